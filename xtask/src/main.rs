//! `cargo xtask`: the project's automation, written in Rust so it needs nothing but cargo.
//!
//! - `cargo xtask run-cluster`: build an example and the `lockstep` launcher, and start the
//!   example as a local cluster on 127.0.0.1 with `lockstep run`: one process per task, each
//!   with its own `TF_CONFIG` and the job's fresh cluster secret.
//! - `cargo xtask bench allreduce`: all-reduce bandwidth and latency between real processes
//!   (the `allreduce_bench` example on clusters of 2 and 4 workers).
//! - `cargo xtask gpu-check`: build the GPU tests and the GPU benchmark, in release, into a
//!   folder with a runner for a GPU machine that has no Rust toolchain.
//! - `cargo xtask deploy k8s|slurm`: build the launcher and run `lockstep deploy`, which
//!   writes a JobSet, a Kubeflow TrainJob and TFJob, a Containerfile, or an sbatch script,
//!   that run an example (or a program) on those engines.
//!
//! Dependencies: `clap` for the command line, `serde_json` to read cargo's build messages.
//! None of the training crates: the README's run command builds them once, in release, for the
//! example.

mod bench;
mod build_example;
mod deploy;
mod gpu_check;
mod run_cluster;

use std::ffi::OsString;
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
    /// Start a local cluster on 127.0.0.1: one process of an example per task, through
    /// `lockstep run` (`cargo xtask run-cluster --help` lists its options).
    #[command(disable_help_flag = true)]
    RunCluster {
        /// `--example NAME`, `--profile PROFILE`, `lockstep run`'s options, then `--` and the
        /// example's arguments (read from the raw command line, `--` included).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<OsString>,
    },
    /// Run a benchmark that needs real processes and print its table.
    Bench(bench::BenchArgs),
    /// Build lockstep-cuda's tests and GPU benchmark for a GPU machine with no Rust toolchain.
    GpuCheck(gpu_check::GpuCheckArgs),
    /// Write the files that run a job on Kubernetes or SLURM (manifests, Containerfile,
    /// sbatch script), through `lockstep deploy` (`cargo xtask deploy --help` lists its
    /// options).
    #[command(disable_help_flag = true)]
    Deploy {
        /// `lockstep deploy`'s arguments (read from the raw command line, `--` included).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<OsString>,
    },
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        // Clap drops a leading `--`, which separates the launcher's options from the
        // example's: the raw arguments after `run-cluster` keep it.
        Command::RunCluster { .. } => run_cluster::run(
            std::env::args_os()
                .skip_while(|arg| arg != "run-cluster")
                .skip(1),
        ),
        Command::Bench(args) => bench::run(&args),
        Command::GpuCheck(args) => gpu_check::run(&args),
        Command::Deploy { .. } => deploy::run(
            std::env::args_os()
                .skip_while(|arg| arg != "deploy")
                .skip(1),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
