//! The `linear` and `wsd` learning-rate schedules: values at chosen steps against the formulas
//! written out here, and every step against Hugging Face's `get_linear_schedule_with_warmup` and
//! `get_wsd_schedule` through torch's `LambdaLR` (fixture written by
//! `tools/reference/make_accum_fixtures.py`).

use serde_json::Value;
use weft_nn::schedule::{DecayShape, Schedule};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1e-300)
}

#[test]
fn linear_warms_up_from_zero_then_decays_to_min_lr() {
    let s = Schedule::Linear {
        lr: 1.0,
        warmup_steps: 4,
        decay_steps: 14,
        min_lr: 0.1,
    };
    s.validate().unwrap();
    // warmup: lr * step / warmup, starting at 0
    for (step, want) in [(0, 0.0), (1, 0.25), (2, 0.5), (3, 0.75)] {
        assert!(close(s.lr_at(step), want), "step {step}: {} vs {want}", s.lr_at(step));
    }
    // the peak at the end of warmup, then 0.9 (the span lr - min_lr) shrinking over 10 steps
    for (step, want) in [
        (4, 1.0),
        (5, 0.1 + 0.9 * 0.9),
        (9, 0.1 + 0.9 * 0.5),
        (13, 0.1 + 0.9 * 0.1),
    ] {
        assert!(close(s.lr_at(step), want), "step {step}: {} vs {want}", s.lr_at(step));
    }
    for step in [14, 15, 1000] {
        assert_eq!(s.lr_at(step), 0.1, "step {step}");
    }
}

#[test]
fn linear_without_warmup_or_decay_length() {
    let s = Schedule::Linear {
        lr: 2.0,
        warmup_steps: 0,
        decay_steps: 4,
        min_lr: 0.0,
    };
    assert_eq!(
        (0..6).map(|i| s.lr_at(i)).collect::<Vec<_>>(),
        [2.0, 1.5, 1.0, 0.5, 0.0, 0.0]
    );
    // warmup == decay: the rate falls to min_lr where warmup ends
    let s = Schedule::Linear {
        lr: 2.0,
        warmup_steps: 2,
        decay_steps: 2,
        min_lr: 0.5,
    };
    assert_eq!((0..4).map(|i| s.lr_at(i)).collect::<Vec<_>>(), [0.0, 1.0, 0.5, 0.5]);
}

#[test]
fn wsd_warmup_stable_then_each_decay_shape() {
    let make = |shape| Schedule::Wsd {
        lr: 1.0,
        warmup_steps: 2,
        decay_steps: 4,
        total_steps: 10,
        min_lr: 0.2,
        shape,
    };
    for shape in [DecayShape::Linear, DecayShape::Cosine, DecayShape::Sqrt] {
        let s = make(shape);
        s.validate().unwrap();
        assert_eq!(s.lr_at(0), 0.0);
        assert_eq!(s.lr_at(1), 0.5);
        for step in 2..6 {
            assert_eq!(s.lr_at(step), 1.0, "{shape:?} step {step}: stable");
        }
        // the decay starts at 10 - 4 = 6 with progress p = (step - 6) / 4
        for step in 6..10 {
            let p = (step - 6) as f64 / 4.0;
            let f = match shape {
                DecayShape::Linear => 1.0 - p,
                DecayShape::Cosine => (1.0 + (std::f64::consts::PI * p).cos()) / 2.0,
                DecayShape::Sqrt => 1.0 - p.sqrt(),
            };
            let want = 0.2 + 0.8 * f;
            assert!(
                close(s.lr_at(step), want),
                "{shape:?} step {step}: {} vs {want}",
                s.lr_at(step)
            );
        }
        for step in [10, 11, 99] {
            assert_eq!(s.lr_at(step), 0.2, "{shape:?} step {step}: min_lr after the end");
        }
    }
    // halfway through a cosine decay: exactly the middle of the span
    assert!(close(make(DecayShape::Cosine).lr_at(8), 0.6));
    assert!(close(make(DecayShape::Sqrt).lr_at(7), 0.2 + 0.8 * 0.5));
    assert_eq!(DecayShape::parse("sqrt"), Some(DecayShape::Sqrt));
    assert_eq!(DecayShape::parse("exp"), None);
}

#[test]
fn bad_linear_and_wsd_settings_are_refused_naming_the_key() {
    let cases = [
        (
            Schedule::Linear {
                lr: 1.0,
                warmup_steps: 5,
                decay_steps: 4,
                min_lr: 0.0,
            },
            "warmup_steps 5 must be <= decay_steps 4",
        ),
        (
            Schedule::Linear {
                lr: 1.0,
                warmup_steps: 0,
                decay_steps: 4,
                min_lr: 2.0,
            },
            "min_lr 2",
        ),
        (
            Schedule::Wsd {
                lr: 1.0,
                warmup_steps: 5,
                decay_steps: 6,
                total_steps: 10,
                min_lr: 0.0,
                shape: DecayShape::Linear,
            },
            "warmup_steps 5 + decay_steps 6 must be <= total_steps 10",
        ),
        (
            Schedule::Wsd {
                lr: f64::NAN,
                warmup_steps: 0,
                decay_steps: 1,
                total_steps: 10,
                min_lr: 0.0,
                shape: DecayShape::Linear,
            },
            "lr NaN",
        ),
        (
            Schedule::Wsd {
                lr: 1.0,
                warmup_steps: usize::MAX,
                decay_steps: 1,
                total_steps: 10,
                min_lr: 0.0,
                shape: DecayShape::Linear,
            },
            "total_steps 10",
        ),
    ];
    for (s, needle) in cases {
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains(needle), "{s:?}: {e}");
    }
}

#[test]
fn linear_and_wsd_match_hugging_face_lambda_lr() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf_schedules.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = doc["schedules"].as_array().unwrap();
    assert!(cases.len() >= 7);
    for c in cases {
        let n = |k: &str| c[k].as_u64().unwrap() as usize;
        let (lr, min_lr) = (c["lr"].as_f64().unwrap(), c["min_lr"].as_f64().unwrap());
        let s = match c["kind"].as_str().unwrap() {
            "linear" => Schedule::Linear {
                lr,
                warmup_steps: n("warmup_steps"),
                decay_steps: n("decay_steps"),
                min_lr,
            },
            "wsd" => Schedule::Wsd {
                lr,
                warmup_steps: n("warmup_steps"),
                decay_steps: n("decay_steps"),
                total_steps: n("total_steps"),
                min_lr,
                shape: DecayShape::parse(c["decay_shape"].as_str().unwrap()).unwrap(),
            },
            k => panic!("kind {k}"),
        };
        s.validate().unwrap();
        for (step, want) in c["lrs"].as_array().unwrap().iter().enumerate() {
            let want = want.as_f64().unwrap();
            let got = s.lr_at(step);
            // LambdaLR multiplies lr by the same factor in f64: equal up to the last bit or two
            assert!(
                (got - want).abs() <= 4.0 * f64::EPSILON * want.abs(),
                "{c}: step {step}: {got:e} vs LambdaLR {want:e}"
            );
        }
    }
}
