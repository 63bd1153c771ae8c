//! One collective in progress: sends and receives checked, chunked messages against a deadline.

use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::element::Element;
use crate::error::CollectiveError;
use crate::header::{Header, Kind, Message};
use crate::transport::{Completion, Flow, Transport};

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

    fn timeout_waiting_for(&self, peer: usize) -> CollectiveError {
        CollectiveError::Timeout {
            op: self.template.op,
            seq: self.template.seq,
            missing_ranks: vec![peer],
            timeout: self.timeout,
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
        let pack_bytes = self.elems_per_pack::<E>() * std::mem::size_of::<E>();
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let mut packs = bytes.chunks(pack_bytes);
        let mut next = Some(packs.next().unwrap_or_default());
        while let Some(pack) = next {
            if !self
                .transport
                .send_slice(peer, self.template, pack, self.deadline)?
            {
                return Err(self.timeout_waiting_for(peer));
            }
            next = packs.next();
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
        let mut packs = Packs::new(self.template, peer, len, self.elems_per_pack::<E>());
        while !packs.done() {
            let Some(message) = self.transport.recv(peer, self.deadline)? else {
                return Err(self.timeout_waiting_for(peer));
            };
            packs.accept(&message, &mut apply)?;
            self.transport.recycle(peer, message.payload);
        }
        Ok(())
    }

    /// The number of elements per message for elements of type `E`.
    pub(crate) fn pack_elems<E>(&self) -> usize {
        self.elems_per_pack::<E>()
    }

    /// Runs `flow` (see [`Transport::exchange`]) against this collective's deadline.
    pub(crate) fn exchange(&mut self, flow: &mut dyn Flow) -> Result<(), CollectiveError> {
        self.note_peer(flow.to());
        self.note_peer(flow.from());
        match self.transport.exchange(flow, self.deadline)? {
            Completion::Done => Ok(()),
            Completion::Expired { waiting_for } => Err(self.timeout_waiting_for(waiting_for)),
        }
    }

    /// The error to report for `error`: a lost peer is often the consequence of another
    /// rank's failure (it aborted, told everyone, and exited), so a pending abort message from
    /// any peer, looked for briefly, names the root cause instead.
    pub(crate) fn root_cause(&mut self, error: CollectiveError) -> CollectiveError {
        if !matches!(error, CollectiveError::PeerLost { .. }) {
            return error;
        }
        let rank = self.rank();
        // First what has arrived from every peer, without waiting; then, briefly, what may
        // still be on its way. A peer with nothing to say must not hold up the look at the
        // others: with many ranks an abort often sits behind a quiet one.
        let now = Instant::now();
        let grace = now + Duration::from_millis(100);
        for deadline in [now, grace] {
            for peer in (0..self.world_size()).filter(|&p| p != rank) {
                // Messages ahead of an abort are data this failed collective no longer needs.
                loop {
                    match self.transport.recv(peer, deadline) {
                        Ok(Some(message)) => {
                            if let Some(aborted) = abort_in(&message) {
                                return aborted;
                            }
                        }
                        // The transport found another peer's abort while it waited.
                        Err(aborted @ CollectiveError::Aborted { .. }) => return aborted,
                        Ok(None) | Err(_) => break,
                    }
                }
            }
        }
        error
    }

    /// Tells every peer this collective failed here (best effort: some may be gone); with
    /// `timed_out`, because this rank waited past its deadline.
    pub(crate) fn abort(&mut self, reason: &str, timed_out: bool) {
        let header = Header {
            kind: Kind::Abort,
            ..self.template
        };
        let payload = abort_payload(reason, timed_out);
        let rank = self.rank();
        // A peer that is stalled, not gone, must not hold this rank's error back for long.
        let deadline = Instant::now() + Duration::from_millis(100);
        for peer in (0..self.world_size()).filter(|&p| p != rank) {
            let _ = self.transport.send(
                peer,
                Message {
                    header,
                    payload: payload.clone(),
                },
                deadline,
            );
        }
    }
}

/// The receiving side of one transfer: which pack comes next, checked against the collective.
struct Packs {
    template: Header,
    peer: usize,
    len: usize,
    per_pack: usize,
    offset: usize,
    received: usize,
}

impl Packs {
    fn new(template: Header, peer: usize, len: usize, per_pack: usize) -> Self {
        Self {
            template,
            peer,
            len,
            per_pack,
            offset: 0,
            received: 0,
        }
    }

    /// How many messages carry `len` elements (one, empty, for none).
    fn messages(&self) -> usize {
        self.len.div_ceil(self.per_pack).max(1)
    }

    fn done(&self) -> bool {
        self.received == self.messages()
    }

    /// Checks the next message and hands its elements to `apply` with their offset.
    fn accept<E: Element>(
        &mut self,
        message: &Message,
        apply: &mut impl FnMut(usize, &[E]),
    ) -> Result<(), CollectiveError> {
        check(&self.template, self.peer, message)?;
        let expected = self.per_pack.min(self.len - self.offset) * std::mem::size_of::<E>();
        check_size(expected, message, self.peer)?;
        // Payloads are normally aligned for E (allocators align to 16 bytes): view them in
        // place, and copy only when they are not.
        match bytemuck::try_cast_slice::<u8, E>(&message.payload) {
            Ok(values) => apply(self.offset, values),
            Err(_) => apply(
                self.offset,
                &bytemuck::pod_collect_to_vec::<u8, E>(&message.payload),
            ),
        }
        self.offset += expected / std::mem::size_of::<E>().max(1);
        self.received += 1;
        Ok(())
    }
}

/// A payload of other than `expected` bytes from `peer` is a mismatch.
pub(crate) fn check_size(
    expected: usize,
    message: &Message,
    peer: usize,
) -> Result<(), CollectiveError> {
    let got = message.payload.len();
    if got == expected {
        return Ok(());
    }
    Err(CollectiveError::Mismatch {
        what: "payload size",
        expected: format!("{expected} bytes"),
        got: format!("{got} bytes"),
        peer,
    })
}

/// An abort's payload: one byte saying whether the rank that sent it timed out, then its
/// error's text.
fn abort_payload(reason: &str, timed_out: bool) -> Bytes {
    let mut payload = Vec::with_capacity(1 + reason.len());
    payload.push(u8::from(timed_out));
    payload.extend_from_slice(reason.as_bytes());
    Bytes::from(payload)
}

/// The error an abort message carries (the rank that failed, and why); `None` for any other
/// message.
pub(crate) fn abort_in(message: &Message) -> Option<CollectiveError> {
    let h = message.header;
    (h.kind == Kind::Abort).then(|| CollectiveError::Aborted {
        op: h.op,
        seq: h.seq,
        origin: h.source as usize,
        reason: String::from_utf8_lossy(message.payload.get(1..).unwrap_or_default()).into_owned(),
    })
}

/// Whether `message` is the abort of a rank that timed out. Such a rank names only the peer it
/// was waiting for, which may itself be waiting for the rank really missing: a rank still
/// within its own deadline waits on and names what it sees itself.
pub(crate) fn is_abort_of_a_timeout(message: &Message) -> bool {
    message.header.kind == Kind::Abort && message.payload.first() == Some(&1)
}

/// Whether `h` is a data message of the collective `t` describes (what [`check`] accepts).
pub(crate) fn belongs(t: &Header, h: &Header) -> bool {
    h.kind == Kind::Data
        && (h.cluster, h.seq, h.op, h.dtype, h.count, h.reduce)
            == (t.cluster, t.seq, t.op, t.dtype, t.count, t.reduce)
}

/// A message from `peer` that does not belong to the collective `t` describes is an error:
/// an abort names the rank that failed; anything else is a mismatch.
pub(crate) fn check(t: &Header, peer: usize, message: &Message) -> Result<(), CollectiveError> {
    let h = message.header;
    if let Some(aborted) = abort_in(message) {
        return Err(aborted);
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
    Ok(())
}
