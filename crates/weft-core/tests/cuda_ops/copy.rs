//! Moving tensors between devices, views, copies, fills.

use super::{assert_close, compare, gpu, randn};
use weft_core::{DType, Device, Tensor};

#[test]
fn round_trip_keeps_every_dtype() {
    let Some(dev) = gpu("round_trip_keeps_every_dtype") else {
        return;
    };
    for dtype in [
        DType::F32,
        DType::F64,
        DType::BF16,
        DType::F16,
        DType::I64,
        DType::I32,
        DType::U8,
        DType::Bool,
    ] {
        let x = Tensor::arange(0.0, 24.0, 1.0, DType::F32)
            .unwrap()
            .reshape(&[2, 3, 4])
            .unwrap();
        let x = if dtype == DType::Bool {
            x.gt(&Tensor::scalar(11.5f32)).unwrap()
        } else {
            x.cast(dtype).unwrap()
        };
        let on = x.to(dev).unwrap();
        assert_eq!(on.device(), dev);
        let back = on.to(Device::Cpu).unwrap();
        assert_eq!(back.device(), Device::Cpu);
        assert_eq!(back.to_vec_f64(), x.to_vec_f64(), "{dtype:?}");
        // Host accessors read through a copy.
        assert_eq!(on.to_vec_f64(), x.to_vec_f64(), "{dtype:?} to_vec_f64");
    }
}

#[test]
fn views_are_gathered_on_the_gpu() {
    let Some(dev) = gpu("views_are_gathered_on_the_gpu") else {
        return;
    };
    let x = randn(&[4, 5, 6], DType::F32, 1);
    compare("permute+contiguous", dev, std::slice::from_ref(&x), true, 0.0, |t| {
        t[0].permute(&[2, 0, 1]).unwrap().contiguous().unwrap()
    });
    compare("narrow", dev, std::slice::from_ref(&x), true, 0.0, |t| {
        t[0].narrow(1, 1, 3).unwrap().contiguous().unwrap()
    });
    compare("expand", dev, &[randn(&[4, 1, 6], DType::F32, 2)], true, 0.0, |t| {
        t[0].expand(&[4, 5, 6]).unwrap().contiguous().unwrap()
    });
    compare("reshape of a view", dev, std::slice::from_ref(&x), true, 0.0, |t| {
        t[0].permute(&[1, 0, 2]).unwrap().reshape(&[20, 6]).unwrap()
    });
    compare(
        "cat",
        dev,
        &[x.clone(), randn(&[4, 2, 6], DType::F32, 3)],
        true,
        0.0,
        |t| Tensor::cat(&[&t[0], &t[1]], 1).unwrap(),
    );
}

#[test]
fn copy_from_and_fill_write_on_the_gpu() {
    let Some(dev) = gpu("copy_from_and_fill_write_on_the_gpu") else {
        return;
    };
    let dst = Tensor::zeros_on(&[3, 4], DType::F32, dev).unwrap();
    assert_eq!(dst.device(), dev);
    let src = randn(&[4, 3], DType::F64, 4);
    // Into a transposed view, from the CPU, with a cast.
    dst.permute(&[1, 0]).unwrap().copy_from(&src).unwrap();
    let want = src
        .cast(DType::F32)
        .unwrap()
        .permute(&[1, 0])
        .unwrap()
        .contiguous()
        .unwrap();
    assert_close("copy_from", &dst, &want, 0.0);
    let ones = Tensor::full_on(&[5], 2.5, DType::BF16, dev).unwrap();
    assert_eq!(ones.to_vec_f64(), vec![2.5; 5]);
}

/// Overlapping views of one buffer: the source is read whole before the destination is written,
/// as on the CPU (a shift by one element each way, and a reversal through a transpose).
#[test]
fn copy_from_between_overlapping_views_of_one_tensor() {
    let Some(dev) = gpu("copy_from_between_overlapping_views_of_one_tensor") else {
        return;
    };
    let n = 100_000;
    let host = randn(&[n], DType::F32, 7);
    for (to, from) in [(0, 1), (1, 0)] {
        let want = host.contiguous_copy().unwrap();
        want.narrow(0, to, n - 1)
            .unwrap()
            .copy_from(&want.narrow(0, from, n - 1).unwrap())
            .unwrap();
        let got = host.to(dev).unwrap();
        got.narrow(0, to, n - 1)
            .unwrap()
            .copy_from(&got.narrow(0, from, n - 1).unwrap())
            .unwrap();
        assert_close(&format!("shift {from} -> {to}"), &got, &want, 0.0);
    }
    let square = randn(&[300, 300], DType::F32, 8);
    let want = square.contiguous_copy().unwrap();
    want.copy_from(&want.permute(&[1, 0]).unwrap()).unwrap();
    let got = square.to(dev).unwrap();
    got.copy_from(&got.permute(&[1, 0]).unwrap()).unwrap();
    assert_close("transpose in place", &got, &want, 0.0);
}

#[test]
fn mixed_devices_are_refused_naming_both() {
    let Some(dev) = gpu("mixed_devices_are_refused_naming_both") else {
        return;
    };
    let a = randn(&[3], DType::F32, 5).to(dev).unwrap();
    let b = randn(&[3], DType::F32, 6);
    let err = Tensor::cat(&[&a, &b], 0).unwrap_err().to_string();
    assert!(err.contains("cuda:0") && err.contains("cpu"), "{err}");
}

#[test]
fn asking_for_a_missing_device_is_one_clear_error() {
    // Runs everywhere: without a driver the error says so; with one, the ordinal past the last
    // device is refused naming the devices there are.
    let x = randn(&[2], DType::F32, 7);
    match weft_core::cuda::device_count() {
        Err(e) => {
            let err = x.to(Device::Cuda(0)).unwrap_err().to_string();
            assert!(err.starts_with("cuda:0 is not available: "), "{err}");
            assert!(err.contains(&e.to_string()), "{err}");
            assert!(!err.contains('\n'), "one line: {err}");
            let err = Tensor::zeros_on(&[2], DType::F32, Device::Cuda(3))
                .unwrap_err()
                .to_string();
            assert!(err.starts_with("cuda:3 is not available: "), "{err}");
        }
        Ok(n) => {
            let err = x.to(Device::Cuda(n)).unwrap_err().to_string();
            assert!(
                err.contains(&format!("cuda:{n} does not exist: this machine has")),
                "{err}"
            );
        }
    }
}

#[test]
fn random_fills_draw_the_cpu_stream() {
    let Some(dev) = gpu("random_fills_draw_the_cpu_stream") else {
        return;
    };
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
        for normal in [false, true] {
            // an offset past 2^32 counters, as a long run's generator reaches
            let (mut a, mut b) = (weft_core::Generator::new(5), weft_core::Generator::new(5));
            a.set_offset((1 << 33) + 7);
            b.set_offset((1 << 33) + 7);
            let (cpu, gpu) = if normal {
                (
                    Tensor::randn(&[3, 1000], dtype, &mut a),
                    Tensor::randn_on(&[3, 1000], dtype, &mut b, dev),
                )
            } else {
                (
                    Tensor::rand(&[3, 1000], dtype, &mut a),
                    Tensor::rand_on(&[3, 1000], dtype, &mut b, dev),
                )
            };
            let (cpu, gpu) = (cpu.unwrap(), gpu.unwrap());
            assert_eq!(gpu.device(), dev);
            assert_eq!(a.offset(), b.offset(), "both streams move on by the same count");
            // uniforms are exact; normals go through log and cos, whose last bit may differ from
            // the CPU's libm in f64 (and, rarely, round the other way to a narrower dtype)
            let tol = match (normal, dtype) {
                (false, _) => 0.0,
                (true, DType::F64) => 1e-14,
                (true, _) => 1e-6,
            };
            let what = format!("{dtype:?} {}", if normal { "normal" } else { "uniform" });
            assert_close(&what, &gpu, &cpu, tol);
        }
    }
}
