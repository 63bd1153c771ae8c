//! Why training could not go on, with the cause from the layer below.

/// Errors of strategies, `fit`, `evaluate`, `predict` and callbacks.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrainError {
    /// A model, layer, loss or optimizer error.
    #[error(transparent)]
    Nn(#[from] lockstep_nn::NnError),
    /// A tensor operation failed outside a layer (converting a batch, reading the loss).
    #[error(transparent)]
    Tensor(#[from] lockstep_tensor::TensorError),
    /// The input pipeline failed.
    #[error("reading the input: {0}")]
    Data(#[from] lockstep_data::DataError),
    /// A collective with the other replicas failed (a peer died, timed out, disagreed).
    #[error(transparent)]
    Collective(#[from] lockstep_collective::CollectiveError),
    /// Saving or restoring a checkpoint failed.
    #[error(transparent)]
    Checkpoint(#[from] lockstep_checkpoint::CheckpointError),
    /// The cluster configuration does not allow this.
    #[error(transparent)]
    Cluster(#[from] lockstep_cluster::ClusterError),
    /// A parameter server, its connection, or the coordinator's.
    #[error(transparent)]
    Ps(#[from] lockstep_ps::PsError),
    /// A setting or call that cannot work, with the reason.
    #[error("{what}: {why}")]
    Invalid {
        /// The setting or call.
        what: &'static str,
        /// Why it cannot work.
        why: String,
    },
    /// A replica thread panicked.
    #[error("replica {replica} panicked: {message}")]
    ReplicaPanicked {
        /// Its index among this process's replicas.
        replica: usize,
        /// The panic's message.
        message: String,
    },
}

impl TrainError {
    pub(crate) fn invalid(what: &'static str, why: impl Into<String>) -> Self {
        Self::Invalid {
            what,
            why: why.into(),
        }
    }
}
