//! The memory plan against a replay: the most tensor bytes a replay holds at once (beyond its
//! inputs) is the plan's peak, with one-pass groups that never make their intermediates and
//! write their results into dying inputs' buffers. One test in this file: the byte counters are
//! process-wide.

use weft_core::graph::{plan, trace};
use weft_core::{memory, DType, Generator, Tensor};

fn randn(shape: &[usize], seed: u64) -> Tensor {
    Tensor::randn(shape, DType::F32, &mut Generator::new(seed)).unwrap()
}

#[test]
fn a_replay_holds_what_the_plan_says_at_its_peak() {
    let n = 256;
    let x = randn(&[n, n], 1);
    let bias = randn(&[n], 2);
    let buffer = n * n * 4;
    // (graph, in-place passes, the planned peak in buffers): a product and a group in its
    // buffer, where writing in place halves the peak; then two such pairs in a row; then the
    // product also returned, so that the group needs a buffer of its own
    type Step = fn(&[Tensor], &Tensor) -> weft_core::Result<Vec<Tensor>>;
    let cases: [(&str, Step, usize, usize); 3] = [
        ("one", |xs, b| Ok(vec![xs[0].matmul(&xs[0])?.add(b)?.tanh()?]), 1, 1),
        (
            "two",
            |xs, b| {
                let h = xs[0].matmul(&xs[0])?.mul_scalar(0.5)?.add(b)?.tanh()?;
                Ok(vec![h.matmul(&xs[0])?.sigmoid()?.add_scalar(-0.25)?])
            },
            2,
            2,
        ),
        (
            "kept",
            |xs, b| {
                let h = xs[0].matmul(&xs[0])?;
                Ok(vec![h.add(b)?.tanh()?, h])
            },
            0,
            2,
        ),
    ];
    for (name, f, in_place, buffers) in cases {
        let (eager, g) = trace(std::slice::from_ref(&x), |xs| f(xs, &bias)).unwrap();
        let g = g.unwrap();
        let p = plan::plan(&g);
        assert_eq!(p.peak_live_bytes, buffers * buffer, "{name}: {p:?}");
        for _ in 0..3 {
            let before = memory::allocated_bytes();
            memory::reset_max_allocated();
            let (out, stats) = g.run_stats(std::slice::from_ref(&x)).unwrap();
            let peak = memory::max_allocated_bytes() - before;
            assert_eq!(stats.in_place, in_place, "{name}");
            for (a, b) in out.iter().zip(&eager) {
                assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap(), "{name}");
            }
            assert_eq!(peak, p.peak_live_bytes, "{name}: the replay's peak against the plan's");
            drop(out);
        }
    }
}
