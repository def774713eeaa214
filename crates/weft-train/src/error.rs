//! The trainer's error type: one line naming the culprit (key, path, tensor, step).

/// Anything that stops a run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad or missing config file or key.
    #[error("config: {0}")]
    Config(String),
    /// From the tensor core (shapes, ids out of range, files).
    #[error(transparent)]
    Core(#[from] weft_core::Error),
    /// From a dataset.
    #[error(transparent)]
    Data(#[from] weft_data::Error),
    /// From the communication runtime (a failed or mismatched peer, a bad job environment).
    #[error(transparent)]
    Dist(#[from] weft_dist::Error),
    /// Checkpoint and metrics files.
    #[error("{0}")]
    Io(String),
    /// A non-finite loss and similar run failures.
    #[error("{0}")]
    Run(String),
}

/// `Result` with the trainer's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
