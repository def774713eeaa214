//! Replay: the nodes run in order through the dispatcher, each computed buffer dropped after
//! its last reader.

use std::sync::Arc;

use super::ir::{Graph, Source, ValueId};
use crate::error::{invalid, Result};
use crate::op::Op;
use crate::Tensor;

/// A graph with what replay needs to know of its values, worked out once: the last node that
/// reads each, and which are results; and where its random draws start on the function's
/// random stream, when it has any.
pub(crate) struct Prepared {
    pub(crate) graph: Graph,
    last: Vec<Option<usize>>,
    is_output: Vec<bool>,
    /// The stream's offset when the graph was captured, and the counters one call takes.
    pub(crate) draws: Option<Draws>,
}

/// Where a graph's random draws lie on its function's random stream.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Draws {
    /// The stream's offset at the start of the captured call.
    pub base: u64,
    /// Counters one call takes.
    pub taken: u64,
}

/// `op` moved from stream offset `from` to `to` when it draws random numbers (a random tensor,
/// a dropout mask, or a dropout's backward, which draws its mask again); `None` otherwise.
pub(crate) fn moved(op: &Op, from: u64, to: u64) -> Option<Op> {
    let at = |offset: u64| offset.wrapping_sub(from).wrapping_add(to);
    match op {
        Op::Dropout { p, seed, offset } => Some(Op::Dropout {
            p: *p,
            seed: *seed,
            offset: at(*offset),
        }),
        Op::Random {
            shape,
            dtype,
            dist,
            seed,
            offset,
        } => Some(Op::Random {
            shape: shape.clone(),
            dtype: *dtype,
            dist: *dist,
            seed: *seed,
            offset: at(*offset),
        }),
        _ => None,
    }
}

impl Prepared {
    pub(crate) fn new(graph: Graph) -> Prepared {
        let (last, is_output) = graph.lifetimes();
        Prepared {
            graph,
            last,
            is_output,
            draws: None,
        }
    }

    /// [`Graph::run`], its random draws starting at stream offset `at` (see [`moved`]).
    pub(crate) fn run(&self, inputs: &[Tensor], at: Option<u64>) -> Result<Vec<Tensor>> {
        self.run_each(inputs, at, &mut |_, op, args| crate::ops::execute(op, args))
    }

    /// [`Prepared::run`] with `exec(node index, op, inputs)` running each node (its random
    /// draws already moved to start at `at`).
    pub(crate) fn run_each(&self, inputs: &[Tensor], at: Option<u64>, exec: &mut Exec) -> Result<Vec<Tensor>> {
        let shift = self.draws.zip(at).map(|(d, at)| (d.base, at));
        let mut exec_moved =
            |i: usize, op: &Op, args: &[&Tensor]| match shift.and_then(|(from, to)| moved(op, from, to)) {
                Some(op) => exec(i, &op, args),
                None => exec(i, op, args),
            };
        self.graph
            .run_with(&self.last, &self.is_output, inputs, &mut exec_moved)
    }
}

/// Runs one node: `(node index, op, inputs) -> outputs`.
pub(crate) type Exec<'a> = dyn FnMut(usize, &Op, &[&Tensor]) -> Result<Vec<Tensor>> + 'a;

impl Graph {
    /// Runs the graph on `inputs` (the shapes and dtypes it was captured with) and returns its
    /// results. A computed result never shares a buffer with another result or with anything the
    /// graph holds, as an eager one would not. (A compiled function's graphs keep what this
    /// works out about their values between calls.)
    pub fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let (last, is_output) = self.lifetimes();
        self.run_with(&last, &is_output, inputs, &mut |_, op, args| {
            crate::ops::execute(op, args)
        })
    }

    /// For each value, the last node that reads it, and whether it is a result.
    fn lifetimes(&self) -> (Vec<Option<usize>>, Vec<bool>) {
        let mut is_output = vec![false; self.values.len()];
        for &v in &self.outputs {
            is_output[v] = true;
        }
        (self.last_reader(), is_output)
    }

    /// Runs the graph, each node through `exec`; `last[v]`: the last node reading value `v`,
    /// `is_output[v]`: whether it is a result.
    fn run_with(
        &self,
        last: &[Option<usize>],
        is_output: &[bool],
        inputs: &[Tensor],
        exec: &mut Exec,
    ) -> Result<Vec<Tensor>> {
        self.check_inputs(inputs)?;
        let mut slots: Vec<Option<Tensor>> = vec![None; self.values.len()];
        let get = |slots: &[Option<Tensor>], v: ValueId| -> Result<Tensor> {
            match &self.values[v].source {
                Source::Input(i) => Ok(inputs[*i].clone()),
                Source::External(t) | Source::Constant(t) => Ok(t.clone()),
                Source::Node { .. } => slots[v]
                    .clone()
                    .ok_or_else(|| invalid("graph", format!("value %{v} is read before it is computed"))),
            }
        };
        for (i, node) in self.nodes.iter().enumerate() {
            let args = node
                .inputs
                .iter()
                .map(|&v| get(&slots, v))
                .collect::<Result<Vec<_>>>()?;
            let refs: Vec<&Tensor> = args.iter().collect();
            let outs = exec(i, &node.op, &refs)?;
            drop(refs);
            drop(args);
            if outs.len() < node.outputs.len() {
                return Err(invalid(
                    "graph",
                    format!(
                        "node {i} ({}) gave {} results, the capture saw {}",
                        node.op.name(),
                        outs.len(),
                        node.outputs.len()
                    ),
                ));
            }
            for (&v, t) in node.outputs.iter().zip(outs) {
                if last[v].is_some() || is_output[v] {
                    slots[v] = Some(t);
                }
            }
            for &v in &node.inputs {
                if last[v] == Some(i) && !is_output[v] {
                    slots[v] = None;
                }
            }
        }
        let results = self
            .outputs
            .iter()
            .map(|&v| get(&slots, v))
            .collect::<Result<Vec<_>>>()?;
        drop(slots);
        // Inputs and parameters come back as themselves, as eagerly. A constant, or a computed
        // buffer that something else still holds (another result after merging, a constant, a
        // parameter), would be a fresh buffer eagerly: it gets its own copy.
        let mut owned = Vec::with_capacity(results.len());
        for (k, (t, &v)) in results.iter().zip(&self.outputs).enumerate() {
            let copy = match self.values[v].source {
                Source::Input(_) | Source::External(_) => false,
                Source::Constant(_) => true,
                Source::Node { .. } => {
                    Arc::strong_count(t.storage()) > 1 || results[..k].iter().any(|r| r.same_storage(t))
                }
            };
            owned.push(if copy { t.contiguous_copy()? } else { t.clone() });
        }
        Ok(owned)
    }

    /// Checks `inputs` against the captured shapes and dtypes, naming the first that differs.
    fn check_inputs(&self, inputs: &[Tensor]) -> Result<()> {
        if inputs.len() != self.inputs.len() {
            return Err(invalid(
                "graph",
                format!("{} inputs given, the graph takes {}", inputs.len(), self.inputs.len()),
            ));
        }
        for (i, (t, &v)) in inputs.iter().zip(&self.inputs).enumerate() {
            let want = &self.values[v];
            if t.shape() != want.shape.as_slice() || t.dtype() != want.dtype {
                return Err(invalid(
                    "graph",
                    format!(
                        "input {i} is {:?} {:?}, the graph was captured with {:?} {:?}",
                        t.dtype(),
                        t.shape(),
                        want.dtype,
                        want.shape
                    ),
                ));
            }
        }
        Ok(())
    }
}
