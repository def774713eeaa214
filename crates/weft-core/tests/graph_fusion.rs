//! Fusion groups replayed as one pass: results equal eager execution bit for bit, the replay
//! statistics say what ran fused and in place, and inputs and parameters are never written.

use weft_core::graph::{compile, fusion, trace, Graph, Outcome, ReplayStats};
use weft_core::{DType, Generator, Result, Tensor};

fn randn(shape: &[usize], seed: u64) -> Tensor {
    Tensor::randn(shape, DType::F32, &mut Generator::new(seed)).unwrap()
}

/// Random values with the awkward ones mixed in: zeros of both signs, infinities, NaN, and
/// numbers large and small enough to overflow or underflow the ops.
fn awkward(shape: &[usize], seed: u64) -> Tensor {
    let mut v = randn(shape, seed).to_vec::<f32>().unwrap();
    let special = [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e30,
        -1e30,
        1e-40,
        88.5,
        -104.0,
    ];
    for (i, s) in special.iter().enumerate() {
        let at = (i * 7919) % v.len();
        v[at] = *s;
    }
    Tensor::from_vec(v, shape).unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect()
}

/// Runs `f` eagerly and compiled (the capture, then two replays) on `inputs`, checks every
/// replay's results against eager bit for bit, and returns the last replay's statistics.
fn check<F>(inputs: &[Tensor], f: F) -> ReplayStats
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>>,
{
    let eager = f(inputs).unwrap();
    let mut compiled = compile(&f);
    compiled.call(inputs).unwrap();
    assert_eq!(compiled.last_outcome(), Some(&Outcome::Captured));
    for _ in 0..2 {
        let replayed = compiled.call(inputs).unwrap();
        assert_eq!(compiled.last_outcome(), Some(&Outcome::Replayed));
        assert_eq!(eager.len(), replayed.len());
        for (k, (e, r)) in eager.iter().zip(&replayed).enumerate() {
            assert_eq!(e.shape(), r.shape(), "result {k}");
            assert_eq!(bits(e), bits(r), "result {k}");
        }
    }
    compiled.replay_stats().expect("a graph was replayed")
}

fn graph_of<F>(inputs: &[Tensor], f: F) -> Graph
where
    F: FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
{
    trace(inputs, f).unwrap().1.unwrap()
}

fn all_ops(x: &Tensor) -> Result<Tensor> {
    x.exp()?
        .mul_scalar(0.3)?
        .tanh()?
        .gelu()?
        .sigmoid()?
        .silu()?
        .gelu_tanh()?
        .add_scalar(-0.25)?
        .relu()?
        .sqrt()?
        .rsqrt()?
        .log()?
        .abs()?
        .clamp(Some(-0.0), Some(3.0))?
        .neg()?
        .square()?
        .add_scalar(0.5)?
        .recip()?
        .pow_scalar(1.7)?
        .affine(0.1, 0.7)
}

#[test]
fn a_chain_of_every_one_pass_op_equals_eager() {
    // 70,000 elements: the pass is cut into chunks on the pool, the last tile partial
    for shape in [&[7usize, 10_000][..], &[3, 5], &[]] {
        let stats = check(&[awkward(shape, 1)], |xs| Ok(vec![all_ops(&xs[0])?]));
        assert_eq!(stats.fused_groups, 1, "{shape:?}");
        assert_eq!(stats.fused_nodes, 20, "{shape:?}");
        assert_eq!(stats.fallback_groups, 0);
    }
}

#[test]
fn broadcast_operands_scalars_and_strided_inputs_equal_eager() {
    // rows long enough for row-aligned tiles (broadcast rows read in place), and short ones
    for (n, c) in [(300, 257), (1000, 10)] {
        let w = awkward(&[c], 2);
        let col = randn(&[n, 1], 3);
        let s = Tensor::full(&[], 1.5, DType::F32).unwrap();
        let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
            let x = &xs[0];
            let t = xs[1].permute(&[1, 0])?; // a strided view, [n, c]
            let y = x
                .mul(&w)?
                .add(&s)?
                .sub(&col)?
                .maximum(&t)?
                .minimum(&x.mul_scalar(4.0)?)?
                .div(&w)?
                .pow(&s)?
                .exp()?;
            let back = t.tanh()?.mul(&y)?.sigmoid()?;
            Ok(vec![y, back])
        };
        let stats = check(&[awkward(&[n, c], 4), randn(&[c, n], 5)], f);
        assert_eq!(stats.fused_groups, 2, "{stats:?}");
        assert_eq!(stats.fused_nodes, 12, "{stats:?}");
    }
}

#[test]
fn groups_on_both_sides_of_a_matmul_and_one_feeding_a_reduction() {
    let w = randn(&[64, 48], 6);
    let b = randn(&[48], 7);
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        let h = xs[0].exp()?.mul_scalar(0.5)?.tanh()?;
        let y = h.matmul(&w)?.add(&b)?.gelu()?.mul_scalar(2.0)?;
        Ok(vec![y.sum(&[1], false)?, y.max(&[0], true)?])
    };
    let x = randn(&[128, 64], 8);
    let g = graph_of(std::slice::from_ref(&x), f);
    assert_eq!(fusion::groups(&g).len(), 2);
    let stats = check(&[x], f);
    assert_eq!(stats.fused_groups, 2);
    assert_eq!(stats.fused_nodes, 6);
}

#[test]
fn an_intermediate_that_is_also_a_result_is_not_fused_over() {
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        let a = xs[0].exp()?;
        let b = a.tanh()?.sigmoid()?;
        Ok(vec![a, b])
    };
    let x = randn(&[50, 50], 9);
    let g = graph_of(std::slice::from_ref(&x), f);
    assert_eq!(fusion::groups(&g), vec![vec![1, 2]]);
    let stats = check(&[x], f);
    assert_eq!(stats.fused_groups, 1);
    assert_eq!(stats.fused_nodes, 2);
}

#[test]
fn two_branches_joining_form_one_group() {
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        let m = xs[0].matmul(&xs[0])?;
        let a = m.exp()?.mul_scalar(0.1)?;
        let b = m.tanh()?;
        Ok(vec![a.add(&b)?.silu()?])
    };
    let x = randn(&[40, 40], 10);
    let g = graph_of(std::slice::from_ref(&x), f);
    assert_eq!(fusion::groups(&g), vec![vec![1, 2, 3, 4, 5]]);
    let stats = check(&[x], f);
    assert_eq!((stats.fused_groups, stats.fused_nodes), (1, 5));
}

#[test]
fn a_dying_buffer_takes_the_result_and_inputs_and_parameters_are_never_written() {
    let w = randn(&[32, 32], 11);
    let b = randn(&[32], 12);
    let (w0, b0) = (bits(&w), bits(&b));
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        // `h` dies in the group: its buffer takes the result
        let h = xs[0].matmul(&w)?;
        let y = h.add(&b)?.gelu()?.mul_scalar(2.0)?;
        // only the input and a parameter are read: nothing may be overwritten
        let z = xs[0].exp()?.mul(&w)?;
        // a single node reading a dying product: written in place too
        let s = y.matmul(&w)?.tanh()?;
        Ok(vec![y, z, s])
    };
    let x = randn(&[32, 32], 13);
    let x0 = bits(&x);
    let stats = check(std::slice::from_ref(&x), f);
    assert_eq!(stats.fused_groups, 2);
    assert_eq!(stats.in_place, 2, "{stats:?}");
    assert_eq!(bits(&x), x0);
    assert_eq!(bits(&w), w0);
    assert_eq!(bits(&b), b0);
}

#[test]
fn a_buffer_that_a_result_views_is_not_overwritten() {
    let w = randn(&[16, 16], 14);
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        let h = xs[0].matmul(&w)?;
        let view = h.reshape(&[256])?; // a result sharing h's buffer
        let y = h.exp()?.mul_scalar(3.0)?;
        Ok(vec![view, y])
    };
    let stats = check(&[randn(&[16, 16], 15)], f);
    assert_eq!(stats.fused_groups, 1);
    assert_eq!(stats.in_place, 0);
}

#[test]
fn results_of_replays_own_their_buffers() {
    let w = randn(&[8, 8], 16);
    let mut compiled = compile(|xs: &[Tensor]| Ok(vec![xs[0].matmul(&w)?.exp()?.tanh()?]));
    let x = randn(&[8, 8], 17);
    compiled.call(std::slice::from_ref(&x)).unwrap();
    let r1 = compiled.call(std::slice::from_ref(&x)).unwrap().remove(0);
    let keep = bits(&r1);
    let r2 = compiled.call(std::slice::from_ref(&x)).unwrap().remove(0);
    assert!(!r1.same_storage(&r2));
    assert_eq!(bits(&r1), keep);
    assert_eq!(compiled.replay_stats().unwrap().in_place, 1);
}

/// loss = mean((tanh(x W + b) * 2)^2), and the gradients of W and b.
fn step(w: &Tensor, b: &Tensor, xs: &[Tensor]) -> Result<Vec<Tensor>> {
    w.set_grad(None);
    b.set_grad(None);
    let h = xs[0].matmul(w)?.add(b)?.tanh()?.mul_scalar(2.0)?;
    let loss = h.square()?.mean_all()?;
    loss.backward()?;
    Ok(vec![loss.detach(), w.grad().unwrap(), b.grad().unwrap()])
}

#[test]
fn a_backward_replays_fused_bit_for_bit() {
    let w = randn(&[24, 12], 18).requires_grad_().unwrap();
    let b = randn(&[12], 19).requires_grad_().unwrap();
    let x = randn(&[64, 24], 20);
    let stats = check(std::slice::from_ref(&x), |xs| step(&w, &b, xs));
    assert!(stats.fused_groups >= 1, "{stats:?}");
}

#[test]
fn groups_with_other_dtypes_run_node_by_node_and_the_dump_says_why() {
    let zero = Tensor::zeros(&[], DType::F32).unwrap();
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        let keep = xs[0].exp()?.gt(&xs[1])?;
        let y = Tensor::where_cond(&keep, &xs[0], &zero)?;
        Ok(vec![xs[1].tanh()?.mul_scalar(2.0)?, y])
    };
    let inputs = [randn(&[64, 64], 21), randn(&[64, 64], 22)];
    let text = graph_of(&inputs, f).to_text();
    assert!(
        text.contains("unary -> compare -> where  [node by node: compare on bool]"),
        "{text}"
    );
    assert!(text.contains("unary -> affine  [one pass"), "{text}");
    let stats = check(&inputs, f);
    assert_eq!((stats.fused_groups, stats.fused_nodes, stats.in_place), (1, 2, 0));
}

#[test]
fn the_f32_part_of_a_group_with_a_comparison_runs_as_one_pass() {
    let zero = Tensor::zeros(&[], DType::F32).unwrap();
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        let a = xs[0].exp()?.mul_scalar(0.5)?.tanh()?;
        let keep = a.gt(&xs[1])?;
        Ok(vec![Tensor::where_cond(&keep, &xs[0], &zero)?])
    };
    let inputs = [randn(&[64, 64], 23), randn(&[64, 64], 24)];
    let g = graph_of(&inputs, f);
    assert_eq!(fusion::groups(&g).len(), 1);
    let text = g.to_text();
    assert!(
        text.contains("[3 of 5 nodes in one pass; node by node: compare on bool]"),
        "{text}"
    );
    let stats = check(&inputs, f);
    assert_eq!((stats.fused_groups, stats.fused_nodes), (1, 3));
}

#[test]
fn a_replay_traced_by_an_outer_capture_runs_node_by_node_and_is_recorded() {
    let w = randn(&[16, 16], 25);
    let mut inner = compile(|xs: &[Tensor]| Ok(vec![xs[0].matmul(&w)?.exp()?.mul_scalar(0.5)?.tanh()?]));
    let x = randn(&[16, 16], 26);
    inner.call(std::slice::from_ref(&x)).unwrap();
    inner.call(std::slice::from_ref(&x)).unwrap();
    assert_eq!(inner.replay_stats().unwrap().fused_groups, 1);
    let (eager, outer) = trace(std::slice::from_ref(&x), |xs| inner.call(xs)).unwrap();
    assert_eq!(inner.replay_stats().unwrap().fused_groups, 0);
    let outer = outer.expect("the outer capture sees every op");
    assert_eq!(outer.nodes.len(), 4);
    let (replayed, stats) = outer.run_stats(std::slice::from_ref(&x)).unwrap();
    assert_eq!(bits(&replayed[0]), bits(&eager[0]));
    assert_eq!((stats.fused_groups, stats.in_place), (1, 1));
}
