use crate::dataset::{Cardinality, Dataset, ElementStream};
use crate::error::DataError;
use crate::fingerprint::Fingerprint;

/// The dataset of [`Dataset::shard`].
#[derive(Clone)]
pub struct Shard<D> {
    inner: D,
    num_shards: u64,
    index: u64,
}

impl<D> Shard<D> {
    pub(crate) fn new(inner: D, num_shards: usize, index: usize) -> Result<Self, DataError> {
        if num_shards == 0 {
            return Err(DataError::invalid("shard", "num_shards must be at least 1"));
        }
        if index >= num_shards {
            return Err(DataError::invalid(
                "shard",
                format!("index {index} must be below num_shards {num_shards}"),
            ));
        }
        Ok(Self {
            inner,
            num_shards: num_shards as u64,
            index: index as u64,
        })
    }
}

impl<D: Dataset> Dataset for Shard<D> {
    fn options(&self) -> crate::DatasetOptions {
        self.inner.options()
    }

    type Item = D::Item;
    type Stream = ShardStream<D::Stream>;

    fn stream(&self, epoch: u64) -> Result<Self::Stream, DataError> {
        self.stream_at(epoch, 0)
    }

    fn stream_at(&self, epoch: u64, offset: u64) -> Result<Self::Stream, DataError> {
        // Element k of the shard is element index + k * num_shards of the input.
        let start = offset
            .saturating_mul(self.num_shards)
            .saturating_add(self.index);
        Ok(ShardStream {
            inner: self.inner.stream_at(epoch, start)?,
            num_shards: self.num_shards,
            at_own_element: true,
        })
    }

    fn cardinality(&self) -> Cardinality {
        let (num, index) = (self.num_shards, self.index);
        self.inner
            .cardinality()
            .map(|n| n.saturating_sub(index).div_ceil(num))
    }

    fn fingerprint(&self, fp: &mut Fingerprint) {
        fp.str("shard").u64(self.num_shards).u64(self.index);
        self.inner.fingerprint(fp);
    }
}

/// The stream of [`Shard`].
pub struct ShardStream<S> {
    inner: S,
    num_shards: u64,
    /// Whether the input is positioned at one of this shard's elements.
    at_own_element: bool,
}

impl<S: ElementStream> ShardStream<S> {
    /// Moves the input to this shard's next element; `false` at the end.
    fn seek(&mut self) -> Result<bool, DataError> {
        if self.at_own_element {
            return Ok(true);
        }
        let gap = self.num_shards - 1;
        self.at_own_element = self.inner.advance(gap)? == gap;
        Ok(self.at_own_element)
    }
}

impl<S: ElementStream> ElementStream for ShardStream<S> {
    type Item = S::Item;

    fn next_element(&mut self) -> Option<Result<S::Item, DataError>> {
        match self.seek() {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => return Some(Err(e)),
        }
        self.at_own_element = false;
        self.inner.next_element()
    }

    fn advance(&mut self, n: u64) -> Result<u64, DataError> {
        let mut skipped = 0;
        while skipped < n && self.seek()? {
            self.at_own_element = false;
            if self.inner.advance(1)? == 0 {
                break;
            }
            skipped += 1;
        }
        Ok(skipped)
    }
}
