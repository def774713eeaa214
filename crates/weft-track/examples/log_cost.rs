//! What recording metrics costs the caller: times `RunWriter::log` over 10,000 metrics (the
//! trainer's side), then the close that writes what is waiting (the background thread's side).
//!
//! `cargo run --release -p weft-track --example log_cost`

use std::time::Instant;

use weft_track::{NewRun, RunWriter, Status, WriterOptions};

fn main() {
    let dir = std::env::temp_dir().join(format!("weft-track-log-cost-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let run = NewRun {
        experiment: "bench".into(),
        ..Default::default()
    };
    let n = 10_000u64;
    let keys = ["loss", "lr", "grad_norm", "step_ms", "tokens_per_s"];
    let mut medians = Vec::new();
    for _ in 0..5 {
        let w = RunWriter::start(&dir, run.clone(), WriterOptions::default()).expect("store");
        let t = Instant::now();
        for i in 0..n {
            w.log(i / 5, keys[(i % 5) as usize], i as f64);
        }
        let log_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        w.end(Status::Finished, None).expect("end");
        let end_s = t.elapsed().as_secs_f64();
        println!(
            "log: {:.0} ns per metric ({:.2} ms for {n}); end (writes what is waiting): {:.1} ms",
            log_s * 1e9 / n as f64,
            log_s * 1e3,
            end_s * 1e3
        );
        medians.push(log_s * 1e9 / n as f64);
    }
    medians.sort_by(f64::total_cmp);
    println!("median: {:.0} ns per metric", medians[2]);
    let _ = std::fs::remove_dir_all(&dir);
}
