//! The op set: every primitive is one value of [`Op`]. The dispatcher (`ops::execute`) runs it on
//! a backend, autograd (`ops::backward`) differentiates it, and a tracer can record it.
//!
//! Composite operations (linear, embedding, split, stack, masked_fill, ...) are functions of these
//! ops. Fused ops exist where one pass over memory pays: softmax, layer/rms norm, cross-entropy,
//! attention, and each op's backward kernel (`*Backward`), which are ops too.

use crate::DType;
use crate::Shape;

/// Pointwise functions of one float tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Abs,
    Tanh,
    Sigmoid,
    Relu,
    /// Exact GELU: `x * Φ(x)` with the erf form of Φ.
    Gelu,
    /// GELU's tanh approximation: `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
    GeluTanh,
    /// `x * sigmoid(x)`.
    Silu,
}

/// Pointwise functions of two tensors, broadcast against each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Maximum,
    Minimum,
}

/// Pointwise comparisons; the result is Bool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompareOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// Reductions over a set of dims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
}

/// Random distributions of [`Op::Random`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Distribution {
    /// Uniform on `[0, 1)`.
    Uniform,
    /// Standard normal.
    Normal,
}

/// Geometry of a 2-D convolution or pooling window (each pair is (height, width)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Conv2dParams {
    pub stride: (usize, usize),
    pub padding: (usize, usize),
    pub dilation: (usize, usize),
    pub groups: usize,
}

/// Geometry of a 2-D pooling window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pool2dParams {
    pub kernel: (usize, usize),
    pub stride: (usize, usize),
    pub padding: (usize, usize),
}

/// One primitive operation with its attributes. Dims are already resolved (non-negative).
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// A function defined outside the op set, with its own backward.
    Custom(crate::function::CustomOp),
    /// The input copied to another device (`Tensor::to`); its gradient goes back to the input's.
    ToDevice(crate::Device),
    // ---- creation (no inputs) ----
    /// A tensor of `shape` filled with `value`.
    Fill {
        shape: Shape,
        value: f64,
        dtype: DType,
    },
    /// `start, start + step, ...` (`len` values).
    Arange {
        start: f64,
        step: f64,
        len: usize,
        dtype: DType,
    },
    /// Counter-based random numbers: element `i` depends only on `(seed, offset, i)`.
    Random {
        shape: Shape,
        dtype: DType,
        dist: Distribution,
        seed: u64,
        offset: u64,
    },

    // ---- elementwise (ops/elementwise.rs) ----
    Unary(UnaryOp),
    /// Inputs `(x, grad_out)`: the gradient of `Unary(op)` with respect to `x`, in one pass.
    UnaryBackward(UnaryOp),
    Binary(BinaryOp),
    Compare(CompareOp),
    /// `x * mul + add`.
    Affine {
        mul: f64,
        add: f64,
    },
    /// `x ^ exponent`.
    PowScalar(f64),
    /// `min(max(x, min), max)`; use infinities for a one-sided clamp.
    Clamp {
        min: f64,
        max: f64,
    },
    /// Inputs `(cond, a, b)`: `cond ? a : b`, all three broadcast.
    Where,
    Cast(DType),

    // ---- reductions (ops/reduce.rs) ----
    Reduce {
        op: ReduceOp,
        dims: Vec<usize>,
        keepdim: bool,
    },
    ArgMax {
        dim: usize,
        keepdim: bool,
    },
    /// Variance with Bessel-style `correction` (1 = unbiased, PyTorch's default).
    Var {
        dims: Vec<usize>,
        correction: usize,
        keepdim: bool,
    },

    // ---- matmul (ops/matmul.rs) ----
    /// `[..., M, K] @ [..., K, N]` with broadcast batch dims.
    Matmul,
    /// Inputs `(x [M, K], weight [N, K])`, then `b [N]` with `bias`, then `r [M, N]` with
    /// `residual`: `act(x weight^T (+ b)) (+ r)`. Each gemm task adds the bias to its block of
    /// the product, applies `act` and adds `r`, while the block is still in its core's cache, so
    /// none costs a pass of its own. With an `act`, the forward saves the pre-activation
    /// `[M, N]` for the backward. The weight's gradient is made as `grad^T x`, in the weight's
    /// own layout.
    Linear {
        act: Option<UnaryOp>,
        bias: bool,
        residual: bool,
    },
    /// Inputs `(pre [M, N], grad_out [M, N])`: the gradient through `Linear`'s activation,
    /// `grad_out * act'(pre)` `[M, N]`, and its column sums `[N]` (the bias gradient), in one
    /// pass; outputs both.
    LinearActBackward(UnaryOp),
    /// Inputs `(a [M, K], b [K, N])` of one float dtype: `a @ b` as an f32 `[M, N]`, the
    /// products of bf16 or f16 operands accumulated in f32 and rounded once, to f32 (not to the
    /// operands' dtype). Autocast's weight gradients, which go to f32 parameters
    /// (`crate::ops::accumulate`); not differentiable.
    WideMatmul,

    // ---- views and layout (ops/shape.rs) ----
    Reshape(Shape),
    Permute(Vec<usize>),
    Narrow {
        dim: usize,
        start: usize,
        len: usize,
    },
    Expand(Shape),
    Contiguous,
    Cat {
        dim: usize,
    },

    // ---- indexing (ops/index.rs) ----
    /// Inputs `(x, index)`: picks `index` (I64, 1-D) along `dim`.
    IndexSelect {
        dim: usize,
    },
    /// Inputs `(x, index, src)`: `x` with `src` rows added at `index` along `dim`.
    IndexAdd {
        dim: usize,
    },
    /// Inputs `(x, index)`: `out[..i..] = x[..index[..i..]..]` along `dim`.
    Gather {
        dim: usize,
    },
    /// Inputs `(x, index, src)`: `x` with `src` added at `index` along `dim`.
    ScatterAdd {
        dim: usize,
    },
    /// Input: I64 class ids; output I64 `[..., num_classes]`.
    OneHot {
        num_classes: usize,
    },

    // ---- fused nn ops (ops/nn.rs) ----
    /// Softmax (or log-softmax) over the last dim.
    Softmax {
        log: bool,
    },
    /// Inputs `(output, grad_out)`.
    SoftmaxBackward {
        log: bool,
    },
    /// Inputs `(x, weight?, bias?)` normalized over the last dim; `rms` skips the mean.
    /// Saves the per-row mean and reciprocal std for the backward.
    Norm {
        eps: f64,
        rms: bool,
        has_weight: bool,
        has_bias: bool,
    },
    /// Inputs `(x, weight?, grad_out, mean, rstd)`; outputs `(dx, dweight?, dbias?)`.
    NormBackward {
        rms: bool,
        has_weight: bool,
        has_bias: bool,
    },
    /// Inputs `(logits [N, C], targets [N] I64)`: mean over non-ignored rows.
    /// Saves the per-row log-sum-exp.
    CrossEntropy {
        ignore_index: i64,
        label_smoothing: f64,
    },
    /// Inputs `(logits, targets, lse, grad_out)`.
    CrossEntropyBackward {
        ignore_index: i64,
        label_smoothing: f64,
    },
    /// Zeroes each element with probability `p` and scales the rest by `1/(1-p)`; the mask is a
    /// pure function of `(seed, offset, index)` so the backward regenerates it.
    Dropout {
        p: f64,
        seed: u64,
        offset: u64,
    },

    // ---- attention (ops/attention.rs) ----
    /// Inputs `(q, k, v)` as `[B, H, T, D]`; saves the per-row log-sum-exp `[B, H, T]`.
    Attention {
        causal: bool,
        scale: f64,
    },
    /// Inputs `(q, k, v, out, lse, grad_out)`; outputs `(dq, dk, dv)`.
    AttentionBackward {
        causal: bool,
        scale: f64,
    },
    /// Input `qkv` `[B, T, 3C]` (q, k and v side by side, each `heads` heads of `C / heads`);
    /// output `[B, T, C]`; saves the per-row log-sum-exp `[B, heads, T]`.
    QkvAttention {
        heads: usize,
        causal: bool,
        scale: f64,
    },
    /// Inputs `(qkv, out, lse, grad_out)`; output `dqkv` `[B, T, 3C]`.
    QkvAttentionBackward {
        heads: usize,
        causal: bool,
        scale: f64,
    },

    // ---- convolution and pooling (ops/conv.rs) ----
    /// Inputs `(x [N, C, H, W], weight [O, C/groups, KH, KW])`.
    Conv2d(Conv2dParams),
    /// Inputs `(x, weight, grad_out)`; outputs `(dx, dweight)`.
    Conv2dBackward(Conv2dParams),
    /// Saves the argmax position of each window.
    MaxPool2d(Pool2dParams),
    /// Inputs `(x, indices, grad_out)`.
    MaxPool2dBackward(Pool2dParams),
    AvgPool2d(Pool2dParams),
    /// Inputs `(x, grad_out)`.
    AvgPool2dBackward(Pool2dParams),
}

impl Op {
    /// A short name for messages and traces.
    /// Whether this op computes each output element from the same element of its inputs (with
    /// broadcasting): the elementwise family, which a fusion group chains. (The dispatchers,
    /// `ops::execute_on_backend` and `cuda::execute`, list the same ops in exhaustive matches, so
    /// that a new op must be placed in a family there.)
    pub fn is_elementwise(&self) -> bool {
        matches!(
            self,
            Op::Unary(_)
                | Op::UnaryBackward(_)
                | Op::Binary(_)
                | Op::Compare(_)
                | Op::Affine { .. }
                | Op::PowScalar(_)
                | Op::Clamp { .. }
                | Op::Where
                | Op::Cast(_)
        )
    }

    pub fn name(&self) -> &'static str {
        match self {
            Op::ToDevice(_) => "to",
            Op::Fill { .. } => "fill",
            Op::Arange { .. } => "arange",
            Op::Random { .. } => "random",
            Op::Unary(_) => "unary",
            Op::UnaryBackward(_) => "unary_backward",
            Op::Binary(_) => "binary",
            Op::Compare(_) => "compare",
            Op::Affine { .. } => "affine",
            Op::PowScalar(_) => "pow_scalar",
            Op::Clamp { .. } => "clamp",
            Op::Where => "where",
            Op::Cast(_) => "cast",
            Op::Reduce { .. } => "reduce",
            Op::ArgMax { .. } => "argmax",
            Op::Var { .. } => "var",
            Op::Matmul => "matmul",
            Op::WideMatmul => "wide_matmul",
            Op::Linear { .. } => "linear",
            Op::LinearActBackward(_) => "linear_act_backward",
            Op::Reshape(_) => "reshape",
            Op::Permute(_) => "permute",
            Op::Narrow { .. } => "narrow",
            Op::Expand(_) => "expand",
            Op::Contiguous => "contiguous",
            Op::Cat { .. } => "cat",
            Op::IndexSelect { .. } => "index_select",
            Op::IndexAdd { .. } => "index_add",
            Op::Gather { .. } => "gather",
            Op::ScatterAdd { .. } => "scatter_add",
            Op::OneHot { .. } => "one_hot",
            Op::Softmax { .. } => "softmax",
            Op::SoftmaxBackward { .. } => "softmax_backward",
            Op::Norm { .. } => "norm",
            Op::NormBackward { .. } => "norm_backward",
            Op::CrossEntropy { .. } => "cross_entropy",
            Op::CrossEntropyBackward { .. } => "cross_entropy_backward",
            Op::Dropout { .. } => "dropout",
            Op::Attention { .. } => "attention",
            Op::AttentionBackward { .. } => "attention_backward",
            Op::QkvAttention { .. } => "qkv_attention",
            Op::QkvAttentionBackward { .. } => "qkv_attention_backward",
            Op::Conv2d(_) => "conv2d",
            Op::Conv2dBackward(_) => "conv2d_backward",
            Op::MaxPool2d(_) => "max_pool2d",
            Op::MaxPool2dBackward(_) => "max_pool2d_backward",
            Op::AvgPool2d(_) => "avg_pool2d",
            Op::AvgPool2dBackward(_) => "avg_pool2d_backward",
            Op::Custom(c) => c.0.name(),
        }
    }
}
