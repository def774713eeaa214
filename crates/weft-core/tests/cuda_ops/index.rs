//! index_select, index_add, gather, scatter_add, one_hot (and embedding) against the CPU.

use super::{assert_close, compare, gpu, randn, tolerance};
use weft_core::{DType, Tensor};

fn ids(v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).expect("ids")
}

/// `n` ids in `0..size`, repeating (a fixed pattern).
fn id_run(n: usize, size: usize, seed: u64) -> Vec<i64> {
    (0..n)
        .map(|i| ((i as u64 * 7 + seed * 13) % size as u64) as i64)
        .collect()
}

#[test]
fn index_select_matches_the_cpu() {
    let Some(dev) = gpu("index_select_matches_the_cpu") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        let tol = tolerance(dtype);
        let x = randn(&[5, 7, 3], dtype, 1);
        for dim in 0..3usize {
            let size = x.shape()[dim];
            let idx = ids(&id_run(9, size, dim as u64), &[9]);
            compare(
                &format!("index_select dim {dim} {dtype:?}"),
                dev,
                &[x.clone(), idx],
                true,
                tol,
                |t| t[0].index_select(dim as isize, &t[1]).unwrap(),
            );
        }
        // a permuted source, a narrowed (strided) index
        let idx = ids(&id_run(12, 5, 3), &[12]);
        compare(
            &format!("index_select strided {dtype:?}"),
            dev,
            &[x.clone(), idx],
            true,
            tol,
            |t| {
                let i = t[1]
                    .narrow(0, 1, 6)
                    .unwrap()
                    .reshape(&[3, 2])
                    .unwrap()
                    .narrow(1, 0, 1)
                    .unwrap()
                    .reshape(&[3])
                    .unwrap();
                t[0].permute(&[2, 1, 0]).unwrap().index_select(2, &i).unwrap()
            },
        );
        // rows longer than a block; an empty index
        let x = randn(&[40, 1000], dtype, 2);
        compare(
            &format!("index_select long rows {dtype:?}"),
            dev,
            &[x.clone(), ids(&id_run(33, 40, 1), &[33])],
            true,
            tol,
            |t| t[0].index_select(0, &t[1]).unwrap(),
        );
        compare(
            &format!("index_select empty index {dtype:?}"),
            dev,
            &[x, ids(&[], &[0])],
            false,
            tol,
            |t| t[0].index_select(0, &t[1]).unwrap(),
        );
    }
}

#[test]
fn index_select_moves_every_dtype() {
    let Some(dev) = gpu("index_select_moves_every_dtype") else {
        return;
    };
    let base = randn(&[6, 5], DType::F32, 3).mul_scalar(10.0).unwrap();
    for dtype in [DType::F64, DType::F16, DType::I64, DType::I32, DType::U8, DType::Bool] {
        let x = if dtype == DType::Bool {
            base.gt(&Tensor::scalar(0.0f32)).unwrap()
        } else if dtype == DType::U8 {
            base.abs().unwrap().cast(dtype).unwrap()
        } else {
            base.cast(dtype).unwrap()
        };
        let idx = ids(&[4, 0, 0, 3], &[4]);
        compare(
            &format!("index_select {dtype:?}"),
            dev,
            &[x.clone(), idx.clone()],
            false,
            0.0,
            |t| t[0].index_select(1, &t[1]).unwrap(),
        );
        compare(
            &format!("gather {dtype:?}"),
            dev,
            &[x, ids(&[1, 0, 4, 4, 2, 3], &[6, 1])],
            false,
            0.0,
            |t| t[0].gather(1, &t[1]).unwrap(),
        );
    }
}

#[test]
fn embedding_picks_rows() {
    let Some(dev) = gpu("embedding_picks_rows") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        let w = randn(&[50, 300], dtype, 4);
        let tokens = ids(&id_run(3 * 37, 50, 5), &[3, 37]);
        compare(
            &format!("embedding {dtype:?}"),
            dev,
            &[w, tokens],
            true,
            tolerance(dtype),
            |t| t[0].embedding(&t[1]).unwrap(),
        );
    }
}

#[test]
fn index_add_matches_the_cpu() {
    let Some(dev) = gpu("index_add_matches_the_cpu") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
        let tol = tolerance(dtype);
        let x = randn(&[6, 9, 4], dtype, 6);
        for dim in 0..3usize {
            let size = x.shape()[dim];
            let n = 11;
            let idx = ids(&id_run(n, size, dim as u64 + 1), &[n]);
            let mut src_shape = x.shape().to_vec();
            src_shape[dim] = n;
            let src = randn(&src_shape, dtype, 7 + dim as u64);
            compare(
                &format!("index_add dim {dim} {dtype:?}"),
                dev,
                &[x.clone(), idx, src],
                true,
                tol,
                |t| t[0].index_add(dim as isize, &t[1], &t[2]).unwrap(),
            );
        }
    }
    // many additions at one place (the atomics), a permuted x and src
    let x = randn(&[3, 40], DType::F32, 8);
    let src = randn(&[40, 1000], DType::F32, 9);
    compare(
        "index_add one row",
        dev,
        &[x, ids(&vec![1; 1000], &[1000]), src],
        true,
        1e-5,
        |t| t[0].index_add(0, &t[1], &t[2].t().unwrap()).unwrap(),
    );
    compare(
        "index_add permuted x",
        dev,
        &[
            randn(&[40, 3], DType::F32, 10),
            ids(&[2, 0, 2], &[3]),
            randn(&[40, 3], DType::F32, 11),
        ],
        true,
        1e-5,
        |t| t[0].t().unwrap().index_add(0, &t[1], &t[2].t().unwrap()).unwrap(),
    );
    // src of another dtype is converted as on the CPU
    for src_dtype in [DType::BF16, DType::F64, DType::I64, DType::I32, DType::U8] {
        let src = randn(&[4, 5], DType::F32, 12)
            .mul_scalar(4.0)
            .unwrap()
            .abs()
            .unwrap()
            .cast(src_dtype)
            .unwrap();
        compare(
            &format!("index_add src {src_dtype:?}"),
            dev,
            &[randn(&[3, 5], DType::F32, 13), ids(&[2, 0, 2, 1], &[4]), src],
            false,
            1e-5,
            |t| t[0].index_add(0, &t[1], &t[2]).unwrap(),
        );
    }
    // nothing to add
    compare(
        "index_add empty",
        dev,
        &[
            randn(&[3, 5], DType::F32, 14),
            ids(&[], &[0]),
            randn(&[0, 5], DType::F32, 15),
        ],
        false,
        1e-5,
        |t| t[0].index_add(0, &t[1], &t[2]).unwrap(),
    );
}

#[test]
fn gather_matches_the_cpu() {
    let Some(dev) = gpu("gather_matches_the_cpu") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        let tol = tolerance(dtype);
        let x = randn(&[4, 6, 5], dtype, 20);
        // index smaller than x in the other dims
        for dim in 0..3usize {
            let mut shape = vec![3, 4, 2];
            shape[dim] = 7;
            let n: usize = shape.iter().product();
            let idx = ids(&id_run(n, x.shape()[dim], dim as u64 + 2), &shape);
            compare(
                &format!("gather dim {dim} {dtype:?}"),
                dev,
                &[x.clone(), idx],
                true,
                tol,
                |t| t[0].gather(dim as isize, &t[1]).unwrap(),
            );
        }
        // a permuted x, a permuted index
        let idx = ids(&id_run(4 * 5 * 6, 6, 9), &[4, 5, 6]);
        compare(
            &format!("gather strided {dtype:?}"),
            dev,
            &[x.clone(), idx],
            true,
            tol,
            |t| t[0].permute(&[0, 2, 1]).unwrap().gather(2, &t[1]).unwrap(),
        );
        // an index broadcast along a dim (stride 0)
        let idx = ids(&id_run(6, 6, 4), &[1, 1, 6]);
        compare(
            &format!("gather broadcast index {dtype:?}"),
            dev,
            &[x.clone(), idx],
            true,
            tol,
            |t| {
                t[0].permute(&[0, 2, 1])
                    .unwrap()
                    .gather(2, &t[1].expand(&[4, 5, 6]).unwrap())
                    .unwrap()
            },
        );
        // cross-entropy style: one id per row of a long row
        let logits = randn(&[33, 1000], dtype, 21);
        let targets = ids(&id_run(33, 1000, 3), &[33, 1]);
        compare(
            &format!("gather long rows {dtype:?}"),
            dev,
            &[logits, targets],
            true,
            tol,
            |t| t[0].gather(1, &t[1]).unwrap(),
        );
    }
}

#[test]
fn scatter_add_matches_the_cpu() {
    let Some(dev) = gpu("scatter_add_matches_the_cpu") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
        let tol = tolerance(dtype);
        let x = randn(&[4, 6, 5], dtype, 30);
        for dim in 0..3usize {
            let mut shape = vec![3, 4, 2];
            shape[dim] = 9;
            let n: usize = shape.iter().product();
            let idx = ids(&id_run(n, x.shape()[dim], dim as u64 + 5), &shape);
            let src = randn(&shape, dtype, 31 + dim as u64);
            compare(
                &format!("scatter_add dim {dim} {dtype:?}"),
                dev,
                &[x.clone(), idx, src],
                true,
                tol,
                |t| t[0].scatter_add(dim as isize, &t[1], &t[2]).unwrap(),
            );
        }
    }
    // everything to one place, strided src and index
    let idx = ids(&vec![3; 2000], &[1000, 2]);
    compare(
        "scatter_add one place",
        dev,
        &[randn(&[5, 2], DType::F32, 32), idx, randn(&[2, 1000], DType::F32, 33)],
        true,
        1e-5,
        |t| t[0].scatter_add(0, &t[1], &t[2].t().unwrap()).unwrap(),
    );
    compare(
        "scatter_add src i32",
        dev,
        &[
            randn(&[3, 4], DType::F32, 34),
            ids(&[0, 2, 2, 1, 0, 0], &[2, 3]),
            Tensor::from_vec(vec![1i32, 2, 3, 4, 5, 6], &[2, 3]).unwrap(),
        ],
        false,
        1e-5,
        |t| t[0].scatter_add(0, &t[1], &t[2]).unwrap(),
    );
}

#[test]
fn one_hot_matches_the_cpu() {
    let Some(dev) = gpu("one_hot_matches_the_cpu") else {
        return;
    };
    compare("one_hot", dev, &[ids(&id_run(35, 10, 1), &[5, 7])], false, 0.0, |t| {
        t[0].one_hot(10).unwrap()
    });
    compare(
        "one_hot permuted",
        dev,
        &[ids(&id_run(35, 300, 2), &[5, 7])],
        false,
        0.0,
        |t| t[0].t().unwrap().one_hot(300).unwrap(),
    );
    compare("one_hot scalar", dev, &[Tensor::scalar(3i64)], false, 0.0, |t| {
        t[0].one_hot(4).unwrap()
    });
    compare("one_hot empty", dev, &[ids(&[], &[0])], false, 0.0, |t| {
        t[0].one_hot(4).unwrap()
    });
}

#[test]
fn indices_out_of_range_are_refused_as_on_the_cpu() {
    let Some(dev) = gpu("indices_out_of_range_are_refused_as_on_the_cpu") else {
        return;
    };
    let x = randn(&[4, 3], DType::F32, 40);
    let bad = ids(&[1, 4, -1], &[3]);
    let bad2 = ids(&[0, 1, 3, 7], &[2, 2]);
    let src = randn(&[3, 3], DType::F32, 41);
    let on = |t: &Tensor| t.to(dev).unwrap();
    let check = |what: &str, cpu: weft_core::Result<Tensor>, gpu: weft_core::Result<Tensor>| {
        let (c, g) = (cpu.unwrap_err().to_string(), gpu.unwrap_err().to_string());
        assert_eq!(g, c, "{what}");
    };
    check(
        "index_select",
        x.index_select(0, &bad),
        on(&x).index_select(0, &on(&bad)),
    );
    check(
        "index_add",
        x.index_add(0, &bad, &src),
        on(&x).index_add(0, &on(&bad), &on(&src)),
    );
    check("gather", x.gather(1, &bad2), on(&x).gather(1, &on(&bad2)));
    let src2 = randn(&[2, 2], DType::F32, 42);
    check(
        "scatter_add",
        x.scatter_add(1, &bad2, &src2),
        on(&x).scatter_add(1, &on(&bad2), &on(&src2)),
    );
    check("one_hot", bad.one_hot(4), on(&bad).one_hot(4));
    // a valid call after the refused ones still works
    let got = on(&x).index_select(0, &on(&ids(&[3, 0], &[2]))).unwrap();
    assert_close(
        "index_select after errors",
        &got,
        &x.index_select(0, &ids(&[3, 0], &[2])).unwrap(),
        0.0,
    );
}
