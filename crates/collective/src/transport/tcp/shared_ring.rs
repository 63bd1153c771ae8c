//! A Unix-domain socket whose bytes travel through memory both processes map: for each
//! direction a ring in one sealed `memfd`, the sender copying in and the receiver copying out,
//! with no system call while both sides are busy.
//!
//! Why: over the socket itself the kernel copies every byte twice, into a socket buffer and
//! out of it, each copy a system call on a core that the all-reduce needs for reducing. In
//! five interleaved runs at 16–256 MiB (`docs/PERFORMANCE.md`, twelfth session) the ring
//! moved 1.10–1.68× the bytes per second of the socket with 2 ranks on 2 cores (median
//! 1.29×) and 0.99–1.76× with 4 (median 1.32×), and cut a 4-byte round from 9–15 µs to
//! 1–3 µs, the way MPI's and NCCL's paths inside a node do.
//!
//! The socket stays, for three jobs: it carries the handshake that passes the `memfd`
//! (`SCM_RIGHTS`); a side that goes to sleep in `poll(2)` says so in the ring's control words
//! and the other side writes one "doorbell" byte to wake it; and the socket's end is how a
//! peer's exit or death is seen, since a ring cannot tell.
//!
//! The protocol, per direction: `head` counts the bytes ever written and only the writer stores
//! it (release, after copying); `tail` counts the bytes ever read and only the reader stores it
//! (release, after copying out). Each side keeps its own counter privately and only reads the
//! other's from the mapping, so a peer that scribbles on the control words can make this side
//! see a count that does not fit the ring, which ends the connection as corrupt input, but can
//! never make it copy outside the ring. Waiting sides set `reader_waiting` or `writer_waiting`,
//! then look at the ring again; the other side looks at the flag after moving its counter.
//! Sequentially consistent fences between the store and the load on both sides mean at least
//! one of them sees the other's store: the sleeper finds the bytes, or gets its doorbell.

#![allow(
    unsafe_code,
    reason = "a mapping shared with the peer process is only reachable through raw pointers"
)]

use std::cell::Cell;
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// Data bytes per direction: as much as the 1 MiB default pack, so a writer never waits for
/// room in the middle of a pack while its reader is busy, and small beside the 32 MiB shared
/// cache. Not tuned: other sizes were not measured.
pub(super) const RING_BYTES: usize = 1 << 20;
/// The control words of a direction, each on its own cache line so that the writer's and the
/// reader's stores do not fight over one line.
const HEAD: usize = 0;
const READER_WAITING: usize = 64;
const TAIL: usize = 128;
const WRITER_WAITING: usize = 192;
const CONTROL_BYTES: usize = 256;
const DIRECTION_BYTES: usize = CONTROL_BYTES + RING_BYTES;
/// The whole mapping: the dialler writes direction 0, the acceptor direction 1.
const MAP_BYTES: usize = 2 * DIRECTION_BYTES;
/// A peer must not be able to shrink the file under the mapping (the next access would raise
/// `SIGBUS`), so the creator seals its size before passing it.
const SEALS: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

/// The handshake's answers: the offer carries the `memfd` or says there is none, the reply
/// says whether it was mapped.
const YES: u8 = 1;
const NO: u8 = 0;

/// The shared memory, mapped read-write for the life of the connection.
struct Mapping {
    base: NonNull<u8>,
}

// SAFETY: the mapping is memory of the process, not of a thread: any thread may reach it
// through the pointer, and `SharedRing` hands out no references into it that could outlive
// a borrow of `self`.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Maps `fd`, after checking that it has exactly the ring's size and can never change it.
    fn new(fd: &OwnedFd) -> io::Result<Self> {
        let seals = rustix::fs::fcntl_get_seals(fd)?;
        if !seals.contains(SEALS) {
            return Err(invalid(
                "the shared ring's memory is not sealed against resizing",
            ));
        }
        let size = rustix::fs::fstat(fd)?.st_size;
        if u64::try_from(size).ok() != Some(MAP_BYTES as u64) {
            return Err(invalid(format!(
                "the shared ring's memory has {size} bytes where {MAP_BYTES} were expected"
            )));
        }
        // SAFETY: a fresh mapping at an address the kernel chooses replaces nothing of ours;
        // the file has exactly `MAP_BYTES` and is sealed against shrinking (checked above), so
        // every page of the mapping stays backed and no access can raise `SIGBUS`.
        let address = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                MAP_BYTES,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )?
        };
        NonNull::new(address.cast())
            .map(|base| Self { base })
            .ok_or_else(|| invalid("mmap returned a null mapping"))
    }

    /// The 8-byte control word at `offset`.
    fn counter(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= MAP_BYTES);
        // SAFETY: `offset` is 8-aligned and inside the mapping (asserted), and the mapping is
        // page-aligned, so the pointer is valid and aligned for an `AtomicU64` for as long as
        // `self` lives. The peer touches these bytes only through atomic operations too.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(offset).cast()) }
    }

    /// The 4-byte control word at `offset`.
    fn flag(&self, offset: usize) -> &AtomicU32 {
        assert!(offset.is_multiple_of(4) && offset + 4 <= MAP_BYTES);
        // SAFETY: as in `counter`, for a 4-aligned word.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(offset).cast()) }
    }

    /// Copies `from` into the mapping at `at`.
    fn copy_in(&self, at: usize, from: &[u8]) {
        assert!(
            at.checked_add(from.len())
                .is_some_and(|end| end <= MAP_BYTES)
        );
        // SAFETY: the destination lies inside the mapping (asserted) and no Rust reference to
        // it exists (the mapping is only ever reached through raw pointers), so nothing this
        // process holds is aliased; `from` is ordinary memory of ours and cannot overlap the
        // mapping. The ring's counters give these bytes to this writer until it publishes them.
        unsafe {
            std::ptr::copy_nonoverlapping(from.as_ptr(), self.base.as_ptr().add(at), from.len());
        }
    }

    /// Copies bytes of the mapping at `at` into `into`.
    fn copy_out(&self, at: usize, into: &mut [u8]) {
        assert!(
            at.checked_add(into.len())
                .is_some_and(|end| end <= MAP_BYTES)
        );
        // SAFETY: the source lies inside the mapping (asserted), `into` is an exclusive borrow
        // of ordinary memory that cannot overlap the mapping. The counters keep the peer from
        // writing these bytes until this reader releases them; a peer that breaks that can
        // only change the bytes received, which the frame checks treat as any corrupt input.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.base.as_ptr().add(at),
                into.as_mut_ptr(),
                into.len(),
            );
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base` is the start of a mapping of `MAP_BYTES` made in `new` and unmapped
        // nowhere else; every borrow handed out by `counter`/`flag` is tied to `self`, so none
        // outlives this.
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), MAP_BYTES) };
    }
}

/// A connected pair of rings and the socket beside them.
pub(super) struct SharedRing {
    socket: UnixStream,
    map: Mapping,
    /// Where the control words of the direction this side writes begin.
    out: usize,
    /// Where the control words of the direction this side reads begin.
    inbound: usize,
    /// Bytes this side has written (its own copy of the outgoing `head`).
    sent: u64,
    /// Bytes this side has read (its own copy of the incoming `tail`).
    received: u64,
    /// The socket has ended: the peer is gone, or cut the connection.
    socket_ended: bool,
    /// `poll` saw the socket readable (a doorbell, or its end) since it was last drained.
    /// Until then an empty ring is only empty, and costs no system call to find out.
    socket_stirred: Cell<bool>,
}

impl std::fmt::Debug for SharedRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRing")
            .field("socket", &self.socket)
            .field("sent", &self.sent)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

/// The dialler's half of the handshake, once both hellos asked for a ring: creates and maps
/// the `memfd` and passes it over `socket`. Gives the socket back when either side cannot map
/// the ring, so the connection carries on as a plain Unix socket.
pub(super) fn offer(socket: UnixStream) -> io::Result<Result<SharedRing, UnixStream>> {
    let created = create();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds;
    let answer = match &created {
        Ok((fd, _)) => {
            fds = [fd.as_fd()];
            if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
                return Err(invalid("no room to pass the shared ring's memory"));
            }
            YES
        }
        Err(e) => {
            tracing::debug!(%e, "no shared-memory ring; a plain Unix socket it is");
            NO
        }
    };
    rustix::net::sendmsg(
        &socket,
        &[IoSlice::new(&[answer])],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    let Ok((_, map)) = created else {
        return Ok(Err(socket));
    };
    let mut reply = [0_u8; 1];
    std::io::Read::read_exact(&mut &socket, &mut reply)?;
    Ok(if reply[0] == YES {
        Ok(SharedRing::new(socket, map, 0))
    } else {
        Err(socket)
    })
}

/// The acceptor's half: receives the dialler's offer, maps it if it can, and answers.
pub(super) fn accept(socket: UnixStream) -> io::Result<Result<SharedRing, UnixStream>> {
    let mut byte = [0_u8; 1];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        &socket,
        &mut [io::IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    if got.bytes == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the peer left during the shared-ring handshake",
        ));
    }
    let mut fds: Vec<OwnedFd> = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(passed) = message {
            fds.extend(passed);
        }
    }
    if byte[0] != YES {
        return Ok(Err(socket));
    }
    let mapped = match fds.as_slice() {
        [fd] => Mapping::new(fd),
        _ => Err(invalid(format!(
            "the shared-ring offer carried {} descriptors where 1 was expected",
            fds.len()
        ))),
    };
    match mapped {
        Ok(map) => {
            std::io::Write::write_all(&mut &socket, &[YES])?;
            Ok(Ok(SharedRing::new(socket, map, 1)))
        }
        Err(e) => {
            tracing::debug!(%e, "could not map the peer's shared-memory ring; a plain Unix socket it is");
            std::io::Write::write_all(&mut &socket, &[NO])?;
            Ok(Err(socket))
        }
    }
}

/// A sealed `memfd` of the ring's size, and its mapping.
fn create() -> io::Result<(OwnedFd, Mapping)> {
    let fd = rustix::fs::memfd_create(
        "lockstep-collective-ring",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    rustix::fs::ftruncate(&fd, MAP_BYTES as u64)?;
    rustix::fs::fcntl_add_seals(&fd, SEALS)?;
    let map = Mapping::new(&fd)?;
    Ok((fd, map))
}

fn invalid(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

impl SharedRing {
    /// `writes` is the direction this side writes: 0 for the dialler, 1 for the acceptor.
    fn new(socket: UnixStream, map: Mapping, writes: usize) -> Self {
        Self {
            socket,
            map,
            out: writes * DIRECTION_BYTES,
            inbound: (1 - writes) * DIRECTION_BYTES,
            sent: 0,
            received: 0,
            socket_ended: false,
            socket_stirred: Cell::new(true),
        }
    }

    pub(super) fn socket(&self) -> &UnixStream {
        &self.socket
    }

    /// Bytes waiting to be read, or an error when the peer's count does not fit the ring.
    fn readable(&self) -> io::Result<usize> {
        let head = self
            .map
            .counter(self.inbound + HEAD)
            .load(Ordering::Acquire);
        let waiting = head.wrapping_sub(self.received);
        usize::try_from(waiting)
            .ok()
            .filter(|&w| w <= RING_BYTES)
            .ok_or_else(|| invalid("the peer's shared-ring write count does not fit the ring"))
    }

    /// Room to write, or an error when the peer's count does not fit the ring.
    fn writable(&self) -> io::Result<usize> {
        let tail = self.map.counter(self.out + TAIL).load(Ordering::Acquire);
        let in_flight = self.sent.wrapping_sub(tail);
        usize::try_from(in_flight)
            .ok()
            .filter(|&f| f <= RING_BYTES)
            .map(|f| RING_BYTES - f)
            .ok_or_else(|| invalid("the peer's shared-ring read count does not fit the ring"))
    }

    /// Wakes the other side if its flag at `offset` says it sleeps.
    fn ring_doorbell(&self, offset: usize) {
        fence(Ordering::SeqCst);
        let flag = self.map.flag(offset);
        if flag.load(Ordering::Relaxed) != 0 && flag.swap(0, Ordering::Relaxed) != 0 {
            // A full socket buffer already holds a doorbell, and a gone peer needs none.
            let _ = rustix::net::send(
                &self.socket,
                &[0],
                SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
            );
        }
    }

    /// Reads what the socket holds (doorbells) without waiting, if `poll` said it holds
    /// anything; notes its end. Returns whether there was anything.
    fn drain_socket(&mut self) -> io::Result<bool> {
        if !self.socket_stirred.replace(false) {
            return Ok(false);
        }
        let mut sink = [0_u8; 64];
        match rustix::net::recv(&self.socket, &mut sink, RecvFlags::DONTWAIT) {
            Ok((0, _)) => {
                self.socket_ended = true;
                Ok(true)
            }
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(true),
            Err(rustix::io::Errno::AGAIN) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Before sleeping in `poll` on the socket: asks the peer for a doorbell when bytes arrive
    /// (`read`) or room frees up (`write`), then returns whether that is already so, in which
    /// case the caller must not sleep.
    pub(super) fn arm(&self, read: bool, write: bool) -> (bool, bool) {
        if read {
            self.map
                .flag(self.inbound + READER_WAITING)
                .store(1, Ordering::Relaxed);
        }
        if write {
            self.map
                .flag(self.out + WRITER_WAITING)
                .store(1, Ordering::Relaxed);
        }
        fence(Ordering::SeqCst);
        // A count that does not fit is "ready" too: the next read or write reports it.
        let can_read = read && ready(&self.readable());
        let can_write = write && self.can_write();
        (can_read, can_write)
    }

    /// After `poll`, which saw the socket readable or not: no doorbells needed until the next
    /// `arm`.
    pub(super) fn disarm(&self, socket_readable: bool) {
        if socket_readable {
            self.socket_stirred.set(true);
        }
        self.map
            .flag(self.inbound + READER_WAITING)
            .store(0, Ordering::Relaxed);
        self.map
            .flag(self.out + WRITER_WAITING)
            .store(0, Ordering::Relaxed);
    }

    /// Whether a write would move bytes (or report an error) now.
    pub(super) fn can_write(&self) -> bool {
        self.socket_ended || self.socket_stirred.get() || ready(&self.writable())
    }

    fn read_ring(&mut self, into: &mut [u8]) -> io::Result<usize> {
        let n = self.readable()?.min(into.len());
        let mut done = 0;
        while done < n {
            let at = (self.received % RING_BYTES as u64) as usize;
            let run = (n - done).min(RING_BYTES - at);
            self.map.copy_out(
                self.inbound + CONTROL_BYTES + at,
                &mut into[done..done + run],
            );
            self.received += run as u64;
            done += run;
        }
        if n > 0 {
            self.map
                .counter(self.inbound + TAIL)
                .store(self.received, Ordering::Release);
            self.ring_doorbell(self.inbound + WRITER_WAITING);
        }
        Ok(n)
    }

    fn write_ring(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut room = self.writable()?;
        let mut done = 0;
        for buf in bufs {
            let mut from: &[u8] = buf;
            while room > 0 && !from.is_empty() {
                let at = (self.sent % RING_BYTES as u64) as usize;
                let run = from.len().min(room).min(RING_BYTES - at);
                self.map
                    .copy_in(self.out + CONTROL_BYTES + at, &from[..run]);
                self.sent += run as u64;
                from = &from[run..];
                room -= run;
                done += run;
            }
        }
        if done > 0 {
            self.map
                .counter(self.out + HEAD)
                .store(self.sent, Ordering::Release);
            self.ring_doorbell(self.out + READER_WAITING);
        }
        Ok(done)
    }
}

/// Whether a count of bytes to move means work now: `Ok(0)` does not; any other count does,
/// and so does an error, which the next read or write reports.
fn ready(count: &io::Result<usize>) -> bool {
    !matches!(count, Ok(0))
}

impl io::Read for SharedRing {
    /// Bytes from the ring; once it is empty, the socket's end is the stream's end.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            let n = self.read_ring(buf)?;
            if n > 0 || self.socket_ended {
                return Ok(n);
            }
            // Bytes written before the peer's socket ended are in the ring by then: look once
            // more after seeing the end.
            if !self.drain_socket()? {
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
    }
}

impl io::Write for SharedRing {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    /// Copies what fits into the ring; a full ring would block, unless the peer is gone.
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        loop {
            if self.socket_ended {
                return Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "the peer closed the connection",
                ));
            }
            let n = self.write_ring(bufs)?;
            if n > 0 || bufs.iter().all(|b| b.is_empty()) {
                return Ok(n);
            }
            // Draining doorbells may have been the reader freeing room: look again.
            if !self.drain_socket()? {
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsFd for SharedRing {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};

    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use proptest::prelude::*;

    use super::*;

    /// A dialler's and an acceptor's ring over one socket pair.
    fn pair() -> (SharedRing, SharedRing) {
        let (a, b) = UnixStream::pair().unwrap();
        std::thread::scope(|s| {
            let acceptor = s.spawn(|| accept(b).unwrap().unwrap());
            let dialler = offer(a).unwrap().unwrap();
            (dialler, acceptor.join().unwrap())
        })
    }

    fn deadline() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    /// Writes all of `bytes` in pieces of the sizes `cuts` cycles through, waiting while full.
    fn write_all(ring: &mut SharedRing, bytes: &[u8], cuts: &[usize]) {
        let (mut at, end) = (0, deadline());
        for &cut in cuts.iter().cycle() {
            if at == bytes.len() {
                return;
            }
            assert!(Instant::now() < end, "the writer stalled at byte {at}");
            match ring.write(&bytes[at..(at + cut).min(bytes.len())]) {
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// Reads `len` bytes in reads of the sizes `cuts` cycles through, waiting while empty.
    fn read_len(ring: &mut SharedRing, len: usize, cuts: &[usize]) -> Vec<u8> {
        let (mut out, end) = (Vec::new(), deadline());
        let mut buffer = vec![0; cuts.iter().copied().max().unwrap_or(1)];
        for &cut in cuts.iter().cycle() {
            if out.len() == len {
                break;
            }
            assert!(
                Instant::now() < end,
                "the reader stalled at byte {}",
                out.len()
            );
            let want = cut.min(len - out.len());
            match ring.read(&mut buffer[..want]) {
                Ok(0) => panic!("the stream ended at byte {}", out.len()),
                Ok(n) => out.extend_from_slice(&buffer[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(12))]

        #[test]
        fn bytes_cut_anywhere_arrive_whole_and_in_order_across_the_wrap(
            len in 0..3 * RING_BYTES,
            seed in any::<u8>(),
            write_cuts in prop::collection::vec(1_usize..400_000, 1..8),
            read_cuts in prop::collection::vec(1_usize..400_000, 1..8),
        ) {
            let (mut dialler, mut acceptor) = pair();
            let bytes: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
            let received = std::thread::scope(|s| {
                let reader = s.spawn(|| read_len(&mut acceptor, len, &read_cuts));
                write_all(&mut dialler, &bytes, &write_cuts);
                reader.join().unwrap()
            });
            prop_assert!(received == bytes, "the bytes differ");
        }
    }

    /// Sends `out` while receiving `len` bytes, as a ring all-reduce's two directions do.
    fn send_and_receive(ring: &mut SharedRing, out: &[u8], len: usize) -> Vec<u8> {
        let (mut sent, mut received, end) = (0, Vec::new(), deadline());
        let mut buffer = vec![0; 70_000];
        while sent < out.len() || received.len() < len {
            assert!(Instant::now() < end, "stalled");
            match ring.write(&out[sent..(sent + 50_000).min(out.len())]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
            let want = buffer.len().min(len - received.len());
            match ring.read(&mut buffer[..want]) {
                Ok(n) => received.extend_from_slice(&buffer[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        received
    }

    #[test]
    fn both_directions_carry_bytes_at_once() {
        let (mut dialler, mut acceptor) = pair();
        let there: Vec<u8> = (0..3 * RING_BYTES).map(|i| i as u8).collect();
        let back: Vec<u8> = there.iter().map(|b| !b).collect();
        std::thread::scope(|s| {
            let far = s.spawn(|| send_and_receive(&mut acceptor, &back, there.len()));
            assert!(send_and_receive(&mut dialler, &there, back.len()) == back);
            assert!(far.join().unwrap() == there);
        });
    }

    #[test]
    fn the_peers_end_is_seen_after_its_last_bytes() {
        let (mut dialler, mut acceptor) = pair();
        write_all(&mut dialler, &[7; 1000], &[1000]);
        drop(dialler);
        // As `poll` would report the hang-up.
        acceptor.disarm(true);
        assert_eq!(read_len(&mut acceptor, 1000, &[4096]), vec![7; 1000]);
        acceptor.disarm(true);
        assert_eq!(acceptor.read(&mut [0; 10]).unwrap(), 0);
    }

    #[test]
    fn a_full_ring_whose_reader_is_gone_fails_the_write() {
        let (mut dialler, acceptor) = pair();
        write_all(&mut dialler, &vec![1; RING_BYTES], &[RING_BYTES]);
        assert_eq!(
            dialler.write(&[1]).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        drop(acceptor);
        dialler.disarm(true);
        assert!(dialler.can_write(), "a write must run to find the end");
        assert_eq!(
            dialler.write(&[1]).unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
    }

    #[test]
    fn a_count_that_does_not_fit_the_ring_is_corrupt_input() {
        let (dialler, mut acceptor) = pair();
        dialler
            .map
            .counter(dialler.out + HEAD)
            .store(RING_BYTES as u64 + 1, Ordering::Release);
        let err = acceptor.read(&mut [0; 10]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert!(err.to_string().contains("does not fit"), "{err}");
    }

    #[test]
    fn a_sleeping_reader_is_woken_by_a_doorbell() {
        let (mut dialler, acceptor) = pair();
        assert_eq!(acceptor.arm(true, false), (false, false));
        write_all(&mut dialler, &[1; 10], &[10]);
        let mut fds = [PollFd::new(acceptor.as_fd(), PollFlags::POLLIN)];
        let woken = poll(&mut fds, PollTimeout::from(5000_u16)).unwrap();
        assert_eq!(woken, 1, "no doorbell came");
        // Without the flag set, no doorbell is sent: writers pay no system call.
        acceptor.disarm(true);
        let mut quiet = acceptor;
        assert_eq!(quiet.read(&mut [0; 10]).unwrap(), 10);
        // The next read finds the ring empty and takes the doorbell out of the socket.
        let drained = quiet.read(&mut [0; 10]).unwrap_err();
        assert_eq!(drained.kind(), io::ErrorKind::WouldBlock);
        write_all(&mut dialler, &[2; 10], &[10]);
        let mut fds = [PollFd::new(quiet.as_fd(), PollFlags::POLLIN)];
        assert_eq!(poll(&mut fds, PollTimeout::ZERO).unwrap(), 0);
    }

    #[test]
    fn memory_that_could_change_size_is_refused() {
        let unsealed = rustix::fs::memfd_create("test", MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&unsealed, MAP_BYTES as u64).unwrap();
        let err = Mapping::new(&unsealed).err().unwrap();
        assert!(err.to_string().contains("not sealed"), "{err}");

        let small = rustix::fs::memfd_create("test", MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&small, 4096).unwrap();
        rustix::fs::fcntl_add_seals(&small, SEALS).unwrap();
        let err = Mapping::new(&small).err().unwrap();
        assert!(err.to_string().contains("4096 bytes"), "{err}");
    }

    #[test]
    fn an_offer_the_acceptor_cannot_map_leaves_a_plain_socket_on_both_sides() {
        let (a, b) = UnixStream::pair().unwrap();
        let unsealed = rustix::fs::memfd_create("test", MemfdFlags::empty()).unwrap();
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        let fds = [unsealed.as_fd()];
        assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
        rustix::net::sendmsg(
            &a,
            &[IoSlice::new(&[YES])],
            &mut control,
            SendFlags::empty(),
        )
        .unwrap();
        let plain = accept(b).unwrap();
        assert!(plain.is_err(), "the acceptor mapped memory it must refuse");
        let mut reply = [9];
        (&a).read_exact(&mut reply).unwrap();
        assert_eq!(reply, [NO]);
    }

    #[test]
    fn an_offer_without_memory_leaves_a_plain_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(&[NO]).unwrap();
        assert!(accept(b).unwrap().is_err());
    }
}
