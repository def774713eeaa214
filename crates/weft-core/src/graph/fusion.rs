//! Fusion groups: chains of elementwise ops in which each intermediate result has one reader and
//! the shape of the chain's result, so the chain could run as one pass over memory.

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
    // parent[i]: the group leader of node i (union by joining a node to its producer's group)
    let mut group_of: Vec<usize> = (0..g.nodes.len()).collect();
    for (i, n) in g.nodes.iter().enumerate() {
        if !n.op.is_elementwise() {
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
                let leader = group_of[p];
                group_of[i] = leader;
                break;
            }
        }
    }
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut index_of_leader = std::collections::HashMap::new();
    for (i, &leader) in group_of.iter().enumerate() {
        let k = *index_of_leader.entry(leader).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[k].push(i);
    }
    groups.retain(|g| g.len() >= 2);
    groups
}
