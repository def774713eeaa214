//! The caching allocator on a GPU: a repeated step stops asking the driver for memory, and a
//! request no GPU can hold is an error naming the op and the device's memory, not an abort.

use super::{gpu, randn};
use weft_core::{cuda, DType, Error, Tensor};

#[test]
fn a_repeated_step_reuses_the_cached_blocks() {
    let Some(dev) = gpu("a_repeated_step_reuses_the_cached_blocks") else {
        return;
    };
    let w = randn(&[64, 64], DType::F32, 1)
        .to(dev)
        .unwrap()
        .requires_grad_()
        .unwrap();
    let mut counts = Vec::new();
    for step in 0..6 {
        let x = randn(&[32, 64], DType::F32, 10 + step).to(dev).unwrap();
        let loss = x
            .matmul(&w)
            .unwrap()
            .gelu()
            .unwrap()
            .softmax(-1)
            .unwrap()
            .sum_all()
            .unwrap();
        loss.backward().unwrap();
        w.set_grad(None);
        cuda::synchronize(dev).unwrap();
        counts.push(cuda::memory_stats(dev).unwrap().driver_allocations);
    }
    // the first steps fill the cache; the later ones take everything from it
    assert_eq!(counts[2], counts[5], "driver allocations per step: {counts:?}");
    let stats = cuda::memory_stats(dev).unwrap();
    assert!(
        stats.peak_allocated >= stats.allocated && stats.reserved >= stats.allocated,
        "{stats:?}"
    );
}

#[test]
fn more_than_the_gpu_holds_is_an_error_naming_the_op_and_the_memory() {
    let Some(dev) = gpu("more_than_the_gpu_holds_is_an_error_naming_the_op_and_the_memory") else {
        return;
    };
    // 4 TiB of f32
    let err = Tensor::zeros_on(&[1 << 40], DType::F32, dev).unwrap_err();
    match &err {
        Error::DeviceOutOfMemory {
            op,
            device,
            bytes,
            total,
            ..
        } => {
            assert_eq!((*op, *device, *bytes), ("full", dev, 4u64 << 40));
            assert!(*total > 0, "{err}");
        }
        other => panic!("expected DeviceOutOfMemory, got {other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.starts_with("full: cannot allocate 4.4 TB") && msg.contains("free of"),
        "{msg}"
    );
    // the device still works afterwards
    assert_eq!(
        Tensor::full_on(&[3], 2.0, DType::F32, dev).unwrap().to_vec_f64(),
        vec![2.0; 3]
    );
}
