//! `cargo xtask bench`: benchmarks that need real processes, which criterion cannot start.

use std::process::Command;

use anyhow::{Context as _, bail};

use crate::build_example::build_example;

/// Options of `cargo xtask bench`.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {
    /// What to measure: `allreduce`.
    target: String,
    /// Cluster sizes (workers) to run.
    #[arg(long, value_delimiter = ',', default_values_t = [2, 4])]
    workers: Vec<usize>,
    /// Arguments for the benchmark binary, after `--` (e.g. `--sizes 4,1048576`).
    #[arg(last = true)]
    program_args: Vec<String>,
}

/// Runs the benchmark on each cluster size with `lockstep run`; every run prints its own
/// table.
pub(crate) fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let example = match args.target.as_str() {
        "allreduce" => "allreduce_bench",
        other => bail!("unknown benchmark {other:?}; available: allreduce"),
    };
    let built = build_example(example, "release")?;
    for &workers in &args.workers {
        let status = Command::new(&built.launcher)
            .args(["run", "--timeout-secs", "600", "--workers"])
            .arg(workers.to_string())
            .arg("--")
            .arg(&built.example)
            .args(&args.program_args)
            .status()
            .with_context(|| format!("starting {}", built.launcher.display()))?;
        if !status.success() {
            bail!("the benchmark on {workers} workers failed ({status})");
        }
    }
    Ok(())
}
