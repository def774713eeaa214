//! Dynamic reverse-mode autograd.
//!
//! Every differentiable op applied while grad mode is on, to inputs of which at least one requires
//! grad, records a [`Node`] (the op, its inputs, and any tensors its forward saved). `backward()`
//! walks the nodes newest-first (the order PyTorch's engine uses), calls each op's backward formula
//! (written with ops, see `ops::backward`) and accumulates into leaves. When a leaf's last incoming
//! gradient of the pass has arrived, its gradient-ready hooks fire, while the rest of the backward
//! goes on: data parallelism starts its bucket all-reduce from there.
//!
//! Backward formulas run with grad mode off: gradients of gradients are not recorded.
//!
//! Gradient accumulation fusion: when a parameter already holds a gradient (an earlier
//! micro-batch's) that nothing else holds, and a product's input reaches it through nothing but
//! a transpose or an autocast cast, the product's backward adds the weight gradient straight
//! into it (`crate::ops::accumulate`) instead of making a new tensor that a pass of its own then
//! adds. On by default; [`set_accumulation_fusion`] turns it off. A product's input that is
//! autocast's copy of a parameter sends its gradient straight to the parameter either way, made
//! in the parameter's dtype from the low-precision operands (not rounded to them first).

use std::cell::Cell;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::op::Op;
use crate::ops::accumulate::Sink;
use crate::tensor::{Tensor, TensorId};

/// What produced a non-leaf tensor.
pub(crate) struct Node {
    pub(crate) op: Op,
    pub(crate) inputs: Vec<Tensor>,
    pub(crate) saved: Vec<Tensor>,
}

/// Frees the graph behind a node without recursion: dropping a node drops its inputs, each of
/// which drops its own node, one stack frame pair per op, so a graph of a few hundred thousand
/// ops (a 12,000-layer model) overflowed the stack when the step's loss was dropped. The inputs
/// and saved tensors this node held last are moved onto a list, and each one's node, when
/// nothing else holds it, gives its own up to the list before it is dropped.
impl Drop for Node {
    fn drop(&mut self) {
        let mut pending = std::mem::take(&mut self.inputs);
        pending.append(&mut self.saved);
        while let Some(mut tensor) = pending.pop() {
            let Some(inner) = Arc::get_mut(&mut tensor.0) else {
                continue;
            };
            if let Some(node) = inner.node.take() {
                if let Ok(mut node) = Arc::try_unwrap(node) {
                    pending.append(&mut node.inputs);
                    pending.append(&mut node.saved);
                }
            }
        }
    }
}

/// A callback run with a leaf once its gradient of the current backward pass is final.
pub type GradHook = Arc<dyn Fn(&Tensor) + Send + Sync>;

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

static ACCUMULATION_FUSION: AtomicBool = AtomicBool::new(true);

/// Turns gradient accumulation fusion (see the module's documentation) on or off for the whole
/// process. Off, every micro-batch's weight gradients are made as new tensors and added to the
/// accumulated ones, as PyTorch's `AccumulateGrad` does; on, they are added in place, with the
/// same sums bit for bit on the CPU (to rounding on a GPU: `crate::ops::accumulate`).
pub fn set_accumulation_fusion(on: bool) {
    ACCUMULATION_FUSION.store(on, Ordering::Relaxed);
}

/// Whether gradient accumulation fusion is on ([`set_accumulation_fusion`]).
pub fn accumulation_fusion() -> bool {
    ACCUMULATION_FUSION.load(Ordering::Relaxed)
}

/// True unless inside [`no_grad`] (per thread).
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// Restores the previous grad mode when dropped.
pub struct GradModeGuard {
    prev: bool,
}

impl GradModeGuard {
    /// Sets grad mode for the current thread until the guard is dropped.
    pub fn new(enabled: bool) -> Self {
        let prev = GRAD_ENABLED.with(|g| g.replace(enabled));
        GradModeGuard { prev }
    }
}

impl Drop for GradModeGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.prev));
    }
}

/// Runs `f` with gradient recording off (as `torch.no_grad()`).
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    let _guard = GradModeGuard::new(false);
    f()
}

impl Tensor {
    /// Whether gradients flow to (or through) this tensor.
    pub fn requires_grad(&self) -> bool {
        self.0.requires_grad.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// True for tensors not produced by a recorded op (parameters, inputs).
    pub fn is_leaf(&self) -> bool {
        self.0.node.is_none()
    }

    /// Marks a leaf as a parameter whose gradient backward accumulates (as `requires_grad_()`).
    pub fn set_requires_grad(&self, on: bool) -> Result<()> {
        if !self.is_leaf() {
            return Err(Error::Autograd(
                "requires_grad can only be set on a leaf tensor; use detach() first".into(),
            ));
        }
        if on && !self.dtype().is_float() {
            return Err(Error::Autograd(format!(
                "only float tensors can require grad, not {:?}",
                self.dtype()
            )));
        }
        self.0.requires_grad.store(on, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Builder form of [`Tensor::set_requires_grad`]`(true)`.
    pub fn requires_grad_(self) -> Result<Tensor> {
        self.set_requires_grad(true)?;
        Ok(self)
    }

    /// The accumulated gradient of a leaf, if backward reached it.
    pub fn grad(&self) -> Option<Tensor> {
        self.0.grad.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces (or clears) the accumulated gradient.
    pub fn set_grad(&self, grad: Option<Tensor>) {
        *self.0.grad.lock().unwrap_or_else(|e| e.into_inner()) = grad;
    }

    /// A tensor sharing this one's data, outside the graph.
    pub fn detach(&self) -> Tensor {
        self.with_layout(self.layout().clone())
    }

    /// Registers `hook`, called with this tensor each time a backward pass has its gradient
    /// complete. On a leaf, after the gradient is accumulated (`grad()` already holds the new
    /// value). On a non-leaf, once every consumer has passed its gradient back and before this
    /// tensor's own op runs its backward (as PyTorch's `Tensor.register_hook`, without access to
    /// the gradient): the place to prepare what that backward needs, such as gathering sharded
    /// parameters. A non-leaf that no backward formula reads is handed over with its shape,
    /// dtype and device but no elements (autograd did not keep them).
    pub fn register_grad_ready_hook(&self, hook: impl Fn(&Tensor) + Send + Sync + 'static) {
        self.0
            .hooks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::new(hook));
    }

    /// Bytes held by the graph recorded behind this tensor: every distinct storage reachable
    /// through its nodes (their inputs and saved tensors, and this tensor's own), except those
    /// that `skip` returns true for (parameters, say). What a backward still to run keeps
    /// alive: the activations of a forward pass.
    pub fn graph_bytes(&self, skip: &dyn Fn(&Tensor) -> bool) -> usize {
        Tensor::graphs_bytes(std::slice::from_ref(self), skip)
    }

    /// [`Tensor::graph_bytes`] of several graphs together: a storage two of them hold (a
    /// parameter's autocast copy that micro-batches share) counted once.
    pub fn graphs_bytes(roots: &[Tensor], skip: &dyn Fn(&Tensor) -> bool) -> usize {
        Tensor::graph_storages(roots, skip)
            .iter()
            .map(|&(_, bytes)| bytes)
            .sum()
    }

    /// The distinct storages the graphs behind `roots` hold (those `skip` returns true for left
    /// out), each as its address (an identity while it is alive) and its bytes: for a running
    /// count of what several graphs hold as they come and go.
    pub fn graph_storages(roots: &[Tensor], skip: &dyn Fn(&Tensor) -> bool) -> Vec<(usize, usize)> {
        let mut storages = crate::storage::DistinctBytes::default();
        let mut seen_tensor = std::collections::HashSet::new();
        let mut stack = roots.to_vec();
        let mut out = Vec::new();
        while let Some(t) = stack.pop() {
            // a tensor and its backward handles share an id, not a storage
            if !seen_tensor.insert((t.id(), Arc::as_ptr(t.storage()))) {
                continue;
            }
            if !skip(&t) {
                let bytes = storages.add(&t);
                if bytes > 0 {
                    out.push((Arc::as_ptr(t.storage()) as usize, bytes));
                }
            }
            if let Some(node) = &t.0.node {
                stack.extend(node.inputs.iter().cloned());
                stack.extend(node.saved.iter().cloned());
            }
        }
        out
    }

    /// Backward from a one-element tensor (seed gradient 1).
    pub fn backward(&self) -> Result<()> {
        if self.numel() != 1 {
            return Err(Error::Autograd(format!(
                "backward() needs a one-element tensor, got shape {:?}; use backward_with(grad)",
                self.shape()
            )));
        }
        let seed = Tensor::ones_like(self)?;
        self.backward_with(&seed)
    }

    /// Backward with an explicit seed gradient of this tensor's shape.
    pub fn backward_with(&self, seed: &Tensor) -> Result<()> {
        if !self.requires_grad() {
            return Err(Error::Autograd(
                "backward on a tensor that does not require grad".into(),
            ));
        }
        if seed.shape() != self.shape() {
            return Err(Error::ShapeMismatch {
                op: "backward",
                lhs: self.shape().to_vec(),
                rhs: seed.shape().to_vec(),
            });
        }
        let _guard = GradModeGuard::new(false);
        run_backward(self, seed.clone())
    }
}

fn run_backward(root: &Tensor, seed: Tensor) -> Result<()> {
    // 1. Count, for every tensor reachable from the root, the edges that will bring it a gradient.
    let mut deps: HashMap<TensorId, usize> = HashMap::new();
    let mut tensors: HashMap<TensorId, Tensor> = HashMap::new();
    let mut stack = vec![root.clone()];
    tensors.insert(root.id(), root.clone());
    while let Some(t) = stack.pop() {
        if let Some(node) = &t.0.node {
            for input in node.inputs.iter().filter(|i| i.requires_grad()) {
                *deps.entry(input.id()).or_insert(0) += 1;
                match tensors.entry(input.id()) {
                    std::collections::hash_map::Entry::Vacant(slot) => {
                        slot.insert(input.clone());
                        stack.push(input.clone());
                    }
                    // hooks are handed the tensor itself where any node kept it
                    std::collections::hash_map::Entry::Occupied(mut slot) => {
                        if slot.get().is_backward_handle() && !input.is_backward_handle() {
                            slot.insert(input.clone());
                        }
                    }
                }
            }
        }
    }

    // the edges each tensor has in all (`deps` counts down as they arrive): a product's
    // gradient goes straight to a parameter (`sink_routes`) only when it is its one edge
    let edges = deps.clone();

    // 2. Walk newest-first; a tensor is ready once all its consumers have been processed.
    let mut grads: HashMap<TensorId, Tensor> = HashMap::new();
    grads.insert(root.id(), seed);
    let mut ready = BinaryHeap::new();
    ready.push(root.id());
    while let Some(id) = ready.pop() {
        let t = tensors.remove(&id).expect("queued tensors are known");
        let Some(grad) = grads.remove(&id) else { continue };
        let Some(node) = &t.0.node else {
            accumulate_into_leaf(&t, grad)?;
            continue;
        };
        run_hooks(&t);
        let routes = sink_routes(&node.op, &node.inputs, &edges, &tensors);
        let (input_grads, taken) = backward_with_sinks(node, &t, &grad, &routes);
        // a parameter whose gradient a sink took: this product was its one gradient of the
        // pass, so it is final
        if input_grads.is_ok() {
            for (route, made) in routes.iter().zip(taken) {
                match made {
                    Taken::No => {}
                    Taken::Added => {
                        tensors.remove(&route.leaf.id());
                        run_hooks(&route.leaf);
                    }
                    Taken::Made(g) => {
                        tensors.remove(&route.leaf.id());
                        accumulate_into_leaf(&route.leaf, g)?;
                    }
                }
            }
        }
        let input_grads = input_grads?;
        for (input, g) in node.inputs.iter().zip(input_grads) {
            if !input.requires_grad() {
                continue;
            }
            if let Some(g) = g {
                if g.shape() != input.shape() {
                    return Err(Error::Autograd(format!(
                        "{} backward produced a gradient of shape {:?} for an input of shape {:?}",
                        node.op.name(),
                        g.shape(),
                        input.shape()
                    )));
                }
                let g = if g.dtype() != input.dtype() {
                    g.cast(input.dtype())?
                } else {
                    g
                };
                let sum = match grads.remove(&input.id()) {
                    Some(prev) => crate::ops::accumulate::sum_gradients(prev, &g)?,
                    None => g,
                };
                grads.insert(input.id(), sum);
            }
            let d = deps.get_mut(&input.id()).expect("counted above");
            *d -= 1;
            if *d == 0 {
                if input.0.node.is_none() {
                    // a leaf's gradient is final now: accumulate it (and fire its hooks) at once
                    // rather than after every newer node, so data parallelism can start
                    // reducing it while the rest of the backward runs
                    tensors.remove(&input.id());
                    if let Some(g) = grads.remove(&input.id()) {
                        accumulate_into_leaf(input, g)?;
                    }
                } else {
                    ready.push(input.id());
                }
            }
        }
    }
    Ok(())
}

/// Where a product's input leads (gradient accumulation fusion): the parameter behind input
/// `input`, whether the input is its transpose, and whether it is autocast's lower-precision
/// copy of it.
struct SinkRoute {
    input: usize,
    leaf: Tensor,
    transposed: bool,
    copy: bool,
}

/// What a sink did with its input's gradient.
enum Taken {
    No,
    /// Added into the parameter's accumulated gradient in place.
    Added,
    /// Made in the parameter's dtype, to accumulate as any gradient.
    Made(Tensor),
}

/// The routes [`sink_leaf`] finds for a product's inputs (`Op::Matmul`'s two, `Op::Linear`'s
/// weight); none for any other op. `edges`: each tensor's count of incoming gradients in the
/// whole pass.
fn sink_routes(
    op: &Op,
    inputs: &[Tensor],
    edges: &HashMap<TensorId, usize>,
    tensors: &HashMap<TensorId, Tensor>,
) -> Vec<SinkRoute> {
    let candidates: &[usize] = match op {
        Op::Matmul => &[0, 1],
        Op::Linear { .. } => &[1],
        _ => &[],
    };
    candidates
        .iter()
        .filter_map(|&i| {
            let (leaf, transposed, copy) = sink_leaf(inputs.get(i)?, edges, tensors)?;
            Some(SinkRoute {
                input: i,
                leaf,
                transposed,
                copy,
            })
        })
        .collect()
}

/// `node`'s backward with a [`Sink`] offered for each route's input: holding the parameter's
/// accumulated gradient when nothing else holds it and fusion is on (not while a graph is being
/// captured: the tracer records ops, not additions in place), or none for autocast's copy
/// (whose gradient the sink makes in the parameter's dtype). The parameters' gradient slots stay
/// locked for the whole backward, so that nothing else reads, takes or replaces a gradient while
/// a product adds into it. Returns the backward's result and, by route, what its sink took.
fn backward_with_sinks(
    node: &Node,
    t: &Tensor,
    grad: &Tensor,
    routes: &[SinkRoute],
) -> (Result<Vec<Option<Tensor>>>, Vec<Taken>) {
    if routes.is_empty() {
        // every op but a product with a parameter behind it: nothing to offer, nothing to
        // allocate
        return (
            crate::ops::backward(&node.op, &node.inputs, t, &node.saved, grad, &[]),
            Vec::new(),
        );
    }
    let in_place = accumulation_fusion() && !crate::graph::recording();
    let slots: Vec<_> = routes
        .iter()
        .map(|r| r.leaf.0.grad.lock().unwrap_or_else(|e| e.into_inner()))
        .collect();
    let mut sinks: Vec<Option<Sink>> = node.inputs.iter().map(|_| None).collect();
    for (r, slot) in routes.iter().zip(&slots) {
        let dst = slot.as_ref().filter(|g| in_place && unshared_grad(g, &r.leaf)).cloned();
        if dst.is_some() || r.copy {
            sinks[r.input] = Some(Sink::new(dst, r.leaf.dtype(), r.transposed));
        }
    }
    let result = crate::ops::backward(&node.op, &node.inputs, t, &node.saved, grad, &sinks);
    let taken = routes
        .iter()
        .map(|r| match sinks[r.input].take() {
            Some(sink) if sink.added() => Taken::Added,
            Some(sink) => sink.into_parts().1.map_or(Taken::No, Taken::Made),
            None => Taken::No,
        })
        .collect();
    // the sinks' handles on the gradients are gone before the slots open
    drop(sinks);
    drop(slots);
    (result, taken)
}

/// The parameter behind `input`, whether `input` is its transpose, and whether it is
/// autocast's copy of it, when this edge is the only one that brings the parameter a gradient
/// in this pass: each tensor from `input` to the leaf has exactly one incoming gradient in the
/// whole pass (`edges`; the same parameter on both sides of a product, or tied to two layers,
/// has more) and no hooks, and the ops between them are 2-D transposes and at most one cast,
/// from the f32 parameter to bf16 or f16 (a cast that rounds the gradient on its way back, such
/// as a bf16 round trip, would be skipped).
fn sink_leaf(
    input: &Tensor,
    edges: &HashMap<TensorId, usize>,
    tensors: &HashMap<TensorId, Tensor>,
) -> Option<(Tensor, bool, bool)> {
    let mut t = tensors.get(&input.id())?.clone();
    let (mut transposed, mut cast) = (false, false);
    // a transpose and a cast, in either order, or a few transposes
    for _ in 0..4 {
        if !t.requires_grad() || edges.get(&t.id()) != Some(&1) {
            return None;
        }
        let Some(node) = &t.0.node else {
            return (!cast || t.dtype() == crate::DType::F32).then_some((t, transposed, cast));
        };
        if !t.0.hooks.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
            return None;
        }
        match &node.op {
            Op::Permute(p) if p.as_slice() == [1, 0] => transposed = !transposed,
            Op::Cast(crate::DType::BF16 | crate::DType::F16) if !cast => cast = true,
            _ => return None,
        }
        let [next] = node.inputs.as_slice() else {
            return None;
        };
        t = tensors.get(&next.id())?.clone();
    }
    None
}

/// Whether `g`, the gradient `leaf` holds, may be added to in place: contiguous, of the leaf's
/// shape, dtype and device, and held by nothing else (no other handle, no view of its storage),
/// so that the addition changes nothing anyone else can see.
fn unshared_grad(g: &Tensor, leaf: &Tensor) -> bool {
    Arc::strong_count(&g.0) == 1
        && Arc::strong_count(g.storage()) == 1
        && g.is_contiguous()
        && g.shape() == leaf.shape()
        && g.dtype() == leaf.dtype()
        && g.device() == leaf.device()
        && !g.is_backward_handle()
}

fn accumulate_into_leaf(leaf: &Tensor, grad: Tensor) -> Result<()> {
    {
        let mut slot = leaf.0.grad.lock().unwrap_or_else(|e| e.into_inner());
        let new = match slot.take() {
            Some(prev) => prev.add(&grad)?,
            // Own the buffer: the same gradient tensor may have been handed to other inputs.
            None if Arc::strong_count(grad.storage()) == 1 && grad.is_contiguous() => grad.detach(),
            None => grad.contiguous_copy()?,
        };
        *slot = Some(new);
    }
    run_hooks(leaf);
    Ok(())
}

/// Calls the grad-ready hooks of `t` (cloned out of the lock, so a hook may register more).
fn run_hooks(t: &Tensor) {
    let hooks = t.0.hooks.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if !hooks.is_empty() {
        crate::graph::note_hooks();
    }
    for hook in hooks {
        hook(t);
    }
}
