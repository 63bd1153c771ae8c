//! A project outside this workspace, as a user starts one: a new crate in a temporary
//! directory that depends on the Lockstep crates by path with their default settings (none of
//! this workspace's `.cargo/config.toml` or profiles), with a `fit` program and a custom-loop
//! program (`tests/outside/`), built with `cargo build` as a new project first is (its dev
//! profile: nothing optimised, overflow checks on) and started with `lockstep run --workers 2`
//! for an epoch cut short.

#![allow(
    clippy::unwrap_used,
    reason = "a test that meets an error must fail loudly"
)]

use std::path::Path;
use std::process::{Command, Stdio};

use lockstep_e2e::{field, launcher_binary, task_lines, workspace_root};

/// Copies `tests/outside` into `dir` as a crate whose dependencies point at this workspace.
fn write_project(dir: &Path) {
    let source = workspace_root().join("tests/outside");
    let root = workspace_root();
    let manifest = std::fs::read_to_string(source.join("Cargo.toml.template"))
        .unwrap()
        .replace("@ROOT@", root.to_str().unwrap());
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    // The workspace's lock file: the same dependency versions, and no index lookups.
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    std::fs::create_dir_all(dir.join("src/bin")).unwrap();
    for file in [
        "src/lib.rs",
        "src/bin/with_fit.rs",
        "src/bin/with_custom_loop.rs",
    ] {
        std::fs::copy(source.join(file), dir.join(file)).unwrap();
    }
}

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Each worker's (test accuracy, weights checksum) after `program` ran on 2 workers for an
/// epoch cut to its first 2,000 digits.
fn run_on_two_workers(launcher: &Path, program: &Path) -> Vec<(f64, String)> {
    let out = Command::new(launcher)
        .args(["run", "--workers", "2", "--timeout-secs", "600", "--"])
        .arg(program)
        .args(["--epochs", "1", "--train-examples", "2000"])
        .stdin(Stdio::null())
        .env_remove("CLICOLOR_FORCE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed\n{stderr}",
        program.display()
    );
    (0..2)
        .map(|rank| {
            let lines = task_lines(&out.stdout, &format!("worker:{rank}"));
            let last = lines.iter().find(|l| l.starts_with("test_accuracy="));
            assert!(last.is_some(), "worker:{rank} printed no result: {lines:?}");
            let last = last.unwrap();
            (
                field(last, "test_accuracy").unwrap().parse().unwrap(),
                field(last, "weights_checksum").unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn a_project_outside_the_workspace_trains_with_fit_and_with_a_custom_loop() {
    let project = tempfile::tempdir().unwrap();
    write_project(project.path());
    // Its own target folder beside the workspace's, kept between runs so that a second run
    // builds nothing; the workspace's own artifacts are built with other settings.
    let target = workspace_root().join("target/outside-workspace");
    let status = cargo()
        .current_dir(project.path())
        .args(["build", "--bins", "--quiet"])
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .stdin(Stdio::null())
        .status()
        .unwrap();
    assert!(
        status.success(),
        "cargo build of the outside project failed"
    );

    let launcher = launcher_binary().unwrap();
    let fit = run_on_two_workers(&launcher, &target.join("debug/with_fit"));
    let custom = run_on_two_workers(&launcher, &target.join("debug/with_custom_loop"));
    assert_eq!(fit[0], fit[1], "the fit program's workers disagree");
    assert_eq!(custom[0], custom[1], "the custom loop's workers disagree");
    // The guide's MLP after 2,000 digits: 0.816 with these seeds (the same bits on every run;
    // 0.897 after the whole epoch).
    assert!(fit[0].0 >= 0.80, "fit reached only {fit:?}");
    // The custom loop is fit's step written out: the same weights, bit for bit.
    assert_eq!(fit[0], custom[0]);
}
