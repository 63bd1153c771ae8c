//! One conformance suite, stamped over every transport × algorithm: results equal a sequential
//! reduction (within rounding for sums, exactly for max/min), for world sizes 1–8 and random
//! lengths, every collective and element type, bit-identical from run to run.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use crate::common::{Wire, run};
use lockstep_collective::{CommunicationOptions, Implementation, ReduceOp, bf16, f16};
use proptest::prelude::*;

/// Rank `r`'s input: distinct per rank and position, exactly representable.
fn input(rank: usize, len: usize, seed: u64) -> Vec<f32> {
    (0..len)
        .map(|i| (((i as u64 * 31 + rank as u64 * 17 + seed) % 97) as f32 - 48.0) / 8.0)
        .collect()
}

fn reference(n: usize, len: usize, seed: u64, op: ReduceOp) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let values = (0..n).map(|r| input(r, len, seed)[i]);
            match op {
                ReduceOp::Sum => values.sum(),
                ReduceOp::Mean => values.sum::<f32>() / n as f32,
                ReduceOp::Max => values.fold(f32::NEG_INFINITY, f32::max),
                ReduceOp::Min => values.fold(f32::INFINITY, f32::min),
            }
        })
        .collect()
}

fn options(implementation: Implementation, bytes_per_pack: usize) -> CommunicationOptions {
    CommunicationOptions {
        implementation,
        bytes_per_pack,
        timeout: std::time::Duration::from_secs(20),
        ..CommunicationOptions::default()
    }
}

macro_rules! conformance {
    ($name:ident, $wire:expr, $implementation:expr) => {
        mod $name {
            use super::*;

            const WIRE: Wire = $wire;
            const IMPLEMENTATION: Implementation = $implementation;

            proptest! {
                #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

                #[test]
                fn all_reduce_equals_a_sequential_reduction(
                    n in 1..=8_usize, len in 0..300_usize, seed: u64, op_index in 0..4_usize, pack in prop_oneof![Just(16_usize), Just(1 << 20)],
                ) {
                    let op = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min][op_index];
                    let expected = reference(n, len, seed, op);
                    let results = run(WIRE, n, options(IMPLEMENTATION, pack), move |comm| {
                        let mut data = input(comm.rank(), len, seed);
                        comm.all_reduce(&mut data, op).unwrap();
                        data
                    });
                    for (rank, result) in results.iter().enumerate() {
                        prop_assert_eq!(result, &results[0], "rank {} differs from rank 0", rank);
                        for (got, want) in result.iter().zip(&expected) {
                            let tolerance = if matches!(op, ReduceOp::Max | ReduceOp::Min) { 0.0 } else { 1e-4 * (1.0 + want.abs()) };
                            prop_assert!((got - want).abs() <= tolerance, "{} vs {}", got, want);
                        }
                    }
                }

                #[test]
                fn results_are_bit_identical_from_run_to_run(n in 2..=6_usize, len in 1..500_usize, seed: u64) {
                    let once = || run(WIRE, n, options(IMPLEMENTATION, 64), move |comm| {
                        let mut data: Vec<f32> = input(comm.rank(), len, seed).iter().map(|v| v * 0.1 + 1e-3).collect();
                        comm.all_reduce(&mut data, ReduceOp::Sum).unwrap();
                        data.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                    });
                    prop_assert_eq!(once(), once());
                }

                /// Waits that may not spin (a step's packs beside its backward pass) sleep until
                /// a frame is whole where the transport can: frames of many segments, ranks
                /// that come late, and several collectives in a row still give the same sums.
                #[test]
                fn waits_that_may_not_spin_give_the_same_sums(
                    n in 2..=4_usize, len in 20_000..200_000_usize, seed: u64, late_pick: usize, pack in prop_oneof![Just(64_usize << 10), Just(1 << 20)],
                ) {
                    let late = late_pick % n;
                    let inputs: Vec<Vec<f32>> = (0..n).map(|rank| input(rank, len, seed)).collect();
                    let expected: Vec<f32> = (0..len).map(|i| inputs.iter().map(|x| x[i]).sum()).collect();
                    let results = run(WIRE, n, options(IMPLEMENTATION, pack), move |comm| {
                        comm.set_spinning(false);
                        let mut rounds = Vec::new();
                        for _ in 0..2 {
                            if comm.rank() == late {
                                std::thread::sleep(std::time::Duration::from_millis(10));
                            }
                            let mut data = input(comm.rank(), len, seed);
                            comm.all_reduce(&mut data, ReduceOp::Sum).unwrap();
                            rounds.push(data);
                        }
                        rounds
                    });
                    for (rank, rounds) in results.iter().enumerate() {
                        for result in rounds {
                            prop_assert_eq!(result, &results[0][0], "rank {} differs from rank 0", rank);
                        }
                    }
                    for (got, want) in results[0][0].iter().zip(&expected) {
                        prop_assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()), "{} vs {}", got, want);
                    }
                }

                #[test]
                fn f64_bf16_and_f16_reduce_too(n in 1..=5_usize, len in 0..100_usize) {
                    let results = run(WIRE, n, options(IMPLEMENTATION, 32), move |comm| {
                        let mut doubles: Vec<f64> = (0..len).map(|i| (i + comm.rank()) as f64).collect();
                        comm.all_reduce(&mut doubles, ReduceOp::Sum).unwrap();
                        let mut halves: Vec<bf16> = (0..len).map(|i| bf16::from_f32((i % 7) as f32)).collect();
                        comm.all_reduce(&mut halves, ReduceOp::Max).unwrap();
                        // Small whole numbers: every partial sum is exact in half precision.
                        let mut ieee: Vec<f16> = (0..len).map(|i| f16::from_f32((i % 5 + comm.rank()) as f32)).collect();
                        comm.all_reduce(&mut ieee, ReduceOp::Sum).unwrap();
                        (doubles, halves, ieee)
                    });
                    let sum_of_ranks = (n * (n - 1) / 2) as f64;
                    for (doubles, halves, ieee) in results {
                        for (i, ((d, h), e)) in doubles.iter().zip(&halves).zip(&ieee).enumerate() {
                            prop_assert_eq!(*d, (i * n) as f64 + sum_of_ranks);
                            prop_assert_eq!(h.to_f32(), (i % 7) as f32);
                            prop_assert_eq!(f64::from(e.to_f32()), ((i % 5) * n) as f64 + sum_of_ranks);
                        }
                    }
                }

                #[test]
                fn reduce_scatter_all_gather_and_broadcast_agree_with_their_definitions(n in 1..=6_usize, block in 0..40_usize, root_pick: usize, seed: u64) {
                    let root = root_pick % n;
                    let results = run(WIRE, n, options(IMPLEMENTATION, 24), move |comm| {
                        let rank = comm.rank();
                        let full = input(rank, n * block, seed);
                        let mut scattered = vec![0.0_f32; block];
                        comm.reduce_scatter(&full, &mut scattered, ReduceOp::Sum).unwrap();
                        let mut gathered = vec![0.0_f32; n * block];
                        comm.all_gather(&scattered, &mut gathered).unwrap();
                        let mut shared = if rank == root { input(99, block, seed) } else { vec![0.0; block] };
                        comm.broadcast(&mut shared, root).unwrap();
                        comm.barrier().unwrap();
                        (scattered, gathered, shared)
                    });
                    let expected = reference(n, n * block, seed, ReduceOp::Sum);
                    for (rank, (scattered, gathered, shared)) in results.iter().enumerate() {
                        for (got, want) in scattered.iter().zip(&expected[rank * block..(rank + 1) * block]) {
                            prop_assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()));
                        }
                        prop_assert_eq!(gathered, &results[0].1, "all-gather differs on rank {}", rank);
                        prop_assert_eq!(shared, &input(99, block, seed));
                    }
                    let concatenated: Vec<f32> = results.iter().flat_map(|r| r.0.clone()).collect();
                    prop_assert_eq!(&results[0].1, &concatenated);
                }
            }
        }
    };
}

conformance!(local_ring, Wire::Local, Implementation::Ring);
conformance!(local_tree, Wire::Local, Implementation::Tree);
conformance!(local_auto, Wire::Local, Implementation::Auto);
conformance!(shared_memory, Wire::Shared, Implementation::Auto);
conformance!(tcp_ring, Wire::Tcp, Implementation::Ring);
conformance!(tcp_tree, Wire::Tcp, Implementation::Tree);
conformance!(tcp_auto, Wire::Tcp, Implementation::Auto);
conformance!(tcp_unix_ring, Wire::TcpUnix, Implementation::Ring);
conformance!(tcp_unix_tree, Wire::TcpUnix, Implementation::Tree);
conformance!(tcp_loopback_ring, Wire::TcpLoopback, Implementation::Ring);
conformance!(tcp_loopback_tree, Wire::TcpLoopback, Implementation::Tree);
conformance!(grpc_ring, Wire::Grpc, Implementation::Ring);
conformance!(grpc_tree, Wire::Grpc, Implementation::Tree);
