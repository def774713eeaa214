//! Ranks as threads of one test process, each with its own connections, exactly as separate
//! processes would have.
#![allow(dead_code)]

use std::time::Duration;

use weft_dist::env::{RankEnv, Starter};
use weft_dist::store::StoreServer;
use weft_dist::{init_with, Options, ProcessGroup, Token};

/// Rank `rank` of `n`, all on this host, with the store at `127.0.0.1:port`.
pub fn env(rank: usize, n: usize, port: u16) -> RankEnv {
    RankEnv {
        rank,
        world_size: n,
        local_rank: rank,
        local_world_size: n,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        restart_count: 0,
        starter: Starter::Launcher,
    }
}

/// Runs `f` on `n` ranks (threads) joined through a fresh store, rank `r` with `options(r)`;
/// returns each rank's result.
pub fn ranks_with<R: Send>(
    n: usize,
    options: impl Fn(usize) -> Options + Sync,
    f: impl Fn(ProcessGroup) -> R + Sync,
) -> Vec<R> {
    let token = Token::new("test-token").unwrap();
    let server = StoreServer::start("127.0.0.1:0", token.clone()).unwrap();
    let port = server.addr().port();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (f, token, o) = (&f, token.clone(), options(r));
                s.spawn(move || f(init_with(Some(env(r, n, port)), Some(token), &o).unwrap()))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

pub fn ranks<R: Send>(n: usize, timeout: Duration, f: impl Fn(ProcessGroup) -> R + Sync) -> Vec<R> {
    ranks_with(
        n,
        |_| Options {
            timeout,
            ..Options::default()
        },
        f,
    )
}

/// Waits until every rank has reached this point, before a test makes one of them give up on
/// purpose: a rank that gives up aborts the group's collectives at once. The abort reaches a
/// peer after the frames this rank had sent, but a collective this rank started and did not wait
/// for may not have sent its frames yet (its sends are queued to the group's thread), and the
/// peer then fails it. After this barrier every earlier collective has completed on every rank;
/// the barrier itself may be the one the abort fails, which the caller does not mind.
pub fn settle(pg: &ProcessGroup) {
    let _ = pg.barrier().and_then(|b| b.wait());
}
