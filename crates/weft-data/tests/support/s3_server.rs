//! A real S3-compatible server on loopback for the tests: `s3s-fs` (objects kept as files in a
//! folder) behind `s3s`'s HTTP service with signature-v4 authentication, served by hyper on its
//! own tokio runtime. Stopping it drops the runtime (the listener and every open connection close,
//! so clients see refused or reset connections); starting it again on the same port serves the
//! same folder, so the data survives.
//!
//! [`FlakyFront`] is a TCP relay in front of it that answers the first N connections with
//! `503 Service Unavailable`, then relays bytes both ways.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;

/// The access key the server accepts.
pub const ACCESS_KEY: &str = "weft-test-key";
/// Its secret.
pub const SECRET_KEY: &str = "weft-test-secret";

/// A running (or stopped) server over one folder.
pub struct S3Server {
    root: PathBuf,
    port: u16,
    rt: Option<tokio::runtime::Runtime>,
}

impl S3Server {
    /// Serves `root` (created if missing) on a free loopback port.
    pub fn start(root: &Path) -> S3Server {
        S3Server::start_on(root, 0)
    }

    /// Serves `root` (created if missing) on loopback port `port` (0: a free one).
    pub fn start_on(root: &Path, port: u16) -> S3Server {
        S3Server::try_start_on(root, port).unwrap()
    }

    /// [`S3Server::start_on`], reporting a folder that cannot be made or a port that cannot be
    /// bound.
    pub fn try_start_on(root: &Path, port: u16) -> std::io::Result<S3Server> {
        std::fs::create_dir_all(root).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", root.display())))?;
        let mut s = S3Server {
            root: root.to_path_buf(),
            port,
            rt: None,
        };
        s.try_resume()?;
        Ok(s)
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Makes bucket `name` (a folder under the root, as s3s-fs keeps buckets).
    pub fn create_bucket(&self, name: &str) {
        self.try_create_bucket(name).unwrap()
    }

    /// [`S3Server::create_bucket`], reporting a name that cannot be a folder.
    pub fn try_create_bucket(&self, name: &str) -> std::io::Result<()> {
        let dir = self.root.join(name);
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return Err(std::io::Error::other(format!("bucket name {name:?} is not valid")));
        }
        std::fs::create_dir_all(&dir).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", dir.display())))
    }

    /// Closes the listener and all connections.
    pub fn stop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }

    /// Serves again on the same port (the first call picks a free one).
    pub fn resume(&mut self) {
        self.try_resume().unwrap()
    }

    fn try_resume(&mut self) -> std::io::Result<()> {
        assert!(self.rt.is_none(), "already running");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let fs = s3s_fs::FileSystem::new(&self.root)
            .map_err(|e| std::io::Error::other(format!("{}: {e:?}", self.root.display())))?;
        let mut b = s3s::service::S3ServiceBuilder::new(fs);
        b.set_auth(s3s::auth::SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
        let service = b.build();
        let addr: SocketAddr = ([127, 0, 0, 1], self.port).into();
        // the port may linger a moment after a stop
        let mut tries = 0;
        let listener = loop {
            match rt.block_on(tokio::net::TcpListener::bind(addr)) {
                Ok(l) => break l,
                Err(_) if tries < 50 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(std::io::Error::new(e.kind(), format!("{addr}: {e}"))),
            }
        };
        self.port = listener.local_addr()?.port();
        rt.spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    continue;
                };
                let service = service.clone();
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(socket), service)
                        .await;
                });
            }
        });
        self.rt = Some(rt);
        Ok(())
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A relay on its own loopback port to `target` that answers the first `fail_first`
/// connections with HTTP 503.
pub struct FlakyFront {
    port: u16,
    stop: Arc<AtomicBool>,
    /// Connections answered with 503 so far.
    pub failed: Arc<AtomicUsize>,
}

impl FlakyFront {
    /// Starts the relay.
    pub fn start(target: u16, fail_first: usize) -> FlakyFront {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(AtomicUsize::new(0));
        let (stop2, failed2) = (stop.clone(), failed.clone());
        std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                let (mut client, _) = match listener.accept() {
                    Ok(c) => c,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                };
                client.set_nonblocking(false).unwrap();
                if failed2.load(Ordering::Relaxed) < fail_first {
                    failed2.fetch_add(1, Ordering::Relaxed);
                    // read the request head, then refuse it
                    let mut buf = [0u8; 8192];
                    let _ = client.set_read_timeout(Some(Duration::from_millis(500)));
                    let _ = client.read(&mut buf);
                    let body = "<Error><Code>ServiceUnavailable</Code></Error>";
                    let _ = write!(
                        client,
                        "HTTP/1.1 503 Service Unavailable\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                relay(client, server);
            }
        });
        FlakyFront { port, stop, failed }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for FlakyFront {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Copies bytes both ways between two sockets on two threads until either side closes.
fn relay(a: TcpStream, b: TcpStream) {
    let (a2, b2) = (a.try_clone().unwrap(), b.try_clone().unwrap());
    let pump = |mut from: TcpStream, mut to: TcpStream| {
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(std::net::Shutdown::Both);
            let _ = from.shutdown(std::net::Shutdown::Both);
        });
    };
    pump(a, b2);
    pump(b, a2);
}
