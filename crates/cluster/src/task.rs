//! Task identity: which job a process belongs to and its index in that job.

use std::fmt;
use std::str::FromStr;

/// The job of the coordinating worker, which saves checkpoints and summaries.
pub const CHIEF: &str = "chief";
/// The job of ordinary training workers.
pub const WORKER: &str = "worker";
/// The job of parameter servers, outside the collective group.
pub const PS: &str = "ps";
/// The job of the side-car evaluator, outside the collective group.
pub const EVALUATOR: &str = "evaluator";

/// One task of a cluster: a job name and an index into that job's address list.
///
/// Job names follow TensorFlow's device-name rule: a letter, then letters, digits or `_`.
/// The four jobs TensorFlow gives meaning to have constants ([`CHIEF`], [`WORKER`], [`PS`],
/// [`EVALUATOR`]); any other valid name is carried along.
///
/// ```
/// use lockstep_cluster::TaskId;
///
/// let task: TaskId = "worker:1".parse().unwrap();
/// assert_eq!(task, TaskId::worker(1));
/// assert_eq!(task.to_string(), "worker:1");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId {
    /// The job name, such as `worker`.
    pub job: String,
    /// The index within the job, from 0.
    pub index: usize,
}

impl TaskId {
    /// A task of any job.
    pub fn new(job: impl Into<String>, index: usize) -> Self {
        Self {
            job: job.into(),
            index,
        }
    }

    /// `chief:0`, the only chief there can be.
    pub fn chief() -> Self {
        Self::new(CHIEF, 0)
    }

    /// `worker:index`.
    pub fn worker(index: usize) -> Self {
        Self::new(WORKER, index)
    }

    /// `evaluator:0`, the only evaluator there can be.
    pub fn evaluator() -> Self {
        Self::new(EVALUATOR, 0)
    }

    /// `ps:index`.
    pub fn ps(index: usize) -> Self {
        Self::new(PS, index)
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.job, self.index)
    }
}

/// Why a string is not a `job:index` task id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not a task id like worker:1: {reason}")]
pub struct ParseTaskIdError {
    input: String,
    reason: &'static str,
}

impl FromStr for TaskId {
    type Err = ParseTaskIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let fail = |reason| ParseTaskIdError {
            input: s.to_owned(),
            reason,
        };
        let (job, index) = s.rsplit_once(':').ok_or_else(|| fail("no `:index`"))?;
        if !is_valid_job_name(job) {
            return Err(fail(
                "the job name must be a letter followed by letters, digits or '_'",
            ));
        }
        let index = index
            .parse()
            .map_err(|_| fail("the index must be a non-negative integer"))?;
        Ok(Self::new(job, index))
    }
}

/// TensorFlow's rule for job names in device strings: `[a-zA-Z][_a-zA-Z0-9]*`.
pub(crate) fn is_valid_job_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic())
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_print_and_parse_as_job_colon_index() {
        for task in [
            TaskId::chief(),
            TaskId::worker(7),
            TaskId::new("my_job2", 3),
        ] {
            assert_eq!(task.to_string().parse::<TaskId>().unwrap(), task);
        }
    }

    #[test]
    fn bad_task_ids_are_refused_with_the_reason() {
        for bad in [
            "worker",
            "worker:-1",
            "worker:x",
            ":1",
            "1job:0",
            "wor ker:0",
            "",
        ] {
            let err = bad.parse::<TaskId>().unwrap_err();
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn job_names_follow_tensorflow_device_rules() {
        assert!(is_valid_job_name("worker"));
        assert!(is_valid_job_name("Job_2"));
        assert!(!is_valid_job_name(""));
        assert!(!is_valid_job_name("_job"));
        assert!(!is_valid_job_name("job-2"));
    }
}
