//! `ParameterServerStrategy` across real processes: a chief, two workers and two `ps` tasks
//! train the tutorial CNN; a worker killed (SIGKILL) mid-run has its step run on the other and
//! training finishes without a restart, each `ps` task applying that step once; a `ps` task killed (SIGKILL) is an error on the chief that
//! names it, and a restarted cluster resumes from the chief's checkpoint (after a `ps` task
//! or the chief died), also on three `ps` tasks where two saved it; a worker killed and
//! started again on its own rejoins and runs steps; the recommender example
//! learns with an embedding table of a million rows sharded over the `ps` tasks.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use lockstep_e2e::{
    check_documented_output, example_binary, field, task_lines, unused_ports, xtask,
};

fn cluster_args<'a>(launcher: &[&'a str]) -> Vec<&'a str> {
    cluster_args_with(launcher, "2", &["--epochs", "2", "--no-backup"])
}

/// Steps an epoch of the CNN runs: half of the 124 that take in every training digit once, so
/// that two epochs train on as many examples as one synchronous epoch of `mnist_keras`.
const STEPS_PER_EPOCH: &str = "62";

/// `run-cluster` of the example with `ps` tasks, the launcher's options and the example's
/// (after `--threads 1 --steps-per-epoch` [`STEPS_PER_EPOCH`]).
fn cluster_args_with<'a>(launcher: &[&'a str], ps: &'a str, example: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "run-cluster",
        "--profile",
        "dev",
        "--timeout-secs=600",
        "--workers",
        "2",
        "--ps",
        ps,
        "--chief",
    ];
    args.extend_from_slice(launcher);
    args.extend([
        "--example",
        "mnist_parameter_server",
        "--",
        "--threads",
        "1",
        "--steps-per-epoch",
        STEPS_PER_EPOCH,
    ]);
    args.extend_from_slice(example);
    args
}

/// The chief's `test_accuracy=` line.
fn result(stdout: &[u8]) -> String {
    task_lines(stdout, "chief:0")
        .into_iter()
        .find(|l| l.starts_with("test_accuracy="))
        .expect("the chief prints its result")
}

/// Checks that the run whose output is `stdout` trained two epochs' worth, from its second
/// epoch's line and its result. The second epoch's training accuracy (the mean over its
/// batches) is the steady measure: 0.907–0.924 in 5 runs of two epochs of 62 steps, where a
/// first epoch's is 0.643–0.661, so it also tells a resumed epoch from one trained afresh.
/// The test accuracy of the final weights swings with the last asynchronous steps
/// (0.920–0.933 in those runs; 0.878–0.933 after 124 steps in earlier ones), so its bar only
/// tells trained weights from broken ones.
fn assert_trained_two_epochs(stdout: &[u8]) {
    let chief = task_lines(stdout, "chief:0");
    let epoch = chief.iter().rev().find(|l| l.starts_with("Epoch 2/2 "));
    assert!(
        epoch.is_some(),
        "the chief logs its second epoch: {chief:?}"
    );
    let epoch = epoch.unwrap();
    let training: Option<f64> = epoch
        .split(" - ")
        .find_map(|part| part.strip_prefix("accuracy: "))
        .and_then(|value| value.parse().ok());
    assert!(
        training.is_some(),
        "an epoch's line gives its accuracy: {epoch}"
    );
    assert!(training.unwrap() > 0.85, "{epoch}");
    let line = result(stdout);
    let accuracy: f64 = field(&line, "test_accuracy").unwrap().parse().unwrap();
    assert!(accuracy > 0.8, "{line}");
}

#[test]
fn a_chief_two_workers_and_two_ps_tasks_train_to_the_synchronous_accuracy_and_all_exit() {
    let out = xtask(&cluster_args(&["--evaluator"])).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    check_documented_output(&out.stdout, "mnist_parameter_server").unwrap();
    // One epoch of mnist_keras (synchronous: the same CNN, Adam and as many examples) reaches
    // 0.914 on the test digits; asynchronous steps train as far, judged as the helper says.
    assert_trained_two_epochs(&out.stdout);
    let line = result(&out.stdout);
    assert_eq!(field(&line, "steps"), Some("124"), "{line}");
    // The evaluator task evaluated the epochs' weights, the last the chief's final ones.
    let evaluator = task_lines(&out.stdout, "evaluator:0");
    let evaluated = evaluator
        .iter()
        .find(|l| l.starts_with("evaluated="))
        .expect("the evaluator prints its result");
    // It evaluates the newest weights each time it looks: one or both epochs.
    assert_eq!(
        field(evaluated, "last_checkpoint"),
        Some("weights-2.safetensors"),
        "{evaluated}"
    );
    assert_eq!(
        field(evaluated, "test_accuracy"),
        field(&line, "test_accuracy"),
        "{evaluated} / {line}"
    );
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
    assert_eq!(field(&line, "steps"), Some("124"), "{line}");
    assert_trained_two_epochs(&out.stdout);
    assert!(
        logs.contains("steps ran again after their worker was lost retried=1"),
        "{logs}"
    );
    // Worker 1 was killed after its step's push reached both ps tasks, and the step ran again
    // on worker 0: each ps task applied that step's push once. The CNN's 8 variables are 4
    // shards on each, so 4 updates a step: 124 steps, 496 updates each.
    for ps in ["ps:0", "ps:1"] {
        let applied = task_lines(&out.stdout, ps)
            .into_iter()
            .find_map(|l| l.strip_prefix("updates_applied=").map(str::to_owned));
        assert_eq!(applied.as_deref(), Some("496"), "{ps}: {logs}");
    }
}

#[test]
fn a_ps_task_killed_mid_run_is_an_error_on_the_chief_naming_it_and_every_task_ends() {
    let out = xtask(&cluster_args_with(
        &["--keep-going", "--kill", "ps:0@300"],
        "2",
        &["--epochs", "2", "--no-backup"],
    ))
    .unwrap();
    let logs = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{logs}");
    // The chief's error names the ps task and how it was lost; the launcher ended (every
    // worker and the other ps task were told that training is over).
    let chief = task_lines(&out.stdout, "chief:0").join("\n")
        + &task_lines(&out.stderr, "chief:0").join("\n");
    assert!(
        chief.contains("a parameter server: ps:0: connection to"),
        "{logs}"
    );
    assert!(logs.contains("task ps:0 failed"), "{logs}");
}

/// Trains 2 epochs with `kill` (a task killed in the second), restarting the cluster once;
/// checks that the second start resumed from the chief's checkpoint of epoch 1 and trained
/// epoch 2 only, and that the completed run deleted its checkpoints.
fn restarted_after(kill: &str, task: &str) {
    let dir = tempfile::tempdir().unwrap();
    let backup = dir.path().join("backup");
    let backup = backup.to_str().unwrap();
    let out = xtask(&cluster_args_with(
        &["--kill", kill, "--restart-on-failure", "1"],
        "2",
        &["--epochs", "2", "--backup-dir", backup],
    ))
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("task {task} failed")), "{stderr}");
    let chief = task_lines(&out.stdout, "chief:0");
    assert!(
        chief
            .iter()
            .any(|l| l == "Restored the checkpoint of epoch 1"),
        "{chief:?}"
    );
    let line = result(&out.stdout);
    assert_eq!(
        field(&line, "steps"),
        Some(STEPS_PER_EPOCH),
        "the second start trains epoch 2: {line}"
    );
    assert_trained_two_epochs(&out.stdout);
    assert!(
        !std::path::Path::new(backup).exists(),
        "a completed run deletes its checkpoints"
    );
}

#[test]
fn a_cluster_restarted_after_a_ps_task_died_resumes_from_the_chiefs_checkpoint() {
    // ps:0 applies 4 shards' gradients a step: 400 falls in the second epoch of 62 steps.
    restarted_after("ps:0@400", "ps:0");
}

#[test]
fn a_cluster_restarted_after_the_chief_died_mid_epoch_resumes_from_its_checkpoint() {
    // Step 100 falls in the second epoch (62 steps each).
    restarted_after("chief:0@100", "chief:0");
}

#[test]
fn shards_checkpointed_by_two_ps_tasks_restore_onto_three() {
    let dir = tempfile::tempdir().unwrap();
    let backup = dir.path().join("backup");
    let backup = backup.to_str().unwrap();
    let first = xtask(&cluster_args_with(
        &[],
        "2",
        &[
            "--epochs",
            "1",
            "--shards",
            "2",
            "--keep-backup",
            "--backup-dir",
            backup,
        ],
    ))
    .unwrap();
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let second = xtask(&cluster_args_with(
        &[],
        "3",
        &["--epochs", "2", "--shards", "3", "--backup-dir", backup],
    ))
    .unwrap();
    assert!(
        second.status.success(),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let chief = task_lines(&second.stdout, "chief:0");
    assert!(
        chief
            .iter()
            .any(|l| l == "Restored the checkpoint of epoch 1"),
        "{chief:?}"
    );
    let line = result(&second.stdout);
    assert_eq!(field(&line, "ps_tasks"), Some("3"), "{line}");
    // One more epoch on top of the first, not a first epoch again.
    assert_trained_two_epochs(&second.stdout);
}

#[test]
fn a_table_of_a_million_rows_sharded_over_two_ps_tasks_learns_the_generated_clicks() {
    let out = xtask(&[
        "run-cluster",
        "--profile",
        "dev",
        "--timeout-secs=600",
        "--workers",
        "2",
        "--ps",
        "2",
        "--chief",
        "--example",
        "recommender",
        "--",
        "--threads",
        "1",
        "--epochs",
        "2",
    ])
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    check_documented_output(&out.stdout, "recommender").unwrap();
    let line = result(&out.stdout);
    assert_eq!(field(&line, "rows"), Some("1048576"), "{line}");
    assert_eq!(field(&line, "steps"), Some("2000"), "{line}");
    // Always answering the commoner label scores the baseline; the model learns which items
    // are good (on rows it fetched a few at a time) and beats it by far.
    let accuracy: f64 = field(&line, "test_accuracy").unwrap().parse().unwrap();
    let baseline: f64 = field(&line, "baseline_accuracy").unwrap().parse().unwrap();
    assert!(accuracy > baseline + 0.1, "{line}");
}

/// Starts `mnist_parameter_server` by hand as task `job:index` of `cluster` (`TF_CONFIG`'s
/// cluster object), for 3 epochs of 100 steps; its stderr (and, but for the chief's, its
/// stdout) goes to `logs/JOB-INDEX.err` (`.out`).
fn start_task(binary: &Path, cluster: &str, (job, index): (&str, usize), logs: &Path) -> Child {
    let file = |extension: &str| File::create(logs.join(format!("{job}-{index}.{extension}")));
    let stdout = if job == "chief" {
        Stdio::piped()
    } else {
        file("out").unwrap().into()
    };
    Command::new(binary)
        .args([
            "--threads",
            "1",
            "--epochs",
            "3",
            "--steps-per-epoch",
            "100",
        ])
        .args(["--no-backup", "--rendezvous-timeout-secs", "60"])
        .env(
            "TF_CONFIG",
            format!(r#"{{"cluster": {cluster}, "task": {{"type": "{job}", "index": {index}}}}}"#),
        )
        .env(
            "LOCKSTEP_CLUSTER_SECRET",
            "the secret of the rejoining-worker test",
        )
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(file("err").unwrap())
        .spawn()
        .unwrap()
}

#[test]
fn a_worker_killed_and_started_again_alone_rejoins_and_runs_steps() {
    let binary = example_binary("mnist_parameter_server").unwrap();
    let logs = tempfile::tempdir().unwrap();
    let first = unused_ports(4).unwrap();
    let at = |i: u16| format!("127.0.0.1:{}", first + i);
    let cluster = format!(
        r#"{{"chief": ["{}"], "worker": ["{}", "{}"], "ps": ["{}"]}}"#,
        at(0),
        at(1),
        at(2),
        at(3)
    );
    let start = |job, index| start_task(&binary, &cluster, (job, index), logs.path());
    let mut others = vec![start("ps", 0), start("worker", 0)];
    let mut worker1 = start("worker", 1);
    let mut chief = start("chief", 0);
    // Once the first epoch is over, worker 1 is SIGKILLed, then started again on its own.
    let mut lines = BufReader::new(chief.stdout.take().unwrap()).lines();
    let mut printed = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let first_epoch = line.starts_with("Epoch 1/");
        printed.push(line);
        if first_epoch {
            break;
        }
    }
    worker1.kill().unwrap();
    worker1.wait().unwrap();
    others.push(start("worker", 1));
    printed.extend(lines.map(Result::unwrap));
    let status = chief.wait().unwrap();
    let read = |name: &str| std::fs::read_to_string(logs.path().join(name)).unwrap();
    let chief_log = read("chief-0.err");
    assert!(status.success(), "{chief_log}");
    for mut task in others {
        assert!(task.wait().unwrap().success(), "{}", read("worker-1.err"));
    }
    let result = printed
        .iter()
        .find(|l| l.starts_with("test_accuracy="))
        .expect("the chief prints its result");
    assert_eq!(field(result, "steps"), Some("300"), "{result}");
    // The coordinator lost worker 1, connected to it again, and the restarted process ran
    // steps until the chief ended training.
    let worker1_connected = format!("connected to a worker worker={}", at(2));
    assert_eq!(
        chief_log.matches(&worker1_connected).count(),
        2,
        "{chief_log}"
    );
    assert!(chief_log.contains("lost a worker"), "{chief_log}");
    let restarted = read("worker-1.err");
    let steps: u64 = restarted
        .lines()
        .find(|l| l.contains("served steps"))
        .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix("steps=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the restarted worker says what it served: {restarted}"));
    assert!(steps > 0, "{restarted}");
}
