//! Recording one run: its row, params and tags at the start, then metrics and artifacts through
//! a channel to a background thread that writes them in batches, and its status at the end.

use std::path::Path;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::{params, Connection, TransactionBehavior};

use crate::error::{Error, Result, SqlContext};
use crate::metrics::insert_metrics;
use crate::resume::RunRef;
use crate::spill::{Record, Spill};
use crate::{OpenOptions, Status, Store};

/// What is known of a run when it starts.
#[derive(Debug, Clone, Default)]
pub struct NewRun {
    /// The experiment it belongs to (made when missing).
    pub experiment: String,
    /// Its name, unique in the experiment: `None` generates `run-N`; a name already taken gets
    /// `-2`, `-3`, ... appended.
    pub name: Option<String>,
    /// The command line that started it.
    pub command: String,
    /// The git commit of the working directory's work tree, and whether it had changes.
    pub git: Option<(String, bool)>,
    /// The machine's host name.
    pub host: String,
    /// The parallel layout, e.g. `dp=2 tp=1 pp=1 zero=0`.
    pub layout: String,
    /// Flat params (`optim.lr` -> `0.001`), stored as text, and as a number when they parse.
    pub params: Vec<(String, String)>,
    /// Tags (`key` -> `value`).
    pub tags: Vec<(String, String)>,
    /// What the run read: its data and initial weights (lineage). Initial weights (`init`,
    /// `resume_from`) without a `source_run` get the run whose recorded checkpoint folder holds
    /// them, if any.
    pub inputs: Vec<RunInput>,
}

/// One thing a run read, as the store records it (table `run_inputs`): MLflow's dataset
/// inputs, widened to any file or folder a run starts from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunInput {
    /// What it is to the run: `data`, `init` (`[init] from`) or `resume_from` (`weft train
    /// --resume-from`).
    pub kind: String,
    /// Where it is: an absolute path (links resolved), or an object store URL, or
    /// `builtin:NAME`.
    pub uri: String,
    /// What it held when the run read it, `sha256:HEX` (of the file, or of a token folder's
    /// `index.json`, which lists its shards' checksums); `None` where nothing was hashed (a
    /// folder of weights, a file too large to hash at the start).
    pub digest: Option<String>,
    /// The run of this store that wrote it (a checkpoint's run), when known.
    pub source_run: Option<i64>,
}

impl NewRun {
    /// A run of `experiment` with this process's command line, host and git state filled in.
    pub fn here(experiment: &str, name: Option<String>) -> NewRun {
        NewRun {
            experiment: experiment.to_string(),
            name,
            command: std::env::args().collect::<Vec<_>>().join(" "),
            git: git_state(Path::new(".")),
            host: host_name(),
            ..Default::default()
        }
    }
}

/// How a [`RunWriter`] batches its writes.
#[derive(Debug, Clone)]
pub struct WriterOptions {
    /// Write once this many records (metrics and artifacts) are waiting. Default: 512.
    pub batch: usize,
    /// Write records at most this long after they arrive. Default: 1 s.
    pub flush_every: Duration,
    /// How often the run's heartbeat is written while it lives. Default: 10 s.
    pub heartbeat: Duration,
    /// While the store stays locked, metric records waiting in memory past this many move to a
    /// file beside the store (`weft.db.run-ID.spill`), written to the store, oldest first, once
    /// it is free. Default: 262,144 (about 20 MB of records).
    pub spill_at: usize,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            batch: 512,
            flush_every: Duration::from_secs(1),
            heartbeat: Duration::from_secs(10),
            spill_at: 1 << 18,
        }
    }
}

enum Msg {
    Metric {
        step: i64,
        key: String,
        value: f64,
        time: f64,
    },
    Artifact {
        kind: String,
        path: String,
    },
    End {
        status: Status,
        error: Option<String>,
    },
}

/// Records one run. Cloning shares it; [`RunWriter::end`] (or dropping the last clone, which
/// records `failed`) writes what is waiting and the status, and stops the thread.
#[derive(Clone)]
pub struct RunWriter {
    inner: Arc<Inner>,
}

struct Inner {
    run_ref: RunRef,
    tx: Option<Sender<Msg>>,
    thread: Mutex<Option<JoinHandle<Result<()>>>>,
}

impl RunWriter {
    /// Opens the store in `dir` (see [`Store::open`]), records `run` as `running`, and starts
    /// the writing thread.
    pub fn start(dir: &Path, run: NewRun, options: WriterOptions) -> Result<RunWriter> {
        Self::start_with(dir, run, options, OpenOptions::default())
    }

    /// [`RunWriter::start`] with the store opened with `open` (its busy timeout is how long
    /// each of the run's writes waits for another's lock).
    pub fn start_with(dir: &Path, run: NewRun, options: WriterOptions, open: OpenOptions) -> Result<RunWriter> {
        let mut store = Store::open_with(dir, open)?;
        let run_ref = insert_run(&mut store, &run)?;
        Self::spawn(store, dir, run_ref, options)
    }

    /// Starts the writing thread of run `run_ref` (recorded as `running`) on `store`.
    pub(crate) fn spawn(store: Store, dir: &Path, run_ref: RunRef, options: WriterOptions) -> Result<RunWriter> {
        let Store { conn, path, .. } = store;
        let id = run_ref.run;
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("weft-track".into())
            .spawn(move || write_loop(conn, &path, id, rx, options))
            .map_err(|source| Error::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        Ok(RunWriter {
            inner: Arc::new(Inner {
                run_ref,
                tx: Some(tx),
                thread: Mutex::new(Some(thread)),
            }),
        })
    }

    /// The run's id in the store.
    pub fn id(&self) -> i64 {
        self.inner.run_ref.run
    }

    /// The run's name in its experiment.
    pub fn name(&self) -> &str {
        &self.inner.run_ref.name
    }

    /// Which run of which store this is: what a checkpoint keeps so that a run resumed from it
    /// continues this one ([`RunWriter::resume`]).
    pub fn run_ref(&self) -> &RunRef {
        &self.inner.run_ref
    }

    /// Queues a metric value at `step` (never blocks on the store; a few hundred nanoseconds).
    /// A NaN is not a metric row: SQLite has no NaN (it would be NULL, which a metric cannot
    /// be); the run's tag [`nan_tag`]`(key)` records the last step it was NaN at instead, so that
    /// a run whose metric ended NaN (it diverged) is not read as ending on its last number.
    /// Infinities are rows.
    pub fn log(&self, step: u64, key: &str, value: f64) {
        self.send(Msg::Metric {
            step: step as i64,
            key: key.to_string(),
            value,
            time: crate::now(),
        });
    }

    /// Queues an artifact (`kind` such as `checkpoint`, and its path, recorded absolute with
    /// links resolved where it exists, so that it names the same file from any working
    /// directory and a run's inputs are matched with it: [`Store::checkpoint_owner`]). An
    /// artifact the run already has (the same kind and path) is not recorded twice.
    pub fn artifact(&self, kind: &str, path: &Path) {
        let path = std::fs::canonicalize(path)
            .or_else(|_| std::path::absolute(path))
            .unwrap_or_else(|_| path.to_path_buf());
        self.send(Msg::Artifact {
            kind: kind.to_string(),
            path: path.display().to_string(),
        });
    }

    fn send(&self, msg: Msg) {
        if let Some(tx) = &self.inner.tx {
            // the thread is gone only after `end`: later records have nowhere to go
            let _ = tx.send(msg);
        }
    }

    /// Writes what is waiting and the run's status (with `error` for a failed run), and stops
    /// the thread. An error only when something was lost: the first error of a batch that was
    /// never written, or of the status. A store busy past its timeout for a while loses nothing
    /// (a missed heartbeat; a batch whose transaction could not start is kept and written by a
    /// later one) and is no error. Later calls do nothing.
    pub fn end(&self, status: Status, error: Option<String>) -> Result<()> {
        let Some(thread) = self.inner.thread.lock().ok().and_then(|mut t| t.take()) else {
            return Ok(());
        };
        self.send(Msg::End { status, error });
        thread.join().unwrap_or_else(|_| {
            Err(Error::Io {
                path: self.inner.run_ref.name.clone().into(),
                source: std::io::Error::other("the run's writing thread panicked"),
            })
        })
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // a run dropped without `end`: the thread sees the channel close and records `failed`
        self.tx.take();
        if let Some(thread) = self.thread.get_mut().ok().and_then(|t| t.take()) {
            let _ = thread.join();
        }
    }
}

/// Inserts the run with its params and tags in one transaction (making the store's id when it
/// has none); which run it is.
fn insert_run(store: &mut Store, run: &NewRun) -> Result<RunRef> {
    let path = store.path.clone();
    let experiment = store.experiment_id(&run.experiment)?;
    let tx = store
        .conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .at(&path)?;
    let store_id = crate::resume::store_id(&tx, &path)?;
    let taken = |name: &str| -> Result<bool> {
        tx.query_row(
            "SELECT count(*) FROM runs WHERE experiment_id = ?1 AND name = ?2",
            params![experiment, name],
            |r| r.get::<_, i64>(0),
        )
        .at(&path)
        .map(|n| n > 0)
    };
    let base = match &run.name {
        Some(n) => n.clone(),
        None => {
            let next: i64 = tx
                .query_row(
                    "SELECT count(*) + 1 FROM runs WHERE experiment_id = ?1",
                    params![experiment],
                    |r| r.get(0),
                )
                .at(&path)?;
            format!("run-{next}")
        }
    };
    let mut name = base.clone();
    let mut n = 2;
    while taken(&name)? {
        name = format!("{base}-{n}");
        n += 1;
    }
    let now = crate::now();
    // ids are never handed out twice, also after the newest run was deleted (what names a run by
    // id, a checkpoint, a model version, another run's input, keeps naming that run or none):
    // the highest id ever given is kept in `meta`
    let id: i64 = tx
        .query_row(
            "SELECT max(coalesce((SELECT max(id) FROM runs), 0),
                        coalesce((SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'last_run_id'), 0)) + 1",
            [],
            |r| r.get(0),
        )
        .at(&path)?;
    tx.execute(
        "INSERT INTO runs (id, experiment_id, name, status, start_time, command, git_commit, git_dirty, host,
         layout, heartbeat) VALUES (?9, ?1, ?2, 'running', ?3, ?4, ?5, ?6, ?7, ?8, ?3)",
        params![
            experiment,
            name,
            now,
            run.command,
            run.git.as_ref().map(|g| g.0.clone()),
            run.git.as_ref().map(|g| g.1),
            run.host,
            run.layout,
            id
        ],
    )
    .at(&path)?;
    tx.execute(
        "INSERT OR REPLACE INTO meta (key, value) VALUES ('last_run_id', ?1)",
        params![id.to_string()],
    )
    .at(&path)?;
    insert_params_and_tags(&tx, &path, id, run)?;
    tx.commit().at(&path)?;
    Ok(RunRef {
        store: store_id,
        run: id,
        experiment: run.experiment.clone(),
        name,
        start_time: now,
    })
}

/// Writes `run`'s params and tags for run `id` (replacing those of the same keys), and its
/// inputs (adding those it does not have yet).
pub(crate) fn insert_params_and_tags(conn: &Connection, path: &Path, id: i64, run: &NewRun) -> Result<()> {
    let mut p = conn
        .prepare("INSERT OR REPLACE INTO params (run_id, key, value, num) VALUES (?1, ?2, ?3, ?4)")
        .at(path)?;
    for (k, v) in &run.params {
        let num = v.trim().parse::<f64>().ok().filter(|x| x.is_finite());
        p.execute(params![id, k, v, num]).at(path)?;
    }
    let mut t = conn
        .prepare("INSERT OR REPLACE INTO tags (run_id, key, value) VALUES (?1, ?2, ?3)")
        .at(path)?;
    for (k, v) in &run.tags {
        t.execute(params![id, k, v]).at(path)?;
    }
    // an input recorded before (a resumed run reading the same data) is not recorded twice
    let mut i = conn
        .prepare(
            "INSERT INTO run_inputs (run_id, kind, uri, digest, source_run) SELECT ?1, ?2, ?3, ?4, ?5
             WHERE NOT EXISTS (SELECT 1 FROM run_inputs WHERE run_id = ?1 AND kind = ?2 AND uri = ?3
                               AND digest IS ?4)",
        )
        .at(path)?;
    for input in &run.inputs {
        let source_run = match (input.source_run, input.kind.as_str()) {
            (Some(r), _) => Some(r),
            // weights: from another run's checkpoint?
            (None, "init" | "resume_from") => crate::read::checkpoint_owner(conn, path, Some(id), &input.uri)?,
            (None, _) => None,
        };
        i.execute(params![id, input.kind, input.uri, input.digest, source_run])
            .at(path)?;
    }
    Ok(())
}

/// The writing thread: batches records, beats, and writes the status at the end; the first
/// error that lost records or the status.
fn write_loop(mut conn: Connection, path: &Path, id: i64, rx: Receiver<Msg>, o: WriterOptions) -> Result<()> {
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
    let (status, error) = loop {
        let flush_at = oldest.map(|t| t + o.flush_every);
        let beat_at = last_beat + o.heartbeat;
        let wake = flush_at.map_or(beat_at, |f| f.min(beat_at));
        let msg = rx.recv_timeout(wake.saturating_duration_since(Instant::now()));
        match msg {
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
            Ok(Msg::End { status, error }) => break (status, error),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                break (
                    Status::Failed,
                    Some("the run ended without recording its status".into()),
                )
            }
        }
        let due = oldest.is_some_and(|t| t.elapsed() >= o.flush_every);
        let full = !kept && metrics.len() + artifacts.len() >= o.batch;
        if full || due {
            let flushed = flush(&mut conn, path, id, &mut metrics, &mut artifacts, &mut spill);
            kept = matches!(flushed, Err(Flush::NotStarted(_)));
            spill_failed = false;
            if let Err(Flush::Lost(e)) = flushed {
                lost.get_or_insert(e);
            }
            // what is still waiting (kept, or after a lost spilled chunk) is tried again a flush
            // interval from now, also when nothing more arrives
            let waiting = !metrics.is_empty() || !artifacts.is_empty() || spill.waiting() > 0;
            oldest = waiting.then(Instant::now);
            last_beat = Instant::now();
        } else if last_beat.elapsed() >= o.heartbeat {
            // a missed beat loses nothing: the next one (or the end) writes a newer time
            let _ = beat(&conn, path, id);
            last_beat = Instant::now();
        }
    };
    // what cannot be written now is never written
    match flush(&mut conn, path, id, &mut metrics, &mut artifacts, &mut spill) {
        Ok(()) => {}
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
    if let Err(e) = end {
        lost.get_or_insert(e);
    }
    lost.map_or(Ok(()), Err)
}

/// Why a flush wrote nothing.
enum Flush {
    /// Its transaction could not start (the store stayed busy past its timeout): the records are
    /// kept for the next flush.
    NotStarted(Error),
    /// It failed once started: its records are gone.
    Lost(Error),
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
                    Err(lost) => Err(lost),
                };
            }
        };
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .at(path)
            .map_err(Flush::NotStarted)?;
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

/// The tag that holds the last step metric `key` was NaN at (a number, as text).
pub fn nan_tag(key: &str) -> String {
    format!("nan_step.{key}")
}

fn beat(conn: &Connection, path: &Path, id: i64) -> Result<()> {
    conn.execute(
        "UPDATE runs SET heartbeat = ?2 WHERE id = ?1",
        params![id, crate::now()],
    )
    .at(path)
    .map(|_| ())
}

/// The commit checked out in the git work tree holding `dir`, and whether the tree has changes;
/// `None` outside a work tree or without git.
pub fn git_state(dir: &Path) -> Option<(String, bool)> {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(dir)
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "HEAD"])?;
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some((commit, dirty))
}

/// This machine's host name (`/proc/sys/kernel/hostname`, `HOSTNAME`, or empty).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default()
}
