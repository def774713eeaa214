//! `weft plan`: ranks the parallel layouts of a run config's model on a number of devices by
//! predicted step time (weft_plan's analytic model; docs/plan.md). Nothing of the model is
//! allocated.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use weft_plan::error::human_bytes;
use weft_plan::{DeviceSpec, MemoryBreakdown, Plan, PlanReport, SearchOptions, Workload};

use crate::print_out;
use crate::train::ConfigArgs;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct PlanArgs {
    #[command(subcommand)]
    what: Option<PlanCommand>,
    #[command(flatten)]
    config: ConfigArgs,
    /// Devices the job has.
    #[arg(long, required = true)]
    devices: Option<usize>,
    /// A cluster.toml describing the devices and their links (docs/plan.md).
    #[arg(long, value_name = "PATH", conflicts_with = "device_spec")]
    cluster: Option<PathBuf>,
    /// A device spec: h100-sxm-80gb (the default), h200-sxm-141gb, a100-sxm-80gb, or local
    /// (this machine as `weft plan calibrate` measured it).
    #[arg(long, value_name = "NAME")]
    device_spec: Option<String>,
    /// Rows per optimizer step (default: data.batch_size x train.grad_accum).
    #[arg(long, value_name = "B")]
    global_batch: Option<u64>,
    /// Plans to show.
    #[arg(long, value_name = "K", default_value_t = 10)]
    top: usize,
    /// Prints the plans as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Subcommand)]
enum PlanCommand {
    /// Measures this machine (matrix products, attention and memory-bound kernels at the
    /// model's shapes; the all-reduce between N local ranks) and keeps it as the `local`
    /// device spec in weft's cache folder.
    Calibrate(crate::calibrate::CalibrateArgs),
}

/// The device spec `weft plan` plans on without `--cluster` or `--device-spec`.
const DEFAULT_SPEC: &str = "h100-sxm-80gb";

pub fn run(args: &PlanArgs) -> Result<(), String> {
    if let Some(PlanCommand::Calibrate(c)) = &args.what {
        return crate::calibrate::run(c);
    }
    let devices = args.devices.ok_or("--devices N is required")?;
    if args.top == 0 {
        return Err("--top 0: must be at least 1 (the plans to show)".into());
    }
    let config = args.config.load()?;
    if let (Some(c), None, None) = (&config.parallel.cluster, &args.cluster, &args.device_spec) {
        weft_core::errln!(
            "weft: note: planning on {DEFAULT_SPEC}, not the config's parallel.cluster ({}), which only \
             `auto` reads: pass --cluster to plan on it",
            config.resolve(c).display()
        );
    }
    let mut work = weft_train::plan_shape::workload(&config, args.global_batch)?;
    let device = match (&args.cluster, &args.device_spec) {
        (Some(path), _) => weft_plan::cluster::load(path).map_err(|e| e.to_string())?,
        (None, Some(name)) => {
            let (spec, note) = weft_train::plan_shape::device_spec(name, devices)?;
            if let Some(note) = note {
                weft_core::errln!("weft: note: {note}");
            }
            spec
        }
        (None, None) => DeviceSpec::builtin(DEFAULT_SPEC).map_err(|e| e.to_string())?,
    };
    // planned for these devices, whatever the config's train.device
    work.kv_repeated = device.gpu;
    let start = Instant::now();
    let options = SearchOptions {
        keep_infeasible: args.top,
        sequence_parallel: weft_train::plan_shape::sequence_parallel_runs(&config),
    };
    let report = weft_plan::plan(&work, &device, devices, options).map_err(|e| e.to_string())?;
    let seconds = start.elapsed().as_secs_f64();
    let text = if args.json {
        json(&report, &work, &device, devices, args.top, seconds)
    } else {
        table(&report, &work, &device, devices, args.top, seconds)
    };
    print_out(&text)
}

/// A rate for the table: whole numbers from 100 up, else three significant digits (a plan is
/// never ranked at 0 tokens/s, and a rate under one printed with no decimals read as 0).
fn rate(x: f64) -> String {
    if !x.is_finite() || x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 1e-3 {
        let decimals = (2 - x.log10().floor() as i32).max(0) as usize;
        format!("{x:.decimals$}")
    } else {
        format!("{x:.2e}")
    }
}

/// `6x16` for 16 stages of 6 blocks, else the list.
fn stages(blocks: &[usize]) -> String {
    match blocks.first() {
        Some(&b) if blocks.iter().all(|&x| x == b) => format!("{b}x{}", blocks.len()),
        _ => format!("{blocks:?}").replace(' ', ""),
    }
}

fn gb(bytes: f64) -> String {
    format!("{:.1}", bytes / 1e9)
}

fn breakdown(m: &MemoryBreakdown) -> String {
    format!(
        "{} = {} + {} + {} + {} + {}",
        gb(m.total()),
        gb(m.params),
        gb(m.grads),
        gb(m.optimizer),
        gb(m.activations),
        gb(m.comm_buffers)
    )
}

fn table(r: &PlanReport, work: &Workload, device: &DeviceSpec, devices: usize, top: usize, seconds: f64) -> String {
    let m = &work.model;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} of {:.2}B parameters ({} layers, {} heads, width {}), global batch {} x {} tokens, {}, on {} x {} \
         ({} each, {} usable)",
        format!("{:?}", m.kind).to_lowercase(),
        m.parameter_count() / 1e9,
        m.n_layer,
        m.n_head,
        m.n_embd,
        work.global_batch,
        m.seq_len,
        work.precision.name(),
        devices,
        device.name,
        human_bytes(device.memory_bytes),
        human_bytes(r.usable_memory)
    );
    let infeasible: usize = r.infeasible_reasons.values().sum();
    let _ = writeln!(
        out,
        "planned in {seconds:.3} s: {} layouts evaluated, {} feasible ({} dominated dropped, {} re-cut to fit), \
         {infeasible} infeasible{}",
        r.evaluated,
        r.plans.len() + r.dominated,
        r.dominated,
        r.recut,
        if r.skipped > 0 {
            format!(", {} skipped (could not rank or fit)", r.skipped)
        } else {
            String::new()
        }
    );
    // the layout column as wide as the longest label shown
    let width = r
        .plans
        .iter()
        .take(top)
        .map(|p| p.layout.label().len())
        .max()
        .unwrap_or(0)
        .max(48);
    let _ = writeln!(
        out,
        "{:>4}  {:<width$} {:>10} {:>10} {:>12} {:>6}  memory/device GB = params + grads + optimizer + activations + comm",
        "rank", "layout", "stages", "step ms", "tokens/s", "MFU"
    );
    for (i, p) in r.plans.iter().take(top).enumerate() {
        let _ = writeln!(
            out,
            "{:>4}  {:<width$} {:>10} {:>10.1} {:>12} {:>5.1}%  {}",
            i + 1,
            p.layout.label(),
            stages(&p.layout.stage_blocks),
            p.time.step * 1e3,
            rate(p.tokens_per_second),
            100.0 * p.mfu,
            breakdown(&p.memory)
        );
    }
    if infeasible > 0 {
        let reasons: Vec<String> = r.infeasible_reasons.iter().map(|(k, v)| format!("{k} ({v})")).collect();
        let _ = writeln!(out, "infeasible: {}", reasons.join(", "));
        if let Some(p) = r.infeasible.first() {
            let _ = writeln!(
                out,
                "closest to fitting: {} needs {} GB ({})",
                p.layout.label(),
                gb(p.memory.total()),
                breakdown(&p.memory)
            );
        }
    }
    if !r.ruled_out.is_empty() {
        let reasons: Vec<String> = r.ruled_out.iter().map(|(k, v)| format!("{k} ({v})")).collect();
        let _ = writeln!(out, "dp x tp x pp splits ruled out: {}", reasons.join(", "));
    }
    out
}

fn plan_json(p: &Plan) -> serde_json::Value {
    let l = &p.layout;
    let m = &p.memory;
    serde_json::json!({
        "dp": l.dp,
        "tp": l.tp,
        "pp": l.pp,
        "zero": l.zero,
        "micro_batches": l.micro_batches,
        "schedule": l.schedule.name(),
        "virtual_stages": l.schedule.chunks(),
        "recompute": l.recompute,
        "sequence_parallel": l.sequence_parallel,
        "comm_dtype": l.comm_dtype.name(),
        "pipeline_dtype": l.pipeline_dtype.name(),
        "stage_blocks": l.config_stage_blocks(),
        "predicted_step_ms": p.time.step * 1e3,
        "predicted_mfu": p.mfu,
        "tokens_per_second": p.tokens_per_second,
        "memory_bytes_per_device": m.total(),
        "memory": {
            "params": m.params,
            "grads": m.grads,
            "optimizer": m.optimizer,
            "activations": m.activations,
            "comm_buffers": m.comm_buffers,
        },
        "feasible": p.feasible,
        "reason": p.reason,
    })
}

fn json(r: &PlanReport, work: &Workload, device: &DeviceSpec, devices: usize, top: usize, seconds: f64) -> String {
    let plans: Vec<serde_json::Value> = r
        .plans
        .iter()
        .take(top)
        .chain(r.infeasible.iter().take(top))
        .map(plan_json)
        .collect();
    let value = serde_json::json!({
        "devices": devices,
        "device": device.name,
        "global_batch": work.global_batch,
        "parameters": work.model.parameter_count(),
        "planning_seconds": seconds,
        "evaluated": r.evaluated,
        "feasible_count": r.plans.len() + r.dominated,
        "dominated_dropped": r.dominated,
        "recut_to_fit": r.recut,
        "skipped": r.skipped,
        "infeasible_count": r.infeasible_reasons.values().sum::<usize>(),
        "plans": plans,
    });
    format!("{value}\n")
}
