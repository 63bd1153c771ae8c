//! Collective algorithms over a [`Session`](crate::session::Session): which rank sends what to
//! whom, in which order. Reductions happen in an order fixed by the ranks alone, so results
//! are bit-identical from run to run, and identical on every rank.

pub(crate) mod ring;
pub(crate) mod tree;

/// How an all-reduce moves data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Reduce-scatter then all-gather around a ring: every link carries `2(n−1)/n` of the
    /// buffer, the bandwidth-optimal choice for large buffers.
    Ring,
    /// Reduce up a binary tree then broadcast down: `2·log₂ n` steps, the latency-optimal
    /// choice for small buffers.
    Tree,
}

impl Algorithm {
    /// The name used in logs and flight records.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ring => "ring",
            Self::Tree => "tree",
        }
    }
}

/// Segment `index` of `len` elements cut into `parts` nearly equal, contiguous pieces.
pub(crate) fn segment(len: usize, parts: usize, index: usize) -> std::ops::Range<usize> {
    (index * len / parts)..((index + 1) * len / parts)
}
