//! Ranks on threads of one process, connected by channels.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::Instant;

use super::Transport;
use crate::error::CollectiveError;
use crate::header::Message;

/// One rank of an in-process group: messages travel through channels.
///
/// ```
/// use lockstep_collective::{Communicator, CommunicationOptions, LocalTransport, ReduceOp};
///
/// let handles: Vec<_> = LocalTransport::group(3)
///     .into_iter()
///     .map(|transport| std::thread::spawn(move || {
///         let mut comm = Communicator::new(transport, CommunicationOptions::default());
///         let mut values = vec![comm.rank() as f32; 4];
///         comm.all_reduce(&mut values, ReduceOp::Sum).map(|()| values)
///     }))
///     .collect();
/// for handle in handles {
///     assert_eq!(handle.join().unwrap()?, [3.0; 4]); // 0 + 1 + 2
/// }
/// # Ok::<(), lockstep_collective::CollectiveError>(())
/// ```
pub struct LocalTransport {
    rank: usize,
    to: Vec<Sender<Message>>,
    from: Vec<Receiver<Message>>,
}

impl LocalTransport {
    /// A connected group of `world_size` ranks, in rank order.
    pub fn group(world_size: usize) -> Vec<Self> {
        // channels[src][dst]
        let mut senders: Vec<Vec<Sender<Message>>> = (0..world_size)
            .map(|_| Vec::with_capacity(world_size))
            .collect();
        let mut receivers: Vec<Vec<Option<Receiver<Message>>>> = (0..world_size)
            .map(|_| (0..world_size).map(|_| None).collect())
            .collect();
        for (src, to) in senders.iter_mut().enumerate() {
            for from in &mut receivers {
                let (tx, rx) = channel();
                to.push(tx);
                from[src] = Some(rx);
            }
        }
        senders
            .into_iter()
            .zip(receivers)
            .enumerate()
            .map(|(rank, (to, from))| Self {
                rank,
                to,
                from: from.into_iter().flatten().collect(),
            })
            .collect()
    }

    fn lost(peer: usize) -> CollectiveError {
        CollectiveError::PeerLost {
            rank: peer,
            address: "in-process".into(),
            reason: "its thread dropped the transport".into(),
        }
    }
}

impl Transport for LocalTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.to.len()
    }

    fn address(&self, peer: usize) -> String {
        format!("in-process rank {peer}")
    }

    fn cluster(&self) -> u64 {
        0
    }

    fn send(
        &mut self,
        peer: usize,
        message: Message,
        _deadline: Instant,
    ) -> Result<bool, CollectiveError> {
        self.to[peer]
            .send(message)
            .map(|()| true)
            .map_err(|_| Self::lost(peer))
    }

    fn recv(&mut self, peer: usize, deadline: Instant) -> Result<Option<Message>, CollectiveError> {
        let wait = deadline.saturating_duration_since(Instant::now());
        match self.from[peer].recv_timeout(wait) {
            Ok(message) => Ok(Some(message)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Err(Self::lost(peer)),
        }
    }
}
