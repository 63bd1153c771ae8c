//! Replicas on threads of one process reducing through each other's buffers: no message, no
//! channel, no copy of the data beyond the reduction itself.
//!
//! An all-reduce is one round between two barriers. At the entry barrier every rank publishes
//! its buffer; rank `r` then sums segment `r` of every buffer (in rank order, so results are
//! deterministic) and writes the result into segment `r` of every buffer while it is still in
//! cache; at the exit barrier every rank waits until no one touches its buffer any more. Other
//! collectives use the channel transport inside.
//!
//! What keeps this sound when ranks fail or are late:
//! - Only the entry barrier has a deadline. A rank that gives up there withdraws its buffer
//!   and breaks the group under the same lock that completes the barrier, so the round either
//!   completed before it gave up (and it takes part) or can never complete: every later
//!   arrival gets [`CollectiveError::Aborted`] naming the rank that gave up.
//! - The exit barrier has no deadline: a rank that passed the entry barrier only reads and
//!   writes memory before reaching it, which cannot block, so the wait is bounded. A rank
//!   therefore never returns while a peer may still write into its buffer. Even a panic
//!   between the barriers reaches the exit barrier (through a drop guard) before it unwinds
//!   further, and the round then fails on every rank.

#![allow(
    unsafe_code,
    reason = "threads read each other's buffers in place between barriers"
)]

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

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

/// Why the group no longer runs all-reduces: a rank gave up waiting, or panicked mid-round.
#[derive(Debug, Clone)]
struct Failure {
    origin: usize,
    reason: String,
}

#[derive(Debug)]
struct ArenaState {
    /// Set once, never cleared: peers of a failed round may be anywhere in the protocol.
    failure: Option<Failure>,
    /// Who has arrived at the current round's entry barrier, with what.
    slots: Vec<Option<Published>>,
    /// Entry barriers completed.
    entries: u64,
    /// The slots of the last completed entry barrier. Stays put until every rank has read it:
    /// the next entry cannot complete before every rank arrives there.
    snapshot: Vec<Published>,
    /// Ranks at the current round's exit barrier.
    finished: usize,
    /// Exit barriers completed.
    exits: u64,
    /// A rank that panicked between the barriers of the current round.
    panicked: Option<usize>,
    /// The same, for the last completed exit barrier: its ranks read it after waking.
    last_round_panicked: Option<usize>,
}

/// The meeting point of a group's threads.
#[derive(Debug)]
pub(crate) struct Arena {
    world_size: usize,
    state: Mutex<ArenaState>,
    turned: Condvar,
}

impl Arena {
    fn new(world_size: usize) -> Self {
        Self {
            world_size,
            state: Mutex::new(ArenaState {
                failure: None,
                slots: vec![None; world_size],
                entries: 0,
                snapshot: Vec::new(),
                finished: 0,
                exits: 0,
                panicked: None,
                last_round_panicked: None,
            }),
            turned: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ArenaState> {
        // No code holding the lock can panic halfway through a change of state.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Publishes `mine` and waits until every rank has published, then returns what every rank
    /// published. By the deadline, this rank withdraws and breaks the group.
    fn enter(
        &self,
        rank: usize,
        mine: Published,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Vec<Published>, CollectiveError> {
        let aborted = |failure: &Failure| CollectiveError::Aborted {
            op: Op::AllReduce,
            seq: mine.seq,
            origin: failure.origin,
            reason: failure.reason.clone(),
        };
        let mut state = self.lock();
        if let Some(failure) = &state.failure {
            return Err(aborted(failure));
        }
        state.slots[rank] = Some(mine);
        if state.slots.iter().all(Option::is_some) {
            state.snapshot = state.slots.iter_mut().filter_map(Option::take).collect();
            state.entries += 1;
            self.turned.notify_all();
            return Ok(state.snapshot.clone());
        }
        let entries = state.entries;
        loop {
            if state.entries != entries {
                return Ok(state.snapshot.clone());
            }
            if let Some(failure) = &state.failure {
                let error = aborted(failure);
                state.slots[rank] = None;
                return Err(error);
            }
            let wait = deadline.saturating_duration_since(Instant::now());
            if wait.is_zero() {
                let missing_ranks: Vec<usize> = (0..self.world_size)
                    .filter(|&r| state.slots[r].is_none())
                    .collect();
                state.slots[rank] = None;
                state.failure = Some(Failure {
                    origin: rank,
                    reason: format!(
                        "gave up all_reduce #{} after {timeout:?} waiting for rank(s) {missing_ranks:?}",
                        mine.seq
                    ),
                });
                self.turned.notify_all();
                return Err(CollectiveError::Timeout {
                    op: Op::AllReduce,
                    seq: mine.seq,
                    missing_ranks,
                    timeout,
                });
            }
            state = self
                .turned
                .wait_timeout(state, wait)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// Waits, without a deadline, until every rank has finished with every buffer of the
    /// round. Returns the rank that panicked during the round, if one did.
    fn exit(&self, panicked: bool, rank: usize) -> Option<usize> {
        let mut state = self.lock();
        if panicked {
            state.panicked.get_or_insert(rank);
            state.failure.get_or_insert_with(|| Failure {
                origin: rank,
                reason: "panicked while reducing in shared memory".into(),
            });
        }
        state.finished += 1;
        if state.finished == self.world_size {
            state.finished = 0;
            state.exits += 1;
            state.last_round_panicked = state.panicked.take();
            self.turned.notify_all();
            return state.last_round_panicked;
        }
        let exits = state.exits;
        while state.exits == exits {
            state = self
                .turned
                .wait(state)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        state.last_round_panicked
    }
}

/// Between the barriers: reaches the exit barrier when dropped, on return or on unwind, so no
/// path leaves a round while a peer may still write into this rank's buffer.
struct Round<'a> {
    arena: &'a Arena,
    rank: usize,
}

impl Round<'_> {
    /// Leaves the round normally; the error names a rank that panicked during it.
    fn finish(self, seq: u64) -> Result<(), CollectiveError> {
        let round = std::mem::ManuallyDrop::new(self);
        match round.arena.exit(false, round.rank) {
            None => Ok(()),
            Some(origin) => Err(CollectiveError::Aborted {
                op: Op::AllReduce,
                seq,
                origin,
                reason: "panicked while reducing in shared memory".into(),
            }),
        }
    }
}

impl Drop for Round<'_> {
    fn drop(&mut self) {
        self.arena.exit(std::thread::panicking(), self.rank);
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
        timeout: Duration,
    ) -> Result<(), CollectiveError> {
        let (rank, n) = (self.channels.rank(), self.channels.world_size());
        let mine = Published {
            address: data.as_mut_ptr() as usize,
            len: data.len(),
            dtype: E::DTYPE,
            reduce: op.code(),
            seq,
        };
        let published = self.arena.enter(rank, mine, deadline, timeout)?;
        let round = Round {
            arena: &self.arena,
            rank,
        };
        // Every rank checks the same snapshot, so either every rank finds a mismatch (each
        // naming a peer whose values differ from its own) or none does and all reduce.
        if let Err(mismatch) = agree(&published, &mine) {
            drop(round);
            return Err(mismatch);
        }
        let buffers: Vec<*mut E> = published.iter().map(|p| p.address as *mut E).collect();
        let own = segment(mine.len, n, rank);
        // SAFETY: every pointer in `buffers` comes from a live `&mut [E]` of `mine.len`
        // elements (`agree` checked every length and element type), held by a thread that
        // stays inside this call until it passes the exit barrier in `round.finish` (or the
        // guard's drop on unwind). This thread passes that barrier only after this block, and
        // no rank can pass it before every rank reaches it, so every buffer outlives every
        // access below. Between the barriers segment `rank` of every buffer is touched by this
        // rank alone (`segment` splits `0..len` into disjoint ranges, one per rank): it reads
        // that range of every buffer and writes it back, so no two threads touch the same
        // element and no reference to a whole buffer is formed. `own` lies inside `0..len`,
        // so `at + len` never passes the end of a buffer.
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
        round.finish(seq)
    }
}

/// Checks that every rank published the same collective as `mine`.
fn agree(published: &[Published], mine: &Published) -> Result<(), CollectiveError> {
    for (peer, theirs) in published.iter().enumerate() {
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
            return Err(CollectiveError::Mismatch {
                what,
                expected,
                got,
                peer,
            });
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LONG: Duration = Duration::from_mins(1);

    fn call(
        transport: &SharedMemoryTransport,
        data: &mut [f32],
        timeout: Duration,
    ) -> Result<(), CollectiveError> {
        transport.all_reduce(data, ReduceOp::Sum, 1, Instant::now() + timeout, timeout)
    }

    #[test]
    fn a_late_arrival_after_a_timeout_gets_an_error_naming_the_rank_that_gave_up() {
        let group = SharedMemoryTransport::group(2);
        // Stands in for the buffer of a rank that has returned: kept alive, so a write into it
        // after its rank gave up would show.
        let mut canary = vec![7.0_f32; 10_000];
        let short = Duration::from_millis(20);
        let err = call(&group[0], &mut canary, short).unwrap_err();
        assert!(
            matches!(&err, CollectiveError::Timeout { missing_ranks, .. } if missing_ranks == &[1]),
            "{err}"
        );
        let mut late = vec![1.0_f32; 10_000];
        let err = call(&group[1], &mut late, LONG).unwrap_err();
        assert!(
            matches!(
                &err,
                CollectiveError::Aborted {
                    origin: 0,
                    op: Op::AllReduce,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("gave up"), "{err}");
        assert!(
            canary.iter().all(|&v| v == 7.0),
            "the departed rank's buffer was written"
        );
        assert!(late.iter().all(|&v| v == 1.0));
        // The group stays broken.
        let err = call(&group[0], &mut canary, LONG).unwrap_err();
        assert!(
            matches!(err, CollectiveError::Aborted { origin: 0, .. }),
            "{err}"
        );
    }

    #[test]
    fn ranks_already_waiting_fail_as_soon_as_one_gives_up() {
        let mut group = SharedMemoryTransport::group(3);
        let rank_1 = group.remove(1);
        let waiting = std::thread::spawn(move || call(&rank_1, &mut [1.0; 64], LONG));
        let err = call(&group[0], &mut [1.0; 64], Duration::from_millis(50)).unwrap_err();
        assert!(
            matches!(&err, CollectiveError::Timeout { missing_ranks, .. } if !missing_ranks.contains(&0)),
            "{err}"
        );
        // Rank 1's own deadline is a minute away: its error comes from rank 0 giving up.
        let err = waiting.join().unwrap().unwrap_err();
        assert!(
            matches!(err, CollectiveError::Aborted { origin: 0, .. }),
            "{err}"
        );
    }

    #[test]
    fn mismatched_sizes_fail_every_rank_and_write_nothing() {
        let mut group = SharedMemoryTransport::group(2);
        let rank_1 = group.remove(1);
        let other = std::thread::spawn(move || {
            let mut data = vec![2.0_f32; 100];
            (call(&rank_1, &mut data, LONG), data)
        });
        let mut data = vec![1.0_f32; 200];
        let err = call(&group[0], &mut data, LONG).unwrap_err();
        let (other_result, other_data) = other.join().unwrap();
        for err in [err, other_result.unwrap_err()] {
            assert!(
                matches!(
                    err,
                    CollectiveError::Mismatch {
                        what: "element count",
                        ..
                    }
                ),
                "{err}"
            );
        }
        assert!(data.iter().all(|&v| v == 1.0));
        assert!(other_data.iter().all(|&v| v == 2.0));
    }

    /// One rank's part in an interleaving: when it arrives, how long it waits, what it held
    /// right after returning and what its buffer holds once every rank is done.
    struct Outcome {
        result: Result<(), CollectiveError>,
        on_return: Vec<f32>,
        at_end: Vec<f32>,
    }

    fn interleave(len: usize, ranks: &[(u64, u64)]) -> Vec<Outcome> {
        let group = SharedMemoryTransport::group(ranks.len());
        let handles: Vec<_> = group
            .into_iter()
            .zip(ranks)
            .enumerate()
            .map(|(rank, (transport, &(delay_us, timeout_us)))| {
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_micros(delay_us));
                    let mut data = vec![rank as f32 + 1.0; len];
                    let result = call(&transport, &mut data, Duration::from_micros(timeout_us));
                    let on_return = data.clone();
                    // Keep the buffer (and the transport) alive until every rank is done:
                    // a peer writing into it after this rank returned would show at the end.
                    (result, on_return, data, transport)
                })
            })
            .collect();
        let joined: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        joined
            .into_iter()
            .map(|(result, on_return, at_end, _transport)| Outcome {
                result,
                on_return,
                at_end,
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// Arrivals and deadlines at random, some deadlines shorter than the others' delays:
        /// the round succeeds everywhere or fails everywhere, a failed round writes nothing,
        /// and no buffer changes after its rank has returned.
        #[test]
        fn no_rank_touches_a_buffer_after_its_rank_returned(
            len in prop_oneof![Just(0_usize), 1_usize..64, 100_000_usize..400_000],
            ranks in proptest::collection::vec((0_u64..3_000, 100_u64..20_000), 2..=4),
        ) {
            let outcomes = interleave(len, &ranks);
            let n = ranks.len() as f32;
            let all_ok = outcomes.iter().all(|o| o.result.is_ok());
            let all_err = outcomes.iter().all(|o| o.result.is_err());
            prop_assert!(all_ok || all_err, "{:?}", outcomes.iter().map(|o| &o.result).collect::<Vec<_>>());
            for (rank, outcome) in outcomes.iter().enumerate() {
                prop_assert!(outcome.on_return == outcome.at_end, "rank {rank}'s buffer changed after it returned");
                let expected = if all_ok { n * (n + 1.0) / 2.0 } else { rank as f32 + 1.0 };
                prop_assert!(outcome.on_return.iter().all(|&v| v == expected), "rank {rank}");
                if let Err(e) = &outcome.result {
                    prop_assert!(
                        matches!(e, CollectiveError::Timeout { .. } | CollectiveError::Aborted { .. }),
                        "{e}"
                    );
                }
            }
        }
    }
}
