//! Which rank caused a failure, and the report the launcher prints about it.
//!
//! The first worker to exit badly is often not the culprit: a rank that finds a mismatched
//! collective sends an abort to its peers, and they may exit before it does. So, as torchrun
//! does with its error files, the launcher reads what each failed worker wrote to its
//! `WEFT_ERROR_FILE` ([`crate::failure`]): the root cause is the earliest failure that no other
//! rank caused. Programs that write no file are reported in the order they exited.

use std::time::SystemTime;

use super::worker::{self, Worker};
use super::LaunchConfig;
use crate::failure::{unix_time, Record};

/// The worker a failure report is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cause {
    /// Worker `i` (an index into the workers): the earliest failure that no other rank caused,
    /// by the error files.
    Root(usize),
    /// Worker `i` failed first; no error file says more.
    First(usize),
    /// Worker `via` failed first, because of global rank `rank`, which is not on this node.
    Elsewhere { rank: usize, via: usize },
}

impl Cause {
    /// The worker of this node the report shows.
    pub(super) fn worker(self) -> usize {
        match self {
            Cause::Root(i) | Cause::First(i) | Cause::Elsewhere { via: i, .. } => i,
        }
    }
}

/// What the launcher knows of one worker after a failure, once all are stopped.
#[derive(Clone, Debug)]
struct Outcome {
    rank: usize,
    /// Exited non-zero or was killed.
    failed: bool,
    /// Exited by itself before the launcher stopped the others.
    on_its_own: bool,
    /// When the launcher found it exited, in seconds since the Unix epoch.
    ended: Option<f64>,
    record: Option<Record>,
}

impl Outcome {
    /// The rank its error file blames, unless that is itself.
    fn caused_by(&self) -> Option<usize> {
        self.record.as_ref()?.caused_by.filter(|&p| p != self.rank)
    }
}

/// A failure of this node's workers, assessed once they are all stopped.
pub(super) struct Failure {
    pub(super) cause: Cause,
    outcomes: Vec<Outcome>,
}

impl Failure {
    /// Reads the error files of `workers` after worker `first` failed; `on_its_own[i]` says
    /// whether worker `i` had exited before the launcher stopped the others at `stopped_at`.
    pub(super) fn assess(workers: &[Worker], first: usize, on_its_own: &[bool], stopped_at: SystemTime) -> Failure {
        let outcomes: Vec<Outcome> = workers
            .iter()
            .zip(on_its_own)
            .map(|(w, &own)| Outcome {
                rank: w.rank,
                failed: w.status.is_some_and(|s| !s.success()),
                on_its_own: own,
                ended: w.ended.map(unix_time),
                record: w.record(),
            })
            .collect();
        Failure {
            cause: find_cause(&outcomes, first, unix_time(stopped_at)),
            outcomes,
        }
    }

    /// One phrase for log lines: `rank 1 failed (exit code 3)`; with `node`, `rank 1 on node 0
    /// failed (...)`.
    pub(super) fn summary(&self, workers: &[Worker], node: Option<usize>) -> String {
        let i = self.cause.worker();
        let on = node.map(|n| format!(" on node {n}")).unwrap_or_default();
        let status = self.status(workers, i);
        match self.cause {
            Cause::Root(_) | Cause::First(_) => format!("rank {}{on} failed ({status})", workers[i].rank),
            Cause::Elsewhere { rank, .. } => {
                format!("rank {}{on} failed because of rank {rank} ({status})", workers[i].rank)
            }
        }
    }

    /// How worker `i` ended: `exit code 3`, `killed by signal 15 (SIGTERM), stopped by the
    /// launcher`.
    fn status(&self, workers: &[Worker], i: usize) -> String {
        let s = worker::describe(workers[i].status.expect("the workers are stopped"));
        if self.outcomes[i].on_its_own {
            s
        } else {
            format!("{s}, stopped by the launcher")
        }
    }

    /// The report: the rank that caused the failure (or failed first), its pid, status and
    /// last stderr lines, then the other ranks that failed on their own (and because of whom)
    /// and those the launcher stopped.
    pub(super) fn report(&self, cfg: &LaunchConfig, workers: &[Worker], restarts: u32) -> String {
        let i = self.cause.worker();
        let w = &workers[i];
        let place = format!("(local rank {} on node {}, pid {})", w.local_rank, cfg.node_rank, w.pid);
        let status = self.status(workers, i);
        let mut out = match self.cause {
            Cause::Root(_) => format!(
                "weft launch: job failed: rank {} {place} caused the failure: {status}\n",
                w.rank
            ),
            Cause::First(_) => format!(
                "weft launch: job failed: rank {} {place} failed first: {status}\n",
                w.rank
            ),
            Cause::Elsewhere { rank, .. } => format!(
                "weft launch: job failed: rank {rank}, on another node, caused the failure; here rank {} {place} \
                 failed first because of it: {status}\n",
                w.rank
            ),
        };
        if restarts > 0 {
            out += &format!(
                "weft launch: after {restarts} restart(s) (--max-restarts {})\n",
                cfg.max_restarts
            );
        }
        let tail = w.tail();
        if tail.is_empty() {
            out += &format!("weft launch: rank {} wrote nothing to stderr\n", w.rank);
        } else {
            out += &format!("weft launch: last {} stderr line(s) of rank {}:\n", tail.len(), w.rank);
            for line in &tail {
                out += &format!("    {line}\n");
            }
        }
        // its error file's message, unless its stderr already ends with it (weft's does)
        if let Some(rec) = &self.outcomes[i].record {
            let words = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
            let message = words(&rec.message);
            if !message.is_empty() && !tail.iter().any(|l| words(l).contains(&message)) {
                out += &format!("weft launch: rank {}'s error: {message}\n", w.rank);
            }
        }
        let mut also_failed = Vec::new();
        let mut stopped = Vec::new();
        for (j, (o, outcome)) in workers.iter().zip(&self.outcomes).enumerate() {
            let Some(s) = o.status else { continue };
            if j == i {
                continue;
            }
            if outcome.on_its_own && !s.success() {
                let because = outcome
                    .caused_by()
                    .map(|p| format!(", because of rank {p}"))
                    .unwrap_or_default();
                also_failed.push(format!("rank {} ({}{because})", o.rank, worker::describe(s)));
            } else if !outcome.on_its_own {
                stopped.push(o.rank);
            }
        }
        if !also_failed.is_empty() {
            out += &format!("weft launch: also failed: {}\n", also_failed.join(", "));
        }
        if !stopped.is_empty() {
            out += &format!("weft launch: stopped by the launcher: {}\n", ranks_text(&stopped));
        }
        out
    }
}

/// What is known the moment worker `first` is seen failing, before the error files of the
/// others are in (for the other nodes, which stop their workers meanwhile): `rank 0 on node 0
/// failed (exit code 1)`, or `rank 0 on node 0 failed because of rank 1 (exit code 1)` when its
/// error file says so.
pub(super) fn first_seen(workers: &[Worker], first: usize, node: usize) -> String {
    let w = &workers[first];
    let status = w.status.map(worker::describe).unwrap_or_else(|| "running".into());
    match w.record().and_then(|r| r.caused_by).filter(|&p| p != w.rank) {
        Some(p) => format!("rank {} on node {node} failed because of rank {p} ({status})", w.rank),
        None => format!("rank {} on node {node} failed ({status})", w.rank),
    }
}

/// The root cause among `outcomes`, given that `first` was seen failing first and the others
/// were stopped at `stopped_at` (seconds since the Unix epoch).
///
/// Without any error file: `first`. Otherwise the earliest failure no other rank caused: a
/// record without `caused_by` (written before the stop, if its worker was stopped), or a worker
/// that failed by itself and wrote nothing (killed, say); times are the records' and, for
/// workers without one, when the launcher saw them exit. When every failure here blames
/// another rank, the blame is followed from `first` until it leaves this node or ends.
fn find_cause(outcomes: &[Outcome], first: usize, stopped_at: f64) -> Cause {
    if outcomes.iter().all(|o| o.record.is_none()) {
        return Cause::First(first);
    }
    let root = |o: &Outcome| {
        o.failed
            && o.caused_by().is_none()
            && match &o.record {
                Some(r) => o.on_its_own || r.time <= stopped_at,
                None => o.on_its_own,
            }
    };
    let time = |o: &Outcome| o.record.as_ref().map(|r| r.time).or(o.ended).unwrap_or(f64::INFINITY);
    let earliest = outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| root(o))
        .min_by(|(i, a), (j, b)| time(a).total_cmp(&time(b)).then(i.cmp(j)));
    if let Some((i, _)) = earliest {
        return Cause::Root(i);
    }
    let mut seen = vec![false; outcomes.len()];
    let mut cur = first;
    loop {
        seen[cur] = true;
        let Some(p) = outcomes[cur].caused_by() else {
            return Cause::Root(cur);
        };
        match outcomes.iter().position(|o| o.rank == p) {
            None => return Cause::Elsewhere { rank: p, via: cur },
            // a rank that blames one that did not fail, or blame in a circle: say what was seen
            Some(j) if seen[j] || !outcomes[j].failed => return Cause::First(first),
            Some(j) => cur = j,
        }
    }
}

/// `rank 3` or `ranks 0, 2, 5`.
pub(super) fn ranks_text(ranks: &[usize]) -> String {
    let list: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
    match list.len() {
        1 => format!("rank {}", list[0]),
        _ => format!("ranks {}", list.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed worker of rank `rank` that exited at `ended`, with a record written at `time`
    /// blaming `caused_by` when `time` is given.
    fn failed(rank: usize, ended: f64, time: Option<f64>, caused_by: Option<usize>) -> Outcome {
        Outcome {
            rank,
            failed: true,
            on_its_own: true,
            ended: Some(ended),
            record: time.map(|t| Record {
                rank: Some(rank),
                time: t,
                message: "error".into(),
                caused_by,
            }),
        }
    }

    #[test]
    fn without_error_files_the_first_to_fail_is_named() {
        let o = [failed(0, 1.0, None, None), failed(1, 0.5, None, None)];
        assert_eq!(find_cause(&o, 0, 2.0), Cause::First(0));
    }

    #[test]
    fn a_rank_failed_by_an_abort_is_not_the_cause() {
        // rank 0 exits first, blaming rank 1, which gave up on its own a little later
        let o = [
            failed(0, 1.0, Some(0.9), Some(1)),
            failed(1, 1.1, Some(0.95), None),
            failed(2, 1.1, Some(0.91), Some(1)),
        ];
        assert_eq!(find_cause(&o, 0, 2.0), Cause::Root(1));
        // the earliest of two independent failures
        let o = [failed(0, 1.0, Some(0.9), None), failed(1, 1.1, Some(0.8), None)];
        assert_eq!(find_cause(&o, 0, 2.0), Cause::Root(1));
    }

    #[test]
    fn a_killed_rank_that_wrote_nothing_is_the_cause() {
        let o = [failed(0, 1.0, Some(0.9), Some(1)), failed(1, 0.8, None, None)];
        assert_eq!(find_cause(&o, 0, 2.0), Cause::Root(1));
    }

    #[test]
    fn blame_is_followed_to_a_stopped_rank_and_off_the_node() {
        // rank 1 was stopped by the launcher before it wrote anything
        let mut stopped = failed(1, 2.5, None, None);
        stopped.on_its_own = false;
        let o = [failed(0, 1.0, Some(0.9), Some(1)), stopped];
        assert_eq!(find_cause(&o, 0, 2.0), Cause::Root(1));
        // a record written after the stop (a worker that reports SIGTERM) is not a cause
        let mut late = failed(1, 2.5, Some(2.4), None);
        late.on_its_own = false;
        let o = [failed(0, 1.0, Some(0.9), Some(3)), late];
        assert_eq!(find_cause(&o, 0, 2.0), Cause::Elsewhere { rank: 3, via: 0 });
        // blame in a circle
        let o = [failed(0, 1.0, Some(0.9), Some(1)), failed(1, 1.0, Some(0.9), Some(0))];
        assert_eq!(find_cause(&o, 1, 2.0), Cause::First(1));
    }

    #[test]
    fn rank_lists() {
        assert_eq!(ranks_text(&[1]), "rank 1");
        assert_eq!(ranks_text(&[0, 2]), "ranks 0, 2");
    }
}
