//! The cluster secret: what every connection of a group proves it knows, in both directions,
//! before it is let in.
//!
//! A connection's handshake (the TCP transport's rendezvous, same-host sockets included)
//! exchanges a fresh random nonce from each side, and each side answers the other's with an
//! HMAC-SHA-256, keyed by the secret, over both nonces, the cluster identity, both ranks, the
//! world size and the protocol version ([`Proof`]). A process without the secret cannot take a
//! rank's place, and a recorded handshake replays to nothing: the other side's nonce is new
//! each time. Without a secret the key is empty: the same exchange, which proves nothing, and
//! a task with a secret refuses a peer without one (and the other way round).

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::error::CollectiveError;

#[cfg(any(feature = "grpc", test))]
pub(crate) use lockstep_cluster::to_hex;
pub use lockstep_cluster::{SECRET_FILE_VARIABLE, SECRET_VARIABLE};

/// The shortest secret accepted: 128 bits.
pub const MIN_SECRET_LEN: usize = 16;

/// A secret that every task of one cluster holds. Its bytes never appear in `Debug` output or
/// in errors.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSecret(Arc<[u8]>);

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

fn secret_error(why: impl fmt::Display) -> CollectiveError {
    CollectiveError::InvalidArgument {
        op: "cluster secret",
        why: why.to_string(),
    }
}

impl ClusterSecret {
    /// A secret of these bytes.
    ///
    /// # Errors
    ///
    /// When it is shorter than [`MIN_SECRET_LEN`] bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, CollectiveError> {
        let bytes = bytes.into();
        if bytes.len() < MIN_SECRET_LEN {
            return Err(secret_error(format!(
                "a cluster secret must be at least {MIN_SECRET_LEN} bytes long, not {}",
                bytes.len()
            )));
        }
        Ok(Self(bytes.into()))
    }

    /// A fresh random secret (32 bytes from the operating system's generator), written as 64
    /// hexadecimal digits: what a launcher hands to each task of a new job.
    ///
    /// # Errors
    ///
    /// When the operating system's random generator fails.
    pub fn generate_hex() -> Result<String, CollectiveError> {
        lockstep_cluster::generate_secret_hex().map_err(secret_error)
    }

    /// The secret the environment gives: [`SECRET_VARIABLE`] itself, or the contents of the
    /// file [`SECRET_FILE_VARIABLE`] names (one trailing newline ignored), or none.
    ///
    /// # Errors
    ///
    /// Both variables set, a secret that is too short, or a file that cannot be read or that
    /// others than its owner may read.
    pub fn from_env() -> Result<Option<Self>, CollectiveError> {
        let value = std::env::var_os(SECRET_VARIABLE).filter(|v| !v.is_empty());
        let file = std::env::var_os(SECRET_FILE_VARIABLE).filter(|v| !v.is_empty());
        match (value, file) {
            (Some(_), Some(_)) => Err(secret_error(format!(
                "both {SECRET_VARIABLE} and {SECRET_FILE_VARIABLE} are set: set one"
            ))),
            (Some(value), None) => Self::new(value.into_encoded_bytes()).map(Some),
            (None, Some(path)) => Self::from_file(Path::new(&path)).map(Some),
            (None, None) => Ok(None),
        }
    }

    /// The secret held in the file at `path` (one trailing newline ignored).
    ///
    /// # Errors
    ///
    /// A file that cannot be read, that its group or others may read, or whose secret is too
    /// short.
    pub fn from_file(path: &Path) -> Result<Self, CollectiveError> {
        use std::os::unix::fs::MetadataExt as _;
        let unreadable = |e: std::io::Error| {
            secret_error(format!("reading the secret file {}: {e}", path.display()))
        };
        let metadata = std::fs::metadata(path).map_err(unreadable)?;
        if metadata.mode() & 0o077 != 0 {
            return Err(secret_error(format!(
                "the secret file {} may be read by others than its owner (mode {:o}): chmod 600 it",
                path.display(),
                metadata.mode() & 0o777
            )));
        }
        let mut bytes = std::fs::read(path).map_err(unreadable)?;
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
            if bytes.last() == Some(&b'\r') {
                bytes.pop();
            }
        }
        Self::new(bytes)
    }
}

/// The bytes of hexadecimal `text`, or `None` where it is not that.
#[cfg(any(feature = "grpc", test))]
pub(crate) fn from_hex(text: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| char::from(c).to_digit(16).map(|d| d as u8);
    let text = text.as_bytes();
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.chunks_exact(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

/// Bytes of a handshake nonce.
pub(crate) const NONCE_LEN: usize = 32;
/// Bytes of a [`Proof`].
pub(crate) const PROOF_LEN: usize = 32;

/// A fresh nonce for one handshake.
pub(crate) fn nonce() -> std::io::Result<[u8; NONCE_LEN]> {
    let mut nonce = [0_u8; NONCE_LEN];
    getrandom::fill(&mut nonce).map_err(std::io::Error::other)?;
    Ok(nonce)
}

/// Which side of a connection a proof speaks for: each side's proof differs, so one cannot
/// be reflected back as the other's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Dialler,
    Acceptor,
}

/// What one handshake's proofs cover, besides the nonces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Binding {
    pub(crate) version: u32,
    pub(crate) cluster: u64,
    pub(crate) world: usize,
    pub(crate) dialler: usize,
    pub(crate) acceptor: usize,
}

/// The HMAC-SHA-256 one side of a handshake sends: keyed by the secret (empty without one),
/// over the side, the binding and both nonces (the dialler's first).
pub(crate) struct Proof;

impl Proof {
    fn mac(
        secret: Option<&ClusterSecret>,
        side: Side,
        binding: Binding,
        nonces: (&[u8; NONCE_LEN], &[u8; NONCE_LEN]),
    ) -> Hmac<Sha256> {
        let label: &[u8] = match side {
            Side::Dialler => b"lockstep dialler",
            Side::Acceptor => b"lockstep acceptor",
        };
        let mut context = Vec::with_capacity(36);
        context.extend_from_slice(&binding.version.to_le_bytes());
        context.extend_from_slice(&binding.cluster.to_le_bytes());
        context.extend_from_slice(&(binding.world as u64).to_le_bytes());
        context.extend_from_slice(&(binding.dialler as u64).to_le_bytes());
        context.extend_from_slice(&(binding.acceptor as u64).to_le_bytes());
        keyed(secret, label, &context, nonces)
    }

    /// `side`'s proof for this handshake.
    pub(crate) fn make(
        secret: Option<&ClusterSecret>,
        side: Side,
        binding: Binding,
        nonces: (&[u8; NONCE_LEN], &[u8; NONCE_LEN]),
    ) -> [u8; PROOF_LEN] {
        let mut out = [0_u8; PROOF_LEN];
        out.copy_from_slice(
            &Self::mac(secret, side, binding, nonces)
                .finalize()
                .into_bytes(),
        );
        out
    }

    /// Whether `proof` is `side`'s for this handshake (compared in constant time).
    pub(crate) fn check(
        secret: Option<&ClusterSecret>,
        side: Side,
        binding: Binding,
        nonces: (&[u8; NONCE_LEN], &[u8; NONCE_LEN]),
        proof: &[u8],
    ) -> bool {
        Self::mac(secret, side, binding, nonces)
            .verify_slice(proof)
            .is_ok()
    }
}

/// HMAC-SHA-256 keyed by the secret (empty without one) over `label`, `context` and both
/// nonces (the dialler's first).
fn keyed(
    secret: Option<&ClusterSecret>,
    label: &[u8],
    context: &[u8],
    nonces: (&[u8; NONCE_LEN], &[u8; NONCE_LEN]),
) -> Hmac<Sha256> {
    let key: &[u8] = secret.map_or(&[], |s| &s.0);
    // HMAC takes a key of any length.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of every length"));
    mac.update(label);
    mac.update(context);
    mac.update(nonces.0);
    mac.update(nonces.1);
    mac
}

/// Which end of a service connection this is: the one that connected, or the one that
/// accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceSide {
    /// The end that connected (a client).
    Dialler,
    /// The end that accepted (the server).
    Acceptor,
}

/// Proves the cluster secret to the other end of `stream` and checks the other end's proof,
/// before a service beside the collectives (a parameter server's, say) reads any request.
///
/// Each end sends a fresh 32-byte nonce, then an HMAC-SHA-256 keyed by the secret over its
/// side, the `service` name and both nonces; each checks the other's in constant time. The
/// same exchange as the collectives' handshake, bound to the service's name, so a proof made
/// for one service or side is worth nothing for another, and a recorded exchange replays to
/// nothing. Without a secret on both ends the exchange proves nothing, as a cluster without a
/// secret trusts whoever reaches it; an end with a secret refuses one without. It admits the
/// connection; what travels after it is neither encrypted nor authenticated, as on the
/// collectives' own connections (`docs/SECURITY.md`: run the cluster on a network you control,
/// or under a transport that encrypts).
///
/// ```
/// use std::os::unix::net::UnixStream;
/// use lockstep_collective::{ClusterSecret, ServiceSide, authenticate_stream};
///
/// let secret = ClusterSecret::new(*b"0123456789abcdef")?;
/// let (mut a, mut b) = UnixStream::pair()?;
/// let other = secret.clone();
/// let server = std::thread::spawn(move || {
///     authenticate_stream(&mut b, Some(&other), "ps", ServiceSide::Acceptor)
/// });
/// authenticate_stream(&mut a, Some(&secret), "ps", ServiceSide::Dialler)?;
/// server.join().unwrap()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// [`CollectiveError::Setup`] naming the cause: the other end's proof is wrong (another
/// secret, or none), or the stream failed or closed (its deadline is the stream's own: set
/// read and write timeouts first).
pub fn authenticate_stream<S: std::io::Read + std::io::Write>(
    stream: &mut S,
    secret: Option<&ClusterSecret>,
    service: &str,
    side: ServiceSide,
) -> Result<(), CollectiveError> {
    let failed = |what: &str, e: std::io::Error| {
        CollectiveError::Setup(format!("the {service} handshake: {what}: {e}"))
    };
    let mine = nonce().map_err(|e| failed("drawing a nonce", e))?;
    stream
        .write_all(&mine)
        .and_then(|()| stream.flush())
        .map_err(|e| failed("sending the nonce", e))?;
    let mut theirs = [0_u8; NONCE_LEN];
    stream
        .read_exact(&mut theirs)
        .map_err(|e| failed("reading the other end's nonce", e))?;
    let nonces = match side {
        ServiceSide::Dialler => (&mine, &theirs),
        ServiceSide::Acceptor => (&theirs, &mine),
    };
    let label = |side: ServiceSide| -> &'static [u8] {
        match side {
            ServiceSide::Dialler => b"lockstep service dialler",
            ServiceSide::Acceptor => b"lockstep service acceptor",
        }
    };
    let other = match side {
        ServiceSide::Dialler => ServiceSide::Acceptor,
        ServiceSide::Acceptor => ServiceSide::Dialler,
    };
    let proof = keyed(secret, label(side), service.as_bytes(), nonces).finalize();
    stream
        .write_all(&proof.into_bytes())
        .and_then(|()| stream.flush())
        .map_err(|e| failed("sending the proof", e))?;
    let mut answer = [0_u8; PROOF_LEN];
    stream
        .read_exact(&mut answer)
        .map_err(|e| failed("reading the other end's proof", e))?;
    keyed(secret, label(other), service.as_bytes(), nonces)
        .verify_slice(&answer)
        .map_err(|_| {
            CollectiveError::Setup(format!(
                "the {service} handshake: the other end did not prove it holds this task's \
                 cluster secret (another secret, or none)"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BINDING: Binding = Binding {
        version: 1,
        cluster: 7,
        world: 2,
        dialler: 1,
        acceptor: 0,
    };

    #[test]
    fn a_proof_checks_only_with_the_same_secret_side_binding_and_nonces() {
        let secret = ClusterSecret::new(*b"0123456789abcdef").unwrap();
        let other = ClusterSecret::new(*b"0123456789abcdeF").unwrap();
        let (a, b) = ([1_u8; NONCE_LEN], [2_u8; NONCE_LEN]);
        let proof = Proof::make(Some(&secret), Side::Dialler, BINDING, (&a, &b));
        assert!(Proof::check(
            Some(&secret),
            Side::Dialler,
            BINDING,
            (&a, &b),
            &proof
        ));
        assert!(!Proof::check(
            Some(&other),
            Side::Dialler,
            BINDING,
            (&a, &b),
            &proof
        ));
        assert!(!Proof::check(
            None,
            Side::Dialler,
            BINDING,
            (&a, &b),
            &proof
        ));
        assert!(!Proof::check(
            Some(&secret),
            Side::Acceptor,
            BINDING,
            (&a, &b),
            &proof
        ));
        assert!(!Proof::check(
            Some(&secret),
            Side::Dialler,
            BINDING,
            (&b, &a),
            &proof
        ));
        let moved = Binding {
            dialler: 0,
            acceptor: 1,
            ..BINDING
        };
        assert!(!Proof::check(
            Some(&secret),
            Side::Dialler,
            moved,
            (&a, &b),
            &proof
        ));
    }

    proptest::proptest! {
        #[test]
        fn hex_round_trips_and_any_text_parses_or_is_refused(bytes: Vec<u8>, text in ".{0,80}") {
            proptest::prop_assert_eq!(from_hex(&to_hex(&bytes)), Some(bytes));
            if let Some(parsed) = from_hex(&text) {
                proptest::prop_assert_eq!(to_hex(&parsed), text.to_ascii_lowercase());
            }
        }
    }

    #[test]
    fn short_secrets_are_refused_and_debug_output_hides_the_bytes() {
        assert!(ClusterSecret::new(*b"short").is_err());
        let secret = ClusterSecret::new(*b"a secret of enough bytes").unwrap();
        assert_eq!(format!("{secret:?}"), "ClusterSecret(..)");
        let hex = ClusterSecret::generate_hex().unwrap();
        assert_eq!(hex.len(), 64);
        assert_ne!(hex, ClusterSecret::generate_hex().unwrap());
    }

    #[test]
    fn a_secret_file_readable_by_others_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = ClusterSecret::from_file(&path).unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let secret = ClusterSecret::from_file(&path).unwrap();
        assert_eq!(
            secret,
            ClusterSecret::new(*b"0123456789abcdef0123").unwrap()
        );
    }

    #[test]
    fn a_service_handshake_passes_with_one_secret_and_fails_with_another_or_none() {
        use std::os::unix::net::UnixStream;
        let secret = ClusterSecret::new(*b"0123456789abcdef").unwrap();
        let other = ClusterSecret::new(*b"0123456789abcdeF").unwrap();
        let run = |client: Option<ClusterSecret>,
                   server: Option<ClusterSecret>,
                   service: &'static str| {
            let (mut a, mut b) = UnixStream::pair().unwrap();
            let accepted = std::thread::spawn(move || {
                authenticate_stream(&mut b, server.as_ref(), "ps", ServiceSide::Acceptor)
            });
            let dialled =
                authenticate_stream(&mut a, client.as_ref(), service, ServiceSide::Dialler);
            (dialled, accepted.join().unwrap())
        };
        let (a, b) = run(Some(secret.clone()), Some(secret.clone()), "ps");
        assert!(a.is_ok() && b.is_ok(), "{a:?} {b:?}");
        for (client, server, service) in [
            (Some(other.clone()), Some(secret.clone()), "ps"),
            (None, Some(secret.clone()), "ps"),
            (Some(secret.clone()), None, "ps"),
            (Some(secret.clone()), Some(secret.clone()), "coordinator"),
        ] {
            let (a, b) = run(client, server, service);
            let message = b.unwrap_err().to_string();
            assert!(message.contains("did not prove"), "{message}");
            assert!(a.is_err());
        }
    }

    #[test]
    fn a_service_handshake_with_a_closed_stream_is_an_error_not_a_hang() {
        use std::os::unix::net::UnixStream;
        let (mut a, b) = UnixStream::pair().unwrap();
        drop(b);
        let e = authenticate_stream(&mut a, None, "ps", ServiceSide::Dialler).unwrap_err();
        assert!(e.to_string().contains("the ps handshake"), "{e}");
    }
}
