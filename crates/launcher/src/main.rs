//! `lockstep`: starts any program as a Lockstep cluster, one process per task, as `torchrun`
//! and `horovodrun` start theirs.
//!
//! `lockstep run --workers 2 -- PROGRAM ARGS…` binds a port on 127.0.0.1 for every task and
//! starts PROGRAM once per task with its `TF_CONFIG`, its bound listening socket (file
//! descriptor 3, `LISTEN_FDS=1`) and the job's fresh cluster secret; prefixes every output
//! line with its task; stops every task's process group when one fails, on Ctrl-C or past a
//! deadline, and can restart them all (`--restart-on-failure K`). See the crate's README.
//!
//! `lockstep deploy k8s|slurm [-- PROGRAM ARGS…]` writes the files that run the program (a
//! binary of the user's crate; the examples by default) on Kubernetes (a JobSet, a Kubeflow
//! TrainJob and TFJob, the Containerfile of its image) or SLURM (an sbatch script).
//!
//! The launcher depends on none of the training crates, so it builds in seconds.
//! Dependencies: `clap` for the command line, `ctrlc` to turn Ctrl-C and SIGTERM into an
//! orderly shutdown, `nix` to signal whole process groups and open the chief's
//! pseudo-terminal, `command-fds` to hand each task its socket, `console` for the terminal's
//! width, `lockstep-cluster` to write each task's `TF_CONFIG` and make the job's secret,
//! `tracing` for the launcher's own log lines; `serde_json` and `serde-saphyr` to build the
//! Kubernetes manifests and write them as YAML, `shlex` to quote arguments in the sbatch
//! script; in its tests, `proptest` for the property tests of the switches' parsers.

mod cluster_plan;
mod deploy;
mod ports;
mod run;
mod supervise;
mod terminal;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Starts a program as a local Lockstep cluster.
#[derive(Debug, Parser)]
#[command(name = "lockstep", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start a local cluster on 127.0.0.1: one process of PROGRAM per task, each with its own
    /// `TF_CONFIG`.
    Run(run::RunArgs),
    /// Write the files that run a job on Kubernetes or SLURM (manifests, Containerfile,
    /// sbatch script): your program after `--`, or an example.
    Deploy(deploy::DeployArgs),
}

/// What `RUST_LOG` asks to be logged: `target=level` directives and a default level, comma
/// separated (`info,lockstep=debug`); INFO where it is unset or empty, or cannot be read
/// (which is said). Span and field filters (`target[span]=level`) are not read.
fn log_filter() -> tracing_subscriber::filter::Targets {
    let info = || tracing_subscriber::filter::Targets::new().with_default(tracing::Level::INFO);
    let raw = std::env::var("RUST_LOG").unwrap_or_default();
    match log_directives(&raw) {
        None => info(),
        Some(directives) => directives.parse().unwrap_or_else(|e| {
            eprintln!(
                "RUST_LOG={raw:?} is not a list of target=level directives ({e}): logging at INFO"
            );
            info()
        }),
    }
}

/// `RUST_LOG`'s directives without empty ones (`info,` is `info`: an empty directive would
/// read as every target at TRACE), or `None` when none is left.
fn log_directives(raw: &str) -> Option<String> {
    let directives: Vec<&str> = raw
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    (!directives.is_empty()).then(|| directives.join(","))
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(terminal::LogEvent::default)
        .with_target(false)
        .with_ansi(terminal::colour_logs())
        .with_max_level(tracing::Level::TRACE)
        .finish()
        .with(log_filter())
        .init();
    let result = match Cli::parse().command {
        Command::Run(args) => run::run(&args),
        Command::Deploy(args) => deploy::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_log_directives_are_dropped_and_none_left_means_the_default() {
        assert_eq!(log_directives("info,").as_deref(), Some("info"));
        assert_eq!(
            log_directives(" info , lockstep=debug ,,").as_deref(),
            Some("info,lockstep=debug")
        );
        assert_eq!(log_directives(""), None);
        assert_eq!(log_directives(" , "), None);
    }

    #[test]
    fn a_trailing_comma_leaves_the_default_level_and_no_catch_all_target() {
        let directives = log_directives("info,").unwrap();
        let filter: tracing_subscriber::filter::Targets = directives.parse().unwrap();
        assert_eq!(
            filter.default_level(),
            Some(tracing::level_filters::LevelFilter::INFO)
        );
        assert_eq!(filter.iter().count(), 0);
    }
}
