//! A sweep's state read back from the run store: trials found by their tags, a re-run trial
//! preferring the attempt that ended, the samplers' observations, the best trial and the table.

use std::path::{Path, PathBuf};

use weft_track::{NewRun, RunWriter, Status, Store, WriterOptions};
use weft_tune::sampler::Outcome;
use weft_tune::space::Value;
use weft_tune::trials::{self, TAG_SWEEP, TAG_TRIAL};
use weft_tune::SweepSpec;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-tune-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Records a run of trial `n` of sweep `sweep` with `lr`, its val_loss curve, and `status`.
fn trial(dir: &Path, sweep: &str, n: u64, lr: &str, curve: &[(u64, f64)], status: Status) -> i64 {
    let run = NewRun {
        experiment: "exp".into(),
        name: Some(format!("{sweep}-trial-{n}")),
        params: vec![("optim.lr".into(), lr.into()), ("model.kind".into(), "gpt".into())],
        tags: vec![(TAG_SWEEP.into(), sweep.into()), (TAG_TRIAL.into(), n.to_string())],
        ..Default::default()
    };
    let w = RunWriter::start(dir, run, WriterOptions::default()).unwrap();
    for (step, v) in curve {
        w.log(*step, "val_loss", *v);
    }
    let id = w.id();
    w.end(status, None).unwrap();
    id
}

#[test]
fn trials_are_read_back_by_tag_and_ranked() {
    let dir = temp_dir("trials");
    let spec = SweepSpec::parse(
        "[sweep]\nname = \"s\"\nexperiment = \"exp\"\nbase = \"r.toml\"\nmetric = \"val_loss\"\ntrials = 5\n\
         [sweep.parameters]\n\"optim.lr\" = { distribution = \"log_uniform\", min = 1e-4, max = 1e-1 }\n",
        "s.toml",
        "s",
        Path::new("."),
    )
    .unwrap();
    trial(&dir, "s", 0, "0.001", &[(2, 3.0), (4, 2.0)], Status::Finished);
    let pruned = trial(&dir, "s", 1, "0.05", &[(2, 3.5)], Status::Killed);
    // trial 2 killed once, then run again to the end
    trial(&dir, "s", 2, "0.01", &[(2, 3.1)], Status::Killed);
    trial(&dir, "s", 2, "0.01", &[(2, 2.9), (4, 1.5)], Status::Finished);
    trial(&dir, "s", 3, "0.02", &[], Status::Failed);
    // another sweep's trial in the same experiment is not this sweep's
    trial(&dir, "other", 0, "0.001", &[(4, 0.1)], Status::Finished);
    let store = Store::open(&dir).unwrap();
    store
        .set_status(pruned, Status::Pruned, Some("pruned: rung 0"))
        .unwrap();

    let t = trials::load(&store, &spec).unwrap();
    let numbers: Vec<(u64, &str)> = t.iter().map(|r| (r.number, r.status.as_str())).collect();
    assert_eq!(
        numbers,
        [(0, "finished"), (1, "pruned"), (2, "finished"), (3, "failed")]
    );
    assert_eq!(t[2].run_name, "s-trial-2-2");
    assert_eq!(t[2].last, Some((4, 1.5)));
    assert_eq!(t[0].values, Some(vec![Value::Float(0.001)]));
    assert!(t.iter().all(|r| r.is_done()));
    assert_eq!(
        t[1].observation(&spec).unwrap().outcome,
        Outcome::Pruned { step: 2, value: 3.5 }
    );
    assert_eq!(t[2].observation(&spec).unwrap().outcome, Outcome::Finished(1.5));
    assert_eq!(t[3].observation(&spec), None);
    let best = trials::best(&spec, &t).unwrap();
    assert_eq!(best.number, 2);
    let text = trials::status_text(&spec, &t);
    assert!(
        text.contains("4 of 5 trials recorded: 2 finished, 1 pruned, 1 failed"),
        "{text}"
    );
    assert!(
        text.contains("best: trial 2 (s-trial-2-2): val_loss = 1.5 at step 4; optim.lr=0.01"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 7, "{text}");
}

/// A trial whose metric ended NaN (it diverged; the store holds no NaN row) ends on NaN: it is
/// not ranked on its last number, not named best under either goal, and teaches the samplers
/// nothing. A NaN before a later number does not count.
#[test]
fn a_trial_whose_metric_ended_nan_is_not_ranked_on_an_earlier_value() {
    let dir = temp_dir("trials-nan");
    for goal in ["minimize", "maximize"] {
        let spec = SweepSpec::parse(
            &format!(
                "[sweep]\nname = \"n{goal}\"\nexperiment = \"exp\"\nbase = \"r.toml\"\nmetric = \"val_loss\"\n\
                 goal = \"{goal}\"\ntrials = 3\n\
                 [sweep.parameters]\n\"optim.lr\" = {{ distribution = \"log_uniform\", min = 1e-4, max = 1e-1 }}\n"
            ),
            "s.toml",
            "s",
            Path::new("."),
        )
        .unwrap();
        let name = format!("n{goal}");
        trial(&dir, &name, 0, "0.001", &[(10, 2.0), (20, 1.9)], Status::Finished);
        // diverged: a huge value, then NaN at the last evaluation
        trial(&dir, &name, 1, "0.05", &[(10, 1e8), (20, f64::NAN)], Status::Finished);
        // NaN once, then a number again
        trial(&dir, &name, 2, "0.01", &[(10, f64::NAN), (20, 1.0)], Status::Finished);
        let store = Store::open(&dir).unwrap();
        let t = trials::load(&store, &spec).unwrap();
        assert!(t[1].last.is_some_and(|(s, v)| s == 20 && v.is_nan()), "{:?}", t[1].last);
        assert_eq!(t[1].observation(&spec), None);
        assert_eq!(t[2].last, Some((20, 1.0)));
        let best = trials::best(&spec, &t).unwrap().number;
        assert_eq!(best, if goal == "minimize" { 2 } else { 0 }, "{goal}");
    }
}

/// Values far from 1 are shown with an exponent in the table (1e-300 took 300 characters).
#[test]
fn tiny_and_huge_values_stay_short_in_the_table() {
    let dir = temp_dir("trials-short");
    let spec = SweepSpec::parse(
        "[sweep]\nname = \"t\"\nexperiment = \"exp\"\nbase = \"r.toml\"\nmetric = \"val_loss\"\ntrials = 2\n\
         [sweep.parameters]\n\"optim.lr\" = { distribution = \"log_uniform\", min = 1e-300, max = 1e-1 }\n",
        "s.toml",
        "s",
        Path::new("."),
    )
    .unwrap();
    let tiny = format!("{}", 1e-300f64);
    trial(&dir, "t", 0, &tiny, &[(2, 1e300)], Status::Finished);
    let store = Store::open(&dir).unwrap();
    let text = trials::status_text(&spec, &trials::load(&store, &spec).unwrap());
    let row = text.lines().find(|l| l.starts_with("0 ")).unwrap();
    assert!(row.len() < 100, "{row}");
    assert!(row.contains("1.000000e300") && row.contains("1e-300"), "{row}");
}

/// A trial the pruner stopped whose driver was killed before it saw the trial end (the trainer
/// recorded its run `killed` on the SIGTERM) is read back as pruned, since the decision was
/// recorded before the trial was told; a resume marks its run so. A later attempt of the trial
/// (another run) is not taken for it, nor is a run still stopping.
#[test]
fn a_recorded_prune_makes_a_killed_trial_pruned() {
    let dir = temp_dir("trials-prune-record");
    let spec = SweepSpec::parse(
        "[sweep]\nname = \"p\"\nexperiment = \"exp\"\nbase = \"r.toml\"\nmetric = \"val_loss\"\ntrials = 3\n\
         [sweep.parameters]\n\"optim.lr\" = { distribution = \"log_uniform\", min = 1e-4, max = 1e-1 }\n",
        "s.toml",
        "s",
        Path::new("."),
    )
    .unwrap();
    let killed = trial(&dir, "p", 0, "0.001", &[(2, 3.0)], Status::Killed);
    let other = trial(&dir, "p", 1, "0.01", &[(2, 3.0)], Status::Killed);
    let store = Store::open(&dir).unwrap();
    let start = |id: i64| store.run_detail(id).unwrap().summary.start_time;
    weft_tune::record::record_prune(&store, &spec, 0, killed, start(killed), 2, "rung 0").unwrap();
    // a prune recorded for another run of the same id (deleted since) is not this run's
    weft_tune::record::record_prune(&store, &spec, 1, other, start(other) - 10.0, 2, "rung 0").unwrap();
    let t = trials::load(&store, &spec).unwrap();
    let got: Vec<(u64, &str)> = t.iter().map(|r| (r.number, r.status.as_str())).collect();
    assert_eq!(got, [(0, "pruned"), (1, "killed")]);
    assert_eq!(t[0].error.as_deref(), Some("pruned: rung 0"));
    assert_eq!(weft_tune::record::settle_prunes(&store, &spec).unwrap(), 1);
    assert_eq!(store.run_detail(killed).unwrap().summary.status, "pruned");
}
