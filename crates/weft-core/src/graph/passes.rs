//! Graph rewrites. Each keeps the results bit for bit: folding runs the same kernels at build
//! time, merging and removal never change what a kept node computes.

use std::collections::HashMap;

use super::ir::{Graph, Source, ValueId};
use crate::error::Result;
use crate::op::Op;

/// Largest result (in elements) that constant folding stores in the graph; larger constant
/// subgraphs stay nodes, so the graph does not hold big buffers between calls.
pub const FOLD_MAX_ELEMENTS: usize = 1 << 16;

/// What [`optimize`] changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Nodes before the passes (as captured).
    pub captured: usize,
    /// Nodes evaluated at build time and replaced by their results.
    pub folded: usize,
    /// Nodes that repeated an earlier node on the same inputs.
    pub merged: usize,
    /// Nodes whose results no result depends on.
    pub removed: usize,
}

/// Runs constant folding, common-subexpression elimination and dead-code elimination, then drops
/// values nothing refers to.
pub fn optimize(g: &mut Graph) -> Result<PassReport> {
    let captured = g.nodes.len();
    let folded = fold_constants(g)?;
    let merged = eliminate_common(g);
    let removed = eliminate_dead(g);
    compact(g);
    Ok(PassReport {
        captured,
        folded,
        merged,
        removed,
    })
}

/// Ops that must run at every call even when their inputs are known.
fn keeps_running(op: &Op) -> bool {
    matches!(
        op,
        Op::Custom(_) | Op::ToDevice(_) | Op::Random { .. } | Op::Dropout { .. }
    )
}

/// Evaluates nodes whose inputs are all constants (and nodes with no inputs, such as fills) and
/// turns their results into constants. Returns the number of nodes folded.
pub fn fold_constants(g: &mut Graph) -> Result<usize> {
    let mut kept = Vec::with_capacity(g.nodes.len());
    let mut folded = 0;
    for node in std::mem::take(&mut g.nodes) {
        let constant_inputs = node
            .inputs
            .iter()
            .map(|&v| match &g.values[v].source {
                Source::Constant(t) => Some(t.clone()),
                _ => None,
            })
            .collect::<Option<Vec<_>>>();
        let small = node
            .outputs
            .iter()
            .all(|&v| g.values[v].shape.iter().product::<usize>() <= FOLD_MAX_ELEMENTS);
        match constant_inputs {
            Some(args) if small && !keeps_running(&node.op) => {
                let refs: Vec<_> = args.iter().collect();
                let outs = crate::ops::execute(&node.op, &refs)?;
                for (&v, t) in node.outputs.iter().zip(outs) {
                    g.values[v].source = Source::Constant(t);
                }
                folded += 1;
            }
            _ => kept.push(node),
        }
    }
    g.nodes = kept;
    g.renumber();
    Ok(folded)
}

/// Merges a node into an earlier one with an equal op and the same inputs: readers of its results
/// read the earlier node's. Returns the number of nodes merged.
pub fn eliminate_common(g: &mut Graph) -> usize {
    let mut seen: HashMap<(&'static str, Vec<ValueId>), Vec<usize>> = HashMap::new();
    let mut replace: Vec<ValueId> = (0..g.values.len()).collect();
    let mut kept: Vec<super::ir::Node> = Vec::with_capacity(g.nodes.len());
    let mut merged = 0;
    for mut node in std::mem::take(&mut g.nodes) {
        for v in node.inputs.iter_mut() {
            *v = replace[*v];
        }
        let key = (node.op.name(), node.inputs.clone());
        let twin = if keeps_running(&node.op) {
            None
        } else {
            seen.get(&key).and_then(|cands| {
                cands
                    .iter()
                    .copied()
                    .find(|&k| kept[k].op == node.op && kept[k].outputs.len() == node.outputs.len())
            })
        };
        match twin {
            Some(k) => {
                for (&mine, &theirs) in node.outputs.iter().zip(&kept[k].outputs) {
                    replace[mine] = theirs;
                }
                merged += 1;
            }
            None => {
                seen.entry(key).or_default().push(kept.len());
                kept.push(node);
            }
        }
    }
    for v in g.outputs.iter_mut() {
        *v = replace[*v];
    }
    g.nodes = kept;
    g.renumber();
    merged
}

/// Removes nodes none of whose results is read by a kept node or returned. Returns the number
/// removed.
pub fn eliminate_dead(g: &mut Graph) -> usize {
    let mut live = vec![false; g.values.len()];
    for &v in &g.outputs {
        live[v] = true;
    }
    let mut keep = vec![false; g.nodes.len()];
    for (i, node) in g.nodes.iter().enumerate().rev() {
        if node.outputs.iter().any(|&v| live[v]) || matches!(node.op, Op::Custom(_)) {
            keep[i] = true;
            for &v in &node.inputs {
                live[v] = true;
            }
        }
    }
    let before = g.nodes.len();
    let mut i = 0;
    g.nodes.retain(|_| {
        i += 1;
        keep[i - 1]
    });
    g.renumber();
    before - g.nodes.len()
}

/// Drops values that no node, input or result refers to, and numbers the rest densely.
pub fn compact(g: &mut Graph) {
    let mut used = vec![false; g.values.len()];
    for &v in g.inputs.iter().chain(&g.outputs) {
        used[v] = true;
    }
    for n in &g.nodes {
        for &v in n.inputs.iter().chain(&n.outputs) {
            used[v] = true;
        }
    }
    let mut map = vec![usize::MAX; g.values.len()];
    let mut values = Vec::with_capacity(g.values.len());
    for (v, value) in std::mem::take(&mut g.values).into_iter().enumerate() {
        if used[v] {
            map[v] = values.len();
            values.push(value);
        }
    }
    g.values = values;
    for v in g.inputs.iter_mut().chain(g.outputs.iter_mut()) {
        *v = map[*v];
    }
    for n in g.nodes.iter_mut() {
        for v in n.inputs.iter_mut().chain(n.outputs.iter_mut()) {
            *v = map[*v];
        }
    }
    g.renumber();
}
