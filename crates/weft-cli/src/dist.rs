//! `weft check collectives` and `weft bench collectives`: programs meant to run under
//! `weft launch` (or srun / mpirun), one process per rank.

use std::time::Duration;

use weft_dist::env::RankEnv;
use weft_dist::selfcheck::Fault;

#[derive(clap::Args)]
pub struct CheckArgs {
    /// Element counts per rank to check at, comma-separated (K and M suffixes: x1024, x1048576).
    #[arg(long, default_value = "1,1000,70000")]
    sizes: String,
    /// Inject a fault to watch the failure paths: `kill` (a rank kills itself) or `mismatch` (a
    /// rank calls broadcast where the others call the scheduled collective).
    #[arg(long, value_parser = ["kill", "mismatch"])]
    inject: Option<String>,
    /// The rank that misbehaves under --inject.
    #[arg(long, default_value_t = 1)]
    inject_rank: usize,
    /// Before which collective (counted from 0) the fault happens.
    #[arg(long, default_value_t = 3)]
    inject_at: usize,
}

#[derive(clap::Args)]
pub struct BenchArgs {
    /// One JSON object per line (rank 0 only) instead of a table.
    #[arg(long)]
    json: bool,
    /// Collectives to measure, comma-separated (default: all).
    #[arg(long)]
    ops: Option<String>,
    /// Smallest buffer, in bytes (K, M and G suffixes allowed). Each size is measured as whole
    /// f32 elements split evenly across the ranks, at least one a rank (the table shows the
    /// bytes moved).
    #[arg(long, default_value = "4K")]
    min_bytes: String,
    /// Largest buffer, in bytes (K, M and G suffixes allowed); sizes grow by factors of 4. Each
    /// rank holds about three times the largest size; sizes that do not fit this machine's
    /// free memory are refused.
    #[arg(long, default_value = "64M")]
    max_bytes: String,
    /// Measuring time per (op, size), in milliseconds: as many calls as fit it, at least 5 and
    /// at most 1000 (so a small buffer may take less, a slow one more).
    #[arg(long, default_value_t = 300)]
    budget_ms: u64,
}

/// `4096`, `4K`, `64M` (binary units).
fn parse_size(flag: &str, s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1usize << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("{flag} {s:?} is not a size (a number with an optional K, M or G suffix)"))
}

/// This process's place in its job; an error naming `command` when it runs outside one (no
/// launcher, Slurm or OpenMPI variables), where it would only measure or check itself.
fn in_a_job(command: &str) -> Result<RankEnv, String> {
    weft_dist::env::from_env().map_err(|e| e.to_string())?.ok_or_else(|| {
        format!(
            "weft {command} runs across the ranks of a job, and this process is not in one (no weft launch, Slurm \
             or OpenMPI variables): start it under weft launch, e.g. `weft launch --nproc-per-node 2 -- weft \
             {command}`"
        )
    })
}

pub fn run_check(args: &CheckArgs) -> Result<(), String> {
    let job = in_a_job("check collectives")?;
    let sizes = args
        .sizes
        .split(',')
        .map(|s| parse_size("--sizes", s))
        .collect::<Result<Vec<_>, _>>()?;
    // refused before anything is allocated, on every rank alike, as `weft bench collectives` does
    if let Some(&largest) = sizes.iter().max() {
        let bytes = weft_dist::selfcheck::largest_buffer(largest, job.world_size).map_err(|e| e.to_string())?;
        let flag = format!("--sizes {}", args.sizes.trim());
        weft_dist::bench::check_memory(&flag, bytes, job.world_size, job.local_world_size)
            .map_err(|e| e.to_string())?;
    }
    let fault = args.inject.as_deref().map(|k| match k {
        "kill" => Fault::Kill {
            rank: args.inject_rank,
            at: args.inject_at,
        },
        _ => Fault::Mismatch {
            rank: args.inject_rank,
            at: args.inject_at,
        },
    });
    let pg = weft_dist::init().map_err(|e| e.to_string())?;
    let checked = weft_dist::selfcheck::run(&pg, &sizes, fault).map_err(|e| e.to_string())?;
    let shm = (0..pg.size())
        .filter(|&p| p != pg.rank() && pg.uses_shared_memory(p))
        .count();
    weft_core::outln!(
        "rank {} of {}: {checked} results checked, all correct (peers: {shm} over shared memory, {} over TCP)",
        pg.rank(),
        pg.size(),
        pg.size() - 1 - shm
    );
    Ok(())
}

pub fn run_bench(args: &BenchArgs) -> Result<(), String> {
    let (lo, hi) = (
        parse_size("--min-bytes", &args.min_bytes)?,
        parse_size("--max-bytes", &args.max_bytes)?,
    );
    if lo == 0 || lo > hi {
        return Err(format!(
            "--min-bytes {lo} must be positive and at most --max-bytes {hi}"
        ));
    }
    let sizes: Vec<usize> = std::iter::successors(Some(lo), |&s| s.checked_mul(4))
        .take_while(|&s| s <= hi)
        .collect();
    let job = in_a_job("bench collectives")?;
    // refused before anything is allocated, on every rank alike
    if let Some(&largest) = sizes.last() {
        let flag = format!("--max-bytes {}", args.max_bytes.trim());
        weft_dist::bench::check_memory(&flag, largest, job.world_size, job.local_world_size)
            .map_err(|e| e.to_string())?;
    }
    let ops: Vec<String> = match &args.ops {
        Some(o) => o.split(',').map(|s| s.trim().to_string()).collect(),
        None => weft_dist::bench::OPS.iter().map(|s| s.to_string()).collect(),
    };
    let ops: Vec<&str> = ops.iter().map(|s| s.as_str()).collect();
    let pg = weft_dist::init().map_err(|e| e.to_string())?;
    let rows =
        weft_dist::bench::run(&pg, &ops, &sizes, Duration::from_millis(args.budget_ms)).map_err(|e| e.to_string())?;
    if pg.rank() != 0 {
        return Ok(());
    }
    let transport = match pg.size() {
        1 => "none",
        _ if pg.uses_shared_memory(1) => "shm",
        _ => "tcp",
    };
    if args.json {
        for r in &rows {
            weft_core::outln!(
                "{}",
                serde_json::json!({
                    "impl": "weft",
                    "op": r.op,
                    "bytes": r.bytes,
                    "ranks": r.ranks,
                    "transport": transport,
                    "median_us": (r.median_us * 10.0).round() / 10.0,
                    "algbw_gbps": (r.algbw_gbps * 1000.0).round() / 1000.0,
                    "busbw_gbps": (r.busbw_gbps * 1000.0).round() / 1000.0,
                })
            );
        }
    } else {
        if pg.size() == 1 {
            weft_core::outln!("1 rank: nothing crosses a link");
        } else {
            weft_core::outln!("{} ranks, {transport} between rank 0 and rank 1", pg.size());
        }
        weft_core::outln!("| op | bytes | median µs | algbw GB/s | busbw GB/s |");
        weft_core::outln!("|---|---:|---:|---:|---:|");
        for r in &rows {
            weft_core::outln!(
                "| {} | {} | {:.1} | {:.3} | {:.3} |",
                r.op,
                r.bytes,
                r.median_us,
                r.algbw_gbps,
                r.busbw_gbps
            );
        }
    }
    Ok(())
}
