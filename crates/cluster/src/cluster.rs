//! `Cluster`: a config whose task is known to fit, with TensorFlow's roles and ranks.

use crate::address::Address;
use crate::error::ClusterError;
use crate::spec::ClusterSpec;
use crate::task::{CHIEF, EVALUATOR, TaskId, WORKER};
use crate::tf_config::TfConfig;

/// A validated cluster as seen by one task: who is chief, which tasks all-reduce together, and
/// this task's rank among them.
///
/// The rules are TensorFlow's (`MultiWorkerMirroredStrategy` and `RunConfig`):
/// - the chief is `chief:0`, or `worker:0` when the cluster has no chief job;
/// - the collective group is the chief, then the workers in order, and a task's rank is its
///   position in that list;
/// - `ps` and `evaluator` tasks are outside the group and have no rank;
/// - an evaluator may be absent from the cluster (it then must have index 0);
/// - no cluster at all means a single local worker: `worker:0`, rank 0 of 1, chief.
///
/// ```
/// use lockstep_cluster::{Cluster, TaskId, TfConfig};
///
/// let config = TfConfig::parse(r#"{
///     "cluster": {"chief": ["h0:1"], "worker": ["h1:1", "h2:1"], "evaluator": ["h3:1"]},
///     "task": {"type": "worker", "index": 1}
/// }"#)?;
/// let cluster = Cluster::new(config)?;
/// assert_eq!(cluster.rank(), Some(2));
/// assert_eq!(cluster.world_size(), 3);
/// assert_eq!(cluster.chief(), TaskId::chief());
/// assert!(!cluster.is_chief());
/// assert_eq!(cluster.peer_address(0), Some("h0:1"));
/// # Ok::<(), lockstep_cluster::ClusterError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    config: TfConfig,
    task: TaskId,
    group: Vec<TaskId>,
}

impl Cluster {
    /// Checks that the config's task fits its cluster and derives roles and ranks.
    ///
    /// # Errors
    ///
    /// [`ClusterError::EmptyClusterWithTask`], [`ClusterError::MissingTask`],
    /// [`ClusterError::NoCollectiveGroup`], [`ClusterError::TaskTypeNotInCluster`] and
    /// [`ClusterError::IndexOutOfRange`].
    pub fn new(config: TfConfig) -> Result<Self, ClusterError> {
        let spec = &config.cluster;
        let task = match (&config.task, spec.is_empty()) {
            (None, true) => {
                return Ok(Self {
                    task: TaskId::worker(0),
                    group: vec![TaskId::worker(0)],
                    config,
                });
            }
            (Some(task), true) => {
                return Err(ClusterError::EmptyClusterWithTask { task: task.clone() });
            }
            (None, false) => {
                return Err(ClusterError::MissingTask {
                    jobs: spec.job_list(),
                });
            }
            (Some(task), false) => task.clone(),
        };
        if !spec.has_job(CHIEF) && !spec.has_job(WORKER) {
            return Err(ClusterError::NoCollectiveGroup {
                jobs: spec.job_list(),
            });
        }
        let len = match spec.num_tasks(&task.job) {
            // TensorFlow lets the evaluator stay out of the cluster spec.
            0 if task.job == EVALUATOR => 1,
            0 => {
                return Err(ClusterError::TaskTypeNotInCluster {
                    job: task.job,
                    jobs: spec.job_list(),
                });
            }
            len => len,
        };
        if task.index >= len {
            return Err(ClusterError::IndexOutOfRange {
                job: task.job,
                index: task.index,
                len,
            });
        }
        let group = (0..spec.num_tasks(CHIEF))
            .map(|_| TaskId::chief())
            .chain((0..spec.num_tasks(WORKER)).map(TaskId::worker))
            .collect();
        Ok(Self {
            config,
            task,
            group,
        })
    }

    /// A single local worker with no peers, what a missing `TF_CONFIG` means.
    pub fn local() -> Self {
        Self {
            config: TfConfig::default(),
            task: TaskId::worker(0),
            group: vec![TaskId::worker(0)],
        }
    }

    /// `true` for a single local worker with no cluster spec.
    pub fn is_local(&self) -> bool {
        self.config.cluster.is_empty()
    }

    /// The cluster's jobs and addresses (empty when local).
    pub fn spec(&self) -> &ClusterSpec {
        &self.config.cluster
    }

    /// The config this cluster was built from.
    pub fn config(&self) -> &TfConfig {
        &self.config
    }

    /// This process's task.
    pub fn task(&self) -> &TaskId {
        &self.task
    }

    /// The `rpc_layer` field, such as `grpc`.
    pub fn rpc_layer(&self) -> Option<&str> {
        self.config.rpc_layer.as_deref()
    }

    /// The `environment` field, such as `cloud`.
    pub fn environment(&self) -> Option<&str> {
        self.config.environment.as_deref()
    }

    /// The chief: `chief:0`, or `worker:0` when there is no chief job.
    pub fn chief(&self) -> TaskId {
        self.group[0].clone()
    }

    /// `true` when this task is the chief. An evaluator is never the chief: it saves no
    /// training checkpoints.
    pub fn is_chief(&self) -> bool {
        self.task == self.group[0]
    }

    /// The tasks that all-reduce together, in rank order: the chief, then the workers.
    pub fn collective_group(&self) -> &[TaskId] {
        &self.group
    }

    /// The number of tasks in the collective group.
    pub fn world_size(&self) -> usize {
        self.group.len()
    }

    /// The number of `worker` tasks (the chief not counted); 1 when local.
    pub fn num_workers(&self) -> usize {
        if self.is_local() {
            1
        } else {
            self.spec().num_tasks(WORKER)
        }
    }

    /// The rank of any task in the collective group; `None` for tasks outside it.
    pub fn rank_of(&self, task: &TaskId) -> Option<usize> {
        self.group.iter().position(|t| t == task)
    }

    /// This task's rank; `None` for `ps` and `evaluator` tasks.
    pub fn rank(&self) -> Option<usize> {
        self.rank_of(&self.task)
    }

    /// `true` when this task takes part in collectives.
    pub fn in_collective_group(&self) -> bool {
        self.rank().is_some()
    }

    /// The address of the task at `rank`; `None` past the group's end, or when local.
    pub fn peer_address(&self, rank: usize) -> Option<&str> {
        self.group
            .get(rank)
            .and_then(|task| self.spec().address(task))
    }

    /// The addresses of the whole collective group in rank order; empty when local.
    pub fn group_addresses(&self) -> Vec<&str> {
        (0..self.world_size())
            .filter_map(|rank| self.peer_address(rank))
            .collect()
    }

    /// How many tasks of the collective group (this one included) the cluster spec places on
    /// this task's host: the tasks that share its cores. Hosts compare as written (an IPv4
    /// address, an IPv6 address or a case-folded name), so `localhost` and `127.0.0.1` count
    /// as two hosts. 1 when local or for a task outside the group.
    ///
    /// ```
    /// use lockstep_cluster::{Cluster, TfConfig};
    ///
    /// let config = TfConfig::parse(r#"{"cluster": {"worker": ["a:1", "a:2", "b:1"]},
    ///                                  "task": {"type": "worker", "index": 0}}"#)?;
    /// assert_eq!(Cluster::new(config)?.group_tasks_on_this_host(), 2);
    /// # Ok::<(), lockstep_cluster::ClusterError>(())
    /// ```
    pub fn group_tasks_on_this_host(&self) -> usize {
        let host_of = |address: &str| address.parse::<Address>().ok().map(|a| a.host().clone());
        let Some(mine) = self.spec().address(&self.task).and_then(host_of) else {
            return 1;
        };
        if !self.in_collective_group() {
            return 1;
        }
        self.group_addresses()
            .into_iter()
            .filter(|&a| host_of(a).as_ref() == Some(&mine))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(json: &str) -> Result<Cluster, ClusterError> {
        Cluster::new(TfConfig::parse(json)?)
    }

    const FULL: &str = r#""cluster": {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["p:1"], "evaluator": ["e:1"]}"#;

    fn full(task: &str) -> Cluster {
        cluster(&format!("{{{FULL}, \"task\": {task}}}")).unwrap()
    }

    #[test]
    fn the_chief_job_comes_first_in_the_group() {
        let c = full(r#"{"type": "chief", "index": 0}"#);
        assert_eq!(
            c.collective_group(),
            [TaskId::chief(), TaskId::worker(0), TaskId::worker(1)]
        );
        assert_eq!(c.rank(), Some(0));
        assert!(c.is_chief());
        assert_eq!(c.num_workers(), 2);
        assert_eq!(c.world_size(), 3);
        assert_eq!(c.group_addresses(), ["c:1", "w0:1", "w1:1"]);
    }

    #[test]
    fn tasks_on_this_host_count_the_group_members_that_share_its_host() {
        let on = |task: &str| {
            cluster(&format!(
                r#"{{"cluster": {{"chief": ["h:1"], "worker": ["H:2", "[::1]:3", "[0::1]:4"], "evaluator": ["h:9"]}}, "task": {task}}}"#
            ))
            .unwrap()
            .group_tasks_on_this_host()
        };
        assert_eq!(on(r#"{"type": "chief", "index": 0}"#), 2); // names compare without case
        assert_eq!(on(r#"{"type": "worker", "index": 1}"#), 2); // [::1] and [0::1] are one host
        assert_eq!(on(r#"{"type": "evaluator", "index": 0}"#), 1); // outside the group
        assert_eq!(
            full(r#"{"type": "worker", "index": 0}"#).group_tasks_on_this_host(),
            1
        );
        assert_eq!(Cluster::local().group_tasks_on_this_host(), 1);
    }

    #[test]
    fn workers_are_ranked_after_the_chief() {
        let c = full(r#"{"type": "worker", "index": 1}"#);
        assert_eq!(c.rank(), Some(2));
        assert!(!c.is_chief());
        assert_eq!(c.peer_address(1), Some("w0:1"));
        assert_eq!(c.peer_address(3), None);
    }

    #[test]
    fn worker_zero_is_chief_when_there_is_no_chief_job() {
        let c = cluster(
            r#"{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}"#,
        )
        .unwrap();
        assert!(c.is_chief());
        assert_eq!(c.chief(), TaskId::worker(0));
        assert_eq!(c.rank(), Some(0));
    }

    #[test]
    fn ps_and_evaluator_are_outside_the_group() {
        for task in [
            r#"{"type": "ps", "index": 0}"#,
            r#"{"type": "evaluator", "index": 0}"#,
        ] {
            let c = full(task);
            assert_eq!(c.rank(), None);
            assert!(!c.in_collective_group());
            assert!(!c.is_chief());
            assert_eq!(c.world_size(), 3);
        }
    }

    #[test]
    fn an_evaluator_may_be_missing_from_the_cluster_but_only_with_index_zero() {
        let ok = cluster(
            r#"{"cluster": {"worker": ["a:1"]}, "task": {"type": "evaluator", "index": 0}}"#,
        )
        .unwrap();
        assert_eq!(ok.rank(), None);
        let err = cluster(
            r#"{"cluster": {"worker": ["a:1"]}, "task": {"type": "evaluator", "index": 1}}"#,
        )
        .unwrap_err();
        assert_eq!(
            err,
            ClusterError::IndexOutOfRange {
                job: "evaluator".into(),
                index: 1,
                len: 1
            }
        );
    }

    #[test]
    fn no_tf_config_means_a_single_local_worker() {
        let c = cluster("").unwrap();
        assert_eq!(c, Cluster::local());
        assert!(c.is_local());
        assert_eq!(
            (c.rank(), c.world_size(), c.num_workers(), c.is_chief()),
            (Some(0), 1, 1, true)
        );
        assert_eq!(c.peer_address(0), None);
    }

    #[test]
    fn a_task_type_not_in_the_cluster_is_refused() {
        let err =
            cluster(r#"{"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}"#)
                .unwrap_err();
        assert_eq!(
            err,
            ClusterError::TaskTypeNotInCluster {
                job: "chief".into(),
                jobs: "worker".into()
            }
        );
    }

    #[test]
    fn an_index_out_of_range_is_refused() {
        let err =
            cluster(r#"{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}}"#)
                .unwrap_err();
        assert_eq!(
            err,
            ClusterError::IndexOutOfRange {
                job: "worker".into(),
                index: 1,
                len: 1
            }
        );
        assert!(err.to_string().contains("`task.index` = 1"), "{err}");
    }

    #[test]
    fn an_empty_cluster_with_a_task_is_refused() {
        let err =
            cluster(r#"{"cluster": {}, "task": {"type": "worker", "index": 0}}"#).unwrap_err();
        assert_eq!(
            err,
            ClusterError::EmptyClusterWithTask {
                task: TaskId::worker(0)
            }
        );
    }

    #[test]
    fn a_cluster_without_a_task_is_refused() {
        let err = cluster(r#"{"cluster": {"worker": ["a:1"]}}"#).unwrap_err();
        assert_eq!(
            err,
            ClusterError::MissingTask {
                jobs: "worker".into()
            }
        );
    }

    #[test]
    fn a_cluster_with_nobody_to_train_is_refused() {
        let err = cluster(r#"{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0}}"#)
            .unwrap_err();
        assert_eq!(err, ClusterError::NoCollectiveGroup { jobs: "ps".into() });
    }

    #[test]
    fn custom_jobs_are_carried_but_not_ranked() {
        let c = cluster(r#"{"cluster": {"worker": ["a:1"], "sidecar": ["b:1"]}, "task": {"type": "sidecar", "index": 0}}"#)
            .unwrap();
        assert_eq!(c.rank(), None);
        assert_eq!(c.spec().num_tasks("sidecar"), 1);
    }
}
