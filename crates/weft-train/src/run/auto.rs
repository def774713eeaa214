//! `[parallel] auto = true`: the layout `weft_plan` predicts fastest for the job's ranks
//! replaces the `[parallel]` keys before the run is built.
//!
//! Every rank plans on its own from the same inputs (the config, the device spec, the number
//! of ranks); the search is deterministic, so they choose the same plan. The ranks then check
//! that they did ([`agree_on_plan`]): a job whose nodes read different calibration files stops
//! with a named error instead of building mismatched layouts. An elastic restart runs this
//! again for the new number of ranks.

use weft_core::Tensor;
use weft_plan::SearchOptions;

use crate::config::RunConfig;
use crate::error::{Error, Result};
use crate::plan_shape;

/// A plan chosen for a run.
pub(super) struct Planned {
    /// The config with the plan's `[parallel]` keys.
    pub config: RunConfig,
    /// One line for the log: the layout, its predicted step time and memory.
    pub line: String,
    /// The same for every rank that chose the same plan.
    pub fingerprint: u64,
}

fn auto_error(message: String) -> Error {
    Error::Config(format!("parallel.auto: {message}"))
}

/// Plans `config`'s model for `ranks` ranks and returns the config with the chosen layout.
///
/// The rows weft shards are those of one forward and backward (`data.batch_size`); the
/// predicted step runs `train.grad_accum` of them. Only plans that reduce and send in f32
/// (`comm_dtype` and `pipeline_dtype` `"f32"`) are chosen,
/// so the plan changes where the numbers of a step are computed, not the numbers; GPU ranks
/// take data-parallel plans only (`tp = pp = 1`, `zero = 0`), as weft runs them.
pub(super) fn plan(config: &RunConfig, ranks: usize) -> Result<Planned> {
    let p = &config.parallel;
    let (device, note) = match &p.cluster {
        Some(path) => (
            weft_plan::cluster::load(&config.resolve(path))
                .map_err(|e| Error::Config(format!("parallel.cluster: {e}")))?,
            None,
        ),
        None => plan_shape::local_spec_for(ranks).map_err(auto_error)?,
    };
    let work = plan_shape::workload(config, None).map_err(auto_error)?;
    let report = weft_plan::plan(
        &work,
        &device,
        ranks,
        SearchOptions {
            keep_infeasible: 0,
            sequence_parallel: plan_shape::sequence_parallel_runs(config),
        },
    )
    .map_err(|e| auto_error(e.to_string()))?;
    let gpu = config.train.device.trim().starts_with("cuda") && ranks > 1;
    let chosen = report
        .plans
        .iter()
        .filter(|c| c.layout.communicates_in_f32())
        .find(|c| !gpu || (c.layout.tp == 1 && c.layout.pp == 1 && c.layout.zero == 0))
        .ok_or_else(|| {
            auto_error(format!(
                "no plan for {ranks} ranks on {} reduces and sends in f32{}: {} feasible plans in all",
                device.name,
                if gpu {
                    " with data parallelism only (GPU ranks)"
                } else {
                    ""
                },
                report.plans.len()
            ))
        })?;
    let l = &chosen.layout;
    let mut resolved = config.clone();
    let q = &mut resolved.parallel;
    q.dp = l.dp;
    q.tp = l.tp;
    q.pp = l.pp;
    q.zero = l.zero;
    q.micro_batches = l.micro_batches;
    q.schedule = l.schedule.name().to_string();
    q.recompute = l.recompute;
    q.sequence_parallel = l.sequence_parallel;
    q.comm_dtype = l.comm_dtype.name().to_string();
    q.pipeline_dtype = l.pipeline_dtype.name().to_string();
    let chunks = l.schedule.chunks();
    q.virtual_stages = (chunks > 1).then_some(chunks);
    q.stage_blocks = (l.pp > 1).then(|| l.config_stage_blocks());
    resolved.validate("the planned layout")?;
    let line = format!(
        "weft: parallel.auto: planned for {ranks} ranks on {}: dp {} tp {} pp {} zero {} micro_batches {} schedule {} \
         virtual_stages {} recompute {} sequence_parallel {} comm_dtype {} pipeline_dtype {} stage_blocks {:?}; predicted {:.1} ms per step, {:.1} MB per rank ({} layouts evaluated)",
        device.name,
        l.dp,
        l.tp,
        l.pp,
        l.zero,
        l.micro_batches,
        l.schedule.name(),
        l.schedule.chunks(),
        l.recompute,
        l.sequence_parallel,
        l.comm_dtype.name(),
        l.pipeline_dtype.name(),
        l.config_stage_blocks(),
        chosen.time.step * 1e3,
        chosen.memory.total() / 1e6,
        report.evaluated
    );
    let line = match note {
        Some(note) => format!("{line}\nweft: parallel.auto: note: {note}"),
        None => line,
    };
    // FNV-1a of every key the plan sets (the label names the chunks a stage and the comm
    // dtype; the cut is per virtual stage under interleaving)
    let key = format!("{} {:?}", l.label(), l.config_stage_blocks());
    let fingerprint = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    Ok(Planned {
        config: resolved,
        line,
        fingerprint,
    })
}

/// Collective over `group`: an error on every rank unless every rank chose the same plan.
pub(super) fn agree_on_plan(group: &weft_dist::ProcessGroup, fingerprint: u64) -> Result<()> {
    // 48 bits of the fingerprint are exact in an f64
    let x = (fingerprint >> 16) as f64;
    let extreme = |op| -> Result<f64> {
        let t = Tensor::from_vec(vec![x], &[1])?;
        group.all_reduce(&t, op)?.wait()?;
        Ok(t.to_vec::<f64>()?[0])
    };
    let (lo, hi) = (extreme(weft_dist::ReduceOp::Min)?, extreme(weft_dist::ReduceOp::Max)?);
    if lo != hi {
        return Err(auto_error(
            "the ranks planned different layouts (their device specs differ: give every node the same \
             parallel.cluster file)"
                .into(),
        ));
    }
    Ok(())
}
