//! Metric records a run's writer could not write while the store stayed locked, moved out of
//! memory into a file beside the store and read back, oldest first, once the store is free: what
//! waits in memory stays bounded however long the lock lasts, and the run never waits on it.
//!
//! The file is `runs.db.run-ID.spill` (the store's file name with the run's id); each record is
//! `step` (i64), `value` and `time` (f64 bits), all little-endian, then the key's length (u32)
//! and its UTF-8 bytes: values round-trip bit for bit, NaN included. Nothing else reads it: the
//! writer removes it once every record in it is written, or at the run's end whatever happened.
//! A file left by a writer that was killed (the run then resumed under the same id) is removed
//! when the run's next writer starts: its records are not that writer's.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// One metric record as the writer queues it: step, key, value, time (seconds since the epoch).
pub(crate) type Record = (i64, String, f64, f64);

/// The spill file of one run, and how much of it is written to the store.
pub(crate) struct Spill {
    path: PathBuf,
    /// Records appended and not yet read back.
    waiting: usize,
    /// Byte offset of the first record not yet read back.
    read_at: u64,
}

impl Spill {
    /// The spill of run `id` of the store file `store` (nothing is created until records come);
    /// a file a killed writer of the run left there is removed.
    pub(crate) fn new(store: &Path, id: i64) -> Spill {
        let name = store
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut spill = Spill {
            path: store.with_file_name(format!("{name}.run-{id}.spill")),
            waiting: 0,
            read_at: 0,
        };
        spill.remove();
        spill
    }

    /// Records in the file that are not written to the store yet.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting
    }

    /// Where the file is.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `records` (oldest first) and empties it. On an error nothing is taken from
    /// `records` (they stay in memory) and what the file held is unchanged for the reader.
    pub(crate) fn append(&mut self, records: &mut Vec<Record>) -> std::io::Result<()> {
        let mut file = OpenOptions::new().create(true).append(true).open(&self.path)?;
        let end = file.seek(SeekFrom::End(0))?;
        let written = (|| {
            let mut w = BufWriter::new(&mut file);
            for (step, key, value, time) in records.iter() {
                w.write_all(&step.to_le_bytes())?;
                w.write_all(&value.to_bits().to_le_bytes())?;
                w.write_all(&time.to_bits().to_le_bytes())?;
                let len = u32::try_from(key.len()).map_err(std::io::Error::other)?;
                w.write_all(&len.to_le_bytes())?;
                w.write_all(key.as_bytes())?;
            }
            w.flush()
        })();
        if let Err(e) = written {
            // a partly written tail would be read as records: cut it off
            let _ = file.set_len(end);
            return Err(e);
        }
        self.waiting += records.len();
        records.clear();
        Ok(())
    }

    /// Up to `n` of the oldest records not yet read, and the offset just past them (for
    /// [`Spill::advance`]); the file's position is not moved until then.
    pub(crate) fn peek(&self, n: usize) -> std::io::Result<(Vec<Record>, u64)> {
        let mut file = File::open(&self.path)?;
        file.seek(SeekFrom::Start(self.read_at))?;
        let mut r = BufReader::new(file);
        let mut out = Vec::with_capacity(n.min(self.waiting));
        let mut at = self.read_at;
        let mut word = [0u8; 8];
        let mut len = [0u8; 4];
        while out.len() < n.min(self.waiting) {
            r.read_exact(&mut word)?;
            let step = i64::from_le_bytes(word);
            r.read_exact(&mut word)?;
            let value = f64::from_bits(u64::from_le_bytes(word));
            r.read_exact(&mut word)?;
            let time = f64::from_bits(u64::from_le_bytes(word));
            r.read_exact(&mut len)?;
            let len = u32::from_le_bytes(len) as usize;
            let mut key = vec![0u8; len];
            r.read_exact(&mut key)?;
            let key = String::from_utf8(key).map_err(std::io::Error::other)?;
            at += 28 + len as u64;
            out.push((step, key, value, time));
        }
        Ok((out, at))
    }

    /// Marks the records [`Spill::peek`] returned (`count` of them, ending at `at`) as read;
    /// the file goes once nothing in it is waiting.
    pub(crate) fn advance(&mut self, count: usize, at: u64) {
        self.waiting -= count.min(self.waiting);
        self.read_at = at;
        if self.waiting == 0 {
            self.remove();
        }
    }

    /// Removes the file (what it still held is given up).
    pub(crate) fn remove(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        self.waiting = 0;
        self.read_at = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_a_killed_writer_left_is_not_read_back_as_the_next_writers() {
        let dir = std::env::temp_dir().join(format!("weft-spill-stale-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = dir.join("runs.db");
        let mut old = Spill::new(&store, 7);
        let mut stale: Vec<Record> = (1000..1040).map(|s| (s, "loss".to_string(), 9.0, 0.0)).collect();
        old.append(&mut stale).unwrap();
        // killed: nothing removed the file
        std::mem::forget(old);
        assert!(dir.join("runs.db.run-7.spill").exists());
        let mut new = Spill::new(&store, 7);
        let mut mine: Vec<Record> = (5..8).map(|s| (s, "loss".to_string(), f64::NAN, 1.5)).collect();
        new.append(&mut mine).unwrap();
        let (read, at) = new.peek(100).unwrap();
        assert_eq!(read.iter().map(|r| r.0).collect::<Vec<_>>(), [5, 6, 7]);
        assert!(read.iter().all(|r| r.2.is_nan() && r.3 == 1.5));
        new.advance(read.len(), at);
        assert!(!dir.join("runs.db.run-7.spill").exists(), "removed once read back");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
