//! The static memory plan: every buffer a node makes, its lifetime in node steps, and an offset
//! in one arena such that buffers alive at the same time never overlap. Known before running.
//!
//! Lifetimes are the replay's ([`super::run`], f32 on the CPU): a fusion group that runs as one
//! pass never makes its intermediates, reads its inputs at its last node (they live until then),
//! and writes its result into the first input that dies there when that input is a computed f32
//! value of the result's shape covering its whole buffer contiguously (a node's own result, or a
//! reshape of one), no later node reads that buffer, and no other input of the pass reads it;
//! one elementwise node with such an input does the same. The replay checks at run time that
//! nothing else holds the buffer; on a GPU, or inside an outer capture, it runs node by node and
//! holds more than planned.

use super::ir::{Graph, Source, ValueId};
use super::run::{Role, Schedule};
use crate::op::Op;

/// One computed buffer (shared by all views of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferPlan {
    /// The buffer id of [`super::Value::buffer`].
    pub buffer: usize,
    pub bytes: usize,
    /// The node that makes it.
    pub first: usize,
    /// The last node that reads it (`nodes.len()` when a result holds it to the end).
    pub last: usize,
    /// Byte offset in the arena.
    pub offset: usize,
}

/// The plan of a graph.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryPlan {
    pub buffers: Vec<BufferPlan>,
    /// Size of the arena holding every computed buffer at its offset.
    pub arena_bytes: usize,
    /// The largest sum of buffers alive at one node step: no arena can be smaller.
    pub peak_live_bytes: usize,
    /// Bytes the graph reads but does not make: inputs, parameters and constants.
    pub outside_bytes: usize,
}

/// Plans `g`'s memory. Offsets are assigned largest buffer first, each at the lowest offset that
/// overlaps no placed buffer whose lifetime meets its own (greedy by size, as TensorFlow Lite's
/// arena planner does).
pub fn plan(g: &Graph) -> MemoryPlan {
    let mut buffers = lifetimes(g);
    let outside_bytes = outside_bytes(g);
    let mut order: Vec<usize> = (0..buffers.len()).collect();
    order.sort_by(|&a, &b| buffers[b].bytes.cmp(&buffers[a].bytes).then(a.cmp(&b)));
    let mut placed: Vec<usize> = Vec::with_capacity(buffers.len());
    let mut arena_bytes = 0;
    for &i in &order {
        let me = buffers[i];
        let mut taken: Vec<(usize, usize)> = placed
            .iter()
            .map(|&p| buffers[p])
            .filter(|o| o.first <= me.last && me.first <= o.last)
            .map(|o| (o.offset, o.offset + o.bytes))
            .collect();
        taken.sort_unstable();
        let mut offset = 0;
        for (start, stop) in taken {
            if start >= offset + me.bytes {
                break;
            }
            offset = offset.max(stop);
        }
        buffers[i].offset = offset;
        arena_bytes = arena_bytes.max(offset + me.bytes);
        placed.push(i);
    }
    let peak = live_bytes(&buffers, g.nodes.len()).into_iter().max().unwrap_or(0);
    MemoryPlan {
        buffers,
        arena_bytes,
        peak_live_bytes: peak,
        outside_bytes,
    }
}

/// Every buffer the replay makes (not inputs, parameters or constants; not a group's
/// intermediates; not a result written into an input's buffer), with its bytes and lifetime
/// (offsets all 0), in buffer-id order.
pub(crate) fn lifetimes(g: &Graph) -> Vec<BufferPlan> {
    buffers(g, true)
}

/// The most bytes the replay holds at one node step ([`plan`]'s `peak_live_bytes`).
pub(crate) fn peak(g: &Graph) -> usize {
    live_bytes(&lifetimes(g), g.nodes.len()).into_iter().max().unwrap_or(0)
}

/// Every buffer a node makes, as if each node ran by itself (every value made, in a buffer of
/// its own): what recomputation searches on (see [`super::remat`]).
pub(crate) fn node_lifetimes(g: &Graph) -> Vec<BufferPlan> {
    buffers(g, false)
}

/// [`lifetimes`] (`replay`) or [`node_lifetimes`].
fn buffers(g: &Graph, replay: bool) -> Vec<BufferPlan> {
    let end = g.nodes.len();
    let nb = g.values.iter().map(|v| v.buffer + 1).max().unwrap_or(0);
    let mut outside = vec![false; nb];
    let mut bytes = vec![0usize; nb];
    let mut first = vec![usize::MAX; nb];
    let mut last = vec![0usize; nb];
    for v in &g.values {
        bytes[v.buffer] = bytes[v.buffer].max(v.bytes);
        outside[v.buffer] |= !matches!(v.source, Source::Node { .. });
    }
    for (i, n) in g.nodes.iter().enumerate() {
        for &v in &n.outputs {
            let b = g.values[v].buffer;
            first[b] = first[b].min(i);
            last[b] = last[b].max(i);
        }
        for &v in &n.inputs {
            let b = g.values[v].buffer;
            last[b] = last[b].max(i);
        }
    }
    for &v in &g.outputs {
        last[g.values[v].buffer] = end;
    }
    let made = match replay {
        true => replay_buffers(g, &mut last, &outside),
        false => vec![true; nb],
    };
    (0..nb)
        .filter(|&b| first[b] != usize::MAX && !outside[b] && made[b])
        .map(|b| BufferPlan {
            buffer: b,
            bytes: bytes[b],
            first: first[b],
            last: last[b],
            offset: 0,
        })
        .collect()
}

/// Which buffers the replay makes, `last` (per buffer, node by node) moved to the replay's: a
/// one-pass program's inputs are read at its last node, and a result it writes into a dying
/// input's buffer keeps that buffer alive as long as the result lives. (`outside`: the buffers of
/// inputs, parameters and constants, which the caller holds.)
fn replay_buffers(g: &Graph, last: &mut [usize], outside: &[bool]) -> Vec<bool> {
    let mut made = vec![true; last.len()];
    let (_, is_output) = g.lifetimes();
    let schedule = Schedule::new(g, &is_output);
    for (n, role) in g.nodes.iter().zip(&schedule.role) {
        if *role == Role::Deferred {
            n.outputs.iter().for_each(|&v| made[g.values[v].buffer] = false);
        }
    }
    let at = |p: &super::pointwise::Program| p.nodes[p.nodes.len() - 1];
    for (p, _) in &schedule.programs {
        for &v in &p.inputs {
            let b = g.values[v].buffer;
            last[b] = last[b].max(at(p));
        }
    }
    // in node order, each buffer id standing for the buffer that holds it (an in-place result
    // lives in its donor's)
    let mut programs: Vec<_> = schedule.programs.iter().collect();
    programs.sort_by_key(|(p, _)| at(p));
    let mut holder: Vec<usize> = (0..last.len()).collect();
    for (p, donors) in programs {
        let result = g.values[g.nodes[at(p)].outputs[0]].buffer;
        let held = |v: ValueId| holder[g.values[v].buffer];
        // the first donor the replay can write into: a computed buffer that dies here (no
        // other view of it read later), read by this pass through one input only (two would
        // hold it twice), which that input covers whole and contiguously
        let donor = donors
            .iter()
            .map(|&d| p.inputs[d])
            .filter(|&v| whole_buffer(g, v) && p.inputs.iter().filter(|&&u| held(u) == held(v)).count() == 1)
            .map(held)
            .find(|&b| last[b] == at(p) && made[b] && !outside[b] && b != result);
        if let Some(b) = donor {
            last[b] = last[result];
            made[result] = false;
            holder[result] = b;
        }
    }
    made
}

/// Whether value `v` covers its whole buffer from its start, contiguously (what an in-place
/// write needs): made by a node into a buffer of its own (kernels write contiguous results), or
/// a reshape of such a value, with as many bytes as the buffer.
fn whole_buffer(g: &Graph, mut v: ValueId) -> bool {
    let val = &g.values[v];
    if val.shape.iter().product::<usize>() * val.dtype.size_in_bytes() != val.bytes {
        return false;
    }
    loop {
        let Source::Node { node, .. } = g.values[v].source else {
            return false;
        };
        let n = &g.nodes[node];
        let b = g.values[v].buffer;
        match n.inputs.iter().find(|&&i| g.values[i].buffer == b) {
            None => return true,
            Some(&i) if matches!(n.op, Op::Reshape(_)) => v = i,
            Some(_) => return false,
        }
    }
}

/// Bytes of `buffers` alive at each node step `0..=steps` (a result lives to step `steps`).
pub(crate) fn live_bytes(buffers: &[BufferPlan], steps: usize) -> Vec<usize> {
    let mut delta = vec![0i64; steps + 2];
    for b in buffers {
        delta[b.first] += b.bytes as i64;
        delta[b.last + 1] -= b.bytes as i64;
    }
    let mut now = 0i64;
    delta[..=steps]
        .iter()
        .map(|d| {
            now += d;
            now.max(0) as usize
        })
        .collect()
}

/// Bytes of the inputs, parameters and constants the graph reads (each buffer once).
fn outside_bytes(g: &Graph) -> usize {
    let mut seen = std::collections::HashSet::new();
    g.values
        .iter()
        .filter(|v| !matches!(v.source, Source::Node { .. }) && seen.insert(v.buffer))
        .map(|v| v.bytes)
        .sum()
}
