//! `VocabShard::cross_entropy` under autocast against the core `cross_entropy` under autocast on
//! the same bf16 logits, on 1, 2 and 3 ranks of an in-process group (threads): the loss is f32
//! (as autocast's f32 op gives), within 1e-6 of the core's and not rounded to bf16, and the
//! gradient returns to the bf16 logits in bf16, equal to the core's up to one bf16 rounding.
//! Without autocast bf16 logits give a bf16 loss, as the core op does.

use std::sync::{Arc, Barrier, Mutex};

use weft_core::{autocast, DType, Generator, Result, Tensor};
use weft_nn::parallel::{GroupReduce, TensorParallelGroup, TpGroup, VocabShard};

/// What the ranks of one group share: each rank's contribution to the collective under way.
struct Shared {
    barrier: Barrier,
    slots: Mutex<Vec<Vec<f64>>>,
}

/// One rank of an in-process group of threads.
struct ThreadGroup {
    rank: usize,
    shared: Arc<Shared>,
}

impl TensorParallelGroup for ThreadGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.shared.slots.lock().unwrap().len()
    }
    fn all_reduce(&self, t: &Tensor, op: GroupReduce) -> Result<()> {
        self.shared.slots.lock().unwrap()[self.rank] = t.to_vec_f64();
        self.shared.barrier.wait();
        let reduced = {
            let slots = self.shared.slots.lock().unwrap();
            let mut acc = slots[0].clone();
            for s in &slots[1..] {
                for (a, &b) in acc.iter_mut().zip(s) {
                    *a = match op {
                        GroupReduce::Sum => *a + b,
                        GroupReduce::Max => a.max(b),
                    };
                }
            }
            acc
        };
        // every rank has read the slots before any writes the next collective's
        self.shared.barrier.wait();
        t.copy_from(&Tensor::from_vec(reduced, t.shape())?)
    }
    fn all_gather(&self, _output: &Tensor, _input: &Tensor) -> Result<()> {
        unimplemented!("the loss does not gather")
    }
}

/// Runs `f(group)` on `n` threads, one per rank; returns each rank's result in rank order.
fn ranks<R: Send>(n: usize, f: impl Fn(TpGroup) -> R + Sync) -> Vec<R> {
    let shared = Arc::new(Shared {
        barrier: Barrier::new(n),
        slots: Mutex::new(vec![Vec::new(); n]),
    });
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let group: TpGroup = Arc::new(ThreadGroup {
                    rank,
                    shared: shared.clone(),
                });
                let f = &f;
                s.spawn(move || f(group))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

const N: usize = 24;
const VOCAB: usize = 67;

/// bf16 logits `[N, VOCAB]` of a realistic spread (a few units), and targets with ignored rows.
fn inputs() -> (Vec<f64>, Tensor) {
    let mut g = Generator::new(7);
    let logits = Tensor::randn(&[N, VOCAB], DType::F32, &mut g)
        .unwrap()
        .mul_scalar(2.5)
        .unwrap()
        .cast(DType::BF16)
        .unwrap()
        .to_vec_f64();
    let targets: Vec<i64> = (0..N)
        .map(|i| if i % 7 == 3 { -1 } else { ((i * 37 + 5) % VOCAB) as i64 })
        .collect();
    (logits, Tensor::from_vec(targets, &[N]).unwrap())
}

/// Columns `[start, start + rows)` of the whole logits (zeros past the vocabulary), as a bf16
/// leaf that takes a gradient.
fn columns(whole: &[f64], start: usize, rows: usize) -> Tensor {
    let mut v = vec![0.0f32; N * rows];
    for i in 0..N {
        for j in 0..rows {
            if start + j < VOCAB {
                v[i * rows + j] = whole[i * VOCAB + start + j] as f32;
            }
        }
    }
    Tensor::from_vec(v, &[N, rows])
        .unwrap()
        .cast(DType::BF16)
        .unwrap()
        .requires_grad_()
        .unwrap()
}

/// The core op's loss (its dtype and value) and gradient of the whole bf16 logits, under
/// autocast to bf16 when `autocast_on`.
fn core(whole: &[f64], targets: &Tensor, autocast_on: bool) -> (DType, f64, Vec<f64>) {
    let logits = columns(whole, 0, VOCAB);
    let dtype = autocast_on.then_some(DType::BF16);
    let loss = autocast(dtype, || logits.cross_entropy(targets, -1, 0.0)).unwrap();
    loss.backward().unwrap();
    let grad = logits.grad().unwrap();
    assert_eq!(grad.dtype(), DType::BF16, "the core op's gradient of bf16 logits");
    (loss.dtype(), loss.item().unwrap(), grad.to_vec_f64())
}

#[test]
fn under_autocast_the_vocab_parallel_loss_is_f32_as_the_core_cross_entropy() {
    let (whole, targets) = inputs();
    let (want_dtype, want, want_grad) = core(&whole, &targets, true);
    assert_eq!(want_dtype, DType::F32);
    for n in [1, 2, 3] {
        let got = ranks(n, |group| {
            let shard = VocabShard::new(group, VOCAB);
            let logits = columns(&whole, shard.start, shard.rows);
            let loss = autocast(Some(DType::BF16), || shard.cross_entropy(&logits, &targets, -1)).unwrap();
            // the backward runs outside the region, as the trainer's does
            loss.backward().unwrap();
            let grad = logits.grad().unwrap();
            (
                loss.dtype(),
                loss.item().unwrap(),
                grad.dtype(),
                grad.to_vec_f64(),
                shard,
            )
        });
        for (dtype, loss, grad_dtype, grad, shard) in got {
            let what = format!("tp={n} rank {}", shard.start / shard.rows);
            assert_eq!(dtype, DType::F32, "{what}: the loss's dtype");
            assert!(
                (loss - want).abs() <= 1e-6 * want.abs(),
                "{what}: loss {loss} vs the core's {want}"
            );
            assert_eq!(grad_dtype, DType::BF16, "{what}: the gradient's dtype");
            for i in 0..N {
                for j in 0..shard.rows {
                    let g = grad[i * shard.rows + j];
                    let c = shard.start + j;
                    let w = if c < VOCAB { want_grad[i * VOCAB + c] } else { 0.0 };
                    // both are the f32/f64 gradient rounded to bf16: one bf16 step apart at most
                    assert!(
                        (g - w).abs() <= w.abs() / 128.0 + 1e-9,
                        "{what}: gradient [{i}, {c}] {g} vs the core's {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn without_autocast_bf16_logits_give_a_bf16_loss_as_the_core_cross_entropy() {
    let (whole, targets) = inputs();
    let (want_dtype, want, _) = core(&whole, &targets, false);
    assert_eq!(want_dtype, DType::BF16);
    let got = ranks(2, |group| {
        let shard = VocabShard::new(group, VOCAB);
        let logits = columns(&whole, shard.start, shard.rows);
        let loss = shard.cross_entropy(&logits, &targets, -1).unwrap();
        (loss.dtype(), loss.item().unwrap())
    });
    for (dtype, loss) in got {
        assert_eq!(dtype, DType::BF16);
        // one bf16 step of a loss of a few units
        assert!((loss - want).abs() <= want.abs() / 128.0, "{loss} vs {want}");
    }
}
