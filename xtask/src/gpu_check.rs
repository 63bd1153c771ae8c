//! `cargo xtask gpu-check`: builds, on this machine, what a GPU machine with no Rust toolchain
//! needs to check the GPU paths: lockstep-cuda's test executables, lockstep-tensor's GPU-vs-CPU
//! tests, lockstep-nn's training tests (the CNN trained on the GPU among them) and
//! lockstep-nn's `gpu_bench` example, in release, in one folder with a `run.sh` that runs the tests (a skip
//! for want of a GPU or of NVRTC counts as a failure there) and then the benchmark.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use clap::Args;

use crate::build_example::workspace_root;

/// The package of the GPU kernels: all its tests.
const PACKAGE: &str = "lockstep-cuda";

/// The package of the GPU benchmark (the CNN's training step needs the models).
const BENCH_PACKAGE: &str = "lockstep-nn";

/// Test targets of other packages that run their GPU paths: `(package, test target)`.
const GPU_TESTS: &[(&str, &str)] = &[("lockstep-tensor", "gpu"), ("lockstep-nn", "training")];

/// The runner written beside the executables.
const RUNNER: &str = r#"#!/usr/bin/env bash
# Written by `cargo xtask gpu-check`. Runs on a machine with a GPU and no Rust toolchain: the
# GPU tests (a skip for want of a GPU or NVRTC fails them here), then the GPU benchmark.
# NVIDIA's libraries are found on the loader's path, in LOCKSTEP_CUDA_LIBRARY_PATH, or in the
# site-packages of pip's nvidia-* wheels (PyTorch's).
set -uo pipefail
cd "$(dirname "$0")"
export LOCKSTEP_REQUIRE_GPU=1 LOCKSTEP_REQUIRE_NVRTC=1
status=0
for test in tests/*; do
    echo "== $test"
    "$test" --test-threads 1 || status=1
done
echo "== gpu_bench"
./gpu_bench || status=1
exit $status
"#;

/// Arguments of `cargo xtask gpu-check`.
#[derive(Debug, Args)]
pub(crate) struct GpuCheckArgs {
    /// The folder to write (replaced if it exists).
    #[arg(long, default_value = "target/gpu-check")]
    out: PathBuf,
}

pub(crate) fn run(args: &GpuCheckArgs) -> anyhow::Result<()> {
    let root = workspace_root();
    let out = root.join(&args.out);
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("removing {}", out.display()))?;
    }
    std::fs::create_dir_all(out.join("tests"))
        .with_context(|| format!("creating {}", out.display()))?;
    let tests: Vec<_> =
        cargo_executables(&["test", "--no-run", "--release", "--package", PACKAGE])?
            .into_iter()
            .filter(|artifact| artifact.test)
            .collect();
    if tests.is_empty() {
        bail!("cargo built no test executable of {PACKAGE}");
    }
    for artifact in &tests {
        copy_executable(&artifact.path, &out.join("tests").join(&artifact.name))?;
    }
    let mut count = tests.len();
    for &(package, target) in GPU_TESTS {
        let built = cargo_executables(&[
            "test",
            "--no-run",
            "--release",
            "--package",
            package,
            "--test",
            target,
        ])?;
        let artifact = built
            .iter()
            .find(|artifact| artifact.test && artifact.name == target)
            .with_context(|| format!("cargo built no test {target} of {package}"))?;
        copy_executable(
            &artifact.path,
            &out.join("tests").join(format!("{package}-{target}")),
        )?;
        count += 1;
    }
    let bench = cargo_executables(&[
        "build",
        "--release",
        "--package",
        BENCH_PACKAGE,
        "--example",
        "gpu_bench",
    ])?;
    let bench = bench
        .iter()
        .find(|artifact| artifact.name == "gpu_bench")
        .context("cargo built no gpu_bench executable")?;
    copy_executable(&bench.path, &out.join("gpu_bench"))?;
    let runner = out.join("run.sh");
    std::fs::write(&runner, RUNNER).with_context(|| format!("writing {}", runner.display()))?;
    make_executable(&runner)?;
    println!(
        "wrote {} ({} test executables and gpu_bench); on the GPU machine run {}/run.sh",
        out.display(),
        count,
        args.out.display()
    );
    Ok(())
}

/// An executable cargo built.
#[derive(Debug, PartialEq, Eq)]
struct Artifact {
    /// The target's name; a library's unit tests are `<package>_unit`.
    name: String,
    path: PathBuf,
    /// Whether it is a test harness (not, say, an example that `cargo test` also builds).
    test: bool,
}

/// Runs cargo with `args` and the JSON message format; returns every artifact with an
/// executable.
fn cargo_executables(args: &[&str]) -> anyhow::Result<Vec<Artifact>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(workspace_root())
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo")?;
    if !output.status.success() {
        bail!("cargo {} failed with {}", args.join(" "), output.status);
    }
    Ok(executables(&String::from_utf8_lossy(&output.stdout)))
}

/// The artifacts of the messages that name an executable.
fn executables(messages: &str) -> Vec<Artifact> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter_map(|m| {
            let path = PathBuf::from(m["executable"].as_str()?);
            let name = m["target"]["name"].as_str()?.replace('-', "_");
            let lib = m["target"]["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k == "lib"));
            Some(Artifact {
                name: if lib { format!("{name}_unit") } else { name },
                path,
                test: m["profile"]["test"] == true,
            })
        })
        .collect()
}

fn copy_executable(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    // Debug sections are most of a release test binary's size; the copy travels to the GPU
    // machine. Without `strip` the copy is left whole.
    let _ = Command::new("strip").arg("--strip-debug").arg(to).status();
    make_executable(to)
}

fn make_executable(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("making {} executable", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executables_are_named_after_their_targets_and_tests_are_told_apart() {
        let messages = concat!(
            r#"{"reason":"compiler-artifact","target":{"name":"lockstep-cuda","kind":["lib"]},"profile":{"test":true},"executable":"/t/deps/lockstep_cuda-1"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","target":{"name":"ops","kind":["test"]},"profile":{"test":true},"executable":"/t/deps/ops-2"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","target":{"name":"gpu_bench","kind":["example"]},"profile":{"test":false},"executable":"/t/examples/gpu_bench"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","target":{"name":"cudarc","kind":["lib"]},"executable":null}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
        );
        let artifact = |name: &str, path: &str, test| Artifact {
            name: name.to_owned(),
            path: PathBuf::from(path),
            test,
        };
        assert_eq!(
            executables(messages),
            [
                artifact("lockstep_cuda_unit", "/t/deps/lockstep_cuda-1", true),
                artifact("ops", "/t/deps/ops-2", true),
                artifact("gpu_bench", "/t/examples/gpu_bench", false),
            ]
        );
    }
}
