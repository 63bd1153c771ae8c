//! Replicas on threads of one process reducing through each other's buffers: no message, no
//! channel, no copy of the data beyond the reduction itself.
//!
//! An all-reduce is one phase between two barriers. Every rank publishes its buffer; rank `r`
//! then sums segment `r` of every buffer (in rank order, so results are deterministic) and
//! writes the result into segment `r` of every buffer while it is still in cache; the second
//! barrier keeps every buffer alive until no one touches it. Other collectives use the channel
//! transport inside.

#![allow(
    unsafe_code,
    reason = "threads read each other's buffers in place between barriers"
)]

use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use super::{LocalTransport, Transport};
use crate::algorithm::segment;
use crate::element::{Element, ReduceOp};
use crate::error::CollectiveError;
use crate::header::{DType, Message, Op};

/// Elements reduced at a time: 16 KiB of f32, well inside the L1 cache.
const REDUCE_CHUNK: usize = 4096;

/// What a rank publishes for one all-reduce: where its buffer is and what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Published {
    address: usize,
    len: usize,
    dtype: DType,
    reduce: u8,
    seq: u64,
}

#[derive(Debug, Default)]
struct BarrierState {
    generation: u64,
    arrived: Vec<bool>,
    slots: Vec<Option<Published>>,
}

/// The meeting point of a group's threads.
#[derive(Debug)]
pub(crate) struct Arena {
    state: Mutex<BarrierState>,
    turned: Condvar,
}

impl Arena {
    fn new(world_size: usize) -> Self {
        Self {
            state: Mutex::new(BarrierState {
                generation: 0,
                arrived: vec![false; world_size],
                slots: vec![None; world_size],
            }),
            turned: Condvar::new(),
        }
    }

    /// Waits until every rank has arrived, or the deadline passes (naming the missing ranks).
    fn barrier(&self, rank: usize, deadline: Instant) -> Result<(), Vec<usize>> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let generation = state.generation;
        state.arrived[rank] = true;
        if state.arrived.iter().all(|&a| a) {
            state.arrived.iter_mut().for_each(|a| *a = false);
            state.generation += 1;
            self.turned.notify_all();
            return Ok(());
        }
        while state.generation == generation {
            let wait = deadline.saturating_duration_since(Instant::now());
            if wait.is_zero() {
                return Err(state
                    .arrived
                    .iter()
                    .enumerate()
                    .filter(|&(_, &a)| !a)
                    .map(|(r, _)| r)
                    .collect());
            }
            state = self
                .turned
                .wait_timeout(state, wait)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        Ok(())
    }

    fn publish(&self, rank: usize, published: Option<Published>) {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .slots[rank] = published;
    }

    fn slots(&self) -> Vec<Option<Published>> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .slots
            .clone()
    }
}

/// One rank of an in-process group whose all-reduce works on the replicas' buffers in place.
///
/// ```
/// use lockstep_collective::{CommunicationOptions, Communicator, ReduceOp, SharedMemoryTransport};
///
/// let replicas: Vec<_> = SharedMemoryTransport::group(2)
///     .into_iter()
///     .map(|t| std::thread::spawn(move || {
///         let mut comm = Communicator::new(t, CommunicationOptions::default());
///         let mut grads = vec![comm.rank() as f32 + 1.0; 1 << 16];
///         comm.all_reduce(&mut grads, ReduceOp::Sum).map(|()| grads[0])
///     }))
///     .collect();
/// for r in replicas {
///     assert_eq!(r.join().unwrap()?, 3.0);
/// }
/// # Ok::<(), lockstep_collective::CollectiveError>(())
/// ```
pub struct SharedMemoryTransport {
    channels: LocalTransport,
    arena: Arc<Arena>,
}

impl SharedMemoryTransport {
    /// A group of `world_size` ranks, in rank order.
    pub fn group(world_size: usize) -> Vec<Self> {
        let arena = Arc::new(Arena::new(world_size));
        LocalTransport::group(world_size)
            .into_iter()
            .map(|channels| Self {
                channels,
                arena: Arc::clone(&arena),
            })
            .collect()
    }

    /// All-reduce in place through the other ranks' buffers.
    pub(crate) fn all_reduce<E: Element>(
        &self,
        data: &mut [E],
        op: ReduceOp,
        seq: u64,
        deadline: Instant,
        timeout: std::time::Duration,
    ) -> Result<(), CollectiveError> {
        let (rank, n) = (self.channels.rank(), self.channels.world_size());
        let timeout_error = |missing_ranks| CollectiveError::Timeout {
            op: Op::AllReduce,
            seq,
            missing_ranks,
            timeout,
        };
        let mine = Published {
            address: data.as_mut_ptr() as usize,
            len: data.len(),
            dtype: E::DTYPE,
            reduce: op.code(),
            seq,
        };
        self.arena.publish(rank, Some(mine));
        self.arena.barrier(rank, deadline).map_err(timeout_error)?;
        let slots = self.arena.slots();
        let mut buffers = Vec::with_capacity(n);
        for (peer, slot) in slots.iter().enumerate() {
            let Some(theirs) = *slot else {
                return Err(CollectiveError::Mismatch {
                    what: "operation",
                    expected: "all_reduce".into(),
                    got: "nothing published".into(),
                    peer,
                });
            };
            let checks = [
                (
                    "sequence number",
                    theirs.seq.to_string(),
                    mine.seq.to_string(),
                ),
                (
                    "element type",
                    format!("{:?}", theirs.dtype),
                    format!("{:?}", mine.dtype),
                ),
                (
                    "element count",
                    theirs.len.to_string(),
                    mine.len.to_string(),
                ),
                (
                    "reduction",
                    theirs.reduce.to_string(),
                    mine.reduce.to_string(),
                ),
            ];
            if let Some((what, got, expected)) = checks
                .into_iter()
                .find(|(_, got, expected)| got != expected)
            {
                // Every rank sees the same slots, so every rank reports the same mismatch.
                return Err(CollectiveError::Mismatch {
                    what,
                    expected,
                    got,
                    peer,
                });
            }
            buffers.push(theirs.address as *mut E);
        }
        let own = segment(data.len(), n, rank);
        // SAFETY: between the two barriers, segment `rank` of every buffer is touched by this
        // rank alone: it reads that range of every buffer and, once a chunk is reduced, writes
        // it back to every buffer. Other ranks touch only their own segments. Every buffer is
        // a live `&mut [E]` of the checked length, held by a thread blocked in this collective
        // until the second barrier.
        unsafe {
            // Chunk by chunk through a buffer that stays in cache: each value is read once and
            // written once, and the sum runs buffer 0 + buffer 1 + … in rank order.
            let mut acc: Vec<E> = Vec::with_capacity(REDUCE_CHUNK);
            for start in (0..own.len()).step_by(REDUCE_CHUNK) {
                let len = REDUCE_CHUNK.min(own.len() - start);
                let at = own.start + start;
                acc.clear();
                acc.extend_from_slice(std::slice::from_raw_parts(buffers[0].add(at), len));
                for &peer_buffer in &buffers[1..] {
                    op.combine(
                        &mut acc,
                        std::slice::from_raw_parts(peer_buffer.add(at), len),
                    );
                }
                op.finish(&mut acc, n);
                for &buffer in &buffers {
                    std::slice::from_raw_parts_mut(buffer.add(at), len).copy_from_slice(&acc);
                }
            }
        }
        self.arena.barrier(rank, deadline).map_err(timeout_error)?;
        self.arena.publish(rank, None);
        Ok(())
    }
}

impl Transport for SharedMemoryTransport {
    fn rank(&self) -> usize {
        self.channels.rank()
    }

    fn world_size(&self) -> usize {
        self.channels.world_size()
    }

    fn address(&self, peer: usize) -> String {
        self.channels.address(peer)
    }

    fn cluster(&self) -> u64 {
        0
    }

    fn send(
        &mut self,
        peer: usize,
        message: Message,
        deadline: Instant,
    ) -> Result<bool, CollectiveError> {
        self.channels.send(peer, message, deadline)
    }

    fn recv(&mut self, peer: usize, deadline: Instant) -> Result<Option<Message>, CollectiveError> {
        self.channels.recv(peer, deadline)
    }

    fn shared_memory(&self) -> Option<&SharedMemoryTransport> {
        Some(self)
    }
}
