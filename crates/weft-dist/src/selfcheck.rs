//! `weft check collectives`: runs every collective on every dtype at a few sizes across the job
//! and checks each result element by element against a computation done locally (every rank's
//! input is a known function of its rank, so each rank can compute the expected output alone).
//! Also injects faults on request, to watch the failure paths of a real job.

use weft_core::{DType, Tensor};

use crate::error::{Error, Result};
use crate::group::ProcessGroup;
use crate::reduce::ReduceOp;

/// A fault to inject on one rank before its `at`-th collective (counted from 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The rank kills itself with SIGKILL (a crashed worker).
    Kill { rank: usize, at: usize },
    /// The rank calls a broadcast where the others call the scheduled collective.
    Mismatch { rank: usize, at: usize },
}

const DTYPES: [DType; 8] = [
    DType::F32,
    DType::F64,
    DType::BF16,
    DType::F16,
    DType::I64,
    DType::I32,
    DType::U8,
    DType::Bool,
];

/// Element `i` of rank `r`'s input: small integers, exact in every dtype and in sums of up to
/// 16 ranks (u8 stays below 256; bool is 0/1).
fn value(dtype: DType, rank: usize, i: usize) -> f64 {
    let v = ((rank * 7 + i * 3) % 11) as f64;
    match dtype {
        DType::Bool => (rank + i).is_multiple_of(3) as u8 as f64,
        DType::U8 => v % 8.0,
        _ => v - 3.0 * (i % 2) as f64,
    }
}

fn input(dtype: DType, rank: usize, n: usize) -> Result<Tensor> {
    // asked for fallibly, as tensors are: a size that does not fit is an error, not an abort
    let mut v: Vec<f64> = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| Error::Invalid(format!("no memory for a check buffer of {n} values")))?;
    v.extend((0..n).map(|i| value(dtype, rank, i)));
    Ok(Tensor::from_vec(v, &[n])?.cast(dtype)?)
}

/// Bytes of the largest buffer [`run`] builds for `k` elements per rank on `ranks` ranks: the
/// inputs of reduce_scatter and all_to_all, `ranks x k` values made as f64 (8 bytes each). An
/// error naming `--sizes` when that is beyond what this machine can address (`isize::MAX`).
pub fn largest_buffer(k: usize, ranks: usize) -> Result<usize> {
    k.checked_mul(ranks)
        .and_then(|n| n.checked_mul(8))
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| {
            Error::Invalid(format!(
                "--sizes {k}: {k} elements per rank on {ranks} ranks are more than this machine can address"
            ))
        })
}

fn reduced(dtype: DType, op: ReduceOp, world: usize, i: usize) -> f64 {
    let xs = (0..world).map(|r| value(dtype, r, i));
    match (dtype, op) {
        (DType::Bool, ReduceOp::Min) => xs.fold(1.0, f64::min),
        (DType::Bool, _) => xs.fold(0.0, f64::max),
        (_, ReduceOp::Sum) => xs.sum(),
        (_, ReduceOp::Avg) => xs.sum::<f64>() / world as f64,
        (_, ReduceOp::Max) => xs.fold(f64::MIN, f64::max),
        (_, ReduceOp::Min) => xs.fold(f64::MAX, f64::min),
    }
}

fn compare(what: &str, rank: usize, dtype: DType, got: &Tensor, want: impl Fn(usize) -> f64) -> Result<()> {
    // averages round in half precision; everything else is exact
    let tol = match dtype {
        DType::BF16 => 1e-2,
        DType::F16 => 1e-3,
        DType::F32 => 1e-6,
        _ => 0.0,
    };
    for (i, g) in got.to_vec_f64().into_iter().enumerate() {
        let w = want(i);
        if (g - w).abs() > tol * w.abs().max(1.0) {
            return Err(Error::Invalid(format!(
                "rank {rank}: {what}: element {i} is {g}, expected {w}"
            )));
        }
    }
    Ok(())
}

/// Runs the checks on `pg`; returns how many results were checked on this rank. `sizes` are
/// element counts per rank.
pub fn run(pg: &ProcessGroup, sizes: &[usize], fault: Option<Fault>) -> Result<usize> {
    let (r, n) = (pg.rank(), pg.size());
    for &k in sizes {
        largest_buffer(k, n)?;
    }
    if let Some(Fault::Kill { rank, .. } | Fault::Mismatch { rank, .. }) = fault {
        if rank >= n {
            return Err(Error::Invalid(format!(
                "--inject-rank {rank}: the job has ranks 0 to {}",
                n - 1
            )));
        }
    }
    let mut calls = 0usize;
    let mut checked = 0usize;
    // called before each collective: injects the fault when its turn comes
    let mut step = |pg: &ProcessGroup, t: &Tensor| -> Result<bool> {
        let at = calls;
        calls += 1;
        match fault {
            Some(Fault::Kill { rank, at: a }) if rank == r && a == at => {
                weft_core::errln!("weft check: rank {r} kills itself before collective #{at}, as asked");
                // SAFETY: sending a signal to this very process.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                Ok(false)
            }
            Some(Fault::Mismatch { rank, at: a }) if rank == r && a == at => {
                weft_core::errln!("weft check: rank {r} calls broadcast instead of collective #{at}, as asked");
                pg.broadcast(t, 0)?.wait()?;
                Ok(false)
            }
            _ => Ok(true),
        }
    };
    for &k in sizes {
        for dtype in DTYPES {
            let mut ops = vec![ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min];
            if dtype.is_float() {
                ops.push(ReduceOp::Avg);
            }
            for &op in &ops {
                let t = input(dtype, r, k)?;
                if step(pg, &t)? {
                    pg.all_reduce(&t, op)?.wait()?;
                }
                compare(&format!("all_reduce({op:?}, {dtype:?} x {k})"), r, dtype, &t, |i| {
                    reduced(dtype, op, n, i)
                })?;
                let full = input(dtype, r, n * k)?;
                let out = Tensor::zeros(&[k], dtype)?;
                if step(pg, &full)? {
                    pg.reduce_scatter(&out, &full, op)?.wait()?;
                }
                compare(
                    &format!("reduce_scatter({op:?}, {dtype:?} x {k})"),
                    r,
                    dtype,
                    &out,
                    |i| reduced(dtype, op, n, r * k + i),
                )?;
                checked += 2;
            }
            let out = Tensor::zeros(&[n * k], dtype)?;
            let mine = input(dtype, r, k)?;
            if step(pg, &mine)? {
                pg.all_gather(&out, &mine)?.wait()?;
            }
            compare(&format!("all_gather({dtype:?} x {k})"), r, dtype, &out, |i| {
                value(dtype, i / k, i % k)
            })?;
            for root in 0..n {
                let t = input(dtype, r, k)?;
                if step(pg, &t)? {
                    pg.broadcast(&t, root)?.wait()?;
                }
                compare(&format!("broadcast({dtype:?} x {k}, root {root})"), r, dtype, &t, |i| {
                    value(dtype, root, i)
                })?;
                let t = input(dtype, r, k)?;
                if step(pg, &t)? {
                    pg.reduce(&t, root, ReduceOp::Sum)?.wait()?;
                }
                if r == root {
                    compare(&format!("reduce({dtype:?} x {k}, root {root})"), r, dtype, &t, |i| {
                        reduced(dtype, ReduceOp::Sum, n, i)
                    })?;
                }
                checked += 2;
            }
            // all_to_all: chunk r of rank q's input lands in chunk q of this rank's output
            let inp = input(dtype, r, n * k)?;
            let out = Tensor::zeros(&[n * k], dtype)?;
            if step(pg, &inp)? {
                pg.all_to_all(&out, &inp)?.wait()?;
            }
            compare(&format!("all_to_all({dtype:?} x {k})"), r, dtype, &out, |i| {
                value(dtype, i / k, r * k + i % k)
            })?;
            checked += 2;
        }
        // point to point around the ring, two tags
        if n > 1 {
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            let sends: Vec<_> = (0..2u32)
                .map(|tag| pg.send(&input(DType::F32, r + tag as usize, k)?, next, tag))
                .collect::<Result<_>>()?;
            for tag in (0..2u32).rev() {
                let t = Tensor::zeros(&[k], DType::F32)?;
                pg.recv(&t, prev, tag)?.wait()?;
                compare(&format!("recv(f32 x {k}, tag {tag})"), r, DType::F32, &t, |i| {
                    value(DType::F32, prev + tag as usize, i)
                })?;
                checked += 1;
            }
            for s in sends {
                s.wait()?;
            }
        }
    }
    pg.barrier()?.wait()?;
    // every rank counted the same schedule: a fault past its end was never injected
    if let Some(Fault::Kill { at, .. } | Fault::Mismatch { at, .. }) = fault {
        if at >= calls {
            return Err(Error::Invalid(format!(
                "--inject-at {at}: the check made {calls} collectives (0 to {}), so nothing was injected",
                calls.saturating_sub(1)
            )));
        }
    }
    Ok(checked)
}
