//! The ONNX operators each fused op of the op set decomposes into: the activations (GELU by
//! its `Erf` or `Tanh` formula, SiLU, rsqrt), layer and RMS norm, and attention with its
//! causal mask. Opset 17 has none of them as one node (`LayerNormalization` aside), and older
//! runtimes read these.

use super::dims::SymDim;
use super::emit::{ints, Emitter};
use super::proto::Attr;
use crate::error::Result;
use crate::op::UnaryOp;
use crate::DType;

impl Emitter<'_> {
    /// `u(x)` for a value of `dtype`.
    pub(super) fn unary(&mut self, u: UnaryOp, x: &str, dtype: DType) -> Result<String> {
        Ok(match u {
            UnaryOp::Neg => self.op("Neg", &[x], vec![]),
            UnaryOp::Exp => self.op("Exp", &[x], vec![]),
            UnaryOp::Log => self.op("Log", &[x], vec![]),
            UnaryOp::Sqrt => self.op("Sqrt", &[x], vec![]),
            UnaryOp::Rsqrt => {
                let s = self.op("Sqrt", &[x], vec![]);
                self.op("Reciprocal", &[&s], vec![])
            }
            UnaryOp::Abs => self.op("Abs", &[x], vec![]),
            UnaryOp::Tanh => self.op("Tanh", &[x], vec![]),
            UnaryOp::Sigmoid => self.op("Sigmoid", &[x], vec![]),
            UnaryOp::Relu => self.op("Relu", &[x], vec![]),
            UnaryOp::Silu => {
                let s = self.op("Sigmoid", &[x], vec![]);
                self.op("Mul", &[x, &s], vec![])
            }
            // 0.5 x (1 + erf(x / sqrt 2))
            UnaryOp::Gelu => {
                let r = self.scalar(dtype, std::f64::consts::FRAC_1_SQRT_2)?;
                let m = self.op("Mul", &[x, &r], vec![]);
                let e = self.op("Erf", &[&m], vec![]);
                self.half_x_one_plus(x, &e, dtype)?
            }
            // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
            UnaryOp::GeluTanh => {
                let x2 = self.op("Mul", &[x, x], vec![]);
                let x3 = self.op("Mul", &[&x2, x], vec![]);
                let c = self.scalar(dtype, 0.044715)?;
                let cx3 = self.op("Mul", &[&x3, &c], vec![]);
                let inner = self.op("Add", &[x, &cx3], vec![]);
                let k = self.scalar(dtype, (2.0 / std::f64::consts::PI).sqrt())?;
                let scaled = self.op("Mul", &[&inner, &k], vec![]);
                let t = self.op("Tanh", &[&scaled], vec![]);
                self.half_x_one_plus(x, &t, dtype)?
            }
        })
    }

    /// `0.5 x (1 + t)`.
    fn half_x_one_plus(&mut self, x: &str, t: &str, dtype: DType) -> Result<String> {
        let one = self.scalar(dtype, 1.0)?;
        let half = self.scalar(dtype, 0.5)?;
        let p = self.op("Add", &[t, &one], vec![]);
        let xp = self.op("Mul", &[x, &p], vec![]);
        Ok(self.op("Mul", &[&xp, &half], vec![]))
    }

    /// Layer or RMS norm over the last dim, then the weight and bias.
    pub(super) fn norm(&mut self, a: &[&str], eps: f64, rms: bool, w: bool, b: bool, dtype: DType) -> Result<String> {
        let last = ("axes", ints(&[-1]));
        let keep = ("keepdims", Attr::Int(1));
        let centered = if rms {
            a[0].to_string()
        } else {
            let mean = self.op("ReduceMean", &a[..1], vec![last.clone(), keep.clone()]);
            self.op("Sub", &[a[0], &mean], vec![])
        };
        let sq = self.op("Mul", &[&centered, &centered], vec![]);
        let var = self.op("ReduceMean", &[&sq], vec![last, keep]);
        let e = self.scalar(dtype, eps)?;
        let ve = self.op("Add", &[&var, &e], vec![]);
        let sd = self.op("Sqrt", &[&ve], vec![]);
        let mut y = self.op("Div", &[&centered, &sd], vec![]);
        let mut next = 1;
        if w {
            y = self.op("Mul", &[&y, a[next]], vec![]);
            next += 1;
        }
        if b {
            y = self.op("Add", &[&y, a[next]], vec![]);
        }
        Ok(y)
    }

    /// `softmax(q kᵀ scale (+ causal mask)) v` over the last two dims of rank-`rank` tensors;
    /// `causal` holds the query and key lengths.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention(
        &mut self,
        q: &str,
        k: &str,
        v: &str,
        rank: usize,
        causal: Option<(SymDim, SymDim)>,
        scale: f64,
        dtype: DType,
    ) -> Result<String> {
        let mut perm: Vec<i64> = (0..rank as i64).collect();
        perm.swap(rank - 1, rank - 2);
        let kt = self.op("Transpose", &[k], vec![("perm", ints(&perm))]);
        let s = self.op("MatMul", &[q, &kt], vec![]);
        let c = self.scalar(dtype, scale)?;
        let mut s = self.op("Mul", &[&s, &c], vec![]);
        if let Some((tq, tk)) = causal {
            if tq != tk {
                return Err(self.unsupported("causal attention with fewer queries than keys"));
            }
            let n = self.dim_scalar(&tq);
            let zero = self.scalar(DType::I64, 0.0)?;
            let one = self.scalar(DType::I64, 1.0)?;
            let r = self.op("Range", &[&zero, &n, &one], vec![]);
            let (a0, a1) = (self.int64s(&[0]), self.int64s(&[1]));
            let cols = self.op("Unsqueeze", &[&r, &a0], vec![]);
            let rows = self.op("Unsqueeze", &[&r, &a1], vec![]);
            // key j is hidden from query i when j > i
            let hidden = self.op("Greater", &[&cols, &rows], vec![]);
            let neg = self.scalar(dtype, f64::NEG_INFINITY)?;
            s = self.op("Where", &[&hidden, &neg, &s], vec![]);
        }
        let p = self.op("Softmax", &[&s], vec![("axis", Attr::Int(-1))]);
        Ok(self.op("MatMul", &[&p, v], vec![]))
    }
}
