//! What bounds a handshake on a new connection, for the collectives' rendezvous and for the
//! services beside them (a parameter server's, a worker's step service): one deadline for all
//! of its reads and writes ([`ByDeadline`]), and a cap on the handshakes an accepting end runs
//! at once ([`HandshakeSlots`]). A peer that sends its bytes one at a time, or never, then
//! holds one place, for one deadline, and nothing else.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Handshakes an accepting end runs at once; connections beyond are closed at once.
pub const MAX_HANDSHAKES: usize = 64;

/// A socket whose blocking reads and writes can be given a timeout.
pub trait SocketTimeouts {
    /// As [`TcpStream::set_read_timeout`].
    ///
    /// # Errors
    ///
    /// The system's refusal.
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;

    /// As [`TcpStream::set_write_timeout`].
    ///
    /// # Errors
    ///
    /// The system's refusal.
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
}

impl SocketTimeouts for TcpStream {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        TcpStream::set_read_timeout(self, timeout)
    }

    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        TcpStream::set_write_timeout(self, timeout)
    }
}

impl SocketTimeouts for UnixStream {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        UnixStream::set_read_timeout(self, timeout)
    }

    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        UnixStream::set_write_timeout(self, timeout)
    }
}

/// A stream whose reads and writes all end by one deadline: each is given the time left (a
/// timeout per read alone would let a peer feeding a byte at a time hold it for ever). Past
/// the deadline they fail with [`io::ErrorKind::TimedOut`], saying so. The socket keeps the
/// last timeout set: the caller sets its own once the handshake is over.
pub struct ByDeadline<'a, S> {
    stream: &'a mut S,
    deadline: Instant,
}

impl<'a, S: SocketTimeouts> ByDeadline<'a, S> {
    /// `stream`'s reads and writes, each ending by `deadline`.
    pub fn new(stream: &'a mut S, deadline: Instant) -> Self {
        Self { stream, deadline }
    }

    /// Fills `buf`, as [`Read::read_exact`], saying so when the peer closes the connection
    /// first.
    ///
    /// # Errors
    ///
    /// The deadline passed, the peer closed the connection, or the socket failed.
    pub fn fill(&mut self, buf: &mut [u8]) -> io::Result<()>
    where
        S: Read,
    {
        self.read_exact(buf).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection during the handshake",
                )
            } else {
                e
            }
        })
    }

    fn left(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(past_deadline())
        } else {
            Ok(left)
        }
    }
}

/// The error of a handshake that ran past its deadline.
fn past_deadline() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "the handshake ran past its deadline",
    )
}

/// A socket's timeout (`WouldBlock` on Unix) said as the deadline it is.
fn in_time<T>(result: io::Result<T>) -> io::Result<T> {
    result.map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => past_deadline(),
        _ => e,
    })
}

impl<S: SocketTimeouts + Read> Read for ByDeadline<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.stream.set_read_timeout(Some(left))?;
        in_time(self.stream.read(buf))
    }
}

impl<S: SocketTimeouts + Write> Write for ByDeadline<'_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.stream.set_write_timeout(Some(left))?;
        in_time(self.stream.write(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

/// The places of an accepting end's handshakes under way, [`MAX_HANDSHAKES`] of them; a
/// clone shares them.
#[derive(Debug, Clone, Default)]
pub struct HandshakeSlots {
    in_flight: Arc<AtomicUsize>,
}

impl HandshakeSlots {
    /// A free place for one handshake, held until the [`HandshakeSlot`] is dropped; `None`
    /// when all are taken.
    pub fn take(&self) -> Option<HandshakeSlot> {
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_HANDSHAKES).then_some(n + 1)
            })
            .ok()
            .map(|_| HandshakeSlot(Arc::clone(&self.in_flight)))
    }

    /// The places taken now.
    pub fn taken(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }
}

/// One of the [`HandshakeSlots`], given back when dropped (a panicking handshake's included).
#[derive(Debug)]
pub struct HandshakeSlot(Arc<AtomicUsize>);

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        reason = "a test that meets an error must fail loudly"
    )]

    use std::net::TcpListener;

    use super::*;

    #[test]
    fn a_peer_feeding_bytes_one_at_a_time_is_cut_off_at_the_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        // Every byte well within any one read's timeout: only the deadline ends it.
        let peer = std::thread::spawn(move || {
            let mut stream = TcpStream::connect(address).unwrap();
            for _ in 0..200 {
                if stream.write_all(&[0]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let (mut stream, _) = listener.accept().unwrap();
        let deadline = Instant::now() + Duration::from_millis(300);
        let e = ByDeadline::new(&mut stream, deadline)
            .fill(&mut [0; 64])
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(e.to_string().contains("deadline"), "{e}");
        // Cut off while the peer still feeds its bytes (4 s of them), not when it stopped.
        assert!(!peer.is_finished(), "the read outlasted the peer");
        drop(stream);
        peer.join().unwrap();
    }

    #[test]
    fn a_peer_that_closes_early_is_named_as_closing() {
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        let mut writer = theirs.try_clone().unwrap();
        writer.write_all(&[1, 2]).unwrap();
        drop((writer, theirs));
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut bounded = ByDeadline::new(&mut ours, deadline);
        let e = bounded.fill(&mut [0; 4]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(e.to_string().contains("closed the connection"), "{e}");
    }

    #[test]
    fn places_past_the_limit_are_refused_until_one_is_given_back() {
        let slots = HandshakeSlots::default();
        let held: Vec<HandshakeSlot> = (0..MAX_HANDSHAKES).map(|_| slots.take().unwrap()).collect();
        assert!(slots.take().is_none());
        assert_eq!(slots.clone().taken(), MAX_HANDSHAKES);
        drop(held);
        assert_eq!(slots.taken(), 0);
        assert!(slots.take().is_some());
    }
}
