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

fn xtask_command(args: &[&str]) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(workspace_root())
        .arg("xtask")
        .args(args)
        .stdin(Stdio::null());
    command
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
    fn fields_are_found_by_key() {
        assert_eq!(field("task=worker:1 rank=1", "rank"), Some("1"));
        assert_eq!(field("task=worker:1 rank=1", "ran"), None);
    }
}
