//! The `TF_CONFIG` JSON document: reading it field by field, and writing it back.

use std::str::FromStr;

use serde_json::{Map, Value};

use crate::error::{ClusterError, quote_json};
use crate::spec::ClusterSpec;
use crate::task::{TaskId, is_valid_job_name};

/// The contents of a `TF_CONFIG` environment variable, checked for syntax and for the rules
/// that concern the cluster alone (see [`ClusterSpec`]).
///
/// Whether the task fits the cluster is checked when the config becomes a
/// [`Cluster`](crate::Cluster). Unknown top-level fields (TensorFlow's `trial`, say) are ignored,
/// as TensorFlow ignores them. An empty or all-blank string means "no cluster", as an unset
/// `TF_CONFIG` does.
///
/// ```
/// use lockstep_cluster::{TaskId, TfConfig};
///
/// let config = TfConfig::parse(r#"{
///     "cluster": {"worker": ["localhost:12345", "localhost:23456"]},
///     "task": {"type": "worker", "index": 1},
///     "rpc_layer": "grpc"
/// }"#)?;
/// assert_eq!(config.task, Some(TaskId::worker(1)));
/// assert_eq!(TfConfig::parse(&config.to_json())?, config);
/// # Ok::<(), lockstep_cluster::ClusterError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TfConfig {
    /// The `cluster` field; empty when absent.
    pub cluster: ClusterSpec,
    /// The `task` field; `task.index` defaults to 0 as in TensorFlow's `RunConfig`.
    pub task: Option<TaskId>,
    /// The `rpc_layer` field, such as `grpc`.
    pub rpc_layer: Option<String>,
    /// The `environment` field, such as `cloud`.
    pub environment: Option<String>,
}

impl TfConfig {
    /// Parses a `TF_CONFIG` document.
    ///
    /// # Errors
    ///
    /// [`ClusterError::Json`] when the text is not JSON, [`ClusterError::WrongType`] when a
    /// field holds the wrong kind of value, and any error of [`ClusterSpec::from_jobs`].
    pub fn parse(json: &str) -> Result<Self, ClusterError> {
        if json.trim().is_empty() {
            return Ok(Self::default());
        }
        let root: Value = serde_json::from_str(json).map_err(|e| ClusterError::Json {
            message: e.to_string(),
        })?;
        let root = as_object(&root, "(the whole document)")?;
        Ok(Self {
            cluster: root
                .get("cluster")
                .map_or_else(|| Ok(ClusterSpec::default()), parse_cluster)?,
            task: root.get("task").map(parse_task).transpose()?,
            rpc_layer: optional_string(root, "rpc_layer")?,
            environment: optional_string(root, "environment")?,
        })
    }

    /// Writes the config as `TF_CONFIG` JSON that [`TfConfig::parse`] reads back unchanged.
    pub fn to_json(&self) -> String {
        let mut root = Map::new();
        let cluster: Map<String, Value> = self
            .cluster
            .jobs()
            .map(|job| {
                (
                    job.to_owned(),
                    Value::from(self.cluster.addresses(job).to_vec()),
                )
            })
            .collect();
        root.insert("cluster".into(), Value::Object(cluster));
        if let Some(task) = &self.task {
            let mut t = Map::new();
            t.insert("type".into(), Value::from(task.job.clone()));
            t.insert("index".into(), Value::from(task.index));
            root.insert("task".into(), Value::Object(t));
        }
        if let Some(rpc_layer) = &self.rpc_layer {
            root.insert("rpc_layer".into(), Value::from(rpc_layer.clone()));
        }
        if let Some(environment) = &self.environment {
            root.insert("environment".into(), Value::from(environment.clone()));
        }
        Value::Object(root).to_string()
    }
}

impl FromStr for TfConfig {
    type Err = ClusterError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

fn wrong_type(field: &str, expected: &'static str, got: &Value) -> ClusterError {
    ClusterError::WrongType {
        field: field.to_owned(),
        expected,
        got: quote_json(got),
    }
}

fn as_object<'a>(value: &'a Value, field: &str) -> Result<&'a Map<String, Value>, ClusterError> {
    value
        .as_object()
        .ok_or_else(|| wrong_type(field, "a JSON object", value))
}

fn optional_string(
    object: &Map<String, Value>,
    field: &str,
) -> Result<Option<String>, ClusterError> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(wrong_type(field, "a string", other)),
    }
}

fn parse_cluster(value: &Value) -> Result<ClusterSpec, ClusterError> {
    let jobs = as_object(value, "cluster")?;
    let mut parsed = Vec::with_capacity(jobs.len());
    for (job, addresses) in jobs {
        let field = format!("cluster.{job}");
        let list = addresses
            .as_array()
            .ok_or_else(|| wrong_type(&field, "a list of \"host:port\" strings", addresses))?;
        let addresses = list
            .iter()
            .enumerate()
            .map(|(i, a)| {
                a.as_str().map(str::to_owned).ok_or_else(|| {
                    wrong_type(&format!("{field}[{i}]"), "a \"host:port\" string", a)
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        parsed.push((job.clone(), addresses));
    }
    ClusterSpec::from_jobs(parsed)
}

fn parse_task(value: &Value) -> Result<TaskId, ClusterError> {
    let task = as_object(value, "task")?;
    let job = match task.get("type") {
        Some(Value::String(job)) => job.clone(),
        Some(other) => return Err(wrong_type("task.type", "a job name string", other)),
        None => return Err(wrong_type("task.type", "a job name string", &Value::Null)),
    };
    if !is_valid_job_name(&job) {
        return Err(ClusterError::InvalidValue {
            field: "task.type".into(),
            value: format!("{job:?}"),
            reason: "a job name must be a letter followed by letters, digits or '_'".into(),
        });
    }
    let index = match task.get("index") {
        None => 0,
        Some(v) => v
            .as_u64()
            .and_then(|i| usize::try_from(i).ok())
            .ok_or_else(|| wrong_type("task.index", "a non-negative integer", v))?,
    };
    Ok(TaskId::new(job, index))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tutorial_tf_config_parses() {
        let config = TfConfig::parse(
            r#"{"cluster": {"chief": ["host1:2222"], "worker": ["host2:2222", "host3:2222"],
                "ps": ["host4:2222"], "evaluator": ["host5:2222"]},
               "task": {"type": "worker", "index": 1}, "environment": "cloud", "trial": "7"}"#,
        )
        .unwrap();
        assert_eq!(config.cluster.num_tasks("worker"), 2);
        assert_eq!(config.task, Some(TaskId::worker(1)));
        assert_eq!(config.environment.as_deref(), Some("cloud"));
        assert_eq!(config.rpc_layer, None);
    }

    #[test]
    fn blank_text_and_an_empty_object_mean_no_cluster() {
        assert_eq!(TfConfig::parse("").unwrap(), TfConfig::default());
        assert_eq!(TfConfig::parse("  \n").unwrap(), TfConfig::default());
        assert_eq!(TfConfig::parse("{}").unwrap(), TfConfig::default());
    }

    #[test]
    fn malformed_json_reports_line_and_column() {
        let err = TfConfig::parse("{\"cluster\": {\"worker\": [\"a:1\",]}}").unwrap_err();
        let ClusterError::Json { message } = &err else {
            panic!("{err:?}")
        };
        assert!(message.contains("line 1 column"), "{message}");
    }

    #[test]
    fn wrong_types_quote_the_field_and_value() {
        let cases = [
            ("[1]", "(the whole document)"),
            (r#"{"cluster": []}"#, "cluster"),
            (r#"{"cluster": {"worker": "a:1"}}"#, "cluster.worker"),
            (
                r#"{"cluster": {"worker": ["a:1", 7]}}"#,
                "cluster.worker[1]",
            ),
            (r#"{"task": "worker"}"#, "task"),
            (r#"{"task": {"index": 0}}"#, "task.type"),
            (r#"{"task": {"type": 3}}"#, "task.type"),
            (r#"{"task": {"type": "worker", "index": -1}}"#, "task.index"),
            (
                r#"{"task": {"type": "worker", "index": 1.5}}"#,
                "task.index",
            ),
            (
                r#"{"task": {"type": "worker", "index": "1"}}"#,
                "task.index",
            ),
            (r#"{"rpc_layer": 1}"#, "rpc_layer"),
            (r#"{"environment": {}}"#, "environment"),
        ];
        for (json, field) in cases {
            match TfConfig::parse(json) {
                Err(ClusterError::WrongType { field: f, .. }) => assert_eq!(f, field, "{json}"),
                other => panic!("{json}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_index_defaults_to_zero() {
        let config =
            TfConfig::parse(r#"{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}}"#)
                .unwrap();
        assert_eq!(config.task, Some(TaskId::worker(0)));
    }

    #[test]
    fn a_bad_task_type_is_refused() {
        let err = TfConfig::parse(r#"{"task": {"type": "work er"}}"#).unwrap_err();
        assert!(err.to_string().contains("task.type"), "{err}");
    }

    #[test]
    fn writing_and_reading_back_is_lossless() {
        let config = TfConfig::parse(
            r#"{"cluster": {"worker": ["[::1]:1", "b:2"]}, "task": {"type": "worker", "index": 1},
                "rpc_layer": "grpc", "environment": "cloud"}"#,
        )
        .unwrap();
        assert_eq!(TfConfig::parse(&config.to_json()).unwrap(), config);
    }
}
