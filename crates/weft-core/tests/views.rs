//! Property tests: any chain of view ops gives the same elements as the same chain applied to a
//! contiguous copy at every step, and chains of pure views never copy.

use proptest::prelude::*;
use weft_core::{DType, Tensor};

/// A view op with raw parameters, resolved against the current shape when applied.
#[derive(Debug, Clone)]
enum ViewOp {
    Permute(u64),
    Transpose(u8, u8),
    Narrow(u8, u8, u8),
    Unsqueeze(u8),
    Squeeze(u8),
    Expand(u8, u8),
    Reshape(u8),
    Flatten,
}

fn view_op() -> impl Strategy<Value = ViewOp> {
    prop_oneof![
        any::<u64>().prop_map(ViewOp::Permute),
        (any::<u8>(), any::<u8>()).prop_map(|(a, b)| ViewOp::Transpose(a, b)),
        (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(d, s, l)| ViewOp::Narrow(d, s, l)),
        any::<u8>().prop_map(ViewOp::Unsqueeze),
        any::<u8>().prop_map(ViewOp::Squeeze),
        (any::<u8>(), 1u8..4).prop_map(|(d, n)| ViewOp::Expand(d, n)),
        any::<u8>().prop_map(ViewOp::Reshape),
        Just(ViewOp::Flatten),
    ]
}

/// Applies `op` to `t`; `None` when the op does not apply to this shape. The second value says
/// whether the op may copy (a reshape of a non-contiguous tensor).
fn apply(t: &Tensor, op: &ViewOp) -> Option<(Tensor, bool)> {
    let rank = t.rank();
    let shape = t.shape().to_vec();
    let pick = |v: u8, n: usize| (v as usize) % n.max(1);
    Some(match *op {
        ViewOp::Permute(seed) => {
            let mut perm: Vec<usize> = (0..rank).collect();
            let mut s = seed;
            for i in (1..rank).rev() {
                perm.swap(i, (s % (i as u64 + 1)) as usize);
                s /= i as u64 + 1;
            }
            (t.permute(&perm).ok()?, false)
        }
        ViewOp::Transpose(a, b) if rank >= 1 => (
            t.transpose(pick(a, rank) as isize, -1 - pick(b, rank) as isize).ok()?,
            false,
        ),
        ViewOp::Narrow(d, s, l) if rank >= 1 => {
            let d = pick(d, rank);
            let start = pick(s, shape[d]);
            let len = pick(l, shape[d] - start) + 1;
            (t.narrow(d as isize, start, len).ok()?, false)
        }
        ViewOp::Unsqueeze(d) if rank < 5 => (t.unsqueeze(pick(d, rank + 1) as isize).ok()?, !t.is_contiguous()),
        ViewOp::Squeeze(d) if rank >= 1 => {
            let d = pick(d, rank);
            if shape[d] != 1 {
                return None;
            }
            (t.squeeze(d as isize).ok()?, !t.is_contiguous())
        }
        ViewOp::Expand(d, n) if rank >= 1 => {
            let d = pick(d, rank);
            if shape[d] != 1 {
                return None;
            }
            let mut to = shape.clone();
            to[d] = n as usize;
            (t.expand(&to).ok()?, false)
        }
        ViewOp::Reshape(split) if rank >= 1 => {
            // merge the last two dims, or split the last dim by a divisor
            let last = shape[rank - 1];
            let mut to: Vec<isize> = shape.iter().map(|&d| d as isize).collect();
            if split % 2 == 0 && rank >= 2 {
                to.pop();
                *to.last_mut()? *= last as isize;
            } else {
                let f = (2..=last)
                    .find(|f| last.is_multiple_of(*f) && (split as usize).is_multiple_of(3))
                    .unwrap_or(1);
                to.pop();
                to.push(f as isize);
                to.push((last / f) as isize);
            }
            (t.reshape(&to).ok()?, !t.is_contiguous())
        }
        ViewOp::Flatten if rank >= 1 => (t.flatten(0, -1).ok()?, !t.is_contiguous()),
        _ => return None,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn view_chains_match_contiguous_copies(
        shape in proptest::collection::vec(1usize..5, 1..4),
        ops in proptest::collection::vec(view_op(), 1..8),
    ) {
        let n: usize = shape.iter().product();
        let base = Tensor::arange(0.0, n as f64, 1.0, DType::F64).unwrap().view(&shape).unwrap();
        let mut view = base.clone();
        let mut copy = base.contiguous_copy().unwrap();
        let mut copied = false;
        for op in &ops {
            let Some((v, may_copy)) = apply(&view, op) else { continue };
            let (c, _) = apply(&copy, op).expect("same shape, same op");
            copied |= may_copy;
            view = v;
            copy = c.contiguous_copy().unwrap();
            prop_assert_eq!(view.shape(), copy.shape());
            prop_assert_eq!(view.to_vec_f64(), copy.to_vec_f64(), "after {:?}", op);
        }
        if !copied {
            prop_assert!(view.same_storage(&base), "a chain of pure views copied: {:?}", ops);
        }
        // a contiguous() of the view equals the element-wise copy too
        prop_assert_eq!(view.contiguous().unwrap().to_vec_f64(), copy.to_vec_f64());
    }
}

#[test]
fn a_product_with_a_tensor_whose_storage_was_released_is_an_error_not_a_wild_read() {
    let w = Tensor::ones(&[3, 4], DType::F32).unwrap();
    let x = Tensor::ones(&[2, 3], DType::F32).unwrap();
    let view = w.t().unwrap();
    *w.storage().write() = weft_core::storage::CpuStorage::zeros(DType::F32, 0);
    for e in [
        x.matmul(&w).unwrap_err(),
        x.t().unwrap().t().unwrap().matmul(&w).unwrap_err(),
    ] {
        assert!(e.to_string().contains("beyond its storage of 0"), "{e}");
    }
    let e = Tensor::ones(&[2, 4], DType::F32)
        .unwrap()
        .linear(&view.t().unwrap(), None);
    assert!(e.is_err());
    assert!(x.matmul(&view.t().unwrap()).is_err());
}

/// A binary op with a transposed-matrix operand (copied in blocks first) equals the op on the
/// operand's contiguous copy: either side, both sides, square and not, narrowed rows (a stride
/// longer than the rows), f32 and f64.
#[test]
fn binary_ops_on_transposed_matrices_equal_those_on_their_copies() {
    for dtype in [DType::F32, DType::F64] {
        for (rows, cols) in [(2, 3), (17, 33), (32, 16), (40, 45)] {
            let n = (cols * (rows + 3)) as f64;
            let stored = Tensor::arange(0.0, n, 1.0, dtype)
                .unwrap()
                .view(&[cols, rows + 3])
                .unwrap();
            // [rows, cols], strides [1, rows + 3]
            let t = stored.narrow(1, 1, rows).unwrap().t().unwrap();
            let c = t.contiguous_copy().unwrap();
            let other = Tensor::arange(0.5, (rows * cols) as f64 + 0.5, 1.0, dtype)
                .unwrap()
                .view(&[rows, cols])
                .unwrap();
            for (got, want) in [
                (t.add(&other).unwrap(), c.add(&other).unwrap()),
                (other.sub(&t).unwrap(), other.sub(&c).unwrap()),
                (t.mul(&t).unwrap(), c.mul(&c).unwrap()),
            ] {
                assert_eq!(got.to_vec_f64(), want.to_vec_f64(), "{dtype:?} {rows} x {cols}");
            }
        }
    }
}
