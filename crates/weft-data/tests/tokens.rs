//! Token datasets: prepare writes shards and index.json; TokenDataset reads them back, verifies
//! them, orders windows by (seed, epoch, position), and refuses damaged or mismatched files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use weft_data::tokens::{prepare, Index, PrepareOptions, WindowOrder, INDEX_NAME};
use weft_data::{CharTokenizer, Gpt2Tokenizer, LocalFolder, ObjectSink, Split, TokenDataset, Tokenizer};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("weft-tokens-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Writes `docs` as files under `d/in` and returns their paths.
fn inputs(d: &Path, docs: &[&str]) -> Vec<PathBuf> {
    let input = d.join("in");
    std::fs::create_dir_all(&input).unwrap();
    docs.iter()
        .enumerate()
        .map(|(i, text)| {
            let p = input.join(format!("doc{i}.txt"));
            std::fs::write(&p, text).unwrap();
            p
        })
        .collect()
}

fn opts(val_fraction: f64, shard_tokens: u64, block_bytes: u64) -> PrepareOptions {
    PrepareOptions {
        val_fraction,
        shard_tokens,
        block_bytes,
        threads: 2,
    }
}

fn open(out: &Path) -> weft_data::Result<TokenDataset> {
    TokenDataset::open(Arc::new(LocalFolder::new(out)))
}

fn err(out: &Path) -> String {
    open(out).unwrap_err().to_string()
}

const DOCS: [&str; 3] = [
    "First Citizen: Before we proceed any further, hear me speak.",
    "All: Speak, speak.",
    "First Citizen: You are all resolved rather to die than to famish?",
];

/// Prepares DOCS with gpt2 into `d/out`, small shards and blocks so that reads cross both.
fn gpt2_dataset(name: &str) -> (PathBuf, Vec<u32>, Vec<u32>) {
    let d = dir(name);
    let files = inputs(&d, &DOCS);
    let out = d.join("out");
    let tok = Tokenizer::Gpt2(Gpt2Tokenizer::new());
    let mut seen = 0;
    prepare(&tok, &files, &LocalFolder::new(&out), &opts(0.25, 7, 8), &mut |b| {
        seen += b
    })
    .unwrap();
    assert_eq!(seen, DOCS.iter().map(|d| d.len() as u64).sum::<u64>());
    // the expected streams: each document cut at floor(0.75 n), each piece followed by <|endoftext|>
    let (mut train, mut val) = (vec![], vec![]);
    for doc in DOCS {
        let ids = tok.encode(doc).unwrap();
        let keep = (ids.len() as f64 * 0.75).floor() as usize;
        train.extend_from_slice(&ids[..keep]);
        train.push(50256);
        val.extend_from_slice(&ids[keep..]);
        val.push(50256);
    }
    (out, train, val)
}

#[test]
fn prepare_then_open_reads_back_both_streams() {
    let (out, train, val) = gpt2_dataset("roundtrip");
    let data = open(&out).unwrap();
    assert_eq!(data.tokenizer().kind(), "gpt2");
    assert_eq!(data.vocab_size(), 50257);
    assert_eq!(data.tokens(Split::Train), train.len() as u64);
    assert_eq!(data.tokens(Split::Val), val.len() as u64);
    assert_eq!(data.read_tokens(Split::Train, 0..train.len() as u64).unwrap(), train);
    assert_eq!(data.read_tokens(Split::Val, 0..val.len() as u64).unwrap(), val);
    // ranges that start and end mid-block and mid-shard
    assert_eq!(data.read_tokens(Split::Train, 5..23).unwrap(), &train[5..23]);
    assert_eq!(data.read_tokens(Split::Train, 6..7).unwrap(), &train[6..7]);
    assert!(data.read_tokens(Split::Train, 0..train.len() as u64 + 1).is_err());
    let index = data.index();
    assert_eq!(index.dtype, weft_data::tokens::TokenDtype::U16);
    assert_eq!(index.eot, Some(50256));
    let shards = &index.splits["train"].shards;
    assert_eq!(shards.len(), train.len().div_ceil(7));
    assert!(shards
        .iter()
        .all(|s| s.crc32.len() as u64 == (s.tokens * 2).div_ceil(8)));
    // a shard holds raw little-endian u16
    let raw = std::fs::read(out.join(&shards[0].name)).unwrap();
    let first: Vec<u32> = raw
        .chunks(2)
        .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
        .collect();
    assert_eq!(first, &train[..7]);
    assert!(data.verify().unwrap() > 0);
    // the text decodes back (train pieces of each document, with separators)
    let text = data.tokenizer().decode(&train).unwrap();
    assert!(
        text.starts_with("First Citizen:") && text.contains("<|endoftext|>All:"),
        "{text}"
    );
}

#[test]
fn batches_are_shifted_windows_in_a_keyed_order() {
    let (out, train, _) = gpt2_dataset("batches");
    let data = open(&out).unwrap();
    let bs = 4;
    let n = data.windows(Split::Train, bs).unwrap();
    assert_eq!(n, (train.len() as u64 - 1) / bs as u64);
    let (x, y) = data.batch(Split::Train, 3, 5, bs, 1337, 0..5).unwrap();
    assert_eq!(x.shape(), &[5, bs]);
    let (x, y) = (x.to_vec::<i64>().unwrap(), y.to_vec::<i64>().unwrap());
    for row in 0..5 {
        let w = data.window(Split::Train, 3, 5, bs, 1337, row).unwrap() as usize;
        assert_eq!(
            w as u64,
            WindowOrder::new(n, 1337, (15 + row as u64) / n).apply((15 + row as u64) % n)
        );
        let want: Vec<i64> = train[w * bs..w * bs + bs + 1].iter().map(|&t| i64::from(t)).collect();
        assert_eq!(&x[row * bs..(row + 1) * bs], &want[..bs], "row {row}");
        assert_eq!(&y[row * bs..(row + 1) * bs], &want[1..], "row {row}");
    }
    // a rank's rows are the same rows of the whole batch
    let (xr, _) = data.batch(Split::Train, 3, 5, bs, 1337, 2..4).unwrap();
    assert_eq!(xr.to_vec::<i64>().unwrap(), &x[2 * bs..4 * bs]);
    // pure function of the arguments; the seed matters
    let (x2, _) = data.batch(Split::Train, 3, 5, bs, 1337, 0..5).unwrap();
    assert_eq!(x2.to_vec::<i64>().unwrap(), x);
    let other: Vec<u64> = (0..n)
        .map(|p| data.window(Split::Train, 0, 1, bs, 7, p as usize).unwrap())
        .collect();
    let this: Vec<u64> = (0..n)
        .map(|p| data.window(Split::Train, 0, 1, bs, 1337, p as usize).unwrap())
        .collect();
    assert_ne!(this, other);
    // every epoch visits every window exactly once
    for epoch in 0..3u64 {
        let mut seen: Vec<u64> = (0..n)
            .map(|i| data.window(Split::Train, epoch * n + i, 1, bs, 1337, 0).unwrap())
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..n).collect::<Vec<_>>(), "epoch {epoch}");
    }
    // evaluation reads the val split
    let (xv, _) = data.batch(Split::Val, 0, 2, 3, 1, 0..2).unwrap();
    assert_eq!(xv.shape(), &[2, 3]);
    // rows outside the batch, and a block longer than the split
    assert!(data.batch(Split::Train, 0, 4, bs, 1, 3..5).is_err());
    let e = data.batch(Split::Val, 0, 1, 1000, 1, 0..1).unwrap_err().to_string();
    assert!(e.contains("\"val\"") && e.contains("1000"), "{e}");
}

#[test]
fn char_datasets_have_no_separator_and_wide_vocabularies_use_u32() {
    let d = dir("char");
    let files = inputs(&d, &["abcabc", "cab"]);
    let tok = Tokenizer::Char(CharTokenizer::from_text("abc"));
    let out = d.join("out");
    let index = prepare(&tok, &files, &LocalFolder::new(&out), &opts(0.0, 100, 4), &mut |_| {}).unwrap();
    assert_eq!(index.eot, None);
    assert_eq!(index.splits["val"].tokens, 0);
    let data = open(&out).unwrap();
    assert_eq!(
        data.read_tokens(Split::Train, 0..9).unwrap(),
        vec![0, 1, 2, 0, 1, 2, 2, 0, 1]
    );
    let e = data.windows(Split::Val, 1).unwrap_err().to_string();
    assert!(e.contains("\"val\"") && e.contains("0 tokens"), "{e}");

    // 70,000 characters: ids past u16
    let chars: Vec<char> = (0x1_0000u32..0x1_0000 + 70_000).filter_map(char::from_u32).collect();
    assert_eq!(chars.len(), 70_000);
    let text: String = chars[69_990..].iter().chain(&chars[..3]).collect();
    let files = inputs(&d.join("wide"), &[&text]);
    let tok = Tokenizer::Char(CharTokenizer::from_chars(chars).unwrap());
    let out = d.join("wide-out");
    let index = prepare(&tok, &files, &LocalFolder::new(&out), &opts(0.0, 100, 8), &mut |_| {}).unwrap();
    assert_eq!(index.dtype, weft_data::tokens::TokenDtype::U32);
    let data = open(&out).unwrap();
    assert_eq!(
        data.read_tokens(Split::Train, 8..13).unwrap(),
        vec![69_998, 69_999, 0, 1, 2]
    );
    assert_eq!(std::fs::metadata(out.join("train-00000.bin")).unwrap().len(), 13 * 4);
}

#[test]
fn a_failed_prepare_writes_no_index() {
    let d = dir("failed");
    let mut files = inputs(&d, &["abc", "abd"]);
    let tok = Tokenizer::Char(CharTokenizer::from_text("abc"));
    let out = d.join("out");
    let e = prepare(&tok, &files, &LocalFolder::new(&out), &opts(0.1, 100, 4), &mut |_| {}).unwrap_err();
    assert!(
        e.to_string().contains("doc1.txt") && e.to_string().contains("'d'"),
        "{e}"
    );
    assert!(!out.join(INDEX_NAME).exists());
    files.push(d.join("absent.txt"));
    files.remove(1);
    let e = prepare(&tok, &files, &LocalFolder::new(&out), &opts(0.1, 100, 4), &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("absent.txt"), "{e}");
    assert!(!out.join(INDEX_NAME).exists());
    std::fs::write(d.join("latin1.txt"), b"caf\xe9").unwrap();
    let e = prepare(
        &tok,
        &[d.join("latin1.txt")],
        &LocalFolder::new(&out),
        &opts(0.1, 100, 4),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("latin1.txt") && e.to_string().contains("UTF-8"),
        "{e}"
    );
    for (bad, words) in [
        (opts(1.0, 100, 4), ["val_fraction", "1"]),
        (opts(0.1, 0, 4), ["shard_tokens", "1"]),
        (opts(0.1, 100, 6), ["block_bytes", "6 is not a positive multiple of 4"]),
        (opts(0.1, 100, 0), ["block_bytes", "0 is not"]),
    ] {
        let e = prepare(&tok, &files[..1], &LocalFolder::new(&out), &bad, &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(words.iter().all(|w| e.contains(w)), "{e}");
    }
    assert!(!out.join(INDEX_NAME).exists());
}

fn read_index(out: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(out.join(INDEX_NAME)).unwrap()).unwrap()
}

fn write_index(out: &Path, v: &serde_json::Value) {
    std::fs::write(out.join(INDEX_NAME), v.to_string()).unwrap();
}

#[test]
fn damaged_datasets_are_refused_naming_the_file() {
    let (out, _, _) = gpt2_dataset("damaged");
    let good = std::fs::read(out.join(INDEX_NAME)).unwrap();
    let shard = out.join("train-00001.bin");
    let shard_bytes = std::fs::read(&shard).unwrap();

    std::fs::remove_file(out.join(INDEX_NAME)).unwrap();
    assert!(err(&out).contains("index.json"));
    std::fs::write(out.join(INDEX_NAME), b"{\"format\": ").unwrap();
    let e = err(&out);
    assert!(e.contains("index.json") && e.contains("not JSON"), "{e}");

    let mut v: serde_json::Value = serde_json::from_slice(&good).unwrap();
    v["version"] = 2.into();
    write_index(&out, &v);
    let e = err(&out);
    assert!(e.contains("index.json") && e.contains("version 2"), "{e}");
    v["version"] = 1.into();
    v["format"] = "other".into();
    write_index(&out, &v);
    assert!(err(&out).contains("\"format\""));
    let mut v: serde_json::Value = serde_json::from_slice(&good).unwrap();
    v["vocab_size"] = 50000.into();
    write_index(&out, &v);
    assert!(err(&out).contains("vocab_size"));
    let mut v: serde_json::Value = serde_json::from_slice(&good).unwrap();
    v["splits"]["train"]["tokens"] = 3.into();
    write_index(&out, &v);
    assert!(err(&out).contains("\"train\""));
    let mut v: serde_json::Value = serde_json::from_slice(&good).unwrap();
    v["block_bytes"] = 6.into();
    write_index(&out, &v);
    let e = err(&out);
    assert!(
        e.contains("index.json") && e.contains("block_bytes: 6 is not a positive multiple of 4"),
        "{e}"
    );
    std::fs::write(out.join(INDEX_NAME), &good).unwrap();
    assert!(open(&out).is_ok());

    // a shard missing, or short
    std::fs::remove_file(&shard).unwrap();
    assert!(err(&out).contains("train-00001.bin"));
    std::fs::write(&shard, &shard_bytes[..shard_bytes.len() - 2]).unwrap();
    let e = err(&out);
    assert!(e.contains("train-00001.bin") && e.contains("bytes"), "{e}");

    // a flipped bit: opens (contents are checked when read), fails on the first read of the block
    let mut flipped = shard_bytes.clone();
    flipped[3] ^= 0x10;
    std::fs::write(&shard, &flipped).unwrap();
    let data = open(&out).unwrap();
    let e = data.read_tokens(Split::Train, 0..20).unwrap_err().to_string();
    assert!(e.contains("train-00001.bin") && e.contains("checksum"), "{e}");
    assert!(data.verify().unwrap_err().to_string().contains("train-00001.bin"));
    // blocks before the damage still read
    assert!(data.read_tokens(Split::Train, 0..7).is_ok());

    // an id past the vocabulary, with a checksum that matches it
    let mut bad = shard_bytes.clone();
    bad[0..2].copy_from_slice(&60000u16.to_le_bytes());
    std::fs::write(&shard, &bad).unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&good).unwrap();
    v["splits"]["train"]["shards"][1]["crc32"][0] = crc32(&bad[..8]).into();
    write_index(&out, &v);
    let data = open(&out).unwrap();
    let e = data.read_tokens(Split::Train, 7..9).unwrap_err().to_string();
    assert!(
        e.contains("train-00001.bin") && e.contains("60000") && e.contains("50257"),
        "{e}"
    );
}

/// CRC-32 (IEEE), bit by bit: an independent check of what prepare records.
fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 { (c >> 1) ^ 0xEDB8_8320 } else { c >> 1 };
        }
    }
    !c
}

#[test]
fn recorded_checksums_are_crc32_of_each_block() {
    let (out, _, _) = gpt2_dataset("crc");
    let index = Index::parse(&std::fs::read(out.join(INDEX_NAME)).unwrap(), "index.json")
        .unwrap()
        .0;
    for split in index.splits.values() {
        for s in &split.shards {
            let bytes = std::fs::read(out.join(&s.name)).unwrap();
            let want: Vec<u32> = bytes.chunks(8).map(crc32).collect();
            assert_eq!(s.crc32, want, "{}", s.name);
        }
    }
    let v = read_index(&out);
    assert_eq!(v["format"], "weft-tokens");
    assert_eq!(v["tokenizer"]["type"], "gpt2");
    assert_eq!(v["val_split"], "per_document");
    // a sink that refuses: the error names the object
    struct Refuse;
    impl ObjectSink for Refuse {
        fn put(&self, name: &str, _: &[u8]) -> weft_data::Result<()> {
            Err(weft_data::Error::Invalid(format!("refused {name}")))
        }
        fn describe(&self, name: &str) -> String {
            name.to_string()
        }
    }
    let files = inputs(&dir("refuse"), &DOCS);
    let tok = Tokenizer::Gpt2(Gpt2Tokenizer::new());
    let e = prepare(&tok, &files, &Refuse, &opts(0.1, 7, 8), &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("train-00000.bin"), "{e}");
}

#[test]
fn datasets_and_tokenizers_can_be_shared_across_threads() {
    fn shared<T: Send + Sync + 'static>() {}
    shared::<TokenDataset>();
    shared::<Tokenizer>();
}

#[test]
fn token_counts_that_overflow_are_refused_naming_index_json_and_the_field() {
    let (out, _, _) = gpt2_dataset("overflow");
    let good: serde_json::Value = read_index(&out);
    let refused = |v: &serde_json::Value, words: &[&str]| {
        write_index(&out, v);
        let e = err(&out);
        assert!(e.contains("index.json"), "{e}");
        for w in words {
            assert!(e.contains(w), "{w:?} not in {e}");
        }
    };
    // 2^63 u16 tokens: 2^64 bytes, one past what 64 bits hold
    let mut v = good.clone();
    let huge = 1u64 << 63;
    v["splits"]["train"]["tokens"] = huge.into();
    v["splits"]["train"]["shards"] = serde_json::json!([
        {"name": "train-00000.bin", "tokens": huge, "crc32": [1, 2]}
    ]);
    refused(&v, &["splits.train.shards[0].tokens", "9223372036854775808", "64 bits"]);
    // two shards whose counts add up past u64::MAX
    let mut v = good.clone();
    v["splits"]["val"]["tokens"] = 8071.into();
    v["splits"]["val"]["shards"] = serde_json::json!([
        {"name": "val-00000.bin", "tokens": 8072, "crc32": [1]},
        {"name": "val-00001.bin", "tokens": u64::MAX, "crc32": [1]}
    ]);
    refused(&v, &["splits.val.shards[1].tokens", "18446744073709551615", "2^64 - 1"]);
}

#[test]
fn an_end_of_text_id_outside_the_vocabulary_is_refused() {
    let (out, _, _) = gpt2_dataset("eot");
    let mut v = read_index(&out);
    for eot in [50257u64, u64::from(u32::MAX)] {
        v["eot"] = eot.into();
        write_index(&out, &v);
        let e = err(&out);
        assert!(
            e.contains("index.json") && e.contains(&format!("eot {eot}")) && e.contains("0..50257"),
            "{e}"
        );
    }
    v["eot"] = 50256.into();
    write_index(&out, &v);
    assert!(open(&out).is_ok());
    v["eot"] = serde_json::Value::Null;
    write_index(&out, &v);
    assert!(open(&out).is_ok());
}

/// A folder whose `len` takes 5 ms, counting the calls in flight at once.
struct SlowLengths {
    inner: LocalFolder,
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

impl weft_data::ObjectSource for SlowLengths {
    fn read_range(&self, name: &str, range: std::ops::Range<u64>) -> weft_data::Result<Vec<u8>> {
        self.inner.read_range(name, range)
    }
    fn read(&self, name: &str) -> weft_data::Result<Vec<u8>> {
        self.inner.read(name)
    }
    fn len(&self, name: &str) -> weft_data::Result<u64> {
        use std::sync::atomic::Ordering::SeqCst;
        let n = self.now.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(n, SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(5));
        self.now.fetch_sub(1, SeqCst);
        self.inner.len(name)
    }
    fn describe(&self, name: &str) -> String {
        weft_data::ObjectSource::describe(&self.inner, name)
    }
}

#[test]
fn shard_lengths_are_asked_for_several_at_once_and_checked_in_order() {
    let d = dir("lengths");
    let text = "to be or not to be that is the question ".repeat(40);
    let files = inputs(&d, &[&text]);
    let out = d.join("out");
    let tok = Tokenizer::Char(CharTokenizer::from_text(&text));
    let index = prepare(&tok, &files, &LocalFolder::new(&out), &opts(0.1, 20, 64), &mut |_| {}).unwrap();
    let shards: usize = index.splits.values().map(|s| s.shards.len()).sum();
    assert!(shards > 40, "{shards} shards");
    let slow = Arc::new(SlowLengths {
        inner: LocalFolder::new(&out),
        now: Default::default(),
        most: Default::default(),
    });
    let ds = TokenDataset::open(slow.clone()).unwrap();
    assert_eq!(
        ds.read_tokens(Split::Train, 0..100).unwrap(),
        open(&out).unwrap().read_tokens(Split::Train, 0..100).unwrap()
    );
    let most = slow.most.load(std::sync::atomic::Ordering::SeqCst);
    assert!(most > 1, "one length at a time");
    // of two shards whose lengths disagree, the first in the index's order is named, whichever
    // length came back first
    let shards = &index.splits["train"].shards;
    let (second, later) = (&shards[1].name, &shards[shards.len() - 2].name);
    std::fs::write(out.join(later), b"xxx").unwrap();
    std::fs::write(out.join(second), b"xx").unwrap();
    for _ in 0..5 {
        let e = err(&out);
        assert!(e.contains(second.as_str()) && e.contains("2 bytes"), "{e}");
    }
}
