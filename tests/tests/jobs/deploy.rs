//! `lockstep deploy` (what `cargo xtask deploy` becomes): the files it writes run a job the way
//! the engines run it.
//!
//! The sbatch script runs under a stand-in `srun` that does what SLURM's does on one node:
//! it starts `SLURM_NTASKS` copies of the command with SLURM's variables, and with
//! `--kill-on-bad-exit` stops them all when one fails. The TFJob's tasks run with the
//! arguments of the manifest and `TF_CONFIG` as Kubeflow's operator writes it. The manifests'
//! fields are checked by xtask's unit tests and, in `.ci/run`, against the controllers' own
//! API models.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use lockstep_e2e::{
    example_binary, field, lockstep, unused_ports, weights_checksums, write_slurm_script,
};

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
        // The second task on the node listens one above the first.
        .env("LOCKSTEP_PORT", unused_ports(2).unwrap().to_string())
        .env_remove("TF_CONFIG");
    if let Some(kill) = fake_kill {
        command.env("FAKE_SRUN_KILL", kill);
    }
    let out = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "the job failed:\n{stderr}");
    (out.stdout, stderr)
}

#[test]
fn the_sbatch_script_restarts_every_task_and_ends_with_the_uninterrupted_weights() {
    let dir = tempfile::tempdir().unwrap();
    write_slurm_script(dir.path()).unwrap();

    let (stdout, stderr) = sbatch(dir.path(), Some("1@25"));
    assert!(
        stderr.contains("starting every task again (1 of 3)"),
        "no restart:\n{stderr}"
    );
    assert!(stderr.contains("source=SLURM"), "{stderr}");
    let restarted = weights_checksums(&stdout);
    assert_eq!(restarted.len(), 2, "{}", String::from_utf8_lossy(&stdout));

    // The same job started by the local launcher from TF_CONFIG, never interrupted.
    assert_eq!(restarted, crate::uninterrupted::weights());
}

#[test]
fn deploy_refuses_a_bad_name_with_the_rule_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("k8s");
    let run = lockstep(&[
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

/// Waits for `child` at most until `deadline`, killing it past that: (success, stdout).
fn finish(mut child: Child, deadline: Instant) -> (bool, String) {
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn the_tfjobs_tasks_train_and_evaluate_with_tf_config_as_the_operator_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("k8s");
    let written = lockstep(&[
        "deploy",
        "k8s",
        "--workers",
        "2",
        "--out",
        out.to_str().unwrap(),
        "--",
        "--epochs",
        "1",
    ])
    .unwrap();
    assert!(written.status.success());
    let text = std::fs::read_to_string(out.join("tfjob.yaml")).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let tfjob = docs.iter().find(|d| d["kind"] == "TFJob").unwrap();

    // The operator's TF_CONFIG names the chief and the workers, not the evaluator; here each
    // pod is a process on its own port of localhost, its volume a folder.
    // Both bound before either is released: a released port may be handed out again.
    let listeners: Vec<TcpListener> = (0..2)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let ports: Vec<u16> = listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect();
    drop(listeners);
    let cluster = json!({
        "chief": [format!("localhost:{}", ports[0])],
        "worker": [format!("localhost:{}", ports[1])],
    });
    let state = dir.path().join("state");
    let mut tasks = Vec::new();
    for (role, replica) in tfjob["spec"]["tfReplicaSpecs"].as_object().unwrap() {
        let container = &replica["template"]["spec"]["containers"][0];
        let command = container["command"][0].as_str().unwrap();
        let binary = example_binary(command.rsplit('/').next().unwrap()).unwrap();
        let args: Vec<String> = container["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let mount = container["volumeMounts"][0]["mountPath"].as_str().unwrap();
                a.as_str().unwrap().replace(mount, state.to_str().unwrap())
            })
            .collect();
        for index in 0..replica["replicas"].as_u64().unwrap() {
            let tf_config = json!({
                "cluster": cluster,
                "task": {"type": role.to_lowercase(), "index": index},
                "environment": "cloud",
            });
            let child = Command::new(&binary)
                .args(&args)
                .env("TF_CONFIG", tf_config.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            tasks.push((format!("{role}:{index}"), child));
        }
    }
    let deadline = Instant::now() + Duration::from_mins(5);
    let mut results = std::collections::BTreeMap::new();
    for (task, child) in tasks {
        let (success, stdout) = finish(child, deadline);
        assert!(success, "{task} failed:\n{stdout}");
        let last = stdout.lines().last().unwrap_or_default().to_owned();
        results.insert(task, last);
    }
    let chief = &results["Chief:0"];
    let worker = &results["Worker:0"];
    let evaluator = &results["Evaluator:0"];
    assert!(field(chief, "weights_checksum").is_some(), "{chief}");
    assert_eq!(
        field(chief, "weights_checksum"),
        field(worker, "weights_checksum")
    );
    assert_eq!(
        field(evaluator, "last_checkpoint"),
        Some("ckpt-1"),
        "{evaluator}"
    );
    assert_eq!(
        field(evaluator, "test_accuracy"),
        field(chief, "test_accuracy"),
        "the evaluator evaluated other weights than the chief's last"
    );
}
