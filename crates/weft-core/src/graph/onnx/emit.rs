//! Each node of a captured graph written as ONNX nodes (opset 17). Shapes come from the
//! dimensions solved over the traces ([`super::dims`]), so a reshape, expand, slice, fill or
//! range follows the dynamic axes at run time: their sizes are computed in the exported graph
//! from the inputs' shapes (`Shape`, `Gather`, `Mul`, `Concat`).

use std::collections::HashMap;

use super::dims::SymDim;
use super::proto::{self, data_type, Attr};
use crate::error::{invalid, Result};
use crate::graph::ir::{Graph, Node, Source, ValueId};
use crate::op::{BinaryOp, CompareOp, Op, ReduceOp};
use crate::DType;

/// The prefix of every name the exporter makes up (intermediate values `/weft/tN`, constants
/// `/weft/cN`, unnamed tensors read by reference `/weft/const.N`, nodes `/weft/nI_K`).
pub(crate) const PREFIX: &str = "/weft/";

/// The ONNX element type of `dtype`.
pub(crate) fn onnx_type(dtype: DType) -> i32 {
    match dtype {
        DType::F32 => data_type::FLOAT,
        DType::F64 => data_type::DOUBLE,
        DType::BF16 => data_type::BFLOAT16,
        DType::F16 => data_type::FLOAT16,
        DType::I64 => data_type::INT64,
        DType::I32 => data_type::INT32,
        DType::U8 => data_type::UINT8,
        DType::Bool => data_type::BOOL,
    }
}

/// Writes a graph's nodes as ONNX nodes.
pub(crate) struct Emitter<'a> {
    g: &'a Graph,
    /// Per value: its dimensions in terms of the axes.
    shapes: &'a [Vec<SymDim>],
    /// Per value: its ONNX name, once written (empty for a saved output nothing reads).
    pub names: Vec<String>,
    pub nodes: Vec<proto::Node>,
    pub initializers: Vec<proto::Tensor>,
    /// Per axis: the name of an INT64 `[1]` tensor holding its size at run time.
    axes: Vec<String>,
    dims: HashMap<SymDim, String>,
    fresh: usize,
    /// The node being written, for names and messages.
    at: usize,
}

pub(super) fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

impl<'a> Emitter<'a> {
    pub(crate) fn new(g: &'a Graph, shapes: &'a [Vec<SymDim>], names: Vec<String>) -> Self {
        Emitter {
            g,
            shapes,
            names,
            nodes: Vec::new(),
            initializers: Vec::new(),
            axes: Vec::new(),
            dims: HashMap::new(),
            fresh: 0,
            at: 0,
        }
    }

    fn tmp(&mut self) -> String {
        self.fresh += 1;
        format!("{PREFIX}t{}", self.fresh)
    }

    /// Adds node `op_type(inputs)` with one fresh output; returns its name.
    pub(super) fn op(&mut self, op_type: &'static str, inputs: &[&str], attrs: Vec<(&'static str, Attr)>) -> String {
        let out = self.tmp();
        self.nodes.push(proto::Node {
            op_type,
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            outputs: vec![out.clone()],
            name: format!("{PREFIX}n{}_{}", self.at, self.nodes.len()),
            attrs,
        });
        out
    }

    /// A constant tensor; returns its name.
    fn constant(&mut self, dims: Vec<i64>, data_type: i32, raw: Vec<u8>) -> String {
        let name = format!("{PREFIX}c{}", self.initializers.len());
        self.initializers.push(proto::Tensor {
            name: name.clone(),
            dims,
            data_type,
            raw,
        });
        name
    }

    /// `v` as one little-endian element of `dtype`.
    fn element(&self, dtype: DType, v: f64) -> Result<Vec<u8>> {
        Ok(match dtype {
            DType::F32 => (v as f32).to_le_bytes().to_vec(),
            DType::F64 => v.to_le_bytes().to_vec(),
            DType::I64 => (v as i64).to_le_bytes().to_vec(),
            DType::I32 => (v as i32).to_le_bytes().to_vec(),
            DType::U8 => vec![v as u8],
            DType::Bool => vec![u8::from(v != 0.0)],
            other => return Err(self.unsupported(&format!("a constant of dtype {other:?}"))),
        })
    }

    /// A 0-d constant `v` of `dtype`.
    pub(super) fn scalar(&mut self, dtype: DType, v: f64) -> Result<String> {
        let raw = self.element(dtype, v)?;
        Ok(self.constant(Vec::new(), onnx_type(dtype), raw))
    }

    /// An INT64 `[n]` constant.
    pub(super) fn int64s(&mut self, v: &[i64]) -> String {
        let raw = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.constant(vec![v.len() as i64], data_type::INT64, raw)
    }

    /// Makes the axes' size tensors: axis `k` is dim `dim` of graph input `input`.
    pub(crate) fn define_axes(&mut self, axes: &[(String, usize)]) {
        for (input, dim) in axes {
            let shape = self.op("Shape", &[input], vec![]);
            let at = self.int64s(&[*dim as i64]);
            let size = self.op("Gather", &[&shape, &at], vec![("axis", Attr::Int(0))]);
            self.axes.push(size);
        }
    }

    /// An INT64 `[1]` tensor holding `d` at run time.
    fn dim(&mut self, d: &SymDim) -> String {
        if let Some(name) = self.dims.get(d) {
            return name.clone();
        }
        let name = if d.is_fixed() {
            self.int64s(&[d.coef])
        } else {
            let mut acc: Option<String> = None;
            for (k, &e) in d.exps.iter().enumerate() {
                for _ in 0..e {
                    let axis = self.axes[k].clone();
                    acc = Some(match acc {
                        None => axis,
                        Some(a) => self.op("Mul", &[&a, &axis], vec![]),
                    });
                }
            }
            let acc = acc.unwrap_or_default();
            if d.coef == 1 {
                acc
            } else {
                let c = self.int64s(&[d.coef]);
                self.op("Mul", &[&acc, &c], vec![])
            }
        };
        self.dims.insert(d.clone(), name.clone());
        name
    }

    /// An INT64 `[rank]` tensor holding shape `dims` at run time.
    fn shape(&mut self, dims: &[SymDim]) -> String {
        if dims.iter().all(SymDim::is_fixed) {
            let v: Vec<i64> = dims.iter().map(|d| d.coef).collect();
            return self.int64s(&v);
        }
        let parts: Vec<String> = dims.iter().map(|d| self.dim(d)).collect();
        let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
        self.op("Concat", &refs, vec![("axis", Attr::Int(0))])
    }

    /// `d` as a 0-d INT64 tensor.
    pub(super) fn dim_scalar(&mut self, d: &SymDim) -> String {
        let t = self.dim(d);
        let axes = self.int64s(&[0]);
        self.op("Squeeze", &[&t, &axes], vec![])
    }

    pub(super) fn unsupported(&self, what: &str) -> crate::Error {
        let op = self.g.nodes.get(self.at).map_or("?", |n| n.op.name());
        invalid(
            "onnx export",
            format!("node {} ({op}): {what} has no ONNX form in this exporter", self.at),
        )
    }

    fn input(&self, node: &Node, i: usize) -> Result<String> {
        let v = node.inputs[i];
        let name = &self.names[v];
        if name.is_empty() {
            return Err(invalid(
                "onnx export",
                format!(
                    "node {} ({}) reads value %{v}, which an inference graph does not compute",
                    self.at,
                    node.op.name()
                ),
            ));
        }
        Ok(name.clone())
    }

    fn dtype(&self, v: ValueId) -> DType {
        self.g.values[v].dtype
    }

    fn rank(&self, v: ValueId) -> usize {
        self.shapes[v].len()
    }

    /// `x` (value `v`, `[..., Hkv, S, D]`) with each head repeated for `heads / Hkv` query heads
    /// in a row (`[..., heads, S, D]`, transformers' `repeat_kv`): Unsqueeze, Expand, Reshape.
    fn repeat_heads(&mut self, x: &str, v: ValueId, heads: &SymDim) -> Result<String> {
        let s = &self.shapes[v];
        let r = s.len();
        let (hkv, d) = (&s[r - 3], &s[r - 1]);
        let fixed = heads.is_fixed() && hkv.is_fixed() && d.is_fixed();
        if !fixed || hkv.coef <= 0 || heads.coef % hkv.coef != 0 {
            return Err(self.unsupported("grouped-query attention whose head counts change"));
        }
        let (rep, d) = (heads.coef / hkv.coef, d.coef);
        let axis = self.int64s(&[r as i64 - 2]);
        let wide = self.op("Unsqueeze", &[x, &axis], vec![]);
        let mut ones = vec![1i64; r + 1];
        ones[r - 2] = rep;
        let ones = self.int64s(&ones);
        let wide = self.op("Expand", &[&wide, &ones], vec![]);
        // leading dims copied (0), the heads merged, S inferred
        let mut merged = vec![0i64; r - 3];
        merged.extend([heads.coef, -1, d]);
        let merged = self.int64s(&merged);
        Ok(self.op("Reshape", &[&wide, &merged], vec![]))
    }

    /// Writes node `i`; its first output's name goes into [`Emitter::names`].
    pub(crate) fn node(&mut self, i: usize, narrow_start: Option<&SymDim>) -> Result<()> {
        self.at = i;
        let node = &self.g.nodes[i];
        let args: Vec<String> = (0..node.inputs.len())
            .map(|k| self.input(node, k))
            .collect::<Result<_>>()?;
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = node.outputs[0];
        let dtype = self.dtype(out);
        let name = match &node.op {
            Op::ToDevice(_) | Op::Contiguous => self.op("Identity", &a[..1], vec![]),
            Op::Unary(u) => self.unary(*u, a[0], dtype)?,
            Op::Binary(b) => {
                let t = match b {
                    BinaryOp::Add => "Add",
                    BinaryOp::Sub => "Sub",
                    BinaryOp::Mul => "Mul",
                    BinaryOp::Div => "Div",
                    BinaryOp::Pow => "Pow",
                    BinaryOp::Maximum => "Max",
                    BinaryOp::Minimum => "Min",
                };
                self.op(t, &a, vec![])
            }
            Op::Compare(c) => match c {
                CompareOp::Eq => self.op("Equal", &a, vec![]),
                CompareOp::Ne => {
                    let eq = self.op("Equal", &a, vec![]);
                    self.op("Not", &[&eq], vec![])
                }
                CompareOp::Lt => self.op("Less", &a, vec![]),
                CompareOp::Le => self.op("LessOrEqual", &a, vec![]),
                CompareOp::Gt => self.op("Greater", &a, vec![]),
                CompareOp::Ge => self.op("GreaterOrEqual", &a, vec![]),
            },
            Op::Affine { mul, add } if *mul == 1.0 && *add == 0.0 => self.op("Identity", &a[..1], vec![]),
            Op::Affine { mul, add } => {
                let mut x = a[0].to_string();
                if *mul != 1.0 {
                    let m = self.scalar(dtype, *mul)?;
                    x = self.op("Mul", &[&x, &m], vec![]);
                }
                if *add != 0.0 {
                    let c = self.scalar(dtype, *add)?;
                    x = self.op("Add", &[&x, &c], vec![]);
                }
                x
            }
            Op::PowScalar(p) => {
                let c = self.scalar(dtype, *p)?;
                self.op("Pow", &[a[0], &c], vec![])
            }
            Op::Clamp { min, max } => {
                let (lo, hi) = (self.scalar(dtype, *min)?, self.scalar(dtype, *max)?);
                self.op("Clip", &[a[0], &lo, &hi], vec![])
            }
            Op::Where => self.op("Where", &a, vec![]),
            Op::Cast(to) => self.op("Cast", &a, vec![("to", Attr::Int(i64::from(onnx_type(*to))))]),
            Op::Reduce { op, dims, keepdim } => {
                let axes: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
                let keep = ("keepdims", Attr::Int(i64::from(*keepdim)));
                match op {
                    ReduceOp::Sum => {
                        let ax = self.int64s(&axes);
                        self.op("ReduceSum", &[a[0], &ax], vec![keep])
                    }
                    ReduceOp::Mean => self.op("ReduceMean", &a[..1], vec![("axes", ints(&axes)), keep]),
                    ReduceOp::Max => self.op("ReduceMax", &a[..1], vec![("axes", ints(&axes)), keep]),
                    ReduceOp::Min => self.op("ReduceMin", &a[..1], vec![("axes", ints(&axes)), keep]),
                }
            }
            Op::ArgMax { dim, keepdim } => self.op(
                "ArgMax",
                &a[..1],
                vec![
                    ("axis", Attr::Int(*dim as i64)),
                    ("keepdims", Attr::Int(i64::from(*keepdim))),
                ],
            ),
            Op::Matmul => self.op("MatMul", &a, vec![]),
            Op::Linear { act, bias, residual } => {
                let wt = self.op("Transpose", &a[1..2], vec![("perm", ints(&[1, 0]))]);
                let mut y = self.op("MatMul", &[a[0], &wt], vec![]);
                if *bias {
                    y = self.op("Add", &[&y, a[2]], vec![]);
                }
                if let Some(u) = act {
                    y = self.unary(*u, &y, dtype)?;
                }
                if *residual {
                    y = self.op("Add", &[&y, a[2 + usize::from(*bias)]], vec![]);
                }
                y
            }
            Op::Reshape(_) => {
                let s = self.shape(&self.shapes[out].clone());
                self.op("Reshape", &[a[0], &s], vec![])
            }
            Op::Expand(_) => {
                let s = self.shape(&self.shapes[out].clone());
                self.op("Expand", &[a[0], &s], vec![])
            }
            Op::Permute(p) => {
                let perm: Vec<i64> = p.iter().map(|&d| d as i64).collect();
                self.op("Transpose", &a, vec![("perm", ints(&perm))])
            }
            Op::Narrow { dim, .. } => {
                let start = narrow_start
                    .cloned()
                    .ok_or_else(|| self.unsupported("a narrow whose start is no product of the axes"))?;
                let len = self.shapes[out][*dim].clone();
                let s = self.dim(&start);
                let l = self.dim(&len);
                let e = self.op("Add", &[&s, &l], vec![]);
                let axes = self.int64s(&[*dim as i64]);
                self.op("Slice", &[a[0], &s, &e, &axes], vec![])
            }
            Op::Cat { dim } => self.op("Concat", &a, vec![("axis", Attr::Int(*dim as i64))]),
            Op::IndexSelect { dim } => self.op("Gather", &a, vec![("axis", Attr::Int(*dim as i64))]),
            Op::Gather { dim } => self.op("GatherElements", &a, vec![("axis", Attr::Int(*dim as i64))]),
            Op::Softmax { log } => {
                let t = if *log { "LogSoftmax" } else { "Softmax" };
                self.op(t, &a, vec![("axis", Attr::Int(-1))])
            }
            Op::Norm {
                eps,
                rms,
                has_weight,
                has_bias,
            } => self.norm(&a, *eps, *rms, *has_weight, *has_bias, dtype)?,
            Op::Attention { causal, scale } => {
                let (q, k, v) = (node.inputs[0], node.inputs[1], node.inputs[2]);
                let (tq, tk) = (
                    self.shapes[q][self.rank(q) - 2].clone(),
                    self.shapes[k][self.rank(k) - 2].clone(),
                );
                let (mut kr, mut vr) = (a[1].to_string(), a[2].to_string());
                let r = self.rank(q);
                if r >= 3 && self.shapes[q][r - 3] != self.shapes[k][r - 3] {
                    // grouped-query attention: each key/value head repeated for its query heads
                    kr = self.repeat_heads(a[1], k, &self.shapes[q][r - 3].clone())?;
                    vr = self.repeat_heads(a[2], v, &self.shapes[q][r - 3].clone())?;
                }
                self.attention(
                    a[0],
                    &kr,
                    &vr,
                    self.rank(q),
                    (*causal).then_some((tq, tk)),
                    *scale,
                    dtype,
                )?
            }
            Op::QkvAttention { heads, causal, scale } => {
                let x = node.inputs[0];
                let s = self.shapes[x].clone();
                let c3 = s.last().filter(|d| d.is_fixed()).map(|d| d.coef);
                let c = match c3 {
                    Some(c3) if s.len() == 3 && c3 % (3 * *heads as i64) == 0 => c3 / 3,
                    _ => return Err(self.unsupported("fused attention of this layout")),
                };
                let hd = c / *heads as i64;
                let split = self.int64s(&[0, 0, 3, *heads as i64, hd]);
                let r = self.op("Reshape", &[a[0], &split], vec![]);
                let t = self.op("Transpose", &[&r], vec![("perm", ints(&[2, 0, 3, 1, 4]))]);
                let mut qkv = Vec::new();
                for part in 0..3 {
                    let at = self.constant(Vec::new(), data_type::INT64, (part as i64).to_le_bytes().to_vec());
                    qkv.push(self.op("Gather", &[&t, &at], vec![("axis", Attr::Int(0))]));
                }
                let tdim = s[1].clone();
                let y = self.attention(
                    &qkv[0],
                    &qkv[1],
                    &qkv[2],
                    4,
                    (*causal).then(|| (tdim.clone(), tdim)),
                    *scale,
                    dtype,
                )?;
                let y = self.op("Transpose", &[&y], vec![("perm", ints(&[0, 2, 1, 3]))]);
                let merge = self.int64s(&[0, 0, c]);
                self.op("Reshape", &[&y, &merge], vec![])
            }
            Op::Conv2d(p) => {
                let w = node.inputs[1];
                let k = &self.shapes[w];
                if k.len() != 4 || !k[2].is_fixed() || !k[3].is_fixed() {
                    return Err(self.unsupported("a convolution whose kernel size changes"));
                }
                let kernel = [k[2].coef, k[3].coef];
                let (ph, pw) = (p.padding.0 as i64, p.padding.1 as i64);
                self.op(
                    "Conv",
                    &a,
                    vec![
                        ("dilations", ints(&[p.dilation.0 as i64, p.dilation.1 as i64])),
                        ("group", Attr::Int(p.groups as i64)),
                        ("kernel_shape", ints(&kernel)),
                        ("pads", ints(&[ph, pw, ph, pw])),
                        ("strides", ints(&[p.stride.0 as i64, p.stride.1 as i64])),
                    ],
                )
            }
            Op::MaxPool2d(p) | Op::AvgPool2d(p) => {
                let (ph, pw) = (p.padding.0 as i64, p.padding.1 as i64);
                let mut attrs = vec![
                    ("kernel_shape", ints(&[p.kernel.0 as i64, p.kernel.1 as i64])),
                    ("pads", ints(&[ph, pw, ph, pw])),
                    ("strides", ints(&[p.stride.0 as i64, p.stride.1 as i64])),
                ];
                if matches!(node.op, Op::AvgPool2d(_)) {
                    // PyTorch's and weft's default: padded positions count
                    attrs.push(("count_include_pad", Attr::Int(1)));
                    self.op("AveragePool", &a[..1], attrs)
                } else {
                    self.op("MaxPool", &a[..1], attrs)
                }
            }
            Op::Fill { value, dtype: fill, .. } => {
                let s = self.shape(&self.shapes[out].clone());
                let value = proto::Tensor {
                    name: String::new(),
                    dims: vec![1],
                    data_type: onnx_type(*fill),
                    raw: self.element(*fill, *value)?,
                };
                self.op("ConstantOfShape", &[&s], vec![("value", Attr::Tensor(value))])
            }
            Op::Arange {
                start, step, dtype: at, ..
            } => {
                if start.fract() != 0.0 || step.fract() != 0.0 {
                    return Err(self.unsupported("a range of fractional start or step"));
                }
                let len = self.shapes[out][0].clone();
                let len = self.dim(&len);
                let st = self.int64s(&[*step as i64]);
                let s0 = self.int64s(&[*start as i64]);
                let span = self.op("Mul", &[&len, &st], vec![]);
                let end = self.op("Add", &[&span, &s0], vec![]);
                let zero = self.int64s(&[0]);
                let end = self.op("Squeeze", &[&end, &zero], vec![]);
                let (s, e, d) = (self.scalar(DType::I64, *start)?, end, self.scalar(DType::I64, *step)?);
                let r = self.op("Range", &[&s, &e, &d], vec![]);
                if *at == DType::I64 {
                    r
                } else {
                    self.op("Cast", &[&r], vec![("to", Attr::Int(i64::from(onnx_type(*at))))])
                }
            }
            other => return Err(self.unsupported(&format!("op {}", other.name()))),
        };
        self.names[out] = name;
        Ok(())
    }
}

/// Per value, its ONNX name (empty until written); and the values held as initializers (by
/// name).
pub(crate) type InitialNames = (Vec<String>, Vec<(ValueId, String)>);

/// The ONNX name of each value that has one before any node is written: the graph's inputs
/// (`input_names`), and tensors made before the capture: a name from `named` when the tensor
/// is one of them (the same storage and layout: a parameter), `/weft/const.N` otherwise. Fails
/// when one name would hold two different tensors.
pub(crate) fn initial_names(
    g: &Graph,
    input_names: &[String],
    named: &[(String, crate::Tensor)],
) -> Result<InitialNames> {
    let mut names = vec![String::new(); g.values.len()];
    let mut externals = Vec::new();
    for (i, &v) in g.inputs.iter().enumerate() {
        names[v] = input_names
            .get(i)
            .cloned()
            .ok_or_else(|| invalid("onnx export", format!("input {i} has no name")))?;
    }
    let mut unnamed = 0;
    let mut held: HashMap<String, &crate::Tensor> = HashMap::new();
    for (v, value) in g.values.iter().enumerate() {
        if let Source::External(t) | Source::Constant(t) = &value.source {
            let name = named
                .iter()
                .find(|(_, p)| p.same_storage(t) && p.layout() == t.layout())
                .map(|(n, _)| n.clone())
                .unwrap_or_else(|| {
                    unnamed += 1;
                    format!("{PREFIX}const.{unnamed}")
                });
            if let Some(other) = held.get(&name) {
                if !(other.same_storage(t) && other.layout() == t.layout()) {
                    return Err(invalid(
                        "onnx export",
                        format!(
                            "the name {name:?} would hold two different tensors ({:?} and {:?}); tensors read by \
                             reference need names of their own",
                            other.shape(),
                            t.shape()
                        ),
                    ));
                }
            }
            held.insert(name.clone(), t);
            names[v] = name.clone();
            externals.push((v, name));
        }
    }
    Ok((names, externals))
}
