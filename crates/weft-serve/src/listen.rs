//! Connections under time limits: every port is served by hyper's HTTP/1 server with a
//! header-read timeout (`axum::serve` sets none: a client that sends half a request line, or
//! opens a connection and sends nothing, would hold it, and its file descriptor, forever), and
//! a connection whose socket takes none of the bytes waiting to be written for the same time is
//! closed, its answer dropped (a send timeout, as nginx's `send_timeout`; counted at the socket,
//! [`Tracked`], so that it covers every answer to its last byte). Each port holds at most `max_connections`
//! connections open at once; past that, new ones wait in the kernel's backlog, unaccepted, until
//! one closes, so that clients that open connections without end cannot take the file
//! descriptors the server needs for its own files. When the server stops, connections that are
//! not handling a request and have nothing left to write (idle, or still sending a request's
//! head) close at once, a request
//! whose body is still arriving is answered 503 ([`crate::body`]), and the requests being handled
//! finish. Request bodies are read by [`crate::body::read_body`].

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::Router;
use hyper::body::{Frame, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub use crate::body::{read_body, BodyBudget};

/// Put in every request's extensions by [`serve`]: completes once the server stops, so that a
/// handler waiting on its client (a body still arriving) can answer at once.
#[derive(Debug, Clone)]
pub struct Stopping(watch::Receiver<bool>);

impl Stopping {
    /// Completes once the server is stopping.
    pub async fn wait(mut self) {
        // an error: the server's stop signal is gone, so it is stopping too
        let _ = self.0.wait_for(|s| *s).await;
    }
}

/// What one connection is doing, shared by its task, its requests' answers and its socket.
#[derive(Debug)]
struct Activity {
    opened: Instant,
    /// Requests handed to the app whose answer's body has not ended (or been dropped). hyper
    /// lets go of a body once it has its last piece, before that piece is written: what is
    /// still to be written is told by `blocked_since`.
    handling: AtomicUsize,
    /// Milliseconds after `opened`, plus 1, since when the socket has taken none of the bytes
    /// hyper has to write (its last write found the socket full); 0 while nothing waits to be
    /// written. Any bytes written set it back to 0.
    blocked_since: AtomicU64,
}

impl Activity {
    fn now(&self) -> u64 {
        self.opened.elapsed().as_millis() as u64 + 1
    }

    /// Whether bytes have waited on the client, none of them written, for longer than `limit`.
    fn stalled(&self, limit: Duration) -> bool {
        let since = self.blocked_since.load(Ordering::SeqCst);
        since != 0 && self.now().saturating_sub(since) > limit.as_millis() as u64
    }

    /// Whether the connection handles no request and has nothing waiting to be written (idle,
    /// or a request's head arriving).
    fn idle(&self) -> bool {
        self.handling.load(Ordering::SeqCst) == 0 && self.blocked_since.load(Ordering::SeqCst) == 0
    }

    /// Notes what a write to the socket did.
    fn wrote<T>(&self, polled: &Poll<io::Result<T>>) {
        match polled {
            // the socket is full: bytes wait, from now unless they waited already
            Poll::Pending => {
                let _ = self
                    .blocked_since
                    .compare_exchange(0, self.now(), Ordering::SeqCst, Ordering::SeqCst);
            }
            Poll::Ready(_) => self.blocked_since.store(0, Ordering::SeqCst),
        }
    }
}

/// One request being handled on a connection, until its answer's body has ended or been
/// dropped.
#[derive(Debug)]
struct Handling(Arc<Activity>);

impl Handling {
    fn start(activity: &Arc<Activity>) -> Handling {
        activity.handling.fetch_add(1, Ordering::SeqCst);
        Handling(activity.clone())
    }
}

impl Drop for Handling {
    fn drop(&mut self) {
        self.0.handling.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An answer's body as hyper sends it, counted as a request being handled until hyper lets go
/// of it.
struct Watched {
    body: Body,
    _handling: Handling,
}

impl hyper::body::Body for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A connection's socket, telling its [`Activity`] whether what hyper writes is taken: the
/// send timeout and the stop look at the bytes themselves, not at the answers' bodies (hyper
/// holds up to about a megabyte of an answer after its body has ended).
struct Tracked {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.activity.wrote(&polled);
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.activity.wrote(&polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The most bytes of answers the kernel holds unsent on a connection (`TCP_NOTSENT_LOWAT`, on
/// Linux). Without it the kernel takes up to its send buffer's 4 MiB and tells the writer of
/// room only once a third of that has gone: a client reading 40 KB a second would let nothing
/// be written for 30 s, and be taken for one that does not read. With it, every 64 KiB the
/// client takes lets more be written.
const UNSENT_IN_KERNEL: usize = 128 << 10;

/// Sets [`UNSENT_IN_KERNEL`] on `stream` (elsewhere than on Linux, nothing).
fn limit_unsent(stream: &TcpStream) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let lowat = UNSENT_IN_KERNEL as libc::c_int;
        // SAFETY: the descriptor is the stream's, open while it is borrowed; the option is an
        // int, passed as a pointer to one and its size
        let _ = unsafe {
            libc::setsockopt(
                stream.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_NOTSENT_LOWAT,
                (&lowat as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (stream, UNSENT_IN_KERNEL);
}

/// How often a connection's task checks for a stalled answer and, once the server stops, for
/// having nothing left to do: a fraction of the read timeout, between 10 ms and 250 ms.
fn check_every(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(10), Duration::from_millis(250))
}

/// How often at most the accept loop says that a port is at its connection limit.
const FULL_NOTICE_EVERY: Duration = Duration::from_secs(60);

/// Serves `app` on `listener` until `shutdown` completes, then stops accepting and waits for
/// the connections' requests being handled (idle connections, and those still sending a
/// request's head, close at once; a body still arriving is answered 503). A connection that
/// has not sent a whole request head within `header_timeout` of its start (or, kept alive, of
/// its last response) is closed, and so is one whose socket has taken none of the bytes waiting
/// to be written for longer than that. At most `max_connections` (at least 1) are open at once; the next is accepted
/// when one closes, and reaching the limit is logged (at most once a minute).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    header_timeout: Duration,
    max_connections: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections.max(1)));
    let mut noticed: Option<std::time::Instant> = None;
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = || Stopping(stop_rx.clone()).wait();
    // each connection's task holds a receiver; all dropped: every connection has ended
    let (close_tx, close_rx) = watch::channel(());
    loop {
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if noticed.is_none_or(|t| t.elapsed() >= FULL_NOTICE_EVERY) {
                    noticed = Some(std::time::Instant::now());
                    let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
                    weft_core::errln!(
                        "weft: {addr}: {max_connections} connections open, the most allowed (--max-connections); \
                         new ones wait until one closes"
                    );
                }
                tokio::select! {
                    slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
                    _ = stopped() => break,
                }
            }
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // out of file descriptors and the like: wait a little rather than spin
                    if !is_connection_error(&e) {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    continue;
                }
            },
            _ = stopped() => break,
        };
        let (app, stop_rx, close_rx) = (app.clone(), stop_rx.clone(), close_rx.clone());
        tokio::spawn(async move {
            connection(stream, app, header_timeout, stop_rx).await;
            drop(close_rx);
            drop(slot);
        });
    }
    drop(close_rx);
    drop(listener);
    close_tx.closed().await;
    Ok(())
}

/// Serves one connection until it ends, the client stops reading an answer for longer than
/// `timeout`, or the server stops (then as [`serve`] says).
async fn connection(stream: TcpStream, app: Router, timeout: Duration, stop_rx: watch::Receiver<bool>) {
    let activity = Arc::new(Activity {
        opened: Instant::now(),
        handling: AtomicUsize::new(0),
        blocked_since: AtomicU64::new(0),
    });
    limit_unsent(&stream);
    let app = TowerToHyperService::new(app);
    let (on_request, stopping) = (activity.clone(), Stopping(stop_rx.clone()));
    let service = hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
        request.extensions_mut().insert(stopping.clone());
        let handling = Handling::start(&on_request);
        let answered = hyper::service::Service::call(&app, request);
        async move {
            let response = answered.await?;
            Ok::<_, Infallible>(response.map(|body| Watched {
                body,
                _handling: handling,
            }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(timeout);
    let io = Tracked {
        stream,
        activity: activity.clone(),
    };
    let conn = builder.serve_connection(TokioIo::new(io), service);
    let mut conn = std::pin::pin!(conn);
    let mut stop = std::pin::pin!(Stopping(stop_rx).wait());
    let mut stopping = false;
    let mut checks = tokio::time::interval(check_every(timeout));
    checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            // the connection first: what can be written now is, before the checks look
            biased;
            _ = conn.as_mut() => return,
            _ = stop.as_mut(), if !stopping => {
                stopping = true;
                // idle: closed at once; else after the request being handled
                conn.as_mut().graceful_shutdown();
            }
            _ = checks.tick() => {
                // nothing could be written to the client for the whole timeout: drop it
                if activity.stalled(timeout) {
                    return;
                }
                // stopping, no request handled and nothing left to write (a request's head
                // still arriving): not waited for
                if stopping && activity.idle() {
                    return;
                }
            }
        }
    }
}

/// Errors of one connection that the accept loop passes over at once.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}
