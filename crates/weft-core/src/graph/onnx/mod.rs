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
use crate::Tensor;

use dims::{AxisSizes, SymDim};
use proto::{Dim, ValueInfo};

/// The opset the exporter writes.
pub const OPSET: i64 = 17;

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
    /// Names for tensors the computation reads (parameters); others are called `const.N`.
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
/// in their place) and drops what does not lead to its results. Fails when the computation cannot be captured, saying why.
pub fn trace_inference<F>(inputs: &[Tensor], f: F) -> Result<Graph>
where
    F: FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
{
    let _inline = crate::graph::InlineFunctions::enter();
    let (_, graph) = crate::no_grad(|| crate::graph::trace(inputs, f))?;
    let mut graph =
        graph.map_err(|e| invalid("onnx export", format!("the forward cannot be captured: {}", e.reason)))?;
    passes::eliminate_dead(&mut graph);
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
    same_structure(traces)?;
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
            dims.push(solve(base, &varied, &|| format!("dim {d} of value %{v}"))?);
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
            crate::op::Op::Narrow { start, .. } => {
                let varied: Vec<usize> = traces[1..]
                    .iter()
                    .map(|t| match &t.nodes[i].op {
                        crate::op::Op::Narrow { start, .. } => *start,
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
    let mut initializers = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (v, name) in externals {
        if !seen.insert(name.clone()) {
            continue;
        }
        let t = match &g.values[v].source {
            crate::graph::Source::External(t) | crate::graph::Source::Constant(t) => t,
            _ => continue,
        };
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
            name: format!("output_{name}"),
            attrs: Vec::new(),
        });
        outputs.push(info(v, name));
    }
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
    Ok(Exported {
        bytes: model.encode(),
        nodes: n_nodes,
        initializers: n_initializers,
    })
}

fn bad(what: String) -> crate::Error {
    invalid("onnx export", what)
}

/// Checks that the traces ran the same ops on the same values (only sizes may differ).
fn same_structure(traces: &[Graph]) -> Result<()> {
    let g = &traces[0];
    for (k, t) in traces.iter().enumerate().skip(1) {
        let differs = |what: String| {
            bad(format!(
                "the computation changes with dynamic axis {} ({what}); it cannot be exported with that axis dynamic",
                k - 1
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
        }
        for (v, (a, b)) in g.values.iter().zip(&t.values).enumerate() {
            if a.dtype != b.dtype || a.shape.len() != b.shape.len() {
                return Err(differs(format!(
                    "value %{v}: {:?} {:?} then {:?} {:?}",
                    a.dtype, a.shape, b.dtype, b.shape
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
mod tests {
    use super::*;
    use crate::DType;

    fn spec(axes: Vec<DynamicAxis>) -> OnnxSpec {
        OnnxSpec {
            name: "t".into(),
            input_names: vec!["x".into()],
            output_names: vec!["y".into()],
            axes,
            ..Default::default()
        }
    }

    fn batch() -> DynamicAxis {
        DynamicAxis {
            name: "batch".into(),
            input: 0,
            dim: 0,
        }
    }

    #[test]
    fn an_op_without_an_onnx_form_is_named() {
        let x = Tensor::zeros(&[2, 3], DType::F32).unwrap();
        let targets = Tensor::from_vec(vec![0i64, 2], &[2]).unwrap();
        let g = trace_inference(&[x], |xs| Ok(vec![xs[0].cross_entropy(&targets, -100, 0.0)?])).unwrap();
        let e = to_onnx(&[g], &spec(vec![])).unwrap_err().to_string();
        assert!(e.contains("cross_entropy") && e.contains("no ONNX form"), "{e}");
    }

    #[test]
    fn a_size_that_is_no_product_of_the_axes_is_refused() {
        // the batch minus one
        let f = |xs: &[Tensor]| Ok(vec![xs[0].narrow(0, 1, xs[0].dim(0)? - 1)?.exp()?]);
        let traces: Vec<Graph> = [2, 3]
            .iter()
            .map(|&b| trace_inference(&[Tensor::zeros(&[b, 4], DType::F32).unwrap()], f).unwrap())
            .collect();
        let e = to_onnx(&traces, &spec(vec![batch()])).unwrap_err().to_string();
        assert!(e.contains("no product of the dynamic axes"), "{e}");
        // traces that do not differ in the axis are refused too
        let same = vec![traces[0].clone(), traces[0].clone()];
        let e = to_onnx(&same, &spec(vec![batch()])).unwrap_err().to_string();
        assert!(e.contains("two sizes"), "{e}");
    }

    #[test]
    fn a_computation_that_changes_with_an_axis_is_refused() {
        // one more op at batch 3
        let f = |xs: &[Tensor]| {
            let y = xs[0].exp()?;
            Ok(vec![if xs[0].dim(0)? > 2 { y.exp()? } else { y }])
        };
        let traces: Vec<Graph> = [2, 3]
            .iter()
            .map(|&b| trace_inference(&[Tensor::zeros(&[b, 4], DType::F32).unwrap()], f).unwrap())
            .collect();
        let e = to_onnx(&traces, &spec(vec![batch()])).unwrap_err().to_string();
        assert!(e.contains("changes with dynamic axis"), "{e}");
    }
}
