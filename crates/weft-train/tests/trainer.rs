//! The `Trainer` as a library: the summary `fit` returns, the order of a step's checkpoint and
//! evaluation, and skipped non-finite steps. (Stopping when asked is in `stop_request.rs`: the
//! request is process-wide.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{adam_trainer, batches, mlp, plain_trainer, temp, trainer};
use weft_train::trainer::{BatchFn, CheckpointPolicy};
use weft_train::{Error, Trainer};

mod common;

#[test]
fn fit_returns_what_it_did() {
    let mut t = trainer().with_eval(2, 2, batches(1.0));
    let s = t.fit(batches(1.0), 0, 6).unwrap();
    assert_eq!((s.steps, s.steps_run, s.skipped_steps, s.stopped_by), (6, 6, 0, None));
    assert_eq!(s.last.as_ref().unwrap().step, 6);
    let last = s.last_eval.as_ref().unwrap();
    assert_eq!(last.step, 6);
    let accuracy = last.accuracy.unwrap();
    assert!((0.0..=1.0).contains(&accuracy), "{accuracy}");
    // the best of the evaluations after steps 2, 4 and 6
    assert!(s.best_eval.as_ref().unwrap().loss <= last.loss);
    assert!(s.checkpoint.is_none());
    // a second call goes on from where the first stopped
    let s = t.fit(batches(1.0), 6, 8).unwrap();
    assert_eq!((s.steps, s.steps_run), (8, 2));
    assert_eq!(s.last.unwrap().step, 8);
}

#[test]
fn the_last_checkpoint_is_written_before_the_last_evaluation() {
    let dir = temp("save-then-eval");
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    // evaluation data that fails the first time it is asked for (after the last step)
    let failing: BatchFn = Arc::new(move |_| {
        seen.fetch_add(1, Ordering::SeqCst);
        Err(Error::Run("the evaluation data went away".into()))
    });
    let mut t = trainer().with_eval(5, 1, failing).with_checkpoints(CheckpointPolicy {
        dir: dir.clone(),
        every: 0,
        keep: 1,
        overwrite: false,
    });
    let e = t.fit(batches(1.0), 0, 5).unwrap_err();
    assert!(e.to_string().contains("went away"), "{e}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // the error came after the final checkpoint was handed over; dropping the trainer waits for it
    drop(t);
    assert!(weft_train::checkpoint::is_complete(&dir.join("step-00000005")));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn non_finite_steps_fail_or_are_skipped() {
    let e = trainer().fit(batches(f32::INFINITY), 0, 3).unwrap_err().to_string();
    assert!(e.starts_with("step 1: the"), "{e}");
    assert!(e.contains("skip_nonfinite"), "{e}");
    let mut t = trainer().with_skip_nonfinite(true);
    let before: Vec<f64> = t.model.parameters().iter().flat_map(|(_, p)| p.to_vec_f64()).collect();
    let s = t.fit(batches(f32::INFINITY), 0, 3).unwrap();
    assert_eq!(s.skipped_steps, 3);
    assert!(s.last.as_ref().unwrap().skipped);
    let after: Vec<f64> = t.model.parameters().iter().flat_map(|(_, p)| p.to_vec_f64()).collect();
    assert_eq!(before, after, "a skipped step changes nothing");
    // finite steps after skipped ones update again
    let s = t.fit(batches(1.0), 3, 4).unwrap();
    assert_eq!(s.skipped_steps, 0);
    let moved: Vec<f64> = t.model.parameters().iter().flat_map(|(_, p)| p.to_vec_f64()).collect();
    assert_ne!(after, moved);
}

#[test]
fn the_progress_display_shows_by_default_on_a_terminal_only() {
    const CHILD: &str = "WEFT_TEST_PROGRESS_CHILD";
    const NAME: &str = "the_progress_display_shows_by_default_on_a_terminal_only";
    if std::env::var_os(CHILD).is_some() {
        plain_trainer().fit(batches(1.0), 0, 5).unwrap();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let exe = exe.to_str().unwrap();
    // on a terminal (this test again, under `script`, which gives it one): a bar
    let shell = format!("{CHILD}=1 '{exe}' --exact {NAME} --nocapture --test-threads 1");
    match std::process::Command::new("script")
        .args(["-qec", &shell, "/dev/null"])
        .output()
    {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains("] step      5/5 | loss"), "{text}");
        }
        Err(e) => eprintln!("skipped the terminal half: `script` cannot run ({e})"),
    }
    // in a pipe: nothing
    let out = std::process::Command::new(exe)
        .args(["--exact", NAME, "--nocapture", "--test-threads", "1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("step "), "{out:?}");
}

#[test]
fn a_checkpoint_of_the_runs_own_folder_continues_the_run() {
    let dir = temp("own-folder");
    let policy = CheckpointPolicy {
        dir: dir.clone(),
        every: 2,
        keep: 1,
        overwrite: false,
    };
    let mut first = trainer().with_checkpoints(policy.clone());
    first.fit(batches(1.0), 0, 4).unwrap();
    drop(first);
    // a program that loads the newest checkpoint itself instead of calling resume()
    let mut again = trainer().with_checkpoints(policy.clone());
    let start = again.load_checkpoint(&dir).unwrap();
    assert_eq!(start, 4);
    again.fit(batches(1.0), start, 6).unwrap();
    drop(again);
    // the same run: pruning kept its newest checkpoint only
    let kept: Vec<usize> = weft_train::checkpoint::list(&dir)
        .unwrap()
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    assert_eq!(kept, [6]);
    // a new trainer starting afresh in that folder is refused
    let e = trainer()
        .with_checkpoints(policy)
        .fit(batches(1.0), 0, 2)
        .unwrap_err()
        .to_string();
    assert!(e.contains("holds checkpoints of another run"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A compiled trainer whose whole step (holding the optimizer's state tensors) was captured,
/// then given a checkpoint by `load_checkpoint`, goes on as the run that wrote it: the graph
/// is captured again around the loaded state.
#[test]
fn a_checkpoint_loaded_into_a_compiled_trainer_is_what_its_update_reads() {
    let dir = temp("compiled-load");
    let adam = || adam_trainer(mlp()).with_compile(true);
    let data = batches(1.0);
    let losses = |t: &mut Trainer, steps: std::ops::Range<usize>| -> Vec<u64> {
        steps
            .map(|i| {
                let (x, y) = data(i).unwrap();
                t.train_step(i, &x, &y).unwrap().loss.to_bits()
            })
            .collect()
    };
    let policy = CheckpointPolicy {
        dir: dir.clone(),
        every: 3,
        keep: 1,
        overwrite: false,
    };
    let mut run = adam().with_checkpoints(policy);
    run.fit(data.clone(), 0, 3).unwrap();
    let want = losses(&mut run, 3..7);
    // another trainer, its whole step captured and replayed over other steps, then loaded
    let mut other = adam();
    losses(&mut other, 0..5);
    assert!(other.whole_step_captured());
    assert_eq!(other.load_checkpoint(&dir).unwrap(), 3);
    assert_eq!(losses(&mut other, 3..7), want);
    let _ = std::fs::remove_dir_all(&dir);
}
