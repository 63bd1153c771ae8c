use crate::dataset::{Cardinality, Dataset, ElementStream};
use crate::error::DataError;
use crate::fingerprint::Fingerprint;

/// The dataset of [`Dataset::repeat`].
#[derive(Clone)]
pub struct Repeat<D> {
    inner: D,
    count: Option<u64>,
}

impl<D> Repeat<D> {
    pub(crate) fn new(inner: D, count: Option<u64>) -> Self {
        Self { inner, count }
    }

    /// The input's epoch for repetition `rep` of this dataset's pass `epoch`: every
    /// repetition is a distinct pass of the input, so shuffles reshuffle.
    fn inner_epoch(&self, epoch: u64, rep: u64) -> u64 {
        match self.count {
            Some(count) => epoch.wrapping_mul(count).wrapping_add(rep),
            None => rep,
        }
    }
}

impl<D: Dataset> Dataset for Repeat<D> {
    fn options(&self) -> crate::DatasetOptions {
        self.inner.options()
    }

    type Item = D::Item;
    type Stream = RepeatStream<D>;

    fn stream(&self, epoch: u64) -> Result<Self::Stream, DataError> {
        self.stream_at(epoch, 0)
    }

    fn stream_at(&self, epoch: u64, offset: u64) -> Result<Self::Stream, DataError> {
        let mut stream = RepeatStream {
            dataset: self.clone(),
            epoch,
            rep: 0,
            current: None,
            yielded_in_rep: 0,
        };
        if self.count == Some(0) {
            return Ok(stream);
        }
        // With a known length, go straight to the right repetition; otherwise count through.
        let known = self.inner.cardinality().finite().filter(|&len| len > 0);
        let (rep, within) = known.map_or((0, 0), |len| (offset / len, offset % len));
        if self.count.is_some_and(|c| rep >= c) {
            return Ok(stream);
        }
        stream.rep = rep;
        stream.current = Some(self.inner.stream_at(self.inner_epoch(epoch, rep), within)?);
        stream.yielded_in_rep = within;
        if known.is_none() {
            stream.advance(offset)?;
        }
        Ok(stream)
    }

    fn cardinality(&self) -> Cardinality {
        match (self.count, self.inner.cardinality()) {
            (Some(0), _) | (_, Cardinality::Finite(0)) => Cardinality::Finite(0),
            (Some(c), inner) => inner.map(|n| n.saturating_mul(c)),
            (None, Cardinality::Finite(_) | Cardinality::Infinite) => Cardinality::Infinite,
            (None, Cardinality::Unknown) => Cardinality::Unknown,
        }
    }

    fn fingerprint(&self, fp: &mut Fingerprint) {
        fp.str("repeat").u64(self.count.map_or(u64::MAX, |c| c));
        self.inner.fingerprint(fp);
    }

    fn file_count(&self) -> Option<usize> {
        self.inner.file_count()
    }

    fn shard_files(&self, num_shards: usize, index: usize) -> Option<Self> {
        Some(Self {
            inner: self.inner.shard_files(num_shards, index)?,
            count: self.count,
        })
    }
}

/// The stream of [`Repeat`].
pub struct RepeatStream<D: Dataset> {
    dataset: Repeat<D>,
    epoch: u64,
    rep: u64,
    current: Option<D::Stream>,
    yielded_in_rep: u64,
}

impl<D: Dataset> RepeatStream<D> {
    /// Moves to the next repetition; `Ok(false)` when there is none (the count is reached,
    /// or the input is empty and repeating it would spin forever).
    fn next_rep(&mut self) -> Result<bool, DataError> {
        let was_empty = self.yielded_in_rep == 0;
        self.current = None;
        self.rep += 1;
        self.yielded_in_rep = 0;
        if was_empty || self.dataset.count.is_some_and(|c| self.rep >= c) {
            return Ok(false);
        }
        let inner_epoch = self.dataset.inner_epoch(self.epoch, self.rep);
        self.current = Some(self.dataset.inner.stream(inner_epoch)?);
        Ok(true)
    }
}

impl<D: Dataset> ElementStream for RepeatStream<D> {
    type Item = D::Item;

    fn next_element(&mut self) -> Option<Result<D::Item, DataError>> {
        loop {
            match self.current.as_mut()?.next_element() {
                Some(item) => {
                    self.yielded_in_rep += 1;
                    return Some(item);
                }
                None => match self.next_rep() {
                    Ok(true) => {}
                    Ok(false) => return None,
                    Err(e) => return Some(Err(e)),
                },
            }
        }
    }

    fn advance(&mut self, n: u64) -> Result<u64, DataError> {
        let mut skipped = 0;
        while skipped < n {
            let Some(current) = self.current.as_mut() else {
                break;
            };
            let got = current.advance(n - skipped)?;
            skipped += got;
            self.yielded_in_rep += got;
            if skipped == n {
                break;
            }
            // This repetition ended. With a known length, whole repetitions are skipped
            // without being produced.
            if let Some(len) = self.dataset.inner.cardinality().finite().filter(|&l| l > 0) {
                let mut whole = (n - skipped) / len;
                if let Some(count) = self.dataset.count {
                    whole = whole.min(count.saturating_sub(self.rep + 1));
                }
                self.rep += whole;
                skipped += whole * len;
            }
            if !self.next_rep()? {
                break;
            }
        }
        Ok(skipped)
    }
}
