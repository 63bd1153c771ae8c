//! What can go wrong deciding where variables live, and serving them.

/// A setting or a shape a partitioner or a placement cannot use; a request a parameter server
/// refuses; a connection that fails.
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
    /// A request that does not fit the shard it names (lengths, rows, an unknown shard).
    #[error("shard {shard}: {why}")]
    Request {
        /// The shard, as `variable/index`.
        shard: String,
        /// Why not.
        why: String,
    },
    /// The optimizer's settings or its update failed.
    #[error("the optimizer of shard {shard}: {why}")]
    Optimizer {
        /// The shard, as `variable/index`.
        shard: String,
        /// The optimizer's words.
        why: String,
    },
    /// Bytes that are not a message of the protocol, or a frame over the size limit.
    #[error("malformed message from {peer}: {why}")]
    Wire {
        /// Who sent it.
        peer: String,
        /// What is wrong with it.
        why: String,
    },
    /// The connection failed: refused, closed, timed out, or the handshake did not prove the
    /// cluster secret.
    #[error("connection to {peer}: {why}")]
    Connection {
        /// The other end.
        peer: String,
        /// The cause.
        why: String,
    },
    /// A scheduled step failed on the worker that ran it, in its words.
    #[error("step {step} failed on {worker}: {why}")]
    Step {
        /// The step's registered name.
        step: String,
        /// The worker that ran it.
        worker: String,
        /// Its words.
        why: String,
    },
    /// The coordinator was shut down before the step ran.
    #[error("the coordinator shut down before step {step} ran")]
    Cancelled {
        /// The step's registered name.
        step: String,
    },
    /// The parameter server refused the request, in its words.
    #[error("parameter server {peer} refused the request: {why}")]
    Refused {
        /// The server.
        peer: String,
        /// Its words.
        why: String,
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
