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
//! - the model's own passes (one block and two, from one row to the whole batch), fitted to
//!   the planner's analytic time for what a pass costs beyond it ([`weft_plan::PassCost`],
//!   `passes`);
//! - the ring all-reduce between the ranks at 4 KiB and 4 MiB, fitted to `2 (n-1) a + 2 (n-1)/n
//!   x bytes / B` for its latency `a` and bandwidth `B` (weft_dist::bench); where the ranks
//!   share cores, among as many of them as compute at once (at least 2), the others waiting,
//!   so that the link is measured unshared (the planner shares the cores among transfers
//!   itself); on shared cores, also the latency of small all-reduces in pairs of ranks that all
//!   compute between their calls (`measure::loaded_latency`), the larger of the two kept.
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

mod measure;
mod passes;
mod sizes;

use std::time::{Duration, Instant};

use weft_core::DType;
use weft_plan::calibration::Calibration;
use weft_plan::{DeviceSpec, Efficiency, PassCost};
use weft_train::plan_shape;

use crate::train::ConfigArgs;
use measure::{attention_rate, collective_link, gemm_rate, loaded_latency, max_over, memory_rate, probe, timed};
use sizes::{Shapes, Sizes, MAX_TENSOR_BYTES};

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
        head_dim: m.head_dim as usize,
    };
    Shapes::decode(&shapes.encode())?;
    // this number of ranks' file, read back for the summary (the latest, `plan-local.toml`, may
    // be another calibration's by then), and the latest
    let path = plan_shape::calibration_path_for(nproc);
    for p in [&path, &plan_shape::calibration_path()] {
        // a folder is put aside by the rename only when it is empty: said now, not after measuring
        if std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()) {
            let mut entries = std::fs::read_dir(p).map_err(|e| format!("{}: {e}", p.display()))?;
            if entries.next().is_some() {
                return Err(format!(
                    "{}: is a folder with files in it, where the calibration goes; remove it and run again",
                    p.display()
                ));
            }
        }
        if let Err(e) = plan_shape::read_calibration(p) {
            weft_core::errln!("weft: warning: ignoring the calibration file ({e}); measuring again");
        }
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
    // the model's own passes, on rank 0 alone as the rates above, up to the largest
    // micro-batch a layout runs (the whole batch: one data-parallel rank, one micro-batch)
    let batch_rows = plan_shape::workload(&config, None)?.global_batch as usize;
    let pass_fit = alone.map(|a| {
        passes::pass_cost(
            &config,
            &spec_of(a.0, a.1, a.2, a.3),
            (batch_rows.clamp(1, 64), env.world_size),
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
            let loaded = loaded_latency(pg, env.rank, &sizes, budget)?;
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
    // on shared cores a collective waits for its partner to get a core: the latency measured
    // while every rank computes between its calls, where that is the larger
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
        // an empty folder where the file goes (a rename cannot replace it); one with files in
        // it was refused before measuring
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            let _ = std::fs::remove_dir(&path);
        }
        let written = std::fs::write(&tmp, &text)
            .map_err(|e| format!("{}: {e}", tmp.display()))
            .and_then(|()| std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display())));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
