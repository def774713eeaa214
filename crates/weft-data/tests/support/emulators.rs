//! Real object-store emulators on loopback for the tests, each a child process on a free port with
//! its own scratch folder, stopped (killed and reaped, its folder removed) when dropped:
//!
//! - [`Azurite`]: Microsoft's Azure Blob Storage emulator (`azurite-blob`, from npm), for `az://`;
//! - [`FakeGcs`]: `fake-gcs-server`, a Google Cloud Storage emulator, for reading `gs://`: it
//!   serves the XML API's GET and HEAD that object_store reads with, but refuses its plain object
//!   PUT (`invalid uploadType`), so objects go in through its JSON upload API ([`FakeGcs::upload`]).
//!
//! `tools/store-emulators/install.sh` installs both under `.cache/store-emulators/bin` of the
//! repository; a command of the same name on `PATH` is used otherwise. When one is absent, its
//! `start` prints one `skipped: ...` line to stderr and returns `None`, and the test returns.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};
use weft_data::store::StoreOptions;

/// The install script named in the skip lines.
const INSTALL: &str = "tools/store-emulators/install.sh";

/// How long an emulator may take to accept connections (node starts slowly on a busy machine).
const READY_WITHIN: Duration = Duration::from_secs(30);

/// Azurite's well-known account (the one every Azurite serves).
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";
/// Its well-known key (base64).
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// `command` under `.cache/store-emulators/bin` of the repository, else on `PATH`.
pub fn find(command: &str) -> Option<PathBuf> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cached = repo.join(".cache/store-emulators/bin").join(command);
    if cached.is_file() {
        return Some(cached);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(command))
        .find(|p| p.is_file())
}

/// A loopback port that was free a moment ago and that no other emulator of this process was
/// given. (The system may hand the same free port to two tests that ask at once; an emulator that
/// then fails to bind it would look ready while the other one answers on its port, and be
/// refused once that one stops.)
fn free_port() -> std::io::Result<u16> {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
        if !given.contains(&port) {
            given.push(port);
            return Ok(port);
        }
    }
}

/// A fresh scratch folder for one emulator.
fn scratch(tag: &str) -> std::io::Result<PathBuf> {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("weft-emulator-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

/// One emulator process, its port and scratch folder (which holds its log).
pub struct Emulator {
    name: &'static str,
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Emulator {
    /// Starts `program` with the arguments `args(port, dir)` on a free loopback port, up to three
    /// times (another process may take the port between the choice and the bind), and waits until
    /// it accepts connections. The error carries the end of its log.
    fn start(name: &'static str, program: &Path, args: impl Fn(u16, &Path) -> Vec<String>) -> Result<Emulator, String> {
        let mut last = String::new();
        for _ in 0..3 {
            let dir = scratch(name).map_err(|e| format!("{name}: scratch folder: {e}"))?;
            let port = free_port().map_err(|e| format!("{name}: no free port: {e}"))?;
            let log = std::fs::File::create(dir.join("log")).map_err(|e| format!("{name}: log file: {e}"))?;
            let log2 = log.try_clone().map_err(|e| format!("{name}: log file: {e}"))?;
            let child = Command::new(program)
                .args(args(port, &dir))
                .current_dir(&dir)
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log2)
                .spawn()
                .map_err(|e| format!("{name}: cannot run {}: {e}", program.display()))?;
            let mut em = Emulator { name, child, port, dir };
            match em.wait_ready() {
                Ok(()) => return Ok(em),
                Err(e) => last = e, // dropping `em` stops it and removes its folder
            }
        }
        Err(last)
    }

    /// Waits until the port accepts connections; an error if the process exits or the time is up.
    fn wait_ready(&mut self) -> Result<(), String> {
        let t = Instant::now();
        while t.elapsed() < READY_WITHIN {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("{} exited ({status}) at start: {}", self.name, self.log_tail()));
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                // something listens; an emulator that lost the port to another process exits
                // at once (its bind failed), so it must still be running a moment later
                std::thread::sleep(Duration::from_millis(200));
                if let Ok(Some(status)) = self.child.try_wait() {
                    return Err(format!("{} exited ({status}) at start: {}", self.name, self.log_tail()));
                }
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!(
            "{} did not listen on 127.0.0.1:{} within {READY_WITHIN:?}: {}",
            self.name,
            self.port,
            self.log_tail()
        ))
    }

    /// The last lines of the emulator's output, for messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Finds `command` or prints the one skip line for `name` and gives `None`; starts it with
/// `args`, panicking (a real failure, not an absence) when it is there but does not come up.
fn start_or_skip(name: &'static str, command: &str, args: impl Fn(u16, &Path) -> Vec<String>) -> Option<Emulator> {
    let Some(program) = find(command) else {
        eprintln!("skipped: {name} not installed (run {INSTALL})");
        return None;
    };
    match Emulator::start(name, &program, args) {
        Ok(em) => Some(em),
        Err(e) => panic!("{e}"),
    }
}

/// An HTTP/1.1 response: status code and body (as text, for messages).
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The body, lossily decoded (chunked bodies keep their chunk lines).
    pub body: String,
}

/// Sends one request to `127.0.0.1:port` on a fresh connection (`Connection: close`) and reads the
/// whole response.
pub fn http(
    port: u16,
    method: &str,
    target: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> std::io::Result<Response> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut req = format!(
        "{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    s.write_all(body)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {text:?}")))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok(Response { status, body })
}

/// Azurite's blob service, with `az://` settings for weft's store.
pub struct Azurite {
    em: Emulator,
}

impl Azurite {
    /// Starts `azurite-blob` (data in its scratch folder, telemetry off), or prints the skip line
    /// and gives `None` when it is not installed.
    pub fn start() -> Option<Azurite> {
        let em = start_or_skip("azurite", "azurite-blob", |port, dir| {
            let dir = dir.join("data").display().to_string();
            [
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                &port.to_string(),
                "--location",
                &dir,
                "--silent",
                "--disableTelemetry",
                "--skipApiVersionCheck",
                "--disableProductStyleUrl",
            ]
            .map(String::from)
            .to_vec()
        })?;
        Some(Azurite { em })
    }

    /// The emulator process.
    pub fn emulator(&self) -> &Emulator {
        &self.em
    }

    /// The account's blob endpoint, `http://127.0.0.1:PORT/devstoreaccount1`.
    pub fn account_url(&self) -> String {
        format!("{}/{AZURITE_ACCOUNT}", self.em.endpoint())
    }

    /// Store settings for this emulator: the well-known account and key (or `key` instead), its
    /// endpoint, plain HTTP.
    pub fn options_with_key(&self, key: &str, retry_for: Duration) -> StoreOptions {
        StoreOptions {
            retry_for,
            config: vec![
                ("azure_storage_account_name".into(), AZURITE_ACCOUNT.into()),
                ("azure_storage_account_key".into(), key.into()),
                ("azure_storage_endpoint".into(), self.account_url()),
                ("azure_allow_http".into(), "true".into()),
            ],
        }
    }

    /// [`Azurite::options_with_key`] with the well-known key.
    pub fn options(&self, retry_for: Duration) -> StoreOptions {
        self.options_with_key(AZURITE_KEY, retry_for)
    }

    /// Creates container `name` (Create Container, signed with the account's shared key).
    pub fn create_container(&self, name: &str) -> Result<(), String> {
        let version = "2021-08-06";
        let date = http_date(SystemTime::now());
        let path = format!("/{AZURITE_ACCOUNT}/{name}");
        // Shared Key: the verb, eleven standard headers (all empty here; a zero Content-Length is
        // empty), the x-ms-* headers, then the canonical resource with its query parameters
        let to_sign = format!(
            "PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{version}\n/{AZURITE_ACCOUNT}{path}\nrestype:container"
        );
        let key = base64_decode(AZURITE_KEY).ok_or("the account key is not base64")?;
        let signature = base64_encode(&hmac_sha256(&key, to_sign.as_bytes()));
        let headers = [
            ("x-ms-date", date),
            ("x-ms-version", version.to_string()),
            ("Authorization", format!("SharedKey {AZURITE_ACCOUNT}:{signature}")),
        ];
        let r = http(self.em.port, "PUT", &format!("{path}?restype=container"), &headers, b"")
            .map_err(|e| format!("azurite: create container {name}: {e}"))?;
        if r.status == 201 {
            Ok(())
        } else {
            Err(format!(
                "azurite: create container {name}: HTTP {}: {}",
                r.status, r.body
            ))
        }
    }
}

/// fake-gcs-server over plain HTTP with in-memory storage, with `gs://` settings for weft's store.
pub struct FakeGcs {
    em: Emulator,
}

impl FakeGcs {
    /// Starts `fake-gcs-server`, or prints the skip line and gives `None` when it is not
    /// installed.
    pub fn start() -> Option<FakeGcs> {
        let em = start_or_skip("fake-gcs-server", "fake-gcs-server", |port, _| {
            let host = format!("127.0.0.1:{port}");
            [
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                &port.to_string(),
                "-backend",
                "memory",
                // path-style object URLs (`/bucket/object`) are served for this host
                "-public-host",
                &host,
                "-external-url",
                &format!("http://{host}"),
                "-log-level",
                "warn",
            ]
            .map(String::from)
            .to_vec()
        })?;
        Some(FakeGcs { em })
    }

    /// The emulator process.
    pub fn emulator(&self) -> &Emulator {
        &self.em
    }

    /// Store settings for this emulator: a service-account key that points the client at it and
    /// turns OAuth off, plain HTTP.
    pub fn options(&self, retry_for: Duration) -> StoreOptions {
        gcs_options(&self.em.endpoint(), retry_for)
    }

    /// Writes object `name` of `bucket` (JSON API media upload, `POST /upload/storage/v1/b/..`).
    pub fn upload(&self, bucket: &str, name: &str, bytes: &[u8]) -> Result<(), String> {
        let target = format!(
            "/upload/storage/v1/b/{bucket}/o?uploadType=media&name={}",
            query_escape(name)
        );
        let headers = [("Content-Type", "application/octet-stream".to_string())];
        let r = http(self.em.port, "POST", &target, &headers, bytes)
            .map_err(|e| format!("fake-gcs-server: upload {bucket}/{name}: {e}"))?;
        if r.status == 200 {
            Ok(())
        } else {
            Err(format!(
                "fake-gcs-server: upload {bucket}/{name}: HTTP {}: {}",
                r.status, r.body
            ))
        }
    }

    /// Creates bucket `name` (JSON API `POST /storage/v1/b`).
    pub fn create_bucket(&self, name: &str) -> Result<(), String> {
        let body = format!(r#"{{"name": "{name}"}}"#);
        let headers = [("Content-Type", "application/json".to_string())];
        let r = http(self.em.port, "POST", "/storage/v1/b", &headers, body.as_bytes())
            .map_err(|e| format!("fake-gcs-server: create bucket {name}: {e}"))?;
        if r.status == 200 {
            Ok(())
        } else {
            Err(format!(
                "fake-gcs-server: create bucket {name}: HTTP {}: {}",
                r.status, r.body
            ))
        }
    }
}

/// Store settings that point object_store's GCS client at `endpoint` with OAuth off (a
/// service-account key with `gcs_base_url` and `disable_oauth`), over plain HTTP.
fn gcs_options(endpoint: &str, retry_for: Duration) -> StoreOptions {
    let key = format!(
        r#"{{"private_key": "", "private_key_id": "", "client_email": "", "gcs_base_url": "{endpoint}", "disable_oauth": true}}"#
    );
    StoreOptions {
        retry_for,
        config: vec![
            ("google_service_account_key".into(), key),
            ("google_allow_http".into(), "true".into()),
        ],
    }
}

/// `s` percent-encoded for a URL query value (everything but unreserved characters).
fn query_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// HMAC-SHA-256 (RFC 2104).
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |x: u8| block.map(|b| b ^ x);
    let inner = Sha256::new().chain_update(pad(0x36)).chain_update(message).finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding.
pub fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Standard base64 (padding optional); `None` for any other character.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.trim_end_matches('=').bytes() {
        let v = B64.iter().position(|&b| b == c)? as u32;
        acc = acc << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// `t` as an HTTP date (RFC 1123, GMT), e.g. `Fri, 04 Dec 2026 20:31:39 GMT`.
pub fn http_date(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // civil date from days since 1970-01-01 (Howard Hinnant's algorithm)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{}, {day:02} {} {year} {:02}:{:02}:{:02} GMT",
        WEEKDAYS[days.rem_euclid(7) as usize],
        MONTHS[(month - 1) as usize],
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}
