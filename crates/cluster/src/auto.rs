//! Choosing the resolver from what the engine that started this process left in its
//! environment.

use std::fmt;

use crate::cluster::Cluster;
use crate::error::ClusterError;
use crate::kubernetes::KubernetesResolver;
use crate::resolver::{ClusterResolver, TfConfigResolver};
use crate::slurm::SlurmResolver;

/// Where a cluster description came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterSource {
    /// `TF_CONFIG` (a hand-written launcher, `cargo xtask run-cluster`, Kubeflow's `TFJob`).
    TfConfig,
    /// A SLURM job step (`SLURM_PROCID`).
    Slurm,
    /// A pod of a Kubernetes indexed Job or JobSet (`JOB_COMPLETION_INDEX`).
    Kubernetes,
    /// None of them: a single local worker.
    Local,
}

impl fmt::Display for ClusterSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::TfConfig => "TF_CONFIG",
            Self::Slurm => "SLURM",
            Self::Kubernetes => "Kubernetes",
            Self::Local => "local",
        })
    }
}

/// The first resolver whose variables are present, in the order `TF_CONFIG`, SLURM,
/// Kubernetes: an explicit `TF_CONFIG` wins over the engine's own variables (Kubeflow's
/// `TFJob` runs in pods of a Job, and some sites start `TF_CONFIG` jobs with `srun`); none of
/// them means a single local worker.
///
/// ```
/// use lockstep_cluster::{AutoResolver, ClusterResolver, ClusterSource};
///
/// let auto = AutoResolver::from_vars([
///     ("SLURM_PROCID", "0"),
///     ("SLURM_NTASKS", "2"),
///     ("SLURM_STEP_NODELIST", "gpu[7,3]"),
/// ]);
/// assert_eq!(auto.source(), ClusterSource::Slurm);
/// assert_eq!(auto.resolve()?.group_addresses(), ["gpu7:8888", "gpu3:8888"]);
/// # Ok::<(), lockstep_cluster::ClusterError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoResolver {
    chosen: Chosen,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Chosen {
    TfConfig(TfConfigResolver),
    Slurm(SlurmResolver),
    Kubernetes(KubernetesResolver),
    Local,
}

impl AutoResolver {
    /// Looks at the environment now.
    ///
    /// # Errors
    ///
    /// [`ClusterError::InvalidEnv`] when `TF_CONFIG` is set but not valid UTF-8.
    pub fn from_env() -> Result<Self, ClusterError> {
        let chosen = if std::env::var_os(TfConfigResolver::VAR).is_some() {
            Chosen::TfConfig(TfConfigResolver::from_env()?)
        } else if std::env::var_os(SLURM_MARK).is_some() {
            Chosen::Slurm(SlurmResolver::from_env())
        } else if std::env::var_os(KubernetesResolver::INDEX_VAR).is_some() {
            Chosen::Kubernetes(KubernetesResolver::from_env())
        } else {
            Chosen::Local
        };
        Ok(Self { chosen })
    }

    /// Chooses from the given variables instead of the environment.
    pub fn from_vars<K: Into<String>, V: Into<String>>(
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        let vars: Vec<(String, String)> = vars
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        let has = |name: &str| vars.iter().any(|(k, _)| k == name);
        let chosen = if let Some((_, json)) = vars.iter().find(|(k, _)| k == TfConfigResolver::VAR)
        {
            Chosen::TfConfig(TfConfigResolver::from_json(json.clone()))
        } else if has(SLURM_MARK) {
            Chosen::Slurm(SlurmResolver::from_vars(vars))
        } else if has(KubernetesResolver::INDEX_VAR) {
            Chosen::Kubernetes(KubernetesResolver::from_vars(vars))
        } else {
            Chosen::Local
        };
        Self { chosen }
    }

    /// Which resolver was chosen.
    pub fn source(&self) -> ClusterSource {
        match self.chosen {
            Chosen::TfConfig(_) => ClusterSource::TfConfig,
            Chosen::Slurm(_) => ClusterSource::Slurm,
            Chosen::Kubernetes(_) => ClusterSource::Kubernetes,
            Chosen::Local => ClusterSource::Local,
        }
    }
}

/// The variable SLURM sets in every task it starts: the task's rank in its job step.
const SLURM_MARK: &str = "SLURM_PROCID";

impl ClusterResolver for AutoResolver {
    fn resolve(&self) -> Result<Cluster, ClusterError> {
        match &self.chosen {
            Chosen::TfConfig(r) => r.resolve(),
            Chosen::Slurm(r) => r.resolve(),
            Chosen::Kubernetes(r) => r.resolve(),
            Chosen::Local => Ok(Cluster::local()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tf_config_wins_then_slurm_then_kubernetes_then_local() {
        let tf = (
            "TF_CONFIG",
            r#"{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}"#,
        );
        let slurm = [
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_STEP_NODELIST", "n1"),
        ];
        let k8s = [
            ("JOB_COMPLETION_INDEX", "0"),
            ("LOCKSTEP_PODS_PER_JOB", "1"),
            ("JOB_NAME", "j"),
            ("LOCKSTEP_SUBDOMAIN", "s"),
        ];
        let all: Vec<_> = [tf].into_iter().chain(slurm).chain(k8s).collect();
        assert_eq!(
            AutoResolver::from_vars(all.clone()).source(),
            ClusterSource::TfConfig
        );
        assert_eq!(
            AutoResolver::from_vars(all.clone())
                .resolve()
                .unwrap()
                .group_addresses(),
            ["a:1", "b:1"]
        );
        assert_eq!(
            AutoResolver::from_vars(all[1..].to_vec()).source(),
            ClusterSource::Slurm
        );
        assert_eq!(
            AutoResolver::from_vars(all[1..].to_vec())
                .resolve()
                .unwrap()
                .rank(),
            Some(1)
        );
        let pod = AutoResolver::from_vars(all[4..].to_vec());
        assert_eq!(pod.source(), ClusterSource::Kubernetes);
        assert_eq!(pod.resolve().unwrap().group_addresses(), ["j-0.s:8888"]);
        let none = AutoResolver::from_vars([("HOME", "/root")]);
        assert_eq!(none.source(), ClusterSource::Local);
        assert_eq!(none.resolve().unwrap(), Cluster::local());
    }

    #[test]
    fn slurm_keeps_the_node_order_it_was_given() {
        let cluster = AutoResolver::from_vars([
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "3"),
            ("SLURM_STEP_NODELIST", "zeta,alpha,mid[3,1]"),
            ("SLURM_STEP_TASKS_PER_NODE", "1(x2),1,0"),
        ])
        .resolve()
        .unwrap();
        assert_eq!(
            cluster.group_addresses(),
            ["zeta:8888", "alpha:8888", "mid3:8888"]
        );
    }

    #[test]
    fn the_chosen_resolvers_errors_come_through() {
        let err = AutoResolver::from_vars([("JOB_COMPLETION_INDEX", "0")])
            .resolve()
            .unwrap_err();
        assert!(err.to_string().contains("LOCKSTEP_PODS_PER_JOB"), "{err}");
    }
}
