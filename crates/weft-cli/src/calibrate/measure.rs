//! The measuring itself: products, attention, memory-bound kernels and the all-reduce between
//! the ranks, each timed within its budget on the slowest rank.

use std::time::{Duration, Instant};

use weft_core::{DType, Tensor};

use super::sizes::Sizes;

/// An f32 tensor of `shape` filled with values in `[-1, 1)` that differ from element to element
/// (a hash of the index and `seed`): what is timed does not depend on the values, and normal
/// random numbers took half of a calibration's time to draw for the larger shapes.
fn randn(shape: &[usize], seed: u64) -> weft_core::Result<Tensor> {
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n as u64)
        .map(|i| {
            let h = (i ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_mul(0xff51_afd7_ed55_8ccd) >> 40;
            (h as f32) / (1u64 << 23) as f32 - 1.0
        })
        .collect();
    Tensor::from_vec(values, shape)
}

/// The slowest rank's `x` (every rank gets it).
pub(super) fn max_over(pg: Option<&weft_dist::ProcessGroup>, x: f64) -> Result<f64, String> {
    let Some(pg) = pg else { return Ok(x) };
    let t = Tensor::from_vec(vec![x], &[1]).map_err(|e| e.to_string())?;
    pg.all_reduce(&t, weft_dist::ReduceOp::Max)
        .and_then(|w| w.wait())
        .map_err(|e| e.to_string())?;
    Ok(t.to_vec::<f64>().map_err(|e| e.to_string())?[0])
}

/// Mean seconds of a call of `f` on the slowest rank, every rank running the same number of
/// calls (about `budget`, 3 to 200) at the same time.
pub(super) fn timed(
    pg: Option<&weft_dist::ProcessGroup>,
    budget: Duration,
    mut f: impl FnMut() -> weft_core::Result<()>,
) -> Result<f64, String> {
    let t0 = Instant::now();
    f().map_err(|e| e.to_string())?;
    let once = max_over(pg, t0.elapsed().as_secs_f64())?;
    let calls = ((budget.as_secs_f64() / once.max(1e-9)) as usize).clamp(3, 200);
    // the mean over the calls, not the median of each: ranks sharing cores are descheduled
    // for whole time slices, which a call's median would leave out
    let t = Instant::now();
    for _ in 0..calls {
        f().map_err(|e| e.to_string())?;
    }
    max_over(pg, t.elapsed().as_secs_f64() / calls as f64)
}

/// FLOP/s of a small product (`256 x 256` by `256 x 256`, faster than none of the larger ones)
/// and bytes/s of a sum of `2^22` elements (48 MB moved: more than a CPU's caches hold), on this
/// rank alone: what [`Sizes`] cuts each call to (some 20 ms in all).
pub(super) fn probe() -> Result<(f64, f64), String> {
    let e = |r: weft_core::Result<Tensor>| r.map_err(|e| e.to_string());
    let (a, b) = (e(randn(&[256, 256], 40))?, e(randn(&[256, 256], 41))?);
    let (x, y) = (e(randn(&[1 << 22], 42))?, e(randn(&[1 << 22], 43))?);
    e(a.matmul(&b))?;
    let t = Instant::now();
    for _ in 0..4 {
        e(a.matmul(&b))?;
    }
    let flops = 4.0 * 2.0 * 256f64.powi(3) / t.elapsed().as_secs_f64().max(1e-9);
    e(x.add(&y))?;
    let t = Instant::now();
    for _ in 0..2 {
        e(x.add(&y))?;
    }
    let bytes = 2.0 * 3.0 * 4.0 * (1u64 << 22) as f64 / t.elapsed().as_secs_f64().max(1e-9);
    Ok((flops, bytes))
}

/// FLOP/s of a block's and the output layer's products (forward `x w`, backward `dy w^T` and
/// `x^T dy`) at `dtype`; `None` when this machine does not compute in it.
pub(super) fn gemm_rate(
    pg: Option<&weft_dist::ProcessGroup>,
    s: &Sizes,
    dtype: DType,
    budget: Duration,
) -> Result<Option<f64>, String> {
    let mut cases = Vec::new();
    let mut flops = 0.0;
    for (i, &(m, k, n)) in s.products.iter().enumerate() {
        let made = (|| -> weft_core::Result<(Tensor, Tensor, Tensor)> {
            let x = randn(&[m, k], i as u64)?.cast(dtype)?;
            let w = randn(&[k, n], 10 + i as u64)?.cast(dtype)?;
            let dy = randn(&[m, n], 20 + i as u64)?.cast(dtype)?;
            // a product in this dtype at all?
            x.matmul(&w)?;
            Ok((x, w, dy))
        })();
        match made {
            Ok(t) => cases.push(t),
            Err(_) if dtype != DType::F32 => return Ok(None),
            Err(e) => return Err(e.to_string()),
        }
        flops += 3.0 * 2.0 * (m * k * n) as f64;
    }
    let seconds = timed(pg, budget, || {
        for (x, w, dy) in &cases {
            x.matmul(w)?;
            dy.matmul(&w.t()?)?;
            x.t()?.matmul(dy)?;
        }
        Ok(())
    })?;
    Ok(Some(flops / seconds))
}

/// FLOP/s of causal attention's forward and backward, counted as the planner counts them
/// (`12 T C` per token: `4 T C` forward, twice that backward, the mask's savings not counted).
pub(super) fn attention_rate(pg: Option<&weft_dist::ProcessGroup>, s: &Sizes, budget: Duration) -> Result<f64, String> {
    let (b, h, t, d) = s.attention;
    let make = |seed| randn(&[b, h, t, d], seed).and_then(|x| x.requires_grad_());
    let (q, k, v) = (make(1), make(2), make(3));
    let (q, k, v) = (
        q.map_err(|e| e.to_string())?,
        k.map_err(|e| e.to_string())?,
        v.map_err(|e| e.to_string())?,
    );
    let dout = randn(&[b, h, t, d], 4).map_err(|e| e.to_string())?;
    let seconds = timed(pg, budget, || {
        let o = Tensor::scaled_dot_product_attention(&q, &k, &v, true, None)?;
        o.backward_with(&dout)?;
        for p in [&q, &k, &v] {
            p.set_grad(None);
        }
        Ok(())
    })?;
    Ok(12.0 * (b * t * t * h * d) as f64 / seconds)
}

/// Bytes/s of the memory-bound kernels: layer norm and the residual addition over the width,
/// GELU over the MLP's width (each read and written once).
pub(super) fn memory_rate(pg: Option<&weft_dist::ProcessGroup>, s: &Sizes, budget: Duration) -> Result<f64, String> {
    let e = |r: weft_core::Result<Tensor>| r.map_err(|e| e.to_string());
    let (tokens, embd, inter) = s.kernels;
    let x = e(randn(&[tokens, embd], 5))?;
    let y = e(randn(&[tokens, embd], 6))?;
    let h = e(randn(&[tokens, inter], 7))?;
    let (w, b) = (e(randn(&[embd], 8))?, e(randn(&[embd], 9))?);
    let bytes = 4.0 * (2 * tokens * embd + 3 * tokens * embd + 2 * tokens * inter) as f64;
    let seconds = timed(pg, budget, || {
        x.layer_norm(Some(&w), Some(&b), 1e-5)?;
        x.add(&y)?;
        h.gelu()?;
        Ok(())
    })?;
    Ok(bytes / seconds)
}

/// Seconds a step of a small ring all-reduce between two ranks costs when every rank computes
/// between its calls, as a job's ranks do on shared cores; on rank 0, `None` for fewer than 3
/// ranks (one pair: the link measured on its own).
///
/// Every rank runs calls of the block's `C x C` product, and ranks `2i` and `2i + 1` all-reduce
/// 1024 numbers after each (a last odd rank computes only): a pair's member that is descheduled
/// for a time slice keeps its partner waiting, which a link measured on its own never shows.
/// The same loop without the all-reduces, on every rank at once, is the baseline: the extra
/// time per call, over a ring's `2 (n - 1)` = 2 steps, is the latency: the mean of two rounds
/// of both loops.
pub(super) fn loaded_latency(
    pg: Option<&weft_dist::ProcessGroup>,
    rank: usize,
    sizes: &Sizes,
    budget: Duration,
) -> Result<Option<f64>, String> {
    let Some(g) = pg else { return Ok(None) };
    let ranks = g.size();
    if ranks < 3 {
        return Ok(None);
    }
    let e = |r: weft_core::Result<Tensor>| r.map_err(|e| e.to_string());
    // every rank creates every pair's group, in the same order
    let mut mine = None;
    for first in (0..ranks - 1).step_by(2) {
        if let Some(sub) = g.new_group(&[first, first + 1]).map_err(|e| e.to_string())? {
            mine = Some(sub);
        }
    }
    let (m, k, n) = sizes.products[1];
    let x = e(randn(&[m, k], 31))?;
    let w = e(randn(&[k, n], 32))?;
    let t = e(randn(&[1024], 30))?;
    let call = |sync: bool| -> Result<(), String> {
        e(x.matmul(&w))?;
        match (&mine, sync) {
            (Some(sub), true) => sub
                .all_reduce(&t, weft_dist::ReduceOp::Sum)
                .and_then(|w| w.wait())
                .map_err(|e| e.to_string()),
            _ => Ok(()),
        }
    };
    // calls that fill about a quarter of the budget (at least 5) at the slowest rank's pace
    let t0 = Instant::now();
    for _ in 0..5 {
        call(true)?;
    }
    let per_call = max_over(pg, t0.elapsed().as_secs_f64() / 5.0)?;
    let calls = (budget.as_secs_f64() / 4.0 / per_call.max(1e-9)).clamp(5.0, 5000.0) as usize;
    let mut readings = Vec::new();
    for _ in 0..2 {
        let mut round = [0.0; 2];
        for (i, sync) in [false, true].into_iter().enumerate() {
            max_over(pg, 0.0)?;
            let t0 = Instant::now();
            for _ in 0..calls {
                call(sync)?;
            }
            round[i] = t0.elapsed().as_secs_f64() / calls as f64;
        }
        readings.push(((round[1] - round[0]) / 2.0).max(0.0));
    }
    max_over(pg, 0.0)?;
    Ok((rank == 0).then(|| readings.iter().sum::<f64>() / readings.len() as f64))
}

/// `(latency s, bandwidth bytes/s)` of the ring all-reduce between the job's ranks.
pub(super) fn collective_link(pg: &weft_dist::ProcessGroup, budget: Duration) -> Result<(f64, f64), String> {
    let sizes = [4096usize, 4 << 20];
    let rows = weft_dist::bench::run(pg, &["all_reduce"], &sizes, budget).map_err(|e| e.to_string())?;
    let n = pg.size() as f64;
    let share = 2.0 * (n - 1.0) / n;
    let (s1, t1) = (rows[0].bytes as f64, rows[0].median_us * 1e-6);
    let (s2, t2) = (rows[1].bytes as f64, rows[1].median_us * 1e-6);
    let slope = (t2 - t1) / (s2 - s1);
    let bandwidth = if slope > 0.0 { share / slope } else { share * s2 / t2 };
    let latency = ((t1 - share * s1 / bandwidth) / (2.0 * (n - 1.0))).max(0.0);
    Ok((latency, bandwidth))
}
