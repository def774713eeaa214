//! A launcher given `--node-rank 0` on a host that `--master-addr` does not name serves a store
//! that nothing connects to: it checks that the store at `--master-addr:--master-port` is its
//! own, and fails at once with one line, starting no worker, when another store answers there.
//! Nothing answering there is no fault (the real node 0 may not be up yet, or the address does
//! not loop back to node 0's host): it checks again meanwhile.
//!
//! Two hosts on one machine: each node 0's store listens on a loopback address of its own
//! (`WEFT_STORE_BIND` 127.0.0.1 and 127.0.0.2, the same port), so "the host that
//! `--master-addr` names" is 127.0.0.1, and 127.0.0.2 is another host.

mod common;
mod launcher;

use std::time::{Duration, Instant};

use common::{free_port, pids_with, wait_for};
use launcher::*;

const TOKEN: &str = "tok-master";

/// `weft launch --node-rank RANK FLAGS --master-port PORT -- sh -c SCRIPT` with the job's token
/// and node 0's store listening on `bind` (when given).
fn node(rank: &str, flags: &[&str], port: u16, bind: Option<&str>, script: &str) -> std::process::Command {
    let mut cmd = launcher();
    cmd.args([
        "--node-rank",
        rank,
        "--master-port",
        &port.to_string(),
        "--stop-timeout",
        "2",
    ])
    .args(flags)
    .args(["--", "sh", "-c", script])
    .env("WEFT_JOB_TOKEN", TOKEN);
    match bind {
        Some(b) => cmd.env("WEFT_STORE_BIND", b),
        None => cmd.env_remove("WEFT_STORE_BIND"),
    };
    cmd
}

/// Waits until a store of this job's answers at `addr`.
fn store_up(addr: &str) {
    let token = weft_dist::Token::new(TOKEN).unwrap();
    weft_dist::store::StoreClient::connect(addr, &token, Duration::from_secs(60)).expect("the store answers");
}

/// What the launcher says when another store answers at 127.0.0.1:`port`, up to whose it is.
fn refusal(port: u16) -> String {
    format!(
        "weft launch: --node-rank 0 serves the store, but the store at 127.0.0.1:{port} (--master-addr and \
         --master-port, where the other nodes connect) is "
    )
}

/// The launcher's run ended with exit 1 and one line on stderr: [`refusal`] with `whose`, and
/// the advice; no worker started.
fn refused_at_once(r: &Run, port: u16, whose: &str) {
    assert_eq!(r.code, Some(1), "{}", r.show());
    let line = format!("{}{whose}", refusal(port));
    assert!(r.stderr.starts_with(&line), "want {line:?}\n{}", r.show());
    assert!(
        r.stderr
            .contains("start --node-rank 0 on the host that --master-addr names (127.0.0.1)"),
        "{}",
        r.show()
    );
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.show());
    assert!(!r.stdout.contains("[rank"), "started workers:\n{}", r.show());
    assert!(!r.stderr.contains("panicked"), "{}", r.show());
    // it marks its store, reads the mark at --master-addr, and keeps its store 1 s for any
    // launcher that reached it by another address
    assert!(r.elapsed < Duration::from_secs(10), "{}", r.show());
}

/// The settings with and without rendezvous rounds (the last call long: node 0 never closes a
/// round alone before node 1 joins).
const MODES: [&[&str]; 3] = [
    &["--nnodes", "2"],
    &["--nnodes", "2", "--max-restarts", "1"],
    &["--nnodes", "1:2", "--rdzv-last-call", "60"],
];

/// The real node 0 runs at 127.0.0.1; a second launcher given `--node-rank 0` on "another
/// host" (127.0.0.2) waited out the 600 s join timeout, silently. Now it fails at once, naming
/// the cause, and the real job runs on.
#[test]
fn a_second_node_0_on_another_host_fails_at_once() {
    for flags in MODES {
        let port = free_port();
        let mut real = Node::start(node("0", flags, port, Some("127.0.0.1"), "echo started"));
        store_up(&format!("127.0.0.1:{port}"));
        let second = run(node("0", flags, port, Some("127.0.0.2"), "echo started"));
        refused_at_once(
            &second,
            port,
            "another launcher's (it holds another launcher's mark): start --node-rank 0",
        );
        // the job runs with its real node 0 (whose own store answers at --master-addr)
        let mut one = Node::start(node("1", flags, port, None, "echo started"));
        for (n, name) in [(&mut real, "node 0"), (&mut one, "node 1")] {
            assert_eq!(n.finish(60), Some(0), "{flags:?}: {name}:\n{}", n.show());
            assert!(!n.stderr().contains("serves the store, but"), "{}", n.show());
        }
        for rank in 0..2 {
            let all = format!("{}{}", real.stdout(), one.stdout());
            assert!(all.contains(&format!("[rank{rank}]: started")), "{flags:?}: {all}");
        }
    }
}

/// Nothing answers at `--master-addr` when node 0's launcher starts (the real node 0 is not up
/// yet): it waits, checking again, and fails once the real node 0's store answers there. In an
/// elastic job with MIN 1, the round it closed alone meanwhile is stopped (its workers too).
#[test]
fn a_node_0_fails_once_another_store_answers_later() {
    for (flags, worker_started) in [
        (&["--nnodes", "2"][..], false),
        (&["--nnodes", "1:2", "--rdzv-last-call", "1"][..], true),
    ] {
        let port = free_port();
        let seconds = format!("60.{}{:09}", std::process::id(), port);
        let script = format!("echo started; exec sleep {seconds}");
        let mut second = Node::start(node("0", flags, port, Some("127.0.0.2"), &script));
        std::thread::sleep(Duration::from_secs(3));
        assert!(second.running(), "{flags:?}:\n{}", second.show());
        assert!(!second.stderr().contains("serves the store"), "{}", second.show());
        if worker_started {
            assert!(
                wait_for(30, || second.stdout().contains("[rank0]: started")),
                "{}",
                second.show()
            );
        }
        let real = Node::start(node("0", flags, port, Some("127.0.0.1"), "exec sleep 60"));
        store_up(&format!("127.0.0.1:{port}"));
        let since = Instant::now();
        let code = second.finish(30);
        let took = since.elapsed();
        let text = second.show();
        drop(real);
        assert_eq!(code, Some(1), "{flags:?}: {text}");
        // rechecked every second (a try that reaches nothing refused ends at once), and 1 s
        // kept for the others
        assert!(took < Duration::from_secs(8), "{took:?}: {text}");
        let said = if worker_started {
            format!("weft launch: job failed: {}", &refusal(port)["weft launch: ".len()..])
        } else {
            refusal(port)
        };
        assert!(
            second.stderr().contains(&format!("{said}another launcher's")),
            "want {said:?}\n{text}"
        );
        assert_eq!(second.stdout().contains("[rank"), worker_started, "{text}");
        assert!(
            wait_for(10, || pids_with(&seconds).is_empty()),
            "workers left: {:?}\n{text}",
            pids_with(&seconds)
        );
    }
}

/// `--master-addr` does not lead back to node 0's host from node 0 itself (a NAT address, a
/// Kubernetes service without hairpin): here something at 127.0.0.1 takes the connection and
/// never answers, while the other node reaches node 0's store at 127.0.0.2. That is no fault:
/// the job runs, with and without rendezvous rounds.
#[test]
fn a_node_0_that_master_addr_does_not_lead_back_to_still_runs() {
    for flags in MODES {
        let port = free_port();
        // connections complete (the system queues them) and then hear nothing
        let silent = std::net::TcpListener::bind(("127.0.0.1", port)).expect("a listener");
        let mut zero = Node::start(node(
            "0",
            &[flags, &["--master-addr", "127.0.0.1"][..]].concat(),
            port,
            Some("127.0.0.2"),
            "echo started",
        ));
        let mut one = Node::start(node(
            "1",
            &[flags, &["--master-addr", "127.0.0.2"][..]].concat(),
            port,
            None,
            "echo started",
        ));
        let started = Instant::now();
        for (n, name) in [(&mut zero, "node 0"), (&mut one, "node 1")] {
            assert_eq!(n.finish(60), Some(0), "{flags:?}: {name}:\n{}", n.show());
            assert!(!n.stderr().contains("serves the store, but"), "{}", n.show());
        }
        // the check waits on its own thread: the meeting does not
        assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
        drop(silent);
    }
}

/// A store of another job (another token), or one of this job's token without a launcher's mark
/// (a rank 0 serving the store itself, an older weft's launcher), at `--master-addr`: the same
/// refusal, saying whose.
#[test]
fn another_jobs_store_or_an_unmarked_one_is_refused_too() {
    for (token, whose) in [
        (
            "tok-another-job",
            "another job's (it does not know this job's WEFT_JOB_TOKEN)",
        ),
        (TOKEN, "another launcher's or rank 0's (it holds no launcher's mark"),
    ] {
        let port = free_port();
        let _store =
            weft_dist::store::StoreServer::start(&format!("127.0.0.1:{port}"), weft_dist::Token::new(token).unwrap())
                .expect("a store");
        let r = run(node("0", &["--nnodes", "2"], port, Some("127.0.0.2"), "echo started"));
        refused_at_once(&r, port, whose);
    }
}

/// `WEFT_STORE_BIND` naming no address of this host: one line naming the variable.
#[test]
fn a_store_bind_address_not_of_this_host_is_refused() {
    let port = free_port().to_string();
    refused(
        &["--nnodes", "2", "--master-port", &port, "--", "true"],
        &[("WEFT_JOB_TOKEN", TOKEN), ("WEFT_STORE_BIND", "192.0.2.1")],
        "(WEFT_STORE_BIND=192.0.2.1 must name an address of this host's, or a name of one; another job may hold \
         that port",
    );
}

/// On a one-node job the workers connect where `WEFT_STORE_BIND` put the store (the default
/// `--master-addr`, 127.0.0.1, leads nowhere then: they waited for the store until their timeout).
#[test]
fn a_one_node_job_with_its_store_elsewhere_reaches_it() {
    let mut cmd = node(
        "0",
        &["--nproc-per-node", "2"],
        free_port(),
        Some("127.0.0.2"),
        "test \"$MASTER_ADDR\" = 127.0.0.2 && exec \"$WEFT\" check collectives",
    );
    cmd.env("WEFT", WEFT);
    let r = run(cmd);
    assert_eq!(r.code, Some(0), "{}", r.show());
    assert!(r.elapsed < Duration::from_secs(60), "{:?}", r.elapsed);
}
