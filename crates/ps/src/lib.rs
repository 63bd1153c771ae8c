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
//! Dependencies: `thiserror` for the errors.

mod error;
mod partitioner;
mod placement;

pub use error::PsError;
pub use partitioner::{
    FixedShardsPartitioner, MaxSizePartitioner, MinSizePartitioner, Partitioner, shard_rows,
};
pub use placement::RoundRobin;
