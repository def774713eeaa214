//! The lazy safetensors reader: what it reads (only the bytes asked for), and the damaged or
//! forged headers it refuses, each with one line naming the file and the tensor.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use weft_core::io::safetensors::{self, SafeTensorsFile};
use weft_core::{DType, Tensor};

fn dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("st-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A file of `header` (JSON, padded to 8 bytes) followed by `data`.
fn raw(path: &Path, header: serde_json::Value, data: &[u8]) {
    let mut head = serde_json::to_vec(&header).unwrap();
    while !(8 + head.len()).is_multiple_of(8) {
        head.push(b' ');
    }
    let mut bytes = (head.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&head);
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).unwrap();
}

fn refused(path: &Path) -> String {
    let e = SafeTensorsFile::open(path).unwrap_err().to_string();
    assert!(e.contains(&path.display().to_string()), "{e}");
    assert!(!e.contains('\n'), "{e}");
    assert_eq!(
        e,
        safetensors::load(path).unwrap_err().to_string(),
        "load refuses as open does"
    );
    e
}

#[test]
fn open_reads_the_header_only_and_rows_read_only_their_bytes() {
    let d = dir("rows");
    let path = d.join("m.safetensors");
    let w = Tensor::from_vec((0..24).map(|v| v as f32).collect::<Vec<_>>(), &[6, 4]).unwrap();
    let b = Tensor::from_vec(vec![1.5f64, -2.5], &[2]).unwrap();
    let meta = BTreeMap::from([("step".to_string(), "7".to_string())]);
    safetensors::save(&path, [("w", &w), ("b", &b)], &meta).unwrap();

    let f = SafeTensorsFile::open(&path).unwrap();
    assert_eq!(f.bytes_copied(), 0);
    assert_eq!(f.names().collect::<Vec<_>>(), ["b", "w"]);
    assert_eq!(f.metadata(), &meta);
    let e = f.entry("w").unwrap();
    assert_eq!((e.dtype, e.shape.as_slice()), (DType::F32, &[6usize, 4][..]));
    assert!(f.entry("nope").is_none());

    let rows = f.rows("w", 2..4).unwrap();
    assert_eq!(rows.shape(), &[2, 4]);
    assert_eq!(
        rows.to_vec::<f32>().unwrap(),
        (8..16).map(|v| v as f32).collect::<Vec<_>>()
    );
    assert_eq!(f.bytes_copied(), 2 * 4 * 4);
    let els = f.elements("w", 5..7).unwrap();
    assert_eq!(els.to_vec::<f32>().unwrap(), [5.0, 6.0]);
    assert_eq!(f.bytes_copied(), 2 * 4 * 4 + 2 * 4);
    assert_eq!(f.tensor("b").unwrap().to_vec::<f64>().unwrap(), [1.5, -2.5]);
    assert_eq!(f.bytes_copied(), 2 * 4 * 4 + 2 * 4 + 16);
    assert_eq!(f.rows("w", 0..0).unwrap().shape(), &[0, 4]);

    for e in [
        f.rows("w", 5..7).unwrap_err(),
        f.elements("w", 20..25).unwrap_err(),
        f.rows("nope", 0..1).unwrap_err(),
    ] {
        let e = e.to_string();
        assert!(
            e.contains("m.safetensors") && (e.contains("\"w\"") || e.contains("\"nope\"")),
            "{e}"
        );
    }
    // the eager API reads the same
    let all = safetensors::load(&path).unwrap();
    assert_eq!(all.tensors["w"].to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
    assert_eq!(all.metadata, meta);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn damaged_or_forged_headers_are_refused_naming_the_tensor() {
    let d = dir("forged");
    let p = d.join("f.safetensors");
    let entry = |dtype: &str, shape: serde_json::Value, b: u64, e: u64| serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [b, e]});
    // a dtype the format knows but weft has no storage for
    raw(
        &p,
        serde_json::json!({"w": entry("F8_E4M3", serde_json::json!([2]), 0, 2)}),
        &[0; 2],
    );
    let e = refused(&p);
    assert!(
        e.contains("\"w\"") && e.contains("F8_E4M3") && e.contains("not one weft reads"),
        "{e}"
    );
    // a dtype the format does not know
    raw(
        &p,
        serde_json::json!({"w": entry("Q4", serde_json::json!([2]), 0, 2)}),
        &[0; 2],
    );
    let e = refused(&p);
    assert!(e.contains("\"w\"") && e.contains("Q4"), "{e}");
    // offsets that do not match the shape
    raw(
        &p,
        serde_json::json!({"w": entry("F32", serde_json::json!([2, 3]), 0, 20)}),
        &[0; 20],
    );
    let e = refused(&p);
    assert!(e.contains("\"w\"") && e.contains("do not hold F32 [2, 3]"), "{e}");
    // a shape whose element count overflows
    let big = serde_json::json!([u64::MAX, 4]);
    raw(&p, serde_json::json!({"w": entry("F32", big, 0, 16)}), &[0; 16]);
    let e = refused(&p);
    assert!(e.contains("\"w\"") && e.contains("more elements than fit"), "{e}");
    // two tensors over the same bytes
    raw(
        &p,
        serde_json::json!({"a": entry("F32", serde_json::json!([2]), 0, 8), "b": entry("F32", serde_json::json!([2]), 0, 8)}),
        &[0; 16],
    );
    let e = refused(&p);
    assert!(e.contains("overlap"), "{e}");
    // offsets past the end of the file
    raw(
        &p,
        serde_json::json!({"w": entry("F32", serde_json::json!([4]), 0, 16)}),
        &[0; 8],
    );
    let e = refused(&p);
    assert!(
        e.contains("\"w\"") && e.contains("truncated") && e.contains("needs bytes up to 16"),
        "{e}"
    );
    // bytes after the last tensor
    raw(
        &p,
        serde_json::json!({"w": entry("F32", serde_json::json!([2]), 0, 8)}),
        &[0; 16],
    );
    let e = refused(&p);
    assert!(e.contains("8 bytes follow the last tensor"), "{e}");
    // a bool byte that is neither 0 nor 1: refused when the tensor is read
    raw(
        &p,
        serde_json::json!({"m": entry("BOOL", serde_json::json!([2]), 0, 2)}),
        &[1, 7],
    );
    let f = SafeTensorsFile::open(&p).unwrap();
    let e = f.tensor("m").unwrap_err().to_string();
    assert!(
        e.contains("f.safetensors") && e.contains("\"m\"") && e.contains("bool byte 7"),
        "{e}"
    );
    // an empty file and a header that is not JSON
    std::fs::write(&p, b"").unwrap();
    assert!(refused(&p).contains("not a safetensors file"));
    raw(&p, serde_json::json!({}), &[]);
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[8] = b'#';
    std::fs::write(&p, bytes).unwrap();
    assert!(refused(&p).contains("not valid JSON"));
    // a missing file
    let gone = d.join("gone.safetensors");
    let e = SafeTensorsFile::open(&gone).unwrap_err().to_string();
    assert!(e.contains("gone.safetensors"), "{e}");
    // not a regular file: a folder, and a FIFO (opening it waited for a writer, forever)
    assert!(refused(&d).contains("not a file (a directory)"));
    #[cfg(unix)]
    {
        let fifo = d.join("fifo.safetensors");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            assert!(refused(&fifo).contains("not a file (a FIFO)"));
        } else {
            eprintln!("skipped the FIFO case: mkfifo is not available");
        }
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn files_written_here_read_back_in_any_layout_the_format_allows() {
    // the crate lays tensors out widest dtype first; a file in name order (as other writers
    // make) reads the same
    let d = dir("layout");
    let p = d.join("l.safetensors");
    let mut data = Vec::new();
    data.extend_from_slice(&[1u8, 2]);
    data.extend(1.0f64.to_le_bytes());
    raw(
        &p,
        serde_json::json!({
            "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
            "b": {"dtype": "F64", "shape": [], "data_offsets": [2, 10]},
            "__metadata__": {"format": "pt"}
        }),
        &data,
    );
    let back = safetensors::load(&p).unwrap();
    assert_eq!(back.tensors["a"].to_vec::<u8>().unwrap(), [1, 2]);
    assert_eq!(back.tensors["b"].to_vec::<f64>().unwrap(), [1.0]);
    assert_eq!(back.tensors["b"].shape(), &[] as &[usize]);
    assert_eq!(back.metadata["format"], "pt");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_header_of_more_tensors_than_weft_reads_is_refused_before_parsing() {
    // empty tensors cost no data bytes: before the count a 90 MB header of them took 1.3 GB
    // and 9 s to refuse (or to accept)
    let d = dir("many");
    let p = d.join("many.safetensors");
    let n = safetensors::header::MAX_TENSORS + 1;
    let mut head = String::with_capacity(n * 60);
    head.push('{');
    for i in 0..n {
        if i > 0 {
            head.push(',');
        }
        head.push_str(&format!(r#""t{i}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}"#));
    }
    head.push('}');
    while !(8 + head.len()).is_multiple_of(8) {
        head.push(' ');
    }
    let mut bytes = (head.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(head.as_bytes());
    std::fs::write(&p, bytes).unwrap();
    let e = refused(&p);
    assert!(
        e.contains(&format!("more than {} tensors", safetensors::header::MAX_TENSORS)),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&d);
}
