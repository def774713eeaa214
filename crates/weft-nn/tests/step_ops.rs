//! The end of a step as graph nodes (`weft_nn::step_ops`, `Optimizer::update_node`): the norm
//! node computes what `grad_norm` does, and a step captured as a graph with its update node
//! (clipping included), replayed at later steps, leaves the parameters and the optimizer state
//! bit for bit where the eager steps (`clip_to_norm`, `step`) leave them (Adam, AdamW, SGD with
//! and without momentum), and changes nothing when the loss is not finite.

use weft_core::graph::GraphCache;
use weft_core::{DType, Generator, Result, Tensor};
use weft_nn::clip::{clip_to_norm, grad_norm};
use weft_nn::optim::{Adam, AdamConfig, Optimizer, ParamGroup, Sgd, SgdConfig};
use weft_nn::step_ops::{grad_norm_node, UpdateInputs, UpdateItem};

fn randn(shape: &[usize], seed: u64) -> Tensor {
    Tensor::randn(shape, DType::F32, &mut Generator::new(seed)).unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect()
}

#[test]
fn the_norm_node_computes_what_grad_norm_does() {
    let params: Vec<Tensor> = (0..3)
        .map(|i| randn(&[5 + i, 3], i as u64).requires_grad_().unwrap())
        .collect();
    for (i, p) in params.iter().enumerate() {
        p.set_grad(Some(randn(p.shape(), 10 + i as u64)));
    }
    let grads: Vec<Tensor> = params.iter().map(|p| p.grad().unwrap()).collect();
    let norm = weft_core::no_grad(|| grad_norm_node(&grads)).unwrap();
    assert_eq!(norm.shape(), &[] as &[usize]);
    assert_eq!(norm.item().unwrap().to_bits(), grad_norm(&params).unwrap().to_bits());
}

/// A two-parameter model and its loss on `x` (scaled by `nan_scale`: NaN makes the loss NaN).
fn loss(w: &Tensor, b: &Tensor, x: &Tensor, nan_scale: &Tensor) -> Result<Tensor> {
    x.matmul(w)?.add(b)?.tanh()?.mul(nan_scale)?.sum_all()
}

struct Model {
    w: Tensor,
    b: Tensor,
}

impl Model {
    fn new() -> Model {
        Model {
            w: randn(&[4, 3], 1).requires_grad_().unwrap(),
            b: randn(&[3], 2).requires_grad_().unwrap(),
        }
    }

    fn groups(&self) -> Vec<ParamGroup> {
        vec![
            ParamGroup::new(vec![("w".into(), self.w.clone())], 0.1),
            ParamGroup::new(vec![("b".into(), self.b.clone())], 0.0),
        ]
    }

    fn params(&self) -> Vec<Tensor> {
        vec![self.w.clone(), self.b.clone()]
    }
}

const MAX_NORM: f64 = 0.3;

/// The eager step: backward, norm, clipping, update (skipped when the loss or norm is not
/// finite, as the trainer does); the norm.
fn eager_step(m: &Model, opt: &mut dyn Optimizer, x: &Tensor, nan: &Tensor, lr: f64) -> f64 {
    m.params().iter().for_each(|p| p.set_grad(None));
    let l = loss(&m.w, &m.b, x, nan).unwrap();
    l.backward().unwrap();
    let norm = grad_norm(&m.params()).unwrap();
    if norm.is_finite() && l.item().unwrap().is_finite() {
        clip_to_norm(&m.params(), MAX_NORM, norm).unwrap();
        opt.step(&m.groups(), lr).unwrap();
    }
    norm
}

/// The same step as one function of `[x, nan, lr, step of w, step of b]` with the norm, clip and
/// update nodes.
fn node_step(m: &Model, opt: &dyn Optimizer, xs: &[Tensor]) -> Result<Vec<Tensor>> {
    m.params().iter().for_each(|p| p.set_grad(None));
    let l = loss(&m.w, &m.b, &xs[0], &xs[1])?;
    l.backward()?;
    let l = l.detach();
    weft_core::no_grad(|| {
        let grads: Vec<Tensor> = m.params().iter().map(|p| p.grad().unwrap()).collect();
        let norm = grad_norm_node(&grads)?;
        let groups = m.groups();
        let items: Vec<UpdateItem> = groups
            .iter()
            .zip(&grads)
            .enumerate()
            .map(|(i, (group, g))| UpdateItem {
                name: &group.params[0].0,
                param: &group.params[0].1,
                grad: g,
                weight_decay: group.weight_decay,
                step: &xs[3 + i],
            })
            .collect();
        let inputs = UpdateInputs {
            lr: &xs[2],
            loss: &l,
            norm: &norm,
            max_norm: Some(MAX_NORM),
        };
        assert!(opt.update_node(&items, &inputs)?.is_some());
        m.params().iter().for_each(|p| p.set_grad(None));
        Ok(vec![l, norm])
    })
}

/// Makes a fresh optimizer.
type Make = Box<dyn Fn() -> Box<dyn Optimizer>>;

fn optimizers() -> Vec<(&'static str, Make)> {
    vec![
        ("adam", Box::new(|| Box::new(Adam::new(AdamConfig::default()).unwrap()))),
        ("adamw", Box::new(|| Box::new(Adam::adamw((0.9, 0.95), 1e-8).unwrap()))),
        ("sgd", Box::new(|| Box::new(Sgd::new(SgdConfig::default()).unwrap()))),
        (
            "sgd-nesterov",
            Box::new(|| {
                Box::new(
                    Sgd::new(SgdConfig {
                        momentum: 0.9,
                        dampening: 0.0,
                        nesterov: true,
                    })
                    .unwrap(),
                )
            }),
        ),
    ]
}

#[test]
fn a_captured_update_replays_the_eager_steps_bit_for_bit() {
    for (name, make) in optimizers() {
        let (eager, captured) = (Model::new(), Model::new());
        let (mut opt_e, mut opt_c) = (make(), make());
        let mut cache = GraphCache::default();
        let one = Tensor::scalar(1.0f32);
        let nan = Tensor::scalar(f32::NAN);
        let mut clipped = 0;
        for step in 0..7 {
            let x = randn(&[6, 4], 100 + step);
            let lr = 0.05 / (1.0 + step as f64);
            // step 4's loss is NaN: both skip it
            let scale = if step == 4 { &nan } else { &one };
            let norm = eager_step(&eager, opt_e.as_mut(), &x, scale, lr);
            clipped += usize::from(norm > MAX_NORM);
            if opt_c.next_step("w").is_none() {
                // the first update makes the state (momentum buffers, moments) eagerly
                assert!(step == 0 && name != "sgd", "{name}: no update node at step {step}");
                eager_step(&captured, opt_c.as_mut(), &x, scale, lr);
                continue;
            }
            let steps = ["w", "b"].map(|n| Tensor::scalar(opt_c.next_step(n).unwrap() as f64));
            let inputs = [
                x.clone(),
                scale.clone(),
                Tensor::scalar(lr),
                steps[0].clone(),
                steps[1].clone(),
            ];
            let opt = opt_c.as_ref();
            let out = cache.call(&inputs, |xs| node_step(&captured, opt, xs)).unwrap();
            let updated = out[0].item().unwrap().is_finite() && out[1].item().unwrap().is_finite();
            assert_eq!(updated, step != 4, "{name} step {step}");
            if updated {
                opt_c.count_updates(&["w", "b"]);
            }
            for (a, b) in eager.params().iter().zip(&captured.params()) {
                assert_eq!(bits(a), bits(b), "{name} step {step}");
            }
            let (se, sc) = (opt_e.state(), opt_c.state());
            assert_eq!(se.len(), sc.len(), "{name}");
            for ((ke, te), (kc, tc)) in se.iter().zip(&sc) {
                assert_eq!(ke, kc, "{name}");
                assert_eq!(te.to_vec_f64(), tc.to_vec_f64(), "{name} step {step}: {ke}");
            }
        }
        assert!(clipped >= 3, "{name}: {clipped} steps clipped");
        // captured once (at the first call with state), replayed at every later step
        assert_eq!(cache.cached(), 1, "{name}");
        assert_eq!(
            cache.last_outcome(),
            Some(&weft_core::graph::Outcome::Replayed),
            "{name}"
        );
    }
}

/// Two parameters whose gradients are one buffer (as a replayed graph may hand them: it records
/// autograd's copy for the second leaf as the same value) are clipped and updated as eagerly,
/// where each has a copy: the buffer is not scaled twice.
#[test]
fn an_update_node_clips_a_gradient_two_parameters_share_once() {
    for (name, make) in optimizers() {
        let pairs = [(), ()].map(|_| [randn(&[5], 1), randn(&[5], 2)]);
        let groups = |ps: &[Tensor; 2]| {
            vec![ParamGroup::new(
                vec![("p".into(), ps[0].clone()), ("q".into(), ps[1].clone())],
                0.1,
            )]
        };
        let (mut opt_e, opt_n) = (make(), make());
        let mut opt_n = opt_n;
        // a first eager step each makes the state (Adam's moments, SGD's momentum)
        for (ps, opt) in [(&pairs[0], &mut opt_e), (&pairs[1], &mut opt_n)] {
            ps.iter().for_each(|p| p.set_grad(Some(randn(&[5], 3))));
            opt.step(&groups(ps), 0.01).unwrap();
        }
        let g = randn(&[5], 4).mul_scalar(10.0).unwrap();
        // eagerly: a copy each, clipped against the norm of both
        pairs[0]
            .iter()
            .for_each(|p| p.set_grad(Some(g.contiguous_copy().unwrap())));
        let norm = grad_norm(&pairs[0]).unwrap();
        assert!(norm > MAX_NORM, "{name}: the step must clip");
        clip_to_norm(&pairs[0], MAX_NORM, norm).unwrap();
        opt_e.step(&groups(&pairs[0]), 0.01).unwrap();
        // the node: the same buffer for both
        let shared = g.contiguous_copy().unwrap();
        let (lr, loss) = (Tensor::scalar(0.01f64), Tensor::scalar(1.0f32));
        let steps = ["p", "q"].map(|n| Tensor::scalar(opt_n.next_step(n).unwrap() as f64));
        weft_core::no_grad(|| {
            let norm = grad_norm_node(&[shared.clone(), shared.clone()]).unwrap();
            let items: Vec<UpdateItem> = ["p", "q"]
                .iter()
                .zip(&pairs[1])
                .zip(&steps)
                .map(|((n, p), step)| UpdateItem {
                    name: n,
                    param: p,
                    grad: &shared,
                    weight_decay: 0.1,
                    step,
                })
                .collect();
            let inputs = UpdateInputs {
                lr: &lr,
                loss: &loss,
                norm: &norm,
                max_norm: Some(MAX_NORM),
            };
            assert!(opt_n.update_node(&items, &inputs).unwrap().is_some(), "{name}");
        });
        for (a, b) in pairs[0].iter().zip(&pairs[1]) {
            assert_eq!(bits(a), bits(b), "{name}");
        }
    }
}
