//! The static memory plan: every buffer a node makes, its lifetime in node steps, and an offset
//! in one arena such that buffers alive at the same time never overlap. Known before running.

use super::ir::{Graph, Source};

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

/// Every buffer a node makes (not inputs, parameters or constants), with its bytes and lifetime
/// (offsets all 0), in buffer-id order.
pub(crate) fn lifetimes(g: &Graph) -> Vec<BufferPlan> {
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
    (0..nb)
        .filter(|&b| first[b] != usize::MAX && !outside[b])
        .map(|b| BufferPlan {
            buffer: b,
            bytes: bytes[b],
            first: first[b],
            last: last[b],
            offset: 0,
        })
        .collect()
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
