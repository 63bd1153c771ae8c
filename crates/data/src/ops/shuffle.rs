use rand_core::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

use crate::dataset::{Cardinality, Dataset, ElementStream};
use crate::error::DataError;
use crate::fingerprint::Fingerprint;

/// The dataset of [`Dataset::shuffle`].
#[derive(Clone)]
pub struct Shuffle<D> {
    inner: D,
    buffer_size: usize,
    seed: u64,
    reshuffle_each_iteration: bool,
}

impl<D> Shuffle<D> {
    pub(crate) fn new(
        inner: D,
        buffer_size: usize,
        seed: u64,
        reshuffle_each_iteration: bool,
    ) -> Self {
        Self {
            inner,
            buffer_size,
            seed,
            reshuffle_each_iteration,
        }
    }
}

/// `SplitMix64`'s finaliser: spreads nearby seeds (0, 1, 2 …) over the whole state space.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl<D: Dataset> Dataset for Shuffle<D> {
    fn options(&self) -> crate::DatasetOptions {
        self.inner.options()
    }

    type Item = D::Item;
    type Stream = ShuffleStream<D::Stream>;

    fn stream(&self, epoch: u64) -> Result<Self::Stream, DataError> {
        if self.buffer_size == 0 {
            return Err(DataError::invalid(
                "shuffle",
                "buffer_size must be at least 1",
            ));
        }
        // The whole random state of a pass is a function of the seed and the epoch: that is
        // what lets a restored iterator reproduce the order exactly.
        let pass = if self.reshuffle_each_iteration {
            epoch
        } else {
            0
        };
        Ok(ShuffleStream {
            inner: self.inner.stream(epoch)?,
            buffer: Vec::with_capacity(self.buffer_size.min(1 << 20)),
            capacity: self.buffer_size,
            rng: Pcg64Mcg::seed_from_u64(mix(self.seed ^ mix(pass))),
            inner_done: false,
        })
    }

    fn cardinality(&self) -> Cardinality {
        self.inner.cardinality()
    }

    fn fingerprint(&self, fp: &mut Fingerprint) {
        fp.str("shuffle")
            .u64(self.buffer_size as u64)
            .u64(self.seed)
            .u64(u64::from(self.reshuffle_each_iteration));
        self.inner.fingerprint(fp);
    }

    fn file_count(&self) -> Option<usize> {
        self.inner.file_count()
    }

    fn shard_files(&self, num_shards: usize, index: usize) -> Option<Self> {
        Some(Self {
            inner: self.inner.shard_files(num_shards, index)?,
            ..*self
        })
    }
}

/// The stream of [`Shuffle`]: `tf.data`'s algorithm — fill a buffer, then repeatedly emit a
/// random buffered element and put the next input element in its place.
pub struct ShuffleStream<S: ElementStream> {
    inner: S,
    buffer: Vec<S::Item>,
    capacity: usize,
    rng: Pcg64Mcg,
    inner_done: bool,
}

impl<S: ElementStream> ShuffleStream<S> {
    /// A uniform index below `n` (Lemire's multiply-and-reject), the same on every platform.
    fn index_below(&mut self, n: usize) -> usize {
        let n = n as u64;
        let threshold = n.wrapping_neg() % n;
        loop {
            let product = u128::from(self.rng.next_u64()) * u128::from(n);
            if (product as u64) >= threshold {
                return (product >> 64) as usize;
            }
        }
    }
}

impl<S: ElementStream> ElementStream for ShuffleStream<S> {
    type Item = S::Item;

    fn next_element(&mut self) -> Option<Result<S::Item, DataError>> {
        while !self.inner_done && self.buffer.len() < self.capacity {
            match self.inner.next_element() {
                Some(Ok(item)) => self.buffer.push(item),
                // The buffer is kept: the next call carries on where this one stopped.
                Some(Err(e)) => return Some(Err(e)),
                None => self.inner_done = true,
            }
        }
        if self.buffer.is_empty() {
            return None;
        }
        let pick = self.index_below(self.buffer.len());
        Some(Ok(self.buffer.swap_remove(pick)))
    }
}
