//! `cargo xtask run-cluster --restart-on-failure`: a job survives a task killed mid-epoch.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use lockstep_e2e::{field, task_lines, xtask};

/// [`lockstep_e2e::keras_epoch`], failing the test when the job fails.
fn keras_epoch(backup: &std::path::Path, extra: &[&str]) -> (String, Vec<String>) {
    lockstep_e2e::keras_epoch(backup, extra).unwrap()
}

#[test]
fn a_worker_killed_mid_epoch_is_restarted_with_the_cluster_and_ends_with_the_same_weights() {
    let dir = tempfile::tempdir().unwrap();
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
    assert_eq!(restarted, crate::uninterrupted::weights());
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
    let out = xtask(&["run-cluster", "--profile", "dev", "--kill", "worker:7@5"]).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("worker:7, a task this cluster lacks"),
        "{stderr}"
    );
}

/// `mnist_keras` for one epoch of global batch 96 on `workers` workers, backing up every step
/// to `backup`, with `extra` launcher options: the launcher's output.
fn keras_on(workers: usize, backup: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let workers = workers.to_string();
    let mut args = vec![
        "run-cluster",
        "--profile",
        "dev",
        "--timeout-secs=600",
        "--workers",
        &workers,
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[
        "--",
        "--epochs",
        "1",
        "--threads",
        "1",
        "--global-batch",
        "96",
        "--backup-every-steps",
        "1",
        "--backup-dir",
        backup.to_str().unwrap(),
    ]);
    xtask(&args).unwrap()
}

/// Kills one of `before` workers after step `step` (no restart), then starts `after` workers
/// on the same backup, and checks that they finish the epoch from that step: together they
/// train on exactly the examples the epoch had left, each worker on its share, and end with
/// the same weights.
fn resize(before: usize, after: usize, step: u64) {
    let dir = tempfile::tempdir().unwrap();
    let backup = dir.path().join("backup");
    let kill = format!("worker:{}@{step}", before - 1);
    let killed = keras_on(before, &backup, &["--kill", &kill]);
    assert!(
        !killed.status.success(),
        "{}",
        String::from_utf8_lossy(&killed.stderr)
    );
    let resumed = keras_on(after, &backup, &[]);
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success(), "{stderr}");
    assert!(stderr.contains("resuming from the backup"), "{stderr}");
    let lines: Vec<String> = (0..after)
        .map(|w| {
            task_lines(&resumed.stdout, &format!("worker:{w}"))
                .last()
                .unwrap()
                .clone()
        })
        .collect();
    let here: Vec<u64> = lines
        .iter()
        .map(|l| field(l, "examples_here").unwrap().parse().unwrap())
        .collect();
    // 7996 training digits in steps of 96: 83 full steps and one of 28.
    let left = 7996 - step * 96;
    assert_eq!(here.iter().sum::<u64>(), left, "{lines:?}");
    let share = (left - 28) / after as u64;
    assert!(
        here.iter().all(|&h| h == share || h == share + 28),
        "{here:?}"
    );
    for line in &lines {
        assert_eq!(field(line, "steps"), Some("84"), "{line}");
        assert_eq!(
            field(line, "weights_checksum"),
            field(&lines[0], "weights_checksum")
        );
    }
}

#[test]
fn a_job_restarted_on_fewer_workers_finishes_the_epoch_from_where_the_backup_stood() {
    resize(3, 2, 20);
}

#[test]
fn a_job_restarted_on_more_workers_finishes_the_epoch_from_where_the_backup_stood() {
    resize(2, 3, 30);
}

#[test]
fn a_chief_killed_while_writing_a_backup_resumes_from_the_previous_one_to_the_same_weights() {
    let dir = tempfile::tempdir().unwrap();
    let (stderr, restarted) = keras_epoch(
        &dir.path().join("b"),
        &["--restart-on-failure", "1", "--kill", "worker:0@save:30"],
    );
    assert!(
        stderr.contains("LOCKSTEP_KILL_IN_SAVE: killing this process")
            && stderr.contains("task worker:0 failed (signal: 9 (SIGKILL))"),
        "{stderr}"
    );
    // Step 30's backup was never published: the restart resumes from step 20's.
    let resumed = stderr
        .lines()
        .find(|l| l.contains("resuming from the backup"))
        .unwrap_or_else(|| panic!("no resume in {stderr}"));
    assert!(resumed.contains("step=20"), "{resumed}");
    assert_eq!(restarted, crate::uninterrupted::weights());
}
