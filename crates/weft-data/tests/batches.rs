//! BatchesDataset: wrap-around and shape checks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use weft_core::{io::safetensors, DType, Tensor};
use weft_data::BatchesDataset;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-data-batches-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A tensor and the name it is saved under.
type Named<'a> = (&'a str, &'a Tensor);

fn save(path: &Path, tensors: &[Named]) {
    safetensors::save(path, tensors.iter().map(|(n, t)| (*n, *t)), &BTreeMap::new()).unwrap();
}

#[test]
fn batches_cycle_through_the_steps() {
    let dir = temp_dir("cycle");
    let path = dir.join("b.safetensors");
    // S = 3 steps, B = 2 rows, inputs [3, 2, 4] I64, targets [3, 2] I64
    let inputs = Tensor::from_vec((0..24i64).collect(), &[3, 2, 4]).unwrap();
    let targets = Tensor::from_vec((100..106i64).collect(), &[3, 2]).unwrap();
    save(&path, &[("inputs", &inputs), ("targets", &targets)]);
    let d = BatchesDataset::from_file(&path).unwrap();
    assert_eq!((d.steps_per_cycle(), d.batch_size()), (3, 2));
    for step in 0..7 {
        let (x, y) = d.batch(step).unwrap();
        let s = (step % 3) as i64;
        assert_eq!(x.shape(), &[2, 4]);
        assert_eq!(y.shape(), &[2]);
        assert_eq!(x.dtype(), DType::I64);
        assert_eq!(x.to_vec::<i64>().unwrap(), (s * 8..s * 8 + 8).collect::<Vec<_>>());
        assert_eq!(y.to_vec::<i64>().unwrap(), vec![100 + 2 * s, 101 + 2 * s]);
        assert!(x.is_contiguous());
    }
    // float inputs with trailing dims keep their dtype
    let images = Tensor::from_vec((0..2 * 3 * 4).map(|v| v as f32).collect(), &[2, 3, 2, 2]).unwrap();
    let labels = Tensor::from_vec(vec![0i64; 6], &[2, 3]).unwrap();
    save(&path, &[("inputs", &images), ("targets", &labels)]);
    let (x, _) = BatchesDataset::from_file(&path).unwrap().batch(3).unwrap();
    assert_eq!((x.shape(), x.dtype()), (&[3, 2, 2][..], DType::F32));
    assert_eq!(
        x.to_vec::<f32>().unwrap(),
        (12..24).map(|v| v as f32).collect::<Vec<_>>()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn mismatched_or_missing_tensors_are_rejected() {
    let dir = temp_dir("bad");
    let path = dir.join("b.safetensors");
    let a = Tensor::from_vec(vec![0i64; 12], &[3, 4]).unwrap();
    let b = Tensor::from_vec(vec![0i64; 8], &[2, 4]).unwrap();
    let c = Tensor::from_vec(vec![0i64; 12], &[3, 2, 2]).unwrap();
    let flat = Tensor::from_vec(vec![0i64; 3], &[3]).unwrap();
    let cases: [(&[Named], &[&str]); 5] = [
        (
            &[("inputs", &a), ("targets", &b)],
            &["[3, 4]", "[2, 4]", "inputs", "targets"],
        ),
        (&[("inputs", &a), ("targets", &c)], &["[3, 4]", "[3, 2, 2]"]),
        (&[("inputs", &a), ("targets", &flat)], &["[3]", "[steps, batch, ...]"]),
        // the list names what the file has, "inputs" included
        (
            &[("inputs", &a)],
            &["no tensor named \"targets\" (the file has [\"inputs\"])"],
        ),
        (&[("x", &a), ("targets", &a)], &["\"inputs\"", "\"x\""]),
    ];
    for (tensors, needles) in cases {
        save(&path, tensors);
        let msg = BatchesDataset::from_file(&path).unwrap_err().to_string();
        assert!(msg.contains("b.safetensors"), "{msg}");
        for n in needles {
            assert!(msg.contains(n), "expected {n:?} in: {msg}");
        }
    }
    let empty = Tensor::from_vec(Vec::<i64>::new(), &[0, 2]).unwrap();
    save(&path, &[("inputs", &empty), ("targets", &empty)]);
    assert!(BatchesDataset::from_file(&path)
        .unwrap_err()
        .to_string()
        .contains("no steps"));
    assert!(BatchesDataset::from_file(dir.join("missing.safetensors"))
        .unwrap_err()
        .to_string()
        .contains("missing.safetensors"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_empty_batch_dimension_is_refused_naming_the_tensor() {
    let dir = temp_dir("empty-batch");
    let path = dir.join("b.safetensors");
    // S = 3 steps of B = 0 rows: every batch would be empty and its loss NaN
    let inputs = Tensor::from_vec(Vec::<i64>::new(), &[3, 0, 4]).unwrap();
    let targets = Tensor::from_vec(Vec::<i64>::new(), &[3, 0]).unwrap();
    save(&path, &[("inputs", &inputs), ("targets", &targets)]);
    let msg = BatchesDataset::from_file(&path).unwrap_err().to_string();
    assert_eq!(
        msg,
        format!(
            "{}: tensor \"inputs\" has shape [3, 0, 4]: dimension 1 (batch) is 0: every batch would have no rows",
            path.display()
        )
    );
    // a row of zero features, and zero targets per row
    let inputs = Tensor::from_vec(Vec::<f32>::new(), &[3, 2, 0]).unwrap();
    let targets = Tensor::from_vec(vec![0i64; 6], &[3, 2]).unwrap();
    save(&path, &[("inputs", &inputs), ("targets", &targets)]);
    let msg = BatchesDataset::from_file(&path).unwrap_err().to_string();
    assert!(
        msg.contains("\"inputs\" has shape [3, 2, 0]: dimension 2 is 0"),
        "{msg}"
    );
    let inputs = Tensor::from_vec(vec![0i64; 24], &[3, 2, 4]).unwrap();
    let targets = Tensor::from_vec(Vec::<i64>::new(), &[3, 2, 0]).unwrap();
    save(&path, &[("inputs", &inputs), ("targets", &targets)]);
    let msg = BatchesDataset::from_file(&path).unwrap_err().to_string();
    assert!(
        msg.contains("\"targets\" has shape [3, 2, 0]: dimension 2 is 0"),
        "{msg}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
