//! Object storage against a real S3-compatible server (s3s-fs, started by each test on a free
//! loopback port with a fresh bucket): reads and writes, errors that name the URL, retries through
//! an outage and through 503s, and the on-disk block cache.

#[path = "support/s3_server.rs"]
mod s3_server;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use s3_server::{FlakyFront, S3Server, ACCESS_KEY, SECRET_KEY};
use weft_data::store::{self, CacheOptions, CachedSource, Store, StoreOptions};
use weft_data::{ObjectSink, ObjectSource};

/// A fresh folder for one test.
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("weft-store-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Settings for `endpoint` with the server's credentials (or `secret` instead of its secret).
fn options(endpoint: &str, secret: &str, retry_for: Duration) -> StoreOptions {
    StoreOptions {
        retry_for,
        config: vec![
            ("aws_endpoint".into(), endpoint.into()),
            ("aws_access_key_id".into(), ACCESS_KEY.into()),
            ("aws_secret_access_key".into(), secret.into()),
            ("aws_region".into(), "us-east-1".into()),
        ],
    }
}

/// A server with bucket `data`, and the store `s3://data/run` on it.
fn server_and_store(tag: &str, retry_for: Duration) -> (S3Server, Arc<Store>, PathBuf) {
    let dir = scratch(tag);
    let server = S3Server::start(&dir.join("server"));
    server.create_bucket("data");
    let s = store::open_with("s3://data/run", &options(&server.endpoint(), SECRET_KEY, retry_for)).unwrap();
    (server, s, dir)
}

/// `n` bytes that differ from block to block.
fn pattern(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

fn cache_options(dir: PathBuf, block: u64, limit: u64, read_ahead: usize) -> CacheOptions {
    CacheOptions {
        dir,
        limit_bytes: limit,
        block_size: block,
        read_ahead,
        version: String::new(),
    }
}

#[test]
fn put_then_read_whole_and_by_range() {
    let (_server, s, dir) = server_and_store("rw", Duration::from_secs(10));
    let data = pattern(100_000, 1);
    s.put("shards/train-00000.bin", &data).unwrap();
    s.put("index.json", b"{\"shards\": 1}").unwrap();
    assert_eq!(s.read("shards/train-00000.bin").unwrap(), data);
    assert_eq!(s.read("index.json").unwrap(), b"{\"shards\": 1}");
    assert_eq!(s.len("shards/train-00000.bin").unwrap(), 100_000);
    for r in [0..1u64, 5..17, 65_536..99_999, 99_999..100_000, 0..100_000, 40..40] {
        let got = s.read_range("shards/train-00000.bin", r.clone()).unwrap();
        assert_eq!(got, &data[r.start as usize..r.end as usize], "{r:?}");
    }
    // replacing an object replaces it whole
    s.put("index.json", b"{}").unwrap();
    assert_eq!(s.read("index.json").unwrap(), b"{}");
    // the objects really are on the server, under the prefix
    assert!(dir.join("server/data/run/shards/train-00000.bin").is_file());
    for r in [99_990..100_001u64, 100_000..100_010, 100_001..100_001] {
        let e = s.read_range("shards/train-00000.bin", r).unwrap_err().to_string();
        assert!(
            e.contains("past the end") && e.contains("s3://data/run/shards/train-00000.bin"),
            "{e}"
        );
    }
    #[allow(clippy::reversed_empty_ranges)]
    let e = s.read_range("shards/train-00000.bin", 10..5).unwrap_err().to_string();
    assert!(
        e.contains("reversed") && e.contains("s3://data/run/shards/train-00000.bin"),
        "{e}"
    );
    assert_eq!(s.describe("a.bin"), "s3://data/run/a.bin");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_missing_object_or_bucket_is_named_at_once() {
    let (server, s, dir) = server_and_store("missing", Duration::from_secs(60));
    let t = Instant::now();
    let e = s.read("nope.bin").unwrap_err().to_string();
    assert!(e.contains("s3://data/run/nope.bin") && e.contains("not found"), "{e}");
    let e = s.len("nope.bin").unwrap_err().to_string();
    assert!(e.contains("s3://data/run/nope.bin"), "{e}");
    let other = store::open_with(
        "s3://no-such-bucket/x",
        &options(&server.endpoint(), SECRET_KEY, Duration::from_secs(60)),
    )
    .unwrap();
    let e = other.read("a.bin").unwrap_err().to_string();
    assert!(e.contains("s3://no-such-bucket/x/a.bin"), "{e}");
    assert!(!e.contains('\n'), "one line: {e}");
    assert!(t.elapsed() < Duration::from_secs(5), "not retried: {:?}", t.elapsed());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_credentials_are_named_at_once() {
    let (server, s, dir) = server_and_store("creds", Duration::from_secs(60));
    s.put("a.bin", b"abc").unwrap();
    let bad = store::open_with(
        "s3://data/run",
        &options(&server.endpoint(), "wrong-secret", Duration::from_secs(60)),
    )
    .unwrap();
    let t = Instant::now();
    let e = bad.read("a.bin").unwrap_err().to_string();
    assert!(e.contains("s3://data/run/a.bin") && e.contains("access denied"), "{e}");
    let e = bad.put("b.bin", b"x").unwrap_err().to_string();
    assert!(e.contains("s3://data/run/b.bin") && e.contains("access denied"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "not retried: {:?}", t.elapsed());
    assert!(!dir.join("server/data/run/b.bin").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_unreachable_endpoint_is_named_within_the_retry_bound() {
    // a port that was free a moment ago: connections are refused
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let s = store::open_with("s3://data/run", &options(&endpoint, SECRET_KEY, Duration::from_secs(2))).unwrap();
    let t = Instant::now();
    let e = s.read("a.bin").unwrap_err().to_string();
    let took = t.elapsed();
    assert!(e.contains("s3://data/run/a.bin") && e.contains("gave up after"), "{e}");
    assert!(
        took >= Duration::from_millis(1000) && took < Duration::from_secs(4),
        "{took:?}: {e}"
    );
    assert!(!e.contains('\n'), "one line: {e}");

    // a ranged read gives up within one bound too (not one for the read and one for a length)
    let t = Instant::now();
    let e = s.read_range("a.bin", 0..10).unwrap_err().to_string();
    let took = t.elapsed();
    assert!(e.contains("s3://data/run/a.bin") && e.contains("gave up after"), "{e}");
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_millis(3500),
        "{took:?}: {e}"
    );
}

#[test]
fn reads_are_retried_while_the_server_is_down_for_3_s() {
    let (mut server, s, dir) = server_and_store("outage", Duration::from_secs(30));
    let data = pattern(300_000, 2);
    s.put("shard.bin", &data).unwrap();
    let reader = {
        let s = s.clone();
        let data = data.clone();
        std::thread::spawn(move || {
            let t = Instant::now();
            let mut longest = Duration::ZERO;
            let mut n = 0u64;
            while t.elapsed() < Duration::from_secs(6) {
                let start = (n * 7919) % 290_000;
                let r = start..start + 10_000;
                let one = Instant::now();
                let got = s.read_range("shard.bin", r.clone()).unwrap();
                longest = longest.max(one.elapsed());
                assert_eq!(got, &data[r.start as usize..r.end as usize]);
                n += 1;
            }
            (n, longest)
        })
    };
    std::thread::sleep(Duration::from_millis(800));
    server.stop();
    std::thread::sleep(Duration::from_secs(3));
    server.resume();
    let (n, longest) = reader.join().unwrap();
    assert!(n > 10, "{n} reads");
    assert!(
        longest >= Duration::from_secs(2),
        "a read waited through the outage: {longest:?}"
    );
    assert_eq!(s.read("shard.bin").unwrap(), data);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn responses_503_are_retried_then_reported_past_the_bound() {
    let (server, s, dir) = server_and_store("503", Duration::from_secs(10));
    s.put("a.bin", b"0123456789").unwrap();
    let front = FlakyFront::start(server.port(), 3);
    let via = store::open_with(
        "s3://data/run",
        &options(&front.endpoint(), SECRET_KEY, Duration::from_secs(10)),
    )
    .unwrap();
    assert_eq!(via.read_range("a.bin", 2..6).unwrap(), b"2345");
    assert_eq!(front.failed.load(std::sync::atomic::Ordering::Relaxed), 3);

    let always = FlakyFront::start(server.port(), usize::MAX);
    let via = store::open_with(
        "s3://data/run",
        &options(&always.endpoint(), SECRET_KEY, Duration::from_secs(1)),
    )
    .unwrap();
    let t = Instant::now();
    let e = via.read("a.bin").unwrap_err().to_string();
    assert!(
        e.contains("s3://data/run/a.bin") && e.contains("503") && e.contains("gave up"),
        "{e}"
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_cache_serves_a_second_read_without_the_server() {
    let (mut server, s, dir) = server_and_store("cache-offline", Duration::from_secs(1));
    let data = pattern(10_000, 3);
    s.put("shard.bin", &data).unwrap();
    let opts = cache_options(dir.join("cache"), 1024, 1 << 20, 0);
    let c = CachedSource::new(s.clone(), opts.clone()).unwrap();
    assert_eq!(c.read_range("shard.bin", 1000..9000).unwrap(), &data[1000..9000]);
    assert_eq!(c.read("shard.bin").unwrap(), data);
    let st = c.stats();
    assert_eq!(st.fetched, 10, "each block fetched once: {st:?}");
    assert!(st.hits >= 7, "{st:?}");
    server.stop();
    // another process (a new cache over the same folder) reads it with the server gone
    let c2 = CachedSource::new(s.clone(), opts).unwrap();
    assert_eq!(c2.len("shard.bin").unwrap(), 10_000);
    assert_eq!(c2.read("shard.bin").unwrap(), data);
    assert_eq!(c2.read_range("shard.bin", 3333..4444).unwrap(), &data[3333..4444]);
    assert_eq!(c2.stats().fetched, 0);
    // what was never cached fails, naming the object
    let e = c2.read("other.bin").unwrap_err().to_string();
    assert!(e.contains("s3://data/run/other.bin"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_cache_stays_within_its_size_limit() {
    let (_server, s, dir) = server_and_store("cache-limit", Duration::from_secs(5));
    let data = pattern(20 * 1024, 4);
    s.put("shard.bin", &data).unwrap();
    let limit = 4 * (1024 + 64);
    let c = CachedSource::new(s.clone(), cache_options(dir.join("cache"), 1024, limit, 0)).unwrap();
    for i in 0..20u64 {
        let r = i * 1024..(i + 1) * 1024;
        assert_eq!(
            c.read_range("shard.bin", r.clone()).unwrap(),
            &data[r.start as usize..r.end as usize]
        );
        assert!(
            c.cached_bytes() <= limit,
            "{} > {limit} after block {i}",
            c.cached_bytes()
        );
    }
    assert!(
        c.cached_bytes() >= 2 * 1024,
        "recent blocks are kept: {}",
        c.cached_bytes()
    );
    // the most recent block is a hit, the first is long gone
    let before = c.stats();
    c.read_range("shard.bin", 19 * 1024..20 * 1024).unwrap();
    assert_eq!(c.stats().hits, before.hits + 1);
    c.read_range("shard.bin", 0..1024).unwrap();
    assert_eq!(c.stats().fetched, before.fetched + 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_corrupted_cache_block_is_detected_and_fetched_again() {
    let (mut server, s, dir) = server_and_store("cache-corrupt", Duration::from_secs(1));
    let data = pattern(4096, 5);
    s.put("shard.bin", &data).unwrap();
    let opts = cache_options(dir.join("cache"), 4096, 1 << 20, 0);
    let c = CachedSource::new(s.clone(), opts).unwrap();
    assert_eq!(c.read("shard.bin").unwrap(), data);
    let blocks: Vec<PathBuf> = std::fs::read_dir(dir.join("cache"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| std::fs::metadata(p).unwrap().len() > 4096)
        .collect();
    assert_eq!(blocks.len(), 1, "{blocks:?}");
    let corrupt = |p: &PathBuf| {
        let mut raw = std::fs::read(p).unwrap();
        let i = raw.len() / 2;
        raw[i] ^= 0x40;
        std::fs::write(p, &raw).unwrap();
    };
    corrupt(&blocks[0]);
    assert_eq!(c.read("shard.bin").unwrap(), data, "fetched again, not served corrupt");
    assert_eq!(c.stats().corrupt, 1);
    assert_eq!(c.stats().fetched, 2);
    // the block was rewritten whole: served from the cache again with the server gone
    server.stop();
    assert_eq!(c.read("shard.bin").unwrap(), data);
    // corrupt again with no server: an error naming the object, never wrong bytes
    corrupt(&blocks[0]);
    let e = c.read("shard.bin").unwrap_err().to_string();
    assert!(e.contains("s3://data/run/shard.bin"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn read_ahead_and_prefetch_fill_the_cache_before_the_reads() {
    let (mut server, s, dir) = server_and_store("cache-ahead", Duration::from_secs(1));
    let data = pattern(16 * 1024, 6);
    s.put("a.bin", &data).unwrap();
    s.put("b.bin", &data[..8 * 1024]).unwrap();
    let c = CachedSource::new(s.clone(), cache_options(dir.join("cache"), 1024, 1 << 20, 3)).unwrap();
    // two sequential reads: blocks 2, 3 and 4 come ahead
    c.read_range("a.bin", 0..1024).unwrap();
    c.read_range("a.bin", 1024..2048).unwrap();
    // a hint for b.bin's second half
    c.prefetch("b.bin", 4096..8192);
    c.wait_prefetched();
    let st = c.stats();
    assert_eq!(st.fetched_ahead, 3 + 4, "{st:?}");
    server.stop();
    assert_eq!(c.read_range("a.bin", 2048..5 * 1024).unwrap(), &data[2048..5 * 1024]);
    assert_eq!(c.read_range("b.bin", 4096..8192).unwrap(), &data[4096..8192]);
    assert_eq!(c.stats().fetched, st.fetched, "served from the cache");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ranks_sharing_one_cache_folder_read_the_right_bytes() {
    let (_server, s, dir) = server_and_store("cache-shared", Duration::from_secs(10));
    let data = pattern(64 * 1024, 7);
    s.put("shard.bin", &data).unwrap();
    // a limit that forces eviction while others read and write
    let opts = cache_options(dir.join("cache"), 2048, 10 * 2048, 2);
    let ranks: Vec<_> = (0..4u64)
        .map(|rank| {
            let (s, opts, data) = (s.clone(), opts.clone(), data.clone());
            std::thread::spawn(move || {
                let c = CachedSource::new(s, opts).unwrap();
                for k in 0..60u64 {
                    let start = (k * 3571 + rank * 997) % (60 * 1024);
                    let r = start..start + 3000;
                    let got = c.read_range("shard.bin", r.clone()).unwrap();
                    assert_eq!(got, &data[r.start as usize..r.end as usize], "rank {rank} {r:?}");
                }
            })
        })
        .collect();
    for r in ranks {
        r.join().unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_server_that_never_answers_is_given_up_within_the_retry_bound() {
    // accepts connections and reads, never answers
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn);
            if held.len() > 100 {
                break;
            }
        }
    });
    let endpoint = format!("http://127.0.0.1:{port}");
    let s = store::open_with("s3://data/run", &options(&endpoint, SECRET_KEY, Duration::from_secs(2))).unwrap();
    let t = Instant::now();
    let e = s.read("a.bin").unwrap_err().to_string();
    let took = t.elapsed();
    assert!(
        e.contains("s3://data/run/a.bin") && e.contains("no answer within"),
        "{e}"
    );
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(4),
        "{took:?}: {e}"
    );
}

#[test]
fn a_cache_limit_smaller_than_a_block_is_refused() {
    let src = Arc::new(weft_data::LocalFolder::new(scratch("cache-bad")));
    let dir = scratch("cache-bad-dir");
    let e = CachedSource::new(src, cache_options(dir.clone(), 4096, 1000, 0))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("1000") && e.contains("4096") && e.contains(&dir.display().to_string()),
        "{e}"
    );
}

/// Environment of a child process started by `processes_sharing_one_cache_folder_...`.
const CHILD_ENV: &str = "WEFT_STORE_TEST_CHILD";

#[test]
fn processes_sharing_one_cache_folder_read_the_right_bytes() {
    let (server, s, dir) = server_and_store("cache-procs", Duration::from_secs(10));
    let data = pattern(64 * 1024, 8);
    s.put("shard.bin", &data).unwrap();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..3)
        .map(|rank| {
            std::process::Command::new(&exe)
                .args([
                    "--ignored",
                    "--exact",
                    "child_rank_reads_through_a_shared_cache",
                    "--test-threads=1",
                ])
                .env(
                    CHILD_ENV,
                    format!("{}|{}|{rank}", server.endpoint(), dir.join("cache").display()),
                )
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // all three run at once
    for (rank, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains("1 passed"), "rank {rank}: {text}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// One rank of the test above; run only as its child process.
#[test]
#[ignore = "run as a child process by processes_sharing_one_cache_folder_read_the_right_bytes"]
fn child_rank_reads_through_a_shared_cache() {
    use std::io::Write;
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        writeln!(
            std::io::stderr(),
            "skipped: runs only as a child of processes_sharing_one_cache_folder_read_the_right_bytes"
        )
        .unwrap();
        return;
    };
    let parts: Vec<&str> = spec.split('|').collect();
    let (endpoint, cache, rank): (&str, &str, u64) = (parts[0], parts[1], parts[2].parse().unwrap());
    let s = store::open_with("s3://data/run", &options(endpoint, SECRET_KEY, Duration::from_secs(10))).unwrap();
    let data = pattern(64 * 1024, 8);
    // a limit that forces eviction while the other processes read and write
    let c = CachedSource::new(s, cache_options(PathBuf::from(cache), 2048, 10 * 2048, 2)).unwrap();
    for k in 0..80u64 {
        let start = (k * 3571 + rank * 997) % (60 * 1024);
        let r = start..start + 3000;
        let got = c.read_range("shard.bin", r.clone()).unwrap();
        assert_eq!(got, &data[r.start as usize..r.end as usize], "rank {rank} {r:?}");
    }
}

/// Marks a child process started by `the_environment_alone_configures_an_s3_compatible_store`.
const ENV_CHILD: &str = "WEFT_STORE_TEST_ENV_CHILD";

#[test]
fn the_environment_alone_configures_an_s3_compatible_store() {
    let (server, s, dir) = server_and_store("env", Duration::from_secs(10));
    s.put("from-env.bin", b"configured by AWS_* variables").unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_opens_the_store_from_the_environment",
            "--test-threads=1",
        ])
        .env_clear()
        .env(ENV_CHILD, "1")
        .env("AWS_ENDPOINT_URL", server.endpoint()) // plain http, without AWS_ALLOW_HTTP
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_REGION", "us-east-1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The child of the test above: `store::open` with nothing but the environment.
#[test]
#[ignore = "run as a child process by the_environment_alone_configures_an_s3_compatible_store"]
fn child_opens_the_store_from_the_environment() {
    use std::io::Write;
    if std::env::var_os(ENV_CHILD).is_none() {
        writeln!(
            std::io::stderr(),
            "skipped: runs only as a child of the_environment_alone_configures_an_s3_compatible_store"
        )
        .unwrap();
        return;
    }
    let s = store::open("s3://data/run").unwrap();
    assert_eq!(s.read("from-env.bin").unwrap(), b"configured by AWS_* variables");
    s.put("written-from-env.bin", b"ok").unwrap();
    assert_eq!(s.read_range("written-from-env.bin", 0..2).unwrap(), b"ok");
}
