//! Options a dataset carries through its transformations to where it is distributed, as
//! `tf.data.Options` set with `dataset.with_options(options)`.

use crate::dataset::{Cardinality, Dataset};
use crate::distribute::AutoShardPolicy;
use crate::error::DataError;
use crate::fingerprint::Fingerprint;

/// A dataset's options (`tf.data.Options`): how a strategy divides it among workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DatasetOptions {
    /// `options.experimental_distribute.auto_shard_policy`; `None` leaves the choice to whoever
    /// distributes the dataset (Auto).
    pub auto_shard_policy: Option<AutoShardPolicy>,
}

impl DatasetOptions {
    /// Options with this auto-shard policy.
    pub fn auto_shard_policy(policy: AutoShardPolicy) -> Self {
        Self {
            auto_shard_policy: Some(policy),
        }
    }
}

/// A dataset with options set; see [`Dataset::with_options`].
#[derive(Debug, Clone)]
pub struct WithOptions<D> {
    inner: D,
    options: DatasetOptions,
}

impl<D> WithOptions<D> {
    pub(crate) fn new(inner: D, options: DatasetOptions) -> Self {
        Self { inner, options }
    }
}

impl<D: Dataset> Dataset for WithOptions<D> {
    type Item = D::Item;
    type Stream = D::Stream;

    fn stream(&self, epoch: u64) -> Result<Self::Stream, DataError> {
        self.inner.stream(epoch)
    }

    fn stream_at(&self, epoch: u64, offset: u64) -> Result<Self::Stream, DataError> {
        self.inner.stream_at(epoch, offset)
    }

    fn cardinality(&self) -> Cardinality {
        self.inner.cardinality()
    }

    fn fingerprint(&self, fp: &mut Fingerprint) {
        self.inner.fingerprint(fp);
    }

    fn file_count(&self) -> Option<usize> {
        self.inner.file_count()
    }

    fn shard_files(&self, num_shards: usize, index: usize) -> Option<Self> {
        Some(Self::new(
            self.inner.shard_files(num_shards, index)?,
            self.options,
        ))
    }

    fn options(&self) -> DatasetOptions {
        // Set later, nearer the end of the pipeline, wins, as in tf.data.
        let inner = self.inner.options();
        DatasetOptions {
            auto_shard_policy: self.options.auto_shard_policy.or(inner.auto_shard_policy),
        }
    }
}
