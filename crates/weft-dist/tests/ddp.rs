//! Data parallelism on 2 and 4 ranks (threads, each with its own connections): gradients equal
//! the single-process gradients of the whole batch, parameters start from rank 0's, gradient
//! accumulation with `no_sync` equals the larger batch, and a parameter without a gradient is an
//! error naming it on every rank (or, when allowed, counts as zero).

mod common;

use std::time::Duration;

use common::{ranks, settle};
use weft_core::{DType, Generator, Tensor};
use weft_dist::{DataParallel, DdpOptions};

const T: Duration = Duration::from_secs(60);

/// A two-layer model: `(x @ w1 + b1).tanh() @ w2`, parameters in registration order.
struct Net {
    params: Vec<(String, Tensor)>,
}

impl Net {
    /// Parameters drawn from `seed` (different seeds give different models).
    fn new(seed: u64) -> Net {
        let mut g = Generator::new(seed);
        let mut p = |shape: &[usize]| {
            Tensor::randn(shape, DType::F32, &mut g)
                .unwrap()
                .requires_grad_()
                .unwrap()
        };
        Net {
            params: vec![
                ("w1".into(), p(&[6, 40])),
                ("b1".into(), p(&[40])),
                ("w2".into(), p(&[40, 3])),
                ("extra".into(), p(&[5])),
            ],
        }
    }

    fn get(&self, name: &str) -> &Tensor {
        &self.params.iter().find(|(n, _)| n == name).unwrap().1
    }

    /// Mean of the squared outputs over the rows of `x`, plus the sum of `extra` when
    /// `use_extra` (else `extra` takes no part in the loss).
    fn loss(&self, x: &Tensor, use_extra: bool) -> Tensor {
        let h = x
            .matmul(self.get("w1"))
            .unwrap()
            .add(self.get("b1"))
            .unwrap()
            .tanh()
            .unwrap();
        let y = h.matmul(self.get("w2")).unwrap();
        let mut l = y.mul(&y).unwrap().mean(&[], false).unwrap();
        if use_extra {
            l = l.add(&self.get("extra").sum(&[], false).unwrap()).unwrap();
        }
        l
    }

    fn grads(&self) -> Vec<Option<Vec<f64>>> {
        self.params
            .iter()
            .map(|(_, p)| p.grad().map(|g| g.to_vec_f64()))
            .collect()
    }

    fn values(&self) -> Vec<Vec<f64>> {
        self.params.iter().map(|(_, p)| p.to_vec_f64()).collect()
    }
}

fn batch(rows: usize, seed: u64) -> Tensor {
    Tensor::randn(&[rows, 6], DType::F32, &mut Generator::new(seed)).unwrap()
}

/// Rows `[r * b, (r + 1) * b)` of `x`.
fn share(x: &Tensor, r: usize, b: usize) -> Tensor {
    x.narrow(0, r * b, b).unwrap().contiguous_copy().unwrap()
}

fn small_buckets() -> DdpOptions {
    DdpOptions {
        first_bucket_bytes: 64,
        bucket_bytes: 128,
        ..DdpOptions::default()
    }
}

fn assert_close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-6 + 1e-5 * w.abs(), "{what}[{i}]: {g} vs {w}");
    }
}

/// Every parameter's gradient equals `want`'s (a reference model's `grads()`).
fn assert_grads(net: &Net, want: &[Option<Vec<f64>>], what: &str) {
    for ((name, _), (g, w)) in net.params.iter().zip(net.grads().iter().zip(want)) {
        assert_close(g.as_ref().unwrap(), w.as_ref().unwrap(), &format!("{what} {name}"));
    }
}

#[test]
fn gradients_are_the_whole_batch_gradients_and_parameters_start_from_rank_0() {
    let reference = Net::new(7);
    let x = batch(8, 1);
    reference.loss(&x, true).backward().unwrap();
    let want = reference.grads();
    let start = reference.values();
    for n in [2, 4] {
        ranks(n, T, |pg| {
            let r = pg.rank();
            // every rank but 0 starts elsewhere: the broadcast must fix that
            let net = Net::new(if r == 0 { 7 } else { 100 + r as u64 });
            let ddp = DataParallel::new(net.params.clone(), &pg, small_buckets()).unwrap();
            // reverse order; a bucket closes once it reaches its cap (64 bytes, then 128)
            assert_eq!(ddp.buckets(), [vec!["extra", "w2"], vec!["b1"], vec!["w1"]]);
            // a break where "extra" begins: no bucket holds it and "w2"
            let broken = DdpOptions {
                bucket_breaks: vec![3],
                ..small_buckets()
            };
            let other = DataParallel::new_unhooked(net.params.clone(), &pg, broken).unwrap();
            assert_eq!(other.buckets(), [vec!["extra"], vec!["w2"], vec!["b1"], vec!["w1"]]);
            drop(other);
            assert_eq!(net.values(), start, "rank {r}: parameters after the broadcast");
            for step in 0..2 {
                ddp.backward(&net.loss(&share(&x, r, 8 / n), true)).unwrap();
                assert_grads(&net, &want, &format!("n={n} rank {r} step {step}"));
                net.params.iter().for_each(|(_, p)| p.set_grad(None));
            }
        });
    }
}

#[test]
fn no_sync_accumulation_equals_the_larger_batch() {
    let reference = Net::new(3);
    let x = batch(16, 2);
    reference.loss(&x, true).backward().unwrap();
    let want = reference.grads();
    ranks(2, T, |pg| {
        let r = pg.rank();
        let net = Net::new(3);
        let ddp = DataParallel::new(net.params.clone(), &pg, DdpOptions::default()).unwrap();
        // this rank's 8 rows in two micro-batches of 4, each loss weighted 1/2
        let mine = share(&x, r, 8);
        let half = Tensor::from_vec(vec![0.5f32], &[]).unwrap();
        ddp.no_sync(|| {
            let l = net.loss(&share(&mine, 0, 4), true).mul(&half).unwrap();
            l.backward().unwrap();
            ddp.finish().unwrap(); // nothing to do inside no_sync
        });
        let l = net.loss(&share(&mine, 1, 4), true).mul(&half).unwrap();
        ddp.backward(&l).unwrap();
        assert_grads(&net, &want, &format!("rank {r}"));
    });
}

#[test]
fn a_parameter_without_gradient_is_named_on_every_rank() {
    let errors = ranks(2, T, |pg| {
        let r = pg.rank();
        let net = Net::new(5);
        let ddp = DataParallel::new(net.params.clone(), &pg, small_buckets()).unwrap();
        // rank 1 leaves "extra" out of its loss
        ddp.backward(&net.loss(&batch(4, r as u64), r == 0))
            .unwrap_err()
            .to_string()
    });
    for (r, e) in errors.iter().enumerate() {
        assert!(e.contains("\"extra\"") && e.contains("no gradient"), "rank {r}: {e}");
    }
}

#[test]
fn unused_parameters_count_as_zero_when_allowed() {
    let x = batch(8, 9);
    // the reference: "extra" is in rank 0's loss only, so its averaged gradient is 1/2 of ones
    ranks(2, T, |pg| {
        let r = pg.rank();
        let net = Net::new(5);
        let options = DdpOptions {
            find_unused_parameters: true,
            ..small_buckets()
        };
        let ddp = DataParallel::new(net.params.clone(), &pg, options).unwrap();
        ddp.backward(&net.loss(&share(&x, r, 4), r == 0)).unwrap();
        let extra = net.get("extra").grad().expect("used on rank 0").to_vec_f64();
        assert_close(&extra, &[0.5; 5], &format!("rank {r}: extra"));
        net.params.iter().for_each(|(_, p)| p.set_grad(None));
        // unused everywhere: no gradient at all, as PyTorch leaves it
        ddp.backward(&net.loss(&share(&x, r, 4), false)).unwrap();
        assert!(net.get("extra").grad().is_none(), "rank {r}");
        assert!(net.get("w1").grad().is_some(), "rank {r}");
    });
}

#[test]
fn without_hooks_gradients_handed_over_early_and_the_rest_give_the_same_averages() {
    let reference = Net::new(11);
    let x = batch(8, 4);
    reference.loss(&x, true).backward().unwrap();
    let want = reference.grads();
    ranks(2, T, |pg| {
        let r = pg.rank();
        let net = Net::new(11);
        let ddp = DataParallel::new_unhooked(net.params.clone(), &pg, small_buckets()).unwrap();
        for step in 0..2 {
            net.loss(&share(&x, r, 4), true).backward().unwrap();
            // "extra" and "w2" (the first bucket) handed over at once, then their gradients
            // spoiled: only what was taken at hand time gives the right averages; finish takes
            // the rest
            for i in [3, 2] {
                ddp.hand_gradient(i);
                let p = &net.params[i].1;
                p.set_grad(Some(Tensor::zeros(p.shape(), DType::F32).unwrap()));
            }
            ddp.finish().unwrap();
            assert_grads(&net, &want, &format!("rank {r} step {step}"));
            net.params.iter().for_each(|(_, p)| p.set_grad(None));
        }
        // handing one over twice, or one that is not there, is an error of finish, on every rank
        // (both ranks past the last reduction first)
        settle(&pg);
        net.loss(&share(&x, r, 4), true).backward().unwrap();
        ddp.hand_gradient(if r == 0 { 1 } else { 9 });
        ddp.hand_gradient(1);
        let e = ddp.finish().unwrap_err().to_string();
        let named = if r == 0 {
            "\"b1\" got a second gradient"
        } else {
            "hand_gradient(9)"
        };
        assert!(e.contains(named), "rank {r}: {e}");
    });
}
