//! Ranks in separate processes or hosts, connected by plain TCP: one connection per pair, a
//! handshake that checks the cluster identity, and a reader thread per peer.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use bytes::BytesMut;

use super::Transport;
use super::inbox::{Inbound, receive};
use crate::error::CollectiveError;
use crate::header::{HEADER_LEN, Header, Message};

const HELLO_MAGIC: u32 = 0x4C53_4848; // "LSHH"
const HELLO_LEN: usize = 4 + 8 + 4 + 4;
/// The largest payload a peer may announce: a corrupt length must not allocate gigabytes.
const MAX_PAYLOAD: u32 = 1 << 30;

/// How a TCP group forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpOptions {
    /// Every member must present the same identity; others are refused.
    pub cluster: u64,
    /// How long to keep trying to reach all peers at start-up.
    pub rendezvous_timeout: Duration,
}

impl Default for TcpOptions {
    fn default() -> Self {
        Self {
            cluster: 0,
            rendezvous_timeout: Duration::from_mins(1),
        }
    }
}

/// One rank of a group connected over TCP.
///
/// Rank `i` listens on `addresses[i]`, dials every higher rank and accepts every lower one.
/// Dialling retries with backoff until the rendezvous deadline, so processes may start in any
/// order. A connection that does not present this group's cluster identity, a valid rank and
/// the right world size is closed and ignored.
pub struct TcpTransport {
    rank: usize,
    cluster: u64,
    addresses: Vec<String>,
    writers: Vec<Option<Mutex<TcpStream>>>,
    inbox: Vec<Option<Receiver<Inbound>>>,
    readers: Vec<JoinHandle<()>>,
}

fn setup(what: impl std::fmt::Display) -> CollectiveError {
    CollectiveError::Setup(what.to_string())
}

fn hello(cluster: u64, rank: usize, world: usize) -> [u8; HELLO_LEN] {
    let mut out = [0_u8; HELLO_LEN];
    out[..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
    out[4..12].copy_from_slice(&cluster.to_le_bytes());
    out[12..16].copy_from_slice(&(rank as u32).to_le_bytes());
    out[16..20].copy_from_slice(&(world as u32).to_le_bytes());
    out
}

/// Reads a peer's hello: `(cluster, rank, world)`.
fn read_hello(stream: &mut TcpStream) -> io::Result<(u64, usize, usize)> {
    let mut raw = [0_u8; HELLO_LEN];
    stream.read_exact(&mut raw)?;
    let word = |at: usize| u32::from_le_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]]);
    if word(0) != HELLO_MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a Lockstep collective peer",
        ));
    }
    let mut cluster = [0_u8; 8];
    cluster.copy_from_slice(&raw[4..12]);
    Ok((
        u64::from_le_bytes(cluster),
        word(12) as usize,
        word(16) as usize,
    ))
}

impl TcpTransport {
    /// Forms the group: binds `addresses[rank]`, connects to every other rank, and checks
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
        let world = addresses.len();
        if rank >= world {
            return Err(setup(format!(
                "rank {rank} is not below the world size {world}"
            )));
        }
        let deadline = Instant::now() + options.rendezvous_timeout;
        let listener = TcpListener::bind(&addresses[rank])
            .map_err(|e| setup(format!("binding {}: {e}", addresses[rank])))?;
        listener.set_nonblocking(true).map_err(setup)?;
        let mut streams: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();

        for (peer, address) in addresses.iter().enumerate().skip(rank + 1) {
            streams[peer] = Some(dial(address, peer, rank, world, options.cluster, deadline)?);
        }
        loop {
            let missing: Vec<usize> = (0..rank).filter(|&p| streams[p].is_none()).collect();
            if missing.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(setup(format!(
                    "rank(s) {missing:?} did not connect within {:?}",
                    options.rendezvous_timeout
                )));
            }
            match listener.accept() {
                Ok((mut stream, from)) => {
                    stream.set_nonblocking(false).map_err(setup)?;
                    stream
                        .set_read_timeout(Some(Duration::from_secs(5)))
                        .map_err(setup)?;
                    match read_hello(&mut stream) {
                        Ok((cluster, peer, peer_world))
                            if cluster == options.cluster
                                && peer_world == world
                                && peer < rank
                                && streams[peer].is_none() =>
                        {
                            stream
                                .write_all(&hello(options.cluster, rank, world))
                                .map_err(setup)?;
                            streams[peer] = Some(stream);
                        }
                        Ok((cluster, peer, peer_world)) => {
                            tracing::warn!(%from, cluster, peer, peer_world, "refused a connection from outside this group");
                        }
                        Err(e) => {
                            tracing::warn!(%from, %e, "refused a connection that did not say hello");
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(setup(format!("accepting on {}: {e}", addresses[rank]))),
            }
        }

        let mut writers = Vec::with_capacity(world);
        let mut inbox = Vec::with_capacity(world);
        let mut readers = Vec::new();
        for (peer, stream) in streams.into_iter().enumerate() {
            let Some(stream) = stream else {
                writers.push(None);
                inbox.push(None);
                continue;
            };
            stream.set_read_timeout(None).map_err(setup)?;
            stream.set_nodelay(true).map_err(setup)?;
            let reader = stream.try_clone().map_err(setup)?;
            let (tx, rx) = channel();
            readers.push(
                thread::Builder::new()
                    .name(format!("lockstep-recv-{peer}"))
                    .spawn(move || read_loop(reader, &tx))
                    .map_err(setup)?,
            );
            writers.push(Some(Mutex::new(stream)));
            inbox.push(Some(rx));
        }
        Ok(Self {
            rank,
            cluster: options.cluster,
            addresses: addresses.to_vec(),
            writers,
            inbox,
            readers,
        })
    }

    /// A group of one (a local run): no sockets at all.
    pub fn single() -> Self {
        Self {
            rank: 0,
            cluster: 0,
            addresses: vec!["local".into()],
            writers: vec![None],
            inbox: vec![None],
            readers: Vec::new(),
        }
    }
}

/// Dials `address` until it answers with the expected hello, or the deadline passes.
fn dial(
    address: &str,
    peer: usize,
    rank: usize,
    world: usize,
    cluster: u64,
    deadline: Instant,
) -> Result<TcpStream, CollectiveError> {
    let mut backoff = Duration::from_millis(10);
    loop {
        let attempt = (|| -> io::Result<TcpStream> {
            let target = address
                .to_socket_addrs()?
                .next()
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))?;
            let wait = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            let mut stream = TcpStream::connect_timeout(&target, wait)?;
            stream.set_read_timeout(Some(Duration::from_secs(5)))?;
            stream.write_all(&hello(cluster, rank, world))?;
            let (their_cluster, their_rank, their_world) = read_hello(&mut stream)?;
            if (their_cluster, their_rank, their_world) != (cluster, peer, world) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{address} is rank {their_rank} of {their_world} in cluster {their_cluster:x}"
                    ),
                ));
            }
            Ok(stream)
        })();
        match attempt {
            Ok(stream) => return Ok(stream),
            Err(e) if Instant::now() + backoff < deadline => {
                tracing::debug!(peer, address, %e, "peer not ready; retrying");
                thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
            Err(e) => {
                return Err(setup(format!(
                    "could not reach rank {peer} at {address} before the deadline: {e}"
                )));
            }
        }
    }
}

/// Reads framed messages until the connection ends, then reports why.
fn read_loop(mut stream: TcpStream, inbox: &Sender<Inbound>) {
    let reason = loop {
        let mut head = [0_u8; HEADER_LEN];
        if let Err(e) = stream.read_exact(&mut head) {
            break if e.kind() == io::ErrorKind::UnexpectedEof {
                "the connection closed".to_owned()
            } else {
                e.to_string()
            };
        }
        let (header, len) = match Header::decode(&head) {
            Ok(decoded) => decoded,
            Err(e) => break e.to_string(),
        };
        if len > MAX_PAYLOAD {
            break format!("a frame announced {len} bytes, over the {MAX_PAYLOAD}-byte limit");
        }
        let mut payload = BytesMut::zeroed(len as usize);
        if let Err(e) = stream.read_exact(&mut payload) {
            break e.to_string();
        }
        if inbox
            .send(Inbound::Message(Message {
                header,
                payload: payload.freeze(),
            }))
            .is_err()
        {
            return; // the transport is gone
        }
    };
    let _ = inbox.send(Inbound::Closed(reason));
}

impl TcpTransport {
    fn lost(&self, peer: usize, reason: String) -> CollectiveError {
        CollectiveError::PeerLost {
            rank: peer,
            address: self.addresses[peer].clone(),
            reason,
        }
    }
}

impl Transport for TcpTransport {
    fn rank(&self) -> usize {
        self.rank
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

    fn send(&mut self, peer: usize, message: Message) -> Result<(), CollectiveError> {
        self.send_slice(peer, message.header, &message.payload)
    }

    fn send_slice(
        &mut self,
        peer: usize,
        header: Header,
        payload: &[u8],
    ) -> Result<(), CollectiveError> {
        let Some(writer) = &self.writers[peer] else {
            return Err(self.lost(peer, "no connection to this rank".into()));
        };
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
        let result = {
            let mut stream = writer
                .lock()
                .map_err(|_| self.lost(peer, "a writer panicked".into()))?;
            stream
                .write_all(&head)
                .and_then(|()| stream.write_all(payload))
        };
        result.map_err(|e| self.lost(peer, e.to_string()))
    }

    fn recv(&mut self, peer: usize, deadline: Instant) -> Result<Option<Message>, CollectiveError> {
        match &self.inbox[peer] {
            Some(inbox) => receive(inbox, deadline).map_err(|reason| self.lost(peer, reason)),
            None => Err(self.lost(peer, "no connection to this rank".into())),
        }
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        for writer in self.writers.iter().flatten() {
            if let Ok(stream) = writer.lock() {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
        for reader in self.readers.drain(..) {
            let _ = reader.join();
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
