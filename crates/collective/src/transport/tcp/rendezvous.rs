//! The rendezvous: how a rank's connections to the others are made and checked, before the
//! mesh of [`super::TcpTransport`] uses them.
//!
//! Each pair has one connection, dialled by the higher rank. Its handshake:
//!
//! 1. dialler → acceptor: a [`Hello`] (cluster identity, ranks, world size, what the dialler
//!    offers: a same-host socket, a shared-memory ring) and a fresh nonce;
//! 2. acceptor → dialler: its own `Hello`, whose flags accept, refuse ([`Hello::REFUSED`]: another
//!    cluster, or the rank is connected already) or send the dialler round to the Unix socket,
//!    its own fresh nonce, and its proof of the cluster secret over both nonces
//!    ([`crate::secret`]), which the dialler checks before anything else;
//! 3. dialler → acceptor: [`CONFIRM`], which only a dialler still waiting sends, and its own
//!    proof, which the acceptor checks;
//! 4. acceptor → dialler: [`ACCEPTED`] when the proof holds and the rank's place was still
//!    free, else [`REFUSED`]; then the shared-memory ring's own exchange, where both offered
//!    one.
//!
//! A rank's place is taken at step 4 and only then, so a connection whose dialler gave up
//! (its hello still in the acceptor's backlog) or went silent never takes it, and of two
//! connections claiming one rank the first to confirm keeps it while the other is told so.
//! The acceptor runs each connection's handshake on a thread of its own with a deadline for
//! the whole exchange ([`HANDSHAKE_TIMEOUT`], and never past the rendezvous deadline), so a
//! peer that sends its hello a byte at a time holds nothing but its own thread; a failed or
//! refused connection is logged and dropped, and the rendezvous goes on.

use std::io::{self, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use super::shared_ring;
use super::stream::{Listeners, SameHost, Stream, connect_unix};
use super::{TcpOptions, setup};
use crate::error::CollectiveError;
use crate::handshake::{ByDeadline, HandshakeSlots, MAX_HANDSHAKES};
use crate::secret::{Binding, ClusterSecret, NONCE_LEN, PROOF_LEN, Proof, Side, nonce};

/// The handshake's version, bound into every proof.
const VERSION: u32 = 1;

const HELLO_MAGIC: u32 = 0x4C53_4848; // "LSHH"
const HELLO_LEN: usize = 4 + 8 + 4 + 4 + 4;
/// Step 3: the dialler still wants this connection.
pub(super) const CONFIRM: [u8; 4] = *b"LSHC";
/// Step 4: the rank's place is this connection's.
pub(super) const ACCEPTED: [u8; 4] = *b"LSHA";
/// Step 4: another connection took the rank's place first.
pub(super) const REFUSED: [u8; 4] = *b"LSHR";
/// Step 3, instead of [`CONFIRM`]: the acceptor's proof did not hold (the two sides' secrets
/// differ); the dialler closes after it, and the acceptor can say why.
pub(super) const DENIED: [u8; 4] = *b"LSHD";

/// The longest one connection's handshake may take, from its accept (or dial) to its last
/// byte: a peer on the other side of the world answers in well under a second.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// What one side of a connection says first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Hello {
    pub(super) cluster: u64,
    pub(super) rank: usize,
    pub(super) world: usize,
    /// [`Hello::SAME_HOST`], [`Hello::USE_UNIX`], [`Hello::SHARED_RING`], [`Hello::REFUSED`].
    pub(super) flags: u32,
}

impl Hello {
    /// From a dialer: it is on the acceptor's host and would take its Unix socket.
    pub(super) const SAME_HOST: u32 = 1;
    /// From an acceptor: come back over my Unix socket (this TCP connection is dropped).
    pub(super) const USE_UNIX: u32 = 2;
    /// From a dialler over a Unix socket: it would pass a shared-memory ring next; from the
    /// acceptor: it takes one. Both must say so before the dialler sends it.
    pub(super) const SHARED_RING: u32 = 4;
    /// From an acceptor: this connection is refused (the rest of the hello says who refuses).
    pub(super) const REFUSED: u32 = 8;

    pub(super) fn encode(self) -> [u8; HELLO_LEN] {
        let mut out = [0_u8; HELLO_LEN];
        out[..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        out[4..12].copy_from_slice(&self.cluster.to_le_bytes());
        out[12..16].copy_from_slice(&(self.rank as u32).to_le_bytes());
        out[16..20].copy_from_slice(&(self.world as u32).to_le_bytes());
        out[20..24].copy_from_slice(&self.flags.to_le_bytes());
        out
    }

    /// A hello from its bytes; anything without the magic is not a Lockstep peer.
    pub(super) fn decode(raw: &[u8; HELLO_LEN]) -> io::Result<Self> {
        let word = |at: usize| u32::from_le_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]]);
        if word(0) != HELLO_MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a Lockstep collective peer",
            ));
        }
        let mut cluster = [0_u8; 8];
        cluster.copy_from_slice(&raw[4..12]);
        Ok(Self {
            cluster: u64::from_le_bytes(cluster),
            rank: word(12) as usize,
            world: word(16) as usize,
            flags: word(20),
        })
    }

    fn read_by(stream: &mut Stream, deadline: Instant) -> io::Result<Self> {
        let mut raw = [0_u8; HELLO_LEN];
        ByDeadline::new(stream, deadline).fill(&mut raw)?;
        Self::decode(&raw)
    }

    /// The same group and world, ignoring flags.
    fn matches(self, other: Self) -> bool {
        (self.cluster, self.rank, self.world) == (other.cluster, other.rank, other.world)
    }
}

/// One lower rank's place at the acceptor.
enum Place {
    Free,
    /// A connection has confirmed and is finishing its handshake (the shared ring's exchange).
    Claimed,
    Taken(Stream),
}

/// What the acceptor's handshake threads share with its accept loop.
struct Admission {
    places: Vec<Place>,
    /// Set when the rendezvous ended: late handshakes refuse.
    closed: bool,
    /// The last connection refused for another identity: the likeliest reason a missing rank
    /// never arrives is that its cluster spec differs from this one's.
    refused: Option<String>,
}

type Shared = Arc<Mutex<Admission>>;

/// Frees the place a handshake claimed and could not finish; nothing once the rendezvous has
/// ended (its places are gone).
fn release(shared: &Shared, peer: usize) {
    if let Some(place) = lock(shared).places.get_mut(peer) {
        *place = Place::Free;
    }
}

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Admission> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a handshake thread needs to know of this rank.
#[derive(Clone)]
struct Acceptor {
    me: Hello,
    secret: Option<ClusterSecret>,
    /// Whether this rank offers a Unix socket.
    unix: bool,
    same_host: SameHost,
    deadline: Instant,
}

/// Accepts every lower rank of the group on `listeners`, refusing (and logging) connections
/// from outside the group, until the deadline: the lower ranks' streams, by rank.
pub(super) fn accept_lower(
    listeners: &Listeners,
    me: Hello,
    addresses: &[String],
    options: &TcpOptions,
    deadline: Instant,
) -> Result<Vec<Option<Stream>>, CollectiveError> {
    let rank = me.rank;
    let shared: Shared = Arc::new(Mutex::new(Admission {
        places: (0..rank).map(|_| Place::Free).collect(),
        closed: false,
        refused: None,
    }));
    let slots = HandshakeSlots::default();
    let acceptor = Acceptor {
        me,
        secret: options.secret.clone(),
        unix: listeners.unix.is_some(),
        same_host: options.same_host,
        deadline,
    };
    loop {
        {
            let mut places = lock(&shared);
            let missing: Vec<usize> = (0..rank)
                .filter(|&p| !matches!(places.places[p], Place::Taken(_)))
                .collect();
            if missing.is_empty() || Instant::now() >= deadline {
                places.closed = true;
                if !missing.is_empty() {
                    let refused = places
                        .refused
                        .as_ref()
                        .map_or_else(String::new, |r| format!("; refused {r}"));
                    return Err(setup(format!(
                        "rank(s) {missing:?} did not connect within {:?}{refused}",
                        options.rendezvous_timeout
                    )));
                }
                let streams = std::mem::take(&mut places.places)
                    .into_iter()
                    .map(|place| match place {
                        Place::Taken(stream) => Some(stream),
                        Place::Free | Place::Claimed => None,
                    })
                    .collect();
                return Ok(streams);
            }
        }
        match listeners.accept() {
            Ok(Some((stream, from))) => {
                let Some(slot) = slots.take() else {
                    tracing::warn!(%from, "refused a connection: {MAX_HANDSHAKES} handshakes are under way already");
                    continue;
                };
                let theirs = Arc::clone(&shared);
                let acceptor = acceptor.clone();
                let spawned = thread::Builder::new()
                    .name("lockstep-handshake".into())
                    .spawn(move || {
                        acceptor.handshake(stream, &from, &theirs);
                        drop(slot);
                    });
                if let Err(e) = spawned {
                    tracing::warn!(%e, "could not start a handshake thread; the connection is dropped");
                }
            }
            Ok(None) => thread::sleep(Duration::from_millis(5)),
            Err(e) => {
                lock(&shared).closed = true;
                return Err(setup(format!("accepting on {}: {e}", addresses[rank])));
            }
        }
    }
}

impl Acceptor {
    /// One accepted connection's handshake, to its end: the rank's place taken, or the
    /// connection refused or failed (logged) and dropped.
    fn handshake(&self, mut stream: Stream, from: &str, shared: &Shared) {
        let deadline = self.deadline.min(Instant::now() + HANDSHAKE_TIMEOUT);
        match self.exchange(&mut stream, from, shared, deadline) {
            Ok(Some((peer, ring))) => match upgrade(stream, ring, shared_ring::accept) {
                Ok(stream) => {
                    let mut places = lock(shared);
                    if !places.closed {
                        places.places[peer] = Place::Taken(stream);
                    }
                }
                Err(e) => {
                    // The dialler retries, as after any failed attempt.
                    tracing::warn!(%from, peer, %e, "the shared-ring handshake failed");
                    release(shared, peer);
                }
            },
            Ok(None) => {}
            Err(e) => tracing::warn!(%from, %e, "dropped a connection whose handshake failed"),
        }
    }

    /// Steps 1 to 4 of the handshake: `Some((rank, ring))` once the connection holds the
    /// place of `rank` (claimed), `None` when it was refused or sent round to the Unix socket.
    fn exchange(
        &self,
        stream: &mut Stream,
        from: &str,
        shared: &Shared,
        deadline: Instant,
    ) -> io::Result<Option<(usize, bool)>> {
        let me = self.me;
        stream.set_nonblocking(false)?;
        let theirs = Hello::read_by(stream, deadline)?;
        let ours =
            theirs.cluster == me.cluster && theirs.world == me.world && theirs.rank < me.rank;
        if !ours {
            tracing::warn!(%from, cluster = format_args!("{:x}", theirs.cluster), peer = theirs.rank, peer_world = theirs.world, "refused a connection from outside this group");
            lock(shared).refused = Some(format!(
                "a connection from {from} as rank {} of {} (cluster {:x}, this group's {:x}), whose cluster spec differs from this task's",
                theirs.rank, theirs.world, theirs.cluster, me.cluster
            ));
            // Answering tells the dialler who refuses it, and why.
            let _ = stream.write_all(&unproven(refusal(me)));
            return Ok(None);
        }
        // Its nonce only once it is one of this group's: a stranger is refused on its hello.
        let mut their_nonce = [0_u8; NONCE_LEN];
        ByDeadline::new(stream, deadline).fill(&mut their_nonce)?;
        let peer = theirs.rank;
        let taken = {
            let places = lock(shared);
            places.closed || matches!(places.places[peer], Place::Taken(_))
        };
        if taken {
            tracing::warn!(%from, peer, "refused a connection for a rank that is connected already");
            let _ = stream.write_all(&unproven(refusal(me)));
            return Ok(None);
        }
        // A peer on this host that reached the TCP port first (a launcher's socket accepts
        // before this rank offers its Unix socket) is sent round to the Unix socket.
        let redirect =
            matches!(stream, Stream::Tcp(_)) && self.unix && theirs.flags & Hello::SAME_HOST != 0;
        let ring = matches!(stream, Stream::Unix(_))
            && self.same_host == SameHost::SharedMemory
            && theirs.flags & Hello::SHARED_RING != 0;
        let flags = if redirect {
            Hello::USE_UNIX
        } else if ring {
            Hello::SHARED_RING
        } else {
            0
        };
        let binding = Binding {
            version: VERSION,
            cluster: me.cluster,
            world: me.world,
            dialler: peer,
            acceptor: me.rank,
        };
        let our_nonce = nonce()?;
        let nonces = (&their_nonce, &our_nonce);
        let proof = Proof::make(self.secret.as_ref(), Side::Acceptor, binding, nonces);
        let mut reply = Vec::with_capacity(REPLY_LEN);
        reply.extend(Hello { flags, ..me }.encode());
        reply.extend(our_nonce);
        reply.extend(proof);
        stream.write_all(&reply)?;
        if redirect {
            return Ok(None);
        }
        if !self.confirmed(stream, (from, peer), shared, (binding, nonces), deadline)? {
            return Ok(None);
        }
        Ok(Some((peer, ring)))
    }

    /// Steps 3 and 4: whether the dialler confirmed with a proof that holds and the place of
    /// `peer` was still free (it is claimed then); a refusal is answered and logged.
    fn confirmed(
        &self,
        stream: &mut Stream,
        (from, peer): (&str, usize),
        shared: &Shared,
        (binding, nonces): (Binding, (&[u8; NONCE_LEN], &[u8; NONCE_LEN])),
        deadline: Instant,
    ) -> io::Result<bool> {
        let mut confirm = [0_u8; CONFIRM.len() + PROOF_LEN];
        let mut denied = [0_u8; DENIED.len()];
        ByDeadline::new(stream, deadline).fill(&mut denied)?;
        if denied == DENIED {
            tracing::warn!(%from, peer, "a connection found this rank's proof of the cluster secret wrong: the two tasks were given different secrets (or one has none)");
            lock(shared).refused = Some(format!(
                "a connection from {from} as rank {peer} that holds another cluster secret than this task's"
            ));
            return Ok(false);
        }
        confirm[..DENIED.len()].copy_from_slice(&denied);
        ByDeadline::new(stream, deadline).fill(&mut confirm[DENIED.len()..])?;
        if confirm[..CONFIRM.len()] != CONFIRM {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the dialler did not confirm its hello",
            ));
        }
        let proven = Proof::check(
            self.secret.as_ref(),
            Side::Dialler,
            binding,
            nonces,
            &confirm[CONFIRM.len()..],
        );
        if !proven {
            tracing::warn!(%from, peer, "refused a connection that did not prove it holds the cluster secret (LOCKSTEP_CLUSTER_SECRET)");
            lock(shared).refused = Some(format!(
                "a connection from {from} as rank {peer} without this task's cluster secret"
            ));
            let _ = stream.write_all(&REFUSED);
            return Ok(false);
        }
        let claimed = {
            let mut places = lock(shared);
            let free = !places.closed && matches!(places.places[peer], Place::Free);
            if free {
                places.places[peer] = Place::Claimed;
            }
            free
        };
        if !claimed {
            tracing::warn!(%from, peer, "refused a second connection for a rank, confirmed after the first");
            let _ = stream.write_all(&REFUSED);
            return Ok(false);
        }
        if let Err(e) = stream.write_all(&ACCEPTED) {
            release(shared, peer);
            return Err(e);
        }
        Ok(true)
    }
}

/// The acceptor's answer to a connection it refuses: its own identity, flagged.
fn refusal(me: Hello) -> Hello {
    Hello {
        flags: Hello::REFUSED,
        ..me
    }
}

/// Bytes of the acceptor's reply: its hello, its nonce and its proof.
const REPLY_LEN: usize = HELLO_LEN + NONCE_LEN + PROOF_LEN;

/// A reply that proves nothing (a refusal needs no proof: the dialler gives up on it).
fn unproven(hello: Hello) -> Vec<u8> {
    let mut reply = hello.encode().to_vec();
    reply.resize(REPLY_LEN, 0);
    reply
}

/// Turns a Unix socket whose hellos agreed on a ring (`ring`) into a ring, through one side's
/// half of the handshake; the socket stays plain when that side or the other cannot map one.
pub(super) fn upgrade(
    stream: Stream,
    ring: bool,
    handshake: fn(
        std::os::unix::net::UnixStream,
    )
        -> io::Result<Result<shared_ring::SharedRing, std::os::unix::net::UnixStream>>,
) -> io::Result<Stream> {
    match stream {
        Stream::Unix(socket) if ring => Ok(match handshake(socket)? {
            Ok(ring) => Stream::Shared(ring),
            Err(socket) => Stream::Unix(socket),
        }),
        other => Ok(other),
    }
}

/// Connects to the first of the addresses `address` resolves to that accepts: a name such
/// as `localhost` may resolve to `::1` before `127.0.0.1`, and a peer listening on all IPv4
/// interfaces accepts only the second.
fn connect_any(address: &str, deadline: Instant) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the name resolves to no address");
    for target in address.to_socket_addrs()? {
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        match TcpStream::connect_timeout(&target, wait) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Dials `address` until it answers with the expected hello, or the deadline passes. A peer
/// on this host (`same_host`) is tried over its Unix socket first; one reached over TCP that
/// offers a Unix socket sends this rank round to it, unless that socket cannot be reached
/// from here (another network namespace), in which case TCP it is.
pub(super) fn dial(
    address: &str,
    peer: usize,
    me: Hello,
    (same_host, ring): (bool, bool),
    secret: Option<&ClusterSecret>,
    deadline: Instant,
) -> Result<Stream, CollectiveError> {
    let mut dialler = Dialler {
        address,
        peer,
        me,
        ring,
        secret,
        deadline,
        unix_reachable: same_host,
        redirected: false,
    };
    let mut backoff = Duration::from_millis(10);
    // The last refusal: once the peer is gone (its rendezvous over), "connection refused"
    // says less than why it refused this rank.
    let mut refusal: Option<String> = None;
    loop {
        match dialler.attempt() {
            Ok(Some(stream)) => return Ok(stream),
            Ok(None) => {}
            Err(e) if Instant::now() + backoff < deadline => {
                tracing::debug!(peer, address, %e, "peer not ready; retrying");
                if matches!(
                    e.kind(),
                    io::ErrorKind::PermissionDenied | io::ErrorKind::AddrInUse
                ) {
                    refusal = Some(e.to_string());
                }
                thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
            Err(e) => {
                let earlier = refusal
                    .filter(|r| *r != e.to_string())
                    .map_or_else(String::new, |r| format!(" (before that: {r})"));
                return Err(setup(format!(
                    "could not reach rank {peer} at {address} before the deadline: {e}{earlier}"
                )));
            }
        }
    }
}

/// One rank dialling a higher one, across its attempts.
struct Dialler<'a> {
    address: &'a str,
    peer: usize,
    me: Hello,
    ring: bool,
    secret: Option<&'a ClusterSecret>,
    deadline: Instant,
    unix_reachable: bool,
    redirected: bool,
}

impl Dialler<'_> {
    /// One connection's handshake: its stream once accepted, `None` when sent round to the
    /// Unix socket, an error when refused or failed.
    fn attempt(&mut self) -> io::Result<Option<Stream>> {
        let unix = if self.unix_reachable {
            connect_unix(self.address).ok().map(Stream::Unix)
        } else {
            None
        };
        if unix.is_none() && self.redirected {
            // Sent round to a Unix socket this rank cannot see: the peer is in another
            // network namespace. The next hello says so, and TCP is accepted.
            self.unix_reachable = false;
        }
        let mut stream = if let Some(stream) = unix {
            stream
        } else {
            Stream::Tcp(connect_any(self.address, self.deadline)?)
        };
        let by = self.deadline.min(Instant::now() + HANDSHAKE_TIMEOUT);
        let mut flags = if self.unix_reachable {
            Hello::SAME_HOST
        } else {
            0
        };
        let unix = matches!(stream, Stream::Unix(_));
        if self.ring && unix {
            flags |= Hello::SHARED_RING;
        }
        let our_nonce = nonce()?;
        let mut hello = Hello { flags, ..self.me }.encode().to_vec();
        hello.extend(our_nonce);
        stream.write_all(&hello)?;
        let mut reply = [0_u8; REPLY_LEN];
        ByDeadline::new(&mut stream, by).fill(&mut reply)?;
        let theirs = self.check_reply(&reply, &our_nonce, &mut stream)?;
        if theirs.flags & Hello::USE_UNIX != 0 {
            // The peer's Unix socket is bound by now: try it at once.
            self.redirected = true;
            return Ok(None);
        }
        let mut confirm = CONFIRM.to_vec();
        let their_nonce = nonce_of(&reply);
        let nonces = (&our_nonce, &their_nonce);
        confirm.extend(Proof::make(
            self.secret,
            Side::Dialler,
            self.binding(),
            nonces,
        ));
        stream.write_all(&confirm)?;
        let mut verdict = [0_u8; ACCEPTED.len()];
        ByDeadline::new(&mut stream, by).fill(&mut verdict)?;
        if verdict != ACCEPTED {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "rank {} refused this rank's connection: it did not take this rank's proof of the cluster secret (the two tasks were given different secrets), or another connection confirmed this rank's place there first",
                    self.peer
                ),
            ));
        }
        let agreed = self.ring && unix && theirs.flags & Hello::SHARED_RING != 0;
        upgrade(stream, agreed, shared_ring::offer).map(Some)
    }

    fn binding(&self) -> Binding {
        Binding {
            version: VERSION,
            cluster: self.me.cluster,
            world: self.me.world,
            dialler: self.me.rank,
            acceptor: self.peer,
        }
    }

    /// The acceptor's hello from its reply, once it is the expected peer's, not a refusal,
    /// and its proof of the secret holds (else the acceptor is told, and this is an error).
    fn check_reply(
        &self,
        reply: &[u8; REPLY_LEN],
        our_nonce: &[u8; NONCE_LEN],
        stream: &mut Stream,
    ) -> io::Result<Hello> {
        let (address, peer) = (self.address, self.peer);
        let expected = Hello {
            rank: peer,
            ..self.me
        };
        let mut raw = [0_u8; HELLO_LEN];
        raw.copy_from_slice(&reply[..HELLO_LEN]);
        let theirs = Hello::decode(&raw)?;
        if !theirs.matches(expected) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{address} answers as rank {} of {} in cluster {:x}, where this task expects rank {} of {} in cluster {:x}: the two tasks' cluster specs differ",
                    theirs.rank,
                    theirs.world,
                    theirs.cluster,
                    expected.rank,
                    expected.world,
                    expected.cluster
                ),
            ));
        }
        if theirs.flags & Hello::REFUSED != 0 {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "rank {peer} refused this rank's connection: another connection holds this rank's place there"
                ),
            ));
        }
        let their_nonce = nonce_of(reply);
        let proven = Proof::check(
            self.secret,
            Side::Acceptor,
            self.binding(),
            (our_nonce, &their_nonce),
            &reply[HELLO_LEN + NONCE_LEN..],
        );
        if !proven {
            // Telling the acceptor lets it name the cause too.
            let _ = stream.write_all(&DENIED);
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "rank {peer} did not prove it holds this task's cluster secret: the two tasks were given different secrets (or one has none: LOCKSTEP_CLUSTER_SECRET)"
                ),
            ));
        }
        Ok(theirs)
    }
}

/// The acceptor's nonce in its reply.
fn nonce_of(reply: &[u8; REPLY_LEN]) -> [u8; NONCE_LEN] {
    let mut nonce = [0_u8; NONCE_LEN];
    nonce.copy_from_slice(&reply[HELLO_LEN..HELLO_LEN + NONCE_LEN]);
    nonce
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_bytes_decode_to_a_hello_or_an_error(raw in prop::array::uniform24(any::<u8>())) {
            if let Ok(hello) = Hello::decode(&raw) {
                prop_assert_eq!(hello.encode(), raw);
            }
        }

        #[test]
        fn hellos_round_trip(cluster: u64, rank: u32, world: u32, flags: u32) {
            let hello = Hello { cluster, rank: rank as usize, world: world as usize, flags };
            prop_assert_eq!(Hello::decode(&hello.encode()).unwrap(), hello);
        }
    }
}
