//! Sizes no machine can hold are errors naming the op and the bytes, never an abort: creation
//! ops, random fills, products, casts and copies of expanded views, and safetensors files whose
//! header claims a huge tensor.
//!
//! Each huge buffer here is 4.4 TB or more; the tests need the machine's memory to be known and
//! smaller than that (on Linux it is read from /proc/meminfo and the cgroup), and pass without
//! checking otherwise.

use weft_core::{alloc, DType, Error, Generator, Tensor};

/// 2^20 x 2^20 elements: 4 TiB of f32.
const SIDE: usize = 1 << 20;

/// Whether a 4 TiB buffer is more than this machine has (so it is refused before asking).
fn refuses_4_tib() -> bool {
    alloc::machine_memory().is_some_and(|m| m < 1 << 42)
}

/// Checks that `r` is an out-of-memory error naming `op` and `bytes`, with the message's form.
fn assert_oom<T: std::fmt::Debug>(r: weft_core::Result<T>, op: &str, bytes: u128) {
    let e = r.expect_err("a buffer larger than the machine was allocated");
    let msg = e.to_string();
    assert!(
        matches!(e, Error::OutOfMemory { op: o, bytes: b, memory: Some(_) } if o == op && b == bytes),
        "{e:?}"
    );
    let want = format!(
        "{op}: cannot allocate {} ({bytes} bytes): more than this machine's {} of memory",
        alloc::human_bytes(bytes),
        alloc::human_bytes(alloc::machine_memory().unwrap() as u128)
    );
    assert_eq!(msg, want);
}

#[test]
fn creating_a_tensor_larger_than_memory_fails_naming_the_op_and_bytes() {
    if !refuses_4_tib() {
        return;
    }
    let tib4 = (SIDE * SIDE * 4) as u128;
    assert_oom(Tensor::zeros(&[SIDE, SIDE], DType::F32), "fill", tib4);
    assert_oom(Tensor::full(&[SIDE, SIDE], 1.5, DType::F32), "fill", tib4);
    assert_oom(Tensor::ones(&[SIDE, SIDE], DType::F64), "fill", 2 * tib4);
    let mut g = Generator::new(1);
    assert_oom(Tensor::randn(&[SIDE, SIDE], DType::F32, &mut g), "random", tib4);
    assert_oom(Tensor::rand(&[SIDE, SIDE], DType::BF16, &mut g), "random", tib4 / 2);
    assert_oom(
        Tensor::arange(0.0, (SIDE * SIDE) as f64, 1.0, DType::I64),
        "arange",
        2 * tib4,
    );
    // and a small tensor right after works as ever
    assert_eq!(Tensor::zeros(&[2, 3], DType::F32).unwrap().to_vec_f64(), vec![0.0; 6]);
}

#[test]
fn a_shape_with_more_elements_than_usize_holds_is_refused() {
    let e = Tensor::zeros(&[1 << 40, 1 << 40], DType::F32).unwrap_err().to_string();
    assert!(
        e.starts_with("full: shape [1099511627776, 1099511627776] has more than"),
        "{e}"
    );
    let one = Tensor::ones(&[1, 1], DType::F32).unwrap();
    let e = one.expand(&[1 << 40, 1 << 40]).unwrap_err().to_string();
    assert!(e.starts_with("expand: shape"), "{e}");
    let (a, b) = (one.expand(&[1 << 40, 1]).unwrap(), one.expand(&[1, 1 << 40]).unwrap());
    let e = a.add(&b).unwrap_err().to_string();
    assert!(e.starts_with("binary: shape") && e.contains("more than"), "{e}");
}

#[test]
fn ops_whose_output_does_not_fit_fail_naming_the_op_and_bytes() {
    if !refuses_4_tib() {
        return;
    }
    let tib4 = (SIDE * SIDE * 4) as u128;
    let one = Tensor::ones(&[1, 1], DType::F32).unwrap();
    // [2^20, 1] @ [1, 2^20]: the operands are views of one element, the product is 4 TiB
    let (col, row) = (one.expand(&[SIDE, 1]).unwrap(), one.expand(&[1, SIDE]).unwrap());
    assert_oom(col.matmul(&row), "matmul", tib4);
    // a broadcast sum of the same two views
    assert_oom(col.add(&row), "binary", tib4);
    // casts and copies of a 2^40-element expanded view
    let big = one.expand(&[SIDE, SIDE]).unwrap();
    // (a view is gathered before it is converted: the gathered copy is the first buffer)
    assert_oom(big.cast(DType::F64), "cast", tib4);
    assert_oom(big.cast(DType::BF16), "cast", tib4);
    assert_oom(big.contiguous(), "contiguous", tib4);
    assert_oom(big.contiguous_copy(), "contiguous_copy", tib4);
    // rows of a real column repeated: no view flattens it, so reshape copies
    let rows = Tensor::ones(&[SIDE, 1], DType::F32)
        .unwrap()
        .expand(&[SIDE, SIDE])
        .unwrap();
    assert_oom(rows.reshape(&[-1]), "reshape", tib4);
    assert_oom(big.to_vec::<f32>(), "to_vec", tib4);
    assert_oom(big.try_to_vec_f64(), "to_vec_f64", 2 * tib4);
    // kernels that read a contiguous copy of their input, or write a tensor-sized output
    assert_oom(big.softmax(-1), "softmax", tib4);
    assert_oom(big.exp(), "unary", tib4);
    assert_oom(big.sum(&[0], false), "reduce", tib4);
    let bf = Tensor::ones(&[1, 1], DType::BF16)
        .unwrap()
        .expand(&[SIDE, SIDE])
        .unwrap();
    assert_oom(bf.exp(), "unary", tib4 / 2);
    let ids = Tensor::zeros(&[SIDE * SIDE], DType::I64);
    assert_oom(ids, "fill", 2 * tib4);
    let idx = Tensor::zeros(&[1], DType::I64).unwrap().expand(&[SIDE]).unwrap();
    assert_oom(
        col.expand(&[SIDE, SIDE]).unwrap().index_select(0, &idx),
        "index_select",
        tib4,
    );
    let parts = [&big, &big];
    assert_oom(Tensor::cat(&parts, 0), "cat", 2 * tib4);
}

/// A safetensors file of `data_len` data bytes (sparse: only the header is written) whose header
/// claims one F32 tensor `"w"` of `shape`; false when the file system refuses a file that long.
fn sparse_safetensors(path: &std::path::Path, shape: &[usize], data_len: u64) -> bool {
    let numel: u64 = shape.iter().map(|&d| d as u64).product();
    let header = serde_json::json!({"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, numel * 4]}});
    let mut head = serde_json::to_vec(&header).unwrap();
    while !(8 + head.len()).is_multiple_of(8) {
        head.push(b' ');
    }
    let mut bytes = (head.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&head);
    std::fs::write(path, &bytes).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(bytes.len() as u64 + data_len).is_ok()
}

#[test]
fn a_safetensors_file_claiming_a_huge_tensor_is_an_error_naming_the_file_and_bytes() {
    let dir =
        std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("alloc-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // the header claims 2^40 floats; the file holds the header only: truncated
    let short = dir.join("short.safetensors");
    assert!(sparse_safetensors(&short, &[SIDE, SIDE], 0));
    let e = weft_core::io::safetensors::load(&short).unwrap_err().to_string();
    assert!(
        e.contains("short.safetensors") && e.contains("truncated") && e.contains("\"w\""),
        "{e}"
    );
    // the same with the bytes to match (a sparse file of 4.4 TB): more than memory can hold
    let huge = dir.join("huge.safetensors");
    if refuses_4_tib() && sparse_safetensors(&huge, &[SIDE, SIDE], (SIDE * SIDE * 4) as u64) {
        // the file is mapped, not read: the tensor's own buffer is what cannot be had
        let tensor_bytes = SIDE * SIDE * 4;
        let e = weft_core::io::safetensors::load(&huge).unwrap_err().to_string();
        assert!(
            e.contains("huge.safetensors")
                && e.contains("\"w\"")
                && e.contains("load: cannot allocate")
                && e.contains(&format!("({tensor_bytes} bytes)")),
            "{e}"
        );
        assert!(e.contains("more than this machine's"), "{e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
