//! The job token and the challenge-response every connection runs before anything else.
//!
//! Both sides prove they know the token without sending it: the client sends a fresh nonce, the
//! server answers with its own nonce and `HMAC-SHA256(token, role | "server" | client nonce |
//! server nonce)`, the client checks that and answers with the same MAC over `"client"` and the
//! nonces in the other order, and the server replies with one status byte. Fresh nonces on both
//! sides mean a recorded exchange cannot be replayed; the role ("store", "mesh") keeps a MAC for
//! one service from being accepted by another.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::{io, Error, Result};

const MAGIC: &[u8; 8] = b"WEFTAUTH";
const NONCE: usize = 32;
const MAC: usize = 32;
/// How long either side waits for the other's handshake message: a stranger that connects and
/// says nothing is dropped after this.
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

fn with_timeout<T>(s: &mut TcpStream, f: impl FnOnce(&mut TcpStream) -> Result<T>) -> Result<T> {
    let peer = s.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
    s.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(|e| io(&peer, e))?;
    s.set_write_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(|e| io(&peer, e))?;
    let r = f(s);
    s.set_read_timeout(None).map_err(|e| io(&peer, e))?;
    s.set_write_timeout(None).map_err(|e| io(&peer, e))?;
    r
}

/// Proves to the server at the other end of `s` that this side knows `token`, and checks that
/// the server does too. `what` names the server in errors.
pub fn client_handshake(s: &mut TcpStream, token: &Token, role: &str, what: &str) -> Result<()> {
    with_timeout(s, |s| {
        let cn = nonce()?;
        let e = |err| io(format!("handshake with {what}"), err);
        s.write_all(MAGIC).map_err(e)?;
        s.write_all(&cn).map_err(e)?;
        let mut sn = [0u8; NONCE];
        let mut smac = [0u8; MAC];
        s.read_exact(&mut sn).map_err(e)?;
        s.read_exact(&mut smac).map_err(e)?;
        if token.mac(role, b"server", &cn, &sn).verify_slice(&smac).is_err() {
            return Err(Error::Auth(format!(
                "{what} does not know this job's token (WEFT_JOB_TOKEN differs)"
            )));
        }
        let cmac = token.mac(role, b"client", &sn, &cn).finalize().into_bytes();
        s.write_all(&cmac).map_err(e)?;
        let mut ok = [0u8; 1];
        s.read_exact(&mut ok).map_err(e)?;
        if ok[0] != 1 {
            return Err(Error::Auth(format!("{what} refused this connection's token")));
        }
        Ok(())
    })
}

/// Checks that the client at the other end of `s` knows `token` (and proves this side does).
pub fn server_handshake(s: &mut TcpStream, token: &Token, role: &str) -> Result<()> {
    with_timeout(s, |s| {
        let e = |err| io("handshake", err);
        let mut magic = [0u8; 8];
        s.read_exact(&mut magic).map_err(e)?;
        if &magic != MAGIC {
            return Err(Error::Auth("the peer does not speak weft's protocol".into()));
        }
        let mut cn = [0u8; NONCE];
        s.read_exact(&mut cn).map_err(e)?;
        let sn = nonce()?;
        let smac = token.mac(role, b"server", &cn, &sn).finalize().into_bytes();
        s.write_all(&sn).map_err(e)?;
        s.write_all(&smac).map_err(e)?;
        let mut cmac = [0u8; MAC];
        s.read_exact(&mut cmac).map_err(e)?;
        let ok = token.mac(role, b"client", &sn, &cn).verify_slice(&cmac).is_ok();
        // a client that lacks the token learns only that it was refused
        let _ = s.write_all(&[ok as u8]);
        if ok {
            Ok(())
        } else {
            Err(Error::Auth("wrong job token".into()))
        }
    })
}
