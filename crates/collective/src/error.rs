//! Typed failures of collectives: every one names the operation, the sequence number and the
//! peer involved, so a hang never has to be debugged — it cannot happen.

use std::time::Duration;

use crate::header::Op;

/// Why a collective failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CollectiveError {
    /// Peers did not answer within the timeout.
    #[error("{op} #{seq} timed out after {timeout:?} waiting for rank(s) {missing_ranks:?}")]
    Timeout {
        /// The collective.
        op: Op,
        /// Its sequence number on this communicator.
        seq: u64,
        /// The ranks that had not delivered.
        missing_ranks: Vec<usize>,
        /// The timeout that expired.
        timeout: Duration,
    },
    /// A peer's process or connection is gone.
    #[error("rank {rank} ({address}) was lost: {reason}")]
    PeerLost {
        /// The lost rank.
        rank: usize,
        /// Its address, or `in-process`.
        address: String,
        /// What was observed (connection reset, end of stream, …).
        reason: String,
    },
    /// Ranks disagree about the collective they are running.
    #[error("mismatch with rank {peer}: {what} is {got} there but {expected} here")]
    Mismatch {
        /// What differs: operation, element count, element type, sequence, reduction.
        what: &'static str,
        /// This rank's value.
        expected: String,
        /// The peer's value.
        got: String,
        /// The peer.
        peer: usize,
    },
    /// Another rank failed and told everyone.
    #[error("rank {origin} aborted {op} #{seq}: {reason}")]
    Aborted {
        /// The collective.
        op: Op,
        /// Its sequence number.
        seq: u64,
        /// The rank that failed first.
        origin: usize,
        /// Its error.
        reason: String,
    },
    /// An earlier collective failed; this communicator no longer runs collectives, since its
    /// peers may be anywhere in the protocol.
    #[error("the communicator is broken by an earlier failure: {cause}")]
    Broken {
        /// The failure that broke it.
        cause: String,
    },
    /// Arguments that cannot work (a root that is not a rank, buffers of the wrong size).
    #[error("{op}: {why}")]
    InvalidArgument {
        /// The collective.
        op: &'static str,
        /// What is wrong.
        why: String,
    },
    /// Setting up the transport failed (binding, connecting, the rendezvous).
    #[error("setting up the transport: {0}")]
    Setup(String),
}
