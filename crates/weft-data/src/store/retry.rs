//! Retrying one store operation.
//!
//! Transient failures (a refused or reset connection, a timeout, a response cut short, HTTP 5xx,
//! 429 or 408) are retried with exponential backoff (100 ms doubling to at most 5 s, with up to 25%
//! jitter) for as long as the time bound allows: the last pause is shortened to the time left, so
//! the last attempt starts at (about) the bound and an outage shorter than the bound is ridden
//! through. Definite answers (a missing
//! object or bucket, bad or insufficient credentials, any other 4xx, a malformed path) fail at
//! once. object_store's own retry loop is switched off (`max_retries = 0`) so that this one loop
//! decides and the bound holds for the whole operation, body included.

use std::time::{Duration, Instant};

/// Whether an error is worth another attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A transient failure: try again after a pause.
    Retry,
    /// A definite answer: report it now.
    Fail,
}

/// Sorts an object_store error into [`Verdict::Retry`] or [`Verdict::Fail`].
pub(crate) fn classify(e: &object_store::Error) -> Verdict {
    use object_store::Error as E;
    match e {
        E::Generic { .. } | E::JoinError { .. } => classify_chain(e),
        _ => Verdict::Fail,
    }
}

/// A generic error: an HTTP status in its text decides; otherwise a transport error anywhere in
/// its chain of sources is transient, and anything else is not.
fn classify_chain(e: &(dyn std::error::Error + 'static)) -> Verdict {
    if let Some(status) = http_status(&chain(e)) {
        return if status >= 500 || status == 429 || status == 408 {
            Verdict::Retry
        } else {
            Verdict::Fail
        };
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<object_store::client::HttpError>() {
            // an unknown kind is a request that could not be made (a URL scheme not allowed,
            // a malformed header): trying again changes nothing
            return match h.kind() {
                object_store::client::HttpErrorKind::Unknown => Verdict::Fail,
                _ => Verdict::Retry,
            };
        }
        if err.is::<std::io::Error>() || err.is::<tokio::task::JoinError>() {
            return Verdict::Retry;
        }
        cur = err.source();
    }
    Verdict::Fail
}

/// The status of an HTTP error response, as object_store words it ("status code: 503 ...").
fn http_status(text: &str) -> Option<u16> {
    let rest = &text[text.find("status code: ")? + "status code: ".len()..];
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// A `fmt::Write` that keeps the first `cap` bytes and then refuses more, which stops the
/// formatting: an error that quotes a server's response body of 1.5 GB was turned into text
/// whole, several times, costing 6 GB of memory and 35 s before the retry loop could look at
/// its clock.
struct Capped {
    text: String,
    cap: usize,
}

impl std::fmt::Write for Capped {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let room = self.cap.saturating_sub(self.text.len());
        if s.len() <= room {
            self.text.push_str(s);
            return Ok(());
        }
        let mut end = room;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.text.push_str(&s[..end]);
        Err(std::fmt::Error)
    }
}

/// The first 2,000 bytes or so of `err`'s message.
fn capped_text(err: &dyn std::error::Error) -> String {
    let mut w = Capped {
        text: String::new(),
        cap: 2000,
    };
    let _ = std::fmt::write(&mut w, format_args!("{err}"));
    w.text
}

/// An error and its sources on one line, each part once, whitespace collapsed, at most 600
/// characters (each part's message read only as far as that needs).
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        let text = capped_text(err).split_whitespace().collect::<Vec<_>>().join(" ");
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = err.source();
    }
    let mut line = parts.join(": ");
    if line.chars().count() > 600 {
        line = line.chars().take(597).collect::<String>() + "...";
    }
    line
}

/// The pause before retry number `attempt` (1-based): 100 ms doubling up to 5 s, lengthened by up
/// to 25% of jitter so that ranks retrying together spread out.
pub(crate) fn backoff(attempt: u32) -> Duration {
    let base = 100u64
        .saturating_mul(1u64 << attempt.saturating_sub(1).min(16))
        .min(5_000);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let jitter = base * u64::from(nanos % 256) / 1024; // 0..25%
    Duration::from_millis(base + jitter)
}

/// How an operation that ran out of attempts ended: the attempts, the time spent, the last error.
pub(crate) struct GaveUp {
    /// Attempts made (at least 1).
    pub attempts: u32,
    /// Time from the first attempt to the last failure.
    pub elapsed: Duration,
    /// The last error.
    pub last: object_store::Error,
    /// Whether the last error was transient (so the bound, not the error, ended the retries).
    pub transient: bool,
}

/// The least time an attempt is given, even when the bound is nearly spent.
const MIN_ATTEMPT: Duration = Duration::from_secs(1);

/// Runs `op` until it succeeds, fails definitively, or fails transiently with `bound` spent since
/// the first attempt. The pause before an attempt is the backoff or what is left of the bound,
/// whichever is shorter, so the last attempt starts at (about) the bound: a store down for less
/// than the bound is ridden through. (Retries stopped when the next backoff would pass the bound,
/// which gave up after 7.2 s of a 10 s bound, 56 s of 60.) `op` is told how long it may take
/// (what is left of the bound, at least 1 s), so that a server that never answers costs at most
/// the bound plus 1 s.
pub(crate) fn retry<T>(bound: Duration, mut op: impl FnMut(Duration) -> object_store::Result<T>) -> Result<T, GaveUp> {
    let start = Instant::now();
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        match op(bound.saturating_sub(start.elapsed()).max(MIN_ATTEMPT)) {
            Ok(v) => return Ok(v),
            Err(e) => {
                let transient = classify(&e) == Verdict::Retry;
                let elapsed = start.elapsed();
                let left = bound.saturating_sub(elapsed);
                if !transient || left.is_zero() {
                    return Err(GaveUp {
                        attempts,
                        elapsed,
                        last: e,
                        transient,
                    });
                }
                std::thread::sleep(backoff(attempts).min(left));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generic(msg: &str) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: msg.to_string().into(),
        }
    }

    #[test]
    fn a_huge_error_is_read_only_as_far_as_the_line_needs() {
        let body = "x".repeat(50 << 20);
        let e = generic(&format!(
            "Server returned non-2xx status code: 503 Service Unavailable: {body}"
        ));
        let t = Instant::now();
        assert_eq!(classify(&e), Verdict::Retry);
        let line = chain(&e);
        assert!(line.len() <= 600 && line.contains("503"), "{}", &line[..80]);
        assert!(t.elapsed() < Duration::from_millis(500), "{:?}", t.elapsed());
    }

    #[test]
    fn statuses_and_kinds_are_sorted() {
        let s503 =
            generic("Error performing GET x - Server returned non-2xx status code: 503 Service Unavailable: slow");
        let s400 = generic("Error performing GET x - Server returned non-2xx status code: 400 Bad Request: no");
        let s429 = generic("status code: 429 Too Many Requests");
        assert_eq!(classify(&s503), Verdict::Retry);
        assert_eq!(classify(&s429), Verdict::Retry);
        assert_eq!(classify(&s400), Verdict::Fail);
        assert_eq!(classify(&generic("something odd")), Verdict::Fail);
        let io = object_store::Error::Generic {
            store: "S3",
            source: Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
        };
        assert_eq!(classify(&io), Verdict::Retry);
        use object_store::client::{HttpError, HttpErrorKind};
        let http = |kind| object_store::Error::Generic {
            store: "S3",
            source: Box::new(HttpError::new(kind, std::io::Error::other("x"))),
        };
        assert_eq!(classify(&http(HttpErrorKind::Connect)), Verdict::Retry);
        assert_eq!(classify(&http(HttpErrorKind::Interrupted)), Verdict::Retry);
        assert_eq!(classify(&http(HttpErrorKind::Timeout)), Verdict::Retry);
        assert_eq!(classify(&http(HttpErrorKind::Unknown)), Verdict::Fail);
        let missing = object_store::Error::NotFound {
            path: "a".into(),
            source: "gone".into(),
        };
        assert_eq!(classify(&missing), Verdict::Fail);
        let denied = object_store::Error::PermissionDenied {
            path: "a".into(),
            source: "no".into(),
        };
        assert_eq!(classify(&denied), Verdict::Fail);
    }

    #[test]
    fn an_outage_shorter_than_the_bound_is_ridden_through() {
        // down for 1.3 s of a 1.5 s bound: attempts at about 0, 0.1, 0.3 and 0.7 s fail, the next
        // backoff (0.8 s or more) would pass the bound, so it is cut to the time left and the last
        // attempt, at the bound, succeeds (it gave up at about 0.7 s)
        let bound = Duration::from_millis(1500);
        let outage = Duration::from_millis(1300);
        let t = Instant::now();
        let mut n = 0;
        let r = retry(bound, |_| {
            n += 1;
            if t.elapsed() < outage {
                Err(generic("Error performing GET x: connection refused, status code: 503"))
            } else {
                Ok(n)
            }
        });
        match r {
            Ok(n) => assert!(n >= 2, "{n}"),
            Err(g) => panic!(
                "gave up after {} attempts in {:?} of a {bound:?} bound",
                g.attempts, g.elapsed
            ),
        }
        // a bound of zero: one attempt
        let mut m = 0;
        let r: Result<(), GaveUp> = retry(Duration::ZERO, |_| {
            m += 1;
            Err(generic("status code: 503 Service Unavailable"))
        });
        assert!(r.is_err() && m == 1, "{m}");
    }

    #[test]
    fn backoff_grows_to_a_cap() {
        assert!(backoff(1) >= Duration::from_millis(100) && backoff(1) <= Duration::from_millis(125));
        assert!(backoff(3) >= Duration::from_millis(400) && backoff(3) <= Duration::from_millis(500));
        assert!(backoff(40) >= Duration::from_secs(5) && backoff(40) <= Duration::from_millis(6250));
    }

    #[test]
    fn retry_stops_at_the_bound_and_on_definite_errors() {
        let t = Instant::now();
        let mut n = 0;
        let r: Result<(), GaveUp> = retry(Duration::from_millis(700), |_| {
            n += 1;
            Err(generic("status code: 500 Internal Server Error"))
        });
        let gave_up = r.err().unwrap();
        assert!(gave_up.transient && gave_up.attempts == n && n >= 3, "{n}");
        // the last attempt is made at the bound, not a backoff before it
        assert!(gave_up.elapsed >= Duration::from_millis(700), "{:?}", gave_up.elapsed);
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());

        let mut m = 0;
        let r: Result<(), GaveUp> = retry(Duration::from_secs(60), |_| {
            m += 1;
            Err(generic("status code: 403 Forbidden"))
        });
        assert!(!r.err().unwrap().transient);
        assert_eq!(m, 1);

        let mut k = 0;
        let r = retry(Duration::from_secs(60), |_| {
            k += 1;
            if k < 3 {
                Err(generic("status code: 502 Bad Gateway"))
            } else {
                Ok(k)
            }
        });
        assert_eq!(r.ok(), Some(3));
    }
}
