//! Prints this task's place in the cluster described by `TF_CONFIG`, then exits.
//!
//! The smallest program `cargo xtask run-cluster` can start: it shows what each process of a
//! cluster sees. The `--fail-as` and `--linger-ms` flags let tests exercise the launcher's
//! failure handling with a real process.
//!
//! ```text
//! $ cargo xtask run-cluster --example cluster_info --workers 2
//! [worker:0] task=worker:0 rank=0 world_size=2 chief=true address=127.0.0.1:40123 pid=812
//! [worker:1] task=worker:1 rank=1 world_size=2 chief=false address=127.0.0.1:40125 pid=813
//! ```

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use lockstep_cluster::TaskId;
use lockstep_examples::ClusterArgs;

/// Print this task's role, rank and world size, as `TF_CONFIG` describes them.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Exit with status 3 when this process is the given task (e.g. worker:1).
    #[arg(long, value_name = "TASK")]
    fail_as: Option<TaskId>,
    /// With `--fail-as`: wait this long (milliseconds) before failing, so the other tasks are up.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    fail_after_ms: u64,
    /// Stay alive this long after printing (milliseconds), so a launcher's shutdown can be seen.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    linger_ms: u64,
}

fn main() -> anyhow::Result<ExitCode> {
    lockstep_examples::init_logging();
    let args = Args::parse();
    let cluster = args.cluster.resolve()?;
    let rank = cluster
        .rank()
        .map_or_else(|| "none".to_owned(), |r| r.to_string());
    let address = cluster.spec().address(cluster.task()).unwrap_or("local");
    println!(
        "task={} rank={rank} world_size={} chief={} address={address} pid={}",
        cluster.task(),
        cluster.world_size(),
        cluster.is_chief(),
        std::process::id(),
    );
    if args.fail_as.as_ref() == Some(cluster.task()) {
        std::thread::sleep(Duration::from_millis(args.fail_after_ms));
        tracing::error!(task = %cluster.task(), "failing on request (--fail-as)");
        return Ok(ExitCode::from(3));
    }
    std::thread::sleep(Duration::from_millis(args.linger_ms));
    Ok(ExitCode::SUCCESS)
}
