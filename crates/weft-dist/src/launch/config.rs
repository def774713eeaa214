//! What to launch: [`LaunchConfig`], its defaults and its checks.

use std::ffi::OsString;
use std::time::Duration;

use super::limits;
use crate::auth::Token;
use crate::error::{Error, Result};
use crate::init::MAX_TIMEOUT;

/// Default of [`LaunchConfig::last_call`]: 10 seconds.
pub const DEFAULT_LAST_CALL: Duration = Duration::from_secs(10);
/// Default of [`LaunchConfig::stop_timeout`]: 30 seconds, as torchrun gives its workers, and as
/// long as Kubernetes' default termination grace period and Slurm's default `KillWait`: time for
/// a `weft train` worker to finish its step and write a checkpoint.
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of [`LaunchConfig::heartbeat_timeout`]: 60 seconds (twelve of the launchers'
/// heartbeats, one every 5 seconds as torchrun's `keep_alive_interval`).
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(60);
/// The shortest [`LaunchConfig::heartbeat_timeout`]: 1 second.
pub const MIN_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default of [`LaunchConfig::master_addr`].
pub const DEFAULT_MASTER_ADDR: &str = "127.0.0.1";
/// The variable that names the host node 0's store listens on when
/// [`LaunchConfig::store_bind`] is not set.
pub const STORE_BIND_VAR: &str = "WEFT_STORE_BIND";

/// What to launch on this node.
#[derive(Clone, Debug)]
pub struct LaunchConfig {
    /// Worker processes on this node, one per rank (at least 1, at most
    /// [`limits::max_nproc_per_node`](super::limits::max_nproc_per_node)).
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
    /// Elastic membership: how long node 0's launcher, its workers done, waits to hear from a
    /// node whose workers still run before it counts the node as lost (default 60 s, at least
    /// 1 s). Every member launcher tells the store it is alive every fifth of this, at most
    /// every 5 s; a node that drops off the network without its connection closing, or whose
    /// launcher is stopped, falls silent. The other nodes' launchers count node 0's as lost
    /// when its store has not answered for as long (or their connection to it closed). Give
    /// every node the same value.
    pub heartbeat_timeout: Duration,
    /// This node's rank, `0..nnodes` (default 0). The launcher of node 0 serves the store.
    /// Under elastic membership it only says which node serves the store: each rendezvous round
    /// numbers the nodes in the order they join.
    pub node_rank: usize,
    /// Where the workers reach the store: the host of node 0 (default `127.0.0.1`).
    pub master_addr: String,
    /// The store's port. `None` (the default): 29500 when `nnodes > 1`; on a single node any
    /// free port, which the workers are told.
    pub master_port: Option<u16>,
    /// Node 0: the host (an address of one of this host's interfaces, or a name of one) its
    /// store listens on. `None` (the default): [`STORE_BIND_VAR`] from the environment when set
    /// and not empty, else every interface (loopback only for a one-node job whose
    /// `master_addr` is loopback). The workers and the other nodes still connect to
    /// `master_addr`, which must reach it.
    pub store_bind: Option<String>,
    /// How many times all workers are started again after a failure (default 0). On several
    /// nodes, every node's launcher restarts its workers together through a new rendezvous
    /// round (see [`elastic`](LaunchConfig::elastic)).
    pub max_restarts: u32,
    /// How long the workers get to exit after the launcher signals them (SIGTERM, or the
    /// signal it forwards) before they are killed with SIGKILL (default 30 seconds, at most
    /// [`MAX_TIMEOUT`], a year).
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
            heartbeat_timeout: DEFAULT_HEARTBEAT_TIMEOUT,
            node_rank: 0,
            master_addr: DEFAULT_MASTER_ADDR.to_string(),
            master_port: None,
            store_bind: None,
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

    /// Checks the numbers and the program, and that this process can run that many workers
    /// ([`limits`](super::limits)); every error is one line naming the flag.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Invalid(m));
        if self.nproc_per_node == 0 {
            return bad("--nproc-per-node must be at least 1".into());
        }
        limits::check(self.nproc_per_node)?;
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
        match self.nnodes.checked_mul(self.nproc_per_node) {
            Some(world) if world <= crate::env::MAX_WORLD_SIZE => {}
            _ => {
                return bad(format!(
                    "--nnodes {} times --nproc-per-node {} is more than the {} ranks weft accepts",
                    self.nnodes,
                    self.nproc_per_node,
                    crate::env::MAX_WORLD_SIZE
                ))
            }
        }
        if self.min_nnodes == 0 || self.min_nnodes > self.nnodes {
            return bad(format!(
                "--nnodes {}:{}: the fewest nodes must be between 1 and the most",
                self.min_nnodes, self.nnodes
            ));
        }
        for (flag, d) in [
            ("--stop-timeout", self.stop_timeout),
            ("--rdzv-last-call", self.last_call),
            ("--rdzv-heartbeat-timeout", self.heartbeat_timeout),
        ] {
            if d > MAX_TIMEOUT {
                return bad(above_the_limit(flag, d.as_secs_f64()));
            }
        }
        if self.heartbeat_timeout < MIN_HEARTBEAT_TIMEOUT {
            return bad(format!(
                "--rdzv-heartbeat-timeout {} is below the shortest, 1 s",
                self.heartbeat_timeout.as_secs_f64()
            ));
        }
        if self.master_port == Some(0) && self.nnodes > 1 {
            return bad(
                "--master-port 0 with --nnodes above 1: the other nodes must know the store's port; give a fixed \
                 one (default 29500)"
                    .into(),
            );
        }
        if self.master_addr.trim().is_empty() {
            return bad("--master-addr is empty".into());
        }
        if self.program.is_empty() {
            return bad("no worker program given: weft launch [OPTIONS] -- PROGRAM [ARGS]...".into());
        }
        Ok(())
    }

    /// The host node 0's store listens on when one is given: [`LaunchConfig::store_bind`], else
    /// [`STORE_BIND_VAR`] when set and not empty (surrounding spaces ignored).
    pub fn store_bind_host(&self) -> Option<String> {
        self.store_bind
            .clone()
            .or_else(|| std::env::var(STORE_BIND_VAR).ok())
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
    }

    /// The job token: [`LaunchConfig::token`], else `WEFT_JOB_TOKEN`, else (single node) a new one.
    pub(super) fn resolve_token(&self) -> Result<Token> {
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

/// `--stop-timeout 1e19 is above the limit of 31536000 s (a year)`.
fn above_the_limit(flag: &str, secs: f64) -> String {
    format!(
        "{flag} {secs} is above the limit of {} s (a year)",
        MAX_TIMEOUT.as_secs()
    )
}

/// Parses a number of seconds given to `flag` (`--stop-timeout`, `--rdzv-last-call`): at least 0,
/// at most [`MAX_TIMEOUT`] (a year); the error is one line naming the flag and the value.
pub fn parse_seconds(flag: &str, secs: f64) -> Result<Duration> {
    if secs.is_finite() && secs > MAX_TIMEOUT.as_secs_f64() {
        return Err(Error::Invalid(above_the_limit(flag, secs)));
    }
    Duration::try_from_secs_f64(secs)
        .map_err(|_| Error::Invalid(format!("{flag} {secs} is not a number of seconds >= 0")))
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

#[cfg(test)]
mod tests {
    use super::*;

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
        // the world the launcher would hand its ranks: refused here, not by every rank's setup
        assert!(with(&|c| {
            c.nnodes = usize::MAX / 2;
            c.min_nnodes = c.nnodes
        })
        .contains("is more than the 1048576 ranks weft accepts"));
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
        assert!(with(&|c| c.nproc_per_node = 100_000).contains("--nproc-per-node 100000 is above the limit"));
        assert!(with(&|c| c.stop_timeout = Duration::MAX).contains("--stop-timeout 18446744073709552000 is above"));
        assert!(with(&|c| c.last_call = MAX_TIMEOUT * 2).contains("--rdzv-last-call 63072000 is above the limit"));
        assert!(with(&|c| {
            c.nnodes = 2;
            c.master_port = Some(0)
        })
        .contains("--master-port 0 with --nnodes above 1"));
    }

    #[test]
    fn seconds_are_bounded() {
        assert_eq!(
            parse_seconds("--stop-timeout", 1.5).unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(parse_seconds("--stop-timeout", 31536000.0).unwrap(), MAX_TIMEOUT);
        for v in [1e19, 1.8e19, 1.9e19, 31536000.5] {
            let e = parse_seconds("--stop-timeout", v).unwrap_err().to_string();
            assert_eq!(
                e,
                format!("--stop-timeout {v} is above the limit of 31536000 s (a year)")
            );
        }
        for v in [-1.0, f64::NAN, f64::INFINITY] {
            let e = parse_seconds("--rdzv-last-call", v).unwrap_err().to_string();
            assert!(
                e.contains(&format!("--rdzv-last-call {v} is not a number of seconds >= 0")),
                "{e}"
            );
        }
    }
}
