//! Gradient checks on random shapes: broadcasting binary ops, reductions over random dim sets,
//! batched matmul with broadcast batch dims, and ops on permuted (non-contiguous) inputs.

mod common;

use common::gradcheck;
use proptest::prelude::*;
use weft_core::{BinaryOp, Tensor};

/// A shape of rank 0..=3 with dims 1..=3, and a second shape that broadcasts against it (some
/// dims set to 1, some leading dims dropped).
fn broadcast_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    proptest::collection::vec(1usize..4, 0..4).prop_flat_map(|a| {
        let rank = a.len();
        (Just(a), proptest::collection::vec(any::<bool>(), rank), 0..=rank).prop_map(|(a, ones, drop)| {
            let b: Vec<usize> = a
                .iter()
                .zip(&ones)
                .map(|(&d, &one)| if one { 1 } else { d })
                .skip(drop)
                .collect();
            (a, b)
        })
    })
}

fn seeded(shape: &[usize], seed: u64) -> Tensor {
    common::uniform(shape, 0.5, 1.5, seed)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn binary_broadcast((a, b) in broadcast_pair(), swap in any::<bool>(), seed in 0u64..1000) {
        let (a, b) = if swap { (b, a) } else { (a, b) };
        let (x, y) = (seeded(&a, seed), seeded(&b, seed + 1));
        for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Pow] {
            gradcheck(&format!("{op:?} {a:?} {b:?}"), &[x.clone(), y.clone()], |t| t[0].binary(op, &t[1]));
        }
    }

    #[test]
    fn reductions_over_random_dims(shape in proptest::collection::vec(1usize..4, 1..4), mask in any::<u8>(), keep in any::<bool>()) {
        let x = seeded(&shape, mask as u64);
        let dims: Vec<isize> = (0..shape.len()).filter(|i| mask & (1 << i) != 0).map(|i| i as isize).collect();
        gradcheck(&format!("sum {shape:?} {dims:?}"), std::slice::from_ref(&x), |t| t[0].sum(&dims, keep));
        gradcheck(&format!("mean {shape:?} {dims:?}"), std::slice::from_ref(&x), |t| t[0].mean(&dims, keep));
        gradcheck(&format!("var {shape:?} {dims:?}"), std::slice::from_ref(&x), |t| t[0].var(&dims, 0, keep));
        gradcheck(&format!("max {shape:?} {dims:?}"), std::slice::from_ref(&x), |t| t[0].max(&dims, keep));
    }

    #[test]
    fn batched_matmul((batch_a, batch_b) in broadcast_pair(), m in 1usize..4, k in 1usize..4, n in 1usize..4, seed in 0u64..1000) {
        let mut sa = batch_a.clone();
        sa.extend([m, k]);
        let mut sb = batch_b.clone();
        sb.extend([k, n]);
        gradcheck(&format!("matmul {sa:?} {sb:?}"), &[seeded(&sa, seed), seeded(&sb, seed + 7)], |t| t[0].matmul(&t[1]));
    }

    #[test]
    fn ops_on_permuted_inputs(shape in proptest::collection::vec(2usize..4, 3), seed in 0u64..1000) {
        // the input is stored [d2, d0, d1] and permuted to [d0, d1, d2] before each op
        let stored = seeded(&[shape[2], shape[0], shape[1]], seed);
        let view = |t: &Tensor| t.permute(&[1, 2, 0]);
        gradcheck("softmax permuted", std::slice::from_ref(&stored), |t| view(&t[0])?.softmax(-1));
        gradcheck("layer_norm permuted", std::slice::from_ref(&stored), |t| view(&t[0])?.layer_norm(None, None, 1e-5));
        gradcheck("tanh permuted", std::slice::from_ref(&stored), |t| view(&t[0])?.tanh());
        gradcheck("sum permuted", std::slice::from_ref(&stored), |t| view(&t[0])?.sum(&[1], false));
    }
}
