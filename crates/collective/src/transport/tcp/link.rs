//! One peer's connection, driven from the calling thread: frames are read without blocking
//! into per-peer queues (or straight into a [`Flow`]'s buffer), and written straight from the
//! caller's slice.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::Shutdown;
use std::ops::Range;

use bytes::{Bytes, BytesMut};

use super::stream::Stream;
use crate::header::{HEADER_LEN, Header, Message};
use crate::transport::Flow;

/// The largest payload a peer may announce: a corrupt length must not allocate gigabytes.
pub(super) const MAX_PAYLOAD: u32 = 1 << 30;
/// Small frames arrive many to a read; they are parsed out of this much staging space.
const STAGING: usize = 64 << 10;
/// Payload buffers kept for reuse per peer (each as large as one pack): enough for the frames
/// a sender may run ahead by when ranks share cores, so steady state allocates nothing.
const SPARE_BUFFERS: usize = 16;
/// Smaller payloads are cheap to allocate and not worth keeping.
const SPARE_MIN_BYTES: usize = 4 << 10;

/// A frame whose payload is still arriving.
enum Arriving {
    /// Into a buffer of the link's, to be queued whole.
    Whole {
        header: Header,
        payload: BytesMut,
        filled: usize,
    },
    /// Into the buffer a [`Flow`] named for its incoming message `index`.
    Placed {
        header: Header,
        index: usize,
        len: usize,
        filled: usize,
    },
}

/// A frame that has arrived.
pub(super) enum Arrived {
    /// Whole, with its payload.
    Message(Message),
    /// Its payload already where a [`Flow`] wanted it.
    Placed(Header),
}

/// The flow whose incoming messages this link is receiving, and how many of them have been
/// taken out of the ready queue so far: the frame read next is its message number
/// `applied + ready.len()`.
pub(super) struct Placing<'f> {
    pub(super) flow: &'f mut dyn Flow,
    pub(super) applied: usize,
}

/// The result of one attempt to move bytes.
pub(super) enum Progress {
    /// Some bytes moved.
    Moved,
    /// The socket has nothing to read, or no room to write, right now.
    WouldBlock,
}

/// A non-blocking connection to one peer.
pub(super) struct Link {
    stream: Stream,
    staging: Box<[u8]>,
    staged: Range<usize>,
    arriving: Option<Arriving>,
    /// Complete frames not yet asked for.
    pub(super) ready: VecDeque<Arrived>,
    /// Why the connection ended, once it has (frames before the end stay in `ready`).
    pub(super) closed: Option<String>,
    /// Whether this end cut it ([`Link::cut`]), rather than the peer closing it.
    pub(super) cut_here: bool,
    /// Payload buffers handed back after use; their bytes are initialised up to `len`, so
    /// reusing one costs no zero-fill.
    spare: Vec<BytesMut>,
    /// The bytes last asked to be in the socket before `poll` wakes a reader
    /// ([`Link::wake_reader_at`]).
    wake_at: usize,
}

impl Link {
    /// Wraps a connected stream.
    pub(super) fn new(stream: Stream) -> io::Result<Self> {
        stream.set_nonblocking(true)?;
        stream.tune()?;
        Ok(Self {
            stream,
            staging: vec![0; STAGING].into_boxed_slice(),
            staged: 0..0,
            arriving: None,
            ready: VecDeque::new(),
            closed: None,
            cut_here: false,
            spare: Vec::new(),
            wake_at: 1,
        })
    }

    pub(super) fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The bytes of the frame arriving now that are still in the socket: 0 before its header
    /// has been read.
    pub(super) fn frame_bytes_in_socket(&self) -> usize {
        let left = match &self.arriving {
            Some(Arriving::Whole {
                payload, filled, ..
            }) => payload.len() - filled,
            Some(Arriving::Placed { len, filled, .. }) => len - filled,
            None => 0,
        };
        left.saturating_sub(self.staged.len())
    }

    /// Has `poll` wake a reader of this link once `bytes` (at least one) are in its socket
    /// ([`Stream::wake_reader_at`]; nothing to do when that is what it already asks), and
    /// returns the bytes it asks now: where the socket refused, what it asked before.
    pub(super) fn wake_reader_at(&mut self, bytes: usize) -> usize {
        let bytes = bytes.max(1);
        if bytes != self.wake_at && self.stream.wake_reader_at(bytes) {
            self.wake_at = bytes;
        }
        self.wake_at
    }

    /// Whether a frame is part-way into a flow's buffer: only that flow may read on.
    pub(super) fn is_placing(&self) -> bool {
        matches!(self.arriving, Some(Arriving::Placed { .. }))
    }

    /// The next whole message, skipping frames that were placed for a flow which has since
    /// ended (they belonged to a collective that failed).
    pub(super) fn next_message(&mut self) -> Option<Message> {
        while let Some(arrived) = self.ready.pop_front() {
            if let Arrived::Message(message) = arrived {
                return Some(message);
            }
        }
        None
    }

    /// Reads everything the socket holds now; returns whether anything arrived (a frame, or
    /// the end of the connection). With `placing`, frames that are the flow's incoming
    /// messages go where it says.
    pub(super) fn pump(&mut self, mut placing: Option<&mut Placing<'_>>) -> bool {
        let mut moved = false;
        while self.closed.is_none() {
            match self.read_step(placing.as_deref_mut()) {
                Ok(Progress::Moved) => moved = true,
                Ok(Progress::WouldBlock) => break,
                Err(reason) => {
                    self.closed = Some(reason);
                    moved = true;
                }
            }
        }
        moved
    }

    /// One read from the socket or one frame parsed out of the staging space.
    fn read_step(&mut self, placing: Option<&mut Placing<'_>>) -> Result<Progress, String> {
        match &mut self.arriving {
            Some(Arriving::Whole {
                header,
                payload,
                filled,
            }) => {
                if *filled == payload.len() {
                    let message = Message {
                        header: *header,
                        payload: std::mem::take(payload).freeze(),
                    };
                    self.arriving = None;
                    self.ready.push_back(Arrived::Message(message));
                    return Ok(Progress::Moved);
                }
                fill(
                    &mut self.stream,
                    &self.staging,
                    &mut self.staged,
                    &mut payload[*filled..],
                    filled,
                )
            }
            Some(Arriving::Placed {
                header,
                index,
                len,
                filled,
            }) => {
                let Some(placing) = placing else {
                    return Err("a message meant for a transfer arrived after it ended".into());
                };
                let Some(into) = placing
                    .flow
                    .place(*index, header, *len)
                    .filter(|into| into.len() == *len)
                else {
                    return Err("a transfer withdrew the room for a message part-way".into());
                };
                if *filled == *len {
                    self.ready.push_back(Arrived::Placed(*header));
                    self.arriving = None;
                    return Ok(Progress::Moved);
                }
                fill(
                    &mut self.stream,
                    &self.staging,
                    &mut self.staged,
                    &mut into[*filled..],
                    filled,
                )
            }
            None if self.staged.len() >= HEADER_LEN => self.begin_frame(placing),
            None => self.stage(),
        }
    }

    /// Decodes the staged header of the next frame and decides where its payload goes.
    fn begin_frame(&mut self, placing: Option<&mut Placing<'_>>) -> Result<Progress, String> {
        let (header, len) =
            Header::decode(&self.staging[self.staged.clone()]).map_err(|e| e.to_string())?;
        if len > MAX_PAYLOAD {
            return Err(format!(
                "a frame announced {len} bytes, over the {MAX_PAYLOAD}-byte limit"
            ));
        }
        self.staged.start += HEADER_LEN;
        let len = len as usize;
        let index = placing.as_ref().map(|p| p.applied + self.ready.len());
        let placed = placing.zip(index).is_some_and(|(placing, index)| {
            index < placing.flow.incoming()
                && placing
                    .flow
                    .place(index, &header, len)
                    .is_some_and(|into| into.len() == len)
        });
        self.arriving = Some(match index {
            Some(index) if placed => Arriving::Placed {
                header,
                index,
                len,
                filled: 0,
            },
            _ => Arriving::Whole {
                header,
                payload: self.buffer(len),
                filled: 0,
            },
        });
        Ok(Progress::Moved)
    }

    /// Reads more bytes into the staging space, for headers and small frames.
    fn stage(&mut self) -> Result<Progress, String> {
        if self.staged.start > 0 {
            self.staging.copy_within(self.staged.clone(), 0);
            self.staged = 0..self.staged.len();
        }
        match read(&mut self.stream, &mut self.staging[self.staged.end..]) {
            Ok(Some(0)) if self.staged.is_empty() => Err("the connection closed".into()),
            Ok(Some(0)) => Err("the connection closed in the middle of a header".into()),
            Ok(Some(n)) => {
                self.staged.end += n;
                Ok(Progress::Moved)
            }
            Ok(None) => Ok(Progress::WouldBlock),
            Err(e) => Err(e.to_string()),
        }
    }

    /// A `len`-byte buffer to read a payload into: a spare one when one is large enough.
    fn buffer(&mut self, len: usize) -> BytesMut {
        match self.spare.iter().position(|b| b.capacity() >= len) {
            Some(at) => {
                let mut buffer = self.spare.swap_remove(at);
                // Growing within capacity zero-fills only what was never initialised.
                buffer.resize(len, 0);
                buffer
            }
            None => BytesMut::zeroed(len),
        }
    }

    /// Keeps a used payload's memory for the next frame, when nobody else holds it.
    pub(super) fn recycle(&mut self, payload: Bytes) {
        if self.spare.len() < SPARE_BUFFERS
            && payload.len() >= SPARE_MIN_BYTES
            && let Ok(buffer) = payload.try_into_mut()
        {
            self.spare.push(buffer);
        }
    }

    /// Writes as much of `header ++ payload` from byte `written` on as the socket takes now;
    /// returns the new count of bytes written.
    pub(super) fn write_step(
        &mut self,
        head: &[u8],
        payload: &[u8],
        written: usize,
    ) -> io::Result<(usize, Progress)> {
        let slices = if written < head.len() {
            [IoSlice::new(&head[written..]), IoSlice::new(payload)]
        } else {
            [
                IoSlice::new(&payload[written - head.len()..]),
                IoSlice::new(&[]),
            ]
        };
        match self.stream.write_vectored(&slices) {
            Ok(0) => Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "the connection accepts no more bytes",
            )),
            Ok(n) => Ok((written + n, Progress::Moved)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok((written, Progress::WouldBlock)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok((written, Progress::Moved)),
            Err(e) => Err(e),
        }
    }

    /// Ends the connection for both sides: a peer must see an end, never half a frame
    /// followed by another.
    pub(super) fn cut(&mut self, reason: String) {
        let _ = self.stream.shutdown(Shutdown::Both);
        if self.closed.is_none() {
            self.cut_here = true;
        }
        self.closed.get_or_insert(reason);
    }

    /// Tells the peer no more frames follow (their reads end after our last frame).
    pub(super) fn finish(&self) {
        let _ = self.stream.shutdown(Shutdown::Write);
    }
}

/// Moves payload bytes into `into` (the part of a payload still missing): first what the
/// staging space already holds, else straight from the socket; counts them in `filled`.
fn fill(
    stream: &mut Stream,
    staging: &[u8],
    staged: &mut Range<usize>,
    into: &mut [u8],
    filled: &mut usize,
) -> Result<Progress, String> {
    if staged.start < staged.end {
        let n = into.len().min(staged.len());
        into[..n].copy_from_slice(&staging[staged.start..staged.start + n]);
        *filled += n;
        staged.start += n;
        return Ok(Progress::Moved);
    }
    match read(stream, into) {
        Ok(Some(0)) => Err("the connection closed in the middle of a message".into()),
        Ok(Some(n)) => {
            *filled += n;
            Ok(Progress::Moved)
        }
        Ok(None) => Ok(Progress::WouldBlock),
        Err(e) => Err(e.to_string()),
    }
}

/// A non-blocking read: `Ok(None)` when nothing is available.
fn read(stream: &mut Stream, into: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        match stream.read(into) {
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    use bytes::BufMut;
    use proptest::prelude::*;

    use super::*;
    use crate::header::{DType, Kind, Op};

    fn pair() -> (TcpStream, Link) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let writer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (reader, _) = listener.accept().unwrap();
        (writer, Link::new(Stream::Tcp(reader)).unwrap())
    }

    fn frame(seq: u64, payload: &[u8]) -> Vec<u8> {
        let header = Header {
            kind: Kind::Data,
            op: Op::AllReduce,
            dtype: DType::F32,
            reduce: 0,
            cluster: 7,
            seq,
            count: 0,
            source: 1,
        };
        let mut out = BytesMut::new();
        header.encode(payload.len() as u32, &mut out);
        out.put_slice(payload);
        out.to_vec()
    }

    /// Pumps until `want` frames are ready or the link closes (bounded in time).
    fn pump_until(link: &mut Link, want: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while link.ready.len() < want && link.closed.is_none() && Instant::now() < deadline {
            if !link.pump(None) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        #[test]
        fn frames_cut_anywhere_arrive_whole_and_in_order(
            payloads in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..70_000), 1..5),
            cuts in prop::collection::vec(1_usize..9_000, 1..40),
        ) {
            let (mut writer, mut link) = pair();
            let bytes: Vec<u8> = payloads
                .iter()
                .enumerate()
                .flat_map(|(seq, p)| frame(seq as u64, p))
                .collect();
            let sender = std::thread::spawn(move || {
                let mut at = 0;
                for cut in cuts.iter().cycle() {
                    if at == bytes.len() {
                        break;
                    }
                    let end = (at + cut).min(bytes.len());
                    writer.write_all(&bytes[at..end]).unwrap();
                    writer.flush().unwrap();
                    at = end;
                }
                writer
            });
            pump_until(&mut link, payloads.len());
            let _writer = sender.join().unwrap();
            prop_assert_eq!(link.ready.len(), payloads.len());
            for (seq, payload) in payloads.iter().enumerate() {
                let message = link.next_message().unwrap();
                prop_assert_eq!(message.header.seq, seq as u64);
                prop_assert_eq!(&message.payload[..], &payload[..]);
                link.recycle(message.payload);
            }
        }

        #[test]
        fn garbage_on_the_wire_ends_the_connection_with_a_reason(
            garbage in prop::collection::vec(any::<u8>(), HEADER_LEN..200),
        ) {
            prop_assume!(Header::decode(&garbage).is_err());
            let (mut writer, mut link) = pair();
            writer.write_all(&garbage).unwrap();
            pump_until(&mut link, 1);
            prop_assert!(link.ready.is_empty());
            prop_assert!(link.closed.is_some());
        }
    }

    #[test]
    fn a_connection_that_ends_mid_message_is_reported_as_such() {
        let (mut writer, mut link) = pair();
        let bytes = frame(0, &[1; 100]);
        writer.write_all(&bytes[..HEADER_LEN + 10]).unwrap();
        drop(writer);
        pump_until(&mut link, 1);
        assert!(link.ready.is_empty());
        let reason = link.closed.unwrap();
        assert!(reason.contains("middle of a message"), "{reason}");
    }

    #[test]
    fn recycled_buffers_are_reused_for_later_payloads() {
        let (mut writer, mut link) = pair();
        writer.write_all(&frame(0, &[3; 8192])).unwrap();
        pump_until(&mut link, 1);
        let first = link.next_message().unwrap().payload;
        let address = first.as_ptr();
        link.recycle(first);
        writer.write_all(&frame(1, &[4; 5000])).unwrap();
        pump_until(&mut link, 1);
        let second = link.next_message().unwrap();
        assert_eq!(second.payload.as_ptr(), address);
        assert!(second.payload.iter().all(|&b| b == 4));
        assert_eq!(second.payload.len(), 5000);
    }

    /// A flow that takes `slots` incoming payloads of `len` bytes in place, unless their
    /// sequence number is 99.
    struct Slots {
        len: usize,
        buffer: Vec<u8>,
    }

    impl Flow for Slots {
        fn to(&self) -> usize {
            0
        }
        fn from(&self) -> usize {
            0
        }
        fn outgoing(&self) -> usize {
            0
        }
        fn incoming(&self) -> usize {
            self.buffer.len() / self.len
        }
        fn needs(&self, _: usize) -> usize {
            0
        }
        fn message(&self, _: usize) -> (Header, &[u8]) {
            unreachable!("this flow sends nothing")
        }
        fn place(&mut self, index: usize, header: &Header, len: usize) -> Option<&mut [u8]> {
            let at = index * self.len;
            (header.seq != 99 && len == self.len).then(|| &mut self.buffer[at..at + self.len])
        }
        fn apply(
            &mut self,
            _: usize,
            _: crate::transport::Arrival<'_>,
        ) -> Result<(), crate::error::CollectiveError> {
            Ok(())
        }
    }

    fn pump_placing_until(link: &mut Link, flow: &mut Slots, want: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while link.ready.len() < want && link.closed.is_none() && Instant::now() < deadline {
            let mut placing = Placing { flow, applied: 0 };
            if !link.pump(Some(&mut placing)) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    #[test]
    fn a_flows_messages_land_in_its_buffer_and_the_rest_arrive_whole() {
        let (mut writer, mut link) = pair();
        let mut flow = Slots {
            len: 70_000,
            buffer: vec![0; 3 * 70_000],
        };
        for (seq, fill) in [(0, 1_u8), (99, 2), (2, 3), (3, 4)] {
            writer.write_all(&frame(seq, &vec![fill; 70_000])).unwrap();
        }
        pump_placing_until(&mut link, &mut flow, 4);
        let kinds: Vec<_> = link
            .ready
            .iter()
            .map(|arrived| match arrived {
                Arrived::Placed(h) => ("placed", h.seq),
                Arrived::Message(m) => ("whole", m.header.seq),
            })
            .collect();
        // Message 1 is refused by the flow, message 3 is past its end.
        assert_eq!(
            kinds,
            [("placed", 0), ("whole", 99), ("placed", 2), ("whole", 3)]
        );
        assert!(flow.buffer[..70_000].iter().all(|&b| b == 1));
        assert!(flow.buffer[70_000..140_000].iter().all(|&b| b == 0));
        assert!(flow.buffer[140_000..].iter().all(|&b| b == 3));
        assert_eq!(link.next_message().unwrap().header.seq, 99);
        assert_eq!(
            link.next_message().unwrap().payload[..],
            vec![4_u8; 70_000][..]
        );
    }

    #[test]
    fn reading_on_without_the_flow_a_frame_is_landing_in_ends_the_connection() {
        let (mut writer, mut link) = pair();
        let mut flow = Slots {
            len: 1000,
            buffer: vec![0; 1000],
        };
        let bytes = frame(0, &[7; 1000]);
        writer.write_all(&bytes[..HEADER_LEN + 10]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !link.is_placing() && Instant::now() < deadline {
            link.pump(Some(&mut Placing {
                flow: &mut flow,
                applied: 0,
            }));
        }
        assert!(link.is_placing());
        writer.write_all(&bytes[HEADER_LEN + 10..]).unwrap();
        pump_until(&mut link, 1);
        assert!(link.ready.is_empty());
        assert!(link.closed.unwrap().contains("after it ended"));
    }
}
