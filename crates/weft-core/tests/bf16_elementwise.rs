//! Binary ops of bf16 tensors: same-shape contiguous operands run in one pass that converts in
//! registers (`cpu::elementwise::binary_bf16`); their bits must be those of widening both
//! operands to f32, the f32 op and rounding back, which views and broadcasts still do (a NaN
//! result's payload excepted).

use half::bf16;
use weft_core::{BinaryOp, DType, Tensor};

/// bf16 bit patterns covering signed zeros, subnormals, the largest finite values, infinities,
/// quiet and signalling NaNs, and ordinary values, followed by a pseudo-random fill up to `len`.
fn patterns(len: usize, seed: u32) -> Vec<bf16> {
    let special: [u16; 16] = [
        0x0000, 0x8000, 0x0001, 0x807f, 0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81, 0x3f80, 0xbf80, 0x4049,
        0x3c00, 0x0080,
    ];
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
    (0..len)
        .map(|i| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let bits = if i % 7 == 0 {
                special[(s >> 7) as usize % special.len()]
            } else {
                // exponents around 1 so that sums, products and quotients round (ties included)
                (((s >> 16) as u16) & 0x807f) | 0x3e00 | (((s >> 8) as u16) & 0x0180)
            };
            bf16::from_bits(bits)
        })
        .collect()
}

fn bits(t: &Tensor) -> Vec<u16> {
    t.to_vec::<bf16>().unwrap().iter().map(|x| x.to_bits()).collect()
}

#[test]
fn contiguous_bf16_binary_ops_give_the_bits_of_the_f32_op_rounded() {
    // past the size at which the kernel splits into tasks on the pool
    let (rows, cols) = (211, 190);
    let a = Tensor::from_vec(patterns(rows * cols, 1), &[rows, cols]).unwrap();
    let b = Tensor::from_vec(patterns(rows * cols, 2), &[rows, cols]).unwrap();
    for op in [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::Pow,
    ] {
        let got = a.binary(op, &b).unwrap();
        assert_eq!(got.dtype(), DType::BF16);
        let want = a
            .cast(DType::F32)
            .unwrap()
            .binary(op, &b.cast(DType::F32).unwrap())
            .unwrap()
            .cast(DType::BF16)
            .unwrap();
        let (g, w) = (bits(&got), bits(&want));
        // a NaN's payload is not specified by Rust's float arithmetic (an optimized build may
        // swap an addition's operands, and x86 keeps the first one's): a NaN must give a NaN,
        // any other value its exact bits
        let nan = |b: u16| b & 0x7fff > 0x7f80;
        for (i, (g, w)) in g.iter().zip(&w).enumerate() {
            if nan(*w) {
                assert!(nan(*g), "{op:?} at {i}: {g:#06x}, want a NaN");
                continue;
            }
            assert_eq!(
                g,
                w,
                "{op:?} at {i}: {:#06x} and {:#06x} gave {g:#06x}, want {w:#06x}",
                a.to_vec::<bf16>().unwrap()[i].to_bits(),
                b.to_vec::<bf16>().unwrap()[i].to_bits()
            );
        }
        // a view (transposed operands) takes the widening path: the same bits, transposed
        let via_views = a.t().unwrap().binary(op, &b.t().unwrap()).unwrap();
        let back = via_views.t().unwrap().contiguous().unwrap();
        for (i, (v, g)) in bits(&back).iter().zip(&g).enumerate() {
            assert!(
                v == g || (nan(*v) && nan(*g)),
                "{op:?} through transposed views at {i}: {v:#06x}, want {g:#06x}"
            );
        }
    }
}

#[test]
fn a_contiguous_window_of_a_larger_buffer_reads_from_its_offset() {
    let a = Tensor::from_vec(patterns(600, 3), &[6, 100]).unwrap();
    let b = Tensor::from_vec(patterns(600, 4), &[6, 100]).unwrap();
    // rows 2..5: contiguous views that start inside their buffers
    let (wa, wb) = (a.narrow(0, 2, 3).unwrap(), b.narrow(0, 1, 3).unwrap());
    assert!(wa.is_contiguous() && wb.is_contiguous());
    let got = wa.binary(BinaryOp::Mul, &wb).unwrap();
    let want = wa
        .contiguous()
        .unwrap()
        .cast(DType::F32)
        .unwrap()
        .binary(BinaryOp::Mul, &wb.contiguous().unwrap().cast(DType::F32).unwrap())
        .unwrap()
        .cast(DType::BF16)
        .unwrap();
    assert_eq!(bits(&got), bits(&want));
}
