//! Which tasks a local cluster has, and the `TF_CONFIG` each one is given.

use anyhow::{Context as _, bail};
use lockstep_cluster::{CHIEF, ClusterSpec, EVALUATOR, PS, TaskId, TfConfig, WORKER};

/// How many tasks of each job to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) workers: usize,
    pub(crate) chief: bool,
    pub(crate) ps: usize,
    pub(crate) evaluator: bool,
}

impl Shape {
    /// Tasks in start order: chief, workers, parameter servers, evaluator.
    pub(crate) fn tasks(self) -> Vec<TaskId> {
        let chief = self.chief.then(TaskId::chief);
        let evaluator = self.evaluator.then(TaskId::evaluator);
        chief
            .into_iter()
            .chain((0..self.workers).map(TaskId::worker))
            .chain((0..self.ps).map(TaskId::ps))
            .chain(evaluator)
            .collect()
    }
}

/// Gives each task of `shape` a port on 127.0.0.1 and returns every task with its `TF_CONFIG`.
///
/// `ports` must hold one port per task, in the order of [`Shape::tasks`].
pub(crate) fn plan(shape: Shape, ports: &[u16]) -> anyhow::Result<Vec<(TaskId, TfConfig)>> {
    if shape.workers == 0 && !shape.chief {
        bail!("a cluster needs someone to train: pass --workers N with N ≥ 1, or --chief");
    }
    let tasks = shape.tasks();
    if tasks.len() != ports.len() {
        bail!("{} tasks but {} ports", tasks.len(), ports.len());
    }
    let address_of = |job: &str| -> Vec<String> {
        tasks
            .iter()
            .zip(ports)
            .filter(|(task, _)| task.job == job)
            .map(|(_, port)| format!("127.0.0.1:{port}"))
            .collect()
    };
    let jobs = [CHIEF, WORKER, PS, EVALUATOR]
        .into_iter()
        .map(|job| (job, address_of(job)))
        .filter(|(_, addresses)| !addresses.is_empty());
    let spec = ClusterSpec::from_jobs(jobs).context("building the local cluster spec")?;
    Ok(tasks
        .into_iter()
        .map(|task| {
            let config = TfConfig {
                cluster: spec.clone(),
                task: Some(task.clone()),
                rpc_layer: Some("grpc".into()),
                environment: None,
            };
            (task, config)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use lockstep_cluster::Cluster;

    use super::*;

    #[test]
    fn every_task_gets_a_config_that_resolves_to_its_own_rank() {
        let shape = Shape {
            workers: 3,
            chief: true,
            ps: 1,
            evaluator: true,
        };
        let ports: Vec<u16> = (5000..5006).collect();
        let planned = plan(shape, &ports).unwrap();
        let ranks: Vec<_> = planned
            .iter()
            .map(|(task, config)| {
                let cluster = Cluster::new(config.clone()).unwrap();
                assert_eq!(cluster.task(), task);
                cluster.rank()
            })
            .collect();
        assert_eq!(ranks, [Some(0), Some(1), Some(2), Some(3), None, None]);
        assert_eq!(
            planned[5].1.cluster.addresses(EVALUATOR),
            ["127.0.0.1:5005"]
        );
    }

    #[test]
    fn a_cluster_with_nobody_to_train_is_refused() {
        let shape = Shape {
            workers: 0,
            chief: false,
            ps: 1,
            evaluator: false,
        };
        let err = plan(shape, &[5000]).unwrap_err();
        assert!(err.to_string().contains("--workers"), "{err}");
    }
}
