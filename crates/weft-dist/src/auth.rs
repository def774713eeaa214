//! The job token and the challenge-response every connection runs before anything else.
//!
//! Both sides prove they know the token without sending it: the client sends a fresh nonce, the
//! server answers with its own nonce and `HMAC-SHA256(token, role | "server" | client nonce |
//! server nonce)`, the client checks that and answers with the same MAC over `"client"` and the
//! nonces in the other order, and the server replies with one status byte. Fresh nonces on both
//! sides mean a recorded exchange cannot be replayed; the role ("store", "mesh") keeps a MAC for
//! one service from being accepted by another.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::{io, Error, Result};

const MAGIC: &[u8; 8] = b"WEFTAUTH";
const NONCE: usize = 32;
const MAC: usize = 32;
/// How long a whole handshake may take, each side's messages together: a stranger that connects
/// and says nothing, or sends a byte now and then, is dropped after this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The job's shared secret. Its text is used as the HMAC key.
#[derive(Clone)]
pub struct Token(Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// A token from its text; empty text is refused.
    pub fn new(text: &str) -> Result<Token> {
        if text.is_empty() {
            return Err(Error::Invalid(
                "WEFT_JOB_TOKEN is empty; it must be a shared secret".into(),
            ));
        }
        Ok(Token(text.as_bytes().to_vec()))
    }

    /// `WEFT_JOB_TOKEN` when set.
    pub fn from_env() -> Result<Option<Token>> {
        match std::env::var("WEFT_JOB_TOKEN") {
            Ok(t) => Token::new(&t).map(Some),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(Error::Invalid("WEFT_JOB_TOKEN is not valid UTF-8".into())),
        }
    }

    /// A fresh random token (32 random bytes as hex), as the launcher makes for a job.
    pub fn generate() -> Result<Token> {
        let mut b = [0u8; 32];
        getrandom::fill(&mut b).map_err(|e| Error::Io(format!("no randomness for the job token: {e}")))?;
        Ok(Token(hex(&b).into_bytes()))
    }

    /// The token's text (to pass to workers in `WEFT_JOB_TOKEN`).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }

    fn mac(&self, role: &str, side: &[u8], first: &[u8], second: &[u8]) -> Hmac<Sha256> {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC accepts keys of any length");
        m.update(role.as_bytes());
        m.update(side);
        m.update(first);
        m.update(second);
        m
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn nonce() -> Result<[u8; NONCE]> {
    let mut n = [0u8; NONCE];
    getrandom::fill(&mut n).map_err(|e| Error::Io(format!("no randomness for a handshake nonce: {e}")))?;
    Ok(n)
}

/// The error of a handshake that ran past `HANDSHAKE_TIMEOUT`.
fn too_slow() -> std::io::Error {
    std::io::Error::new(
        ErrorKind::TimedOut,
        format!("no complete handshake within {} s", HANDSHAKE_TIMEOUT.as_secs()),
    )
}

/// The socket timeout for an operation that must end by `deadline`; a timed-out error when it
/// has passed.
fn left(deadline: Instant) -> std::io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(too_slow())
    } else {
        Ok(left)
    }
}

/// Fills `buf` from `s` by `deadline` (however the peer spreads its bytes); a timeout says so
/// in words rather than as the socket's "resource temporarily unavailable".
pub(crate) fn read_exact_by(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        s.set_read_timeout(Some(left(deadline)?))?;
        match s.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    ErrorKind::UnexpectedEof,
                    "the peer closed the connection",
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return Err(too_slow()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes `buf` to `s` by `deadline`.
fn write_all_by(s: &mut TcpStream, buf: &[u8], deadline: Instant) -> std::io::Result<()> {
    s.set_write_timeout(Some(left(deadline)?))?;
    s.write_all(buf).map_err(|e| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => too_slow(),
        _ => e,
    })
}

/// Runs `f` (which sets the socket's timeouts as it goes) and clears the timeouts after.
fn clearing_timeouts<T>(s: &mut TcpStream, f: impl FnOnce(&mut TcpStream) -> Result<T>) -> Result<T> {
    let peer = s.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
    let r = f(s);
    s.set_read_timeout(None).map_err(|e| io(&peer, e))?;
    s.set_write_timeout(None).map_err(|e| io(&peer, e))?;
    r
}

/// Proves to the server at the other end of `s` that this side knows `token`, and checks that
/// the server does too. `what` names the server in errors.
pub fn client_handshake(s: &mut TcpStream, token: &Token, role: &str, what: &str) -> Result<()> {
    let by = Instant::now() + HANDSHAKE_TIMEOUT;
    clearing_timeouts(s, |s| {
        let cn = nonce()?;
        let e = |err| io(format!("handshake with {what}"), err);
        let mut hello = MAGIC.to_vec();
        hello.extend_from_slice(&cn);
        write_all_by(s, &hello, by).map_err(e)?;
        let mut sn = [0u8; NONCE];
        let mut smac = [0u8; MAC];
        read_exact_by(s, &mut sn, by).map_err(e)?;
        read_exact_by(s, &mut smac, by).map_err(e)?;
        if token.mac(role, b"server", &cn, &sn).verify_slice(&smac).is_err() {
            return Err(Error::Auth(format!(
                "{what} does not know this job's token (WEFT_JOB_TOKEN differs)"
            )));
        }
        let cmac = token.mac(role, b"client", &sn, &cn).finalize().into_bytes();
        write_all_by(s, &cmac, by).map_err(e)?;
        let mut ok = [0u8; 1];
        read_exact_by(s, &mut ok, by).map_err(e)?;
        if ok[0] != 1 {
            return Err(Error::Auth(format!("{what} refused this connection's token")));
        }
        Ok(())
    })
}

/// Checks that the client at the other end of `s` knows `token` (and proves this side does),
/// all of it by `by` (at most [`HANDSHAKE_TIMEOUT`] after the connection was accepted).
pub fn server_handshake(s: &mut TcpStream, token: &Token, role: &str, by: Instant) -> Result<()> {
    clearing_timeouts(s, |s| {
        let e = |err| io("handshake", err);
        let mut magic = [0u8; 8];
        read_exact_by(s, &mut magic, by).map_err(e)?;
        if &magic != MAGIC {
            return Err(Error::Auth("the peer does not speak weft's protocol".into()));
        }
        let mut cn = [0u8; NONCE];
        read_exact_by(s, &mut cn, by).map_err(e)?;
        let sn = nonce()?;
        let mut answer = sn.to_vec();
        answer.extend_from_slice(&token.mac(role, b"server", &cn, &sn).finalize().into_bytes());
        write_all_by(s, &answer, by).map_err(e)?;
        let mut cmac = [0u8; MAC];
        read_exact_by(s, &mut cmac, by).map_err(e)?;
        let ok = token.mac(role, b"client", &sn, &cn).verify_slice(&cmac).is_ok();
        // a client that lacks the token learns only that it was refused
        let _ = write_all_by(s, &[ok as u8], by);
        if ok {
            Ok(())
        } else {
            Err(Error::Auth("wrong job token".into()))
        }
    })
}
