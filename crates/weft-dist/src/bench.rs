//! `weft bench collectives`: latency and bandwidth of each collective across the job, reported
//! with nccl-tests' conventions (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md): `bytes` is
//! the size of the whole buffer (the output of all_gather, the input of reduce_scatter),
//! algorithm bandwidth is `bytes / time`, and bus bandwidth scales it by the share of the data
//! that must cross each link: `2(n-1)/n` for all_reduce, `(n-1)/n` for all_gather,
//! reduce_scatter and all_to_all, 1 for broadcast and reduce.

use std::time::{Duration, Instant};

use weft_core::Tensor;

use crate::error::{Error, Result};
use crate::group::ProcessGroup;
use crate::reduce::ReduceOp;

/// The collectives the benchmark knows, in its default order.
pub const OPS: [&str; 6] = [
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "broadcast",
    "reduce",
    "all_to_all",
];

/// One measured (op, size).
#[derive(Clone, Debug)]
pub struct Row {
    pub op: &'static str,
    pub bytes: usize,
    pub ranks: usize,
    /// Median over iterations of the slowest rank's time per call, in microseconds.
    pub median_us: f64,
    pub algbw_gbps: f64,
    pub busbw_gbps: f64,
}

fn bus_factor(op: &str, n: usize) -> f64 {
    let n = n as f64;
    match op {
        "all_reduce" => 2.0 * (n - 1.0) / n,
        "all_gather" | "reduce_scatter" | "all_to_all" => (n - 1.0) / n,
        _ => 1.0,
    }
}

/// Bytes one rank holds to measure a buffer of `size` bytes across `ranks` ranks: the two whole
/// buffers and the share [`run`] allocates, and as much again for what is in flight (frames that
/// arrive before their receive is posted, up to a whole buffer; reduce-scatter's scratch, two
/// shares).
pub fn bytes_per_rank(size: usize, ranks: usize) -> u64 {
    let (whole, share) = (size as u64, (size / ranks.max(1)) as u64);
    whole.saturating_mul(3).saturating_add(share.saturating_mul(3))
}

/// Refuses a largest size whose buffers do not fit the memory this machine has left
/// ([`weft_core::memory::available`]) when `local_ranks` ranks of a job of `ranks` each hold
/// [`bytes_per_rank`]; `flag` (`--max-bytes 64G`, or `--sizes ...` for `weft check collectives`)
/// names it in the one-line error. Passes when the machine does not say how much it has.
pub fn check_memory(flag: &str, size: usize, ranks: usize, local_ranks: usize) -> Result<()> {
    let per_rank = bytes_per_rank(size, ranks);
    let needed = per_rank.saturating_mul(local_ranks.max(1) as u64);
    match weft_core::memory::available() {
        Some(a) if needed > a.bytes => Err(Error::Invalid(format!(
            "{flag} needs {needed} bytes on this machine ({local_ranks} rank(s) here, each holding {per_rank} \
             bytes: two buffers of {size} bytes, a share and room for messages in flight), but {} bytes are \
             available ({}); choose a smaller {}",
            a.bytes,
            a.source,
            flag.split(' ').next().unwrap_or(flag)
        ))),
        _ => Ok(()),
    }
}

/// A zeroed f32 tensor of `elems` elements for `what` (fallible, as every tensor allocation): an
/// error naming `what` when the memory cannot be had.
fn buffer(elems: usize, what: &str) -> Result<Tensor> {
    Tensor::zeros(&[elems], weft_core::DType::F32).map_err(|e| Error::Invalid(format!("{what}: {e}")))
}

/// Sizes from 4 KiB to 64 MiB, by factors of 4.
pub fn default_sizes() -> Vec<usize> {
    (0..8).map(|i| 4096usize << (2 * i)).collect()
}

/// Runs one call of `op`: `a` and `c` are whole buffers, `b` one rank's share.
fn call(pg: &ProcessGroup, op: &str, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<()> {
    match op {
        "all_reduce" => pg.all_reduce(a, ReduceOp::Sum)?.wait(),
        "reduce_scatter" => pg.reduce_scatter(b, a, ReduceOp::Sum)?.wait(),
        "all_gather" => pg.all_gather(a, b)?.wait(),
        "broadcast" => pg.broadcast(a, 0)?.wait(),
        "reduce" => pg.reduce(a, 0, ReduceOp::Sum)?.wait(),
        "all_to_all" => pg.all_to_all(c, a)?.wait(),
        other => Err(Error::Invalid(format!(
            "unknown collective {other:?}; known: {}",
            OPS.join(", ")
        ))),
    }
}

/// The slowest rank's value of `x`.
fn max_over_ranks(pg: &ProcessGroup, x: f64) -> Result<f64> {
    let t = Tensor::from_vec(vec![x], &[1])?;
    pg.all_reduce(&t, ReduceOp::Max)?.wait()?;
    Ok(t.to_vec::<f64>()?[0])
}

/// Measures each of `ops` at each of `sizes` (bytes; rounded down to whole f32 elements that
/// split evenly across ranks, at least one a rank), for about `budget` of calls per point (at
/// least 5 calls and at most 1000). Every rank returns the
/// same rows.
pub fn run(pg: &ProcessGroup, ops: &[&str], sizes: &[usize], budget: Duration) -> Result<Vec<Row>> {
    let n = pg.size();
    let mut rows = Vec::new();
    for &op in ops {
        let op: &'static str = OPS
            .iter()
            .find(|&&o| o == op)
            .ok_or_else(|| Error::Invalid(format!("unknown collective {op:?}; known: {}", OPS.join(", "))))?;
        for &size in sizes {
            let per_rank = (size / 4 / n).max(1);
            let elems = per_rank * n;
            let what = format!("{op} at {size} bytes");
            let a = buffer(elems, &what)?;
            let b = buffer(per_rank, &what)?;
            let c = buffer(elems, &what)?;
            // two warm-up calls, then as many calls as fit the budget (the same count on every
            // rank: the slowest rank's estimate decides)
            let t0 = Instant::now();
            for _ in 0..2 {
                call(pg, op, &a, &b, &c)?;
            }
            let each = max_over_ranks(pg, t0.elapsed().as_secs_f64() / 2.0)?;
            let iters = ((budget.as_secs_f64() / each.max(1e-9)) as usize).clamp(5, 1000);
            let mut times = Vec::with_capacity(iters);
            for _ in 0..iters {
                let t = Instant::now();
                call(pg, op, &a, &b, &c)?;
                times.push(t.elapsed().as_secs_f64());
            }
            times.sort_by(|x, y| x.total_cmp(y));
            let median = max_over_ranks(pg, times[iters / 2])?;
            let bytes = elems * 4;
            let algbw = bytes as f64 / median / 1e9;
            rows.push(Row {
                op,
                bytes,
                ranks: n,
                median_us: median * 1e6,
                algbw_gbps: algbw,
                busbw_gbps: algbw * bus_factor(op, n),
            });
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_too_large_are_errors_not_aborts() {
        assert_eq!(buffer(3, "x").unwrap().to_vec::<f32>().unwrap(), vec![0.0; 3]);
        // more than any address space, and more than any machine has
        for elems in [usize::MAX / 2, 1 << 60] {
            let e = buffer(elems, "all_reduce at 4 EiB").unwrap_err().to_string();
            assert!(
                e.starts_with("all_reduce at 4 EiB: ") && e.contains("cannot allocate"),
                "{e}"
            );
        }
    }

    #[test]
    fn memory_needed_per_rank_and_node() {
        assert_eq!(bytes_per_rank(1 << 20, 2), 3 * (1 << 20) + 3 * (1 << 19));
        assert_eq!(bytes_per_rank(usize::MAX, 1), u64::MAX);
        check_memory("--max-bytes 4K", 4096, 2, 2).unwrap();
        if weft_core::memory::available().is_some() {
            let e = check_memory("--max-bytes 1E", 1 << 60, 2, 2).unwrap_err().to_string();
            assert!(
                e.starts_with("--max-bytes 1E needs ") && e.contains("bytes are available"),
                "{e}"
            );
        }
    }
}
