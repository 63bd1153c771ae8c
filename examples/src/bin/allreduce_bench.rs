//! All-reduce bandwidth and latency between real processes: run it on every task of a cluster
//! and rank 0 prints a table.
//!
//! ```text
//! $ cargo xtask run-cluster --example allreduce_bench --workers 2 -- --sizes 4096,16777216
//! [worker:0] settings rank=0 wires=self,shm oversubscribed=false send_ahead=0 spin_us=500 sndbuf=… rcvbuf=… cores=2 bytes_per_pack=1048576
//! [worker:1] settings rank=1 wires=shm,self oversubscribed=false send_ahead=0 spin_us=500 sndbuf=… rcvbuf=… cores=2 bytes_per_pack=1048576
//! [worker:0] ranks  wire   bytes      algorithm   rounds    time_us  algbw_GBps  busbw_GBps
//! [worker:0] 2      tcp    4096       ring          …
//! ```
//!
//! Ranks on one host exchange bytes through shared-memory rings; `--same-host unix` makes them
//! use Unix-domain sockets, and `--same-host tcp` TCP over loopback, as gloo does.
//!
//! The method is the one of the reference figures in `shared/anchors/collectives/` (gloo,
//! Open MPI), so the tables compare directly: 5 warm-up rounds; probe batches of 3, 6, 12, …
//! rounds until one takes 0.2 s on the slowest rank; then enough back-to-back timed rounds for
//! 2 s (at least 20, or 5 when 20 would take over 10 s); the reported time is the slowest
//! rank's median. Bus bandwidth is as nccl-tests defines it: `size / time × 2(n − 1) / n`.
//! Afterwards every rank checks the sum of `rank + 1` over all ranks.

use std::time::Instant;

use clap::Parser;
use lockstep_cluster::Cluster;
use lockstep_collective::{
    ClusterTransport, CommunicationOptions, Communicator, GrpcTransport, Implementation, ReduceOp,
    SameHost, TcpOptions, TcpTransport,
};
use lockstep_examples::ClusterArgs;

/// Measure all-reduce across the tasks of the cluster in `TF_CONFIG`.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Buffer sizes in bytes (f32 elements), smallest first.
    #[arg(long, value_delimiter = ',', default_values_t = [4, 4096, 65_536, 1 << 20, 16 << 20, 64 << 20])]
    sizes: Vec<usize>,
    /// Algorithms to measure: ring, tree.
    #[arg(long, value_delimiter = ',', default_values_t = ["ring".to_owned(), "tree".to_owned()])]
    algorithms: Vec<String>,
    /// Timed rounds per size, instead of as many as fill `--seconds`.
    #[arg(long)]
    iters: Option<usize>,
    /// Seconds of timed rounds per size.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Bytes per message.
    #[arg(long, default_value_t = 1 << 20)]
    bytes_per_pack: usize,
    /// The transport between processes.
    #[arg(long, value_enum, default_value_t = Wire::Tcp)]
    transport: Wire,
    /// How TCP reaches ranks on this host: a shared-memory ring, a Unix-domain socket, or TCP
    /// like any other.
    #[arg(long, value_enum, default_value_t = SameHostWire::Shm)]
    same_host: SameHostWire,
}

/// How the TCP transport reaches ranks on the same host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SameHostWire {
    /// A shared-memory ring beside a Unix-domain socket.
    Shm,
    /// A Unix-domain socket.
    Unix,
    /// TCP over loopback.
    Tcp,
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
    lockstep_examples::init_logging();
    let args = Args::parse();
    let cluster = args.cluster.resolve()?;
    if !cluster.in_collective_group() {
        println!(
            "task {} is outside the collective group; nothing to measure",
            cluster.task()
        );
        return Ok(());
    }
    match args.transport {
        Wire::Tcp => measure::<TcpTransport>(&cluster, &args, "tcp", |t| t.settings().to_string()),
        Wire::Grpc => measure::<GrpcTransport>(&cluster, &args, "grpc", |_| {
            "wires=grpc (tonic, HTTP/2; one stream per peer)".to_owned()
        }),
    }
}

fn measure<T: ClusterTransport>(
    cluster: &Cluster,
    args: &Args,
    wire: &str,
    settings: fn(&T) -> String,
) -> anyhow::Result<()> {
    let transport = TcpOptions {
        same_host: match args.same_host {
            SameHostWire::Shm => SameHost::SharedMemory,
            SameHostWire::Unix => SameHost::UnixSocket,
            SameHostWire::Tcp => SameHost::Tcp,
        },
        ..args.cluster.transport()
    };
    let mut comm: Communicator<T> =
        Communicator::from_cluster_with(cluster, CommunicationOptions::default(), &transport)?;
    let n = comm.world_size();
    // Every rank says what it chose: the settings of one rank can differ from another's.
    println!(
        "settings rank={} {} bytes_per_pack={}",
        comm.rank(),
        settings(comm.transport()),
        args.bytes_per_pack
    );
    if comm.rank() == 0 {
        println!(
            "{:<6} {:<6} {:<10} {:<10} {:>7} {:>10} {:>11} {:>11}",
            "ranks", "wire", "bytes", "algorithm", "rounds", "time_us", "algbw_GBps", "busbw_GBps"
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
            let mut data = vec![0.0_f32; elements];
            for _ in 0..5 {
                comm.all_reduce(&mut data, ReduceOp::Sum)?;
            }
            let rounds = match args.iters {
                Some(iters) => iters.max(1),
                None => rounds_for(&mut comm, &mut data, args.seconds)?,
            };
            let mut times = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                let started = Instant::now();
                comm.all_reduce(&mut data, ReduceOp::Sum)?;
                times.push(started.elapsed().as_secs_f64());
            }
            times.sort_by(f64::total_cmp);
            let mut median = [times[times.len() / 2]];
            comm.all_reduce(&mut median, ReduceOp::Max)?;
            let [median] = median;

            data.fill((comm.rank() + 1) as f32);
            comm.all_reduce(&mut data, ReduceOp::Sum)?;
            let expected = (n * (n + 1) / 2) as f32;
            anyhow::ensure!(
                data.iter().all(|&x| x == expected),
                "{name} all-reduce of {bytes} bytes gave a wrong sum"
            );
            if comm.rank() == 0 {
                let algbw = (elements * 4) as f64 / median / 1e9;
                let busbw = algbw * 2.0 * (n - 1) as f64 / n as f64;
                println!(
                    "{n:<6} {wire:<6} {:<10} {name:<10} {rounds:>7} {:>10.1} {algbw:>11.3} {busbw:>11.3}",
                    elements * 4,
                    median * 1e6
                );
            }
        }
    }
    Ok(())
}

/// How many timed rounds fill `seconds`, from probe batches of 3, 6, 12, … rounds until one
/// takes 0.2 s on the slowest rank; at least 20 rounds, or 5 when 20 would take over 10 s.
/// Every rank gets the same answer.
fn rounds_for<T: ClusterTransport>(
    comm: &mut Communicator<T>,
    data: &mut [f32],
    seconds: f64,
) -> anyhow::Result<usize> {
    let mut batch = 3_usize;
    let per_round = loop {
        comm.barrier()?;
        let started = Instant::now();
        for _ in 0..batch {
            comm.all_reduce(data, ReduceOp::Sum)?;
        }
        let mut elapsed = [started.elapsed().as_secs_f64()];
        comm.all_reduce(&mut elapsed, ReduceOp::Max)?;
        if elapsed[0] >= 0.2 || batch > 100_000 {
            break elapsed[0] / batch as f64;
        }
        batch *= 2;
    };
    let for_seconds = (seconds / per_round).ceil() as usize;
    let floor = ((10.0 / per_round).ceil() as usize).clamp(5, 20);
    Ok(for_seconds.max(floor).min(200_000))
}
