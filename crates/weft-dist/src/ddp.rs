//! Data parallelism (PyTorch's `DistributedDataParallel`): every rank of a group holds the whole
//! model, computes gradients on its own share of each batch, and the gradients are averaged over
//! the group before the optimizer step, so every replica takes the same step.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use weft_core::{DType, Tensor};
//! let world = weft_dist::init()?;
//! let w = Tensor::ones(&[4, 3], DType::F32)?.requires_grad_()?;
//! let ddp = weft_dist::DataParallel::new(vec![("w".into(), w.clone())], &world, Default::default())?;
//! let x = Tensor::ones(&[2, 4], DType::F32)?; // this rank's share of the batch
//! let loss = x.matmul(&w)?.mean(&[], false)?;
//! ddp.backward(&loss)?; // w.grad() is now the average over the ranks
//! # Ok(()) }
//! ```
//!
//! How: at construction the parameters are broadcast from rank 0 and cut into buckets in reverse
//! registration order (the order backward produces their gradients): the first bucket holds
//! about [`DdpOptions::first_bucket_bytes`], the others [`DdpOptions::bucket_bytes`] (and none
//! reaches across a [`DdpOptions::bucket_breaks`] index). Each
//! parameter's gradient-ready hook copies its gradient into its bucket; when a bucket is full its
//! all-reduce (average) starts on the group's thread while backward goes on, buckets starting in
//! order on every rank. [`DataParallel::finish`] waits for them and points each gradient at its
//! slice of the averaged bucket. The buckets live in host memory: a GPU parameter's gradient is
//! copied into its bucket and its averaged slice copied back to the GPU.
//!
//! Without hooks ([`DataParallel::new_unhooked`], for a backward that hooks must stay out of,
//! such as one captured as a graph and replayed): the caller hands each gradient over as it is
//! made ([`DataParallel::hand_gradient`], what the hook would do), and [`DataParallel::finish`]
//! hands the rest the parameters hold to the same buckets, in bucket order, after backward has
//! ended (those all-reduces no longer overlap it); the averages are the same, bit for bit.

use std::sync::{Arc, Mutex, MutexGuard};

use weft_core::{DType, Tensor};

use crate::error::{Error, Result};
use crate::group::{ProcessGroup, Work};
use crate::reduce::ReduceOp;

/// Settings of [`DataParallel`].
#[derive(Clone, Debug)]
pub struct DdpOptions {
    /// Size cap of the first bucket to be reduced (the last parameters), bytes. PyTorch: 1 MiB.
    pub first_bucket_bytes: usize,
    /// Size cap of every other bucket, bytes. PyTorch's `bucket_cap_mb`: 25 MiB.
    pub bucket_bytes: usize,
    /// Allow parameters that get no gradient in a step on some rank (PyTorch's
    /// `find_unused_parameters`): they count as zero there, and one whose gradient is missing on
    /// every rank keeps no gradient. Off: a missing gradient is an error naming the parameters.
    pub find_unused_parameters: bool,
    /// Parameter indices that start a bucket's run: parameter `i` listed here and parameter
    /// `i - 1` never share a bucket. An interleaved pipeline stage lists where each of its
    /// chunks' parameters begin, since a chunk's gradients are whole after that chunk's last
    /// backward, earlier than the next chunk's, and a bucket holding both would wait for the
    /// later one. Empty by default.
    pub bucket_breaks: Vec<usize>,
}

impl Default for DdpOptions {
    fn default() -> Self {
        DdpOptions {
            first_bucket_bytes: 1 << 20,
            bucket_bytes: 25 << 20,
            find_unused_parameters: false,
            bucket_breaks: Vec::new(),
        }
    }
}

/// Keeps model replicas in step across a group; see the module docs.
pub struct DataParallel {
    reducer: Arc<Mutex<Reducer>>,
}

/// A run of parameters whose gradients are averaged in one all-reduce.
struct Bucket {
    /// Parameter indices, in bucket order.
    members: Vec<usize>,
    /// Element offset of each member in the flat buffer.
    offsets: Vec<usize>,
    numel: usize,
    dtype: DType,
    /// Members whose gradient has not arrived in this step.
    missing: usize,
    /// The flat gradients of this step (taken at the first arrival).
    buffer: Option<Tensor>,
    /// Last step's buffer, reused once the gradients viewing it are gone.
    spare: Option<Tensor>,
    work: Option<Work>,
}

struct Reducer {
    pg: ProcessGroup,
    params: Vec<(String, Tensor)>,
    /// (bucket, member position) of each parameter.
    place: Vec<(usize, usize)>,
    buckets: Vec<Bucket>,
    ready: Vec<bool>,
    /// Buckets before this one have started their all-reduce in this step.
    next_launch: usize,
    sync: bool,
    find_unused: bool,
    /// The first error met by a hook, reported by `finish`.
    error: Option<Error>,
    /// The gradient-ready hooks are registered (else `finish` takes the gradients itself).
    hooked: bool,
}

impl DataParallel {
    /// Broadcasts `params` from group rank 0 (every rank must pass the same names, shapes and
    /// dtypes, in the same order) and registers the gradient hooks. Errors: a parameter that is
    /// not contiguous or not a float tensor, or a failed broadcast.
    pub fn new(params: Vec<(String, Tensor)>, pg: &ProcessGroup, options: DdpOptions) -> Result<DataParallel> {
        let ddp = Self::new_unhooked(params, pg, options)?;
        ddp.attach_hooks();
        Ok(ddp)
    }

    /// As [`DataParallel::new`] without registering the gradient hooks: backward passes run
    /// without side effects (they can be captured as a graph). The caller hands gradients over
    /// as they are made ([`DataParallel::hand_gradient`]), and [`DataParallel::finish`] takes
    /// those the parameters hold that were not, bucket by bucket in the order the hooks would
    /// start them (those do not overlap backward; the averages are the same).
    /// [`DataParallel::attach_hooks`] registers the hooks later.
    pub fn new_unhooked(params: Vec<(String, Tensor)>, pg: &ProcessGroup, options: DdpOptions) -> Result<DataParallel> {
        for (name, p) in &params {
            if !p.is_contiguous() || !p.dtype().is_float() {
                return Err(Error::Invalid(format!(
                    "data parallel: parameter {name:?} (shape {:?}, {}) must be a contiguous float tensor",
                    p.shape(),
                    p.dtype().name()
                )));
            }
        }
        for (i, (name, p)) in params.iter().enumerate() {
            if let Some((other, _)) = params[..i].iter().find(|(_, q)| q.same_storage(p)) {
                return Err(Error::Invalid(format!(
                    "data parallel: parameters {other:?} and {name:?} are the same tensor; list it once"
                )));
            }
        }
        for (_, p) in &params {
            pg.broadcast(p, 0)?.wait()?;
        }
        let buckets = plan_buckets(&params, &options);
        let mut place = vec![(0, 0); params.len()];
        for (b, bucket) in buckets.iter().enumerate() {
            for (m, &i) in bucket.members.iter().enumerate() {
                place[i] = (b, m);
            }
        }
        let n = params.len();
        let reducer = Arc::new(Mutex::new(Reducer {
            pg: pg.clone(),
            params: params.clone(),
            place,
            buckets,
            ready: vec![false; n],
            next_launch: 0,
            sync: true,
            find_unused: options.find_unused_parameters,
            error: None,
            hooked: false,
        }));
        Ok(DataParallel { reducer })
    }

    /// Registers the gradient-ready hooks (once; later calls do nothing): from the next
    /// backward on, buckets start their all-reduce while backward runs. Hooks cannot be
    /// removed again.
    pub fn attach_hooks(&self) {
        let params = {
            let mut r = lock(&self.reducer);
            if std::mem::replace(&mut r.hooked, true) {
                return;
            }
            r.params.clone()
        };
        for (i, (_, p)) in params.iter().enumerate() {
            let r = Arc::downgrade(&self.reducer);
            p.register_grad_ready_hook(move |leaf| {
                if let Some(r) = r.upgrade() {
                    lock(&r).gradient_ready(i, leaf);
                }
            });
        }
    }

    /// Whether the gradient-ready hooks are registered.
    pub fn hooked(&self) -> bool {
        lock(&self.reducer).hooked
    }

    /// Without hooks: parameter `i` (in the order given to [`DataParallel::new_unhooked`]) holds
    /// its final gradient of this backward; hands it to its bucket now, as its hook would (a
    /// full bucket starts its all-reduce). [`DataParallel::finish`] takes the gradients not
    /// handed over this way. An error (a second gradient, one that does not match the
    /// parameter, an index out of range, a wrapper whose hooks are registered, which take every
    /// gradient themselves) is reported by `finish`, as a hook's is. Inside
    /// [`DataParallel::no_sync`] this does nothing.
    pub fn hand_gradient(&self, i: usize) {
        let mut r = lock(&self.reducer);
        if !r.sync || r.error.is_some() {
            return;
        }
        let n = r.params.len();
        let wrong = if r.hooked {
            Some(format!(
                "data parallel: hand_gradient({i}) on a wrapper whose hooks are registered (they take every gradient)"
            ))
        } else if i >= n {
            Some(format!(
                "data parallel: hand_gradient({i}) names no parameter (there are {n})"
            ))
        } else {
            None
        };
        match wrong {
            Some(msg) => r.error = Some(Error::Invalid(msg)),
            None => {
                let p = r.params[i].1.clone();
                r.gradient_ready(i, &p);
            }
        }
    }

    /// The parameter names of each bucket, in the order their all-reduces start.
    pub fn buckets(&self) -> Vec<Vec<String>> {
        let r = lock(&self.reducer);
        r.buckets
            .iter()
            .map(|b| b.members.iter().map(|&i| r.params[i].0.clone()).collect())
            .collect()
    }

    /// Runs `f` (forward and backward passes) without averaging: gradients accumulate locally,
    /// as in PyTorch's `no_sync()`, and the next synchronised backward averages the sum.
    pub fn no_sync<R>(&self, f: impl FnOnce() -> R) -> R {
        let was = std::mem::replace(&mut lock(&self.reducer).sync, false);
        let out = f();
        lock(&self.reducer).sync = was;
        out
    }

    /// `loss.backward()` followed by [`DataParallel::finish`].
    pub fn backward(&self, loss: &Tensor) -> Result<()> {
        loss.backward()?;
        self.finish()
    }

    /// After a synchronised backward: starts the buckets still waiting (those with parameters
    /// that got no gradient, when that is allowed), waits for every all-reduce and sets each
    /// gradient to the group's average. Without hooks, first takes every gradient the parameters
    /// hold that was not handed over, in bucket order (what backward and earlier `no_sync` passes
    /// accumulated). Without
    /// `find_unused_parameters`, a parameter without a gradient is an error naming it (the group
    /// is aborted with the same message, so the other ranks stop too). Inside
    /// [`DataParallel::no_sync`] this does nothing.
    pub fn finish(&self) -> Result<()> {
        let mut r = lock(&self.reducer);
        if !r.sync {
            return Ok(());
        }
        if !r.hooked {
            r.take_held_gradients();
        }
        let result = r.finish();
        r.reset();
        if let Err(e) = &result {
            r.pg.abort(&e.to_string());
        }
        result
    }
}

fn lock(r: &Mutex<Reducer>) -> MutexGuard<'_, Reducer> {
    r.lock().unwrap_or_else(|e| e.into_inner())
}

/// Buckets in reverse parameter order: each closes once it holds at least its cap in bytes (as
/// PyTorch's `compute_bucket_assignment_by_size`), where the dtype changes, or after a parameter
/// of [`DdpOptions::bucket_breaks`].
fn plan_buckets(params: &[(String, Tensor)], options: &DdpOptions) -> Vec<Bucket> {
    let cap = |k: usize| {
        if k == 0 {
            options.first_bucket_bytes
        } else {
            options.bucket_bytes
        }
    };
    let mut buckets: Vec<Bucket> = Vec::new();
    let mut open = false;
    for (i, (_, p)) in params.iter().enumerate().rev() {
        if open && buckets.last().is_some_and(|b| b.dtype != p.dtype()) {
            open = false;
        }
        if !open {
            buckets.push(Bucket {
                members: Vec::new(),
                offsets: Vec::new(),
                numel: 0,
                dtype: p.dtype(),
                missing: 0,
                buffer: None,
                spare: None,
                work: None,
            });
            open = true;
        }
        let k = buckets.len() - 1;
        let b = buckets.last_mut().expect("pushed");
        b.members.push(i);
        b.offsets.push(b.numel);
        b.numel += p.numel();
        b.missing += 1;
        // as PyTorch: a bucket closes once it reaches its cap (its last tensor may pass it)
        if b.numel * b.dtype.size_in_bytes() >= cap(k) || options.bucket_breaks.contains(&i) {
            open = false;
        }
    }
    buckets
}

impl Bucket {
    /// This step's flat buffer: last step's when nothing else holds it any more (its gradients
    /// were cleared), else a new one. Every element is overwritten before the all-reduce.
    fn buffer(&mut self) -> Result<Tensor> {
        if self.buffer.is_none() {
            let reusable = self
                .spare
                .take()
                .filter(|t| std::sync::Arc::strong_count(t.storage()) == 1);
            self.buffer = Some(match reusable {
                Some(t) => t,
                None => Tensor::zeros(&[self.numel], self.dtype)?,
            });
        }
        Ok(self.buffer.clone().expect("set above"))
    }
}

impl Reducer {
    /// What the hooks would have done during backward, after it: every parameter holding a
    /// gradient not handed over yet hands it to its bucket, buckets in order (so each starts as
    /// soon as it is full).
    fn take_held_gradients(&mut self) {
        let order: Vec<usize> = self.buckets.iter().flat_map(|b| b.members.clone()).collect();
        for i in order {
            let p = self.params[i].1.clone();
            if p.grad().is_some() && !self.ready[i] {
                self.gradient_ready(i, &p);
            }
        }
    }

    fn gradient_ready(&mut self, i: usize, leaf: &Tensor) {
        if !self.sync || self.error.is_some() {
            return;
        }
        if let Err(e) = self.take_gradient(i, leaf) {
            self.error = Some(e);
        }
    }

    fn take_gradient(&mut self, i: usize, leaf: &Tensor) -> Result<()> {
        if self.ready[i] {
            return Err(Error::Invalid(format!(
                "data parallel: parameter {:?} got a second gradient before finish() (call finish() after \
                 each synchronised backward, or accumulate inside no_sync)",
                self.params[i].0
            )));
        }
        let grad = leaf
            .grad()
            .ok_or_else(|| Error::Invalid(format!("parameter {:?} has no gradient", self.params[i].0)))?;
        let (b, m) = self.place[i];
        let bucket = &mut self.buckets[b];
        let buffer = bucket.buffer()?;
        let at = bucket.offsets[m];
        if grad.dtype() != bucket.dtype || grad.numel() != self.params[i].1.numel() {
            return Err(Error::Invalid(format!(
                "data parallel: the gradient of {:?} ({:?}, {}) does not match the parameter",
                self.params[i].0,
                grad.shape(),
                grad.dtype().name()
            )));
        }
        weft_core::dtype_dispatch!(grad.dtype(), T => grad.with_data::<T, Result<()>>(|g| {
            buffer.with_data_mut::<T, ()>(|d| d[at..at + g.len()].copy_from_slice(g))?;
            Ok(())
        })??);
        self.ready[i] = true;
        bucket.missing -= 1;
        self.launch_ready()
    }

    /// Starts, in bucket order, every bucket whose gradients are all in.
    fn launch_ready(&mut self) -> Result<()> {
        while let Some(b) = self.buckets.get(self.next_launch) {
            if b.missing > 0 {
                break;
            }
            self.launch(self.next_launch)?;
        }
        Ok(())
    }

    fn launch(&mut self, b: usize) -> Result<()> {
        let _s = crate::trace::span("compute", "launch all_reduce");
        let bucket = &mut self.buckets[b];
        let buffer = bucket.buffer()?;
        // parameters without a gradient here (allowed by find_unused_parameters) count as zero
        for (m, &i) in bucket.members.iter().enumerate() {
            if !self.ready[i] {
                let (at, n) = (bucket.offsets[m], self.params[i].1.numel());
                buffer
                    .narrow(0, at, n)?
                    .copy_from(&Tensor::zeros(&[n], bucket.dtype)?)?;
            }
        }
        bucket.work = Some(self.pg.all_reduce(&buffer, ReduceOp::Avg)?);
        self.next_launch = b + 1;
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let unused: Vec<usize> = (0..self.params.len()).filter(|&i| !self.ready[i]).collect();
        if !unused.is_empty() && !self.find_unused {
            let names: Vec<&str> = unused.iter().map(|&i| self.params[i].0.as_str()).collect();
            return Err(Error::Invalid(format!(
                "data parallel: rank {}: parameters {names:?} received no gradient in this backward pass \
                 (every parameter must take part in the loss on every rank, or allow unused parameters)",
                self.pg.global_rank()
            )));
        }
        for b in self.next_launch..self.buckets.len() {
            self.launch(b)?;
        }
        // which parameters had a gradient on some rank
        let used_anywhere = if self.find_unused {
            let mask: Vec<u8> = self.ready.iter().map(|&r| r as u8).collect();
            let t = Tensor::from_vec(mask, &[self.params.len()])?;
            self.pg.all_reduce(&t, ReduceOp::Max)?.wait()?;
            t.to_vec::<u8>()?.into_iter().map(|m| m != 0).collect()
        } else {
            vec![true; self.params.len()]
        };
        for bucket in &mut self.buckets {
            if let Some(w) = bucket.work.take() {
                w.wait()?;
            }
        }
        for bucket in &self.buckets {
            let buffer = bucket.buffer.as_ref().expect("launched buckets have buffers");
            for (&i, &at) in bucket.members.iter().zip(&bucket.offsets) {
                let p = &self.params[i].1;
                let grad = if used_anywhere[i] {
                    // the buckets live in host memory: a GPU parameter's gradient is copied back
                    let g = buffer.narrow(0, at, p.numel())?.view(p.shape())?;
                    Some(if p.device() == weft_core::Device::Cpu {
                        g
                    } else {
                        g.to(p.device())?
                    })
                } else {
                    None
                };
                p.set_grad(grad);
            }
        }
        Ok(())
    }

    /// Ready for the next step, whatever happened in this one.
    fn reset(&mut self) {
        self.ready.iter_mut().for_each(|r| *r = false);
        self.next_launch = 0;
        self.error = None;
        for b in &mut self.buckets {
            b.missing = b.members.len();
            b.spare = b.buffer.take();
            b.work = None;
        }
    }
}
