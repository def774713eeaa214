//! Tests of the shapes cut to the memory and time budgets.

use super::sizes::{Shapes, Sizes, MAX_TENSOR_BYTES, MIN_TOKENS, MIN_WIDTH};

/// GPT-2's widths and 50k vocabulary at 64 rows of 1024 tokens (`weft plan calibrate
/// --nproc 1`): every tensor within the budget, every call within its FLOPs and bytes, the
/// floors kept, and the line names what was cut.
#[test]
fn sizes_keep_every_tensor_and_call_within_the_budgets() {
    let s = Shapes {
        tokens: 64 * 1024,
        seq: 1024,
        embd: 1024,
        heads: 16,
        inter: 4096,
        vocab: 50257,
        head_dim: 64,
    };
    for (limit, flops, bytes) in [
        (MAX_TENSOR_BYTES, 2e10 * 0.2 / 8.0, 1e10 * 0.2 / 8.0),
        (MAX_TENSOR_BYTES, 2e10 * 0.02 / 8.0, 1e10 * 0.02 / 8.0),
        (1e6, 1e15, 1e15),
        (1e9, 1e12, 1e12),
    ] {
        let z = Sizes::of(s, limit, flops, bytes);
        let mut call = 0.0;
        for &(m, k, n) in &z.products {
            let largest = (m * k).max(k * n).max(m * n);
            assert!(
                4.0 * largest as f64 <= limit || (k.max(n) <= MIN_WIDTH && m <= MIN_TOKENS),
                "{z:?}"
            );
            assert!(m >= 1 && k >= MIN_WIDTH.min(1024) && n >= MIN_WIDTH.min(1024), "{z:?}");
            call += 6.0 * (m * k * n) as f64;
        }
        let floors = z
            .products
            .iter()
            .all(|&(m, k, n)| m <= MIN_TOKENS && k <= MIN_WIDTH && n <= MIN_WIDTH);
        assert!(call <= flops || floors, "{call} > {flops}: {z:?}");
        let (r, h, t, d) = z.attention;
        assert_eq!(d, 64);
        assert!(4.0 * (r * h * t * d) as f64 <= limit, "{z:?}");
        assert!(
            12.0 * (r * t * t * h * d) as f64 <= flops / 2.0 || (r, h) == (1, 1),
            "{z:?}"
        );
        let (tokens, c, i) = z.kernels;
        assert!(
            4.0 * (tokens * c.max(i)) as f64 <= limit || tokens == MIN_TOKENS,
            "{z:?}"
        );
        let line = z.cut(&s).unwrap();
        assert!(
            line.contains("output layer C x V at") && line.contains("(of 65536 x 1024 x 50257)"),
            "{line}"
        );
    }
    // the model's own shapes where they are within the budgets
    let tiny = Shapes {
        tokens: 256,
        seq: 64,
        embd: 64,
        heads: 4,
        inter: 256,
        vocab: 512,
        head_dim: 16,
    };
    let z = Sizes::of(tiny, MAX_TENSOR_BYTES, 1e12, 1e12);
    assert_eq!(z.cut(&tiny), None);
    assert_eq!(z.products[4], (256, 64, 512));
    assert_eq!(z.attention, (4, 4, 64, 16));
}

/// A llama's heads of their own width (Qwen3-0.6B's: 16 heads of 128 over a width of 1024):
/// the q, k, v product is `C x 3q` and the output projection `q x C`, with `q = heads x
/// head_dim`, and attention runs at the head width; the shapes go through `--worker`'s text
/// and back, also where the width does not divide by the heads.
#[test]
fn heads_of_their_own_width_are_measured_at_it() {
    let s = Shapes {
        tokens: 256,
        seq: 64,
        embd: 1024,
        heads: 16,
        inter: 3072,
        vocab: 1000,
        head_dim: 128,
    };
    let z = Sizes::of(s, f64::INFINITY, f64::INFINITY, f64::INFINITY);
    assert_eq!(z.products[0], (256, 1024, 3 * 2048));
    assert_eq!(z.products[1], (256, 2048, 1024));
    assert_eq!(z.attention, (4, 16, 64, 128));
    for embd in [1024, 30] {
        let text = Shapes { embd, ..s }.encode();
        let back = Shapes::decode(&text).unwrap();
        assert_eq!((back.embd, back.head_dim), (embd, 128), "{text}");
    }
    let small = Sizes::of(s, 1e6, f64::INFINITY, f64::INFINITY);
    let line = small.cut(&s).unwrap();
    assert!(line.contains("C x 3q at"), "{line}");
    assert!(Shapes::decode("256,64,1024,16,3072,1000").is_err());
}
