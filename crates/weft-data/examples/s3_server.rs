//! The tests' S3-compatible server as a program, for trying `s3://` URLs by hand and for tests of
//! other crates that run weft in a child process:
//!
//! ```text
//! cargo run -p weft-data --example s3_server -- ROOT [PORT] [BUCKET...]
//! ```
//!
//! Serves the folder ROOT (each subfolder a bucket; the BUCKETs named are created) on
//! `127.0.0.1:PORT` (default: a free port), with the access key `weft-test-key` and secret
//! `weft-test-secret`, until killed. The first line on stdout is the endpoint, then the variables
//! a client needs.

#[path = "../tests/support/s3_server.rs"]
mod s3_server;

use std::path::PathBuf;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(root) = args.first() else {
        weft_core::errln!("usage: s3_server ROOT [PORT] [BUCKET...]");
        std::process::exit(2);
    };
    let port = match args.get(1).map(|p| p.parse::<u16>()) {
        None => 0,
        Some(Ok(p)) => p,
        Some(Err(e)) => {
            weft_core::errln!("s3_server: PORT {:?}: {e}", args[1]);
            std::process::exit(2);
        }
    };
    let server = match s3_server::S3Server::try_start_on(&PathBuf::from(root), port) {
        Ok(s) => s,
        Err(e) => {
            weft_core::errln!("s3_server: {e}");
            std::process::exit(1);
        }
    };
    for bucket in args.iter().skip(2) {
        if let Err(e) = server.try_create_bucket(bucket) {
            weft_core::errln!("s3_server: {e}");
            std::process::exit(1);
        }
    }
    weft_core::outln!("{}", server.endpoint());
    weft_core::outln!(
        "AWS_ENDPOINT_URL={} AWS_ACCESS_KEY_ID={} AWS_SECRET_ACCESS_KEY={} AWS_REGION=us-east-1",
        server.endpoint(),
        s3_server::ACCESS_KEY,
        s3_server::SECRET_KEY
    );
    loop {
        std::thread::park();
    }
}
