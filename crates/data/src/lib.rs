//! Input pipelines for synchronous data-parallel training, composed like `tf.data`, and the
//! MNIST data the project trains on.
//!
//! A [`Dataset`] is a recipe; each pass over it (an epoch) is a fresh, deterministic stream of
//! elements. Stages compose as in TensorFlow's tutorials:
//!
//! ```
//! use lockstep_data::mnist::{Mnist, scale};
//! use lockstep_data::{AutoShardPolicy, Dataset, InputContext, distribute};
//!
//! let mnist = Mnist::embedded()?;
//! let ds = mnist.train.dataset()?
//!     // Shared arrays make every cache replay a pointer copy (4.5× faster; docs/PERFORMANCE.md).
//!     .map(|(image, label)| (scale(&image).into_shared(), label))
//!     .cache()
//!     .shuffle(10_000, 42, true);
//! // Worker 0 of 2, one replica each, global batch 64.
//! let ctx = InputContext::new(2, 0, 2)?;
//! let steps = distribute(ds, 64, &ctx, AutoShardPolicy::Auto)?.prefetch(2);
//! let mut iter = steps.iter()?;
//! let replica_batches = iter.next().unwrap()?;
//! assert_eq!(replica_batches[0].0.shape(), [32, 28, 28, 1]);
//!
//! // A checkpoint stores where the iterator is; a restarted worker resumes there exactly.
//! let state = iter.state();
//! let resumed = steps.iter_from(&state)?.next().unwrap()?;
//! assert_eq!(resumed[0].1, iter.next().unwrap()?[0].1);
//! # Ok::<(), lockstep_data::DataError>(())
//! ```
//!
//! Every element may be an error ([`DataError`]): a malformed file, batching arrays of
//! different shapes, a closure that panicked on the prefetch thread. Nothing is silently
//! dropped.
//!
//! Dependencies: `ndarray` holds images and batches; `rayon` runs `map` in parallel; `flate2`
//! reads gzip IDX files; `crc32c` checksums cache files (hardware-accelerated); `xxhash-rust`
//! fingerprints pipelines; `rand_pcg` is a small, value-stable generator for shuffles;
//! `serde` makes iterator states and contexts storable in checkpoints; `thiserror` and
//! `tracing` for errors and warnings.

mod batch;
mod dataset;
mod distribute;
mod element;
mod error;
mod fingerprint;
pub mod mnist;
pub mod ops;
mod source;

pub use batch::{Batch, BatchStream, Batchable};
pub use dataset::{Cardinality, Dataset, ElementStream, Iter, IterState, advance_by_reading};
pub use distribute::{AutoShardPolicy, Distributed, DistributedStream, InputContext, distribute};
pub use element::{Element, Scalar};
pub use error::DataError;
pub use fingerprint::Fingerprint;
pub use ops::DatasetOptions;
pub use source::{
    FileStream, FromFiles, FromSlices, SliceStream, Slices, from_files, from_slices, from_vec,
};
