//! A headless Chromium driven through the Chrome DevTools Protocol over a pipe
//! (`--remote-debugging-pipe`: commands on the browser's fd 3, answers on its fd 4, each a JSON
//! message ended by a NUL byte), for tests that watch a page change over time.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The system's Chromium, when installed (tools/browser/install.sh).
pub fn chromium() -> Option<&'static str> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
}

/// A page in a headless browser, closed (with the browser) when dropped.
pub struct Page {
    child: Child,
    commands: std::fs::File,
    answers: Receiver<Value>,
    session: String,
    next_id: u64,
    profile: PathBuf,
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds: [RawFd; 2] = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened and are owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

impl Page {
    /// Starts `chromium` headless with a `width` x `height` window and opens `url` in it.
    pub fn open(chromium: &str, url: &str, profile: PathBuf, width: u32, height: u32) -> Page {
        use std::os::fd::AsRawFd;
        let (cmd_read, cmd_write) = pipe();
        let (ans_read, ans_write) = pipe();
        let (r, w) = (cmd_read.as_raw_fd(), ans_write.as_raw_fd());
        let mut command = Command::new(chromium);
        command
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--remote-debugging-pipe",
            ])
            .arg(format!("--window-size={width},{height}"))
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls (fcntl, dup2, close) between fork and exec. The pipe
        // ends are first copied above 9 so that dup2 onto 3 and 4 never aliases its source.
        unsafe {
            command.pre_exec(move || {
                let a = libc::fcntl(r, libc::F_DUPFD, 10);
                let b = libc::fcntl(w, libc::F_DUPFD, 10);
                if a < 0 || b < 0 || libc::dup2(a, 3) < 0 || libc::dup2(b, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // the copies above 9 lost close-on-exec: only 3 and 4 go to the browser
                libc::close(a);
                libc::close(b);
                Ok(())
            });
        }
        let child = command.spawn().expect("start chromium");
        drop((cmd_read, ans_write));
        let (tx, answers) = channel();
        let reader = std::fs::File::from(ans_read);
        std::thread::spawn(move || {
            let mut reader = BufReader::new(reader);
            let mut message = Vec::new();
            while matches!(reader.read_until(0, &mut message), Ok(n) if n > 0) {
                if message.last() == Some(&0) {
                    message.pop();
                }
                if let Ok(v) = serde_json::from_slice::<Value>(&message) {
                    if tx.send(v).is_err() {
                        break;
                    }
                }
                message.clear();
            }
        });
        let mut page = Page {
            child,
            commands: std::fs::File::from(cmd_write),
            answers,
            session: String::new(),
            next_id: 0,
            profile,
        };
        let target = page.call("Target.createTarget", json!({ "url": "about:blank" }));
        let target_id = target["targetId"].as_str().expect("a target id").to_string();
        let attached = page.call(
            "Target.attachToTarget",
            json!({ "targetId": target_id, "flatten": true }),
        );
        page.session = attached["sessionId"].as_str().expect("a session id").to_string();
        page.call("Page.enable", json!({}));
        page.call("Page.navigate", json!({ "url": url }));
        page
    }

    /// Sends `method` with `params` (to the page once attached) and waits for its result.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if !self.session.is_empty() {
            message["sessionId"] = json!(self.session);
        }
        let mut bytes = message.to_string().into_bytes();
        bytes.push(0);
        self.commands.write_all(&bytes).expect("write to chromium");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.answers.recv_timeout(left) {
                Ok(v) if v["id"] == json!(id) => {
                    assert!(v.get("error").is_none(), "{method}: {}", v["error"]);
                    return v["result"].clone();
                }
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => panic!("{method}: no answer from chromium in 60 s"),
                Err(RecvTimeoutError::Disconnected) => panic!("{method}: chromium closed its pipe"),
            }
        }
    }

    /// The value of JavaScript `expression` in the page (promises awaited).
    pub fn eval(&mut self, expression: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
        );
        assert!(
            r.get("exceptionDetails").is_none(),
            "{expression}: {}",
            r["exceptionDetails"]
        );
        r["result"]["value"].clone()
    }

    /// Evaluates `expression` every 100 ms until `done` holds for its value; that value, or a
    /// panic naming `what` and the last value after `timeout`.
    pub fn wait_for(
        &mut self,
        what: &str,
        expression: &str,
        timeout: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.eval(expression);
            if done(&v) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {timeout:?}; last value {v}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Writes a PNG of the page's viewport to `path`.
    pub fn screenshot(&mut self, path: &Path) {
        use base64::Engine;
        let r = self.call("Page.captureScreenshot", json!({ "format": "png" }));
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().expect("screenshot data"))
            .expect("base64 screenshot");
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        std::fs::write(path, png).expect("write the screenshot");
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}
