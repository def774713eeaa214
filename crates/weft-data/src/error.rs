//! The one error type of `weft-data`.
//!
//! Every message names what is at fault: the file path, the line and column of a CSV value, the
//! tensor of a safetensors file, the character and position of an untokenizable input, or the split
//! and sizes of a dataset too small for the batch asked of it.

use std::path::PathBuf;

/// What went wrong while loading data or building a batch.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error from `weft-core` (a tensor op, or reading a safetensors file).
    #[error(transparent)]
    Core(#[from] weft_core::Error),

    /// A file could not be read (missing, unreadable, not UTF-8, bad gzip stream).
    #[error("{}: {source}", path.display())]
    Io {
        /// The file that could not be read.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },

    /// A CSV value or row that could not be accepted. `line` and `column` are 1-based; `column` is
    /// `None` when the whole row is at fault (a ragged row).
    #[error("{}:{line}{}: {msg}", path.display(), column.map(|c| format!(": column {c}")).unwrap_or_default())]
    Csv {
        /// The CSV file.
        path: PathBuf,
        /// 1-based line number in the (decompressed) file.
        line: usize,
        /// 1-based column number, when one value is at fault.
        column: Option<usize>,
        /// What is wrong with it.
        msg: String,
    },

    /// A character that is not in the tokenizer's vocabulary.
    #[error("character {ch:?} at position {position} (in chars) is not in the vocabulary")]
    UnknownChar {
        /// The character.
        ch: char,
        /// Its index in the input, counted in chars.
        position: usize,
    },

    /// A token id outside `0..vocab_size`.
    #[error("token id {id} at position {position} is out of range 0..{vocab_size}")]
    TokenOutOfRange {
        /// The id.
        id: i64,
        /// Its index in the input slice.
        position: usize,
        /// The vocabulary size.
        vocab_size: usize,
    },

    /// Anything else that could not be accepted (bad arguments, malformed tokenizer JSON, splits too
    /// small for the batch asked, missing or mismatched tensors); the message says what and where.
    #[error("{0}")]
    Invalid(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Shorthand for [`Error::Invalid`].
pub(crate) fn invalid(msg: impl Into<String>) -> Error {
    Error::Invalid(msg.into())
}
