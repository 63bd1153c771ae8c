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

    /// Sends a message to `peer`: `Ok(true)` once the transport has taken it, `Ok(false)` when
    /// `deadline` passed first (a transport with bounded buffers waits for a slow reader).
    ///
    /// # Errors
    ///
    /// [`CollectiveError::PeerLost`] when the peer is gone.
    fn send(
        &mut self,
        peer: usize,
        message: Message,
        deadline: Instant,
    ) -> Result<bool, CollectiveError>;

    /// Sends `payload` under `header` to `peer`, as [`Transport::send`]. Transports that write
    /// bytes out (TCP) do so straight from the slice; the default copies it into a message.
    ///
    /// # Errors
    ///
    /// [`CollectiveError::PeerLost`] when the peer is gone.
    fn send_slice(
        &mut self,
        peer: usize,
        header: Header,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<bool, CollectiveError> {
        self.send(
            peer,
            Message {
                header,
                payload: Bytes::copy_from_slice(payload),
            },
            deadline,
        )
    }

    /// Sends `outgoing` while receiving `messages` messages from `from`, handing each to
    /// `on_receive` in order; both directions progress together, so neither side's sending
    /// waits for the other's receiving to finish. The default alternates one send and one
    /// receive.
    ///
    /// # Errors
    ///
    /// [`CollectiveError::PeerLost`] when a peer is gone, or what `on_receive` returns.
    fn exchange(
        &mut self,
        outgoing: Outgoing<'_>,
        from: usize,
        messages: usize,
        deadline: Instant,
        on_receive: &mut dyn FnMut(&Message) -> Result<(), CollectiveError>,
    ) -> Result<Completion, CollectiveError> {
        let mut received = 0;
        let mut receive_one = |transport: &mut Self| -> Result<bool, CollectiveError> {
            let Some(message) = transport.recv(from, deadline)? else {
                return Ok(false);
            };
            on_receive(&message)?;
            transport.recycle(from, message.payload);
            Ok(true)
        };
        for pack in outgoing.packs() {
            if !self.send_slice(outgoing.to, outgoing.header, pack, deadline)? {
                return Ok(Completion::Expired {
                    waiting_for: outgoing.to,
                });
            }
            if received < messages {
                if !receive_one(self)? {
                    return Ok(Completion::Expired { waiting_for: from });
                }
                received += 1;
            }
        }
        while received < messages {
            if !receive_one(self)? {
                return Ok(Completion::Expired { waiting_for: from });
            }
            received += 1;
        }
        Ok(Completion::Done)
    }

    /// Hands back the payload of a received message once it has been used, so a transport
    /// that reads into buffers can reuse them; the default drops it.
    fn recycle(&mut self, peer: usize, payload: Bytes) {
        let _ = (peer, payload);
    }

    /// The next message from `peer`, waiting at most until `deadline`; `Ok(None)` when the
    /// deadline passes first.
    ///
    /// # Errors
    ///
    /// [`CollectiveError::PeerLost`] when the peer is gone.
    fn recv(&mut self, peer: usize, deadline: Instant) -> Result<Option<Message>, CollectiveError>;
}

/// What one side of a [`Transport::exchange`] sends: `payload` to `to` under `header`, cut into
/// messages of `pack_bytes` (one empty message when `payload` is empty).
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    /// The receiving rank.
    pub to: usize,
    /// The header of every message.
    pub header: Header,
    /// The bytes to send.
    pub payload: &'a [u8],
    /// The most bytes in one message.
    pub pack_bytes: usize,
}

impl<'a> Outgoing<'a> {
    /// The payload as the messages that carry it.
    pub fn packs(&self) -> impl Iterator<Item = &'a [u8]> + use<'a> {
        let payload: &'a [u8] = self.payload;
        let empty = payload.is_empty().then_some(payload);
        payload.chunks(self.pack_bytes.max(1)).chain(empty)
    }
}

/// How a transfer with a deadline ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Completion {
    /// Everything was sent and received.
    Done,
    /// The deadline passed while waiting for this rank.
    Expired {
        /// The rank that had not taken or delivered its messages.
        waiting_for: usize,
    },
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
    fn send(
        &mut self,
        peer: usize,
        message: Message,
        deadline: Instant,
    ) -> Result<bool, CollectiveError> {
        (**self).send(peer, message, deadline)
    }
    fn send_slice(
        &mut self,
        peer: usize,
        header: Header,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<bool, CollectiveError> {
        (**self).send_slice(peer, header, payload, deadline)
    }
    fn exchange(
        &mut self,
        outgoing: Outgoing<'_>,
        from: usize,
        messages: usize,
        deadline: Instant,
        on_receive: &mut dyn FnMut(&Message) -> Result<(), CollectiveError>,
    ) -> Result<Completion, CollectiveError> {
        (**self).exchange(outgoing, from, messages, deadline, on_receive)
    }
    fn recycle(&mut self, peer: usize, payload: Bytes) {
        (**self).recycle(peer, payload);
    }
    fn recv(&mut self, peer: usize, deadline: Instant) -> Result<Option<Message>, CollectiveError> {
        (**self).recv(peer, deadline)
    }
}
