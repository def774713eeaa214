//! The launchers of a job on several nodes (run side by side on this machine) meeting on node
//! 0's store: launchers given different `--nproc-per-node`, or the same `--node-rank`, fail the
//! job on every node at once, naming the cause; and the other nodes notice a lost node 0 (its
//! launcher killed, or stopped as a node cut off the network is silent) within the heartbeat
//! timeout.

mod common;
mod launcher;

use std::time::{Duration, Instant};

use common::{free_port, pids_with, wait_for};
use launcher::*;

/// `weft launch FLAGS -- sh -c SCRIPT` (or `weft check collectives` when `script` is None) with
/// the job's token, started now.
fn node(flags: &[&str], script: Option<&str>) -> Node {
    let mut cmd = launcher();
    cmd.args(flags).arg("--");
    match script {
        Some(s) => cmd.args(["sh", "-c", s]),
        None => cmd.args([WEFT, "check", "collectives", "--sizes", "1"]),
    };
    // without the launchers meeting, the workers of node 0 waited for this long
    cmd.env("WEFT_JOB_TOKEN", "tok-nodes").env("WEFT_DIST_TIMEOUT", "60");
    Node::start(cmd)
}

/// Every launcher in `nodes` exits 1 within `secs` seconds, saying `why` on stderr, and none
/// started a worker when `no_workers`.
fn all_fail(nodes: &mut [Node], secs: u64, why: &str, no_workers: bool) {
    let started = Instant::now();
    for (i, n) in nodes.iter_mut().enumerate() {
        let left = secs.saturating_sub(started.elapsed().as_secs());
        let code = n.finish(left);
        let text = n.show();
        assert_eq!(code, Some(1), "launcher {i} after {:?}:\n{text}", started.elapsed());
        assert!(
            text.contains(&format!("weft launch: job failed: {why}")),
            "launcher {i}:\n{text}"
        );
        assert!(!text.contains("panicked"), "launcher {i}:\n{text}");
        if no_workers {
            assert!(!text.contains("[rank"), "launcher {i} started workers:\n{text}");
        }
    }
}

/// `60.<digits unique to this test process and call>`: a `sleep` argument that finds its
/// processes in /proc.
fn unique_seconds() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("60.{}{nanos:09}", std::process::id())
}

/// Node 0's workers waited out WEFT_DIST_TIMEOUT (node 1's failed at once, naming the world
/// sizes): now every launcher fails at once, before starting any worker, with one message naming
/// both values, with or without rendezvous rounds.
#[test]
fn launchers_given_different_nproc_per_node_fail_at_once_naming_both() {
    for (n0, n1, nnodes) in [("2", "1", "2"), ("1", "2", "2"), ("2", "1", "1:2")] {
        let port = free_port().to_string();
        let flags = |rank: &'static str, nproc: &'static str| {
            let mut f = vec!["--nnodes", nnodes, "--node-rank", rank, "--nproc-per-node", nproc];
            f.extend(["--master-port", &port, "--rdzv-last-call", "60", "--stop-timeout", "2"]);
            node(&f, None)
        };
        let mut nodes = [flags("0", n0), flags("1", n1)];
        let why = format!(
            "the launcher with --node-rank 1 (at 127.0.0.1) was given --nproc-per-node {n1}, but node 0's launcher \
             --nproc-per-node {n0}: every node of a job must be given the same --nproc-per-node"
        );
        all_fail(&mut nodes, 30, &why, true);
    }
}

/// Two launchers given the same `--node-rank` started ranks with the same numbers; rank 0 said
/// only that it refused a connection, and every rank waited out WEFT_DIST_TIMEOUT. Now the
/// job fails on every node at once naming the cause: whether the second comes while the
/// launchers wait for each other, or once the workers run.
#[test]
fn two_launchers_given_the_same_node_rank_fail_the_job_naming_it() {
    let why = "two launchers were given --node-rank 1 (the second at 127.0.0.1): every node of a job needs its own \
               --node-rank, 0 to ";
    // a 3-node job given node ranks 0, 1, 1: the third never comes
    let port = free_port().to_string();
    let mut nodes: Vec<Node> = ["0", "1", "1"]
        .iter()
        .map(|rank| node(&["--nnodes", "3", "--node-rank", rank, "--master-port", &port], None))
        .collect();
    all_fail(&mut nodes, 30, &format!("{why}2"), true);

    // a 2-node job running, and a third launcher given node rank 1
    let port = free_port().to_string();
    let seconds = unique_seconds();
    let script = format!("echo started; exec sleep {seconds}");
    let flags = |rank| {
        [
            "--nnodes",
            "2",
            "--node-rank",
            rank,
            "--master-port",
            &port,
            "--stop-timeout",
            "2",
        ]
    };
    let mut nodes = vec![node(&flags("0"), Some(&script)), node(&flags("1"), Some(&script))];
    let running = wait_for(60, || nodes.iter().all(|n| n.stdout().contains("started")));
    assert!(running, "{}\n{}", nodes[0].show(), nodes[1].show());
    nodes.push(node(&flags("1"), Some(&script)));
    all_fail(&mut nodes, 30, &format!("{why}1"), false);
    assert!(
        wait_for(10, || pids_with(&seconds).is_empty()),
        "workers left: {:?}",
        pids_with(&seconds)
    );
}

/// A launcher stopped while it waits for the other nodes leaves its node rank to the next one
/// given it (it is no duplicate): the job then runs.
#[test]
fn a_launcher_stopped_while_waiting_for_the_others_may_be_started_again() {
    let port = free_port().to_string();
    let flags = |rank| ["--nnodes", "3", "--node-rank", rank, "--master-port", &port];
    let mut first = [node(&flags("0"), Some("true")), node(&flags("1"), Some("true"))];
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: kill has no memory effects; the child is this test's
    unsafe { libc::kill(first[1].child.id() as i32, libc::SIGTERM) };
    assert_eq!(first[1].finish(30), Some(143), "{}", first[1].show());
    assert!(
        first[1]
            .stderr()
            .contains("received SIGTERM while waiting for the other nodes; not starting the workers"),
        "{}",
        first[1].show()
    );
    let mut then = [node(&flags("1"), Some("true")), node(&flags("2"), Some("true"))];
    for n in then.iter_mut().chain([&mut first[0]]) {
        assert_eq!(n.finish(60), Some(0), "{}", n.show());
    }
}

/// A two-node elastic job runs; `end` ends node 0's launcher (which serves the store) once
/// both are in the round. Node 1's launcher must stop its worker and exit 1 within the
/// heartbeat timeout (3 s) and a little, saying `why` (all of them). Before, it noticed only when its worker
/// ended (killed) or after the store's reply timeout, 120 s (stopped).
fn node_1_notices_a_lost_node_0(end: i32, why: &[&str]) {
    let port = free_port().to_string();
    let seconds = unique_seconds();
    let script = format!("exec sleep {seconds}");
    let flags = |rank| {
        [
            "--nnodes",
            "1:2",
            "--node-rank",
            rank,
            "--master-port",
            &port,
            "--rdzv-last-call",
            "60",
            "--rdzv-heartbeat-timeout",
            "3",
            "--stop-timeout",
            "2",
        ]
    };
    let mut a = node(&flags("0"), Some(&script));
    let mut b = node(&flags("1"), Some(&script));
    assert!(
        wait_for(60, || b.stderr().contains("rendezvous round 0: 2 node(s)")),
        "{}",
        b.show()
    );
    // SAFETY: kill has no memory effects; the child is this test's
    unsafe { libc::kill(a.child.id() as i32, end) };
    let ended = Instant::now();
    let code = b.finish(30);
    let took = ended.elapsed();
    let _ = (a.child.kill(), a.child.wait());
    assert_eq!(code, Some(1), "{}", b.show());
    assert!(took < Duration::from_secs(15), "{took:?}\n{}", b.show());
    assert!(
        b.stderr().contains(&format!("weft launch: job failed: {}", why[0])),
        "{}",
        b.show()
    );
    assert!(why.iter().all(|w| b.stderr().contains(w)), "{}", b.show());
    assert!(
        wait_for(10, || pids_with(&seconds).is_empty()),
        "workers left: {:?}\n{}",
        pids_with(&seconds),
        b.show()
    );
}

#[test]
fn the_other_nodes_notice_a_killed_node_0() {
    node_1_notices_a_lost_node_0(
        libc::SIGKILL,
        &[
            "lost the launcher with --node-rank 0, which serves the store: the store at 127.0.0.1:",
            "closed the connection",
        ],
    );
}

#[test]
fn the_other_nodes_notice_a_stopped_node_0() {
    node_1_notices_a_lost_node_0(
        libc::SIGSTOP,
        &[
            "the launcher with --node-rank 0, which serves the store at 127.0.0.1:",
            "has not answered for 3 s (--rdzv-heartbeat-timeout",
        ],
    );
}

/// A store that answers but where node 0 never publishes its settings (node 0 runs a weft that
/// does not): node 1's launcher, with and without rendezvous rounds, says so after the 10 s it
/// waits. It said it had lost node 0's launcher before, as if that had crashed.
#[test]
fn settings_never_published_are_not_said_as_a_lost_node_0() {
    let store = weft_dist::store::StoreServer::start("127.0.0.1:0", weft_dist::Token::new("tok-nodes").unwrap())
        .expect("a store");
    let port = store.addr().port().to_string();
    let flags = |nnodes| {
        [
            "--nnodes",
            nnodes,
            "--node-rank",
            "1",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            &port,
        ]
    };
    let mut nodes = [node(&flags("2"), Some("true")), node(&flags("1:2"), Some("true"))];
    for n in nodes.iter_mut() {
        let code = n.finish(40);
        let text = n.show();
        assert_eq!(code, Some(1), "{text}");
        assert!(
            text.contains(
                "weft: error: the launcher with --node-rank 0 did not publish its settings in the store within 10 s \
                 (run the same weft on every node)"
            ),
            "{text}"
        );
        assert!(!text.contains("lost the launcher"), "{text}");
        assert!(!text.contains("[rank"), "started workers:\n{text}");
    }
}
