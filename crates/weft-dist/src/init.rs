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

/// The operation timeout: `WEFT_DIST_TIMEOUT` (seconds) or [`DEFAULT_TIMEOUT`].
pub fn timeout_from_env() -> Result<Duration> {
    match std::env::var("WEFT_DIST_TIMEOUT") {
        Err(_) => Ok(DEFAULT_TIMEOUT),
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s > 0.0 && s.is_finite() => Ok(Duration::from_secs_f64(s)),
            _ => Err(Error::Invalid(format!(
                "WEFT_DIST_TIMEOUT={v:?} is not a positive number of seconds"
            ))),
        },
    }
}

/// Joins the job described by the environment (see [`crate::env`]); a single-process group when
/// no distributed variables are set.
pub fn init() -> Result<ProcessGroup> {
    let env = from_env()?;
    let token = Token::from_env()?;
    init_with(env, token, timeout_from_env()?)
}

/// [`init`] with everything given: `env` (None: one process), the job token (required when
/// the world has more than one rank) and the operation timeout.
pub fn init_with(env: Option<RankEnv>, token: Option<Token>, timeout: Duration) -> Result<ProcessGroup> {
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
            &format!("0.0.0.0:{}", env.master_port),
            token.clone(),
        )?)
    } else {
        None
    };
    let addr = format!("{}:{}", env.master_addr, env.master_port);
    let store = StoreClient::connect(&addr, &token, timeout)?;
    let prefix = format!("attempt{}/", env.restart_count);
    let mesh = Mesh::connect(env.rank, env.world_size, &store, &token, &prefix, timeout)?;
    let world = Arc::new(World::new(mesh, Some(store), server));
    ProcessGroup::new(world, 0, (0..env.world_size).collect())
}
