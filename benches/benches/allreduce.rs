//! All-reduce of f32 buffers between ranks on threads of this process: channel messages, shared
//! memory (in place), and TCP over loopback (with and without a cluster secret), for 2 and 4
//! ranks. Criterion's throughput is the algorithm bandwidth (buffer bytes / time); bus
//! bandwidth is that × 2(n − 1)/n. The `rendezvous` group times forming a TCP group, with
//! and without a secret (its handshake's proofs).
//!
//! `cargo bench -p lockstep-benches --features bench --bench allreduce`
//!
//! Between processes, `cargo xtask bench allreduce` measures the same over real sockets.

use std::net::{Ipv4Addr, TcpListener};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use lockstep_collective::{
    ClusterSecret, CommunicationOptions, Communicator, Implementation, LocalTransport, ReduceOp,
    SameHost, SharedMemoryTransport, TcpOptions, TcpTransport, Transport,
};

/// Builds the transports of a fresh group.
type MakeGroup = Box<dyn Fn() -> Vec<Box<dyn Transport>>>;

/// A group of ranks on threads that all-reduce their buffer each time they are told to.
struct Group {
    go: Vec<Sender<()>>,
    done: Receiver<()>,
    threads: Vec<JoinHandle<()>>,
}

impl Group {
    fn new(
        transports: Vec<Box<dyn Transport>>,
        elements: usize,
        implementation: Implementation,
    ) -> Self {
        let (done_tx, done) = channel();
        let mut go = Vec::new();
        let mut threads = Vec::new();
        for transport in transports {
            let (go_tx, go_rx) = channel::<()>();
            let done_tx = done_tx.clone();
            go.push(go_tx);
            threads.push(thread::spawn(move || {
                let options = CommunicationOptions {
                    implementation,
                    ..CommunicationOptions::default()
                };
                let mut comm = Communicator::new(transport, options);
                let mut data = vec![1.0_f32; elements];
                while go_rx.recv().is_ok() {
                    // The mean of ones is ones: the buffer needs no refill between rounds.
                    comm.all_reduce(&mut data, ReduceOp::Mean)
                        .expect("all-reduce");
                    if done_tx.send(()).is_err() {
                        return;
                    }
                }
            }));
        }
        Self { go, done, threads }
    }

    fn all_reduce(&self) {
        for go in &self.go {
            go.send(()).expect("rank alive");
        }
        for _ in &self.go {
            self.done.recv().expect("rank done");
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.go.clear();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// A secret for the rows that use one.
fn secret() -> ClusterSecret {
    ClusterSecret::new(*b"a cluster secret for benchmarks").expect("long enough")
}

fn tcp(n: usize, secret: Option<ClusterSecret>) -> Vec<Box<dyn Transport>> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("port"))
        .collect();
    let addresses: Vec<String> = listeners
        .iter()
        .map(|l| l.local_addr().expect("address").to_string())
        .collect();
    let options = TcpOptions {
        cluster: 1,
        rendezvous_timeout: Duration::from_secs(20),
        // Threads of one process over TCP on loopback: what the row measures.
        same_host: SameHost::Tcp,
        secret,
        ..TcpOptions::default()
    };
    let handles: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(rank, listener)| {
            let (addresses, options) = (addresses.clone(), options.clone());
            thread::spawn(move || {
                TcpTransport::connect_on(listener, rank, &addresses, &options).expect("tcp group")
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| Box::new(h.join().expect("connect")) as Box<dyn Transport>)
        .collect()
}

fn allreduce(c: &mut Criterion) {
    let mut group = c.benchmark_group("allreduce");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for &bytes in &[4096_usize, 1 << 20, 16 << 20, 64 << 20] {
        let elements = bytes / 4;
        group.throughput(Throughput::Bytes(bytes as u64));
        for ranks in [2_usize, 4] {
            let wires: [(&str, MakeGroup); 4] = [
                (
                    "shared_memory",
                    Box::new(move || {
                        SharedMemoryTransport::group(ranks)
                            .into_iter()
                            .map(|t| Box::new(t) as Box<dyn Transport>)
                            .collect()
                    }),
                ),
                (
                    "channels_ring",
                    Box::new(move || {
                        LocalTransport::group(ranks)
                            .into_iter()
                            .map(|t| Box::new(t) as Box<dyn Transport>)
                            .collect()
                    }),
                ),
                ("tcp_loopback_ring", Box::new(move || tcp(ranks, None))),
                (
                    "tcp_loopback_ring_secret",
                    Box::new(move || tcp(ranks, Some(secret()))),
                ),
            ];
            for (wire, make) in &wires {
                let g = Group::new(make(), elements, Implementation::Ring);
                group.bench_function(
                    BenchmarkId::new(format!("{wire}/{ranks}ranks"), bytes),
                    |b| b.iter(|| g.all_reduce()),
                );
            }
        }
    }
    group.finish();
}

/// Forming a TCP group on loopback, from binding to every rank connected.
fn rendezvous(c: &mut Criterion) {
    let mut group = c.benchmark_group("rendezvous");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for ranks in [2_usize, 4] {
        group.bench_function(BenchmarkId::new("tcp", format!("{ranks}ranks")), |b| {
            b.iter(|| tcp(ranks, None));
        });
        group.bench_function(
            BenchmarkId::new("tcp_secret", format!("{ranks}ranks")),
            |b| b.iter(|| tcp(ranks, Some(secret()))),
        );
    }
    group.finish();
}

criterion_group!(benches, allreduce, rendezvous);
criterion_main!(benches);
