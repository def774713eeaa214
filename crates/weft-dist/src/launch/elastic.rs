//! Jobs on several nodes that restart together, and may go on with fewer nodes (`--nnodes
//! MIN:MAX`), as torchrun's elastic agent does.
//!
//! The launchers meet in rendezvous rounds on the store node 0's launcher serves (keys
//! `weft/elastic/<round>/...`). In round `k`:
//! - each launcher takes a slot (`joined`, counted up), and the store marks it `left/<slot>`
//!   (counted in `left/count`) when the launcher's connection closes: both in one request
//!   ([`StoreClient::claim`]), so a launcher killed while it waits for the round to close is not
//!   counted in it. The round closes once `MAX` nodes are there, or `MIN` are and
//!   [`LaunchConfig::last_call`] has passed. The launcher with the lowest slot not left closes
//!   it (`closed` = the slots of its members, at most `MAX`); a launcher whose slot is not among
//!   them is left out.
//! - node ranks are the members' places in `closed`; the round's workers get `WORLD_SIZE =
//!   nodes x nproc_per_node` and `WEFT_RESTART_COUNT = k`.
//! - a launcher whose worker fails writes `failed` (which rank, how) and stops its workers; the
//!   others see it within a tenth of a second ([`Watch`]) and stop theirs. While restarts are
//!   left, every survivor joins round `k + 1`. A node that is gone (its launcher killed) writes nothing, but
//!   its peers' collectives fail, and their launchers report it.
//! - a launcher whose workers all exited 0 sets `done/<node rank>`; node 0's launcher waits for
//!   every node of the round before it stops serving the store (a failure that another node
//!   reports meanwhile sends it to the next round with the others, or ends the job, as while its
//!   workers ran; a signal ends it with 128 + the signal). The store marks a member's slot
//!   `left/<slot>` when its connection closes, so a node whose launcher died (killed, its
//!   machine rebooted) ends that wait: node 0's launcher says so and exits 1. Each member
//!   also counts up `alive/<node rank>` from a thread of its own ([`Watch`]), so a node that
//!   drops off the network without its connection closing, or whose launcher is stopped, ends
//!   the wait too once it has been silent for [`LaunchConfig::heartbeat_timeout`]. While its own
//!   workers run, node 0's launcher watches the same way ([`Others`]) and fails the round for
//!   every node when one goes away or falls silent, so the survivors restart without it (a
//!   stopped or cut-off node's ranks would hold the others' collectives until
//!   `WEFT_DIST_TIMEOUT`).
//! - the other launchers watch node 0's in turn, through the same thread: when their store's
//!   connection closes, or the store has not answered for the heartbeat timeout (their requests
//!   wait no longer than that for an answer either), node 0's launcher is lost, and with it the
//!   store: they stop their workers and exit 1, naming it.
//! - before the first round, each launcher checks its settings against node 0's
//!   (`meet::check_settings`); one given another `--nproc-per-node` or `--nnodes` (or
//!   `--max-restarts 0` where node 0's has more) fails the job on every node
//!   (`weft/launch/fatal`, which every launcher watches), with no restart.
//! - a worker that stopped on a SIGTERM or SIGINT sent to it ends the job on this node as on a
//!   single node (`finish_stopping`): no restart, no `failed`.
//! - node 0's launcher checks that the store at `--master-addr` is its own (`launch::master`)
//!   while it waits for a round to close, and while the workers of a round it is alone in run
//!   (`--nnodes 1:MAX`): one started with `--node-rank 0` on another host fails as soon as
//!   another store answers there. A round with another node in it shows the store is the
//!   job's: the check stops.
//!
//! Node 0's launcher must outlive the job: it serves the store.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error_files::ErrorFiles;
use super::master::Check;
use super::meet::{
    check_master, check_settings, connect, node_0_lost, nodes_text, not_the_master, store_addr, JOIN_TIMEOUT,
};
use super::watch::{linger, peek, Watch, FATAL, LOOK_EVERY};
use super::{
    drain_output, fail_for_good, finish_stopping, forward_signal, job_env, report, signal_name, signals, start_all,
    stop, stop_after_failure, watch_workers, End, LaunchConfig, EXIT_FAILED, OUTPUT_GRACE,
};
use crate::auth::Token;
use crate::error::{Error, Result};
use crate::store::StoreClient;

/// The longest time between two of a member launcher's heartbeats (torchrun's
/// `keep_alive_interval`).
const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);
/// How often node 0 looks at the other nodes' heartbeats while its workers run.
const HEARTBEAT_LOOK: Duration = Duration::from_secs(1);

/// One closed round, as this node sees it.
struct Round {
    nodes: usize,
    node_rank: usize,
    /// Each member's slot, by node rank.
    slots: Vec<usize>,
}

/// How joining a round ended.
enum Joined {
    Member(Round),
    /// The round closed without this node.
    LeftOut(usize),
    /// The job fails on every node for this reason ([`FATAL`]).
    Fatal(String),
    /// Another store answered at `--master-addr` (node 0's launcher; [`Check::other`]).
    NotTheMaster(String),
    /// The launcher received this signal.
    Signal(i32),
}

fn key(round: u32, what: &str) -> String {
    format!("weft/elastic/{round}/{what}")
}

/// The key the store sets when the launcher that took `slot` in round `round` is gone.
fn left(round: u32, slot: usize) -> String {
    key(round, &format!("left/{slot}"))
}

/// The members of a closed round (`closed`: their slots, in node-rank order).
fn members(round: u32, closed: &str) -> Result<Vec<usize>> {
    let slots: Option<Vec<usize>> = closed.split(' ').map(|s| s.parse().ok()).collect();
    match slots {
        Some(slots) if !slots.is_empty() => Ok(slots),
        _ => Err(Error::Invalid(format!(
            "rendezvous round {round}: malformed members {closed:?} (run the same weft on every node)"
        ))),
    }
}

/// Closes round `round` if this launcher, in `slot`, holds the lowest slot not left and at least
/// MIN launchers are there (of the first MAX); true when it did. Only one launcher is the lowest
/// there: a lower one counts as gone only once its connection closed, after what it sent (a
/// `closed` too) was done.
fn close(store: &StoreClient, cfg: &LaunchConfig, round: u32, slot: usize) -> Result<bool> {
    for lower in 1..slot {
        if peek(store, &left(round, lower))?.is_none() {
            return Ok(false);
        }
    }
    if peek(store, &key(round, "closed"))?.is_some() {
        return Ok(false);
    }
    let joined = store.add(&key(round, "joined"), 0)?.max(0) as usize;
    let mut slots = Vec::new();
    for s in slot..=joined {
        if slots.len() < cfg.nnodes && (s == slot || peek(store, &left(round, s))?.is_none()) {
            slots.push(s.to_string());
        }
    }
    if slots.len() < cfg.min_nnodes {
        return Ok(false);
    }
    store.set(&key(round, "closed"), slots.join(" ").as_bytes())?;
    Ok(true)
}

/// Joins round `round` and waits for it to close; `master` checks the store at `--master-addr`
/// meanwhile (node 0's launcher).
fn join(store: &StoreClient, cfg: &LaunchConfig, round: u32, master: Option<&Check>) -> Result<Joined> {
    // the slot and what tells the others it is gone, in one request
    let slot = store.claim(&key(round, "joined"), &key(round, "left/"))? as usize;
    let started = Instant::now();
    let mut enough_since: Option<Instant> = None;
    loop {
        if let Some(sig) = signals::received() {
            return Ok(Joined::Signal(sig));
        }
        if let Some(why) = master.and_then(Check::other) {
            return Ok(Joined::NotTheMaster(why));
        }
        if let Some(why) = peek(store, FATAL)? {
            return Ok(Joined::Fatal(why));
        }
        if let Some(v) = peek(store, &key(round, "closed"))? {
            let slots = members(round, &v)?;
            return Ok(match slots.iter().position(|&s| s == slot) {
                Some(node_rank) => Joined::Member(Round {
                    nodes: slots.len(),
                    node_rank,
                    slots,
                }),
                None => Joined::LeftOut(slots.len()),
            });
        }
        // the launchers there now: those that joined, less those gone since
        let joined = store.add(&key(round, "joined"), 0)?;
        let count = (joined - store.add(&key(round, "left/count"), 0)?).max(0) as usize;
        if count >= cfg.min_nnodes {
            let since = *enough_since.get_or_insert_with(Instant::now);
            if (count >= cfg.nnodes || since.elapsed() >= cfg.last_call) && close(store, cfg, round, slot)? {
                continue;
            }
        } else {
            enough_since = None;
        }
        if started.elapsed() > JOIN_TIMEOUT {
            return Err(Error::Timeout(format!(
                "rendezvous round {round}: {count} node(s) joined within {} s, fewer than --nnodes {}:{} needs",
                JOIN_TIMEOUT.as_secs(),
                cfg.min_nnodes,
                cfg.nnodes
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs this node's part of an elastic job; the launcher's exit code.
pub(super) fn run(
    cfg: &LaunchConfig,
    token: &Token,
    port: u16,
    own: Option<SocketAddr>,
    errors: &ErrorFiles,
) -> Result<i32> {
    let serves_store = own.is_some();
    let addr = store_addr(cfg, port, own);
    let store = match connect(&addr, token)? {
        // the other nodes wait for node 0's store no longer than the heartbeat timeout: its
        // silence means node 0's launcher is lost
        Ok(store) if !serves_store => Arc::new(store.with_reply_timeout(cfg.heartbeat_timeout)),
        Ok(store) => Arc::new(store),
        Err(sig) => {
            weft_core::errln!(
                "weft launch: received {} while waiting for the store; not starting the workers",
                signal_name(sig)
            );
            return Ok(128 + sig);
        }
    };
    let lost = |e| node_0_lost(serves_store, e);
    // dropped (the check stopped) once a round has another node in it: this store is the job's
    let mut master = check_master(&store, cfg, token, port, serves_store)?;
    if let Some(why) = check_settings(&store, cfg, serves_store)? {
        weft_core::errln!("weft launch: job failed: {why}");
        return Ok(EXIT_FAILED);
    }
    let mut round = 0u32;
    loop {
        let r = match join(&store, cfg, round, master.as_ref()).map_err(lost)? {
            Joined::Member(r) => r,
            Joined::NotTheMaster(why) => {
                not_the_master(&store, &why);
                return Ok(EXIT_FAILED);
            }
            Joined::Signal(sig) => {
                weft_core::errln!("weft launch: received {}; not starting the workers", signal_name(sig));
                return Ok(128 + sig);
            }
            Joined::LeftOut(nodes) => {
                weft_core::errln!(
                    "weft launch: rendezvous round {round} closed with {nodes} node(s) before this one joined; the \
                     job goes on without it"
                );
                return Ok(EXIT_FAILED);
            }
            Joined::Fatal(why) => {
                weft_core::errln!("weft launch: job failed: {why}");
                linger(serves_store);
                return Ok(EXIT_FAILED);
            }
        };
        if r.nodes > 1 {
            master = None;
        }
        // (the store tells the others if this launcher goes away before the round ends: it
        // marks its slot left, as asked when it joined)
        // a thread tells it this launcher is alive until the round ends here, and looks for
        // what the others say (and, on the other nodes, whether node 0's launcher still answers)
        let watch = Watch::start(
            store.clone(),
            Some(key(round, "failed")),
            Some((
                key(round, &format!("alive/{}", r.node_rank)),
                heartbeat_every(cfg.heartbeat_timeout),
            )),
        )?;
        weft_core::errln!(
            "weft launch: rendezvous round {round}: {} node(s), this is node {} (ranks {} to {})",
            r.nodes,
            r.node_rank,
            r.node_rank * cfg.nproc_per_node,
            (r.node_rank + 1) * cfg.nproc_per_node - 1
        );
        let node = LaunchConfig {
            nnodes: r.nodes,
            min_nnodes: r.nodes,
            node_rank: r.node_rank,
            ..cfg.clone()
        };
        let env = job_env(&node, port, token);
        // node 0 also watches the other nodes' launchers: one that went away or fell silent
        // before it was done fails the round for every node (their workers' collectives would
        // notice only after WEFT_DIST_TIMEOUT, and not at all between collectives)
        let mut others = serves_store.then(|| Others::new(round, r.slots.clone(), r.node_rank, cfg.heartbeat_timeout));
        let mut next_heartbeat_look = Instant::now() + HEARTBEAT_LOOK;
        let mut elsewhere = || {
            if let Some(why) = watch.fatal() {
                return Some(End::Fatal(why));
            }
            // a failure some node reported first is the cause (a node whose worker failed
            // writes it, then its launcher may go away before it is looked at)
            if let Some(why) = watch.failed() {
                return Some(End::Elsewhere(why));
            }
            // node 0 alone in the round: another store at --master-addr ends the job here
            if let Some(why) = master.as_ref().and_then(Check::other) {
                return Some(End::Fatal(why));
            }
            if !serves_store {
                return node_0_silent(&watch, &addr, cfg.heartbeat_timeout).map(End::Fatal);
            }
            if let Some(others) = others.as_mut().filter(|_| Instant::now() >= next_heartbeat_look) {
                next_heartbeat_look = Instant::now() + HEARTBEAT_LOOK;
                if let Ok(Err(lost)) = others.look(&store) {
                    let why = lost.describe(round, cfg.heartbeat_timeout);
                    // the other nodes stop their workers too (if the store cannot take it,
                    // their workers' collectives fail on the lost node's ranks); a cause
                    // written meanwhile stays
                    if store.add(&key(round, "failed-by"), 1).is_ok_and(|n| n == 1) {
                        let _ = store.set(&key(round, "failed"), why.as_bytes());
                    }
                    let why = peek(&store, &key(round, "failed")).ok().flatten().unwrap_or(why);
                    return Some(End::Elsewhere(why));
                }
            }
            None
        };
        let mut workers = Vec::with_capacity(node.nproc_per_node);
        let mut end = match start_all(&node, &env, round, errors, &mut workers, &mut elsewhere)? {
            Some(end) => end,
            None => watch_workers(&mut workers, &mut elsewhere),
        };
        if let End::Done = end {
            store
                .set(&key(round, &format!("done/{}", r.node_rank)), b"1")
                .map_err(lost)?;
            stop(&mut workers, libc::SIGTERM, cfg.stop_timeout);
            drain_output(&mut workers, OUTPUT_GRACE);
            let Some(others) = others else {
                return Ok(0);
            };
            // the silences measured while the workers ran go on counting
            match wait_for_the_others(&store, round, others) {
                Waited::AllDone => return Ok(0),
                Waited::Lost(why) => {
                    weft_core::errln!("weft launch: job failed: {why}");
                    linger(serves_store);
                    return Ok(EXIT_FAILED);
                }
                Waited::Signal(sig) => {
                    weft_core::errln!(
                        "weft launch: received {} while waiting for the other nodes' workers to finish (this node's \
                         are done); no longer serving the store",
                        signal_name(sig)
                    );
                    return Ok(128 + sig);
                }
                // as when another node's worker fails while this node's run: the next round, if
                // restarts remain
                Waited::Failed(why) => end = End::Elsewhere(why),
            }
        }
        let why = match end {
            End::Done => unreachable!("handled above"),
            End::Signal(sig) => return Ok(forward_signal(&node, &mut workers, sig)),
            End::Stopped(first) => return Ok(finish_stopping(&node, &mut workers, first)),
            End::Fatal(why) => return Ok(fail_for_good(&node, &mut workers, &why, serves_store)),
            End::Failed(first) => {
                // the other nodes stop their workers while this one stops its own (and then
                // reads the error files, which may name another rank as the cause)
                let first_seen = report::first_seen(&workers, first, r.node_rank);
                let told = store.set(&key(round, "failed"), first_seen.as_bytes()).map_err(lost);
                let failure = stop_after_failure(&node, &mut workers, first);
                if told.is_err() || round >= cfg.max_restarts || signals::received().is_some() {
                    weft_core::err!("{}", failure.report(&node, &workers, round));
                    // node 0's launcher lost: no round can follow
                    told?;
                    // (the others read `failed` before node 0's store goes)
                    linger(serves_store);
                    return Ok(signals::received().map_or(EXIT_FAILED, |sig| 128 + sig));
                }
                failure.summary(&workers, Some(r.node_rank))
            }
            End::Elsewhere(why) => {
                stop(&mut workers, libc::SIGTERM, cfg.stop_timeout);
                drain_output(&mut workers, OUTPUT_GRACE);
                if round >= cfg.max_restarts {
                    weft_core::errln!(
                        "weft launch: job failed: {why}; no restarts left (--max-restarts {})",
                        cfg.max_restarts
                    );
                    linger(serves_store);
                    return Ok(EXIT_FAILED);
                }
                why
            }
        };
        round += 1;
        weft_core::errln!(
            "weft launch: {why}; restarting all workers: rendezvous round {round}, attempt {} of {} \
             (WEFT_RESTART_COUNT={round})",
            round + 1,
            cfg.max_restarts + 1
        );
    }
}

/// On a node other than node 0: why node 0's launcher counts as lost, if it does (the store's
/// connection closed, or the store has not answered for `timeout`).
fn node_0_silent(watch: &Watch, addr: &str, timeout: Duration) -> Option<String> {
    let (quiet, broken) = watch.store();
    if let Some(e) = broken {
        return Some(format!(
            "lost the launcher with --node-rank 0, which serves the store: {e}"
        ));
    }
    (quiet >= timeout).then(|| {
        format!(
            "the launcher with --node-rank 0, which serves the store at {addr}, has not answered for {} s \
             (--rdzv-heartbeat-timeout; it was stopped, or its node dropped off the network)",
            timeout.as_secs_f64()
        )
    })
}

/// How often a member launcher says it is alive, for a heartbeat timeout of `timeout`: a fifth
/// of it, at most [`HEARTBEAT_EVERY`].
fn heartbeat_every(timeout: Duration) -> Duration {
    (timeout / 5).min(HEARTBEAT_EVERY)
}

/// Why node 0 counts a node that was not done as lost.
enum Lost {
    /// Its launcher's connection to the store closed.
    Closed(usize),
    /// Its heartbeat stopped for the heartbeat timeout.
    Silent(usize),
}

impl Lost {
    /// `node N of rendezvous round R went away (...)`, or `has not been heard from for ...`.
    fn describe(&self, round: u32, timeout: Duration) -> String {
        match self {
            Lost::Closed(node) => format!(
                "node {node} of rendezvous round {round} went away (its launcher's connection to the store closed)"
            ),
            Lost::Silent(node) => format!(
                "node {node} of rendezvous round {round} has not been heard from for {} s (its launcher says it is \
                 alive every {} s; the node dropped off the network, or its launcher was stopped)",
                timeout.as_secs_f64(),
                heartbeat_every(timeout).as_secs_f64()
            ),
        }
    }
}

/// Node 0's watch over the other nodes of a round: which are done, which went away or fell
/// silent before they were done.
struct Others {
    round: u32,
    me: usize,
    timeout: Duration,
    /// Each node's slot in the round (which the store marks left when its launcher is gone).
    slots: Vec<usize>,
    /// Each node's heartbeat count when it last changed, and when that was.
    heard: Vec<(i64, Instant)>,
}

impl Others {
    fn new(round: u32, slots: Vec<usize>, me: usize, timeout: Duration) -> Others {
        Others {
            round,
            me,
            timeout,
            heard: vec![(-1, Instant::now()); slots.len()],
            slots,
        }
    }

    /// The other nodes whose workers are done (their launchers have left: only node 0's waits).
    fn finished(&self, store: &StoreClient) -> Vec<usize> {
        (0..self.heard.len())
            .filter(|&n| n != self.me)
            .filter(|&n| matches!(peek(store, &key(self.round, &format!("done/{n}"))), Ok(Some(_))))
            .collect()
    }

    /// Looks at every other node once: `Ok(Err(lost))` for the first that went away or fell
    /// silent before it was done, `Ok(Ok(waiting))` otherwise (whether any is not done yet),
    /// `Err(())` when the store cannot be asked.
    fn look(&mut self, store: &StoreClient) -> std::result::Result<std::result::Result<bool, Lost>, ()> {
        let round = self.round;
        let mut waiting = false;
        for node in (0..self.heard.len()).filter(|&n| n != self.me) {
            // gone before done: a node sets done before its connection closes
            let gone = peek(store, &left(round, self.slots[node]));
            let done = peek(store, &key(round, &format!("done/{node}")));
            match (gone, done) {
                (_, Ok(Some(_))) => {}
                (Ok(Some(_)), Ok(None)) => return Ok(Err(Lost::Closed(node))),
                (Ok(None), Ok(None)) => {
                    let beats = store.add(&key(round, &format!("alive/{node}")), 0).map_err(|_| ())?;
                    let (last, since) = &mut self.heard[node];
                    if beats != *last {
                        (*last, *since) = (beats, Instant::now());
                    } else if since.elapsed() >= self.timeout {
                        return Ok(Err(Lost::Silent(node)));
                    }
                    waiting = true;
                }
                _ => return Err(()),
            }
        }
        Ok(Ok(waiting))
    }
}

/// How node 0's wait for the other nodes of a round ended ([`wait_for_the_others`]).
enum Waited {
    /// Every other node's workers are done.
    AllDone,
    /// The job failed: a node went away or fell silent before it was done, the job's failure on
    /// every node ([`FATAL`]), or the store could not be asked.
    Lost(String),
    /// Another node reported a failure of the round (`failed`).
    Failed(String),
    /// The launcher received this signal.
    Signal(i32),
}

/// Node 0, its workers done: keeps serving the store until every other node of the round
/// (`others`, with the silences it measured while the workers ran) is done too, or the round
/// or the job fails, or a signal comes.
fn wait_for_the_others(store: &StoreClient, round: u32, mut others: Others) -> Waited {
    let unasked = |e: Error| {
        Waited::Lost(format!(
            "the store could not be asked whether the other nodes are done: {e}"
        ))
    };
    loop {
        if let Some(sig) = signals::received() {
            return Waited::Signal(sig);
        }
        match peek(store, FATAL) {
            Ok(Some(why)) => return Waited::Lost(why),
            Ok(None) => {}
            Err(e) => return unasked(e),
        }
        match peek(store, &key(round, "failed")) {
            // a node that finished has left, and no round can have it: the job ends here
            // (with a fixed --nnodes the next round could never fill)
            Ok(Some(why)) => {
                let finished = others.finished(store);
                return match finished.as_slice() {
                    [] => Waited::Failed(why),
                    nodes => Waited::Lost(format!(
                        "{why}; no round can follow: {} finished and left",
                        nodes_text(nodes)
                    )),
                };
            }
            Ok(None) => {}
            Err(e) => return unasked(e),
        }
        match others.look(store) {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => return Waited::AllDone,
            Ok(Err(lost)) => {
                return Waited::Lost(format!(
                    "{} before its workers finished",
                    lost.describe(round, others.timeout)
                ))
            }
            Err(()) => {
                return Waited::Lost("the store could not be asked whether the other nodes are done".to_string())
            }
        }
        std::thread::sleep(LOOK_EVERY);
    }
}
