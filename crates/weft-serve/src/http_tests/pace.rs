//! The minimum rate at which a client must take its answers (`--min-send-rate`): a client that
//! reads a large answer a little at a time, each pause far under the read timeout, is cut once
//! it falls behind the rate by more than the read timeout, and what its answer held of the
//! budget is given back; a client reading steadily at about 300 KB a second is not cut.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::answers::{infer_raw, send, split_answer, status};
use super::writes::{read_slowly, whole};
use super::{start, wait};
use crate::Limits;

#[test]
fn a_client_taking_an_answer_under_the_send_rate_is_cut_and_its_budget_freed() {
    let rate: u64 = 512 << 10;
    let timeout = Duration::from_secs(5);
    let s = start(Limits {
        body_bytes: 4 << 20,
        body_bytes_in_flight: 8 << 20,
        read_timeout: timeout,
        min_send_rate: rate,
        ..Limits::default()
    });
    // 900,000 values: 3.6 MB held and about 10 MB of text, two minutes at the client's pace
    let big = infer_raw(300_000, "1,-1");
    let mut c = TcpStream::connect(s.inference).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c.write_all(big.as_bytes()).unwrap();
    let asked = Instant::now();
    assert!(
        wait(|| s.bodies.used() >= 3_600_000),
        "the answer holds {} bytes",
        s.bodies.used()
    );
    // its share of the budget is held: a second such request does not fit
    let got = send(s.inference, &big);
    let (head, _) = split_answer(&got);
    assert_eq!(status(&got), 503, "{head}");
    // 8 KiB every 100 ms: about 80 KiB a second, under the rate, and no pause near the read
    // timeout (the kernel lets the server write again every second or two: with a timeout of
    // 2 s the server's writes waited past it, and the client was cut without the rate)
    let mut freed = None;
    let got = read_slowly(
        &mut c,
        8 << 10,
        Duration::from_millis(100),
        Duration::from_secs(40),
        |_| {
            if freed.is_none() && s.bodies.used() == 0 {
                freed = Some(asked.elapsed());
            }
        },
    );
    assert!(!whole(&got), "the whole answer was sent in {:?}", asked.elapsed());
    // cut, what it held given back, once the waiting passed the timeout plus what the bytes
    // written earned (all of them read by now, the kernel's buffers drained after the cut)
    let freed = freed.expect("the answer held its bytes until the end");
    let bound = timeout + Duration::from_secs_f64(got.len() as f64 / rate as f64) + Duration::from_secs(2);
    assert!(
        freed < bound,
        "freed after {freed:?} and {} bytes, past {bound:?}",
        got.len()
    );
    assert!(freed >= timeout, "freed after {freed:?}, within the read timeout");
    // the same request is answered
    let got = send(s.inference, &big);
    assert_eq!(status(&got), 200);
    assert!(whole(&got));
}

/// (Linux: the server sets `TCP_NOTSENT_LOWAT` there, which a short read timeout relies on.)
#[cfg(target_os = "linux")]
#[test]
fn a_client_reading_steadily_at_300_kb_a_second_is_not_cut() {
    // the default rate (64 KiB a second), with a read timeout of 1 s: a second of waiting in hand
    let s = start(Limits {
        read_timeout: Duration::from_secs(1),
        ..Limits::default()
    });
    let mut c = TcpStream::connect(s.inference).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // about 2 MB, read 16 KiB every 50 ms
    c.write_all(infer_raw(60_000, "1,-1").as_bytes()).unwrap();
    let t = Instant::now();
    let got = read_slowly(
        &mut c,
        16 << 10,
        Duration::from_millis(50),
        Duration::from_secs(60),
        |_| {},
    );
    let took = t.elapsed();
    let rate = got.len() as f64 / took.as_secs_f64();
    assert!(
        whole(&got),
        "cut at {} bytes after {took:?} ({rate:.0} bytes a second)",
        got.len()
    );
    assert!(rate < 400_000.0, "read at {rate:.0} bytes a second");
}
