//! `GET /api/runs/{id}/events`: a run's new metric values as server-sent events while it runs.
//!
//! The stream starts after a cursor: the `Last-Event-ID` header a browser's `EventSource` sends
//! when it reconnects (the last event it got), else `?after=N`, else the newest metric row of the
//! store (only values written from now on). The cursor is a metric row's id; `GET /api/runs/{id}/metrics` returns
//! one (`cursor`, taken before its series), so a page that draws the series and then streams
//! from its cursor misses nothing (a value read twice has a step the page already holds).
//!
//! Events, every [`POLL`] while there is something new:
//! - `metrics`: `{"points": {key: [[step, value, time], ...]}}`, its `id` the cursor after it;
//! - `end`: `{"status": "finished" | "failed" | "killed" | "deleted"}` once the run no longer
//!   runs (or its heartbeat stopped: `killed`) and every value it wrote was sent; the stream
//!   then closes;
//! - `reset`: `{"cursor": c}` when the store's newest row id fell below the cursor (rows with
//!   the newest ids were deleted: a run resumed or deleted, and SQLite hands their ids out
//!   again). The stream goes on from `c`; a page fetches the run's series again, since values
//!   written meanwhile under reused ids may have been passed over.
//!
//! The server's shutdown ends the stream without an event (the browser's `EventSource` tries
//! to connect again, as after any lost connection). A store error ends the stream with `error`: `{"error": message}`. An idle stream carries a
//! comment every 15 s, so proxies keep it open.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, StreamExt};
use rusqlite::params;
use serde_json::{json, Value};

use super::{on_store, query_pairs, reply, run_id, segments, Failure, Segments, Shared};
use crate::error::SqlContext;
use crate::read::{naming_run, RunOf};
use crate::{Result, Store};

/// How often a stream looks for new values.
pub const POLL: Duration = Duration::from_millis(300);

/// The most metric rows one `metrics` event carries.
const BATCH: i64 = 5000;

/// Past this many rows of the whole store after the cursor, the stream does not catch up row by
/// row: it sends `reset` with the newest row's id, and the page reads the run's series whole
/// (down-sampled). Catching up through the run's index sorted all of the run's rows at every
/// look (0.35 s each for a run of 2 million rows, about 400 looks to catch up, a core busy).
const SCAN_LIMIT: i64 = 100_000;

/// A metric row as the stream reads it: `(row id, step, key, value, time)`.
type Row = (i64, i64, String, f64, f64);

impl Store {
    /// The id of the newest metric row in the store (0 when there is none): a cursor for
    /// [`Store::metrics_after`].
    pub fn metric_cursor(&self) -> Result<i64> {
        self.conn
            .query_row("SELECT COALESCE(MAX(rowid), 0) FROM metrics", [], |r| r.get(0))
            .at(&self.path)
    }

    /// Run `id`'s metric rows with ids in `(after, upto]`, oldest first, at most `limit`: the
    /// store's rows in that range walked in id order, whichever run wrote them (few, on a live
    /// stream; a stream further behind is reset instead).
    pub fn metrics_after(&self, id: i64, after: i64, upto: i64, limit: i64) -> Result<Vec<Row>> {
        let sql = "SELECT rowid, step, key, value, time FROM metrics
             WHERE rowid > ?2 AND rowid <= ?3 AND +run_id = ?1 ORDER BY rowid LIMIT ?4";
        let p = &self.path;
        let mut stmt = self.conn.prepare_cached(sql).at(p)?;
        let rows = stmt
            .query_map(
                params![id, after, upto, limit],
                naming_run("metrics", RunOf::Id(id), |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                }),
            )
            .at(p)?;
        rows.collect::<rusqlite::Result<_>>().at(p)
    }

    /// Run `id`'s status (`running`, `finished`, ...), `None` when the store has no such run; a
    /// `running` run whose heartbeat is older than the store's `stale_after` reads `killed` (as
    /// the next open of the store will mark it; nothing is written here).
    /// A damaged row (a heartbeat that is text) is an error naming the run, the table and the
    /// column.
    pub fn run_status(&self, id: i64) -> Result<Option<String>> {
        let Some((status, heartbeat)) = self.status_and_heartbeat(id)? else {
            return Ok(None);
        };
        let stale = heartbeat < self.stale_before();
        Ok(Some(if status == "running" && stale {
            "killed".into()
        } else {
            status
        }))
    }
}

/// What one look at the store found.
struct Look {
    rows: Vec<Row>,
    /// The cursor after these rows.
    cursor: i64,
    /// The run's status once every row it wrote was read and it no longer runs.
    ended: Option<String>,
    /// The newest row id fell below the cursor: the cursor was moved back to it.
    reset: bool,
}

/// Reads what run `id` wrote after `cursor`.
fn look(store: &Store, id: i64, cursor: i64) -> Result<Look> {
    look_within(store, id, cursor, SCAN_LIMIT)
}

/// [`look`], resetting a cursor more than `scan_limit` rows behind.
fn look_within(store: &Store, id: i64, cursor: i64, scan_limit: i64) -> Result<Look> {
    // the status first: a run seen ended has written its last row before this read
    let status = store.run_status(id)?;
    let upto = store.metric_cursor()?;
    if upto - cursor > scan_limit {
        // far behind: the page reads the series whole, the stream goes on from the newest row
        return Ok(Look {
            rows: Vec::new(),
            cursor: upto,
            ended: status.map_or(Some("deleted".to_string()), |s| (s != "running").then_some(s)),
            reset: true,
        });
    }
    let reset = upto < cursor;
    let cursor = cursor.min(upto);
    let rows = store.metrics_after(id, cursor, upto, BATCH)?;
    let drained = (rows.len() as i64) < BATCH;
    let cursor = if drained {
        upto.max(cursor)
    } else {
        rows.last().map_or(cursor, |r| r.0)
    };
    let ended = match status {
        Some(s) if s == "running" => None,
        Some(s) => drained.then_some(s),
        None => Some("deleted".to_string()),
    };
    Ok(Look {
        rows,
        cursor,
        ended,
        reset,
    })
}

/// The `metrics` event of `rows`, its id `cursor`.
fn metrics_event(rows: &[Row], cursor: i64) -> Event {
    let mut points = serde_json::Map::new();
    for (_, step, key, value, time) in rows {
        let entry = points.entry(key.clone()).or_insert_with(|| json!([]));
        if let Value::Array(list) = entry {
            list.push(json!([step, super::json::num(*value), time]));
        }
    }
    Event::default()
        .event("metrics")
        .id(cursor.to_string())
        .data(json!({ "points": points }).to_string())
}

/// Where a stream starts: the `Last-Event-ID` header (a reconnect: the last event the client
/// got), else `?after=N` (the URL it first opened); `None` when neither.
fn start_cursor(query: Option<&str>, headers: &HeaderMap) -> std::result::Result<Option<i64>, Failure> {
    let q = query_pairs(query.unwrap_or(""));
    let given = headers
        .get("last-event-id")
        .map(|h| ("Last-Event-ID", String::from_utf8_lossy(h.as_bytes()).into_owned()))
        .or_else(|| q.iter().find(|(k, _)| k == "after").map(|(_, v)| ("after", v.clone())));
    match given {
        None => Ok(None),
        Some((what, v)) => match v.trim().parse::<i64>() {
            Ok(n) if n >= 0 => Ok(Some(n)),
            _ => Err(Failure(
                StatusCode::BAD_REQUEST,
                format!("{what}: expected a metric row id (a whole number, 0 or more), found {v:?}"),
            )),
        },
    }
}

/// Turns true when the server shuts down: the streams then end ([`super::app`]).
#[derive(Clone)]
pub(super) struct Closing(pub(super) tokio::sync::watch::Receiver<bool>);

/// A stream's state between looks.
struct Tail {
    store: Shared,
    closing: tokio::sync::watch::Receiver<bool>,
    id: i64,
    cursor: i64,
    first: bool,
    done: bool,
}

pub(super) async fn events(
    State(store): State<Shared>,
    axum::Extension(Closing(closing)): axum::Extension<Closing>,
    path: Segments<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    let start = segments(path).and_then(|id| start_cursor(q.as_deref(), &headers).and_then(|c| Ok((run_id(&id)?, c))));
    let (id, given) = match start {
        Ok(x) => x,
        Err(f) => return reply(Err(f)),
    };
    let opened = on_store(&store, move |s| Ok((s.has_run(id)?, s.metric_cursor()?))).await;
    let cursor = match opened {
        Ok((false, _)) => {
            return reply(Err(Failure(StatusCode::NOT_FOUND, format!("no run with id {id}"))));
        }
        Ok((true, newest)) => given.unwrap_or(newest),
        Err(e) => return reply(Err(e)),
    };
    let tail = Tail {
        store,
        closing,
        id,
        cursor,
        first: true,
        done: false,
    };
    let events = stream::unfold(tail, |mut t| async move {
        if t.done || *t.closing.borrow() {
            return None;
        }
        if !t.first {
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                // the server is shutting down (or the sender is gone with it)
                _ = t.closing.wait_for(|closing| *closing) => return None,
            }
        }
        t.first = false;
        let (id, cursor) = (t.id, t.cursor);
        let mut out = Vec::new();
        match on_store(&t.store, move |s| Ok(look(s, id, cursor)?)).await {
            Ok(look) => {
                t.cursor = look.cursor;
                if look.reset {
                    out.push(
                        Event::default()
                            .event("reset")
                            .id(look.cursor.to_string())
                            .data(json!({ "cursor": look.cursor }).to_string()),
                    );
                }
                if !look.rows.is_empty() {
                    out.push(metrics_event(&look.rows, look.cursor));
                }
                if let Some(status) = look.ended {
                    out.push(
                        Event::default()
                            .event("end")
                            .data(json!({ "status": status }).to_string()),
                    );
                    t.done = true;
                }
            }
            Err(Failure(_, e)) => {
                out.push(Event::default().event("error").data(json!({ "error": e }).to_string()));
                t.done = true;
            }
        }
        Some((out, t))
    })
    .flat_map(|events| stream::iter(events.into_iter().map(Ok::<Event, Infallible>)));
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NewRun, RunWriter, Status, WriterOptions};

    fn temp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("weft-live-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn rows_after_a_cursor_are_the_runs_own_in_order_and_a_run_ends_once_drained() {
        let dir = temp("after");
        let a = RunWriter::start(&dir, NewRun::default(), WriterOptions::default()).unwrap();
        let b = RunWriter::start(&dir, NewRun::default(), WriterOptions::default()).unwrap();
        for s in 0..10 {
            a.log(s, "loss", s as f64);
            b.log(s, "loss", -(s as f64));
        }
        a.end(Status::Finished, None).unwrap();
        b.end(Status::Finished, None).unwrap();
        let store = Store::open(&dir).unwrap();
        let upto = store.metric_cursor().unwrap();
        assert_eq!(upto, 20);
        let scan = store.metrics_after(a.id(), 0, upto, 100).unwrap();
        assert_eq!(
            scan.iter().map(|r| r.1).collect::<Vec<_>>(),
            (0..10).collect::<Vec<_>>()
        );
        assert!(scan.windows(2).all(|w| w[0].0 < w[1].0));
        // a cursor in the middle: only later rows
        let later = store.metrics_after(a.id(), scan[4].0, upto, 100).unwrap();
        assert_eq!(later, scan[5..].to_vec());
        // a cursor further behind than the limit: no rows, a reset to the newest row (the page
        // reads the series whole), and the end of a run that has ended
        let far = look_within(&store, a.id(), 0, 5).unwrap();
        assert!(far.rows.is_empty() && far.reset, "{:?}", far.rows);
        assert_eq!((far.cursor, far.ended.as_deref()), (upto, Some("finished")));
        let near = look_within(&store, a.id(), upto - 5, 5).unwrap();
        assert!(!near.reset);
        // a finished run ends only when its rows are all read
        let first = look(&store, a.id(), 0).unwrap();
        assert_eq!(first.rows.len(), 10);
        assert_eq!(first.ended.as_deref(), Some("finished"));
        assert_eq!(first.cursor, upto);
        let again = look(&store, a.id(), first.cursor).unwrap();
        assert!(again.rows.is_empty());
        assert_eq!(store.run_status(999).unwrap(), None);
        assert_eq!(look(&store, 999, 0).unwrap().ended.as_deref(), Some("deleted"));
        // a cursor past the newest row (its rows deleted): moved back, and said so
        let past = look(&store, a.id(), upto + 50).unwrap();
        assert!(past.reset && past.cursor == upto && past.rows.is_empty());
        assert!(!look(&store, a.id(), upto).unwrap().reset);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_running_run_whose_heartbeat_stopped_reads_killed() {
        let dir = temp("stale");
        // no beat or flush of its own during the test
        let quiet = WriterOptions {
            heartbeat: Duration::from_secs(3600),
            flush_every: Duration::from_secs(3600),
            ..WriterOptions::default()
        };
        let w = RunWriter::start(&dir, NewRun::default(), quiet).unwrap();
        let store = Store::open(&dir).unwrap();
        assert_eq!(store.run_status(w.id()).unwrap().as_deref(), Some("running"));
        store
            .conn
            .execute("UPDATE runs SET heartbeat = 0 WHERE id = ?1", params![w.id()])
            .unwrap();
        assert_eq!(store.run_status(w.id()).unwrap().as_deref(), Some("killed"));
        assert_eq!(look(&store, w.id(), 0).unwrap().ended.as_deref(), Some("killed"));
        drop(w);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_start_cursor_is_checked() {
        let mut h = HeaderMap::new();
        assert_eq!(start_cursor(None, &h).ok(), Some(None));
        assert_eq!(start_cursor(Some("after=12"), &h).ok(), Some(Some(12)));
        h.insert("last-event-id", "7".parse().unwrap());
        assert_eq!(start_cursor(None, &h).ok(), Some(Some(7)));
        // a reconnect keeps its URL: the header says where it got to
        assert_eq!(start_cursor(Some("after=3"), &h).ok(), Some(Some(7)));
        let h = HeaderMap::new();
        for bad in ["after=-1", "after=x", "after=1.5"] {
            let Err(Failure(code, msg)) = start_cursor(Some(bad), &h) else {
                panic!("{bad} accepted")
            };
            assert_eq!(code, StatusCode::BAD_REQUEST);
            assert!(msg.starts_with("after:"), "{msg}");
        }
    }
}
