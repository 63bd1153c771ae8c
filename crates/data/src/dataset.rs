//! The `Dataset` trait: a recipe for a stream of elements that can be iterated many times
//! (once per epoch), resumed at any position, and composed like `tf.data`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::batch::{Batch, Batchable};
use crate::element::Element;
use crate::error::DataError;
use crate::fingerprint::Fingerprint;
use crate::ops::{
    Cache, Enumerate, FileCache, Filter, Map, Prefetch, Repeat, Shard, Shuffle, Skip, Take, Zip,
};

/// How many elements a dataset yields per epoch, when that is known without iterating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cardinality {
    /// Exactly this many.
    Finite(u64),
    /// It never ends (`repeat()` of a non-empty dataset).
    Infinite,
    /// Only iterating tells (after `filter`, say).
    Unknown,
}

impl Cardinality {
    /// Applies `f` to a finite count and keeps the other cases.
    #[must_use]
    pub fn map(self, f: impl FnOnce(u64) -> u64) -> Self {
        match self {
            Self::Finite(n) => Self::Finite(f(n)),
            other => other,
        }
    }

    /// The finite count, if there is one.
    pub fn finite(self) -> Option<u64> {
        match self {
            Self::Finite(n) => Some(n),
            _ => None,
        }
    }
}

/// The low-level iterator every pipeline stage implements: elements that may fail, plus a way
/// to skip ahead cheaply. Users iterate through [`Iter`], which adds position tracking.
pub trait ElementStream: Send + 'static {
    /// The element type.
    type Item: Send + 'static;

    /// The next element, an error, or `None` at the end of the epoch.
    fn next_element(&mut self) -> Option<Result<Self::Item, DataError>>;

    /// Skips up to `n` elements and returns how many were skipped (fewer only at the end).
    /// Stages override it when they can skip without computing the elements.
    ///
    /// # Errors
    ///
    /// The first error met while skipping.
    fn advance(&mut self, n: u64) -> Result<u64, DataError> {
        advance_by_reading(self, n)
    }
}

/// Skips up to `n` elements by producing and dropping them: the default of
/// [`ElementStream::advance`], and the fallback of stages that can skip only some of the time.
///
/// # Errors
///
/// The first error met while skipping.
pub fn advance_by_reading<S: ElementStream + ?Sized>(
    stream: &mut S,
    n: u64,
) -> Result<u64, DataError> {
    let mut skipped = 0;
    while skipped < n {
        match stream.next_element() {
            None => break,
            Some(Err(e)) => return Err(e),
            Some(Ok(_)) => skipped += 1,
        }
    }
    Ok(skipped)
}

impl<S: ElementStream + ?Sized> ElementStream for Box<S> {
    type Item = S::Item;
    fn next_element(&mut self) -> Option<Result<Self::Item, DataError>> {
        (**self).next_element()
    }
    fn advance(&mut self, n: u64) -> Result<u64, DataError> {
        (**self).advance(n)
    }
}

/// Where an iterator stands, to save in a checkpoint and restore after a restart.
///
/// Pipelines are deterministic functions of their seeds and the epoch, so the epoch and the
/// number of elements already produced pin down everything else: each shuffle's random state
/// is re-derived from its seed and the epoch, and caches and sources are positioned directly.
/// The fingerprint stops a state from being restored into a different pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IterState {
    /// The epoch the iterator was created for.
    pub epoch: u64,
    /// Elements produced so far in this epoch.
    pub offset: u64,
    /// The pipeline's fingerprint.
    pub fingerprint: u64,
}

/// A recipe for a stream of elements, like a `tf.data.Dataset`.
///
/// Datasets are cheap to clone (their state lives behind `Arc`s) and immutable: each call to
/// [`Dataset::iter`] starts a fresh pass. Every pass is a deterministic function of the epoch
/// number, which is what makes [`Iter::state`] and [`Dataset::iter_from`] exact.
///
/// ```
/// use lockstep_data::{Dataset, from_vec};
///
/// let squares = from_vec((0..10_u32).collect())
///     .map(|x| x * x)
///     .filter(|x| x % 2 == 0)
///     .batch(2, false);
/// let batches = squares.iter()?.collect::<Result<Vec<_>, _>>()?;
/// assert_eq!(batches[0].to_vec(), [0, 4]);
/// assert_eq!(batches.len(), 3);
/// # Ok::<(), lockstep_data::DataError>(())
/// ```
pub trait Dataset: Clone + Send + Sync + 'static {
    /// The element type.
    type Item: Send + 'static;
    /// The stage's iterator.
    type Stream: ElementStream<Item = Self::Item>;

    /// Starts pass `epoch` from its first element.
    ///
    /// # Errors
    ///
    /// When the pass cannot start (an unreadable file, say).
    fn stream(&self, epoch: u64) -> Result<Self::Stream, DataError>;

    /// Starts pass `epoch` positioned after its first `offset` elements (or at its end).
    /// Stages override this when they can position themselves without computing what they
    /// skip.
    ///
    /// # Errors
    ///
    /// As for [`Dataset::stream`], plus errors met while skipping.
    fn stream_at(&self, epoch: u64, offset: u64) -> Result<Self::Stream, DataError> {
        let mut stream = self.stream(epoch)?;
        stream.advance(offset)?;
        Ok(stream)
    }

    /// Elements per pass, when known.
    fn cardinality(&self) -> Cardinality;

    /// Mixes a description of this pipeline into `fp`.
    fn fingerprint(&self, fp: &mut Fingerprint);

    /// The number of files at the source, for file-level auto-sharding; `None` when the
    /// source is not made of files or the pipeline combines several sources.
    fn file_count(&self) -> Option<usize> {
        None
    }

    /// The options set on this pipeline ([`Dataset::with_options`]), carried through every
    /// transformation; none by default.
    fn options(&self) -> crate::DatasetOptions {
        crate::DatasetOptions::default()
    }

    /// The same pipeline reading only files `index`, `index + num_shards`, … of its source.
    /// `None` where [`Dataset::file_count`] is `None`.
    fn shard_files(&self, _num_shards: usize, _index: usize) -> Option<Self> {
        None
    }

    /// This pipeline's fingerprint as a number.
    fn fingerprint_value(&self) -> u64 {
        let mut fp = Fingerprint::new();
        self.fingerprint(&mut fp);
        fp.finish()
    }

    /// Iterates pass 0.
    ///
    /// # Errors
    ///
    /// When the pass cannot start.
    #[allow(
        clippy::iter_not_returning_iterator,
        reason = "starting a pass can fail, like `fs::read_dir`"
    )]
    fn iter(&self) -> Result<Iter<Self::Stream>, DataError> {
        self.iter_epoch(0)
    }

    /// Iterates pass `epoch` (a shuffle with `reshuffle_each_iteration` orders each pass
    /// differently).
    ///
    /// # Errors
    ///
    /// When the pass cannot start.
    fn iter_epoch(&self, epoch: u64) -> Result<Iter<Self::Stream>, DataError> {
        Ok(Iter {
            stream: self.stream(epoch)?,
            epoch,
            offset: 0,
            fingerprint: self.fingerprint_value(),
        })
    }

    /// Resumes an iterator from a saved [`IterState`]: it yields exactly what the original
    /// iterator would have yielded next.
    ///
    /// # Errors
    ///
    /// [`DataError::Restore`] when the state comes from another pipeline or points past the
    /// end of the pass.
    fn iter_from(&self, state: &IterState) -> Result<Iter<Self::Stream>, DataError> {
        let fingerprint = self.fingerprint_value();
        if state.fingerprint != fingerprint {
            return Err(DataError::Restore {
                reason: format!(
                    "the state is from another pipeline (fingerprint {:016x}, this one is {fingerprint:016x})",
                    state.fingerprint
                ),
            });
        }
        if let Some(len) = self
            .cardinality()
            .finite()
            .filter(|&len| state.offset > len)
        {
            return Err(DataError::Restore {
                reason: format!(
                    "offset {} is past the end of the pass ({len} elements)",
                    state.offset
                ),
            });
        }
        Ok(Iter {
            stream: self.stream_at(state.epoch, state.offset)?,
            epoch: state.epoch,
            offset: state.offset,
            fingerprint,
        })
    }

    /// Applies `f` to every element, in parallel on rayon, keeping the order.
    fn map<U, F>(self, f: F) -> Map<Self, F>
    where
        U: Send + 'static,
        F: Fn(Self::Item) -> U + Send + Sync + 'static,
    {
        Map::new(self, f)
    }

    /// Keeps the elements for which `predicate` is true.
    fn filter<P>(self, predicate: P) -> Filter<Self, P>
    where
        P: Fn(&Self::Item) -> bool + Send + Sync + 'static,
    {
        Filter::new(self, predicate)
    }

    /// Groups `size` consecutive elements into one, stacking arrays along a new first axis.
    /// The last, smaller batch is dropped when `drop_remainder` is set.
    fn batch(self, size: usize, drop_remainder: bool) -> Batch<Self>
    where
        Self::Item: Batchable,
    {
        Batch::new(self, size, drop_remainder)
    }

    /// Keeps elements `index`, `index + num_shards`, `index + 2 * num_shards`, …
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`] when `num_shards` is 0 or `index >= num_shards`.
    fn shard(self, num_shards: usize, index: usize) -> Result<Shard<Self>, DataError> {
        Shard::new(self, num_shards, index)
    }

    /// Keeps the first pass in memory and replays it in later passes.
    fn cache(self) -> Cache<Self>
    where
        Self::Item: Clone + Sync,
    {
        Cache::new(self)
    }

    /// Writes the first pass to `path` and reads later passes (and later runs) from it. The
    /// file records the pipeline's fingerprint and a checksum: a file from another pipeline,
    /// or a damaged or partial one, is rebuilt, never read as data.
    fn cache_to_file(self, path: impl Into<std::path::PathBuf>) -> FileCache<Self>
    where
        Self::Item: Element,
    {
        FileCache::new(self, path.into())
    }

    /// Shuffles with a buffer of `buffer_size` elements, as `tf.data` does: a buffer as large
    /// as the dataset gives a uniform permutation. The order is a function of `seed` and, when
    /// `reshuffle_each_iteration` is set, of the epoch.
    fn shuffle(
        self,
        buffer_size: usize,
        seed: u64,
        reshuffle_each_iteration: bool,
    ) -> Shuffle<Self> {
        Shuffle::new(self, buffer_size, seed, reshuffle_each_iteration)
    }

    /// Produces up to `buffer` elements ahead on a background thread.
    fn prefetch(self, buffer: usize) -> Prefetch<Self> {
        Prefetch::new(self, buffer)
    }

    /// Repeats the dataset `count` times, or forever with `None`. Each repetition is a new
    /// pass, so shuffles reshuffle.
    fn repeat(self, count: Option<u64>) -> Repeat<Self> {
        Repeat::new(self, count)
    }

    /// The first `count` elements.
    fn take(self, count: u64) -> Take<Self> {
        Take::new(self, count)
    }

    /// All but the first `count` elements.
    fn skip(self, count: u64) -> Skip<Self> {
        Skip::new(self, count)
    }

    /// Pairs this dataset's elements with `other`'s; ends with the shorter.
    fn zip<O: Dataset>(self, other: O) -> Zip<Self, O> {
        Zip::new(self, other)
    }

    /// Pairs each element with its index in the pass.
    fn enumerate(self) -> Enumerate<Self> {
        Enumerate::new(self)
    }

    /// The same pipeline with `options` set, as `dataset.with_options(options)`: a strategy
    /// that distributes it reads them (the auto-shard policy).
    ///
    /// ```
    /// use lockstep_data::{AutoShardPolicy, Dataset, DatasetOptions, from_vec};
    ///
    /// let ds = from_vec(vec![1_u32, 2, 3])
    ///     .with_options(DatasetOptions::auto_shard_policy(AutoShardPolicy::Off))
    ///     .map(|x| x * 2);
    /// assert_eq!(ds.options().auto_shard_policy, Some(AutoShardPolicy::Off));
    /// ```
    fn with_options(self, options: crate::DatasetOptions) -> crate::ops::WithOptions<Self> {
        crate::ops::WithOptions::new(self, options)
    }
}

/// Iterates one pass of a dataset and knows where it stands ([`Iter::state`]).
pub struct Iter<S> {
    stream: S,
    epoch: u64,
    offset: u64,
    fingerprint: u64,
}

impl<S: ElementStream> Iter<S> {
    /// The position to save in a checkpoint; [`Dataset::iter_from`] resumes from it.
    pub fn state(&self) -> IterState {
        IterState {
            epoch: self.epoch,
            offset: self.offset,
            fingerprint: self.fingerprint,
        }
    }
}

impl<S: ElementStream> Iterator for Iter<S> {
    type Item = Result<S::Item, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        let next = self.stream.next_element();
        if next.is_some() {
            self.offset += 1;
        }
        next
    }
}

/// A shared closure, so datasets holding one stay cheap to clone.
pub(crate) type Shared<F> = Arc<F>;
