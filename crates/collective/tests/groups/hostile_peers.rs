//! The TCP rendezvous against broken and hostile connections: whatever else arrives, the
//! group's own ranks rendezvous within the deadline and reduce the right values, or a rank
//! fails naming the cause. Real sockets on 127.0.0.1; every wait is bounded.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use crate::common::{fresh_cluster, listeners};
use lockstep_collective::{
    ClusterSecret, CollectiveError, CommunicationOptions, Communicator, ReduceOp, SameHost,
    TcpOptions, TcpTransport,
};

/// The hello rank `rank` of a group of `world` sends, as anyone who knows the (public) cluster
/// identity can write it.
fn hello(cluster: u64, rank: u32, world: u32) -> Vec<u8> {
    let mut h = 0x4C53_4848_u32.to_le_bytes().to_vec();
    h.extend(cluster.to_le_bytes());
    h.extend(rank.to_le_bytes());
    h.extend(world.to_le_bytes());
    h.extend(0_u32.to_le_bytes());
    h
}

/// Rank 0's proof to rank 1 of a group of 2 with no secret (the key empty), as the handshake
/// computes it: whoever knows the protocol can, which is why a cluster wants a secret.
fn proof_without_secret(cluster: u64, dialler_nonce: &[u8], acceptor_nonce: &[u8]) -> Vec<u8> {
    dialler_proof(b"", cluster, dialler_nonce, acceptor_nonce)
}

/// Rank 0's proof to rank 1 of a group of 2 keyed by `key`.
fn dialler_proof(key: &[u8], cluster: u64, dialler_nonce: &[u8], acceptor_nonce: &[u8]) -> Vec<u8> {
    use hmac::{Hmac, KeyInit, Mac};
    let mut mac = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(key).unwrap();
    mac.update(b"lockstep dialler");
    mac.update(&1_u32.to_le_bytes());
    mac.update(&cluster.to_le_bytes());
    mac.update(&2_u64.to_le_bytes());
    mac.update(&0_u64.to_le_bytes());
    mac.update(&1_u64.to_le_bytes());
    mac.update(dialler_nonce);
    mac.update(acceptor_nonce);
    mac.finalize().into_bytes().to_vec()
}

/// Completes the handshake with rank 1 at `address` as rank 0 of a group of 2 with no secret,
/// as anyone who knows the protocol can (the key is empty), and returns the accepted stream.
fn handshake_as_rank0_without_a_secret(address: &str, cluster: u64) -> TcpStream {
    let mut stream = loop {
        if let Ok(stream) = TcpStream::connect(address) {
            break stream;
        }
        thread::sleep(Duration::from_millis(10));
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream.write_all(&hello(cluster, 0, 2)).unwrap();
    stream.write_all(&[7; 32]).unwrap(); // its nonce
    // Rank 1's hello, nonce and proof of the (empty) secret.
    let mut reply = [0_u8; 24 + 32 + 32];
    stream.read_exact(&mut reply).unwrap();
    let proof = proof_without_secret(cluster, &[7; 32], &reply[24..56]);
    stream.write_all(b"LSHC").unwrap();
    stream.write_all(&proof).unwrap();
    let mut verdict = [0_u8; 4];
    stream.read_exact(&mut verdict).unwrap();
    assert_eq!(&verdict, b"LSHA");
    stream
}

fn options(timeout: Duration) -> TcpOptions {
    TcpOptions {
        cluster: fresh_cluster(),
        rendezvous_timeout: timeout,
        // Over TCP only: the connections under test are TCP ones.
        same_host: SameHost::Tcp,
        ..TcpOptions::default()
    }
}

/// Starts rank 0 after `delay` and rank 1 at once on `listeners`, and returns each rank's
/// all-reduce of `[rank + 1, 2·(rank + 1)]` (or its error).
fn reduce_pair(
    mut listeners: Vec<TcpListener>,
    addresses: &[String],
    options: &TcpOptions,
    delay: Duration,
) -> Vec<Result<[f32; 2], CollectiveError>> {
    let handles: Vec<_> = [(0_usize, delay), (1, Duration::ZERO)]
        .into_iter()
        .map(|(rank, delay)| {
            let listener = listeners.remove(0);
            let (addresses, options) = (addresses.to_vec(), options.clone());
            thread::spawn(move || {
                thread::sleep(delay);
                let transport = TcpTransport::connect_on(listener, rank, &addresses, &options)?;
                let mut comm = Communicator::new(
                    transport,
                    CommunicationOptions {
                        timeout: Duration::from_secs(5),
                        ..CommunicationOptions::default()
                    },
                );
                let one = (rank + 1) as f32;
                let mut data = [one, 2.0 * one];
                comm.all_reduce(&mut data, ReduceOp::Sum).map(|()| data)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn assert_reduced(results: &[Result<[f32; 2], CollectiveError>]) {
    for result in results {
        assert_eq!(result.as_ref().unwrap(), &[3.0, 6.0]);
    }
}

#[test]
fn a_dialler_that_gave_up_leaves_no_stale_connection_behind() {
    let (listeners, addresses) = listeners(2);
    let options = options(Duration::from_secs(10));
    // Rank 0's hello, left in rank 1's backlog by a connection closed before rank 1 accepts
    // it: a dialler that gave up. Twice, so that one of them meets rank 1 mid-rendezvous.
    for _ in 0..2 {
        let mut stale = TcpStream::connect(&addresses[1]).unwrap();
        stale.write_all(&hello(options.cluster, 0, 2)).unwrap();
    }
    let results = reduce_pair(listeners, &addresses, &options, Duration::ZERO);
    assert_reduced(&results);
}

#[test]
fn a_silent_impostor_with_the_public_identity_does_not_take_a_rank_place() {
    let (listeners, addresses) = listeners(2);
    let options = options(Duration::from_secs(10));
    // Says rank 0's hello to rank 1 first, then stays connected and silent.
    let mut impostor = TcpStream::connect(&addresses[1]).unwrap();
    impostor.write_all(&hello(options.cluster, 0, 2)).unwrap();
    let results = reduce_pair(listeners, &addresses, &options, Duration::from_millis(200));
    assert_reduced(&results);
    drop(impostor);
}

#[test]
fn a_hello_fed_a_byte_at_a_time_does_not_hold_up_the_rendezvous() {
    let (listeners, addresses) = listeners(2);
    let options = options(Duration::from_secs(6));
    let hello = hello(options.cluster, 0, 2);
    let target = addresses[1].clone();
    // One byte every 300 ms: the whole hello would take 7 s, past the rendezvous deadline.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let drip = thread::spawn({
        let stop = std::sync::Arc::clone(&stop);
        move || {
            let mut stream = TcpStream::connect(&target).unwrap();
            for byte in hello {
                if stop.load(std::sync::atomic::Ordering::Relaxed)
                    || stream.write_all(&[byte]).is_err()
                {
                    return;
                }
                thread::sleep(Duration::from_millis(300));
            }
        }
    });
    let results = reduce_pair(listeners, &addresses, &options, Duration::from_millis(200));
    assert_reduced(&results);
    // Formed while the drip was still feeding its hello: not held up by it.
    assert!(!drip.is_finished(), "the rendezvous waited for the drip");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    drip.join().unwrap();
}

#[test]
fn a_refusal_is_not_taken_for_acceptance() {
    let (mut listeners, addresses) = listeners(2);
    let options = options(Duration::from_secs(3));
    let (a1, o1, l1) = (addresses.clone(), options.clone(), listeners.remove(1));
    let rank1 = thread::spawn(move || TcpTransport::connect_on(l1, 1, &a1, &o1));
    // An impostor that knows the protocol completes the handshake as rank 0 first: without a
    // shared secret nothing tells it apart, but the real rank 0, refused, must say so.
    let impostor = handshake_as_rank0_without_a_secret(&addresses[1], options.cluster);
    let err = TcpTransport::connect_on(listeners.remove(0), 0, &addresses, &options)
        .err()
        .unwrap();
    // Refused, which a timeout would not say.
    assert!(err.to_string().contains("refused"), "{err}");
    drop(rank1.join().unwrap());
    drop(impostor);
}

fn secret(text: &str) -> ClusterSecret {
    ClusterSecret::new(text.as_bytes()).unwrap()
}

#[test]
fn a_process_without_the_secret_takes_no_place_and_the_group_forms() {
    let (listeners, addresses) = listeners(2);
    let options = TcpOptions {
        secret: Some(secret("the secret of this cluster")),
        ..options(Duration::from_secs(10))
    };
    // Two impostors dial rank 1 as rank 0 with the public identity first: one with another
    // secret, one with none. Each fails, saying why; neither takes the place.
    let impostors: Vec<_> = [Some(secret("another secret entirely")), None]
        .into_iter()
        .map(|wrong| {
            let (addresses, options) = (
                addresses.clone(),
                TcpOptions {
                    secret: wrong,
                    rendezvous_timeout: Duration::from_secs(2),
                    ..options.clone()
                },
            );
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            thread::spawn(move || TcpTransport::connect_on(listener, 0, &addresses, &options))
        })
        .collect();
    let results = reduce_pair(listeners, &addresses, &options, Duration::from_millis(300));
    assert_reduced(&results);
    for impostor in impostors {
        let err = impostor.join().unwrap().err().unwrap().to_string();
        assert!(err.contains("cluster secret"), "{err}");
    }
}

#[test]
fn ranks_given_different_secrets_both_fail_naming_the_secret() {
    let (mut listeners, addresses) = listeners(2);
    let base = options(Duration::from_secs(2));
    let (a0, l0) = (addresses.clone(), listeners.remove(0));
    let o0 = TcpOptions {
        secret: Some(secret("the secret of rank zero")),
        ..base.clone()
    };
    let rank0 = thread::spawn(move || TcpTransport::connect_on(l0, 0, &a0, &o0));
    let o1 = TcpOptions {
        secret: Some(secret("the secret of rank one!")),
        ..base
    };
    let rank1 = TcpTransport::connect_on(listeners.remove(0), 1, &addresses, &o1);
    let errors =
        [rank0.join().unwrap().err().unwrap(), rank1.err().unwrap()].map(|e| e.to_string());
    assert!(errors[0].contains("cluster secret"), "{}", errors[0]);
    assert!(
        errors[1].contains("did not connect") && errors[1].contains("cluster secret"),
        "{}",
        errors[1]
    );
}

#[test]
fn ranks_sharing_a_secret_over_every_same_host_path_reduce() {
    for same_host in [SameHost::Tcp, SameHost::UnixSocket, SameHost::SharedMemory] {
        let (listeners, addresses) = listeners(2);
        let options = TcpOptions {
            secret: Some(secret("the secret of this cluster")),
            same_host,
            ..options(Duration::from_secs(10))
        };
        let results = reduce_pair(listeners, &addresses, &options, Duration::ZERO);
        assert_reduced(&results);
    }
}

#[test]
fn a_replayed_handshake_takes_no_place_and_the_group_forms() {
    let (listeners, addresses) = listeners(2);
    let key = b"the secret of this cluster";
    let options = TcpOptions {
        secret: Some(secret("the secret of this cluster")),
        ..options(Duration::from_secs(10))
    };
    // What a recorded handshake of rank 0 holds: its hello and nonce, and a confirmation
    // whose proof is valid, for the nonce rank 1 sent then. Replayed, rank 1's nonce is new.
    let (recorded_nonce, old_acceptor_nonce) = ([5_u8; 32], [6_u8; 32]);
    let recorded_proof = dialler_proof(key, options.cluster, &recorded_nonce, &old_acceptor_nonce);
    let mut replay = TcpStream::connect(&addresses[1]).unwrap();
    replay
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    replay.write_all(&hello(options.cluster, 0, 2)).unwrap();
    replay.write_all(&recorded_nonce).unwrap();
    let (listeners, addresses, options) = (listeners, addresses, options);
    let started = thread::spawn({
        let (addresses, options) = (addresses.clone(), options.clone());
        move || reduce_pair(listeners, &addresses, &options, Duration::from_millis(300))
    });
    let mut reply = [0_u8; 24 + 32 + 32];
    replay.read_exact(&mut reply).unwrap();
    assert_ne!(&reply[24..56], &old_acceptor_nonce);
    replay.write_all(b"LSHC").unwrap();
    replay.write_all(&recorded_proof).unwrap();
    let mut verdict = [0_u8; 4];
    replay.read_exact(&mut verdict).unwrap();
    assert_eq!(&verdict, b"LSHR");
    let results = started.join().unwrap();
    assert_reduced(&results);
}

#[test]
fn a_frame_announcing_more_than_the_limit_fails_the_rank_naming_it() {
    let (mut listeners, addresses) = listeners(2);
    // No secret: whoever knows the protocol completes the handshake, as a peer that is in
    // the cluster but broken or hostile would.
    let options = options(Duration::from_secs(5));
    let (a1, o1, l1) = (addresses.clone(), options.clone(), listeners.remove(1));
    let rank1 = thread::spawn(move || {
        let transport = TcpTransport::connect_on(l1, 1, &a1, &o1)?;
        let mut comm = Communicator::new(
            transport,
            CommunicationOptions {
                timeout: Duration::from_secs(5),
                ..CommunicationOptions::default()
            },
        );
        let mut data = [1.0_f32, 2.0];
        comm.all_reduce(&mut data, ReduceOp::Sum).map(|()| data)
    });
    let mut peer = handshake_as_rank0_without_a_secret(&addresses[1], options.cluster);
    // A well-formed header of this cluster whose payload is 4 GiB: refused on its length,
    // before any of it is read or allocated.
    let header = lockstep_collective::Header {
        kind: lockstep_collective::Kind::Data,
        op: lockstep_collective::Op::AllReduce,
        dtype: lockstep_collective::DType::F32,
        reduce: 0,
        cluster: options.cluster,
        seq: 0,
        count: 2,
        source: 0,
    };
    let mut frame = bytes::BytesMut::new();
    header.encode(u32::MAX, &mut frame);
    peer.write_all(&frame).unwrap();
    let err = rank1.join().unwrap().err().unwrap().to_string();
    // Refused on the length, which a timeout would not say.
    assert!(err.contains("limit"), "{err}");
    drop(peer);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(8))]

    /// Whatever a stranger sends in place of a handshake (a hello of the public identity and
    /// a nonce first, or not, then any bytes as its confirmation), it takes no place: the
    /// group forms and reduces.
    #[test]
    fn any_bytes_sent_as_a_handshake_take_no_place_and_the_group_forms(
        introduced: bool,
        garbage in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..120),
    ) {
        let (listeners, addresses) = listeners(2);
        let options = TcpOptions {
            secret: Some(secret("the secret of this cluster")),
            ..options(Duration::from_secs(10))
        };
        let mut stranger = TcpStream::connect(&addresses[1]).unwrap();
        if introduced {
            stranger.write_all(&hello(options.cluster, 0, 2)).unwrap();
            stranger.write_all(&[3; 32]).unwrap();
        }
        stranger.write_all(&garbage).unwrap();
        let results = reduce_pair(listeners, &addresses, &options, Duration::from_millis(100));
        assert_reduced(&results);
        drop(stranger);
    }
}
