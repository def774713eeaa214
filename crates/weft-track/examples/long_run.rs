//! Records one long run for timing the dashboard's curves: STEPS steps of `loss` (default
//! 1,000,000) through `RunWriter` into the store in DIR.
//!
//! `cargo run --release -p weft-track --example long_run -- DIR [STEPS]`, then
//! `weft ui --dir DIR` and `GET /api/runs/1/metrics?key=loss`.

use std::path::PathBuf;
use std::time::Instant;

use weft_track::{NewRun, RunWriter, Status, WriterOptions};

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().expect("DIR"));
    let steps: u64 = args.next().map_or(1_000_000, |a| a.parse().expect("STEPS"));
    let run = NewRun {
        experiment: "long".into(),
        ..Default::default()
    };
    let options = WriterOptions {
        batch: 8192,
        ..Default::default()
    };
    let t = Instant::now();
    let w = RunWriter::start(&dir, run, options).expect("store");
    for s in 0..steps {
        w.log(
            s,
            "loss",
            3.0 / (1.0 + s as f64 * 1e-4) + ((s as f64) * 0.1).sin() * 0.05,
        );
    }
    w.end(Status::Finished, None).expect("end");
    println!(
        "run {} with {steps} values of loss in {:.1} s",
        w.id(),
        t.elapsed().as_secs_f64()
    );
}
