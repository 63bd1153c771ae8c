use crate::dataset::{Cardinality, Dataset, ElementStream};
use crate::error::DataError;
use crate::fingerprint::Fingerprint;

/// The dataset of [`Dataset::take`].
#[derive(Clone)]
pub struct Take<D> {
    inner: D,
    count: u64,
}

impl<D> Take<D> {
    pub(crate) fn new(inner: D, count: u64) -> Self {
        Self { inner, count }
    }
}

impl<D: Dataset> Dataset for Take<D> {
    fn options(&self) -> crate::DatasetOptions {
        self.inner.options()
    }

    type Item = D::Item;
    type Stream = TakeStream<D::Stream>;

    fn stream(&self, epoch: u64) -> Result<Self::Stream, DataError> {
        self.stream_at(epoch, 0)
    }

    fn stream_at(&self, epoch: u64, offset: u64) -> Result<Self::Stream, DataError> {
        let offset = offset.min(self.count);
        Ok(TakeStream {
            inner: self.inner.stream_at(epoch, offset)?,
            remaining: self.count - offset,
        })
    }

    fn cardinality(&self) -> Cardinality {
        match self.inner.cardinality() {
            Cardinality::Finite(n) => Cardinality::Finite(n.min(self.count)),
            Cardinality::Infinite => Cardinality::Finite(self.count),
            Cardinality::Unknown if self.count == 0 => Cardinality::Finite(0),
            Cardinality::Unknown => Cardinality::Unknown,
        }
    }

    fn fingerprint(&self, fp: &mut Fingerprint) {
        fp.str("take").u64(self.count);
        self.inner.fingerprint(fp);
    }
}

/// The stream of [`Take`].
pub struct TakeStream<S> {
    inner: S,
    remaining: u64,
}

impl<S: ElementStream> ElementStream for TakeStream<S> {
    type Item = S::Item;

    fn next_element(&mut self) -> Option<Result<S::Item, DataError>> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        self.inner.next_element()
    }

    fn advance(&mut self, n: u64) -> Result<u64, DataError> {
        let skipped = self.inner.advance(n.min(self.remaining))?;
        self.remaining -= skipped;
        Ok(skipped)
    }
}

/// The dataset of [`Dataset::skip`].
#[derive(Clone)]
pub struct Skip<D> {
    inner: D,
    count: u64,
}

impl<D> Skip<D> {
    pub(crate) fn new(inner: D, count: u64) -> Self {
        Self { inner, count }
    }
}

impl<D: Dataset> Dataset for Skip<D> {
    fn options(&self) -> crate::DatasetOptions {
        self.inner.options()
    }

    type Item = D::Item;
    type Stream = D::Stream;

    fn stream(&self, epoch: u64) -> Result<Self::Stream, DataError> {
        self.stream_at(epoch, 0)
    }

    fn stream_at(&self, epoch: u64, offset: u64) -> Result<Self::Stream, DataError> {
        self.inner
            .stream_at(epoch, self.count.saturating_add(offset))
    }

    fn cardinality(&self) -> Cardinality {
        let count = self.count;
        self.inner.cardinality().map(|n| n.saturating_sub(count))
    }

    fn fingerprint(&self, fp: &mut Fingerprint) {
        fp.str("skip").u64(self.count);
        self.inner.fingerprint(fp);
    }
}
