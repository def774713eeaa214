//! A real static-file web server on loopback for the tests: tower-http's `ServeDir` (GET and
//! HEAD, byte ranges, `Last-Modified`, 404 for what is not there) served by hyper on its own
//! tokio runtime, as a plain web server or a CDN in front of a dataset would be. Dropping it
//! stops it.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;

/// A running server over one folder.
pub struct HttpServer {
    port: u16,
    rt: Option<tokio::runtime::Runtime>,
}

impl HttpServer {
    /// Serves the files under `root` on a free loopback port.
    pub fn start(root: &Path) -> HttpServer {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let addr: SocketAddr = ([127, 0, 0, 1], 0).into();
        let listener = rt.block_on(tokio::net::TcpListener::bind(addr)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let service = TowerToHyperService::new(tower_http::services::ServeDir::new(root));
        rt.spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    // out of descriptors, say: wait rather than spin
                    tokio::time::sleep(Duration::from_millis(10)).await;
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
        HttpServer { port, rt: Some(rt) }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}
