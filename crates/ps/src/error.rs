//! What can go wrong deciding where variables live.

/// A setting or a shape a partitioner or a placement cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PsError {
    /// A setting out of its range, named with what it must be.
    #[error("{what} must be {must}, not {got}")]
    Setting {
        /// The setting.
        what: &'static str,
        /// What it must be.
        must: &'static str,
        /// What it was.
        got: usize,
    },
    /// A shape a partitioner cannot split.
    #[error("cannot partition a variable of shape {shape:?}: {why}")]
    Shape {
        /// The variable's shape.
        shape: Vec<usize>,
        /// Why not.
        why: &'static str,
    },
}

/// `got`, or [`PsError::Setting`] when it is 0.
pub(crate) fn at_least_one(what: &'static str, got: usize) -> Result<usize, PsError> {
    if got == 0 {
        return Err(PsError::Setting {
            what,
            must: "at least 1",
            got,
        });
    }
    Ok(got)
}
