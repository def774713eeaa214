//! Optimizers and gradient clipping on inputs the PyTorch fixture (`optim.rs`) does not cover:
//! hyper-parameter and shape validation, bad parameters refused before anything changes,
//! `load_state` errors, parameters without gradients, the parallel path for large parameters,
//! restored state cast to the parameter dtype, and clipping edge cases.

use std::collections::BTreeMap;

use weft_core::{DType, Tensor};
use weft_nn::clip::clip_grad_norm;
use weft_nn::optim::{Adam, AdamConfig, Optimizer, ParamGroup, Sgd, SgdConfig};

/// Runs one step that must fail and returns the message.
fn step_error(opt: &mut dyn Optimizer, groups: &[ParamGroup], lr: f64) -> String {
    match opt.step(groups, lr) {
        Ok(()) => panic!("the step should have failed"),
        Err(e) => e.to_string(),
    }
}

fn param(data: Vec<f32>, shape: &[usize], grad: Option<Vec<f32>>) -> Tensor {
    let p = Tensor::from_vec(data, shape).unwrap();
    if let Some(g) = grad {
        p.set_grad(Some(Tensor::from_vec(g, shape).unwrap()));
    }
    p
}

#[test]
fn hyper_parameters_are_validated() {
    let sgd = |momentum, dampening, nesterov| {
        Sgd::new(SgdConfig {
            momentum,
            dampening,
            nesterov,
        })
    };
    assert!(sgd(0.0, 0.0, false).is_ok());
    assert!(sgd(0.9, 0.0, true).is_ok());
    for (m, d, n) in [
        (0.0, 0.0, true),
        (0.9, 0.1, true),
        (-0.1, 0.0, false),
        (f64::NAN, 0.0, false),
    ] {
        let e = sgd(m, d, n).expect_err("invalid SGD config accepted").to_string();
        assert!(e.contains("momentum"), "message {e:?}");
    }
    let e = sgd(0.9, 0.1, true).unwrap_err().to_string();
    assert!(e.contains("Nesterov") && e.contains("dampening"), "message {e:?}");

    let adam = |b1, b2, eps| {
        Adam::new(AdamConfig {
            betas: (b1, b2),
            eps,
            decoupled: false,
        })
    };
    assert!(adam(0.9, 0.999, 1e-8).is_ok());
    assert!(adam(0.0, 0.0, 0.0).is_ok());
    for (b1, b2, eps, needle) in [
        (1.0, 0.999, 1e-8, "beta1"),
        (-0.1, 0.999, 1e-8, "beta1"),
        (0.9, 1.0, 1e-8, "beta2"),
        (0.9, f64::NAN, 1e-8, "beta2"),
        (0.9, 0.999, -1e-8, "eps"),
        (0.9, 0.999, f64::INFINITY, "eps"),
    ] {
        let e = adam(b1, b2, eps).expect_err("invalid Adam config accepted").to_string();
        assert!(
            e.contains(needle),
            "({b1}, {b2}, {eps}): message {e:?} should name {needle}"
        );
    }
    assert!(Adam::adamw((0.9, 1.5), 1e-8).is_err());
    assert!(Adam::adamw((0.9, 0.95), 1e-8).unwrap().config().decoupled);
    let d = AdamConfig::default();
    assert_eq!((d.betas, d.eps, d.decoupled), ((0.9, 0.999), 1e-8, false));
    assert_eq!(
        SgdConfig::default(),
        SgdConfig {
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false
        }
    );

    // Learning rate and weight decay are checked at each step.
    let p = param(vec![1.0; 4], &[4], Some(vec![0.5; 4]));
    let mut opt = Adam::new(AdamConfig::default()).unwrap();
    let groups = [ParamGroup::new(vec![("p".into(), p.clone())], 0.0)];
    assert!(step_error(&mut opt, &groups, -1.0).contains("learning rate"));
    assert!(step_error(&mut opt, &groups, f64::NAN).contains("learning rate"));
    let bad_wd = [ParamGroup::new(vec![("p".into(), p.clone())], -0.1)];
    assert!(step_error(&mut opt, &bad_wd, 1e-3).contains("weight_decay"));
    assert_eq!(
        p.to_vec::<f32>().unwrap(),
        vec![1.0; 4],
        "failed steps must not touch the parameter"
    );
    assert!(opt.state().is_empty(), "failed steps must not create state");
}

#[test]
fn bad_parameters_are_rejected_before_anything_changes() {
    let makers: [fn() -> Box<dyn Optimizer>; 2] = [
        || {
            Box::new(
                Sgd::new(SgdConfig {
                    momentum: 0.9,
                    ..SgdConfig::default()
                })
                .unwrap(),
            )
        },
        || Box::new(Adam::adamw((0.9, 0.95), 1e-8).unwrap()),
    ];
    for make in makers {
        let good = param(vec![1.0; 4], &[4], Some(vec![0.5; 4]));
        // A gradient of the wrong shape.
        let bad = param(vec![1.0; 6], &[2, 3], None);
        bad.set_grad(Some(Tensor::from_vec(vec![0.5f32; 6], &[3, 2]).unwrap()));
        let groups = [ParamGroup::new(
            vec![("good".into(), good.clone()), ("bad".into(), bad.clone())],
            0.1,
        )];
        let e = step_error(make().as_mut(), &groups, 0.1);
        assert!(
            e.contains("\"bad\"") && e.contains("[3, 2]") && e.contains("[2, 3]"),
            "message {e:?}"
        );
        assert_eq!(
            good.to_vec::<f32>().unwrap(),
            vec![1.0; 4],
            "a failed step changed another parameter"
        );

        // A gradient of the wrong dtype.
        let bad = param(vec![1.0; 4], &[4], None);
        bad.set_grad(Some(Tensor::from_vec(vec![0.5f64; 4], &[4]).unwrap()));
        let groups = [ParamGroup::new(vec![("x".into(), bad)], 0.0)];
        let e = step_error(make().as_mut(), &groups, 0.1);
        assert!(
            e.contains("\"x\"") && e.contains("float64") && e.contains("float32"),
            "message {e:?}"
        );

        // The same name twice.
        let a = param(vec![1.0; 4], &[4], Some(vec![0.5; 4]));
        let groups = [
            ParamGroup::new(vec![("w".into(), a.clone())], 0.0),
            ParamGroup::new(vec![("w".into(), a.clone())], 0.1),
        ];
        let e = step_error(make().as_mut(), &groups, 0.1);
        assert!(e.contains("\"w\"") && e.contains("more than once"), "message {e:?}");
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![1.0; 4]);
    }
}

#[test]
fn load_state_errors_name_the_tensor_and_shapes() {
    let t = |shape: &[usize]| Tensor::zeros(shape, DType::F32).unwrap();
    let full = |shape_avg: &[usize], shape_sq: &[usize]| -> BTreeMap<String, Tensor> {
        BTreeMap::from([
            ("w.exp_avg".to_string(), t(shape_avg)),
            ("w.exp_avg_sq".to_string(), t(shape_sq)),
            ("w.step".to_string(), Tensor::scalar(3.0f32)),
        ])
    };
    let mut adam = Adam::new(AdamConfig::default()).unwrap();
    assert!(adam.load_state(&full(&[2, 3], &[2, 3])).is_ok());

    let mut missing = full(&[2, 3], &[2, 3]);
    missing.remove("w.exp_avg_sq");
    let e = adam.load_state(&missing).unwrap_err().to_string();
    assert!(e.contains("\"w.exp_avg_sq\"") && e.contains("missing"), "message {e:?}");

    let e = adam.load_state(&full(&[2, 3], &[3, 2])).unwrap_err().to_string();
    assert!(
        e.contains("\"w.exp_avg_sq\"") && e.contains("[3, 2]") && e.contains("[2, 3]"),
        "message {e:?}"
    );

    let mut unknown = full(&[2, 3], &[2, 3]);
    unknown.insert("w.momentum_buffer".into(), t(&[2, 3]));
    let e = adam.load_state(&unknown).unwrap_err().to_string();
    assert!(e.contains("\"w.momentum_buffer\""), "message {e:?}");

    let mut bad_step = full(&[2, 3], &[2, 3]);
    bad_step.insert("w.step".into(), Tensor::scalar(2.5f64));
    let e = adam.load_state(&bad_step).unwrap_err().to_string();
    assert!(e.contains("\"w.step\""), "message {e:?}");

    // Shapes against the parameter are checked at the next step; nothing changes on error.
    adam.load_state(&full(&[2, 3], &[2, 3])).unwrap();
    let p = param(vec![1.0; 6], &[3, 2], Some(vec![0.5; 6]));
    let groups = [ParamGroup::new(vec![("w".into(), p.clone())], 0.0)];
    let e = step_error(&mut adam, &groups, 1e-3);
    assert!(
        e.contains("\"w.exp_avg\"") && e.contains("[2, 3]") && e.contains("[3, 2]"),
        "message {e:?}"
    );
    assert_eq!(p.to_vec::<f32>().unwrap(), vec![1.0; 6]);

    // Restored state for a parameter the groups do not have (a renamed model, say) is an error.
    adam.load_state(&full(&[3, 2], &[3, 2])).unwrap();
    let groups = [ParamGroup::new(vec![("v".into(), p.clone())], 0.0)];
    let e = step_error(&mut adam, &groups, 1e-3);
    assert!(
        e.contains("\"w\"") && e.contains("none of the param groups"),
        "message {e:?}"
    );
    // With the right name it steps, continuing from step 3.
    let groups = [ParamGroup::new(vec![("w".into(), p.clone())], 0.0)];
    adam.step(&groups, 1e-3).unwrap();
    let state: BTreeMap<String, Tensor> = adam.state().into_iter().collect();
    assert_eq!(state["w.step"].item().unwrap(), 4.0);

    // SGD without momentum keeps no state, so a momentum buffer is unexpected.
    let mut sgd = Sgd::new(SgdConfig::default()).unwrap();
    let e = sgd
        .load_state(&BTreeMap::from([("w.momentum_buffer".to_string(), t(&[2]))]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"w.momentum_buffer\""), "message {e:?}");
    let mut sgd = Sgd::new(SgdConfig {
        momentum: 0.9,
        ..SgdConfig::default()
    })
    .unwrap();
    sgd.load_state(&BTreeMap::from([("w.momentum_buffer".to_string(), t(&[2]))]))
        .unwrap();
    let p = param(vec![1.0; 3], &[3], Some(vec![0.5; 3]));
    let e = step_error(&mut sgd, &[ParamGroup::new(vec![("w".into(), p)], 0.0)], 0.1);
    assert!(
        e.contains("\"w.momentum_buffer\"") && e.contains("[2]") && e.contains("[3]"),
        "message {e:?}"
    );
}

#[test]
fn parameters_without_gradients_are_untouched() {
    let optimizers: Vec<(&str, Box<dyn Optimizer>)> = vec![
        (
            "sgd",
            Box::new(
                Sgd::new(SgdConfig {
                    momentum: 0.9,
                    dampening: 0.0,
                    nesterov: true,
                })
                .unwrap(),
            ),
        ),
        ("adam", Box::new(Adam::new(AdamConfig::default()).unwrap())),
        ("adamw", Box::new(Adam::adamw((0.9, 0.95), 1e-8).unwrap())),
    ];
    for (name, mut opt) in optimizers {
        let with = param(vec![1.0, -2.0, 3.0], &[3], Some(vec![0.1, 0.2, -0.3]));
        let without = param(vec![4.0, -5.0], &[2], None);
        // Weight decay must not touch it either (AdamW decays only parameters that have a gradient).
        let groups = [ParamGroup::new(
            vec![("with".into(), with.clone()), ("without".into(), without.clone())],
            0.5,
        )];
        for _ in 0..3 {
            opt.step(&groups, 0.1).unwrap();
        }
        assert_eq!(
            without.to_vec::<f32>().unwrap(),
            vec![4.0, -5.0],
            "{name}: parameter without gradient changed"
        );
        assert_ne!(
            with.to_vec::<f32>().unwrap(),
            vec![1.0, -2.0, 3.0],
            "{name}: parameter with gradient unchanged"
        );
        assert!(
            opt.state().iter().all(|(k, _)| k.starts_with("with.")),
            "{name}: state for a parameter without gradient"
        );
    }
}

/// A parameter large enough for the parallel chunked loop updates exactly as the same elements
/// split into small (serial) parameters.
#[test]
fn large_parameters_update_like_small_ones() {
    let n = 200_000;
    let values: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin()).collect();
    let grads: Vec<f32> = (0..n).map(|i| ((i as f32) * 1.3).cos() * 0.01).collect();
    let piece = 1000;
    for decoupled in [false, true] {
        let cfg = AdamConfig {
            betas: (0.9, 0.95),
            eps: 1e-8,
            decoupled,
        };
        let big = param(values.clone(), &[n], Some(grads.clone()));
        let small: Vec<(String, Tensor)> = (0..n / piece)
            .map(|k| {
                let r = k * piece..(k + 1) * piece;
                (
                    format!("p{k}"),
                    param(values[r.clone()].to_vec(), &[piece], Some(grads[r].to_vec())),
                )
            })
            .collect();
        let mut a = Adam::new(cfg).unwrap();
        let mut b = Adam::new(cfg).unwrap();
        for _ in 0..3 {
            a.step(&[ParamGroup::new(vec![("big".into(), big.clone())], 0.1)], 1e-2)
                .unwrap();
            b.step(&[ParamGroup::new(small.clone(), 0.1)], 1e-2).unwrap();
        }
        let joined: Vec<f32> = small.iter().flat_map(|(_, t)| t.to_vec::<f32>().unwrap()).collect();
        assert!(
            big.to_vec::<f32>().unwrap() == joined,
            "decoupled={decoupled}: chunked update differs from serial"
        );

        let mut a = Sgd::new(SgdConfig {
            momentum: 0.9,
            dampening: 0.1,
            nesterov: false,
        })
        .unwrap();
        let mut b = Sgd::new(SgdConfig {
            momentum: 0.9,
            dampening: 0.1,
            nesterov: false,
        })
        .unwrap();
        for _ in 0..3 {
            a.step(&[ParamGroup::new(vec![("big".into(), big.clone())], 0.1)], 1e-2)
                .unwrap();
            b.step(&[ParamGroup::new(small.clone(), 0.1)], 1e-2).unwrap();
        }
        let joined: Vec<f32> = small.iter().flat_map(|(_, t)| t.to_vec::<f32>().unwrap()).collect();
        assert!(
            big.to_vec::<f32>().unwrap() == joined,
            "SGD: chunked update differs from serial"
        );
    }
}

/// Restored f32 state drives an f64 parameter (cast at the step, as PyTorch's load_state_dict
/// casts state to the parameter's dtype).
#[test]
fn restored_state_is_cast_to_the_parameter_dtype() {
    let mut opt = Adam::new(AdamConfig::default()).unwrap();
    opt.load_state(&BTreeMap::from([
        (
            "w.exp_avg".to_string(),
            Tensor::from_vec(vec![0.1f32, -0.2], &[2]).unwrap(),
        ),
        (
            "w.exp_avg_sq".to_string(),
            Tensor::from_vec(vec![0.01f32, 0.04], &[2]).unwrap(),
        ),
        ("w.step".to_string(), Tensor::scalar(5.0f32)),
    ]))
    .unwrap();
    let p = Tensor::from_vec(vec![1.0f64, 2.0], &[2]).unwrap();
    p.set_grad(Some(Tensor::from_vec(vec![0.3f64, 0.3], &[2]).unwrap()));
    opt.step(&[ParamGroup::new(vec![("w".into(), p.clone())], 0.0)], 1e-3)
        .unwrap();
    let state: BTreeMap<String, Tensor> = opt.state().into_iter().collect();
    assert_eq!(state["w.exp_avg"].dtype(), DType::F64);
    assert_eq!(state["w.step"].item().unwrap(), 6.0);
    // The same update in f64 from the f32 state values.
    let (t, lr, g) = (6.0f64, 1e-3, 0.3);
    let m0 = [0.1f32 as f64, -0.2f32 as f64];
    let v0 = [0.01f32 as f64, 0.04f32 as f64];
    for (i, got) in p.to_vec::<f64>().unwrap().into_iter().enumerate() {
        let m = m0[i] + (1.0 - 0.9) * (g - m0[i]);
        let v = v0[i] * 0.999 + (1.0 - 0.999) * g * g;
        let want =
            (1.0 + i as f64) - lr / (1.0 - 0.9f64.powf(t)) * m / (v.sqrt() / (1.0 - 0.999f64.powf(t)).sqrt() + 1e-8);
        assert!((got - want).abs() < 1e-14, "element {i}: got {got}, expected {want}");
    }
}

#[test]
fn clip_edge_cases() {
    // Below max_norm: gradients untouched bit for bit, the norm returned.
    let a = param(vec![0.0; 2], &[2], Some(vec![0.3, 0.4]));
    let none = param(vec![0.0; 3], &[3], None);
    let norm = clip_grad_norm(&[a.clone(), none.clone()], 1.0).unwrap();
    assert!((norm - 0.5).abs() < 1e-7);
    assert_eq!(a.grad().unwrap().to_vec::<f32>().unwrap(), vec![0.3, 0.4]);
    assert!(none.grad().is_none());
    // Above: scaled to max_norm / (norm + 1e-6).
    let norm = clip_grad_norm(std::slice::from_ref(&a), 0.1).unwrap();
    let g = a.grad().unwrap().to_vec::<f32>().unwrap();
    let coef = (0.1 / (norm + 1e-6)) as f32;
    assert_eq!(g, vec![0.3f32 * coef, 0.4f32 * coef]);
    // No gradients at all.
    assert_eq!(clip_grad_norm(std::slice::from_ref(&none), 1.0).unwrap(), 0.0);
    assert_eq!(clip_grad_norm(&[], 1.0).unwrap(), 0.0);
    // Non-finite norms are returned, not errors.
    let inf = param(vec![0.0; 2], &[2], Some(vec![f32::INFINITY, 1.0]));
    assert_eq!(clip_grad_norm(std::slice::from_ref(&inf), 1.0).unwrap(), f64::INFINITY);
    let nan = param(vec![0.0; 2], &[2], Some(vec![f32::NAN, 1.0]));
    assert!(clip_grad_norm(&[nan], 1.0).unwrap().is_nan());
    // A non-contiguous gradient (a transposed view) is scaled in place through a copy.
    let p = param(vec![0.0; 6], &[2, 3], None);
    let g = Tensor::from_vec(vec![3.0f32, 0.0, 0.0, 4.0, 0.0, 0.0], &[3, 2])
        .unwrap()
        .t()
        .unwrap();
    p.set_grad(Some(g.clone()));
    let norm = clip_grad_norm(std::slice::from_ref(&p), 1.0).unwrap();
    assert!((norm - 5.0).abs() < 1e-9);
    let scaled = p.grad().unwrap().to_vec::<f32>().unwrap();
    let c = (1.0 / (5.0 + 1e-6)) as f32;
    assert_eq!(scaled, vec![3.0 * c, 0.0, 0.0, 0.0, 4.0 * c, 0.0]);
    // Invalid max_norm.
    assert!(clip_grad_norm(std::slice::from_ref(&a), -1.0).is_err());
    assert!(clip_grad_norm(&[a], f64::NAN).is_err());
}
