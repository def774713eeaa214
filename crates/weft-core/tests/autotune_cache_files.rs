//! The autotuning cache file when something else stands at its path: a FIFO (read, it waited
//! for a writer for ever, and `weft train` with `autotune = "search"` hung at step 2), a symlink
//! to `/dev/zero` (read until memory ran out), a file past the size cap, a folder. Each is
//! ignored with a warning naming what it is, at once, and a search's write puts a regular file
//! in its place (not through the link, not into the FIFO); a folder stays, and the write says
//! why it failed.
#![cfg(unix)]

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use weft_core::tune;

/// `f()` on another thread, failing the test when it takes more than 20 s (it hung for ever).
fn within_20s<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{what}: still waiting after 20 s"))
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o600) },
        0,
        "mkfifo {}",
        path.display()
    );
}

/// A load ignores the file with a warning containing `why`; a save then leaves a regular file
/// holding this process's choice.
fn ignored_then_replaced(file: &Path, case: &str, why: &str) {
    tune::clear();
    let (n, warning) = within_20s(case, tune::load_cache);
    let warning = warning.unwrap_or_else(|| panic!("{case}: no warning"));
    assert_eq!(n, 0, "{case}");
    assert!(
        warning.contains(why) && warning.contains("ignored and will be rewritten"),
        "{case}: {warning}"
    );
    assert!(!warning.contains('\n'), "{case}: {warning}");
    let key = "gemm f32 m=1 n=2 k=3 threads=1";
    tune::record(key, 1);
    let written = within_20s(case, tune::save_cache).unwrap_or_else(|e| panic!("{case}: {e}"));
    assert_eq!(written, file);
    let meta = std::fs::symlink_metadata(file).unwrap();
    assert!(meta.file_type().is_file(), "{case}: {:?}", meta.file_type());
    let text = std::fs::read_to_string(file).unwrap();
    assert!(text.contains(key) && text.contains("one-thread"), "{case}: {text}");
    // and it is read back
    tune::clear();
    assert_eq!(tune::load_cache(), (1, None), "{case}");
    std::fs::remove_file(file).unwrap();
}

#[test]
fn a_cache_file_that_is_no_regular_file_is_ignored_at_once_and_replaced() {
    let dir = std::env::temp_dir().join(format!("weft-autotune-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // this test binary's only test: the variable is the process's
    std::env::set_var("WEFT_CACHE_DIR", &dir);
    let file = tune::cache_file();
    assert!(file.starts_with(&dir), "{}", file.display());

    mkfifo(&file);
    ignored_then_replaced(&file, "a FIFO", "is a FIFO, not a regular file");

    std::os::unix::fs::symlink("/dev/zero", &file).unwrap();
    ignored_then_replaced(
        &file,
        "a link to /dev/zero",
        "is a character device, not a regular file",
    );

    // a link to a regular file is read through, and replaced rather than written through
    let elsewhere = dir.join("elsewhere.json");
    std::fs::write(&elsewhere, br#"{"format": "weft-autotune-2", "choices": {}}"#).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &file).unwrap();
    tune::clear();
    assert_eq!(tune::load_cache(), (0, None));
    tune::record("gemm f32 m=1 n=2 k=3 threads=1", 1);
    tune::save_cache().unwrap();
    assert!(std::fs::symlink_metadata(&file).unwrap().file_type().is_file());
    assert_eq!(
        std::fs::read_to_string(&elsewhere).unwrap(),
        r#"{"format": "weft-autotune-2", "choices": {}}"#
    );
    std::fs::remove_file(&file).unwrap();

    // past the cap (sparse: nothing is written), without reading it
    let big = std::fs::File::create(&file).unwrap();
    big.set_len(tune::MAX_CACHE_FILE + 1).unwrap();
    drop(big);
    ignored_then_replaced(&file, "a file past the cap", "longer than the 16777216 bytes");

    // a folder: ignored, and the write fails saying why (the folder stays)
    std::fs::create_dir(&file).unwrap();
    tune::clear();
    let warning = tune::load_cache().1.unwrap();
    assert!(warning.contains("is a directory, not a regular file"), "{warning}");
    tune::record("gemm f32 m=1 n=2 k=3 threads=1", 1);
    let e = tune::save_cache().unwrap_err().to_string();
    assert!(e.contains("a directory"), "{e}");
    assert!(file.is_dir());

    tune::clear();
    let _ = std::fs::remove_dir_all(&dir);
}
