//! Running a group of ranks on threads, over any transport.

#![allow(dead_code, reason = "each test file uses part of the helpers")]

use std::net::{Ipv4Addr, TcpListener};
use std::thread;
use std::time::Duration;

use lockstep_collective::{
    ClusterTransport, CommunicationOptions, Communicator, GrpcTransport, LocalTransport,
    SharedMemoryTransport, TcpOptions, TcpTransport, Transport,
};

/// Which transport a group uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wire {
    Local,
    Shared,
    Tcp,
    Grpc,
}

pub(crate) type Comm = Communicator<Box<dyn Transport>>;

/// `n` distinct free ports on 127.0.0.1.
pub(crate) fn free_addresses(n: usize) -> Vec<String> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().to_string())
        .collect()
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
        Wire::Tcp => connect_all::<TcpTransport>(n),
        Wire::Grpc => connect_all::<GrpcTransport>(n),
    }
}

/// Forms a group of `n` over a network transport, one thread per rank.
fn connect_all<T: ClusterTransport + 'static>(n: usize) -> Vec<Box<dyn Transport>> {
    let addresses = free_addresses(n);
    let options = TcpOptions {
        cluster: 42,
        rendezvous_timeout: Duration::from_secs(20),
    };
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let (addresses, options) = (addresses.clone(), options.clone());
            thread::spawn(move || T::connect(rank, &addresses, &options).unwrap())
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
