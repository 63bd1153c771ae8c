//! All-reduce bandwidth and latency between real processes: run it on every task of a cluster
//! and rank 0 prints a table.
//!
//! ```text
//! $ cargo xtask run-cluster --example allreduce_bench --workers 4
//! [worker:0] ranks  bytes      algorithm  time_us   algbw_GBps  busbw_GBps
//! [worker:0] 4      4096       tree       ...
//! ```
//!
//! Each size runs a few warm-up rounds, then `--iters` timed rounds; the reported time is the
//! median over rounds of the slowest rank (a collective is as slow as its slowest member).
//! Bus bandwidth is as nccl-tests defines it: `size / time × 2(n − 1) / n`.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use lockstep_cluster::Cluster;
use lockstep_cluster::{ClusterResolver, TfConfigResolver};
use lockstep_collective::{
    ClusterTransport, CommunicationOptions, Communicator, GrpcTransport, Implementation, ReduceOp,
    TcpTransport,
};

/// Measure all-reduce across the tasks of the cluster in `TF_CONFIG`.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Buffer sizes in bytes (f32 elements), smallest first.
    #[arg(long, value_delimiter = ',', default_values_t = [4, 4096, 65_536, 1 << 20, 16 << 20, 64 << 20])]
    sizes: Vec<usize>,
    /// Algorithms to measure: ring, tree.
    #[arg(long, value_delimiter = ',', default_values_t = ["ring".to_owned(), "tree".to_owned()])]
    algorithms: Vec<String>,
    /// Timed rounds per size (small sizes run 20× more).
    #[arg(long, default_value_t = 10)]
    iters: usize,
    /// Bytes per message.
    #[arg(long, default_value_t = 1 << 20)]
    bytes_per_pack: usize,
    /// The transport between processes.
    #[arg(long, value_enum, default_value_t = Wire::Tcp)]
    transport: Wire,
}

/// Transports between processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Wire {
    /// Raw TCP, one connection per pair.
    Tcp,
    /// gRPC (tonic, HTTP/2), one bidirectional stream per pair.
    Grpc,
}

fn implementation(name: &str) -> anyhow::Result<Implementation> {
    match name {
        "ring" => Ok(Implementation::Ring),
        "tree" => Ok(Implementation::Tree),
        "auto" => Ok(Implementation::Auto),
        other => anyhow::bail!("unknown algorithm {other:?}: ring, tree or auto"),
    }
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    let args = Args::parse();
    let cluster = TfConfigResolver::from_env()?
        .resolve()
        .context("reading TF_CONFIG")?;
    if !cluster.in_collective_group() {
        println!(
            "task {} is outside the collective group; nothing to measure",
            cluster.task()
        );
        return Ok(());
    }
    match args.transport {
        Wire::Tcp => measure::<TcpTransport>(&cluster, &args, "tcp"),
        Wire::Grpc => measure::<GrpcTransport>(&cluster, &args, "grpc"),
    }
}

fn measure<T: ClusterTransport>(cluster: &Cluster, args: &Args, wire: &str) -> anyhow::Result<()> {
    let mut comm: Communicator<T> = Communicator::from_cluster(
        cluster,
        CommunicationOptions::default(),
        Duration::from_mins(1),
    )?;
    let n = comm.world_size();
    if comm.rank() == 0 {
        println!(
            "{:<6} {:<6} {:<10} {:<10} {:>10} {:>11} {:>11}",
            "ranks", "wire", "bytes", "algorithm", "time_us", "algbw_GBps", "busbw_GBps"
        );
    }
    for name in &args.algorithms {
        let options = CommunicationOptions {
            implementation: implementation(name)?,
            bytes_per_pack: args.bytes_per_pack,
            ..CommunicationOptions::default()
        };
        for &bytes in &args.sizes {
            comm.set_options(options);
            let elements = (bytes / 4).max(1);
            let mut data = vec![1.0_f32; elements];
            let rounds = if bytes <= 65_536 {
                args.iters * 20
            } else {
                args.iters
            };
            for _ in 0..3 {
                comm.all_reduce(&mut data, ReduceOp::Sum)?;
            }
            let mut times = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                let started = Instant::now();
                comm.all_reduce(&mut data, ReduceOp::Sum)?;
                times.push(started.elapsed().as_secs_f64());
            }
            // The slowest rank's time, round by round.
            comm.all_reduce(&mut times, ReduceOp::Max)?;
            times.sort_by(f64::total_cmp);
            let median = times[times.len() / 2];
            if comm.rank() == 0 {
                let algbw = (elements * 4) as f64 / median / 1e9;
                let busbw = algbw * 2.0 * (n - 1) as f64 / n as f64;
                println!(
                    "{n:<6} {wire:<6} {:<10} {name:<10} {:>10.1} {algbw:>11.3} {busbw:>11.3}",
                    elements * 4,
                    median * 1e6
                );
            }
        }
    }
    Ok(())
}
