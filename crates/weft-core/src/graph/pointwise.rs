//! One-pass execution of fusion groups: a group of elementwise f32 nodes becomes a small
//! program (one instruction per node, reading the group's inputs and earlier instructions'
//! results), run over the output in tiles of [`TILE`] elements on the thread pool. Only the
//! group's result is written to memory; each input is read once.
//!
//! Every instruction applies the per-element function of the op's own kernel, with the same f32
//! arithmetic (`ops::elementwise::forward`): unary ops and their gradients call the kernels'
//! serial functions on each tile, and the scalar ops round their operand to f32 as the kernels
//! do. Results therefore equal node-by-node execution bit for bit. Ops with another dtype
//! (comparisons, `where`, casts) and every non-f32 group run node by node.

use std::mem::MaybeUninit;
use std::sync::Arc;

use super::ir::{Graph, Source, ValueId};
use crate::cpu::elementwise as k;
use crate::error::{invalid, Result};
use crate::layout::Layout;
use crate::op::{BinaryOp, Op, UnaryOp};
use crate::shape::numel;
use crate::storage::StorageElement;
use crate::{DType, Device, Tensor};

/// Elements per tile: each instruction's result for one tile stays in the core's L1 cache.
pub(crate) const TILE: usize = 512;

/// What one replay did with its fusion groups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayStats {
    /// Groups (of two or more nodes) run as one pass.
    pub fused_groups: usize,
    /// Nodes those groups hold.
    pub fused_nodes: usize,
    /// Groups with a program that ran node by node at this replay (a tensor on a GPU, a layout
    /// that does not fit its buffer, or a replay inside an outer capture).
    pub fallback_groups: usize,
    /// One-pass results (of a group or a single elementwise node) written into the buffer of an
    /// input that died there, instead of a new buffer.
    pub in_place: usize,
}

/// Where an instruction's operand comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arg {
    /// Input `k` of the program, broadcast to the program's shape.
    In(usize),
    /// The result of instruction `j`.
    Reg(usize),
}

/// One node's per-element operation, its scalar attributes already rounded to f32 as the
/// kernel rounds them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Inst {
    Unary(UnaryOp, Arg),
    /// `(x, grad_out)`.
    UnaryBackward(UnaryOp, Arg, Arg),
    Binary(BinaryOp, Arg, Arg),
    /// `x * mul + add` (two roundings, no fma, as the kernel).
    Affine {
        mul: f32,
        add: f32,
        x: Arg,
    },
    PowScalar(f32, Arg),
    Clamp {
        lo: f32,
        hi: f32,
        x: Arg,
    },
}

/// A fusion group (or one elementwise node) as a program over f32 elements.
#[derive(Clone, Debug)]
pub(crate) struct Program {
    /// The group's nodes in execution order; the last one makes the result.
    pub nodes: Vec<usize>,
    /// The distinct values the group reads from outside it, in order of first use.
    pub inputs: Vec<ValueId>,
    /// One instruction per node.
    pub insts: Vec<Inst>,
    /// The shape of the group's result (every instruction's shape).
    pub shape: Vec<usize>,
}

impl Program {
    /// The program of `nodes` (in execution order, each intermediate read only inside the
    /// group), or why the group cannot run as one pass.
    pub(crate) fn build(g: &Graph, nodes: &[usize]) -> std::result::Result<Program, String> {
        let last = *nodes.last().ok_or("empty group")?;
        let output = g.nodes[last].outputs[0];
        let shape = g.values[output].shape.clone();
        let mut inputs: Vec<ValueId> = Vec::new();
        let mut insts = Vec::with_capacity(nodes.len());
        let mut made: Vec<(ValueId, usize)> = Vec::new();
        for (j, &i) in nodes.iter().enumerate() {
            let n = &g.nodes[i];
            let name = n.op.name();
            if n.outputs.len() != 1 {
                return Err(format!("{name} has {} results", n.outputs.len()));
            }
            for &v in n.inputs.iter().chain(&n.outputs) {
                if g.values[v].dtype != DType::F32 {
                    return Err(format!("{name} on {:?}", g.values[v].dtype).to_lowercase());
                }
            }
            if g.values[n.outputs[0]].shape != shape {
                return Err(format!("{name} makes another shape than the group's"));
            }
            let mut arg = |v: ValueId| -> Arg {
                if let Some(&(_, r)) = made.iter().find(|(m, _)| *m == v) {
                    return Arg::Reg(r);
                }
                match inputs.iter().position(|&u| u == v) {
                    Some(k) => Arg::In(k),
                    None => {
                        inputs.push(v);
                        Arg::In(inputs.len() - 1)
                    }
                }
            };
            let same = |v: ValueId| g.values[v].shape == shape;
            let inst = match (&n.op, n.inputs.as_slice()) {
                (Op::Unary(u), &[x]) => Inst::Unary(*u, arg(x)),
                (Op::UnaryBackward(u), &[x, d]) if same(x) && same(d) => Inst::UnaryBackward(*u, arg(x), arg(d)),
                (Op::UnaryBackward(_), _) => return Err("unary_backward with broadcast inputs".into()),
                (Op::Binary(b), &[x, y]) => Inst::Binary(*b, arg(x), arg(y)),
                (Op::Affine { mul, add }, &[x]) => Inst::Affine {
                    mul: *mul as f32,
                    add: *add as f32,
                    x: arg(x),
                },
                (Op::PowScalar(e), &[x]) => Inst::PowScalar(*e as f32, arg(x)),
                (Op::Clamp { min, max }, &[x]) => Inst::Clamp {
                    lo: *min as f32,
                    hi: *max as f32,
                    x: arg(x),
                },
                _ => return Err(format!("{name} is not in the one-pass set")),
            };
            insts.push(inst);
            made.push((n.outputs[0], j));
        }
        Ok(Program {
            nodes: nodes.to_vec(),
            inputs,
            insts,
            shape,
        })
    }

    /// Runs the program on `args` (one tensor per [`Program::inputs`]), writing the result into
    /// the buffer of the first `args[d]`, `d` in `donors`, whose buffer is held by nothing else
    /// (its tensor is then consumed). [`Outcome::NodeByNode`] (the arguments given back) when a
    /// tensor is not on the CPU or not f32, or a layout does not fit its buffer: the caller runs
    /// the nodes one by one.
    pub(crate) fn run(&self, mut args: Vec<Tensor>, donors: &[usize]) -> Result<Outcome> {
        if args.len() != self.inputs.len() {
            return Err(invalid("graph", "fused group given the wrong number of inputs"));
        }
        if args
            .iter()
            .any(|t| t.device() != Device::Cpu || t.dtype() != DType::F32)
        {
            return Ok(Outcome::NodeByNode(args));
        }
        let n = numel(&self.shape);
        let layouts = args
            .iter()
            .map(|t| t.layout().expand(&self.shape))
            .collect::<Result<Vec<Layout>>>()?;
        if args.iter().zip(&layouts).any(|(t, l)| !l.fits(t.storage().len())) {
            // a buffer released under its view: the kernels report it
            return Ok(Outcome::NodeByNode(args));
        }
        let reuse = donors.iter().copied().find(|&d| reusable(&args[d], n));
        if let Some(d) = reuse {
            let storage = args.remove(d).storage().clone();
            // the donor is no input of the pass any more: it is read from the output itself
            let (others, mut lays) = (args, layouts);
            lays.remove(d);
            let mut guard = storage.write();
            let data = f32::slice_mut(&mut guard).ok_or_else(|| invalid("graph", "in-place buffer is not f32"))?;
            // SAFETY: f32 and MaybeUninit<f32> share a layout, and only f32 values are written.
            let out = unsafe { &mut *(&mut data[..n] as *mut [f32] as *mut [MaybeUninit<f32>]) };
            self.pass(&others, &lays, Some(d), out);
            drop(guard);
            let layout = Layout::contiguous(&self.shape);
            return Ok(Outcome::Fused(Tensor::build(storage, layout, DType::F32, None), true));
        }
        let mut out = crate::alloc::uninit::<f32>("fused elementwise", n)?;
        self.pass(&args, &layouts, None, &mut out);
        // SAFETY: `pass` writes every element.
        let t = Tensor::from_vec(unsafe { crate::cpu::assume_init(out) }, &self.shape)?;
        Ok(Outcome::Fused(t, false))
    }

    /// Writes every element of `out` (`numel(shape)` elements). `args`/`layouts`: the inputs
    /// other than the donor, in order; input `donor` (when given) is read from `out` itself.
    fn pass(&self, args: &[Tensor], layouts: &[Layout], donor: Option<usize>, out: &mut [MaybeUninit<f32>]) {
        let guards: Vec<_> = args.iter().map(|t| t.storage().read()).collect();
        let empty: &[f32] = &[];
        let srcs: Vec<Src> = guards
            .iter()
            .zip(layouts)
            .map(|(g, l)| {
                let data = f32::slice(g).unwrap_or(empty);
                if l.is_contiguous() {
                    Src::Contiguous(&data[l.offset.min(data.len())..])
                } else {
                    Src::Strided(data, l)
                }
            })
            .collect();
        // map program input k to a source (None: the donor, read from `out`)
        let mut by_input: Vec<Option<&Src>> = Vec::with_capacity(self.inputs.len());
        let mut it = srcs.iter();
        for k in 0..self.inputs.len() {
            by_input.push(if Some(k) == donor { None } else { it.next() });
        }
        let run_chunk = |start: usize, chunk: &mut [MaybeUninit<f32>]| self.chunk(&by_input, start, chunk);
        let n = out.len();
        if n < crate::cpu::PARALLEL_THRESHOLD {
            run_chunk(0, out);
        } else {
            let per = n.div_ceil(crate::cpu::threads::num_threads() * 4).max(4096);
            crate::cpu::pool::for_each_chunk(out, per, |i, c| run_chunk(i * per, c));
        }
    }

    /// One chunk of the output, elements `start..start + out.len()`, tile by tile.
    fn chunk(&self, srcs: &[Option<&Src>], start: usize, out: &mut [MaybeUninit<f32>]) {
        let ni = self.inputs.len();
        let last = self.insts.len() - 1;
        // registers: one per input (a gathered or donor tile), one per instruction but the last
        let mut regs = vec![0f32; (ni + last) * TILE];
        // with rows of at least 64 elements, tiles end at row ends, so that a broadcast input's
        // tile is one run of its storage (read in place) or one value
        let inner = self.shape.last().copied().unwrap_or(1);
        let rows = inner >= 64;
        let mut t0 = 0;
        while t0 < out.len() {
            let mut m = TILE.min(out.len() - t0);
            if rows {
                m = m.min(inner - (start + t0) % inner);
            }
            let (inp, res) = regs.split_at_mut(ni * TILE);
            let mut views: Vec<&[f32]> = Vec::with_capacity(ni);
            for (k, reg) in inp.chunks_mut(TILE).enumerate() {
                let reg = &mut reg[..m];
                match srcs[k] {
                    Some(Src::Contiguous(d)) => views.push(&d[start + t0..start + t0 + m]),
                    Some(Src::Strided(d, l)) if rows && l.strides.last() == Some(&1) => {
                        let off = offset_of(l, start + t0);
                        views.push(&d[off..off + m]);
                    }
                    Some(Src::Strided(d, l)) => {
                        gather(d, l, start + t0, reg);
                        views.push(reg);
                    }
                    None => {
                        // SAFETY: the donor's buffer holds its (initialized) f32 values.
                        let src = unsafe { &*(&out[t0..t0 + m] as *const [MaybeUninit<f32>] as *const [f32]) };
                        reg.copy_from_slice(src);
                        views.push(reg);
                    }
                }
            }
            for (j, inst) in self.insts.iter().enumerate() {
                let (done, rest) = res.split_at_mut(j * TILE);
                let done: &[f32] = done;
                let (a, b) = inst.args();
                let a = operand(a, &views, done, m);
                let b = b.map_or(&[][..], |b| operand(b, &views, done, m));
                let dst: &mut [MaybeUninit<f32>] = if j == last {
                    &mut out[t0..t0 + m]
                } else {
                    // SAFETY: f32 and MaybeUninit<f32> share a layout; only f32 values are written.
                    unsafe { &mut *(&mut rest[..m] as *mut [f32] as *mut [MaybeUninit<f32>]) }
                };
                apply(inst, a, b, dst);
            }
            t0 += m;
        }
    }
}

/// What [`Program::run`] did.
pub(crate) enum Outcome {
    /// The result, and whether it was written into the donor's buffer.
    Fused(Tensor, bool),
    /// Not run: the arguments, to run the nodes one by one.
    NodeByNode(Vec<Tensor>),
}

/// Whether `t`'s buffer can take the result (`n` f32 elements): held by nothing but `t`, on the
/// CPU, contiguous from its start and exactly `n` elements long.
fn reusable(t: &Tensor, n: usize) -> bool {
    Arc::strong_count(&t.0) == 1
        && Arc::strong_count(t.storage()) == 1
        && t.device() == Device::Cpu
        && t.dtype() == DType::F32
        && t.is_contiguous()
        && t.layout().offset == 0
        && t.numel() == n
        && t.storage().len() == n
}

/// An input's elements: a contiguous run from the element of output index 0, or a strided
/// (broadcast) layout over the output's shape.
enum Src<'a> {
    Contiguous(&'a [f32]),
    Strided(&'a [f32], &'a Layout),
}

/// The storage offset of output element `e` (row-major index) under layout `l`.
fn offset_of(l: &Layout, mut e: usize) -> usize {
    let mut off = l.offset;
    for d in (0..l.rank()).rev() {
        off += (e % l.shape[d]) * l.strides[d];
        e /= l.shape[d];
    }
    off
}

/// `dst[i] = data[offset of output element start + i]` under layout `l` (the output's shape).
fn gather(data: &[f32], l: &Layout, start: usize, dst: &mut [f32]) {
    let rank = l.rank();
    if rank == 0 {
        dst.fill(data[l.offset]);
        return;
    }
    let inner = l.shape[rank - 1];
    let inner_stride = l.strides[rank - 1];
    let mut done = 0;
    while done < dst.len() {
        let e = start + done;
        let run = (inner - e % inner).min(dst.len() - done);
        let off = offset_of(l, e);
        let out = &mut dst[done..done + run];
        if inner_stride == 0 {
            out.fill(data[off]);
        } else if inner_stride == 1 {
            out.copy_from_slice(&data[off..off + run]);
        } else {
            for (i, o) in out.iter_mut().enumerate() {
                *o = data[off + i * inner_stride];
            }
        }
        done += run;
    }
}

/// The tile of operand `a`: an input's view, or an earlier instruction's register (`regs`
/// holds the registers of the instructions before the current one), `m` elements.
fn operand<'a>(a: Arg, views: &[&'a [f32]], regs: &'a [f32], m: usize) -> &'a [f32] {
    match a {
        Arg::In(k) => views[k],
        Arg::Reg(r) => &regs[r * TILE..r * TILE + m],
    }
}

impl Inst {
    /// The operands: the first, and the second of a two-input op.
    fn args(&self) -> (Arg, Option<Arg>) {
        match *self {
            Inst::Unary(_, x) | Inst::PowScalar(_, x) => (x, None),
            Inst::Affine { x, .. } | Inst::Clamp { x, .. } => (x, None),
            Inst::UnaryBackward(_, x, y) | Inst::Binary(_, x, y) => (x, Some(y)),
        }
    }
}

/// Applies one instruction to a tile (operands `x`, and `y` for a two-input op): the loops are
/// those of `ops::elementwise::forward`.
fn apply(inst: &Inst, x: &[f32], y: &[f32], dst: &mut [MaybeUninit<f32>]) {
    fn map(x: &[f32], dst: &mut [MaybeUninit<f32>], f: impl Fn(f32) -> f32) {
        for (d, &x) in dst.iter_mut().zip(x) {
            d.write(f(x));
        }
    }
    fn zip(x: &[f32], y: &[f32], dst: &mut [MaybeUninit<f32>], f: impl Fn(f32, f32) -> f32) {
        for ((d, &x), &y) in dst.iter_mut().zip(x).zip(y) {
            d.write(f(x, y));
        }
    }
    match *inst {
        Inst::Unary(u, _) => k::unary_serial(u, x, dst),
        Inst::UnaryBackward(u, ..) => k::unary_backward_serial(u, x, y, dst),
        Inst::Binary(b, ..) => match b {
            BinaryOp::Add => zip(x, y, dst, |a, b| a + b),
            BinaryOp::Sub => zip(x, y, dst, |a, b| a - b),
            BinaryOp::Mul => zip(x, y, dst, |a, b| a * b),
            BinaryOp::Div => zip(x, y, dst, |a, b| a / b),
            BinaryOp::Pow => zip(x, y, dst, |a, b| a.powf(b)),
            BinaryOp::Maximum => zip(x, y, dst, |a, b| if b > a { b } else { a }),
            BinaryOp::Minimum => zip(x, y, dst, |a, b| if b < a { b } else { a }),
        },
        Inst::Affine { mul, add, .. } => map(x, dst, |v| v * mul + add),
        Inst::PowScalar(e, _) => {
            if e == 2.0 {
                map(x, dst, |v| v * v)
            } else if e == -1.0 {
                map(x, dst, |v| 1.0 / v)
            } else {
                map(x, dst, |v| v.powf(e))
            }
        }
        Inst::Clamp { lo, hi, .. } => map(x, dst, |v| v.max(lo).min(hi)),
    }
}

/// Whether the value is one the replay may overwrite once its last reader ran: a node's result
/// (never an input, a parameter or a constant).
pub(crate) fn computed(g: &Graph, v: ValueId) -> bool {
    matches!(g.values[v].source, Source::Node { .. })
}

#[cfg(test)]
#[path = "pointwise_tests.rs"]
mod tests;
