//! Recomputation (rematerialization): a value made early and read again much later (an
//! activation the forward makes and the backward reads) is made a second time next to its late
//! readers when that is cheap and lowers the graph's peak memory. The first copy is then freed
//! after its early readers.
//!
//! The pass is driven by the peak: at the node step where the most bytes are alive, it takes the
//! largest buffer alive there that (a) a cheap node made (an elementwise op, a normalization, or
//! the activation of a fused `Linear`, recomputed from the pre-activation the `Linear` keeps
//! anyway), (b) is read both before and after that step, and (c) can be made again from values
//! still alive at its first late reader (inputs, parameters, or buffers whose own lifetime
//! reaches that far). It inserts the recomputation (and the views the late readers read) just
//! before the first late reader, points the late readers at it, and keeps the change only if the
//! peak went down. It repeats until no buffer at the peak qualifies. The search counts each
//! node's values in buffers of their own; the memory plan counts them as the replay holds them
//! (one-pass groups, results written into dying inputs), and the pass's changes are kept only
//! when the plan's peak went down too. Its report gives the plan's peaks.
//!
//! A recomputation runs the same kernel on the same inputs as the first computation (the fused
//! `Linear`'s activation runs the per-element function the `Linear` applies to its blocks), so
//! results stay bit for bit.

use std::collections::{HashMap, HashSet};

use super::ir::{Graph, Node, Source, Value, ValueId};
use crate::op::Op;

/// Largest number of recomputations one graph gets (each costs a pass over its buffer).
const MAX_RECOMPUTED: usize = 256;

/// Largest number of changes tried on one graph (each trial copies the graph and works out its
/// lifetimes again), so that the pass stays quick on a capture of many thousands of nodes.
const MAX_TRIALS: usize = 4096;

/// What [`rematerialize`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RematReport {
    /// Buffers made a second time next to their late readers.
    pub recomputed: usize,
    /// The memory plan's peak of computed bytes alive at one step ([`super::plan::plan`]),
    /// before and after.
    pub peak_before: usize,
    pub peak_after: usize,
}

/// Recomputes cheap values next to their late readers while that lowers the peak (see the
/// module docs).
pub fn rematerialize(g: &mut Graph) -> RematReport {
    let peak_before = super::plan::peak(g);
    let original = g.clone();
    // buffers that did not qualify at the current peak (tried again once the graph changes)
    let mut rejected: HashSet<usize> = HashSet::new();
    let (mut recomputed, mut trials) = (0, 0);
    'search: while recomputed < MAX_RECOMPUTED && trials < MAX_TRIALS {
        let life = Lifetimes::of(g);
        let (peak, at) = life.peak();
        let mut candidates: Vec<usize> = life
            .computed_buffers()
            .filter(|&b| life.first[b] < at && life.last[b] > at && life.last[b] < g.nodes.len())
            .filter(|b| !rejected.contains(b))
            .collect();
        candidates.sort_by(|&a, &b| life.bytes[b].cmp(&life.bytes[a]).then(a.cmp(&b)));
        for b in candidates {
            let Some(change) = plan_recompute(g, &life, b, at) else {
                rejected.insert(b);
                continue;
            };
            if trials == MAX_TRIALS {
                break 'search;
            }
            trials += 1;
            let mut trial = g.clone();
            change.apply(&mut trial);
            if Lifetimes::of(&trial).peak().0 < peak {
                *g = trial;
                recomputed += 1;
                rejected.clear();
                continue 'search;
            }
            rejected.insert(b);
        }
        break;
    }
    // the search counts each node's values apart; what the plan counts must go down too
    let peak_after = super::plan::peak(g);
    if recomputed > 0 && peak_after >= peak_before {
        *g = original;
        return RematReport {
            recomputed: 0,
            peak_before,
            peak_after: peak_before,
        };
    }
    RematReport {
        recomputed,
        peak_before,
        peak_after,
    }
}

/// Each buffer's bytes and lifetime in node steps, as the memory plan counts them.
struct Lifetimes {
    bytes: Vec<usize>,
    /// The first node that makes a value of the buffer (`usize::MAX`: none does, or it is an
    /// input, a parameter or a constant).
    first: Vec<usize>,
    /// The last node that reads it; `nodes.len()` when a result holds it.
    last: Vec<usize>,
    /// Bytes alive at each node step.
    live: Vec<usize>,
}

impl Lifetimes {
    /// Each node's buffers as if it ran alone ([`super::plan::node_lifetimes`]), indexed by
    /// buffer id. (The search runs on these: on the replay's lifetimes, where a result written
    /// into a dying input keeps that buffer alive, it finds less to recompute; measured on the
    /// speed-target GPT, its choice then held 0.5 MB more at the replay's peak.)
    fn of(g: &Graph) -> Lifetimes {
        let buffers = super::plan::node_lifetimes(g);
        let nb = g.values.iter().map(|v| v.buffer + 1).max().unwrap_or(0);
        let (mut bytes, mut first, mut last) = (vec![0; nb], vec![usize::MAX; nb], vec![0; nb]);
        for p in &buffers {
            (bytes[p.buffer], first[p.buffer], last[p.buffer]) = (p.bytes, p.first, p.last);
        }
        Lifetimes {
            bytes,
            first,
            last,
            live: super::plan::live_bytes(&buffers, g.nodes.len()),
        }
    }

    /// The most bytes alive at one step, and the first step where that many are.
    fn peak(&self) -> (usize, usize) {
        let mut best = (0, 0);
        for (i, &b) in self.live.iter().enumerate() {
            if b > best.0 {
                best = (b, i);
            }
        }
        best
    }

    /// Buffers some node makes.
    fn computed_buffers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.first.len()).filter(|&b| self.first[b] != usize::MAX)
    }
}

/// How a buffer's root value is made again.
enum Recipe {
    /// Run node `node` again on its inputs; the root is its output `output`.
    Rerun { node: usize, output: usize },
    /// `act(pre)`: the activation a fused `Linear` applied, from its pre-activation output.
    Activation { act: crate::UnaryOp, pre: ValueId },
}

/// A recomputation to insert before node `before`: the recipe for `root`, the view nodes that
/// lead from `root` to each value the late readers read (root first), and the late readers.
struct Change {
    recipe: Recipe,
    root: ValueId,
    /// View nodes to make again, each reading the root or an earlier one's output.
    views: Vec<usize>,
    before: usize,
    /// Nodes after the peak that read the buffer.
    late: Vec<usize>,
    buffer: usize,
}

/// Ops whose result is cheap to make again: one pass over memory, deterministic.
fn cheap(op: &Op) -> bool {
    op.is_elementwise() || matches!(op, Op::Norm { .. } | Op::Softmax { .. })
}

/// Ops whose result is a view of their one input (no buffer of its own).
fn is_view(op: &Op) -> bool {
    matches!(op, Op::Reshape(_) | Op::Permute(_) | Op::Narrow { .. } | Op::Expand(_))
}

/// The recomputation of buffer `b` (alive across step `at`), if it qualifies.
fn plan_recompute(g: &Graph, life: &Lifetimes, b: usize, at: usize) -> Option<Change> {
    let root_node = life.first[b];
    let node = &g.nodes[root_node];
    let output = node.outputs.iter().position(|&v| g.values[v].buffer == b)?;
    let root = node.outputs[output];
    let recipe = match &node.op {
        Op::Linear {
            act: Some(act),
            residual: false,
            ..
        } if output == 0 && node.outputs.len() == 2 => Recipe::Activation {
            act: *act,
            pre: node.outputs[1],
        },
        op if cheap(op) => Recipe::Rerun {
            node: root_node,
            output,
        },
        _ => return None,
    };
    // (a view of the buffer is no reader of its own: its readers are)
    let late: Vec<usize> = (at + 1..g.nodes.len())
        .filter(|&j| g.nodes[j].inputs.iter().any(|&v| g.values[v].buffer == b))
        .filter(|&j| !(is_view(&g.nodes[j].op) && g.values[g.nodes[j].outputs[0]].buffer == b))
        .collect();
    let before = *late.first()?;
    // what the recipe reads must be alive at `before` anyway
    let needs: Vec<ValueId> = match &recipe {
        Recipe::Rerun { node, .. } => g.nodes[*node].inputs.clone(),
        Recipe::Activation { pre, .. } => vec![*pre],
    };
    for v in needs {
        let value = &g.values[v];
        if matches!(value.source, Source::Node { .. }) && (value.buffer == b || life.last[value.buffer] < before) {
            return None;
        }
    }
    // every value of the buffer that a late reader reads must be a chain of views of the root
    let mut views = Vec::new();
    let mut reached: HashSet<ValueId> = HashSet::from([root]);
    for &j in &late {
        for &v in &g.nodes[j].inputs {
            if g.values[v].buffer == b {
                chain(g, v, &mut reached, &mut views)?;
            }
        }
    }
    Some(Change {
        recipe,
        root,
        views,
        before,
        late,
        buffer: b,
    })
}

/// Adds to `views` (root side first) the view nodes that make `v` from a value in `reached`;
/// `None` when `v` is not such a view.
fn chain(g: &Graph, v: ValueId, reached: &mut HashSet<ValueId>, views: &mut Vec<usize>) -> Option<()> {
    if reached.contains(&v) {
        return Some(());
    }
    let Source::Node { node, .. } = g.values[v].source else {
        return None;
    };
    let n = &g.nodes[node];
    if !is_view(&n.op) || n.inputs.len() != 1 || n.outputs.len() != 1 {
        return None;
    }
    chain(g, n.inputs[0], reached, views)?;
    reached.insert(v);
    views.push(node);
    Some(())
}

impl Change {
    /// Inserts the recomputation before `self.before` and points the late readers at it.
    fn apply(self, g: &mut Graph) {
        let mut next_buffer = g.values.iter().map(|v| v.buffer + 1).max().unwrap_or(0);
        let mut fresh = |g: &mut Graph, like: ValueId, shared: Option<usize>| -> ValueId {
            let mut value: Value = g.values[like].clone();
            value.buffer = shared.unwrap_or_else(|| {
                next_buffer += 1;
                next_buffer - 1
            });
            // the source is set by `renumber`
            value.source = Source::Node { node: 0, output: 0 };
            g.values.push(value);
            g.values.len() - 1
        };
        let mut inserted: Vec<Node> = Vec::new();
        let mut map: HashMap<ValueId, ValueId> = HashMap::new();
        let new_root = match self.recipe {
            Recipe::Rerun { node, output } => {
                let original = g.nodes[node].clone();
                let outputs: Vec<ValueId> = original.outputs.iter().map(|&v| fresh(g, v, None)).collect();
                let root = outputs[output];
                inserted.push(Node {
                    op: original.op,
                    inputs: original.inputs,
                    outputs,
                });
                root
            }
            Recipe::Activation { act, pre } => {
                let root = fresh(g, self.root, None);
                inserted.push(Node {
                    op: Op::Unary(act),
                    inputs: vec![pre],
                    outputs: vec![root],
                });
                root
            }
        };
        map.insert(self.root, new_root);
        let buffer = g.values[new_root].buffer;
        for &k in &self.views {
            let view = g.nodes[k].clone();
            let out = fresh(g, view.outputs[0], Some(buffer));
            map.insert(view.outputs[0], out);
            inserted.push(Node {
                op: view.op,
                inputs: vec![map[&view.inputs[0]]],
                outputs: vec![out],
            });
        }
        for &j in &self.late {
            for v in g.nodes[j].inputs.iter_mut() {
                if g.values[*v].buffer == self.buffer {
                    *v = map[v];
                }
            }
        }
        let tail = g.nodes.split_off(self.before);
        g.nodes.extend(inserted);
        g.nodes.extend(tail);
        g.renumber();
        // views of the first copy that only late readers read are now read by none
        super::passes::eliminate_dead(g);
    }
}
