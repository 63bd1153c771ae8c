//! The Estimator tutorial across real processes: two workers and an evaluator task, a
//! cluster killed mid-run that resumes at its global step, and a chief killed while it writes
//! a checkpoint.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::path::Path;
use std::time::{Duration, Instant};

use lockstep_e2e::{check_documented_output, spawn_xtask, task_lines, xtask};

fn cluster_args<'a>(model_dir: &'a str, max_steps: &'a str) -> Vec<&'a str> {
    vec![
        "run-cluster",
        "--profile",
        "dev",
        "--timeout-secs=600",
        "--workers",
        "2",
        "--evaluator",
        "--example",
        "mnist_estimator",
        "--",
        "--threads",
        "1",
        "--save-checkpoints-steps",
        "10",
        "--eval-steps",
        "4",
        "--model-dir",
        model_dir,
        "--max-steps",
        max_steps,
    ]
}

/// The global steps of the checkpoints in `dir`.
fn checkpoints(dir: &Path) -> Vec<u64> {
    let mut steps: Vec<u64> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.strip_prefix("ckpt-"))
                        .and_then(|s| s.parse().ok())
                })
                .collect()
        })
        .unwrap_or_default();
    steps.sort_unstable();
    steps
}

#[test]
fn two_workers_and_an_evaluator_train_and_evaluate_to_max_steps() {
    let dir = tempfile::tempdir().unwrap();
    let model_dir = dir.path().to_str().unwrap();
    let out = xtask(&cluster_args(model_dir, "30")).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    check_documented_output(&out.stdout, "mnist_estimator").unwrap();
    let evaluator = task_lines(&out.stdout, "evaluator:0");
    let last = evaluator.last().unwrap();
    assert!(last.ends_with("'global_step': 30}"), "{evaluator:?}");
    assert!(
        task_lines(&out.stdout, "worker:0").is_empty(),
        "only the evaluator evaluates"
    );
    assert_eq!(checkpoints(dir.path()).last(), Some(&30));
    assert!(stderr.contains("evaluation of ckpt-30"), "{stderr}");
}

#[test]
fn a_killed_cluster_restarted_resumes_at_its_global_step() {
    let dir = tempfile::tempdir().unwrap();
    let model_dir = dir.path().to_str().unwrap();
    let mut args = cluster_args(model_dir, "100000");
    // Slow enough to kill mid-run: no evaluator needed for that part.
    args.retain(|a| *a != "--evaluator");
    let mut child = spawn_xtask(&args).unwrap();
    let deadline = Instant::now() + Duration::from_mins(5);
    while checkpoints(dir.path()).last().is_none_or(|s| *s < 20) {
        assert!(
            Instant::now() < deadline,
            "no checkpoint of step 20 appeared"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the cluster ended early"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SIGTERM to the launcher: it kills every task, which the examples do not catch.
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(!child.wait().unwrap().success());
    let saved = *checkpoints(dir.path()).last().unwrap();

    let max_steps = (saved + 15).to_string();
    let out = xtask(&cluster_args(model_dir, &max_steps)).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "restored the newest checkpoint global_step={saved}"
        )),
        "{stderr}"
    );
    // 15 more steps: one checkpoint every 10 steps and one at the end, none repeated.
    let after: Vec<u64> = checkpoints(dir.path())
        .into_iter()
        .filter(|s| *s > saved)
        .collect();
    let expected: Vec<u64> = ((saved + 1)..=(saved + 15))
        .filter(|s| s % 10 == 0 || *s == saved + 15)
        .collect();
    let kept: Vec<u64> = expected.iter().rev().take(5).rev().copied().collect();
    assert_eq!(after, kept, "{stderr}");
    let evaluator = task_lines(&out.stdout, "evaluator:0");
    assert!(
        evaluator
            .last()
            .unwrap()
            .ends_with(&format!("'global_step': {max_steps}}}")),
        "{evaluator:?}"
    );
}

#[test]
fn a_chief_killed_while_writing_a_checkpoint_restarts_from_the_previous_one() {
    let dir = tempfile::tempdir().unwrap();
    let model_dir = dir.path().to_str().unwrap();
    let mut args = cluster_args(model_dir, "30");
    args.splice(
        1..1,
        ["--restart-on-failure", "1", "--kill", "worker:0@save:20"],
    );
    let out = xtask(&args).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("LOCKSTEP_KILL_IN_SAVE: killing this process")
            && stderr.contains("task worker:0 failed (signal: 9 (SIGKILL))"),
        "{stderr}"
    );
    // Step 20's checkpoint was written but never published: the restart resumes from step 10's.
    assert!(
        stderr.contains("restored the newest checkpoint global_step=10"),
        "{stderr}"
    );
    assert_eq!(checkpoints(dir.path()), [10, 20, 30]);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let evaluator = task_lines(&out.stdout, "evaluator:0");
    assert!(
        evaluator.last().unwrap().ends_with("'global_step': 30}"),
        "{evaluator:?}"
    );
}
