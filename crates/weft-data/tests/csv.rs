//! CsvDataset: parsing (header or not, gzip), errors naming line and column, splits, epochs,
//! evaluation batches, and the real digits file.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use weft_core::DType;
use weft_data::{CsvDataset, Error, LabelColumn, Split};

/// A fresh directory for one test.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-data-csv-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `n` rows: feature 0 = the row index, feature 1 = 2 * row index, label = row % classes.
fn numbered_csv(n: usize, classes: usize) -> String {
    (0..n).map(|i| format!("{i},{},{}\n", 2 * i, i % classes)).collect()
}

fn load_str(text: &str, label: LabelColumn, val_fraction: f64) -> weft_data::Result<CsvDataset> {
    CsvDataset::from_csv_text(text, Path::new("mem.csv"), label, 1.0, val_fraction, 0)
}

#[test]
fn without_header() {
    let d = load_str("1,2,0\n3,4,1\n\n5,6,2\r\n", LabelColumn::Last, 0.0).unwrap();
    assert!(d.header().is_none());
    assert_eq!((d.num_features(), d.num_classes(), d.num_rows_total()), (2, 3, 3));
    let (x, y) = d.eval_batches(Split::Train, 10).next().unwrap().unwrap();
    assert_eq!(x.shape(), &[3, 2]);
    assert_eq!(x.dtype(), DType::F32);
    assert_eq!(y.dtype(), DType::I64);
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![1., 2., 3., 4., 5., 6.]);
    assert_eq!(y.to_vec::<i64>().unwrap(), vec![0, 1, 2]);
}

#[test]
fn with_header_and_label_by_name_or_index() {
    let text = "label,a,b\n1,0.5,2\n0,1.5,-3e1\n";
    let d = load_str(text, LabelColumn::Name("label".into()), 0.0).unwrap();
    assert_eq!(d.header().unwrap(), ["label", "a", "b"]);
    assert_eq!(d.label_index(), 0);
    let (x, y) = d.eval_batches(Split::Train, 1).nth(1).unwrap().unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.5, -30.0]);
    assert_eq!(y.to_vec::<i64>().unwrap(), vec![0]);
    let by_index = load_str(text, LabelColumn::Index(0), 0.0).unwrap();
    assert_eq!(
        by_index
            .eval_batches(Split::Train, 2)
            .next()
            .unwrap()
            .unwrap()
            .1
            .to_vec::<i64>()
            .unwrap(),
        vec![1, 0]
    );
    // counted from the end: -3 of three columns is the first, -1 the last
    let from_end = load_str(text, LabelColumn::FromEnd(3), 0.0).unwrap();
    assert_eq!(from_end.label_index(), 0);
    let classes = "label,a,b\n1,0,2\n0,1,3\n";
    assert_eq!(
        load_str(classes, LabelColumn::FromEnd(1), 0.0).unwrap().label_index(),
        2
    );
    assert_eq!(
        load_str(classes, LabelColumn::FromEnd(2), 0.0).unwrap().label_index(),
        1
    );
    // label in the middle: features keep the other columns in order
    let mid = load_str("3,1,4\n", LabelColumn::Index(1), 0.0).unwrap();
    let (x, y) = mid.eval_batches(Split::Train, 1).next().unwrap().unwrap();
    assert_eq!(
        (x.to_vec::<f32>().unwrap(), y.to_vec::<i64>().unwrap()),
        (vec![3.0, 4.0], vec![1])
    );
}

#[test]
fn feature_scale_and_integral_float_labels() {
    let d = CsvDataset::from_csv_text("16,8,2.0\n", Path::new("m.csv"), LabelColumn::Last, 1.0 / 16.0, 0.0, 0).unwrap();
    let (x, y) = d.eval_batches(Split::Train, 1).next().unwrap().unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.0, 0.5]);
    assert_eq!(y.to_vec::<i64>().unwrap(), vec![2]);
}

#[test]
fn label_column_errors() {
    let no_such = load_str("a,b\n1,2\n", LabelColumn::Name("c".into()), 0.0)
        .unwrap_err()
        .to_string();
    assert!(no_such.contains("\"c\"") && no_such.contains("mem.csv"), "{no_such}");
    let no_header = load_str("1,2\n", LabelColumn::Name("b".into()), 0.0)
        .unwrap_err()
        .to_string();
    assert!(no_header.contains("no header"), "{no_header}");
    let out_of_range = load_str("1,2\n", LabelColumn::Index(2), 0.0).unwrap_err().to_string();
    assert!(
        out_of_range.contains("index 2") && out_of_range.contains("2 columns"),
        "{out_of_range}"
    );
    for k in [3, usize::MAX] {
        let e = load_str("1,2\n", LabelColumn::FromEnd(k), 0.0).unwrap_err().to_string();
        assert!(e.contains(&format!("index -{k}")) && e.contains("-1 to -2"), "{e}");
    }
}

#[test]
fn parse_errors_name_path_line_and_column() {
    let cases: [(&str, usize, Option<usize>, &str); 6] = [
        ("1,2,0\n3,x,1\n", 2, Some(2), "\"x\""),
        ("1,2,0\n\n3,4\n", 3, None, "ragged"),
        ("1,2,0\n3,4,1,5\n", 2, None, "expected 3 values, found 4"),
        ("a,b,c\n1,2,-1\n", 2, Some(3), "negative"),
        ("a,b,c\n1,2,0.5\n", 2, Some(3), "(\"c\")"),
        ("1,,0\n", 1, Some(2), "\"\""),
    ];
    for (text, line, column, needle) in cases {
        let err = load_str(text, LabelColumn::Last, 0.0).unwrap_err();
        match &err {
            Error::Csv {
                path,
                line: l,
                column: c,
                ..
            } => {
                assert_eq!(
                    (path.as_path(), *l, *c),
                    (Path::new("mem.csv"), line, column),
                    "{text:?}: {err}"
                )
            }
            other => panic!("{text:?}: expected a CSV error, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("mem.csv:{line}")) && msg.contains(needle),
            "{text:?}: {msg}"
        );
        if let Some(c) = column {
            assert!(msg.contains(&format!("column {c}")), "{msg}");
        }
    }
    assert!(load_str("", LabelColumn::Last, 0.0)
        .unwrap_err()
        .to_string()
        .contains("no rows"));
    assert!(load_str("a,b\n", LabelColumn::Last, 0.0)
        .unwrap_err()
        .to_string()
        .contains("no data rows"));
    assert!(load_str("1\n2\n", LabelColumn::Last, 0.0).is_err());
    assert!(load_str("1,nan,0\n", LabelColumn::Last, 0.0).is_err());
}

#[test]
fn gzip_and_plain_files_agree_and_errors_name_the_file() {
    let dir = temp_dir("gz");
    let text = "f1,f2,label\n".to_string() + &numbered_csv(50, 5);
    let plain = dir.join("t.csv");
    std::fs::write(&plain, &text).unwrap();
    let gz = dir.join("t.csv.gz");
    let mut enc = flate2::write::GzEncoder::new(std::fs::File::create(&gz).unwrap(), flate2::Compression::default());
    enc.write_all(text.as_bytes()).unwrap();
    enc.finish().unwrap();
    let a = CsvDataset::from_file(&plain, LabelColumn::Name("label".into()), 1.0, 0.2).unwrap();
    let b = CsvDataset::from_file(&gz, LabelColumn::Last, 1.0, 0.2).unwrap();
    assert_eq!(a.rows(Split::Val), b.rows(Split::Val));
    let (xa, ya) = a.batch(Split::Train, 8, 1, 3).unwrap();
    let (xb, yb) = b.batch(Split::Train, 8, 1, 3).unwrap();
    assert_eq!(xa.to_vec::<f32>().unwrap(), xb.to_vec::<f32>().unwrap());
    assert_eq!(ya.to_vec::<i64>().unwrap(), yb.to_vec::<i64>().unwrap());
    let missing = CsvDataset::from_file(dir.join("nope.csv"), LabelColumn::Last, 1.0, 0.1)
        .unwrap_err()
        .to_string();
    assert!(missing.contains("nope.csv"), "{missing}");
    let bad = dir.join("bad.csv");
    std::fs::write(&bad, "1,2,0\n1,2,3,4\n").unwrap();
    let msg = CsvDataset::from_file(&bad, LabelColumn::Last, 1.0, 0.1)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("bad.csv:2"), "{msg}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn split_sizes_and_disjointness() {
    let d = load_str(&numbered_csv(100, 4), LabelColumn::Last, 0.25).unwrap();
    assert_eq!((d.num_rows(Split::Train), d.num_rows(Split::Val)), (75, 25));
    let mut all: Vec<usize> = d.rows(Split::Train).iter().chain(d.rows(Split::Val)).copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..100).collect::<Vec<_>>());
    // the split is shuffled (not simply the last rows), and depends on the split seed
    assert_ne!(d.rows(Split::Val), (75..100).collect::<Vec<_>>());
    let other =
        CsvDataset::from_csv_text(&numbered_csv(100, 4), Path::new("m"), LabelColumn::Last, 1.0, 0.25, 9).unwrap();
    assert_ne!(d.rows(Split::Val), other.rows(Split::Val));
    let no_val = load_str(&numbered_csv(10, 2), LabelColumn::Last, 0.0).unwrap();
    assert_eq!(no_val.num_rows(Split::Val), 0);
    assert_eq!(no_val.eval_batches(Split::Val, 4).count(), 0);
    assert!(no_val.batch(Split::Val, 1, 0, 0).is_err());
}

/// The row index each sample came from (feature 0 is the row index).
fn batch_rows(d: &CsvDataset, split: Split, bs: usize, seed: u64, step: usize) -> Vec<usize> {
    let (x, y) = d.batch(split, bs, seed, step).unwrap();
    assert_eq!(x.shape(), &[bs, 2]);
    assert_eq!(y.shape(), &[bs]);
    let (xv, yv) = (x.to_vec::<f32>().unwrap(), y.to_vec::<i64>().unwrap());
    (0..bs)
        .map(|i| {
            let r = xv[2 * i] as usize;
            assert_eq!(xv[2 * i + 1], 2.0 * r as f32);
            assert_eq!(yv[i], (r % 4) as i64);
            r
        })
        .collect()
}

#[test]
fn each_epoch_is_a_permutation_of_the_train_rows() {
    let d = load_str(&numbered_csv(100, 4), LabelColumn::Last, 0.2).unwrap(); // 80 train rows
    let (bs, seed) = (10, 5);
    assert_eq!(d.batches_per_epoch(Split::Train, bs).unwrap(), 8);
    let mut epochs = Vec::new();
    for e in 0..3 {
        let rows: Vec<usize> = (0..8)
            .flat_map(|k| batch_rows(&d, Split::Train, bs, seed, e * 8 + k))
            .collect();
        let mut sorted = rows.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            d.rows(Split::Train),
            "epoch {e} must visit every train row exactly once"
        );
        epochs.push(rows);
    }
    assert_ne!(epochs[0], epochs[1], "epochs are reshuffled");
    assert_ne!(epochs[1], epochs[2]);
    // drop_last: 80 rows in batches of 7 -> 11 batches, no row twice in an epoch
    assert_eq!(d.batches_per_epoch(Split::Train, 7).unwrap(), 11);
    let rows: Vec<usize> = (0..11).flat_map(|k| batch_rows(&d, Split::Train, 7, seed, k)).collect();
    let mut dedup = rows.clone();
    dedup.sort_unstable();
    dedup.dedup();
    assert_eq!(dedup.len(), 77);
    // step 11 starts epoch 1
    assert_eq!(
        &batch_rows(&d, Split::Train, 7, seed, 11)[..],
        &d.epoch_order(Split::Train, seed, 1).unwrap()[..7]
            .iter()
            .map(|&p| d.rows(Split::Train)[p])
            .collect::<Vec<_>>()[..]
    );
}

#[test]
fn batches_are_pure_functions_of_seed_and_step() {
    let d = load_str(&numbered_csv(100, 4), LabelColumn::Last, 0.2).unwrap();
    let forward: Vec<Vec<usize>> = (0..30).map(|s| batch_rows(&d, Split::Train, 16, 11, s)).collect();
    // any order of access (a resumed run, a cache evicted by the other split or seed) agrees
    let fresh = load_str(&numbered_csv(100, 4), LabelColumn::Last, 0.2).unwrap();
    for s in (0..30).rev() {
        batch_rows(&fresh, Split::Train, 16, 99, s);
        batch_rows(&fresh, Split::Val, 4, 11, s);
        assert_eq!(batch_rows(&fresh, Split::Train, 16, 11, s), forward[s]);
    }
    assert_ne!(batch_rows(&d, Split::Train, 16, 12, 0), forward[0]);
    assert_eq!(batch_rows(&d.clone(), Split::Train, 16, 11, 17), forward[17]);
}

#[test]
fn batch_size_errors_name_split_and_sizes() {
    let d = load_str(&numbered_csv(100, 4), LabelColumn::Last, 0.2).unwrap();
    let msg = d.batch(Split::Val, 21, 0, 0).unwrap_err().to_string();
    assert!(
        msg.contains("val") && msg.contains("20 rows") && msg.contains("21"),
        "{msg}"
    );
    assert!(d.batch(Split::Train, 0, 0, 0).is_err());
    assert!(d.eval_batches(Split::Train, 0).next().unwrap().is_err());
}

#[test]
fn eval_batches_cover_the_split_in_order() {
    let d = load_str(&numbered_csv(100, 4), LabelColumn::Last, 0.2).unwrap();
    let batches: Vec<_> = d.eval_batches(Split::Val, 6).map(Result::unwrap).collect();
    assert_eq!(
        batches.iter().map(|(x, _)| x.shape()[0]).collect::<Vec<_>>(),
        vec![6, 6, 6, 2]
    );
    let rows: Vec<usize> = batches
        .iter()
        .flat_map(|(x, _)| {
            x.to_vec::<f32>()
                .unwrap()
                .chunks(2)
                .map(|r| r[0] as usize)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(rows, d.rows(Split::Val));
}

#[test]
fn digits_file_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/digits.csv.gz");
    if !path.exists() {
        println!("skipping digits_file_loads: {} is absent", path.display());
        return;
    }
    let d = CsvDataset::from_file(&path, LabelColumn::Last, 1.0 / 16.0, 0.1).unwrap();
    assert!(d.header().is_none());
    assert_eq!((d.num_rows_total(), d.num_features(), d.num_classes()), (1797, 64, 10));
    assert_eq!((d.num_rows(Split::Train), d.num_rows(Split::Val)), (1617, 180));
    let (x, y) = d.batch(Split::Train, 64, 0, 0).unwrap();
    assert_eq!((x.shape(), y.shape()), (&[64, 64][..], &[64][..]));
    let xv = x.to_vec::<f32>().unwrap();
    assert!(xv.iter().all(|&v| (0.0..=1.0).contains(&v)));
    let mut counts = BTreeMap::new();
    for (_, y) in d.eval_batches(Split::Train, 500).map(Result::unwrap) {
        for label in y.to_vec::<i64>().unwrap() {
            *counts.entry(label).or_insert(0) += 1;
        }
    }
    assert_eq!(counts.len(), 10);
    assert_eq!(counts.values().sum::<usize>(), 1617);
}
