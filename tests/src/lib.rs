//! Helpers for the end-to-end tests: run `cargo xtask …` from the workspace root, as a user
//! would, and read what each task printed.
//!
//! ```no_run
//! let run = lockstep_e2e::xtask(&["run-cluster", "--workers", "2", "--profile", "dev"])?;
//! assert!(run.status.success());
//! let lines = lockstep_e2e::task_lines(&run.stdout, "worker:0");
//! # Ok::<(), std::io::Error>(())
//! ```

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

pub use lockstep_testenv::unused_ports;

pub mod hosts;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().unwrap_or(here).to_path_buf()
}

/// Runs `cargo xtask ARGS` in the workspace root and collects its output.
///
/// # Errors
///
/// When cargo cannot be started at all.
pub fn xtask(args: &[&str]) -> std::io::Result<Output> {
    xtask_command(args).output()
}

/// Starts `cargo xtask ARGS` in the workspace root with stdout and stderr piped, for tests
/// that interact with the launcher while it runs. `cargo` replaces itself with the xtask
/// binary, so the child's pid is the launcher's.
///
/// # Errors
///
/// When cargo cannot be started at all.
pub fn spawn_xtask(args: &[&str]) -> std::io::Result<Child> {
    xtask_command(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
}

/// Builds example `name` (dev profile) and returns its binary, to run one process by hand.
///
/// # Errors
///
/// When cargo cannot run or the build fails.
pub fn example_binary(name: &str) -> std::io::Result<PathBuf> {
    build_with_launcher(name).map(|(example, _)| example)
}

/// Builds the `lockstep` launcher (dev profile) and returns its binary.
///
/// # Errors
///
/// When cargo cannot run or the build fails.
pub fn launcher_binary() -> std::io::Result<PathBuf> {
    build_with_launcher("cluster_info").map(|(_, launcher)| launcher)
}

/// Runs the `lockstep` launcher (dev profile, see [`launcher_binary`]) with `args` in the
/// workspace root, as `cargo xtask deploy` runs it, and collects its output.
///
/// # Errors
///
/// When the launcher cannot be built or started.
pub fn lockstep(args: &[&str]) -> std::io::Result<Output> {
    Command::new(launcher_binary()?)
        .args(args)
        .current_dir(workspace_root())
        .stdin(Stdio::null())
        .env_remove("CLICOLOR_FORCE")
        .output()
}

/// Builds example `name` and the launcher (dev profile) in one cargo run, as
/// `cargo xtask run-cluster --profile dev` does: the same packages selected, so the same
/// features, and none of the artifacts it built is built again.
fn build_with_launcher(name: &str) -> std::io::Result<(PathBuf, PathBuf)> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(workspace_root())
        .args(["build", "--quiet", "--profile", "dev"])
        .args(["--package", "lockstep-examples", "--bin", name])
        .args(["--package", "lockstep-launcher", "--bin", "lockstep"])
        .stdin(Stdio::null())
        .status()?;
    if !status.success() {
        return Err(std::io::Error::other(format!(
            "building {name} and the launcher failed: {status}"
        )));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from);
    let debug = target.join("debug");
    Ok((debug.join(name), debug.join("lockstep")))
}

fn xtask_command(args: &[&str]) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(workspace_root())
        .arg("xtask")
        .args(args)
        .stdin(Stdio::null())
        // Output is piped here, as into a file; a forced colour setting would say otherwise.
        .env_remove("CLICOLOR_FORCE");
    command
}

/// Runs `mnist_keras` for one epoch on 2 workers through `cargo xtask run-cluster` (dev
/// profile, one kernel thread each, a backup every 10 steps in `backup`), with the launcher
/// options `extra`: (the launcher's stderr, each worker's last weights checksum).
///
/// # Errors
///
/// When cargo cannot run, the job fails (the error holds its stderr), or a worker printed no
/// checksum.
pub fn keras_epoch(backup: &Path, extra: &[&str]) -> Result<(String, Vec<String>), String> {
    let backup = backup.to_str().ok_or("the backup path is not UTF-8")?;
    let mut args = vec!["run-cluster", "--profile", "dev", "--timeout-secs=600"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[
        "--",
        "--epochs",
        "1",
        "--threads",
        "1",
        "--backup-every-steps",
        "10",
        "--backup-dir",
        backup,
    ]);
    let out = xtask(&args).map_err(|e| format!("cargo xtask: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(format!("the job failed:\n{stderr}"));
    }
    let checksums = (0..2)
        .map(|rank| {
            task_lines(&out.stdout, &format!("worker:{rank}"))
                .last()
                .and_then(|last| field(last, "weights_checksum").map(str::to_owned))
                .ok_or_else(|| format!("worker:{rank} printed no weights checksum"))
        })
        .collect::<Result<_, _>>()?;
    Ok((stderr, checksums))
}

/// Writes the sbatch script of `lockstep deploy slurm` (what `cargo xtask deploy slurm` runs)
/// for one node of 2 tasks, one core each, into `dir`.
///
/// # Errors
///
/// When the launcher cannot run or fails (its stderr is the error).
pub fn write_slurm_script(dir: &Path) -> Result<(), String> {
    let out = dir.to_str().ok_or("the folder's path is not UTF-8")?;
    let args = [
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
    ];
    let written = lockstep(&args).map_err(|e| format!("lockstep: {e}"))?;
    if !written.status.success() {
        return Err(String::from_utf8_lossy(&written.stderr).into_owned());
    }
    Ok(())
}

/// The weights checksum of every line of `output` that prints one, in order.
pub fn weights_checksums(output: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(output)
        .lines()
        .filter_map(|l| field(l, "weights_checksum").map(str::to_owned))
        .collect()
}

/// The lines a task printed, without the `[task] ` prefix the launcher adds.
pub fn task_lines(output: &[u8], task: &str) -> Vec<String> {
    let prefix = format!("[{task}] ");
    String::from_utf8_lossy(output)
        .lines()
        .filter_map(|line| line.strip_prefix(&prefix).map(str::to_owned))
        .collect()
}

/// The value of `key=value` in a line of space-separated fields.
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// The keys of a line of `key=value` fields, in order, up to the first word that is not one
/// (free text, such as an error message, may follow the last field).
pub fn keys(line: &str) -> Vec<&str> {
    line.split_whitespace()
        .map_while(|word| {
            let (key, _) = word.split_once('=')?;
            (!key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
                .then_some(key)
        })
        .collect()
}

/// The output an example's documentation shows: each `[task] …` line of the `text` block in
/// `examples/src/bin/EXAMPLE.rs`, as `(task, line without the prefix)`.
///
/// # Errors
///
/// When the example's source cannot be read.
pub fn documented_output(example: &str) -> std::io::Result<Vec<(String, String)>> {
    let path = workspace_root()
        .join("examples/src/bin")
        .join(format!("{example}.rs"));
    let source = std::fs::read_to_string(path)?;
    Ok(source
        .lines()
        .filter_map(|line| line.strip_prefix("//! ["))
        .filter_map(|rest| rest.split_once("] "))
        .map(|(task, line)| (task.to_owned(), line.to_owned()))
        .collect())
}

/// Checks that every line an example's documentation shows (see [`documented_output`]) has
/// the same fields, in the same order, as some line its task printed in `stdout`: the
/// documentation cannot drift from the program. Lines of a task that printed nothing (one
/// this run's cluster lacks, such as an evaluator) are not checked, but at least one line is.
///
/// # Errors
///
/// A description of the first documented line with no printed counterpart.
pub fn check_documented_output(stdout: &[u8], example: &str) -> Result<(), String> {
    let documented = documented_output(example).map_err(|e| e.to_string())?;
    let mut checked = 0;
    for (task, line) in documented {
        let printed = task_lines(stdout, &task);
        if printed.is_empty() {
            continue;
        }
        checked += 1;
        if !printed.iter().any(|p| keys(p) == keys(&line)) {
            return Err(format!(
                "{example}'s documentation shows `[{task}] {line}` (fields {:?}), but {task} printed:\n{}",
                keys(&line),
                printed.join("\n")
            ));
        }
    }
    if checked == 0 {
        return Err(format!(
            "no task of {example}'s documented output printed anything:\n{}",
            String::from_utf8_lossy(stdout)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_lines_strip_only_their_own_prefix() {
        let out = b"[worker:0] a=1\n[worker:1] a=2\n[worker:0] b=3\nplain\n";
        assert_eq!(task_lines(out, "worker:0"), ["a=1", "b=3"]);
        assert_eq!(task_lines(out, "chief:0"), Vec::<String>::new());
    }

    #[test]
    fn keys_stop_at_free_text() {
        assert_eq!(keys("a=1 b_c=x y"), ["a", "b_c"]);
        assert_eq!(
            keys("result=error kind=PeerLost detail=rank 1 was lost: k=v"),
            ["result", "kind", "detail"]
        );
        assert!(keys("ranks bytes").is_empty());
    }

    #[test]
    fn every_example_documents_its_output() {
        for example in [
            "mnist_custom_loop",
            "cluster_info",
            "collective_check",
            "allreduce_bench",
        ] {
            assert!(
                !documented_output(example).unwrap().is_empty(),
                "{example} shows no output in its documentation"
            );
        }
    }

    #[test]
    fn fields_are_found_by_key() {
        assert_eq!(field("task=worker:1 rank=1", "rank"), Some("1"));
        assert_eq!(field("task=worker:1 rank=1", "ran"), None);
    }
}
