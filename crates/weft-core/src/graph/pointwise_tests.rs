//! Unit tests of the one-pass evaluator.

use super::*;
use crate::op::CompareOp;

fn values(n: usize, seed: u64) -> Tensor {
    let mut v = Tensor::randn(&[n], DType::F32, &mut crate::Generator::new(seed))
        .and_then(|t| t.mul_scalar(3.0))
        .and_then(|t| t.to_vec::<f32>())
        .unwrap();
    let special = [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e30,
        -1e-40,
        90.0,
        -110.0,
        1.0,
    ];
    for (i, s) in special.iter().enumerate() {
        if n > 0 {
            v[(i * 31) % n] = *s;
        }
    }
    Tensor::from_vec(v, &[n]).unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect()
}

/// Each instruction alone equals its op's kernel, bit for bit, at lengths around the tile
/// and the parallel threshold.
#[test]
fn every_instruction_equals_its_kernel() {
    let mut ops: Vec<Op> = Vec::new();
    for u in [
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Abs,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Gelu,
        UnaryOp::GeluTanh,
        UnaryOp::Silu,
    ] {
        ops.push(Op::Unary(u));
        ops.push(Op::UnaryBackward(u));
    }
    for b in [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
    ] {
        ops.push(Op::Binary(b));
    }
    ops.push(Op::Affine { mul: 0.1, add: -0.3 });
    ops.push(Op::Affine { mul: 1.0, add: 0.0 });
    for e in [2.0, -1.0, 0.5, 3.3] {
        ops.push(Op::PowScalar(e));
    }
    ops.push(Op::Clamp { min: 0.0, max: 1.0 });
    ops.push(Op::Clamp {
        min: -0.1,
        max: f64::INFINITY,
    });
    for n in [1, 511, 513, 40_000] {
        let (x, y) = (values(n, 1), values(n, 2));
        for op in &ops {
            let two = matches!(op, Op::Binary(_) | Op::UnaryBackward(_));
            let args: Vec<Tensor> = if two {
                vec![x.clone(), y.clone()]
            } else {
                vec![x.clone()]
            };
            let refs: Vec<&Tensor> = args.iter().collect();
            let want = crate::ops::execute(op, &refs).unwrap().remove(0);
            let mut g = Graph::default();
            for t in &args {
                g.values.push(crate::graph::Value {
                    source: Source::External(t.clone()),
                    shape: vec![n],
                    dtype: DType::F32,
                    buffer: g.values.len(),
                    bytes: 4 * n,
                });
            }
            g.values.push(crate::graph::Value {
                source: Source::Node { node: 0, output: 0 },
                shape: vec![n],
                dtype: DType::F32,
                buffer: g.values.len(),
                bytes: 4 * n,
            });
            g.nodes.push(crate::graph::Node {
                op: op.clone(),
                inputs: (0..args.len()).collect(),
                outputs: vec![args.len()],
            });
            let p = Program::build(&g, &[0]).unwrap();
            let Outcome::Fused(got, _) = p.run(args, &[]).unwrap() else {
                panic!("{op:?} did not run fused")
            };
            assert_eq!(bits(&got), bits(&want), "{op:?} at {n} elements");
        }
    }
}

#[test]
fn comparisons_are_left_to_their_kernels() {
    let mut g = Graph::default();
    for dtype in [DType::F32, DType::F32, DType::Bool] {
        g.values.push(crate::graph::Value {
            source: Source::Input(g.values.len()),
            shape: vec![4],
            dtype,
            buffer: g.values.len(),
            bytes: 16,
        });
    }
    g.nodes.push(crate::graph::Node {
        op: Op::Compare(CompareOp::Lt),
        inputs: vec![0, 1],
        outputs: vec![2],
    });
    let why = Program::build(&g, &[0]).unwrap_err();
    assert!(why.contains("bool"), "{why}");
}

/// `gather` reads what a layout's offsets name, from any start, across rows.
#[test]
fn gather_follows_broadcast_and_strided_layouts() {
    let data: Vec<f32> = (0..200).map(|i| i as f32).collect();
    let layouts = [
        Layout::contiguous(&[7]).expand(&[5, 6, 7]).unwrap(),
        Layout::contiguous(&[5, 1, 1]).expand(&[5, 6, 7]).unwrap(),
        Layout::contiguous(&[]).expand(&[3, 4]).unwrap(),
        Layout::contiguous(&[6, 5]).permute(&[1, 0]).unwrap(),
        Layout::contiguous(&[3, 1, 9])
            .narrow(2, 2, 4)
            .unwrap()
            .expand(&[3, 5, 4])
            .unwrap(),
    ];
    for l in &layouts {
        let offsets = l.offsets("test").unwrap();
        for start in 0..offsets.len() {
            for len in [1, 3, offsets.len() - start] {
                let len = len.min(offsets.len() - start);
                let mut dst = vec![0f32; len];
                gather(&data, l, start, &mut dst);
                let want: Vec<f32> = offsets[start..start + len].iter().map(|&o| data[o]).collect();
                assert_eq!(dst, want, "{l:?} from {start}");
            }
        }
    }
}
