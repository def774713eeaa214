//! Answers as they are written to the socket: a stop lets an answer being read finish (its last
//! megabyte or so waits in hyper's buffer after the body has ended), an answer the client does
//! not read is dropped after the read timeout whatever its kind (pipelined whole answers, sent
//! with a `Content-Length`, included), a client reading steadily but slowly is not cut off,
//! and a request whose body and answer pass the budget of bytes in flight only together is
//! answered.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::answers::{infer_raw, split_answer, status};
use super::{start, wait};
use crate::Limits;

/// Reads from `c` until the server closes it (or a read error, or `bound` has passed), `piece`
/// bytes at a time with `pause` after each; calls `after_each` with what has arrived so far.
pub(super) fn read_slowly(
    c: &mut TcpStream,
    piece: usize,
    pause: Duration,
    bound: Duration,
    mut after_each: impl FnMut(usize),
) -> Vec<u8> {
    let t = Instant::now();
    let mut got = Vec::new();
    let mut buf = vec![0u8; piece];
    while t.elapsed() < bound {
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(_) => break,
        }
        after_each(got.len());
        std::thread::sleep(pause);
    }
    got
}

/// Whether `got` is a whole chunked answer.
pub(super) fn whole(got: &[u8]) -> bool {
    got.ends_with(b"}]}\r\n0\r\n\r\n")
}

#[test]
fn a_stop_lets_an_answer_being_read_finish() {
    let mut s = start(Limits {
        read_timeout: Duration::from_secs(60),
        ..Limits::default()
    });
    let mut c = TcpStream::connect(s.inference).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // about 10 MB of text, more than the kernel's buffers and hyper's take, in 18 chunks of
    // 52,428 values: the last is a whole chunk, part of which waits in hyper's buffer after the
    // body has ended (a short last chunk is often written at once)
    c.write_all(infer_raw(314_568, "1,-1").as_bytes()).unwrap();
    let mut stop = s.stop.take();
    let got = read_slowly(
        &mut c,
        32 << 10,
        Duration::from_millis(20),
        Duration::from_secs(60),
        |n| {
            if n > 256 << 10 {
                if let Some(stop) = stop.take() {
                    let _ = stop.send(());
                }
            }
        },
    );
    assert!(whole(&got), "the answer was cut at {} bytes", got.len());
    let (_, body) = split_answer(&got);
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["outputs"][0]["data"].as_array().map(Vec::len), Some(943_704));
    assert!(
        s.stopped.recv_timeout(Duration::from_secs(10)).is_ok(),
        "the server did not stop"
    );
}

#[test]
fn pipelined_whole_answers_not_read_are_dropped_after_the_read_timeout() {
    let s = start(Limits {
        read_timeout: Duration::from_millis(500),
        ..Limits::default()
    });
    // 17,000 rows: 51,000 values, each answer written whole (about 0.6 MB, with a
    // Content-Length); 16 of them are more than the sockets take
    let one = infer_raw(17_000, "1,-1").replace("Connection: close\r\n", "");
    let count = 16;
    let c = TcpStream::connect(s.inference).unwrap();
    let mut w = c.try_clone().unwrap();
    // written from a thread: the server stops reading while its answers wait
    let writer = std::thread::spawn(move || {
        for _ in 0..count {
            if w.write_all(one.as_bytes()).is_err() {
                break;
            }
        }
    });
    // not read for six times the timeout
    std::thread::sleep(Duration::from_secs(3));
    let mut c = c;
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    let closed = loop {
        match c.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
    };
    let answers = got.windows(12).filter(|w| w == b"HTTP/1.1 200").count();
    assert!(closed, "the connection stayed open for {:?}", started.elapsed());
    assert!(answers < count, "all {answers} answers were sent after 3 s unread");
    let _ = writer.join();
    // nothing is held, and the server answers
    assert!(wait(|| s.bodies.used() == 0), "{} bytes held", s.bodies.used());
    let mut fresh = TcpStream::connect(s.inference).unwrap();
    fresh.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    fresh.write_all(infer_raw(10, "1,-1").as_bytes()).unwrap();
    let mut all = Vec::new();
    let _ = fresh.read_to_end(&mut all);
    assert_eq!(status(&all), 200);
}

/// (Linux: the server sets `TCP_NOTSENT_LOWAT` there, which this relies on.)
#[cfg(target_os = "linux")]
#[test]
fn a_client_reading_slowly_but_steadily_gets_the_whole_answer() {
    let s = start(Limits {
        read_timeout: Duration::from_millis(300),
        ..Limits::default()
    });
    let mut c = TcpStream::connect(s.inference).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // about 6.6 MB, read at about 1.3 MB/s: one 1 MiB chunk of text takes longer than the
    // timeout to be read, yet the client never pauses for as long as that
    c.write_all(infer_raw(200_000, "1,-1").as_bytes()).unwrap();
    let t = Instant::now();
    let got = read_slowly(
        &mut c,
        64 << 10,
        Duration::from_millis(50),
        Duration::from_secs(60),
        |_| {},
    );
    assert!(whole(&got), "cut at {} bytes after {:?}", got.len(), t.elapsed());
}

#[test]
fn a_body_and_answer_past_the_budget_only_together_are_answered() {
    // the answer holds 70,000 x 3 values' 4 bytes and a MiB of text (1.9 MB), under the 2 MiB
    // budget; with the request's 350 kB body it would pass it
    let s = start(Limits {
        body_bytes: 1 << 20,
        body_bytes_in_flight: 2 << 20,
        ..Limits::default()
    });
    for _ in 0..2 {
        let mut c = TcpStream::connect(s.inference).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        c.write_all(infer_raw(70_000, "1,-1").as_bytes()).unwrap();
        let mut got = Vec::new();
        let _ = c.read_to_end(&mut got);
        let (head, _) = split_answer(&got);
        assert_eq!(status(&got), 200, "{head}");
        assert!(wait(|| s.bodies.used() == 0), "{} bytes held", s.bodies.used());
    }
}
