//! Helpers of the launcher's tests: running a launcher to the end with a deadline, shell-script
//! workers, temporary folders.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const WEFT: &str = env!("CARGO_BIN_EXE_weft");
/// Longest any launcher here may take (they finish in about a second when nothing is wrong).
pub const LIMIT: Duration = Duration::from_secs(180);

/// What a finished launcher left.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    pub fn show(&self) -> String {
        format!(
            "exit {:?} after {:.1} s\n--- stdout\n{}--- stderr\n{}",
            self.code,
            self.elapsed.as_secs_f64(),
            self.stdout,
            self.stderr
        )
    }
}

/// `weft launch` without the variables of an enclosing job, output piped.
pub fn launcher() -> Command {
    let mut cmd = Command::new(WEFT);
    cmd.arg("launch");
    for v in [
        "WEFT_JOB_TOKEN",
        "WEFT_NUM_THREADS",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "WEFT_LAUNCHED",
        "WEFT_RESTART_COUNT",
        "WEFT_ERROR_FILE",
    ] {
        cmd.env_remove(v);
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

/// `weft launch FLAGS -- sh -c SCRIPT` with extra variables.
pub fn sh_job(flags: &[&str], script: &str, env: &[(&str, &str)]) -> Command {
    let mut cmd = launcher();
    cmd.args(flags).args(["--", "sh", "-c", script]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

pub fn reader(mut r: impl Read + Send + 'static) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = r.read_to_end(&mut b);
        let _ = tx.send(b);
    });
    rx
}

/// Waits for `child` (up to LIMIT; killed and reported past it) and collects its output.
pub fn finish(mut child: Child, started: Instant, out: mpsc::Receiver<Vec<u8>>, err: mpsc::Receiver<Vec<u8>>) -> Run {
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            let text = |rx: &mpsc::Receiver<Vec<u8>>| {
                String::from_utf8_lossy(&rx.recv_timeout(Duration::from_secs(5)).unwrap_or_default()).into_owned()
            };
            panic!(
                "weft launch still running after {LIMIT:?}\n--- stdout\n{}--- stderr\n{}",
                text(&out),
                text(&err)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let elapsed = started.elapsed();
    let text = |rx: mpsc::Receiver<Vec<u8>>| {
        String::from_utf8_lossy(&rx.recv_timeout(Duration::from_secs(30)).expect("output ends")).into_owned()
    };
    Run {
        code: status.code(),
        stdout: text(out),
        stderr: text(err),
        elapsed,
    }
}

pub fn run(mut cmd: Command) -> Run {
    let started = Instant::now();
    let mut child = cmd.spawn().expect("weft launch starts");
    let out = reader(child.stdout.take().unwrap());
    let err = reader(child.stderr.take().unwrap());
    finish(child, started, out, err)
}

/// A fresh empty folder under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("weft-launch-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub const ENV_SCRIPT: &str = "echo \"env RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE \
    LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE GROUP_RANK=$GROUP_RANK MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT \
    WEFT_JOB_TOKEN=$WEFT_JOB_TOKEN WEFT_LAUNCHED=$WEFT_LAUNCHED WEFT_RESTART_COUNT=$WEFT_RESTART_COUNT \
    WEFT_NUM_THREADS=$WEFT_NUM_THREADS WEFT_ERROR_FILE=$WEFT_ERROR_FILE\"";

/// The variables each rank printed with ENV_SCRIPT, by global rank.
pub fn env_by_rank(stdout: &str) -> HashMap<usize, HashMap<String, String>> {
    let mut by_rank = HashMap::new();
    for line in stdout.lines() {
        let Some((prefix, rest)) = line.split_once("]: env ") else {
            continue;
        };
        let rank: usize = prefix.strip_prefix("[rank").unwrap().parse().unwrap();
        let vars: HashMap<String, String> = rest
            .split(' ')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(
            vars.get("RANK").map(String::as_str),
            Some(rank.to_string().as_str()),
            "{line}"
        );
        assert!(by_rank.insert(rank, vars).is_none(), "rank {rank} printed twice");
    }
    by_rank
}

/// Runs `weft launch ARGS` and checks it fails with one line on stderr containing `want`.
pub fn refused(args: &[&str], env: &[(&str, &str)], want: &str) -> Run {
    let mut cmd = launcher();
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let r = run(cmd);
    assert!(r.code.is_some_and(|c| c != 0), "{args:?}: {}", r.show());
    assert!(!r.stderr.contains("panicked"), "{args:?}: {}", r.show());
    assert_eq!(r.stderr.trim().lines().count(), 1, "{args:?}: {}", r.show());
    assert!(r.stderr.contains(want), "{args:?}: want {want:?}\n{}", r.show());
    r
}

/// A launcher run in the background, its output gathered as it comes (killed when dropped).
pub struct Node {
    pub child: Child,
    stdout: std::sync::Arc<std::sync::Mutex<String>>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

fn gather(r: impl Read + Send + 'static) -> std::sync::Arc<std::sync::Mutex<String>> {
    use std::io::BufRead;
    let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let to = text.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(r).lines().map_while(Result::ok) {
            let mut t = to.lock().unwrap();
            t.push_str(&line);
            t.push('\n');
        }
    });
    text
}

impl Node {
    /// Spawns `cmd` (its stdout and stderr piped) and starts gathering its output.
    pub fn start(mut cmd: Command) -> Node {
        let mut child = cmd.spawn().expect("weft launch starts");
        let (stdout, stderr) = (
            gather(child.stdout.take().unwrap()),
            gather(child.stderr.take().unwrap()),
        );
        Node { child, stdout, stderr }
    }

    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill has no memory effects; the child is this test's
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Waits up to `secs` for the launcher to exit; its exit code, or None (killed then).
    pub fn finish(&mut self, secs: u64) -> Option<i32> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                // the rest of its output
                std::thread::sleep(Duration::from_millis(200));
                return Some(status.code().unwrap_or(-1));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = (self.child.kill(), self.child.wait());
        None
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn show(&self) -> String {
        format!("--- stdout\n{}--- stderr\n{}", self.stdout(), self.stderr())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = (self.child.kill(), self.child.wait());
    }
}
