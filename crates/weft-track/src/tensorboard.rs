//! TensorBoard event files (`events.out.tfevents.<seconds>.<host>`): scalars in the format
//! TensorBoard's readers take, so `tensorboard --logdir weft-runs` shows a run's curves. A file
//! is never overwritten: a run's file whose name is taken gets `.2`, `.3`, ... appended, and an
//! export's name holds the run's id (an existing one is refused).
//!
//! A file is a sequence of TFRecord records: the payload's length (u64, little-endian), the
//! masked CRC32C of those 8 bytes (u32, little-endian), the payload, and the masked CRC32C of
//! the payload. Each payload is an `Event` protobuf (tensorflow/core/util/event.proto): the
//! first holds `file_version: "brain.Event:2"`, each later one a `wall_time`, a `step` and a
//! `summary` with one `value { tag, simple_value }`. The few protobuf fields are encoded here by
//! hand (tags and varints, no protobuf crate); CRC32C comes from the `crc32c` crate.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The `file_version` of the first event.
pub const FILE_VERSION: &str = "brain.Event:2";

/// The CRC32C of `data`, masked as TFRecord stores it: rotated right by 15 bits plus
/// `0xa282ead8` (wrapping).
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// `payload` framed as one TFRecord record.
pub fn record(payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(payload.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(&masked_crc32c(payload).to_le_bytes());
    out
}

fn varint(mut x: u64, out: &mut Vec<u8>) {
    while x >= 0x80 {
        out.push((x as u8) | 0x80);
        x >>= 7;
    }
    out.push(x as u8);
}

/// A length-delimited field (wire type 2).
fn bytes_field(field: u32, data: &[u8], out: &mut Vec<u8>) {
    varint(u64::from(field << 3 | 2), out);
    varint(data.len() as u64, out);
    out.extend_from_slice(data);
}

/// `Event.wall_time` (field 1, a double: wire type 1).
fn wall_time_field(wall_time: f64, out: &mut Vec<u8>) {
    out.push(1 << 3 | 1);
    out.extend_from_slice(&wall_time.to_le_bytes());
}

/// The first event of a file: `wall_time` (seconds since the Unix epoch) and `file_version`.
pub fn file_version_event(wall_time: f64) -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    wall_time_field(wall_time, &mut out);
    bytes_field(3, FILE_VERSION.as_bytes(), &mut out);
    out
}

/// A scalar's event: `wall_time` (seconds since the Unix epoch), `step`, and a summary with one
/// value `{ tag, simple_value }` (a 32-bit float, as TensorBoard stores scalars).
pub fn scalar_event(wall_time: f64, step: i64, tag: &str, value: f32) -> Vec<u8> {
    // Summary.Value: tag (field 1, string), simple_value (field 2, float: wire type 5)
    let mut v = Vec::with_capacity(tag.len() + 8);
    bytes_field(1, tag.as_bytes(), &mut v);
    v.push(2 << 3 | 5);
    v.extend_from_slice(&value.to_le_bytes());
    // Summary: value (field 1, repeated message)
    let mut summary = Vec::with_capacity(v.len() + 2);
    bytes_field(1, &v, &mut summary);
    let mut out = Vec::with_capacity(summary.len() + 24);
    wall_time_field(wall_time, &mut out);
    // Event.step (field 2, int64 varint: negative steps take ten bytes, as protobuf says)
    out.push(2 << 3);
    varint(step as u64, &mut out);
    // Event.summary (field 5)
    bytes_field(5, &summary, &mut out);
    out
}

/// The file name TensorBoard looks for: `events.out.tfevents.<seconds>.<host>`.
pub fn file_name(wall_time: f64, host: &str) -> String {
    let host = if host.is_empty() { "localhost" } else { host };
    // the host comes from the store: one file name whatever it holds
    let host: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("events.out.tfevents.{}.{host}", wall_time as u64)
}

/// Writes one event file: the version event at creation, then scalars. Writes are buffered;
/// [`EventWriter::flush`] pushes them to the file (TensorBoard reads a growing file).
pub struct EventWriter {
    file: BufWriter<File>,
    path: PathBuf,
}

/// How many names [`EventWriter::create_in`] tries (`NAME`, `NAME.2`, ...) before it gives up.
const NAME_TRIES: u32 = 1000;

impl EventWriter {
    /// Creates `events.out.tfevents.<seconds>.<host>` in `dir` (made when missing; this host's
    /// name) and writes its version event. A name already taken (another file made in the same
    /// second: a resumed run writing beside its earlier file) gets `.2`, `.3`, ... appended: an
    /// existing file is never overwritten.
    pub fn create_in(dir: &Path) -> Result<EventWriter> {
        let now = crate::now();
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        Self::create_unique(dir, &file_name(now, &crate::writer::host_name()), now)
    }

    /// Creates `dir/name`, or `dir/name.2`, `dir/name.3`, ... when taken.
    fn create_unique(dir: &Path, name: &str, wall_time: f64) -> Result<EventWriter> {
        let mut n = 1;
        loop {
            let path = match n {
                1 => dir.join(name),
                n => dir.join(format!("{name}.{n}")),
            };
            match Self::create(&path, wall_time) {
                Err(Error::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::AlreadyExists && n < NAME_TRIES =>
                {
                    n += 1
                }
                made => return made,
            }
        }
    }

    /// Creates the file `path` and writes its version event at `wall_time` (seconds since the
    /// Unix epoch). A file already at `path` is an error (kind `AlreadyExists`), not
    /// overwritten: it holds another run's events, or an earlier export's.
    pub fn create(path: &Path, wall_time: f64) -> Result<EventWriter> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|source| {
                let source = if source.kind() == std::io::ErrorKind::AlreadyExists {
                    std::io::Error::new(
                        source.kind(),
                        "already exists; an event file is never overwritten (remove it, or write to another \
                         folder)",
                    )
                } else {
                    source
                };
                Error::Io {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
        let mut w = EventWriter {
            file: BufWriter::new(file),
            path: path.to_path_buf(),
        };
        w.write(&file_version_event(wall_time))?;
        Ok(w)
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends a scalar: `tag` at `step`, logged at `wall_time` (seconds since the Unix epoch);
    /// `value` is stored as a 32-bit float.
    pub fn scalar(&mut self, tag: &str, step: i64, value: f64, wall_time: f64) -> Result<()> {
        self.write(&scalar_event(wall_time, step, tag, value as f32))
    }

    fn write(&mut self, payload: &[u8]) -> Result<()> {
        self.file.write_all(&record(payload)).map_err(|source| Error::Io {
            path: self.path.clone(),
            source,
        })
    }

    /// Pushes buffered events to the file.
    pub fn flush(&mut self) -> Result<()> {
        self.file.flush().map_err(|source| Error::Io {
            path: self.path.clone(),
            source,
        })
    }
}

/// The name of run `id`'s exported event file: [`file_name`] of its start time and host, then
/// `.run-<id>`, so that runs started in the same second on one host (a sweep's parallel trials)
/// exported to one folder get files of their own, and an export into the run's own folder does
/// not take the name of the file the run wrote while it trained.
pub fn export_file_name(start_time: f64, host: &str, id: i64) -> String {
    format!("{}.run-{id}", file_name(start_time, host))
}

/// Writes run `id`'s metrics from `store` as one event file in `out_dir` (made when missing),
/// named by [`export_file_name`]: every recorded value, by step, each at the time it was
/// logged. The file's path. A file of that name already there (the run exported to the folder
/// before) is an error naming it, and is left as it is.
pub fn export_run(store: &crate::Store, id: i64, out_dir: &Path) -> Result<PathBuf> {
    let detail = store.run_detail(id)?;
    let mut rows = store.metric_rows(id)?;
    rows.sort_by(|a, b| a.0.cmp(&b.0).then(a.3.total_cmp(&b.3)));
    std::fs::create_dir_all(out_dir).map_err(|source| Error::Io {
        path: out_dir.to_path_buf(),
        source,
    })?;
    let start = detail.summary.start_time;
    let mut w = EventWriter::create(&out_dir.join(export_file_name(start, &detail.host, id)), start)?;
    for (step, key, value, time) in rows {
        w.scalar(&key, step, value, time)?;
    }
    w.flush()?;
    Ok(w.path().to_path_buf())
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        let _ = self.file.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_the_version_event() {
        let mut out = Vec::new();
        varint(300, &mut out);
        assert_eq!(out, [0xac, 0x02]);
        let e = file_version_event(0.0);
        assert_eq!(e[0], 0x09);
        assert_eq!(&e[9..11], &[0x1a, 13]);
        assert_eq!(&e[11..], FILE_VERSION.as_bytes());
        assert_eq!(file_name(1.7e9, "h"), "events.out.tfevents.1700000000.h");
        assert_eq!(file_name(1.7e9, "../x/.."), "events.out.tfevents.1700000000.___x___");
        assert_eq!(
            export_file_name(1.7e9, "h", 12),
            "events.out.tfevents.1700000000.h.run-12"
        );
    }

    #[test]
    fn a_taken_name_gets_a_number_and_no_file_is_overwritten() {
        let dir = std::env::temp_dir().join(format!("weft-track-tb-names-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let name = file_name(1.7e9, "h");
        // a run resumed in the second its earlier attempt started: File::create truncated the
        // earlier attempt's file
        std::fs::write(dir.join(&name), b"the earlier attempt's events").unwrap();
        let second = EventWriter::create_unique(&dir, &name, 1.7e9).unwrap();
        assert_eq!(second.path(), dir.join(format!("{name}.2")));
        let third = EventWriter::create_unique(&dir, &name, 1.7e9).unwrap();
        assert_eq!(third.path(), dir.join(format!("{name}.3")));
        assert_eq!(std::fs::read(dir.join(&name)).unwrap(), b"the earlier attempt's events");
        // a path given whole is refused when taken, naming it, and left as it is
        let e = EventWriter::create(&dir.join(&name), 1.7e9).err().unwrap();
        assert!(matches!(&e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::AlreadyExists));
        assert!(
            e.to_string().contains(&name) && e.to_string().contains("never overwritten"),
            "{e}"
        );
        assert_eq!(std::fs::read(dir.join(&name)).unwrap(), b"the earlier attempt's events");
        drop((second, third));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
