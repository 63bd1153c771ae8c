//! What a cluster does when it cannot form or its workers disagree: every task that started
//! exits within its rendezvous timeout with an error naming the cause, never hangs.
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
    command.spawn().unwrap()
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
