//! The one error type of the crate.

use std::path::PathBuf;

/// Everything that can go wrong building or running a pipeline, or reading data files.
///
/// Each variant says which operation or file failed and why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// A pipeline operation was given an argument it cannot work with.
    #[error("{op}: {reason}")]
    InvalidArgument {
        /// The operation, such as `shard` or `batch`.
        op: &'static str,
        /// What is wrong with the argument.
        reason: String,
    },
    /// A data file is malformed: wrong magic number, bad dimensions, truncated, corrupt.
    #[error("{}: {what}", path.display())]
    BadFile {
        /// The file (or the name of an embedded file).
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// Elements of one batch have different shapes.
    #[error(
        "batch: element {index} has shape {got:?}, but the batch's first element has shape {expected:?}"
    )]
    ShapeMismatch {
        /// Position of the offending element in the batch.
        index: usize,
        /// The first element's shape.
        expected: Vec<usize>,
        /// The offending element's shape.
        got: Vec<usize>,
    },
    /// An iterator state cannot be restored into this pipeline.
    #[error("cannot restore the iterator: {reason}")]
    Restore {
        /// Why not.
        reason: String,
    },
    /// Bytes that do not decode to an element (a damaged cache record).
    #[error("cannot decode an element: {0}")]
    Decode(String),
}

impl DataError {
    pub(crate) fn invalid(op: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            op,
            reason: reason.into(),
        }
    }

    pub(crate) fn bad_file(path: impl Into<PathBuf>, what: impl Into<String>) -> Self {
        Self::BadFile {
            path: path.into(),
            what: what.into(),
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}
