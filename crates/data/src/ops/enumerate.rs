use crate::dataset::{Cardinality, Dataset, ElementStream};
use crate::error::DataError;
use crate::fingerprint::Fingerprint;

/// The dataset of [`Dataset::enumerate`].
#[derive(Clone)]
pub struct Enumerate<D> {
    inner: D,
}

impl<D> Enumerate<D> {
    pub(crate) fn new(inner: D) -> Self {
        Self { inner }
    }
}

impl<D: Dataset> Dataset for Enumerate<D> {
    fn options(&self) -> crate::DatasetOptions {
        self.inner.options()
    }

    type Item = (u64, D::Item);
    type Stream = EnumerateStream<D::Stream>;

    fn stream(&self, epoch: u64) -> Result<Self::Stream, DataError> {
        self.stream_at(epoch, 0)
    }

    fn stream_at(&self, epoch: u64, offset: u64) -> Result<Self::Stream, DataError> {
        Ok(EnumerateStream {
            inner: self.inner.stream_at(epoch, offset)?,
            index: offset,
        })
    }

    fn cardinality(&self) -> Cardinality {
        self.inner.cardinality()
    }

    fn fingerprint(&self, fp: &mut Fingerprint) {
        fp.str("enumerate");
        self.inner.fingerprint(fp);
    }

    fn file_count(&self) -> Option<usize> {
        self.inner.file_count()
    }

    fn shard_files(&self, num_shards: usize, index: usize) -> Option<Self> {
        Some(Self {
            inner: self.inner.shard_files(num_shards, index)?,
        })
    }
}

/// The stream of [`Enumerate`].
pub struct EnumerateStream<S> {
    inner: S,
    index: u64,
}

impl<S: ElementStream> ElementStream for EnumerateStream<S> {
    type Item = (u64, S::Item);

    fn next_element(&mut self) -> Option<Result<Self::Item, DataError>> {
        let item = self.inner.next_element()?;
        self.index += 1;
        Some(item.map(|x| (self.index - 1, x)))
    }

    fn advance(&mut self, n: u64) -> Result<u64, DataError> {
        let skipped = self.inner.advance(n)?;
        self.index += skipped;
        Ok(skipped)
    }
}
