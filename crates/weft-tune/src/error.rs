//! The sweep's errors: each names the file, key or trial it is about, in one line.

use std::path::PathBuf;

/// What went wrong with a sweep.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The sweep file (or a value in it) is not valid: the file, the key and why.
    #[error("{0}")]
    Spec(String),
    /// A file could not be read, or a trial's process could not be started or waited for.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The run store could not be read or written.
    #[error(transparent)]
    Track(#[from] weft_track::Error),
    /// The store holds a state this sweep cannot go on from (a trial still running elsewhere,
    /// a finished sweep started again without `--resume`).
    #[error("{0}")]
    State(String),
}

/// The sweep's result type.
pub type Result<T> = std::result::Result<T, Error>;
