//! A stop requested while `fit` runs (as a signal handler does) ends it after the step, with a
//! checkpoint. Alone in its test binary: the request is process-wide.

use std::sync::Arc;

use common::{batches, temp, trainer};
use weft_train::trainer::{BatchFn, CheckpointPolicy};

mod common;

#[test]
fn a_requested_stop_ends_fit_after_the_step_with_a_checkpoint() {
    let dir = temp("stop");
    let mut t = trainer().with_checkpoints(CheckpointPolicy {
        dir: dir.clone(),
        every: 0,
        keep: 3,
        overwrite: false,
    });
    // the batch of step 3 (index 2) asks for the stop, as a signal arriving mid-step would
    let inner = batches(1.0);
    let asking: BatchFn = Arc::new(move |i| {
        if i == 2 {
            weft_train::stop::request(15);
        }
        inner(i)
    });
    let s = t.fit(asking, 0, 100).unwrap();
    assert_eq!(s.stopped_by, Some(15));
    // the prefetcher builds batches ahead, so the request lands during step 1, 2 or 3
    assert!((1..=3).contains(&s.steps), "{}", s.steps);
    let ckpt = s.checkpoint.unwrap();
    assert_eq!(ckpt, dir.join(format!("step-{:08}", s.steps)));
    assert!(weft_train::checkpoint::is_complete(&ckpt));
    let _ = std::fs::remove_dir_all(&dir);
}
