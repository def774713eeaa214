//! One worker process: starting it, forwarding its output line by line with a `[rank{R}]: `
//! prefix, keeping the tail of its stderr, signalling it and reaping it (a worker dropped
//! unreaped is killed and reaped then, so no path leaves a zombie or a stray process).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use crate::error::{Error, Result};
use crate::failure::Record;
use crate::signal::signal_name;

/// A line longer than this (in bytes, without a newline) is forwarded in pieces of this size,
/// so a worker that writes binary junk cannot grow the launcher's memory without bound.
const MAX_LINE: u64 = 1 << 20;

/// The last stderr lines of a worker.
type Tail = Arc<Mutex<VecDeque<String>>>;

/// What a worker is started with.
pub(super) struct Spec<'a> {
    pub program: &'a OsString,
    pub args: &'a [OsString],
    /// Variables set on top of the launcher's environment.
    pub env: Vec<(String, String)>,
    pub rank: usize,
    pub local_rank: usize,
    /// How many stderr lines to keep.
    pub tail_lines: usize,
    /// Where it writes its error record (the `WEFT_ERROR_FILE` in `env`), if it has one.
    pub error_file: Option<PathBuf>,
}

/// A started worker.
pub(super) struct Worker {
    pub rank: usize,
    pub local_rank: usize,
    pub pid: u32,
    child: Child,
    /// Set once the process has been reaped.
    pub status: Option<ExitStatus>,
    /// When the launcher found it exited (within its polling interval).
    pub ended: Option<SystemTime>,
    error_file: Option<PathBuf>,
    readers: Vec<JoinHandle<()>>,
    tail: Tail,
    /// Set once the worker's process group was seen empty after the worker was reaped: its id
    /// (the worker's pid) may then be handed to a new process, whose group must never be
    /// signalled. Looked at on every poll, so the window is one polling interval.
    group_gone: std::cell::Cell<bool>,
}

impl Worker {
    /// Starts the worker in a process group of its own (signals to it reach its children too),
    /// with stdin closed and stdout/stderr forwarded by two reader threads.
    pub(super) fn start(spec: Spec) -> Result<Worker> {
        let mut cmd = Command::new(spec.program);
        cmd.args(spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        #[cfg(target_os = "linux")]
        {
            // SAFETY: getpid before the fork; in the child only async-signal-safe calls.
            let launcher = unsafe { libc::getpid() };
            unsafe {
                cmd.pre_exec(move || {
                    // the worker dies with the launcher, even when the launcher is SIGKILLed
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    if libc::getppid() != launcher {
                        return Err(std::io::Error::other("the launcher exited"));
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().map_err(|e| {
            let why = if e.kind() == std::io::ErrorKind::NotFound {
                "not found (give its path, or the name of a program on PATH)".to_string()
            } else {
                e.to_string()
            };
            Error::Io(format!(
                "cannot start the worker program {}: {why}",
                std::path::Path::new(spec.program).display()
            ))
        })?;
        let tail: Tail = Arc::new(Mutex::new(VecDeque::new()));
        let prefix = format!("[rank{}]: ", spec.rank);
        let mut readers = Vec::with_capacity(2);
        let out = child.stdout.take().expect("stdout is piped");
        let err = child.stderr.take().expect("stderr is piped");
        for (pipe, to_stderr) in [(Box::new(out) as Box<dyn Read + Send>, false), (Box::new(err), true)] {
            let prefix = prefix.clone();
            let keep = to_stderr.then(|| (tail.clone(), spec.tail_lines));
            let name = format!("weft-launch-{}{}", spec.rank, if to_stderr { "e" } else { "o" });
            let reader = std::thread::Builder::new()
                .name(name)
                .spawn(move || forward(pipe, &prefix, to_stderr, keep))
                .map_err(|e| Error::Io(format!("cannot start an output thread for rank {}: {e}", spec.rank)));
            match reader {
                Ok(r) => readers.push(r),
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(e);
                }
            }
        }
        Ok(Worker {
            rank: spec.rank,
            local_rank: spec.local_rank,
            pid: child.id(),
            child,
            status: None,
            ended: None,
            error_file: spec.error_file,
            readers,
            tail,
            group_gone: std::cell::Cell::new(false),
        })
    }

    /// The exit status if the worker has exited (reaping it), else None.
    pub(super) fn poll(&mut self) -> Option<ExitStatus> {
        if self.status.is_some() {
            self.group_alive();
        }
        if self.status.is_none() {
            match self.child.try_wait() {
                Ok(s) => {
                    self.status = s;
                    if s.is_some() {
                        self.ended = Some(SystemTime::now());
                    }
                }
                Err(e) => {
                    weft_core::errln!(
                        "weft launch: cannot wait for rank {} (pid {}): {e}; counting it as failed",
                        self.rank,
                        self.pid
                    );
                    self.status = Some(ExitStatus::from_raw(255 << 8));
                    self.ended = Some(SystemTime::now());
                }
            }
        }
        self.status
    }

    /// Blocks until the worker has exited.
    pub(super) fn wait(&mut self) -> ExitStatus {
        if self.status.is_none() {
            self.status = Some(self.child.wait().unwrap_or_else(|_| ExitStatus::from_raw(255 << 8)));
            self.ended = Some(SystemTime::now());
        }
        self.status.expect("set above")
    }

    /// What the worker wrote to its error file, if it wrote a record there.
    pub(super) fn record(&self) -> Option<Record> {
        crate::failure::read(self.error_file.as_ref()?)
    }

    /// Sends `sig` to the worker's process group (so its children get it too), or to the
    /// worker alone if it left that group. Once the worker has been reaped, to what is left of
    /// its group: the processes it started and left behind.
    pub(super) fn signal(&self, sig: i32) {
        if self.status.is_some() && !self.group_alive() {
            return;
        }
        let pid = self.pid as libc::pid_t;
        // SAFETY: kill has no memory effects. The group id is the worker's pid, which the kernel
        // does not give to a new process while the worker is unreaped or any member of its
        // group lives; a reaped worker's group is signalled only while it was seen alive at
        // the last poll (group_alive), so a pid handed out again after that is not.
        unsafe {
            if libc::kill(-pid, sig) != 0 && self.status.is_none() {
                libc::kill(pid, sig);
            }
        }
    }

    /// Whether the worker has been reaped but processes of its group (children it started and
    /// left behind) still live. Reaps those of them that ended as this process's children (as
    /// happens when the launcher is PID 1 or a subreaper), so they do not count as alive.
    pub(super) fn left_behind(&self) -> bool {
        if self.status.is_none() || self.group_gone.get() {
            return false;
        }
        let pid = self.pid as libc::pid_t;
        // SAFETY: waitpid on the worker's (already reaped) group only reaps members of that
        // group, never another worker (each has a group of its own).
        unsafe { while libc::waitpid(-pid, std::ptr::null_mut(), libc::WNOHANG) > 0 {} }
        self.group_alive()
    }

    /// Whether the reaped worker's process group still has members; once it has none it is
    /// marked gone for good (its id may name another process's group later).
    fn group_alive(&self) -> bool {
        if self.group_gone.get() {
            return false;
        }
        // SAFETY: kill with signal 0 only checks that the group has members we may signal.
        let alive = unsafe { libc::kill(-(self.pid as libc::pid_t), 0) } == 0;
        if !alive {
            self.group_gone.set(true);
        }
        alive
    }

    /// The signal a worker that ended this way was asked to stop by: it exited with 128 +
    /// SIGTERM or SIGINT (the code of a clean stop on that signal, as `weft train`'s), or was
    /// killed by one of them. None for any other end, and while it runs.
    pub(super) fn stop_signal(&self) -> Option<i32> {
        let status = self.status?;
        let sig = status.code().map_or(status.signal(), |c| c.checked_sub(128))?;
        [libc::SIGTERM, libc::SIGINT].contains(&sig).then_some(sig)
    }

    /// Whether both output threads have seen the end of their pipe.
    pub(super) fn output_done(&self) -> bool {
        self.readers.iter().all(|r| r.is_finished())
    }

    /// Joins the output threads that have finished (the others are left running: a child of
    /// the worker may still hold the pipe open).
    pub(super) fn join_output(&mut self) {
        for r in std::mem::take(&mut self.readers) {
            if r.is_finished() {
                let _ = r.join();
            }
        }
    }

    /// The last stderr lines kept.
    pub(super) fn tail(&self) -> Vec<String> {
        self.tail
            .lock()
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // an early return left it (or what it started) running: nothing may outlive its
        // launcher, nor stay a zombie
        self.signal(libc::SIGKILL);
        if self.status.is_none() {
            self.wait();
        }
    }
}

/// While it lives, this process is a child subreaper (Linux): what the workers start and leave
/// behind becomes its child when they exit, so [`Worker::left_behind`] reaps it as soon as it
/// ends, rather than waiting for PID 1 to (which may take seconds, or never happen in a
/// container). The previous setting comes back when it is dropped.
pub(super) struct Reaper {
    #[cfg(target_os = "linux")]
    previous: libc::c_int,
}

impl Reaper {
    pub(super) fn install() -> Reaper {
        #[cfg(target_os = "linux")]
        {
            let mut previous: libc::c_int = 0;
            // SAFETY: prctl reads and sets an attribute of this process; `previous` outlives the call.
            unsafe {
                libc::prctl(libc::PR_GET_CHILD_SUBREAPER, &mut previous as *mut libc::c_int);
                libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong);
            }
            Reaper { previous }
        }
        #[cfg(not(target_os = "linux"))]
        Reaper {}
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        // SAFETY: sets an attribute of this process back.
        unsafe {
            libc::prctl(libc::PR_SET_CHILD_SUBREAPER, self.previous as libc::c_ulong);
        }
    }
}

/// Waits (up to `grace`) for the output threads of every worker to reach the end of their pipes,
/// so nothing a worker wrote before exiting is lost, then joins those that did.
pub(super) fn drain_output(workers: &mut [Worker], grace: Duration) {
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && !workers.iter().all(Worker::output_done) {
        std::thread::sleep(Duration::from_millis(10));
    }
    for w in workers {
        w.join_output();
    }
}

/// Copies `pipe` line by line to the launcher's stdout (or stderr), each line prefixed and
/// written whole under the stream's lock; keeps the last lines in `keep`.
fn forward(pipe: Box<dyn Read + Send>, prefix: &str, to_stderr: bool, keep: Option<(Tail, usize)>) {
    let mut reader = BufReader::with_capacity(64 << 10, pipe);
    let mut buf = Vec::new();
    let mut line = Vec::new();
    loop {
        buf.clear();
        match (&mut reader).take(MAX_LINE).read_until(b'\n', &mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
        let mut body = buf.as_slice();
        if let Some(b) = body.strip_suffix(b"\n") {
            body = b.strip_suffix(b"\r").unwrap_or(b);
        }
        let text = String::from_utf8_lossy(body);
        line.clear();
        line.extend_from_slice(prefix.as_bytes());
        line.extend_from_slice(text.as_bytes());
        line.push(b'\n');
        // a closed launcher stdout must not stop the draining (the worker would block on a full pipe)
        if to_stderr {
            let mut e = std::io::stderr().lock();
            let _ = e.write_all(&line);
        } else {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(&line);
            let _ = o.flush();
        }
        if let Some((tail, n)) = &keep {
            if let Ok(mut t) = tail.lock() {
                if t.len() == *n {
                    t.pop_front();
                }
                if *n > 0 {
                    t.push_back(text.into_owned());
                }
            }
        }
    }
}

/// `exit code 3`, `killed by signal 9 (SIGKILL)`.
pub fn describe(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        format!("exit code {code}")
    } else if let Some(sig) = status.signal() {
        let core = if status.core_dumped() { ", core dumped" } else { "" };
        format!("killed by signal {sig} ({}{core})", signal_name(sig))
    } else {
        status.to_string()
    }
}
