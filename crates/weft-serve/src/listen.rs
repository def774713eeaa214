//! Connections under time limits: every port is served by hyper's HTTP/1 server with a
//! header-read timeout (`axum::serve` sets none: a client that sends half a request line, or
//! opens a connection and sends nothing, would hold it, and its file descriptor, forever), and
//! a connection whose client does not take its answers fast enough is closed, the answer
//! dropped and what it held given back: bytes may wait on the client (the socket full) for the
//! timeout at most, and beyond that the client must take them at a minimum rate on average
//! ([`Pacing`]; nginx's `send_timeout` and Kestrel's `MinResponseDataRate`; counted at the
//! socket, [`Tracked`], so that it covers every answer to its last byte). Each port holds at
//! most `max_connections` connections open at once; past that, new ones wait in the kernel's
//! backlog, unaccepted, until one closes, so that clients that open connections without end
//! cannot take the file descriptors the server needs for its own files. When the server stops,
//! connections that are not handling a request and have nothing left to write (idle, or still
//! sending a request's head) close at once, a request whose body is still arriving is answered
//! 503 ([`crate::body`]), and the requests being handled finish. Request bodies are read by
//! [`crate::body::read_body`].

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
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

/// How fast a connection's client must take its answers: bytes may wait on it (the socket
/// full, none of them written) for `timeout` at most, and over any stretch the time bytes wait
/// may pass `timeout` only by one second for each `min_rate` bytes the client took meanwhile.
/// Past either, the connection is closed and its answer dropped ([`serve_paced`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pacing {
    /// The longest bytes may wait on the client at once, and the most waiting a client may
    /// have in hand (the grace before the rate counts).
    pub timeout: Duration,
    /// The slowest a client may take an answer, in bytes a second on average, counted while
    /// bytes wait on it (at least 1).
    pub min_rate: u64,
}

impl Pacing {
    /// The waiting, in microseconds, that `bytes` written earn at the minimum rate.
    fn earned(&self, bytes: usize) -> i64 {
        let us = bytes as u128 * 1_000_000 / self.min_rate.max(1) as u128;
        us.min(i64::MAX as u128) as i64
    }

    /// The grace, in microseconds.
    fn grace(&self) -> i64 {
        self.timeout.as_micros().min(i64::MAX as u128) as i64
    }
}

/// The waiting a connection's client has in hand.
#[derive(Debug)]
struct Pace {
    /// Microseconds after the connection opened since when bytes have waited on the client,
    /// none of them written (its last write found the socket full); `None` while nothing waits.
    blocked_since: Option<u64>,
    /// Microseconds the bytes waiting may still wait, counted from `blocked_since`: the grace
    /// at first, one second more for each `min_rate` bytes written, less the time bytes waited,
    /// never more than the grace; below 0 once the client has been slower than the rate.
    credit: i64,
}

/// What one connection is doing, shared by its task, its requests' answers and its socket.
#[derive(Debug)]
struct Activity {
    opened: Instant,
    pacing: Pacing,
    /// Requests handed to the app whose answer's body has not ended (or been dropped). hyper
    /// lets go of a body once it has its last piece, before that piece is written: what is
    /// still to be written is told by `pace.blocked_since`.
    handling: AtomicUsize,
    pace: Mutex<Pace>,
}

impl Activity {
    fn new(pacing: Pacing) -> Activity {
        Activity {
            opened: Instant::now(),
            pacing,
            handling: AtomicUsize::new(0),
            pace: Mutex::new(Pace {
                blocked_since: None,
                credit: pacing.grace(),
            }),
        }
    }

    /// Microseconds since the connection opened.
    fn now(&self) -> u64 {
        self.opened.elapsed().as_micros().min(u64::MAX as u128) as u64
    }

    fn pace(&self) -> std::sync::MutexGuard<'_, Pace> {
        // nothing panics while holding it
        self.pace.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether bytes waiting on the client have waited longer than it has in hand ([`Pacing`]).
    fn too_slow(&self) -> bool {
        let pace = self.pace();
        pace.blocked_since
            .is_some_and(|since| self.now().saturating_sub(since) as i64 > pace.credit)
    }

    /// Whether the connection handles no request and has nothing waiting to be written (idle,
    /// or a request's head arriving).
    fn idle(&self) -> bool {
        self.handling.load(Ordering::SeqCst) == 0 && self.pace().blocked_since.is_none()
    }

    /// A new request: when nothing waits on the client, its answer starts with the whole grace
    /// (a client slow with an earlier answer that it has taken whole is not held to it).
    fn request_started(&self) {
        let mut pace = self.pace();
        if pace.blocked_since.is_none() {
            pace.credit = self.pacing.grace();
        }
    }

    /// Notes what a write to the socket did.
    fn wrote(&self, polled: &Poll<io::Result<usize>>) {
        let now = self.now();
        let mut pace = self.pace();
        if polled.is_pending() {
            // the socket is full: bytes wait, from now unless they waited already
            pace.blocked_since.get_or_insert(now);
            return;
        }
        if let Some(since) = pace.blocked_since.take() {
            let waited = now.saturating_sub(since).min(i64::MAX as u64) as i64;
            pace.credit = pace.credit.saturating_sub(waited);
        }
        if let Poll::Ready(Ok(n)) = polled {
            let earned = self.pacing.earned(*n);
            pace.credit = pace.credit.saturating_add(earned).min(self.pacing.grace());
        }
    }
}

/// One request being handled on a connection, until its answer's body has ended or been
/// dropped.
#[derive(Debug)]
struct Handling(Arc<Activity>);

impl Handling {
    fn start(activity: &Arc<Activity>) -> Handling {
        activity.request_started();
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
/// pacing and the stop look at the bytes themselves, not at the answers' bodies (hyper holds up
/// to about a megabyte of an answer after its body has ended).
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

/// How often a connection's task checks for an answer its client takes too slowly and, once
/// the server stops, for having nothing left to do: a fraction of the read timeout, between
/// 10 ms and 250 ms.
fn check_every(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(10), Duration::from_millis(250))
}

/// How often at most the accept loop says that a port is at its connection limit.
const FULL_NOTICE_EVERY: Duration = Duration::from_secs(60);

/// Serves `app` on `listener` until `shutdown` completes, then stops accepting and waits for
/// the connections' requests being handled (idle connections, and those still sending a
/// request's head, close at once; a body still arriving is answered 503). A connection that
/// has not sent a whole request head within `header_timeout` of its start (or, kept alive, of
/// its last response) is closed, and so is one whose client takes its answers slower than
/// [`Pacing`] allows, with `header_timeout` as its timeout and the default minimum rate
/// ([`crate::Limits`]' `min_send_rate`: 64 KiB a second). At most `max_connections`, and at
/// least one, are open at once; the next is accepted when one closes, and reaching the limit
/// is logged at most once a minute.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    header_timeout: Duration,
    max_connections: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let pacing = Pacing {
        timeout: header_timeout,
        min_rate: crate::Limits::default().min_send_rate,
    };
    serve_paced(listener, app, pacing, max_connections, shutdown).await
}

/// [`serve`] with `pacing`: `pacing.timeout` is the header timeout too.
pub async fn serve_paced(
    listener: TcpListener,
    app: Router,
    pacing: Pacing,
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
            connection(stream, app, pacing, stop_rx).await;
            drop(close_rx);
            drop(slot);
        });
    }
    drop(close_rx);
    drop(listener);
    close_tx.closed().await;
    Ok(())
}

/// Serves one connection until it ends, its client takes an answer slower than `pacing`
/// allows, or the server stops (then as [`serve`] says).
async fn connection(stream: TcpStream, app: Router, pacing: Pacing, stop_rx: watch::Receiver<bool>) {
    let timeout = pacing.timeout;
    let activity = Arc::new(Activity::new(pacing));
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
                // the client took too little of what waits on it, for too long: drop it
                if activity.too_slow() {
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
