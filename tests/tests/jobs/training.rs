//! The training examples train in lockstep across real processes: `cargo xtask run-cluster`'s
//! default (the Keras-style `mnist_keras`) and the custom loop.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::path::Path;
use std::process::{Command, Stdio};

use lockstep_e2e::{check_documented_output, example_binary, field, task_lines, xtask};
use lockstep_testenv::{Need, skip};

/// Each worker's final line: (test accuracy, weight checksum).
fn train_one_epoch() -> Vec<(f64, String)> {
    let out = xtask(&[
        "run-cluster",
        "--profile",
        "dev",
        "--timeout-secs=600",
        "--workers",
        "2",
        "--example",
        "mnist_custom_loop",
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

/// `cargo xtask run-cluster` (`mnist_keras`) for one epoch with its backup in `backup`: each
/// worker's final line.
fn keras_one_epoch(backup: &std::path::Path) -> Vec<String> {
    let backup = backup.to_str().unwrap();
    let out = xtask(&[
        "run-cluster",
        "--profile",
        "dev",
        "--timeout-secs=600",
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

#[test]
fn the_fashion_mnist_example_trains_functional_models_in_lockstep() {
    let data = Path::new("/usr/share/datasets/fashion-mnist");
    if !data.is_dir() {
        skip(
            Need::FashionMnist,
            format_args!(
                "{} missing (apt-get install dataset-fashion-mnist)",
                data.display()
            ),
        );
        return;
    }
    let out = xtask(&[
        "run-cluster",
        "--profile",
        "dev",
        "--timeout-secs=600",
        "--example",
        "fashion_mnist",
        "--",
        "--epochs",
        "1",
        "--model",
        "mlp",
    ])
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "training failed\n{stderr}");
    check_documented_output(&out.stdout, "fashion_mnist").unwrap();
    let lines: Vec<String> = (0..2)
        .map(|rank| {
            task_lines(&out.stdout, &format!("worker:{rank}"))
                .into_iter()
                .find(|l| l.starts_with("test_accuracy="))
                .expect("every worker prints its result")
        })
        .collect();
    let checksum = |line: &str| field(line, "weights_checksum").unwrap().to_owned();
    assert_eq!(checksum(&lines[0]), checksum(&lines[1]), "{lines:?}");
    let accuracy: f64 = field(&lines[0], "test_accuracy").unwrap().parse().unwrap();
    assert!(accuracy >= 0.8, "{lines:?}");
}

#[test]
fn an_evaluator_beside_keras_fit_evaluates_the_chiefs_checkpoints_up_to_the_last_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("checkpoints");
    let backup = dir.path().join("backup");
    let out = xtask(&[
        "run-cluster",
        "--profile",
        "dev",
        "--timeout-secs=600",
        "--evaluator",
        "--",
        "--epochs",
        "2",
        "--threads",
        "1",
        "--backup-dir",
        backup.to_str().unwrap(),
        "--checkpoint-dir",
        checkpoints.to_str().unwrap(),
    ])
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    check_documented_output(&out.stdout, "mnist_keras").unwrap();
    let worker = task_lines(&out.stdout, "worker:0");
    let worker = worker.last().unwrap();
    let evaluator = task_lines(&out.stdout, "evaluator:0");
    let evaluator = evaluator.last().unwrap();
    assert_eq!(
        field(evaluator, "last_checkpoint"),
        Some("ckpt-2"),
        "{evaluator}"
    );
    assert_eq!(field(evaluator, "iterations"), field(worker, "steps"));
    // The last evaluation is of the final weights: the workers' own test accuracy.
    assert_eq!(
        field(evaluator, "test_accuracy"),
        field(worker, "test_accuracy"),
        "{evaluator} / {worker}"
    );
    let evaluated: usize = field(evaluator, "evaluated").unwrap().parse().unwrap();
    assert!((1..=2).contains(&evaluated), "{evaluator}");
    // A directory given is the user's: kept, with each epoch's weights.
    assert!(checkpoints.join("ckpt-1").is_file() && checkpoints.join("ckpt-2").is_file());
}

/// Runs `mnist_keras` alone (no `TF_CONFIG`: one local worker), backing up every 10 steps to
/// `backup`; with `kill_after_step`, the process SIGKILLs itself once that step has ended
/// (`LOCKSTEP_KILL_AT_STEP`: the same step whatever the machine's load). Returns the final
/// line, or `None` when killed.
fn keras_alone(backup: &Path, kill_after_step: Option<u64>) -> Option<String> {
    let binary = example_binary("mnist_keras").unwrap();
    let mut command = Command::new(binary);
    command
        .args([
            "--epochs",
            "2",
            "--threads",
            "1",
            "--backup-every-steps",
            "10",
            "--backup-dir",
        ])
        .arg(backup)
        .env_remove("TF_CONFIG")
        .env_remove("LOCKSTEP_KILL_AT_STEP")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(step) = kill_after_step {
        command.env("LOCKSTEP_KILL_AT_STEP", step.to_string());
    }
    let out = command.output().unwrap();
    if kill_after_step.is_some() {
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(out.status.signal(), Some(9), "not killed: {}", out.status);
        return None;
    }
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .find(|l| l.starts_with("test_accuracy="))
        .map(str::to_owned)
}

#[test]
fn a_worker_killed_mid_epoch_resumes_from_its_backup_to_the_same_weights() {
    let dir = tempfile::tempdir().unwrap();
    let checksum = |line: &str| field(line, "weights_checksum").unwrap().to_owned();
    let uninterrupted = keras_alone(&dir.path().join("a"), None).unwrap();
    let backup = dir.path().join("b");
    // 125 steps an epoch: step 30 is mid-way through the first.
    assert!(keras_alone(&backup, Some(30)).is_none());
    let resumed = keras_alone(&backup, None).unwrap();
    assert_eq!(
        checksum(&resumed),
        checksum(&uninterrupted),
        "{resumed} vs {uninterrupted}"
    );
    assert!(field(&resumed, "steps") == field(&uninterrupted, "steps"));
}

/// The lines worker 0 of a one-worker `run-cluster` of `example` printed.
fn alone(example: &str) -> Vec<String> {
    let out = xtask(&[
        "run-cluster",
        "--profile",
        "dev",
        "--timeout-secs=600",
        "--workers",
        "1",
        "--example",
        example,
    ])
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_documented_output(&out.stdout, example).unwrap();
    task_lines(&out.stdout, "worker:0")
}

/// An epoch line without its duration (`- 0.8s -`).
fn timeless(line: &str) -> String {
    line.split(" - ")
        .filter(|part| {
            part.strip_suffix('s')
                .is_none_or(|seconds| seconds.parse::<f64>().is_err())
        })
        .collect::<Vec<_>>()
        .join(" - ")
}

#[test]
fn the_mirrored_mlp_trains_and_a_resumed_run_continues_it_exactly() {
    let mirrored = alone("mirrored_mlp");
    assert!(
        mirrored.iter().any(|l| l.contains("val_accuracy: ")),
        "{mirrored:?}"
    );
    let last = mirrored
        .iter()
        .find(|l| l.starts_with("test_loss="))
        .unwrap();
    let accuracy: f64 = field(last, "test_accuracy").unwrap().parse().unwrap();
    assert!(accuracy >= 0.85, "{last}");
    assert_eq!(field(last, "replicas"), Some("2"));

    let resumed = alone("keras_resume");
    assert!(
        resumed.iter().any(|l| l == "Creating a new model"),
        "{resumed:?}"
    );
    assert!(
        resumed.iter().any(|l| l.starts_with("Restoring from")),
        "{resumed:?}"
    );
    let second = |lines: &[String]| {
        lines
            .iter()
            .find(|l| l.starts_with("Epoch 2/2"))
            .map(|l| timeless(l))
            .unwrap()
    };
    assert_eq!(second(&resumed), second(&mirrored));
}
