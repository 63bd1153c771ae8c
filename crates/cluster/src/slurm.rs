//! A cluster from the variables SLURM sets for each task of a job step.

use std::collections::BTreeMap;

use crate::address::Address;
use crate::cluster::Cluster;
use crate::error::{ClusterError, PORT_VAR, port_var};
use crate::hostlist::expand_hostlist;
use crate::resolver::ClusterResolver;
use crate::spec::ClusterSpec;
use crate::task::{TaskId, WORKER};
use crate::tf_config::TfConfig;

const PROCID: &str = "SLURM_PROCID";
const NTASKS: &str = "SLURM_NTASKS";
const NODELIST: &str = "SLURM_STEP_NODELIST";
const TASKS_PER_NODE: &str = "SLURM_STEP_TASKS_PER_NODE";
const RESOLVER: &str = "SLURM";

/// Builds a cluster of `worker` tasks from a SLURM job step, like TensorFlow's
/// `SlurmClusterResolver`.
///
/// Task `i` is `worker:i` (`SLURM_PROCID`). Tasks fill the nodes of `SLURM_STEP_NODELIST` in
/// order, as many per node as `SLURM_STEP_TASKS_PER_NODE` says (`2(x3),1` style), or an equal
/// share of `SLURM_NTASKS` when that is unset. The `k`-th task on a node listens on
/// `base_port + k`: `LOCKSTEP_PORT` when set (a batch script picks one per job, so two jobs
/// sharing a node do not collide), else 8888.
///
/// ```
/// use lockstep_cluster::{ClusterResolver, SlurmResolver};
///
/// let resolver = SlurmResolver::from_vars([
///     ("SLURM_PROCID", "3"),
///     ("SLURM_NTASKS", "4"),
///     ("SLURM_STEP_NODELIST", "node[01-02]"),
/// ]);
/// let cluster = resolver.resolve()?;
/// assert_eq!(cluster.rank(), Some(3));
/// assert_eq!(cluster.group_addresses(), ["node01:8888", "node01:8889", "node02:8888", "node02:8889"]);
/// # Ok::<(), lockstep_cluster::ClusterError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmResolver {
    vars: BTreeMap<String, String>,
    base_port: Option<u16>,
}

impl SlurmResolver {
    /// The first port on each node when none is given: TensorFlow's choice.
    pub const DEFAULT_BASE_PORT: u16 = 8888;

    /// Takes the `SLURM_*` variables and `LOCKSTEP_PORT` from the environment now.
    pub fn from_env() -> Self {
        Self::from_vars(
            std::env::vars_os()
                .filter_map(|(k, v)| {
                    Some((k.into_string().ok()?, v.to_string_lossy().into_owned()))
                })
                .filter(|(k, _)| k.starts_with("SLURM_") || k == PORT_VAR),
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
            base_port: None,
        }
    }

    /// Sets the port of the first task on each node, whatever `LOCKSTEP_PORT` says.
    #[must_use]
    pub fn with_base_port(mut self, base_port: u16) -> Self {
        self.base_port = Some(base_port);
        self
    }

    fn base_port(&self) -> Result<u16, ClusterError> {
        match (self.base_port, self.vars.get(PORT_VAR)) {
            (Some(port), _) => Ok(port),
            (None, Some(value)) => port_var(value),
            (None, None) => Ok(Self::DEFAULT_BASE_PORT),
        }
    }

    fn var(&self, var: &'static str) -> Result<&str, ClusterError> {
        self.vars
            .get(var)
            .map(String::as_str)
            .ok_or(ClusterError::MissingEnv {
                var,
                resolver: RESOLVER,
            })
    }

    fn count(&self, var: &'static str) -> Result<usize, ClusterError> {
        let value = self.var(var)?;
        value
            .trim()
            .parse()
            .map_err(|_| ClusterError::invalid_env(var, value, "not a non-negative integer".into()))
    }

    fn tasks_per_node(&self, nodes: usize, ntasks: usize) -> Result<Vec<usize>, ClusterError> {
        let Some(spec) = self.vars.get(TASKS_PER_NODE) else {
            if !ntasks.is_multiple_of(nodes) {
                return Err(ClusterError::invalid_env(
                    NTASKS,
                    &ntasks.to_string(),
                    format!(
                        "{ntasks} tasks do not spread evenly over {nodes} nodes; set {TASKS_PER_NODE}"
                    ),
                ));
            }
            return Ok(vec![ntasks / nodes; nodes]);
        };
        let counts = parse_tasks_per_node(spec).ok_or_else(|| {
            ClusterError::invalid_env(
                TASKS_PER_NODE,
                spec,
                "expected counts like `2(x3),1`".into(),
            )
        })?;
        if counts.len() != nodes {
            return Err(ClusterError::invalid_env(
                TASKS_PER_NODE,
                spec,
                format!("names {} nodes but the node list has {nodes}", counts.len()),
            ));
        }
        let total: usize = counts.iter().sum();
        if total != ntasks {
            return Err(ClusterError::invalid_env(
                TASKS_PER_NODE,
                spec,
                format!("adds up to {total} tasks but {NTASKS} is {ntasks}"),
            ));
        }
        Ok(counts)
    }
}

impl ClusterResolver for SlurmResolver {
    fn resolve(&self) -> Result<Cluster, ClusterError> {
        let procid = self.count(PROCID)?;
        let ntasks = self.count(NTASKS)?;
        if ntasks == 0 {
            return Err(ClusterError::invalid_env(
                NTASKS,
                "0",
                "a job step has at least one task".into(),
            ));
        }
        if procid >= ntasks {
            return Err(ClusterError::invalid_env(
                PROCID,
                &procid.to_string(),
                format!("must be below {NTASKS}={ntasks}"),
            ));
        }
        let nodelist = self.var(NODELIST)?;
        let nodes = expand_hostlist(nodelist)
            .map_err(|e| ClusterError::invalid_env(NODELIST, nodelist, e.to_string()))?;
        let per_node = self.tasks_per_node(nodes.len(), ntasks)?;
        let base_port = self.base_port()?;
        let mut addresses = Vec::with_capacity(ntasks);
        for (node, &count) in nodes.iter().zip(&per_node) {
            for local in 0..count {
                let port = u16::try_from(local)
                    .ok()
                    .and_then(|l| base_port.checked_add(l))
                    .filter(|&p| p != 0)
                    .ok_or_else(|| {
                        ClusterError::invalid_env(
                            TASKS_PER_NODE,
                            &count.to_string(),
                            format!("{count} tasks from base port {base_port} run past port 65535"),
                        )
                    })?;
                let address = format!("{node}:{port}");
                address.parse::<Address>().map_err(|e| {
                    ClusterError::invalid_env(
                        NODELIST,
                        nodelist,
                        format!("node {node:?} gives a bad address: {e}"),
                    )
                })?;
                addresses.push(address);
            }
        }
        let spec = ClusterSpec::from_jobs([(WORKER, addresses)])?;
        Cluster::new(TfConfig {
            cluster: spec,
            task: Some(TaskId::worker(procid)),
            rpc_layer: Some("grpc".into()),
            environment: None,
        })
    }
}

/// Parses SLURM's compressed counts: `2(x3),1` is `[2, 2, 2, 1]`.
fn parse_tasks_per_node(spec: &str) -> Option<Vec<usize>> {
    let mut counts = Vec::new();
    for part in spec.split(',') {
        let (count, repeat) = match part.split_once("(x") {
            Some((count, rest)) => (count, rest.strip_suffix(')')?.parse::<usize>().ok()?),
            None => (part, 1),
        };
        let count: usize = count.parse().ok()?;
        if repeat == 0 || counts.len() + repeat > crate::hostlist::MAX_HOSTS {
            return None;
        }
        counts.extend(std::iter::repeat_n(count, repeat));
    }
    Some(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolver(procid: &str, ntasks: &str, nodes: &str) -> SlurmResolver {
        SlurmResolver::from_vars([(PROCID, procid), (NTASKS, ntasks), (NODELIST, nodes)])
    }

    #[test]
    fn tasks_per_node_follow_the_compressed_counts() {
        let r = SlurmResolver::from_vars([
            (PROCID, "2"),
            (NTASKS, "3"),
            (NODELIST, "a,b"),
            (TASKS_PER_NODE, "1,2"),
        ])
        .with_base_port(9000);
        let c = r.resolve().unwrap();
        assert_eq!(c.group_addresses(), ["a:9000", "b:9000", "b:9001"]);
        assert_eq!(c.task(), &TaskId::worker(2));
        assert_eq!(c.rpc_layer(), Some("grpc"));
        assert_eq!(parse_tasks_per_node("2(x3),1"), Some(vec![2, 2, 2, 1]));
        assert_eq!(parse_tasks_per_node("2(x0)"), None);
        assert_eq!(parse_tasks_per_node("x"), None);
    }

    #[test]
    fn lockstep_port_sets_the_first_port_of_each_node() {
        let vars = [
            (PROCID, "1"),
            (NTASKS, "2"),
            (NODELIST, "a"),
            (PORT_VAR, "23456"),
        ];
        let c = SlurmResolver::from_vars(vars).resolve().unwrap();
        assert_eq!(c.group_addresses(), ["a:23456", "a:23457"]);
        let c = SlurmResolver::from_vars(vars)
            .with_base_port(9000)
            .resolve()
            .unwrap();
        assert_eq!(c.group_addresses(), ["a:9000", "a:9001"]);
        let err = SlurmResolver::from_vars([
            (PROCID, "0"),
            (NTASKS, "1"),
            (NODELIST, "a"),
            (PORT_VAR, "0"),
        ])
        .resolve()
        .unwrap_err();
        assert!(
            matches!(err, ClusterError::InvalidEnv { var: PORT_VAR, .. }),
            "{err}"
        );
    }

    #[test]
    fn missing_variables_are_named() {
        let err = SlurmResolver::from_vars([(PROCID, "0")])
            .resolve()
            .unwrap_err();
        assert_eq!(
            err,
            ClusterError::MissingEnv {
                var: NTASKS,
                resolver: RESOLVER
            }
        );
    }

    #[test]
    fn bad_values_are_named_with_the_reason() {
        let cases = [
            (resolver("x", "2", "a"), PROCID),
            (resolver("2", "2", "a"), PROCID),
            (resolver("0", "0", "a"), NTASKS),
            (resolver("0", "3", "a,b"), NTASKS),
            (resolver("0", "2", "a[1-"), NODELIST),
            (resolver("0", "2", "bad_host[1-2]"), NODELIST),
        ];
        for (r, var) in cases {
            match r.resolve() {
                Err(ClusterError::InvalidEnv { var: v, .. }) => assert_eq!(v, var),
                other => panic!("{r:?}: {other:?}"),
            }
        }
        let mismatch = SlurmResolver::from_vars([
            (PROCID, "0"),
            (NTASKS, "3"),
            (NODELIST, "a,b"),
            (TASKS_PER_NODE, "1,1"),
        ]);
        assert!(
            mismatch
                .resolve()
                .unwrap_err()
                .to_string()
                .contains("adds up to 2")
        );
    }

    #[test]
    fn ports_past_65535_are_refused() {
        let r = resolver("0", "2", "a").with_base_port(65535);
        assert!(matches!(r.resolve(), Err(ClusterError::InvalidEnv { .. })));
    }
}
