//! Deadlines computed from durations that come from outside (`WEFT_DIST_TIMEOUT`,
//! `--stop-timeout`, a store request's wait, a library caller's options): a duration too long for
//! the clock means "never", not a panic ("overflow when adding duration to instant").

use std::time::{Duration, Instant};

/// How far off a deadline that does not fit the clock is put instead: about 100 years.
const NEVER: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// The instant `timeout` from now; for a timeout the clock cannot add, an instant far enough
/// off to count as never.
pub(crate) fn after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(NEVER))
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_timeouts_do_not_panic() {
        let now = Instant::now();
        assert!(after(Duration::MAX) > now + Duration::from_secs(365 * 24 * 60 * 60));
        assert!(after(Duration::from_secs_f64(1e19)) > now);
        let short = after(Duration::from_millis(5));
        assert!(short >= now && short < now + Duration::from_secs(5));
    }
}
