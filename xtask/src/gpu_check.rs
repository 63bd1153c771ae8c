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

/// The benchmarks, `(package, example)`: the CNN's training step (lockstep-nn, which has the
/// models), NCCL's all-reduce (lockstep-cuda) and `fit` end to end (lockstep-train).
const BENCHES: [(&str, &str); 3] = [
    ("lockstep-nn", "gpu_bench"),
    ("lockstep-cuda", "nccl_bench"),
    ("lockstep-train", "gpu_fit_bench"),
];

/// A test executable that runs GPU paths, and the filters that pick its GPU tests (none: all
/// of them). The CPU-only tests (NVRTC's compilation, the library search, the CPU training
/// runs) are CI's and are left out.
struct GpuTests {
    package: &'static str,
    target: &'static str,
    filters: &'static [&'static str],
}

/// Every executable the GPU machine runs, in order: the kernels first, the models last.
const GPU_TESTS: &[GpuTests] = &[
    GpuTests {
        package: "lockstep-cuda",
        target: "ops",
        filters: &[],
    },
    GpuTests {
        package: "lockstep-cuda",
        target: "nccl",
        filters: &[],
    },
    GpuTests {
        package: "lockstep-tensor",
        target: "gpu",
        filters: &[],
    },
    GpuTests {
        package: "lockstep-nn",
        target: "training",
        filters: &["gpu", "every_device"],
    },
    GpuTests {
        package: "lockstep-train",
        target: "gpu",
        filters: &[],
    },
    GpuTests {
        package: "lockstep-train",
        target: LIB,
        filters: &["a_replica_on_a_gpu"],
    },
    GpuTests {
        package: "lockstep-train",
        target: "estimator",
        filters: &["gpu"],
    },
];

/// The `target` of a package's unit tests (its library's test executable).
const LIB: &str = "lib";

/// PyTorch's figures for the same benchmark, copied beside `gpu_bench`.
const TORCH_REFERENCE: &str = "benches/torch_gpu_reference.py";

/// PyTorch's NCCL figures, copied beside `nccl_bench`.
const TORCH_NCCL_REFERENCE: &str = "benches/torch_nccl_reference.py";

/// The runner written beside the executables. `run.sh [LOG_DIR]`:
/// 1. finds NVIDIA's libraries (asking `python3` where pip's `nvidia` package is, when
///    `LOCKSTEP_CUDA_LIBRARY_PATH` is unset) and prints the environment: `nvidia-smi`, the
///    driver, where each library was found;
/// 2. runs each test executable on its GPU tests, under its own `timeout`, its log in
///    `LOG_DIR` (default `logs` beside the script) as it goes, so a hang or a crash loses
///    nothing; `LOCKSTEP_REQUIRE_GPU=1` (the default here) turns a skip for want of a GPU
///    into a failure, while a test that needs two GPUs on a machine with one still skips,
///    saying so after its name in the log (`test … ... skipped: …`), which the runner counts;
/// 3. runs `gpu_bench`, `gpu_fit_bench` and the PyTorch reference interleaved, then
///    `nccl_bench` and PyTorch's NCCL reference, `LOCKSTEP_BENCH_REPEATS` times each (default
///    3);
/// 4. ends with one summary line per executable, the number of GPU tests that ran and of
///    those that skipped (and why), and every benchmark table. It exits non-zero when a test
///    failed, timed out or did not run.
const RUNNER: &str = r#"#!/usr/bin/env bash
# Written by `cargo xtask gpu-check`: the GPU checks for a machine with a GPU and no Rust.
# Usage: run.sh [LOG_DIR]   (logs default to ./logs beside this script)
# Environment: LOCKSTEP_TEST_TIMEOUT (seconds per test executable, default 900),
# LOCKSTEP_BENCH_REPEATS (default 3; 0 skips the benchmark), LOCKSTEP_REQUIRE_GPU (default 1).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
logs="${1:-$here/logs}"
mkdir -p "$logs" || exit 2
cd "$here"
export LOCKSTEP_REQUIRE_GPU="${LOCKSTEP_REQUIRE_GPU:-1}" LOCKSTEP_REQUIRE_NVRTC=1
timeout_s="${LOCKSTEP_TEST_TIMEOUT:-900}"
repeats="${LOCKSTEP_BENCH_REPEATS:-3}"
if [ -z "${LOCKSTEP_CUDA_LIBRARY_PATH:-}" ] && command -v python3 >/dev/null; then
    found="$(python3 -c '
import os
try:
    import nvidia
except ImportError:
    raise SystemExit(0)
folders = sorted({os.path.join(p, d, "lib") for p in nvidia.__path__ for d in os.listdir(p)})
print(os.pathsep.join(f for f in folders if os.path.isdir(f)))
' 2>/dev/null)"
    if [ -n "$found" ]; then export LOCKSTEP_CUDA_LIBRARY_PATH="$found"; fi
fi
{
    echo "== environment"
    date -u
    uname -srm
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
        nvidia-smi
    else
        echo "nvidia-smi: not on PATH"
    fi
    echo "python3: $(command -v python3 || echo none)"
    echo "LOCKSTEP_CUDA_LIBRARY_PATH=${LOCKSTEP_CUDA_LIBRARY_PATH:-}"
    ./gpu_bench --libraries
} 2>&1 | tee "$logs/environment.log"

status=0
summary=()
ran=0
skips=0
while IFS='|' read -r name filters; do
    [ -n "$name" ] || continue
    log="$logs/$name.log"
    echo "== $name ${filters:+(tests matching: $filters)}"
    # shellcheck disable=SC2086 # the filters are words
    # --nocapture: a test that skips says why on a line of its own, which is counted below.
    timeout --kill-after=10 "$timeout_s" "tests/$name" --test-threads 1 --nocapture $filters >"$log" 2>&1
    rc=$?
    tail -n 3 "$log"
    result="$(grep -E '^test result:' "$log" | tail -n 1)"
    passed="$(sed -nE 's/.* ([0-9]+) passed.*/\1/p' <<<"$result")"
    failed="$(sed -nE 's/.* ([0-9]+) failed.*/\1/p' <<<"$result")"
    # libtest prints a test's name and then, on the same line, what the test says.
    skipped="$(grep -cE '(^|\.\.\. )skipped: ' "$log")"
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        line="$name: TIMED OUT after ${timeout_s}s (log: $log)"
        status=1
    elif [ -z "$result" ]; then
        line="$name: NO RESULT, exit $rc (log: $log)"
        status=1
    else
        line="$name: ${passed:-0} passed, ${failed:-0} failed, $skipped of them skipped (exit $rc)"
        ran=$((ran + ${passed:-0} - skipped))
        skips=$((skips + skipped))
        [ "$rc" -eq 0 ] || status=1
    fi
    summary+=("$line")
done <tests/list

for ((r = 1; r <= repeats; r++)); do
    echo "== benchmark, repetition $r of $repeats"
    timeout --kill-after=10 "$timeout_s" ./gpu_bench >"$logs/gpu_bench.$r.log" 2>&1 || status=1
    cat "$logs/gpu_bench.$r.log"
    timeout --kill-after=10 "$timeout_s" ./gpu_fit_bench >"$logs/gpu_fit_bench.$r.log" 2>&1 || status=1
    cat "$logs/gpu_fit_bench.$r.log"
    torch=0
    if command -v python3 >/dev/null && python3 -c 'import torch' 2>/dev/null; then torch=1; fi
    if [ "$torch" = 1 ]; then
        timeout --kill-after=10 "$timeout_s" python3 torch_gpu_reference.py \
            >"$logs/torch.$r.log" 2>&1 || status=1
        cat "$logs/torch.$r.log"
    else
        echo "PyTorch reference skipped: no python3 with torch"
    fi
    timeout --kill-after=10 "$timeout_s" ./nccl_bench >"$logs/nccl_bench.$r.log" 2>&1 || status=1
    cat "$logs/nccl_bench.$r.log"
    if [ "$torch" = 1 ]; then
        PYTHONUNBUFFERED=1 timeout --kill-after=10 "$timeout_s" python3 torch_nccl_reference.py \
            >"$logs/torch_nccl.$r.log" 2>&1 || status=1
        cat "$logs/torch_nccl.$r.log"
    fi
done

echo "== summary"
printf '%s\n' "${summary[@]}"
if [ "$LOCKSTEP_REQUIRE_GPU" = 1 ]; then
    echo "GPU tests run: $ran, skipped: $skips (LOCKSTEP_REQUIRE_GPU=1: a test that found no GPU failed)"
else
    echo "tests passed: $ran, skipped: $skips (LOCKSTEP_REQUIRE_GPU=$LOCKSTEP_REQUIRE_GPU)"
fi
if [ "$skips" -gt 0 ]; then
    echo "why they skipped:"
    grep -ohE '(^|\.\.\. )skipped: .*' "$logs"/*.log | sed 's/^\.\.\. //' | sort | uniq -c
fi
for ((r = 1; r <= repeats; r++)); do
    echo "-- benchmark, repetition $r"
    grep -h -E '^(\||device)' "$logs/gpu_bench.$r.log" "$logs/gpu_fit_bench.$r.log" "$logs/torch.$r.log" \
        "$logs/nccl_bench.$r.log" "$logs/torch_nccl.$r.log" 2>/dev/null
done
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
    for tests in GPU_TESTS {
        let (which, name) = if tests.target == LIB {
            (
                vec!["--lib"],
                format!("{}_unit", tests.package.replace('-', "_")),
            )
        } else {
            (vec!["--test", tests.target], tests.target.to_owned())
        };
        let mut args = vec!["test", "--no-run", "--release", "--package", tests.package];
        args.extend(which);
        let built = cargo_executables(&args)?;
        let artifact = built
            .iter()
            .find(|artifact| artifact.test && artifact.name == name)
            .with_context(|| {
                format!("cargo built no test {} of {}", tests.target, tests.package)
            })?;
        copy_executable(&artifact.path, &out.join("tests").join(tests.file_name()))?;
    }
    let list = out.join("tests/list");
    std::fs::write(&list, test_list()).with_context(|| format!("writing {}", list.display()))?;
    for (package, example) in BENCHES {
        build_example(package, example, &out)?;
    }
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
        "wrote {} ({} test executables, gpu_bench, nccl_bench, gpu_fit_bench, {} MiB); on the GPU machine run {}/run.sh [LOG_DIR]",
        out.display(),
        GPU_TESTS.len(),
        folder_size(&out)? >> 20,
        args.out.display()
    );
    Ok(())
}

/// Builds `example` of `package` in release and copies it, stripped, into `out`.
fn build_example(package: &str, example: &str, out: &Path) -> anyhow::Result<()> {
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
    copy_executable(&artifact.path, &out.join(example))
}

impl GpuTests {
    /// The executable's name in the artefact's `tests/`.
    fn file_name(&self) -> String {
        format!("{}-{}", self.package, self.target)
    }
}

/// `tests/list`: a line per executable, `name|filters`, which `run.sh` reads.
fn test_list() -> String {
    let mut list = String::new();
    for tests in GPU_TESTS {
        let _ = writeln!(list, "{}|{}", tests.file_name(), tests.filters.join(" "));
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
    fn the_runner_reads_one_line_per_executable_with_its_filters() {
        let list = test_list();
        let lines: Vec<&str> = list.lines().collect();
        assert_eq!(lines.len(), GPU_TESTS.len());
        assert_eq!(lines[0], "lockstep-cuda-ops|");
        assert!(
            lines.contains(&"lockstep-nn-training|gpu every_device"),
            "{list}"
        );
        assert!(RUNNER.contains("done <tests/list"));
    }

    #[test]
    fn the_runner_logs_each_executable_and_sums_up_passes_failures_and_hangs() {
        let dir = tempfile::tempdir().unwrap();
        let script = |path: &Path, body: &str| {
            std::fs::write(path, format!("#!/usr/bin/env bash\n{body}\n")).unwrap();
            make_executable(path).unwrap();
        };
        std::fs::create_dir(dir.path().join("tests")).unwrap();
        script(&dir.path().join("run.sh"), RUNNER);
        std::fs::write(dir.path().join("tests/list"), "good|\nbad|gpu\nhangs|\n").unwrap();
        script(
            &dir.path().join("tests/good"),
            "echo 'test two_gpus ... skipped: needs 2 GPUs, this machine has 1'; echo 'test one_gpu ... ok'; echo 'test result: ok. 3 passed; 0 failed; 0 ignored'",
        );
        script(
            &dir.path().join("tests/bad"),
            "echo \"filters: $*\"; echo 'test result: FAILED. 1 passed; 2 failed; 0 ignored'; exit 101",
        );
        script(&dir.path().join("tests/hangs"), "sleep 30");
        script(
            &dir.path().join("gpu_bench"),
            "if [ \"$1\" = --libraries ]; then echo 'libcuda.so.1: not found'; else echo '| step | 512 | 1 ms |'; fi",
        );
        let logs = dir.path().join("logs");
        let output = Command::new("bash")
            .arg(dir.path().join("run.sh"))
            .arg(&logs)
            .env("LOCKSTEP_TEST_TIMEOUT", "1")
            .env("LOCKSTEP_BENCH_REPEATS", "1")
            .env("LOCKSTEP_REQUIRE_GPU", "1")
            .env("LOCKSTEP_CUDA_LIBRARY_PATH", "/nowhere")
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(!output.status.success(), "{stdout}");
        for want in [
            "good: 3 passed, 0 failed, 1 of them skipped (exit 0)",
            "bad: 1 passed, 2 failed, 0 of them skipped (exit 101)",
            "hangs: TIMED OUT after 1s",
            "GPU tests run: 3, skipped: 1",
            "1 skipped: needs 2 GPUs, this machine has 1",
            "libcuda.so.1: not found",
            "| step | 512 | 1 ms |",
        ] {
            assert!(stdout.contains(want), "{want:?} missing from:\n{stdout}");
        }
        let bad = std::fs::read_to_string(logs.join("bad.log")).unwrap();
        assert!(
            bad.contains("filters: --test-threads 1 --nocapture gpu"),
            "{bad}"
        );
        assert!(logs.join("environment.log").is_file() && logs.join("hangs.log").is_file());
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
