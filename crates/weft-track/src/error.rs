//! The store's errors: each names the file (or the run) it is about.

use std::path::PathBuf;

/// What went wrong with a store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file is not a SQLite database, or is damaged.
    #[error("{path}: not a weft run store, or a damaged one ({reason})")]
    Corrupt { path: PathBuf, reason: String },
    /// The file was written by a newer weft, with a schema this one does not know.
    #[error("{path}: schema version {found} is newer than this weft's ({known}); use a newer weft to read it")]
    NewerSchema { path: PathBuf, found: i64, known: i64 },
    /// A run named on the command line is not in the store.
    #[error("{0}")]
    UnknownRun(String),
    /// A value the store does not take (a metric that is not a finite number).
    #[error("{0}")]
    Invalid(String),
    /// A `--filter` expression that does not parse (its position and what was expected).
    #[error("{0}")]
    Filter(String),
    /// Another SQLite error, with the file it happened on.
    #[error("{path}: {source}")]
    Sql {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    /// The store's folder could not be made or read.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The store's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// Attaches `path` to SQLite errors.
pub(crate) trait SqlContext<T> {
    fn at(self, path: &std::path::Path) -> Result<T>;
}

impl<T> SqlContext<T> for rusqlite::Result<T> {
    fn at(self, path: &std::path::Path) -> Result<T> {
        self.map_err(|source| sql_error(path, source))
    }
}

/// A SQLite error on `path`: a damaged or foreign file becomes [`Error::Corrupt`].
pub(crate) fn sql_error(path: &std::path::Path, source: rusqlite::Error) -> Error {
    use rusqlite::ffi::ErrorCode;
    match source.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => Error::Corrupt {
            path: path.to_path_buf(),
            reason: source.to_string(),
        },
        _ => Error::Sql {
            path: path.to_path_buf(),
            source,
        },
    }
}

/// `value` quoted for an error message, its first 80 characters only (then `...` and its length
/// in bytes): text read from a file or given by a client may be long.
pub(crate) fn quoted(value: &str) -> String {
    match value.char_indices().nth(80) {
        None => format!("{value:?}"),
        Some((end, _)) => format!("{:?}... ({} bytes)", &value[..end], value.len()),
    }
}
