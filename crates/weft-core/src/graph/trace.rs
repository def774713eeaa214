//! Capture: while a closure runs under [`trace`], the dispatcher reports every op it executes
//! (`record_op`), and the few places that touch tensors outside the op set report that too
//! (host reads and in-place writes, autograd's leaf copies and hooks).
//!
//! Values are recognised by their buffer and view: (storage address, offset, shape, strides,
//! dtype). The tracer keeps a weak reference to every storage it has seen, so no address is
//! reused while the capture runs, without keeping any buffer alive (autograd decides whether to
//! copy a gradient by its storage's reference count, which must not change under capture).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::{Arc, Weak};

use super::ir::{Graph, Node, Source, Value, ValueId};
use crate::error::Result;
use crate::op::Op;
use crate::storage::Storage;
use crate::tensor::{Tensor, TensorId};
use crate::DType;

/// Why a closure could not be captured; the caller runs it eagerly instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureError {
    pub reason: String,
    /// Whether a second capture may succeed: the only obstacle was tensors made outside the op
    /// set, which lazily built caches (rotary tables) make once, at their first call.
    pub may_retry: bool,
}

impl std::fmt::Display for CaptureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

type Key = (usize, usize, Vec<usize>, Vec<usize>, DType);

struct Tracer {
    graph: Graph,
    keys: HashMap<Key, ValueId>,
    buffers: HashMap<usize, usize>,
    pins: Vec<Weak<Storage>>,
    /// Tensors with an id at or above this were made during the capture.
    start: TensorId,
    /// The first reason a replay could never be faithful.
    refusal: Option<String>,
    /// The first tensor made outside the op set: a second capture may not meet it (a cache the
    /// function fills at its first call).
    made_outside: Option<String>,
    /// Whether random draws (dropout, random tensors) are recorded: the caller gives the
    /// function's random stream, so that a replay can move them along it.
    stream: bool,
}

thread_local! {
    static TRACER: RefCell<Option<Tracer>> = const { RefCell::new(None) };
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
    static INLINE: Cell<bool> = const { Cell::new(false) };
    /// Depth of nested `ops::execute` calls: only the outermost op is a node.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

fn key(t: &Tensor) -> Key {
    let l = t.layout();
    (
        Arc::as_ptr(t.storage()) as usize,
        l.offset,
        l.shape.clone(),
        l.strides.clone(),
        t.dtype(),
    )
}

impl Tracer {
    fn refuse(&mut self, reason: String) {
        self.refusal.get_or_insert(reason);
    }

    fn buffer_of(&mut self, t: &Tensor) -> usize {
        let ptr = Arc::as_ptr(t.storage()) as usize;
        let next = self.buffers.len();
        let id = *self.buffers.entry(ptr).or_insert(next);
        if id == next {
            self.pins.push(Arc::downgrade(t.storage()));
        }
        id
    }

    fn add_value(&mut self, t: &Tensor, source: Source) -> ValueId {
        let buffer = self.buffer_of(t);
        let id = self.graph.values.len();
        self.graph.values.push(Value {
            source,
            shape: t.shape().to_vec(),
            dtype: t.dtype(),
            buffer,
            bytes: t.storage().len() * t.dtype().size_in_bytes(),
        });
        self.keys.insert(key(t), id);
        id
    }

    /// The value `t` is, registering it as an external (made before the capture) or a constant
    /// (made during it, outside the op set) the first time it is seen.
    fn value_of(&mut self, t: &Tensor) -> ValueId {
        if let Some(&v) = self.keys.get(&key(t)) {
            return v;
        }
        let source = if t.id() >= self.start {
            self.made_outside.get_or_insert_with(|| {
                format!(
                    "a tensor of shape {:?} was made outside the op set during the capture \
                     (Tensor::from_vec, or a kernel called directly); a replay could not make it again: \
                     make constants before compiling, or with ops",
                    t.shape()
                )
            });
            Source::Constant(t.clone())
        } else {
            Source::External(t.clone())
        };
        self.add_value(t, source)
    }
}

/// Restores the thread's tracer state when a capture ends (also on a panic).
struct Session;

impl Drop for Session {
    fn drop(&mut self) {
        ACTIVE.with(|a| a.set(false));
        TRACER.with(|t| t.borrow_mut().take());
    }
}

/// Runs `f(inputs)` once, eagerly, while capturing it. Returns the eager results and either the
/// captured graph or why it cannot be replayed faithfully (an op that draws new random numbers
/// at each call, a host read of a computed value, an in-place write, autograd hooks, results that
/// still need gradients). Errors of `f` are returned as they are.
pub fn trace<F>(inputs: &[Tensor], f: F) -> Result<(Vec<Tensor>, std::result::Result<Graph, CaptureError>)>
where
    F: FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
{
    trace_with(inputs, false, f)
}

/// [`trace`]; with `stream`, random draws are recorded rather than refused (the caller moves
/// them along the function's random stream at each replay: see `GraphCache::call_with_stream`).
pub(crate) fn trace_with<F>(
    inputs: &[Tensor],
    stream: bool,
    f: F,
) -> Result<(Vec<Tensor>, std::result::Result<Graph, CaptureError>)>
where
    F: FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
{
    if ACTIVE.with(|a| a.get()) {
        return Err(crate::error::invalid(
            "trace",
            "a capture is already running on this thread",
        ));
    }
    let mut tracer = Tracer {
        graph: Graph::default(),
        keys: HashMap::new(),
        buffers: HashMap::new(),
        pins: Vec::new(),
        start: crate::tensor::next_tensor_id(),
        refusal: None,
        made_outside: None,
        stream,
    };
    for (i, t) in inputs.iter().enumerate() {
        let v = tracer.add_value(t, Source::Input(i));
        tracer.graph.inputs.push(v);
    }
    TRACER.with(|s| *s.borrow_mut() = Some(tracer));
    ACTIVE.with(|a| a.set(true));
    let session = Session;
    let outputs = f(inputs)?;
    let mut tracer = TRACER
        .with(|s| s.borrow_mut().take())
        .expect("the tracer lives until the session ends");
    drop(session);
    for (i, t) in outputs.iter().enumerate() {
        if t.requires_grad() {
            tracer.refuse(format!(
                "result {i} still needs gradients: a compiled function runs its own backward \
                 (replays record no autograd); return gradients, or run the forward under no_grad"
            ));
        }
        let v = tracer.value_of(t);
        tracer.graph.outputs.push(v);
    }
    let result = match (tracer.refusal, tracer.made_outside) {
        (Some(reason), _) => Err(CaptureError {
            reason,
            may_retry: false,
        }),
        (None, Some(reason)) => Err(CaptureError {
            reason,
            may_retry: true,
        }),
        (None, None) => Ok(tracer.graph),
    };
    Ok((outputs, result))
}

/// Whether an op executed now on this thread is captured (a capture runs and this is not an op
/// inside another op's forward).
pub(crate) fn recording() -> bool {
    ACTIVE.with(|a| a.get()) && DEPTH.with(|d| d.get()) == 0
}

/// Whether ops inside custom functions are recorded in their place (see [`InlineFunctions`]).
pub(crate) fn inlining() -> bool {
    INLINE.with(|i| i.get())
}

/// While it lives, a capture on this thread records the ops a custom function's forward runs
/// instead of one node for the function (an export needs ops it knows; a replay needs the
/// function's own backward, so compiled mode keeps the node).
pub(crate) struct InlineFunctions(bool);

impl InlineFunctions {
    pub(crate) fn enter() -> InlineFunctions {
        InlineFunctions(INLINE.with(|i| i.replace(true)))
    }
}

impl Drop for InlineFunctions {
    fn drop(&mut self) {
        INLINE.with(|i| i.set(self.0));
    }
}

/// Marks the ops executed while it lives as nested in one recorded op.
pub(crate) struct RecordGuard;

impl RecordGuard {
    pub(crate) fn enter() -> RecordGuard {
        DEPTH.with(|d| d.set(d.get() + 1));
        RecordGuard
    }
}

impl Drop for RecordGuard {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}

fn with_tracer(f: impl FnOnce(&mut Tracer)) {
    TRACER.with(|s| {
        if let Some(t) = s.borrow_mut().as_mut() {
            f(t)
        }
    });
}

/// Records `outputs = op(inputs)` as a node.
pub(crate) fn record_op(op: &Op, inputs: &[&Tensor], outputs: &[Tensor]) {
    with_tracer(|tr| {
        match op {
            Op::Random { .. } if !tr.stream => tr.refuse(
                "random numbers are drawn at each call; a replay would repeat the captured draw (give the \
                 function's random stream to compile it)"
                    .into(),
            ),
            Op::Dropout { .. } if !tr.stream => tr.refuse(
                "dropout draws a new mask at each call; a replay would repeat the captured one (give the \
                 function's random stream to compile it)"
                    .into(),
            ),
            _ => {}
        }
        let ins: Vec<ValueId> = inputs.iter().map(|t| tr.value_of(t)).collect();
        let node = tr.graph.nodes.len();
        let outs = outputs
            .iter()
            .enumerate()
            .map(|(k, t)| tr.add_value(t, Source::Node { node, output: k }))
            .collect();
        tr.graph.nodes.push(Node {
            op: op.clone(),
            inputs: ins,
            outputs: outs,
        });
    });
}

/// Called where host code reads (`write == false`) or writes a tensor's elements outside the op
/// set. Reading an input or a parameter is allowed (validation); reading a computed value means
/// the closure may branch on data, and writing in place is a side effect a replay would skip.
pub(crate) fn host_access(t: &Tensor, write: bool, what: &'static str) {
    if !recording() {
        return;
    }
    with_tracer(|tr| {
        if write {
            tr.refuse(format!(
                "{what} writes a tensor of shape {:?} in place; a replay runs only ops",
                t.shape()
            ));
            return;
        }
        if let Some(&v) = tr.keys.get(&key(t)) {
            if let Source::Node { node, .. } = tr.graph.values[v].source {
                let op = tr.graph.nodes[node].op.name();
                tr.refuse(format!(
                    "{what} reads the value of a {op} result on the host (data-dependent control flow)"
                ));
            }
        }
    });
}

/// `dst` was made from `src` by a copy outside the op set (autograd taking ownership of a leaf's
/// gradient): it is the same value.
pub(crate) fn note_copy(src: &Tensor, dst: &Tensor) {
    if !recording() {
        return;
    }
    with_tracer(|tr| {
        let v = tr.value_of(src);
        tr.keys.insert(key(dst), v);
        let buffer = tr.graph.values[v].buffer;
        tr.buffers.entry(Arc::as_ptr(dst.storage()) as usize).or_insert(buffer);
        tr.pins.push(Arc::downgrade(dst.storage()));
    });
}

/// Autograd is about to run gradient hooks (data parallelism's reductions, ZeRO's gathers): side
/// effects a replay would skip.
pub(crate) fn note_hooks() {
    if !recording() {
        return;
    }
    with_tracer(|tr| {
        tr.refuse("gradient hooks (data parallelism, ZeRO) run during the backward; a replay would skip them".into())
    });
}
