//! `cargo xtask gpu-check`: builds, on this machine, what a GPU machine with no Rust toolchain
//! needs to check the GPU paths: the test executables that exercise them (lockstep-cuda's ops
//! against the CPU, lockstep-tensor's GPU-vs-CPU tests, lockstep-nn's GPU training and session
//! tests), the benchmarks ([`BENCHES`]) and PyTorch's reference scripts, in release and
//! stripped, in one folder with a `run.sh` (see [`RUNNER`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use clap::Args;

use crate::build_example::workspace_root;

mod expected;
mod glibc;

use expected::{GPU_TESTS, GpuTests, LIB, listed_tests};

/// The benchmarks, `(package, example)`: the CNN's training step (lockstep-nn, which has the
/// models), NCCL's all-reduce (lockstep-cuda) and `fit` end to end (lockstep-train).
const BENCHES: [(&str, &str); 3] = [
    ("lockstep-nn", "gpu_bench"),
    ("lockstep-cuda", "nccl_bench"),
    ("lockstep-train", "gpu_fit_bench"),
];

/// PyTorch's figures for the same benchmark, copied beside `gpu_bench`.
const TORCH_REFERENCE: &str = "benches/torch_gpu_reference.py";

/// PyTorch's NCCL figures, copied beside `nccl_bench`.
const TORCH_NCCL_REFERENCE: &str = "benches/torch_nccl_reference.py";

/// The runner written beside the executables (`run.sh [LOG_DIR]`):
/// 1. stops, saying so, when the machine's glibc is older than the one the binaries need
///    (`glibc-needed`, written here);
/// 2. prints the environment: `nvidia-smi`, the driver, the file and version of each of
///    NVIDIA's libraries (`gpu_bench --libraries`: where `LOCKSTEP_CUDA_LIBRARY_PATH` names
///    them, on the loader's path, or where pip's wheels put them beside a `python3` on `PATH`);
/// 3. runs each test executable on the tests [`GPU_TESTS`] names, under its own `timeout`, its
///    log in `LOG_DIR` (default `logs` beside the script) as it goes, so a hang or a crash
///    costs one executable and loses nothing; `LOCKSTEP_REQUIRE_GPU=1` (the default here)
///    turns a skip for want of a GPU into a failure, while a test that needs two GPUs on a
///    machine with one is a skip the summary names;
/// 4. runs `gpu_bench`, `gpu_fit_bench` and the PyTorch reference interleaved, then
///    `nccl_bench` and PyTorch's NCCL reference, `LOCKSTEP_BENCH_REPEATS` times (default 3),
///    while the call's budget lasts;
/// 5. ends with one line per executable (how many of its named tests passed, how many of them
///    skipped, which did not pass), every skip and its reason, and every benchmark table.
///
/// Every step gets at most what is left of `LOCKSTEP_CALL_BUDGET` (default 540 s), so the
/// summary comes within a 10-minute call. It exits non-zero when a named test did not pass,
/// timed out or did not run.
const RUNNER: &str = include_str!("run.sh");

/// Arguments of `cargo xtask gpu-check`.
#[derive(Debug, Args)]
pub(crate) struct GpuCheckArgs {
    /// The folder to write (replaced if it exists).
    #[arg(long, default_value = "target/gpu-check")]
    out: PathBuf,
    /// Only check, on a debug build of the workspace's tests, that every test the GPU machine
    /// runs exists by name and that no GPU test is left unnamed; write nothing.
    #[arg(long)]
    check_names: bool,
    /// Only check that every test that skipped for want of a GPU in a run whose skips this
    /// file logged (`LOCKSTEP_SKIP_LOG`) is one the GPU machine runs; write nothing.
    #[arg(long, value_name = "SKIP_LOG")]
    check_skips: Option<PathBuf>,
}

pub(crate) fn run(args: &GpuCheckArgs) -> anyhow::Result<()> {
    if args.check_names {
        return check_names();
    }
    if let Some(log) = &args.check_skips {
        let text = std::fs::read_to_string(log)
            .with_context(|| format!("reading the skip log {}", log.display()))?;
        let unnamed = expected::unnamed_gpu_skips(&text);
        if !unnamed.is_empty() {
            bail!(
                "these tests skipped for want of a GPU, but the GPU machine does not run them (name them in xtask/src/gpu_check/expected.rs):\n{}",
                unnamed.join("\n")
            );
        }
        println!("every test that skipped for want of a GPU is one the GPU machine runs");
        return Ok(());
    }
    let root = workspace_root();
    let out = root.join(&args.out);
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("removing {}", out.display()))?;
    }
    std::fs::create_dir_all(out.join("tests"))
        .with_context(|| format!("creating {}", out.display()))?;
    let mut copied = Vec::new();
    for tests in GPU_TESTS {
        let mut args = vec!["test", "--no-run", "--release", "--package", tests.package];
        if tests.target == LIB {
            args.push("--lib");
        } else {
            args.extend(["--test", tests.target]);
        }
        let built = cargo_executables(&args)?;
        let path = test_executable(&built, tests)?;
        check_listed(tests, path)?;
        let copy = out.join("tests").join(tests.file_name());
        copy_executable(path, &copy)?;
        copied.push(copy);
    }
    let list = out.join("tests/list");
    std::fs::write(&list, test_list()).with_context(|| format!("writing {}", list.display()))?;
    for (package, example) in BENCHES {
        copied.push(build_example(package, example, &out)?);
    }
    let needed = glibc::needed(&copied)?;
    std::fs::write(out.join("glibc-needed"), format!("{needed}\n"))
        .context("writing glibc-needed")?;
    for reference in [TORCH_REFERENCE, TORCH_NCCL_REFERENCE] {
        let name = Path::new(reference)
            .file_name()
            .context("a reference script's path has a file name")?;
        std::fs::copy(root.join(reference), out.join(name))
            .with_context(|| format!("copying {reference}"))?;
    }
    let runner = out.join("run.sh");
    std::fs::write(&runner, RUNNER).with_context(|| format!("writing {}", runner.display()))?;
    make_executable(&runner)?;
    println!(
        "wrote {} ({} test executables of {} named tests, gpu_bench, nccl_bench, gpu_fit_bench; glibc {needed} or newer; {} MiB); on the GPU machine run {}/run.sh [LOG_DIR]",
        out.display(),
        GPU_TESTS.len(),
        GPU_TESTS.iter().map(|t| t.tests.len()).sum::<usize>(),
        folder_size(&out)? >> 20,
        args.out.display()
    );
    Ok(())
}

/// `--check-names`: the tests [`GPU_TESTS`] names against a debug build of the workspace's
/// tests (the README's test command's build, so nothing new is compiled after it).
fn check_names() -> anyhow::Result<()> {
    let built = cargo_executables(&["test", "--workspace", "--no-run"])?;
    let mut wrong = Vec::new();
    for tests in GPU_TESTS {
        let path = test_executable(&built, tests)?;
        if let Err(e) = check_listed(tests, path) {
            wrong.push(e.to_string());
        }
    }
    if !wrong.is_empty() {
        bail!("{}", wrong.join("\n"));
    }
    println!(
        "every one of the {} tests the GPU machine runs exists, and no GPU test is left unnamed",
        GPU_TESTS.iter().map(|t| t.tests.len()).sum::<usize>()
    );
    Ok(())
}

/// The executable of `tests` among what cargo `built`.
fn test_executable<'a>(built: &'a [Artifact], tests: &GpuTests) -> anyhow::Result<&'a Path> {
    let name = if tests.target == LIB {
        format!("{}_unit", tests.package.replace('-', "_"))
    } else {
        tests.target.to_owned()
    };
    built
        .iter()
        .find(|a| a.test && a.package == tests.package && a.name == name)
        .map(|a| a.path.as_path())
        .with_context(|| format!("cargo built no test {} of {}", tests.target, tests.package))
}

/// Fails when `tests` and what the executable at `path` lists disagree ([`GpuTests::mismatches`]).
fn check_listed(tests: &GpuTests, path: &Path) -> anyhow::Result<()> {
    let output = Command::new(path)
        .args(["--list", "--format", "terse"])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("listing the tests of {}", path.display()))?;
    if !output.status.success() {
        bail!("{} --list failed with {}", path.display(), output.status);
    }
    let wrong = tests.mismatches(&listed_tests(&String::from_utf8_lossy(&output.stdout)));
    if !wrong.is_empty() {
        bail!("{}", wrong.join("\n"));
    }
    Ok(())
}

/// Builds `example` of `package` in release and copies it, stripped, into `out`; returns the
/// copy.
fn build_example(package: &str, example: &str, out: &Path) -> anyhow::Result<PathBuf> {
    let built = cargo_executables(&[
        "build",
        "--release",
        "--package",
        package,
        "--example",
        example,
    ])?;
    let artifact = built
        .iter()
        .find(|artifact| artifact.name == example)
        .with_context(|| format!("cargo built no {example} executable"))?;
    let copy = out.join(example);
    copy_executable(&artifact.path, &copy)?;
    Ok(copy)
}

/// `tests/list`: a line per executable, `name|test test …`, which `run.sh` reads.
fn test_list() -> String {
    let mut list = String::new();
    for tests in GPU_TESTS {
        let _ = writeln!(list, "{}|{}", tests.file_name(), tests.tests.join(" "));
    }
    list
}

/// The bytes of the files directly in `folder` and its sub-folders.
fn folder_size(folder: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in
        std::fs::read_dir(folder).with_context(|| format!("reading {}", folder.display()))?
    {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            folder_size(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

/// An executable cargo built.
#[derive(Debug, PartialEq, Eq)]
struct Artifact {
    /// The package it belongs to.
    package: String,
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
                package: package_name(m["package_id"].as_str()?).to_owned(),
                name: if lib { format!("{name}_unit") } else { name },
                path,
                test: m["profile"]["test"] == true,
            })
        })
        .collect()
}

/// The package's name in a cargo package id: `path+file:///…/train#lockstep-train@0.1.0`, or,
/// from older cargo, `lockstep-train 0.1.0 (path+file:///…)`.
fn package_name(id: &str) -> &str {
    match id.rsplit_once('#') {
        Some((_, name_version)) => name_version.split('@').next().unwrap_or(name_version),
        None => id.split(' ').next().unwrap_or(id),
    }
}

fn copy_executable(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    // Symbols and debug sections are most of a release test binary's size, and the copy
    // travels to the GPU machine (a panic's message and location survive stripping). Without
    // `strip` the copy is left whole.
    let _ = Command::new("strip").arg("--strip-all").arg(to).status();
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
    fn the_runner_reads_one_line_per_executable_with_its_tests_by_name() {
        let list = test_list();
        let lines: Vec<&str> = list.lines().collect();
        assert_eq!(lines.len(), GPU_TESTS.len());
        assert!(
            lines[0]
                .starts_with("lockstep-cuda-ops|bias_softmax_and_cross_entropy_equal_the_cpus "),
            "{list}"
        );
        assert!(
            lines.contains(&"lockstep-train-estimator|an_estimator_whose_replica_is_on_a_gpu_trains_and_evaluates_as_on_the_cpu"),
            "{list}"
        );
        assert!(RUNNER.contains("done <tests/list"));
    }

    /// A folder with the runner, `list`, the fake executables `(name, body)` in `tests/`, a
    /// fake `gpu_bench`, and `glibc-needed`.
    fn artefact(list: &str, executables: &[(&str, &str)], glibc: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let script = |path: &Path, body: &str| {
            std::fs::write(path, format!("#!/usr/bin/env bash\n{body}\n")).unwrap();
            make_executable(path).unwrap();
        };
        std::fs::create_dir(dir.path().join("tests")).unwrap();
        script(&dir.path().join("run.sh"), RUNNER);
        std::fs::write(dir.path().join("tests/list"), list).unwrap();
        std::fs::write(dir.path().join("glibc-needed"), glibc).unwrap();
        for (name, body) in executables {
            script(&dir.path().join("tests").join(name), body);
        }
        script(
            &dir.path().join("gpu_bench"),
            "if [ \"$1\" = --libraries ]; then echo 'libcuda.so.1: not found'; else echo '| step | 512 | 1 ms |'; fi",
        );
        dir
    }

    /// Runs the artefact's runner with `env`: (whether it passed, its stdout).
    fn run_runner(dir: &Path, env: &[(&str, &str)]) -> (bool, String) {
        run_runner_in(dir, dir.join("logs").to_str().unwrap(), dir, env)
    }

    /// [`run_runner`] with the log folder `logs` given from the folder `cwd`.
    fn run_runner_in(dir: &Path, logs: &str, cwd: &Path, env: &[(&str, &str)]) -> (bool, String) {
        let output = Command::new("bash")
            .arg(dir.join("run.sh"))
            .arg(logs)
            .current_dir(cwd)
            .envs(env.iter().copied())
            .env("LOCKSTEP_CUDA_LIBRARY_PATH", "/nowhere")
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    }

    #[test]
    fn the_runner_runs_each_named_test_and_fails_fewer_passes_failures_and_hangs() {
        let dir = artefact(
            "good|one_gpu two_gpus\nshort|p q\nbad|a b\nhangs|x\n",
            &[
                (
                    "good",
                    "echo 'test one_gpu ... ok'; echo 'test two_gpus ... ok'; echo 'SKIPPED g.rs two_gpus: needs two GPUs (this machine has 1)' >&2; printf 'g.rs\\ttwo_gpus\\ttwo GPUs\\tthis machine has 1\\n' >>\"$LOCKSTEP_SKIP_LOG\"; echo 'test result: ok. 2 passed; 0 failed'",
                ),
                (
                    "short",
                    "echo 'test p ... ok'; echo 'test result: ok. 1 passed; 0 failed'",
                ),
                (
                    "bad",
                    "echo \"arguments: $*\"; echo 'test a ... FAILED'; echo 'test b ... ok'; exit 101",
                ),
                ("hangs", "sleep 30"),
            ],
            "2.17",
        );
        let (passed, stdout) = run_runner(
            dir.path(),
            &[
                ("LOCKSTEP_TEST_TIMEOUT", "2"),
                ("LOCKSTEP_BENCH_REPEATS", "1"),
                ("LOCKSTEP_REQUIRE_GPU", "1"),
            ],
        );
        assert!(!passed, "{stdout}");
        for want in [
            "the artefact needs 2.17",
            "good: 2 of 2 passed, 1 of them skipped (exit 0)",
            "short: 1 of 2 passed, 0 of them skipped (exit 0); did not pass: q",
            "bad: 1 of 2 passed, 0 of them skipped (exit 101); did not pass: a",
            "hangs: TIMED OUT after 2s, 0 of 1 passed",
            "GPU tests run: 3 of 7, skipped: 1",
            "two_gpus (g.rs): needs two GPUs: this machine has 1",
            "libcuda.so.1: not found",
            "| step | 512 | 1 ms |",
            "benchmark repetitions run: 1 of 1",
        ] {
            assert!(stdout.contains(want), "{want:?} missing from:\n{stdout}");
        }
        let bad = std::fs::read_to_string(dir.path().join("logs/bad.log")).unwrap();
        assert!(
            bad.contains("arguments: --exact --test-threads 1 a b"),
            "{bad}"
        );
        assert!(dir.path().join("logs/environment.log").is_file());
    }

    #[test]
    fn the_runner_stops_on_an_older_glibc_and_runs_nothing_past_its_budget() {
        let passes = ("good", "echo 'test t ... ok'");
        let dir = artefact("good|t\n", &[passes], "99.0");
        let (passed, stdout) = run_runner(dir.path(), &[]);
        assert!(!passed);
        assert!(
            stdout.contains("STOP: the artefact's binaries need glibc 99.0"),
            "{stdout}"
        );
        assert!(!stdout.contains("== good"), "{stdout}");
        let dir = artefact("good|t\n", &[passes], "2.17");
        let (passed, stdout) = run_runner(
            dir.path(),
            &[
                ("LOCKSTEP_CALL_BUDGET", "3"),
                ("LOCKSTEP_BENCH_REPEATS", "2"),
            ],
        );
        assert!(!passed, "{stdout}");
        for want in [
            "good: NOT RUN, the call's budget of 3s ran out",
            "benchmark repetitions 1 to 2 not run",
            "benchmark repetitions run: 0 of 2",
        ] {
            assert!(stdout.contains(want), "{want:?} missing from:\n{stdout}");
        }
    }

    #[test]
    fn the_runner_keeps_its_logs_in_a_folder_named_relative_to_where_it_was_started() {
        let dir = artefact("good|t\n", &[("good", "echo 'test t ... ok'")], "2.17");
        let caller = tempfile::tempdir().unwrap();
        let env = [("LOCKSTEP_BENCH_REPEATS", "0")];
        let (passed, stdout) = run_runner_in(dir.path(), "some/logs", caller.path(), &env);
        assert!(passed, "{stdout}");
        assert!(stdout.contains("good: 1 of 1 passed"), "{stdout}");
        assert!(caller.path().join("some/logs/good.log").is_file());
    }

    #[test]
    fn the_runner_is_valid_bash() {
        let status = Command::new("bash")
            .args(["-n", "-c", RUNNER])
            .status()
            .expect("the runner is a bash script, and bash runs it");
        assert!(status.success());
    }

    #[test]
    fn executables_are_named_after_their_targets_and_tests_are_told_apart() {
        let messages = concat!(
            r#"{"reason":"compiler-artifact","package_id":"path+file:///w/crates/cuda#lockstep-cuda@0.1.0","target":{"name":"lockstep-cuda","kind":["lib"]},"profile":{"test":true},"executable":"/t/deps/lockstep_cuda-1"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","package_id":"lockstep-cuda 0.1.0 (path+file:///w/crates/cuda)","target":{"name":"ops","kind":["test"]},"profile":{"test":true},"executable":"/t/deps/ops-2"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","package_id":"path+file:///w/crates/nn#lockstep-nn@0.1.0","target":{"name":"gpu_bench","kind":["example"]},"profile":{"test":false},"executable":"/t/examples/gpu_bench"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","package_id":"registry+https://github.com/rust-lang/crates.io-index#cudarc@0.19.10","target":{"name":"cudarc","kind":["lib"]},"executable":null}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
        );
        let artifact = |package: &str, name: &str, path: &str, test| Artifact {
            package: package.to_owned(),
            name: name.to_owned(),
            path: PathBuf::from(path),
            test,
        };
        assert_eq!(
            executables(messages),
            [
                artifact(
                    "lockstep-cuda",
                    "lockstep_cuda_unit",
                    "/t/deps/lockstep_cuda-1",
                    true
                ),
                artifact("lockstep-cuda", "ops", "/t/deps/ops-2", true),
                artifact("lockstep-nn", "gpu_bench", "/t/examples/gpu_bench", false),
            ]
        );
    }
}
