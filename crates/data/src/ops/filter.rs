use std::sync::Arc;

use crate::dataset::{Cardinality, Dataset, ElementStream, Shared};
use crate::error::DataError;
use crate::fingerprint::Fingerprint;

/// The dataset of [`Dataset::filter`].
pub struct Filter<D, P> {
    inner: D,
    predicate: Shared<P>,
}

impl<D, P> Filter<D, P> {
    pub(crate) fn new(inner: D, predicate: P) -> Self {
        Self {
            inner,
            predicate: Arc::new(predicate),
        }
    }
}

impl<D: Clone, P> Clone for Filter<D, P> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            predicate: Arc::clone(&self.predicate),
        }
    }
}

impl<D, P> Dataset for Filter<D, P>
where
    D: Dataset,
    P: Fn(&D::Item) -> bool + Send + Sync + 'static,
{
    fn options(&self) -> crate::DatasetOptions {
        self.inner.options()
    }

    type Item = D::Item;
    type Stream = FilterStream<D::Stream, P>;

    fn stream(&self, epoch: u64) -> Result<Self::Stream, DataError> {
        Ok(FilterStream {
            inner: self.inner.stream(epoch)?,
            predicate: Arc::clone(&self.predicate),
        })
    }

    fn cardinality(&self) -> Cardinality {
        match self.inner.cardinality() {
            Cardinality::Finite(0) => Cardinality::Finite(0),
            _ => Cardinality::Unknown,
        }
    }

    fn fingerprint(&self, fp: &mut Fingerprint) {
        fp.str("filter").str(std::any::type_name::<P>());
        self.inner.fingerprint(fp);
    }

    fn file_count(&self) -> Option<usize> {
        self.inner.file_count()
    }

    fn shard_files(&self, num_shards: usize, index: usize) -> Option<Self> {
        Some(Self {
            inner: self.inner.shard_files(num_shards, index)?,
            predicate: Arc::clone(&self.predicate),
        })
    }
}

/// The stream of [`Filter`].
pub struct FilterStream<S, P> {
    inner: S,
    predicate: Shared<P>,
}

impl<S, P> ElementStream for FilterStream<S, P>
where
    S: ElementStream,
    P: Fn(&S::Item) -> bool + Send + Sync + 'static,
{
    type Item = S::Item;

    fn next_element(&mut self) -> Option<Result<S::Item, DataError>> {
        loop {
            match self.inner.next_element()? {
                Ok(item) if !(self.predicate)(&item) => {}
                other => return Some(other),
            }
        }
    }
}
