//! The byte stream under a link: TCP, or to a peer on the same host a Unix-domain socket,
//! whose bytes may go through a shared-memory ring beside it ([`super::shared_ring`]).
//!
//! All carry the same frames; a Unix socket skips the TCP/IP stack, which on loopback costs
//! more than the copies themselves (two processes exchanging in both directions at once moved
//! 2.5× as many bytes over Unix sockets as over TCP on 127.0.0.1, `docs/PERFORMANCE.md`).
//! The Unix sockets live in Linux's abstract namespace, named after the rank's TCP address:
//! no file is left behind, and the name is private to the network namespace, so a peer that
//! shares this task's address but not its network namespace is simply not found there and
//! gets TCP. Any local user can bind an abstract name first, so both ends check the other's
//! credentials (`SO_PEERCRED`): a socket held by another user is refused, with a warning, and
//! the pair talks over TCP, where the handshake decides.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

use nix::libc;
use nix::poll::PollFlags;
use nix::sys::socket::setsockopt;
use nix::{getsockopt_impl, setsockopt_impl, sockopt_impl};

use super::shared_ring::SharedRing;
use crate::handshake::SocketTimeouts;

/// The send and receive buffer asked for a Unix socket; Linux doubles it for bookkeeping, so
/// 1 MiB of data fits: one pack of the default `bytes_per_pack`. Measured beside the default
/// and 2 and 4 MiB (`cargo xtask bench allreduce`, 16–256 MiB): larger buffers kept more bytes
/// in flight than the caches hold and were slower on 4 ranks sharing 2 cores.
const UNIX_BUFFER: usize = 512 * 1024;

// `SO_RCVLOWAT`, which nix does not name: how many bytes a TCP socket must hold before `poll`
// reports it readable (a read without waiting takes what there is either way).
sockopt_impl!(RcvLowat, Both, libc::SOL_SOCKET, libc::SO_RCVLOWAT, usize);

/// How a rank reaches the peers that its cluster spec places on its own host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SameHost {
    /// A shared-memory ring per pair, beside a Unix-domain socket that wakes sleepers and
    /// tells when a peer is gone; a plain Unix socket where the ring cannot be mapped, and TCP
    /// where the peer offers no Unix socket.
    #[default]
    SharedMemory,
    /// A Unix-domain socket where the peer offers one (falling back to TCP).
    UnixSocket,
    /// TCP like every other peer.
    Tcp,
}

/// A connected stream of any kind.
#[derive(Debug)]
pub(super) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    Shared(SharedRing),
}

impl SocketTimeouts for Stream {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        Stream::set_read_timeout(self, timeout)
    }

    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        Stream::set_write_timeout(self, timeout)
    }
}

impl Stream {
    /// `tcp`, `unix` or `shm`, for logs and the benchmark's settings line.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Self::Tcp(_) => "tcp",
            Self::Unix(_) => "unix",
            Self::Shared(_) => "shm",
        }
    }

    pub(super) fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        match self {
            Self::Tcp(s) => s.set_nonblocking(nonblocking),
            Self::Unix(s) => s.set_nonblocking(nonblocking),
            Self::Shared(s) => s.socket().set_nonblocking(nonblocking),
        }
    }

    pub(super) fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Self::Tcp(s) => s.set_read_timeout(timeout),
            Self::Unix(s) => s.set_read_timeout(timeout),
            Self::Shared(s) => s.socket().set_read_timeout(timeout),
        }
    }

    pub(super) fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Self::Tcp(s) => s.set_write_timeout(timeout),
            Self::Unix(s) => s.set_write_timeout(timeout),
            Self::Shared(s) => s.socket().set_write_timeout(timeout),
        }
    }

    /// What `poll` must watch on the socket to learn that this stream can be read (`read`) or
    /// written (`write`). A ring's socket only ever becomes readable: with a doorbell, or at
    /// the peer's end.
    pub(super) fn poll_events(&self, read: bool, write: bool) -> PollFlags {
        let mut events = PollFlags::empty();
        match self {
            Self::Shared(_) => {
                if read || write {
                    events |= PollFlags::POLLIN;
                }
            }
            Self::Tcp(_) | Self::Unix(_) => {
                if read {
                    events |= PollFlags::POLLIN;
                }
                if write {
                    events |= PollFlags::POLLOUT;
                }
            }
        }
        events
    }

    /// Before sleeping in `poll`: a ring asks its peer for doorbells and says whether it can
    /// be read or written already (then the caller must not sleep). Sockets need nothing.
    pub(super) fn arm(&self, read: bool, write: bool) -> (bool, bool) {
        match self {
            Self::Shared(s) => s.arm(read, write),
            Self::Tcp(_) | Self::Unix(_) => (false, false),
        }
    }

    /// After `poll`: whether a write can move bytes now, given what `poll` said of the socket
    /// (`readable`, `writable`). For a ring, the ring says; its doorbells are turned off again.
    pub(super) fn disarm(&self, readable: bool, writable: bool) -> bool {
        match self {
            Self::Shared(s) => {
                s.disarm(readable);
                s.can_write()
            }
            Self::Tcp(_) | Self::Unix(_) => writable,
        }
    }

    /// Readies a connected stream for frames: small frames leave at once (Nagle's algorithm
    /// would hold a header back), and a Unix socket gets buffers that hold one default pack
    /// (its 208 KiB default made writers stop every fifth of a pack; TCP tunes its own).
    pub(super) fn tune(&self) -> io::Result<()> {
        match self {
            Self::Tcp(s) => s.set_nodelay(true),
            // The socket beside a ring carries one-byte doorbells only.
            Self::Shared(_) => Ok(()),
            Self::Unix(s) => {
                use nix::sys::socket::{setsockopt, sockopt};
                setsockopt(s, sockopt::SndBuf, &UNIX_BUFFER)?;
                setsockopt(s, sockopt::RcvBuf, &UNIX_BUFFER)?;
                Ok(())
            }
        }
    }

    /// Has `poll` report a TCP stream readable only once `bytes` (at least one) are waiting in
    /// its socket, or it has ended; other streams report any byte. Linux wakes a reader early
    /// where the socket's buffer could not hold that many, so no wait outlasts what the socket
    /// can take. Returns whether the socket took it (never for other streams).
    pub(super) fn wake_reader_at(&self, bytes: usize) -> bool {
        match self {
            Self::Tcp(s) => setsockopt(s, RcvLowat, &bytes.max(1)).is_ok(),
            Self::Unix(_) | Self::Shared(_) => false,
        }
    }

    pub(super) fn is_tcp(&self) -> bool {
        matches!(self, Self::Tcp(_))
    }

    pub(super) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Self::Tcp(s) => s.shutdown(how),
            Self::Unix(s) => s.shutdown(how),
            Self::Shared(s) => s.socket().shutdown(how),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.read(buf),
            Self::Unix(s) => s.read(buf),
            Self::Shared(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.write(buf),
            Self::Unix(s) => s.write(buf),
            Self::Shared(s) => s.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.write_vectored(bufs),
            Self::Unix(s) => s.write_vectored(bufs),
            Self::Shared(s) => s.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Self::Tcp(s) => s.as_fd(),
            Self::Unix(s) => s.as_fd(),
            Self::Shared(s) => s.as_fd(),
        }
    }
}

/// Where a rank accepts its lower-ranked peers: its TCP address, and the abstract Unix
/// socket named after it when one could be bound.
pub(super) struct Listeners {
    pub(super) tcp: TcpListener,
    pub(super) unix: Option<UnixListener>,
}

impl Listeners {
    /// Non-blocking listeners on `tcp` (bound already) and, unless [`SameHost::Tcp`], the
    /// Unix socket for `address`. A Unix name already taken (another process bound this
    /// TCP address earlier with `SO_REUSEPORT`, say) only means no Unix socket.
    pub(super) fn new(tcp: TcpListener, address: &str, same_host: SameHost) -> io::Result<Self> {
        tcp.set_nonblocking(true)?;
        let unix = match same_host {
            SameHost::Tcp => None,
            SameHost::SharedMemory | SameHost::UnixSocket => match bind_unix(address) {
                Ok(listener) => {
                    listener.set_nonblocking(true)?;
                    Some(listener)
                }
                Err(e) => {
                    // Taken by an earlier process on this address (`SO_REUSEPORT`), or by
                    // someone else: peers that dial it will find out whose it is.
                    tracing::warn!(address, name = unix_name(address), %e, "no Unix socket for same-host peers; TCP only");
                    None
                }
            },
        };
        Ok(Self { tcp, unix })
    }

    /// A connection waiting on either listener, with where it came from.
    pub(super) fn accept(&self) -> io::Result<Option<(Stream, String)>> {
        if let Some(unix) = &self.unix {
            match unix.accept() {
                Ok((stream, _)) => match same_user(&stream) {
                    Ok(()) => return Ok(Some((Stream::Unix(stream), "unix".into()))),
                    Err(e) => tracing::warn!(%e, "refused a Unix-socket connection"),
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        match self.tcp.accept() {
            Ok((stream, from)) => Ok(Some((Stream::Tcp(stream), from.to_string()))),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The abstract socket name of the rank listening on TCP `address`.
fn unix_name(address: &str) -> String {
    format!("lockstep-collective/{address}")
}

#[cfg(target_os = "linux")]
fn bind_unix(address: &str) -> io::Result<UnixListener> {
    use std::os::linux::net::SocketAddrExt;
    let name = std::os::unix::net::SocketAddr::from_abstract_name(unix_name(address))?;
    UnixListener::bind_addr(&name)
}

#[cfg(not(target_os = "linux"))]
fn bind_unix(_address: &str) -> io::Result<UnixListener> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "abstract Unix sockets are Linux-only",
    ))
}

/// Connects to the Unix socket of the rank listening on TCP `address`, if it offers one and
/// it belongs to this user (a socket of another user's is refused with a warning: the name is
/// anyone's to take).
#[cfg(target_os = "linux")]
pub(super) fn connect_unix(address: &str) -> io::Result<UnixStream> {
    use std::os::linux::net::SocketAddrExt;
    let name = std::os::unix::net::SocketAddr::from_abstract_name(unix_name(address))?;
    let stream = UnixStream::connect_addr(&name)?;
    if let Err(e) = same_user(&stream) {
        tracing::warn!(address, name = unix_name(address), %e, "refused the Unix socket of a same-host peer; TCP instead");
        return Err(e);
    }
    Ok(stream)
}

/// `Ok` when the process at the other end of `stream` runs as this process's user.
#[cfg(target_os = "linux")]
fn same_user(stream: &UnixStream) -> io::Result<()> {
    use nix::sys::socket::{getsockopt, sockopt};
    let peer = getsockopt(stream, sockopt::PeerCredentials)?;
    let me = nix::unistd::geteuid().as_raw();
    if peer.uid() == me {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the socket's other end is process {} of uid {}, not this user's (uid {me})",
                peer.pid(),
                peer.uid()
            ),
        ))
    }
}

#[cfg(not(target_os = "linux"))]
fn same_user(_stream: &UnixStream) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "peer credentials are read on Linux only",
    ))
}

#[cfg(not(target_os = "linux"))]
pub(super) fn connect_unix(_address: &str) -> io::Result<UnixStream> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "abstract Unix sockets are Linux-only",
    ))
}
