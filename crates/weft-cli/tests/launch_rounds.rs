//! The launchers of a job on several nodes (run side by side on this machine) while they meet
//! and while node 0's waits for the others: a launcher that went away while it waited is not
//! counted (neither at the meeting nor in a rendezvous round), and node 0's launcher, its workers
//! done, still answers a signal and another node's failure. The test follows the launchers
//! through the store they meet on, so nothing here depends on how fast they are.

mod common;
mod launcher;

use std::time::{Duration, Instant};

use common::free_port;
use launcher::*;
use weft_dist::store::StoreClient;
use weft_dist::Token;

const TOKEN: &str = "tok-rounds";

/// `weft launch FLAGS -- sh -c SCRIPT` with the job's token, started now.
fn node(flags: &[&str], script: &str) -> Node {
    let cmd = sh_job(flags, script, &[("WEFT_JOB_TOKEN", TOKEN), ("WEFT_DIST_TIMEOUT", "60")]);
    Node::start(cmd)
}

/// A connection of the test's own to the store node 0's launcher serves on `port`.
fn store(port: &str) -> StoreClient {
    let token = Token::new(TOKEN).unwrap();
    StoreClient::connect(&format!("127.0.0.1:{port}"), &token, Duration::from_secs(60)).expect("node 0's store")
}

/// Waits up to 60 s until `ready` (asked of the store every 20 ms); panics past it with `what`.
fn until(what: &str, nodes: &[&Node], mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready() {
        let shown: Vec<String> = nodes.iter().map(|n| n.show()).collect();
        assert!(
            Instant::now() < deadline,
            "{what} did not happen:\n{}",
            shown.join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether any of the `nodes` node ranks of rendezvous round `round` marked its workers done.
/// A round's node ranks go by the order the launchers joined it, not by `--node-rank`: node 1's
/// launcher can join before node 0's (which serves the store), so the node rank of a given
/// launcher is not known in advance.
fn any_done(store: &StoreClient, round: u32, nodes: usize) -> bool {
    (0..nodes).any(|r| has(store, &format!("weft/elastic/{round}/done/{r}")))
}

/// The node rank `node`'s launcher had in rendezvous round `round`, from the line it prints
/// when the round closes.
fn round_node(node: &Node, round: u32) -> usize {
    let stderr = node.stderr();
    let head = format!("rendezvous round {round}: ");
    let line = stderr
        .lines()
        .find(|l| l.contains(&head) && l.contains(", this is node "))
        .unwrap_or_else(|| panic!("no line for round {round}:\n{}", node.show()));
    let rest = &line[line.find(", this is node ").unwrap() + ", this is node ".len()..];
    rest.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"))
}

/// Whether the store holds `key`.
fn has(store: &StoreClient, key: &str) -> bool {
    store.get(key, Duration::from_millis(1)).is_ok()
}

/// A launcher that went away while it waited for the others no longer counts as there: the
/// others keep waiting for a launcher of its node rank (before, they started their workers as
/// soon as a third launcher came, and theirs waited in vain for node 1's ranks).
#[test]
fn a_launcher_gone_while_waiting_is_not_counted_at_the_meeting() {
    let port = free_port().to_string();
    let flags = |rank| {
        [
            "--nnodes",
            "3",
            "--node-rank",
            rank,
            "--master-port",
            &port,
            "--stop-timeout",
            "2",
        ]
    };
    let script = "echo worker-of-node-$GROUP_RANK";
    let mut n0 = node(&flags("0"), script);
    let mut n1 = node(&flags("1"), script);
    let s = store(&port);
    until("node 1 arriving", &[&n0, &n1], || {
        s.add("weft/launch/arrived", 0).unwrap_or(0) >= 2
    });
    n1.signal(libc::SIGTERM);
    assert_eq!(n1.finish(60), Some(143), "{}", n1.show());
    let mut n2 = node(&flags("2"), script);
    until("node 2 arriving", &[&n0, &n2], || {
        s.add("weft/launch/arrived", 0).unwrap_or(0) >= 3
    });
    // the launchers there look every 50 ms: a second is plenty to have started (before)
    std::thread::sleep(Duration::from_secs(1));
    for (i, n) in [&mut n0, &mut n2].into_iter().enumerate() {
        assert!(n.running(), "launcher {i} ended:\n{}", n.show());
        assert!(
            !n.stdout().contains("worker-of-node"),
            "launcher {i} started workers:\n{}",
            n.show()
        );
    }
    let mut again = node(&flags("1"), script);
    for (n, rank) in [(&mut n0, 0), (&mut again, 1), (&mut n2, 2)] {
        assert_eq!(n.finish(60), Some(0), "{}", n.show());
        assert!(n.stdout().contains(&format!("worker-of-node-{rank}")), "{}", n.show());
    }
}

/// A launcher killed (SIGKILL) after it joined a rendezvous round, before the round closed, is
/// not counted in it: the round goes on without it (before, it closed with the dead node, and
/// node 0's launcher waited for it until the heartbeat timeout and failed).
#[test]
fn a_launcher_killed_before_its_round_closed_is_not_in_it() {
    let port = free_port().to_string();
    let flags = |rank: &str| -> Vec<String> {
        [
            "--nnodes",
            "1:3",
            "--node-rank",
            rank,
            "--nproc-per-node",
            "1",
            "--max-restarts",
            "1",
            // long enough for node 1 to join and be killed before node 0 closes the round
            // alone, on a loaded machine too
            "--rdzv-last-call",
            "20",
            "--rdzv-heartbeat-timeout",
            "5",
            "--stop-timeout",
            "2",
            "--master-port",
            &port,
        ]
        .map(String::from)
        .to_vec()
    };
    let mut n0 = node(&strs(&flags("0")), "echo node-$GROUP_RANK of $WORLD_SIZE");
    let s = store(&port);
    let n1 = node(&strs(&flags("1")), "echo node-$GROUP_RANK of $WORLD_SIZE");
    until("both joining round 0", &[&n0, &n1], || {
        s.add("weft/elastic/0/joined", 0).unwrap_or(0) >= 2
    });
    assert!(
        !has(&s, "weft/elastic/0/closed"),
        "round 0 closed before the kill:\n{}",
        n0.show()
    );
    n1.signal(libc::SIGKILL);
    assert_eq!(n0.finish(60), Some(0), "{}", n0.show());
    assert!(
        n0.stderr().contains("rendezvous round 0: 1 node(s), this is node 0"),
        "{}",
        n0.show()
    );
    assert!(n0.stdout().contains("node-0 of 1"), "{}", n0.show());
}

/// Elastic flags of a two-node job on `port` for node rank `rank`.
fn two_nodes(rank: &str, port: &str) -> Vec<String> {
    [
        "--nnodes",
        "2",
        "--node-rank",
        rank,
        "--nproc-per-node",
        "1",
        "--max-restarts",
        "1",
        "--rdzv-last-call",
        "1",
        "--stop-timeout",
        "2",
        "--master-port",
        port,
    ]
    .map(String::from)
    .to_vec()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Node 0's launcher, its workers done while it waits for node 1's, ends on a signal with 128 +
/// the signal and says so (before, it exited 0, silently).
#[test]
fn node_0_signalled_while_waiting_for_the_others_exits_with_the_signal() {
    let port = free_port().to_string();
    let mut n0 = node(&strs(&two_nodes("0", &port)), "true");
    let mut n1 = node(&strs(&two_nodes("1", &port)), "exec sleep 120");
    let s = store(&port);
    until("node 0's workers done", &[&n0, &n1], || any_done(&s, 0, 2));
    n0.signal(libc::SIGTERM);
    assert_eq!(n0.finish(60), Some(143), "{}", n0.show());
    assert!(
        n0.stderr()
            .contains("received SIGTERM while waiting for the other nodes' workers to finish"),
        "{}",
        n0.show()
    );
    // node 1 loses the store and stops its worker
    assert_eq!(n1.finish(60), Some(1), "{}", n1.show());
}

/// Node 0's launcher, its workers done, joins the next round when another node's worker fails
/// and restarts remain (before, it exited 0, silently, and the other node lost the store).
#[test]
fn node_0_whose_workers_are_done_restarts_with_the_others() {
    let port = free_port().to_string();
    let dir = common::temp_dir("launch-rounds-restart");
    let go = dir.join("go");
    let mut n0 = node(&strs(&two_nodes("0", &port)), "echo round-$WEFT_RESTART_COUNT");
    // round 0: fails once the test says so (after node 0's workers are done); round 1: succeeds
    let script = format!(
        "if [ \"$WEFT_RESTART_COUNT\" = 0 ]; then while [ ! -e '{}' ]; do sleep 0.05; done; echo boom >&2; exit 3; \
         fi; echo round-$WEFT_RESTART_COUNT",
        go.display()
    );
    let mut n1 = node(&strs(&two_nodes("1", &port)), &script);
    let s = store(&port);
    until("node 0's workers done", &[&n0, &n1], || any_done(&s, 0, 2));
    std::fs::write(&go, b"").unwrap();
    for n in [&mut n0, &mut n1] {
        assert_eq!(n.finish(60), Some(0), "{}", n.show());
        assert!(n.stdout().contains("round-1"), "{}", n.show());
    }
    // the failing launcher's node rank in round 0, as it printed it
    let failed = round_node(&n1, 0);
    assert!(
        n0.stderr().contains(&format!(
            "rank {failed} on node {failed} failed (exit code 3); restarting all workers: rendezvous round 1"
        )),
        "{}",
        n0.show()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Of three nodes with a fixed `--nnodes 3`, node 1's workers finish and its launcher leaves,
/// then a worker on node 2 fails while node 0's launcher waits: no round can have node 1 again,
/// so node 0 ends the job at once, saying so (before, nodes 0 and 2 joined a round that could
/// never fill and waited out the join timeout, 600 s).
#[test]
fn a_failure_after_another_node_finished_ends_the_job() {
    let port = free_port().to_string();
    let dir = common::temp_dir("launch-rounds-finished");
    let go = dir.join("go");
    let three = |rank: &str| -> Vec<String> {
        let mut flags = two_nodes(rank, &port);
        flags[1] = "3".into();
        flags
    };
    let mut n0 = node(&strs(&three("0")), "true");
    let mut n1 = node(&strs(&three("1")), "true");
    let script = format!(
        "while [ ! -e '{}' ]; do sleep 0.05; done; echo boom >&2; exit 3",
        go.display()
    );
    let mut n2 = node(&strs(&three("2")), &script);
    assert_eq!(n1.finish(60), Some(0), "{}", n1.show());
    let s = store(&port);
    // both `true` nodes done (a round's node ranks go by the order the launchers joined)
    until("two nodes' workers done", &[&n0, &n2], || {
        (0..3).filter(|r| has(&s, &format!("weft/elastic/0/done/{r}"))).count() >= 2
    });
    drop(s);
    std::fs::write(&go, b"").unwrap();
    assert_eq!(n0.finish(60), Some(1), "{}", n0.show());
    assert!(
        // node ranks of a round go by the order the launchers joined, not --node-rank
        n0.stderr().contains("failed (exit code 3); no round can follow: node ")
            && n0.stderr().contains(" finished and left"),
        "{}",
        n0.show()
    );
    assert_ne!(n2.finish(60), Some(0), "{}", n2.show());
    let _ = std::fs::remove_dir_all(&dir);
}
