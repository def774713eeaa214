//! Starting and watching the workers of a job (`weft launch`), with torchrun's semantics.
//!
//! The launcher of each node starts `nproc_per_node` workers (global rank = node rank x
//! nproc_per_node + local rank), each with the variables [`crate::env`] reads (`RANK`,
//! `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`, `MASTER_ADDR`, `MASTER_PORT`,
//! `WEFT_JOB_TOKEN`, `WEFT_LAUNCHED=1`, `WEFT_RESTART_COUNT`, `WEFT_ERROR_FILE`) on top of its
//! own environment. The launcher of node 0 serves the rendezvous store for the whole job; on
//! several nodes the launchers first meet there (`meet`: the same settings on every node, each
//! node rank claimed once; node 0's launcher checks that the store at `MASTER_ADDR` is its own,
//! `master`) and watch it while the workers run (`watch`).
//!
//! Every line a worker writes is forwarded with a `[rank{R}]: ` prefix. When a worker fails
//! (non-zero exit or a signal), the others are stopped (SIGTERM, SIGKILL after
//! [`LaunchConfig::stop_timeout`]) and the job is restarted ([`LaunchConfig::max_restarts`]) or
//! a report on the rank that caused the failure is printed (`report`, from the workers' error
//! files). SIGINT, SIGTERM and SIGHUP sent to the launcher are forwarded to the workers, at any
//! moment: while they are being started too. How many workers one launcher may start is
//! bounded (`limits`).
//!
//! ```no_run
//! # fn main() -> weft_dist::Result<()> {
//! use weft_dist::launch::{run, LaunchConfig};
//! let cfg = LaunchConfig::new(4, "weft", ["check", "collectives"]);
//! let code = run(&cfg)?; // 0 when every worker exited 0
//! # std::process::exit(code) }
//! ```

mod config;
mod elastic;
mod error_files;
mod limits;
mod master;
mod meet;
mod report;
mod signals;
mod watch;
mod worker;

use std::time::{Duration, Instant, SystemTime};

use crate::auth::Token;
use crate::env::DEFAULT_MASTER_PORT;
use crate::error::{Error, Result};
use crate::failure::ERROR_FILE_VAR;
use crate::store::StoreServer;

pub use crate::signal::signal_name;
pub use config::{
    parse_nnodes, parse_seconds, LaunchConfig, DEFAULT_HEARTBEAT_TIMEOUT, DEFAULT_LAST_CALL, DEFAULT_MASTER_ADDR,
    DEFAULT_STOP_TIMEOUT, STORE_BIND_VAR,
};
use error_files::ErrorFiles;
pub use limits::{max_nproc_per_node, Limit, MAX_NPROC_PER_NODE};
use report::{ranks_text, Failure};
pub use worker::describe as describe_exit;
use worker::{drain_output, Spec, Worker};

/// How many of a worker's last stderr lines the failure report shows.
pub const TAIL_LINES: usize = 20;
/// The launcher's exit code when a worker failed (and no restarts were left).
pub const EXIT_FAILED: i32 = 1;

/// How often the launcher checks its workers and its signals.
const POLL: Duration = Duration::from_millis(25);
/// How long the launcher waits, after the workers exit, for the rest of their output (a child
/// they left behind may hold their pipes open).
const OUTPUT_GRACE: Duration = Duration::from_secs(2);

/// How one attempt ended.
enum End {
    /// Every worker exited 0.
    Done,
    /// The launcher received this signal.
    Signal(i32),
    /// The worker at this index failed first.
    Failed(usize),
    /// The worker at this index stopped on a SIGTERM or SIGINT sent to it, not to the launcher
    /// (Slurm's step kill, a node shutdown): the job is being stopped, not failing.
    Stopped(usize),
    /// Another node's launcher reported a failure (elastic rounds).
    Elsewhere(String),
    /// The job fails on every node, with no restart: a launcher given other settings than node
    /// 0's, two given the same node rank, or node 0's launcher (the store) lost.
    Fatal(String),
}

/// Where node 0's store listens: on the host [`LaunchConfig::store_bind_host`] names when one is
/// given (`WEFT_STORE_BIND`); else only on loopback for a one-node job whose workers reach it
/// there (`--master-addr` 127.0.0.1, the default, or `localhost`; strangers on the network
/// cannot connect at all then), else on every interface.
fn store_host(cfg: &LaunchConfig) -> String {
    if let Some(host) = cfg.store_bind_host() {
        let host = crate::addr::bare(&host).to_string();
        return match host.parse::<std::net::IpAddr>() {
            Ok(ip @ std::net::IpAddr::V6(_)) => format!("[{ip}]"),
            _ => host,
        };
    }
    let addr = crate::addr::bare(&cfg.master_addr);
    let every = crate::addr::any_interface(addr).to_string();
    if cfg.nnodes != 1 {
        return every;
    }
    match addr.parse::<std::net::IpAddr>() {
        // the loopback address the workers are given (127.0.1.1 is a host name's on some systems)
        Ok(ip @ std::net::IpAddr::V4(_)) if ip.is_loopback() => ip.to_string(),
        Ok(ip @ std::net::IpAddr::V6(_)) if ip.is_loopback() => format!("[{ip}]"),
        _ if addr == "localhost" => "127.0.0.1".into(),
        _ => every,
    }
}

/// Runs the job on this node: starts the workers, forwards their output, and watches them until
/// they all exit 0 (returns 0), one fails with no restarts left (prints a report on stderr and
/// returns [`EXIT_FAILED`]) or the launcher receives SIGINT, SIGTERM or SIGHUP (returns 128 +
/// the signal's number). Errors: a bad config (more workers than [`max_nproc_per_node`] too), no
/// job token for a multi-node job, a store that cannot listen, a program that cannot be started.
///
/// It installs process-wide signal handlers while it runs (the previous ones are restored when
/// it returns), so one process runs one launch at a time.
pub fn run(cfg: &LaunchConfig) -> Result<i32> {
    cfg.validate()?;
    let token = cfg.resolve_token()?;
    let _handlers = signals::Handlers::install()?;
    let _reaper = worker::Reaper::install();
    let (store, port) = if cfg.node_rank == 0 {
        let port = match cfg.master_port {
            Some(p) => p,
            None if cfg.nnodes > 1 => DEFAULT_MASTER_PORT,
            None => 0,
        };
        let bind = cfg.store_bind_host();
        let store = StoreServer::start(&format!("{}:{port}", store_host(cfg)), token.clone()).map_err(|e| match e {
            Error::Io(m) if bind.is_some() || port != 0 => {
                let mut hints = Vec::new();
                if let Some(host) = &bind {
                    hints.push(format!(
                        "{STORE_BIND_VAR}={host} must name an address of this host's, or a name of one"
                    ));
                }
                if port != 0 {
                    hints.push("another job may hold that port: choose another with --master-port".to_string());
                }
                Error::Io(format!("{m} ({})", hints.join("; ")))
            }
            other => other,
        })?;
        let port = store.addr().port();
        (Some(store), port)
    } else {
        (None, cfg.master_port.unwrap_or(DEFAULT_MASTER_PORT))
    };
    let errors = ErrorFiles::create();
    // where node 0's launcher reaches its own store
    let own = store.as_ref().map(|s| s.addr());
    if cfg.elastic() {
        let code = elastic::run(cfg, &token, port, own, &errors);
        drop(store);
        return code;
    }
    // the launchers of several nodes meet before they start their workers
    let meeting = if cfg.nnodes > 1 {
        match meet::meet(cfg, &token, port, own)? {
            meet::Met::Go(watch) => Some(watch),
            meet::Met::Failed => return Ok(EXIT_FAILED),
            meet::Met::Signal(sig) => return Ok(128 + sig),
        }
    } else {
        None
    };
    let mut fatal = || meeting.as_ref().and_then(|w| w.fatal()).map(End::Fatal);
    let env = job_env(cfg, port, &token);

    let mut restarts = 0u32;
    let code = loop {
        if let Some(sig) = signals::received() {
            weft_core::errln!("weft launch: received {}; not starting the workers", signal_name(sig));
            break 128 + sig;
        }
        let mut workers = Vec::with_capacity(cfg.nproc_per_node);
        let end = match start_all(cfg, &env, restarts, &errors, &mut workers, &mut fatal)? {
            Some(end) => end,
            None => watch_workers(&mut workers, &mut fatal),
        };
        match end {
            End::Done => {
                // what the workers started and left behind is stopped before the output is
                // drained (it may hold their pipes open)
                stop(&mut workers, libc::SIGTERM, cfg.stop_timeout);
                drain_output(&mut workers, OUTPUT_GRACE);
                break 0;
            }
            End::Signal(sig) => break forward_signal(cfg, &mut workers, sig),
            End::Stopped(first) => break finish_stopping(cfg, &mut workers, first),
            End::Elsewhere(_) => unreachable!("only rendezvous rounds hear of other nodes' failures"),
            End::Fatal(why) => break fail_for_good(cfg, &mut workers, &why, store.is_some()),
            End::Failed(first) => {
                let failure = stop_after_failure(cfg, &mut workers, first);
                if signals::received().is_none() && restarts < cfg.max_restarts {
                    restarts += 1;
                    weft_core::errln!(
                        "weft launch: {}; restarting all workers: attempt {} of {} (WEFT_RESTART_COUNT={restarts})",
                        failure.summary(&workers, None),
                        restarts + 1,
                        cfg.max_restarts + 1
                    );
                    continue;
                }
                weft_core::err!("{}", failure.report(cfg, &workers, restarts));
                break signals::received().map_or(EXIT_FAILED, |sig| 128 + sig);
            }
        }
    };
    drop(store);
    Ok(code)
}

/// Stops the workers because the job fails on every node for `why` ([`End::Fatal`]) and says
/// so; the launcher's exit code. Node 0's launcher (`serves_store`) keeps the store a moment
/// longer, so the other nodes' launchers read why.
fn fail_for_good(cfg: &LaunchConfig, workers: &mut [Worker], why: &str, serves_store: bool) -> i32 {
    stop(workers, libc::SIGTERM, cfg.stop_timeout);
    drain_output(workers, OUTPUT_GRACE);
    weft_core::errln!("weft launch: job failed: {why}");
    watch::linger(serves_store);
    EXIT_FAILED
}

/// Forwards signal `sig`, which the launcher received, to the workers started so far and waits
/// for them; the launcher's exit code.
fn forward_signal(cfg: &LaunchConfig, workers: &mut [Worker], sig: i32) -> i32 {
    if workers.len() < cfg.nproc_per_node {
        weft_core::errln!(
            "weft launch: received {} while starting the workers ({} of {} started); stopping them",
            signal_name(sig),
            workers.len(),
            cfg.nproc_per_node
        );
    } else {
        weft_core::errln!(
            "weft launch: received {}; forwarding it to the workers",
            signal_name(sig)
        );
    }
    stop(workers, sig, cfg.stop_timeout);
    drain_output(workers, OUTPUT_GRACE);
    128 + sig
}

/// After worker `first` stopped on a SIGTERM or SIGINT sent to it, not to the launcher (as
/// Slurm's step kill or a node shutdown send them to every process): the job is being stopped,
/// so nothing is restarted, and the other workers are not sent a signal of their own while they
/// stop (a second SIGTERM ends a `weft train` worker at once, in the middle of its stop
/// checkpoint). They got the signal too, or their next collective fails on the rank that left.
/// Those still running [`LaunchConfig::stop_timeout`] later are stopped as after a failure
/// (SIGTERM, then SIGKILL after the stop timeout). A first signal to the launcher meanwhile is
/// not forwarded (the workers are stopping already); a second one kills them at once. Returns
/// the launcher's exit code: 128 + the worker's signal, or + the launcher's if it got one.
fn finish_stopping(cfg: &LaunchConfig, workers: &mut [Worker], first: usize) -> i32 {
    let sig = workers[first].stop_signal().unwrap_or(libc::SIGTERM);
    weft_core::errln!(
        "weft launch: rank {} stopped on {} ({}): the job is being stopped, not restarted; waiting up to {} s for \
         the other workers to stop",
        workers[first].rank,
        signal_name(sig),
        workers[first].status.map(describe_exit).unwrap_or_default(),
        cfg.stop_timeout.as_secs_f64()
    );
    let seen = signals::count();
    let deadline = crate::deadline::after(cfg.stop_timeout);
    let mut now = false;
    while workers.iter_mut().any(|w| w.poll().is_none()) && Instant::now() < deadline {
        if signals::count() >= seen + 2 {
            weft_core::errln!("weft launch: received a second signal; killing the workers (SIGKILL)");
            now = true;
            break;
        }
        std::thread::sleep(POLL);
    }
    if now {
        stop(workers, libc::SIGKILL, Duration::ZERO);
    } else {
        stop(workers, libc::SIGTERM, cfg.stop_timeout);
    }
    drain_output(workers, OUTPUT_GRACE);
    let others: Vec<String> = workers
        .iter()
        .filter(|w| w.status.is_some_and(|s| !s.success()) && w.stop_signal().is_none())
        .map(|w| format!("rank {} ({})", w.rank, w.status.map(describe_exit).unwrap_or_default()))
        .collect();
    if !others.is_empty() {
        weft_core::errln!("weft launch: while the job stopped, also ended: {}", others.join(", "));
    }
    128 + signals::received().unwrap_or(sig)
}

/// The variables every worker of this node gets (besides its ranks, the restart count and its
/// error file).
/// The `MASTER_ADDR` workers are given: `--master-addr`, where every node's workers find the
/// store; but on a one-node job whose store listens where `WEFT_STORE_BIND` says, there (the
/// workers are on this host, and `--master-addr`, 127.0.0.1 by default, may lead nowhere: they
/// waited for a store that was not there).
fn workers_master_addr(cfg: &LaunchConfig) -> String {
    match cfg.store_bind_host() {
        Some(host) if cfg.nnodes == 1 && !cfg.elastic() => crate::addr::bare(&host).to_string(),
        _ => cfg.master_addr.trim().to_string(),
    }
}

fn job_env(cfg: &LaunchConfig, port: u16, token: &Token) -> Vec<(String, String)> {
    // WEFT_NUM_THREADS is left alone: each weft worker sizes its pool to the cores divided by
    // LOCAL_WORLD_SIZE itself (weft_core's default), and a value set here is inherited.
    vec![
        ("WORLD_SIZE".to_string(), cfg.world_size().to_string()),
        ("LOCAL_WORLD_SIZE".into(), cfg.nproc_per_node.to_string()),
        ("GROUP_RANK".into(), cfg.node_rank.to_string()),
        ("MASTER_ADDR".into(), workers_master_addr(cfg)),
        ("MASTER_PORT".into(), port.to_string()),
        ("WEFT_JOB_TOKEN".into(), token.text()),
        ("WEFT_LAUNCHED".into(), "1".into()),
    ]
}

/// After worker `first` failed: stops the others (SIGTERM), collects their output and reads
/// their error files.
fn stop_after_failure(cfg: &LaunchConfig, workers: &mut [Worker], first: usize) -> Failure {
    for w in workers.iter_mut() {
        w.poll();
    }
    let on_their_own = workers.iter().map(|w| w.status.is_some()).collect::<Vec<_>>();
    let stopped_at = SystemTime::now();
    stop(workers, libc::SIGTERM, cfg.stop_timeout);
    drain_output(workers, OUTPUT_GRACE);
    Failure::assess(workers, first, &on_their_own, stopped_at)
}

/// Starts every worker of this node for attempt `restart` into `workers`. Between two starts
/// it looks at the signals, at `elsewhere` (another node's failure) and, every [`POLL`], at
/// the workers already started (reaping those that exited, so none waits as a zombie): when
/// one of these ends the attempt early, returns how (the caller stops the workers started).
/// On an error, stops and reaps those started.
fn start_all(
    cfg: &LaunchConfig,
    env: &[(String, String)],
    restart: u32,
    errors: &ErrorFiles,
    workers: &mut Vec<Worker>,
    elsewhere: &mut dyn FnMut() -> Option<End>,
) -> Result<Option<End>> {
    let mut next_poll = Instant::now() + POLL;
    for local in 0..cfg.nproc_per_node {
        if let Some(sig) = signals::received() {
            return Ok(Some(End::Signal(sig)));
        }
        if let Some(end) = elsewhere() {
            return Ok(Some(end));
        }
        if Instant::now() >= next_poll {
            next_poll = Instant::now() + POLL;
            if let Some(end) = first_ended(workers) {
                return Ok(Some(end));
            }
        }
        let rank = cfg.node_rank * cfg.nproc_per_node + local;
        let mut vars = env.to_vec();
        vars.push(("RANK".into(), rank.to_string()));
        vars.push(("LOCAL_RANK".into(), local.to_string()));
        vars.push(("WEFT_RESTART_COUNT".into(), restart.to_string()));
        let error_file = errors.fresh(rank);
        if let Some(path) = &error_file {
            vars.push((ERROR_FILE_VAR.into(), path.to_string_lossy().into_owned()));
        }
        let spec = Spec {
            program: &cfg.program,
            args: &cfg.args,
            env: vars,
            rank,
            local_rank: local,
            tail_lines: TAIL_LINES,
            error_file,
        };
        match Worker::start(spec) {
            Ok(w) => workers.push(w),
            Err(e) => {
                stop(workers, libc::SIGKILL, Duration::ZERO);
                drain_output(workers, OUTPUT_GRACE);
                return Err(e);
            }
        }
    }
    Ok(None)
}

/// Polls every worker (reaping those that exited): [`End::Stopped`] when one stopped on a
/// SIGTERM or SIGINT sent to it ([`Worker::stop_signal`]), else [`End::Failed`] with the first
/// that failed; None while none did.
fn first_ended(workers: &mut [Worker]) -> Option<End> {
    let (mut failed, mut stopped) = (None, None);
    for (i, w) in workers.iter_mut().enumerate() {
        if w.poll().is_some_and(|s| !s.success()) {
            failed = failed.or(Some(i));
            if w.stop_signal().is_some() {
                stopped = stopped.or(Some(i));
            }
        }
    }
    stopped.map(End::Stopped).or(failed.map(End::Failed))
}

/// Polls the workers and the signals until every worker exited 0, one failed, a signal came,
/// or `elsewhere` says how the attempt ends (another node's failure, the job's).
fn watch_workers(workers: &mut [Worker], elsewhere: &mut dyn FnMut() -> Option<End>) -> End {
    loop {
        if let Some(sig) = signals::received() {
            return End::Signal(sig);
        }
        if let Some(end) = elsewhere() {
            return end;
        }
        if let Some(end) = first_ended(workers) {
            return end;
        }
        if workers.iter().all(|w| w.status.is_some()) {
            return End::Done;
        }
        std::thread::sleep(POLL);
    }
}

/// Sends `sig` to every running worker and to what the workers that exited left behind in
/// their process groups, waits up to `timeout` for all of it to exit and kills the rest with
/// SIGKILL. Returns at once when nothing runs. A signal to the launcher while it stops them is
/// forwarded too if none came before; a further one kills them at once.
fn stop(workers: &mut [Worker], sig: i32, timeout: Duration) {
    let left: Vec<usize> = workers.iter().filter(|w| w.left_behind()).map(|w| w.rank).collect();
    if !left.is_empty() {
        weft_core::errln!(
            "weft launch: {} exited but left processes running in {} process group; stopping them ({})",
            ranks_text(&left),
            if left.len() == 1 { "its" } else { "their" },
            signal_name(sig)
        );
    }
    for w in workers.iter() {
        w.signal(sig);
    }
    let mut seen = signals::count();
    // stopping because of a signal: a further one means "now"
    let mut forwarded = seen > 0;
    let deadline = crate::deadline::after(timeout);
    loop {
        let running: Vec<usize> = workers
            .iter_mut()
            .filter_map(|w| w.poll().is_none().then_some(w.rank))
            .collect();
        let left: Vec<usize> = workers.iter().filter(|w| w.left_behind()).map(|w| w.rank).collect();
        if running.is_empty() && left.is_empty() {
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
            if !timeout.is_zero() && !running.is_empty() {
                weft_core::errln!(
                    "weft launch: {} still running {} s after {}; killing (SIGKILL)",
                    ranks_text(&running),
                    timeout.as_secs_f64(),
                    signal_name(sig)
                );
            }
            if !timeout.is_zero() && !left.is_empty() {
                weft_core::errln!(
                    "weft launch: processes left behind by {} still running {} s after {}; killing (SIGKILL)",
                    ranks_text(&left),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    #[test]
    fn statuses() {
        assert_eq!(worker::describe(ExitStatus::from_raw(3 << 8)), "exit code 3");
        assert_eq!(
            worker::describe(ExitStatus::from_raw(9)),
            "killed by signal 9 (SIGKILL)"
        );
        assert_eq!(signal_name(15), "SIGTERM");
    }
}
