//! `ParameterServerStrategy` across real processes: a chief, two workers and two `ps` tasks
//! train the tutorial CNN; a worker SIGKILLed mid-run has its step run on the other and
//! training finishes without a restart.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use lockstep_e2e::{check_documented_output, field, task_lines, xtask};

fn cluster_args<'a>(launcher: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "run-cluster",
        "--profile",
        "dev",
        "--timeout-secs=600",
        "--workers",
        "2",
        "--ps",
        "2",
        "--chief",
    ];
    args.extend_from_slice(launcher);
    args.extend([
        "--example",
        "mnist_parameter_server",
        "--",
        "--threads",
        "1",
        "--epochs",
        "2",
    ]);
    args
}

/// The chief's `test_accuracy=` line.
fn result(stdout: &[u8]) -> String {
    task_lines(stdout, "chief:0")
        .into_iter()
        .find(|l| l.starts_with("test_accuracy="))
        .expect("the chief prints its result")
}

#[test]
fn a_chief_two_workers_and_two_ps_tasks_train_to_the_synchronous_accuracy_and_all_exit() {
    let out = xtask(&cluster_args(&[])).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    check_documented_output(&out.stdout, "mnist_parameter_server").unwrap();
    let line = result(&out.stdout);
    // Two epochs of mnist_keras (synchronous, the same CNN, Adam and batch) reach about 0.95
    // on the test digits.
    let accuracy: f64 = field(&line, "test_accuracy").unwrap().parse().unwrap();
    assert!(accuracy > 0.92, "{line}");
    assert_eq!(field(&line, "steps"), Some("248"), "{line}");
}

#[test]
fn a_worker_killed_mid_run_has_its_step_run_on_the_other_and_training_finishes() {
    let out = xtask(&cluster_args(&["--keep-going", "--kill", "worker:1@20"])).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let logs = format!("{stdout}{stderr}");
    // The killed worker fails the launcher's run; the chief trains on without it.
    assert!(!out.status.success(), "{logs}");
    assert!(logs.contains("worker:1 failed"), "{logs}");
    let line = result(&out.stdout);
    assert_eq!(field(&line, "steps"), Some("248"), "{line}");
    let accuracy: f64 = field(&line, "test_accuracy").unwrap().parse().unwrap();
    assert!(accuracy > 0.92, "{line}");
    assert!(
        logs.contains("steps ran again after their worker was lost retried=1"),
        "{logs}"
    );
}
