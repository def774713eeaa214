//! The process's limit on open file descriptors, against the servers' connection limits
//! (`--max-connections` of `weft serve` and `weft ui`).

/// Descriptors kept for the server's own files (models, the run store, logs) beyond its
/// connections.
const RESERVED: u64 = 256;

/// Raises the soft limit on open files to the hard limit (as Go's runtime does at start) and
/// returns the soft limit then; `None` where it cannot be read.
fn raise_to_hard_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write only the struct passed
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Some(raised.rlim_cur);
        }
    }
    Some(limit.rlim_cur)
}

/// The connections a port may hold open: `wanted` (`--max-connections`, at least 1), lowered
/// with one warning line when `ports` ports of that many, and [`RESERVED`] more, would pass
/// the process's limit on open files (raised to its hard limit first).
pub fn connections_per_port(program: &str, wanted: usize, ports: usize) -> Result<usize, String> {
    if wanted == 0 {
        return Err("--max-connections: 0 would accept no connection; give at least 1".into());
    }
    let Some(open_files) = raise_to_hard_limit() else {
        return Ok(wanted);
    };
    let room = open_files.saturating_sub(RESERVED) / ports.max(1) as u64;
    if (wanted as u64) <= room {
        return Ok(wanted);
    }
    let lowered = room.max(1) as usize;
    weft_core::errln!(
        "{program}: warning: --max-connections {wanted} on {ports} port(s) would pass this process's limit of \
         {open_files} open files (ulimit -n); each port holds at most {lowered}"
    );
    Ok(lowered)
}
