//! Ranks on one host: shared-memory rings (the default) or Unix-domain sockets where both sides
//! can use them, TCP when asked for, and the same results every way.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::time::Duration;

use crate::common::{fresh_cluster, tcp_group};
use lockstep_collective::{CommunicationOptions, Communicator, ReduceOp, SameHost, TcpOptions};
use lockstep_testenv::{Need, available, skip};

fn options(same_host: SameHost) -> TcpOptions {
    TcpOptions {
        cluster: fresh_cluster(),
        rendezvous_timeout: Duration::from_secs(20),
        same_host,
        ..TcpOptions::default()
    }
}

/// Each rank's wires and the result of one all-reduce, in a group of `n` whose rank `r`
/// starts after `delay(r)`.
fn group(
    n: usize,
    same_host: SameHost,
    delay: fn(usize) -> Duration,
) -> Vec<(Vec<Option<&'static str>>, Vec<f32>)> {
    tcp_group(n, &options(same_host), delay, reduce_once)
}

/// This rank's wires, and its result of one all-reduce of `rank + 1`.
fn reduce_once(
    rank: usize,
    transport: lockstep_collective::TcpTransport,
) -> (Vec<Option<&'static str>>, Vec<f32>) {
    let wires = transport.settings().wires;
    let mut comm = Communicator::new(transport, CommunicationOptions::default());
    let mut data = vec![rank as f32 + 1.0; 100_000];
    comm.all_reduce(&mut data, ReduceOp::Sum).unwrap();
    (wires, data)
}

/// Asserts that every rank reaches every other over `wire` and summed correctly.
fn assert_every_pair(results: &[(Vec<Option<&'static str>>, Vec<f32>)], wire: &str) {
    for (rank, (wires, data)) in results.iter().enumerate() {
        for (peer, got) in wires.iter().enumerate() {
            let expected = if peer == rank { None } else { Some(wire) };
            assert_eq!(*got, expected, "rank {rank} to {peer}: {wires:?}");
        }
        assert!(data.iter().all(|&v| v == 6.0));
    }
}

/// The higher ranks start late: their TCP ports (bound beforehand, as a launcher hands them
/// over) accept rank 0's dial before they offer a Unix socket, so rank 0 is sent round.
fn late(rank: usize) -> Duration {
    Duration::from_millis(300 * rank as u64)
}

#[test]
fn ranks_on_one_host_share_memory_rings_even_when_a_tcp_port_answers_first() {
    assert_every_pair(&group(3, SameHost::SharedMemory, late), "shm");
}

#[test]
fn ranks_on_one_host_talk_over_unix_sockets_even_when_a_tcp_port_answers_first() {
    assert_every_pair(&group(3, SameHost::UnixSocket, late), "unix");
}

#[test]
fn a_ring_and_a_plain_socket_meet_as_a_plain_socket() {
    // Rank 0 asks for rings, the others do not: the pairs with rank 0 agree on no ring.
    let (listeners, addresses) = crate::common::listeners(3);
    let cluster = fresh_cluster();
    let handles: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(rank, listener)| {
            let addresses = addresses.clone();
            std::thread::spawn(move || {
                let same_host = if rank == 0 {
                    SameHost::SharedMemory
                } else {
                    SameHost::UnixSocket
                };
                let options = TcpOptions {
                    cluster,
                    ..options(same_host)
                };
                let transport = lockstep_collective::TcpTransport::connect_on(
                    listener, rank, &addresses, &options,
                )
                .unwrap();
                reduce_once(rank, transport)
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_every_pair(&results, "unix");
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

/// Binds the abstract Unix name of the rank at `address` as another user (`nobody`) would,
/// before the rank starts; the squatter counts the bytes it is sent until its input closes.
const SQUATTER: &str = r"
import select, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(b'\0lockstep-collective/' + sys.argv[1].encode())
s.listen(8)
print('bound', flush=True)
conns, got = [], 0
while True:
    ready, _, _ = select.select([s, sys.stdin] + conns, [], [], 60)
    if not ready or sys.stdin in ready:
        break
    for c in ready:
        if c is s:
            conns.append(s.accept()[0])
        else:
            data = c.recv(65536)
            got += len(data)
            if not data:
                conns.remove(c)
print(got, flush=True)
";

#[test]
fn a_unix_socket_name_taken_by_another_user_is_refused_and_the_pair_uses_tcp() {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    if !nix::unistd::geteuid().is_root() {
        skip(Need::Root, "running a squatter as another user needs root");
        return;
    }
    let python = Command::new("python3").arg("--version").output();
    if available(
        Need::Python,
        python.map_err(|e| format!("no python3 to play the squatter: {e}")),
    )
    .is_none()
    {
        return;
    }
    let (listeners, addresses) = crate::common::listeners(2);
    let mut squatter = Command::new("python3")
        .args(["-c", SQUATTER, &addresses[1]])
        .uid(65534)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs as user 65534");
    let mut out = BufReader::new(squatter.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "bound");
    let options = options(SameHost::SharedMemory);
    let handles: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(rank, listener)| {
            let (addresses, options) = (addresses.clone(), options.clone());
            std::thread::spawn(move || {
                let transport = lockstep_collective::TcpTransport::connect_on(
                    listener, rank, &addresses, &options,
                )
                .unwrap();
                reduce_once(rank, transport)
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    squatter.stdin.take().unwrap().write_all(b"done\n").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    squatter.wait().unwrap();
    assert_eq!(results[0].0, [None, Some("tcp")]);
    assert_eq!(results[1].0, [Some("tcp"), None]);
    assert!(
        results
            .iter()
            .all(|(_, data)| data.iter().all(|&v| v == 3.0))
    );
    assert_eq!(line.trim(), "0", "the squatter was sent nothing");
}
