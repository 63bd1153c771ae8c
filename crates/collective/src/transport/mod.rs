//! Point-to-point message transports that the algorithms run over.

#[cfg(feature = "grpc")]
mod grpc;
#[cfg(feature = "grpc")]
mod inbox;
pub(crate) mod inherited;
mod local;
mod shared;
mod tcp;

use std::time::Instant;

#[cfg(feature = "grpc")]
pub use grpc::GrpcTransport;
pub use local::LocalTransport;
pub use shared::SharedMemoryTransport;
pub use tcp::{SameHost, TcpOptions, TcpSettings, TcpTransport};

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

    /// Whether waits may spin before they sleep (the default, where a transport spins at all),
    /// or must leave the core to other work: `false` while this rank's core has other work
    /// beside the collective (a step's backward pass beside its gradient packs), which a
    /// spinning wait would take it from. Such a wait yields the core between checks, or, where
    /// the transport can be woken only once a message has arrived whole, sleeps at once.
    fn set_spinning(&mut self, spinning: bool) {
        let _ = spinning;
    }

    /// Looks, without waiting, for a peer whose connection has ended, reading and keeping
    /// whatever has arrived meanwhile: the side channel by which a wait elsewhere (an NCCL
    /// collective on a GPU) learns within moments that a peer process died, where it would
    /// otherwise wait for its timeout. Transports whose peers cannot end apart from this rank
    /// (threads of one process) have nothing to report.
    ///
    /// # Errors
    ///
    /// [`CollectiveError::PeerLost`] naming the first peer found gone.
    fn check_peers(&mut self) -> Result<(), CollectiveError> {
        Ok(())
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

    /// Runs `flow`: sends its outgoing messages while receiving its incoming ones, both
    /// directions progressing together, and each outgoing message leaving only once the
    /// incoming messages it depends on have been applied. The default alternates: it receives
    /// what the next send waits for, sends, and receives one more.
    ///
    /// # Errors
    ///
    /// [`CollectiveError::PeerLost`] when a peer is gone, or what [`Flow::apply`] returns.
    fn exchange(
        &mut self,
        flow: &mut dyn Flow,
        deadline: Instant,
    ) -> Result<Completion, CollectiveError> {
        let (to, from) = (flow.to(), flow.from());
        let mut received = 0;
        let receive_one = |transport: &mut Self,
                           flow: &mut dyn Flow,
                           received: &mut usize|
         -> Result<bool, CollectiveError> {
            let Some(message) = transport.recv(from, deadline)? else {
                return Ok(false);
            };
            flow.apply(*received, Arrival::Message(&message))?;
            transport.recycle(from, message.payload);
            *received += 1;
            Ok(true)
        };
        for index in 0..flow.outgoing() {
            while received < flow.needs(index).min(flow.incoming()) {
                if !receive_one(self, flow, &mut received)? {
                    return Ok(Completion::Expired { waiting_for: from });
                }
            }
            let (header, payload) = flow.message(index);
            if !self.send_slice(to, header, payload, deadline)? {
                return Ok(Completion::Expired { waiting_for: to });
            }
            if received < flow.incoming() && !receive_one(self, flow, &mut received)? {
                return Ok(Completion::Expired { waiting_for: from });
            }
        }
        while received < flow.incoming() {
            if !receive_one(self, flow, &mut received)? {
                return Ok(Completion::Expired { waiting_for: from });
            }
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

/// Both directions of one pipelined transfer, as [`Transport::exchange`] runs it: messages to
/// one peer and from another, where an outgoing message may depend on incoming ones (a ring
/// all-reduce forwards each pack as soon as it has reduced it, while it is still in cache).
///
/// Incoming messages are numbered from 0 in arrival order, outgoing ones in sending order.
pub trait Flow {
    /// The rank outgoing messages go to.
    fn to(&self) -> usize;

    /// The rank incoming messages come from.
    fn from(&self) -> usize;

    /// How many messages go out.
    fn outgoing(&self) -> usize;

    /// How many messages come in.
    fn incoming(&self) -> usize;

    /// How many incoming messages must have been applied before outgoing message `index` may
    /// leave.
    fn needs(&self, index: usize) -> usize;

    /// Outgoing message `index`: its header and payload. Asked for only once its needs are
    /// met, possibly more than once while a transport writes it out piece by piece; the
    /// answer must not change meanwhile.
    fn message(&self, index: usize) -> (Header, &[u8]);

    /// Where the `len`-byte payload of incoming message `index`, announced by `header`, may be
    /// written directly, saving a copy; `None` (the default) to receive it whole and hand it
    /// to [`Flow::apply`]. Transports may ask more than once for one message and must get the
    /// same answer; a flow must answer `None` for any header it would not accept, so that
    /// [`Flow::apply`] sees the message and reports what is wrong with it.
    fn place(&mut self, index: usize, header: &Header, len: usize) -> Option<&mut [u8]> {
        let _ = (index, header, len);
        None
    }

    /// Incoming message `index` has arrived, in order: check it and apply it.
    ///
    /// # Errors
    ///
    /// Whatever makes the message unacceptable (a mismatch, an abort from its sender).
    fn apply(&mut self, index: usize, arrival: Arrival<'_>) -> Result<(), CollectiveError>;
}

/// How an incoming message of a [`Flow`] arrived.
#[derive(Debug, Clone, Copy)]
pub enum Arrival<'a> {
    /// Whole, in a buffer of the transport's.
    Message(&'a Message),
    /// Its payload already written where [`Flow::place`] said; this is its header.
    Placed(Header),
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
    /// [`CollectiveError::Setup`] when the address cannot be bound or the group does not form
    /// before the rendezvous deadline.
    fn connect(
        rank: usize,
        addresses: &[String],
        options: &TcpOptions,
    ) -> Result<Self, CollectiveError> {
        Self::connect_on(
            tcp::bind_own(rank, addresses, options.bind)?,
            rank,
            addresses,
            options,
        )
    }

    /// As [`ClusterTransport::connect`], listening on `listener`, bound to `addresses[rank]`
    /// already: a launcher's hand-over leaves no moment in which the port is free for
    /// another program to take.
    ///
    /// # Errors
    ///
    /// As [`ClusterTransport::connect`].
    fn connect_on(
        listener: std::net::TcpListener,
        rank: usize,
        addresses: &[String],
        options: &TcpOptions,
    ) -> Result<Self, CollectiveError>;

    /// A group of one, with no network at all (a local run).
    fn single() -> Self;
}

impl ClusterTransport for TcpTransport {
    fn connect_on(
        listener: std::net::TcpListener,
        rank: usize,
        addresses: &[String],
        options: &TcpOptions,
    ) -> Result<Self, CollectiveError> {
        Self::connect_on(listener, rank, addresses, options)
    }
    fn single() -> Self {
        Self::single()
    }
}

#[cfg(feature = "grpc")]
impl ClusterTransport for GrpcTransport {
    fn connect_on(
        listener: std::net::TcpListener,
        rank: usize,
        addresses: &[String],
        options: &TcpOptions,
    ) -> Result<Self, CollectiveError> {
        Self::connect_on(listener, rank, addresses, options)
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
    fn check_peers(&mut self) -> Result<(), CollectiveError> {
        (**self).check_peers()
    }
    fn set_spinning(&mut self, spinning: bool) {
        (**self).set_spinning(spinning);
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
        flow: &mut dyn Flow,
        deadline: Instant,
    ) -> Result<Completion, CollectiveError> {
        (**self).exchange(flow, deadline)
    }
    fn recycle(&mut self, peer: usize, payload: Bytes) {
        (**self).recycle(peer, payload);
    }
    fn recv(&mut self, peer: usize, deadline: Instant) -> Result<Option<Message>, CollectiveError> {
        (**self).recv(peer, deadline)
    }
}
