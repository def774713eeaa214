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

use weft_core::{DType, Generator, Tensor};
use weft_plan::calibration::Calibration;
use weft_plan::{DeviceSpec, Efficiency, PassCost};
use weft_train::plan_shape;

use crate::train::ConfigArgs;

#[derive(clap::Args)]
pub struct CalibrateArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Ranks to measure together: the ranks a job on this machine will have [default: the
    /// cores there are].
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
    let nproc = args.nproc.unwrap_or(cores);
    if !(1..=64).contains(&nproc) {
        return Err(format!("--nproc {nproc}: must be 1 to 64"));
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

fn randn(shape: &[usize], seed: u64) -> weft_core::Result<Tensor> {
    Tensor::randn(shape, DType::F32, &mut Generator::new(seed))
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

/// FLOP/s of a block's and the output layer's products (forward `x w`, backward `dy w^T` and
/// `x^T dy`) at `dtype`; `None` when this machine does not compute in it.
fn gemm_rate(
    pg: Option<&weft_dist::ProcessGroup>,
    s: Shapes,
    dtype: DType,
    budget: Duration,
) -> Result<Option<f64>, String> {
    let (m, c) = (s.tokens, s.embd);
    let dims = [(c, 3 * c), (c, c), (c, s.inter), (s.inter, c), (c, s.vocab)];
    let mut cases = Vec::new();
    let mut flops = 0.0;
    for (i, &(k, n)) in dims.iter().enumerate() {
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
fn attention_rate(pg: Option<&weft_dist::ProcessGroup>, s: Shapes, budget: Duration) -> Result<f64, String> {
    let (b, h, t, d) = (s.tokens / s.seq, s.heads, s.seq, s.embd / s.heads);
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
    Ok(12.0 * (b * t * t * s.embd) as f64 / seconds)
}

/// Bytes/s of the memory-bound kernels: layer norm and the residual addition over the width,
/// GELU over the MLP's width (each read and written once).
fn memory_rate(pg: Option<&weft_dist::ProcessGroup>, s: Shapes, budget: Duration) -> Result<f64, String> {
    let e = |r: weft_core::Result<Tensor>| r.map_err(|e| e.to_string());
    let x = e(randn(&[s.tokens, s.embd], 5))?;
    let y = e(randn(&[s.tokens, s.embd], 6))?;
    let h = e(randn(&[s.tokens, s.inter], 7))?;
    let (w, b) = (e(randn(&[s.embd], 8))?, e(randn(&[s.embd], 9))?);
    let bytes = 4.0 * (2 * s.tokens * s.embd + 3 * s.tokens * s.embd + 2 * s.tokens * s.inter) as f64;
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
    shapes: Shapes,
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
            let x = e(randn(&[shapes.tokens, shapes.embd], 31))?;
            let w = e(randn(&[shapes.embd, shapes.embd], 32))?;
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
    // the rates of one rank computing alone (the others wait), then of every rank at once:
    // their ratio is how many ranks compute at the full rate together
    let alone = if env.rank == 0 {
        Some((
            gemm_rate(None, shapes, DType::F32, budget)?.unwrap_or(1.0),
            gemm_rate(None, shapes, DType::BF16, budget)?,
            attention_rate(None, shapes, budget)?,
            memory_rate(None, shapes, budget)?,
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
            (_, Some(_)) => gemm_rate(None, shapes, DType::F32, budget / 2)?,
            (_, None) => None,
        };
        max_over(pg, 0.0)?;
        let together = gemm_rate(pg, shapes, DType::F32, budget / 2)?.unwrap_or(1.0);
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
            let loaded = loaded_latency(pg, &members, env.rank, shapes, budget)?;
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
