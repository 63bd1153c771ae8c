//! The straggler report end to end: the worker the launcher slows is the one the chief names.

#![allow(
    clippy::unwrap_used,
    reason = "a test that meets an error must fail loudly"
)]

use lockstep_e2e::{field, xtask};

#[test]
fn the_chief_names_the_worker_the_launcher_slowed_and_how_long_it_was_waited_for() {
    let out = xtask(&[
        "run-cluster",
        "--profile",
        "dev",
        "--timeout-secs=600",
        "--slow",
        "worker:1@40",
        "--",
        "--epochs",
        "1",
        "--threads",
        "1",
        "--no-backup",
    ])
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report = stderr
        .lines()
        .find(|line| line.contains("straggler report"))
        .unwrap_or_else(|| panic!("no straggler report in {stderr}"));
    assert!(
        report.starts_with("[worker:0]"),
        "the chief reports: {report}"
    );
    assert_eq!(field(report, "waited_for"), Some("worker:1"), "{report}");
    // 40 ms after each of its steps: worker:0 waited at least half of that for it at every
    // step. Only a floor, well under the sleep: load stretches both workers' own work, which
    // moves the wait either way by some of that.
    let wait: f64 = field(report, "wait_ms_per_step").unwrap().parse().unwrap();
    assert!(wait >= 20.0, "{report}");
    // The share of a step spent waiting for it: 0.58-0.73 measured, loaded or not; a floor
    // well under that.
    let share: f64 = field(report, "share_of_step").unwrap().parse().unwrap();
    assert!((0.2..=1.0).contains(&share), "{report}");
    let out = xtask(&["run-cluster", "--profile", "dev", "--slow", "worker:7@5"]).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--slow names worker:7, a task this cluster lacks"),
        "{stderr}"
    );
}
