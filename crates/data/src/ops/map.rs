use std::collections::VecDeque;
use std::sync::Arc;

use rayon::prelude::*;

use crate::dataset::{Cardinality, Dataset, ElementStream, Shared};
use crate::error::DataError;
use crate::fingerprint::Fingerprint;

/// Elements handed to rayon at once: large enough to amortise the fork-join, small enough that
/// a consumer taking a few elements does not wait for many.
const CHUNK: usize = 256;

/// The dataset of [`Dataset::map`].
pub struct Map<D, F> {
    inner: D,
    f: Shared<F>,
}

impl<D, F> Map<D, F> {
    pub(crate) fn new(inner: D, f: F) -> Self {
        Self {
            inner,
            f: Arc::new(f),
        }
    }
}

impl<D: Clone, F> Clone for Map<D, F> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            f: Arc::clone(&self.f),
        }
    }
}

impl<D, F, U> Dataset for Map<D, F>
where
    D: Dataset,
    U: Send + 'static,
    F: Fn(D::Item) -> U + Send + Sync + 'static,
{
    fn options(&self) -> crate::DatasetOptions {
        self.inner.options()
    }

    type Item = U;
    type Stream = MapStream<D::Stream, F, U>;

    fn stream(&self, epoch: u64) -> Result<Self::Stream, DataError> {
        self.stream_at(epoch, 0)
    }

    fn stream_at(&self, epoch: u64, offset: u64) -> Result<Self::Stream, DataError> {
        // One element in, one out: position the input and compute nothing that is skipped.
        Ok(MapStream {
            inner: self.inner.stream_at(epoch, offset)?,
            f: Arc::clone(&self.f),
            ready: VecDeque::new(),
        })
    }

    fn cardinality(&self) -> Cardinality {
        self.inner.cardinality()
    }

    fn fingerprint(&self, fp: &mut Fingerprint) {
        fp.str("map").str(std::any::type_name::<F>());
        self.inner.fingerprint(fp);
    }

    fn file_count(&self) -> Option<usize> {
        self.inner.file_count()
    }

    fn shard_files(&self, num_shards: usize, index: usize) -> Option<Self> {
        Some(Self {
            inner: self.inner.shard_files(num_shards, index)?,
            f: Arc::clone(&self.f),
        })
    }
}

/// The stream of [`Map`]: reads a chunk, maps it in parallel, yields it in order.
pub struct MapStream<S, F, U> {
    inner: S,
    f: Shared<F>,
    ready: VecDeque<Result<U, DataError>>,
}

impl<S, F, U> ElementStream for MapStream<S, F, U>
where
    S: ElementStream,
    U: Send + 'static,
    F: Fn(S::Item) -> U + Send + Sync + 'static,
{
    type Item = U;

    fn next_element(&mut self) -> Option<Result<U, DataError>> {
        if self.ready.is_empty() {
            let mut inputs = Vec::with_capacity(CHUNK);
            let mut error = None;
            while inputs.len() < CHUNK {
                match self.inner.next_element() {
                    Some(Ok(x)) => inputs.push(x),
                    Some(Err(e)) => {
                        error = Some(e);
                        break;
                    }
                    None => break,
                }
            }
            let f = &*self.f;
            let outputs: Vec<U> = if inputs.len() > 1 {
                inputs.into_par_iter().map(f).collect()
            } else {
                inputs.into_iter().map(f).collect()
            };
            self.ready.extend(outputs.into_iter().map(Ok));
            self.ready.extend(error.map(Err));
        }
        self.ready.pop_front()
    }

    fn advance(&mut self, n: u64) -> Result<u64, DataError> {
        let mut skipped = 0;
        while skipped < n {
            match self.ready.pop_front() {
                Some(Ok(_)) => skipped += 1,
                Some(Err(e)) => return Err(e),
                None => return Ok(skipped + self.inner.advance(n - skipped)?),
            }
        }
        Ok(skipped)
    }
}
