//! A cluster from the variables of a Kubernetes indexed Job's pod, or of a JobSet's.

use std::collections::BTreeMap;

use crate::address::Address;
use crate::cluster::Cluster;
use crate::error::{ClusterError, PORT_VAR, port_var};
use crate::resolver::ClusterResolver;
use crate::spec::ClusterSpec;
use crate::task::{TaskId, WORKER};
use crate::tf_config::TfConfig;

const RESOLVER: &str = "Kubernetes";

/// Builds a cluster of `worker` tasks from a pod of a Kubernetes indexed Job or JobSet, with
/// no call to the Kubernetes API: every pod's DNS name follows from the names and indices.
///
/// The variables (the manifests of `cargo xtask deploy k8s` set all of them):
///
/// | variable | set by | meaning |
/// | --- | --- | --- |
/// | `JOB_COMPLETION_INDEX` | the Job controller | this pod's index in its Job |
/// | `LOCKSTEP_PODS_PER_JOB` | the manifest | the Job's `parallelism` (= `completions`) |
/// | `JOBSET_NAME` | the manifest, from the pod's annotation `jobset.sigs.k8s.io/jobset-name` | set: a JobSet |
/// | `REPLICATED_JOB_NAME` | the manifest, from `jobset.sigs.k8s.io/replicatedjob-name` | the JobSet's replicated job |
/// | `JOB_INDEX` | the manifest, from `jobset.sigs.k8s.io/job-index` | which Job of the replicated job (default 0) |
/// | `LOCKSTEP_JOBS` | the manifest | the replicated job's `replicas` (default 1) |
/// | `JOB_NAME` | the manifest, from the pod's label `batch.kubernetes.io/job-name` | an indexed Job without JobSet |
/// | `LOCKSTEP_SUBDOMAIN` | the manifest | the headless service (default: the JobSet's name, JobSet's own default) |
/// | `LOCKSTEP_PORT` | the manifest | the port every pod listens on (default 8888) |
///
/// Pod `p` of Job `j` is rank `j × pods_per_job + p`, so ranks follow the JobSet's Job order,
/// and worker 0 is the chief. Its address is JobSet's pod host name,
/// `<jobset>-<replicatedJob>-<j>-<p>.<subdomain>:<port>`, or for a plain indexed Job
/// `<job>-<p>.<subdomain>:<port>`.
///
/// ```
/// use lockstep_cluster::{ClusterResolver, KubernetesResolver};
///
/// let resolver = KubernetesResolver::from_vars([
///     ("JOB_COMPLETION_INDEX", "1"),
///     ("LOCKSTEP_PODS_PER_JOB", "2"),
///     ("JOBSET_NAME", "mnist"),
///     ("REPLICATED_JOB_NAME", "workers"),
///     ("JOB_INDEX", "1"),
///     ("LOCKSTEP_JOBS", "2"),
/// ]);
/// let cluster = resolver.resolve()?;
/// assert_eq!(cluster.rank(), Some(3));
/// assert_eq!(cluster.group_addresses()[3], "mnist-workers-1-1.mnist:8888");
/// # Ok::<(), lockstep_cluster::ClusterError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesResolver {
    vars: BTreeMap<String, String>,
}

impl KubernetesResolver {
    /// The variable whose presence says this process is a pod of an indexed Job.
    pub const INDEX_VAR: &'static str = "JOB_COMPLETION_INDEX";
    /// The port every pod listens on when `LOCKSTEP_PORT` is unset.
    pub const DEFAULT_PORT: u16 = 8888;

    /// The names of the variables this resolver reads.
    pub const VARS: [&'static str; 9] = [
        Self::INDEX_VAR,
        PODS_PER_JOB,
        JOBSET_NAME,
        REPLICATED_JOB_NAME,
        JOB_INDEX,
        JOBS,
        JOB_NAME,
        SUBDOMAIN,
        PORT_VAR,
    ];

    /// Takes the variables from the environment now.
    pub fn from_env() -> Self {
        Self::from_vars(
            Self::VARS
                .iter()
                .filter_map(|&var| Some((var, std::env::var(var).ok()?))),
        )
    }

    /// Uses the given variables instead of the environment (for tests and custom launchers).
    pub fn from_vars<K: Into<String>, V: Into<String>>(
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Self {
            vars: vars
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        }
    }

    fn optional(&self, var: &'static str) -> Option<&str> {
        self.vars
            .get(var)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    }

    fn var(&self, var: &'static str) -> Result<&str, ClusterError> {
        self.optional(var).ok_or(ClusterError::MissingEnv {
            var,
            resolver: RESOLVER,
        })
    }

    fn count(&self, var: &'static str, default: Option<usize>) -> Result<usize, ClusterError> {
        let value = match (self.optional(var), default) {
            (Some(value), _) => value,
            (None, Some(default)) => return Ok(default),
            (None, None) => self.var(var)?,
        };
        value
            .parse()
            .map_err(|_| ClusterError::invalid_env(var, value, "not a non-negative integer".into()))
    }

    /// The host name of pod `pod` of Job `job`, without the subdomain.
    fn host(&self, job: usize, pod: usize) -> Result<String, ClusterError> {
        match self.optional(JOBSET_NAME) {
            Some(jobset) => {
                let replicated = self.var(REPLICATED_JOB_NAME)?;
                Ok(format!("{jobset}-{replicated}-{job}-{pod}"))
            }
            None => Ok(format!("{}-{pod}", self.var(JOB_NAME)?)),
        }
    }
}

const PODS_PER_JOB: &str = "LOCKSTEP_PODS_PER_JOB";
const JOBSET_NAME: &str = "JOBSET_NAME";
const REPLICATED_JOB_NAME: &str = "REPLICATED_JOB_NAME";
const JOB_INDEX: &str = "JOB_INDEX";
const JOBS: &str = "LOCKSTEP_JOBS";
const JOB_NAME: &str = "JOB_NAME";
const SUBDOMAIN: &str = "LOCKSTEP_SUBDOMAIN";

impl ClusterResolver for KubernetesResolver {
    fn resolve(&self) -> Result<Cluster, ClusterError> {
        let pod = self.count(Self::INDEX_VAR, None)?;
        let per_job = self.count(PODS_PER_JOB, None)?;
        let jobset = self.optional(JOBSET_NAME).is_some();
        let (job, jobs) = if jobset {
            (self.count(JOB_INDEX, Some(0))?, self.count(JOBS, Some(1))?)
        } else {
            (0, 1)
        };
        if per_job == 0 {
            return Err(ClusterError::invalid_env(
                PODS_PER_JOB,
                "0",
                "a Job has at least one pod".into(),
            ));
        }
        if pod >= per_job {
            return Err(ClusterError::invalid_env(
                Self::INDEX_VAR,
                &pod.to_string(),
                format!("must be below {PODS_PER_JOB}={per_job}"),
            ));
        }
        if job >= jobs {
            return Err(ClusterError::invalid_env(
                JOB_INDEX,
                &job.to_string(),
                format!("must be below {JOBS}={jobs}"),
            ));
        }
        let world = jobs
            .checked_mul(per_job)
            .filter(|&w| w <= MAX_PODS)
            .ok_or_else(|| {
                ClusterError::invalid_env(
                    JOBS,
                    &jobs.to_string(),
                    format!("{jobs} Jobs of {per_job} pods are more than {MAX_PODS} pods"),
                )
            })?;
        let subdomain = match self.optional(SUBDOMAIN) {
            Some(subdomain) => subdomain,
            None if jobset => self.var(JOBSET_NAME)?,
            None => self.var(SUBDOMAIN)?,
        };
        let port = match self.optional(PORT_VAR) {
            None => Self::DEFAULT_PORT,
            Some(value) => port_var(value)?,
        };
        let mut addresses = Vec::with_capacity(world);
        for rank in 0..world {
            let address = format!(
                "{}.{subdomain}:{port}",
                self.host(rank / per_job, rank % per_job)?
            );
            address.parse::<Address>().map_err(|e| {
                let var = if jobset { JOBSET_NAME } else { JOB_NAME };
                let value = self.optional(var).unwrap_or_default();
                ClusterError::invalid_env(
                    var,
                    value,
                    format!("gives the bad pod address {address:?}: {e}"),
                )
            })?;
            addresses.push(address);
        }
        let spec = ClusterSpec::from_jobs([(WORKER, addresses)])?;
        Cluster::new(TfConfig {
            cluster: spec,
            task: Some(TaskId::worker(job * per_job + pod)),
            rpc_layer: None,
            environment: None,
        })
    }
}

/// More pods than this is a mistake in a variable, not a cluster (a spec of that many
/// addresses would take gigabytes).
const MAX_PODS: usize = 1 << 16;

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn jobset(vars: &[(&str, &str)]) -> KubernetesResolver {
        let mut all = vec![
            ("JOB_COMPLETION_INDEX", "0"),
            (PODS_PER_JOB, "2"),
            (JOBSET_NAME, "train"),
            (REPLICATED_JOB_NAME, "worker"),
        ];
        for &(k, v) in vars {
            all.retain(|(key, _)| *key != k);
            all.push((k, v));
        }
        KubernetesResolver::from_vars(all)
    }

    #[test]
    fn jobset_pods_take_ranks_in_job_order_and_dns_names_in_the_subdomain() {
        let c = jobset(&[
            ("JOB_COMPLETION_INDEX", "0"),
            (JOB_INDEX, "1"),
            (JOBS, "2"),
            (SUBDOMAIN, "svc"),
            (PORT_VAR, "2222"),
        ])
        .resolve()
        .unwrap();
        assert_eq!(
            c.group_addresses(),
            [
                "train-worker-0-0.svc:2222",
                "train-worker-0-1.svc:2222",
                "train-worker-1-0.svc:2222",
                "train-worker-1-1.svc:2222",
            ]
        );
        assert_eq!(c.task(), &TaskId::worker(2));
        assert!(!c.is_chief());
        assert!(jobset(&[]).resolve().unwrap().is_chief());
    }

    #[test]
    fn a_plain_indexed_job_names_pods_after_the_job() {
        let c = KubernetesResolver::from_vars([
            ("JOB_COMPLETION_INDEX", "2"),
            (PODS_PER_JOB, "3"),
            (JOB_NAME, "mnist"),
            (SUBDOMAIN, "mnist-svc"),
        ])
        .resolve()
        .unwrap();
        assert_eq!(
            c.group_addresses(),
            [
                "mnist-0.mnist-svc:8888",
                "mnist-1.mnist-svc:8888",
                "mnist-2.mnist-svc:8888"
            ]
        );
        assert_eq!(c.rank(), Some(2));
    }

    #[test]
    fn missing_and_bad_variables_are_named() {
        let missing = |vars: &[(&'static str, &'static str)], var: &'static str| {
            assert_eq!(
                KubernetesResolver::from_vars(vars.iter().copied()).resolve(),
                Err(ClusterError::MissingEnv {
                    var,
                    resolver: RESOLVER
                })
            );
        };
        missing(&[], "JOB_COMPLETION_INDEX");
        missing(&[("JOB_COMPLETION_INDEX", "0")], PODS_PER_JOB);
        missing(
            &[
                ("JOB_COMPLETION_INDEX", "0"),
                (PODS_PER_JOB, "1"),
                (SUBDOMAIN, "s"),
            ],
            JOB_NAME,
        );
        missing(
            &[
                ("JOB_COMPLETION_INDEX", "0"),
                (PODS_PER_JOB, "1"),
                (JOB_NAME, "j"),
            ],
            SUBDOMAIN,
        );
        missing(
            &[
                ("JOB_COMPLETION_INDEX", "0"),
                (PODS_PER_JOB, "1"),
                (JOBSET_NAME, "j"),
            ],
            REPLICATED_JOB_NAME,
        );
        let cases = [
            (
                jobset(&[("JOB_COMPLETION_INDEX", "x")]),
                "JOB_COMPLETION_INDEX",
            ),
            (
                jobset(&[("JOB_COMPLETION_INDEX", "2")]),
                "JOB_COMPLETION_INDEX",
            ),
            (jobset(&[(PODS_PER_JOB, "0")]), PODS_PER_JOB),
            (jobset(&[(JOB_INDEX, "1")]), JOB_INDEX),
            (jobset(&[(JOBS, "99999999999")]), JOBS),
            (jobset(&[(PORT_VAR, "0")]), PORT_VAR),
            (jobset(&[(PORT_VAR, "70000")]), PORT_VAR),
            (jobset(&[(JOBSET_NAME, "bad_name")]), JOBSET_NAME),
        ];
        for (r, var) in cases {
            match r.resolve() {
                Err(ClusterError::InvalidEnv { var: v, .. }) => assert_eq!(v, var, "{r:?}"),
                other => panic!("{r:?}: {other:?}"),
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn any_variables_resolve_or_fail_without_panicking(
            vars in proptest::collection::vec(
                (proptest::sample::select(KubernetesResolver::VARS.to_vec()), "\\PC{0,12}"),
                0..10,
            )
        ) {
            let _ = KubernetesResolver::from_vars(vars).resolve();
        }

        #[test]
        fn every_pod_of_a_jobset_sees_the_same_cluster_and_its_own_rank(
            per_job in 1_usize..5,
            jobs in 1_usize..4,
        ) {
            let mut seen = Vec::new();
            for job in 0..jobs {
                for pod in 0..per_job {
                    let (p, j, n, pj) = (pod.to_string(), job.to_string(), jobs.to_string(), per_job.to_string());
                    let c = jobset(&[
                        ("JOB_COMPLETION_INDEX", &p),
                        (JOB_INDEX, &j),
                        (JOBS, &n),
                        (PODS_PER_JOB, &pj),
                    ])
                    .resolve()
                    .unwrap();
                    prop_assert_eq!(c.rank(), Some(seen.len()));
                    seen.push(c.spec().clone());
                }
            }
            prop_assert!(seen.windows(2).all(|w| w[0] == w[1]));
        }
    }
}
