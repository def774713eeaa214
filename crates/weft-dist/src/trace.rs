//! A timeline of compute and communication spans per rank, written in the Chrome trace event
//! format (opens in Perfetto or `chrome://tracing`), as Horovod's timeline: one process row per
//! rank, one thread row per thread that did work (the training loop, each group's
//! communication thread), so overlap and stragglers can be seen.
//!
//! Recording is off until [`enable`] is called; a disabled [`span`] costs one atomic load.
//! Timestamps are microseconds of the system clock, so ranks on one host line up exactly (and
//! hosts as well as their clocks agree).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use weft_core::{DType, Tensor};

use crate::error::{Error, Result};
use crate::group::ProcessGroup;

/// One finished span.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    /// What ran: `forward`, `all_reduce(avg, f32 x 1024) #3`, ...
    pub name: String,
    /// `compute` or `comm` (a communication thread's work), or `wait` (a thread blocked on
    /// communication).
    pub cat: &'static str,
    /// The thread that did it (its name).
    pub thread: String,
    /// Start, microseconds since the Unix epoch.
    pub start_us: f64,
    /// Duration, microseconds.
    pub dur_us: f64,
}

static ENABLED: AtomicBool = AtomicBool::new(false);

struct Clock {
    instant: Instant,
    epoch_us: f64,
}

fn clock() -> &'static Clock {
    static CLOCK: OnceLock<Clock> = OnceLock::new();
    CLOCK.get_or_init(|| Clock {
        instant: Instant::now(),
        epoch_us: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64() * 1e6)
            .unwrap_or(0.0),
    })
}

fn spans() -> &'static Mutex<Vec<Span>> {
    static SPANS: Mutex<Vec<Span>> = Mutex::new(Vec::new());
    &SPANS
}

/// Starts recording spans in this process.
pub fn enable() {
    clock();
    ENABLED.store(true, Ordering::Release);
}

/// Whether spans are being recorded.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

fn micros(t: Instant) -> f64 {
    let c = clock();
    c.epoch_us + t.saturating_duration_since(c.instant).as_secs_f64() * 1e6
}

thread_local! {
    static THREAD: RefCell<Option<String>> = const { RefCell::new(None) };
}

fn thread_name() -> String {
    THREAD.with(|t| {
        t.borrow_mut()
            .get_or_insert_with(|| {
                let cur = std::thread::current();
                cur.name().unwrap_or("main").to_string()
            })
            .clone()
    })
}

/// Records a span of category `cat` that ran on this thread from `start` to `end`.
pub fn record(cat: &'static str, name: impl Into<String>, start: Instant, end: Instant) {
    if !enabled() {
        return;
    }
    let s = Span {
        name: name.into(),
        cat,
        thread: thread_name(),
        start_us: micros(start),
        dur_us: end.saturating_duration_since(start).as_secs_f64() * 1e6,
    };
    spans().lock().unwrap_or_else(|e| e.into_inner()).push(s);
}

/// A span recorded when dropped (nothing when recording is off).
pub struct SpanGuard {
    started: Option<(Instant, &'static str, String)>,
}

/// Starts a span of category `cat` named `name` on this thread; it ends when the guard drops.
pub fn span(cat: &'static str, name: impl Into<String>) -> SpanGuard {
    SpanGuard {
        started: enabled().then(|| (Instant::now(), cat, name.into())),
    }
}

impl Drop for SpanGuard {
    fn drop(&mut self) {
        if let Some((start, cat, name)) = self.started.take() {
            record(cat, name, start, Instant::now());
        }
    }
}

/// The spans recorded so far, removed from the recorder.
pub fn take() -> Vec<Span> {
    std::mem::take(&mut *spans().lock().unwrap_or_else(|e| e.into_inner()))
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// The spans of every rank (`(rank, spans)`) as one Chrome trace JSON document: a process per
/// rank, a thread per thread name, complete (`"ph": "X"`) events.
pub fn chrome_json(ranks: &[(usize, Vec<Span>)]) -> String {
    let mut events = Vec::new();
    for (rank, spans) in ranks {
        events.push(format!(
            r#"{{"ph":"M","name":"process_name","pid":{rank},"tid":0,"args":{{"name":"rank {rank}"}}}}"#
        ));
        let mut threads: Vec<&str> = Vec::new();
        for s in spans {
            if !threads.contains(&s.thread.as_str()) {
                threads.push(&s.thread);
            }
        }
        for (tid, t) in threads.iter().enumerate() {
            events.push(format!(
                r#"{{"ph":"M","name":"thread_name","pid":{rank},"tid":{tid},"args":{{"name":"{}"}}}}"#,
                escape(t)
            ));
        }
        for s in spans {
            let tid = threads.iter().position(|t| *t == s.thread).expect("listed");
            events.push(format!(
                r#"{{"ph":"X","name":"{}","cat":"{}","pid":{rank},"tid":{tid},"ts":{:.3},"dur":{:.3}}}"#,
                escape(&s.name),
                s.cat,
                s.start_us,
                s.dur_us
            ));
        }
    }
    format!("{{\"traceEvents\":[\n{}\n]}}\n", events.join(",\n"))
}

fn encode(spans: &[Span]) -> Vec<u8> {
    let mut out = Vec::new();
    for s in spans {
        for field in [s.name.as_str(), s.cat, s.thread.as_str()] {
            out.extend_from_slice(&(field.len() as u32).to_le_bytes());
            out.extend_from_slice(field.as_bytes());
        }
        out.extend_from_slice(&s.start_us.to_le_bytes());
        out.extend_from_slice(&s.dur_us.to_le_bytes());
    }
    out
}

fn decode(mut b: &[u8], peer: usize) -> Result<Vec<Span>> {
    let bad = || Error::Io(format!("rank {peer} sent a malformed trace"));
    let take = |n: usize, b: &mut &[u8]| -> Result<Vec<u8>> {
        if b.len() < n {
            return Err(bad());
        }
        let (h, t) = b.split_at(n);
        *b = t;
        Ok(h.to_vec())
    };
    let mut spans = Vec::new();
    while !b.is_empty() {
        let mut fields = Vec::new();
        for _ in 0..3 {
            let len = u32::from_le_bytes(take(4, &mut b)?.try_into().expect("4 bytes")) as usize;
            fields.push(String::from_utf8(take(len, &mut b)?).map_err(|_| bad())?);
        }
        let start_us = f64::from_le_bytes(take(8, &mut b)?.try_into().expect("8 bytes"));
        let dur_us = f64::from_le_bytes(take(8, &mut b)?.try_into().expect("8 bytes"));
        let cat = match fields[1].as_str() {
            "compute" => "compute",
            "comm" => "comm",
            "wait" => "wait",
            _ => "other",
        };
        spans.push(Span {
            name: fields[0].clone(),
            cat,
            thread: fields[2].clone(),
            start_us,
            dur_us,
        });
    }
    Ok(spans)
}

/// Collects every rank's spans on rank 0 of `pg` (or this process's alone without a group) and
/// writes them there to `path` as Chrome trace JSON. Every rank of the group must call it.
pub fn gather_and_write(pg: Option<&ProcessGroup>, path: &std::path::Path) -> Result<()> {
    let mine = take();
    let write = |ranks: &[(usize, Vec<Span>)]| {
        std::fs::write(path, chrome_json(ranks))
            .map_err(|e| Error::Io(format!("cannot write the trace {}: {e}", path.display())))
    };
    let Some(pg) = pg.filter(|g| g.size() > 1) else {
        return write(&[(0, mine)]);
    };
    const TAG: u32 = 0x7ace;
    if pg.rank() != 0 {
        let bytes = encode(&mine);
        let len = Tensor::from_vec(vec![bytes.len() as i64], &[1])?;
        pg.send(&len, 0, TAG)?.wait()?;
        let n = bytes.len();
        pg.send(&Tensor::from_vec(bytes, &[n])?, 0, TAG)?.wait()?;
        return Ok(());
    }
    let mut all = vec![(pg.global_rank(), mine)];
    for src in 1..pg.size() {
        let len = Tensor::zeros(&[1], DType::I64)?;
        pg.recv(&len, src, TAG)?.wait()?;
        let n = len.to_vec::<i64>()?[0];
        if !(0..=1 << 31).contains(&n) {
            return Err(Error::Io(format!("rank {src} announced a trace of {n} bytes")));
        }
        let buf = Tensor::zeros(&[n as usize], DType::U8)?;
        pg.recv(&buf, src, TAG)?.wait()?;
        all.push((pg.ranks()[src], decode(&buf.to_vec::<u8>()?, src)?));
    }
    write(&all)
}
