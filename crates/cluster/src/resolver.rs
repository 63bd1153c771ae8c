//! Where a cluster description comes from, behind one trait.

use std::env::{self, VarError};

use crate::cluster::Cluster;
use crate::error::ClusterError;
use crate::spec::ClusterSpec;
use crate::task::{TaskId, WORKER};
use crate::tf_config::TfConfig;

/// A source of cluster descriptions: `TF_CONFIG`, SLURM, or a spec written in code.
///
/// Training code takes `&dyn ClusterResolver` (or a generic) and so runs unchanged under a
/// Kubernetes `TFJob`, SLURM or a hand-written launcher.
///
/// ```
/// use lockstep_cluster::{ClusterResolver, ExplicitResolver};
///
/// fn world_size(resolver: &dyn ClusterResolver) -> usize {
///     resolver.resolve().map_or(0, |cluster| cluster.world_size())
/// }
/// let resolver = ExplicitResolver::from_addresses(["127.0.0.1:5000", "127.0.0.1:5001"], 1);
/// assert_eq!(world_size(&resolver), 2);
/// ```
pub trait ClusterResolver {
    /// Produces the validated cluster, as seen by this process.
    ///
    /// # Errors
    ///
    /// A [`ClusterError`] naming the field or variable at fault.
    fn resolve(&self) -> Result<Cluster, ClusterError>;
}

/// Reads the `TF_CONFIG` JSON, from the environment or from a string.
///
/// ```
/// use lockstep_cluster::{ClusterResolver, TfConfigResolver};
///
/// let json = r#"{"cluster": {"worker": ["localhost:2222"]}, "task": {"type": "worker", "index": 0}}"#;
/// let cluster = TfConfigResolver::from_json(json).resolve()?;
/// assert!(cluster.is_chief());
/// # Ok::<(), lockstep_cluster::ClusterError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TfConfigResolver {
    json: Option<String>,
}

impl TfConfigResolver {
    /// The name of the environment variable read by [`TfConfigResolver::from_env`].
    pub const VAR: &'static str = "TF_CONFIG";

    /// Takes `TF_CONFIG` from the environment now; unset means a single local worker.
    ///
    /// # Errors
    ///
    /// [`ClusterError::InvalidEnv`] when the variable is not valid UTF-8.
    pub fn from_env() -> Result<Self, ClusterError> {
        match env::var(Self::VAR) {
            Ok(json) => Ok(Self { json: Some(json) }),
            Err(VarError::NotPresent) => Ok(Self { json: None }),
            Err(VarError::NotUnicode(raw)) => Err(ClusterError::InvalidEnv {
                var: Self::VAR,
                value: raw.to_string_lossy().into_owned(),
                reason: "not valid UTF-8".into(),
            }),
        }
    }

    /// Uses the given JSON text as the `TF_CONFIG`.
    pub fn from_json(json: impl Into<String>) -> Self {
        Self {
            json: Some(json.into()),
        }
    }
}

impl ClusterResolver for TfConfigResolver {
    fn resolve(&self) -> Result<Cluster, ClusterError> {
        match &self.json {
            None => Ok(Cluster::local()),
            Some(json) => Cluster::new(TfConfig::parse(json)?),
        }
    }
}

/// A cluster written in code: a spec and this process's task.
///
/// ```
/// use lockstep_cluster::{ClusterResolver, ClusterSpec, ExplicitResolver, TaskId};
///
/// let spec = ClusterSpec::from_jobs([("chief", vec!["h:1"]), ("worker", vec!["h:2"])])?;
/// let cluster = ExplicitResolver::new(spec, TaskId::worker(0)).resolve()?;
/// assert_eq!(cluster.rank(), Some(1));
/// # Ok::<(), lockstep_cluster::ClusterError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExplicitResolver {
    config: Result<TfConfig, ClusterError>,
}

impl ExplicitResolver {
    /// A spec and the task of this process.
    pub fn new(spec: ClusterSpec, task: TaskId) -> Self {
        Self {
            config: Ok(TfConfig {
                cluster: spec,
                task: Some(task),
                rpc_layer: None,
                environment: None,
            }),
        }
    }

    /// A plain list of worker addresses in rank order, and this process's rank: the shape
    /// `torch.distributed` and Horovod users know. Invalid addresses surface in `resolve`.
    pub fn from_addresses<A: Into<String>>(
        addresses: impl IntoIterator<Item = A>,
        rank: usize,
    ) -> Self {
        let addresses: Vec<String> = addresses.into_iter().map(Into::into).collect();
        Self {
            config: ClusterSpec::from_jobs([(WORKER, addresses)]).map(|spec| TfConfig {
                cluster: spec,
                task: Some(TaskId::worker(rank)),
                rpc_layer: None,
                environment: None,
            }),
        }
    }
}

impl ClusterResolver for ExplicitResolver {
    fn resolve(&self) -> Result<Cluster, ClusterError> {
        Cluster::new(self.config.clone()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absent_tf_config_resolves_to_a_local_worker() {
        assert_eq!(
            TfConfigResolver { json: None }.resolve().unwrap(),
            Cluster::local()
        );
    }

    #[test]
    fn tf_config_errors_come_through_resolve() {
        let err = TfConfigResolver::from_json("{").resolve().unwrap_err();
        assert!(matches!(err, ClusterError::Json { .. }));
    }

    #[test]
    fn explicit_addresses_are_ranked_in_order() {
        let c = ExplicitResolver::from_addresses(["a:1", "b:1", "c:1"], 2)
            .resolve()
            .unwrap();
        assert_eq!(c.rank(), Some(2));
        assert_eq!(c.peer_address(1), Some("b:1"));
        assert!(
            ExplicitResolver::from_addresses(["a:1"], 1)
                .resolve()
                .is_err()
        );
        assert!(
            ExplicitResolver::from_addresses(["a"], 0)
                .resolve()
                .is_err()
        );
    }
}
