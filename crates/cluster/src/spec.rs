//! `ClusterSpec`: job name → ordered addresses, validated as a whole.

use std::collections::{BTreeMap, HashMap};

use crate::address::Address;
use crate::error::ClusterError;
use crate::task::{CHIEF, EVALUATOR, TaskId, is_valid_job_name};

/// The jobs of a cluster and the ordered addresses of each job's tasks, like TensorFlow's
/// `tf.train.ClusterSpec`.
///
/// A `ClusterSpec` is always valid: job names follow TensorFlow's rule, every job lists at least
/// one `host:port` address, there is at most one chief and one evaluator, and no address is
/// given to two tasks.
///
/// ```
/// use lockstep_cluster::{ClusterSpec, TaskId};
///
/// let spec = ClusterSpec::from_jobs([
///     ("chief", vec!["10.0.0.1:2222"]),
///     ("worker", vec!["10.0.0.2:2222", "10.0.0.3:2222"]),
/// ])?;
/// assert_eq!(spec.num_tasks("worker"), 2);
/// assert_eq!(spec.address(&TaskId::worker(1)), Some("10.0.0.3:2222"));
/// assert!(ClusterSpec::from_jobs([("worker", vec!["a:1", "a:1"])]).is_err());
/// # Ok::<(), lockstep_cluster::ClusterError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterSpec {
    jobs: BTreeMap<String, Vec<String>>,
}

impl ClusterSpec {
    /// Builds and validates a spec from `(job, addresses)` pairs.
    ///
    /// # Errors
    ///
    /// [`ClusterError::InvalidValue`] for a bad job name, an empty job or a repeated job,
    /// [`ClusterError::InvalidAddress`] for an address that is not `host:port`,
    /// [`ClusterError::MultipleChiefs`], [`ClusterError::MultipleEvaluators`] and
    /// [`ClusterError::DuplicateAddress`].
    pub fn from_jobs<J, A, I>(jobs: I) -> Result<Self, ClusterError>
    where
        J: Into<String>,
        A: Into<String>,
        I: IntoIterator<Item = (J, Vec<A>)>,
    {
        let mut map = BTreeMap::new();
        for (job, addresses) in jobs {
            let job = job.into();
            let addresses: Vec<String> = addresses.into_iter().map(Into::into).collect();
            if map.contains_key(&job) {
                return Err(ClusterError::InvalidValue {
                    field: format!("cluster.{job}"),
                    value: format!("{addresses:?}"),
                    reason: "the job is listed twice".into(),
                });
            }
            map.insert(job, addresses);
        }
        let spec = Self { jobs: map };
        spec.validate()?;
        Ok(spec)
    }

    fn validate(&self) -> Result<(), ClusterError> {
        let mut seen: HashMap<String, TaskId> = HashMap::new();
        for (job, addresses) in &self.jobs {
            if !is_valid_job_name(job) {
                return Err(ClusterError::InvalidValue {
                    field: "cluster".into(),
                    value: format!("{job:?}"),
                    reason: "a job name must be a letter followed by letters, digits or '_'".into(),
                });
            }
            if addresses.is_empty() {
                return Err(ClusterError::InvalidValue {
                    field: format!("cluster.{job}"),
                    value: "[]".into(),
                    reason: "a job must list at least one address".into(),
                });
            }
            for (index, written) in addresses.iter().enumerate() {
                let address: Address =
                    written
                        .parse()
                        .map_err(|reason| ClusterError::InvalidAddress {
                            field: format!("cluster.{job}[{index}]"),
                            value: written.clone(),
                            reason,
                        })?;
                let task = TaskId::new(job.clone(), index);
                if let Some(first) = seen.insert(address.to_string(), task.clone()) {
                    return Err(ClusterError::DuplicateAddress {
                        address: written.clone(),
                        first,
                        second: task,
                    });
                }
            }
        }
        let listed = |job: &str| self.addresses(job).join(", ");
        match self.num_tasks(CHIEF) {
            0 | 1 => {}
            count => {
                return Err(ClusterError::MultipleChiefs {
                    count,
                    addresses: listed(CHIEF),
                });
            }
        }
        match self.num_tasks(EVALUATOR) {
            0 | 1 => Ok(()),
            count => Err(ClusterError::MultipleEvaluators {
                count,
                addresses: listed(EVALUATOR),
            }),
        }
    }

    /// `true` when the spec lists no job (a local, single-process run).
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// The job names, in sorted order.
    pub fn jobs(&self) -> impl Iterator<Item = &str> {
        self.jobs.keys().map(String::as_str)
    }

    /// `true` when the spec has the job.
    pub fn has_job(&self, job: &str) -> bool {
        self.jobs.contains_key(job)
    }

    /// The addresses of a job in task order; empty for a job the spec does not have.
    pub fn addresses(&self, job: &str) -> &[String] {
        self.jobs.get(job).map_or(&[], Vec::as_slice)
    }

    /// The number of tasks of a job; 0 for a job the spec does not have.
    pub fn num_tasks(&self, job: &str) -> usize {
        self.addresses(job).len()
    }

    /// The address of a task, if the spec lists it.
    pub fn address(&self, task: &TaskId) -> Option<&str> {
        self.addresses(&task.job)
            .get(task.index)
            .map(String::as_str)
    }

    /// Every task with its address, job by job in sorted order, then by index.
    pub fn tasks(&self) -> impl Iterator<Item = (TaskId, &str)> {
        self.jobs.iter().flat_map(|(job, addresses)| {
            addresses
                .iter()
                .enumerate()
                .map(move |(index, address)| (TaskId::new(job.clone(), index), address.as_str()))
        })
    }

    /// The job names joined for error messages.
    pub(crate) fn job_list(&self) -> String {
        if self.jobs.is_empty() {
            "none".into()
        } else {
            self.jobs().collect::<Vec<_>>().join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::AddressError;

    #[test]
    fn a_valid_spec_keeps_job_order_and_addresses() {
        let spec = ClusterSpec::from_jobs([
            ("worker", vec!["h:2", "h:3"]),
            ("chief", vec!["h:1"]),
            ("my_job", vec!["[::1]:9"]),
        ])
        .unwrap();
        assert_eq!(
            spec.jobs().collect::<Vec<_>>(),
            ["chief", "my_job", "worker"]
        );
        assert_eq!(spec.addresses("worker"), ["h:2", "h:3"]);
        assert_eq!(spec.address(&TaskId::chief()), Some("h:1"));
        assert_eq!(spec.address(&TaskId::worker(2)), None);
        assert_eq!(spec.tasks().count(), 4);
    }

    #[test]
    fn two_chiefs_are_refused() {
        let err = ClusterSpec::from_jobs([("chief", vec!["a:1", "b:1"])]).unwrap_err();
        assert_eq!(
            err,
            ClusterError::MultipleChiefs {
                count: 2,
                addresses: "a:1, b:1".into()
            }
        );
    }

    #[test]
    fn an_evaluator_listed_twice_is_refused() {
        let err =
            ClusterSpec::from_jobs([("worker", vec!["a:1"]), ("evaluator", vec!["b:1", "c:1"])])
                .unwrap_err();
        assert!(
            matches!(err, ClusterError::MultipleEvaluators { count: 2, .. }),
            "{err}"
        );
    }

    #[test]
    fn the_same_address_for_two_tasks_is_refused_even_when_spelled_differently() {
        let err =
            ClusterSpec::from_jobs([("chief", vec!["[::1]:5"]), ("worker", vec!["[0::1]:5"])])
                .unwrap_err();
        assert_eq!(
            err,
            ClusterError::DuplicateAddress {
                address: "[0::1]:5".into(),
                first: TaskId::chief(),
                second: TaskId::worker(0)
            }
        );
        assert!(ClusterSpec::from_jobs([("worker", vec!["Host:5", "host:5"])]).is_err());
    }

    #[test]
    fn a_bad_address_names_its_field() {
        let err = ClusterSpec::from_jobs([("worker", vec!["a:1", "b"])]).unwrap_err();
        assert_eq!(
            err,
            ClusterError::InvalidAddress {
                field: "cluster.worker[1]".into(),
                value: "b".into(),
                reason: AddressError::MissingPort
            }
        );
    }

    #[test]
    fn bad_job_names_empty_jobs_and_repeated_jobs_are_refused() {
        let bad_name = ClusterSpec::from_jobs([("job-x", vec!["a:1"])]).unwrap_err();
        assert!(bad_name.to_string().contains("\"job-x\""), "{bad_name}");
        let empty = ClusterSpec::from_jobs([("worker", Vec::<String>::new())]).unwrap_err();
        assert!(empty.to_string().contains("cluster.worker"), "{empty}");
        let twice =
            ClusterSpec::from_jobs([("worker", vec!["a:1"]), ("worker", vec!["b:1"])]).unwrap_err();
        assert!(twice.to_string().contains("listed twice"), "{twice}");
    }
}
