//! Recording one run: its row, params and tags at the start, then metrics and artifacts through
//! a channel to a background thread that writes them in batches, and its status at the end.

use std::path::Path;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{params, Connection, TransactionBehavior};

use crate::error::{Error, Result, SqlContext};
use crate::resume::RunRef;
use crate::{OpenOptions, Status, Store};

mod thread;

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
    /// file beside the store (`runs.db.run-ID.spill`), written to the store, oldest first, once
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
            .spawn(move || thread::write_loop(conn, &path, id, rx, options))
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

/// The tag that holds the last step metric `key` was NaN at (a number, as text).
pub fn nan_tag(key: &str) -> String {
    format!("nan_step.{key}")
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
