//! `tf.estimator.RunConfig`: where an Estimator keeps its checkpoints and how often it saves,
//! logs and summarizes.

use std::fmt;
use std::path::PathBuf;

use lockstep_cluster::{AutoResolver, Cluster, ClusterResolver as _};

use crate::strategy::Strategy;

/// How an [`Estimator`](super::Estimator) runs, with TensorFlow's defaults:
/// checkpoints every 600 s when neither `save_checkpoints_steps` nor `save_checkpoints_secs`
/// is set, 5 kept, a log line and a `global_step/sec` summary every 100 steps, a loss
/// summary every 100 steps.
///
/// ```
/// use lockstep_train::{MirroredStrategy, RunConfig};
///
/// let config = RunConfig::new("/tmp/multiworker")
///     .train_distribute(MirroredStrategy::new(2)?)
///     .save_checkpoints_steps(50);
/// assert_eq!(config.keep_checkpoint_max, 5);
/// # Ok::<(), lockstep_train::TrainError>(())
/// ```
pub struct RunConfig {
    /// Where checkpoints and event files go (the chief writes them). `None`: a directory
    /// under the system's temporary directory, as TensorFlow makes one.
    pub model_dir: Option<PathBuf>,
    /// The strategy that trains (one local replica when `None`).
    pub train_distribute: Option<Box<dyn Strategy>>,
    /// Evaluate across the training group's replicas (each evaluates its shard, the metric
    /// states are summed), instead of on this process alone. TensorFlow takes a second
    /// strategy here; Lockstep evaluates on the group `train_distribute` built.
    pub eval_distribute: bool,
    /// Save a checkpoint every this many steps.
    pub save_checkpoints_steps: Option<u64>,
    /// Save a checkpoint every this many seconds (the chief's clock decides, for all).
    pub save_checkpoints_secs: Option<u64>,
    /// Checkpoints kept; older ones are deleted.
    pub keep_checkpoint_max: usize,
    /// Log the loss and steps/s every this many steps.
    pub log_step_count_steps: u64,
    /// Write the loss to the event files every this many steps.
    pub save_summary_steps: u64,
    /// The seed the `model_fn` builds with ([`Variables::random_seed`](super::Variables::random_seed)).
    pub random_seed: Option<u64>,
    /// The cluster this task belongs to (roles: chief, worker, evaluator, ps). `None`, the
    /// default: as the environment says when the estimator runs, as TensorFlow's `RunConfig`
    /// reads `TF_CONFIG` (Lockstep also reads SLURM's and Kubernetes' variables; one local
    /// worker without any).
    pub cluster: Option<Cluster>,
}

impl RunConfig {
    /// TensorFlow's defaults with checkpoints in `model_dir`.
    pub fn new(model_dir: impl Into<PathBuf>) -> Self {
        Self {
            model_dir: Some(model_dir.into()),
            ..Self::default()
        }
    }

    /// Trains under `strategy`.
    #[must_use]
    pub fn train_distribute(mut self, strategy: impl Strategy + 'static) -> Self {
        self.train_distribute = Some(Box::new(strategy));
        self
    }

    /// Saves every `steps` steps (and no longer every 600 s).
    #[must_use]
    pub fn save_checkpoints_steps(mut self, steps: u64) -> Self {
        self.save_checkpoints_steps = Some(steps);
        self
    }

    /// Runs as the task `cluster` says, whatever the environment holds.
    #[must_use]
    pub fn cluster(mut self, cluster: Cluster) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// The cluster set with [`RunConfig::cluster`], or else the environment's.
    ///
    /// # Errors
    ///
    /// When the environment describes a cluster badly (a `TF_CONFIG` that does not parse).
    pub fn resolved_cluster(&self) -> Result<Cluster, lockstep_cluster::ClusterError> {
        match &self.cluster {
            Some(cluster) => Ok(cluster.clone()),
            None => AutoResolver::from_env()?.resolve(),
        }
    }

    /// Seconds between time-based checkpoints: TensorFlow's 600 when no frequency is set.
    pub(crate) fn checkpoint_secs(&self) -> Option<u64> {
        match (self.save_checkpoints_steps, self.save_checkpoints_secs) {
            (None, None) => Some(600),
            (_, secs) => secs,
        }
    }
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            model_dir: None,
            train_distribute: None,
            eval_distribute: false,
            save_checkpoints_steps: None,
            save_checkpoints_secs: None,
            keep_checkpoint_max: 5,
            log_step_count_steps: 100,
            save_summary_steps: 100,
            random_seed: None,
            cluster: None,
        }
    }
}

impl fmt::Debug for RunConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunConfig")
            .field("model_dir", &self.model_dir)
            .field(
                "train_distribute",
                &self
                    .train_distribute
                    .as_ref()
                    .map(Strategy::num_replicas_in_sync),
            )
            .field("eval_distribute", &self.eval_distribute)
            .field("save_checkpoints_steps", &self.save_checkpoints_steps)
            .field("save_checkpoints_secs", &self.save_checkpoints_secs)
            .field("keep_checkpoint_max", &self.keep_checkpoint_max)
            .field("log_step_count_steps", &self.log_step_count_steps)
            .field("save_summary_steps", &self.save_summary_steps)
            .field("random_seed", &self.random_seed)
            .field("cluster", &self.cluster.as_ref().map(Cluster::task))
            .finish()
    }
}
