//! The conv family on a GPU against the CPU: conv2d (strides, padding, dilation, groups, 1x1,
//! bias), max and average pooling with overlapping, padded windows; forward and backward, in
//! every float dtype, with strided and broadcast (expanded) inputs and edge sizes.

use super::{compare, gpu, randn, tolerance};
use weft_core::{Conv2dParams, DType, Pool2dParams, Tensor};

const FLOATS: [DType; 4] = [DType::F32, DType::BF16, DType::F64, DType::F16];

fn conv(stride: usize, padding: usize, dilation: usize, groups: usize) -> Conv2dParams {
    Conv2dParams {
        stride: (stride, stride),
        padding: (padding, padding),
        dilation: (dilation, dilation),
        groups,
    }
}

fn window(k: (usize, usize), stride: (usize, usize), padding: (usize, usize)) -> Pool2dParams {
    Pool2dParams {
        kernel: k,
        stride,
        padding,
    }
}

#[test]
fn conv2d_matches_the_cpu() {
    let Some(dev) = gpu("conv2d_matches_the_cpu") else {
        return;
    };
    for dtype in FLOATS {
        let tol = tolerance(dtype);
        let case = |what: &str| format!("conv2d {what} {dtype:?}");
        // stride 2, padding 1, dilation 2, two groups; sizes not multiples of 32
        let x = randn(&[2, 4, 9, 11], dtype, 1);
        let w = randn(&[6, 2, 3, 3], dtype, 2);
        compare(&case("s2 p1 d2 g2"), dev, &[x.clone(), w.clone()], true, tol, |t| {
            t[0].conv2d(&t[1], None, conv(2, 1, 2, 2)).unwrap()
        });
        // each parameter alone, and a non-square mix
        for (what, p) in [
            ("stride 2", conv(2, 0, 1, 1)),
            ("padding 1", conv(1, 1, 1, 1)),
            ("dilation 2", conv(1, 0, 2, 1)),
            (
                "mixed",
                Conv2dParams {
                    stride: (2, 1),
                    padding: (0, 2),
                    dilation: (1, 3),
                    groups: 1,
                },
            ),
        ] {
            let w = randn(&[5, 4, 3, 2], dtype, 3);
            compare(&case(what), dev, &[x.clone(), w], true, tol, |t| {
                t[0].conv2d(&t[1], None, p).unwrap()
            });
        }
        // depthwise (groups = channels)
        let wd = randn(&[8, 1, 3, 3], dtype, 4);
        compare(&case("depthwise"), dev, &[x.clone(), wd], true, tol, |t| {
            t[0].conv2d(&t[1], None, conv(1, 1, 1, 4)).unwrap()
        });
        // 1x1 with a bias
        let w1 = randn(&[3, 4, 1, 1], dtype, 5);
        let b = randn(&[3], dtype, 6);
        compare(&case("1x1 + bias"), dev, &[x.clone(), w1, b], true, tol, |t| {
            t[0].conv2d(&t[1], Some(&t[2]), Conv2dParams::new()).unwrap()
        });
    }
}

#[test]
fn conv2d_reads_views_and_edge_sizes() {
    let Some(dev) = gpu("conv2d_reads_views_and_edge_sizes") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        let tol = tolerance(dtype);
        let case = |what: &str| format!("conv2d {what} {dtype:?}");
        // a permuted input and a narrowed weight
        let xt = randn(&[2, 9, 11, 4], dtype, 7);
        let w = randn(&[8, 2, 3, 3], dtype, 8);
        compare(&case("strided"), dev, &[xt, w], true, tol, |t| {
            let x = t[0].permute(&[0, 3, 1, 2]).unwrap();
            let w = t[1].narrow(0, 1, 6).unwrap();
            x.conv2d(&w, None, conv(2, 1, 1, 2)).unwrap()
        });
        // a broadcast (expanded) batch
        let x1 = randn(&[1, 3, 7, 7], dtype, 9);
        let w = randn(&[4, 3, 3, 3], dtype, 10);
        compare(&case("expanded"), dev, &[x1, w], true, tol, |t| {
            let x = t[0].expand(&[3, 3, 7, 7]).unwrap();
            x.conv2d(&t[1], None, conv(1, 1, 1, 1)).unwrap()
        });
        // the weight gradient reduces over n*oh*ow = 2*33*37 terms, several blocks' worth
        let x = randn(&[2, 3, 33, 37], dtype, 11);
        let w = randn(&[5, 3, 3, 3], dtype, 12);
        compare(&case("large plane"), dev, &[x, w], true, tol, |t| {
            t[0].conv2d(&t[1], None, conv(1, 1, 1, 1)).unwrap()
        });
        // the kernel covers the whole padded input (1x1 output)
        let x = randn(&[2, 2, 3, 3], dtype, 13);
        let w = randn(&[2, 2, 5, 5], dtype, 14);
        compare(&case("full window"), dev, &[x, w], true, tol, |t| {
            t[0].conv2d(&t[1], None, conv(1, 1, 1, 1)).unwrap()
        });
        // an empty batch
        let x = randn(&[0, 4, 6, 6], dtype, 15);
        let w = randn(&[2, 4, 3, 3], dtype, 16);
        compare(&case("empty batch"), dev, &[x, w], true, tol, |t| {
            t[0].conv2d(&t[1], None, conv(1, 0, 1, 1)).unwrap()
        });
    }
}

#[test]
fn pools_match_the_cpu() {
    let Some(dev) = gpu("pools_match_the_cpu") else {
        return;
    };
    let windows = [
        ("k3 s2 p1", window((3, 3), (2, 2), (1, 1))),
        ("k2", Pool2dParams::square(2)),
        ("k3x2 s1x2 p1x0", window((3, 2), (1, 2), (1, 0))),
        ("k1", Pool2dParams::square(1)),
    ];
    for dtype in FLOATS {
        let tol = tolerance(dtype);
        let x = randn(&[2, 3, 9, 10], dtype, 20);
        for (what, p) in windows {
            compare(
                &format!("max_pool2d {what} {dtype:?}"),
                dev,
                std::slice::from_ref(&x),
                true,
                tol,
                |t| t[0].max_pool2d(p).unwrap(),
            );
            compare(
                &format!("avg_pool2d {what} {dtype:?}"),
                dev,
                std::slice::from_ref(&x),
                true,
                tol,
                |t| t[0].avg_pool2d(p).unwrap(),
            );
        }
    }
}

/// A view taken of a test's input inside the compared function.
type View = fn(&Tensor) -> Tensor;

#[test]
fn pools_read_views_and_edge_sizes() {
    let Some(dev) = gpu("pools_read_views_and_edge_sizes") else {
        return;
    };
    let p = window((3, 3), (2, 2), (1, 1));
    for dtype in [DType::F32, DType::BF16] {
        let tol = tolerance(dtype);
        let cases: [(&str, Tensor, View); 4] = [
            ("permuted", randn(&[2, 9, 10, 3], dtype, 21), |x| {
                x.permute(&[0, 3, 1, 2]).unwrap()
            }),
            ("expanded", randn(&[1, 3, 9, 10], dtype, 22), |x| {
                x.expand(&[2, 3, 9, 10]).unwrap()
            }),
            // planes larger than a block, sizes not multiples of 32
            ("large", randn(&[1, 2, 45, 67], dtype, 23), |x| x.clone()),
            ("empty", randn(&[0, 3, 8, 8], dtype, 24), |x| x.clone()),
        ];
        for (what, x, view) in cases {
            compare(
                &format!("max_pool2d {what} {dtype:?}"),
                dev,
                std::slice::from_ref(&x),
                true,
                tol,
                |t| view(&t[0]).max_pool2d(p).unwrap(),
            );
            compare(
                &format!("avg_pool2d {what} {dtype:?}"),
                dev,
                std::slice::from_ref(&x),
                true,
                tol,
                |t| view(&t[0]).avg_pool2d(p).unwrap(),
            );
        }
    }
}

/// Ties go to the window's first maximum and a NaN wins its window, as on the CPU: the gradient
/// shows which position each window chose.
#[test]
fn max_pool2d_breaks_ties_and_keeps_nans_as_the_cpu() {
    let Some(dev) = gpu("max_pool2d_breaks_ties_and_keeps_nans_as_the_cpu") else {
        return;
    };
    let (h, w) = (7, 8);
    // few distinct values, so most windows hold their maximum more than once
    let mut v: Vec<f32> = (0..2 * h * w).map(|i| ((i * 7) % 5) as f32).collect();
    // one NaN, and a second NaN in an overlapping window
    v[h * w + 2 * w + 3] = f32::NAN;
    v[h * w + 3 * w + 4] = f32::NAN;
    // a window of -inf
    for i in 0..3 {
        v[i * w..i * w + 3].iter_mut().for_each(|x| *x = f32::NEG_INFINITY);
    }
    let x = Tensor::from_vec(v, &[1, 2, h, w]).unwrap();
    for dtype in [DType::F32, DType::BF16, DType::F64] {
        let x = x.cast(dtype).unwrap();
        for p in [window((3, 3), (2, 2), (1, 1)), window((3, 3), (1, 1), (0, 0))] {
            compare(
                &format!("max_pool2d ties {p:?} {dtype:?}"),
                dev,
                std::slice::from_ref(&x),
                true,
                tolerance(dtype),
                |t| t[0].max_pool2d(p).unwrap(),
            );
        }
    }
}
