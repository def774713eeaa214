//! `http(s)://` datasets: token shards prepared into a folder, served by a real static-file web
//! server on loopback (byte ranges, no listing, no writes), read back through `store::open`
//! exactly as from the folder; a missing object and a server that is gone are named by URL.

#[path = "support/http_server.rs"]
mod http_server;
#[path = "support/same_dataset.rs"]
mod same_dataset;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_server::HttpServer;
use weft_data::store::{self, StoreOptions};
use weft_data::tokens::{prepare, PrepareOptions};
use weft_data::{Gpt2Tokenizer, LocalFolder, ObjectSink, ObjectSource, TokenDataset, Tokenizer};

/// A fresh folder for one test.
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("weft-http-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn options(retry_for: Duration) -> StoreOptions {
    StoreOptions {
        retry_for,
        config: Vec::new(),
    }
}

const TEXT: &str = "First Citizen: Before we proceed any further, hear me speak. All: Speak, speak. \
                    First Citizen: You are all resolved rather to die than to famish? All: Resolved.";

#[test]
fn a_dataset_served_over_http_reads_as_from_its_folder() {
    let d = scratch("dataset");
    let input = d.join("in.txt");
    std::fs::write(&input, TEXT.repeat(20)).unwrap();
    let folder = d.join("site/datasets/tiny");
    let tok = Tokenizer::Gpt2(Gpt2Tokenizer::new());
    let opts = PrepareOptions {
        val_fraction: 0.1,
        shard_tokens: 100,
        block_bytes: 64,
        threads: 2,
    };
    prepare(&tok, &[input], &LocalFolder::new(&folder), &opts, &mut |_| {}).unwrap();
    let server = HttpServer::start(&d.join("site"));
    let url = format!("{}/datasets/tiny", server.endpoint());
    let remote = store::open_with(&url, &options(Duration::from_secs(5))).unwrap();
    let from_http = TokenDataset::open(remote.clone()).unwrap();
    let from_folder = TokenDataset::open(Arc::new(LocalFolder::new(&folder))).unwrap();
    same_dataset::assert_reads_alike(&from_http, &from_folder, 4, 16);
    // a range of a shard, and its length
    let shard = &from_folder.index().splits["train"].shards[1].name;
    let whole = std::fs::read(folder.join(shard)).unwrap();
    assert_eq!(remote.read_range(shard, 3..9).unwrap(), &whole[3..9]);
    assert_eq!(remote.len(shard).unwrap(), whole.len() as u64);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_missing_object_and_a_server_that_is_gone_are_named_by_url() {
    let d = scratch("errors");
    std::fs::create_dir_all(d.join("site")).unwrap();
    std::fs::write(d.join("site/a.bin"), b"abc").unwrap();
    let server = HttpServer::start(&d.join("site"));
    let url = server.endpoint();
    let s = store::open_with(&url, &options(Duration::from_secs(2))).unwrap();
    assert_eq!(s.read("a.bin").unwrap(), b"abc");
    // a 404 is not retried
    let t = Instant::now();
    let e = s.read("missing.bin").unwrap_err().to_string();
    assert!(e.contains(&format!("{url}/missing.bin")), "{e}");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    // a plain web server takes no writes
    let e = s.put("new.bin", b"x").unwrap_err().to_string();
    assert!(e.contains(&format!("{url}/new.bin")), "{e}");
    // gone: refused connections are retried for retry_for, then named
    drop(server);
    let t = Instant::now();
    let e = s.read("a.bin").unwrap_err().to_string();
    assert!(e.contains(&format!("{url}/a.bin")), "{e}");
    assert!(t.elapsed() >= Duration::from_millis(1500), "{:?}", t.elapsed());
    std::fs::remove_dir_all(&d).unwrap();
}
