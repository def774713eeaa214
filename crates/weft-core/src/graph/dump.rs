//! Text and Graphviz forms of a graph, with its fusion groups (and whether each runs as one
//! pass or node by node) and memory plan.

use std::fmt::Write;

use super::ir::{Graph, Source, ValueId};

fn ty(g: &Graph, v: ValueId) -> String {
    let val = &g.values[v];
    format!("{}{:?}", format!("{:?}", val.dtype).to_lowercase(), val.shape)
}

/// What a value that no node makes is (`None` for node results).
fn leaf_label(source: &Source) -> Option<String> {
    match source {
        Source::Input(i) => Some(format!("input {i}")),
        Source::External(_) => Some("external".into()),
        Source::Constant(_) => Some("constant".into()),
        Source::Node { .. } => None,
    }
}

fn mib(bytes: usize) -> String {
    format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
}

impl Graph {
    /// The graph as text: its inputs, externals and constants, one line per node
    /// (`%out = op{attributes}(%in, ...) : dtype[shape]`), the fusion groups (each `one pass`,
    /// or `node by node` and why) and the memory plan.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let (groups, group_of) = groups_and_index(self);
        let _ = writeln!(s, "graph: {} nodes, {} values", self.nodes.len(), self.values.len());
        for (v, val) in self.values.iter().enumerate() {
            if let Some(kind) = leaf_label(&val.source) {
                let _ = writeln!(s, "  %{v} = {kind} : {}", ty(self, v));
            }
        }
        for (i, n) in self.nodes.iter().enumerate() {
            let outs: Vec<String> = n.outputs.iter().map(|v| format!("%{v}")).collect();
            let ins: Vec<String> = n.inputs.iter().map(|v| format!("%{v}")).collect();
            let types: Vec<String> = n.outputs.iter().map(|&v| ty(self, v)).collect();
            let fused = group_of[i].map(|k| format!("  [fusion {k}]")).unwrap_or_default();
            let _ = writeln!(
                s,
                "  {} = {:?}({}) : {}{fused}",
                outs.join(", "),
                n.op,
                ins.join(", "),
                types.join(", ")
            );
        }
        let outs: Vec<String> = self.outputs.iter().map(|v| format!("%{v}")).collect();
        let _ = writeln!(s, "  return {}", outs.join(", "));
        let _ = writeln!(s, "fusion groups: {}", groups.len());
        for (k, grp) in groups.iter().enumerate() {
            let names: Vec<&str> = grp.iter().map(|&i| self.nodes[i].op.name()).collect();
            let how = match super::fusion::one_pass_parts(self, grp) {
                (_, None) => "one pass (f32 on the CPU)".to_string(),
                (parts, Some(why)) if parts.is_empty() => format!("node by node: {why}"),
                (parts, Some(why)) => {
                    let n: usize = parts.iter().map(|p| p.nodes.len()).sum();
                    format!("{n} of {} nodes in one pass; node by node: {why}", grp.len())
                }
            };
            let _ = writeln!(s, "  fusion {k}: {}  [{how}]", names.join(" -> "));
        }
        let plan = super::plan::plan(self);
        let _ = writeln!(
            s,
            "memory plan: {} buffers in one arena of {} (peak live {}); inputs, parameters and constants {}",
            plan.buffers.len(),
            mib(plan.arena_bytes),
            mib(plan.peak_live_bytes),
            mib(plan.outside_bytes)
        );
        s
    }

    /// The graph in Graphviz's dot language: a box per node (fusion groups in clusters), an
    /// ellipse per input, external and constant.
    pub fn to_dot(&self) -> String {
        let mut s = String::from("digraph weft {\n  rankdir=TB;\n  node [fontname=\"monospace\"];\n");
        for (v, val) in self.values.iter().enumerate() {
            if let Some(label) = leaf_label(&val.source) {
                let _ = writeln!(s, "  v{v} [shape=ellipse, label=\"{label}\\n{}\"];", ty(self, v));
            }
        }
        let (groups, grouped) = groups_and_index(self);
        let node_line = |i: usize| {
            let n = &self.nodes[i];
            format!(
                "  n{i} [shape=box, label=\"{}\\n{}\"];\n",
                n.op.name(),
                ty(self, n.outputs[0])
            )
        };
        for (k, grp) in groups.iter().enumerate() {
            let _ = writeln!(s, "  subgraph cluster_{k} {{\n  label=\"fusion {k}\"; style=dashed;");
            for &i in grp {
                s.push_str(&node_line(i));
            }
            s.push_str("  }\n");
        }
        for i in (0..self.nodes.len()).filter(|&i| grouped[i].is_none()) {
            s.push_str(&node_line(i));
        }
        let from = |v: ValueId| match self.values[v].source {
            Source::Node { node, .. } => format!("n{node}"),
            _ => format!("v{v}"),
        };
        for (i, n) in self.nodes.iter().enumerate() {
            for &v in &n.inputs {
                let _ = writeln!(s, "  {} -> n{i};", from(v));
            }
        }
        for (k, &v) in self.outputs.iter().enumerate() {
            let _ = writeln!(
                s,
                "  out{k} [shape=doubleoctagon, label=\"result {k}\"];\n  {} -> out{k};",
                from(v)
            );
        }
        s.push_str("}\n");
        s
    }
}

/// The fusion groups of `g`, and for each node the group it belongs to.
fn groups_and_index(g: &Graph) -> (Vec<Vec<usize>>, Vec<Option<usize>>) {
    let groups = super::fusion::groups(g);
    let mut idx = vec![None; g.nodes.len()];
    for (k, grp) in groups.iter().enumerate() {
        for &i in grp {
            idx[i] = Some(k);
        }
    }
    (groups, idx)
}
