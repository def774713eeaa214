//! The local calibration cache (`plan-local.toml`, `plan-local-N.toml` in `WEFT_CACHE_DIR`)
//! when something other than a regular file stands there: a FIFO (read, `weft plan
//! --device-spec local` and `weft plan calibrate` waited for a writer for ever), a link to
//! `/dev/zero` (read until memory ran out), a file past the size cap. `--device-spec local` is
//! refused at once naming what the file is and the command that measures again;
//! `calibrate` warns, measures, and puts a regular file in its place.
#![cfg(unix)]

mod common;

use std::path::Path;
use std::process::Output;

use common::{mkfifo, temp_dir, weft_command};

/// `weft args...` with `WEFT_CACHE_DIR=cache`, killed (and the test failed) after 30 s.
fn weft_within_30s(cache: &Path, args: &[&str]) -> Output {
    let mut cmd = weft_command(args);
    cmd.env("WEFT_CACHE_DIR", cache);
    common::output_within(cmd, 30, &format!("weft {args:?}"))
}

/// `weft plan calibrate --nproc N` of a tiny model, 10 ms a rate.
fn calibrate(cache: &Path, nproc: &str) -> Output {
    #[rustfmt::skip]
    let args = ["plan", "calibrate", "--nproc", nproc, "--budget-ms", "10", "--set", "model.n_layer=2",
        "--set", "model.n_embd=32", "--set", "model.n_head=2", "--set", "model.block_size=16",
        "--set", "data.batch_size=8"];
    weft_within_30s(cache, &args)
}

fn names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// `weft plan --devices 2 --device-spec local` fails in one line holding every `needle`.
fn local_plan_refused(cache: &Path, needles: &[&str]) {
    let out = weft_within_30s(cache, &["plan", "--devices", "2", "--device-spec", "local"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    for n in needles {
        assert!(err.contains(n), "{n:?} in {err}");
    }
}

#[test]
fn a_calibration_file_that_is_no_regular_file_is_refused_at_once_and_measured_again() {
    let dir = temp_dir("plan-cache-files");
    let cache = dir.join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    let (latest, for_2) = (cache.join("plan-local.toml"), cache.join("plan-local-2.toml"));

    mkfifo(&latest);
    local_plan_refused(
        &cache,
        &["plan-local.toml: is a FIFO, not a regular file", "weft plan calibrate"],
    );
    mkfifo(&for_2);
    local_plan_refused(
        &cache,
        &[
            "calibration for 2 ranks",
            "plan-local-2.toml: is a FIFO, not a regular file",
            "weft plan calibrate --nproc 2",
        ],
    );
    std::fs::remove_file(&for_2).unwrap();
    std::fs::remove_file(&latest).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &latest).unwrap();
    local_plan_refused(&cache, &["is a character device, not a regular file"]);
    std::fs::remove_file(&latest).unwrap();
    // past the cap (sparse: nothing is written)
    std::fs::File::create(&latest).unwrap().set_len(2 << 20).unwrap();
    local_plan_refused(&cache, &["longer than the 1048576 bytes"]);
    std::fs::remove_file(&latest).unwrap();

    // calibrate: a warning, then a regular file in the FIFO's place
    mkfifo(&latest);
    let out = weft_within_30s(
        &cache,
        &[
            "plan",
            "calibrate",
            "--nproc",
            "1",
            "--budget-ms",
            "10",
            "--set",
            "model.n_layer=2",
            "--set",
            "model.n_embd=32",
            "--set",
            "model.n_head=2",
            "--set",
            "model.block_size=16",
            "--set",
            "data.batch_size=8",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("ignoring the calibration file") && err.contains("is a FIFO") && err.contains("measuring again"),
        "{err}"
    );
    assert!(!names(&cache).iter().any(|n| n.contains("tmp")), "{:?}", names(&cache));
    assert!(std::fs::symlink_metadata(&latest).unwrap().file_type().is_file());
    let text = std::fs::read_to_string(&latest).unwrap();
    let c = weft_plan::calibration::Calibration::parse(&text, "plan-local.toml").unwrap();
    assert_eq!(c.ranks, 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A folder where a calibration goes: an empty one is replaced by the file, one with files in it
/// is refused before measuring (the rename failed after measuring and left its temporary file,
/// one more at each try). A per-rank file that cannot be used is warned about as the latest
/// is (it was replaced without a word), and the summary is the calibration just measured (it
/// read the latest file back, which a calibration for another number of ranks running at the
/// same time may have written).
#[test]
fn folders_and_the_per_rank_file_are_handled_and_the_summary_is_its_own() {
    let dir = temp_dir("plan-cache-folders");
    let cache = dir.join("cache");
    let (latest, for_1) = (cache.join("plan-local.toml"), cache.join("plan-local-1.toml"));
    std::fs::create_dir_all(&latest).unwrap();
    mkfifo(&for_1);
    let out = calibrate(&cache, "1");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("plan-local-1.toml: is a FIFO"), "{err}");
    assert!(err.contains("plan-local.toml: is a directory"), "{err}");
    for f in [&latest, &for_1] {
        assert!(std::fs::symlink_metadata(f).unwrap().is_file(), "{}", f.display());
    }
    assert!(!names(&cache).iter().any(|n| n.contains("tmp")), "{:?}", names(&cache));

    std::fs::remove_file(&latest).unwrap();
    std::fs::create_dir_all(latest.join("kept")).unwrap();
    let out = calibrate(&cache, "1");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("is a folder with files in it") && !err.contains("measuring this machine"),
        "{err}"
    );
    assert!(latest.join("kept").is_dir());
    std::fs::remove_dir_all(&latest).unwrap();

    // the summary reads this number of ranks' own file: another calibration's latest is not it
    let out = calibrate(&cache, "1");
    assert!(out.status.success());
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(
        summary.starts_with("local: 1 ranks") && summary.contains("plan-local-1.toml"),
        "{summary}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
