//! Helpers for tests that run the `weft` binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;

/// The training fixtures written by `tools/reference/make_train_fixtures.py`.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../weft-train/tests/fixtures")
}

/// A fresh empty folder under the system temp dir.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `weft` with `args` on 2 compute threads.
pub fn weft(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(args)
        .env("WEFT_NUM_THREADS", "2")
        .output()
        .expect("the weft binary runs")
}

/// Runs `weft` and panics with its stderr unless it succeeds.
pub fn weft_ok(args: &[&str]) -> Output {
    let out = weft(args);
    assert!(
        out.status.success(),
        "weft {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The JSON objects of a metrics file.
pub fn read_metrics(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
