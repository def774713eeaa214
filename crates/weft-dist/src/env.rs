//! Where a rank learns who it is: the variables `weft launch` (and torchrun) set, Slurm's
//! (`srun`), or OpenMPI's (`mpirun`), in that order of precedence.

use crate::error::{Error, Result};

/// Default rendezvous port (torchrun's).
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// The most ranks a job may have: far beyond any cluster, small enough that every rank can
/// hold a slot per peer (connections, sequence numbers) without the sizes overflowing.
pub const MAX_WORLD_SIZE: usize = 1 << 20;

/// What started this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Starter {
    /// `weft launch`: the launcher serves the store.
    Launcher,
    /// torchrun-style variables without `weft launch` (RANK, WORLD_SIZE, ...): rank 0 serves.
    TorchrunVars,
    /// Slurm's `srun`: rank 0 serves the store.
    Slurm,
    /// OpenMPI's `mpirun`: rank 0 serves the store.
    OpenMpi,
}

/// This process's place in the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankEnv {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// How many times the launcher restarted the job's workers (0 on the first attempt).
    pub restart_count: u64,
    pub starter: Starter,
}

impl RankEnv {
    /// Whether this rank must serve the rendezvous store itself.
    pub fn serves_store(&self) -> bool {
        self.rank == 0 && self.starter != Starter::Launcher
    }
}

/// Reads the environment through `get` (so tests need not touch the process environment).
/// `Ok(None)` when no distributed variables are set: a single process.
pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<RankEnv>> {
    let num = |key: &str| -> Result<Option<usize>> {
        match get(key) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse::<usize>()
                .map(Some)
                .map_err(|_| Error::Invalid(format!("{key}={v:?} is not a non-negative integer"))),
        }
    };
    let need = |key: &str, what: &str| -> Result<usize> {
        num(key)?.ok_or_else(|| Error::Invalid(format!("{key} is not set ({what} needs it)")))
    };
    let port = match get("MASTER_PORT") {
        None => DEFAULT_MASTER_PORT,
        Some(p) => match p.trim().parse::<u16>() {
            // rank 0 would serve the store on some free port no other rank knows
            Ok(0) => {
                return Err(Error::Invalid(format!(
                    "MASTER_PORT={p:?}: the ranks must all know the store's port; give a fixed one, 1 to 65535 \
                     (default {DEFAULT_MASTER_PORT})"
                )))
            }
            Ok(port) => port,
            Err(_) => return Err(Error::Invalid(format!("MASTER_PORT={p:?} is not a port number"))),
        },
    };
    let restart_count = num("WEFT_RESTART_COUNT")?.unwrap_or(0) as u64;
    let (rank, world, local, local_world, addr, starter) = if get("RANK").is_some() {
        let what = "a rank started with RANK set";
        let rank = need("RANK", what)?;
        let world = need("WORLD_SIZE", what)?;
        let local = num("LOCAL_RANK")?.unwrap_or(rank);
        let local_world = num("LOCAL_WORLD_SIZE")?.unwrap_or(world);
        let starter = if get("WEFT_LAUNCHED").as_deref() == Some("1") {
            Starter::Launcher
        } else {
            Starter::TorchrunVars
        };
        (rank, world, local, local_world, get("MASTER_ADDR"), starter)
    } else if get("SLURM_PROCID").is_some() {
        let what = "a rank started by srun";
        let rank = need("SLURM_PROCID", what)?;
        let world = need("SLURM_NTASKS", what)?;
        let local = num("SLURM_LOCALID")?.unwrap_or(0);
        let local_world = get("SLURM_TASKS_PER_NODE")
            .and_then(|v| leading_int(&v))
            .or(num("SLURM_NTASKS_PER_NODE")?)
            .unwrap_or(1);
        let addr = get("MASTER_ADDR").or_else(|| {
            get("SLURM_JOB_NODELIST")
                .or_else(|| get("SLURM_NODELIST"))
                .and_then(|l| first_host(&l))
        });
        (rank, world, local, local_world, addr, Starter::Slurm)
    } else if get("OMPI_COMM_WORLD_RANK").is_some() {
        let what = "a rank started by mpirun";
        let rank = need("OMPI_COMM_WORLD_RANK", what)?;
        let world = need("OMPI_COMM_WORLD_SIZE", what)?;
        let local = num("OMPI_COMM_WORLD_LOCAL_RANK")?.unwrap_or(0);
        let local_world = num("OMPI_COMM_WORLD_LOCAL_SIZE")?.unwrap_or(1);
        (rank, world, local, local_world, get("MASTER_ADDR"), Starter::OpenMpi)
    } else {
        return Ok(None);
    };
    if world > MAX_WORLD_SIZE || local_world > MAX_WORLD_SIZE {
        return Err(Error::Invalid(format!(
            "a world of {world} ranks ({local_world} on this host) is more than the {MAX_WORLD_SIZE} weft accepts"
        )));
    }
    if world == 0 || rank >= world {
        return Err(Error::Invalid(format!(
            "rank {rank} is out of range for a world of {world}"
        )));
    }
    if local_world == 0 || local >= local_world {
        return Err(Error::Invalid(format!(
            "local rank {local} is out of range for {local_world} ranks on this host"
        )));
    }
    let master_addr = match addr {
        Some(a) if !a.trim().is_empty() => a.trim().to_string(),
        // all ranks on this host: the loopback address is right
        _ if local_world == world => "127.0.0.1".to_string(),
        _ => {
            return Err(Error::Invalid(
                "MASTER_ADDR is not set and ranks span several hosts: set it to the host of rank 0".into(),
            ))
        }
    };
    Ok(Some(RankEnv {
        rank,
        world_size: world,
        local_rank: local,
        local_world_size: local_world,
        master_addr,
        master_port: port,
        restart_count,
        starter,
    }))
}

/// [`from_vars`] on the process environment.
pub fn from_env() -> Result<Option<RankEnv>> {
    from_vars(|k| std::env::var(k).ok())
}

/// `4` from Slurm's `4(x2),3`.
fn leading_int(s: &str) -> Option<usize> {
    let digits: String = s.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// The first host of a Slurm node list: `node[07-09,12],gpu1` -> `node07`.
pub fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    // the first entry ends at a comma outside brackets
    let mut depth = 0;
    let mut end = list.len();
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let entry = &list[..end];
    let host = match entry.find('[') {
        None => entry.to_string(),
        Some(open) => {
            let inner = entry[open + 1..].trim_end_matches(']');
            let first = inner.split([',', '-']).next()?;
            format!("{}{}{}", &entry[..open], first, &entry[entry.find(']')? + 1..])
        }
    };
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<Option<RankEnv>> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn slurm_first_host() {
        assert_eq!(first_host("node[07-09,12],gpu1").as_deref(), Some("node07"));
        assert_eq!(first_host("a,b").as_deref(), Some("a"));
        assert_eq!(first_host("gpu[3]").as_deref(), Some("gpu3"));
        assert_eq!(first_host("rack[1-2]-n").as_deref(), Some("rack1-n"));
        assert_eq!(first_host(""), None);
    }

    #[test]
    fn sources_in_order() {
        assert_eq!(env(&[]).unwrap(), None);
        let l = env(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("WEFT_LAUNCHED", "1"),
            ("MASTER_PORT", "1234"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (l.rank, l.world_size, l.master_port, l.starter),
            (1, 2, 1234, Starter::Launcher)
        );
        assert_eq!(l.master_addr, "127.0.0.1");
        let s = env(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_TASKS_PER_NODE", "2(x2)"),
            ("SLURM_JOB_NODELIST", "n[4-5]"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((s.rank, s.world_size, s.local_rank, s.local_world_size), (3, 4, 1, 2));
        assert_eq!((s.master_addr.as_str(), s.starter), ("n4", Starter::Slurm));
        assert!(!s.serves_store());
        let m = env(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ])
        .unwrap()
        .unwrap();
        assert!(m.serves_store());
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = env(&[("RANK", "x"), ("WORLD_SIZE", "2")]).unwrap_err().to_string();
        assert!(e.contains("RANK=\"x\""), "{e}");
        let e = env(&[("RANK", "0"), ("WORLD_SIZE", "18446744073709551614")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than the 1048576 weft accepts"), "{e}");
        let e = env(&[("RANK", "2"), ("WORLD_SIZE", "2")]).unwrap_err().to_string();
        assert!(e.contains("rank 2 is out of range"), "{e}");
        let e = env(&[("RANK", "0")]).unwrap_err().to_string();
        assert!(e.contains("WORLD_SIZE is not set"), "{e}");
        let e = env(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("MASTER_ADDR is not set"), "{e}");
        let e = env(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_PORT", "99999")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("MASTER_PORT"), "{e}");
        for starter in [
            [("RANK", "0"), ("WORLD_SIZE", "2")],
            [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")],
        ] {
            let mut vars = starter.to_vec();
            vars.push(("MASTER_PORT", "0"));
            let e = env(&vars).unwrap_err().to_string();
            assert!(
                e.starts_with("MASTER_PORT=\"0\": the ranks must all know the store's port"),
                "{e}"
            );
        }
    }
}
