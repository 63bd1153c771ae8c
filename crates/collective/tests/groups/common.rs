//! Running a group of ranks on threads, over any transport.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::net::{Ipv4Addr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use lockstep_collective::{
    ClusterTransport, CommunicationOptions, Communicator, GrpcTransport, LocalTransport, SameHost,
    SharedMemoryTransport, TcpOptions, TcpTransport, Transport,
};

/// Which transport a group uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wire {
    Local,
    Shared,
    /// TCP as `from_cluster` sets it up: ranks on one host through shared-memory rings.
    Tcp,
    /// Ranks on one host over plain Unix-domain sockets (`SameHost::UnixSocket`).
    TcpUnix,
    /// TCP over 127.0.0.1 between every pair (`SameHost::Tcp`).
    TcpLoopback,
    Grpc,
}

impl Wire {
    /// Every transport.
    pub(crate) const ALL: [Self; 6] = [
        Self::Local,
        Self::Shared,
        Self::Tcp,
        Self::TcpUnix,
        Self::TcpLoopback,
        Self::Grpc,
    ];
}

pub(crate) type Comm = Communicator<Box<dyn Transport>>;

/// `n` distinct ports on 127.0.0.1 that nothing listens on (for tests of peers that never
/// come, and of a rank binding its own port), from [`lockstep_testenv::unused_ports`]. Every
/// group that does form binds through [`listeners`] instead.
pub(crate) fn free_addresses(n: usize) -> Vec<String> {
    let len = u16::try_from(n).unwrap();
    let first = lockstep_testenv::unused_ports(len).unwrap();
    (first..first + len)
        .map(|port| format!("127.0.0.1:{port}"))
        .collect()
}

/// `n` listeners on ports of 127.0.0.1 the kernel chose, and their addresses. Each stays bound
/// until its rank listens on it (`connect_on`): no parallel test can take the port between.
pub(crate) fn listeners(n: usize) -> (Vec<TcpListener>, Vec<String>) {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap())
        .collect();
    let addresses = listeners
        .iter()
        .map(|l| l.local_addr().unwrap().to_string())
        .collect();
    (listeners, addresses)
}

/// A cluster identity no other group of this test run shares, so a connection that strays
/// between two tests' groups is refused instead of joining.
pub(crate) fn fresh_cluster() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    (u64::from(std::process::id()) << 32) | NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Connected transports for a group of `n`, one per rank (TCP groups form on threads).
pub(crate) fn transports(wire: Wire, n: usize) -> Vec<Box<dyn Transport>> {
    match wire {
        Wire::Local => LocalTransport::group(n)
            .into_iter()
            .map(|t| Box::new(t) as Box<dyn Transport>)
            .collect(),
        Wire::Shared => SharedMemoryTransport::group(n)
            .into_iter()
            .map(|t| Box::new(t) as Box<dyn Transport>)
            .collect(),
        Wire::Tcp => connect_all::<TcpTransport>(n, SameHost::SharedMemory),
        Wire::TcpUnix => connect_all::<TcpTransport>(n, SameHost::UnixSocket),
        Wire::TcpLoopback => connect_all::<TcpTransport>(n, SameHost::Tcp),
        Wire::Grpc => connect_all::<GrpcTransport>(n, SameHost::Tcp),
    }
}

/// Forms a TCP group of `n` on threads, rank `r` starting after `delay(r)`, and returns what
/// `body` makes of each rank's transport, in rank order.
pub(crate) fn tcp_group<R: Send + 'static>(
    n: usize,
    options: &TcpOptions,
    delay: fn(usize) -> Duration,
    body: fn(usize, TcpTransport) -> R,
) -> Vec<R> {
    let (listeners, addresses) = listeners(n);
    let handles: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(rank, listener)| {
            let (addresses, options) = (addresses.clone(), options.clone());
            thread::spawn(move || {
                thread::sleep(delay(rank));
                body(
                    rank,
                    TcpTransport::connect_on(listener, rank, &addresses, &options).unwrap(),
                )
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Forms a group of `n` over a network transport, one thread per rank.
fn connect_all<T: ClusterTransport + 'static>(
    n: usize,
    same_host: SameHost,
) -> Vec<Box<dyn Transport>> {
    let (listeners, addresses) = listeners(n);
    let options = TcpOptions {
        cluster: fresh_cluster(),
        rendezvous_timeout: Duration::from_secs(20),
        same_host,
        ..TcpOptions::default()
    };
    let handles: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(rank, listener)| {
            let (addresses, options) = (addresses.clone(), options.clone());
            thread::spawn(move || T::connect_on(listener, rank, &addresses, &options).unwrap())
        })
        .collect();
    handles
        .into_iter()
        .map(|h| Box::new(h.join().unwrap()) as Box<dyn Transport>)
        .collect()
}

/// Runs `body` on every rank of a fresh group and returns the results in rank order.
pub(crate) fn run<R, F>(wire: Wire, n: usize, options: CommunicationOptions, body: F) -> Vec<R>
where
    R: Send + 'static,
    F: Fn(&mut Comm) -> R + Send + Sync + Clone + 'static,
{
    let handles: Vec<_> = transports(wire, n)
        .into_iter()
        .map(|transport| {
            let body = body.clone();
            thread::spawn(move || body(&mut Communicator::new(transport, options)))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}
