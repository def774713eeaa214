//! Jobs on several nodes that restart together, and may go on with fewer nodes (`--nnodes
//! MIN:MAX`), as torchrun's elastic agent does.
//!
//! The launchers meet in rendezvous rounds on the store node 0's launcher serves (keys
//! `weft/elastic/<round>/...`). In round `k`:
//! - each launcher takes a slot (`joined`, counted up); the round closes once `MAX` nodes have
//!   joined, or `MIN` have and [`LaunchConfig::last_call`] has passed. One launcher closes it
//!   (`closed` = the number of nodes); a launcher whose slot is past it is left out.
//! - node ranks are the slots in order; the round's workers get `WORLD_SIZE = nodes x
//!   nproc_per_node` and `WEFT_RESTART_COUNT = k`.
//! - a launcher whose worker fails writes `failed` (which rank, how) and stops its workers; the
//!   others see it within [`POLL_ELSEWHERE`] and stop theirs. While restarts are left, every
//!   survivor joins round `k + 1`. A node that is gone (its launcher killed) writes nothing, but
//!   its peers' collectives fail, and their launchers report it.
//! - a launcher whose workers all exited 0 sets `done/<node rank>`; node 0's launcher waits for
//!   every node of the round before it stops serving the store. Each member asks the store to
//!   set `gone/<node rank>` when its connection closes, so a node whose launcher died (killed,
//!   its machine rebooted) ends that wait: node 0's launcher says so and exits 1. Each member
//!   also counts up `alive/<node rank>` from a thread of its own ([`Heartbeat`]), so a node that
//!   drops off the network without its connection closing, or whose launcher is stopped, ends
//!   the wait too once it has been silent for [`LaunchConfig::heartbeat_timeout`]. While its own
//!   workers run, node 0's launcher watches the same way ([`Others`]) and fails the round for
//!   every node when one goes away or falls silent, so the survivors restart without it (a
//!   stopped or cut-off node's ranks would hold the others' collectives until
//!   `WEFT_DIST_TIMEOUT`).
//! - a worker that stopped on a SIGTERM or SIGINT sent to it ends the job on this node as on a
//!   single node (`finish_stopping`): no restart, no `failed`.
//!
//! Node 0's launcher must outlive the job: it serves the store.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::error_files::ErrorFiles;
use super::{
    drain_output, finish_stopping, forward_signal, job_env, report, signal_name, signals, start_all, stop,
    stop_after_failure, watch, End, LaunchConfig, EXIT_FAILED, OUTPUT_GRACE,
};
use crate::auth::Token;
use crate::error::{Error, Result};
use crate::store::StoreClient;

/// How often a launcher looks for another node's failure while its workers run.
const POLL_ELSEWHERE: Duration = Duration::from_millis(100);
/// How long a launcher waits for a round to gather `MIN` nodes, and to connect to the store.
const JOIN_TIMEOUT: Duration = Duration::from_secs(600);
/// The longest time between two of a member launcher's heartbeats (torchrun's
/// `keep_alive_interval`).
const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);
/// How often node 0 looks at the other nodes' heartbeats while its workers run.
const HEARTBEAT_LOOK: Duration = Duration::from_secs(1);
/// How long one attempt to connect to the store lasts before the launcher looks at its signals
/// again.
const CONNECT_SLICE: Duration = Duration::from_secs(1);

/// One closed round, as this node sees it.
struct Round {
    nodes: usize,
    node_rank: usize,
}

/// How joining a round ended.
enum Joined {
    Member(Round),
    /// The round closed without this node.
    LeftOut(usize),
    /// The launcher received this signal.
    Signal(i32),
}

fn key(round: u32, what: &str) -> String {
    format!("weft/elastic/{round}/{what}")
}

/// The value of `key` if some launcher set it (asking the store for at most a millisecond).
fn peek(store: &StoreClient, key: &str) -> Result<Option<String>> {
    match store.get(key, Duration::from_millis(1)) {
        Ok(v) => Ok(Some(String::from_utf8_lossy(&v).into_owned())),
        Err(Error::Timeout(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Joins round `round` and waits for it to close.
fn join(store: &StoreClient, cfg: &LaunchConfig, round: u32) -> Result<Joined> {
    let slot = store.add(&key(round, "joined"), 1)? as usize;
    let started = Instant::now();
    let mut enough_since: Option<Instant> = None;
    loop {
        if let Some(sig) = signals::received() {
            return Ok(Joined::Signal(sig));
        }
        if let Some(v) = peek(store, &key(round, "closed"))? {
            let nodes: usize = v
                .parse()
                .map_err(|_| Error::Invalid(format!("rendezvous round {round}: malformed node count {v:?}")))?;
            return Ok(if slot <= nodes {
                Joined::Member(Round {
                    nodes,
                    node_rank: slot - 1,
                })
            } else {
                Joined::LeftOut(nodes)
            });
        }
        let count = store.add(&key(round, "joined"), 0)? as usize;
        if count >= cfg.min_nnodes {
            let since = *enough_since.get_or_insert_with(Instant::now);
            if (count >= cfg.nnodes || since.elapsed() >= cfg.last_call) && store.add(&key(round, "closer"), 1)? == 1 {
                let nodes = (store.add(&key(round, "joined"), 0)? as usize).min(cfg.nnodes);
                store.set(&key(round, "closed"), nodes.to_string().as_bytes())?;
            }
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

/// Connects to the store at `addr`, trying until [`JOIN_TIMEOUT`]; `Ok(Err(sig))` when the
/// launcher received signal `sig` meanwhile.
fn connect(addr: &str, token: &Token) -> Result<std::result::Result<StoreClient, i32>> {
    let started = Instant::now();
    loop {
        if let Some(sig) = signals::received() {
            return Ok(Err(sig));
        }
        match StoreClient::connect(addr, token, CONNECT_SLICE) {
            Ok(store) => return Ok(Ok(store)),
            Err(Error::Timeout(_)) if started.elapsed() < JOIN_TIMEOUT => {}
            Err(Error::Timeout(_)) => {
                return Err(Error::Timeout(format!(
                    "could not connect to the store at {addr} within {} s (is node 0's launcher running, and \
                     --master-addr/--master-port right?)",
                    JOIN_TIMEOUT.as_secs()
                )))
            }
            Err(e) => return Err(e),
        }
    }
}

/// Runs this node's part of an elastic job; the launcher's exit code.
pub(super) fn run(
    cfg: &LaunchConfig,
    token: &Token,
    port: u16,
    serves_store: bool,
    errors: &ErrorFiles,
) -> Result<i32> {
    let host = if serves_store {
        "127.0.0.1"
    } else {
        cfg.master_addr.trim()
    };
    let store = match connect(&crate::addr::host_port(host, port), token)? {
        Ok(store) => Arc::new(store),
        Err(sig) => {
            weft_core::errln!(
                "weft launch: received {} while waiting for the store; not starting the workers",
                signal_name(sig)
            );
            return Ok(128 + sig);
        }
    };
    let mut round = 0u32;
    loop {
        let r = match join(&store, cfg, round)? {
            Joined::Member(r) => r,
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
        };
        // the store tells the others if this launcher goes away before the round ends
        store.set_on_close(&key(round, &format!("gone/{}", r.node_rank)))?;
        // and tells it this launcher is alive until the round ends here
        let _heartbeat = Heartbeat::start(
            store.clone(),
            key(round, &format!("alive/{}", r.node_rank)),
            heartbeat_every(cfg.heartbeat_timeout),
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
        let mut next_look = Instant::now();
        // node 0 also watches the other nodes' launchers: one that went away or fell silent
        // before it was done fails the round for every node (their workers' collectives would
        // notice only after WEFT_DIST_TIMEOUT, and not at all between collectives)
        let mut others = serves_store.then(|| Others::new(round, r.nodes, r.node_rank, cfg.heartbeat_timeout));
        let mut next_heartbeat_look = Instant::now() + HEARTBEAT_LOOK;
        let mut elsewhere = || {
            if Instant::now() < next_look {
                return None;
            }
            next_look = Instant::now() + POLL_ELSEWHERE;
            // a failure some node reported first is the cause (a node whose worker failed
            // writes it, then its launcher may go away before it is looked at)
            if let Some(why) = peek(&store, &key(round, "failed")).ok().flatten() {
                return Some(why);
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
                    return Some(peek(&store, &key(round, "failed")).ok().flatten().unwrap_or(why));
                }
            }
            None
        };
        let mut workers = Vec::with_capacity(node.nproc_per_node);
        let end = match start_all(&node, &env, round, errors, &mut workers, &mut elsewhere)? {
            Some(end) => end,
            None => watch(&mut workers, &mut elsewhere),
        };
        let why = match end {
            End::Done => {
                store.set(&key(round, &format!("done/{}", r.node_rank)), b"1")?;
                stop(&mut workers, libc::SIGTERM, cfg.stop_timeout);
                drain_output(&mut workers, OUTPUT_GRACE);
                if let Some(others) = others {
                    // the silences measured while the workers ran go on counting
                    let lost = wait_for_the_others(&store, round, others);
                    if let Err(lost) = lost {
                        let why = lost.describe(round, cfg.heartbeat_timeout);
                        weft_core::errln!("weft launch: job failed: {why} before its workers finished");
                        return Ok(EXIT_FAILED);
                    }
                    return Ok(0);
                }
                return Ok(0);
            }
            End::Signal(sig) => return Ok(forward_signal(&node, &mut workers, sig)),
            End::Stopped(first) => return Ok(finish_stopping(&node, &mut workers, first)),
            End::Failed(first) => {
                // the other nodes stop their workers while this one stops its own (and then
                // reads the error files, which may name another rank as the cause)
                let first_seen = report::first_seen(&workers, first, r.node_rank);
                store.set(&key(round, "failed"), first_seen.as_bytes())?;
                let failure = stop_after_failure(&node, &mut workers, first);
                if round >= cfg.max_restarts || signals::received().is_some() {
                    weft_core::err!("{}", failure.report(&node, &workers, round));
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

/// How often a member launcher says it is alive, for a heartbeat timeout of `timeout`: a fifth
/// of it, at most [`HEARTBEAT_EVERY`].
fn heartbeat_every(timeout: Duration) -> Duration {
    (timeout / 5).min(HEARTBEAT_EVERY)
}

/// A thread that counts up a key of the store every `every` until dropped: a member launcher
/// telling node 0's that it is alive. It ends on its own when the store cannot be asked (the
/// launcher's next call to the store fails the same way).
struct Heartbeat {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Heartbeat {
    fn start(store: Arc<StoreClient>, key: String, every: Duration) -> Result<Heartbeat> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("weft-heartbeat".into())
            .spawn(move || {
                while !stopping.load(Ordering::SeqCst) && store.add(&key, 1).is_ok() {
                    let next = Instant::now() + every;
                    while !stopping.load(Ordering::SeqCst) && Instant::now() < next {
                        std::thread::sleep(Duration::from_millis(20).min(every));
                    }
                }
            })
            .map_err(|e| crate::error::io("weft launch: cannot start the heartbeat thread", e))?;
        Ok(Heartbeat {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
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
    /// Each node's heartbeat count when it last changed, and when that was.
    heard: Vec<(i64, Instant)>,
}

impl Others {
    fn new(round: u32, nodes: usize, me: usize, timeout: Duration) -> Others {
        Others {
            round,
            me,
            timeout,
            heard: vec![(-1, Instant::now()); nodes],
        }
    }

    /// Looks at every other node once: `Ok(Err(lost))` for the first that went away or fell
    /// silent before it was done, `Ok(Ok(waiting))` otherwise (whether any is not done yet),
    /// `Err(())` when the store cannot be asked.
    fn look(&mut self, store: &StoreClient) -> std::result::Result<std::result::Result<bool, Lost>, ()> {
        let round = self.round;
        let mut waiting = false;
        for node in (0..self.heard.len()).filter(|&n| n != self.me) {
            // gone before done: a node sets done before its connection closes
            let gone = peek(store, &key(round, &format!("gone/{node}")));
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

/// Node 0, its workers done: keeps serving the store until every other node of the round
/// (`others`, with the silences it measured while the workers ran) is done too (or one failed,
/// a signal came, or the store cannot be asked). `Err` names a node that went away or fell
/// silent for the heartbeat timeout before it was done.
fn wait_for_the_others(store: &StoreClient, round: u32, mut others: Others) -> std::result::Result<(), Lost> {
    loop {
        let failed = peek(store, &key(round, "failed"));
        if !matches!(failed, Ok(None)) || signals::received().is_some() {
            return Ok(());
        }
        match others.look(store) {
            Ok(Ok(true)) => {}
            Ok(Err(lost)) => return Err(lost),
            Ok(Ok(false)) | Err(()) => return Ok(()),
        }
        std::thread::sleep(POLL_ELSEWHERE);
    }
}
