//! Joining the job: `init` reads who this rank is from the environment, reaches the rendezvous
//! store (serving it on rank 0 when no launcher does), connects to every other rank and returns
//! the group of all ranks.

use std::sync::Arc;
use std::time::Duration;

use crate::auth::Token;
use crate::env::{from_env, RankEnv};
use crate::error::{Error, Result};
use crate::group::{ProcessGroup, World};
use crate::mesh::Mesh;
use crate::store::{StoreClient, StoreServer};

/// Default time a rank waits for a peer before failing (as torch.distributed's 30 minutes is
/// long for a stuck job, weft uses 5).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The longest timeout weft accepts from outside (`WEFT_DIST_TIMEOUT`, `weft launch
/// --stop-timeout` and `--rdzv-last-call`): a year (365 days), in seconds 31536000. Longer
/// values are refused in one line rather than overflowing the clock.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// How a rank communicates.
#[derive(Clone, Debug)]
pub struct Options {
    /// How long a rank waits for a peer (connecting, or inside an operation) before failing.
    pub timeout: Duration,
    /// Use shared memory between ranks on one host (else TCP everywhere).
    pub shared_memory: bool,
    /// What identifies this rank's host (ranks with equal values share memory and count as one
    /// host for hierarchical collectives); by default the kernel's boot id, the host name and
    /// the network namespace. Set it when that guess is wrong, e.g. for containers on one
    /// machine that do not share /dev/shm.
    pub host_id: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            timeout: DEFAULT_TIMEOUT,
            shared_memory: true,
            host_id: None,
        }
    }
}

impl Options {
    /// From the environment: `WEFT_DIST_TIMEOUT` (seconds, default 300, at most
    /// [`MAX_TIMEOUT`]), `WEFT_SHM` (`0` turns shared memory off) and `WEFT_HOST_ID`.
    pub fn from_env() -> Result<Options> {
        let timeout = match std::env::var("WEFT_DIST_TIMEOUT") {
            Err(_) => DEFAULT_TIMEOUT,
            Ok(v) => parse_timeout(&v)?,
        };
        let shared_memory = match std::env::var("WEFT_SHM").as_deref() {
            Err(_) | Ok("1") => true,
            Ok("0") => false,
            Ok(v) => return Err(Error::Invalid(format!("WEFT_SHM={v:?} must be 0 or 1"))),
        };
        let host_id = std::env::var("WEFT_HOST_ID").ok().filter(|h| !h.is_empty());
        Ok(Options {
            timeout,
            shared_memory,
            host_id,
        })
    }
}

/// `WEFT_DIST_TIMEOUT`'s value `v`: a positive number of seconds, at most [`MAX_TIMEOUT`].
fn parse_timeout(v: &str) -> Result<Duration> {
    match v.trim().parse::<f64>() {
        Ok(s) if s > MAX_TIMEOUT.as_secs_f64() && s.is_finite() => Err(Error::Invalid(format!(
            "WEFT_DIST_TIMEOUT={v:?} is above the limit of {} s (a year)",
            MAX_TIMEOUT.as_secs()
        ))),
        Ok(s) if s > 0.0 && s.is_finite() => Ok(Duration::from_secs_f64(s)),
        _ => Err(Error::Invalid(format!(
            "WEFT_DIST_TIMEOUT={v:?} is not a positive number of seconds"
        ))),
    }
}

/// Joins the job described by the environment (see [`crate::env`]); a single-process group when
/// no distributed variables are set.
pub fn init() -> Result<ProcessGroup> {
    let env = from_env()?;
    let token = Token::from_env()?;
    init_with(env, token, &Options::from_env()?)
}

/// [`init`] with everything given: `env` (None: one process), the job token (required when
/// the world has more than one rank) and the options.
pub fn init_with(env: Option<RankEnv>, token: Option<Token>, options: &Options) -> Result<ProcessGroup> {
    let timeout = options.timeout;
    let Some(env) = env.filter(|e| e.world_size > 1) else {
        let world = Arc::new(World::new(Mesh::single(), None, None));
        return ProcessGroup::new(world, 0, vec![0]);
    };
    let token = token.ok_or_else(|| {
        Error::Invalid(
            "WEFT_JOB_TOKEN is not set: every rank needs the job's shared secret (weft launch sets it; under \
             srun or mpirun export the same random value to all ranks)"
                .into(),
        )
    })?;
    let server = if env.serves_store() {
        Some(StoreServer::start(
            &format!("{}:{}", crate::addr::any_interface(&env.master_addr), env.master_port),
            token.clone(),
        )?)
    } else {
        None
    };
    let addr = crate::addr::host_port(&env.master_addr, env.master_port);
    let store = StoreClient::connect(&addr, &token, timeout)?;
    let prefix = format!("attempt{}/", env.restart_count);
    let mesh = Mesh::connect(env.rank, env.world_size, &store, &token, &prefix, options)?;
    let world = Arc::new(World::new(mesh, Some(store), server));
    ProcessGroup::new(world, 0, (0..env.world_size).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_bounded() {
        assert_eq!(parse_timeout("2.5").unwrap(), Duration::from_millis(2500));
        assert_eq!(parse_timeout("31536000").unwrap(), MAX_TIMEOUT);
        for v in ["1e19", "31536001", "1.9e19"] {
            let e = parse_timeout(v).unwrap_err().to_string();
            assert!(
                e.contains(&format!("WEFT_DIST_TIMEOUT=\"{v}\" is above the limit of 31536000 s")),
                "{e}"
            );
        }
        for v in ["0", "-1", "inf", "NaN", "x"] {
            let e = parse_timeout(v).unwrap_err().to_string();
            assert!(e.contains("is not a positive number of seconds"), "{e}");
        }
    }
}
