//! Recomputation in compiled graphs (`GraphCache::with_recompute`, `graph::remat`): a training
//! step of a small two-block network recomputes its activations next to the backward that reads
//! them, keeps its results bit for bit, and holds fewer bytes at its peak. In a process of its
//! own: it reads the process-wide count of tensor bytes.

use weft_core::graph::{plan, remat, GraphCache};
use weft_core::{memory, DType, Generator, Tensor, UnaryOp};

fn randn(shape: &[usize], seed: u64) -> Tensor {
    Tensor::randn(shape, DType::F32, &mut Generator::new(seed))
        .unwrap()
        .mul_scalar(0.2)
        .unwrap()
}

/// `xs[0]`: `[batch, rows, width]` (the products see it as `[batch * rows, width]`, through
/// views). Two blocks of `x + W2 gelu(W1 norm(x) + b1) + b2`, then a mean of squares: the loss and
/// every parameter's gradient.
fn step(params: &[Tensor], xs: &[Tensor]) -> weft_core::Result<Vec<Tensor>> {
    for p in params {
        p.set_grad(None);
    }
    let shape = xs[0].shape().to_vec();
    let mut h = xs[0].clone();
    for block in params.chunks(6) {
        let n = h.layer_norm(Some(&block[0]), Some(&block[1]), 1e-5)?;
        let up = n.linear_act(&block[2], Some(&block[3]), UnaryOp::Gelu)?;
        h = h.add(&up.linear(&block[4], Some(&block[5]))?)?;
    }
    let loss = h.square()?.mean(&[0, 1, 2], false)?;
    loss.backward()?;
    assert_eq!(h.shape(), shape.as_slice());
    let mut out = vec![loss.detach()];
    out.extend(
        params
            .iter()
            .map(|p| p.grad().expect("every parameter gets a gradient")),
    );
    Ok(out)
}

fn params(width: usize, hidden: usize) -> Vec<Tensor> {
    let mut ps = Vec::new();
    for b in 0..2u64 {
        let s = 10 * b;
        ps.push(Tensor::ones(&[width], DType::F32).unwrap());
        ps.push(Tensor::zeros(&[width], DType::F32).unwrap());
        ps.push(randn(&[hidden, width], s + 1));
        ps.push(randn(&[hidden], s + 2));
        ps.push(randn(&[width, hidden], s + 3));
        ps.push(randn(&[width], s + 4));
        for p in &ps[ps.len() - 6..] {
            p.set_requires_grad(true).unwrap();
        }
    }
    ps
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect()
}

/// The most tensor bytes alive at once during `f`, above what was alive before it.
fn peak_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let before = memory::allocated_bytes();
    memory::reset_max_allocated();
    let r = f();
    (r, memory::max_allocated_bytes() - before)
}

#[test]
fn recomputed_activations_keep_the_results_and_lower_the_peak() {
    let (rows, width, hidden) = (256, 64, 256);
    let ps = params(width, hidden);
    let x = randn(&[4, rows / 4, width], 99);

    let mut plain = GraphCache::default();
    let mut recomputing = GraphCache::default().with_recompute(true);
    let (eager, eager_peak) = peak_during(|| step(&ps, std::slice::from_ref(&x)).unwrap());
    let mut peaks = [0usize; 2];
    for (k, cache) in [&mut plain, &mut recomputing].into_iter().enumerate() {
        // the first call captures (running eagerly), the next three replay
        for call in 0..4 {
            let (out, peak) = peak_during(|| cache.call(std::slice::from_ref(&x), |xs| step(&ps, xs)).unwrap());
            assert_eq!(out.len(), eager.len());
            for (i, (a, b)) in out.iter().zip(&eager).enumerate() {
                assert_eq!(
                    bits(a),
                    bits(b),
                    "cache {k}, call {call}: result {i} differs from eager"
                );
            }
            if call > 0 {
                peaks[k] = peak;
            }
        }
    }

    // what the pass did: the gelu outputs and the norm outputs are made again in the backward
    let report = recomputing.remat_report();
    assert!(report.recomputed >= 2, "{report:?}");
    assert!(report.peak_after < report.peak_before, "{report:?}");
    assert_eq!(plain.remat_report(), remat::RematReport::default());
    let (g_plain, g_remat) = (
        plain.graph_for(std::slice::from_ref(&x)).unwrap(),
        recomputing.graph_for(std::slice::from_ref(&x)).unwrap(),
    );
    assert_eq!(plan::plan(g_plain).peak_live_bytes, report.peak_before);
    assert_eq!(plan::plan(g_remat).peak_live_bytes, report.peak_after);
    assert!(g_remat.nodes.len() > g_plain.nodes.len());
    // the late readers read the activations through views ([batch, rows, hidden] as
    // [batch * rows, hidden]): those are made again on the recomputed buffers
    let reshapes = |g: &weft_core::graph::Graph| g.nodes.iter().filter(|n| n.op.name() == "reshape").count();
    assert!(reshapes(g_remat) > reshapes(g_plain), "no view was made again");
    // the first block's gelu output ([rows, hidden] f32) is no longer alive at the peak (the
    // second block's is read right after it, by the backward's first product)
    let gelu_bytes = rows * hidden * 4;
    assert!(
        report.peak_before - report.peak_after >= gelu_bytes,
        "{report:?}: expected at least one [{rows}, {hidden}] f32 buffer fewer"
    );

    // and the replays hold less at once than the plain ones and the eager step
    assert!(
        peaks[1] + gelu_bytes <= peaks[0],
        "replay peaks: plain {} bytes, recomputing {} bytes (eager {eager_peak})",
        peaks[0],
        peaks[1]
    );
    assert!(peaks[1] < eager_peak, "recomputing {} vs eager {eager_peak}", peaks[1]);
}

#[test]
fn a_graph_without_late_readers_is_left_alone() {
    // a forward alone: every activation dies where it is made
    let ps = params(16, 32);
    let x = randn(&[8, 16], 5);
    let mut cache = GraphCache::default().with_recompute(true);
    let f = |xs: &[Tensor]| -> weft_core::Result<Vec<Tensor>> {
        weft_core::no_grad(|| {
            let n = xs[0].layer_norm(Some(&ps[0]), Some(&ps[1]), 1e-5)?;
            Ok(vec![n
                .linear_act(&ps[2], Some(&ps[3]), UnaryOp::Gelu)?
                .linear(&ps[4], Some(&ps[5]))?])
        })
    };
    let want = f(std::slice::from_ref(&x)).unwrap();
    for _ in 0..2 {
        let got = cache.call(std::slice::from_ref(&x), f).unwrap();
        assert_eq!(bits(&got[0]), bits(&want[0]));
    }
    assert_eq!(cache.remat_report().recomputed, 0);
}
