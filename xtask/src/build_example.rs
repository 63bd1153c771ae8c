//! Building an example binary and the `lockstep` launcher with cargo, and finding the
//! executables it produced.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};

/// The package that holds the example binaries.
const EXAMPLES_PACKAGE: &str = "lockstep-examples";

/// The launcher's package and binary.
const LAUNCHER_PACKAGE: &str = "lockstep-launcher";
const LAUNCHER: &str = "lockstep";

/// What [`build_example`] built.
#[derive(Debug)]
pub(crate) struct Built {
    pub(crate) example: PathBuf,
    pub(crate) launcher: PathBuf,
}

/// The workspace root, where `cargo` must run.
pub(crate) fn workspace_root() -> PathBuf {
    let xtask_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    xtask_dir.parent().unwrap_or(xtask_dir).to_path_buf()
}

/// Builds `example` and the launcher with the cargo profile `profile`, in one cargo run, and
/// returns their executables' paths.
pub(crate) fn build_example(example: &str, profile: &str) -> anyhow::Result<Built> {
    let built = build(
        profile,
        &[(EXAMPLES_PACKAGE, example), (LAUNCHER_PACKAGE, LAUNCHER)],
    )
    .with_context(|| {
        format!(
            "building example `{example}` ({profile} profile) failed; examples are the \
             binaries of the `{EXAMPLES_PACKAGE}` package"
        )
    })?;
    let [example, launcher] = <[PathBuf; 2]>::try_from(built)
        .map_err(|_| anyhow::anyhow!("cargo reported another number of executables"))?;
    Ok(Built { example, launcher })
}

/// Builds the launcher alone (release profile) and returns its executable's path.
pub(crate) fn build_launcher() -> anyhow::Result<PathBuf> {
    build("release", &[(LAUNCHER_PACKAGE, LAUNCHER)])?
        .pop()
        .context("cargo reported no executable for the launcher")
}

/// Builds each `(package, binary)` with the cargo profile `profile`, in one cargo run, and
/// returns their executables' paths in the same order.
///
/// Cargo's JSON messages name the artifact, so this works whatever `CARGO_TARGET_DIR` or the
/// profile's output folder is. Compiler diagnostics still reach the terminal, rendered.
fn build(profile: &str, binaries: &[(&str, &str)]) -> anyhow::Result<Vec<PathBuf>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(workspace_root())
        .args(["build", "--profile", profile]);
    for (package, binary) in binaries {
        command.args(["--package", package, "--bin", binary]);
    }
    let output = command
        .arg("--message-format=json-render-diagnostics")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo build")?;
    let names: Vec<&str> = binaries.iter().map(|(_, binary)| *binary).collect();
    if !output.status.success() {
        bail!(
            "building {} ({profile} profile) failed with {}",
            names.join(" and "),
            output.status
        );
    }
    let messages = String::from_utf8_lossy(&output.stdout);
    names
        .iter()
        .map(|name| {
            find_executable(&messages, name)
                .with_context(|| format!("cargo built `{name}` but reported no executable for it"))
        })
        .collect()
}

/// Picks the executable of binary target `name` out of cargo's JSON message stream.
fn find_executable(messages: &str, name: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_executable_is_read_from_the_artifact_message() {
        let messages = concat!(
            r#"{"reason":"compiler-artifact","target":{"name":"lockstep_cluster"},"executable":null}"#,
            "\nnot json\n",
            r#"{"reason":"compiler-artifact","target":{"name":"cluster_info"},"executable":"/t/release/cluster_info"}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
        );
        assert_eq!(
            find_executable(messages, "cluster_info"),
            Some(PathBuf::from("/t/release/cluster_info"))
        );
        assert_eq!(find_executable(messages, "other"), None);
    }

    #[test]
    fn the_workspace_root_holds_the_workspace_manifest() {
        assert!(workspace_root().join("Cargo.toml").is_file());
        assert!(workspace_root().join("xtask").is_dir());
    }
}
