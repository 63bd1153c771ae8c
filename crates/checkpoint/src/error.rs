//! What can go wrong with a checkpoint, naming the file or directory involved.

use std::path::PathBuf;

/// Errors of saving, listing and restoring checkpoints.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The file system refused an operation.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done: "writing", "renaming", "reading", …
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// A checkpoint's files are damaged: truncated, failing their checksum, or unreadable.
    #[error("checkpoint {path} is damaged: {why}")]
    Damaged {
        /// The checkpoint directory or file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The directory holds no intact checkpoint.
    #[error("no intact checkpoint in {dir}")]
    NotFound {
        /// The directory searched.
        dir: PathBuf,
    },
    /// A checkpoint does not fit what restores it: another model, another optimizer.
    #[error("checkpoint does not match: {what}: expected {expected}, found {found}")]
    Mismatch {
        /// What differs, e.g. "variable dense/kernel".
        what: String,
        /// What the restoring side has.
        expected: String,
        /// What the checkpoint holds.
        found: String,
    },
    /// A checkpoint to be saved is malformed (a bad file key, values that do not fill a shape).
    #[error("cannot save checkpoint: {0}")]
    Invalid(String),
}

impl CheckpointError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io {
            action,
            path,
            source,
        }
    }

    pub(crate) fn damaged(path: impl Into<PathBuf>, why: impl Into<String>) -> Self {
        Self::Damaged {
            path: path.into(),
            why: why.into(),
        }
    }
}
