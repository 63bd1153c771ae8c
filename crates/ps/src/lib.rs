//! Parameter-server training: the parts of TensorFlow's `ParameterServerStrategy` that decide
//! where a model's variables live. A variable's first axis is split into shards by a
//! [`Partitioner`] with TensorFlow's semantics ([`FixedShardsPartitioner`],
//! [`MinSizePartitioner`], [`MaxSizePartitioner`]); [`shard_rows`] says which rows each shard
//! holds (the first shards one row longer where the rows do not divide); [`RoundRobin`] puts
//! the shards of every variable, in the order they are created, on the `ps` tasks in turn.
//!
//! ```
//! use lockstep_ps::{MaxSizePartitioner, Partitioner, RoundRobin, shard_rows};
//!
//! // An embedding table of 1,000,000 rows of 64 f32: 256 MB, in shards of at most 64 MiB.
//! let partitioner = MaxSizePartitioner::new(64 << 20, None)?;
//! let shards = partitioner.num_shards(&[1_000_000, 64], 4)?;
//! assert_eq!(shards, 4);
//! assert_eq!(shard_rows(1_000_000, shards)[0], 0..250_000);
//! // Two parameter servers: shards 0 and 2 on ps 0, 1 and 3 on ps 1.
//! let mut placement = RoundRobin::new(2)?;
//! assert_eq!(placement.place(shards), [0, 1, 0, 1]);
//! # Ok::<(), lockstep_ps::PsError>(())
//! ```
//!
//! A `ps` task serves its shards with [`PsServer`]: a worker or the chief connects with
//! [`PsClient`], proves the cluster secret, creates shards with their optimizer, pulls values
//! (whole, or the rows an embedding lookup needs) and pushes gradients (whole, or of some
//! rows), which the server applies with the shard's optimizer, whose state lives there too
//! (a push marked with a step's [`StepId`] is applied once, however often the step ran);
//! the chief exports every shard for a checkpoint and imports them on a restore.
//!
//! The chief schedules steps with [`ClusterCoordinator`] (TensorFlow's): each worker serves
//! them with a [`StepServer`] from its [`StepRegistry`], the program's named step functions
//! (every task runs the same program, so a step travels as its name and its arguments'
//! bytes); a step held by a worker that is lost runs again on another, and a restarted worker
//! rejoins. [`protocol`] is the wire format of both services.
//!
//! ```
//! use std::net::TcpListener;
//! use std::time::Duration;
//! use lockstep_nn::{Optimizer, Sgd};
//! use lockstep_ps::{PsClient, PsServer, ShardKey, ShardState};
//!
//! let server = PsServer::new(None).spawn(TcpListener::bind("127.0.0.1:0")?)?;
//! let mut ps = PsClient::connect(server.address(), None, Duration::from_secs(5))?;
//! let key = ShardKey::new("embedding/embeddings", 0);
//! let sgd = Sgd::new(0.5);
//! ps.create(ShardState {
//!     key: Some(key.clone()),
//!     rows: 3,
//!     cols: 2,
//!     values: vec![1.0; 6],
//!     optimizer: serde_json::to_string(&sgd.config())?,
//!     ..ShardState::default()
//! })?;
//! // An embedding lookup of row 2, and its gradient back: only row 2 moves.
//! assert_eq!(ps.pull_rows(&key, &[2])?, [1.0, 1.0]);
//! ps.push_rows(&key, &[2], &[1.0, -1.0])?;
//! assert_eq!(ps.pull(&key)?, [1.0, 1.0, 1.0, 1.0, 0.5, 1.5]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Dependencies: `lockstep-collective` for the cluster secret's handshake (one proof for every
//! service of a cluster); `lockstep-nn` for the optimizers a server applies (the update rules
//! of synchronous training, unchanged); `prost` for the messages (Protocol Buffers, as the
//! rest of Lockstep's wire formats); `bytes` for the messages' `f32`s, which share the buffer
//! a frame was read into rather than being copied out of it; `bytemuck` to copy those `f32`s
//! to and from their little-endian bytes as one block (one element at a time, an unoptimised
//! build of a dependent crate spends a third of a parameter-server step there); `serde_json` for an optimizer's
//! settings in Keras' form; `nix` for TCP keepalive (std has no setter); `thiserror` for the
//! errors; `tracing` for the connections a server refuses or closes and the workers a
//! coordinator loses.

mod client;
mod connection;
pub mod coordinator;
mod error;
pub mod keepalive;
mod partitioner;
mod placement;
pub mod protocol;
mod server;
mod steps;
mod store;
mod worker;

pub use client::PsClient;
pub use connection::HANDSHAKE_TIMEOUT;
pub use coordinator::{ClusterCoordinator, CoordinatorOptions, RemoteValue};
pub use error::PsError;
pub use lockstep_collective::MAX_HANDSHAKES;
pub use partitioner::{
    FixedShardsPartitioner, MaxSizePartitioner, MinSizePartitioner, Partitioner, shard_rows,
};
pub use placement::RoundRobin;
pub use protocol::{Rows, ShardKey, ShardState, StepId};
pub use server::{PsServer, RunningServer};
pub use steps::{StepFn, StepRegistry};
pub use store::ShardStore;
pub use worker::{RunningWorker, StepServer};
