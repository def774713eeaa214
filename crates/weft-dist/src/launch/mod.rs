//! Starting and watching the workers of a job (`weft launch`), with torchrun's semantics.
//!
//! The launcher of each node starts `nproc_per_node` workers (global rank = node rank x
//! nproc_per_node + local rank), each with the variables [`crate::env`] reads (`RANK`,
//! `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`, `MASTER_ADDR`, `MASTER_PORT`,
//! `WEFT_JOB_TOKEN`, `WEFT_LAUNCHED=1`, `WEFT_RESTART_COUNT`) on top of its
//! own environment. The launcher of node 0 serves the rendezvous store for the whole job.
//!
//! Every line a worker writes is forwarded with a `[rank{R}]: ` prefix. When a worker fails
//! (non-zero exit or a signal), the others are stopped (SIGTERM, SIGKILL after
//! [`LaunchConfig::stop_timeout`]) and the job is restarted ([`LaunchConfig::max_restarts`]) or
//! a report on the failed rank is printed. SIGINT, SIGTERM and SIGHUP sent to the launcher are
//! forwarded to the workers.
//!
//! ```no_run
//! # fn main() -> weft_dist::Result<()> {
//! use weft_dist::launch::{run, LaunchConfig};
//! let cfg = LaunchConfig::new(4, "weft", ["check", "collectives"]);
//! let code = run(&cfg)?; // 0 when every worker exited 0
//! # std::process::exit(code) }
//! ```

mod elastic;
mod signals;
mod worker;

use std::ffi::OsString;
use std::time::{Duration, Instant};

use crate::auth::Token;
use crate::env::DEFAULT_MASTER_PORT;
use crate::error::{Error, Result};
use crate::store::StoreServer;

pub use signals::signal_name;
pub use worker::describe as describe_exit;
use worker::{drain_output, Spec, Worker};

/// Default of [`LaunchConfig::last_call`]: 10 seconds.
pub const DEFAULT_LAST_CALL: Duration = Duration::from_secs(10);
/// Default of [`LaunchConfig::stop_timeout`]: 5 seconds.
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Default of [`LaunchConfig::master_addr`].
pub const DEFAULT_MASTER_ADDR: &str = "127.0.0.1";
/// How many of a worker's last stderr lines the failure report shows.
pub const TAIL_LINES: usize = 20;
/// The launcher's exit code when a worker failed (and no restarts were left).
pub const EXIT_FAILED: i32 = 1;

/// How often the launcher checks its workers and its signals.
const POLL: Duration = Duration::from_millis(25);
/// How long the launcher waits, after the workers exit, for the rest of their output (a child
/// they left behind may hold their pipes open).
const OUTPUT_GRACE: Duration = Duration::from_secs(2);

/// What to launch on this node.
#[derive(Clone, Debug)]
pub struct LaunchConfig {
    /// Worker processes on this node, one per rank (at least 1).
    pub nproc_per_node: usize,
    /// Nodes in the job (at least 1; default 1): the most, under elastic membership. See
    /// [`parse_nnodes`] for torchrun's `MIN:MAX`.
    pub nnodes: usize,
    /// The fewest nodes the job may run on (default: `nnodes`). Below `nnodes`, membership is
    /// elastic (see [`elastic`](LaunchConfig::elastic)).
    pub min_nnodes: usize,
    /// Elastic membership: how long a rendezvous round stays open for more nodes once
    /// `min_nnodes` have joined (torchrun's `last_call_timeout`; default 10 s). Nodes that
    /// survive a failure must rejoin within it (so it should exceed `stop_timeout`).
    pub last_call: Duration,
    /// This node's rank, `0..nnodes` (default 0). The launcher of node 0 serves the store.
    /// Under elastic membership it only says which node serves the store: each rendezvous round
    /// numbers the nodes in the order they join.
    pub node_rank: usize,
    /// Where the workers reach the store: the host of node 0 (default `127.0.0.1`).
    pub master_addr: String,
    /// The store's port. `None` (the default): 29500 when `nnodes > 1`; on a single node any
    /// free port, which the workers are told.
    pub master_port: Option<u16>,
    /// How many times all workers are started again after a failure (default 0). On several
    /// nodes, every node's launcher restarts its workers together through a new rendezvous
    /// round (see [`elastic`](LaunchConfig::elastic)).
    pub max_restarts: u32,
    /// How long the workers get to exit after the launcher signals them (SIGTERM, or the
    /// signal it forwards) before they are killed with SIGKILL (default 5 seconds).
    pub stop_timeout: Duration,
    /// The job token. `None` (the default): `WEFT_JOB_TOKEN` from the environment, or a freshly
    /// generated one when `nnodes == 1`.
    pub token: Option<Token>,
    /// The worker program: a path, or a name looked up on `PATH`.
    pub program: OsString,
    /// The worker program's arguments.
    pub args: Vec<OsString>,
}

impl LaunchConfig {
    /// `nproc_per_node` workers of `program args` on a single node, everything else at its
    /// default.
    pub fn new<P, I, A>(nproc_per_node: usize, program: P, args: I) -> LaunchConfig
    where
        P: Into<OsString>,
        I: IntoIterator<Item = A>,
        A: Into<OsString>,
    {
        LaunchConfig {
            nproc_per_node,
            nnodes: 1,
            min_nnodes: 1,
            last_call: DEFAULT_LAST_CALL,
            node_rank: 0,
            master_addr: DEFAULT_MASTER_ADDR.to_string(),
            master_port: None,
            max_restarts: 0,
            stop_timeout: DEFAULT_STOP_TIMEOUT,
            token: None,
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
        }
    }

    /// Ranks in the whole job: `nnodes * nproc_per_node`.
    pub fn world_size(&self) -> usize {
        self.nnodes.saturating_mul(self.nproc_per_node)
    }

    /// Whether the nodes' launchers meet in rendezvous rounds (`launch::elastic`): with elastic
    /// membership (`min_nnodes < nnodes`), or with restarts on several nodes.
    pub fn elastic(&self) -> bool {
        self.min_nnodes < self.nnodes || (self.nnodes > 1 && self.max_restarts > 0)
    }

    /// Checks the numbers and the program; every error is one line naming the flag.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Invalid(m));
        if self.nproc_per_node == 0 {
            return bad("--nproc-per-node must be at least 1".into());
        }
        if self.nnodes == 0 {
            return bad("--nnodes must be at least 1".into());
        }
        if self.node_rank >= self.nnodes {
            return bad(format!(
                "--node-rank {} is out of range for --nnodes {} (node ranks are 0 to {})",
                self.node_rank,
                self.nnodes,
                self.nnodes - 1
            ));
        }
        if self.nnodes.checked_mul(self.nproc_per_node).is_none() {
            return bad("--nnodes times --nproc-per-node is too large".into());
        }
        if self.min_nnodes == 0 || self.min_nnodes > self.nnodes {
            return bad(format!(
                "--nnodes {}:{}: the fewest nodes must be between 1 and the most",
                self.min_nnodes, self.nnodes
            ));
        }
        if self.master_addr.trim().is_empty() {
            return bad("--master-addr is empty".into());
        }
        if self.program.is_empty() {
            return bad("no worker program given: weft launch [OPTIONS] -- PROGRAM [ARGS]...".into());
        }
        Ok(())
    }

    /// The job token: [`LaunchConfig::token`], else `WEFT_JOB_TOKEN`, else (single node) a new one.
    fn resolve_token(&self) -> Result<Token> {
        if let Some(t) = &self.token {
            return Ok(t.clone());
        }
        match Token::from_env()? {
            Some(t) => Ok(t),
            None if self.nnodes == 1 => Token::generate(),
            None => Err(Error::Invalid(format!(
                "WEFT_JOB_TOKEN is not set: a job on {} nodes needs one shared secret; export the same \
                 WEFT_JOB_TOKEN on every node (e.g. `export WEFT_JOB_TOKEN=$(head -c 32 /dev/urandom | od -An \
                 -tx1 | tr -d ' \\n')`)",
                self.nnodes
            ))),
        }
    }
}

/// Parses `--nnodes`: `N`, or torchrun's `MIN:MAX` (elastic membership: the job runs on at
/// least MIN and at most MAX nodes); returns `(min, max)`.
pub fn parse_nnodes(s: &str) -> Result<(usize, usize)> {
    let num = |t: &str| {
        t.trim()
            .parse::<usize>()
            .map_err(|_| Error::Invalid(format!("--nnodes {s:?} is not a number of nodes (N, or MIN:MAX)")))
    };
    match s.split_once(':') {
        None => num(s).map(|n| (n, n)),
        Some((lo, hi)) => {
            let (lo, hi) = (num(lo)?, num(hi)?);
            if lo == 0 || lo > hi {
                return Err(Error::Invalid(format!("--nnodes {s}: MIN:MAX needs 1 <= MIN <= MAX")));
            }
            Ok((lo, hi))
        }
    }
}

/// How one attempt ended.
enum End {
    /// Every worker exited 0.
    Done,
    /// The launcher received this signal.
    Signal(i32),
    /// The worker at this index failed first.
    Failed(usize),
    /// Another node's launcher reported a failure (elastic rounds).
    Elsewhere(String),
}

/// Runs the job on this node: starts the workers, forwards their output, and watches them until
/// they all exit 0 (returns 0), one fails with no restarts left (prints a report on stderr and
/// returns [`EXIT_FAILED`]) or the launcher receives SIGINT, SIGTERM or SIGHUP (returns 128 +
/// the signal's number). Errors: a bad config, no job token for a multi-node job, a store that
/// cannot listen, a program that cannot be started.
///
/// It installs process-wide signal handlers while it runs (the previous ones are restored when
/// it returns), so one process runs one launch at a time.
pub fn run(cfg: &LaunchConfig) -> Result<i32> {
    cfg.validate()?;
    let token = cfg.resolve_token()?;
    let _handlers = signals::Handlers::install()?;
    let (store, port) = if cfg.node_rank == 0 {
        let port = match cfg.master_port {
            Some(p) => p,
            None if cfg.nnodes > 1 => DEFAULT_MASTER_PORT,
            None => 0,
        };
        let store = StoreServer::start(&format!("0.0.0.0:{port}"), token.clone()).map_err(|e| match e {
            Error::Io(m) if port != 0 => Error::Io(format!(
                "{m} (another job may hold that port: choose another with --master-port)"
            )),
            other => other,
        })?;
        let port = store.addr().port();
        (Some(store), port)
    } else {
        (None, cfg.master_port.unwrap_or(DEFAULT_MASTER_PORT))
    };
    if cfg.elastic() {
        let code = elastic::run(cfg, &token, port, store.is_some());
        drop(store);
        return code;
    }
    let env = job_env(cfg, port, &token);

    let mut restarts = 0u32;
    let code = loop {
        if let Some(sig) = signals::received() {
            weft_core::errln!("weft launch: received {}; not starting the workers", signal_name(sig));
            break 128 + sig;
        }
        let mut workers = start_all(cfg, &env, restarts)?;
        match watch(&mut workers, &mut || None) {
            End::Done => {
                drain_output(&mut workers, OUTPUT_GRACE);
                break 0;
            }
            End::Signal(sig) => break forward_signal(cfg, &mut workers, sig),
            End::Elsewhere(_) => unreachable!("a single-node watch has no other node"),
            End::Failed(first) => {
                let status = failure(&workers, first);
                let exited_before_stop = stop_after_failure(cfg, &mut workers);
                let w = &workers[first];
                if signals::received().is_none() && restarts < cfg.max_restarts {
                    restarts += 1;
                    weft_core::errln!(
                        "weft launch: rank {} failed ({status}); restarting all workers: attempt {} of {} \
                         (WEFT_RESTART_COUNT={restarts})",
                        w.rank,
                        restarts + 1,
                        cfg.max_restarts + 1
                    );
                    continue;
                }
                weft_core::err!("{}", report(cfg, &workers, first, &exited_before_stop, restarts));
                break signals::received().map_or(EXIT_FAILED, |sig| 128 + sig);
            }
        }
    };
    drop(store);
    Ok(code)
}

/// Forwards signal `sig`, which the launcher received, to the workers and waits for them; the
/// launcher's exit code.
fn forward_signal(cfg: &LaunchConfig, workers: &mut [Worker], sig: i32) -> i32 {
    weft_core::errln!(
        "weft launch: received {}; forwarding it to the workers",
        signal_name(sig)
    );
    stop(workers, sig, cfg.stop_timeout);
    drain_output(workers, OUTPUT_GRACE);
    128 + sig
}

/// The variables every worker of this node gets (besides its ranks and the restart count).
fn job_env(cfg: &LaunchConfig, port: u16, token: &Token) -> Vec<(String, String)> {
    // WEFT_NUM_THREADS is left alone: each weft worker sizes its pool to the cores divided by
    // LOCAL_WORLD_SIZE itself (weft_core's default), and a value set here is inherited.
    vec![
        ("WORLD_SIZE".to_string(), cfg.world_size().to_string()),
        ("LOCAL_WORLD_SIZE".into(), cfg.nproc_per_node.to_string()),
        ("GROUP_RANK".into(), cfg.node_rank.to_string()),
        ("MASTER_ADDR".into(), cfg.master_addr.trim().to_string()),
        ("MASTER_PORT".into(), port.to_string()),
        ("WEFT_JOB_TOKEN".into(), token.text()),
        ("WEFT_LAUNCHED".into(), "1".into()),
    ]
}

/// How worker `first`, which [`watch`] saw fail, ended.
fn failure(workers: &[Worker], first: usize) -> String {
    worker::describe(workers[first].status.expect("a failed worker has exited"))
}

/// After a worker failed: stops the others (SIGTERM) and collects their output; which workers
/// had exited before the stop.
fn stop_after_failure(cfg: &LaunchConfig, workers: &mut [Worker]) -> Vec<bool> {
    for w in workers.iter_mut() {
        w.poll();
    }
    let exited_before_stop = workers.iter().map(|w| w.status.is_some()).collect::<Vec<_>>();
    stop(workers, libc::SIGTERM, cfg.stop_timeout);
    drain_output(workers, OUTPUT_GRACE);
    exited_before_stop
}

/// Starts every worker of this node for attempt `restart`; on an error stops those started.
fn start_all(cfg: &LaunchConfig, env: &[(String, String)], restart: u32) -> Result<Vec<Worker>> {
    let mut workers: Vec<Worker> = Vec::with_capacity(cfg.nproc_per_node);
    for local in 0..cfg.nproc_per_node {
        let rank = cfg.node_rank * cfg.nproc_per_node + local;
        let mut vars = env.to_vec();
        vars.push(("RANK".into(), rank.to_string()));
        vars.push(("LOCAL_RANK".into(), local.to_string()));
        vars.push(("WEFT_RESTART_COUNT".into(), restart.to_string()));
        let spec = Spec {
            program: &cfg.program,
            args: &cfg.args,
            env: vars,
            rank,
            local_rank: local,
            tail_lines: TAIL_LINES,
        };
        match Worker::start(spec) {
            Ok(w) => workers.push(w),
            Err(e) => {
                stop(&mut workers, libc::SIGKILL, Duration::ZERO);
                drain_output(&mut workers, OUTPUT_GRACE);
                return Err(e);
            }
        }
    }
    Ok(workers)
}

/// Polls the workers and the signals until every worker exited 0, one failed, a signal came,
/// or `elsewhere` reports another node's failure.
fn watch(workers: &mut [Worker], elsewhere: &mut dyn FnMut() -> Option<String>) -> End {
    loop {
        if let Some(sig) = signals::received() {
            return End::Signal(sig);
        }
        if let Some(why) = elsewhere() {
            return End::Elsewhere(why);
        }
        let mut running = false;
        for (i, w) in workers.iter_mut().enumerate() {
            match w.poll() {
                None => running = true,
                Some(s) if !s.success() => return End::Failed(i),
                Some(_) => {}
            }
        }
        if !running {
            return End::Done;
        }
        std::thread::sleep(POLL);
    }
}

/// Sends `sig` to every running worker, waits up to `timeout` for them to exit and kills the
/// rest with SIGKILL. A signal to the launcher while it stops them is forwarded too if none
/// came before; a further one kills them at once.
fn stop(workers: &mut [Worker], sig: i32, timeout: Duration) {
    for w in workers.iter() {
        w.signal(sig);
    }
    let mut seen = signals::count();
    // stopping because of a signal: a further one means "now"
    let mut forwarded = seen > 0;
    let deadline = Instant::now() + timeout;
    loop {
        let running: Vec<usize> = workers
            .iter_mut()
            .filter_map(|w| w.poll().is_none().then_some(w.rank))
            .collect();
        if running.is_empty() {
            return;
        }
        if signals::count() != seen {
            seen = signals::count();
            let s = signals::received().unwrap_or(libc::SIGTERM);
            if forwarded {
                weft_core::errln!(
                    "weft launch: received {} again; killing the workers (SIGKILL)",
                    signal_name(s)
                );
                break;
            }
            weft_core::errln!("weft launch: received {}; forwarding it to the workers", signal_name(s));
            for w in workers.iter() {
                w.signal(s);
            }
            forwarded = true;
        }
        if Instant::now() >= deadline {
            if !timeout.is_zero() {
                weft_core::errln!(
                    "weft launch: {} still running {} s after {}; killing (SIGKILL)",
                    ranks_text(&running),
                    timeout.as_secs_f64(),
                    signal_name(sig)
                );
            }
            break;
        }
        std::thread::sleep(POLL);
    }
    for w in workers.iter() {
        w.signal(libc::SIGKILL);
    }
    for w in workers.iter_mut() {
        w.wait();
    }
}

/// `rank 3` or `ranks 0, 2, 5`.
fn ranks_text(ranks: &[usize]) -> String {
    let list: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
    match list.len() {
        1 => format!("rank {}", list[0]),
        _ => format!("ranks {}", list.join(", ")),
    }
}

/// The failure report: the rank that failed first, its pid, status and last stderr lines, then
/// the other ranks that failed on their own and those the launcher stopped.
fn report(cfg: &LaunchConfig, workers: &[Worker], first: usize, exited: &[bool], restarts: u32) -> String {
    let w = &workers[first];
    let status = worker::describe(w.status.expect("a failed worker has exited"));
    let mut out = format!(
        "weft launch: job failed: rank {} (local rank {} on node {}, pid {}) failed first: {status}\n",
        w.rank, w.local_rank, cfg.node_rank, w.pid
    );
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
        for line in tail {
            out += &format!("    {line}\n");
        }
    }
    let mut also_failed = Vec::new();
    let mut stopped = Vec::new();
    for (i, o) in workers.iter().enumerate() {
        let Some(s) = o.status else { continue };
        if i == first {
            continue;
        }
        if exited[i] && !s.success() {
            also_failed.push(format!("rank {} ({})", o.rank, worker::describe(s)));
        } else if !exited[i] {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    #[test]
    fn nnodes_forms() {
        assert_eq!(parse_nnodes("2").unwrap(), (2, 2));
        assert_eq!(parse_nnodes("3:3").unwrap(), (3, 3));
        assert_eq!(parse_nnodes("1:2").unwrap(), (1, 2));
        let e = parse_nnodes("2:1").unwrap_err().to_string();
        assert!(e.contains("1 <= MIN <= MAX"), "{e}");
        assert!(parse_nnodes("0:2").is_err());
        assert!(parse_nnodes("x").is_err());
        assert!(parse_nnodes("1:").is_err());
    }

    #[test]
    fn validation() {
        let ok = LaunchConfig::new(2, "true", Vec::<String>::new());
        ok.validate().unwrap();
        assert_eq!(ok.world_size(), 2);
        let with = |f: &dyn Fn(&mut LaunchConfig)| {
            let mut c = ok.clone();
            f(&mut c);
            c.validate().unwrap_err().to_string()
        };
        assert!(with(&|c| c.nproc_per_node = 0).contains("--nproc-per-node"));
        assert!(with(&|c| c.nnodes = 0).contains("--nnodes"));
        assert!(with(&|c| {
            c.nnodes = 2;
            c.node_rank = 2
        })
        .contains("--node-rank 2 is out of range"));
        assert!(with(&|c| {
            c.nnodes = 2;
            c.min_nnodes = 3
        })
        .contains("--nnodes 3:2"));
        assert!(with(&|c| c.min_nnodes = 0).contains("between 1 and the most"));
        assert!(with(&|c| c.program = OsString::new()).contains("no worker program"));
    }

    #[test]
    fn statuses() {
        assert_eq!(worker::describe(ExitStatus::from_raw(3 << 8)), "exit code 3");
        assert_eq!(
            worker::describe(ExitStatus::from_raw(9)),
            "killed by signal 9 (SIGKILL)"
        );
        assert_eq!(signal_name(15), "SIGTERM");
        assert_eq!(ranks_text(&[1]), "rank 1");
        assert_eq!(ranks_text(&[0, 2]), "ranks 0, 2");
    }
}
