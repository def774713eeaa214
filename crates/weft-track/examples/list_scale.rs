//! How long the run table takes at scale: records RUNS runs of STEPS steps x 5 metrics (through
//! `RunWriter`, as training does), then times `Store::list_runs` (what `weft runs list` reads)
//! and a filter over it.
//!
//! `cargo run --release -p weft-track --example list_scale -- [RUNS] [STEPS] [DIR]`
//! (defaults 10000 runs, 100 steps, a temp dir removed at the end; a DIR given is kept, so
//! `weft runs list --dir DIR` can be timed on it, and a DIR that holds a store is listed again
//! without recording).

use std::path::PathBuf;
use std::time::Instant;

use weft_track::filter::Filter;
use weft_track::{NewRun, RunWriter, Status, Store, WriterOptions};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runs: usize = args.first().map_or(10_000, |a| a.parse().expect("RUNS"));
    let steps: u64 = args.get(1).map_or(100, |a| a.parse().expect("STEPS"));
    let keep = args.get(2).map(PathBuf::from);
    let dir = keep
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("weft-track-list-scale-{}", std::process::id())));
    let reuse = keep.is_some() && dir.join(weft_track::STORE_FILE).is_file();
    if !reuse {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let keys = ["loss", "lr", "grad_norm", "step_ms", "tokens_per_s"];
    let options = WriterOptions {
        batch: 4096,
        ..Default::default()
    };
    // a connection held open for the whole loop: without it each run's close is the store's last
    // connection, which checkpoints the WAL and syncs the file (tens of ms a run)
    let held = Store::open(&dir).expect("store");
    let t = Instant::now();
    for i in (0..runs).filter(|_| !reuse) {
        let run = NewRun {
            experiment: format!("exp-{}", i % 10),
            params: vec![
                ("optim.lr".into(), format!("{}", 1e-4 * (1 + i % 20) as f64)),
                ("model.n_layer".into(), format!("{}", 2 + i % 6)),
                ("data.path".into(), "data/tokens.bin".into()),
            ],
            tags: vec![("sweep".into(), format!("{}", i % 3))],
            ..Default::default()
        };
        let w = RunWriter::start(&dir, run, options.clone()).expect("store");
        for s in 1..=steps {
            for (k, key) in keys.iter().enumerate() {
                w.log(s, key, (i + k) as f64 / s as f64);
            }
        }
        w.end(Status::Finished, None).expect("end");
    }
    drop(held);
    let bytes = std::fs::metadata(dir.join(weft_track::STORE_FILE)).map_or(0, |m| m.len());
    println!(
        "recorded {runs} runs x {steps} steps x {} metrics in {:.1} s ({:.0} MB)",
        keys.len(),
        t.elapsed().as_secs_f64(),
        bytes as f64 / 1e6
    );
    let mut times = Vec::new();
    let filter = Filter::parse("optim.lr < 1e-3 and status = 'finished' and metrics.loss < 50").expect("filter");
    for _ in 0..5 {
        let t = Instant::now();
        let store = Store::open_existing(&dir).expect("open");
        let all = store.list_runs(None).expect("list");
        let listed = t.elapsed().as_secs_f64();
        let matched = all.iter().filter(|r| filter.matches(r)).count();
        let filtered = t.elapsed().as_secs_f64();
        assert_eq!(all.len(), runs);
        println!(
            "open + list {} runs: {:.0} ms; + filter ({matched} match): {:.0} ms",
            all.len(),
            listed * 1e3,
            filtered * 1e3
        );
        times.push(listed);
    }
    times.sort_by(f64::total_cmp);
    println!("median open + list: {:.0} ms", times[2] * 1e3);
    if keep.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}
