//! Every example binary starts and says what it does and which flags it takes (`--help`),
//! without a cluster, a data set or a network: the first thing a user runs.
//!
//! The binaries under test are the ones `cargo xtask run-cluster --profile dev` and the
//! end-to-end tests run: this test is why `cargo test --workspace` builds them, with the
//! workspace's features, before any of those starts.

#![allow(
    clippy::unwrap_used,
    reason = "a test that meets an error must fail loudly"
)]

use std::process::Command;

/// Every `[[bin]]` of this package, with its executable.
const EXAMPLES: [(&str, &str); 11] = [
    ("allreduce_bench", env!("CARGO_BIN_EXE_allreduce_bench")),
    ("cluster_info", env!("CARGO_BIN_EXE_cluster_info")),
    ("collective_check", env!("CARGO_BIN_EXE_collective_check")),
    ("fashion_mnist", env!("CARGO_BIN_EXE_fashion_mnist")),
    ("keras_resume", env!("CARGO_BIN_EXE_keras_resume")),
    ("mirrored_mlp", env!("CARGO_BIN_EXE_mirrored_mlp")),
    ("mnist_custom_loop", env!("CARGO_BIN_EXE_mnist_custom_loop")),
    ("mnist_estimator", env!("CARGO_BIN_EXE_mnist_estimator")),
    ("mnist_keras", env!("CARGO_BIN_EXE_mnist_keras")),
    (
        "mnist_parameter_server",
        env!("CARGO_BIN_EXE_mnist_parameter_server"),
    ),
    ("recommender", env!("CARGO_BIN_EXE_recommender")),
];

#[test]
fn every_example_answers_help_with_its_usage_and_its_options() {
    for (name, executable) in EXAMPLES {
        let out = Command::new(executable)
            .arg("--help")
            .env_remove("TF_CONFIG")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name}: {}", out.status);
        assert!(
            stdout.contains(&format!("Usage: {name}")),
            "{name}:\n{stdout}"
        );
        assert!(stdout.contains("Options:"), "{name}:\n{stdout}");
    }
}

#[test]
fn an_unknown_flag_is_refused_naming_it() {
    for (name, executable) in EXAMPLES {
        let out = Command::new(executable)
            .arg("--no-such-flag")
            .env_remove("TF_CONFIG")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name} took an unknown flag");
        assert!(stderr.contains("--no-such-flag"), "{name}:\n{stderr}");
    }
}
