//! Optimizers, gradient clipping and learning-rate schedules against PyTorch.
//!
//! `tests/fixtures/optim.json` is written by `python3 tools/reference/make_optim_fixtures.py` (run by
//! hand, needs torch; see its docstring for the format). Each case starts from the same float32
//! parameters (a [3, 4] weight and a [4] bias), feeds a sequence of seeded gradients (some steps
//! leave a parameter without a gradient), optionally clips them with `clip_grad_norm_(1.0)`, and
//! steps `torch.optim.SGD` / `Adam` / `AdamW` (single-tensor code path) with nanoGPT's cosine
//! learning rate. The replay here does the same with weft and compares every parameter element
//! after every step, and every recorded total norm:
//!
//! - f32: `|got - expected| <= 1e-7 + 1e-6 |expected|`;
//! - f64: `|got - expected| <= 1e-14 + 1e-12 |expected|`.
//!
//! weft's fused loops repeat PyTorch's operations in PyTorch's order with the same roundings
//! (including ATen's fused multiply-adds), so the SGD trajectories agree bit for bit. Adam differs in
//! the last bit for a few elements because PyTorch's `sqrt` on x86 is not correctly rounded (about
//! 20% of its float32 and 1.4% of its float64 results are 1 ulp off; weft's is IEEE `sqrt`):
//! replaying PyTorch's own ops with an exact sqrt reproduces exactly the f32 elements weft differs on.
//! With clipping, the norm's summation order adds last-bit differences too. `replay_reports_how_close`
//! prints, per case, the number of elements that are not bit-identical and how much of the tolerance
//! the worst one uses (`cargo test -p weft-nn --test optim -- --nocapture`): at most ~0.11.
//!
//! The other tests check that a `state()` / `load_state()` round trip gives the same next step bit
//! for bit, and the learning-rate schedules' edge cases; `optim_checks.rs` what the fixture cannot.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use serde_json::Value;
use weft_core::{DType, Tensor};
use weft_nn::clip::clip_grad_norm;
use weft_nn::optim::{Adam, AdamConfig, Optimizer, ParamGroup, Sgd, SgdConfig};
use weft_nn::schedule::Schedule;

/// (absolute, relative) tolerance for f32 cases.
const F32_TOL: (f64, f64) = (1e-7, 1e-6);
/// (absolute, relative) tolerance for f64 cases.
const F64_TOL: (f64, f64) = (1e-14, 1e-12);

fn doc() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| serde_json::from_str(include_str!("fixtures/optim.json")).expect("optim.json parses"))
}

fn cases() -> &'static [Value] {
    doc()["cases"].as_array().expect("a `cases` array")
}

fn case_named(name: &str) -> &'static Value {
    cases()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no fixture case {name:?}"))
}

fn shape_of(t: &Value) -> Vec<usize> {
    t["shape"]
        .as_array()
        .expect("shape")
        .iter()
        .map(|d| d.as_u64().expect("size") as usize)
        .collect()
}

/// A fixture tensor's exact values, from its "bits" (IEEE bit patterns in hex: 8 digits for an f32
/// value, 16 for an f64 one), widened to f64.
fn floats_of(t: &Value) -> Vec<f64> {
    t["bits"]
        .as_array()
        .expect("bits")
        .iter()
        .map(|b| {
            let b = b.as_str().expect("hex string");
            match b.len() {
                8 => f32::from_bits(u32::from_str_radix(b, 16).expect("hex")) as f64,
                16 => f64::from_bits(u64::from_str_radix(b, 16).expect("hex")),
                n => panic!("bit pattern of {n} hex digits"),
            }
        })
        .collect()
}

/// A fixture tensor in `dtype`.
fn tensor_of(t: &Value, dtype: DType) -> Tensor {
    let data = floats_of(t);
    let shape = shape_of(t);
    match dtype {
        DType::F32 => Tensor::from_vec(data.iter().map(|&x| x as f32).collect::<Vec<f32>>(), &shape),
        DType::F64 => Tensor::from_vec(data, &shape),
        other => panic!("fixture dtype {other:?}"),
    }
    .expect("fixture tensor")
}

fn dtype_of(case: &Value) -> DType {
    match case["dtype"].as_str().expect("dtype") {
        "f32" => DType::F32,
        "f64" => DType::F64,
        other => panic!("unknown dtype {other:?}"),
    }
}

fn tolerance(dtype: DType) -> (f64, f64) {
    if dtype == DType::F32 {
        F32_TOL
    } else {
        F64_TOL
    }
}

fn schedule_of(case: &Value) -> Schedule {
    let s = &case["schedule"];
    Schedule::Cosine {
        lr: s["lr"].as_f64().expect("lr"),
        warmup_steps: s["warmup"].as_u64().expect("warmup") as usize,
        decay_steps: s["decay"].as_u64().expect("decay") as usize,
        min_lr: s["min_lr"].as_f64().expect("min_lr"),
    }
}

fn optimizer_of(case: &Value) -> Box<dyn Optimizer> {
    let c = &case["config"];
    match case["optimizer"].as_str().expect("optimizer") {
        "sgd" => Box::new(
            Sgd::new(SgdConfig {
                momentum: c["momentum"].as_f64().expect("momentum"),
                dampening: c["dampening"].as_f64().expect("dampening"),
                nesterov: c["nesterov"].as_bool().expect("nesterov"),
            })
            .expect("valid SGD config"),
        ),
        "adam" => {
            let betas = c["betas"].as_array().expect("betas");
            Box::new(
                Adam::new(AdamConfig {
                    betas: (betas[0].as_f64().expect("beta1"), betas[1].as_f64().expect("beta2")),
                    eps: c["eps"].as_f64().expect("eps"),
                    decoupled: c["decoupled"].as_bool().expect("decoupled"),
                })
                .expect("valid Adam config"),
            )
        }
        other => panic!("unknown optimizer {other:?}"),
    }
}

/// Fresh parameters (the fixture's initial values) in `dtype`, by name.
fn initial_params(dtype: DType) -> BTreeMap<String, Tensor> {
    doc()["params"]
        .as_object()
        .expect("params")
        .iter()
        .map(|(n, t)| (n.clone(), tensor_of(t, dtype)))
        .collect()
}

fn groups_of(case: &Value, params: &BTreeMap<String, Tensor>) -> Vec<ParamGroup> {
    case["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| {
            let names = g["params"].as_array().expect("group params");
            ParamGroup::new(
                names
                    .iter()
                    .map(|n| {
                        let n = n.as_str().expect("param name");
                        (n.to_string(), params[n].clone())
                    })
                    .collect(),
                g["weight_decay"].as_f64().expect("weight_decay"),
            )
        })
        .collect()
}

/// Sets each parameter's gradient for step `it` of `case` (none where the case says so).
fn set_grads(case: &Value, it: usize, params: &BTreeMap<String, Tensor>, dtype: DType) {
    let step = &case["steps"][it];
    let grads = &doc()["grads"][step["grad"].as_u64().expect("grad index") as usize];
    let missing: BTreeSet<(usize, &str)> = case["no_grad"]
        .as_array()
        .expect("no_grad")
        .iter()
        .map(|x| (x[0].as_u64().expect("step") as usize, x[1].as_str().expect("name")))
        .collect();
    for (name, p) in params {
        let g = if missing.contains(&(it, name.as_str())) {
            None
        } else {
            Some(tensor_of(&grads[name.as_str()], dtype))
        };
        p.set_grad(g);
    }
}

/// Compares `got` with the fixture tensor `want` element by element; the error names the case, the
/// step, the parameter and the element.
fn compare(what: &str, got: &Tensor, want: &Value, tol: (f64, f64)) -> Result<Agreement, String> {
    if got.shape() != shape_of(want).as_slice() {
        return Err(format!(
            "{what}: shape {:?}, expected {:?}",
            got.shape(),
            shape_of(want)
        ));
    }
    let mut a = Agreement {
        total: got.numel(),
        ..Agreement::default()
    };
    for (i, (g, e)) in got.to_vec_f64().into_iter().zip(floats_of(want)).enumerate() {
        let diff = (g - e).abs();
        let allowed = tol.0 + tol.1 * e.abs();
        if diff.is_nan() || diff > allowed {
            return Err(format!(
                "{what}[{i}]: got {g:e}, expected {e:e} (difference {diff:e} > {:e} + {:e} * |expected|)",
                tol.0, tol.1
            ));
        }
        a.worst = a.worst.max(diff / allowed);
        a.inexact += usize::from(g.to_bits() != e.to_bits());
    }
    Ok(a)
}

/// How close a replay came: the largest `|got - expected| / (atol + rtol |expected|)` (1 is the
/// tolerance), and the number of elements that were not bit-identical.
#[derive(Debug, Default)]
struct Agreement {
    worst: f64,
    inexact: usize,
    total: usize,
}

/// Replays `case` through weft with learning rates `lr_scale` times the schedule's (1.0 for the
/// real comparison); fails at the first element out of tolerance.
fn replay(case: &Value, lr_scale: f64) -> Result<Agreement, String> {
    let name = case["name"].as_str().expect("name");
    let dtype = dtype_of(case);
    let tol = tolerance(dtype);
    let params = initial_params(dtype);
    let groups = groups_of(case, &params);
    let all: Vec<Tensor> = params.values().cloned().collect();
    let schedule = schedule_of(case);
    schedule.validate().map_err(|e| format!("{name}: schedule: {e}"))?;
    let mut opt = optimizer_of(case);
    let clip = case["clip"].as_f64();
    let mut agreement = Agreement::default();
    for (it, step) in case["steps"].as_array().expect("steps").iter().enumerate() {
        let lr = schedule.lr_at(it);
        let want_lr = step["lr"].as_f64().expect("lr");
        if (lr - want_lr).abs() > 1e-15 * want_lr.abs() {
            return Err(format!(
                "{name} step {it}: schedule gives lr {lr:e}, PyTorch used {want_lr:e}"
            ));
        }
        set_grads(case, it, &params, dtype);
        if let Some(max_norm) = clip {
            let norm = clip_grad_norm(&all, max_norm).map_err(|e| format!("{name} step {it}: clip: {e}"))?;
            let want = step["total_norm"].as_f64().expect("total_norm");
            // PyTorch accumulates the norm in float32: allow its rounding.
            if (norm - want).abs() > tol.1.max(1e-6) * want {
                return Err(format!("{name} step {it}: total norm {norm:e}, expected {want:e}"));
            }
        }
        opt.step(&groups, lr * lr_scale)
            .map_err(|e| format!("{name} step {it}: {e}"))?;
        for (pname, p) in &params {
            let want = &step["params"][pname.as_str()];
            let a = compare(&format!("{name} step {it} {pname}"), p, want, tol)?;
            agreement.worst = agreement.worst.max(a.worst);
            agreement.inexact += a.inexact;
            agreement.total += a.total;
        }
    }
    Ok(agreement)
}

#[test]
fn fixture_covers_every_optimizer_and_dtype() {
    let kinds: BTreeSet<(String, String)> = cases()
        .iter()
        .map(|c| {
            (
                c["optimizer"].as_str().unwrap().to_string(),
                c["dtype"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for want in [("sgd", "f32"), ("sgd", "f64"), ("adam", "f32"), ("adam", "f64")] {
        assert!(
            kinds.contains(&(want.0.to_string(), want.1.to_string())),
            "no {want:?} case in optim.json"
        );
    }
    assert!(cases().iter().any(|c| c["clip"].is_number()), "no clipping case");
    assert!(
        cases().iter().any(|c| !c["no_grad"].as_array().unwrap().is_empty()),
        "no missing-gradient case"
    );
}

#[test]
fn replay_matches_pytorch() {
    let mut failures = Vec::new();
    for case in cases() {
        if let Err(e) = replay(case, 1.0) {
            failures.push(e);
        }
    }
    assert!(
        failures.is_empty(),
        "{} case(s) differ from PyTorch:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn replay_reports_how_close() {
    for case in cases() {
        if let Ok(a) = replay(case, 1.0) {
            eprintln!(
                "{:<32} {:>4} of {:>4} elements not bit-identical; the worst uses {:.3} of the tolerance",
                case["name"].as_str().unwrap(),
                a.inexact,
                a.total,
                a.worst
            );
        }
    }
}

/// The comparison is strict enough to notice a learning rate off by 1e-4 (relative).
#[test]
fn replay_detects_a_wrong_update() {
    for case in cases() {
        let name = case["name"].as_str().unwrap();
        match replay(case, 1.0 + 1e-4) {
            Ok(_) => panic!("{name}: a 1e-4 error in the learning rate went unnoticed"),
            Err(e) => assert!(e.starts_with(name) && e.contains("step"), "{name}: message {e:?}"),
        }
    }
}

#[test]
fn schedule_matches_nanogpt() {
    for s in doc()["schedules"].as_array().expect("schedules") {
        let sched = Schedule::Cosine {
            lr: s["lr"].as_f64().unwrap(),
            warmup_steps: s["warmup"].as_u64().unwrap() as usize,
            decay_steps: s["decay"].as_u64().unwrap() as usize,
            min_lr: s["min_lr"].as_f64().unwrap(),
        };
        sched.validate().unwrap();
        let its = s["its"].as_array().unwrap();
        let values = s["values"].as_array().unwrap();
        for (it, want) in its.iter().zip(values) {
            let (it, want) = (it.as_u64().unwrap() as usize, want.as_f64().unwrap());
            let got = sched.lr_at(it);
            assert!(
                (got - want).abs() <= 1e-15 * want.abs(),
                "{sched:?} at step {it}: got {got:e}, nanoGPT {want:e}"
            );
        }
    }
}

#[test]
fn schedule_edge_cases_and_validation() {
    assert_eq!(Schedule::Constant { lr: 0.5 }.lr_at(123), 0.5);
    // decay == warmup: warmup, then straight to min_lr, no division by zero.
    let s = Schedule::Cosine {
        lr: 1.0,
        warmup_steps: 4,
        decay_steps: 4,
        min_lr: 0.1,
    };
    s.validate().unwrap();
    assert_eq!(s.lr_at(3), 4.0 / 5.0);
    assert_eq!(s.lr_at(4), 0.1);
    assert_eq!(s.lr_at(5), 0.1);
    // No warmup: the peak at step 0, min_lr at decay_steps.
    let s = Schedule::Cosine {
        lr: 1.0,
        warmup_steps: 0,
        decay_steps: 10,
        min_lr: 0.0,
    };
    assert_eq!(s.lr_at(0), 1.0);
    assert!(s.lr_at(10).abs() < 1e-16);
    let bad = [
        Schedule::Constant { lr: -1.0 },
        Schedule::Constant { lr: f64::NAN },
        Schedule::Cosine {
            lr: 1.0,
            warmup_steps: 5,
            decay_steps: 4,
            min_lr: 0.1,
        },
        Schedule::Cosine {
            lr: 0.1,
            warmup_steps: 0,
            decay_steps: 4,
            min_lr: 1.0,
        },
        Schedule::Cosine {
            lr: 1.0,
            warmup_steps: 0,
            decay_steps: 4,
            min_lr: -0.1,
        },
        Schedule::Cosine {
            lr: f64::INFINITY,
            warmup_steps: 0,
            decay_steps: 4,
            min_lr: 0.1,
        },
    ];
    for s in bad {
        assert!(s.validate().is_err(), "{s:?} should be rejected");
    }
}

fn bits(t: &Tensor) -> Vec<u64> {
    t.to_vec_f64().into_iter().map(f64::to_bits).collect()
}

fn copy_params(params: &BTreeMap<String, Tensor>) -> BTreeMap<String, Tensor> {
    params
        .iter()
        .map(|(n, t)| (n.clone(), t.contiguous_copy().unwrap()))
        .collect()
}

/// Runs the first `k` steps of `case`, snapshots the state, restores it into a fresh optimizer
/// with copied parameters, and checks both take the same next step bit for bit.
fn check_round_trip(case_name: &str, k: usize) {
    let case = case_named(case_name);
    let dtype = dtype_of(case);
    let schedule = schedule_of(case);
    let params = initial_params(dtype);
    let groups = groups_of(case, &params);
    let mut opt = optimizer_of(case);
    for it in 0..k {
        set_grads(case, it, &params, dtype);
        opt.step(&groups, schedule.lr_at(it)).unwrap();
    }
    let state: BTreeMap<String, Tensor> = opt.state().into_iter().collect();
    assert!(!state.is_empty(), "{case_name}: no state after {k} steps");

    let params2 = copy_params(&params);
    let groups2 = groups_of(case, &params2);
    let mut opt2 = optimizer_of(case);
    opt2.load_state(&state).unwrap();
    let restored: BTreeMap<String, Tensor> = opt2.state().into_iter().collect();
    assert_eq!(
        state.keys().collect::<Vec<_>>(),
        restored.keys().collect::<Vec<_>>(),
        "{case_name}: state keys"
    );
    for (key, t) in &state {
        assert_eq!(bits(t), bits(&restored[key]), "{case_name}: restored {key} differs");
    }

    set_grads(case, k, &params, dtype);
    set_grads(case, k, &params2, dtype);
    let lr = schedule.lr_at(k);
    opt.step(&groups, lr).unwrap();
    opt2.step(&groups2, lr).unwrap();
    for (name, p) in &params {
        assert_eq!(
            bits(p),
            bits(&params2[name]),
            "{case_name} step {k}: {name} differs after load_state"
        );
    }
    let after: BTreeMap<String, Tensor> = opt.state().into_iter().collect();
    let after2: BTreeMap<String, Tensor> = opt2.state().into_iter().collect();
    for (key, t) in &after {
        assert_eq!(
            bits(t),
            bits(&after2[key]),
            "{case_name} step {k}: state {key} differs after load_state"
        );
    }
    // The snapshot taken before the step did not move with it.
    for (key, t) in &state {
        if !key.ends_with(".step") {
            assert_ne!(
                bits(t),
                bits(&after[key]),
                "{case_name}: state() should be a snapshot ({key})"
            );
        }
    }
}

#[test]
fn state_round_trip_reproduces_the_next_step() {
    check_round_trip("sgd/momentum_dampening", 3);
    check_round_trip("sgd/nesterov_weight_decay_f64", 2);
    check_round_trip("adam/l2_weight_decay", 3);
    check_round_trip("adamw/clip_f64", 4);
    // The bias misses steps 1 and 2: its step count lags and must survive the round trip.
    check_round_trip("adam/missing_grads", 3);
}

#[test]
fn adam_state_names_and_step_counts() {
    let case = case_named("adam/missing_grads");
    let params = initial_params(DType::F32);
    let groups = groups_of(case, &params);
    let mut opt = optimizer_of(case);
    for it in 0..4 {
        set_grads(case, it, &params, DType::F32);
        opt.step(&groups, 1e-3).unwrap();
    }
    let state: BTreeMap<String, Tensor> = opt.state().into_iter().collect();
    let keys: Vec<&str> = state.keys().map(String::as_str).collect();
    let want = [
        "bias.exp_avg",
        "bias.exp_avg_sq",
        "bias.step",
        "embed.exp_avg",
        "embed.exp_avg_sq",
        "embed.step",
        "weight.exp_avg",
        "weight.exp_avg_sq",
        "weight.step",
    ];
    assert_eq!(keys, want);
    assert_eq!(state["weight.step"].item().unwrap(), 4.0);
    assert_eq!(
        state["embed.step"].item().unwrap(),
        3.0,
        "embed had no gradient at step 0"
    );
    assert_eq!(
        state["bias.step"].item().unwrap(),
        2.0,
        "bias had no gradient at steps 1 and 2"
    );
    assert_eq!(state["weight.exp_avg"].shape(), &[3, 4]);
    assert_eq!(state["bias.exp_avg_sq"].dtype(), DType::F32);
}
