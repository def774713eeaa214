//! Process groups: the collective and point-to-point operations on tensors, each returning a
//! [`Work`] handle.
//!
//! Each group runs its collectives, in call order, on its own thread, so a caller can start one
//! (an all-reduce of a gradient bucket, say) and go on computing until it calls [`Work::wait`].
//! Every rank of the group must call the same collectives in the same order, as with
//! `torch.distributed`; each message carries the call's sequence number, op, dtype and element
//! count, and a rank that receives something else stops with an error naming both calls. Sends
//! run on a second thread per group; a receive completes when its message has arrived and
//! `wait` is called (messages are taken off the socket as soon as they arrive).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use weft_core::{DType, Device, Tensor};

use crate::collectives::{self as algo, describe, op_code, Ctx, Kind};
use crate::error::{Error, Result};
use crate::mesh::Mesh;
use crate::reduce::{check_op, dtype_code, ReduceOp};
use crate::store::{StoreClient, StoreServer};

mod p2p;

type Job = Box<dyn FnOnce() -> Result<()> + Send>;

/// What every group of a process shares: the connections, and whether any operation failed.
pub(crate) struct World {
    pub mesh: Mesh,
    pub store: Option<StoreClient>,
    pub _server: Option<StoreServer>,
    next_group: AtomicU32,
    broken: Mutex<Option<String>>,
}

impl World {
    pub fn new(mesh: Mesh, store: Option<StoreClient>, server: Option<StoreServer>) -> World {
        World {
            mesh,
            store,
            _server: server,
            next_group: AtomicU32::new(1),
            broken: Mutex::new(None),
        }
    }
}

/// A set of ranks that communicate; see the module docs.
#[derive(Clone)]
pub struct ProcessGroup {
    inner: Arc<Inner>,
}

struct Inner {
    id: u32,
    ranks: Vec<usize>,
    me: usize,
    world: Arc<World>,
    /// Collective jobs with their sequence numbers (assigned in call order under this lock).
    collectives: Mutex<(mpsc::Sender<Job>, u64)>,
    sends: Mutex<mpsc::Sender<Job>>,
    /// Next sequence number per (peer, tag), for sends and for receives.
    send_seq: Mutex<HashMap<(usize, u32), u64>>,
    recv_seq: Mutex<HashMap<(usize, u32), u64>>,
}

/// A pending operation. Dropping it without waiting lets the operation finish unobserved.
#[must_use = "an operation's errors surface only through wait()"]
pub struct Work {
    kind: WorkKind,
}

enum WorkKind {
    Queued(mpsc::Receiver<Result<()>>, String),
    Deferred(Job),
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            WorkKind::Queued(_, what) => write!(f, "Work({what})"),
            WorkKind::Deferred(_) => f.write_str("Work(recv)"),
        }
    }
}

impl Work {
    /// This work, then `dst` (a GPU tensor) overwritten with `src` (its host stand-in that the
    /// collective wrote): how GPU tensors take part in collectives, through host memory.
    fn then_copy_back(self, dst: &Tensor, src: Tensor) -> Work {
        let dst = dst.clone();
        Work {
            kind: WorkKind::Deferred(Box::new(move || {
                self.wait()?;
                dst.copy_from(&src)?;
                Ok(())
            })),
        }
    }

    /// Blocks until the operation has finished on this rank; its error, if any.
    pub fn wait(self) -> Result<()> {
        match self.kind {
            WorkKind::Queued(rx, what) => {
                let _span = crate::trace::span("wait", &what);
                rx.recv()
                    .unwrap_or_else(|_| Err(Error::PeerFailed(format!("{what}: the group's thread is gone"))))
            }
            WorkKind::Deferred(f) => f(),
        }
    }
}

fn spawn_worker(name: String, world: Arc<World>) -> Result<mpsc::Sender<Job>> {
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            for job in rx {
                let _ = job();
            }
            drop(world);
        })
        .map_err(|e| Error::Io(format!("cannot start a communication thread: {e}")))?;
    Ok(tx)
}

/// A host copy of `t` when it lives on a GPU (collectives of GPU tensors run on host copies:
/// the inputs copied out first, the outputs copied back by [`Work::wait`]); `None` on the CPU.
fn host_copy(t: &Tensor) -> Result<Option<Tensor>> {
    if t.device() == Device::Cpu {
        return Ok(None);
    }
    Ok(Some(weft_core::no_grad(|| t.to(Device::Cpu))?))
}

/// A collective from `input` into `output`, at least one of them on a GPU, run by `run` on host
/// copies of both; the output's copy is written back by [`Work::wait`].
fn on_host_copies(output: &Tensor, input: &Tensor, run: impl FnOnce(&Tensor, &Tensor) -> Result<Work>) -> Result<Work> {
    let i = host_copy(input)?.unwrap_or_else(|| input.clone());
    match host_copy(output)? {
        Some(o) => Ok(run(&o, &i)?.then_copy_back(output, o)),
        None => run(output, &i),
    }
}

/// The raw bytes of a contiguous tensor, mutably (bool bytes written here are checked 0/1).
fn with_bytes_mut<R>(t: &Tensor, f: impl FnOnce(&mut [u8]) -> R) -> Result<R> {
    Ok(weft_core::dtype_dispatch!(t.dtype(), T => t.with_data_mut::<T, R>(|s| {
        // SAFETY: every dtype is plain old data; callers write only validated bytes.
        f(unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(s)) })
    })?))
}

/// The raw bytes of a contiguous tensor.
fn with_bytes<R>(t: &Tensor, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
    Ok(weft_core::dtype_dispatch!(t.dtype(), T => t.with_data::<T, R>(|s| {
        // SAFETY: reading any plain-old-data element as bytes is sound.
        f(unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) })
    })?))
}

/// Runs `f` on the bytes of `input` and, mutably, of `output`; `input` is read in place
/// unless it shares storage with `output` (then from a copy).
fn with_input_output(input: &Tensor, output: &Tensor, f: impl FnOnce(&[u8], &mut [u8]) -> Result<()>) -> Result<()> {
    if input.same_storage(output) {
        let copy = bytes_of(input)?;
        with_bytes_mut(output, |b| f(&copy, b))?
    } else {
        with_bytes(input, |i| with_bytes_mut(output, |b| f(i, b)))??
    }
}

fn bytes_of(t: &Tensor) -> Result<Vec<u8>> {
    Ok(
        weft_core::dtype_dispatch!(t.dtype(), T => t.with_data::<T, Vec<u8>>(|s| {
        // SAFETY: reading any plain-old-data element as bytes is sound.
        unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }.to_vec()
    })?),
    )
}

impl ProcessGroup {
    pub(crate) fn new(world: Arc<World>, id: u32, ranks: Vec<usize>) -> Result<ProcessGroup> {
        let me = ranks
            .iter()
            .position(|&r| r == world.mesh.rank)
            .ok_or_else(|| Error::Invalid("this rank is not in the group".into()))?;
        let rank = world.mesh.rank;
        let collectives = spawn_worker(format!("weft-g{id}-r{rank}"), world.clone())?;
        let sends = spawn_worker(format!("weft-g{id}-send-r{rank}"), world.clone())?;
        Ok(ProcessGroup {
            inner: Arc::new(Inner {
                id,
                ranks,
                me,
                world,
                collectives: Mutex::new((collectives, 0)),
                sends: Mutex::new(sends),
                send_seq: Mutex::default(),
                recv_seq: Mutex::default(),
            }),
        })
    }

    /// This process's rank in the group (0..size).
    pub fn rank(&self) -> usize {
        self.inner.me
    }

    /// Number of ranks in the group.
    pub fn size(&self) -> usize {
        self.inner.ranks.len()
    }

    /// The global ranks of the members, in group order.
    pub fn ranks(&self) -> &[usize] {
        &self.inner.ranks
    }

    /// The rendezvous store (None in a single-process job), for programs that need to agree on
    /// small values outside collectives.
    pub fn store(&self) -> Option<&StoreClient> {
        self.inner.world.store.as_ref()
    }

    /// Gives up on this job: every later operation of every group of this process fails, and
    /// every peer is told `reason`, so ranks waiting on this one fail now with it instead of at
    /// their timeout. For errors found outside a collective (a rank whose gradients are
    /// missing, say) that the other ranks would otherwise only see as silence.
    pub fn abort(&self, reason: &str) {
        let w = &self.inner.world;
        w.broken.lock().unwrap().get_or_insert(reason.to_string());
        w.mesh.abort(reason);
    }

    /// Whether messages to group rank `peer` travel through shared memory (else TCP).
    pub fn uses_shared_memory(&self, peer: usize) -> bool {
        self.inner
            .ranks
            .get(peer)
            .is_some_and(|&g| self.inner.world.mesh.is_shared_memory(g))
    }

    /// The global rank of this process.
    pub fn global_rank(&self) -> usize {
        self.inner.world.mesh.rank
    }

    /// A subgroup of the given global ranks (in that order), as `torch.distributed.new_group`:
    /// every rank of the job must call this with the same ranks in the same order, members or
    /// not; members get `Some`.
    pub fn new_group(&self, ranks: &[usize]) -> Result<Option<ProcessGroup>> {
        let world = &self.inner.world;
        let id = world.next_group.fetch_add(1, Ordering::SeqCst);
        let n = world.mesh.world;
        let mut seen = vec![false; n];
        for &r in ranks {
            if r >= n || std::mem::replace(&mut seen[r], true) {
                return Err(Error::Invalid(format!(
                    "new_group({ranks:?}): ranks must be distinct and below the world size {n}"
                )));
            }
        }
        if ranks.is_empty() {
            return Err(Error::Invalid("new_group: no ranks given".into()));
        }
        if !seen[world.mesh.rank] {
            return Ok(None);
        }
        ProcessGroup::new(world.clone(), id, ranks.to_vec()).map(Some)
    }

    fn check_peer(&self, op: &str, r: usize) -> Result<()> {
        if r >= self.size() {
            return Err(Error::Invalid(format!(
                "{op}: rank {r} is not in this group of {} ranks",
                self.size()
            )));
        }
        Ok(())
    }

    /// Queues a collective: `f` runs on the group's thread with the call's context.
    fn collective(
        &self,
        kind: Kind,
        reduce: Option<ReduceOp>,
        device: Device,
        dtype: DType,
        count: usize,
        f: impl FnOnce(&Ctx) -> Result<()> + Send + 'static,
    ) -> Result<Work> {
        // The extension point for other devices: CPU tensors run the algorithms of
        // `collectives` over shared memory and TCP; the public methods have already put GPU
        // tensors' elements in host copies (NCCL would take them here instead).
        if let Device::Cuda(_) = device {
            return Err(Error::Invalid(format!(
                "{kind:?} of a tensor on {device}: reached the host algorithms without a host copy"
            )));
        }
        let inner = self.inner.clone();
        let op = op_code(kind, reduce);
        let mut q = self.inner.collectives.lock().unwrap();
        let seq = q.1;
        q.1 += 1;
        let what = format!(
            "rank {}: {} #{seq} of group {}",
            self.global_rank(),
            describe(op, dtype_code(dtype), count as u64),
            self.inner.id
        );
        let (tx, rx) = mpsc::channel();
        let job: Job = Box::new(move || {
            let world = &inner.world;
            let broken = world.broken.lock().unwrap().clone();
            let r = match broken {
                Some(why) => Err(Error::PeerFailed(format!(
                    "rank {}: communication stopped after an earlier failure: {why}",
                    world.mesh.rank
                ))),
                None => {
                    let ctx = Ctx {
                        mesh: &world.mesh,
                        ranks: &inner.ranks,
                        me: inner.me,
                        group: inner.id,
                        stream: (inner.id as u64) << 32,
                        seq,
                        op,
                        dtype,
                        count: count as u64,
                    };
                    let started = std::time::Instant::now();
                    let r = f(&ctx);
                    if crate::trace::enabled() {
                        let name = format!("{} #{seq}", describe(op, dtype_code(dtype), count as u64));
                        crate::trace::record("comm", name, started, std::time::Instant::now());
                    }
                    if let Err(e) = &r {
                        let msg = e.to_string();
                        world.broken.lock().unwrap().get_or_insert(msg.clone());
                        world.mesh.abort(&msg);
                    }
                    r
                }
            };
            let _ = tx.send(r);
            Ok(())
        });
        q.0.send(job)
            .map_err(|_| Error::PeerFailed(format!("{what}: the group's thread is gone")))?;
        Ok(Work {
            kind: WorkKind::Queued(rx, what),
        })
    }

    /// Reduces `t` across the group in place; every rank ends with the result.
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<Work> {
        if let Some(h) = host_copy(t)? {
            return Ok(self.all_reduce(&h, op)?.then_copy_back(t, h));
        }
        check_contiguous("all_reduce", t)?;
        check_op(op, t.dtype())?;
        let t2 = t.clone();
        self.collective(Kind::AllReduce, Some(op), t.device(), t.dtype(), t.numel(), move |c| {
            with_bytes_mut(&t2, |b| algo::all_reduce(c, b, op))?
        })
    }

    /// `output` (`n` elements... of `input.numel() / size`) receives this rank's chunk of the
    /// chunk-wise reduction of every rank's `input` (as `reduce_scatter_tensor`).
    pub fn reduce_scatter(&self, output: &Tensor, input: &Tensor, op: ReduceOp) -> Result<Work> {
        if output.device() != Device::Cpu || input.device() != Device::Cpu {
            return on_host_copies(output, input, |o, i| self.reduce_scatter(o, i, op));
        }
        check_contiguous("reduce_scatter", output)?;
        check_pair(
            "reduce_scatter",
            output,
            input,
            output.numel() * self.size(),
            input.numel(),
            "input",
        )?;
        check_op(op, input.dtype())?;
        let (o, i) = (output.clone(), input.clone());
        self.collective(
            Kind::ReduceScatter,
            Some(op),
            input.device(),
            input.dtype(),
            input.numel(),
            move |c| with_input_output(&i, &o, |input, b| algo::reduce_scatter(c, input, b, op)),
        )
    }

    /// `output` (`size` chunks of `input.numel()`) receives every rank's `input` in rank order
    /// (as `all_gather_into_tensor`).
    pub fn all_gather(&self, output: &Tensor, input: &Tensor) -> Result<Work> {
        if output.device() != Device::Cpu || input.device() != Device::Cpu {
            return on_host_copies(output, input, |o, i| self.all_gather(o, i));
        }
        check_contiguous("all_gather", output)?;
        check_pair(
            "all_gather",
            output,
            input,
            input.numel() * self.size(),
            output.numel(),
            "output",
        )?;
        let (o, i, me) = (output.clone(), input.clone(), self.rank());
        self.collective(
            Kind::AllGather,
            None,
            input.device(),
            input.dtype(),
            output.numel(),
            move |c| {
                with_input_output(&i, &o, |mine, b| {
                    let k = mine.len();
                    b[me * k..(me + 1) * k].copy_from_slice(mine);
                    algo::all_gather(c, b)
                })
            },
        )
    }

    /// Copies `t` from group rank `root` to every rank.
    pub fn broadcast(&self, t: &Tensor, root: usize) -> Result<Work> {
        if let Some(h) = host_copy(t)? {
            return Ok(self.broadcast(&h, root)?.then_copy_back(t, h));
        }
        check_contiguous("broadcast", t)?;
        self.check_peer("broadcast", root)?;
        let t2 = t.clone();
        self.collective(Kind::Broadcast, None, t.device(), t.dtype(), t.numel(), move |c| {
            with_bytes_mut(&t2, |b| algo::broadcast(c, b, root))?
        })
    }

    /// Reduces `t` onto group rank `root` (other ranks' `t` end with partial results, as
    /// Gloo's).
    pub fn reduce(&self, t: &Tensor, root: usize, op: ReduceOp) -> Result<Work> {
        if let Some(h) = host_copy(t)? {
            return Ok(self.reduce(&h, root, op)?.then_copy_back(t, h));
        }
        check_contiguous("reduce", t)?;
        self.check_peer("reduce", root)?;
        check_op(op, t.dtype())?;
        let t2 = t.clone();
        self.collective(Kind::Reduce, Some(op), t.device(), t.dtype(), t.numel(), move |c| {
            with_bytes_mut(&t2, |b| algo::reduce_to_root(c, b, root, op))?
        })
    }

    /// Chunk `j` of `input` (`size` equal chunks) goes to rank `j`; `output` chunk `j` comes
    /// from rank `j` (as `all_to_all_single` with equal splits).
    pub fn all_to_all(&self, output: &Tensor, input: &Tensor) -> Result<Work> {
        if output.device() != Device::Cpu || input.device() != Device::Cpu {
            return on_host_copies(output, input, |o, i| self.all_to_all(o, i));
        }
        check_contiguous("all_to_all", output)?;
        check_pair("all_to_all", output, input, input.numel(), output.numel(), "output")?;
        if !input.numel().is_multiple_of(self.size()) {
            return Err(Error::Invalid(format!(
                "all_to_all: {} elements do not split evenly across {} ranks",
                input.numel(),
                self.size()
            )));
        }
        let (o, i) = (output.clone(), input.clone());
        self.collective(
            Kind::AllToAll,
            None,
            input.device(),
            input.dtype(),
            input.numel(),
            move |c| with_input_output(&i, &o, |input, b| algo::all_to_all(c, input, b)),
        )
    }

    /// Returns once every rank of the group has called it.
    pub fn barrier(&self) -> Result<Work> {
        self.collective(Kind::Barrier, None, Device::Cpu, DType::U8, 0, algo::barrier)
    }
}

fn check_contiguous(op: &str, t: &Tensor) -> Result<()> {
    if !t.is_contiguous() {
        return Err(Error::Invalid(format!(
            "{op}: the tensor of shape {:?} must be contiguous (call .contiguous() first)",
            t.shape()
        )));
    }
    Ok(())
}

/// Checks dtypes agree and that `got` elements equal `want` (naming the `which` tensor).
fn check_pair(op: &str, output: &Tensor, input: &Tensor, want: usize, got: usize, which: &str) -> Result<()> {
    if output.dtype() != input.dtype() {
        return Err(Error::Invalid(format!(
            "{op}: output is {:?} but input is {:?}",
            output.dtype(),
            input.dtype()
        )));
    }
    if want != got {
        return Err(Error::Invalid(format!(
            "{op}: {which} has {got} elements, expected {want} (output {:?}, input {:?})",
            output.shape(),
            input.shape()
        )));
    }
    Ok(())
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ProcessGroup(id {}, rank {} of {:?})",
            self.inner.id, self.inner.me, self.inner.ranks
        )
    }
}
