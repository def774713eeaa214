//! A store that lies, and a cache that kept a bad answer (found by probing with a misbehaving
//! S3 server): a response claiming more bytes than weft reads of an object whole is an error
//! naming it before anything is allocated (the process aborted on the allocation); a block the
//! cache kept from a bad answer is read again from the store when it fails its checksum, so the
//! dataset reads once the store serves it right (it failed for good before).

#[path = "support/s3_server.rs"]
mod s3_server;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use s3_server::{S3Server, ACCESS_KEY, SECRET_KEY};
use weft_data::store::{self, CacheOptions, CachedSource, StoreOptions};
use weft_data::tokenizer::CharTokenizer;
use weft_data::tokens::{prepare, PrepareOptions, TokenDataset};
use weft_data::{ObjectSink, ObjectSource, Split, Tokenizer};

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("weft-store-damage-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn options(endpoint: &str) -> StoreOptions {
    StoreOptions {
        retry_for: Duration::from_secs(2),
        config: vec![
            ("aws_endpoint".into(), endpoint.into()),
            ("aws_access_key_id".into(), ACCESS_KEY.into()),
            ("aws_secret_access_key".into(), SECRET_KEY.into()),
            ("aws_region".into(), "us-east-1".into()),
        ],
    }
}

/// A server that answers every request with a head claiming `length` bytes and a short body,
/// then closes the connection.
fn liar(length: u64) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { continue };
            let _ = c.set_read_timeout(Some(Duration::from_millis(500)));
            let mut head = [0u8; 8192];
            let _ = c.read(&mut head);
            let _ = write!(
                c,
                "HTTP/1.1 200 OK\r\nContent-Length: {length}\r\nLast-Modified: Mon, 01 Jan 2024 00:00:00 GMT\r\n\
                 ETag: \"e\"\r\nConnection: close\r\n\r\n{{}}"
            );
        }
    });
    format!("http://127.0.0.1:{port}")
}

#[test]
fn an_object_claiming_more_than_is_read_whole_is_refused_before_it_is_allocated() {
    let s = store::open_with("s3://data/ds", &options(&liar(100_000_000_000))).unwrap();
    let e = s.read("index.json").unwrap_err().to_string();
    assert!(
        e.contains("s3://data/ds/index.json") && e.contains("over the 1073741824 bytes"),
        "{e}"
    );
    // through the block cache, whose length comes from a HEAD that claims 2^62 bytes
    let s = store::open_with("s3://data/ds", &options(&liar(1 << 62))).unwrap();
    let cached = CachedSource::new(
        s,
        CacheOptions {
            dir: scratch("liar-cache"),
            limit_bytes: 1 << 20,
            block_size: 1 << 16,
            read_ahead: 0,
            version: String::new(),
        },
    )
    .unwrap();
    let e = cached.read("index.json").unwrap_err().to_string();
    assert!(e.contains("over the 1073741824 bytes"), "{e}");
}

#[test]
fn a_block_the_cache_kept_from_a_bad_answer_is_read_again_from_the_store() {
    let dir = scratch("poison");
    let server = S3Server::start(&dir.join("server"));
    server.create_bucket("data");
    let s = store::open_with("s3://data/ds", &options(&server.endpoint())).unwrap();
    let text: String = (0..3000).map(|i| ["to be ", "or not ", "that is "][i % 3]).collect();
    let input = dir.join("text.txt");
    std::fs::write(&input, &text).unwrap();
    let tok = Tokenizer::Char(CharTokenizer::from_text(&text));
    let opts = PrepareOptions {
        val_fraction: 0.1,
        shard_tokens: 1 << 20,
        block_bytes: 4096,
        threads: 1,
    };
    prepare(&tok, &[input], &*s, &opts, &mut |_| {}).unwrap();
    let shard = "train-00000.bin";
    let good = s.read(shard).unwrap();
    let mut bad = good.clone();
    bad[5000] ^= 0x01;
    let cache = |tag: &str| CacheOptions {
        dir: dir.join(tag),
        limit_bytes: 1 << 24,
        block_size: 1 << 16,
        read_ahead: 0,
        version: String::new(),
    };
    let open = |tag: &str| TokenDataset::open(Arc::new(CachedSource::new(s.clone(), cache(tag)).unwrap()));
    // the store answers wrong once; the cache keeps that answer
    s.put(shard, &bad).unwrap();
    let e = open("cache")
        .unwrap()
        .read_tokens(Split::Train, 0..4000)
        .unwrap_err()
        .to_string();
    assert!(e.contains("checksum mismatch"), "{e}");
    // the store is right again: the kept block fails its checksum, is read again, and passes
    s.put(shard, &good).unwrap();
    let ds = open("cache").unwrap();
    let ids = ds.read_tokens(Split::Train, 0..4000).unwrap();
    assert_eq!(ids.len(), 4000);
    assert_eq!(
        ids,
        TokenDataset::open(s.clone())
            .unwrap()
            .read_tokens(Split::Train, 0..4000)
            .unwrap()
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
