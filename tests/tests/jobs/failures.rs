//! What a cluster does when it cannot form or its workers disagree: every task that started
//! exits within its rendezvous timeout with an error naming the cause, never hangs; and what
//! it does when strangers knock: it trains on, to the weights of an undisturbed run.
//!
//! Each task is the `mnist_keras` binary started by hand with its own `TF_CONFIG`, as a
//! scheduler starts it; a task that listens is handed its socket already bound (fd 3,
//! `LISTEN_FDS=1`, as `cargo xtask run-cluster` does), so no parallel test can take its port.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use command_fds::{CommandFdExt, FdMapping};
use lockstep_e2e::{example_binary, unused_ports};

/// A listener on a port of 127.0.0.1 the kernel chose, and its address.
fn listener() -> (TcpListener, String) {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let address = listener.local_addr().unwrap().to_string();
    (listener, address)
}

/// An address of 127.0.0.1 on which nothing listens.
fn closed_address() -> String {
    format!("127.0.0.1:{}", unused_ports(1).unwrap())
}

fn tf_config(workers: &[String], index: usize) -> String {
    let list: Vec<String> = workers.iter().map(|w| format!("{w:?}")).collect();
    format!(
        r#"{{"cluster": {{"worker": [{}]}}, "task": {{"type": "worker", "index": {index}}}}}"#,
        list.join(", ")
    )
}

/// Starts `mnist_keras` for a short run as the worker `TF_CONFIG` describes, on `listener`
/// when given (else it binds its address's port itself), with `extra` arguments (a
/// rendezvous timeout of 3 s unless they give one).
fn start(binary: &Path, tf_config: String, listener: Option<TcpListener>, extra: &[&str]) -> Child {
    command(binary, tf_config, listener, extra).spawn().unwrap()
}

/// The command [`start`] runs.
fn command(
    binary: &Path,
    tf_config: String,
    listener: Option<TcpListener>,
    extra: &[&str],
) -> Command {
    let mut command = Command::new(binary);
    if !extra.contains(&"--rendezvous-timeout-secs") {
        command.args(["--rendezvous-timeout-secs", "3"]);
    }
    command
        .args(["--epochs", "1", "--no-backup", "--threads", "1"])
        .args(extra)
        .env("TF_CONFIG", tf_config)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(listener) = listener {
        command
            .fd_mappings(vec![FdMapping {
                parent_fd: OwnedFd::from(listener),
                child_fd: 3,
            }])
            .unwrap()
            .env("LISTEN_FDS", "1");
    }
    command
}

/// Waits for every task (killing any still running after a minute, which fails the test) and
/// returns each one's stderr; every task must have failed.
fn all_fail(children: Vec<Child>) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_mins(1);
    children
        .into_iter()
        .enumerate()
        .map(|(i, mut child)| {
            while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let hung = child.try_wait().unwrap().is_none();
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(!hung, "task {i} was still running after a minute\n{stderr}");
            assert!(!out.status.success(), "task {i} succeeded\n{stderr}");
            stderr
        })
        .collect()
}

#[test]
fn a_worker_that_never_starts_fails_every_other_task_naming_it() {
    let binary = example_binary("mnist_keras").unwrap();
    let ((l0, a0), (l1, a1)) = (listener(), listener());
    let workers = vec![a0, a1, closed_address()];
    let errors = all_fail(vec![
        start(&binary, tf_config(&workers, 0), Some(l0), &[]),
        start(&binary, tf_config(&workers, 1), Some(l1), &[]),
    ]);
    for (task, stderr) in errors.iter().enumerate() {
        assert!(
            stderr.contains(&format!("could not reach rank 2 at {}", workers[2]))
                && stderr.contains(&format!("2 = worker:2 at {}", workers[2])),
            "worker {task}: {stderr}"
        );
    }
}

#[test]
fn a_port_in_use_fails_its_task_and_the_other_names_the_task_that_never_came() {
    let binary = example_binary("mnist_keras").unwrap();
    let (taken, a0) = listener();
    let (l1, a1) = listener();
    let workers = vec![a0.clone(), a1];
    let errors = all_fail(vec![
        start(&binary, tf_config(&workers, 0), None, &[]),
        start(&binary, tf_config(&workers, 1), Some(l1), &[]),
    ]);
    let port = a0.rsplit(':').next().unwrap();
    assert!(
        errors[0].contains(&format!("0.0.0.0:{port}")) && errors[0].contains("in use"),
        "{}",
        errors[0]
    );
    assert!(
        errors[1].contains("rank(s) [0] did not connect")
            && errors[1].contains(&format!("0 = worker:0 at {a0}")),
        "{}",
        errors[1]
    );
    drop(taken);
}

#[test]
fn an_address_that_does_not_resolve_fails_every_task_naming_it() {
    let binary = example_binary("mnist_keras").unwrap();
    let ((l0, a0), (l1, a1)) = (listener(), listener());
    let port = a1.rsplit(':').next().unwrap();
    let unreachable = format!("lockstep-no-such-host.invalid:{port}");
    let workers = vec![a0, unreachable.clone()];
    let errors = all_fail(vec![
        start(&binary, tf_config(&workers, 0), Some(l0), &[]),
        start(&binary, tf_config(&workers, 1), Some(l1), &[]),
    ]);
    assert!(
        errors[0].contains(&format!("could not reach rank 1 at {unreachable}")),
        "{}",
        errors[0]
    );
    assert!(
        errors[1].contains("rank(s) [0] did not connect")
            && errors[1].contains(&format!("1 = worker:1 at {unreachable}")),
        "{}",
        errors[1]
    );
}

#[test]
fn tasks_given_different_cluster_lists_both_fail_saying_the_specs_differ() {
    let binary = example_binary("mnist_keras").unwrap();
    let ((l0, a0), (l1, a1)) = (listener(), listener());
    // The same two processes, one of them written down by name: another cluster to the other.
    let by_name = a1.replace("127.0.0.1", "localhost");
    let errors = all_fail(vec![
        start(
            &binary,
            tf_config(&[a0.clone(), a1.clone()], 0),
            Some(l0),
            &[],
        ),
        start(&binary, tf_config(&[a0, by_name], 1), Some(l1), &[]),
    ]);
    assert!(errors[0].contains("cluster specs differ"), "{}", errors[0]);
    assert!(
        errors[1].contains("did not connect") && errors[1].contains("cluster spec differs"),
        "{}",
        errors[1]
    );
}

#[test]
fn workers_that_build_different_models_both_fail_saying_so() {
    let binary = example_binary("mnist_keras").unwrap();
    let ((l0, a0), (l1, a1)) = (listener(), listener());
    let workers = vec![a0, a1];
    let errors = all_fail(vec![
        start(&binary, tf_config(&workers, 0), Some(l0), &[]),
        start(
            &binary,
            tf_config(&workers, 1),
            Some(l1),
            &["--dense-units", "64"],
        ),
    ]);
    for (task, stderr) in errors.iter().enumerate() {
        assert!(
            stderr.contains("the workers built different models"),
            "worker {task}: {stderr}"
        );
    }
}

#[test]
fn a_connection_from_outside_the_cluster_is_refused_and_logged_and_the_job_completes() {
    use std::io::{Read as _, Write as _};

    let binary = example_binary("mnist_keras").unwrap();
    let ((l0, a0), (l1, a1)) = (listener(), listener());
    let workers = vec![a0, a1.clone()];
    let args = ["--rendezvous-timeout-secs", "60"];
    // Worker 1 waits for worker 0; a stranger of another cluster knocks first.
    let worker1 = start(&binary, tf_config(&workers, 1), Some(l1), &args);
    let mut hello = 0x4C53_4848_u32.to_le_bytes().to_vec();
    hello.extend(0xDEAD_BEEF_u64.to_le_bytes());
    hello.extend(0_u32.to_le_bytes());
    hello.extend(2_u32.to_le_bytes());
    hello.extend(0_u32.to_le_bytes());
    let mut stranger = std::net::TcpStream::connect(&a1).unwrap();
    stranger.write_all(&hello).unwrap();
    stranger
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    // Worker 1 answers (or closes) once it has looked at the hello and refused it.
    let _ = stranger.read(&mut [0_u8; 24]);
    let worker0 = start(&binary, tf_config(&workers, 0), Some(l0), &args);
    let deadline = Instant::now() + Duration::from_mins(5);
    for (task, mut child) in [(0, worker0), (1, worker1)] {
        while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "worker {task}: {stderr}");
        if task == 1 {
            assert!(
                stderr.contains("refused a connection from outside this group")
                    && stderr.contains("deadbeef"),
                "{stderr}"
            );
        }
    }
}

/// The hello of rank `rank` of a group of `world` with cluster identity `cluster`.
fn hello(cluster: u64, rank: u32, world: u32) -> Vec<u8> {
    let mut hello = 0x4C53_4848_u32.to_le_bytes().to_vec();
    hello.extend(cluster.to_le_bytes());
    hello.extend(rank.to_le_bytes());
    hello.extend(world.to_le_bytes());
    hello.extend(0_u32.to_le_bytes());
    hello
}

/// The cluster identity every task computes from the group's addresses: FNV-1a, a public
/// checksum, so a stranger who knows the addresses writes a hello that passes it.
fn public_identity(addresses: &[String]) -> u64 {
    addresses
        .iter()
        .flat_map(|a| a.bytes().chain([0]))
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// What the strangers met at one task's port.
#[derive(Debug, Default)]
struct Knocks {
    /// Impostor handshakes that got as far as the task's nonce and proof (the public
    /// identity passed), and the verdicts they got for a made-up proof.
    reached_the_proof: usize,
    verdicts: Vec<[u8; 4]>,
}

/// Knocks on `address` in every hostile way until `stop`: an impostor that completes the
/// handshake as rank 0 with the public identity and a made-up proof, a hello left behind by a
/// dialler that gave up, a hello fed a byte at a time, and a frame header announcing 4 GiB
/// where a hello belongs.
///
/// `proofs` counts the impostors that reached the proof, as they do, for the test to wait on.
fn knock(
    address: &str,
    identity: u64,
    stop: &std::sync::atomic::AtomicBool,
    proofs: &std::sync::atomic::AtomicUsize,
) -> Knocks {
    use std::io::{Read as _, Write as _};
    use std::net::TcpStream;
    use std::sync::atomic::Ordering;

    let connect = || {
        let stream = TcpStream::connect(address).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        Some(stream)
    };
    let mut knocks = Knocks::default();
    let mut drip: Option<(TcpStream, usize)> = None;
    let rank0 = hello(identity, 0, 2);
    let deadline = Instant::now() + Duration::from_mins(2);
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        if let Some(mut impostor) = connect() {
            let mut reply = [0_u8; 24 + 32 + 32];
            let sent = impostor
                .write_all(&rank0)
                .and_then(|()| impostor.write_all(&[7; 32]));
            if sent.is_ok() && impostor.read_exact(&mut reply).is_ok() {
                knocks.reached_the_proof += 1;
                proofs.fetch_add(1, Ordering::Relaxed);
                let mut verdict = [0_u8; 4];
                let confirmed = impostor
                    .write_all(b"LSHC")
                    .and_then(|()| impostor.write_all(&[9; 32]));
                if confirmed.is_ok() && impostor.read_exact(&mut verdict).is_ok() {
                    knocks.verdicts.push(verdict);
                }
            }
        }
        if let Some(mut stale) = connect() {
            let _ = stale.write_all(&rank0);
        }
        if let Some(mut oversize) = connect() {
            let mut header = 0x4C53_4D53_u32.to_le_bytes().to_vec();
            header.resize(40, 0);
            header.extend(u32::MAX.to_le_bytes());
            let _ = oversize.write_all(&header);
        }
        drip = match drip.take() {
            Some((mut stream, sent)) if sent < rank0.len() => stream
                .write_all(&rank0[sent..=sent])
                .is_ok()
                .then_some((stream, sent + 1)),
            _ => connect().map(|stream| (stream, 0)),
        };
        std::thread::sleep(Duration::from_millis(100));
    }
    knocks
}

/// Trains `mnist_keras` for an epoch on two workers sharing `secret`, with strangers knocking
/// on both ports from before the workers start until they finish when `hostile`: each
/// worker's weights checksum, and what the strangers met at worker 1.
fn train_with_knocks(binary: &Path, secret: &str, hostile: bool) -> (Vec<String>, Knocks) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    let ((l0, a0), (l1, a1)) = (listener(), listener());
    let workers = vec![a0, a1];
    let identity = public_identity(&workers);
    let stop = Arc::new(AtomicBool::new(false));
    let proofs = Arc::new(AtomicUsize::new(0));
    let strangers: Vec<_> = workers
        .iter()
        .filter(|_| hostile)
        .map(|address| {
            let (address, stop, proofs) = (address.clone(), Arc::clone(&stop), Arc::clone(&proofs));
            std::thread::spawn(move || knock(&address, identity, &stop, &proofs))
        })
        .collect();
    let args = ["--rendezvous-timeout-secs", "60"];
    let start = |index: usize, listener: TcpListener| {
        command(binary, tf_config(&workers, index), Some(listener), &args)
            .env("LOCKSTEP_CLUSTER_SECRET", secret)
            .spawn()
            .unwrap()
    };
    // Worker 1 waits alone until an impostor has reached its proof: the strangers reach it
    // before worker 0 does, however slowly it starts.
    let worker1 = start(1, l1);
    let alone_until = Instant::now() + Duration::from_mins(1);
    while hostile && proofs.load(Ordering::Relaxed) == 0 && Instant::now() < alone_until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let worker0 = start(0, l0);
    let deadline = Instant::now() + Duration::from_mins(3);
    let mut checksums = Vec::new();
    for (task, mut child) in [(0, worker0), (1, worker1)] {
        while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "worker {task}: {stderr}");
        let checksum = stdout
            .lines()
            .filter_map(|line| lockstep_e2e::field(line, "weights_checksum"))
            .next_back();
        assert!(
            checksum.is_some(),
            "worker {task} printed no checksum: {stdout}"
        );
        checksums.extend(checksum.map(str::to_owned));
        if hostile && task == 1 {
            assert!(
                stderr.contains("did not prove it holds the cluster secret"),
                "worker 1 did not log the impostor: {stderr}"
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut knocks: Vec<Knocks> = strangers.into_iter().map(|s| s.join().unwrap()).collect();
    (checksums, knocks.pop().unwrap_or_default())
}

#[test]
fn a_job_with_a_secret_trains_to_the_undisturbed_weights_while_strangers_knock_on_its_ports() {
    let binary = example_binary("mnist_keras").unwrap();
    let secret = "the secret of the hostile-peer test";
    let (undisturbed, _) = train_with_knocks(&binary, secret, false);
    let (knocked, knocks) = train_with_knocks(&binary, secret, true);
    assert_eq!(undisturbed[0], undisturbed[1]);
    assert_eq!(knocked, undisturbed, "the strangers changed the weights");
    assert!(
        knocks.reached_the_proof > 0,
        "no impostor got as far as the proof: {knocks:?}"
    );
    assert!(
        knocks.verdicts.iter().all(|v| v == b"LSHR"),
        "an impostor was not refused: {knocks:?}"
    );
}
