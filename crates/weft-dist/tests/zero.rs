//! ZeRO sharding on 2 and 4 ranks (threads, each with its own connections): every stage takes
//! the steps plain data parallelism takes (AdamW, the whole batch split across the ranks),
//! stage 3 holds only the running unit's parameters whole, the optimizer state round-trips
//! between its sharded and whole forms, and a missing gradient is an error naming it.

mod common;

use std::time::Duration;

use common::{ranks, settle};
use weft_core::{DType, Generator, Tensor};
use weft_dist::zero::Piece;
use weft_dist::{DdpOptions, ShardedDataParallel, ZeroOptions};
use weft_nn::optim::{Adam, Optimizer, ParamGroup};

const T: Duration = Duration::from_secs(60);
const UNITS: [&str; 2] = ["l0", "l1"];

/// `((x @ l0.w + l0.b).tanh() @ l1.w + l1.b).tanh() @ head * scale`: units `l0` and `l1`, and
/// a root unit (`head`, `scale`). Sizes are odd on purpose, so shards cut through parameters.
struct Net {
    params: Vec<(String, Tensor)>,
}

impl Net {
    fn new(seed: u64) -> Net {
        let mut g = Generator::new(seed);
        let mut p = |name: &str, shape: &[usize]| {
            let t = Tensor::randn(shape, DType::F32, &mut g)
                .unwrap()
                .mul_scalar(0.5)
                .unwrap();
            (name.to_string(), t.contiguous_copy().unwrap().requires_grad_().unwrap())
        };
        Net {
            params: vec![
                p("head", &[9, 3]),
                p("l0.w", &[5, 11]),
                p("l0.b", &[11]),
                p("l1.w", &[11, 9]),
                p("l1.b", &[9]),
                p("scale", &[3]),
            ],
        }
    }

    fn get(&self, name: &str) -> &Tensor {
        &self.params.iter().find(|(n, _)| n == name).unwrap().1
    }

    fn whole(&self, name: &str) -> bool {
        let p = self.get(name);
        p.storage().read().len() == p.numel()
    }

    /// Mean squared output; `inside(unit)` runs within each unit's forward (after its
    /// parameters are gathered), and `skip_scale` leaves `scale` out of the loss.
    fn loss(&self, x: &Tensor, z: Option<&ShardedDataParallel>, inside: impl Fn(&str), skip_scale: bool) -> Tensor {
        let mut h = x.clone();
        for u in UNITS {
            if let Some(z) = z {
                z.before_unit(u).unwrap();
            }
            inside(u);
            let w = self.get(&format!("{u}.w"));
            let b = self.get(&format!("{u}.b"));
            h = h.matmul(w).unwrap().add(b).unwrap().tanh().unwrap();
            if let Some(z) = z {
                z.after_unit(u, &h).unwrap();
            }
        }
        let mut y = h.matmul(self.get("head")).unwrap();
        if !skip_scale {
            y = y.mul(self.get("scale")).unwrap();
        }
        y.mul(&y).unwrap().mean(&[], false).unwrap()
    }

    fn values(&self) -> Vec<Vec<f64>> {
        self.params.iter().map(|(_, p)| p.to_vec_f64()).collect()
    }
}

fn batch(step: usize) -> Tensor {
    Tensor::randn(&[8, 5], DType::F32, &mut Generator::new(100 + step as u64)).unwrap()
}

fn share(x: &Tensor, r: usize, n: usize) -> Tensor {
    let b = x.shape()[0] / n;
    x.narrow(0, r * b, b).unwrap().contiguous_copy().unwrap()
}

fn adamw() -> Adam {
    Adam::adamw((0.9, 0.95), 1e-8).unwrap()
}

/// Weight decay for two-dim parameters, as the trainer groups them.
fn groups(params: Vec<(String, Tensor, usize)>) -> Vec<ParamGroup> {
    let (decay, no): (Vec<_>, Vec<_>) = params.into_iter().partition(|p| p.2 >= 2);
    let strip = |v: Vec<(String, Tensor, usize)>| v.into_iter().map(|(n, t, _)| (n, t)).collect();
    vec![ParamGroup::new(strip(decay), 0.1), ParamGroup::new(strip(no), 0.0)]
}

fn piece_groups(pieces: &[Piece]) -> Vec<ParamGroup> {
    groups(
        pieces
            .iter()
            .map(|p| (p.name.clone(), p.tensor.clone(), p.param_shape.len()))
            .collect(),
    )
}

const STEPS: usize = 4;
const LR: f64 = 0.05;

/// The single-process run on the whole batch: parameters and optimizer state after the steps.
fn reference() -> (Vec<Vec<f64>>, Vec<(String, Tensor)>) {
    let net = Net::new(7);
    let mut opt = adamw();
    let g = groups(
        net.params
            .iter()
            .map(|(n, p)| (n.clone(), p.clone(), p.rank()))
            .collect(),
    );
    for step in 0..STEPS {
        net.loss(&batch(step), None, |_| {}, false).backward().unwrap();
        opt.step(&g, LR).unwrap();
        net.params.iter().for_each(|(_, p)| p.set_grad(None));
    }
    (net.values(), opt.state())
}

fn options(stage: usize) -> ZeroOptions {
    ZeroOptions {
        stage,
        ddp: DdpOptions::default(),
        bf16: false,
    }
}

fn assert_close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-6 + 1e-5 * w.abs(), "{what}[{i}]: {g} vs {w}");
    }
}

#[test]
fn every_stage_takes_the_steps_of_the_whole_batch_and_consolidates_the_optimizer_state() {
    let (want, want_state) = reference();
    let names: Vec<String> = Net::new(7).params.iter().map(|(n, _)| n.clone()).collect();
    for n in [2, 4] {
        for stage in 1..=3 {
            ranks(n, T, |pg| {
                let r = pg.rank();
                // ranks other than 0 start elsewhere: the broadcast must fix that
                let net = Net::new(if r == 0 { 7 } else { 50 + r as u64 });
                let units: Vec<String> = UNITS.iter().map(|u| u.to_string()).collect();
                let z = ShardedDataParallel::new(net.params.clone(), &units, &pg, options(stage)).unwrap();
                let unit_names: Vec<String> = z.units().into_iter().map(|(u, _)| u).collect();
                assert_eq!(unit_names, ["l0", "l1", ""]);
                let mut opt = adamw();
                let g = piece_groups(z.pieces());
                for step in 0..STEPS {
                    z.begin_forward().unwrap();
                    net.loss(&share(&batch(step), r, n), Some(&z), |_| {}, false)
                        .backward()
                        .unwrap();
                    z.finish().unwrap();
                    opt.step(&g, LR).unwrap();
                    z.after_step().unwrap();
                }
                let state = z.consolidate_state(opt.state()).unwrap();
                z.gather_parameters().unwrap();
                let what = format!("n={n} stage {stage} rank {r}");
                for ((name, got), w) in names.iter().zip(net.values()).zip(&want) {
                    assert_close(&got, w, &format!("{what}: {name}"));
                }
                assert_eq!(state.len(), want_state.len(), "{what}: state keys");
                for ((k, t), (wk, wt)) in state.iter().zip(&want_state) {
                    assert_eq!((k, t.shape()), (wk, wt.shape()), "{what}");
                    assert_close(&t.to_vec_f64(), &wt.to_vec_f64(), &format!("{what}: {k}"));
                }
                // and back: this rank's share of the whole state is the state it keeps
                let map = state.into_iter().collect();
                let mine = z.shard_state(&map).unwrap();
                let kept = opt.state();
                assert_eq!(mine.len(), kept.len(), "{what}");
                for (k, t) in kept {
                    assert_eq!(mine[&k].to_vec_f64(), t.to_vec_f64(), "{what}: {k}");
                }
            });
        }
    }
}

#[test]
fn stage_3_holds_a_units_parameters_whole_only_around_its_forward_and_backward() {
    ranks(2, T, |pg| {
        let net = Net::new(7);
        let units: Vec<String> = UNITS.iter().map(|u| u.to_string()).collect();
        let z = ShardedDataParallel::new(net.params.clone(), &units, &pg, options(3)).unwrap();
        let mut opt = adamw();
        let g = piece_groups(z.pieces());
        let every = ["head", "l0.w", "l0.b", "l1.w", "l1.b", "scale"];
        for step in 0..2 {
            z.begin_forward().unwrap();
            assert!(net.whole("head") && net.whole("scale"), "the root unit is gathered");
            let loss = net.loss(
                &share(&batch(step), pg.rank(), 2),
                Some(&z),
                |u| {
                    if u == "l1" {
                        assert!(
                            !net.whole("l0.w") && !net.whole("l0.b"),
                            "l0 is freed after its forward"
                        );
                        assert!(net.whole("l1.w") && net.whole("l1.b"));
                    }
                },
                false,
            );
            // every unit but the root was freed after its forward
            assert!(!net.whole("l0.w") && !net.whole("l1.w") && net.whole("head"));
            loss.backward().unwrap();
            z.finish().unwrap();
            for name in every {
                assert!(!net.whole(name), "step {step}: {name} is freed after backward");
            }
            let held = z.held_bytes();
            let psi: usize = net.params.iter().map(|(_, p)| p.numel()).sum();
            // a shard of the parameters and one of the gradients (each padded by at most a
            // few elements per unit)
            assert!(
                held.params >= psi * 4 / 2 && held.params <= psi * 4 / 2 + 3 * 4,
                "{held:?}"
            );
            assert_eq!(held.grads, held.params, "{held:?}");
            opt.step(&g, LR).unwrap();
            z.after_step().unwrap();
        }
        z.gather_parameters().unwrap();
        for name in every {
            assert!(net.whole(name), "{name} is whole after gather_parameters");
        }
    });
}

#[test]
fn a_parameter_without_gradient_is_named_on_every_rank() {
    for stage in [2, 3] {
        let errors = ranks(2, T, |pg| {
            let net = Net::new(7);
            let units: Vec<String> = UNITS.iter().map(|u| u.to_string()).collect();
            let z = ShardedDataParallel::new(net.params.clone(), &units, &pg, options(stage)).unwrap();
            z.begin_forward().unwrap();
            // rank 1 leaves `scale` out; rank 0 waits at its reduction, until rank 1 aborts
            let skip = pg.rank() == 1;
            net.loss(&share(&batch(0), pg.rank(), 2), Some(&z), |_| {}, skip)
                .backward()
                .unwrap();
            z.finish().unwrap_err().to_string()
        });
        for e in errors {
            assert!(e.contains("\"scale\""), "stage {stage}: {e}");
        }
    }
}

#[test]
fn a_stage_outside_1_to_3_and_a_unit_without_parameters_are_refused() {
    ranks(2, T, |pg| {
        let net = Net::new(7);
        let e = ShardedDataParallel::new(net.params.clone(), &[], &pg, options(4))
            .err()
            .unwrap();
        assert!(e.to_string().contains("stage 4"), "{e}");
        let e = ShardedDataParallel::new(net.params.clone(), &["l2".into()], &pg, options(3))
            .err()
            .unwrap();
        assert!(e.to_string().contains("\"l2\""), "{e}");
    });
}

#[test]
fn bf16_communication_computes_with_rounded_parameters_and_keeps_f32_master_weights() {
    let (want, _) = reference();
    for stage in 1..=3 {
        ranks(2, T, |pg| {
            let r = pg.rank();
            let net = Net::new(7);
            let units: Vec<String> = UNITS.iter().map(|u| u.to_string()).collect();
            let opts = ZeroOptions {
                bf16: true,
                ..options(stage)
            };
            let z = ShardedDataParallel::new(net.params.clone(), &units, &pg, opts).unwrap();
            let mut opt = adamw();
            let g = piece_groups(z.pieces());
            let rounded = |v: f64| half::bf16::from_f64(v).to_f64() == v;
            for step in 0..STEPS {
                z.begin_forward().unwrap();
                net.loss(
                    &share(&batch(step), r, 2),
                    Some(&z),
                    |u| {
                        // the unit being computed with holds bf16 values
                        let w = net.get(&format!("{u}.w")).to_vec_f64();
                        assert!(w.iter().all(|&v| rounded(v)), "stage {stage} step {step}: {u}");
                    },
                    false,
                )
                .backward()
                .unwrap();
                z.finish().unwrap();
                opt.step(&g, LR).unwrap();
                z.after_step().unwrap();
            }
            z.gather_parameters().unwrap();
            // the gathered parameters are the f32 master weights, not their bf16 roundings
            let values = net.values();
            assert!(values.iter().flatten().any(|&v| !rounded(v)), "stage {stage}");
            // bf16 rounding moves the result a little against the steps themselves
            let start = Net::new(7).values();
            let flat = |v: &[Vec<f64>]| v.concat();
            let (got, want, start) = (flat(&values), flat(&want), flat(&start));
            let mean = |f: &dyn Fn(usize) -> f64| (0..got.len()).map(f).sum::<f64>() / got.len() as f64;
            let moved = mean(&|i| (want[i] - start[i]).abs());
            let off = mean(&|i| (got[i] - want[i]).abs());
            eprintln!("stage {stage}: mean update {moved:.4}, mean difference from f32 {off:.5}");
            assert!(off < 0.05 * moved, "stage {stage}: {off} against updates of {moved}");
        });
    }
}

#[test]
fn without_hooks_stages_1_and_2_take_gradients_handed_over_early_and_refuse_misuse() {
    let (want, _) = reference();
    for stage in [1, 2] {
        ranks(2, T, |pg| {
            let r = pg.rank();
            let net = Net::new(7);
            let units: Vec<String> = UNITS.iter().map(|u| u.to_string()).collect();
            let z = ShardedDataParallel::new_unhooked(net.params.clone(), &units, &pg, options(stage)).unwrap();
            let mut opt = adamw();
            let g = piece_groups(z.pieces());
            for step in 0..STEPS {
                z.begin_forward().unwrap();
                net.loss(&share(&batch(step), r, 2), Some(&z), |_| {}, false)
                    .backward()
                    .unwrap();
                // unit l1 (l1.w, l1.b) handed over now, then its gradients spoiled: only what
                // was taken when it was handed over can give the right step
                z.hand_gradient(4);
                z.hand_gradient(3);
                for i in [3, 4] {
                    let p = &net.params[i].1;
                    p.set_grad(Some(Tensor::zeros(p.shape(), DType::F32).unwrap()));
                }
                z.finish().unwrap();
                opt.step(&g, LR).unwrap();
                z.after_step().unwrap();
            }
            z.gather_parameters().unwrap();
            for ((name, _), (got, w)) in net.params.iter().zip(net.values().iter().zip(&want)) {
                assert_close(got, w, &format!("stage {stage} rank {r}: {name}"));
            }
            // a gradient handed over twice, or one that is not there: an error of finish (both
            // ranks past the gather first)
            settle(&pg);
            z.begin_forward().unwrap();
            net.loss(&share(&batch(0), r, 2), Some(&z), |_| {}, false)
                .backward()
                .unwrap();
            let (first, second) = if r == 0 { (1, 1) } else { (99, 1) };
            z.hand_gradient(first);
            z.hand_gradient(second);
            let e = z.finish().unwrap_err().to_string();
            let named = if r == 0 {
                "\"l0.w\" got a second gradient"
            } else {
                "hand_gradient(99)"
            };
            assert!(e.contains(named), "stage {stage} rank {r}: {e}");
        });
    }
    // a wrapper whose hooks are registered takes every gradient itself
    ranks(2, T, |pg| {
        let net = Net::new(7);
        let units: Vec<String> = UNITS.iter().map(|u| u.to_string()).collect();
        let z = ShardedDataParallel::new(net.params.clone(), &units, &pg, options(2)).unwrap();
        z.begin_forward().unwrap();
        net.loss(&share(&batch(0), pg.rank(), 2), Some(&z), |_| {}, false)
            .backward()
            .unwrap();
        z.hand_gradient(0);
        // both ranks past their hooks' reductions before either reports (and aborts)
        settle(&pg);
        let e = z.finish().unwrap_err().to_string();
        assert!(e.contains("hooks are registered"), "{e}");
    });
}
