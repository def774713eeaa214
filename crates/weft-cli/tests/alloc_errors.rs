//! Sizes from outside that no machine here can hold (a config's width, batch or context length,
//! a thread count) end `weft train` with exit 1 and one `weft: error:` line naming the cause,
//! never an abort.

mod common;

use std::process::Output;

use common::weft;

/// Checks that `out` failed with exactly one `weft: error:` line, and returns it.
fn one_error_line(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("weft: error: "), "{err}");
    err
}

/// `setting` when this machine cannot hold `bytes` in one buffer, else `larger` (which no
/// machine can): the test means the same on every machine.
fn too_large<'a>(setting: &'a str, bytes: u64, larger: &'a str) -> &'a str {
    match weft_core::alloc::machine_memory() {
        Some(m) if m < bytes => setting,
        _ => larger,
    }
}

/// `weft train --quiet --set SETTING` on the built-in run fails naming a buffer it cannot
/// allocate, and the bytes.
fn refused(setting: &str) -> String {
    let err = one_error_line(&weft(&["train", "--quiet", "--set", setting]));
    assert!(
        err.contains(": cannot allocate ") && err.contains(" bytes): "),
        "{setting}: {err}"
    );
    if weft_core::alloc::machine_memory().is_some() {
        assert!(err.contains("more than this machine's"), "{setting}: {err}");
    }
    err
}

#[test]
fn a_model_too_wide_for_memory_is_one_error_line() {
    // the first block's fused q, k, v projection: [3 * 65536, 65536] f32, 51.5 GB
    let set = too_large("model.n_embd=65536", 51_539_607_552, "model.n_embd=4194304");
    let err = refused(set);
    if set == "model.n_embd=65536" {
        assert!(err.contains("(51539607552 bytes)"), "{err}");
    }
}

#[test]
fn a_batch_too_large_for_memory_is_one_error_line() {
    // the batch's token ids: 10^8 rows of 64 i64, 51.2 GB
    let set = too_large(
        "data.batch_size=100000000",
        51_200_000_000,
        "data.batch_size=100000000000000",
    );
    let err = refused(set);
    assert!(err.contains("text batch: cannot allocate"), "{err}");
    if set == "data.batch_size=100000000" {
        assert!(err.contains("51.2 GB (51200000000 bytes)"), "{err}");
    }
}

#[test]
fn a_context_too_long_for_memory_is_one_error_line() {
    // the position embedding: [10^8, 128] f32, 51.2 GB
    let set = too_large(
        "model.block_size=100000000",
        51_200_000_000,
        "model.block_size=100000000000000",
    );
    let err = refused(set);
    if set == "model.block_size=100000000" {
        assert!(err.contains("51.2 GB (51200000000 bytes)"), "{err}");
    }
}

#[test]
fn a_thread_count_over_the_limit_or_malformed_is_one_error_line() {
    for (value, why) in [
        ("100000", "is more than the limit of 1024 compute threads"),
        ("0", "is not a positive integer"),
        ("many", "is not a positive integer"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(["train", "--quiet", "--set", "train.steps=1"])
            .env("WEFT_NUM_THREADS", value)
            .output()
            .unwrap();
        let err = one_error_line(&out);
        assert!(err.contains(&format!("WEFT_NUM_THREADS={value:?} {why}")), "{err}");
    }
}
