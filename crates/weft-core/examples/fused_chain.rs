//! Eager against compiled (fused) replay of elementwise chains over 4M f32 elements.
//!
//! `WEFT_NUM_THREADS=2 cargo run --release -p weft-core --example fused_chain [repeats]`
//!
//! Prints, for each chain, the median wall time of a call in milliseconds (eager, compiled
//! replay) and the ratio; the results are checked equal bit for bit first. Eagerly each
//! intermediate is freed as soon as the next op has read it. A first line times one eager op
//! (one read, one write of a new buffer): the floor a one-pass chain approaches.

use std::time::Instant;

use weft_core::graph::compile;
use weft_core::{DType, Generator, Result, Tensor};

/// One op of a chain: `(previous result, x, bias [C]) -> result`.
type Step = fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>;

/// Six memory-bound ops: scale, bias `[C]`, relu, product with the input, scale, shift.
const CHEAP: [Step; 6] = [
    |t, _, _| t.mul_scalar(1.5),
    |t, _, b| t.add(b),
    |t, _, _| t.relu(),
    |t, x, _| t.mul(x),
    |t, _, _| t.mul_scalar(0.5),
    |t, _, _| t.add_scalar(1.0),
];

/// Six ops, two of them transcendental: scale, bias `[C]`, GELU, product with the input,
/// tanh, shift.
const HEAVY: [Step; 6] = [
    |t, _, _| t.mul_scalar(1.5),
    |t, _, b| t.add(b),
    |t, _, _| t.gelu(),
    |t, x, _| t.mul(x),
    |t, _, _| t.tanh(),
    |t, _, _| t.add_scalar(1.0),
];

/// The chain on `x`, each intermediate dropped once the next op has read it.
fn run(steps: &[Step], x: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let mut t = x.clone();
    for step in steps {
        t = step(&t, x, bias)?;
    }
    Ok(t)
}

fn median_ms(repeats: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<f64> = (0..repeats)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() -> Result<()> {
    let repeats: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(51);
    let (rows, cols) = (4096, 1024);
    let mut gen = Generator::new(0);
    let x = Tensor::randn(&[rows, cols], DType::F32, &mut gen)?;
    let bias = Tensor::randn(&[cols], DType::F32, &mut gen)?;
    println!("chain  elements  eager_ms  compiled_ms  eager/compiled  (median of {repeats})");
    let one = median_ms(repeats, || {
        let _ = x.mul_scalar(1.5);
    });
    println!("one op {:>8}  {one:>8.2}", rows * cols);
    for (name, steps) in [("cheap", &CHEAP), ("heavy", &HEAVY)] {
        let mut compiled = compile(|xs: &[Tensor]| Ok(vec![run(steps, &xs[0], &bias)?]));
        let inputs = [x.clone()];
        compiled.call(&inputs)?;
        let want = run(steps, &x, &bias)?.to_vec::<f32>()?;
        let got = compiled.call(&inputs)?.remove(0).to_vec::<f32>()?;
        let same = want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
        let stats = compiled.replay_stats().unwrap_or_default();
        if !same || stats.fused_groups != 1 {
            return Err(weft_core::Error::Invalid {
                op: "fused_chain",
                msg: format!("{name}: replay differs from eager or did not fuse ({stats:?})"),
            });
        }
        let eager = median_ms(repeats, || {
            let _ = run(steps, &x, &bias);
        });
        let fused = median_ms(repeats, || {
            let _ = compiled.call(&inputs);
        });
        println!(
            "{name:<6} {:>8}  {eager:>8.2}  {fused:>11.2}  {:>14.2}",
            rows * cols,
            eager / fused
        );
    }
    Ok(())
}
