//! The parameter-server service over real TCP on loopback: concurrent clients, the cluster
//! secret, hostile bytes, refusals that leave the connection usable, export and import.

#![allow(
    clippy::unwrap_used,
    reason = "a test that meets an error must fail loudly"
)]

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use lockstep_collective::{ClusterSecret, ServiceSide, authenticate_stream};
use lockstep_nn::{Optimizer, Sgd};
use lockstep_ps::protocol::SERVICE;
use lockstep_ps::{PsClient, PsError, PsServer, Rows, RunningServer, ShardKey, ShardState, StepId};

const TIMEOUT: Duration = Duration::from_secs(10);

/// Pushes each worker makes in the concurrency test.
const PUSHES: usize = 50;

fn secret() -> ClusterSecret {
    ClusterSecret::new(*b"a secret of this test's cluster").unwrap()
}

fn serve(secret: Option<ClusterSecret>) -> RunningServer {
    PsServer::new(secret)
        .spawn(TcpListener::bind("127.0.0.1:0").unwrap())
        .unwrap()
}

fn shard(key: &ShardKey, rows: u64, cols: u64, learning_rate: f32) -> ShardState {
    ShardState {
        key: Some(key.clone()),
        rows,
        cols,
        values: vec![0.0; (rows * cols) as usize],
        optimizer: serde_json::to_string(&Sgd::new(learning_rate).config()).unwrap(),
        ..ShardState::default()
    }
}

#[test]
fn workers_pushing_at_once_each_have_every_push_applied() {
    let server = serve(Some(secret()));
    let key = ShardKey::new("dense/kernel", 0);
    let mut first = PsClient::connect(server.address(), Some(&secret()), TIMEOUT).unwrap();
    assert_eq!(first.create(shard(&key, 4, 8, 0.5)).unwrap(), (true, 0));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (address, key) = (server.address(), key.clone());
            std::thread::spawn(move || {
                let mut ps = PsClient::connect(address, Some(&secret()), TIMEOUT).unwrap();
                // Every worker's create finds the shard made: the values stay.
                assert!(!ps.create(shard(&key, 4, 8, 0.5)).unwrap().0);
                for _ in 0..PUSHES {
                    ps.push(&key, &[w as f32 + 1.0; 32]).unwrap();
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    // SGD moves by −0.5 · g each push: 50 pushes of 1, 2, 3 and 4 each, in any order.
    let sum: f32 = (1..=4).map(|g| g as f32 * PUSHES as f32).sum();
    let values = first.pull(&key).unwrap();
    assert_eq!(values, vec![-0.5 * sum; 32]);
    let exported = first.export().unwrap();
    assert_eq!(exported.len(), 1);
    assert_eq!(exported[0].iterations, 4 * PUSHES as u64);
}

#[test]
fn a_client_without_the_secret_is_refused_and_the_server_serves_the_others() {
    let server = serve(Some(secret()));
    let other = ClusterSecret::new(*b"another cluster's secret bytes!").unwrap();
    for wrong in [Some(&other), None] {
        let e = PsClient::connect(server.address(), wrong, TIMEOUT)
            .err()
            .expect("refused");
        assert!(
            matches!(&e, PsError::Connection { why, .. } if why.contains("handshake")),
            "{e}"
        );
    }
    let mut ps = PsClient::connect(server.address(), Some(&secret()), TIMEOUT).unwrap();
    let key = ShardKey::new("v", 0);
    ps.create(shard(&key, 1, 2, 0.1)).unwrap();
    assert_eq!(ps.pull(&key).unwrap(), [0.0, 0.0]);
}

#[test]
fn garbage_after_the_handshake_closes_that_connection_only() {
    let server = serve(None);
    let mut hostile = TcpStream::connect(server.address()).unwrap();
    hostile.set_read_timeout(Some(TIMEOUT)).unwrap();
    authenticate_stream(&mut hostile, None, SERVICE, ServiceSide::Dialler).unwrap();
    // A frame of 12 bytes that are not a request, then a length over the limit.
    hostile.write_all(&12_u32.to_le_bytes()).unwrap();
    hostile.write_all(&[0xff; 12]).unwrap();
    hostile.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let mut buf = [0_u8; 1];
    let read = std::io::Read::read(&mut hostile, &mut buf);
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "the server closes it: {read:?}"
    );
    let mut ps = PsClient::connect(server.address(), None, TIMEOUT).unwrap();
    let key = ShardKey::new("v", 0);
    ps.create(shard(&key, 2, 1, 0.1)).unwrap();
    assert_eq!(ps.pull(&key).unwrap(), [0.0, 0.0]);
}

#[test]
fn a_refused_request_names_its_cause_and_the_connection_goes_on() {
    let server = serve(None);
    let mut ps = PsClient::connect(server.address(), None, TIMEOUT).unwrap();
    let key = ShardKey::new("embedding/embeddings", 0);
    ps.create(shard(&key, 10, 4, 1.0)).unwrap();
    let refusals = [
        ps.pull(&ShardKey::new("missing", 0)).unwrap_err(),
        ps.pull_rows(&key, &[10]).unwrap_err(),
        ps.push(&key, &[1.0; 3]).unwrap_err(),
        ps.push_rows(&key, &[1, 2], &[1.0; 4]).unwrap_err(),
    ];
    let causes = [
        "no such shard",
        "row 10 of a shard of 10 rows",
        "3 values",
        "for 2 rows of 4",
    ];
    for (e, cause) in refusals.iter().zip(causes) {
        assert!(
            matches!(e, PsError::Refused { why, .. } if why.contains(cause)),
            "{e} lacks {cause:?}"
        );
    }
    ps.push_rows(&key, &[7], &[1.0, 2.0, 3.0, 4.0]).unwrap();
    assert_eq!(
        ps.pull_rows(&key, &[7, 0]).unwrap(),
        [-1.0, -2.0, -3.0, -4.0, 0.0, 0.0, 0.0, 0.0]
    );
}

#[test]
fn shards_exported_from_one_server_and_imported_into_another_train_on_alike() {
    let (a, b) = (serve(None), serve(None));
    let mut first = PsClient::connect(a.address(), None, TIMEOUT).unwrap();
    let key = ShardKey::new("embedding/embeddings", 1);
    first.create(shard(&key, 6, 3, 0.25)).unwrap();
    first.push_rows(&key, &[5, 1, 5], &[1.0; 9]).unwrap();
    let mut second = PsClient::connect(b.address(), None, TIMEOUT).unwrap();
    second.import(first.export().unwrap()).unwrap();
    for ps in [&mut first, &mut second] {
        ps.push(&key, &[0.5; 18]).unwrap();
    }
    assert_eq!(first.export().unwrap(), second.export().unwrap());
    // A broken import is refused whole: the server keeps what it had.
    let mut broken = first.export().unwrap();
    broken[0].values.pop();
    assert!(matches!(
        second.import(broken),
        Err(PsError::Refused { .. })
    ));
    assert_eq!(second.pull(&key).unwrap(), first.pull(&key).unwrap());
}

#[test]
fn a_server_that_stops_answering_is_an_error_within_the_timeout_not_a_hang() {
    // A listener that accepts and then says nothing: the handshake waits for its nonce.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = silent.local_addr().unwrap();
    let started = std::time::Instant::now();
    let e = PsClient::connect(address, None, Duration::from_millis(300))
        .err()
        .expect("no answer");
    assert!(matches!(e, PsError::Connection { .. }), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    drop(silent);
}

#[test]
fn a_shutdown_request_is_answered_and_ends_the_service() {
    let server = serve(None);
    let mut ps = PsClient::connect(server.address(), None, TIMEOUT).unwrap();
    ps.shutdown().unwrap();
    // Returns at once: the request is recorded once its answer is sent (a ps task's process
    // ends when this returns, so the answer must be on its way by then).
    server.wait_for_shutdown();
}

#[test]
fn several_shards_pulled_and_pushed_in_one_request_each_move_as_alone() {
    let server = serve(None);
    let mut ps = PsClient::connect(server.address(), None, TIMEOUT).unwrap();
    let (a, b) = (
        ShardKey::new("dense/kernel", 0),
        ShardKey::new("dense/bias", 0),
    );
    ps.create(shard(&a, 2, 2, 1.0)).unwrap();
    ps.create(shard(&b, 1, 3, 1.0)).unwrap();
    let keys = [b.clone(), a.clone()];
    ps.push_shards(&keys, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
        .unwrap();
    assert_eq!(ps.pull(&b).unwrap(), [-1.0, -2.0, -3.0]);
    assert_eq!(
        ps.pull_shards(&keys).unwrap(),
        [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0]
    );
    // A gradient of the wrong total length is refused whole.
    let e = ps.push_shards(&keys, &[1.0; 6]).unwrap_err();
    assert!(
        matches!(&e, PsError::Refused { why, .. } if why.contains("6 values")),
        "{e}"
    );
    assert_eq!(ps.pull(&a).unwrap(), [-4.0, -5.0, -6.0, -7.0]);
}

#[test]
fn one_request_pulls_and_pushes_whole_shards_beside_some_rows_of_a_table() {
    let server = serve(None);
    let mut ps = PsClient::connect(server.address(), None, TIMEOUT).unwrap();
    let (table, bias) = (
        ShardKey::new("embedding/embeddings", 1),
        ShardKey::new("dense/bias", 0),
    );
    ps.create(shard(&table, 4, 2, 1.0)).unwrap();
    ps.create(shard(&bias, 1, 2, 1.0)).unwrap();
    let keys = [bias.clone(), table.clone()];
    let rows = || vec![Rows::every(), Rows::some(vec![3, 1])];
    // Row 3's gradient, then row 1's, after the bias': only those rows move.
    ps.push_shard_rows(&keys, rows(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], None)
        .unwrap();
    assert_eq!(
        ps.pull(&table).unwrap(),
        [0.0, 0.0, -5.0, -6.0, 0.0, 0.0, -3.0, -4.0]
    );
    assert_eq!(
        ps.pull_shard_rows(&keys, rows()).unwrap(),
        [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]
    );
    // A row past the shard, or selections that do not match the keys, change nothing.
    let past = vec![Rows::every(), Rows::some(vec![4])];
    let e = ps
        .push_shard_rows(&keys, past, &[1.0; 4], None)
        .unwrap_err();
    assert!(
        matches!(&e, PsError::Refused { why, .. } if why.contains("row 4")),
        "{e}"
    );
    let e = ps.pull_shard_rows(&keys, vec![Rows::every()]).unwrap_err();
    assert!(
        matches!(&e, PsError::Refused { why, .. } if why.contains("1 row selections for 2")),
        "{e}"
    );
    assert_eq!(ps.pull(&bias).unwrap(), [-1.0, -2.0]);
}

#[test]
fn a_step_pushed_again_after_its_worker_was_lost_is_applied_once() {
    let server = serve(None);
    let key = ShardKey::new("dense/kernel", 0);
    let (mut first, mut second) = (
        PsClient::connect(server.address(), None, TIMEOUT).unwrap(),
        PsClient::connect(server.address(), None, TIMEOUT).unwrap(),
    );
    first.create(shard(&key, 1, 2, 1.0)).unwrap();
    let keys = [key.clone()];
    let step = |number| Some(StepId { run: 7, number });
    // Step 0 from the worker that is then lost, and again from the one that reruns it.
    assert_eq!(
        first
            .push_shard_rows(&keys, Vec::new(), &[1.0, 1.0], step(0))
            .unwrap(),
        1
    );
    assert_eq!(
        second
            .push_shard_rows(&keys, Vec::new(), &[5.0, 5.0], step(0))
            .unwrap(),
        0
    );
    // Step 1, and step 0 of another coordinator's run, apply.
    assert_eq!(
        second
            .push_shard_rows(&keys, Vec::new(), &[2.0, 2.0], step(1))
            .unwrap(),
        1
    );
    let other_run = Some(StepId { run: 8, number: 0 });
    second
        .push_shard_rows(&keys, Vec::new(), &[4.0, 4.0], other_run)
        .unwrap();
    assert_eq!(first.pull(&key).unwrap(), [-7.0, -7.0]);
    assert_eq!(server.store().updates(), 3);
    // A refused push does not count as its step's: the step's next push applies.
    let e = first
        .push_shard_rows(&keys, Vec::new(), &[1.0], step(2))
        .unwrap_err();
    assert!(matches!(e, PsError::Refused { .. }), "{e}");
    first
        .push_shard_rows(&keys, Vec::new(), &[1.0, 1.0], step(2))
        .unwrap();
    assert_eq!(first.pull(&key).unwrap(), [-8.0, -8.0]);
}
