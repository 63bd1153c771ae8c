//! All-reduces in a loop across the cluster in `TF_CONFIG`, and reports how it ended — with
//! switches that make one rank misbehave, to see how the others react in real processes.
//!
//! ```text
//! $ cargo xtask run-cluster --example collective_check --workers 3 --keep-going -- --misbehave crash --rank 1
//! [worker:0] result=error kind=PeerLost detail=rank 1 (127.0.0.1:40125) was lost: the connection closed
//! [worker:2] result=error kind=Aborted detail=…
//! ```
//!
//! With `--watch`, the others wait outside the collectives at the middle one, as a GPU's NCCL
//! call does, and see the crash through their connections alone:
//!
//! ```text
//! $ cargo xtask run-cluster --example collective_check --workers 3 --keep-going -- --misbehave crash --rank 1 --watch
//! [worker:0] result=error kind=PeerLost seen_ms=… detail=rank 1 (127.0.0.1:40125) was lost: the connection closed
//! ```

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use lockstep_collective::{
    CollectiveError, CommunicationOptions, Communicator, Implementation, ReduceOp, TcpTransport,
};
use lockstep_examples::ClusterArgs;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Misbehaviour {
    /// Everyone behaves.
    None,
    /// The chosen rank's process ends abruptly in the middle of the run (no destructors run,
    /// no goodbye sent: the operating system closes its sockets, as after a crash).
    Crash,
    /// The chosen rank all-reduces a buffer of another size.
    WrongSize,
    /// The chosen rank joins late.
    Late,
    /// The chosen rank stops calling collectives (but stays alive) until the others have
    /// given up on it and gone (their connections close), at most four timeouts.
    Stall,
}

/// Calls no collective until a peer is seen gone (the others timed out waiting and ended), or
/// `at_most` has passed.
fn stall_until_the_others_go(comm: &mut Communicator<TcpTransport>, at_most: Duration) {
    let started = std::time::Instant::now();
    while comm.check_peers().is_ok() && started.elapsed() < at_most {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// All-reduce in a loop and report `result=ok` or `result=error kind=… detail=…`.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// How the chosen rank misbehaves.
    #[arg(long, value_enum, default_value_t = Misbehaviour::None)]
    misbehave: Misbehaviour,
    /// The rank that misbehaves.
    #[arg(long, default_value_t = 1)]
    rank: usize,
    /// All-reduces to run; the misbehaviour happens at the middle one.
    #[arg(long, default_value_t = 6)]
    iterations: usize,
    /// Elements per all-reduce.
    #[arg(long, default_value_t = 1 << 18)]
    elements: usize,
    /// Seconds a collective may wait for its peers.
    #[arg(long, default_value_t = 5)]
    timeout_secs: u64,
    /// At the middle all-reduce, the other ranks wait outside the collectives instead (as a
    /// GPU's NCCL call does), watching their connections (`check_peers`) every 20 ms for up
    /// to `timeout_secs` × 4, and report the peer they see gone and after how long.
    #[arg(long)]
    watch: bool,
}

/// The `--watch` wait: `result=error kind=PeerLost … seen_ms=…` once a peer is seen gone, or
/// `result=unseen` when none is within `limit`.
fn watch(comm: &mut Communicator<TcpTransport>, limit: Duration) -> ExitCode {
    let started = std::time::Instant::now();
    while started.elapsed() < limit {
        if let Err(error) = comm.check_peers() {
            println!(
                "result=error kind={} seen_ms={} detail={error}",
                kind(&error),
                started.elapsed().as_millis()
            );
            // Stay a moment: the other watchers, looking every 20 ms, must see the crash, not
            // this process's own exit after it.
            std::thread::sleep(Duration::from_millis(200));
            return ExitCode::SUCCESS;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("result=unseen");
    ExitCode::from(3)
}

fn kind(error: &CollectiveError) -> &'static str {
    match error {
        CollectiveError::Timeout { .. } => "Timeout",
        CollectiveError::PeerLost { .. } => "PeerLost",
        CollectiveError::Mismatch { .. } => "Mismatch",
        CollectiveError::Aborted { .. } => "Aborted",
        CollectiveError::Broken { .. } => "Broken",
        _ => "Other",
    }
}

fn main() -> anyhow::Result<ExitCode> {
    lockstep_examples::init_logging();
    let args = Args::parse();
    let cluster = args.cluster.resolve()?;
    let me = cluster
        .rank()
        .context("this task is outside the collective group")?;
    let chosen = me == args.rank;
    if chosen && args.misbehave == Misbehaviour::Late {
        std::thread::sleep(Duration::from_millis(1500));
    }
    let options = CommunicationOptions {
        implementation: Implementation::Ring,
        timeout: Duration::from_secs(args.timeout_secs),
        ..CommunicationOptions::default()
    };
    let mut comm: Communicator<TcpTransport> =
        Communicator::from_cluster_with(&cluster, options, &args.cluster.transport())?;
    let middle = args.iterations / 2;
    for iteration in 0..args.iterations {
        if chosen && iteration == middle {
            match args.misbehave {
                Misbehaviour::Crash => std::process::exit(101),
                Misbehaviour::Stall => {
                    stall_until_the_others_go(
                        &mut comm,
                        Duration::from_secs(args.timeout_secs * 4),
                    );
                    println!("result=stalled");
                    return Ok(ExitCode::SUCCESS);
                }
                _ => {}
            }
        }
        if !chosen && iteration == middle && args.watch {
            return Ok(watch(&mut comm, Duration::from_secs(args.timeout_secs * 4)));
        }
        let wrong = chosen && iteration == middle && args.misbehave == Misbehaviour::WrongSize;
        let mut data = vec![
            1.0_f32;
            if wrong {
                args.elements / 2
            } else {
                args.elements
            }
        ];
        if let Err(error) = comm.all_reduce(&mut data, ReduceOp::Sum) {
            println!("result=error kind={} detail={error}", kind(&error));
            return Ok(ExitCode::SUCCESS);
        }
        let expected = comm.world_size() as f32;
        if data.iter().any(|&v| v != expected) {
            println!("result=wrong-data");
            return Ok(ExitCode::from(2));
        }
    }
    println!("result=ok");
    Ok(ExitCode::SUCCESS)
}
