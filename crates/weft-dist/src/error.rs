//! The crate's error type. Every message names the culprit: the rank, the operation (with its
//! sequence number in its group), the key or the address.

/// What went wrong in the communication runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad environment variable, argument or call (wrong tensor size, rank out of range).
    #[error("{0}")]
    Invalid(String),
    /// A socket could not be opened, read or written; the message says which and why.
    #[error("{0}")]
    Io(String),
    /// A connection did not prove it knows the job token (or this side could not prove it).
    #[error("authentication failed: {0}")]
    Auth(String),
    /// A peer died, closed its connection or aborted while this rank waited on it.
    #[error("{0}")]
    PeerFailed(String),
    /// Nothing arrived from a peer within the timeout.
    #[error("{0}")]
    Timeout(String),
    /// Two ranks called different collectives (op, dtype, size or order) at the same point.
    #[error("{0}")]
    Mismatch(String),
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] weft_core::Error),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl From<Error> for weft_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Tensor(t) => t,
            other => weft_core::Error::Io(other.to_string()),
        }
    }
}

/// An `Io` error with context: `what` (e.g. "connecting to the store at 10.0.0.1:29500").
pub(crate) fn io(what: impl std::fmt::Display, e: std::io::Error) -> Error {
    Error::Io(format!("{what}: {e}"))
}
