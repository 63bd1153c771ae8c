//! Replicas on threads of several processes: reduce among a process's replicas in shared
//! memory, all-reduce across processes from one replica each, broadcast back locally — the
//! shape of `MultiWorkerMirroredStrategy` with several devices per worker.

use crate::communicator::{CommunicationOptions, Communicator};
use crate::element::{Element, ReduceOp};
use crate::error::CollectiveError;
use crate::header::Op;
use crate::transport::{SharedMemoryTransport, Transport};

/// One replica's handle on a two-level group: `local_replicas` threads in each of
/// `cross.world_size()` processes.
///
/// ```
/// use lockstep_collective::{CommunicationOptions, HierarchicalCommunicator, LocalTransport, ReduceOp};
///
/// // Two "processes" (here: a channel group standing in for the network), two replicas each.
/// let mut handles = Vec::new();
/// for cross in LocalTransport::group(2) {
///     for mut replica in HierarchicalCommunicator::group(2, cross, CommunicationOptions::default()) {
///         handles.push(std::thread::spawn(move || {
///             let mut grads = vec![replica.rank() as f32; 8];
///             replica.all_reduce(&mut grads, ReduceOp::Mean).map(|()| grads[0])
///         }));
///     }
/// }
/// for h in handles {
///     assert_eq!(h.join().unwrap()?, 1.5); // mean of ranks 0, 1, 2, 3
/// }
/// # Ok::<(), lockstep_collective::CollectiveError>(())
/// ```
pub struct HierarchicalCommunicator<X: Transport> {
    local: Communicator<SharedMemoryTransport>,
    /// Present on the process's first replica only.
    cross: Option<Communicator<X>>,
    process: usize,
    processes: usize,
}

impl<X: Transport> HierarchicalCommunicator<X> {
    /// The replicas of this process: `local_replicas` handles, the first of which carries the
    /// cross-process transport. Hand one to each replica thread.
    pub fn group(local_replicas: usize, cross: X, options: CommunicationOptions) -> Vec<Self> {
        let (process, processes) = (cross.rank(), cross.world_size());
        let mut cross = Some(Communicator::new(cross, options));
        SharedMemoryTransport::group(local_replicas.max(1))
            .into_iter()
            .map(|local| Self {
                local: Communicator::new(local, options),
                cross: cross.take(),
                process,
                processes,
            })
            .collect()
    }

    /// This replica's rank among all replicas of all processes (process-major).
    pub fn rank(&self) -> usize {
        self.process * self.local.world_size() + self.local.rank()
    }

    /// All replicas of all processes.
    pub fn world_size(&self) -> usize {
        self.processes * self.local.world_size()
    }

    /// Whether this replica's waits, within the process and across processes, may spin
    /// ([`Transport::set_spinning`]).
    pub fn set_spinning(&mut self, spinning: bool) {
        self.local.set_spinning(spinning);
        if let Some(cross) = &mut self.cross {
            cross.set_spinning(spinning);
        }
    }

    /// The options every collective of this replica runs with.
    pub fn options(&self) -> &CommunicationOptions {
        self.local.options()
    }

    /// Whether this replica is its process's first, the one that talks to other processes
    /// ([`HierarchicalCommunicator::all_reduce_processes`]).
    pub fn talks_to_processes(&self) -> bool {
        self.cross.is_some()
    }

    /// This process's index among the processes.
    pub fn process(&self) -> usize {
        self.process
    }

    /// The number of processes.
    pub fn processes(&self) -> usize {
        self.processes
    }

    /// Looks, without waiting, for another process whose connection has ended
    /// ([`Communicator::check_peers`]); only a process's first replica talks to other
    /// processes, so the others have nothing to look at and find nothing.
    ///
    /// # Errors
    ///
    /// [`CollectiveError::PeerLost`] naming the process found gone (its rank among processes).
    pub fn check_peers(&mut self) -> Result<(), CollectiveError> {
        self.cross
            .as_mut()
            .map_or(Ok(()), Communicator::check_peers)
    }

    /// Gives every replica of every process replica 0's `data` (process 0's first replica):
    /// the initial variables of a model built on every worker.
    ///
    /// # Errors
    ///
    /// As [`Communicator::broadcast`] at either level; a cross-process failure reaches the
    /// other local replicas as [`CollectiveError::Aborted`].
    pub fn broadcast<E: Element>(&mut self, data: &mut [E]) -> Result<(), CollectiveError> {
        if let Some(cross) = &mut self.cross
            && let Err(e) = cross.broadcast(data, 0)
        {
            return Err(self.local.abandon_next(Op::Broadcast, e));
        }
        self.local.broadcast(data, 0)
    }

    /// An all-reduce among the processes alone, from the first replica of each (the others
    /// take no part): agreements that concern processes, not replicas, such as whether the
    /// chief's checkpoint was written.
    ///
    /// # Errors
    ///
    /// [`CollectiveError::InvalidArgument`] on a replica other than its process's first; else
    /// as [`Communicator::all_reduce`].
    pub fn all_reduce_processes<E: Element>(
        &mut self,
        data: &mut [E],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        match &mut self.cross {
            Some(cross) => cross.all_reduce(data, op),
            None => Err(CollectiveError::InvalidArgument {
                op: "all_reduce_processes",
                why: format!(
                    "replica {} is not its process's first; only that one talks to other processes",
                    self.local.rank()
                ),
            }),
        }
    }

    /// Replaces `data` with the reduction over every replica of every process.
    ///
    /// # Errors
    ///
    /// As [`Communicator::all_reduce`] at either level. A cross-process failure reaches the
    /// other local replicas as [`CollectiveError::Aborted`] of the local broadcast, carrying
    /// the cross-process error.
    pub fn all_reduce<E: Element>(
        &mut self,
        data: &mut [E],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        // Sums at both levels; the mean divides once, by the total number of replicas.
        let level_op = if op == ReduceOp::Mean {
            ReduceOp::Sum
        } else {
            op
        };
        self.local.all_reduce(data, level_op)?;
        if let Some(cross) = &mut self.cross
            && let Err(e) = cross.all_reduce(data, level_op)
        {
            // The other replicas are already waiting for the local broadcast: they learn why
            // it will not come, rather than time out.
            return Err(self.local.abandon_next(Op::Broadcast, e));
        }
        self.local.broadcast(data, 0)?;
        if op == ReduceOp::Mean {
            E::div_count_into(data, self.world_size());
        }
        Ok(())
    }
}
