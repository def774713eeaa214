//! TextDataset: split, batch determinism, shift, offsets, resume, errors.

use weft_data::{Split, TextDataset};

fn corpus() -> String {
    // long enough and varied enough that windows at different offsets differ
    (0..2000)
        .map(|i| format!("line {i}: the quick brown fox {}\n", i * 7919 % 1000))
        .collect()
}

#[test]
fn batches_are_a_pure_function_of_seed_and_step() {
    let d = TextDataset::from_text(&corpus(), 0.1).unwrap();
    let (x1, y1) = d.batch(Split::Train, 8, 32, 1337, 5).unwrap();
    let (x2, y2) = d.batch(Split::Train, 8, 32, 1337, 5).unwrap();
    assert_eq!(x1.to_vec::<i64>().unwrap(), x2.to_vec::<i64>().unwrap());
    assert_eq!(y1.to_vec::<i64>().unwrap(), y2.to_vec::<i64>().unwrap());
    // a second dataset built from the same text agrees too
    let d2 = TextDataset::from_text(&corpus(), 0.1).unwrap();
    assert_eq!(
        d2.batch(Split::Train, 8, 32, 1337, 5)
            .unwrap()
            .0
            .to_vec::<i64>()
            .unwrap(),
        x1.to_vec::<i64>().unwrap()
    );
    // other steps and seeds differ
    let (x3, _) = d.batch(Split::Train, 8, 32, 1337, 6).unwrap();
    let (x4, _) = d.batch(Split::Train, 8, 32, 1338, 5).unwrap();
    assert_ne!(x1.to_vec::<i64>().unwrap(), x3.to_vec::<i64>().unwrap());
    assert_ne!(x1.to_vec::<i64>().unwrap(), x4.to_vec::<i64>().unwrap());
}

#[test]
fn shapes_dtypes_and_shift() {
    let d = TextDataset::from_text(&corpus(), 0.1).unwrap();
    for split in [Split::Train, Split::Val] {
        let (x, y) = d.batch(split, 4, 16, 7, 3).unwrap();
        assert_eq!(x.shape(), &[4, 16]);
        assert_eq!(y.shape(), &[4, 16]);
        assert_eq!(x.dtype(), weft_core::DType::I64);
        assert_eq!(y.dtype(), weft_core::DType::I64);
        let (xv, yv) = (x.to_vec::<i64>().unwrap(), y.to_vec::<i64>().unwrap());
        let offsets = d.offsets(split, 4, 16, 7, 3).unwrap();
        let data = d.tokens(split);
        for b in 0..4 {
            let o = offsets[b];
            assert_eq!(&xv[b * 16..(b + 1) * 16], &data[o..o + 16]);
            assert_eq!(&yv[b * 16..(b + 1) * 16], &data[o + 1..o + 17]);
            // y is x shifted by one
            assert_eq!(&xv[b * 16 + 1..(b + 1) * 16], &yv[b * 16..(b + 1) * 16 - 1]);
        }
    }
}

#[test]
fn offsets_follow_the_formula_and_stay_in_range() {
    let d = TextDataset::from_text(&corpus(), 0.1).unwrap();
    let (bs, block, seed) = (16, 64, 42u64);
    let len = d.num_tokens(Split::Train);
    let mut seen_low = false;
    let mut seen_high = false;
    for step in 0..200 {
        let offsets = d.offsets(Split::Train, bs, block, seed, step).unwrap();
        for (b, &o) in offsets.iter().enumerate() {
            let u = weft_core::rng::uniform(seed, (step * bs + b) as u64);
            assert_eq!(o, (u * (len - block) as f64).floor() as usize);
            assert!(o + block < len);
            seen_low |= o < (len - block) / 10;
            seen_high |= o > (len - block) * 9 / 10;
        }
    }
    assert!(seen_low && seen_high, "offsets should cover the whole range");
}

#[test]
fn resuming_at_step_k_sees_the_same_batches() {
    let d = TextDataset::from_text(&corpus(), 0.1).unwrap();
    let full: Vec<Vec<i64>> = (0..10)
        .map(|s| d.batch(Split::Train, 4, 8, 3, s).unwrap().0.to_vec().unwrap())
        .collect();
    // a "new process": a fresh dataset, starting at step 6
    let resumed = TextDataset::from_text(&corpus(), 0.1).unwrap();
    for (s, expected) in full.iter().enumerate().skip(6) {
        assert_eq!(
            &resumed
                .batch(Split::Train, 4, 8, 3, s)
                .unwrap()
                .0
                .to_vec::<i64>()
                .unwrap(),
            expected
        );
    }
}

#[test]
fn too_short_split_names_split_and_sizes() {
    let d = TextDataset::from_text(&"abcdefghij".repeat(10), 0.1).unwrap(); // val has 10 tokens
    assert!(d.batch(Split::Val, 2, 9, 0, 0).is_ok());
    let msg = d.batch(Split::Val, 2, 10, 0, 0).unwrap_err().to_string();
    assert!(
        msg.contains("val") && msg.contains("10 tokens") && msg.contains("11"),
        "{msg}"
    );
    let empty_val = TextDataset::from_text("abcdef", 0.0).unwrap();
    assert_eq!(empty_val.num_tokens(Split::Val), 0);
    assert!(empty_val.batch(Split::Val, 1, 1, 0, 0).is_err());
    assert!(d.batch(Split::Train, 0, 4, 0, 0).is_err());
    assert!(d.batch(Split::Train, 4, 0, 0, 0).is_err());
}

#[test]
fn val_fraction_is_validated() {
    for bad in [-0.01, 1.0, 1.5, f64::NAN, f64::INFINITY] {
        let msg = TextDataset::from_text("abc", bad).unwrap_err().to_string();
        assert!(msg.contains("val_fraction"), "{msg}");
    }
}

#[test]
fn from_file_and_tokenizer_reuse() {
    let dir = std::env::temp_dir().join(format!("weft-data-text-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("input.txt");
    std::fs::write(&path, corpus()).unwrap();
    let d = TextDataset::from_file(&path, 0.1).unwrap();
    assert_eq!(
        d.vocab_size(),
        weft_data::CharTokenizer::from_text(&corpus()).vocab_size()
    );
    // a checkpointed tokenizer re-used on the same text gives the same tokens
    let tok = weft_data::CharTokenizer::from_json(&d.tokenizer().to_json()).unwrap();
    let d2 = TextDataset::with_tokenizer(&corpus(), tok, 0.1).unwrap();
    assert_eq!(d2.tokens(Split::Val), d.tokens(Split::Val));
    // text outside the vocabulary is an error
    assert!(TextDataset::with_tokenizer("xyz~", d.tokenizer().clone(), 0.1).is_err());
    let missing = dir.join("missing.txt");
    let msg = TextDataset::from_file(&missing, 0.1).unwrap_err().to_string();
    assert!(msg.contains("missing.txt"), "{msg}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tinyshakespeare_matches_nanogpt() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/tinyshakespeare.txt");
    if !path.exists() {
        println!("skipping tinyshakespeare_matches_nanogpt: {} is absent", path.display());
        return;
    }
    // nanoGPT's shakespeare_char/prepare.py prints: vocab size 65, train 1,003,854 tokens, val 111,540
    let d = TextDataset::from_file(&path, 0.1).unwrap();
    assert_eq!(d.vocab_size(), 65);
    assert_eq!(
        (d.num_tokens(Split::Train), d.num_tokens(Split::Val)),
        (1_003_854, 111_540)
    );
    let (x, _) = d.batch(Split::Val, 12, 1024, 1337, 0).unwrap();
    assert_eq!(x.shape(), &[12, 1024]);
}
