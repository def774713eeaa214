//! `weft plan calibrate`: measures this machine for the planner's `local` device spec and
//! keeps it in weft's cache folder (`weft_train::plan_shape::calibration_path`).
//!
//! The command starts `--nproc` ranks on this machine (over weft's own transport, as `weft
//! launch` would) and each measures, at the same time as the others so that they share the
//! cores as a job's ranks do, at the model's shapes:
//!
//! - the matrix products of a block and of the output layer, forward and backward (the
//!   `f32` rate, and the `bf16` one where this CPU computes in bf16; else the f32 rate);
//! - attention's forward and backward, as a fraction of the products' rate;
//! - the memory-bound kernels (layer norm, GELU, residual addition), bytes/s;
//! - the model's own passes (one block and two, at one row, half a rank's share of the batch
//!   and all of it), fitted to the planner's analytic time for what a pass costs beyond it
//!   ([`weft_plan::PassCost`], `passes`);
//! - the ring all-reduce between the ranks at 4 KiB and 4 MiB, fitted to `2 (n-1) a + 2 (n-1)/n
//!   x bytes / B` for its latency `a` and bandwidth `B` (weft_dist::bench); where the ranks
//!   share cores, among as many of them as compute at once (at least 2), the others waiting,
//!   so that the link is measured unshared (the planner shares the cores among transfers
//!   itself).
//!
//! The shapes are the model's cut to a memory and a time budget ([`Sizes`]): each f32 tensor at
//! most 64 MB (a 48th of a rank's share of the memory, if less), each timed call at most an
//! eighth of the budget at the rates of a small product and sum; one line says what was cut
//! (GPT-2's output layer at full shape is 13.2 GB a tensor).
//!
//! The rates are those of one rank computing alone; the products are then measured on every
//! rank at once, and where that is slower (ranks sharing cores) the spec's `shared_compute` is
//! the ranks that compute at the full rate together (`ranks x together / alone`).
//!
//! The spec: `devices_per_node` = the ranks, `memory_bytes` = this machine's available memory
//! divided by them, every efficiency 1.0 (attention's the measured fraction), the measured
//! rates as the peaks. Every measurement has a budget (`--budget-ms`), so the whole takes
//! seconds.

mod passes;

use std::time::{Duration, Instant};

use weft_core::{DType, Tensor};
use weft_plan::calibration::Calibration;
use weft_plan::{DeviceSpec, Efficiency, PassCost};
use weft_train::plan_shape;

use crate::train::ConfigArgs;

#[derive(clap::Args)]
pub struct CalibrateArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Ranks to measure together: the ranks a job on this machine will have, 1 to 64 [default:
    /// the cores there are, at most 64].
    #[arg(long, value_name = "N")]
    nproc: Option<usize>,
    /// Measuring time per rate, in milliseconds (at most 2000).
    #[arg(long, value_name = "MS", default_value_t = 200)]
    budget_ms: u64,
    /// One rank of the measuring job, with the shapes to measure at (set by the command itself).
    #[arg(long, hide = true, value_name = "SHAPES")]
    worker: Option<String>,
}

/// The shapes measured: tokens of a micro-batch, sequence, width, heads, MLP width, vocabulary.
#[derive(Clone, Copy, Debug)]
struct Shapes {
    tokens: usize,
    seq: usize,
    embd: usize,
    heads: usize,
    inter: usize,
    vocab: usize,
}

impl Shapes {
    fn encode(&self) -> String {
        let s = self;
        format!("{},{},{},{},{},{}", s.tokens, s.seq, s.embd, s.heads, s.inter, s.vocab)
    }

    fn decode(text: &str) -> Result<Shapes, String> {
        let v: Vec<usize> = text
            .split(',')
            .map(|x| x.trim().parse::<usize>())
            .collect::<Result<_, _>>()
            .map_err(|_| format!("--worker {text:?}: not six whole numbers"))?;
        match v[..] {
            [tokens, seq, embd, heads, inter, vocab]
                if v.iter().all(|&x| (1..=1 << 20).contains(&x)) && embd % heads == 0 && tokens % seq == 0 =>
            {
                Ok(Shapes {
                    tokens,
                    seq,
                    embd,
                    heads,
                    inter,
                    vocab,
                })
            }
            _ => Err(format!("--worker {text:?}: not the shapes of a model")),
        }
    }
}

/// The most bytes one tensor measured has (f32), and at most a 48th of a rank's share of this
/// machine's available memory: the products, attention and kernels are measured at the model's
/// shapes cut to it (a rate in FLOP/s or bytes/s hardly depends on the size once it is this
/// large). GPT-2's output layer at 64 rows of 1024 tokens is 13.2 GB a tensor.
const MAX_TENSOR_BYTES: f64 = (64 << 20) as f64;
/// The fewest tokens (rows of a product) and the narrowest width a cut keeps.
const MIN_TOKENS: usize = 64;
const MIN_WIDTH: usize = 256;

/// What is measured: the model's shapes cut so that every tensor stays within a memory budget
/// and every call within a time budget ([`Sizes::of`]).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Sizes {
    /// `(tokens, k, n)` of each product: a block's four (`C x 3C`, `C x C`, `C x I`, `I x C`)
    /// and the output layer's (`C x V`).
    products: [(usize, usize, usize); 5],
    /// Attention's rows, heads, sequence and head size.
    attention: (usize, usize, usize, usize),
    /// Tokens, width and MLP width of the memory-bound kernels.
    kernels: (usize, usize, usize),
}

/// Halves `x` (rounding up) down to `floor` (or to what it is, if less).
fn halve(x: &mut usize, floor: usize) -> bool {
    let next = x.div_ceil(2).max(floor.min(*x));
    let changed = next < *x;
    *x = next;
    changed
}

impl Sizes {
    /// The model's shapes `s` with every f32 tensor at most `tensor_bytes`, each product call
    /// (forward and both backward products of the five) at most `call_flops` and attention's
    /// (forward and backward) at most half of it, and each kernel call at most `call_bytes`
    /// moved: tokens are cut first, then the widest dimensions (not below [`MIN_TOKENS`] and
    /// [`MIN_WIDTH`], or what the model has).
    fn of(s: Shapes, tensor_bytes: f64, call_flops: f64, call_bytes: f64) -> Sizes {
        let (c, i, v) = (s.embd, s.inter, s.vocab);
        let mut products = [
            (s.tokens, c, 3 * c),
            (s.tokens, c, c),
            (s.tokens, c, i),
            (s.tokens, i, c),
            (s.tokens, c, v),
        ];
        for (m, k, n) in products.iter_mut() {
            // the weight within the budget (its widest side first), then the tokens
            while 4.0 * (*k * *n) as f64 > tensor_bytes {
                let widest = if *n >= *k { &mut *n } else { &mut *k };
                if !halve(widest, MIN_WIDTH) {
                    break;
                }
            }
            let most = (tensor_bytes / (4.0 * (*k).max(*n) as f64)) as usize;
            *m = (*m).min(most.max(1));
        }
        let flops = |p: &[(usize, usize, usize); 5]| p.iter().map(|&(m, k, n)| 6.0 * (m * k * n) as f64).sum::<f64>();
        while flops(&products) > call_flops {
            // fewer tokens for every product, else the widest dimension of all narrower
            let mut cut = false;
            for (m, _, _) in products.iter_mut() {
                cut |= halve(m, MIN_TOKENS);
            }
            if !cut {
                let widest = products
                    .iter_mut()
                    .flat_map(|(_, k, n)| [k, n])
                    .max_by_key(|d| **d)
                    .filter(|d| **d > MIN_WIDTH);
                match widest {
                    Some(d) => {
                        halve(d, MIN_WIDTH);
                    }
                    None => break,
                }
            }
        }
        // attention: q, k, v and their gradients `[rows, heads, seq, head size]`
        let head = c / s.heads.max(1);
        let (mut rows, mut heads, mut seq) = (s.tokens / s.seq, s.heads, s.seq);
        let cost = |rows: usize, heads: usize, seq: usize| {
            let bytes = 4.0 * (rows * heads * seq * head) as f64;
            let flops = 12.0 * (rows * seq * seq * heads * head) as f64;
            bytes > tensor_bytes || flops > call_flops / 2.0
        };
        while cost(rows, heads, seq) {
            if !(halve(&mut rows, 1) || halve(&mut heads, 1) || halve(&mut seq, MIN_TOKENS)) {
                break;
            }
        }
        // the kernels: `[tokens, C]` and `[tokens, I]`, read and written
        let mut tokens = s.tokens;
        while (4.0 * (tokens * c.max(i)) as f64 > tensor_bytes || 4.0 * (tokens * (5 * c + 2 * i)) as f64 > call_bytes)
            && halve(&mut tokens, MIN_TOKENS)
        {}
        Sizes {
            products,
            attention: (rows, heads, seq, head),
            kernels: (tokens, c, i),
        }
    }

    /// One line saying what was measured smaller than the model's shapes, if anything was.
    fn cut(&self, s: &Shapes) -> Option<String> {
        let whole = Sizes::of(*s, f64::INFINITY, f64::INFINITY, f64::INFINITY);
        if *self == whole {
            return None;
        }
        let names = ["C x 3C", "C x C", "C x I", "I x C", "output layer C x V"];
        let mut parts = Vec::new();
        for ((name, &(m, k, n)), &(m0, k0, n0)) in names.iter().zip(&self.products).zip(&whole.products) {
            if (m, k, n) != (m0, k0, n0) {
                parts.push(format!("{name} at {m} x {k} x {n} (of {m0} x {k0} x {n0})"));
            }
        }
        if self.attention != whole.attention {
            let (r, h, t, _) = self.attention;
            let (r0, h0, t0, _) = whole.attention;
            parts.push(format!(
                "attention at {r} rows x {h} heads x {t} tokens (of {r0} x {h0} x {t0})"
            ));
        }
        if self.kernels != whole.kernels {
            parts.push(format!(
                "the memory-bound kernels at {} tokens (of {})",
                self.kernels.0, whole.kernels.0
            ));
        }
        Some(parts.join(", "))
    }
}

pub fn run(args: &CalibrateArgs) -> Result<(), String> {
    if args.budget_ms == 0 || args.budget_ms > 2000 {
        return Err(format!("--budget-ms {}: must be 1 to 2000", args.budget_ms));
    }
    if let Some(shapes) = &args.worker {
        return worker(&args.config, Shapes::decode(shapes)?, args.budget_ms);
    }
    if weft_dist::env::from_env().map_err(|e| e.to_string())?.is_some() {
        return Err(
            "weft plan calibrate starts its own ranks (--nproc N): run it outside weft launch, Slurm or mpirun".into(),
        );
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let most = weft_plan::calibration::MAX_RANKS;
    let nproc = args.nproc.unwrap_or(cores.min(most));
    if !(1..=most).contains(&nproc) {
        return Err(format!("--nproc {nproc}: {}", weft_plan::calibration::ranks_advice()));
    }
    let config = args.config.load()?;
    let work = plan_shape::workload(&config, None)?;
    let m = &work.model;
    let rows = (work.global_batch as usize / nproc).clamp(1, 64);
    let shapes = Shapes {
        tokens: rows * m.seq_len as usize,
        seq: m.seq_len as usize,
        embd: m.n_embd as usize,
        heads: m.n_head as usize,
        inter: m.intermediate as usize,
        vocab: m.vocab as usize,
    };
    Shapes::decode(&shapes.encode())?;
    let path = plan_shape::calibration_path();
    if let Err(e) = plan_shape::read_calibration(&path) {
        weft_core::errln!("weft: warning: ignoring the calibration file ({e}); measuring again");
    }
    weft_core::errln!(
        "weft: measuring this machine with {nproc} ranks at {} tokens x width {} (up to {} ms per rate)",
        shapes.tokens,
        shapes.embd,
        args.budget_ms
    );
    let exe = std::env::current_exe().map_err(|e| format!("the weft executable: {e}"))?;
    let mut worker_args = vec![
        "plan".to_string(),
        "calibrate".to_string(),
        "--budget-ms".to_string(),
        args.budget_ms.to_string(),
        "--worker".to_string(),
        shapes.encode(),
    ];
    // the ranks build the model's own passes from the same config
    worker_args.extend(args.config.to_args()?);
    let cfg = weft_dist::launch::LaunchConfig::new(nproc, exe, worker_args);
    match weft_dist::launch::run(&cfg).map_err(|e| e.to_string())? {
        0 => {}
        code => return Err(format!("the measuring ranks failed (exit status {code})")),
    }
    let c = plan_shape::read_calibration(&path)?
        .ok_or_else(|| format!("the measuring ranks wrote no calibration at {}", path.display()))?;
    crate::print_out(&summary(&c, &path))
}

fn summary(c: &Calibration, path: &std::path::Path) -> String {
    let s = &c.spec;
    format!(
        "local: {} ranks ({}), measured in {:.1} s, written to {}\n  gemm f32 {:.2} GFLOP/s, bf16 {:.2} GFLOP/s, \
         attention {:.2} of gemm, memory-bound {:.2} GB/s, all-reduce latency {:.1} us and bandwidth {:.2} GB/s, \
         memory {:.2} GB per rank, ranks computing at once {}\n  model passes {:.2}x their analytic time, \
         plus {:.3} ms a block and {:.3} ms the embeddings and output layer per micro-batch\n",
        c.ranks,
        c.machine,
        c.measure_seconds,
        path.display(),
        s.flops_f32 / 1e9,
        s.flops_bf16 / 1e9,
        s.efficiency.attention,
        s.memory_bandwidth / 1e9,
        s.intra_latency * 1e6,
        s.intra_bandwidth / 1e9,
        s.memory_bytes / 1e9,
        s.shared_compute
            .map_or(format!("{} (own compute)", c.ranks), |k| format!("{k:.2}")),
        s.pass_cost.time_scale,
        s.pass_cost.block * 1e3,
        s.pass_cost.ends * 1e3,
    )
}

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
fn max_over(pg: Option<&weft_dist::ProcessGroup>, x: f64) -> Result<f64, String> {
    let Some(pg) = pg else { return Ok(x) };
    let t = Tensor::from_vec(vec![x], &[1]).map_err(|e| e.to_string())?;
    pg.all_reduce(&t, weft_dist::ReduceOp::Max)
        .and_then(|w| w.wait())
        .map_err(|e| e.to_string())?;
    Ok(t.to_vec::<f64>().map_err(|e| e.to_string())?[0])
}

/// Mean seconds of a call of `f` on the slowest rank, every rank running the same number of
/// calls (about `budget`, 3 to 200) at the same time.
fn timed(
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
fn probe() -> Result<(f64, f64), String> {
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
fn gemm_rate(
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
fn attention_rate(pg: Option<&weft_dist::ProcessGroup>, s: &Sizes, budget: Duration) -> Result<f64, String> {
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
fn memory_rate(pg: Option<&weft_dist::ProcessGroup>, s: &Sizes, budget: Duration) -> Result<f64, String> {
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

/// Seconds a step of a small ring all-reduce among `members` takes while the other ranks
/// compute (products at the model's shapes), on rank 0; `None` where every rank is a member.
fn loaded_latency(
    pg: Option<&weft_dist::ProcessGroup>,
    members: &[usize],
    rank: usize,
    sizes: &Sizes,
    budget: Duration,
) -> Result<Option<f64>, String> {
    let Some(g) = pg else { return Ok(None) };
    let sub = g.new_group(members).map_err(|e| e.to_string())?;
    if members.len() == g.size() {
        return Ok(None);
    }
    let e = |r: weft_core::Result<Tensor>| r.map_err(|e| e.to_string());
    max_over(pg, 0.0)?;
    let start = Instant::now();
    let mut result = None;
    match &sub {
        Some(sub) => {
            let t = e(randn(&[1024], 30))?;
            let call = || {
                sub.all_reduce(&t, weft_dist::ReduceOp::Sum)
                    .and_then(|w| w.wait())
                    .map_err(|e| e.to_string())
            };
            // 10 calls, then as many as half the budget holds by the slowest member's count
            for _ in 0..10 {
                call()?;
            }
            let first = max_over(Some(sub), start.elapsed().as_secs_f64() / 10.0)?;
            let calls = ((budget.as_secs_f64() / 2.0 / first.max(1e-9)) as usize).clamp(10, 10_000);
            let t0 = Instant::now();
            for _ in 0..calls {
                call()?;
            }
            let per_call = t0.elapsed().as_secs_f64() / calls as f64;
            let n = members.len() as f64;
            if rank == 0 {
                result = Some(per_call / (2.0 * (n - 1.0)));
            }
        }
        None => {
            // the block's `C x C` product, as measured
            let (m, k, n) = sizes.products[1];
            let x = e(randn(&[m, k], 31))?;
            let w = e(randn(&[k, n], 32))?;
            while start.elapsed() < budget {
                e(x.matmul(&w))?;
            }
        }
    }
    max_over(pg, 0.0)?;
    Ok(result)
}

/// `(latency s, bandwidth bytes/s)` of the ring all-reduce between the job's ranks.
fn collective_link(pg: &weft_dist::ProcessGroup, budget: Duration) -> Result<(f64, f64), String> {
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

/// How many of `ranks` compute at the full rate at once, from the rate of all at once over one
/// alone (`ratio`, per rank), where that is clearly fewer than the ranks (they share cores);
/// `None` where each has its own.
fn shared_compute(ranks: usize, ratio: f64) -> Option<f64> {
    let n = ranks as f64;
    let k = (n * ratio).clamp(1.0, n);
    (k < n - 0.5).then_some(k)
}

/// The spec of one rank computing alone at the measured rates (FLOP/s, bytes/s), every
/// efficiency 1.0 but attention's, its links and memory still to be measured.
fn spec_of(f32_rate: f64, bf16_rate: Option<f64>, attention: f64, memory: f64) -> DeviceSpec {
    DeviceSpec {
        name: "local".into(),
        devices_per_node: 1,
        flops_bf16: bf16_rate.unwrap_or(f32_rate),
        flops_f32: f32_rate,
        memory_bytes: 1.0,
        memory_bandwidth: memory,
        intra_bandwidth: memory,
        intra_latency: 0.0,
        inter_bandwidth: memory,
        inter_latency: 0.0,
        shared_compute: None,
        // measured on CPU ranks
        gpu: false,
        efficiency: Efficiency {
            gemm: 1.0,
            memory_bound: 1.0,
            collective: 1.0,
            attention: (attention / f32_rate).clamp(1e-3, 16.0),
            memory_margin: Efficiency::default().memory_margin,
        },
        pass_cost: PassCost::default(),
    }
}

fn worker(config: &ConfigArgs, shapes: Shapes, budget_ms: u64) -> Result<(), String> {
    let config = config.load()?;
    let start = Instant::now();
    let budget = Duration::from_millis(budget_ms);
    let env = weft_dist::env::from_env()
        .map_err(|e| e.to_string())?
        .ok_or("--worker runs under the ranks weft plan calibrate starts")?;
    let group = match env.world_size {
        1 => None,
        _ => Some(weft_dist::init().map_err(|e| e.to_string())?),
    };
    let pg = group.as_ref();
    // the shapes measured: the model's, cut to a share of this machine's memory and to calls of
    // an eighth of the budget at the rates a small product and a small sum run at on rank 0
    // (larger ones run faster), which every rank then knows
    let (mut limit, mut call_flops, mut call_bytes) = (0.0, 0.0, 0.0);
    if env.rank == 0 {
        let available = weft_core::memory::available().map_or(f64::INFINITY, |a| a.bytes as f64);
        limit = MAX_TENSOR_BYTES.min(available / env.world_size as f64 / 48.0).max(1e6);
        let (flops, bytes) = probe()?;
        call_flops = flops * budget.as_secs_f64() / 8.0;
        call_bytes = bytes * budget.as_secs_f64() / 8.0;
    }
    let sizes = Sizes::of(
        shapes,
        max_over(pg, limit)?,
        max_over(pg, call_flops)?,
        max_over(pg, call_bytes)?,
    );
    if env.rank == 0 {
        if let Some(cut) = sizes.cut(&shapes) {
            weft_core::errln!(
                "weft: note: measuring at smaller shapes than the model's (each tensor at most {:.0} MB, each call \
                 within an eighth of --budget-ms): {cut}",
                limit / 1e6
            );
        }
    }
    // the rates of one rank computing alone (the others wait), then of every rank at once:
    // their ratio is how many ranks compute at the full rate together
    let alone = if env.rank == 0 {
        Some((
            gemm_rate(None, &sizes, DType::F32, budget)?.unwrap_or(1.0),
            gemm_rate(None, &sizes, DType::BF16, budget)?,
            attention_rate(None, &sizes, budget)?,
            memory_rate(None, &sizes, budget)?,
        ))
    } else {
        None
    };
    // the model's own passes, on rank 0 alone as the rates above
    let pass_fit = alone.map(|a| {
        passes::pass_cost(
            &config,
            &spec_of(a.0, a.1, a.2, a.3),
            (shapes.tokens / shapes.seq, env.world_size),
            budget,
        )
        .unwrap_or_else(|e| {
            // a model too large to measure here still gets the rates above
            weft_core::errln!("weft: warning: the model's passes were not measured ({e}); planning without their cost");
            (PassCost::default(), Vec::new())
        })
    });
    max_over(pg, 0.0)?;
    // three turns of alone and together (this machine may be shared with other work): the
    // median of the three ratios
    let mut ratios = Vec::new();
    for turn in 0..3 {
        let single = match (turn, &alone) {
            (0, Some(a)) => Some(a.0),
            (_, Some(_)) => gemm_rate(None, &sizes, DType::F32, budget / 2)?,
            (_, None) => None,
        };
        max_over(pg, 0.0)?;
        let together = gemm_rate(pg, &sizes, DType::F32, budget / 2)?.unwrap_or(1.0);
        if let Some(single) = single {
            ratios.push(together / single);
        }
    }
    ratios.sort_by(f64::total_cmp);
    // rank 0's reading of how many ranks compute at once, where they share cores
    let shared = ratios.get(1).and_then(|&r| shared_compute(env.world_size, r));
    // the link between ranks that each have a core: on shared cores, as many ranks as compute at
    // once (at least 2; the others wait), since the planner shares the cores among the
    // transfers itself; rank 0 knows how many
    let ((unloaded_latency, bandwidth), link_ranks, loaded_latency) = match pg {
        Some(g) => {
            let mine = match (env.rank, shared) {
                (0, Some(k)) => (k.floor() as usize).clamp(2, env.world_size),
                (0, None) => env.world_size,
                _ => 0,
            };
            let n = max_over(pg, mine as f64)? as usize;
            let members: Vec<usize> = (0..n.clamp(2, env.world_size)).collect();
            // twice, the better latency and bandwidth kept: two ranks that the scheduler puts
            // on one core at first measure that core, not the link (where fewer than 2 ranks
            // compute at once, the two measuring share one anyway)
            let link = match g.new_group(&members).map_err(|e| e.to_string())? {
                Some(sub) => {
                    let (a, b) = (collective_link(&sub, budget / 2)?, collective_link(&sub, budget / 2)?);
                    (a.0.min(b.0), a.1.max(b.1))
                }
                None => (0.0, 0.0),
            };
            max_over(pg, 0.0)?;
            let loaded = loaded_latency(pg, &members, env.rank, &sizes, budget)?;
            (link, members.len(), loaded)
        }
        None => ((0.0, alone.map_or(1e9, |a| a.3)), 1, None),
    };
    let Some((f32_rate, bf16_rate, attention, memory)) = alone else {
        return Ok(());
    };
    let ranks = env.world_size;
    let together = ratios[1] * f32_rate;
    let (pass_cost, pass_times) = pass_fit.ok_or("rank 0 measured no model passes")?;
    // on shared cores a message waits for its receiver to get a core: the latency measured
    // while the other ranks compute
    let latency = match loaded_latency {
        Some(l) if shared.is_some() => l.max(unloaded_latency),
        _ => unloaded_latency,
    };
    let available = weft_core::memory::available()
        .ok_or("this machine does not say how much memory it has available (/proc/meminfo)")?;
    let mut measured = vec![
        ("gemm_f32_flops".to_string(), f32_rate),
        ("gemm_f32_all_ranks_flops".to_string(), together),
        ("attention_f32_flops".to_string(), attention),
        ("memory_bound_bytes_per_s".to_string(), memory),
        ("all_reduce_latency_s".to_string(), latency),
        ("all_reduce_bandwidth_bytes_per_s".to_string(), bandwidth),
        ("all_reduce_ranks".to_string(), link_ranks as f64),
        ("all_reduce_unloaded_latency_s".to_string(), unloaded_latency),
        ("available_memory_bytes".to_string(), available.bytes as f64),
        ("tokens".to_string(), shapes.tokens as f64),
        // the shapes the rates were measured at ([`Sizes`]): the block's `C x C` product's
        // tokens and the output layer's columns
        ("measured_product_tokens".to_string(), sizes.products[1].0 as f64),
        ("measured_output_columns".to_string(), sizes.products[4].2 as f64),
    ];
    if let Some(r) = bf16_rate {
        measured.push(("gemm_bf16_flops".to_string(), r));
    }
    if let Some(l) = loaded_latency {
        measured.push(("all_reduce_loaded_latency_s".to_string(), l));
    }
    measured.extend(pass_times);
    let spec = DeviceSpec {
        devices_per_node: ranks,
        memory_bytes: available.bytes as f64 / ranks as f64,
        intra_bandwidth: bandwidth,
        intra_latency: latency,
        inter_bandwidth: bandwidth,
        inter_latency: latency,
        shared_compute: shared,
        pass_cost,
        ..spec_of(f32_rate, bf16_rate, attention, memory)
    };
    let c = Calibration {
        spec,
        ranks,
        machine: weft_core::tune::machine(),
        measure_seconds: start.elapsed().as_secs_f64(),
        measured,
    };
    // kept for this number of ranks, and as the latest
    let text = c.to_toml();
    for path in [plan_shape::calibration_path_for(ranks), plan_shape::calibration_path()] {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, &text).map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        };
        let z = Sizes::of(tiny, MAX_TENSOR_BYTES, 1e12, 1e12);
        assert_eq!(z.cut(&tiny), None);
        assert_eq!(z.products[4], (256, 64, 512));
        assert_eq!(z.attention, (4, 4, 64, 16));
    }
}
