//! Fusion groups: elementwise ops joined to the elementwise producers of their inputs when each
//! joined result has one reader (no other node, not a graph result) and the shape of its reader's
//! result, so the group could run as one pass over memory. A group is a tree of such edges ending
//! at its last node, the only one whose result leaves the group; every member has the last
//! node's shape (inputs from outside the group may broadcast to it).

use super::ir::{Graph, Source};

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
