//! `az://` and `gs://` stores against real local emulators, each started by the test on a free
//! loopback port with a fresh container or bucket: reads and writes, errors that name the URL, and
//! token shards prepared into the emulator and read back as batches, the same as from a local
//! folder.
//!
//! - Azure Blob Storage: Azurite, for everything (writes through weft's store).
//! - Google Cloud Storage: fake-gcs-server, for reads only: objects go in through its own JSON
//!   upload API, as it refuses the XML API's plain PUT that object_store writes with (so weft's
//!   `put` to `gs://` is not tested here).
//!
//! The emulators come from `tools/store-emulators/install.sh`; without one, its tests print one
//! `skipped: ...` line and return.

#[path = "support/emulators.rs"]
mod emulators;
#[path = "support/same_dataset.rs"]
mod same_dataset;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use emulators::{Azurite, FakeGcs};
use weft_data::store::{self, CacheOptions, CachedSource, Store};
use weft_data::tokens::{prepare, PrepareOptions, INDEX_NAME};
use weft_data::{Gpt2Tokenizer, LocalFolder, ObjectSink, ObjectSource, TokenDataset, Tokenizer};

/// A fresh folder for one test.
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("weft-cloud-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `n` bytes that differ from block to block.
fn pattern(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

/// Azurite with container `data`, and the store `az://data/run` on it.
fn azure(retry_for: Duration) -> Option<(Azurite, Arc<Store>)> {
    let az = Azurite::start()?;
    az.create_container("data").unwrap();
    let s = store::open_with("az://data/run", &az.options(retry_for)).unwrap();
    Some((az, s))
}

/// fake-gcs-server with bucket `data`, and the store `gs://data/run` on it.
fn fake_gcs(retry_for: Duration) -> Option<(FakeGcs, Arc<Store>)> {
    let gs = FakeGcs::start()?;
    gs.create_bucket("data").unwrap();
    let s = store::open_with("gs://data/run", &gs.options(retry_for)).unwrap();
    Some((gs, s))
}

/// Objects written under `run/` of bucket `data` of fake-gcs-server through its JSON upload API.
struct FakeGcsUpload<'a>(&'a FakeGcs);

impl ObjectSink for FakeGcsUpload<'_> {
    fn put(&self, name: &str, bytes: &[u8]) -> weft_data::Result<()> {
        self.0
            .upload("data", &format!("run/{name}"), bytes)
            .map_err(weft_data::Error::Invalid)
    }

    fn describe(&self, name: &str) -> String {
        format!("gs://data/run/{name}")
    }
}

/// Checks what [`SHARD`] (holding `data`) and [`EMPTY`] (empty) of `s`, opened at `root`, read
/// back: whole, their lengths, byte ranges, and ranges past the end refused naming the object.
fn reads_back(s: &Store, root: &str, data: &[u8]) {
    assert_eq!(s.read(SHARD).unwrap(), data);
    assert_eq!(s.len(SHARD).unwrap(), data.len() as u64);
    let n = data.len() as u64;
    for r in [0..1u64, 5..17, 65_536..n - 1, n - 1..n, 0..n, 40..40] {
        let got = s.read_range(SHARD, r.clone()).unwrap();
        assert_eq!(got, &data[r.start as usize..r.end as usize], "{r:?}");
    }
    assert_eq!(s.read(EMPTY).unwrap(), b"");
    assert_eq!(s.len(EMPTY).unwrap(), 0);
    let shard = format!("{root}/{SHARD}");
    for r in [n - 10..n + 1, n..n + 10, n + 1..n + 1] {
        let e = s.read_range(SHARD, r.clone()).unwrap_err().to_string();
        assert!(e.contains("past the end") && e.contains(&shard), "{r:?}: {e}");
    }
    assert_eq!(s.describe("a.bin"), format!("{root}/a.bin"));
}

/// The object [`reads_back`] reads whole and by range.
const SHARD: &str = "shards/train-00000.bin";
/// The empty object [`reads_back`] reads.
const EMPTY: &str = "empty.bin";

/// A missing object in `s` (opened at `root`) and any object of `other` (a store in a container or
/// bucket that does not exist, opened at `other_root`) fail at once, naming their URLs.
fn missing_is_named_at_once(s: &Store, root: &str, other: &Store, other_root: &str) {
    let t = Instant::now();
    let e = s.read("nope.bin").unwrap_err().to_string();
    assert!(
        e.contains(&format!("{root}/nope.bin")) && e.contains("not found"),
        "{e}"
    );
    let e = s.len("nope.bin").unwrap_err().to_string();
    assert!(
        e.contains(&format!("{root}/nope.bin")) && e.contains("not found"),
        "{e}"
    );
    let e = s.read_range("nope.bin", 0..10).unwrap_err().to_string();
    assert!(
        e.contains(&format!("{root}/nope.bin")) && e.contains("not found"),
        "{e}"
    );
    let e = other.read("a.bin").unwrap_err().to_string();
    assert!(
        e.contains(&format!("{other_root}/a.bin")) && e.contains("not found"),
        "{e}"
    );
    assert!(!e.contains('\n'), "one line: {e}");
    assert!(t.elapsed() < Duration::from_secs(5), "not retried: {:?}", t.elapsed());
}

const DOCS: [&str; 3] = [
    "First Citizen: Before we proceed any further, hear me speak.",
    "All: Speak, speak.",
    "First Citizen: You are all resolved rather to die than to famish?",
];

/// Prepares DOCS with gpt2 through `sink` (which writes where `remote` reads) and into a local
/// folder under `dir` (small shards and blocks, so that reads cross both); the objects must be the
/// same bytes, and the dataset opened from the remote store (plainly, and through the block cache
/// as training opens it) must give the same tokens and batches as the local one.
fn token_shards_read_as_from_a_folder(sink: &dyn ObjectSink, remote: Arc<Store>, dir: &Path) {
    let input = dir.join("in");
    std::fs::create_dir_all(&input).unwrap();
    let files: Vec<PathBuf> = DOCS
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let p = input.join(format!("doc{i}.txt"));
            std::fs::write(&p, text).unwrap();
            p
        })
        .collect();
    let tok = Tokenizer::Gpt2(Gpt2Tokenizer::new());
    let opts = PrepareOptions {
        val_fraction: 0.25,
        shard_tokens: 7,
        block_bytes: 8,
        threads: 2,
    };
    let local_dir = dir.join("local");
    let local_index = prepare(&tok, &files, &LocalFolder::new(&local_dir), &opts, &mut |_| {}).unwrap();
    let remote_index = prepare(&tok, &files, sink, &opts, &mut |_| {}).unwrap();
    assert_eq!(remote_index, local_index);
    let index_bytes = remote.read(INDEX_NAME).unwrap();
    assert_eq!(index_bytes, std::fs::read(local_dir.join(INDEX_NAME)).unwrap());
    let shards: Vec<&str> = local_index
        .splits
        .values()
        .flat_map(|s| s.shards.iter().map(|s| s.name.as_str()))
        .collect();
    assert!(shards.len() > 2, "{shards:?}");
    for name in &shards {
        assert_eq!(
            remote.read(name).unwrap(),
            std::fs::read(local_dir.join(name)).unwrap(),
            "{name}"
        );
    }

    let local = TokenDataset::open(Arc::new(LocalFolder::new(&local_dir))).unwrap();
    let plain = TokenDataset::open(remote.clone()).unwrap();
    let cache = CacheOptions {
        dir: dir.join("cache"),
        limit_bytes: 1 << 20,
        block_size: 16,
        read_ahead: 2,
        version: "v1".into(),
    };
    let cached = TokenDataset::open_with_index(
        Arc::new(CachedSource::new(remote.clone(), cache).unwrap()),
        &index_bytes,
    )
    .unwrap();
    for ds in [&plain, &cached] {
        same_dataset::assert_reads_alike(ds, &local, 3, 4);
    }
}

#[test]
fn azure_put_then_read_whole_and_by_range() {
    let Some((_az, s)) = azure(Duration::from_secs(10)) else {
        return;
    };
    let data = pattern(100_000, 1);
    s.put(SHARD, &data).unwrap();
    s.put(EMPTY, b"").unwrap();
    reads_back(&s, "az://data/run", &data);
    // replacing an object replaces it whole
    s.put("index.json", b"{\"shards\": 1}").unwrap();
    s.put("index.json", b"{}").unwrap();
    assert_eq!(s.read("index.json").unwrap(), b"{}");
}

#[test]
fn azure_a_missing_object_or_container_is_named_at_once() {
    let Some((az, s)) = azure(Duration::from_secs(60)) else {
        return;
    };
    let other = store::open_with("az://no-such-container/x", &az.options(Duration::from_secs(60))).unwrap();
    missing_is_named_at_once(&s, "az://data/run", &other, "az://no-such-container/x");
}

#[test]
fn azure_a_wrong_account_key_is_named_at_once() {
    let Some((az, s)) = azure(Duration::from_secs(60)) else {
        return;
    };
    s.put("a.bin", b"abc").unwrap();
    // a well-formed key that is not the account's
    let wrong = emulators::base64_encode(&[7u8; 64]);
    let bad = store::open_with("az://data/run", &az.options_with_key(&wrong, Duration::from_secs(60))).unwrap();
    let t = Instant::now();
    let e = bad.read("a.bin").unwrap_err().to_string();
    assert!(e.contains("az://data/run/a.bin") && e.contains("access denied"), "{e}");
    let e = bad.put("b.bin", b"x").unwrap_err().to_string();
    assert!(e.contains("az://data/run/b.bin") && e.contains("access denied"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "not retried: {:?}", t.elapsed());
    let e = s.read("b.bin").unwrap_err().to_string();
    assert!(e.contains("not found"), "nothing was written: {e}");
}

#[test]
fn azure_token_shards_read_as_from_a_local_folder() {
    let Some((_az, s)) = azure(Duration::from_secs(10)) else {
        return;
    };
    let dir = scratch("az-tokens");
    token_shards_read_as_from_a_folder(&*s, s.clone(), &dir);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gcs_reads_whole_and_by_range() {
    let Some((gs, s)) = fake_gcs(Duration::from_secs(10)) else {
        return;
    };
    let data = pattern(100_000, 1);
    gs.upload("data", &format!("run/{SHARD}"), &data).unwrap();
    gs.upload("data", &format!("run/{EMPTY}"), b"").unwrap();
    reads_back(&s, "gs://data/run", &data);
}

#[test]
fn gcs_a_missing_object_or_bucket_is_named_at_once() {
    let Some((gs, s)) = fake_gcs(Duration::from_secs(60)) else {
        return;
    };
    let other = store::open_with("gs://no-such-bucket/x", &gs.options(Duration::from_secs(60))).unwrap();
    missing_is_named_at_once(&s, "gs://data/run", &other, "gs://no-such-bucket/x");
}

#[test]
fn gcs_token_shards_read_as_from_a_local_folder() {
    let Some((gs, s)) = fake_gcs(Duration::from_secs(10)) else {
        return;
    };
    let dir = scratch("gs-tokens");
    token_shards_read_as_from_a_folder(&FakeGcsUpload(&gs), s, &dir);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn signing_helpers_match_known_values() {
    // RFC 4231, test case 2
    let mac = emulators::hmac_sha256(b"Jefe", b"what do ya want for nothing?");
    let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    for (plain, coded) in [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foobar", "Zm9vYmFy"),
    ] {
        assert_eq!(emulators::base64_encode(plain.as_bytes()), coded);
        assert_eq!(emulators::base64_decode(coded).unwrap(), plain.as_bytes());
    }
    assert_eq!(emulators::base64_decode(emulators::AZURITE_KEY).unwrap().len(), 64);
    assert!(emulators::base64_decode("not base64!").is_none());
    let t = |s| UNIX_EPOCH + Duration::from_secs(s);
    assert_eq!(emulators::http_date(t(0)), "Thu, 01 Jan 1970 00:00:00 GMT");
    assert_eq!(emulators::http_date(t(951_782_400)), "Tue, 29 Feb 2000 00:00:00 GMT");
    assert_eq!(emulators::http_date(t(1_796_416_299)), "Fri, 04 Dec 2026 20:31:39 GMT");
}
