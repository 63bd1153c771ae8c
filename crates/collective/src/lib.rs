//! Collectives for synchronous data-parallel training — the heart of
//! `MultiWorkerMirroredStrategy`: all-reduce (ring, tree, or AUTO), reduce-scatter,
//! all-gather, broadcast and barrier on flat buffers of `f32`, `f64` or bf16, between threads
//! of one process or processes on many hosts.
//!
//! ```
//! use lockstep_collective::{CommunicationOptions, Communicator, LocalTransport, ReduceOp};
//!
//! // Four replicas on threads; each averages its gradients with the others.
//! let replicas: Vec<_> = LocalTransport::group(4)
//!     .into_iter()
//!     .map(|transport| std::thread::spawn(move || {
//!         let mut comm = Communicator::new(transport, CommunicationOptions::default());
//!         let mut grads = vec![comm.rank() as f32; 1000];
//!         comm.all_reduce(&mut grads, ReduceOp::Mean).map(|()| grads)
//!     }))
//!     .collect();
//! for replica in replicas {
//!     assert!(replica.join().unwrap()?.iter().all(|&g| g == 1.5)); // mean of 0, 1, 2, 3
//! }
//! # Ok::<(), lockstep_collective::CollectiveError>(())
//! ```
//!
//! Between processes, [`Communicator::from_cluster`] joins the group a `TF_CONFIG` describes
//! (ranks as `lockstep-cluster` numbers them) over [`TcpTransport`].
//!
//! Failures are typed and never hang: every wait has a deadline
//! ([`CollectiveError::Timeout`] names the missing ranks), a dead peer is
//! [`CollectiveError::PeerLost`], ranks that disagree get [`CollectiveError::Mismatch`], and a
//! rank that fails tells the others ([`CollectiveError::Aborted`]). A flight recorder keeps
//! the last collectives and logs them on any failure.
//!
//! Dependencies: `bytes` for payloads that move without copies between threads; `bytemuck` to
//! view element slices as bytes without `unsafe`; `half` for bf16; `lockstep-cluster` for
//! ranks and addresses; `thiserror` and `tracing`.

mod algorithm;
mod communicator;
mod element;
mod error;
mod flight;
mod header;
mod session;
mod transport;

pub use algorithm::Algorithm;
pub use communicator::{AUTO_TREE_MAX_BYTES, CommunicationOptions, Communicator, Implementation};
pub use element::{Element, ReduceOp};
pub use error::CollectiveError;
pub use flight::{FLIGHT_RECORDS, FlightRecord};
pub use half::bf16;
pub use header::{DType, HEADER_LEN, Header, HeaderError, Kind, Message, Op};
pub use transport::{LocalTransport, SharedMemoryTransport, TcpOptions, TcpTransport, Transport};
