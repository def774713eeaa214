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
    // two products, each followed by a group that runs as one pass in the product's buffer
    let f = |xs: &[Tensor]| {
        let h = xs[0].matmul(&xs[0])?.mul_scalar(0.5)?.add(&bias)?.tanh()?;
        Ok(vec![h.matmul(&xs[0])?.sigmoid()?.add_scalar(-0.25)?])
    };
    let (eager, g) = trace(std::slice::from_ref(&x), f).unwrap();
    let g = g.unwrap();
    let p = plan::plan(&g);
    let buffer = n * n * 4;
    // the two products' buffers, alive together at the second product
    assert_eq!(p.buffers.len(), 2, "{p:?}");
    assert_eq!(p.peak_live_bytes, 2 * buffer);
    for _ in 0..3 {
        let before = memory::allocated_bytes();
        memory::reset_max_allocated();
        let out = g.run(std::slice::from_ref(&x)).unwrap();
        let peak = memory::max_allocated_bytes() - before;
        assert_eq!(out[0].to_vec::<f32>().unwrap(), eager[0].to_vec::<f32>().unwrap());
        assert_eq!(peak, p.peak_live_bytes, "replay peak against the plan's");
        drop(out);
    }
}
