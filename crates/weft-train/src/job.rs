//! Keeping the ranks of a job together when one of them cannot go on: a preparation step that
//! fails on one rank fails on all, so no rank walks alone into a collective and waits there.

use weft_core::Tensor;
use weft_dist::{ProcessGroup, ReduceOp};

use crate::error::{Error, Result};

/// Every rank's `result` of one preparation step, made the same on every rank of `group`: when
/// any rank failed, each fails (the ranks that failed with their own error, the others naming
/// the lowest rank that did). `what` names the step in that message.
pub fn agree<T>(group: Option<&ProcessGroup>, result: Result<T>, what: &str) -> Result<T> {
    let failed = lowest_failed(group, result.is_err())?;
    match (result, failed) {
        (Err(e), _) => Err(e),
        (Ok(_), Some(failed)) => {
            // the launcher's report names that rank as the cause, not this one
            weft_dist::failure::blame(failed);
            Err(Error::Run(format!(
                "{what} failed on rank {failed} (its own message says why)"
            )))
        }
        (ok, None) => ok,
    }
}

/// Collective over `group`: the lowest rank (of the job) for which `failed` is true, if any.
pub fn lowest_failed(group: Option<&ProcessGroup>, failed: bool) -> Result<Option<usize>> {
    let Some(g) = group.filter(|g| g.size() > 1) else {
        return Ok(None);
    };
    // the lowest failed rank r as the largest value: size - r
    let mine = if failed { (g.size() - g.rank()) as f64 } else { 0.0 };
    let t = Tensor::from_vec(vec![mine], &[1])?;
    g.all_reduce(&t, ReduceOp::Max)?.wait()?;
    let worst = t.to_vec::<f64>()?[0] as usize;
    Ok((worst > 0).then(|| g.ranks()[g.size() - worst]))
}

/// Checks that `value` is the same on every rank of `group`; the lowest and highest values
/// otherwise.
pub fn same_everywhere(group: Option<&ProcessGroup>, value: usize) -> Result<std::result::Result<(), (usize, usize)>> {
    let Some(g) = group.filter(|g| g.size() > 1) else {
        return Ok(Ok(()));
    };
    let t = Tensor::from_vec(vec![value as f64, -(value as f64)], &[2])?;
    g.all_reduce(&t, ReduceOp::Max)?.wait()?;
    let v = t.to_vec::<f64>()?;
    let (lo, hi) = (-v[1] as usize, v[0] as usize);
    Ok(if lo == hi { Ok(()) } else { Err((lo, hi)) })
}
