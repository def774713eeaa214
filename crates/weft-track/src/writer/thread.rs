//! The run's writing thread: batches records, beats, and writes the status at the end.

use std::path::Path;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Instant;

use rusqlite::{params, Connection, TransactionBehavior};

use super::{nan_tag, Msg, WriterOptions};
use crate::error::{Error, Result, SqlContext};
use crate::metrics::insert_metrics;
use crate::spill::{Record, Spill};
use crate::Status;

/// The writing thread: batches records, beats, and writes the status at the end; the first
/// error that lost records or the status. A run deleted from the store while it runs (`weft
/// runs delete`) is found at the next flush or beat: from then on nothing more is written for it
/// (every row would fail its foreign key), what arrives is dropped, and the end says the run was
/// deleted ([`deleted`]).
pub(super) fn write_loop(
    mut conn: Connection,
    path: &Path,
    id: i64,
    rx: Receiver<Msg>,
    o: WriterOptions,
) -> Result<()> {
    let mut metrics: Vec<Record> = Vec::with_capacity(o.batch.min(4096));
    let mut artifacts: Vec<(String, String)> = Vec::new();
    let mut oldest: Option<Instant> = None;
    // a batch whose transaction could not start waits for its retry (a flush interval later)
    // however large it grows: trying again at every record would block for the busy timeout
    // per record; records keep being received meanwhile (the channel never blocks the run), and
    // past `spill_at` of them they move to the spill file, so what waits in memory is bounded by
    // `spill_at` and what the run logs during one busy timeout
    let mut kept = false;
    let mut spill = Spill::new(path, id);
    // an append that failed (a full disk) is tried again at the next flush attempt, not at
    // every record
    let mut spill_failed = false;
    let mut last_beat = Instant::now();
    let mut lost: Option<Error> = None;
    // the run's row is gone: nothing more is written
    let mut gone = false;
    let (status, error) = loop {
        let flush_at = oldest.map(|t| t + o.flush_every);
        let beat_at = last_beat + o.heartbeat;
        let wake = flush_at.map_or(beat_at, |f| f.min(beat_at));
        let msg = if gone {
            // nothing to flush or beat: only the end is waited for
            rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
        } else {
            rx.recv_timeout(wake.saturating_duration_since(Instant::now()))
        };
        match msg {
            Ok(Msg::End { status, error }) => break (status, error),
            Err(RecvTimeoutError::Disconnected) => {
                break (
                    Status::Failed,
                    Some("the run ended without recording its status".into()),
                )
            }
            // nowhere to write it
            Ok(_) | Err(RecvTimeoutError::Timeout) if gone => continue,
            Ok(Msg::Metric { step, key, value, time }) => {
                metrics.push((step, key, value, time));
                oldest.get_or_insert_with(Instant::now);
                if kept && !spill_failed && metrics.len() >= o.spill_at.max(1) {
                    // a failed append leaves them in memory: nothing is lost either way
                    spill_failed = spill.append(&mut metrics).is_err();
                }
            }
            Ok(Msg::Artifact { kind, path }) => {
                artifacts.push((kind, path));
                oldest.get_or_insert_with(Instant::now);
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
        let due = oldest.is_some_and(|t| t.elapsed() >= o.flush_every);
        let full = !kept && metrics.len() + artifacts.len() >= o.batch;
        if full || due {
            let flushed = flush(&mut conn, path, id, &mut metrics, &mut artifacts, &mut spill);
            kept = matches!(flushed, Err(Flush::NotStarted(_)));
            spill_failed = false;
            match flushed {
                Err(Flush::Lost(e)) => {
                    lost.get_or_insert(e);
                }
                Err(Flush::Deleted) => {
                    gone = true;
                    metrics = Vec::new();
                    artifacts.clear();
                    spill.remove();
                }
                Ok(()) | Err(Flush::NotStarted(_)) => {}
            }
            // what is still waiting (kept, or after a lost spilled chunk) is tried again a flush
            // interval from now, also when nothing more arrives
            let waiting = !metrics.is_empty() || !artifacts.is_empty() || spill.waiting() > 0;
            oldest = waiting.then(Instant::now);
            last_beat = Instant::now();
        } else if last_beat.elapsed() >= o.heartbeat {
            // a missed beat loses nothing: the next one (or the end) writes a newer time
            if let Ok(0) = beat(&conn, path, id) {
                gone = true;
                metrics = Vec::new();
                artifacts.clear();
                spill.remove();
            }
            last_beat = Instant::now();
        }
    };
    if gone {
        spill.remove();
        return Err(deleted(path, id));
    }
    // what cannot be written now is never written
    match flush(&mut conn, path, id, &mut metrics, &mut artifacts, &mut spill) {
        Ok(()) => {}
        Err(Flush::Deleted) => {
            spill.remove();
            return Err(deleted(path, id));
        }
        // nothing was waiting: only a heartbeat is missed
        Err(Flush::NotStarted(_)) if metrics.is_empty() && artifacts.is_empty() && spill.waiting() == 0 => {}
        Err(Flush::NotStarted(e) | Flush::Lost(e)) => {
            lost.get_or_insert(e);
        }
    }
    spill.remove();
    let end = conn
        .execute(
            "UPDATE runs SET status = ?2, end_time = ?3, heartbeat = ?3, error = ?4 WHERE id = ?1",
            params![id, status.as_str(), crate::now(), error],
        )
        .at(path);
    match end {
        // deleted after its last rows were written: its status has nowhere to go
        Ok(0) => return Err(deleted(path, id)),
        Ok(_) => {}
        Err(e) => {
            lost.get_or_insert(e);
        }
    }
    lost.map_or(Ok(()), Err)
}

/// The error of a run whose row was deleted from the store while it ran.
fn deleted(path: &Path, id: i64) -> Error {
    Error::UnknownRun(format!(
        "{}: run {id} was deleted from the store while it ran (`weft runs delete`): what it logged \
         afterwards and its end are not recorded",
        path.display()
    ))
}

/// Whether run `id`'s row is in the store (read inside a flush's transaction, which holds the
/// write lock: no one deletes it before the transaction ends).
fn run_exists(tx: &rusqlite::Transaction, path: &Path, id: i64) -> Result<bool> {
    tx.query_row("SELECT count(*) FROM runs WHERE id = ?1", params![id], |r| {
        r.get::<_, i64>(0)
    })
    .at(path)
    .map(|n| n > 0)
}

/// Why a flush wrote nothing.
enum Flush {
    /// Its transaction could not start (the store stayed busy past its timeout): the records are
    /// kept for the next flush.
    NotStarted(Error),
    /// It failed once started: its records are gone.
    Lost(Error),
    /// The run's row is no longer in the store (deleted while the run runs): nothing was
    /// written, and nothing more can be.
    Deleted,
}

/// Spilled records at most per transaction when they are read back.
const SPILL_CHUNK: usize = 1 << 16;

/// Writes the waiting records and the heartbeat: the spilled ones first (the oldest), a
/// transaction per [`SPILL_CHUNK`], then those in memory in one.
fn flush(
    conn: &mut Connection,
    path: &Path,
    id: i64,
    metrics: &mut Vec<Record>,
    artifacts: &mut Vec<(String, String)>,
    spill: &mut Spill,
) -> std::result::Result<(), Flush> {
    while spill.waiting() > 0 {
        let (chunk, at) = match spill.peek(SPILL_CHUNK) {
            Ok(read) => read,
            Err(source) => {
                // unreadable: what it held is lost (and reported even when the records in
                // memory, tried next, are kept)
                let e = Error::Io {
                    path: spill.path().to_path_buf(),
                    source,
                };
                spill.remove();
                return match flush_memory(conn, path, id, metrics, artifacts) {
                    Ok(()) | Err(Flush::NotStarted(_)) => Err(Flush::Lost(e)),
                    Err(other) => Err(other),
                };
            }
        };
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .at(path)
            .map_err(Flush::NotStarted)?;
        if !run_exists(&tx, path, id).map_err(Flush::Lost)? {
            return Err(Flush::Deleted);
        }
        // started: this chunk is gone whatever happens to it, as a batch in memory
        spill.advance(chunk.len(), at);
        write_batch(&tx, path, id, chunk, Vec::new())
            .and_then(|()| tx.commit().at(path))
            .map_err(Flush::Lost)?;
    }
    flush_memory(conn, path, id, metrics, artifacts)
}

/// Writes the records waiting in memory and the heartbeat in one transaction.
fn flush_memory(
    conn: &mut Connection,
    path: &Path,
    id: i64,
    metrics: &mut Vec<Record>,
    artifacts: &mut Vec<(String, String)>,
) -> std::result::Result<(), Flush> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .at(path)
        .map_err(Flush::NotStarted)?;
    if !run_exists(&tx, path, id).map_err(Flush::Lost)? {
        return Err(Flush::Deleted);
    }
    // once the transaction started, the batch is gone whatever happens to it (a failed write
    // is not retried)
    let metrics = std::mem::take(metrics);
    let artifacts = std::mem::take(artifacts);
    write_batch(&tx, path, id, metrics, artifacts)
        .and_then(|()| tx.commit().at(path))
        .map_err(Flush::Lost)
}

/// Writes `metrics` and `artifacts` of run `id` and its heartbeat inside `tx`.
fn write_batch(
    tx: &rusqlite::Transaction,
    path: &Path,
    id: i64,
    metrics: Vec<Record>,
    artifacts: Vec<(String, String)>,
) -> Result<()> {
    let (nan, rows): (Vec<_>, Vec<_>) = metrics.into_iter().partition(|r| r.2.is_nan());
    insert_metrics(tx, path, id, &rows)?;
    let mut t = tx
        .prepare_cached(
            "INSERT INTO tags (run_id, key, value) VALUES (?1, ?2, ?3)
             ON CONFLICT (run_id, key) DO UPDATE SET value = CASE
               WHEN CAST(excluded.value AS INTEGER) > CAST(value AS INTEGER) THEN excluded.value ELSE value END",
        )
        .at(path)?;
    for (step, key, _, _) in nan {
        t.execute(params![id, nan_tag(&key), step.to_string()]).at(path)?;
    }
    let mut a = tx
        .prepare_cached(
            "INSERT INTO artifacts (run_id, kind, path) SELECT ?1, ?2, ?3 WHERE NOT EXISTS
             (SELECT 1 FROM artifacts WHERE run_id = ?1 AND kind = ?2 AND path = ?3)",
        )
        .at(path)?;
    for (kind, p) in artifacts {
        a.execute(params![id, kind, p]).at(path)?;
    }
    tx.execute(
        "UPDATE runs SET heartbeat = ?2 WHERE id = ?1",
        params![id, crate::now()],
    )
    .at(path)?;
    Ok(())
}

/// Writes run `id`'s heartbeat; how many rows it changed (0: the run was deleted).
fn beat(conn: &Connection, path: &Path, id: i64) -> Result<usize> {
    conn.execute(
        "UPDATE runs SET heartbeat = ?2 WHERE id = ?1",
        params![id, crate::now()],
    )
    .at(path)
}
