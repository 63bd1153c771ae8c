//! One collective in progress: sends and receives checked, chunked messages against a deadline.

use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::element::Element;
use crate::error::CollectiveError;
use crate::header::{Header, Kind, Message};
use crate::transport::Transport;

pub(crate) struct Session<'a, T: Transport> {
    pub(crate) transport: &'a mut T,
    pub(crate) template: Header,
    pub(crate) deadline: Instant,
    pub(crate) timeout: Duration,
    /// Bytes per message: larger buffers travel as several messages, so the receiver reduces
    /// one chunk while the next is on the wire.
    pub(crate) bytes_per_pack: usize,
    pub(crate) peers: Vec<usize>,
}

impl<T: Transport> Session<'_, T> {
    pub(crate) fn rank(&self) -> usize {
        self.transport.rank()
    }

    pub(crate) fn world_size(&self) -> usize {
        self.transport.world_size()
    }

    fn elems_per_pack<E>(&self) -> usize {
        (self.bytes_per_pack / std::mem::size_of::<E>().max(1)).max(1)
    }

    fn note_peer(&mut self, peer: usize) {
        if !self.peers.contains(&peer) {
            self.peers.push(peer);
        }
    }

    /// Sends `data` to `peer` as one or more messages (one empty message for empty data, so
    /// both sides stay in step).
    pub(crate) fn send<E: Element>(
        &mut self,
        peer: usize,
        data: &[E],
    ) -> Result<(), CollectiveError> {
        self.note_peer(peer);
        if data.is_empty() {
            return self.transport.send(
                peer,
                Message {
                    header: self.template,
                    payload: Bytes::new(),
                },
            );
        }
        for chunk in data.chunks(self.elems_per_pack::<E>()) {
            self.transport
                .send_slice(peer, self.template, bytemuck::cast_slice(chunk))?;
        }
        Ok(())
    }

    /// Receives `len` elements from `peer`, chunk by chunk as [`Session::send`] cut them, and
    /// hands each chunk to `apply` with its element offset.
    pub(crate) fn recv<E: Element>(
        &mut self,
        peer: usize,
        len: usize,
        mut apply: impl FnMut(usize, &[E]),
    ) -> Result<(), CollectiveError> {
        self.note_peer(peer);
        let per_pack = self.elems_per_pack::<E>();
        let mut offset = 0;
        loop {
            let expected = per_pack.min(len - offset);
            let message = self.recv_checked(peer)?;
            let got = message.payload.len();
            if got != expected * std::mem::size_of::<E>() {
                return Err(CollectiveError::Mismatch {
                    what: "payload size",
                    expected: format!("{} bytes", expected * std::mem::size_of::<E>()),
                    got: format!("{got} bytes"),
                    peer,
                });
            }
            // Payloads are normally aligned for E (allocators align to 16 bytes): view them in
            // place, and copy only when they are not.
            match bytemuck::try_cast_slice::<u8, E>(&message.payload) {
                Ok(values) => apply(offset, values),
                Err(_) => apply(
                    offset,
                    &bytemuck::pod_collect_to_vec::<u8, E>(&message.payload),
                ),
            }
            offset += expected;
            if offset >= len {
                return Ok(());
            }
        }
    }

    /// The next message from `peer`, checked against this collective.
    fn recv_checked(&mut self, peer: usize) -> Result<Message, CollectiveError> {
        let t = self.template;
        let Some(message) = self.transport.recv(peer, self.deadline)? else {
            return Err(CollectiveError::Timeout {
                op: t.op,
                seq: t.seq,
                missing_ranks: vec![peer],
                timeout: self.timeout,
            });
        };
        let h = message.header;
        if h.kind == Kind::Abort {
            return Err(CollectiveError::Aborted {
                op: h.op,
                seq: h.seq,
                origin: h.source as usize,
                reason: String::from_utf8_lossy(&message.payload).into_owned(),
            });
        }
        let mismatch = |what, expected: String, got: String| {
            Err(CollectiveError::Mismatch {
                what,
                expected,
                got,
                peer,
            })
        };
        if h.cluster != t.cluster {
            return mismatch(
                "cluster identity",
                format!("{:x}", t.cluster),
                format!("{:x}", h.cluster),
            );
        }
        if h.seq != t.seq {
            return mismatch("sequence number", t.seq.to_string(), h.seq.to_string());
        }
        if h.op != t.op {
            return mismatch("operation", t.op.to_string(), h.op.to_string());
        }
        if h.dtype != t.dtype {
            return mismatch(
                "element type",
                format!("{:?}", t.dtype),
                format!("{:?}", h.dtype),
            );
        }
        if h.count != t.count {
            return mismatch("element count", t.count.to_string(), h.count.to_string());
        }
        if h.reduce != t.reduce {
            return mismatch("reduction", t.reduce.to_string(), h.reduce.to_string());
        }
        Ok(message)
    }

    /// The error to report for `error`: a lost peer is often the consequence of another
    /// rank's failure (it aborted, told everyone, and exited), so a pending abort message from
    /// any peer, looked for briefly, names the root cause instead.
    pub(crate) fn root_cause(&mut self, error: CollectiveError) -> CollectiveError {
        if !matches!(error, CollectiveError::PeerLost { .. }) {
            return error;
        }
        let grace = Instant::now() + Duration::from_millis(100);
        let rank = self.rank();
        for peer in (0..self.world_size()).filter(|&p| p != rank) {
            // Messages ahead of an abort are data this failed collective no longer needs.
            while let Ok(Some(message)) = self.transport.recv(peer, grace) {
                if message.header.kind == Kind::Abort {
                    return CollectiveError::Aborted {
                        op: message.header.op,
                        seq: message.header.seq,
                        origin: message.header.source as usize,
                        reason: String::from_utf8_lossy(&message.payload).into_owned(),
                    };
                }
            }
        }
        error
    }

    /// Tells every peer this collective failed here (best effort: some may be gone).
    pub(crate) fn abort(&mut self, reason: &str) {
        let header = Header {
            kind: Kind::Abort,
            ..self.template
        };
        let rank = self.rank();
        for peer in (0..self.world_size()).filter(|&p| p != rank) {
            let _ = self.transport.send(
                peer,
                Message {
                    header,
                    payload: Bytes::copy_from_slice(reason.as_bytes()),
                },
            );
        }
    }
}
