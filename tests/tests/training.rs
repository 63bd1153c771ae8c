//! The training examples train in lockstep across real processes: `cargo xtask run-cluster`'s
//! default (the custom loop) and the Keras-style `mnist_keras`.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use lockstep_e2e::{check_documented_output, field, task_lines, xtask};

/// Each worker's final line: (test accuracy, weight checksum).
fn train_one_epoch() -> Vec<(f64, String)> {
    let out = xtask(&[
        "run-cluster",
        "--profile",
        "dev",
        "--timeout-secs=600",
        "--workers",
        "2",
        "--",
        "--epochs",
        "1",
    ])
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "training failed\n{stderr}");
    check_documented_output(&out.stdout, "mnist_custom_loop").unwrap();
    (0..2)
        .map(|rank| {
            let lines = task_lines(&out.stdout, &format!("worker:{rank}"));
            let last = lines
                .iter()
                .find(|l| l.starts_with("test_accuracy="))
                .expect("every worker prints its result");
            (
                field(last, "test_accuracy").unwrap().parse().unwrap(),
                field(last, "weights_checksum").unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn two_workers_train_in_lockstep_and_reproducibly() {
    let first = train_one_epoch();
    assert_eq!(
        first[0].1, first[1].1,
        "the workers' weights differ: {first:?}"
    );
    assert!(
        first.iter().all(|(accuracy, _)| *accuracy >= 0.85),
        "{first:?}"
    );
    let second = train_one_epoch();
    assert_eq!(
        first, second,
        "the same seeds and layout must give bit-identical weights"
    );
}

/// `mnist_keras` for one epoch with its backup in `backup`: each worker's final line.
fn keras_one_epoch(backup: &std::path::Path) -> Vec<String> {
    let backup = backup.to_str().unwrap();
    let out = xtask(&[
        "run-cluster",
        "--profile",
        "dev",
        "--timeout-secs=600",
        "--example",
        "mnist_keras",
        "--",
        "--epochs",
        "1",
        "--backup-dir",
        backup,
    ])
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "training failed\n{stderr}");
    check_documented_output(&out.stdout, "mnist_keras").unwrap();
    (0..2)
        .map(|rank| {
            task_lines(&out.stdout, &format!("worker:{rank}"))
                .into_iter()
                .find(|l| l.starts_with("test_accuracy="))
                .expect("every worker prints its result")
        })
        .collect()
}

#[test]
fn the_keras_example_trains_in_lockstep_and_removes_its_backup() {
    let dir = tempfile::tempdir().unwrap();
    let backup = dir.path().join("backup");
    let lines = keras_one_epoch(&backup);
    let checksum = |line: &str| field(line, "weights_checksum").unwrap().to_owned();
    assert_eq!(checksum(&lines[0]), checksum(&lines[1]), "{lines:?}");
    let accuracy: f64 = field(&lines[0], "test_accuracy").unwrap().parse().unwrap();
    assert!(accuracy >= 0.85, "{lines:?}");
    assert!(!backup.exists(), "a completed run deletes its backup");
}
