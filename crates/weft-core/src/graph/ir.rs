//! The graph IR: values (inputs, externals, constants, node outputs) and nodes whose operations
//! are [`Op`] values.

use crate::op::Op;
use crate::{DType, Tensor};

/// Index of a value in [`Graph::values`].
pub type ValueId = usize;

/// Where a value comes from.
#[derive(Clone, Debug)]
pub enum Source {
    /// Argument `i` of the captured closure: new at every call.
    Input(usize),
    /// A tensor made before the capture (a parameter), read by reference at every replay.
    External(Tensor),
    /// A tensor known when the graph is built (the result of constant folding): its data is
    /// fixed.
    Constant(Tensor),
    /// Output `output` of node `node`.
    Node { node: usize, output: usize },
}

/// One value of the graph, with what the capture saw of it.
#[derive(Clone, Debug)]
pub struct Value {
    pub source: Source,
    /// Shape at capture time.
    pub shape: Vec<usize>,
    pub dtype: DType,
    /// The buffer this value lives in: values that are views of one storage share it.
    pub buffer: usize,
    /// Bytes of that buffer (its whole storage, not only this view's elements).
    pub bytes: usize,
}

/// One operation: `outputs = op(inputs)`. The first output is the op's result, the others are
/// what its forward saves for a backward (or further results of a backward kernel).
#[derive(Clone, Debug)]
pub struct Node {
    pub op: Op,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
}

/// A captured computation. Nodes are in execution order; every node's inputs are defined by an
/// earlier node or are inputs, externals or constants.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub values: Vec<Value>,
    pub nodes: Vec<Node>,
    /// The closure's arguments, in order.
    pub inputs: Vec<ValueId>,
    /// The closure's results, in order.
    pub outputs: Vec<ValueId>,
}

impl Graph {
    /// Values that are node outputs (not inputs, externals or constants).
    pub fn is_computed(&self, v: ValueId) -> bool {
        matches!(self.values[v].source, Source::Node { .. })
    }

    /// For each value, the index of the last node that reads it (`None` when no node does).
    pub fn last_reader(&self) -> Vec<Option<usize>> {
        let mut last = vec![None; self.values.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for &v in &n.inputs {
                last[v] = Some(i);
            }
        }
        last
    }

    /// Re-numbers `Source::Node` entries after nodes were removed or reordered.
    pub(crate) fn renumber(&mut self) {
        for (i, n) in self.nodes.iter().enumerate() {
            for (k, &v) in n.outputs.iter().enumerate() {
                self.values[v].source = Source::Node { node: i, output: k };
            }
        }
    }

    /// How many nodes run each op name, for summaries.
    pub fn op_counts(&self) -> Vec<(&'static str, usize)> {
        let mut counts: Vec<(&'static str, usize)> = Vec::new();
        for n in &self.nodes {
            match counts.iter_mut().find(|(name, _)| *name == n.op.name()) {
                Some((_, c)) => *c += 1,
                None => counts.push((n.op.name(), 1)),
            }
        }
        counts
    }
}
