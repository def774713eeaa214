use super::passes::{eliminate_common, eliminate_dead, fold_constants, optimize};
use super::plan::plan;
use super::*;
use crate::{DType, Generator, Result, Tensor, UnaryOp};
use std::sync::Arc;

fn randn(shape: &[usize], seed: u64) -> Tensor {
    Tensor::randn(shape, DType::F32, &mut Generator::new(seed)).unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect()
}

fn leaf(shape: &[usize], seed: u64) -> Tensor {
    randn(shape, seed).requires_grad_().unwrap()
}

/// A small training step: loss = mean(gelu(x W^T + b)^2), gradients of W and b.
fn step(w: &Tensor, b: &Tensor, xs: &[Tensor]) -> Result<Vec<Tensor>> {
    w.set_grad(None);
    b.set_grad(None);
    let h = xs[0].linear(w, Some(b))?.gelu()?;
    let loss = h.mul(&h)?.mean_all()?;
    loss.backward()?;
    Ok(vec![loss.detach(), w.grad().unwrap(), b.grad().unwrap()])
}

fn sgd(params: &[&Tensor], grads: &[Tensor]) {
    for (p, g) in params.iter().zip(grads) {
        let g = g.to_vec::<f32>().unwrap();
        p.with_data_mut::<f32, _>(|d| d.iter_mut().zip(&g).for_each(|(x, g)| *x -= 0.1 * g))
            .unwrap();
    }
}

#[test]
fn replays_a_training_step_bit_for_bit_and_sees_parameter_updates() {
    let (we, be) = (leaf(&[6, 5], 1), leaf(&[6], 2));
    let (wc, bc) = (
        we.detach().contiguous_copy().unwrap().requires_grad_().unwrap(),
        be.detach().contiguous_copy().unwrap().requires_grad_().unwrap(),
    );
    let mut compiled = compile(|xs: &[Tensor]| step(&wc, &bc, xs));
    for call in 0..4 {
        let x = randn(&[3, 5], 10 + call);
        let eager = step(&we, &be, std::slice::from_ref(&x)).unwrap();
        let replayed = compiled.call(std::slice::from_ref(&x)).unwrap();
        let want = if call == 0 {
            Outcome::Captured
        } else {
            Outcome::Replayed
        };
        assert_eq!(compiled.last_outcome(), Some(&want));
        for (e, r) in eager.iter().zip(&replayed) {
            assert_eq!(bits(e), bits(r), "call {call}");
        }
        sgd(&[&we, &be], &eager[1..]);
        sgd(&[&wc, &bc], &replayed[1..]);
    }
    assert_eq!(compiled.cached(), 1);
}

#[test]
fn results_own_their_buffers() {
    let w = leaf(&[4], 3);
    // the gradient of w in `w + w` reaches the leaf through a copy autograd makes
    let mut compiled = compile(|xs: &[Tensor]| {
        w.set_grad(None);
        let loss = w.add(&w)?.mul(&xs[0])?.sum_all()?;
        loss.backward()?;
        Ok(vec![w.grad().unwrap(), xs[0].clone()])
    });
    let x = randn(&[4], 4);
    let first = compiled.call(std::slice::from_ref(&x)).unwrap();
    let again = compiled.call(std::slice::from_ref(&x)).unwrap();
    assert_eq!(compiled.last_outcome(), Some(&Outcome::Replayed));
    assert_eq!(bits(&first[0]), bits(&again[0]));
    assert_eq!(bits(&again[1]), bits(&x));
    assert!(
        again[1].same_storage(&x),
        "an input returned as a result is the input, as eagerly"
    );
    assert_eq!(Arc::strong_count(again[0].storage()), 1, "the gradient owns its buffer");
}

#[test]
fn a_new_input_shape_captures_a_new_graph_and_the_cache_is_bounded() {
    let w = randn(&[5], 5);
    let mut compiled = compile(|xs: &[Tensor]| Ok(vec![xs[0].mul(&w)?.exp()?])).with_cache_capacity(2);
    for rows in [1, 2, 3, 1] {
        let x = randn(&[rows, 5], rows as u64);
        let out = compiled.call(std::slice::from_ref(&x)).unwrap();
        assert_eq!(compiled.last_outcome(), Some(&Outcome::Captured), "rows {rows}");
        assert_eq!(bits(&out[0]), bits(&x.mul(&w).unwrap().exp().unwrap()));
    }
    assert_eq!(compiled.cached(), 2);
    compiled.call(&[randn(&[1, 5], 9)]).unwrap();
    assert_eq!(compiled.last_outcome(), Some(&Outcome::Replayed));
}

fn refusal<F>(f: F) -> String
where
    F: FnMut(&[Tensor]) -> Result<Vec<Tensor>>,
{
    let mut compiled = compile(f);
    let x = randn(&[2, 3], 7);
    let first = compiled.call(std::slice::from_ref(&x)).unwrap();
    let second = compiled.call(std::slice::from_ref(&x)).unwrap();
    assert_eq!(first.len(), second.len());
    match compiled.last_outcome() {
        Some(Outcome::Eager(reason)) => reason.clone(),
        other => panic!("expected an eager fallback, got {other:?}"),
    }
}

#[test]
fn what_cannot_be_replayed_runs_eagerly_with_a_reason() {
    let r = refusal(|xs| Ok(vec![xs[0].dropout(0.5, true, &mut Generator::new(1))?]));
    assert!(r.contains("dropout"), "{r}");
    let r = refusal(|xs| {
        Ok(vec![xs[0].add(&Tensor::rand(
            &[2, 3],
            DType::F32,
            &mut Generator::new(1),
        )?)?])
    });
    assert!(r.contains("random"), "{r}");
    let r = refusal(|xs| {
        let s = xs[0].sum_all()?;
        let y = if s.item()? > 0.0 { xs[0].exp()? } else { xs[0].neg()? };
        Ok(vec![y])
    });
    assert!(r.contains("data-dependent") && r.contains("reduce"), "{r}");
    let r = refusal(|xs| {
        let y = xs[0].exp()?;
        y.with_data_mut::<f32, _>(|d| d[0] = 0.0)?;
        Ok(vec![y])
    });
    assert!(r.contains("in place"), "{r}");
    // a constant made at every call: tried twice, then given up
    let r = refusal(|xs| Ok(vec![xs[0].mul(&Tensor::from_vec(vec![2.0f32; 3], &[3])?)?]));
    assert!(r.contains("outside the op set"), "{r}");
    let w = leaf(&[3], 8);
    let r = refusal(|xs| Ok(vec![xs[0].mul(&w)?]));
    assert!(r.contains("needs gradients"), "{r}");
    let w = leaf(&[3], 9);
    w.register_grad_ready_hook(|_| {});
    let r = refusal(|xs| {
        w.set_grad(None);
        xs[0].mul(&w)?.sum_all()?.backward()?;
        Ok(vec![w.grad().unwrap()])
    });
    assert!(r.contains("hooks"), "{r}");
}

#[test]
fn a_cache_filled_at_the_first_call_is_captured_at_the_second() {
    let table: std::sync::Mutex<Option<Tensor>> = std::sync::Mutex::new(None);
    let mut compiled = compile(|xs: &[Tensor]| {
        let t = table
            .lock()
            .unwrap()
            .get_or_insert_with(|| Tensor::from_vec(vec![3.0f32; 3], &[3]).unwrap())
            .clone();
        Ok(vec![xs[0].mul(&t)?])
    });
    let x = randn(&[2, 3], 1);
    let outcomes: Vec<_> = (0..3)
        .map(|_| {
            compiled.call(std::slice::from_ref(&x)).unwrap();
            compiled.last_outcome().cloned().unwrap()
        })
        .collect();
    assert!(matches!(outcomes[0], Outcome::Eager(_)));
    assert_eq!(outcomes[1..], [Outcome::Captured, Outcome::Replayed]);
}

#[test]
fn reading_an_input_on_the_host_is_allowed() {
    let mut compiled = compile(|xs: &[Tensor]| {
        let n = xs[0].to_vec::<f32>()?.len();
        Ok(vec![xs[0].mul_scalar(n as f64)?])
    });
    let x = randn(&[2, 3], 1);
    compiled.call(std::slice::from_ref(&x)).unwrap();
    compiled.call(std::slice::from_ref(&x)).unwrap();
    assert_eq!(compiled.last_outcome(), Some(&Outcome::Replayed));
}

fn traced<F>(x: &Tensor, f: F) -> Graph
where
    F: FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
{
    trace(std::slice::from_ref(x), f).unwrap().1.unwrap()
}

#[test]
fn common_subexpressions_merge_and_dead_nodes_go() {
    let x = randn(&[4, 4], 1);
    let f = |xs: &[Tensor]| {
        let _unused = xs[0].tanh()?.sigmoid()?;
        Ok(vec![xs[0].exp()?.add(&xs[0].exp()?)?])
    };
    let mut g = traced(&x, f);
    assert_eq!(g.nodes.len(), 5);
    assert_eq!(eliminate_common(&mut g), 1);
    assert_eq!(eliminate_dead(&mut g), 2);
    let names: Vec<_> = g.nodes.iter().map(|n| n.op.name()).collect();
    assert_eq!(names, ["unary", "binary"]);
    let out = g.run(std::slice::from_ref(&x)).unwrap();
    assert_eq!(bits(&out[0]), bits(&f(std::slice::from_ref(&x)).unwrap()[0]));
    // different attributes are not merged
    let mut g = traced(&x, |xs| {
        Ok(vec![xs[0].unary(UnaryOp::Exp)?.add(&xs[0].unary(UnaryOp::Tanh)?)?])
    });
    assert_eq!(eliminate_common(&mut g), 0);
}

#[test]
fn constant_subgraphs_fold() {
    let x = randn(&[3], 2);
    let f = |xs: &[Tensor]| {
        let c = Tensor::ones(&[3], DType::F32)?.mul_scalar(2.0)?.exp()?;
        Ok(vec![xs[0].add(&c)?])
    };
    let mut g = traced(&x, f);
    assert_eq!(g.nodes.len(), 4);
    assert_eq!(fold_constants(&mut g).unwrap(), 3);
    assert_eq!(g.nodes.len(), 1);
    let out = g.run(std::slice::from_ref(&x)).unwrap();
    assert_eq!(bits(&out[0]), bits(&f(std::slice::from_ref(&x)).unwrap()[0]));
    // big constants stay nodes
    let big = passes::FOLD_MAX_ELEMENTS + 1;
    let y = randn(&[big], 3);
    let mut g = traced(&y, |xs| Ok(vec![xs[0].add(&Tensor::ones(&[big], DType::F32)?)?]));
    assert_eq!(fold_constants(&mut g).unwrap(), 0);
}

#[test]
fn the_memory_plan_never_overlaps_live_buffers() {
    let w = leaf(&[8, 8], 4);
    let x = randn(&[16, 8], 5);
    let mut g = traced(&x, |xs| {
        w.set_grad(None);
        let mut h = xs[0].clone();
        for _ in 0..3 {
            h = h.matmul(&w)?.tanh()?;
        }
        h.sum_all()?.backward()?;
        Ok(vec![w.grad().unwrap()])
    });
    optimize(&mut g).unwrap();
    let p = plan(&g);
    assert!(!p.buffers.is_empty());
    assert!(p.arena_bytes >= p.peak_live_bytes && p.peak_live_bytes > 0);
    for a in &p.buffers {
        for b in &p.buffers {
            let meet = a.buffer != b.buffer && a.first <= b.last && b.first <= a.last;
            let overlap = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
            assert!(!(meet && overlap), "{a:?} and {b:?}");
        }
    }
    // three [16, 8] f32 activations alive at once at least (each tanh is kept for the backward)
    assert!(p.peak_live_bytes >= 3 * 16 * 8 * 4);
    assert_eq!(p.outside_bytes, 16 * 8 * 4 + 8 * 8 * 4 + 4);
}

#[test]
fn the_plan_of_a_chain_reuses_memory() {
    // x -> x x -> (x x) x -> ...: only two [32, 32] buffers are alive at once
    let x = randn(&[32, 32], 6);
    let g = traced(&x, |xs| {
        Ok(vec![xs[0]
            .matmul(&xs[0])?
            .matmul(&xs[0])?
            .matmul(&xs[0])?
            .matmul(&xs[0])?])
    });
    let p = plan(&g);
    assert_eq!(p.buffers.len(), 4);
    assert_eq!(p.peak_live_bytes, 2 * 4096);
    assert_eq!(p.arena_bytes, 2 * 4096);
}

#[test]
fn the_plan_counts_a_one_pass_group_as_its_result_alone() {
    // x -> exp -> tanh -> exp -> tanh runs as one pass: its intermediates are never made
    let x = randn(&[1024], 6);
    let g = traced(&x, |xs| Ok(vec![xs[0].exp()?.tanh()?.exp()?.tanh()?]));
    assert_eq!(fusion::groups(&g), vec![vec![0, 1, 2, 3]]);
    let p = plan(&g);
    assert_eq!(p.buffers.len(), 1);
    assert_eq!((p.peak_live_bytes, p.arena_bytes), (4096, 4096));
    // tanh(x x + b): the sum and the tanh are written into the product's buffer, which dies
    // there; with the product also returned, they are not
    let b = randn(&[32], 7);
    let x = randn(&[32, 32], 8);
    let g = traced(&x, |xs| Ok(vec![xs[0].matmul(&xs[0])?.add(&b)?.tanh()?]));
    let p = plan(&g);
    assert_eq!(p.buffers.len(), 1, "{p:?}");
    assert_eq!(
        p.buffers[0].last,
        g.nodes.len(),
        "the product's buffer holds the result"
    );
    assert_eq!(p.peak_live_bytes, 4096);
    let g = traced(&x, |xs| {
        let h = xs[0].matmul(&xs[0])?;
        Ok(vec![h.add(&b)?.tanh()?, h])
    });
    let p = plan(&g);
    assert_eq!((p.buffers.len(), p.peak_live_bytes), (2, 2 * 4096), "{p:?}");
}

#[test]
fn the_plan_writes_in_place_only_where_the_replay_can() {
    let x = randn(&[32, 32], 9);
    // an input seen through a view: the caller holds its buffer
    let g = traced(&x, |xs| Ok(vec![xs[0].reshape(&[1024])?.tanh()?]));
    assert_eq!(plan(&g).buffers.len(), 1, "the result in a buffer of its own");
    type Case = (&'static str, fn(&Tensor) -> Result<Tensor>);
    let cases: [Case; 3] = [
        // half of a dying product: not the whole buffer
        ("narrow", |x| x.matmul(x)?.narrow(0, 0, 16)?.tanh()),
        // a dying product read twice by the pass, once transposed
        ("read twice", |x| {
            let h = x.matmul(x)?;
            h.add(&h.transpose(0, 1)?)
        }),
        // a transposed view of a dying product: not contiguous
        ("transposed", |x| x.matmul(x)?.transpose(0, 1)?.tanh()),
    ];
    for (name, f) in cases {
        let g = traced(&x, |xs| Ok(vec![f(&xs[0])?]));
        let (_, stats) = g.run_stats(std::slice::from_ref(&x)).unwrap();
        assert_eq!(stats.in_place, 0, "{name}: the replay writes a new buffer");
        assert_eq!(plan(&g).buffers.len(), 2, "{name}: {:?}", plan(&g));
    }
    // and where it can, it does: a reshape of a dying product
    let g = traced(&x, |xs| Ok(vec![xs[0].matmul(&xs[0])?.reshape(&[1024])?.tanh()?]));
    let (_, stats) = g.run_stats(std::slice::from_ref(&x)).unwrap();
    assert_eq!((stats.in_place, plan(&g).buffers.len()), (1, 1));
}

#[test]
fn elementwise_chains_form_fusion_groups() {
    let x = randn(&[4, 4], 7);
    let g = traced(&x, |xs| {
        let a = xs[0].exp()?.mul_scalar(2.0)?.tanh()?;
        Ok(vec![a.matmul(&xs[0])?.sigmoid()?])
    });
    let groups = fusion::groups(&g);
    assert_eq!(groups, vec![vec![0, 1, 2]]);
    assert!(g.to_text().contains("fusion 0: unary -> affine -> unary"));
    assert!(g.to_dot().starts_with("digraph"));
}

#[test]
fn replay_checks_its_inputs() {
    let x = randn(&[2, 2], 8);
    let g = traced(&x, |xs| Ok(vec![xs[0].exp()?]));
    let err = g.run(&[randn(&[3, 2], 1)]).unwrap_err().to_string();
    assert!(err.contains("input 0") && err.contains("[3, 2]"), "{err}");
    assert!(g.run(&[]).is_err());
}

/// A training step with dropout and a random tensor drawn from `g`: loss and the weight's
/// gradient.
fn random_step(w: &Tensor, g: &std::sync::Mutex<Generator>, xs: &[Tensor]) -> Result<Vec<Tensor>> {
    w.set_grad(None);
    let mut g = g.lock().unwrap();
    let h = xs[0].linear(w, None)?.dropout(0.3, true, &mut g)?;
    let noise = Tensor::rand(h.shape(), DType::F32, &mut g)?;
    let loss = h.add(&noise)?.gelu()?.mean_all()?;
    loss.backward()?;
    Ok(vec![loss.detach(), w.grad().unwrap()])
}

#[test]
fn random_draws_replay_along_their_stream_bit_for_bit() {
    let we = leaf(&[4, 5], 3);
    let wc = we.detach().contiguous_copy().unwrap().requires_grad_().unwrap();
    let (ge, gc) = (
        std::sync::Mutex::new(Generator::new(42)),
        std::sync::Mutex::new(Generator::new(42)),
    );
    let mut cache = GraphCache::default();
    for call in 0..4 {
        let x = randn(&[3, 5], 20 + call);
        let eager = random_step(&we, &ge, std::slice::from_ref(&x)).unwrap();
        let replayed = cache
            .call_with_stream(std::slice::from_ref(&x), &gc, |xs| random_step(&wc, &gc, xs))
            .unwrap();
        let want = if call == 0 {
            Outcome::Captured
        } else {
            Outcome::Replayed
        };
        assert_eq!(cache.last_outcome(), Some(&want));
        for (e, r) in eager.iter().zip(&replayed) {
            assert_eq!(bits(e), bits(r), "call {call}");
        }
        // each call drew new masks, and the streams stand at the same place
        assert_eq!(ge.lock().unwrap().offset(), gc.lock().unwrap().offset());
        assert_eq!(ge.lock().unwrap().offset(), (call + 1) * 2 * 12);
    }
    // a graph with draws needs its stream
    let e = cache
        .call(&[randn(&[3, 5], 9)], |xs| random_step(&wc, &gc, xs))
        .unwrap_err();
    assert!(e.to_string().contains("random stream"), "{e}");
    // a draw from another generator than the stream given is refused, even at offsets the
    // stream's call covers
    for other_offset in [0, gc.offset()] {
        let other = std::sync::Mutex::new(Generator::new(7));
        other.set_offset(other_offset);
        let both = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
            let out = random_step(&wc, &gc, xs)?;
            let extra = Tensor::rand(&[2], DType::F32, &mut other.lock().unwrap())?;
            Ok(vec![out[0].add(&extra.sum_all()?)?, out[1].clone()])
        };
        let mut cache = GraphCache::default();
        let x = randn(&[3, 5], 1);
        cache.call_with_stream(std::slice::from_ref(&x), &gc, both).unwrap();
        let reason = cache.eager_reason().unwrap_or_default().to_string();
        assert!(reason.contains("not from the function's random stream"), "{reason}");
    }
}

/// Two layers: loss, both weights' gradients, the hidden activation and the input.
fn two_layer_step(w1: &Tensor, w2: &Tensor, xs: &[Tensor]) -> Result<Vec<Tensor>> {
    w1.set_grad(None);
    w2.set_grad(None);
    let h = xs[0].linear(w1, None)?.gelu()?;
    let loss = h.linear(w2, None)?.tanh()?.mean_all()?;
    loss.backward()?;
    Ok(vec![
        loss.detach(),
        w1.grad().unwrap(),
        w2.grad().unwrap(),
        h.detach(),
        xs[0].clone(),
    ])
}

#[test]
fn a_replay_hands_over_each_result_no_later_node_reads_as_soon_as_it_is_made() {
    let (w1e, w2e) = (leaf(&[6, 5], 1), leaf(&[3, 6], 2));
    let (w1c, w2c) = (
        w1e.detach().contiguous_copy().unwrap().requires_grad_().unwrap(),
        w2e.detach().contiguous_copy().unwrap().requires_grad_().unwrap(),
    );
    let mut cache = GraphCache::default();
    for call in 0..3 {
        let x = randn(&[4, 5], 30 + call);
        let eager = two_layer_step(&w1e, &w2e, std::slice::from_ref(&x)).unwrap();
        let mut got: Vec<(usize, Tensor)> = Vec::new();
        let mut ready = |k: usize, t: &Tensor| -> Result<()> {
            got.push((k, t.clone()));
            Ok(())
        };
        let out = cache
            .call_handing(std::slice::from_ref(&x), None, &mut ready, |xs| {
                two_layer_step(&w1c, &w2c, xs)
            })
            .unwrap();
        let handed: Vec<bool> = out.iter().map(Option::is_none).collect();
        // every result, whether handed over or returned, is eager's
        let mut all: Vec<Option<Tensor>> = out.clone();
        for (k, t) in &got {
            all[*k] = Some(t.clone());
        }
        for (e, r) in eager.iter().zip(&all) {
            assert_eq!(bits(e), bits(r.as_ref().unwrap()), "call {call}");
        }
        if call == 0 {
            // the capture runs the function eagerly: nothing is handed over
            assert!(got.is_empty() && handed.iter().all(|h| !h));
            continue;
        }
        // the gradients are handed over in the order backward makes them (the second layer's
        // first, although it is the later result), the loss before both; the activation (read by
        // the second layer) and the input are not
        let order: Vec<usize> = got.iter().map(|(k, _)| *k).collect();
        assert_eq!(order, vec![0, 2, 1], "call {call}");
        assert_eq!(handed, vec![true, true, true, false, false]);
        // the replay let go of what it handed over: the receiver holds the only reference
        for (k, t) in &got {
            assert_eq!(Arc::strong_count(t.storage()), 1, "result {k}");
        }
        let (h, input) = (out[3].as_ref().unwrap(), out[4].as_ref().unwrap());
        assert!(input.same_storage(&x) && !got.iter().any(|(_, t)| t.same_storage(h)));
    }
}
