//! Opening a connection of the services beside the collectives (a parameter server's, a
//! worker's step service): both ends prove the cluster secret, bound to the service's name,
//! before any message, within one deadline for the whole exchange.
//!
//! The accepting end runs each handshake on a thread of its own ([`Handshakes`]), at most
//! [`MAX_HANDSHAKES`] at once, so a peer that sends its bytes one at a time, or never, holds
//! only its own thread, and for [`HANDSHAKE_TIMEOUT`] at most: never a client that proves the
//! secret, and never the service.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use lockstep_collective::{
    ByDeadline, ClusterSecret, HandshakeSlots, MAX_HANDSHAKES, ServiceSide, authenticate_stream,
};

use crate::error::PsError;
use crate::protocol;

/// How long a new connection has to prove the cluster secret to the end that accepted it,
/// from its accept to its handshake's last byte.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to `address` for `service`, proven both ways: with keepalive (a host that
/// vanishes ends it), and `timeout` on connecting, on the whole handshake and on every later
/// read and write (the caller may lift it).
///
/// # Errors
///
/// [`PsError::Connection`] when `address` cannot be reached within `timeout` or the handshake
/// fails (the two ends hold different secrets, say).
pub(crate) fn dial(
    address: SocketAddr,
    secret: Option<&ClusterSecret>,
    service: &str,
    timeout: Duration,
) -> Result<TcpStream, PsError> {
    let peer = address.to_string();
    let failed = |doing: &str, e: io::Error| protocol::connection(&peer, doing, &e);
    let mut stream =
        TcpStream::connect_timeout(&address, timeout).map_err(|e| failed("connecting", e))?;
    stream
        .set_nodelay(true)
        .and_then(|()| crate::keepalive::keep_alive(&stream))
        .map_err(|e| failed("setting up", e))?;
    prove(
        &mut stream,
        &peer,
        (secret, service),
        ServiceSide::Dialler,
        timeout,
    )?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| failed("setting up", e))?;
    Ok(stream)
}

/// Proves `secret` for `service` on an accepted connection from `peer` within `timeout` in
/// all; then lifts the read deadline (a client may stay idle).
///
/// # Errors
///
/// [`PsError::Connection`] when the handshake fails or runs past `timeout`, or the socket
/// cannot be set up.
pub(crate) fn accept(
    stream: &mut TcpStream,
    peer: &str,
    (secret, service): (Option<&ClusterSecret>, &str),
    timeout: Duration,
) -> Result<(), PsError> {
    let setup = |e: io::Error| protocol::connection(peer, "setting up", &e);
    stream.set_nonblocking(false).map_err(setup)?;
    stream.set_nodelay(true).map_err(setup)?;
    prove(
        stream,
        peer,
        (secret, service),
        ServiceSide::Acceptor,
        timeout,
    )?;
    stream
        .set_read_timeout(None)
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(setup)
}

/// One side of the handshake, every read and write of it ending by `now + timeout`.
fn prove(
    stream: &mut TcpStream,
    peer: &str,
    (secret, service): (Option<&ClusterSecret>, &str),
    side: ServiceSide,
    timeout: Duration,
) -> Result<(), PsError> {
    let mut bounded = ByDeadline::new(stream, Instant::now() + timeout);
    authenticate_stream(&mut bounded, secret, service, side).map_err(|e| PsError::Connection {
        peer: peer.to_owned(),
        why: e.to_string(),
    })
}

/// An accepting end's handshakes, each on a thread of its own, at most [`MAX_HANDSHAKES`] at
/// once, each within its timeout.
pub(crate) struct Handshakes {
    secret: Option<ClusterSecret>,
    service: &'static str,
    timeout: Duration,
    slots: HandshakeSlots,
}

impl Handshakes {
    /// Handshakes for `service` with peers that must prove `secret`, each within
    /// [`HANDSHAKE_TIMEOUT`].
    pub(crate) fn new(secret: Option<ClusterSecret>, service: &'static str) -> Self {
        Self {
            secret,
            service,
            timeout: HANDSHAKE_TIMEOUT,
            slots: HandshakeSlots::default(),
        }
    }

    /// The same, each handshake within `timeout`.
    #[cfg(test)]
    fn within(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Runs `stream`'s handshake on a thread of its own and, when the peer proved the secret,
    /// `then` on that thread. A connection beyond [`MAX_HANDSHAKES`] at once, or one that fails
    /// its handshake, is logged and closed.
    pub(crate) fn start(
        &self,
        mut stream: TcpStream,
        from: SocketAddr,
        then: impl FnOnce(TcpStream, SocketAddr) + Send + 'static,
    ) {
        let service = self.service;
        let Some(slot) = self.slots.take() else {
            tracing::warn!(%from, service, "refused a connection: {MAX_HANDSHAKES} handshakes are under way already");
            return;
        };
        let (secret, timeout) = (self.secret.clone(), self.timeout);
        let spawned = std::thread::Builder::new()
            .name(format!("{service} {from}"))
            .spawn(move || {
                let proven = accept(
                    &mut stream,
                    &from.to_string(),
                    (secret.as_ref(), service),
                    timeout,
                );
                drop(slot);
                match proven {
                    Ok(()) => then(stream, from),
                    Err(e) => tracing::warn!(%from, service, error = %e, "refused a connection"),
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(%from, service, error = %e, "no thread for a connection's handshake; it is closed");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        reason = "a test that meets an error must fail loudly"
    )]

    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::mpsc;

    use super::*;

    fn secret() -> ClusterSecret {
        ClusterSecret::new(*b"a secret of this test's cluster").unwrap()
    }

    /// A peer that sends a byte every `gap` for `bytes` bytes, then waits for the close.
    fn trickle(address: SocketAddr, bytes: usize, gap: Duration) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let mut stream = TcpStream::connect(address).unwrap();
            for _ in 0..bytes {
                if stream.write_all(&[0]).is_err() {
                    return;
                }
                std::thread::sleep(gap);
            }
            let _ = stream.read(&mut [0; 64]);
        })
    }

    #[test]
    fn a_peer_feeding_its_handshake_a_byte_at_a_time_is_cut_off_at_the_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        // Every byte well within any one read's timeout: only a deadline for the whole
        // exchange ends it.
        let peer = trickle(
            listener.local_addr().unwrap(),
            200,
            Duration::from_millis(20),
        );
        let (mut stream, from) = listener.accept().unwrap();
        let proven = accept(
            &mut stream,
            &from.to_string(),
            (Some(&secret()), "test"),
            Duration::from_millis(300),
        );
        assert!(
            matches!(&proven, Err(PsError::Connection { why, .. }) if why.contains("deadline")),
            "{proven:?}"
        );
        // Cut off while the peer still trickles its bytes (4 s of them), not when it stopped.
        assert!(!peer.is_finished(), "the handshake outlasted the peer");
        drop(stream);
        peer.join().unwrap();
    }

    #[test]
    fn silent_peers_beyond_the_limit_are_refused_while_a_client_with_the_secret_is_served() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let handshakes = Handshakes::new(Some(secret()), "test").within(Duration::from_secs(5));
        let (served, proven) = mpsc::channel();
        let silent: Vec<TcpStream> = (0..MAX_HANDSHAKES + 8)
            .map(|_| TcpStream::connect(address).unwrap())
            .collect();
        for _ in &silent {
            let (stream, from) = listener.accept().unwrap();
            let served = served.clone();
            handshakes.start(stream, from, move |_, from| {
                let _ = served.send(from);
            });
        }
        // The places are full: a connection now is closed at once, unproven.
        let mut late = TcpStream::connect(address).unwrap();
        let (stream, from) = listener.accept().unwrap();
        handshakes.start(stream, from, |_, _| {
            panic!("a connection past the limit was served")
        });
        late.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(late.read(&mut [0; 64]).unwrap(), 0, "it is closed");
        // The silent ones go; a client that proves the secret is served.
        drop(silent);
        let deadline = Instant::now() + Duration::from_secs(5);
        let client = std::thread::spawn(move || {
            dial(address, Some(&secret()), "test", Duration::from_secs(5)).unwrap()
        });
        let (stream, from) = listener.accept().unwrap();
        while handshakes.slots.taken() >= MAX_HANDSHAKES {
            assert!(
                Instant::now() < deadline,
                "the silent peers' places were never given back"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        handshakes.start(stream, from, move |_, from| {
            let _ = served.send(from);
        });
        let _stream = client.join().unwrap();
        assert_eq!(
            proven.recv_timeout(Duration::from_secs(5)).unwrap(),
            from,
            "only the client with the secret was served"
        );
    }
}
