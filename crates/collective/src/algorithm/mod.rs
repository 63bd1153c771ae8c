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

/// `data[send]` to read and `data[recv]` to write at the same time.
///
/// # Panics
///
/// When the ranges overlap: the algorithms only ever pair distinct segments.
pub(crate) fn read_and_write<E>(
    data: &mut [E],
    send: std::ops::Range<usize>,
    recv: std::ops::Range<usize>,
) -> (&[E], &mut [E]) {
    if send.end <= recv.start {
        let (head, tail) = data.split_at_mut(recv.start);
        (&head[send], &mut tail[..recv.len()])
    } else {
        assert!(
            recv.end <= send.start,
            "segments {send:?} and {recv:?} overlap"
        );
        let (head, tail) = data.split_at_mut(send.start);
        (&tail[..send.len()], &mut head[recv])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_and_write_gives_the_named_segments_in_either_order() {
        let mut data = [0, 1, 2, 3, 4, 5];
        let (read, write) = read_and_write(&mut data, 0..2, 4..6);
        assert_eq!((read, &*write), (&[0, 1][..], &[4, 5][..]));
        let (read, write) = read_and_write(&mut data, 3..5, 1..3);
        assert_eq!((read, &*write), (&[3, 4][..], &[1, 2][..]));
    }

    #[test]
    fn read_and_write_accepts_empty_segments_at_a_boundary() {
        let mut data = [0, 1, 2];
        let (read, write) = read_and_write(&mut data, 1..1, 1..2);
        assert_eq!((read.len(), &*write), (0, &[1][..]));
        let (read, write) = read_and_write(&mut data, 1..2, 1..1);
        assert_eq!((read, write.len()), (&[1][..], 0));
    }
}
