//! What a store is given from outside, found by probing: an existence check that must not take
//! "could not ask" for "absent" (`weft data prepare` replaced a dataset when the `HEAD` of its
//! `index.json` was refused or the store stayed unavailable); URLs whose prefix holds a space or
//! a non-ASCII character (encoded twice: the keys were `my%20data/...`), or a query (dropped
//! without a word); block-cache entries that are not regular files (a FIFO hung the run, a link
//! to `/dev/zero` read without end). Against the S3-compatible server of `store.rs`.

#[path = "support/s3_server.rs"]
mod s3_server;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use s3_server::{S3Server, ACCESS_KEY, SECRET_KEY};
use weft_data::store::{self, CacheOptions, CachedSource, StoreOptions};
use weft_data::{LocalFolder, ObjectSink, ObjectSource};

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("weft-store-inputs-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn options(endpoint: &str, retry_for: Duration) -> StoreOptions {
    StoreOptions {
        retry_for,
        config: vec![
            ("aws_endpoint".into(), endpoint.into()),
            ("aws_access_key_id".into(), ACCESS_KEY.into()),
            ("aws_secret_access_key".into(), SECRET_KEY.into()),
            ("aws_region".into(), "us-east-1".into()),
        ],
    }
}

/// A server that answers every request with `status` (e.g. `403 Forbidden`) and an empty body,
/// counting the requests (as `liar` in store_damage.rs, with a status of choice).
fn answering(status: &'static str) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { continue };
            count.fetch_add(1, Ordering::Relaxed);
            let _ = c.set_read_timeout(Some(Duration::from_millis(500)));
            let mut head = [0u8; 8192];
            let _ = c.read(&mut head);
            let _ = write!(c, "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    (format!("http://127.0.0.1:{port}"), seen)
}

#[test]
fn only_not_found_means_an_object_is_absent() {
    let dir = scratch("exists");
    let server = S3Server::start(&dir.join("server"));
    server.create_bucket("data");
    let s = store::open_with("s3://data/ds", &options(&server.endpoint(), Duration::from_secs(5))).unwrap();
    assert!(!s.exists("index.json").unwrap(), "nothing there yet");
    s.put("index.json", b"{}").unwrap();
    assert!(s.exists("index.json").unwrap());
    // a bucket that is not there: not found too (the write that follows names it)
    let other = store::open_with("s3://nobucket/ds", &options(&server.endpoint(), Duration::from_secs(5))).unwrap();
    assert!(!other.exists("index.json").unwrap());

    // a HEAD refused (a write-only role): the length fails, as the old check saw it, and so
    // does the question, naming the URL; it is never "absent"
    let (denied, _) = answering("403 Forbidden");
    let s = store::open_with("s3://data/existing", &options(&denied, Duration::from_secs(5))).unwrap();
    assert!(s.len("index.json").is_err());
    let e = s.exists("index.json").unwrap_err().to_string();
    assert!(
        e.contains("s3://data/existing/index.json") && e.contains("access denied") && e.contains("403"),
        "{e}"
    );

    // a store that stays unavailable: retried for the bound, then an error, never "absent"
    let (down, requests) = answering("503 Service Unavailable");
    let s = store::open_with("s3://data/existing", &options(&down, Duration::from_secs(1))).unwrap();
    let t = Instant::now();
    let e = s.exists("index.json").unwrap_err().to_string();
    assert!(
        e.contains("s3://data/existing/index.json") && e.contains("store unavailable") && e.contains("503"),
        "{e}"
    );
    assert!(requests.load(Ordering::Relaxed) >= 2, "retried");
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());

    // a folder: missing (the folder too) is absent; a file, a directory or a broken link is there
    let local = dir.join("local");
    let f = store::open(local.to_str().unwrap()).unwrap();
    assert!(!f.exists("index.json").unwrap());
    f.put("index.json", b"{}").unwrap();
    assert!(f.exists("index.json").unwrap());
    std::fs::remove_file(local.join("index.json")).unwrap();
    std::fs::create_dir(local.join("index.json")).unwrap();
    assert!(f.exists("index.json").unwrap());
    std::fs::remove_dir(local.join("index.json")).unwrap();
    std::os::unix::fs::symlink(dir.join("nowhere"), local.join("index.json")).unwrap();
    assert!(f.exists("index.json").unwrap());
    // a folder that is a file: the question cannot be answered
    std::fs::write(dir.join("plain-file"), b"x").unwrap();
    let g = store::open(dir.join("plain-file").to_str().unwrap()).unwrap();
    let e = g.exists("index.json").unwrap_err().to_string();
    assert!(e.contains("plain-file/index.json"), "{e}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn prefixes_are_decoded_once_and_queries_are_refused() {
    let dir = scratch("urls");
    let root = dir.join("server");
    let server = S3Server::start(&root);
    server.create_bucket("data");
    let opts = options(&server.endpoint(), Duration::from_secs(5));
    // s3s-fs keeps key K of bucket B as the file ROOT/B/K: the folder names are the keys
    for (url, key_folder) in [
        ("s3://data/my data", "my data"),
        ("s3://data/my%20data/b", "my data/b"),
        ("s3://data/d\u{15b}2", "d\u{15b}2"),
        ("s3://data/plain/run", "plain/run"),
        ("s3://data/plain/run/", "plain/run"),
    ] {
        let s = store::open_with(url, &opts).unwrap();
        s.put("index.json", url.as_bytes()).unwrap();
        let file = root.join("data").join(key_folder).join("index.json");
        assert_eq!(
            std::fs::read(&file).unwrap(),
            url.as_bytes(),
            "{url}: {}",
            file.display()
        );
        assert_eq!(s.read("index.json").unwrap(), url.as_bytes(), "{url}");
    }
    assert!(!root.join("data/my%20data").exists(), "no key encoded twice");
    assert!(!root.join("data/d%C5%9B2").exists(), "no key encoded twice");

    // a dataset another tool put under the key "dś2x/": read by either form of its URL
    let theirs = root.join("data").join("d\u{15b}2x");
    std::fs::create_dir_all(&theirs).unwrap();
    std::fs::write(theirs.join("train-00000.bin"), b"0123456789").unwrap();
    for url in ["s3://data/d\u{15b}2x", "s3://data/d%C5%9B2x"] {
        let s = store::open_with(url, &opts).unwrap();
        assert_eq!(s.len("train-00000.bin").unwrap(), 10, "{url}");
        assert_eq!(s.read_range("train-00000.bin", 2..5).unwrap(), b"234", "{url}");
        assert_eq!(
            s.describe("train-00000.bin"),
            "s3://data/d%C5%9B2x/train-00000.bin",
            "the URL form in messages"
        );
    }

    // a query or a fragment is refused, naming the URL, before anything is written
    for url in ["s3://data/q?versionId=abc", "s3://data/q#v2", "s3://data/q?"] {
        let e = store::open_with(url, &opts).unwrap_err().to_string();
        assert!(e.contains(url) && e.contains("cannot hold a"), "{url}: {e}");
    }
    assert!(!root.join("data/q").exists());
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `f` on another thread; a failure when it has not returned within 20 s.
fn within_20s<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{what}: no answer within 20 s"))
}

#[test]
fn cache_entries_that_are_not_files_are_fetched_again_not_read() {
    let dir = scratch("cache-kinds");
    let src = Arc::new(LocalFolder::new(dir.join("src")));
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 31 % 251) as u8).collect();
    src.put("shard.bin", &data).unwrap();
    let cache_dir = dir.join("cache");
    let opts = CacheOptions {
        dir: cache_dir.clone(),
        limit_bytes: 1 << 20,
        block_size: 4096,
        read_ahead: 0,
        version: String::new(),
    };
    let warm = CachedSource::new(src.clone(), opts.clone()).unwrap();
    assert_eq!(warm.read("shard.bin").unwrap(), data);
    drop(warm);
    for kind in ["fifo", "zero"] {
        let entries: Vec<PathBuf> = std::fs::read_dir(&cache_dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "blk"))
            .collect();
        assert_eq!(entries.len(), 4, "3 blocks and the length");
        for p in &entries {
            std::fs::remove_file(p).unwrap();
            if kind == "fifo" {
                assert!(std::process::Command::new("mkfifo").arg(p).status().unwrap().success());
            } else {
                std::os::unix::fs::symlink("/dev/zero", p).unwrap();
            }
        }
        let (src, opts, want) = (src.clone(), opts.clone(), data.clone());
        let stats = within_20s(kind, move || {
            let c = CachedSource::new(src, opts).unwrap();
            assert_eq!(c.read("shard.bin").unwrap(), want);
            c.stats()
        });
        assert_eq!((stats.fetched, stats.hits), (3, 0), "{kind}: {stats:?}");
        // the entries are whole files again
        for p in &entries {
            assert!(
                std::fs::symlink_metadata(p).unwrap().file_type().is_file(),
                "{kind}: {}",
                p.display()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn cache_opts(dir: PathBuf, limit_bytes: u64, block_size: u64) -> CacheOptions {
    CacheOptions {
        dir,
        limit_bytes,
        block_size,
        read_ahead: 0,
        version: String::new(),
    }
}

#[test]
fn a_cache_limit_that_holds_no_whole_entry_is_refused_naming_the_keys() {
    let dir = scratch("cache-one-block");
    let src = Arc::new(LocalFolder::new(dir.join("src")));
    src.put("shard.bin", &[5u8; 3000]).unwrap();
    // an entry is a block and a 20-byte header: a limit of exactly one block cached none
    for limit in [1000, 1019] {
        let e = CachedSource::new(src.clone(), cache_opts(dir.join("cache"), limit, 1000))
            .err()
            .unwrap_or_else(|| panic!("a limit of {limit} bytes for blocks of 1000 was accepted"))
            .to_string();
        assert!(
            e.contains("data.cache_gb") && e.contains("data.cache_block_mb") && e.contains(&format!("({limit} bytes")),
            "{e}"
        );
    }
    // one whole entry fits: the block read is cached and served again
    let c = CachedSource::new(src.clone(), cache_opts(dir.join("cache"), 1020, 1000)).unwrap();
    assert_eq!(c.read_range("shard.bin", 0..10).unwrap(), [5u8; 10]);
    assert_eq!(c.read_range("shard.bin", 10..20).unwrap(), [5u8; 10]);
    assert_eq!((c.stats().fetched, c.stats().hits), (1, 1), "{:?}", c.stats());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_cache_folder_that_cannot_be_created_is_named_with_its_key() {
    let dir = scratch("cache-uncreatable");
    let src = Arc::new(LocalFolder::new(dir.join("src")));
    std::fs::write(dir.join("file"), b"not a folder").unwrap();
    let bad = dir.join("file").join("cache");
    let e = CachedSource::new(src, cache_opts(bad.clone(), 1 << 20, 4096))
        .err()
        .expect("a cache folder under a file was accepted")
        .to_string();
    assert!(
        e.contains(&bad.display().to_string()) && e.contains("block cache folder") && e.contains("data.cache_dir"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
