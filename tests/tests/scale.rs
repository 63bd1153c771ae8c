//! Past two processes: 4 and 8 workers of the Keras example (one kernel thread each; on a
//! machine with fewer cores they share them) train to the same weights, the chief's straggler
//! report names the worker the launcher slowed, and when one is killed every other reports it,
//! its flight recorder ending with the same failed collective.

#![allow(
    clippy::unwrap_used,
    reason = "a test that meets an error must fail loudly"
)]

use std::sync::{Mutex, MutexGuard, PoisonError};

use lockstep_e2e::{field, task_lines, weights_checksums, xtask};

/// Holds the machine for one test's clusters: each test's workers share its cores, and a
/// straggler shows only against others that no other test's cluster starves.
fn one_cluster_at_a_time() -> MutexGuard<'static, ()> {
    static MACHINE: Mutex<()> = Mutex::new(());
    MACHINE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `cargo xtask run-cluster` of the Keras example with `workers`, `launcher` options, one
/// epoch on one thread each; its output.
fn run(workers: usize, launcher: &[&str]) -> std::process::Output {
    let workers = workers.to_string();
    let mut args = vec![
        "run-cluster",
        "--profile",
        "dev",
        "--timeout-secs=600",
        "--workers",
        &workers,
    ];
    args.extend_from_slice(launcher);
    args.extend_from_slice(&["--", "--epochs", "1", "--threads", "1", "--no-backup"]);
    xtask(&args).expect("cargo xtask starts")
}

#[test]
fn four_and_eight_workers_train_to_one_set_of_weights_and_the_chief_names_the_slowed_one() {
    let _machine = one_cluster_at_a_time();
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    for workers in [4_usize, 8] {
        let slowed = format!("worker:{}", workers - 1);
        // A sleeping worker hands its core to the others; while it sleeps they must finish
        // their own steps and wait, or the sleep is hidden. With more workers than cores
        // their steps take longer in proportion, so the sleep does too.
        let slow_ms = 40 * workers.div_ceil(cores);
        let out = run(workers, &["--slow", &format!("{slowed}@{slow_ms}")]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{workers} workers: {stderr}");
        let checksums = weights_checksums(&out.stdout);
        assert_eq!(checksums.len(), workers, "{workers} workers");
        assert!(
            checksums.iter().all(|c| *c == checksums[0]),
            "{workers} workers: {checksums:?}"
        );
        let report = task_lines(&out.stderr, "worker:0")
            .into_iter()
            .find(|line| line.contains("straggler report"))
            .unwrap_or_else(|| panic!("{workers} workers: no straggler report in {stderr}"));
        assert_eq!(
            field(&report, "waited_for"),
            Some(slowed.as_str()),
            "{workers} workers: {report}"
        );
        let wait: f64 = field(&report, "wait_ms_per_step").unwrap().parse().unwrap();
        assert!(wait > 5.0, "{workers} workers: {report}");
    }
}

#[test]
fn eight_workers_each_report_a_killed_one_and_their_flight_recorders_agree_where_it_failed() {
    let _machine = one_cluster_at_a_time();
    let out = run(8, &["--keep-going", "--kill", "worker:5@4"]);
    assert!(!out.status.success(), "a killed task fails the run");
    let mut failed_collectives = Vec::new();
    for worker in (0..8).filter(|&w| w != 5) {
        let lines = task_lines(&out.stderr, &format!("worker:{worker}"));
        let error = lines
            .iter()
            .find(|line| line.starts_with("Error: "))
            .unwrap_or_else(|| panic!("worker:{worker} reported no error: {lines:?}"));
        assert!(error.contains("rank 5"), "worker:{worker}: {error}");
        // The recorder's lines for this rank's own communicator: the last that did not end
        // well is the all-reduce every rank was in.
        let failed = lines
            .iter()
            .rfind(|line| {
                line.contains("flight recorder: all_reduce") && !line.contains(": ok rank=")
            })
            .unwrap_or_else(|| panic!("worker:{worker}: no failed all-reduce recorded"));
        assert!(failed.contains("rank 5"), "worker:{worker}: {failed}");
        let seq = failed
            .split_whitespace()
            .find(|word| word.starts_with('#'))
            .unwrap()
            .to_owned();
        failed_collectives.push(seq);
    }
    assert!(
        failed_collectives
            .iter()
            .all(|s| *s == failed_collectives[0]),
        "{failed_collectives:?}"
    );
}
