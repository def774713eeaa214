//! Connections from outside the job, and a store that stops answering (found by probing a
//! running job): strangers that connect to a rank's or the store's port and say nothing, or
//! trickle a byte now and then, hold only their own handshake thread for at most the handshake
//! timeout; the ranks and clients that know the token get through meanwhile; a client of a
//! store that stops answering gets an error naming it; ranks with different world sizes say so.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use weft_core::Tensor;
use weft_dist::store::{StoreClient, StoreServer};
use weft_dist::{init_with, Options, ProcessGroup, Token};

const T: Duration = Duration::from_secs(30);

/// Rank `rank` of a job of `world` ranks with the store at `127.0.0.1:port`.
fn join(rank: usize, world: usize, port: u16, token: &Token, timeout: Duration) -> weft_dist::Result<ProcessGroup> {
    let options = Options {
        timeout,
        ..Options::default()
    };
    init_with(Some(common::env(rank, world, port)), Some(token.clone()), &options)
}

/// The process's thread count (Linux), or `None`.
fn threads() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:")?.trim().parse().ok())
}

/// Sends `bytes` one at a time, `every` apart, until the peer closes the connection or `give_up`
/// passes; returns how long the connection stayed open.
fn trickle(mut s: TcpStream, bytes: &[u8], every: Duration, give_up: Duration) -> Duration {
    let t = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let mut sink = [0u8; 64];
    for b in bytes.iter().cycle() {
        if t.elapsed() > give_up || s.write_all(&[*b]).is_err() {
            break;
        }
        let until = Instant::now() + every;
        while Instant::now() < until {
            match s.read(&mut sink) {
                Ok(0) => return t.elapsed(),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return t.elapsed(),
                _ => {}
            }
        }
    }
    t.elapsed()
}

#[test]
fn strangers_at_a_ranks_port_do_not_keep_the_next_rank_out() {
    let token = Token::new("test-token").unwrap();
    let server = StoreServer::start("127.0.0.1:0", token.clone()).unwrap();
    let port = server.addr().port();
    let started = Instant::now();
    std::thread::scope(|s| {
        let rank0 = s.spawn(|| {
            let pg = join(0, 2, port, &token, T).unwrap();
            let t = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
            pg.all_reduce(&t, weft_dist::ReduceOp::Sum).unwrap().wait().unwrap();
            t.to_vec::<f32>().unwrap()
        });
        // strangers at rank 0's port before rank 1 comes: two silent, one trickling the
        // handshake's first bytes; the accept thread ran their handshakes one after another,
        // so rank 1's own handshake timed out behind them (10 s each) and the job failed
        let store = StoreClient::connect(&format!("127.0.0.1:{port}"), &token, T).unwrap();
        let addr = String::from_utf8(store.get("attempt0/mesh/0", T).unwrap()).unwrap();
        let silent: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(&addr).unwrap()).collect();
        let trickler = {
            let c = TcpStream::connect(&addr).unwrap();
            s.spawn(move || trickle(c, b"WEFTAUTH", Duration::from_millis(900), Duration::from_secs(30)))
        };
        std::thread::sleep(Duration::from_millis(300));
        let pg = join(1, 2, port, &token, T).unwrap();
        let joined = started.elapsed();
        let t = Tensor::from_vec(vec![10.0f32, 20.0], &[2]).unwrap();
        pg.all_reduce(&t, weft_dist::ReduceOp::Sum).unwrap().wait().unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), [11.0, 22.0]);
        assert_eq!(rank0.join().unwrap(), [11.0, 22.0]);
        assert!(joined < Duration::from_secs(8), "rank 1 joined after {joined:?}");
        // the trickler is dropped at the handshake's deadline, not a byte at a time
        let open = trickler.join().unwrap();
        assert!(open < Duration::from_secs(14), "the trickling stranger stayed {open:?}");
        drop(silent);
    });
}

#[test]
fn the_store_serves_its_clients_while_many_strangers_hold_connections() {
    let token = Token::new("test-token").unwrap();
    let server = StoreServer::start("127.0.0.1:0", token.clone()).unwrap();
    let addr = server.addr().to_string();
    let before = threads();
    let strangers: Vec<TcpStream> = (0..150).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    let trickler = {
        let c = TcpStream::connect(&addr).unwrap();
        std::thread::spawn(move || trickle(c, b"WEFTAUTH", Duration::from_millis(900), Duration::from_secs(30)))
    };
    std::thread::sleep(Duration::from_millis(500));
    // a thread per connection in its handshake, at most 64 of them (one per connection before)
    if let (Some(before), Some(now)) = (before, threads()) {
        assert!(
            now <= before + 64 + 8,
            "{before} threads before, {now} with 150 strangers"
        );
    }
    let t = Instant::now();
    let client = StoreClient::connect(&addr, &token, T).unwrap();
    client.set("k", b"v").unwrap();
    assert_eq!(client.get("k", T).unwrap(), b"v");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let open = trickler.join().unwrap();
    assert!(open < Duration::from_secs(14), "the trickling stranger stayed {open:?}");
    drop(strangers);
}

#[test]
fn a_store_that_stops_answering_is_an_error_naming_it() {
    let token = Token::new("test-token").unwrap();
    // a store that passes the handshake and then never answers (its host hung)
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mute = {
        let token = token.clone();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let by = Instant::now() + Duration::from_secs(10);
            weft_dist::auth::server_handshake(&mut s, &token, "store", by).unwrap();
            std::thread::sleep(Duration::from_secs(5));
            drop(s);
        })
    };
    let client = StoreClient::connect(&addr, &token, T)
        .unwrap()
        .with_reply_timeout(Duration::from_millis(500));
    let t = Instant::now();
    let e = client.get("k", Duration::from_millis(200)).unwrap_err().to_string();
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert!(e.contains(&addr) && e.contains("did not answer within 1 s"), "{e}");
    // the connection is not used again: a late reply would answer the wrong request
    let e = client.set("k", b"v").unwrap_err().to_string();
    assert!(e.contains("failed earlier"), "{e}");
    mute.join().unwrap();
}

#[test]
fn ranks_with_different_world_sizes_say_so() {
    let token = Token::new("test-token").unwrap();
    let server = StoreServer::start("127.0.0.1:0", token.clone()).unwrap();
    let port = server.addr().port();
    let three = Duration::from_secs(3);
    std::thread::scope(|s| {
        let rank0 = s.spawn(|| join(0, 2, port, &token, three).err());
        // rank 2 of a job its launcher thinks has 4 ranks
        let t = Instant::now();
        let Err(e) = join(2, 4, port, &token, three) else {
            panic!("rank 2 of 4 joined a job of 2")
        };
        let e = e.to_string();
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert!(e.contains("rank 2 runs with WORLD_SIZE=4 but rank 0 with 2"), "{e}");
        // rank 0 waits for its rank 1 as before, and times out naming it
        let e0 = rank0.join().unwrap().expect("rank 1 never came").to_string();
        assert!(e0.contains("rank") && e0.contains("3 s"), "{e0}");
    });
}
