//! `cargo xtask run-cluster` started as a user starts it, with real processes on 127.0.0.1.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::io::{BufRead as _, BufReader, Read as _};
use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use lockstep_e2e::{check_documented_output, field, spawn_xtask, task_lines, xtask};

/// Flags shared by every run: the dev profile reuses the test build's artifacts, and the
/// timeout bounds a run that would otherwise hang the suite.
const COMMON: [&str; 6] = [
    "run-cluster",
    "--example",
    "cluster_info",
    "--profile",
    "dev",
    "--timeout-secs=300",
];

fn run(extra: &[&str]) -> std::process::Output {
    let args: Vec<&str> = COMMON.iter().chain(extra).copied().collect();
    xtask(&args).expect("cargo xtask starts")
}

fn the_only_line(stdout: &[u8], task: &str) -> String {
    let lines = task_lines(stdout, task);
    assert_eq!(
        lines.len(),
        1,
        "{task} printed {lines:?}\nstdout:\n{}",
        String::from_utf8_lossy(stdout)
    );
    lines[0].clone()
}

#[test]
fn three_workers_and_an_evaluator_each_print_their_rank() {
    let out = run(&["--workers", "3", "--evaluator"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "run-cluster failed: {}\n{stderr}",
        out.status
    );

    for rank in 0..3 {
        let task = format!("worker:{rank}");
        let line = the_only_line(&out.stdout, &task);
        assert_eq!(field(&line, "task"), Some(task.as_str()), "{line}");
        assert_eq!(
            field(&line, "rank"),
            Some(rank.to_string().as_str()),
            "{line}"
        );
        assert_eq!(field(&line, "world_size"), Some("3"), "{line}");
        assert_eq!(
            field(&line, "chief"),
            Some(if rank == 0 { "true" } else { "false" }),
            "{line}"
        );
        assert!(
            field(&line, "address").is_some_and(|a| a.starts_with("127.0.0.1:")),
            "{line}"
        );
    }
    check_documented_output(&out.stdout, "cluster_info").unwrap();
    // Piped, as into a file: the launcher's and the tasks' log lines are plain text.
    assert!(
        !out.stderr.contains(&0x1b) && !out.stdout.contains(&0x1b),
        "ANSI escape codes in piped output:\n{stderr}"
    );
    let evaluator = the_only_line(&out.stdout, "evaluator:0");
    assert_eq!(field(&evaluator, "rank"), Some("none"), "{evaluator}");
    assert_eq!(field(&evaluator, "world_size"), Some("3"), "{evaluator}");
    assert_eq!(field(&evaluator, "chief"), Some("false"), "{evaluator}");

    let addresses: std::collections::HashSet<_> =
        ["worker:0", "worker:1", "worker:2", "evaluator:0"]
            .iter()
            .map(|t| field(&the_only_line(&out.stdout, t), "address").map(str::to_owned))
            .collect();
    assert_eq!(addresses.len(), 4, "every task has its own port");
}

#[test]
fn a_chief_takes_rank_zero_and_parameter_servers_have_none() {
    let out = run(&["--workers", "2", "--chief", "--ps", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let chief = the_only_line(&out.stdout, "chief:0");
    assert_eq!(
        (field(&chief, "rank"), field(&chief, "chief")),
        (Some("0"), Some("true"))
    );
    let worker = the_only_line(&out.stdout, "worker:1");
    assert_eq!(
        (field(&worker, "rank"), field(&worker, "world_size")),
        (Some("2"), Some("3"))
    );
    let ps = the_only_line(&out.stdout, "ps:0");
    assert_eq!(field(&ps, "rank"), Some("none"));
}

#[test]
fn a_failing_task_fails_the_run_names_the_task_and_stops_the_others() {
    // worker:1 exits with status 3 once everyone is up; the others would linger ten minutes.
    let out = run(&[
        "--workers",
        "3",
        "--grace-secs",
        "2",
        "--",
        "--fail-as",
        "worker:1",
        "--fail-after-ms",
        "2000",
        "--linger-ms",
        "600000",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the run must fail\n{stderr}");
    assert!(
        stderr.contains("task worker:1 failed (exit status: 3)"),
        "{stderr}"
    );

    for task in ["worker:0", "worker:2"] {
        let line = the_only_line(&out.stdout, task);
        let pid = field(&line, "pid").expect("cluster_info prints its pid");
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "{task} (pid {pid}) was left running"
        );
    }
}

#[test]
fn a_cluster_with_nobody_to_train_is_refused_before_anything_starts() {
    let out = run(&["--workers", "0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--workers N with N ≥ 1, or --chief"),
        "{stderr}"
    );
}

#[test]
fn an_unknown_example_is_a_clear_build_error() {
    let out = xtask(&[
        "run-cluster",
        "--example",
        "no_such_example",
        "--profile",
        "dev",
    ])
    .expect("cargo xtask starts");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("building example `no_such_example`"),
        "{stderr}"
    );
}

#[test]
fn ctrl_c_stops_every_task_and_fails_the_run() {
    let mut args: Vec<&str> = COMMON.to_vec();
    args.extend([
        "--workers",
        "2",
        "--grace-secs",
        "2",
        "--",
        "--linger-ms",
        "600000",
    ]);
    let mut launcher = spawn_xtask(&args).expect("cargo xtask starts");
    let stdout = launcher.stdout.take().expect("stdout is piped");
    let (lines_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });

    // Wait (bounded: the first build of the example may be in progress) for both tasks.
    let mut pids = Vec::new();
    while pids.len() < 2 {
        match lines.recv_timeout(Duration::from_mins(5)) {
            Ok(line) => pids.extend(field(&line, "pid").map(str::to_owned)),
            Err(e) => {
                let _ = launcher.kill();
                panic!("the tasks never reported their pids: {e}");
            }
        }
    }
    let status = Command::new("kill")
        .args(["-INT", &launcher.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -INT failed");
    let exit = launcher.wait().unwrap();
    let mut stderr = String::new();
    launcher
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();

    assert!(!exit.success(), "an interrupted run must fail\n{stderr}");
    assert!(
        stderr.contains("interrupted; stopped all 2 tasks"),
        "{stderr}"
    );
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "task pid {pid} was left running"
        );
    }
}
