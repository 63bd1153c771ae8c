//! The two-level all-reduce equals a flat one over all replicas.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::thread;
use std::time::Duration;

use crate::common::{Wire, transports};
use lockstep_collective::{
    CollectiveError, CommunicationOptions, HierarchicalCommunicator, ReduceOp,
};
use proptest::prelude::*;

fn value(rank: usize, i: usize) -> f64 {
    ((rank * 31 + i * 7) % 23) as f64 - 11.0
}

#[test]
fn a_broadcast_reaches_every_replica_and_process_reductions_involve_first_replicas_only() {
    let (processes, replicas) = (3, 2);
    let mut handles = Vec::new();
    for cross in transports(Wire::Tcp, processes) {
        for mut replica in
            HierarchicalCommunicator::group(replicas, cross, CommunicationOptions::default())
        {
            handles.push(thread::spawn(move || {
                let rank = replica.rank();
                let mut data = vec![rank as f32 + 1.0; 5];
                replica.broadcast(&mut data).unwrap();
                let mut count = [1.0_f64];
                let process_sum = replica
                    .all_reduce_processes(&mut count, ReduceOp::Sum)
                    .map(|()| count[0]);
                (rank, data, process_sum)
            }));
        }
    }
    for handle in handles {
        let (rank, data, process_sum) = handle.join().unwrap();
        assert_eq!(data, [1.0; 5], "replica {rank} has replica 0's values");
        if rank % replicas == 0 {
            assert_eq!(process_sum.unwrap(), processes as f64);
        } else {
            let err = process_sum.unwrap_err();
            assert!(err.to_string().contains("not its process's first"), "{err}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, ..ProptestConfig::default() })]

    #[test]
    fn two_levels_reduce_like_one(processes in 1..=3_usize, replicas in 1..=3_usize, len in 0..200_usize, op_index in 0..4_usize, tcp: bool) {
        let op = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min][op_index];
        let wire = if tcp { Wire::Tcp } else { Wire::Local };
        let mut handles = Vec::new();
        for cross in transports(wire, processes) {
            for mut replica in HierarchicalCommunicator::group(replicas, cross, CommunicationOptions::default()) {
                handles.push(thread::spawn(move || {
                    let rank = replica.rank();
                    let mut data: Vec<f64> = (0..len).map(|i| value(rank, i)).collect();
                    replica.all_reduce(&mut data, op).unwrap();
                    (rank, replica.world_size(), data)
                }));
            }
        }
        let n = processes * replicas;
        let mut ranks = Vec::new();
        for handle in handles {
            let (rank, world, data) = handle.join().unwrap();
            prop_assert_eq!(world, n);
            ranks.push(rank);
            for (i, got) in data.iter().enumerate() {
                let values = (0..n).map(|r| value(r, i));
                let want = match op {
                    ReduceOp::Sum => values.sum(),
                    ReduceOp::Mean => values.sum::<f64>() / n as f64,
                    ReduceOp::Max => values.fold(f64::NEG_INFINITY, f64::max),
                    ReduceOp::Min => values.fold(f64::INFINITY, f64::min),
                };
                prop_assert!((got - want).abs() < 1e-9, "rank {} element {}: {} vs {}", rank, i, got, want);
            }
        }
        ranks.sort_unstable();
        prop_assert_eq!(ranks, (0..n).collect::<Vec<_>>());
    }
}

#[test]
fn a_cross_process_failure_reaches_every_local_replica_with_its_cause() {
    let timeout = Duration::from_secs(20);
    let options = CommunicationOptions {
        timeout,
        ..CommunicationOptions::default()
    };
    let mut handles = Vec::new();
    // The two processes disagree about the buffer's length: their cross-process step fails.
    for (process, cross) in transports(Wire::Local, 2).into_iter().enumerate() {
        for mut replica in HierarchicalCommunicator::group(3, cross, options) {
            handles.push(thread::spawn(move || {
                let mut data = vec![1.0_f32; 8 + process];
                (replica.rank(), replica.all_reduce(&mut data, ReduceOp::Sum))
            }));
        }
    }
    for handle in handles {
        let (rank, result) = handle.join().unwrap();
        match result {
            // A leader sees the mismatch, or the other leader's abort over it.
            Err(CollectiveError::Mismatch { .. } | CollectiveError::Aborted { .. })
                if rank % 3 == 0 => {}
            Err(CollectiveError::Aborted {
                origin: 0, reason, ..
            }) if rank % 3 != 0 => {
                assert!(reason.contains("mismatch"), "rank {rank}: {reason}");
            }
            other => panic!("rank {rank}: {other:?}"),
        }
    }
    // Every replica failed with the mismatch or an abort over it, not a timeout: none waited
    // for one.
}
