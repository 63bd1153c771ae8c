//! Ranks on one host: Unix-domain sockets where both sides can use them, TCP when asked for,
//! and the same results either way.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

mod common;

use std::thread;
use std::time::Duration;

use common::{fresh_cluster, listeners};
use lockstep_collective::{
    CommunicationOptions, Communicator, ReduceOp, SameHost, TcpOptions, TcpTransport,
};

fn options(same_host: SameHost) -> TcpOptions {
    TcpOptions {
        cluster: fresh_cluster(),
        rendezvous_timeout: Duration::from_secs(20),
        same_host,
    }
}

/// Forms a group of `n` on threads, rank `r` starting after `delay(r)`, and returns each
/// rank's wires and the result of one all-reduce.
fn group(
    n: usize,
    same_host: SameHost,
    delay: fn(usize) -> Duration,
) -> Vec<(Vec<Option<&'static str>>, Vec<f32>)> {
    let (listeners, addresses) = listeners(n);
    let options = options(same_host);
    let handles: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(rank, listener)| {
            let (addresses, options) = (addresses.clone(), options.clone());
            thread::spawn(move || {
                thread::sleep(delay(rank));
                let transport =
                    TcpTransport::connect_on(listener, rank, &addresses, &options).unwrap();
                let wires = transport.settings().wires;
                let mut comm = Communicator::new(transport, CommunicationOptions::default());
                let mut data = vec![rank as f32 + 1.0; 100_000];
                comm.all_reduce(&mut data, ReduceOp::Sum).unwrap();
                (wires, data)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn ranks_on_one_host_talk_over_unix_sockets_even_when_a_tcp_port_answers_first() {
    // The higher ranks start late: their TCP ports (bound beforehand, as a launcher hands them
    // over) accept rank 0's dial before they offer a Unix socket, so rank 0 is sent round.
    let results = group(3, SameHost::UnixSocket, |rank| {
        Duration::from_millis(300 * rank as u64)
    });
    for (rank, (wires, data)) in results.iter().enumerate() {
        for (peer, wire) in wires.iter().enumerate() {
            let expected = if peer == rank { None } else { Some("unix") };
            assert_eq!(*wire, expected, "rank {rank} to {peer}: {wires:?}");
        }
        assert!(data.iter().all(|&v| v == 6.0));
    }
}

#[test]
fn same_host_tcp_keeps_every_pair_on_tcp() {
    let results = group(3, SameHost::Tcp, |_| Duration::ZERO);
    for (rank, (wires, data)) in results.iter().enumerate() {
        assert!(
            wires
                .iter()
                .enumerate()
                .all(|(peer, w)| (peer == rank) == w.is_none() && w.is_none_or(|w| w == "tcp")),
            "rank {rank}: {wires:?}"
        );
        assert!(data.iter().all(|&v| v == 6.0));
    }
}
