//! `cargo xtask`: the project's automation, written in Rust so it needs nothing but cargo.
//!
//! - `cargo xtask run-cluster`: build an example and start it as a local cluster on
//!   127.0.0.1, one process per task, each with its own `TF_CONFIG` and the job's fresh
//!   cluster secret.
//! - `cargo xtask bench allreduce`: all-reduce bandwidth and latency between real processes
//!   (the `allreduce_bench` example on clusters of 2 and 4 workers).
//! - `cargo xtask gpu-check`: build the GPU tests and the GPU benchmark, in release, into a
//!   folder with a runner for a GPU machine that has no Rust toolchain.
//! - `cargo xtask deploy k8s|slurm`: write a JobSet, a Kubeflow TrainJob and TFJob, a
//!   Containerfile, or an sbatch script, that run an example on those engines.
//!
//! Dependencies: `clap` for the command line, `ctrlc` to turn Ctrl-C and SIGTERM into an
//! orderly shutdown, `nix` to signal whole process groups, `serde_json` to read cargo's
//! build messages, `lockstep-cluster` to write each task's `TF_CONFIG`, `lockstep-collective` for
//! a fresh cluster secret per local job, `serde-saphyr` to write the
//! Kubernetes manifests as YAML, `shlex` to quote arguments in the sbatch script.

mod bench;
mod build_example;
mod cluster_plan;
mod deploy;
mod gpu_check;
mod ports;
mod run_cluster;
mod supervise;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Lockstep's project automation.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start a local cluster on 127.0.0.1: one process of an example per task.
    RunCluster(run_cluster::RunClusterArgs),
    /// Run a benchmark that needs real processes and print its table.
    Bench(bench::BenchArgs),
    /// Build lockstep-cuda's tests and GPU benchmark for a GPU machine with no Rust toolchain.
    GpuCheck(gpu_check::GpuCheckArgs),
    /// Write the files that run a job on Kubernetes or SLURM (manifests, Containerfile,
    /// sbatch script).
    Deploy(deploy::DeployArgs),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(lockstep_task::colour_logs())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let result = match Cli::parse().command {
        Command::RunCluster(args) => run_cluster::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::GpuCheck(args) => gpu_check::run(&args),
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
