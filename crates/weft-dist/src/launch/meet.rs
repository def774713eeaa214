//! How the launchers of a job on several nodes meet on the store that node 0's launcher serves,
//! before they start their workers (as torchrun's agents do):
//! - node 0's launcher publishes its settings ([`SETTINGS`]: `--nproc-per-node`, `--nnodes` and
//!   `--max-restarts`, which decides whether the launchers meet in rendezvous rounds);
//!   every other launcher compares its own with them, and one given others fails the job on
//!   every node ([`FATAL`]) with one message naming both values. Its workers would get another
//!   `WORLD_SIZE` than node 0's, and node 0's would wait for ranks that never come.
//! - without rendezvous rounds (`launch::elastic`), each launcher claims its `--node-rank`
//!   (a second launcher given the same one fails the job the same way: the two would start ranks
//!   with the same numbers) and waits until every node's launcher has come ([`meet`]), so node
//!   0's launcher, which serves the store, cannot be done and gone before another node's
//!   launcher reached it.
//! - node 0's launcher checks meanwhile that the store at `--master-addr`, where the others
//!   connect, is its own (`launch::master`): one started with `--node-rank 0` on another host
//!   fails as soon as another store answers there, rather than wait for nodes that never come.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::master::{own_addr, Check};
use super::watch::{linger, peek, set_fatal, Watch, FATAL};
use super::{signal_name, signals, LaunchConfig};
use crate::auth::Token;
use crate::error::{Error, Result};
use crate::store::StoreClient;

/// Node 0's launcher's settings: `<nproc-per-node> <min nnodes>:<max nnodes> <max restarts>`.
/// (`/2`: launchers before the atomic claims of [`StoreClient::claim`] read `weft/launch/settings`
/// and meet by other keys; they wait for this one in vain and say to run the same weft everywhere.)
const SETTINGS: &str = "weft/launch/settings/2";
/// How long another launcher waits for node 0's to publish its settings (it does so right after
/// it starts the store).
const SETTINGS_WAIT: Duration = Duration::from_secs(10);
/// Claimed ([`StoreClient::claim`]) by each launcher that claimed its node rank and checked its
/// settings, without rendezvous rounds; `{ARRIVED}/left/count` counts those whose connection
/// closed since (gone while they waited: their node ranks are free again).
const ARRIVED: &str = "weft/launch/arrived";
/// Set by the first launcher that sees every node's launcher there: the others then go too,
/// even once some of those have gone again (done with their workers).
const ALL_THERE: &str = "weft/launch/all-there";
/// Counted up by each launcher once it has seen [`ALL_THERE`] (node 0's waits for all of them
/// before starting its workers).
const WENT: &str = "weft/launch/went";
/// How long a launcher waits for the others to come, and to connect to the store.
pub(super) const JOIN_TIMEOUT: Duration = Duration::from_secs(600);
/// How long one attempt to connect to the store lasts before the launcher looks at its signals
/// again.
const CONNECT_SLICE: Duration = Duration::from_secs(1);

/// Connects to the store at `addr`, trying until [`JOIN_TIMEOUT`]; `Ok(Err(sig))` when the
/// launcher received signal `sig` meanwhile.
pub(super) fn connect(addr: &str, token: &Token) -> Result<std::result::Result<StoreClient, i32>> {
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

/// The store's address as this launcher reaches it: node 0's launcher (its store listening at
/// `own`) its own store on loopback, or where it listens ([`own_addr`]); the others at
/// `--master-addr`.
pub(super) fn store_addr(cfg: &LaunchConfig, port: u16, own: Option<SocketAddr>) -> String {
    match own {
        Some(bound) => own_addr(bound),
        None => crate::addr::host_port(cfg.master_addr.trim(), port),
    }
}

/// Node 0's launcher: marks its store (`store`, a client of it) and starts checking that the
/// store at `--master-addr` is this one ([`Check`]); None on the other nodes.
pub(super) fn check_master(
    store: &StoreClient,
    cfg: &LaunchConfig,
    token: &Token,
    port: u16,
    serves_store: bool,
) -> Result<Option<Check>> {
    if !serves_store {
        return Ok(None);
    }
    Check::start(store, cfg, token, port).map(Some)
}

/// Node 0's launcher, once another store answered at `--master-addr` ([`Check::other`]): says
/// `why` in one line, and fails the job in its own store too (for a launcher that reached this
/// one by another address), keeping it a moment for them to read.
pub(super) fn not_the_master(store: &StoreClient, why: &str) {
    weft_core::errln!("weft launch: {why}");
    let _ = set_fatal(store, why);
    linger(true);
}

/// An error of this launcher's store, which node 0's launcher serves, said as losing that
/// launcher (on node 0 itself, `e` as it is).
pub(super) fn node_0_lost(serves_store: bool, e: Error) -> Error {
    match e {
        Error::Io(m) if !serves_store => Error::Io(format!(
            "lost the launcher with --node-rank 0, which serves the store: {m}"
        )),
        e => e,
    }
}

fn settings(cfg: &LaunchConfig) -> String {
    format!(
        "{} {}:{} {}",
        cfg.nproc_per_node, cfg.min_nnodes, cfg.nnodes, cfg.max_restarts
    )
}

/// `--nnodes` as it was given: `N`, or `MIN:MAX`.
fn nnodes_text(min: &str, max: &str) -> String {
    if min == max {
        max.to_string()
    } else {
        format!("{min}:{max}")
    }
}

/// Node 0's launcher publishes its settings; another compares its own with them. `Ok(Some(why))`
/// when they differ: the job then fails on every node ([`FATAL`] is set). A store call that
/// fails is said as losing node 0's launcher ([`node_0_lost`]); settings not published in time,
/// or not readable, are said as they are (node 0 runs another weft: nothing was lost).
pub(super) fn check_settings(store: &StoreClient, cfg: &LaunchConfig, serves_store: bool) -> Result<Option<String>> {
    let lost = |e| node_0_lost(serves_store, e);
    if serves_store {
        store.set(SETTINGS, settings(cfg).as_bytes()).map_err(lost)?;
        return Ok(None);
    }
    let theirs = match store.get(SETTINGS, SETTINGS_WAIT) {
        Ok(v) => String::from_utf8_lossy(&v).into_owned(),
        Err(Error::Timeout(_)) => {
            return Err(Error::Io(format!(
                "the launcher with --node-rank 0 did not publish its settings in the store within {} s (run the \
                 same weft on every node)",
                SETTINGS_WAIT.as_secs()
            )))
        }
        Err(e) => return Err(lost(e)),
    };
    let parts = |s: &str| -> Option<(String, String, String)> {
        let mut words = s.split(' ');
        let (nproc, nodes, restarts) = (words.next()?, words.next()?, words.next()?);
        let (min, max) = nodes.split_once(':')?;
        Some((nproc.into(), nnodes_text(min, max), restarts.into()))
    };
    let (Some(t), Some(m)) = (parts(&theirs), parts(&settings(cfg))) else {
        return Err(Error::Io(format!(
            "the launcher with --node-rank 0 published malformed settings {theirs:?} (run the same weft on every node)"
        )));
    };
    // --max-restarts decides whether the launchers meet in rendezvous rounds (with a fixed
    // --nnodes): 0 on one node and more on another would leave each waiting for the other
    let rounds = |s: &(String, String, String)| s.1.contains(':') || s.2 != "0";
    let (flag, this, node_0, need) = if t.0 != m.0 {
        ("--nproc-per-node", m.0, t.0, "the same --nproc-per-node")
    } else if t.1 != m.1 {
        ("--nnodes", m.1, t.1, "the same --nnodes")
    } else if rounds(&t) != rounds(&m) {
        (
            "--max-restarts",
            m.2,
            t.2,
            "--max-restarts 0, or every node one above 0",
        )
    } else {
        return Ok(None);
    };
    let why = format!(
        "the launcher with --node-rank {} (at {}) was given {flag} {this}, but node 0's launcher {flag} {node_0}: \
         every node of a job must be given {need}",
        cfg.node_rank,
        store.local_ip()
    );
    set_fatal(store, &why).map_err(lost)?;
    Ok(Some(why))
}

/// How meeting the other launchers ended.
pub(super) enum Met {
    /// Every node's launcher came with the same settings: start the workers. The watch says
    /// when the job fails elsewhere for good ([`FATAL`]).
    Go(Watch),
    /// The job failed (said on stderr).
    Failed,
    /// The launcher received this signal (said on stderr).
    Signal(i32),
}

/// Without rendezvous rounds: claims this node's rank, checks the settings, and waits until the
/// launchers of all `--nnodes` nodes have come.
pub(super) fn meet(cfg: &LaunchConfig, token: &Token, port: u16, own: Option<SocketAddr>) -> Result<Met> {
    let serves_store = own.is_some();
    let addr = store_addr(cfg, port, own);
    let store = match connect(&addr, token)? {
        Ok(store) => Arc::new(store),
        Err(sig) => {
            weft_core::errln!(
                "weft launch: received {} while waiting for the store; not starting the workers",
                signal_name(sig)
            );
            return Ok(Met::Signal(sig));
        }
    };
    let lost = |e| node_0_lost(serves_store, e);
    let failed = |why: String| {
        weft_core::errln!("weft launch: job failed: {why}");
        Ok(Met::Failed)
    };
    // dropped (the check stopped) once every node's launcher came here: this store is the job's
    let master = check_master(&store, cfg, token, port, serves_store)?;
    let me = cfg.node_rank;
    // a launcher that claimed the rank before and is gone (stopped while it waited here, to be
    // started again) leaves it to the next; the claim and what marks it left are one request,
    // so a launcher killed at any moment never holds the rank for good
    let n = store.claim(&claim(me), &left_prefix(me)).map_err(lost)?;
    // a launcher that just exited may not be marked yet (the store handles its closed
    // connection on a thread of its own): an unmarked claim is a second launcher only when it
    // stays unmarked for a moment
    let unmarked = |store: &StoreClient| -> Result<Option<i64>> {
        for k in 1..n {
            if peek(store, &left(me, k)).map_err(lost)?.is_none() {
                return Ok(Some(k));
            }
        }
        Ok(None)
    };
    let mut before = unmarked(&store)?;
    let grace = Instant::now() + Duration::from_secs(2);
    while before.is_some() && Instant::now() < grace {
        std::thread::sleep(Duration::from_millis(50));
        before = unmarked(&store)?;
    }
    if before.is_some() {
        let why = format!(
            "two launchers were given --node-rank {me} (the second at {}): every node of a job needs its own \
             --node-rank, 0 to {}",
            store.local_ip(),
            cfg.nnodes - 1
        );
        set_fatal(&store, &why).map_err(lost)?;
        return failed(why);
    }
    if let Some(why) = check_settings(&store, cfg, serves_store)? {
        return failed(why);
    }
    // counted while this launcher is here: one that goes away while it waits is taken back
    // (its node rank is free for the next launcher given it)
    store.claim(ARRIVED, &format!("{ARRIVED}/left/")).map_err(lost)?;
    let started = Instant::now();
    loop {
        if let Some(sig) = signals::received() {
            weft_core::errln!(
                "weft launch: received {} while waiting for the other nodes; not starting the workers",
                signal_name(sig)
            );
            return Ok(Met::Signal(sig));
        }
        if let Some(why) = master.as_ref().and_then(Check::other) {
            not_the_master(&store, &why);
            return Ok(Met::Failed);
        }
        if let Some(why) = peek(&store, FATAL).map_err(lost)? {
            linger(serves_store);
            return failed(why);
        }
        if peek(&store, ALL_THERE).map_err(lost)?.is_some() || all_there(&store, cfg.nnodes).map_err(lost)? {
            store.set(ALL_THERE, b"1").map_err(lost)?;
            // node 0's launcher serves the store: it starts its workers (which may end at
            // once, and it with them) only once every launcher has seen that all are there,
            // or a launcher still polling lost the store (bounded: one that died meanwhile
            // is noticed by the others' workers)
            let went = store.add(WENT, 1).map_err(lost)?;
            if serves_store && went < cfg.nnodes as i64 {
                let until = Instant::now() + Duration::from_secs(10);
                while store.add(WENT, 0).map_err(lost)? < cfg.nnodes as i64 && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            return Ok(Met::Go(Watch::start(store, None, None)?));
        }
        if started.elapsed() > JOIN_TIMEOUT {
            let mut missing = Vec::new();
            for node in 0..cfg.nnodes {
                // never claimed, or its last claimant went away
                let n = store.add(&claim(node), 0).map_err(lost)?;
                if n == 0 || peek(&store, &left(node, n)).map_err(lost)?.is_some() {
                    missing.push(node);
                }
            }
            return Err(Error::Timeout(format!(
                "the launchers of {} did not come within {} s (is every node started, with the same \
                 --master-addr, --master-port and WEFT_JOB_TOKEN?)",
                nodes_text(&missing),
                JOIN_TIMEOUT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The key a launcher counts up to claim node rank `node`.
fn claim(node: usize) -> String {
    format!("weft/launch/node/{node}")
}

/// Set by the store when the connection of the `n`th launcher that claimed node rank `node`
/// closes.
fn left(node: usize, n: i64) -> String {
    format!("{}{n}", left_prefix(node))
}

fn left_prefix(node: usize) -> String {
    format!("weft/launch/node/{node}/left/")
}

/// Whether the launchers of all `nnodes` nodes are here now: arrived, and not gone since.
fn all_there(store: &StoreClient, nnodes: usize) -> Result<bool> {
    let arrived = store.add(ARRIVED, 0)?;
    let gone = store.add(&format!("{ARRIVED}/left/count"), 0)?;
    Ok(arrived - gone >= nnodes as i64)
}

/// `node 3`, `nodes 1, 2 and 3`, or the first 8 and how many more.
pub(super) fn nodes_text(nodes: &[usize]) -> String {
    let shown: Vec<String> = nodes.iter().take(8).map(|n| n.to_string()).collect();
    match nodes.len() {
        0 => "some nodes".into(),
        1 => format!("node {}", shown[0]),
        n if n > 8 => format!("nodes {} and {} more", shown.join(", "), n - 8),
        _ => {
            let last = shown.last().cloned().unwrap_or_default();
            format!("nodes {} and {last}", shown[..shown.len() - 1].join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_nodes_are_named_in_one_short_line() {
        assert_eq!(nodes_text(&[]), "some nodes");
        assert_eq!(nodes_text(&[3]), "node 3");
        assert_eq!(nodes_text(&[1, 2, 3]), "nodes 1, 2 and 3");
        let many: Vec<usize> = (1..100).collect();
        assert_eq!(nodes_text(&many), "nodes 1, 2, 3, 4, 5, 6, 7, 8 and 91 more");
    }
}
