//! Opening a connection of the services beside the collectives (a parameter server's, a
//! worker's step service): both ends prove the cluster secret, bound to the service's name,
//! before any message.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use lockstep_collective::{ClusterSecret, ServiceSide, authenticate_stream};

use crate::error::PsError;
use crate::protocol;

/// How long a new connection has to prove the cluster secret to the end that accepted it.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to `address` for `service`, proven both ways: with keepalive (a host that
/// vanishes ends it), and `timeout` on connecting, the handshake and every later read and
/// write (the caller may lift it).
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
        .and_then(|()| stream.set_read_timeout(Some(timeout)))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| failed("setting up", e))?;
    authenticate_stream(&mut stream, secret, service, ServiceSide::Dialler).map_err(|e| {
        PsError::Connection {
            peer,
            why: e.to_string(),
        }
    })?;
    Ok(stream)
}

/// Proves `secret` for `service` on an accepted connection from `peer`, within
/// [`HANDSHAKE_TIMEOUT`] a read; then lifts the read deadline (a client may stay idle).
///
/// # Errors
///
/// [`PsError::Connection`] when the handshake fails or the socket cannot be set up.
pub(crate) fn accept(
    stream: &mut TcpStream,
    peer: &str,
    secret: Option<&ClusterSecret>,
    service: &str,
) -> Result<(), PsError> {
    let setup = |e: io::Error| protocol::connection(peer, "setting up", &e);
    stream.set_nonblocking(false).map_err(setup)?;
    stream.set_nodelay(true).map_err(setup)?;
    stream
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(setup)?;
    stream
        .set_write_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(setup)?;
    authenticate_stream(stream, secret, service, ServiceSide::Acceptor).map_err(|e| {
        PsError::Connection {
            peer: peer.to_owned(),
            why: e.to_string(),
        }
    })?;
    stream.set_read_timeout(None).map_err(setup)
}
