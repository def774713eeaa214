//! Replay: the nodes run in order through the dispatcher, each computed buffer dropped after
//! its last reader. Fusion groups of f32 elementwise nodes run as one pass
//! ([`super::pointwise`]) at their last node, writing into a dying input's buffer when nothing
//! else holds it.

use std::sync::{Arc, Mutex};

use super::ir::{Graph, Source, ValueId};
use super::pointwise::{self, Program, ReplayStats};
use crate::error::{invalid, Result};
use crate::op::Op;
use crate::Tensor;

/// A graph with what replay needs to know, worked out once: how each node runs (alone, or in
/// its fusion group's one-pass program), the step after which each value is dropped, and which
/// values are results; and where its random draws start on the function's random stream, when
/// it has any.
pub(crate) struct Prepared {
    pub(crate) graph: Graph,
    schedule: Schedule,
    is_output: Vec<bool>,
    /// Per value: its position among the results when a replay may hand it over as soon as it
    /// is computed (see [`Prepared::run_handing`]).
    early: Vec<Option<usize>>,
    /// What the latest replay did with its fusion groups.
    stats: Mutex<ReplayStats>,
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
        let (_, is_output) = graph.lifetimes();
        let schedule = Schedule::new(&graph, &is_output);
        let early = early_results(&graph, &schedule);
        Prepared {
            graph,
            schedule,
            is_output,
            early,
            stats: Mutex::new(ReplayStats::default()),
            draws: None,
        }
    }

    /// What the latest replay did with its fusion groups.
    pub(crate) fn stats(&self) -> ReplayStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`Graph::run`], its random draws starting at stream offset `at` (see [`moved`]).
    pub(crate) fn run(&self, inputs: &[Tensor], at: Option<u64>) -> Result<Vec<Tensor>> {
        self.run_each(inputs, at, &mut |_, op, args| crate::ops::execute(op, args))
    }

    /// [`Prepared::run`] with `exec(node index, op, inputs)` running each node (its random
    /// draws already moved to start at `at`).
    pub(crate) fn run_each(&self, inputs: &[Tensor], at: Option<u64>, exec: &mut Exec) -> Result<Vec<Tensor>> {
        all_present(self.replay(inputs, at, exec, None)?)
    }

    /// [`Prepared::run`] that calls `ready(k, result)` for result `k` as soon as the replay has
    /// made it, when nothing the replay does later can touch it: a value a node computes that no
    /// later node reads, that is no other result, and whose buffer nothing else holds at that
    /// moment. (A training step's gradients are such results: a data-parallel reduction can
    /// start on each while the rest of backward runs.) The replay keeps no reference to a
    /// result it handed over. Returns the results, `None` for those `ready` got.
    pub(crate) fn run_handing(
        &self,
        inputs: &[Tensor],
        at: Option<u64>,
        ready: &mut Ready,
    ) -> Result<Vec<Option<Tensor>>> {
        let hand = Handing {
            early: &self.early,
            ready,
        };
        self.replay(inputs, at, &mut |_, op, args| crate::ops::execute(op, args), Some(hand))
    }

    /// The replay behind [`Prepared::run_each`] and [`Prepared::run_handing`].
    fn replay(
        &self,
        inputs: &[Tensor],
        at: Option<u64>,
        exec: &mut Exec,
        hand: Option<Handing>,
    ) -> Result<Vec<Option<Tensor>>> {
        let shift = self.draws.zip(at).map(|(d, at)| (d.base, at));
        let mut exec_moved =
            |i: usize, op: &Op, args: &[&Tensor]| match shift.and_then(|(from, to)| moved(op, from, to)) {
                Some(op) => exec(i, &op, args),
                None => exec(i, op, args),
            };
        let (outputs, stats) = self
            .graph
            .run_with(&self.schedule, &self.is_output, inputs, &mut exec_moved, hand)?;
        *self.stats.lock().unwrap_or_else(|e| e.into_inner()) = stats;
        Ok(outputs)
    }
}

/// The results of a replay that handed none over.
pub(crate) fn all_present(outputs: Vec<Option<Tensor>>) -> Result<Vec<Tensor>> {
    outputs
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| invalid("graph", "a replay that hands no result over returned none for one"))
}

/// Runs one node: `(node index, op, inputs) -> outputs`.
pub(crate) type Exec<'a> = dyn FnMut(usize, &Op, &[&Tensor]) -> Result<Vec<Tensor>> + 'a;

/// Takes result `k` of a replay as soon as it is made: `(k, result)`.
pub type Ready<'a> = dyn FnMut(usize, &Tensor) -> Result<()> + 'a;

/// The results a replay hands over early: per value its result position, and where to.
struct Handing<'a, 'b> {
    early: &'a [Option<usize>],
    ready: &'a mut Ready<'b>,
}

/// Per value of `g`: its position among the results when a replay may hand it over as soon as
/// its node has run: computed by a node, read by no node, and a result once only.
fn early_results(g: &Graph, schedule: &Schedule) -> Vec<Option<usize>> {
    let mut early = vec![None; g.values.len()];
    let mut seen = vec![0usize; g.values.len()];
    for &v in &g.outputs {
        seen[v] += 1;
    }
    for (k, &v) in g.outputs.iter().enumerate() {
        let computed = matches!(g.values[v].source, Source::Node { .. });
        if computed && seen[v] == 1 && schedule.last[v].is_none() {
            early[v] = Some(k);
        }
    }
    early
}

impl Graph {
    /// Runs the graph on `inputs` (the shapes and dtypes it was captured with) and returns its
    /// results. A computed result never shares a buffer with another result or with anything the
    /// graph holds, as an eager one would not. (A compiled function's graphs keep what this
    /// works out about their values between calls.)
    pub fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        Ok(self.run_stats(inputs)?.0)
    }

    /// [`Graph::run`], with what the replay did with its fusion groups.
    pub fn run_stats(&self, inputs: &[Tensor]) -> Result<(Vec<Tensor>, ReplayStats)> {
        let (_, is_output) = self.lifetimes();
        let schedule = Schedule::new(self, &is_output);
        let (outputs, stats) = self.run_with(
            &schedule,
            &is_output,
            inputs,
            &mut |_, op, args| crate::ops::execute(op, args),
            None,
        )?;
        Ok((all_present(outputs)?, stats))
    }

    /// For each value, the last node that reads it, and whether it is a result.
    pub(crate) fn lifetimes(&self) -> (Vec<Option<usize>>, Vec<bool>) {
        let mut is_output = vec![false; self.values.len()];
        for &v in &self.outputs {
            is_output[v] = true;
        }
        (self.last_reader(), is_output)
    }

    /// Runs the graph, each node through `exec` (fused groups as one pass); `schedule`: how
    /// each node runs and the step after which each value is dropped, `is_output[v]`: whether
    /// value `v` is a result; `hand`: results to hand over as soon as they are made (see
    /// [`Prepared::run_handing`]). Returns the results (`None` for those handed over) and the
    /// fusion groups' statistics.
    fn run_with(
        &self,
        schedule: &Schedule,
        is_output: &[bool],
        inputs: &[Tensor],
        exec: &mut Exec,
        mut hand: Option<Handing>,
    ) -> Result<(Vec<Option<Tensor>>, ReplayStats)> {
        self.check_inputs(inputs)?;
        let mut handed = vec![false; self.outputs.len()];
        let last = &schedule.last;
        let mut stats = ReplayStats::default();
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
            let (outs, read): (Vec<Tensor>, &[ValueId]) = match schedule.role[i] {
                Role::Deferred => continue,
                Role::Alone => {
                    let args = node
                        .inputs
                        .iter()
                        .map(|&v| get(&slots, v))
                        .collect::<Result<Vec<_>>>()?;
                    let refs: Vec<&Tensor> = args.iter().collect();
                    (exec(i, &node.op, &refs)?, &node.inputs)
                }
                Role::Runs(k) => {
                    let (p, donors) = &schedule.programs[k];
                    // a donor's slot is emptied first, so that the pass may find its buffer unshared
                    let mut args = Vec::with_capacity(p.inputs.len());
                    for (j, &v) in p.inputs.iter().enumerate() {
                        let taken = if donors.contains(&j) { slots[v].take() } else { None };
                        args.push(match taken {
                            Some(t) => t,
                            None => get(&slots, v)?,
                        });
                    }
                    // inside a capture (a replay traced by an outer function) every node goes
                    // through the dispatcher, so that the outer trace records it
                    let outcome = if super::recording() {
                        pointwise::Outcome::NodeByNode(args)
                    } else {
                        p.run(args, donors)?
                    };
                    let out = match outcome {
                        pointwise::Outcome::Fused(t, in_place) => {
                            stats.in_place += usize::from(in_place);
                            if p.nodes.len() > 1 {
                                stats.fused_groups += 1;
                                stats.fused_nodes += p.nodes.len();
                            }
                            t
                        }
                        pointwise::Outcome::NodeByNode(args) => {
                            stats.fallback_groups += usize::from(p.nodes.len() > 1);
                            self.run_group(p, args, exec)?
                        }
                    };
                    (vec![out], &p.inputs)
                }
            };
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
            for &v in read {
                if last[v] == Some(i) && !is_output[v] {
                    slots[v] = None;
                }
            }
            if let Some(h) = hand.as_mut() {
                for &v in &node.outputs {
                    let Some(k) = h.early[v] else { continue };
                    // a view of a buffer something else still holds (or the tensor itself, held
                    // by another slot) is returned at the end
                    let alone = |t: &mut Tensor| Arc::strong_count(&t.0) == 1 && Arc::strong_count(t.storage()) == 1;
                    if let Some(t) = slots[v].take_if(alone) {
                        (h.ready)(k, &t)?;
                        handed[k] = true;
                    }
                }
            }
        }
        let results = self
            .outputs
            .iter()
            .zip(&handed)
            .map(|(&v, &gone)| if gone { Ok(None) } else { get(&slots, v).map(Some) })
            .collect::<Result<Vec<_>>>()?;
        drop(slots);
        // Inputs and parameters come back as themselves, as eagerly. A constant, or a computed
        // buffer that something else still holds (another result after merging, a constant, a
        // parameter), would be a fresh buffer eagerly: it gets its own copy.
        let mut owned = Vec::with_capacity(results.len());
        for (k, (t, &v)) in results.iter().zip(&self.outputs).enumerate() {
            let Some(t) = t else {
                owned.push(None);
                continue;
            };
            let copy = match self.values[v].source {
                Source::Input(_) | Source::External(_) => false,
                Source::Constant(_) => true,
                Source::Node { .. } => {
                    Arc::strong_count(t.storage()) > 1 || results[..k].iter().flatten().any(|r| r.same_storage(t))
                }
            };
            owned.push(Some(if copy { t.contiguous_copy()? } else { t.clone() }));
        }
        Ok((owned, stats))
    }

    /// Runs a group's nodes one by one through `exec` (`args`: the program's inputs), returning
    /// the last node's result.
    fn run_group(&self, p: &Program, args: Vec<Tensor>, exec: &mut Exec) -> Result<Tensor> {
        let mut made: Vec<(ValueId, Tensor)> = Vec::with_capacity(p.nodes.len());
        for &i in &p.nodes {
            let node = &self.nodes[i];
            let ins = node
                .inputs
                .iter()
                .map(|v| match made.iter().find(|(m, _)| m == v) {
                    Some((_, t)) => Ok(t),
                    None => p
                        .inputs
                        .iter()
                        .position(|u| u == v)
                        .map(|k| &args[k])
                        .ok_or_else(|| invalid("graph", format!("fused node {i} reads %{v} from nowhere"))),
                })
                .collect::<Result<Vec<&Tensor>>>()?;
            let mut outs = exec(i, &node.op, &ins)?;
            if outs.is_empty() {
                return Err(invalid(
                    "graph",
                    format!("node {i} ({}) gave no result", node.op.name()),
                ));
            }
            made.push((node.outputs[0], outs.swap_remove(0)));
        }
        made.pop()
            .map(|(_, t)| t)
            .ok_or_else(|| invalid("graph", "empty fused group"))
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

/// How replay runs a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Through `exec`, by itself.
    Alone,
    /// In its group's pass, at the group's last node.
    Deferred,
    /// Program `k` of the schedule: a group's last node, or one elementwise node with an input
    /// whose buffer it may take.
    Runs(usize),
}

/// How a graph's nodes are replayed: each node's role, the programs with the inputs each may
/// write its result into, and for each value the node after which replay drops it (its last
/// reader's step: a group's readers read at the group's last node).
pub(crate) struct Schedule {
    pub(crate) role: Vec<Role>,
    pub(crate) programs: Vec<(Program, Vec<usize>)>,
    pub(crate) last: Vec<Option<usize>>,
}

impl Schedule {
    pub(crate) fn new(g: &Graph, is_output: &[bool]) -> Schedule {
        let mut role = vec![Role::Alone; g.nodes.len()];
        let mut programs = Vec::new();
        let mut in_group = vec![false; g.nodes.len()];
        for grp in super::fusion::groups(g) {
            for p in super::fusion::one_pass_parts(g, &grp).0 {
                for &i in &p.nodes {
                    in_group[i] = true;
                    role[i] = Role::Deferred;
                }
                role[p.nodes[p.nodes.len() - 1]] = Role::Runs(programs.len());
                programs.push((p, Vec::new()));
            }
        }
        let mut last: Vec<Option<usize>> = vec![None; g.values.len()];
        for (k, (p, _)) in programs.iter().enumerate() {
            let at = p.nodes[p.nodes.len() - 1];
            debug_assert_eq!(role[at], Role::Runs(k));
            for &v in &p.inputs {
                last[v] = last[v].max(Some(at));
            }
        }
        for (i, n) in g.nodes.iter().enumerate() {
            if role[i] == Role::Alone {
                for &v in &n.inputs {
                    last[v] = last[v].max(Some(i));
                }
            }
        }
        // inputs of a pass whose buffer it may take: computed f32 values of the result's shape
        // that die there
        let dies = |v: ValueId, at: usize, shape: &[usize]| {
            pointwise::computed(g, v)
                && !is_output[v]
                && last[v] == Some(at)
                && g.values[v].dtype == crate::DType::F32
                && g.values[v].shape == shape
        };
        for (p, donors) in &mut programs {
            let at = p.nodes[p.nodes.len() - 1];
            *donors = (0..p.inputs.len())
                .filter(|&j| dies(p.inputs[j], at, &p.shape))
                .collect();
        }
        for (i, n) in g.nodes.iter().enumerate() {
            if in_group[i] || !n.op.is_elementwise() {
                continue;
            }
            if let Ok(p) = Program::build(g, &[i]) {
                let donors: Vec<usize> = (0..p.inputs.len())
                    .filter(|&j| dies(p.inputs[j], i, &p.shape))
                    .collect();
                if !donors.is_empty() {
                    role[i] = Role::Runs(programs.len());
                    programs.push((p, donors));
                }
            }
        }
        Schedule { role, programs, last }
    }
}
