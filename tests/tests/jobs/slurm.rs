//! The sbatch script `cargo xtask deploy slurm` writes, submitted to a real SLURM (one node,
//! 2 tasks): the job completes, and with one task killed (SIGKILL) mid-run on its first start, the
//! script's restart loop brings the job to the weights of an uninterrupted run. A skip that
//! the log shows where no SLURM answers (`sinfo` shows no idle node); `.ci/run` starts one with
//! `.ci/slurm_up` and sets `LOCKSTEP_REQUIRE_SLURM=1`.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Stdio};

use lockstep_e2e::{example_binary, unused_ports, weights_checksums, write_slurm_script};
use lockstep_testenv::{Need, skip};

/// What each task runs: the example, with task 1 told to SIGKILL itself after step 25 on its
/// first start only (`mkdir` is atomic: one start of one task makes the marker).
const KILL_ONCE: &str = r#"#!/bin/bash
if [ "${SLURM_PROCID:-}" = 1 ] && mkdir "$SLURM_SUBMIT_DIR/.killed-once" 2>/dev/null; then
    export LOCKSTEP_KILL_AT_STEP=25
fi
exec "$REAL_BIN" "$@"
"#;

fn slurm_is_up() -> Result<(), String> {
    let out = Command::new("sinfo")
        .args(["-h", "-o", "%T"])
        .output()
        .map_err(|e| format!("no `sinfo` ({e}): SLURM is not installed"))?;
    let states = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && states.lines().any(|s| s.trim() == "idle") {
        Ok(())
    } else {
        Err(format!(
            "SLURM has no idle node (`sinfo`: {}{})",
            states.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Submits `dir/lockstep.sbatch` with `sbatch --wait` from `dir`, each task running `bin`:
/// the job's output file, once it has ended.
fn submit(dir: &Path, bin: &Path, real_bin: &Path) -> String {
    let out = Command::new("sbatch")
        .args(["--wait", "--quiet", "lockstep.sbatch"])
        .args(["--epochs", "1", "--backup-every-steps", "10"])
        .current_dir(dir)
        .env("LOCKSTEP_BIN", bin)
        .env("REAL_BIN", real_bin)
        .env("LOCKSTEP_PORT", unused_ports(2).unwrap().to_string())
        .env_remove("TF_CONFIG")
        .env_remove("LOCKSTEP_CLUSTER_SECRET")
        .env_remove("LOCKSTEP_CLUSTER_SECRET_FILE")
        .env_remove("CLICOLOR_FORCE")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let log: String = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "out"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    assert!(
        out.status.success(),
        "the job failed ({}): {}\n{log}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    log
}

#[test]
fn a_job_under_slurm_with_a_task_killed_restarts_and_ends_with_the_uninterrupted_weights() {
    if let Err(why) = slurm_is_up() {
        skip(Need::Slurm, why);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write_slurm_script(dir.path()).unwrap();
    let example = example_binary("mnist_keras").unwrap();
    let wrapper = dir.path().join("kill-once");
    std::fs::write(&wrapper, KILL_ONCE).unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();

    let log = submit(dir.path(), &wrapper, &example);
    assert!(
        dir.path().join(".killed-once").exists(),
        "task 1 never started:\n{log}"
    );
    assert!(
        log.contains("starting every task again (1 of 3)"),
        "no restart:\n{log}"
    );
    assert!(log.contains("source=SLURM"), "{log}");
    let restarted = weights_checksums(log.as_bytes());
    assert_eq!(restarted.len(), 2, "{log}");

    // The same job started by the local launcher from TF_CONFIG, never interrupted.
    assert_eq!(restarted, crate::uninterrupted::weights());
}
