//! What a failing worker leaves for its launcher, so the launcher can tell which rank caused a
//! failure and which only failed because of it (torchrun's error files,
//! `TORCHELASTIC_ERROR_FILE`).
//!
//! `weft launch` gives each worker a path in [`ERROR_FILE_VAR`] (`WEFT_ERROR_FILE`). A worker
//! that fails calls [`record`] with its one-line error, which writes a small JSON object there:
//!
//! ```json
//! {"rank": 1, "time": 1716212345.125, "message": "mismatched collectives: ...", "caused_by": null}
//! ```
//!
//! `time` is in seconds since the Unix epoch; `caused_by` is the rank whose abort or closed
//! connection made one of this process's operations fail first (see [`caused_by`]), or `null`
//! when no peer did: then this rank failed on its own. Without the variable, [`record`] does
//! nothing.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The variable that names a worker's error file.
pub const ERROR_FILE_VAR: &str = "WEFT_ERROR_FILE";

/// The first peer that failed this process (see [`blame`]).
static FIRST_CAUSE: FirstCause = FirstCause::new();

/// The first peer rank set in it, once; `usize::MAX` while none is.
struct FirstCause(AtomicUsize);

impl FirstCause {
    const NONE: usize = usize::MAX;

    const fn new() -> FirstCause {
        FirstCause(AtomicUsize::new(Self::NONE))
    }

    fn set(&self, peer: usize) {
        if peer != Self::NONE {
            let _ = self
                .0
                .compare_exchange(Self::NONE, peer, Ordering::SeqCst, Ordering::SeqCst);
        }
    }

    fn get(&self) -> Option<usize> {
        match self.0.load(Ordering::SeqCst) {
            Self::NONE => None,
            p => Some(p),
        }
    }
}

/// Notes that an operation of this process failed because of global rank `peer` (its abort, or
/// its closed connection). Only the first call counts: later failures follow from it.
pub fn blame(peer: usize) {
    FIRST_CAUSE.set(peer);
}

/// The global rank whose abort or closed connection first made an operation of this process
/// fail, if any did.
pub fn caused_by() -> Option<usize> {
    FIRST_CAUSE.get()
}

/// One worker's error file.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// The worker's global rank (from its environment), if it knew it.
    pub rank: Option<usize>,
    /// When it failed, in seconds since the Unix epoch.
    pub time: f64,
    /// Its one-line error.
    pub message: String,
    /// The rank whose failure caused this one, if another rank's did.
    pub caused_by: Option<usize>,
}

impl Record {
    /// This process's record of `message`, now.
    pub fn now(message: &str) -> Record {
        Record {
            rank: crate::env::from_env().ok().flatten().map(|e| e.rank),
            time: unix_now(),
            message: message.to_string(),
            caused_by: caused_by(),
        }
    }

    /// The JSON text of the file.
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "rank": self.rank,
            "time": self.time,
            "message": self.message,
            "caused_by": self.caused_by,
        })
        .to_string()
    }

    /// Reads the JSON text of a file; `None` when it is not a record (a worker may write
    /// anything there).
    pub fn parse(text: &str) -> Option<Record> {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        let rank = |key: &str| v.get(key).and_then(|r| r.as_u64()).map(|r| r as usize);
        Some(Record {
            rank: rank("rank"),
            time: v.get("time")?.as_f64()?,
            message: v.get("message")?.as_str()?.to_string(),
            caused_by: rank("caused_by"),
        })
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> f64 {
    unix_time(SystemTime::now())
}

/// `t` in seconds since the Unix epoch (0 before it).
pub fn unix_time(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// Writes this process's [`Record`] of `message` to the file [`ERROR_FILE_VAR`] names, if it is
/// set. A file that cannot be written costs one warning line on stderr, nothing more.
pub fn record(message: &str) {
    let Some(path) = std::env::var_os(ERROR_FILE_VAR).filter(|p| !p.is_empty()) else {
        return;
    };
    let path = Path::new(&path);
    if let Err(e) = write(path, &Record::now(message)) {
        weft_core::errln!(
            "weft: cannot write the error file {} ({ERROR_FILE_VAR}): {e}",
            path.display()
        );
    }
}

/// Writes `rec` to `path` whole: into a file beside it, then renamed over it, so a reader never
/// sees half a record.
pub fn write(path: &Path, rec: &Record) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    std::fs::write(&tmp, rec.to_json())?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// The most [`read`] takes of an error file: a record is a few hundred bytes.
pub const MAX_RECORD_BYTES: u64 = 64 << 10;

/// The record at `path`, if there is a readable one. The worker chose what lies there, so the
/// file is opened without following a symbolic link and without blocking (a FIFO would hold the
/// launcher in `open` forever), only a regular file counts, and at most [`MAX_RECORD_BYTES`] of
/// it are read (a longer file is no record); anything else counts as no record.
pub fn read(path: &Path) -> Option<Record> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.file_type().is_file() {
        return None;
    }
    let mut text = String::new();
    f.take(MAX_RECORD_BYTES + 1).read_to_string(&mut text).ok()?;
    if text.len() as u64 > MAX_RECORD_BYTES {
        return None;
    }
    Record::parse(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_cause_counts() {
        let c = FirstCause::new();
        assert_eq!(c.get(), None);
        c.set(2);
        c.set(0);
        assert_eq!(c.get(), Some(2));
    }

    #[test]
    fn records_round_trip_through_files() {
        let dir = std::env::temp_dir().join(format!("weft-failure-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rank-1.json");
        let rec = Record {
            rank: Some(1),
            time: 1716212345.125,
            message: "mismatched \"collectives\"\nsecond line".into(),
            caused_by: Some(3),
        };
        write(&path, &rec).unwrap();
        assert_eq!(read(&path), Some(rec.clone()));
        let alone = Record {
            rank: None,
            caused_by: None,
            ..rec
        };
        write(&path, &alone).unwrap();
        assert_eq!(read(&path), Some(alone));
        // only the record is left: the temporary file was renamed
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::write(&path, "not json").unwrap();
        assert_eq!(read(&path), None);
        assert_eq!(Record::parse(r#"{"rank": 0}"#), None);
        assert_eq!(read(&dir.join("missing.json")), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// What a worker leaves at its error file is read without blocking, without following a
    /// link, and only so far: a FIFO, a link to `/dev/zero` and an endless file count as no
    /// record, at once.
    #[test]
    fn files_that_are_no_records_are_not_waited_on_or_read_without_end() {
        let dir = std::env::temp_dir().join(format!("weft-failure-odd-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo.json");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let zero = dir.join("zero.json");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let good = dir.join("good.json");
        let rec = Record {
            rank: Some(0),
            time: 1.5,
            message: "boom".into(),
            caused_by: None,
        };
        write(&good, &rec).unwrap();
        let linked = dir.join("linked.json");
        std::os::unix::fs::symlink(&good, &linked).unwrap();
        let big = dir.join("big.json");
        let padded = format!("{}{}", rec.to_json(), " ".repeat(MAX_RECORD_BYTES as usize));
        std::fs::write(&big, padded).unwrap();
        // in a thread, so the test fails rather than hangs when a read blocks
        let (tx, rx) = std::sync::mpsc::channel();
        let paths = [fifo, zero, linked, big, good];
        std::thread::spawn(move || {
            for p in paths {
                let _ = tx.send((p.clone(), read(&p)));
            }
        });
        let mut seen = Vec::new();
        for _ in 0..5 {
            let (p, r) = rx
                .recv_timeout(std::time::Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("reading an error file blocked; read so far: {seen:?}"));
            seen.push((p.file_name().unwrap().to_string_lossy().into_owned(), r));
        }
        let expected: Vec<(String, Option<Record>)> = ["fifo", "zero", "linked", "big"]
            .iter()
            .map(|n| (format!("{n}.json"), None))
            .chain([("good.json".to_string(), Some(rec))])
            .collect();
        assert_eq!(seen, expected);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
