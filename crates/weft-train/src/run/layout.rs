//! The job this process is a rank of, and the layout `[parallel]` gives it.

use crate::config::RunConfig;
use crate::error::{Error, Result};

/// The job this process belongs to, from the launcher's (or Slurm's, OpenMPI's) variables.
pub(crate) struct JobShape {
    pub ranks: usize,
    pub rank: usize,
    /// Ranks of the job on this machine.
    pub local_ranks: usize,
}

impl JobShape {
    /// `this job has 4 ranks (this is rank 1)`, or that this is a single process.
    fn describe(&self) -> String {
        if self.ranks > 1 {
            format!("this job has {} ranks (this is rank {})", self.ranks, self.rank)
        } else {
            "this is a single process (no launcher variables are set)".to_string()
        }
    }
}

pub(super) fn job_shape() -> Result<JobShape> {
    let env = weft_dist::env::from_env()?;
    Ok(JobShape {
        ranks: env.as_ref().map_or(1, |e| e.world_size),
        rank: env.as_ref().map_or(0, |e| e.rank),
        local_ranks: env.as_ref().map_or(1, |e| e.local_world_size),
    })
}

/// Joins the job when this process is one of several ranks (started by `weft launch`, Slurm or
/// OpenMPI), after checking that `[parallel]` describes as many ranks as the job has: every rank
/// reads the same config, so each stops with the same message before any connection is made.
pub(super) fn join_job(config: &RunConfig, job: &JobShape) -> Result<Option<weft_dist::ProcessGroup>> {
    let p = &config.parallel;
    let want = p.dp * p.tp * p.pp;
    let ranks = job.ranks;
    if want != ranks {
        let who = job.describe();
        return Err(Error::Config(format!(
            "parallel: dp x tp x pp = {} x {} x {} = {want}, but {who}; start {want} ranks, e.g. `weft launch \
             --nproc-per-node {want} -- weft train ...`, or leave parallel.dp unset to use every rank",
            p.dp, p.tp, p.pp
        )));
    }
    if ranks == 1 {
        return Ok(None);
    }
    Ok(Some(weft_dist::init()?))
}

/// `config` with `parallel.dp = 0` (the default) replaced by the data-parallel ranks the job
/// has: its ranks divided by `tp x pp`.
pub(super) fn with_job_dp(config: &RunConfig, job: &JobShape) -> Result<RunConfig> {
    let mut resolved = config.clone();
    let p = &config.parallel;
    if p.dp == 0 {
        let cut = p.tp * p.pp;
        if cut == 0 || !job.ranks.is_multiple_of(cut) {
            return Err(Error::Config(format!(
                "parallel: dp unset takes the job's ranks divided by tp x pp = {} x {} = {cut}, but {}; start a \
                 multiple of {cut} ranks, e.g. `weft launch --nproc-per-node {cut} -- weft train ...`",
                p.tp,
                p.pp,
                job.describe()
            )));
        }
        resolved.parallel.dp = job.ranks / cut;
    }
    Ok(resolved)
}
