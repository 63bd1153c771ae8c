//! Point-to-point message transports that the algorithms run over.

mod grpc;
mod inbox;
mod local;
mod shared;
mod tcp;

use std::time::Instant;

pub use grpc::GrpcTransport;
pub use local::LocalTransport;
pub use shared::SharedMemoryTransport;
pub use tcp::{TcpOptions, TcpTransport};

use crate::error::CollectiveError;
use bytes::Bytes;

use crate::header::{Header, Message};

/// Ordered, reliable messages between the ranks of a group.
///
/// Messages from one peer arrive in the order sent. `send` does not wait for the peer to
/// receive (transports buffer), so a ring where everyone sends before receiving cannot
/// deadlock. A peer that disappears is reported as [`CollectiveError::PeerLost`].
pub trait Transport: Send {
    /// This process's rank.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn world_size(&self) -> usize;

    /// Where a peer lives, for error messages.
    fn address(&self, peer: usize) -> String;

    /// The identity every message of this group carries.
    fn cluster(&self) -> u64;

    /// The shared-memory group this rank belongs to, when its peers are threads whose buffers
    /// it can read directly; all-reduce then works in place.
    fn shared_memory(&self) -> Option<&SharedMemoryTransport> {
        None
    }

    /// Sends a message to `peer`.
    ///
    /// # Errors
    ///
    /// [`CollectiveError::PeerLost`] when the peer is gone.
    fn send(&mut self, peer: usize, message: Message) -> Result<(), CollectiveError>;

    /// Sends `payload` under `header` to `peer`. Transports that write bytes out (TCP) do so
    /// straight from the slice; the default copies it into a message.
    ///
    /// # Errors
    ///
    /// [`CollectiveError::PeerLost`] when the peer is gone.
    fn send_slice(
        &mut self,
        peer: usize,
        header: Header,
        payload: &[u8],
    ) -> Result<(), CollectiveError> {
        self.send(
            peer,
            Message {
                header,
                payload: Bytes::copy_from_slice(payload),
            },
        )
    }

    /// The next message from `peer`, waiting at most until `deadline`; `Ok(None)` when the
    /// deadline passes first.
    ///
    /// # Errors
    ///
    /// [`CollectiveError::PeerLost`] when the peer is gone.
    fn recv(&mut self, peer: usize, deadline: Instant) -> Result<Option<Message>, CollectiveError>;
}

/// A transport that can join the members of a cluster by address: TCP or gRPC.
pub trait ClusterTransport: Transport + Sized {
    /// Forms the group: this process is `rank` and listens on `addresses[rank]`.
    ///
    /// # Errors
    ///
    /// [`CollectiveError::Setup`] when the group does not form before the rendezvous deadline.
    fn connect(
        rank: usize,
        addresses: &[String],
        options: &TcpOptions,
    ) -> Result<Self, CollectiveError>;

    /// A group of one, with no network at all (a local run).
    fn single() -> Self;
}

impl ClusterTransport for TcpTransport {
    fn connect(
        rank: usize,
        addresses: &[String],
        options: &TcpOptions,
    ) -> Result<Self, CollectiveError> {
        Self::connect(rank, addresses, options)
    }
    fn single() -> Self {
        Self::single()
    }
}

impl ClusterTransport for GrpcTransport {
    fn connect(
        rank: usize,
        addresses: &[String],
        options: &TcpOptions,
    ) -> Result<Self, CollectiveError> {
        Self::connect(rank, addresses, options)
    }
    fn single() -> Self {
        Self::single()
    }
}

impl<T: Transport + ?Sized> Transport for Box<T> {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn world_size(&self) -> usize {
        (**self).world_size()
    }
    fn address(&self, peer: usize) -> String {
        (**self).address(peer)
    }
    fn cluster(&self) -> u64 {
        (**self).cluster()
    }
    fn shared_memory(&self) -> Option<&SharedMemoryTransport> {
        (**self).shared_memory()
    }
    fn send(&mut self, peer: usize, message: Message) -> Result<(), CollectiveError> {
        (**self).send(peer, message)
    }
    fn send_slice(
        &mut self,
        peer: usize,
        header: Header,
        payload: &[u8],
    ) -> Result<(), CollectiveError> {
        (**self).send_slice(peer, header, payload)
    }
    fn recv(&mut self, peer: usize, deadline: Instant) -> Result<Option<Message>, CollectiveError> {
        (**self).recv(peer, deadline)
    }
}
