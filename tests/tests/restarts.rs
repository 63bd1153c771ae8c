//! `cargo xtask run-cluster --restart-on-failure`: a job survives a task killed mid-epoch.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use lockstep_e2e::{field, task_lines, xtask};

/// `mnist_keras` for one epoch on 2 workers, backing up every 10 steps, with `extra` launcher
/// options: (stderr, each worker's weights checksum).
fn keras_epoch(backup: &std::path::Path, extra: &[&str]) -> (String, Vec<String>) {
    let mut args = vec!["run-cluster", "--profile", "dev", "--timeout-secs=600"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[
        "--",
        "--epochs",
        "1",
        "--threads",
        "1",
        "--backup-every-steps",
        "10",
        "--backup-dir",
        backup.to_str().unwrap(),
    ]);
    let out = xtask(&args).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let checksums = (0..2)
        .map(|rank| {
            let lines = task_lines(&out.stdout, &format!("worker:{rank}"));
            let last = lines.last().unwrap();
            field(last, "weights_checksum").unwrap().to_owned()
        })
        .collect();
    (stderr, checksums)
}

#[test]
fn a_worker_killed_mid_epoch_is_restarted_with_the_cluster_and_ends_with_the_same_weights() {
    let dir = tempfile::tempdir().unwrap();
    let (_, uninterrupted) = keras_epoch(&dir.path().join("a"), &[]);
    let (stderr, restarted) = keras_epoch(
        &dir.path().join("b"),
        &["--restart-on-failure", "2", "--kill", "worker:1@35"],
    );
    assert!(
        stderr
            .contains("task worker:1 failed (signal: 9 (SIGKILL)); restarting every task (1 of 2)"),
        "{stderr}"
    );
    assert!(stderr.contains("resuming from the backup"), "{stderr}");
    assert_eq!(restarted, uninterrupted);
    assert_eq!(restarted[0], restarted[1]);
}

#[test]
fn without_restarts_a_killed_worker_fails_the_job_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let backup = dir.path().join("backup");
    let out = xtask(&[
        "run-cluster",
        "--profile",
        "dev",
        "--timeout-secs=600",
        "--kill",
        "worker:1@5",
        "--",
        "--epochs",
        "1",
        "--threads",
        "1",
        "--backup-dir",
        backup.to_str().unwrap(),
    ])
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("task worker:1 failed (signal: 9 (SIGKILL))"),
        "{stderr}"
    );
    let out = xtask(&["run-cluster", "--kill", "worker:7@5"]).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("worker:7, a task this cluster lacks"),
        "{stderr}"
    );
}
