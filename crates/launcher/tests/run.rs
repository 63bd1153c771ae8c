//! `lockstep run` starting programs that are not Lockstep's: what every task is given, how
//! failures end the job, and the chief's live line on a terminal.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::process::{Command, Output, Stdio};

use lockstep_testenv::{Need, skip};

fn lockstep(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(args)
        .stdin(Stdio::null())
        .env_remove("CLICOLOR_FORCE")
        .env_remove("LOCKSTEP_CLUSTER_SECRET")
        .env_remove("LOCKSTEP_CLUSTER_SECRET_FILE")
        .output()
        .unwrap()
}

/// The lines task `task` printed on stdout, without their prefix.
fn lines_of(stdout: &[u8], task: &str) -> Vec<String> {
    let prefix = format!("[{task}] ");
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
        .collect()
}

#[test]
fn every_task_of_any_program_gets_its_config_its_socket_and_the_jobs_secret() {
    let out = lockstep(&[
        "run",
        "--workers",
        "2",
        "--evaluator",
        "--timeout-secs",
        "60",
        "--",
        "sh",
        "-c",
        r#"echo "$LISTEN_FDS $LOCKSTEP_CLUSTER_SECRET $TF_CONFIG""#,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut secrets = Vec::new();
    for (task, kind, index) in [
        ("worker:0", "worker", 0),
        ("worker:1", "worker", 1),
        ("evaluator:0", "evaluator", 0),
    ] {
        let lines = lines_of(&out.stdout, task);
        assert_eq!(lines.len(), 1, "{task}: {lines:?}");
        let mut fields = lines[0].splitn(3, ' ');
        let (fds, secret, config) = (
            fields.next().unwrap(),
            fields.next().unwrap(),
            fields.next().unwrap(),
        );
        assert_eq!(fds, "1", "{task} was not handed its socket");
        assert_eq!(secret.len(), 64, "{task}'s secret: {secret:?}");
        secrets.push(secret.to_owned());
        let config: serde_json::Value = serde_json::from_str(config).unwrap();
        assert_eq!(config["task"]["type"], kind, "{config}");
        assert_eq!(config["task"]["index"], index, "{config}");
        assert_eq!(config["cluster"]["worker"].as_array().unwrap().len(), 2);
    }
    secrets.dedup();
    assert_eq!(secrets.len(), 1, "the tasks were given different secrets");
}

#[test]
fn a_failing_task_stops_the_others_and_the_launcher_names_it() {
    let out = lockstep(&[
        "run",
        "--workers",
        "2",
        "--timeout-secs",
        "60",
        "--grace-secs",
        "1",
        "--",
        "sh",
        "-c",
        r#"case "$TF_CONFIG" in *'"index":1'*) exit 3;; *) exec sleep 50;; esac"#,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("task worker:1 failed (exit status: 3)"),
        "{stderr}"
    );
}

#[test]
fn a_program_that_does_not_exist_is_named_in_the_error() {
    let out = lockstep(&["run", "--workers", "1", "--", "/nonexistent/trainer"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("starting worker:0"), "{stderr}");
}

#[test]
fn a_run_without_a_program_is_refused_with_usage() {
    let out = lockstep(&["run", "--workers", "2"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("PROGRAM"), "{stderr}");
}

#[test]
fn on_a_terminal_the_chiefs_unfinished_line_is_drawn_live_and_other_tasks_stay_lines() {
    // `script` (util-linux) runs the launcher with a terminal as its stdout.
    if let Err(e) = Command::new("script").arg("--version").output() {
        skip(
            Need::Terminal,
            format_args!("`script` (util-linux) cannot run: {e}"),
        );
        return;
    }
    let log = std::env::temp_dir().join(format!("lockstep-tty-{}.log", std::process::id()));
    let program = r"if [ -t 1 ]; then printf 'step 1\rstep 2'; sleep 0.3; printf '\rdone\n'; else echo piped; fi";
    let launcher = format!(
        "{} run --workers 2 --timeout-secs 60 -- sh -c \"{}\"",
        env!("CARGO_BIN_EXE_lockstep"),
        program.replace('"', "\\\"")
    );
    let status = Command::new("script")
        .args(["-q", "-e", "-c", &launcher])
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .env("NO_COLOR", "1")
        .status()
        .unwrap();
    let shown = std::fs::read(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    let shown = String::from_utf8_lossy(&shown);
    assert!(status.success(), "{shown}");
    // The chief's live line: cleared and redrawn, prefixed, without a line end of its own;
    // whatever is printed while it shows (the launcher's own log lines too) clears it first.
    assert!(shown.contains("\r\x1b[2K[worker:0] step 2"), "{shown:?}");
    for (at, _) in shown.match_indices("[worker:0] step 2") {
        let after = &shown[at + "[worker:0] step 2".len()..];
        assert!(
            after.starts_with('\r'),
            "written onto the live line: {after:?}"
        );
    }
    assert!(shown.contains("[worker:0] done\r\n"), "{shown:?}");
    // The other task's stdout is a pipe, as ever.
    assert!(shown.contains("[worker:1] piped"), "{shown:?}");
}
