//! Feeding a cluster: which elements each worker reads, and how a global batch is split
//! among replicas — `tf.distribute.InputContext` and `AutoShardPolicy`.

use serde::{Deserialize, Serialize};

use crate::batch::Batchable;
use crate::dataset::{Cardinality, Dataset, ElementStream};
use crate::error::DataError;
use crate::fingerprint::Fingerprint;

/// What one input pipeline (one worker) needs to know about the cluster, as in
/// `tf.distribute.InputContext`.
///
/// ```
/// use lockstep_data::InputContext;
///
/// // Worker 1 of 2, each with 2 replicas.
/// let ctx = InputContext::new(2, 1, 4)?;
/// assert_eq!(ctx.per_replica_batch_size(64)?, 16);
/// assert!(ctx.per_replica_batch_size(66).is_err());
/// # Ok::<(), lockstep_data::DataError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputContext {
    /// How many input pipelines (workers) read data.
    pub num_input_pipelines: usize,
    /// This pipeline's index, below `num_input_pipelines`.
    pub input_pipeline_id: usize,
    /// Replicas across the whole cluster that train in lockstep.
    pub num_replicas_in_sync: usize,
}

impl InputContext {
    /// Checks and builds a context.
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`] when a count is 0, the id is out of range, or the
    /// replicas do not divide evenly among the pipelines.
    pub fn new(
        num_input_pipelines: usize,
        input_pipeline_id: usize,
        num_replicas_in_sync: usize,
    ) -> Result<Self, DataError> {
        let fail = |reason: String| Err(DataError::invalid("InputContext", reason));
        if num_input_pipelines == 0 || num_replicas_in_sync == 0 {
            return fail(format!(
                "num_input_pipelines ({num_input_pipelines}) and num_replicas_in_sync ({num_replicas_in_sync}) must be at least 1"
            ));
        }
        if input_pipeline_id >= num_input_pipelines {
            return fail(format!(
                "input_pipeline_id {input_pipeline_id} must be below num_input_pipelines {num_input_pipelines}"
            ));
        }
        if !num_replicas_in_sync.is_multiple_of(num_input_pipelines) {
            return fail(format!(
                "{num_replicas_in_sync} replicas cannot be spread evenly over {num_input_pipelines} input pipelines"
            ));
        }
        Ok(Self {
            num_input_pipelines,
            input_pipeline_id,
            num_replicas_in_sync,
        })
    }

    /// One process with `replicas` replicas (`MirroredStrategy`).
    ///
    /// # Errors
    ///
    /// When `replicas` is 0.
    pub fn local(replicas: usize) -> Result<Self, DataError> {
        Self::new(1, 0, replicas)
    }

    /// Replicas fed by this pipeline.
    pub fn local_replicas(&self) -> usize {
        self.num_replicas_in_sync / self.num_input_pipelines
    }

    /// The batch each replica gets from a global batch.
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`] when `global_batch_size` does not divide by the
    /// number of replicas.
    pub fn per_replica_batch_size(&self, global_batch_size: usize) -> Result<usize, DataError> {
        if global_batch_size == 0 || !global_batch_size.is_multiple_of(self.num_replicas_in_sync) {
            return Err(DataError::invalid(
                "distribute",
                format!(
                    "the global batch size {global_batch_size} must be a positive multiple of the {} replicas in sync",
                    self.num_replicas_in_sync
                ),
            ));
        }
        Ok(global_batch_size / self.num_replicas_in_sync)
    }
}

/// How a dataset is divided among workers, as `tf.data.experimental.AutoShardPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum AutoShardPolicy {
    /// No division: every worker reads everything.
    Off,
    /// Every worker reads the whole stream and keeps its part of each global batch, so all
    /// workers take the same number of steps.
    Data,
    /// Each worker reads its own files (the source must be at least as many files as workers).
    File,
    /// `File` when the source has enough files, `Data` otherwise.
    #[default]
    Auto,
}

/// Divides `dataset` among the workers of `ctx` and batches it into per-replica batches: each
/// element of the result is one training step's batches for this worker's local replicas.
///
/// With `Data` sharding, step `s` of every worker comes from global batch `s` of the stream,
/// worker `w` taking elements `w * b .. (w + 1) * b` of it (`b` = per-worker batch). A final
/// incomplete global batch is dropped on every worker, so no worker waits for a step the
/// others never take; [`Distributed::keep_remainder`] keeps it instead, for a training loop
/// that lets workers without data join a step empty-handed (as `lockstep-train` does).
///
/// ```
/// use lockstep_data::{AutoShardPolicy, Dataset, InputContext, distribute, from_vec};
///
/// let ds = from_vec((0..20_u32).collect());
/// let ctx = InputContext::new(2, 1, 2)?; // worker 1 of 2, one replica each
/// let steps = distribute(ds, 8, &ctx, AutoShardPolicy::Data)?.iter()?.collect::<Result<Vec<_>, _>>()?;
/// assert_eq!(steps.len(), 2); // 20 elements make 2 whole global batches of 8
/// assert_eq!(steps[0][0].to_vec(), [4, 5, 6, 7]);
/// assert_eq!(steps[1][0].to_vec(), [12, 13, 14, 15]);
/// # Ok::<(), lockstep_data::DataError>(())
/// ```
///
/// # Errors
///
/// When the global batch does not divide among the replicas, or `File` sharding is asked of
/// a dataset with fewer files than workers.
pub fn distribute<D>(
    dataset: D,
    global_batch_size: usize,
    ctx: &InputContext,
    policy: AutoShardPolicy,
) -> Result<Distributed<D>, DataError>
where
    D: Dataset,
    D::Item: Batchable,
{
    let per_replica = ctx.per_replica_batch_size(global_batch_size)?;
    let per_pipeline = per_replica * ctx.local_replicas();
    let pipelines = ctx.num_input_pipelines;
    let files = dataset.file_count();
    let by_file = match policy {
        _ if pipelines == 1 => false,
        AutoShardPolicy::Off | AutoShardPolicy::Data => false,
        AutoShardPolicy::Auto => files.is_some_and(|n| n >= pipelines),
        AutoShardPolicy::File => match files {
            Some(n) if n >= pipelines => true,
            Some(n) => {
                return Err(DataError::invalid(
                    "distribute",
                    format!("{n} files cannot be split among {pipelines} workers"),
                ));
            }
            None => {
                return Err(DataError::invalid(
                    "distribute",
                    "AutoShardPolicy::File needs a dataset read from files",
                ));
            }
        },
    };
    let (inner, lead, stride) = if by_file {
        let inner = dataset
            .shard_files(pipelines, ctx.input_pipeline_id)
            .ok_or_else(|| {
                DataError::invalid("distribute", "the dataset cannot be sharded by file")
            })?;
        (inner, 0, per_pipeline)
    } else if policy == AutoShardPolicy::Off || pipelines == 1 {
        (dataset, 0, per_pipeline)
    } else {
        (
            dataset,
            ctx.input_pipeline_id * per_pipeline,
            global_batch_size,
        )
    };
    Ok(Distributed {
        inner,
        per_replica,
        replicas: ctx.local_replicas(),
        lead: lead as u64,
        stride: stride as u64,
        keep_remainder: false,
    })
}

/// The dataset of [`distribute`]: one element per training step, holding one batch per local
/// replica.
#[derive(Clone)]
pub struct Distributed<D> {
    inner: D,
    per_replica: usize,
    replicas: usize,
    /// Elements of each stride before this worker's part.
    lead: u64,
    /// Elements of the input consumed per step (the global batch, or this worker's part).
    stride: u64,
    keep_remainder: bool,
}

impl<D> Distributed<D> {
    /// Keeps the last, incomplete global batch: each worker takes what falls in its part of
    /// it, so a step may hold fewer batches than replicas (the first ones, the last of them
    /// short) and a worker whose part is empty ends its epoch one step before the others.
    ///
    /// ```
    /// use lockstep_data::{AutoShardPolicy, Dataset, InputContext, distribute, from_vec};
    ///
    /// let ctx = InputContext::new(2, 1, 4)?; // worker 1 of 2, two replicas each
    /// let ds = distribute(from_vec((0..22_u32).collect()), 8, &ctx, AutoShardPolicy::Data)?;
    /// let steps = ds.keep_remainder().iter()?.collect::<Result<Vec<_>, _>>()?;
    /// assert_eq!(steps.len(), 3);
    /// assert_eq!(steps[2].len(), 1); // elements 16..22: worker 1 gets 20, 21 for one replica
    /// assert_eq!(steps[2][0].to_vec(), [20, 21]);
    /// # Ok::<(), lockstep_data::DataError>(())
    /// ```
    #[must_use]
    pub fn keep_remainder(mut self) -> Self {
        self.keep_remainder = true;
        self
    }
}

impl<D> Dataset for Distributed<D>
where
    D: Dataset,
    D::Item: Batchable,
{
    fn options(&self) -> crate::DatasetOptions {
        self.inner.options()
    }

    type Item = Vec<<D::Item as Batchable>::Batched>;
    type Stream = DistributedStream<D::Stream>;

    fn stream(&self, epoch: u64) -> Result<Self::Stream, DataError> {
        self.stream_at(epoch, 0)
    }

    fn stream_at(&self, epoch: u64, offset: u64) -> Result<Self::Stream, DataError> {
        Ok(DistributedStream {
            inner: self
                .inner
                .stream_at(epoch, offset.saturating_mul(self.stride))?,
            per_replica: self.per_replica,
            replicas: self.replicas,
            lead: self.lead,
            stride: self.stride,
            keep_remainder: self.keep_remainder,
        })
    }

    fn cardinality(&self) -> Cardinality {
        let (stride, lead, keep) = (self.stride, self.lead, self.keep_remainder);
        self.inner
            .cardinality()
            .map(|n| n / stride + u64::from(keep && n % stride > lead))
    }

    fn fingerprint(&self, fp: &mut Fingerprint) {
        fp.str("distribute")
            .u64(self.per_replica as u64)
            .u64(self.replicas as u64)
            .u64(self.lead)
            .u64(self.stride)
            .u64(u64::from(self.keep_remainder));
        self.inner.fingerprint(fp);
    }
}

/// The stream of [`Distributed`].
pub struct DistributedStream<S> {
    inner: S,
    per_replica: usize,
    replicas: usize,
    lead: u64,
    stride: u64,
    keep_remainder: bool,
}

impl<S: ElementStream> DistributedStream<S>
where
    S::Item: Batchable,
{
    /// This worker's elements of the next stride; `None` when the stride is incomplete
    /// (unless remainders are kept and this worker's part of it is not empty).
    fn take_part(&mut self) -> Result<Option<Vec<S::Item>>, DataError> {
        if self.inner.advance(self.lead)? < self.lead {
            return Ok(None);
        }
        let own = self.per_replica * self.replicas;
        let mut items = Vec::with_capacity(own);
        while items.len() < own {
            match self.inner.next_element() {
                Some(item) => items.push(item?),
                None if self.keep_remainder && !items.is_empty() => return Ok(Some(items)),
                None => return Ok(None),
            }
        }
        let trail = self.stride - self.lead - own as u64;
        if self.inner.advance(trail)? < trail && !self.keep_remainder {
            return Ok(None);
        }
        Ok(Some(items))
    }
}

impl<S: ElementStream> ElementStream for DistributedStream<S>
where
    S::Item: Batchable,
{
    type Item = Vec<<S::Item as Batchable>::Batched>;

    fn next_element(&mut self) -> Option<Result<Self::Item, DataError>> {
        let items = match self.take_part() {
            Ok(Some(items)) => items,
            Ok(None) => return None,
            Err(e) => return Some(Err(e)),
        };
        let replicas = items.len().div_ceil(self.per_replica.max(1));
        let mut items = items.into_iter();
        let batches = (0..replicas)
            .map(|_| <S::Item as Batchable>::stack(items.by_ref().take(self.per_replica).collect()))
            .collect();
        Some(batches)
    }

    fn advance(&mut self, n: u64) -> Result<u64, DataError> {
        let wanted = n.saturating_mul(self.stride);
        Ok(self.inner.advance(wanted)? / self.stride)
    }
}
