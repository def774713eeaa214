//! Fusion groups: elementwise ops joined to the elementwise producers of their inputs when each
//! joined result has one reader (no other node, not a graph result) and the shape of its reader's
//! result, so the group could run as one pass over memory. A group is a tree of such edges ending
//! at its last node, the only one whose result leaves the group; every member has the last
//! node's shape (inputs from outside the group may broadcast to it).

use super::ir::{Graph, Source};
use super::pointwise::Program;

/// The fusion groups of `g`: each a list of node indices in execution order, at least two long.
pub fn groups(g: &Graph) -> Vec<Vec<usize>> {
    let mut readers = vec![0usize; g.values.len()];
    for n in &g.nodes {
        for &v in &n.inputs {
            readers[v] += 1;
        }
    }
    for &v in &g.outputs {
        readers[v] += 1;
    }
    // a union-find over nodes: each set's root is its first node
    let mut parent: Vec<usize> = (0..g.nodes.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    for (i, n) in g.nodes.iter().enumerate() {
        if !n.op.is_elementwise() || n.outputs.len() != 1 {
            continue;
        }
        let out_shape = &g.values[n.outputs[0]].shape;
        for &v in &n.inputs {
            let Source::Node { node: p, .. } = g.values[v].source else {
                continue;
            };
            let producer = &g.nodes[p];
            if producer.op.is_elementwise()
                && producer.outputs.len() == 1
                && readers[v] == 1
                && &g.values[v].shape == out_shape
            {
                // the producer's group ends at `p` (its result is read only here): join it
                let (a, b) = (root(&mut parent, p), root(&mut parent, i));
                parent[a.max(b)] = a.min(b);
            }
        }
    }
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut index_of_leader = std::collections::HashMap::new();
    for i in 0..g.nodes.len() {
        let leader = root(&mut parent, i);
        let k = *index_of_leader.entry(leader).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[k].push(i);
    }
    groups.retain(|g| g.len() >= 2);
    groups
}

/// The parts of fusion group `grp` that run as one pass: the group without the nodes the
/// one-pass evaluator does not take, cut into its connected pieces of two or more nodes (each
/// again a tree ending at its last node), each as a program; and why the other nodes run node
/// by node (`None` when the whole group is one program).
pub(crate) fn one_pass_parts(g: &Graph, grp: &[usize]) -> (Vec<Program>, Option<String>) {
    let whole = match Program::build(g, grp) {
        Ok(p) => return (vec![p], None),
        Err(why) => why,
    };
    let ok: Vec<bool> = grp.iter().map(|&i| Program::build(g, &[i]).is_ok()).collect();
    // part[k]: the index in `grp` of the first node of member k's piece
    let mut part: Vec<usize> = (0..grp.len()).collect();
    for (k, &i) in grp.iter().enumerate() {
        for &v in &g.nodes[i].inputs {
            let Source::Node { node: p, .. } = g.values[v].source else {
                continue;
            };
            if let Some(j) = grp.iter().position(|&m| m == p) {
                if ok[j] && ok[k] {
                    let (a, b) = (part[j], part[k]);
                    for x in part.iter_mut().filter(|x| **x == a.max(b)) {
                        *x = a.min(b);
                    }
                }
            }
        }
    }
    let mut parts = Vec::new();
    for first in 0..grp.len() {
        let nodes: Vec<usize> = (0..grp.len())
            .filter(|&k| ok[k] && part[k] == first)
            .map(|k| grp[k])
            .collect();
        if nodes.len() >= 2 {
            if let Ok(p) = Program::build(g, &nodes) {
                parts.push(p);
            }
        }
    }
    (parts, Some(whole))
}
