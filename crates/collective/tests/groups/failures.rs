//! Failures are typed errors on every rank within the timeout — never a hang, never wrong data.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{Wire, free_addresses, fresh_cluster, listeners, run, tcp_group, transports};
use lockstep_collective::{
    CollectiveError, CommunicationOptions, Communicator, GrpcTransport, Implementation, Op,
    ReduceOp, TcpOptions, TcpTransport,
};

fn quick(implementation: Implementation) -> CommunicationOptions {
    CommunicationOptions {
        implementation,
        bytes_per_pack: 1 << 20,
        timeout: Duration::from_secs(2),
        ..CommunicationOptions::default()
    }
}

fn is_mismatch_or_abort_of_one(e: &CollectiveError) -> bool {
    match e {
        CollectiveError::Mismatch { what, .. } => *what == "element count",
        CollectiveError::Aborted { reason, .. } => reason.contains("mismatch"),
        _ => false,
    }
}

#[test]
fn wrong_sizes_on_one_rank_fail_every_rank_and_break_the_communicator() {
    for wire in Wire::ALL {
        for implementation in [Implementation::Ring, Implementation::Tree] {
            let results = run(wire, 4, quick(implementation), |comm| {
                let len = if comm.rank() == 2 { 100 } else { 200 };
                let first = comm.all_reduce(&mut vec![1.0_f32; len], ReduceOp::Sum);
                let second = comm.all_reduce(&mut vec![1.0_f32; 200], ReduceOp::Sum);
                (first, second)
            });
            for (rank, (first, second)) in results.iter().enumerate() {
                let err = first.as_ref().unwrap_err();
                assert!(
                    is_mismatch_or_abort_of_one(err),
                    "{wire:?} {implementation:?} rank {rank}: {err}"
                );
                assert!(
                    matches!(second, Err(CollectiveError::Broken { .. })),
                    "rank {rank}: {second:?}"
                );
            }
        }
    }
}

#[test]
fn a_rank_that_never_joins_makes_the_others_fail_within_the_timeout() {
    // Every wire's group at once, each on threads of its own: the test waits out one silent
    // rank, not one per wire.
    let outcomes: Vec<_> = thread::scope(|scope| {
        let groups: Vec<_> = Wire::ALL
            .into_iter()
            .map(|wire| {
                scope.spawn(move || {
                    // How many of the others have their answer: the silent rank leaves once
                    // both have (or after a minute, when one hangs and the test fails).
                    let answered = Arc::new(AtomicUsize::new(0));
                    let results = run(wire, 3, quick(Implementation::Ring), move |comm| {
                        if comm.rank() == 2 {
                            let deadline = Instant::now() + Duration::from_mins(1);
                            while answered.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
                                thread::sleep(Duration::from_millis(20));
                            }
                            return None;
                        }
                        let result = comm.all_reduce(&mut [1.0_f32; 64], ReduceOp::Sum);
                        answered.fetch_add(1, Ordering::SeqCst);
                        Some(result)
                    });
                    (wire, results)
                })
            })
            .collect();
        groups.into_iter().map(|g| g.join().unwrap()).collect()
    });
    for (wire, results) in outcomes {
        let errors: Vec<_> = results
            .into_iter()
            .flatten()
            .map(Result::unwrap_err)
            .collect();
        assert_eq!(errors.len(), 2);
        assert!(
            errors.iter().any(|e| matches!(e, CollectiveError::Timeout { missing_ranks, op: Op::AllReduce, .. } if missing_ranks == &[2])),
            "{wire:?}: {errors:?}"
        );
        assert!(
            errors.iter().all(|e| matches!(
                e,
                CollectiveError::Timeout { .. } | CollectiveError::Aborted { .. }
            )),
            "{errors:?}"
        );
    }
}

#[test]
fn a_rank_that_disappears_is_reported_as_lost() {
    for wire in [
        Wire::Local,
        Wire::Tcp,
        Wire::TcpUnix,
        Wire::TcpLoopback,
        Wire::Grpc,
    ] {
        let results = run(wire, 3, quick(Implementation::Ring), |comm| {
            comm.all_reduce(&mut [1.0_f32; 8], ReduceOp::Sum).unwrap();
            if comm.rank() == 1 {
                return None; // the thread ends: its transport is dropped, its sockets close
            }
            Some(comm.all_reduce(&mut [1.0_f32; 8], ReduceOp::Sum))
        });
        for result in results.into_iter().flatten() {
            let err = result.unwrap_err();
            let names_rank_1 = match &err {
                CollectiveError::PeerLost { rank, .. } => *rank == 1,
                CollectiveError::Aborted { reason, .. } => reason.contains("rank 1"),
                _ => false,
            };
            assert!(names_rank_1, "{wire:?}: {err}");
        }
    }
}

#[test]
fn a_peer_process_that_dies_is_seen_by_check_peers_within_moments_without_a_collective() {
    for wire in [Wire::Tcp, Wire::TcpUnix, Wire::TcpLoopback] {
        // The two survivors stay connected until both have looked: a survivor that ended
        // first would look gone to the other.
        let both_looked = Arc::new(Barrier::new(2));
        let results = run(wire, 3, quick(Implementation::Ring), move |comm| {
            comm.all_reduce(&mut [1.0_f32; 8], ReduceOp::Sum).unwrap();
            // Every peer is alive: nothing to report, and nothing read is lost.
            let quiet = comm.check_peers();
            comm.all_reduce(&mut [1.0_f32; 8], ReduceOp::Sum).unwrap();
            if comm.rank() == 1 {
                return None; // the thread ends: its transport is dropped, its sockets close
            }
            let started = Instant::now();
            let found = loop {
                match comm.check_peers() {
                    Err(e) => break Some(e),
                    Ok(()) if started.elapsed() > Duration::from_secs(10) => break None,
                    Ok(()) => thread::sleep(Duration::from_millis(5)),
                }
            };
            let waited = started.elapsed();
            both_looked.wait();
            Some((quiet, found, waited))
        });
        for (quiet, found, waited) in results.into_iter().flatten() {
            assert!(quiet.is_ok(), "{wire:?}: {quiet:?}");
            let found = found.unwrap_or_else(|| panic!("{wire:?}: no peer reported gone in 10 s"));
            assert!(
                matches!(found, CollectiveError::PeerLost { rank: 1, .. }),
                "{wire:?}: {found}"
            );
            // Seen by its closed sockets, without a collective: no bound on how soon, which a
            // loaded machine would stretch; the poll above gives up after 10 s.
            eprintln!("{wire:?}: the dead peer seen after {waited:?}");
        }
    }
}

#[test]
fn with_many_ranks_every_rank_hears_of_a_lost_one_at_once_not_hop_by_hop_round_the_ring() {
    const RANKS: usize = 12;
    let results = run(
        Wire::TcpLoopback,
        RANKS,
        quick(Implementation::Ring),
        |comm| {
            let mut data = vec![1.0_f32; 1 << 18];
            comm.all_reduce(&mut data, ReduceOp::Sum).unwrap();
            if comm.rank() == 5 {
                return None; // the thread ends: its transport is dropped, its sockets close
            }
            let result = comm.all_reduce(&mut data, ReduceOp::Sum);
            Some((Instant::now(), result))
        },
    );
    let ended: Vec<_> = results.into_iter().flatten().collect();
    assert_eq!(ended.len(), RANKS - 1);
    for (_, result) in &ended {
        let err = result.as_ref().unwrap_err();
        let names_rank_5 = match err {
            CollectiveError::PeerLost { rank, .. } => *rank == 5,
            CollectiveError::Aborted { reason, .. } => reason.contains("rank 5"),
            _ => false,
        };
        assert!(names_rank_5, "{err}");
    }
    // The first rank to see it tells every other; none learns it from its ring neighbour's
    // exit after a wait of its own (about 100 ms a hop, over a second round 11 ranks).
    let first = ended.iter().map(|(at, _)| *at).min().unwrap();
    let last = ended.iter().map(|(at, _)| *at).max().unwrap();
    assert!(
        last - first < Duration::from_millis(600),
        "the last rank heard {:?} after the first",
        last - first
    );
}

#[test]
fn a_connection_from_outside_the_cluster_is_refused_and_the_group_still_forms() {
    let (mut listeners, addresses) = listeners(2);
    let options = TcpOptions {
        cluster: fresh_cluster(),
        rendezvous_timeout: Duration::from_secs(10),
        ..TcpOptions::default()
    };
    let (a0, o0, l0) = (addresses.clone(), options.clone(), listeners.remove(0));
    let rank0 = thread::spawn(move || TcpTransport::connect_on(l0, 0, &a0, &o0));
    // An intruder says hello with another cluster identity, then another sends garbage.
    let target = addresses[0].clone();
    let intruders = thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut sent = 0;
        while sent < 2 && Instant::now() < deadline {
            if let Ok(mut stream) = TcpStream::connect(&target) {
                let hello = if sent == 0 {
                    let mut h = 0x4C53_4848_u32.to_le_bytes().to_vec();
                    h.extend(999_u64.to_le_bytes());
                    h.extend(1_u32.to_le_bytes());
                    h.extend(2_u32.to_le_bytes());
                    h
                } else {
                    b"GET / HTTP/1.1\r\n\r\n....".to_vec()
                };
                let _ = stream.write_all(&hello);
                sent += 1;
            } else {
                thread::sleep(Duration::from_millis(10));
            }
        }
        sent
    });
    assert_eq!(intruders.join().unwrap(), 2);
    thread::sleep(Duration::from_millis(100));
    let rank1 = TcpTransport::connect_on(listeners.remove(0), 1, &addresses, &options).unwrap();
    let rank0 = rank0.join().unwrap().unwrap();
    let results: Vec<_> = [rank0, rank1]
        .into_iter()
        .map(|t| {
            thread::spawn(move || {
                let mut comm = Communicator::new(t, CommunicationOptions::default());
                let mut data = [1.0_f32, 2.0];
                comm.all_reduce(&mut data, ReduceOp::Sum).map(|()| data)
            })
        })
        .collect();
    for r in results {
        assert_eq!(r.join().unwrap().unwrap(), [2.0, 4.0]);
    }
}

#[test]
fn late_starters_join_the_group() {
    let options = TcpOptions {
        cluster: fresh_cluster(),
        rendezvous_timeout: Duration::from_secs(20),
        ..TcpOptions::default()
    };
    // Rank 0 starts last.
    let sums = tcp_group(
        3,
        &options,
        |rank| Duration::from_millis(400 * (2 - rank as u64)),
        |rank, transport| {
            let mut comm = Communicator::new(transport, CommunicationOptions::default());
            let mut data = [rank as f64];
            comm.all_reduce(&mut data, ReduceOp::Sum).map(|()| data[0])
        },
    );
    for sum in sums {
        assert_eq!(sum.unwrap(), 3.0);
    }
}

#[test]
fn a_rendezvous_that_does_not_complete_names_the_missing_ranks() {
    let addresses = free_addresses(3);
    let options = TcpOptions {
        cluster: fresh_cluster(),
        rendezvous_timeout: Duration::from_millis(500),
        ..TcpOptions::default()
    };
    let err = TcpTransport::connect(2, &addresses, &options)
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("rank(s) [0, 1] did not connect"),
        "{err}"
    );
    let err = TcpTransport::connect(0, &addresses, &options)
        .err()
        .unwrap();
    assert!(err.to_string().contains("could not reach rank 1"), "{err}");

    // gRPC dials every higher rank at once and still names the lowest it could not reach.
    let addresses = free_addresses(3);
    let err = GrpcTransport::connect(2, &addresses, &options)
        .err()
        .unwrap();
    assert!(
        err.to_string()
            .contains("rank(s) [0, 1] did not open their streams"),
        "{err}"
    );
    let err = GrpcTransport::connect(0, &addresses, &options)
        .err()
        .unwrap();
    assert!(err.to_string().contains("could not reach rank 1"), "{err}");
}

#[test]
fn bad_arguments_are_errors_and_do_not_break_the_communicator() {
    let results = run(Wire::Local, 2, quick(Implementation::Auto), |comm| {
        let root = comm.broadcast(&mut [0.0_f32], 5).unwrap_err();
        let scatter = comm
            .reduce_scatter(&[0.0_f32; 3], &mut [0.0; 2], ReduceOp::Sum)
            .unwrap_err();
        let gather = comm.all_gather(&[0.0_f32; 2], &mut [0.0; 3]).unwrap_err();
        let still_works = comm.all_reduce(&mut [1.0_f32], ReduceOp::Sum);
        (root, scatter, gather, still_works)
    });
    for (root, scatter, gather, still_works) in results {
        assert!(root.to_string().contains("root 5"), "{root}");
        assert!(matches!(
            scatter,
            CollectiveError::InvalidArgument {
                op: "reduce_scatter",
                ..
            }
        ));
        assert!(matches!(
            gather,
            CollectiveError::InvalidArgument {
                op: "all_gather",
                ..
            }
        ));
        still_works.unwrap();
    }
    let nccl = CommunicationOptions {
        implementation: Implementation::Nccl,
        ..CommunicationOptions::default()
    };
    let mut comm = Communicator::new(transports(Wire::Local, 1).pop().unwrap(), nccl);
    assert!(
        comm.all_reduce(&mut [1.0_f32], ReduceOp::Sum)
            .unwrap_err()
            .to_string()
            .contains("NCCL")
    );
}

#[test]
fn the_flight_recorder_keeps_recent_collectives_and_the_failure() {
    let records = run(Wire::Local, 2, quick(Implementation::Ring), |comm| {
        comm.all_reduce(&mut [1.0_f32; 10], ReduceOp::Sum).unwrap();
        comm.barrier().unwrap();
        let len = 10 + comm.rank();
        let _ = comm.all_reduce(&mut vec![1.0_f32; len], ReduceOp::Sum);
        comm.flight_records()
            .map(|r| (r.op, r.seq, r.algorithm, r.failure.is_some()))
            .collect::<Vec<_>>()
    });
    for r in records {
        assert_eq!(
            r,
            [
                (Op::AllReduce, 1, "ring", false),
                (Op::Barrier, 2, "tree", false),
                (Op::AllReduce, 3, "ring", true)
            ]
        );
    }
}

#[test]
fn ranks_with_different_cluster_specs_both_fail_saying_the_specs_differ() {
    let (mut listeners, addresses) = listeners(2);
    let options = |cluster| TcpOptions {
        cluster,
        rendezvous_timeout: Duration::from_secs(2),
        ..TcpOptions::default()
    };
    let (a0, o0, l0) = (
        addresses.clone(),
        options(fresh_cluster()),
        listeners.remove(0),
    );
    let rank0 = thread::spawn(move || TcpTransport::connect_on(l0, 0, &a0, &o0));
    let rank1 = TcpTransport::connect_on(
        listeners.remove(0),
        1,
        &addresses,
        &options(fresh_cluster()),
    );
    let errors =
        [rank0.join().unwrap().err().unwrap(), rank1.err().unwrap()].map(|e| e.to_string());
    assert!(errors[0].contains("cluster specs differ"), "{}", errors[0]);
    assert!(
        errors[1].contains("did not connect") && errors[1].contains("cluster spec differs"),
        "{}",
        errors[1]
    );
}
