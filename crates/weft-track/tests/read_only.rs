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

    // read-only by choice, in a writable folder
    let store = Store::open_read_only(&dir).unwrap();
    assert_eq!(store.list_runs(None).unwrap().len(), 1);
    drop(store);

    if !make_read_only(&dir) {
        make_writable(&dir);
        eprintln!("skipped: no way to make a folder read-only here (root without a working chattr)");
        return;
    }
    let opened = Store::open_existing(&dir);
    let mut store = match opened {
        Ok(store) => store,
        Err(e) => {
            make_writable(&dir);
            panic!("a store in a read-only folder: {e}");
        }
    };
    let runs = store.list_runs(None).unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].name, "kept");
    assert!(store.has_run(id).unwrap());
    // writing is an error, not a panic, and nothing is made in the folder
    assert!(store.delete_run(id).is_err());
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    make_writable(&dir);
    assert_eq!(files, vec![std::ffi::OsString::from("runs.db")]);
}
