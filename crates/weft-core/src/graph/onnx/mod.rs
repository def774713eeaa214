//! ONNX export of a captured inference computation (opset 17).
//!
//! A graph holds concrete shapes. To give the exported model dynamic axes (batch, sequence),
//! the same computation is traced once at base sizes and once more per axis with that axis
//! changed ([`trace_inference`] each time); [`to_onnx`] solves every dimension as a product of
//! the axes ([`dims`]) and writes shapes that the exported graph computes from its inputs' at
//! run time. Parameters become initializers under their names; every node maps onto standard
//! ONNX operators ([`emit`]: fused ops such as linear, norms and attention are written as the
//! operators they fuse). An op without an ONNX form is an error naming it; nothing is written.

mod dims;
mod emit;
mod fused;
mod proto;

use crate::error::{invalid, Result};
use crate::graph::ir::Graph;
use crate::graph::passes;
use crate::graph::Source;
use crate::op::Op;
use crate::Tensor;

use dims::{AxisSizes, SymDim};
use proto::{Dim, ValueInfo};

/// The prefix of the Identity nodes that give the graph's outputs their names.
const OUTPUT_NODE: &str = "/weft/output/";

/// The opset the exporter writes.
pub const OPSET: i64 = 17;

/// The largest file an export writes: 2 GiB less one byte, protobuf's limit on a message, which
/// ONNX readers (onnxruntime, `onnx.load`, tract) cannot read past. A model above it is refused
/// (weights in an external data file are not written).
pub const MAX_FILE_BYTES: u64 = (1 << 31) - 1;

/// Refuses a file of (at least) `bytes` bytes above [`MAX_FILE_BYTES`], in one line naming
/// both; `what` says what was counted.
fn within_protobuf_limit(bytes: u128, what: &str) -> Result<()> {
    if bytes <= u128::from(MAX_FILE_BYTES) {
        return Ok(());
    }
    let gib = bytes as f64 / (1u64 << 30) as f64;
    Err(bad(format!(
        "{what} {bytes} bytes ({gib:.2} GiB), over the {MAX_FILE_BYTES} bytes (2 GiB) a protobuf message, and so an \
         ONNX file, can hold; nothing was written"
    )))
}

/// The bytes of `tensors`' data, from their shapes and dtypes (nothing is read or allocated).
fn data_bytes<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> u128 {
    tensors
        .into_iter()
        .map(|t| {
            let n: u128 = t.shape().iter().map(|&d| d as u128).product();
            n * t.dtype().size_in_bytes() as u128
        })
        .sum()
}

/// A dynamic axis: dim `dim` of graph input `input`, called `name` in the file.
#[derive(Clone, Debug)]
pub struct DynamicAxis {
    pub name: String,
    pub input: usize,
    pub dim: usize,
}

/// What an export writes besides the graph.
#[derive(Clone, Debug, Default)]
pub struct OnnxSpec {
    /// The graph's name.
    pub name: String,
    /// The model's and the graph's doc string.
    pub doc: String,
    /// One per graph input, in order.
    pub input_names: Vec<String>,
    /// One per graph output, in order.
    pub output_names: Vec<String>,
    /// The dynamic axes; trace `k + 1` of [`to_onnx`] changes axis `k`.
    pub axes: Vec<DynamicAxis>,
    /// Names for tensors the computation reads (parameters, matched by storage and layout);
    /// others are called `/weft/const.N`.
    pub named: Vec<(String, Tensor)>,
    /// `metadata_props` of the model.
    pub metadata: Vec<(String, String)>,
}

/// An exported model.
#[derive(Clone, Debug)]
pub struct Exported {
    /// The `.onnx` file's bytes.
    pub bytes: Vec<u8>,
    /// ONNX nodes and initializers in it.
    pub nodes: usize,
    pub initializers: usize,
}

/// Traces `f(inputs)` (run under `no_grad`, as inference; custom functions' own ops recorded
/// in their place), drops what does not lead to its results and numbers the remaining values
/// densely. A capture that failed only because a lazily built cache made its tensors during it
/// is run once more. Fails when the computation cannot be captured, saying why.
pub fn trace_inference<F>(inputs: &[Tensor], mut f: F) -> Result<Graph>
where
    F: FnMut(&[Tensor]) -> Result<Vec<Tensor>>,
{
    let _inline = crate::graph::InlineFunctions::enter();
    let mut retried = false;
    let mut graph = loop {
        let (_, graph) = crate::no_grad(|| crate::graph::trace(inputs, &mut f))?;
        match graph {
            Ok(g) => break g,
            Err(e) if e.may_retry && !retried => retried = true,
            Err(e) => {
                return Err(invalid(
                    "onnx export",
                    format!("the forward cannot be captured: {}", e.reason),
                ))
            }
        }
    };
    passes::eliminate_dead(&mut graph);
    passes::compact(&mut graph);
    Ok(graph)
}

/// The ONNX model of `traces`: `traces[0]` at the axes' base
/// sizes, `traces[k + 1]` the same computation with axis `k` (only) changed.
pub fn to_onnx(traces: &[Graph], spec: &OnnxSpec) -> Result<Exported> {
    let n_axes = spec.axes.len();
    if traces.len() != n_axes + 1 {
        return Err(bad(format!(
            "{} traces for {n_axes} dynamic axes (one at the base sizes, one per axis)",
            traces.len()
        )));
    }
    let g = &traces[0];
    same_structure(traces, &spec.axes)?;
    let input_size = |t: &Graph, a: &DynamicAxis| -> Result<usize> {
        let v = *t
            .inputs
            .get(a.input)
            .ok_or_else(|| bad(format!("axis {}: no input {}", a.name, a.input)))?;
        t.values[v]
            .shape
            .get(a.dim)
            .copied()
            .ok_or_else(|| bad(format!("axis {}: input {} has no dim {}", a.name, a.input, a.dim)))
    };
    let mut sizes = AxisSizes {
        base: Vec::new(),
        varied: Vec::new(),
    };
    for (k, a) in spec.axes.iter().enumerate() {
        let (b, v) = (input_size(g, a)?, input_size(&traces[k + 1], a)?);
        if b == 0 || v == 0 || b == v {
            return Err(bad(format!(
                "axis {}: traced at sizes {b} and {v}; two sizes above 0 are needed",
                a.name
            )));
        }
        sizes.base.push(b);
        sizes.varied.push(v);
    }
    let solve = |base: usize, varied: &[usize], what: &dyn Fn() -> String| -> Result<SymDim> {
        sizes.solve(base, varied).ok_or_else(|| {
            bad(format!(
                "{}: size {base} (then {varied:?} as the axes change) is no product of the dynamic axes",
                what()
            ))
        })
    };
    let mut shapes = Vec::with_capacity(g.values.len());
    for (v, value) in g.values.iter().enumerate() {
        let mut dims = Vec::with_capacity(value.shape.len());
        for (d, &base) in value.shape.iter().enumerate() {
            let varied: Vec<usize> = traces[1..].iter().map(|t| t.values[v].shape[d]).collect();
            dims.push(solve(base, &varied, &|| {
                let seen: Vec<String> = traces.iter().map(|t| format!("{:?}", t.values[v].shape)).collect();
                format!(
                    "dim {d} of value %{v} (from {}; shapes {} in the traces)",
                    producer(g, v),
                    seen.join(", ")
                )
            })?);
        }
        shapes.push(dims);
    }
    let (names, externals) = emit::initial_names(g, &spec.input_names, &spec.named)?;
    let mut e = emit::Emitter::new(g, &shapes, names);
    let axis_inputs: Vec<(String, usize)> = spec
        .axes
        .iter()
        .map(|a| (spec.input_names[a.input].clone(), a.dim))
        .collect();
    e.define_axes(&axis_inputs);
    for (i, node) in g.nodes.iter().enumerate() {
        let start = match &node.op {
            Op::Narrow { start, .. } => {
                let varied: Vec<usize> = traces[1..]
                    .iter()
                    .map(|t| match &t.nodes[i].op {
                        Op::Narrow { start, .. } => *start,
                        _ => usize::MAX,
                    })
                    .collect();
                sizes.solve(*start, &varied)
            }
            _ => None,
        };
        e.node(i, start.as_ref())?;
    }
    // parameters and other tensors read by reference, once each
    let mut held = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (v, name) in externals {
        if !seen.insert(name.clone()) {
            continue;
        }
        match &g.values[v].source {
            Source::External(t) | Source::Constant(t) => held.push((name, t)),
            _ => continue,
        }
    }
    // their bytes alone are a lower bound of the file's size: a model past the limit is
    // refused from its shapes, before its weights are copied (`held` may be many GiB)
    let emitted: u128 = e.initializers.iter().map(|t| t.raw.len() as u128).sum();
    within_protobuf_limit(
        data_bytes(held.iter().map(|(_, t)| *t)) + emitted,
        "the model's weights and constants take",
    )?;
    let mut initializers = Vec::new();
    for (name, t) in held {
        initializers.push(proto::Tensor {
            name,
            dims: t.shape().iter().map(|&d| d as i64).collect(),
            data_type: emit::onnx_type(t.dtype()),
            raw: crate::io::safetensors::le_bytes(t)?,
        });
    }
    initializers.append(&mut e.initializers);
    let dim_of = |d: &SymDim| -> Dim {
        if d.is_fixed() {
            return Dim::Fixed(d.coef);
        }
        let mut parts: Vec<String> = Vec::new();
        if d.coef != 1 {
            parts.push(d.coef.to_string());
        }
        for (k, &x) in d.exps.iter().enumerate() {
            for _ in 0..x {
                parts.push(spec.axes[k].name.clone());
            }
        }
        Dim::Named(parts.join("*"))
    };
    let info = |v: usize, name: &str| ValueInfo {
        name: name.to_string(),
        data_type: emit::onnx_type(g.values[v].dtype),
        dims: shapes[v].iter().map(dim_of).collect(),
        doc: String::new(),
    };
    let inputs: Vec<ValueInfo> = g
        .inputs
        .iter()
        .zip(&spec.input_names)
        .map(|(&v, n)| info(v, n))
        .collect();
    if spec.output_names.len() != g.outputs.len() {
        return Err(bad(format!(
            "{} output names for {} outputs",
            spec.output_names.len(),
            g.outputs.len()
        )));
    }
    let mut nodes = e.nodes;
    let mut outputs = Vec::new();
    for (&v, name) in g.outputs.iter().zip(&spec.output_names) {
        let inner = e.names[v].clone();
        if inner.is_empty() {
            return Err(bad(format!("output {name:?} is not computed by the graph")));
        }
        nodes.push(proto::Node {
            op_type: "Identity",
            inputs: vec![inner],
            outputs: vec![name.clone()],
            name: format!("{OUTPUT_NODE}{name}"),
            attrs: Vec::new(),
        });
        outputs.push(info(v, name));
    }
    unique_names(&inputs, &initializers, &nodes)?;
    let (n_nodes, n_initializers) = (nodes.len(), initializers.len());
    let model = proto::Model {
        graph_name: spec.name.clone(),
        doc: spec.doc.clone(),
        opset: OPSET,
        nodes,
        initializers,
        inputs,
        outputs,
        metadata: spec.metadata.clone(),
    };
    let bytes = model.encode();
    within_protobuf_limit(bytes.len() as u128, "the ONNX file would take")?;
    Ok(Exported {
        bytes,
        nodes: n_nodes,
        initializers: n_initializers,
    })
}

/// Checks that no two of the graph's inputs, initializers and node outputs share a name.
fn unique_names(inputs: &[ValueInfo], initializers: &[proto::Tensor], nodes: &[proto::Node]) -> Result<()> {
    let mut seen: std::collections::HashMap<&str, String> = std::collections::HashMap::new();
    let named = inputs
        .iter()
        .map(|i| (i.name.as_str(), "an input".to_string()))
        .chain(
            initializers
                .iter()
                .map(|t| (t.name.as_str(), "an initializer".to_string())),
        )
        .chain(nodes.iter().flat_map(|n| {
            n.outputs.iter().map(move |o| match n.name.strip_prefix(OUTPUT_NODE) {
                Some(_) => (o.as_str(), "a graph output".to_string()),
                None => (o.as_str(), format!("the output of {} node {}", n.op_type, n.name)),
            })
        }));
    for (name, what) in named {
        if let Some(first) = seen.get(name) {
            return Err(bad(format!(
                "the name {name:?} is both {first} and {what}; names must differ"
            )));
        }
        seen.insert(name, what);
    }
    Ok(())
}

fn bad(what: String) -> crate::Error {
    invalid("onnx export", what)
}

/// Whether `a` and `b` are the same op, but for attributes that are sizes (a reshape's or
/// expand's target shape, a narrow's start and length, a fill's shape, a range's length).
/// Floating-point attributes are compared bit for bit.
fn same_op_but_sizes(a: &Op, b: &Op) -> bool {
    let same = |x: f64, y: f64| x.to_bits() == y.to_bits();
    match (a, b) {
        (Op::Reshape(_), Op::Reshape(_)) | (Op::Expand(_), Op::Expand(_)) => true,
        (Op::Narrow { dim: d, .. }, Op::Narrow { dim: e, .. }) => d == e,
        (Op::Fill { value: v, dtype: t, .. }, Op::Fill { value: w, dtype: u, .. }) => same(*v, *w) && t == u,
        (
            Op::Arange {
                start: s0,
                step: d0,
                dtype: t0,
                ..
            },
            Op::Arange {
                start: s1,
                step: d1,
                dtype: t1,
                ..
            },
        ) => same(*s0, *s1) && same(*d0, *d1) && t0 == t1,
        (Op::Affine { mul: m0, add: a0 }, Op::Affine { mul: m1, add: a1 }) => same(*m0, *m1) && same(*a0, *a1),
        (Op::PowScalar(p), Op::PowScalar(q)) => same(*p, *q),
        (Op::Clamp { min: l0, max: h0 }, Op::Clamp { min: l1, max: h1 }) => same(*l0, *l1) && same(*h0, *h1),
        _ => a == b,
    }
}

/// What produces value `v` of `g`, for messages: `node I (op)`, `input I`, or a tensor read by
/// reference.
fn producer(g: &Graph, v: usize) -> String {
    match &g.values[v].source {
        Source::Node { node, .. } => format!("node {node} ({})", g.nodes[*node].op.name()),
        Source::Input(i) => format!("input {i}"),
        Source::External(_) | Source::Constant(_) => {
            match g.nodes.iter().enumerate().find(|(_, n)| n.inputs.contains(&v)) {
                Some((i, n)) => format!("a tensor read by node {i} ({})", n.op.name()),
                None => "a tensor read by reference".to_string(),
            }
        }
    }
}

/// Checks that the traces ran the same ops, with the same attributes but for sizes, on the
/// same values, reading the same tensors (only sizes may differ).
fn same_structure(traces: &[Graph], axes: &[DynamicAxis]) -> Result<()> {
    let g = &traces[0];
    for (k, t) in traces.iter().enumerate().skip(1) {
        let axis = axes.get(k - 1).map_or("?", |a| a.name.as_str());
        let differs = |what: String| {
            bad(format!(
                "the computation changes with dynamic axis {axis} ({what}); it cannot be exported with that axis dynamic"
            ))
        };
        if t.nodes.len() != g.nodes.len() || t.values.len() != g.values.len() {
            return Err(differs(format!(
                "{} nodes and {} values, then {} and {}",
                g.nodes.len(),
                g.values.len(),
                t.nodes.len(),
                t.values.len()
            )));
        }
        for (i, (a, b)) in g.nodes.iter().zip(&t.nodes).enumerate() {
            if a.op.name() != b.op.name() || a.inputs != b.inputs || a.outputs != b.outputs {
                return Err(differs(format!("node {i}: {} then {}", a.op.name(), b.op.name())));
            }
            if !same_op_but_sizes(&a.op, &b.op) {
                return Err(differs(format!(
                    "node {i} ({}): {:?} then {:?}",
                    a.op.name(),
                    a.op,
                    b.op
                )));
            }
        }
        for (v, (a, b)) in g.values.iter().zip(&t.values).enumerate() {
            if a.dtype != b.dtype || a.shape.len() != b.shape.len() {
                return Err(differs(format!(
                    "value %{v} of {}: {:?} {:?} then {:?} {:?}",
                    producer(g, v),
                    a.dtype,
                    a.shape,
                    b.dtype,
                    b.shape
                )));
            }
            let same_source = match (&a.source, &b.source) {
                (Source::External(x), Source::External(y)) | (Source::Constant(x), Source::Constant(y)) => {
                    x.same_storage(y) && x.layout() == y.layout()
                }
                (Source::Input(i), Source::Input(j)) => i == j,
                (Source::Node { node: n, output: o }, Source::Node { node: m, output: p }) => n == m && o == p,
                _ => false,
            };
            if !same_source {
                return Err(differs(format!(
                    "value %{v} of {} is another tensor in each trace",
                    producer(g, v)
                )));
            }
        }
        if g.inputs != t.inputs || g.outputs != t.outputs {
            return Err(differs("inputs or outputs".into()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
