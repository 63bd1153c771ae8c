//! `cargo xtask bench`: benchmarks that need real processes, which criterion cannot start.

use crate::run_cluster::{self, RunClusterArgs};

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

/// Runs the benchmark on each cluster size; every run prints its own table.
pub(crate) fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let example = match args.target.as_str() {
        "allreduce" => "allreduce_bench",
        other => anyhow::bail!("unknown benchmark {other:?}; available: allreduce"),
    };
    for &workers in &args.workers {
        run_cluster::run(&RunClusterArgs::workers(
            workers,
            example,
            args.program_args.clone(),
        ))?;
    }
    Ok(())
}
