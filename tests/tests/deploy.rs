//! `cargo xtask deploy`: the files it writes run a job the way the engines run it.
//!
//! The sbatch script runs under a stand-in `srun` that does what SLURM's does on one node:
//! it starts `SLURM_NTASKS` copies of the command with SLURM's variables, and with
//! `--kill-on-bad-exit` stops them all when one fails. The Kubernetes manifests' fields are
//! checked by xtask's unit tests and, in `.ci/run`, against the controllers' own API models.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;

use lockstep_e2e::{example_binary, field, task_lines, xtask};

/// SLURM's `srun` on one node, as far as the script uses it. `FAKE_SRUN_KILL=TASK@STEP` makes
/// task TASK of the first step SIGKILL itself after training step STEP.
const FAKE_SRUN: &str = r#"#!/bin/bash
set -u
while [[ "${1:-}" == --* ]]; do shift; done
first_step_done="$SLURM_SUBMIT_DIR/.first-step"
pids=()
for ((i = 0; i < SLURM_NTASKS; i++)); do
    kill=()
    if [ -n "${FAKE_SRUN_KILL:-}" ] && [ ! -e "$first_step_done" ] && [ "${FAKE_SRUN_KILL%@*}" = "$i" ]; then
        kill=("LOCKSTEP_KILL_AT_STEP=${FAKE_SRUN_KILL#*@}")
    fi
    env SLURM_PROCID="$i" SLURM_STEP_NODELIST=localhost SLURM_STEP_TASKS_PER_NODE="$SLURM_NTASKS" \
        "${kill[@]}" "$@" &
    pids+=($!)
done
touch "$first_step_done"
for ((n = 0; n < SLURM_NTASKS; n++)); do
    wait -n
    status=$?
    if [ "$status" -ne 0 ]; then
        kill "${pids[@]}" 2>/dev/null
        wait
        exit "$status"
    fi
done
"#;

/// A port whose successor is free too (the second task on the node listens one above).
fn two_free_ports() -> u16 {
    for _ in 0..100 {
        let first = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = first.local_addr().unwrap().port();
        if port < u16::MAX && TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
    panic!("no two consecutive free ports on 127.0.0.1");
}

/// Runs the generated script in `dir` as `sbatch` would on a node, with `fake_kill` passed to
/// the stand-in `srun`: (stdout, stderr).
fn sbatch(dir: &Path, fake_kill: Option<&str>) -> (Vec<u8>, String) {
    let bin_dir = dir.join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let srun = bin_dir.join("srun");
    std::fs::write(&srun, FAKE_SRUN).unwrap();
    std::fs::set_permissions(&srun, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut command = Command::new("bash");
    command
        .arg(dir.join("lockstep.sbatch"))
        .args(["--epochs", "1", "--backup-every-steps", "10"])
        .current_dir(dir)
        .env("PATH", path)
        .env("SLURM_JOB_ID", "4242")
        .env("SLURM_NTASKS", "2")
        .env("SLURM_SUBMIT_DIR", dir)
        .env("LOCKSTEP_BIN", example_binary("mnist_keras").unwrap())
        .env("LOCKSTEP_PORT", two_free_ports().to_string())
        .env_remove("TF_CONFIG");
    if let Some(kill) = fake_kill {
        command.env("FAKE_SRUN_KILL", kill);
    }
    let out = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "the job failed:\n{stderr}");
    (out.stdout, stderr)
}

/// The weights checksum each task printed last, in the order of their lines.
fn checksums(stdout: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| field(l, "weights_checksum").map(str::to_owned))
        .collect()
}

#[test]
fn the_sbatch_script_restarts_every_task_and_ends_with_the_uninterrupted_weights() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let written = xtask(&[
        "deploy",
        "slurm",
        "--nodes",
        "1",
        "--tasks-per-node",
        "2",
        "--cpus-per-task",
        "1",
        "--out",
        out,
    ])
    .unwrap();
    assert!(
        written.status.success(),
        "{}",
        String::from_utf8_lossy(&written.stderr)
    );

    let (stdout, stderr) = sbatch(dir.path(), Some("1@25"));
    assert!(
        stderr.contains("starting every task again (1 of 3)"),
        "no restart:\n{stderr}"
    );
    assert!(stderr.contains("source=SLURM"), "{stderr}");
    let restarted = checksums(&stdout);
    assert_eq!(restarted.len(), 2, "{}", String::from_utf8_lossy(&stdout));

    // The same job started by the local launcher from TF_CONFIG, never interrupted.
    let backup = tempfile::tempdir().unwrap();
    let reference = xtask(&[
        "run-cluster",
        "--profile",
        "dev",
        "--timeout-secs=600",
        "--",
        "--epochs",
        "1",
        "--threads",
        "1",
        "--backup-dir",
        backup.path().to_str().unwrap(),
    ])
    .unwrap();
    assert!(reference.status.success());
    for (rank, restarted) in restarted.iter().enumerate() {
        let lines = task_lines(&reference.stdout, &format!("worker:{rank}"));
        let uninterrupted = field(lines.last().unwrap(), "weights_checksum").unwrap();
        assert_eq!(restarted, uninterrupted, "worker {rank}");
    }
}

#[test]
fn deploy_refuses_a_bad_name_with_the_rule_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("k8s");
    let run = xtask(&[
        "deploy",
        "k8s",
        "--name",
        "My_Job",
        "--out",
        out.to_str().unwrap(),
    ])
    .unwrap();
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("\"My_Job\" is not a DNS label"), "{stderr}");
    assert!(!out.exists());
}
