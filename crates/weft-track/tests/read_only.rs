//! A store on a folder that cannot be written (a read-only volume) is read as it is: SQLite's
//! write-ahead log cannot make its `-shm` file there, and every command reading the store
//! failed with "unable to open database file".

use std::path::{Path, PathBuf};
use std::process::Command;

use weft_track::{NewRun, RunWriter, Status, Store, WriterOptions};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-track-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn record(dir: &Path, name: &str) -> i64 {
    let run = NewRun {
        experiment: "exp".into(),
        name: Some(name.into()),
        ..Default::default()
    };
    let w = RunWriter::start(dir, run, WriterOptions::default()).unwrap();
    w.log(1, "loss", 0.5);
    let id = w.id();
    w.end(Status::Finished, None).unwrap();
    id
}

/// Whether a file can be made in `dir`.
fn writable(dir: &Path) -> bool {
    let probe = dir.join("probe");
    let ok = std::fs::write(&probe, b"").is_ok();
    let _ = std::fs::remove_file(&probe);
    ok
}

/// Makes `dir` impossible to write: its permissions (enough for anyone but root), else
/// `chattr +i` (root); `false` when neither works here.
fn make_read_only(dir: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555)).unwrap();
    if !writable(dir) {
        return true;
    }
    let _ = Command::new("chattr").arg("+i").arg(dir).status();
    !writable(dir)
}

fn make_writable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = Command::new("chattr").arg("-i").arg(dir).status();
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755));
}

#[test]
fn a_store_whose_folder_cannot_be_written_is_read_as_it_is() {
    let dir = temp_dir("read-only").join("store");
    let id = record(&dir, "kept");
    // what the last writer left is in the file itself (its connection closed: checkpointed)
    for leftover in ["runs.db-wal", "runs.db-shm"] {
        let _ = std::fs::remove_file(dir.join(leftover));
    }

    // read-only by choice, in a writable folder: it sees what others write once the file
    // changed and it is refreshed (SQLite trusts an immutable file not to change)
    let mut store = Store::open_read_only(&dir).unwrap();
    assert!(store.is_read_only());
    assert_eq!(store.list_runs(None).unwrap().len(), 1);
    assert!(!store.refresh().unwrap(), "nothing changed");
    let second = record(&dir, "later");
    for leftover in ["runs.db-wal", "runs.db-shm"] {
        let _ = std::fs::remove_file(dir.join(leftover));
    }
    assert!(store.refresh().unwrap(), "the file changed");
    assert!(store.has_run(second).unwrap());
    assert_eq!(store.list_runs(None).unwrap().len(), 2);
    // the stale runs' marking (at every open and dashboard run table) writes nothing here
    assert_eq!(store.mark_stale_unless_busy().unwrap(), 0);
    drop(store);

    // writable again however the test ends (a folder left immutable outlives the test)
    let _writable_again = WritableAgain(&dir);
    if !make_read_only(&dir) {
        eprintln!("skipped: no way to make a folder read-only here (root without a working chattr)");
        return;
    }
    let mut store = Store::open_existing(&dir).unwrap();
    let runs = store.list_runs(None).unwrap();
    assert_eq!(runs.len(), 2);
    assert!(runs.iter().any(|r| r.name == "kept"), "{runs:?}");
    assert!(store.has_run(id).unwrap());
    assert_eq!(store.mark_stale_unless_busy().unwrap(), 0);
    // writing is an error, not a panic, and nothing is made in the folder
    assert!(store.delete_run(id).is_err());
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(files, vec![std::ffi::OsString::from("runs.db")]);
}

/// Makes its folder writable again when dropped.
struct WritableAgain<'a>(&'a Path);

impl Drop for WritableAgain<'_> {
    fn drop(&mut self) {
        make_writable(self.0);
    }
}
