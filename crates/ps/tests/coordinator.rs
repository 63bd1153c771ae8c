//! The coordinator and workers' step services over real TCP on loopback: scheduling, results,
//! a worker killed mid-step, a worker restarted, failing and unknown steps, the secret.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "a test that meets an error must fail loudly; one step panics on purpose"
)]

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockstep_collective::ClusterSecret;
use lockstep_ps::{
    ClusterCoordinator, CoordinatorOptions, PsError, RemoteValue, RunningWorker, StepRegistry,
    StepServer,
};

/// A worker's state in these tests: its name, how many steps it ran, and where it says that a
/// step started.
struct Worker {
    name: &'static str,
    runs: Arc<AtomicUsize>,
    started: Mutex<Sender<&'static str>>,
}

fn registry(step_time: Duration) -> StepRegistry<Worker> {
    StepRegistry::new()
        .with("square", move |w: &mut Worker, args: &[u8]| {
            let _ = w.started.lock().unwrap().send(w.name);
            std::thread::sleep(step_time);
            let x = u64::from_le_bytes(args.try_into().map_err(|_| "not a u64".to_owned())?);
            w.runs.fetch_add(1, Ordering::SeqCst);
            Ok((x * x).to_le_bytes().to_vec())
        })
        .with("fail", |_: &mut Worker, _: &[u8]| {
            Err("the batch was empty".to_owned())
        })
        .with(
            "crash",
            |_: &mut Worker, _: &[u8]| -> Result<Vec<u8>, String> {
                panic!("this step takes its worker down")
            },
        )
}

fn worker(
    name: &'static str,
    at: &str,
    step_time: Duration,
    secret: Option<ClusterSecret>,
    started: Sender<&'static str>,
) -> (RunningWorker, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let running = StepServer::new(registry(step_time), secret)
        .spawn(TcpListener::bind(at).unwrap(), move || Worker {
            name,
            runs: counted,
            started: Mutex::new(started),
        })
        .unwrap();
    (running, runs)
}

fn options(secret: Option<ClusterSecret>) -> CoordinatorOptions {
    CoordinatorOptions {
        secret,
        connect_timeout: Duration::from_secs(5),
        retry_interval: Duration::from_millis(20),
    }
}

fn square(x: u64) -> Vec<u8> {
    x.to_le_bytes().to_vec()
}

fn read(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes.try_into().unwrap())
}

#[test]
fn every_scheduled_step_runs_once_and_its_result_comes_back() {
    let secret = ClusterSecret::new(*b"a secret of this test's cluster").unwrap();
    let (tx, _rx) = channel();
    let workers: Vec<_> = ["w0", "w1", "w2"]
        .into_iter()
        .map(|n| {
            worker(
                n,
                "127.0.0.1:0",
                Duration::from_millis(2),
                Some(secret.clone()),
                tx.clone(),
            )
        })
        .collect();
    let addresses: Vec<SocketAddr> = workers.iter().map(|(w, _)| w.address()).collect();
    let coordinator = ClusterCoordinator::new(&addresses, &options(Some(secret))).unwrap();
    let values: Vec<_> = (0..60)
        .map(|x| coordinator.schedule("square", square(x)))
        .collect();
    coordinator.join().unwrap();
    assert!(coordinator.done());
    for (x, value) in values.iter().enumerate() {
        assert!(value.is_ready());
        assert_eq!(read(&value.fetch().unwrap()), (x * x) as u64);
    }
    let runs: Vec<usize> = workers
        .iter()
        .map(|(_, r)| r.load(Ordering::SeqCst))
        .collect();
    assert_eq!(runs.iter().sum::<usize>(), 60, "{runs:?}");
    assert!(
        runs.iter().all(|&r| r > 0),
        "every free worker takes steps: {runs:?}"
    );
    assert_eq!(coordinator.retried(), 0);
}

#[test]
fn a_worker_killed_mid_step_has_its_step_run_on_another_and_training_goes_on() {
    let (tx, rx) = channel();
    let (doomed, _) = worker(
        "doomed",
        "127.0.0.1:0",
        Duration::from_millis(100),
        None,
        tx.clone(),
    );
    let (survivor, survivor_runs) = worker(
        "survivor",
        "127.0.0.1:0",
        Duration::from_millis(5),
        None,
        tx,
    );
    let coordinator =
        ClusterCoordinator::new(&[doomed.address(), survivor.address()], &options(None)).unwrap();
    let values: Vec<_> = (0..40)
        .map(|x| coordinator.schedule("square", square(x)))
        .collect();
    // Kill the doomed worker while it is inside a step.
    while rx.recv_timeout(Duration::from_secs(10)).unwrap() != "doomed" {}
    doomed.kill();
    coordinator.join().unwrap();
    for (x, value) in values.iter().enumerate() {
        assert_eq!(read(&value.fetch().unwrap()), (x * x) as u64, "step {x}");
    }
    assert!(
        coordinator.retried() >= 1,
        "the killed worker's step ran again"
    );
    assert!(survivor_runs.load(Ordering::SeqCst) >= 39);
}

#[test]
fn a_restarted_worker_rejoins_and_takes_steps_again() {
    let (tx, _rx) = channel();
    let (first, first_runs) = worker(
        "w0",
        "127.0.0.1:0",
        Duration::from_millis(1),
        None,
        tx.clone(),
    );
    let address = first.address();
    let coordinator = ClusterCoordinator::new(&[address], &options(None)).unwrap();
    coordinator.schedule("square", square(3)).fetch().unwrap();
    assert_eq!(first_runs.load(Ordering::SeqCst), 1);
    first.kill();
    // Scheduled while the only worker is gone: it waits for the worker's return.
    let waiting = coordinator.schedule("square", square(4));
    std::thread::sleep(Duration::from_millis(100));
    assert!(!waiting.is_ready());
    let (_restarted, restarted_runs) = worker(
        "w0 again",
        &address.to_string(),
        Duration::from_millis(1),
        None,
        tx,
    );
    assert_eq!(read(&waiting.fetch().unwrap()), 16);
    coordinator.join().unwrap();
    assert_eq!(restarted_runs.load(Ordering::SeqCst), 1);
}

#[test]
fn a_failing_or_unknown_step_is_an_error_at_fetch_and_join_and_the_others_still_run() {
    let (tx, _rx) = channel();
    let (w, _) = worker("w0", "127.0.0.1:0", Duration::ZERO, None, tx);
    let coordinator = ClusterCoordinator::new(&[w.address()], &options(None)).unwrap();
    let failing = coordinator.schedule("fail", Vec::new());
    let unknown = coordinator.schedule("no such step", Vec::new());
    let fine = coordinator.schedule("square", square(5));
    let e = coordinator.join().unwrap_err();
    assert!(
        matches!(&e, PsError::Step { step, why, .. } if step == "fail" && why.contains("empty")),
        "{e}"
    );
    assert_eq!(read(&fine.fetch().unwrap()), 25);
    assert!(matches!(failing.fetch(), Err(PsError::Step { .. })));
    let e = unknown.fetch().unwrap_err();
    assert!(
        e.to_string().contains("\"square\""),
        "names the registered steps: {e}"
    );
    // The error was reported once: the next join is clean.
    coordinator.join().unwrap();
}

#[test]
fn a_coordinator_without_the_workers_secret_runs_nothing_and_cancels_on_shutdown() {
    let secret = ClusterSecret::new(*b"a secret of this test's cluster").unwrap();
    let (tx, _rx) = channel();
    let (w, runs) = worker("w0", "127.0.0.1:0", Duration::ZERO, Some(secret), tx);
    let coordinator = ClusterCoordinator::new(&[w.address()], &options(None)).unwrap();
    let value = coordinator.schedule("square", square(2));
    std::thread::sleep(Duration::from_millis(200));
    assert!(!value.is_ready());
    drop(coordinator);
    assert!(matches!(value.fetch(), Err(PsError::Cancelled { .. })));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[test]
fn shutting_the_workers_down_ends_each_service_after_the_steps_scheduled() {
    let serving: Vec<_> = (0..2)
        .map(|_| {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let address = listener.local_addr().unwrap();
            let (tx, _rx) = channel();
            let runs = Arc::new(AtomicUsize::new(0));
            let counted = Arc::clone(&runs);
            let thread = std::thread::spawn(move || {
                let mut state = Worker {
                    name: "w",
                    runs: counted,
                    started: Mutex::new(tx),
                };
                let stop = std::sync::atomic::AtomicBool::new(false);
                StepServer::new(registry(Duration::from_millis(1)), None)
                    .serve(&listener, &mut state, &stop)
                    .unwrap();
            });
            (address, thread, runs)
        })
        .collect();
    let addresses: Vec<SocketAddr> = serving.iter().map(|(a, _, _)| *a).collect();
    let coordinator = ClusterCoordinator::new(&addresses, &options(None)).unwrap();
    let values: Vec<_> = (0..10)
        .map(|x| coordinator.schedule("square", square(x)))
        .collect();
    assert_eq!(coordinator.shutdown_workers(), 2);
    assert!(values.iter().all(RemoteValue::is_ready));
    for (_, thread, _) in serving {
        thread.join().unwrap();
    }
}

#[test]
fn a_step_that_takes_down_every_worker_running_it_fails_instead_of_going_round_for_ever() {
    let (tx, _rx) = channel();
    let workers: Vec<_> = (0..4)
        .map(|_| worker("w", "127.0.0.1:0", Duration::ZERO, None, tx.clone()))
        .collect();
    let addresses: Vec<SocketAddr> = workers.iter().map(|(w, _)| w.address()).collect();
    let coordinator = ClusterCoordinator::new(&addresses, &options(None)).unwrap();
    let crash = coordinator.schedule("crash", Vec::new());
    let e = coordinator.join().unwrap_err();
    assert!(
        e.to_string()
            .contains("3 workers were lost while running it"),
        "{e}"
    );
    assert!(matches!(crash.fetch(), Err(PsError::Step { .. })));
    assert_eq!(coordinator.retried(), 2);
    // The worker it did not reach still runs steps.
    assert_eq!(
        read(&coordinator.schedule("square", square(6)).fetch().unwrap()),
        36
    );
}

#[test]
fn a_peer_that_never_finishes_its_handshake_keeps_no_coordinator_waiting() {
    let secret = ClusterSecret::new(*b"a secret of this test's cluster").unwrap();
    let (tx, _rx) = channel();
    let (running, runs) = worker(
        "w0",
        "127.0.0.1:0",
        Duration::ZERO,
        Some(secret.clone()),
        tx,
    );
    // Connected first, and silent: its handshake holds a thread of its own until the
    // handshake's deadline, and the service goes on without it.
    let mut silent = TcpStream::connect(running.address()).unwrap();
    silent.write_all(&[0; 3]).unwrap();
    let coordinator =
        ClusterCoordinator::new(&[running.address()], &options(Some(secret))).unwrap();
    let value = coordinator.schedule("square", square(7));
    coordinator.join().unwrap();
    assert_eq!(read(&value.fetch().unwrap()), 49);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Served while the silent peer's handshake still waits for its deadline: the worker has
    // not closed that connection yet. What it sent (its side of the handshake) is read, then
    // nothing more is there, and no end either.
    silent.set_nonblocking(true).unwrap();
    let still_open = loop {
        match std::io::Read::read(&mut silent, &mut [0; 64]) {
            Ok(0) => break false,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break true,
            Err(e) => panic!("reading the silent peer's connection: {e}"),
        }
    };
    assert!(
        still_open,
        "the silent peer's connection ended before the coordinator was served"
    );
    drop(silent);
}
