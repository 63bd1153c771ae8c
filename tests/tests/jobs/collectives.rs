//! Collectives between real processes started by `cargo xtask run-cluster`: a rank that
//! crashes, stalls, sends the wrong size or joins late, and how every other rank reacts.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use lockstep_e2e::{field, task_lines, xtask};

fn run(workers: &str, misbehave: &str) -> (std::process::Output, Vec<String>) {
    run_with(workers, misbehave, &[])
}

fn run_with(workers: &str, misbehave: &str, extra: &[&str]) -> (std::process::Output, Vec<String>) {
    let mut args = vec![
        "run-cluster",
        "--example",
        "collective_check",
        "--profile",
        "dev",
        "--timeout-secs=120",
        "--keep-going",
        "--workers",
        workers,
        "--",
        "--misbehave",
        misbehave,
        "--rank",
        "1",
        "--timeout-secs",
        "3",
    ];
    args.extend_from_slice(extra);
    let out = xtask(&args).expect("cargo xtask starts");
    let n: usize = workers.parse().unwrap();
    let results = (0..n)
        .map(|rank| {
            let lines = task_lines(&out.stdout, &format!("worker:{rank}"));
            lines
                .iter()
                .find(|l| l.starts_with("result="))
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    (out, results)
}

#[test]
fn a_rank_that_crashes_mid_all_reduce_makes_every_other_rank_report_it() {
    let (out, results) = run("3", "crash");
    assert!(!out.status.success(), "the crashed task fails the run");
    for rank in [0, 2] {
        let line = &results[rank];
        assert_eq!(
            field(line, "result"),
            Some("error"),
            "worker:{rank}: {line:?}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            line.contains("rank 1"),
            "worker:{rank} should name rank 1: {line}"
        );
    }
}

#[test]
fn a_rank_that_crashes_while_the_others_wait_outside_the_collectives_is_seen_within_moments() {
    // The others wait as a GPU's NCCL call does, watching only their connections.
    let (out, results) = run_with("3", "crash", &["--watch"]);
    for rank in [0, 2] {
        let line = &results[rank];
        assert_eq!(
            field(line, "kind"),
            Some("PeerLost"),
            "worker:{rank}: {line:?}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(line.contains("rank 1"), "worker:{rank}: {line}");
        // Seen by the closed connections (PeerLost, which the watch giving up would not
        // say), after a time it reports: no bound on it, which a loaded machine would stretch.
        assert!(
            field(line, "seen_ms").is_some_and(|ms| ms.parse::<u64>().is_ok()),
            "worker:{rank}: {line}"
        );
    }
}

#[test]
fn a_rank_with_the_wrong_size_makes_every_rank_report_a_mismatch() {
    let (out, results) = run("3", "wrong-size");
    for (rank, line) in results.iter().enumerate() {
        assert_eq!(
            field(line, "result"),
            Some("error"),
            "worker:{rank}: {line:?}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            line.contains("mismatch") && line.contains("element count"),
            "worker:{rank}: {line}"
        );
    }
}

#[test]
fn a_rank_that_stalls_makes_the_others_time_out_naming_it() {
    let (out, results) = run("3", "stall");
    assert_eq!(results[1], "result=stalled");
    for rank in [0, 2] {
        let line = &results[rank];
        assert!(
            matches!(field(line, "kind"), Some("Timeout" | "Aborted")),
            "worker:{rank}: {line:?}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(
        results
            .iter()
            .any(|l| l.contains("kind=Timeout") && l.contains("[1]")),
        "{results:?}"
    );
}

#[test]
fn a_late_starter_joins_and_everyone_finishes() {
    let (out, results) = run("3", "late");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(results, ["result=ok", "result=ok", "result=ok"]);
}
