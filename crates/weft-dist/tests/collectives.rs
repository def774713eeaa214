//! Every collective and dtype on 2, 3 and 4 ranks (threads of this process, each with its own
//! connections, exactly as separate processes would have), checked element by element against a
//! single-process computation; subgroups; send/recv ordering; mismatched calls; a dead rank; a
//! wrong token.

use std::time::{Duration, Instant};

mod common;

use common::{ranks, ranks_with};
use weft_core::{DType, Tensor};
use weft_dist::store::StoreServer;
use weft_dist::{Options, ProcessGroup, ReduceOp, Token};

const DTYPES: [DType; 8] = [
    DType::F32,
    DType::F64,
    DType::BF16,
    DType::F16,
    DType::I64,
    DType::I32,
    DType::U8,
    DType::Bool,
];

/// A named way to build each rank's options.
type Transport = (&'static str, Box<dyn Fn(usize) -> Options + Sync>);

/// The transports every collective is checked on: shared memory (one host), TCP only, and
/// ranks spread over two "hosts" (hierarchical all-reduce when a host holds several ranks).
fn transports(n: usize) -> Vec<Transport> {
    vec![
        (
            "shm",
            Box::new(|_| Options {
                timeout: T,
                ..Options::default()
            }),
        ),
        (
            "tcp",
            Box::new(|_| Options {
                timeout: T,
                shared_memory: false,
                host_id: None,
            }),
        ),
        (
            "two hosts",
            Box::new(move |r| Options {
                timeout: T,
                shared_memory: true,
                host_id: Some(format!("host{}", r * 2 / n)),
            }),
        ),
    ]
}

/// Checks the transport each peer link uses.
fn check_links(pg: &ProcessGroup, setup: &str) {
    let n = pg.size();
    for p in (0..n).filter(|&p| p != pg.rank()) {
        let want = match setup {
            "shm" => true,
            "tcp" => false,
            _ => p * 2 / n == pg.rank() * 2 / n,
        };
        assert_eq!(pg.uses_shared_memory(p), want, "{setup}: rank {} to {p}", pg.rank());
    }
}

const T: Duration = Duration::from_secs(60);

/// Small integers exact in every dtype (bool: 0/1).
fn value(dtype: DType, rank: usize, i: usize) -> f64 {
    let v = ((rank * 7 + i * 3) % 11) as f64;
    match dtype {
        DType::Bool => (rank + i).is_multiple_of(3) as u8 as f64,
        DType::U8 => v % 4.0, // sums of 4 ranks stay below 256
        _ => v - 3.0 * (i % 2) as f64,
    }
}

fn tensor(dtype: DType, vals: &[f64]) -> Tensor {
    Tensor::from_vec(vals.to_vec(), &[vals.len()])
        .unwrap()
        .cast(dtype)
        .unwrap()
}

fn reduce_expected(dtype: DType, op: ReduceOp, cols: &[Vec<f64>]) -> Vec<f64> {
    let n = cols.len();
    (0..cols[0].len())
        .map(|i| {
            let xs = cols.iter().map(|c| c[i]);
            match (dtype, op) {
                (DType::Bool, ReduceOp::Min) => xs.fold(1.0, f64::min),
                (DType::Bool, _) => xs.fold(0.0, f64::max),
                (_, ReduceOp::Sum) => xs.sum(),
                (_, ReduceOp::Avg) => xs.sum::<f64>() / n as f64,
                (_, ReduceOp::Max) => xs.fold(f64::MIN, f64::max),
                (_, ReduceOp::Min) => xs.fold(f64::MAX, f64::min),
            }
        })
        .collect()
}

fn close(dtype: DType, got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    // half precision rounds the average (sums of small integers are exact everywhere)
    let tol = match dtype {
        DType::BF16 => 1e-2,
        DType::F16 => 1e-3,
        DType::F32 => 1e-6,
        _ => 1e-12,
    };
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * w.abs().max(1.0),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

fn ops_for(dtype: DType) -> Vec<ReduceOp> {
    let mut ops = vec![ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min];
    if dtype.is_float() {
        ops.push(ReduceOp::Avg);
    }
    ops
}

/// Element counts: a few elements (latency algorithms), an odd count above the small-message
/// threshold (ring with uneven chunks), and one above a segment.
fn sizes(dtype: DType) -> [usize; 3] {
    let e = dtype.size_in_bytes();
    [5, (96 << 10) / e + 3, (2 << 20) / e + 1]
}

#[test]
fn all_reduce_every_dtype_and_op() {
    for n in [2, 3, 4] {
        for (setup, options) in transports(n) {
            ranks_with(n, options, |pg| {
                check_links(&pg, setup);
                let r = pg.rank();
                for dtype in DTYPES {
                    for count in sizes(dtype) {
                        let cols: Vec<Vec<f64>> = (0..n)
                            .map(|q| (0..count).map(|i| value(dtype, q, i)).collect())
                            .collect();
                        for op in ops_for(dtype) {
                            let t = tensor(dtype, &cols[r]);
                            pg.all_reduce(&t, op).unwrap().wait().unwrap();
                            let what = format!("{setup}: n={n} rank {r} all_reduce {op:?} {dtype:?} x {count}");
                            close(dtype, &t.to_vec_f64(), &reduce_expected(dtype, op, &cols), &what);
                        }
                    }
                }
            });
        }
    }
}

#[test]
fn all_reduce_results_are_bitwise_equal_across_ranks() {
    // random floats: sums round, and every rank must still hold the very same bits
    for n in [3, 4] {
        for ((setup, options), count) in transports(n).into_iter().zip([7usize, 50_000, 300_000]) {
            let outs = ranks_with(n, options, |pg| {
                let mut g = weft_core::Generator::new(pg.rank() as u64 + 1);
                let t = Tensor::randn(&[count], DType::F32, &mut g).unwrap();
                pg.all_reduce(&t, ReduceOp::Sum).unwrap().wait().unwrap();
                t.to_vec::<f32>()
                    .unwrap()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect::<Vec<u32>>()
            });
            assert!(
                outs.iter().all(|o| o == &outs[0]),
                "{setup}: n={n} count={count}: ranks disagree"
            );
        }
    }
}

#[test]
fn scatter_gather_broadcast_reduce_all_to_all() {
    for n in [2, 3, 4] {
        for (setup, options) in transports(n) {
            ranks_with(n, options, |pg| {
                check_links(&pg, setup);
                let r = pg.rank();
                for dtype in DTYPES {
                    for k in [3usize, (80 << 10) / dtype.size_in_bytes()] {
                        let what = |op: &str| format!("{setup}: n={n} rank {r} {op} {dtype:?} k={k}");
                        let cols: Vec<Vec<f64>> = (0..n)
                            .map(|q| (0..n * k).map(|i| value(dtype, q, i)).collect())
                            .collect();
                        // reduce_scatter: chunk r of the element-wise reduction
                        for op in ops_for(dtype) {
                            let out = Tensor::zeros(&[k], dtype).unwrap();
                            pg.reduce_scatter(&out, &tensor(dtype, &cols[r]), op)
                                .unwrap()
                                .wait()
                                .unwrap();
                            let full = reduce_expected(dtype, op, &cols);
                            close(
                                dtype,
                                &out.to_vec_f64(),
                                &full[r * k..(r + 1) * k],
                                &what("reduce_scatter"),
                            );
                        }
                        // all_gather: every rank's first k values, in rank order
                        let out = Tensor::zeros(&[n * k], dtype).unwrap();
                        pg.all_gather(&out, &tensor(dtype, &cols[r][..k]))
                            .unwrap()
                            .wait()
                            .unwrap();
                        let want: Vec<f64> = cols.iter().flat_map(|c| c[..k].to_vec()).collect();
                        close(dtype, &out.to_vec_f64(), &want, &what("all_gather"));
                        // broadcast from every root
                        for root in 0..n {
                            let t = tensor(dtype, &cols[r]);
                            pg.broadcast(&t, root).unwrap().wait().unwrap();
                            close(dtype, &t.to_vec_f64(), &cols[root], &what("broadcast"));
                        }
                        // reduce to every root
                        for root in 0..n {
                            for op in ops_for(dtype) {
                                let t = tensor(dtype, &cols[r]);
                                pg.reduce(&t, root, op).unwrap().wait().unwrap();
                                if r == root {
                                    close(
                                        dtype,
                                        &t.to_vec_f64(),
                                        &reduce_expected(dtype, op, &cols),
                                        &what("reduce"),
                                    );
                                }
                            }
                        }
                        // all_to_all: chunk j of rank q lands in chunk q of rank j
                        let out = Tensor::zeros(&[n * k], dtype).unwrap();
                        pg.all_to_all(&out, &tensor(dtype, &cols[r])).unwrap().wait().unwrap();
                        let want: Vec<f64> = (0..n).flat_map(|q| cols[q][r * k..(r + 1) * k].to_vec()).collect();
                        close(dtype, &out.to_vec_f64(), &want, &what("all_to_all"));
                    }
                }
                pg.barrier().unwrap().wait().unwrap();
            });
        }
    }
}

/// Receives are posted for the reader threads to fill; frames that come before their receive
/// is posted (a late rank), and inputs that share storage with the output, take other paths.
#[test]
fn late_ranks_and_in_place_inputs_over_several_segments() {
    for n in [2, 3] {
        for (setup, options) in transports(n) {
            ranks_with(n, options, |pg| {
                let r = pg.rank();
                let what = |op: &str| format!("{setup}: n={n} rank {r} {op}");
                let k = (3 << 20) / 4 + 7; // several 1 MiB segments per chunk
                let cols: Vec<Vec<f64>> = (0..n)
                    .map(|q| (0..n * k).map(|i| value(DType::F32, q, i)).collect())
                    .collect();
                // the other ranks' whole share is sent (and queued) before rank 0 posts anything
                if r == 0 {
                    std::thread::sleep(Duration::from_millis(300));
                }
                let t = tensor(DType::F32, &cols[r]);
                pg.all_reduce(&t, ReduceOp::Sum).unwrap().wait().unwrap();
                close(
                    DType::F32,
                    &t.to_vec_f64(),
                    &reduce_expected(DType::F32, ReduceOp::Sum, &cols),
                    &what("all_reduce"),
                );
                // reduce_scatter into a chunk of its own input
                let input = tensor(DType::F32, &cols[r]);
                let out = input.narrow(0, r * k, k).unwrap();
                assert!(out.same_storage(&input));
                pg.reduce_scatter(&out, &input, ReduceOp::Max).unwrap().wait().unwrap();
                let full = reduce_expected(DType::F32, ReduceOp::Max, &cols);
                close(
                    DType::F32,
                    &out.to_vec_f64(),
                    &full[r * k..(r + 1) * k],
                    &what("reduce_scatter in place"),
                );
                // all_gather from a chunk of its own output
                let out = tensor(DType::F32, &cols[r]);
                let input = out.narrow(0, r * k, k).unwrap();
                pg.all_gather(&out, &input).unwrap().wait().unwrap();
                let want: Vec<f64> = (0..n).flat_map(|q| cols[q][q * k..(q + 1) * k].to_vec()).collect();
                close(DType::F32, &out.to_vec_f64(), &want, &what("all_gather in place"));
                // all_to_all and broadcast with a late root
                if r == n - 1 {
                    std::thread::sleep(Duration::from_millis(300));
                }
                let out = Tensor::zeros(&[n * k], DType::F32).unwrap();
                pg.all_to_all(&out, &tensor(DType::F32, &cols[r]))
                    .unwrap()
                    .wait()
                    .unwrap();
                let want: Vec<f64> = (0..n).flat_map(|q| cols[q][r * k..(r + 1) * k].to_vec()).collect();
                close(DType::F32, &out.to_vec_f64(), &want, &what("all_to_all"));
                let t = tensor(DType::F32, &cols[r]);
                pg.broadcast(&t, 0).unwrap().wait().unwrap();
                close(DType::F32, &t.to_vec_f64(), &cols[0], &what("broadcast"));
            });
        }
    }
}

#[test]
fn operations_overlap_and_complete_in_order() {
    // several collectives in flight at once, waited for in reverse
    ranks(4, T, |pg| {
        let ts: Vec<Tensor> = (0..6)
            .map(|j| Tensor::from_vec(vec![(pg.rank() + j) as f32; 1000 * (j + 1)], &[1000 * (j + 1)]).unwrap())
            .collect();
        let works: Vec<_> = ts.iter().map(|t| pg.all_reduce(t, ReduceOp::Sum).unwrap()).collect();
        for w in works.into_iter().rev() {
            w.wait().unwrap();
        }
        for (j, t) in ts.iter().enumerate() {
            let want = (0..4).map(|r| (r + j) as f32).sum::<f32>();
            assert!(t.to_vec::<f32>().unwrap().iter().all(|&x| x == want));
        }
    });
}

#[test]
fn subgroups() {
    ranks(4, T, |pg| {
        let r = pg.rank();
        // every rank creates both groups, in the same order
        let even = pg.new_group(&[0, 2]).unwrap();
        let odd = pg.new_group(&[3, 1]).unwrap();
        let mine = if r % 2 == 0 { even.as_ref() } else { odd.as_ref() };
        let mine = mine.expect("member of its own group");
        assert!(if r % 2 == 0 { odd.is_none() } else { even.is_none() });
        assert_eq!(mine.size(), 2);
        // group rank follows the order given: rank 3 is rank 0 of the odd group
        assert_eq!(mine.rank(), [0, 1, 1, 0][r]);
        let t = Tensor::from_vec(vec![r as i64 + 1; 10], &[10]).unwrap();
        mine.all_reduce(&t, ReduceOp::Sum).unwrap().wait().unwrap();
        let want = if r % 2 == 0 { 1 + 3 } else { 2 + 4 };
        assert!(t.to_vec::<i64>().unwrap().iter().all(|&x| x == want));
        // the world group still works after, interleaved with the subgroups
        let w = Tensor::from_vec(vec![1i32; 3], &[3]).unwrap();
        pg.all_reduce(&w, ReduceOp::Sum).unwrap().wait().unwrap();
        assert_eq!(w.to_vec::<i32>().unwrap(), vec![4; 3]);
        mine.barrier().unwrap().wait().unwrap();
    });
}

#[test]
fn send_recv_in_order_per_tag() {
    ranks(2, T, |pg| {
        if pg.rank() == 0 {
            let mut works = Vec::new();
            for i in 0..5 {
                for tag in [0u32, 7] {
                    let t = Tensor::from_vec(vec![(i * 10 + tag as usize) as f32; 3 + i], &[3 + i]).unwrap();
                    works.push(pg.send(&t, 1, tag).unwrap());
                }
            }
            works.into_iter().for_each(|w| w.wait().unwrap());
        } else {
            // post receives for tag 7 first, and wait on them out of order
            let r7: Vec<Tensor> = (0..5).map(|i| Tensor::zeros(&[3 + i], DType::F32).unwrap()).collect();
            let r0: Vec<Tensor> = (0..5).map(|i| Tensor::zeros(&[3 + i], DType::F32).unwrap()).collect();
            let mut w7: Vec<_> = r7.iter().map(|t| pg.recv(t, 0, 7).unwrap()).collect();
            let w0: Vec<_> = r0.iter().map(|t| pg.recv(t, 0, 0).unwrap()).collect();
            w7.swap(0, 4);
            w7.into_iter().for_each(|w| w.wait().unwrap());
            w0.into_iter().for_each(|w| w.wait().unwrap());
            for i in 0..5 {
                assert!(r7[i].to_vec::<f32>().unwrap().iter().all(|&x| x == (i * 10 + 7) as f32));
                assert!(r0[i].to_vec::<f32>().unwrap().iter().all(|&x| x == (i * 10) as f32));
            }
        }
    });
}

#[test]
fn mismatched_collectives_name_both_sides() {
    let errs = ranks(2, T, |pg| {
        let t = Tensor::zeros(&[8], DType::F32).unwrap();
        let w = if pg.rank() == 0 {
            pg.all_reduce(&t, ReduceOp::Sum)
        } else {
            pg.broadcast(&t, 0)
        };
        w.unwrap().wait().unwrap_err().to_string()
    });
    for e in &errs {
        assert!(
            e.contains("all_reduce(sum, f32 x 8)") && e.contains("broadcast(f32 x 8)"),
            "{e}"
        );
    }
    // a size mismatch
    let errs = ranks(2, T, |pg| {
        let t = Tensor::zeros(&[8 + pg.rank()], DType::F32).unwrap();
        pg.all_reduce(&t, ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap_err()
            .to_string()
    });
    assert!(
        errs.iter().any(|e| e.contains("f32 x 8") && e.contains("f32 x 9")),
        "{errs:?}"
    );
}

#[test]
fn a_dead_rank_fails_the_others_fast_with_its_name() {
    let t0 = Instant::now();
    let errs = ranks(3, Duration::from_secs(120), |pg| {
        let t = Tensor::zeros(&[1000], DType::F32).unwrap();
        pg.all_reduce(&t, ReduceOp::Sum).unwrap().wait().unwrap();
        if pg.rank() == 1 {
            // leaves the job: dropping the group closes its connections, as a process exit does
            return String::new();
        }
        std::thread::sleep(Duration::from_millis(200));
        pg.all_reduce(&t, ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap_err()
            .to_string()
    });
    assert!(t0.elapsed() < Duration::from_secs(60), "took {:?}", t0.elapsed());
    for e in [&errs[0], &errs[2]] {
        assert!(e.contains("rank 1"), "{e}");
        assert!(e.contains("all_reduce(sum, f32 x 1000) #1"), "{e}");
    }
}

/// A rank that gives up right after sending: its peer still receives everything sent before the
/// abort, on either transport, and fails only the operation after it. Through shared memory the
/// data and the abort used to travel apart (the ring and the TCP connection), and the abort
/// could fail a receive whose frame was already in the ring. Two frames of 2 MiB make the second
/// one's header reach the reader well after the sender's `abort` returns.
#[test]
fn an_abort_arrives_after_the_frames_sent_before_it() {
    for (setup, options) in transports(2).into_iter().take(2) {
        for round in 0..5 {
            let got = ranks_with(2, &options, |pg| -> Result<String, String> {
                check_links(&pg, setup);
                let n = 512 * 1024;
                if pg.rank() == 1 {
                    pg.barrier().unwrap().wait().unwrap();
                    let a = Tensor::full(&[n], 1.0, DType::F32).unwrap();
                    let b = Tensor::full(&[n], 2.0, DType::F32).unwrap();
                    let (wa, wb) = (pg.send(&a, 0, 0).unwrap(), pg.send(&b, 0, 0).unwrap());
                    wa.wait().unwrap();
                    wb.wait().unwrap();
                    pg.abort("stopping on purpose");
                    return Ok(String::new());
                }
                let (ra, rb) = (
                    Tensor::zeros(&[n], DType::F32).unwrap(),
                    Tensor::zeros(&[n], DType::F32).unwrap(),
                );
                let (wa, wb) = (pg.recv(&ra, 1, 0).unwrap(), pg.recv(&rb, 1, 0).unwrap());
                pg.barrier().unwrap().wait().unwrap();
                wa.wait().map_err(|e| format!("first receive: {e}"))?;
                wb.wait().map_err(|e| format!("second receive: {e}"))?;
                assert!(ra.to_vec::<f32>().unwrap().iter().all(|&x| x == 1.0));
                assert!(rb.to_vec::<f32>().unwrap().iter().all(|&x| x == 2.0));
                let t = Tensor::zeros(&[4], DType::F32).unwrap();
                Ok(pg
                    .all_reduce(&t, ReduceOp::Sum)
                    .unwrap()
                    .wait()
                    .unwrap_err()
                    .to_string())
            });
            let e = got[0]
                .as_ref()
                .unwrap_or_else(|e| panic!("{setup}, round {round}: {e}"));
            assert!(e.contains("rank 1 gave up: stopping on purpose"), "{setup}: {e}");
        }
    }
}

#[test]
fn a_silent_rank_times_out_naming_it() {
    let errs = ranks(2, Duration::from_secs(2), |pg| {
        let t = Tensor::zeros(&[4], DType::F32).unwrap();
        if pg.rank() == 1 {
            std::thread::sleep(Duration::from_secs(6));
            return String::new();
        }
        pg.all_reduce(&t, ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap_err()
            .to_string()
    });
    assert!(
        errs[0].contains("timed out") && errs[0].contains("rank 1"),
        "{}",
        errs[0]
    );
}

#[test]
fn wrong_token_is_refused_and_the_job_goes_on() {
    let token = Token::new("right").unwrap();
    let server = StoreServer::start("127.0.0.1:0", token.clone()).unwrap();
    let addr = server.addr().to_string();
    let bad = weft_dist::store::StoreClient::connect(&addr, &Token::new("wrong").unwrap(), T);
    let e = bad.err().expect("refused").to_string();
    assert!(e.contains("token"), "{e}");
    let good = weft_dist::store::StoreClient::connect(&addr, &token, T).unwrap();
    good.set("k", b"v").unwrap();
    assert_eq!(good.get("k", T).unwrap(), b"v");
    assert_eq!(good.add("n", 2).unwrap(), 2);
    assert_eq!(good.add("n", 3).unwrap(), 5);
    let e = good.get("missing", Duration::from_millis(200)).unwrap_err().to_string();
    assert!(e.contains("\"missing\""), "{e}");
}

#[test]
fn bad_calls_are_refused_before_any_communication() {
    ranks(2, T, |pg| {
        let a = Tensor::zeros(&[4], DType::F32).unwrap();
        let b = Tensor::zeros(&[5], DType::F32).unwrap();
        let i = Tensor::zeros(&[4], DType::I32).unwrap();
        assert!(pg.all_gather(&b, &a).unwrap_err().to_string().contains("expected 8"));
        assert!(pg.reduce_scatter(&a, &i, ReduceOp::Sum).is_err());
        assert!(pg
            .all_reduce(&i, ReduceOp::Avg)
            .unwrap_err()
            .to_string()
            .contains("avg"));
        assert!(pg.broadcast(&a, 2).unwrap_err().to_string().contains("rank 2"));
        assert!(pg.send(&a, pg.rank(), 0).is_err());
        let m = Tensor::zeros(&[2, 3], DType::F32).unwrap().t().unwrap();
        assert!(pg
            .all_reduce(&m, ReduceOp::Sum)
            .unwrap_err()
            .to_string()
            .contains("contiguous"));
        assert!(pg.new_group(&[0, 0]).is_err());
        // the group still works
        pg.all_reduce(&a, ReduceOp::Sum).unwrap().wait().unwrap();
    });
}

#[test]
fn an_unresolvable_store_address_is_retried_until_the_timeout() {
    let t0 = Instant::now();
    let err = weft_dist::store::StoreClient::connect(
        "no-such-host.invalid:29500",
        &Token::new("t").unwrap(),
        Duration::from_millis(500),
    )
    .err()
    .expect("an unresolvable name cannot connect");
    let msg = err.to_string();
    assert!(
        t0.elapsed() >= Duration::from_millis(500),
        "gave up after {:?}",
        t0.elapsed()
    );
    assert!(msg.contains("cannot resolve no-such-host.invalid:29500"), "{msg}");
}
