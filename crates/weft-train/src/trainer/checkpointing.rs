//! The trainer's checkpoints: claiming the folder for the run, resuming from the newest
//! checkpoint that verifies (after checking it is this model's), loading any layout's
//! checkpoint, and saving in the background.

use std::path::{Path, PathBuf};

use weft_core::Tensor;
use weft_dist::trace::span;
use weft_dist::ProcessGroup;

use super::{whole, Trainer};
use crate::checkpoint::{self, CheckpointState, Claim, ClaimMode, FolderState, Loaded};
use crate::error::{Error, Result};

impl Trainer {
    /// The ranks of the run: the job, else the data-parallel group; `None` for a single process.
    /// They write checkpoints together, agree on when to stop, and their rank 0 logs.
    pub(super) fn job_group(&self) -> Option<&ProcessGroup> {
        self.job.as_ref().or(self.data_parallel.as_ref().map(|(pg, _)| pg))
    }

    /// [`Trainer::job_group`], which tensor and pipeline parallelism need to have been given
    /// ([`Trainer::with_job`]) for checkpoints.
    pub(super) fn checkpoint_group(&self) -> Result<Option<&ProcessGroup>> {
        if self.job.is_none() && (self.tensor_parallel.is_some() || self.pipeline.is_some()) {
            return Err(Error::Config(
                "checkpoints of a tensor-parallel or pipeline run need the job's group (Trainer::with_job)".into(),
            ));
        }
        Ok(self.job_group())
    }

    /// Whether this rank logs for the job (rank 0 of [`Trainer::job_group`]).
    pub fn is_logging_rank(&self) -> bool {
        self.job_group().is_none_or(|g| g.rank() == 0)
    }

    /// Claims the checkpoint folder for this run (see [`checkpoint::Claim`]): every rank checks
    /// it can write there, rank 0 takes the lock and applies `mode`, and every rank fails if
    /// any did. Done once; [`Trainer::resume`] and [`Trainer::fit`] call it when needed. A fresh
    /// run's call (from [`Trainer::fit`] or a save: the run is starting) also removes the
    /// earlier checkpoints a claim with `overwrite` found ([`Claim::clear_earlier`]), once.
    pub fn claim_checkpoints(&mut self, mode: ClaimMode) -> Result<()> {
        let Some(policy) = &self.checkpoints else {
            return Ok(());
        };
        let dir = policy.dir.clone();
        let group = self.checkpoint_group()?.cloned();
        if self.claim.is_none() {
            self.claim = Some(checkpoint::claim(&dir, group.as_ref(), mode)?);
        }
        if let (ClaimMode::Fresh { .. }, Some(claim)) = (mode, self.claim.as_mut()) {
            claim.clear_earlier(group.as_ref())?;
        }
        Ok(())
    }

    /// Restores the newest checkpoint of the policy's folder that reads back whole, if any, and
    /// returns the step to continue from (0 when the folder holds none). Each rank reads and
    /// verifies only what it holds (as [`Trainer::load_checkpoint`]), and a folder counts when
    /// every rank's part of it verifies. Newer folders that do not are named on stderr with the
    /// reason and left as they are; when there are checkpoint folders but none verifies, it is an
    /// error. The checkpoint must be of this model (and tokenizer): see
    /// [`Trainer::load_checkpoint`].
    pub fn resume(&mut self) -> Result<usize> {
        let Some(policy) = &self.checkpoints else {
            return Err(Error::Config("resume needs train.checkpoint_dir".into()));
        };
        let dir = policy.dir.clone();
        self.claim_checkpoints(ClaimMode::Resume)?;
        let group = self.checkpoint_group()?.cloned();
        let group = group.as_ref();
        let logs = self.is_logging_rank();
        let folders = crate::job::agree(group, checkpoint::scan(&dir), "--resume: listing the checkpoints")?;
        // the ranks try the same folders in the same order, or none
        let newest = folders.last().map_or(0, |(step, _, _)| step + 1);
        for value in [folders.len(), newest] {
            if crate::job::same_everywhere(group, value)?.is_err() {
                return Err(Error::Run(format!(
                    "--resume: the ranks see different checkpoint folders in {}; is it on a filesystem every \
                     rank sees?",
                    dir.display()
                )));
            }
        }
        let me = group.map(|g| g.ranks()[g.rank()]);
        let mut skipped = Vec::new();
        let mut found = None;
        for (_, path, state) in folders.into_iter().rev() {
            let mine = match state {
                FolderState::NoMarker => Err(format!(
                    "it has no {} marker (its save did not finish)",
                    checkpoint::MARKER
                )),
                FolderState::NoIndex => Err(format!("its {} is missing", checkpoint::INDEX)),
                FolderState::Complete => self.read_own(&path, true, true).map_err(|e| e.to_string()),
            };
            let first = crate::job::lowest_failed(group, mine.is_err())?;
            match mine {
                Ok(loaded) if first.is_none() => {
                    found = Some((path, loaded));
                    break;
                }
                // the lowest rank whose part fails says why (replicas would repeat it)
                Err(why) if first.is_none() || first == me => {
                    weft_core::errln!("weft: warning: --resume skips {}: {why}", path.display());
                }
                _ => {
                    if let Some(rank) = first.filter(|_| logs) {
                        weft_core::errln!(
                            "weft: warning: --resume skips {}: rank {rank}'s part does not verify (its warning says why)",
                            path.display()
                        );
                    }
                }
            }
            skipped.push(path.file_name().unwrap_or_default().to_string_lossy().into_owned());
        }
        // the folders between the newest and the one chosen could differ from rank to rank
        let chosen = found.as_ref().map_or(0, |(_, l)| l.state.step);
        if let Err((lo, hi)) = crate::job::same_everywhere(group, chosen)? {
            return Err(Error::Run(format!(
                "--resume: the ranks chose different checkpoints (steps {lo} to {hi}) in {}; is it on a filesystem \
                 every rank sees?",
                dir.display()
            )));
        }
        let Some((path, loaded)) = found else {
            if skipped.is_empty() {
                return Ok(0);
            }
            // starting over would bury them: a person should look first
            return Err(Error::Run(format!(
                "--resume: no checkpoint in {} verifies ({}: see the warnings above); move them aside to start \
                 over, or resume from a copy that verifies with --resume-from",
                dir.display(),
                skipped.join(", ")
            )));
        };
        // the run goes on under its own id
        if let Some(run) = &loaded.state.run {
            self.run_id = run.clone();
        }
        self.continued_extra = Some(loaded.state.extra.clone());
        // a stage or part that does not fit this run fails every rank
        let applied = self.apply_checkpoint(&path, loaded);
        let step = crate::job::agree(group, applied, "--resume: loading the checkpoint")?;
        self.resumed_from = Some(path);
        Ok(step)
    }

    /// The extra state ([`Trainer::checkpoint_extra`]) of the checkpoint this run continues: the
    /// one [`Trainer::resume`] restored, or one of the policy's own folder that
    /// [`Trainer::load_checkpoint`] restored. `None` when the run continues none.
    pub fn continued_extra(&self) -> Option<&serde_json::Value> {
        self.continued_extra.as_ref()
    }

    /// The checkpoint [`Trainer::resume`] restored, if it restored one.
    pub fn resumed_from(&self) -> Option<&Path> {
        self.resumed_from.as_deref()
    }

    /// Uses `claim` (see [`checkpoint::claim`]) for the policy's folder instead of claiming it
    /// at the first [`Trainer::resume`] or [`Trainer::fit`].
    pub fn with_claim(mut self, claim: Claim) -> Self {
        self.claim = Some(claim);
        self
    }

    /// Restores checkpoint folder `ckpt` (or the newest one inside a checkpoint directory),
    /// whatever layout wrote it; returns the step to continue from. Every rank reads only what it
    /// holds (a stage's parameters, the rows of a part cut on dim 0). The checkpoint's model
    /// config and tokenizer
    /// (from [`Trainer::checkpoint_extra`]'s `model` and `tokenizer`) must equal this run's:
    /// a difference is an error naming it.
    ///
    /// A checkpoint of the policy's own folder continues that run, as [`Trainer::resume`] does
    /// (the folder is claimed for resuming, and the run keeps its id); any other starts a new run
    /// from it.
    pub fn load_checkpoint(&mut self, ckpt: &Path) -> Result<usize> {
        let dir = checkpoint::resolve(ckpt)?;
        let loaded = self.read_own(&dir, false, true)?;
        let own = self.checkpoints.as_ref().is_some_and(|p| {
            let canonical = |d: &Path| d.canonicalize().ok();
            dir.parent()
                .and_then(canonical)
                .is_some_and(|d| Some(d) == canonical(&p.dir))
        });
        if own {
            self.claim_checkpoints(ClaimMode::Resume)?;
            // continuing its own checkpoints: train.overwrite must not remove the one just
            // loaded (every rank decides `own` alike, from the same paths)
            if let Some(claim) = self.claim.as_mut() {
                claim.keep_earlier();
            }
            if let Some(run) = &loaded.state.run {
                self.run_id = run.clone();
            }
            self.continued_extra = Some(loaded.state.extra.clone());
        }
        self.apply_checkpoint(&dir, loaded)
    }

    /// Loads `loaded` (this rank's tensor-parallel parts of the cut tensors, the others whole)
    /// into the model and the optimizer.
    fn apply_checkpoint(&mut self, dir: &Path, mut loaded: Loaded) -> Result<usize> {
        self.apply_weights(dir, &loaded)?;
        // a pipeline stage keeps its own parameters' state only
        let mine: std::collections::BTreeSet<&str> = self.params.iter().map(|(n, _)| n.as_str()).collect();
        loaded.optimizer.retain(|key, _| mine.contains(whole::param_of(key)));
        match self.zero() {
            Some(z) => self.optimizer.load_state(&z.shard_state(&loaded.optimizer)?)?,
            None => self.optimizer.load_state(&loaded.optimizer)?,
        }
        let offset = self.own_rng_offset(&loaded.state);
        self.model.context().set_rng_offset(offset);
        // a whole-step graph holds the optimizer's state tensors, which loading replaced
        self.forget_whole_step();
        Ok(loaded.state.step)
    }

    /// Where this rank's dropout stream goes on from in checkpoint `state`: its own rank's
    /// position when the checkpoint records one per rank and was written at this run's layout
    /// (as many ranks, and the same `parallel` record in [`Trainer::checkpoint_extra`]: the
    /// sizes, and a pipeline's schedule, micro-batches and stage cut), else the checkpoint's one
    /// position (rank 0's). Pipeline stages advance their
    /// streams by their own layers only, so at another layout the masks do not repeat the
    /// checkpoint's run.
    fn own_rng_offset(&self, state: &CheckpointState) -> u64 {
        // the group the checkpoint's writers were ranked in (`checkpoint_group`, which a
        // checkpoint written at all had)
        let (rank, size) = self.job_group().map_or((0, 1), |g| (g.rank(), g.size()));
        let parallel = |extra: &serde_json::Value| extra.get("parallel").cloned();
        let same_layout = state.rng_offsets.len() == size && parallel(&state.extra) == parallel(&self.checkpoint_extra);
        match state.rng_offsets.get(rank) {
            Some(&offset) if same_layout => offset,
            _ => state.rng_offset,
        }
    }

    /// Restores only the model's weights of checkpoint folder `ckpt` (or the newest one inside a
    /// checkpoint directory), whatever layout or optimizer wrote it: the optimizer's state, the
    /// dropout stream and the run's id are left as they are, and the folder is not claimed.
    /// Returns the steps the checkpoint had trained. As [`Trainer::load_checkpoint`], each rank
    /// reads only the weights it holds, and the checkpoint's model config and tokenizer must be
    /// this run's. What `weft evaluate` loads.
    pub fn load_weights(&mut self, ckpt: &Path) -> Result<usize> {
        let dir = checkpoint::resolve(ckpt)?;
        let loaded = self.read_own(&dir, false, false)?;
        self.apply_weights(&dir, &loaded)?;
        Ok(loaded.state.step)
    }

    /// Loads the weights of `loaded` this rank holds into the model, once its model config and
    /// tokenizer are found to be this run's.
    fn apply_weights(&mut self, dir: &Path, loaded: &Loaded) -> Result<()> {
        same_model(&self.checkpoint_extra, &loaded.state.extra, dir, RESUME_ADVICE)?;
        self.gather_parameters()?;
        // a pipeline stage keeps its own parameters only
        let mine: std::collections::BTreeSet<&str> = self.params.iter().map(|(n, _)| n.as_str()).collect();
        weft_nn::state_dict::load_state_dict_only(
            self.model.as_ref(),
            &loaded.params,
            self.model.aliases(),
            &dir.display().to_string(),
            &|n| mine.contains(n),
        )?;
        Ok(())
    }

    /// Hands this rank's share of the state before step `next_step` (copies of the pieces it
    /// owns; no communication but, once, agreeing on a nonce) to the background writer, which
    /// writes it while training goes on; rank 0's writer completes the checkpoint when every
    /// rank's files are written. Returns where the checkpoint will be.
    pub(super) fn save(&mut self, next_step: usize) -> Result<Option<PathBuf>> {
        let Some(policy) = self.checkpoints.clone() else {
            return Ok(None);
        };
        self.claim_checkpoints(ClaimMode::Fresh {
            overwrite: policy.overwrite,
        })?;
        let _s = span("checkpoint", format!("copy step {next_step}"));
        let group = self.checkpoint_group()?.cloned();
        let nonce = match (self.checkpoint_nonce, &group) {
            (Some(n), _) => n,
            (None, None) => checkpoint::new_nonce(),
            (None, Some(g)) => {
                let t = Tensor::from_vec(vec![checkpoint::new_nonce() as f64], &[1])?;
                g.broadcast(&t, 0)?.wait()?;
                t.to_vec::<f64>()?[0] as u64
            }
        };
        self.checkpoint_nonce = Some(nonce);
        let shard = self.local_shard()?;
        let state = CheckpointState {
            step: next_step,
            // this rank's: rank 0's writer collects every rank's
            rng_offset: self.model.context().rng_offset(),
            rng_offsets: Vec::new(),
            extra: self.checkpoint_extra.clone(),
            run: Some(self.run_id.clone()),
        };
        let pending = checkpoint::Pending {
            dir: policy.dir.clone(),
            shard,
            state,
            aliases: self
                .model
                .aliases()
                .iter()
                .map(|(a, c)| (a.to_string(), c.to_string()))
                .collect(),
            keep: policy.keep,
            coordination: group.map(|group| checkpoint::Coordination { group, nonce }),
        };
        self.checkpoint_writer.submit(pending)?;
        Ok(Some(checkpoint::folder(&policy.dir, next_step)))
    }

    /// Saves the state before step `next_step` into the policy's folder (no-op without one)
    /// and waits until the checkpoint is complete; returns its folder. Every rank of the job
    /// must call it.
    pub fn save_checkpoint(&mut self, next_step: usize) -> Result<Option<PathBuf>> {
        let path = self.save(next_step)?;
        self.checkpoint_writer.finish()?;
        Ok(path)
    }
}

/// What a run that resumes (or starts from) a checkpoint of another model is told.
const RESUME_ADVICE: &str = "resume with the checkpoint's model, or start a new run (another train.checkpoint_dir)";

/// Checks, from its index alone, that the checkpoint at `ckpt` (a folder, or a directory's
/// newest) records the model (and tokenizer) of `ours` (a run's [`Trainer::checkpoint_extra`]),
/// before a model of the run's size is built; `advice` ends the message when it does not.
pub(crate) fn check_checkpoint_model(ours: &serde_json::Value, ckpt: &Path, advice: &str) -> Result<()> {
    let dir = checkpoint::resolve(ckpt)?;
    let index = checkpoint::read_index(&dir)?;
    same_model(ours, &index.state.extra, &dir, advice)
}

/// Checks that a checkpoint (whose extra JSON is `theirs`) holds this run's model: every key of
/// the model config equal, and the same tokenizer. Either side without a model config (a
/// library run that records none) is not checked. `advice` ends the message when they differ.
fn same_model(ours: &serde_json::Value, theirs: &serde_json::Value, dir: &Path, advice: &str) -> Result<()> {
    let (Some(mine), Some(saved)) = (ours.get("model"), theirs.get("model")) else {
        return Ok(());
    };
    let differ = |what: String| Err(Error::Config(format!("{}: {what}; {advice}", dir.display())));
    if let (Some(a), Some(b)) = (mine.as_object(), saved.as_object()) {
        let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
        // the kind first: other keys differ because it does
        keys.sort_by_key(|k| (k.as_str() != "kind", k.as_str()));
        keys.dedup();
        for k in keys {
            let (x, y) = (a.get(k), b.get(k));
            if x != y {
                let show = |v: Option<&serde_json::Value>| v.map_or("nothing".to_string(), |v| v.to_string());
                return differ(format!(
                    "model.{k} is {} in the checkpoint but {} in this run",
                    show(y),
                    show(x)
                ));
            }
        }
    } else if mine != saved {
        return differ(format!("its model config {saved} is not this run's {mine}"));
    }
    let vocab = |v: &serde_json::Value| -> Option<String> {
        let text = v.get("tokenizer")?.as_str()?;
        let json: serde_json::Value = serde_json::from_str(text).ok()?;
        json.get("vocab")?.as_str().map(str::to_string)
    };
    if let (Some(a), Some(b)) = (vocab(ours), vocab(theirs)) {
        if a != b {
            let only = |x: &str, y: &str| -> String { x.chars().filter(|c| !y.contains(*c)).take(10).collect() };
            let (new, gone) = (only(&a, &b), only(&b, &a));
            let detail = match (new.is_empty(), gone.is_empty()) {
                (true, true) => "the same characters with other token ids".to_string(),
                _ => format!("characters only in this run's text: {new:?}; only in the checkpoint's: {gone:?}"),
            };
            return differ(format!(
                "the checkpoint's tokenizer is not this run's ({} vs {} characters; {detail})",
                b.chars().count(),
                a.chars().count()
            ));
        }
        return Ok(());
    }
    // other tokenizers (gpt2, tokenizer.json): the same JSON form, or the kinds named
    let tokenizer = |v: &serde_json::Value| -> Option<serde_json::Value> {
        serde_json::from_str(v.get("tokenizer")?.as_str()?).ok()
    };
    if let (Some(a), Some(b)) = (tokenizer(ours), tokenizer(theirs)) {
        if a != b {
            let kind = |v: &serde_json::Value| v.get("type").and_then(|t| t.as_str()).unwrap_or("unknown").to_string();
            let (ka, kb) = (kind(&a), kind(&b));
            let detail = if ka == kb {
                format!("two different {ka} tokenizers")
            } else {
                format!("{kb} in the checkpoint, {ka} in this run")
            };
            return differ(format!("the checkpoint's tokenizer is not this run's ({detail})"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_different_model_or_tokenizer_is_named() {
        let dir = Path::new("/c/step-00000010");
        let tok = |v: &str| json!({"type": "char", "vocab": v}).to_string();
        let ours = json!({"model": {"kind": "gpt", "n_head": 4, "n_embd": 32}, "tokenizer": tok("abc")});
        assert!(same_model(&ours, &ours, dir, RESUME_ADVICE).is_ok());
        let heads = json!({"model": {"kind": "gpt", "n_head": 2, "n_embd": 32}, "tokenizer": tok("abc")});
        let e = same_model(&ours, &heads, dir, RESUME_ADVICE).unwrap_err().to_string();
        assert!(
            e.contains("model.n_head is 2 in the checkpoint but 4 in this run"),
            "{e}"
        );
        let text = json!({"model": {"kind": "gpt", "n_head": 4, "n_embd": 32}, "tokenizer": tok("abd")});
        let e = same_model(&ours, &text, dir, RESUME_ADVICE).unwrap_err().to_string();
        assert!(
            e.contains("tokenizer") && e.contains("\"c\"") && e.contains("\"d\""),
            "{e}"
        );
        // a library run without a recorded model is not checked
        assert!(same_model(&serde_json::Value::Null, &heads, dir, RESUME_ADVICE).is_ok());
    }
}
