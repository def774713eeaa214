//! Tensor parallelism on 2 and 3 ranks (threads, each with its own connections): a
//! column-parallel then row-parallel pair of Linears, and a vocab-parallel embedding with its
//! tied output layer and cross-entropy, give the whole layers' outputs and gradients (the
//! parameters' gradients put back together); the device mesh puts each rank in the right groups.
//!
//! `VocabShard::cross_entropy` under autocast against the core `cross_entropy` under autocast on
//! the same bf16 logits, on 1, 2 and 3 ranks: the loss is f32 (as autocast's f32 op gives),
//! within 1e-6 of the core's and not rounded to bf16, and the gradient returns to the bf16
//! logits in bf16, equal to the core's up to one bf16 rounding. Without autocast bf16 logits
//! give a bf16 loss, as the core op does.

mod common;

use std::time::Duration;

use common::ranks;
use weft_core::{autocast, DType, Generator, Tensor};
use weft_dist::tensor_parallel::{gather_whole, TpProcessGroup};
use weft_dist::{DeviceMesh, ProcessGroup};
use weft_nn::layers::{Embedding, Linear};
use weft_nn::parallel::{copy_to_group, Split, VocabShard};

const T: Duration = Duration::from_secs(60);

fn randn(shape: &[usize], seed: u64) -> Tensor {
    Tensor::randn(shape, DType::F32, &mut Generator::new(seed)).unwrap()
}

fn assert_close(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    for (i, (g, w)) in got.to_vec_f64().iter().zip(want.to_vec_f64()).enumerate() {
        assert!((g - w).abs() <= 1e-5 + 1e-4 * w.abs(), "{what}[{i}]: {g} vs {w}");
    }
}

/// A whole Linear with fresh leaf parameters copied from `like` (each rank cuts its own copy).
fn copy_linear(like: &Linear) -> Linear {
    let leaf = |t: &Tensor| t.contiguous_copy().unwrap().requires_grad_().unwrap();
    let mut l = like.clone();
    l.weight = leaf(&like.weight);
    l.bias = like.bias.as_ref().map(leaf);
    l
}

/// A cut Linear: its part on this rank, its splits, and the whole layer.
type Cut<'a> = (&'a Linear, &'a [(String, Split)], &'a Linear);

/// The input's gradient `xt` (against the whole layers' `xw`) and the weights' gradients of a
/// column-parallel `ta` and a row-parallel `tb` cut as `sa` and `sb`, put back together over
/// `pg`, against the whole layers' `wa` and `wb`.
fn assert_pair_gradients(pg: &ProcessGroup, what: &str, (xt, xw): (&Tensor, &Tensor), a: Cut, b: Cut) {
    assert_close(
        &xt.grad().unwrap(),
        &xw.grad().unwrap(),
        &format!("{what}: input gradient"),
    );
    for ((part, splits, whole), name) in [(a, "a.weight"), (b, "b.weight")] {
        let got = gather_whole(pg, &splits[0].1, &part.weight.grad().unwrap()).unwrap();
        assert_close(&got, &whole.weight.grad().unwrap(), &format!("{what}: {name}"));
    }
}

#[test]
fn column_then_row_parallel_linears_equal_the_whole_layers() {
    let mut g = Generator::new(3);
    let a = Linear::new(5, 6, true, &mut g).unwrap();
    let b = Linear::new(6, 4, true, &mut g).unwrap();
    let x = randn(&[2, 3, 5], 9);
    // whole: loss = mean(b(gelu(a(x)))^2), with x's gradient too
    let (wa, wb) = (copy_linear(&a), copy_linear(&b));
    let xw = x.contiguous_copy().unwrap().requires_grad_().unwrap();
    let y = wb.forward(&wa.forward(&xw).unwrap().gelu().unwrap()).unwrap();
    let loss = y.mul(&y).unwrap().mean(&[], false).unwrap();
    loss.backward().unwrap();
    for (n, blocks) in [(2, 1), (3, 1)] {
        ranks(n, T, |pg| {
            let group = TpProcessGroup::handle(&pg);
            let (mut ta, mut tb) = (copy_linear(&a), copy_linear(&b));
            let sa = ta.make_column_parallel(&group, blocks).unwrap();
            let sb = tb.make_row_parallel(&group).unwrap();
            let xt = x.contiguous_copy().unwrap().requires_grad_().unwrap();
            let y = tb.forward(&ta.forward(&xt).unwrap().gelu().unwrap()).unwrap();
            let what = format!("tp={n} blocks={blocks} rank {}", pg.rank());
            let l = y.mul(&y).unwrap().mean(&[], false).unwrap();
            assert_close(&l, &loss, &format!("{what}: loss"));
            l.backward().unwrap();
            assert_pair_gradients(&pg, &what, (&xt, &xw), (&ta, &sa, &wa), (&tb, &sb, &wb));
            let whole = |split: &Split, t: &Tensor| gather_whole(&pg, split, &t.grad().unwrap()).unwrap();
            assert_close(
                &whole(&sa[1].1, ta.bias.as_ref().unwrap()),
                &wa.bias.as_ref().unwrap().grad().unwrap(),
                &format!("{what}: a.bias"),
            );
            // the row-parallel bias is whole on every rank, with the whole gradient
            assert_close(
                &tb.bias.as_ref().unwrap().grad().unwrap(),
                &wb.bias.as_ref().unwrap().grad().unwrap(),
                &format!("{what}: b.bias"),
            );
        });
    }
}

/// A pre-norm block `x + b(gelu(a(ln(x))))` under sequence parallelism on 2 and 3 ranks: the
/// stream split into each rank's part of the tokens, the norm on that part, `a` gathering the
/// tokens and `b` reduce-scattering them, the output gathered again for the loss. Loss, the
/// input's gradient and every parameter's (the norm's weight and bias and `b`'s bias summed over
/// the group) equal the whole block's.
#[test]
fn a_sequence_parallel_block_equals_the_whole_block() {
    use weft_nn::layers::LayerNorm;
    use weft_nn::sequence_parallel::{gather_sequence, split_sequence};
    let mut g = Generator::new(11);
    let a = Linear::new(5, 6, true, &mut g).unwrap();
    let b = Linear::new(6, 5, true, &mut g).unwrap();
    let mut ln = LayerNorm::new(5, true, 1e-5).unwrap();
    ln.weight = randn(&[5], 12);
    ln.bias = Some(randn(&[5], 13));
    // 2 rows of 6 tokens: 6 divides by 2 and by 3
    let x = randn(&[2, 6, 5], 14);
    let copy_ln = |l: &LayerNorm| {
        let leaf = |t: &Tensor| t.contiguous_copy().unwrap().requires_grad_().unwrap();
        let mut c = l.clone();
        c.weight = leaf(&l.weight);
        c.bias = l.bias.as_ref().map(leaf);
        c
    };
    let (wa, wb, wln) = (copy_linear(&a), copy_linear(&b), copy_ln(&ln));
    let xw = x.contiguous_copy().unwrap().requires_grad_().unwrap();
    let h = wa.forward(&wln.forward(&xw).unwrap()).unwrap().gelu().unwrap();
    let yw = xw.add(&wb.forward(&h).unwrap()).unwrap();
    let loss = yw.mul(&yw).unwrap().mean(&[], false).unwrap();
    loss.backward().unwrap();
    for n in [2, 3] {
        ranks(n, T, |pg| {
            let group = TpProcessGroup::with_sequence_parallel(&pg, true);
            let (mut ta, mut tb, mut tln) = (copy_linear(&a), copy_linear(&b), copy_ln(&ln));
            let sa = ta.make_column_parallel(&group, 1).unwrap();
            let sb = tb.make_row_parallel(&group).unwrap();
            tln.make_sequence_parallel(&group);
            let xt = x.contiguous_copy().unwrap().requires_grad_().unwrap();
            let part = split_sequence(&xt, &group).unwrap();
            assert_eq!(part.shape(), [2, 6 / n, 5]);
            let h = ta.forward(&tln.forward(&part).unwrap()).unwrap().gelu().unwrap();
            let yp = part.add(&tb.forward(&h).unwrap()).unwrap();
            assert_eq!(yp.shape(), [2, 6 / n, 5]);
            let what = format!("sequence-parallel tp={n} rank {}", pg.rank());
            let y = gather_sequence(&yp.detach(), &group).unwrap();
            assert_close(&y, &yw, &format!("{what}: output"));
            // each rank's loss is its tokens' share of the mean: the ranks' losses sum to the
            // whole loss (a loss taken whole on every rank after the gather would count its
            // gradient once per rank: the gather's backward sums the ranks' gradients, as
            // the vocabulary-parallel output layer after it needs)
            let l = yp.mul(&yp).unwrap().sum_all().unwrap().mul_scalar(1.0 / 60.0).unwrap();
            let total = l.detach().contiguous_copy().unwrap();
            pg.all_reduce(&total, weft_dist::ReduceOp::Sum).unwrap().wait().unwrap();
            assert_close(&total, &loss, &format!("{what}: loss"));
            l.backward().unwrap();
            assert_pair_gradients(&pg, &what, (&xt, &xw), (&ta, &sa, &wa), (&tb, &sb, &wb));
            for (got, want, name) in [
                (tb.bias.as_ref().unwrap(), wb.bias.as_ref().unwrap(), "b.bias"),
                (&tln.weight, &wln.weight, "ln.weight"),
                (tln.bias.as_ref().unwrap(), wln.bias.as_ref().unwrap(), "ln.bias"),
            ] {
                assert_close(&got.grad().unwrap(), &want.grad().unwrap(), &format!("{what}: {name}"));
            }
        });
    }
}

#[test]
fn a_column_parallel_fused_projection_gives_each_rank_its_part_of_every_block() {
    // a fused q,k,v projection (3 blocks of 4 output features) over 2 ranks
    let a = Linear::new(5, 12, true, &mut Generator::new(5)).unwrap();
    let x = randn(&[3, 5], 6);
    let whole = copy_linear(&a);
    let y = whole.forward(&x).unwrap();
    y.mul(&y).unwrap().sum_all().unwrap().backward().unwrap();
    ranks(2, T, |pg| {
        let group = TpProcessGroup::handle(&pg);
        let mut part = copy_linear(&a);
        let splits = part.make_column_parallel(&group, 3).unwrap();
        let out = part.forward(&x).unwrap();
        assert_eq!(out.shape(), [3, 6]);
        let split = Split {
            dim: 1,
            blocks: 3,
            len: 12,
        };
        // rank r's output columns are its rows of each block
        let got = gather_whole(&pg, &split, &out.detach()).unwrap();
        assert_close(&got, &y, "fused output");
        // the sum of the ranks' partial losses is the whole loss
        out.mul(&out).unwrap().sum_all().unwrap().backward().unwrap();
        let g = gather_whole(&pg, &splits[0].1, &part.weight.grad().unwrap()).unwrap();
        assert_close(&g, &whole.weight.grad().unwrap(), "fused weight gradient");
    });
}

#[test]
fn a_vocab_parallel_embedding_and_cross_entropy_equal_the_whole_even_with_padding() {
    // vocab 7 over 2 and 3 ranks: 1 and 2 padding rows
    let table = randn(&[7, 3], 4);
    let ids = Tensor::from_vec(vec![0i64, 6, 3, 5, 1, 2], &[2, 3]).unwrap();
    let targets = Tensor::from_vec(vec![6i64, 0, -1, 2, 5, 4], &[6]).unwrap();
    let loss_of = |emb: &Embedding, logits: &dyn Fn(&Tensor) -> Tensor| {
        let h = emb.forward(&ids).unwrap().tanh().unwrap().reshape(&[6, 3]).unwrap();
        logits(&h)
    };
    let whole = Embedding::from_weight(table.contiguous_copy().unwrap().requires_grad_().unwrap());
    let want = loss_of(&whole, &|h| {
        h.matmul(&whole.weight.t().unwrap())
            .unwrap()
            .cross_entropy(&targets, -1, 0.0)
            .unwrap()
    });
    want.backward().unwrap();
    for n in [2, 3] {
        ranks(n, T, |pg| {
            let group = TpProcessGroup::handle(&pg);
            let mut emb = Embedding::from_weight(table.contiguous_copy().unwrap().requires_grad_().unwrap());
            let split = emb.make_vocab_parallel(&group).unwrap().remove(0).1;
            let shard = emb.shard.clone().unwrap();
            let got = loss_of(&emb, &|h| {
                let logits = copy_to_group(h, &group)
                    .unwrap()
                    .matmul(&emb.weight.t().unwrap())
                    .unwrap();
                shard.cross_entropy(&logits, &targets, -1).unwrap()
            });
            let what = format!("tp={n} rank {}", pg.rank());
            assert_close(&got, &want, &format!("{what}: loss"));
            got.backward().unwrap();
            let g = gather_whole(&pg, &split, &emb.weight.grad().unwrap()).unwrap();
            assert_close(&g, &whole.weight.grad().unwrap(), &format!("{what}: table gradient"));
            // padding rows get no gradient
            let rows = emb.weight.dim(0).unwrap();
            let local = emb.weight.grad().unwrap().to_vec_f64();
            for r in 0..rows {
                if shard.start + r >= 7 {
                    assert!(
                        local[r * 3..r * 3 + 3].iter().all(|&v| v == 0.0),
                        "{what}: padding row {r}"
                    );
                }
            }
        });
    }
}

#[test]
fn the_device_mesh_puts_tensor_parallel_ranks_next_to_each_other() {
    let got = ranks(8, T, |pg| {
        let m = DeviceMesh::new(&pg, 2, 2, 2).unwrap();
        // every group works: sum the global ranks over it
        let sum = |g: &weft_dist::ProcessGroup| {
            let t = Tensor::from_vec(vec![pg.rank() as f64], &[1]).unwrap();
            g.all_reduce(&t, weft_dist::ReduceOp::Sum).unwrap().wait().unwrap();
            t.to_vec::<f64>().unwrap()[0] as usize
        };
        (
            m.coords(),
            m.tp_group.ranks().to_vec(),
            m.dp_group.ranks().to_vec(),
            m.pp_group.ranks().to_vec(),
            sum(&m.tp_group),
        )
    });
    // rank 5 = pp 1, dp 0, tp 1
    assert_eq!(got[5].0, (0, 1, 1));
    assert_eq!(got[5].1, [4, 5]);
    assert_eq!(got[5].2, [5, 7]);
    assert_eq!(got[5].3, [1, 5]);
    assert_eq!(got[5].4, 9);
    assert_eq!(got[2].1, [2, 3]);
    ranks(2, T, |pg| {
        let e = DeviceMesh::new(&pg, 2, 2, 1).err().unwrap();
        assert!(e.to_string().contains("2 x 2 x 1 = 4"), "{e}");
    });
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
        let got = ranks(n, T, |pg| {
            let shard = VocabShard::new(TpProcessGroup::handle(&pg), VOCAB);
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
                pg.rank(),
            )
        });
        for (dtype, loss, grad_dtype, grad, shard, rank) in got {
            let what = format!("tp={n} rank {rank}");
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
    let got = ranks(2, T, |pg| {
        let shard = VocabShard::new(TpProcessGroup::handle(&pg), VOCAB);
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
