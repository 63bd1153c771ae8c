//! Ranks in separate processes or hosts, connected by plain TCP: one connection per pair and
//! a handshake that checks the cluster identity. There are no helper threads: the calling
//! thread reads and writes every socket itself (non-blocking, waiting in `poll(2)`), so a
//! message costs no thread hand-off on either side, and while a write waits for room it keeps
//! reading, so two ranks sending to each other never block each other.

mod link;
mod rendezvous;
mod shared_ring;
mod stream;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::num::NonZeroUsize;
use std::os::fd::AsFd;
use std::thread;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use lockstep_cluster::{Address, Host};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use self::link::{Arrived, Link, MAX_PAYLOAD, Placing, Progress};
use self::rendezvous::{Hello, accept_lower, dial};
pub use self::stream::SameHost;
use self::stream::{Listeners, Stream};
use super::{Arrival, Completion, Flow, Transport};
use crate::error::CollectiveError;
use crate::header::{HEADER_LEN, Header, Kind, Message};
use crate::secret::ClusterSecret;

/// How long a wait checks its connections in a loop before sleeping in `poll`: a wake-up from
/// `poll` costs tens of microseconds on a VM, a round trip on loopback less, and a 1 MiB pack
/// through a shared-memory ring a few hundred (2 ranks, 16–256 MiB: 2.2–2.8 GB/s busbw with
/// 50 µs, 2.6–5.1 with 500 µs). With a core per rank nobody else wants the core meanwhile;
/// when ranks outnumber cores the loop yields it.
const SPIN: Duration = Duration::from_micros(500);

/// The longest a wait sleeps for a whole frame ([`TcpTransport::wait`]) before it looks again,
/// should the kernel not wake it: a bound on a missed wake-up's cost, not a timeout.
const WHOLE_FRAME_NAP: u16 = 20;

/// How a TCP group forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpOptions {
    /// Every member must present the same identity; others are refused. It tells clusters
    /// apart (by default a checksum of the addresses, which anyone can compute): a guard
    /// against mistakes, not a credential.
    pub cluster: u64,
    /// How long to keep trying to reach all peers at start-up.
    pub rendezvous_timeout: Duration,
    /// How to reach peers whose address names this task's host.
    pub same_host: SameHost,
    /// The interface to listen on, with the port of this rank's address. `None` (the
    /// default) listens on all interfaces, as TensorFlow's servers do: the host named in a
    /// cluster spec is how *peers* reach this task (on Kubernetes a service name), and need
    /// not name an interface of this machine.
    pub bind: Option<IpAddr>,
    /// The secret every connection proves it holds, both ways, in its handshake
    /// ([`crate::ClusterSecret`]); `None` proves nothing, and a peer with a secret refuses a
    /// peer without one. [`crate::Communicator::from_cluster_with`] takes it from the
    /// environment when this is `None`.
    pub secret: Option<ClusterSecret>,
}

impl Default for TcpOptions {
    fn default() -> Self {
        Self {
            cluster: 0,
            rendezvous_timeout: Duration::from_mins(1),
            same_host: SameHost::default(),
            bind: None,
            secret: None,
        }
    }
}

/// One rank of a group connected over TCP.
///
/// Rank `i` listens on the port of `addresses[i]` (on all interfaces unless
/// [`TcpOptions::bind`] names one), dials every higher rank by its address (names are looked
/// up again on every try, so a DNS record that appears late is found) and accepts every lower one.
/// Dialling retries with backoff until the rendezvous deadline, so processes may start in any
/// order. A connection that does not present this group's cluster identity, a valid rank and
/// the right world size, or that does not prove it holds the cluster secret
/// ([`TcpOptions::secret`]), is closed and ignored. The identity is not a secret: whoever can
/// reach a task's port can present it; without a secret, whoever can reach a port can take a
/// rank's place. A peer whose address names this rank's own host
/// is reached through a shared-memory ring beside a Unix-domain socket, or over the socket
/// alone, when it offers them ([`SameHost`]), else over TCP.
pub struct TcpTransport {
    rank: usize,
    cluster: u64,
    addresses: Vec<String>,
    links: Vec<Option<Link>>,
    spin: Duration,
    /// Whether waits spin now, or leave the core to other work ([`Transport::set_spinning`]):
    /// yielding it between checks, or, on TCP, sleeping until the frame read is whole.
    spinning: bool,
    /// More ranks than cores on this host: spinning must yield, or it steals a peer's core.
    oversubscribed: bool,
}

/// The choices a [`TcpTransport`] made, for benchmarks and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpSettings {
    /// Per rank, the kind of stream to it (`tcp` or `unix`); `None` for this rank.
    pub wires: Vec<Option<&'static str>>,
    /// More ranks of the group on this host than it has cores.
    pub oversubscribed: bool,
    /// Packs that sending may run ahead of receiving; `None` for as many as the sockets take.
    pub send_ahead: Option<usize>,
    /// How long a wait spins before sleeping in `poll`.
    pub spin: Duration,
    /// The kernel's send buffer of the first connection, in bytes (`SO_SNDBUF`).
    pub send_buffer: Option<usize>,
    /// The kernel's receive buffer of the first connection, in bytes (`SO_RCVBUF`).
    pub receive_buffer: Option<usize>,
}

impl fmt::Display for TcpSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let wires: Vec<&str> = self.wires.iter().map(|w| w.unwrap_or("self")).collect();
        let bytes = |b: Option<usize>| b.map_or("?".to_owned(), |b| b.to_string());
        write!(
            f,
            "wires={} oversubscribed={} send_ahead={} spin_us={} sndbuf={} rcvbuf={} cores={}",
            wires.join(","),
            self.oversubscribed,
            self.send_ahead
                .map_or("unbounded".to_owned(), |a| a.to_string()),
            self.spin.as_micros(),
            bytes(self.send_buffer),
            bytes(self.receive_buffer),
            thread::available_parallelism().map_or(1, NonZeroUsize::get),
        )
    }
}

fn setup(what: impl std::fmt::Display) -> CollectiveError {
    CollectiveError::Setup(what.to_string())
}

/// `addresses[rank]`, or an error when `rank` is not below the world size.
pub(crate) fn own_address(rank: usize, addresses: &[String]) -> Result<&str, CollectiveError> {
    addresses.get(rank).map(String::as_str).ok_or_else(|| {
        setup(format!(
            "rank {rank} is not below the world size {}",
            addresses.len()
        ))
    })
}

/// Binds the port of `addresses[rank]` on `bind`, or on all interfaces (of the address's
/// family) when `bind` is `None`, for a rank's listener.
pub(crate) fn bind_own(
    rank: usize,
    addresses: &[String],
    bind: Option<IpAddr>,
) -> Result<TcpListener, CollectiveError> {
    bind_address(own_address(rank, addresses)?, bind)
}

/// A listener on the port of `address` (`host:port`), on the interface `bind` or on every
/// interface of the address's family.
pub(crate) fn bind_address(
    address: &str,
    bind: Option<IpAddr>,
) -> Result<TcpListener, CollectiveError> {
    let parsed: Address = address
        .parse()
        .map_err(|e| setup(format!("this rank's address {address:?}: {e}")))?;
    let ip = bind.unwrap_or(match parsed.host() {
        Host::Ipv6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        _ => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    });
    let local = SocketAddr::new(ip, parsed.port());
    let listener = TcpListener::bind(local).map_err(|e| {
        setup(format!(
            "listening on {local} for this rank's address {address}: {e}"
        ))
    })?;
    tracing::debug!(%local, address, "listening");
    Ok(listener)
}

impl TcpTransport {
    /// Forms the group: listens on the port of `addresses[rank]` (on the interface of
    /// [`TcpOptions::bind`]), connects to every other rank, and checks
    /// every peer's identity.
    ///
    /// # Errors
    ///
    /// [`CollectiveError::Setup`] when the address cannot be bound or some rank is not
    /// reached before the rendezvous deadline (the error names the missing ranks).
    pub fn connect(
        rank: usize,
        addresses: &[String],
        options: &TcpOptions,
    ) -> Result<Self, CollectiveError> {
        Self::connect_on(
            bind_own(rank, addresses, options.bind)?,
            rank,
            addresses,
            options,
        )
    }

    /// As [`TcpTransport::connect`], accepting on `listener`, bound already (by a launcher
    /// that handed it over, or a test that must not free a port before using it).
    ///
    /// # Errors
    ///
    /// As [`TcpTransport::connect`].
    pub fn connect_on(
        listener: TcpListener,
        rank: usize,
        addresses: &[String],
        options: &TcpOptions,
    ) -> Result<Self, CollectiveError> {
        own_address(rank, addresses)?;
        let world = addresses.len();
        let deadline = Instant::now() + options.rendezvous_timeout;
        let listeners =
            Listeners::new(listener, &addresses[rank], options.same_host).map_err(setup)?;
        let mut streams: Vec<Option<Stream>> = (0..world).map(|_| None).collect();

        let me = Hello {
            cluster: options.cluster,
            rank,
            world,
            flags: 0,
        };
        // Dial every higher rank at once while accepting the lower ones, so a rank that never
        // comes is named by every rank that waits for it, not hidden behind the first peer in
        // line that is itself still waiting for it.
        let (accepted, dialled) = thread::scope(|scope| {
            let dials: Vec<_> = addresses
                .iter()
                .enumerate()
                .skip(rank + 1)
                .map(|(peer, address)| {
                    let unix_first =
                        options.same_host != SameHost::Tcp && same_host(address, &addresses[rank]);
                    let ring = options.same_host == SameHost::SharedMemory;
                    let secret = options.secret.as_ref();
                    let handle = scope.spawn(move || {
                        dial(address, peer, me, (unix_first, ring), secret, deadline)
                    });
                    (peer, handle)
                })
                .collect();
            let accepted = accept_lower(&listeners, me, addresses, options, deadline);
            let dialled: Vec<(usize, Result<Stream, CollectiveError>)> = dials
                .into_iter()
                .map(|(peer, handle)| {
                    let stream = handle
                        .join()
                        .unwrap_or_else(|_| Err(setup(format!("dialling rank {peer} panicked"))));
                    (peer, stream)
                })
                .collect();
            (accepted, dialled)
        });
        let mut failures = Vec::new();
        match accepted {
            Ok(lower) => {
                for (peer, stream) in lower.into_iter().enumerate() {
                    streams[peer] = stream;
                }
            }
            Err(e) => failures.push(e.to_string()),
        }
        for (peer, stream) in dialled {
            match stream {
                Ok(stream) => streams[peer] = Some(stream),
                Err(e) => failures.push(e.to_string()),
            }
        }
        if !failures.is_empty() {
            return Err(setup(
                failures
                    .iter()
                    .map(|f| f.strip_prefix("setting up the transport: ").unwrap_or(f))
                    .collect::<Vec<_>>()
                    .join("; "),
            ));
        }

        let mut links = Vec::with_capacity(world);
        for stream in streams {
            links.push(match stream {
                Some(stream) => {
                    stream.set_read_timeout(None).map_err(setup)?;
                    Some(Link::new(stream).map_err(setup)?)
                }
                None => None,
            });
        }
        Ok(Self {
            rank,
            cluster: options.cluster,
            spin: SPIN,
            spinning: true,
            oversubscribed: oversubscribed(addresses, rank),
            addresses: addresses.to_vec(),
            links,
        })
    }

    /// How many packs sending may run ahead of receiving (`None`: as far as the sockets
    /// take). With a core per rank, pack for pack keeps the bytes in flight few enough to stay
    /// in cache (2 ranks on 2 cores: ~2× the bandwidth of unbounded); when ranks share cores,
    /// each turn on a core should move as much as the sockets hold (4 ranks on 2 cores: ~1.4×).
    fn send_ahead(&self) -> Option<usize> {
        (!self.oversubscribed).then_some(0)
    }

    /// What this rank chose for its connections, as `cargo xtask bench allreduce` prints it.
    pub fn settings(&self) -> TcpSettings {
        let buffer = |option: fn(&Stream) -> nix::Result<usize>| {
            self.links
                .iter()
                .flatten()
                .next()
                .and_then(|link| option(link.stream()).ok())
        };
        TcpSettings {
            wires: self
                .links
                .iter()
                .map(|link| link.as_ref().map(|l| l.stream().kind()))
                .collect(),
            oversubscribed: self.oversubscribed,
            send_ahead: self.send_ahead(),
            spin: self.spin,
            send_buffer: buffer(|s| {
                nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::SndBuf)
            }),
            receive_buffer: buffer(|s| {
                nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::RcvBuf)
            }),
        }
    }

    /// A group of one (a local run): no sockets at all.
    pub fn single() -> Self {
        Self {
            rank: 0,
            cluster: 0,
            addresses: vec!["local".into()],
            links: vec![None],
            spin: Duration::ZERO,
            spinning: true,
            oversubscribed: false,
        }
    }
}

/// Whether two addresses name the same host, by the rule of
/// `lockstep_cluster::Cluster::group_tasks_on_this_host`: hosts compare as parsed (`[::1]` and
/// `[0::1]` are one host, names ignore case), but `localhost` and `127.0.0.1` are two.
/// Addresses that do not parse never share a host.
fn same_host(a: &str, b: &str) -> bool {
    match (a.parse::<Address>(), b.parse::<Address>()) {
        (Ok(a), Ok(b)) => a.host() == b.host(),
        _ => false,
    }
}

/// Whether this rank's host runs more ranks of the group than it has cores.
fn oversubscribed(addresses: &[String], rank: usize) -> bool {
    let colocated = addresses
        .iter()
        .filter(|a| same_host(a, &addresses[rank]))
        .count();
    colocated > thread::available_parallelism().map_or(1, NonZeroUsize::get)
}

impl TcpTransport {
    /// The abort of a peer other than `from` (whose messages the running flow reads itself),
    /// taken out of what has arrived from it, if any. The abort of a peer that timed out is
    /// left where it is: this rank, still within its deadline, names what it waits for itself.
    fn abort_from_others(&mut self, from: usize) -> Option<CollectiveError> {
        self.links
            .iter_mut()
            .enumerate()
            .filter(|&(peer, _)| peer != from)
            .find_map(|(_, link)| {
                let ready = &mut link.as_mut()?.ready;
                let at = ready.iter().position(|arrived| {
                    matches!(arrived, Arrived::Message(m)
                        if m.header.kind == Kind::Abort && !crate::session::is_abort_of_a_timeout(m))
                })?;
                match ready.remove(at)? {
                    Arrived::Message(message) => crate::session::abort_in(&message),
                    Arrived::Placed(_) => None,
                }
            })
    }

    fn lost(&self, peer: usize, reason: String) -> CollectiveError {
        CollectiveError::PeerLost {
            rank: peer,
            address: self.addresses[peer].clone(),
            reason,
        }
    }

    fn link(&mut self, peer: usize) -> Result<&mut Link, CollectiveError> {
        match self.links.get_mut(peer) {
            Some(Some(link)) => Ok(link),
            _ => Err(CollectiveError::PeerLost {
                rank: peer,
                address: self.addresses.get(peer).cloned().unwrap_or_default(),
                reason: "no connection to this rank".into(),
            }),
        }
    }

    /// Writes what `peer`'s socket takes of `frame` (whose payload is `payload`) now.
    fn write(
        &mut self,
        peer: usize,
        frame: &mut Frame,
        payload: &[u8],
    ) -> Result<Progress, CollectiveError> {
        let link = self.link(peer)?;
        match link.write_step(&frame.head, payload, frame.written) {
            Ok((written, progress)) => {
                frame.written = written;
                Ok(progress)
            }
            Err(e) => {
                link.cut(e.to_string());
                Err(self.lost(peer, e.to_string()))
            }
        }
    }

    /// Gives up on `frame`: when part of it is out, the connection is cut, since half a frame
    /// followed by the next would be misread as data.
    fn abandon(&mut self, peer: usize, frame: &Frame) {
        if frame.written > 0
            && let Some(Some(link)) = self.links.get_mut(peer)
        {
            link.cut("a send was abandoned part-way through a message".into());
        }
    }

    /// Ends an exchange early: a message part-way out is abandoned, and one part-way into the
    /// flow's buffer cuts its connection (the rest of it has nowhere to go).
    fn give_up(&mut self, to: usize, from: usize, sending: Option<&Frame>) {
        if let Some(frame) = sending {
            self.abandon(to, frame);
        }
        if let Some(Some(link)) = self.links.get_mut(from)
            && link.is_placing()
        {
            link.cut("a receive was abandoned part-way through a message".into());
        }
    }

    /// Waits when nothing could move: checks again in a loop for [`SPIN`] after the last
    /// progress (yielding the core when ranks outnumber cores or waits may not spin), then
    /// sleeps in [`TcpTransport::wait`]. A wait that may not spin on TCP connections alone
    /// sleeps at once: `poll` then wakes it once the frame it reads has arrived whole, where
    /// yielding would leave the frame in the socket until the scheduler next gave it the
    /// core (at 1 Gbit/s, a 256 KiB piece's collective took 3.4–4.0 ms of a backward pass
    /// instead of 2.1). Returns `None` once `deadline` has passed, else whether `writer` may
    /// take more bytes (always worth a try while spinning).
    fn idle(
        &mut self,
        idle_since: &mut Option<Instant>,
        writer: Option<usize>,
        reader: Option<usize>,
        deadline: Instant,
    ) -> Option<bool> {
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        let sleep_at_once = !self.spinning && self.tcp_only(writer, reader);
        if !sleep_at_once && now.duration_since(*idle_since.get_or_insert(now)) < self.spin {
            if self.oversubscribed || !self.spinning {
                thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            return Some(true);
        }
        self.wait(writer, reader, deadline)
    }

    /// Whether a wait names `writer` or `reader` and their connections (those named) are TCP.
    fn tcp_only(&self, writer: Option<usize>, reader: Option<usize>) -> bool {
        (writer.is_some() || reader.is_some())
            && [writer, reader].into_iter().flatten().all(
                |peer| matches!(self.links.get(peer), Some(Some(link)) if link.stream().is_tcp()),
            )
    }

    /// Sleeps in `poll` until some connection has bytes to read (every such connection but
    /// `reader`'s, which the caller reads itself, is drained into its queue), `writer`'s
    /// connection has room, or `deadline` passes. Returns `None` in the last case, else
    /// whether `writer` can take more bytes.
    ///
    /// While waits may not spin, `reader`'s connection wakes it only once the rest of the
    /// frame it is reading is in the socket (`SO_RCVLOWAT`), not at each segment: a 128 KiB
    /// frame is some ninety segments at an MTU of 1500, and each wake-up takes the core from
    /// the backward pass the wait runs beside. Measured at 1 Gbit/s, the tutorial's literal
    /// model kept its speed on 0.45 cores instead of 1.5 (docs/PERFORMANCE.md).
    fn wait(
        &mut self,
        writer: Option<usize>,
        reader: Option<usize>,
        deadline: Instant,
    ) -> Option<bool> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        // Whole milliseconds, rounded up so a wait never ends just short of the deadline;
        // capped, since the callers loop anyway.
        let millis = u16::try_from(left.as_micros().div_ceil(1000)).unwrap_or(u16::MAX);
        let mut watched = Vec::with_capacity(self.links.len());
        let mut fds = Vec::with_capacity(self.links.len());
        // A ring that can move bytes already (it is checked after asking for doorbells, so
        // none can be missed) means polling without sleeping.
        let mut ready_now = false;
        let mut whole_frame = false;
        let spinning = self.spinning;
        for (peer, link) in self.links.iter_mut().enumerate() {
            let Some(link) = link else { continue };
            let bytes = match reader {
                Some(reader) if reader == peer && !spinning => link.frame_bytes_in_socket(),
                _ => 1,
            };
            // Where the socket still asks for more than a byte (it refused to go back to
            // one), the nap below bounds the wait as well.
            whole_frame |= link.wake_reader_at(bytes) > 1;
        }
        for (peer, link) in self.links.iter().enumerate() {
            let Some(link) = link else { continue };
            let (read, write) = (link.closed.is_none(), writer == Some(peer));
            let events = link.stream().poll_events(read, write);
            if !events.is_empty() {
                let (can_read, can_write) = link.stream().arm(read, write);
                ready_now |= can_read || can_write;
                fds.push(PollFd::new(link.stream().as_fd(), events));
                watched.push(peer);
            }
        }
        if fds.is_empty() {
            thread::sleep(left.min(Duration::from_millis(u64::from(millis))));
            return (Instant::now() < deadline).then_some(false);
        }
        let timeout = if ready_now {
            PollTimeout::ZERO
        } else if whole_frame {
            PollTimeout::from(millis.min(WHOLE_FRAME_NAP))
        } else {
            PollTimeout::from(millis)
        };
        // An interrupted or failed poll just means looking again; the deadline bounds it.
        let _ = poll(&mut fds, timeout);
        let input = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR;
        let output = PollFlags::POLLOUT | PollFlags::POLLHUP | PollFlags::POLLERR;
        let revents: Vec<PollFlags> = fds
            .iter()
            .map(|fd| fd.revents().unwrap_or(PollFlags::empty()))
            .collect();
        drop(fds);
        let mut writable = false;
        for (peer, events) in watched.into_iter().zip(revents) {
            let Some(Some(link)) = self.links.get_mut(peer) else {
                continue;
            };
            let can_write = link
                .stream()
                .disarm(events.intersects(input), events.intersects(output));
            // A ring's bytes may be there without a doorbell: pumping finds them or nothing.
            if reader != Some(peer)
                && (events.intersects(input) || matches!(link.stream(), Stream::Shared(_)))
            {
                link.pump(None);
            }
            writable |= can_write && writer == Some(peer);
        }
        Some(writable)
    }
}

/// Whether `flow`'s outgoing message `sent` may start: it exists, sending is at most `ahead`
/// messages ahead of receiving, and the incoming messages it depends on have been applied.
fn may_start(flow: &dyn Flow, sent: usize, applied: usize, ahead: usize) -> bool {
    sent < flow.outgoing() && sent <= applied + ahead && applied >= flow.needs(sent)
}

/// One message on its way out: the encoded header, and how much of it and the payload (the
/// caller's slice, `len` bytes) the socket has taken.
struct Frame {
    head: BytesMut,
    len: usize,
    written: usize,
}

impl Frame {
    fn new(header: Header, payload: &[u8]) -> Result<Self, CollectiveError> {
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|&len| len <= MAX_PAYLOAD)
            .ok_or_else(|| CollectiveError::InvalidArgument {
                op: "send",
                why: format!(
                    "a message of {} bytes is over the {MAX_PAYLOAD}-byte limit",
                    payload.len()
                ),
            })?;
        let mut head = BytesMut::with_capacity(HEADER_LEN);
        header.encode(len, &mut head);
        Ok(Self {
            head,
            len: payload.len(),
            written: 0,
        })
    }

    fn is_sent(&self) -> bool {
        self.written == self.head.len() + self.len
    }
}

impl Transport for TcpTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn set_spinning(&mut self, spinning: bool) {
        self.spinning = spinning;
    }

    fn world_size(&self) -> usize {
        self.addresses.len()
    }

    fn address(&self, peer: usize) -> String {
        self.addresses[peer].clone()
    }

    fn cluster(&self) -> u64 {
        self.cluster
    }

    fn check_peers(&mut self) -> Result<(), CollectiveError> {
        // Which connections have bytes or their end to read, asked of `poll` without sleeping:
        // a ring's socket tells its end to `poll` alone.
        let mut watched = Vec::with_capacity(self.links.len());
        let mut fds = Vec::with_capacity(self.links.len());
        for (peer, link) in self.links.iter().enumerate() {
            let Some(link) = link.as_ref().filter(|l| l.closed.is_none()) else {
                continue;
            };
            let events = link.stream().poll_events(true, false);
            if !events.is_empty() {
                fds.push(PollFd::new(link.stream().as_fd(), events));
                watched.push(peer);
            }
        }
        // A failed poll finds nothing this time; the caller asks again.
        let _ = poll(&mut fds, PollTimeout::ZERO);
        let stirred = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR;
        let revents: Vec<bool> = fds
            .iter()
            .map(|fd| fd.revents().is_some_and(|e| e.intersects(stirred)))
            .collect();
        drop(fds);
        for (peer, readable) in watched.into_iter().zip(revents) {
            let Some(Some(link)) = self.links.get_mut(peer) else {
                continue;
            };
            // A frame part-way into a transfer's buffer belongs to that transfer alone.
            if readable && !link.is_placing() {
                link.stream().disarm(true, false);
                link.pump(None);
            }
        }
        // A connection this rank cut itself (a collective of its own failed) says nothing of
        // whether the peer lives.
        let gone = self.links.iter().enumerate().find_map(|(peer, link)| {
            let link = link.as_ref().filter(|l| !l.cut_here)?;
            Some((peer, link.closed.clone()?))
        });
        gone.map_or(Ok(()), |(peer, reason)| Err(self.lost(peer, reason)))
    }

    fn send(
        &mut self,
        peer: usize,
        message: Message,
        deadline: Instant,
    ) -> Result<bool, CollectiveError> {
        self.send_slice(peer, message.header, &message.payload, deadline)
    }

    fn send_slice(
        &mut self,
        peer: usize,
        header: Header,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<bool, CollectiveError> {
        let mut frame = Frame::new(header, payload)?;
        loop {
            match self.write(peer, &mut frame, payload)? {
                Progress::Moved if frame.is_sent() => return Ok(true),
                Progress::Moved => {}
                Progress::WouldBlock => {
                    if self.wait(Some(peer), None, deadline).is_none() {
                        self.abandon(peer, &frame);
                        return Ok(false);
                    }
                }
            }
        }
    }

    fn recv(&mut self, peer: usize, deadline: Instant) -> Result<Option<Message>, CollectiveError> {
        let mut idle_since = None;
        loop {
            let link = self.link(peer)?;
            if let Some(message) = link.next_message() {
                return Ok(Some(message));
            }
            if let Some(reason) = link.closed.clone() {
                return Err(self.lost(peer, reason));
            }
            if link.pump(None) {
                idle_since = None;
            } else if self.idle(&mut idle_since, None, None, deadline).is_none() {
                return Ok(None);
            } else if idle_since.is_some_and(|since| since.elapsed() >= self.spin)
                && let Some(aborted) = self.abort_from_others(peer)
            {
                // Past spinning, waits sleep in `poll`, which lets every connection's bytes
                // in: a peer that failed has told every rank, as in `exchange`.
                return Err(aborted);
            }
        }
    }

    fn exchange(
        &mut self,
        flow: &mut dyn Flow,
        deadline: Instant,
    ) -> Result<Completion, CollectiveError> {
        let (to, from) = (flow.to(), flow.from());
        let (outgoing, incoming) = (flow.outgoing(), flow.incoming());
        let (mut sent, mut applied) = (0, 0);
        let mut sending: Option<Frame> = None;
        let mut idle_since = None;
        // After a write would block, the next waits for `poll` to say there is room: retrying
        // at once would trickle the payload out in many small writes.
        let mut can_write = true;
        let ahead = self.send_ahead().unwrap_or(usize::MAX / 2);
        loop {
            let mut moved = false;
            // Take what has arrived first: applying it overlaps with the bytes in flight, and
            // may let the next message out.
            let link = self.link(from)?;
            while applied < incoming
                && let Some(arrived) = link.ready.pop_front()
            {
                let handled = match &arrived {
                    Arrived::Message(message) => flow.apply(applied, Arrival::Message(message)),
                    Arrived::Placed(header) => flow.apply(applied, Arrival::Placed(*header)),
                };
                if let Arrived::Message(message) = arrived {
                    link.recycle(message.payload);
                }
                if let Err(e) = handled {
                    self.give_up(to, from, sending.as_ref());
                    return Err(e);
                }
                applied += 1;
                moved = true;
            }
            if applied < incoming && link.ready.is_empty() {
                if let Some(reason) = link.closed.clone() {
                    self.give_up(to, from, sending.as_ref());
                    return Err(self.lost(from, reason));
                }
                moved |= link.pump(Some(&mut Placing { flow, applied }));
            }
            while can_write {
                if sending.is_none() && may_start(flow, sent, applied, ahead) {
                    let (header, payload) = flow.message(sent);
                    sending = Some(Frame::new(header, payload)?);
                }
                let Some(frame) = &mut sending else { break };
                match self.write(to, frame, flow.message(sent).1)? {
                    Progress::Moved if frame.is_sent() => {
                        sent += 1;
                        sending = None;
                        moved = true;
                    }
                    Progress::Moved => moved = true,
                    Progress::WouldBlock => can_write = false,
                }
            }
            if sent == outgoing && applied == incoming {
                return Ok(Completion::Done);
            }
            if moved {
                idle_since = None;
                continue;
            }
            let writer = (sending.is_some() || may_start(flow, sent, applied, ahead)).then_some(to);
            let reader = (applied < incoming).then_some(from);
            let waited = if writer.is_some() && self.oversubscribed {
                self.wait(writer, reader, deadline)
            } else {
                self.idle(&mut idle_since, writer, reader, deadline)
            };
            // Waiting let every other connection's bytes in: a peer that failed has told
            // every rank, and waiting on for `from` would only hear of it once the failure
            // had travelled the ring.
            if let Some(aborted) = self.abort_from_others(from) {
                self.give_up(to, from, sending.as_ref());
                return Err(aborted);
            }
            if let Some(writable) = waited {
                can_write = writable;
            } else {
                self.give_up(to, from, sending.as_ref());
                let waiting_for = if applied < incoming { from } else { to };
                return Ok(Completion::Expired { waiting_for });
            }
        }
    }

    fn recycle(&mut self, peer: usize, payload: Bytes) {
        if let Some(Some(link)) = self.links.get_mut(peer) {
            link.recycle(payload);
        }
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        for link in self.links.iter().flatten() {
            link.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    use crate::header::{DType, Kind, Op};

    fn frame(message: &Message) -> Bytes {
        let mut out = BytesMut::new();
        message
            .header
            .encode(message.payload.len() as u32, &mut out);
        out.extend_from_slice(&message.payload);
        out.freeze()
    }

    #[test]
    fn hosts_compare_as_parsed_addresses() {
        assert!(same_host("[::1]:1", "[0::1]:2"));
        assert!(same_host("Worker-0.svc:1", "worker-0.svc:2"));
        assert!(!same_host("localhost:1", "127.0.0.1:2"));
        assert!(!same_host("10.0.0.1:1", "10.0.0.2:1"));
        assert!(!same_host("local", "local"));
    }

    #[test]
    fn frames_start_with_a_decodable_header() {
        let message = Message {
            header: Header {
                kind: Kind::Data,
                op: Op::AllReduce,
                dtype: DType::F32,
                reduce: 0,
                cluster: 1,
                seq: 2,
                count: 3,
                source: 0,
            },
            payload: Bytes::from_static(&[1, 2, 3, 4]),
        };
        let bytes = frame(&message);
        assert_eq!(Header::decode(&bytes).unwrap(), (message.header, 4));
        assert_eq!(&bytes[HEADER_LEN..], &[1, 2, 3, 4]);
    }
}
