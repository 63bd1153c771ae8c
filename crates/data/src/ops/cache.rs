use std::sync::{Arc, OnceLock};

use crate::dataset::{Cardinality, Dataset, ElementStream, advance_by_reading};
use crate::error::DataError;
use crate::fingerprint::Fingerprint;

/// The dataset of [`Dataset::cache`].
pub struct Cache<D: Dataset> {
    inner: D,
    store: Arc<OnceLock<Arc<[D::Item]>>>,
}

impl<D: Dataset> Cache<D> {
    pub(crate) fn new(inner: D) -> Self {
        Self {
            inner,
            store: Arc::new(OnceLock::new()),
        }
    }
}

impl<D: Dataset> Clone for Cache<D> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            store: Arc::clone(&self.store),
        }
    }
}

impl<D> Dataset for Cache<D>
where
    D: Dataset,
    D::Item: Clone + Sync,
{
    fn options(&self) -> crate::DatasetOptions {
        self.inner.options()
    }

    type Item = D::Item;
    type Stream = CacheStream<D::Stream>;

    fn stream(&self, epoch: u64) -> Result<Self::Stream, DataError> {
        self.stream_at(epoch, 0)
    }

    fn stream_at(&self, _epoch: u64, offset: u64) -> Result<Self::Stream, DataError> {
        if let Some(items) = self.store.get() {
            let pos = usize::try_from(offset)
                .unwrap_or(usize::MAX)
                .min(items.len());
            return Ok(CacheStream::Replay {
                items: Arc::clone(items),
                pos,
            });
        }
        // The cache holds the first pass, whatever epoch asks first; filling goes through
        // every element, so skipped ones are recorded too.
        let mut stream = CacheStream::Fill {
            inner: self.inner.stream(0)?,
            seen: Vec::new(),
            store: Arc::clone(&self.store),
            failed: false,
        };
        stream.advance(offset)?;
        Ok(stream)
    }

    fn cardinality(&self) -> Cardinality {
        self.inner.cardinality()
    }

    fn fingerprint(&self, fp: &mut Fingerprint) {
        // A cache replays its input unchanged: it adds nothing to what the pipeline computes.
        self.inner.fingerprint(fp);
    }
}

/// The stream of [`Cache`]: filling during the first pass, replaying after.
pub enum CacheStream<S: ElementStream> {
    /// The first pass: reading the input and keeping every element.
    Fill {
        /// The input.
        inner: S,
        /// Elements seen so far.
        seen: Vec<S::Item>,
        /// Where the complete pass goes.
        store: Arc<OnceLock<Arc<[S::Item]>>>,
        /// An error was met: this pass is not cached.
        failed: bool,
    },
    /// Later passes: reading from memory.
    Replay {
        /// The cached pass.
        items: Arc<[S::Item]>,
        /// The next element.
        pos: usize,
    },
}

impl<S> ElementStream for CacheStream<S>
where
    S: ElementStream,
    S::Item: Clone + Sync,
{
    type Item = S::Item;

    fn next_element(&mut self) -> Option<Result<S::Item, DataError>> {
        match self {
            Self::Replay { items, pos } => {
                let item = items.get(*pos)?.clone();
                *pos += 1;
                Some(Ok(item))
            }
            Self::Fill {
                inner,
                seen,
                store,
                failed,
            } => match inner.next_element() {
                Some(Ok(item)) => {
                    if !*failed {
                        seen.push(item.clone());
                    }
                    Some(Ok(item))
                }
                Some(Err(e)) => {
                    *failed = true;
                    seen.clear();
                    Some(Err(e))
                }
                None => {
                    if !*failed {
                        // Another stream may have filled it first; either copy is the same pass.
                        let _ = store.set(std::mem::take(seen).into());
                    }
                    None
                }
            },
        }
    }

    fn advance(&mut self, n: u64) -> Result<u64, DataError> {
        match self {
            Self::Replay { items, pos } => {
                let skipped = usize::try_from(n)
                    .unwrap_or(usize::MAX)
                    .min(items.len() - *pos);
                *pos += skipped;
                Ok(skipped as u64)
            }
            Self::Fill { .. } => advance_by_reading(self, n),
        }
    }
}
