//! The one error type of the crate.

use crate::address::AddressError;
use crate::task::TaskId;

/// Everything that can be wrong with a cluster description.
///
/// Every variant names the offending field (or environment variable) and quotes the value,
/// so a user can fix the `TF_CONFIG` without reading this crate's source.
///
/// ```
/// use lockstep_cluster::{ClusterError, TfConfig};
///
/// let err = TfConfig::parse(r#"{"cluster": {"worker": ["localhost"]}}"#).unwrap_err();
/// assert!(matches!(err, ClusterError::InvalidAddress { .. }));
/// assert_eq!(
///     err.to_string(),
///     "TF_CONFIG field `cluster.worker[0]` = \"localhost\" is not a host:port address: no `:port` after the host",
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The text is not JSON at all; the message carries `serde_json`'s line and column.
    #[error("TF_CONFIG is not valid JSON: {message}")]
    Json {
        /// `serde_json`'s description, with line and column.
        message: String,
    },
    /// A field holds a JSON value of the wrong kind.
    #[error("TF_CONFIG field `{field}` must be {expected}, got {got}")]
    WrongType {
        /// Dotted path of the field, such as `task.index`.
        field: String,
        /// What the field must hold.
        expected: &'static str,
        /// The offending JSON value, shortened if long.
        got: String,
    },
    /// A field has the right kind of value but an unacceptable one.
    #[error("TF_CONFIG field `{field}` = {value}: {reason}")]
    InvalidValue {
        /// Dotted path of the field.
        field: String,
        /// The offending value, quoted.
        value: String,
        /// Why it is refused.
        reason: String,
    },
    /// An address in the cluster is not `host:port`.
    #[error("TF_CONFIG field `{field}` = {value:?} is not a host:port address: {reason}")]
    InvalidAddress {
        /// Dotted path of the address, such as `cluster.worker[1]`.
        field: String,
        /// The address as written.
        value: String,
        /// What is wrong with it.
        reason: AddressError,
    },
    /// `task.type` names a job the cluster does not have.
    #[error("TF_CONFIG field `task.type` = {job:?} is not a job of the cluster (jobs: {jobs})")]
    TaskTypeNotInCluster {
        /// The task type as written.
        job: String,
        /// The cluster's jobs, comma separated.
        jobs: String,
    },
    /// `task.index` is past the end of its job's address list.
    #[error(
        "TF_CONFIG field `task.index` = {index} is out of range: job {job:?} has {len} task(s), so the index must be below {len}"
    )]
    IndexOutOfRange {
        /// The task's job.
        job: String,
        /// The index as written.
        index: usize,
        /// How many tasks the job has.
        len: usize,
    },
    /// More than one address under `cluster.chief`.
    #[error(
        "TF_CONFIG field `cluster.chief` lists {count} addresses ({addresses}); there can be at most one chief"
    )]
    MultipleChiefs {
        /// How many were listed.
        count: usize,
        /// The listed addresses, comma separated.
        addresses: String,
    },
    /// More than one address under `cluster.evaluator`.
    #[error(
        "TF_CONFIG field `cluster.evaluator` lists {count} addresses ({addresses}); there can be at most one evaluator"
    )]
    MultipleEvaluators {
        /// How many were listed.
        count: usize,
        /// The listed addresses, comma separated.
        addresses: String,
    },
    /// The same address is given to two tasks.
    #[error(
        "address {address:?} is listed twice in TF_CONFIG's cluster: for {first} and for {second}"
    )]
    DuplicateAddress {
        /// The address as written for the second task.
        address: String,
        /// The task that has it first.
        first: TaskId,
        /// The task that repeats it.
        second: TaskId,
    },
    /// A task is given, but the cluster lists no jobs.
    #[error(
        "TF_CONFIG has task {task} but field `cluster` is empty; list the cluster's jobs, or drop `task` to run locally"
    )]
    EmptyClusterWithTask {
        /// The task as written.
        task: TaskId,
    },
    /// The cluster lists jobs but no task says which one this process is.
    #[error(
        "TF_CONFIG lists cluster jobs ({jobs}) but has no field `task`; set task.type and task.index"
    )]
    MissingTask {
        /// The cluster's jobs, comma separated.
        jobs: String,
    },
    /// Neither a `chief` nor a `worker` job: nobody would train.
    #[error(
        "TF_CONFIG field `cluster` has no `chief` or `worker` job (jobs: {jobs}); the collective group would be empty"
    )]
    NoCollectiveGroup {
        /// The cluster's jobs, comma separated.
        jobs: String,
    },
    /// An environment variable a resolver needs is not set.
    #[error("environment variable {var} is not set; the {resolver} resolver needs it")]
    MissingEnv {
        /// The variable's name.
        var: &'static str,
        /// Which resolver asked for it.
        resolver: &'static str,
    },
    /// An environment variable is set to something unusable.
    #[error("environment variable {var}={value:?}: {reason}")]
    InvalidEnv {
        /// The variable's name.
        var: &'static str,
        /// Its value, or a description of it if it is not UTF-8.
        value: String,
        /// Why it is refused.
        reason: String,
    },
}

/// Renders a JSON value for an error message, cut short so a huge document stays readable.
pub(crate) fn quote_json(value: &serde_json::Value) -> String {
    const LIMIT: usize = 80;
    let text = value.to_string();
    if text.chars().count() <= LIMIT {
        text
    } else {
        let short: String = text.chars().take(LIMIT).collect();
        format!("{short}…")
    }
}

impl ClusterError {
    /// [`ClusterError::InvalidEnv`] for `var` set to `value`, refused for `reason`.
    pub(crate) fn invalid_env(var: &'static str, value: &str, reason: String) -> Self {
        Self::InvalidEnv {
            var,
            value: value.to_owned(),
            reason,
        }
    }
}

/// The variable the SLURM and Kubernetes resolvers take their port from: the one place a
/// deployment says which port its tasks listen on.
pub(crate) const PORT_VAR: &str = "LOCKSTEP_PORT";

/// `LOCKSTEP_PORT`'s value as a port, or the error naming it.
pub(crate) fn port_var(value: &str) -> Result<u16, ClusterError> {
    value
        .trim()
        .parse()
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| {
            ClusterError::invalid_env(PORT_VAR, value, "not a port from 1 to 65535".into())
        })
}
