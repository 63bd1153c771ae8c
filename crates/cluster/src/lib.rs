//! Who is in the cluster, and who am I? `TF_CONFIG`, SLURM, Kubernetes and explicit cluster specs for
//! synchronous data-parallel training.
//!
//! This crate reads the cluster description every TensorFlow user knows, the `TF_CONFIG`
//! environment variable, checks it with errors that name the field and value at fault, and
//! answers the questions a distributed trainer asks: which task is the chief, which tasks
//! all-reduce together, and what is my rank among them.
//!
//! ```
//! use lockstep_cluster::{ClusterResolver, TfConfigResolver};
//!
//! let json = r#"{
//!     "cluster": {"worker": ["127.0.0.1:20000", "127.0.0.1:20001", "127.0.0.1:20002"]},
//!     "task": {"type": "worker", "index": 2}
//! }"#;
//! let cluster = TfConfigResolver::from_json(json).resolve()?;
//! assert_eq!(cluster.rank(), Some(2));
//! assert_eq!(cluster.world_size(), 3);
//! assert!(!cluster.is_chief()); // worker:0 is chief when there is no chief job
//!
//! // In a real process: TfConfigResolver::from_env()?.resolve()?
//! # Ok::<(), lockstep_cluster::ClusterError>(())
//! ```
//!
//! The pieces:
//! - [`TfConfig`] — the JSON document, parsed and written back;
//! - [`ClusterSpec`] — job name → ordered `host:port` [`Address`]es, always valid;
//! - [`TaskId`] — `job:index`;
//! - [`Cluster`] — a config whose task fits, with TensorFlow's roles and ranks;
//! - [`ClusterResolver`] — where it comes from — [`TfConfigResolver`], [`SlurmResolver`]
//!   (with [`expand_hostlist`]), [`KubernetesResolver`] (indexed Jobs and JobSets),
//!   [`ExplicitResolver`], and [`AutoResolver`], which picks the first of `TF_CONFIG`, SLURM and
//!   Kubernetes whose variables are set.
//!
//! It also names the variables that carry the job's secret ([`SECRET_VARIABLE`],
//! [`SECRET_FILE_VARIABLE`]) and makes a fresh one ([`generate_secret_hex`]), so that a launcher
//! hands tasks their cluster and their secret without building the collective layer.
//!
//! Dependencies: `serde_json` parses and writes the JSON (a hand-written parser would be one more
//! thing to fuzz); `thiserror` derives the error type; `getrandom` draws a new secret from the
//! operating system's generator.

mod address;
mod auto;
mod cluster;
mod error;
mod hostlist;
mod kubernetes;
mod resolver;
mod secret;
mod slurm;
mod spec;
mod task;
mod tf_config;

pub use address::{Address, AddressError, Host};
pub use auto::{AutoResolver, ClusterSource};
pub use cluster::Cluster;
pub use error::ClusterError;
pub use hostlist::{HostlistError, MAX_HOSTS, expand_hostlist};
pub use kubernetes::KubernetesResolver;
pub use resolver::{ClusterResolver, ExplicitResolver, TfConfigResolver};
pub use secret::{SECRET_FILE_VARIABLE, SECRET_VARIABLE, generate_secret_hex, to_hex};
pub use slurm::SlurmResolver;
pub use spec::ClusterSpec;
pub use task::{CHIEF, EVALUATOR, PS, ParseTaskIdError, TaskId, WORKER};
pub use tf_config::TfConfig;
