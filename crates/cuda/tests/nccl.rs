//! NCCL: its sums equal the CPU ring's, and no wait outlives the timeout.
//!
//! Tests that need a GPU are a skip that the log shows without one (`LOCKSTEP_REQUIRE_GPU=1`
//! makes that a failure); those that need two GPUs skip likewise on machines with one.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::time::{Duration, Instant};

use lockstep_collective::{
    CommunicationOptions, Communicator, Implementation, LocalTransport, ReduceOp,
};
use lockstep_cuda::nccl::{self, NcclComm, UniqueId};
use lockstep_cuda::{CudaDevice, CudaError, device_count};
use lockstep_testenv::{Need, available, skip};

/// Every GPU of this machine, or `None` after a visible skip where there is no GPU or no NCCL
/// (a failure under `LOCKSTEP_REQUIRE_GPU=1`), or fewer than `at_least` GPUs (a failure under
/// `LOCKSTEP_REQUIRE_TWO_GPUS=1`: the lent machines have one).
fn gpus(at_least: usize) -> Option<Vec<CudaDevice>> {
    let opened = device_count().and_then(|count| (0..count).map(CudaDevice::open).collect());
    let devices: Vec<CudaDevice> = available(
        Need::Gpu,
        opened
            .and_then(|d| nccl::version().map(|_| d))
            .map_err(|e| format!("no GPU with NCCL: {e}")),
    )?;
    if devices.len() < at_least {
        skip(
            Need::TwoGpus,
            format!("needs {at_least}, this machine has {}", devices.len()),
        );
        return None;
    }
    Some(devices)
}

/// Rank `rank`'s value `i`: sums of these over ranks cancel a good deal, as gradients do.
fn value(rank: usize, i: usize) -> f32 {
    (((i * 7919 + rank * 104_729) % 2001) as f32 / 1000.0 - 1.0) * (1.0 + rank as f32)
}

/// Rank `rank`'s values.
fn values(rank: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| value(rank, i)).collect()
}

/// The sum the CPU ring (lockstep-collective, in process) computes of every rank's values.
fn cpu_ring_sum(ranks: usize, len: usize) -> Vec<f32> {
    let options = CommunicationOptions {
        implementation: Implementation::Ring,
        ..CommunicationOptions::default()
    };
    let mut results: Vec<Vec<f32>> = std::thread::scope(|scope| {
        let handles: Vec<_> = LocalTransport::group(ranks)
            .into_iter()
            .enumerate()
            .map(|(rank, transport)| {
                scope.spawn(move || {
                    let mut data = values(rank, len);
                    Communicator::new(transport, options)
                        .all_reduce(&mut data, ReduceOp::Sum)
                        .unwrap();
                    data
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    results.swap_remove(0)
}

/// NCCL and the ring add the ranks' values in different orders: each sum lies within
/// `(n − 1)·ε·Σ|x|` of any other order's, the bound of a sum of `n` terms in `f32`.
fn assert_within_reduction_order(nccl: &[f32], ring: &[f32], ranks: usize) {
    assert_eq!(nccl.len(), ring.len());
    for (i, (a, b)) in nccl.iter().zip(ring).enumerate() {
        let magnitude: f32 = (0..ranks).map(|r| value(r, i).abs()).sum();
        let bound = (ranks.max(2) - 1) as f32 * f32::EPSILON * magnitude;
        assert!(
            (a - b).abs() <= bound,
            "value {i}: NCCL {a}, ring {b}, bound {bound}"
        );
    }
}

/// A size over a whole number of NCCL's chunks and a ragged one.
const LENGTHS: [usize; 3] = [1, 1_000_003, 4 << 20];

#[test]
fn nccl_says_its_version_where_it_loads_and_every_call_is_an_error_naming_it_where_not() {
    if nccl::available() {
        let (major, minor, patch) = nccl::version().unwrap();
        assert_eq!(major, 2, "NCCL {major}.{minor}.{patch}");
        return;
    }
    let err = nccl::version().unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(
            err,
            CudaError::MissingLibrary {
                library: "libnccl.so.2",
                ..
            }
        ) || matches!(err, CudaError::NotBuilt | CudaError::NoDriver),
        "{text}"
    );
    assert!(UniqueId::new().is_err());
}

#[test]
fn a_unique_id_travels_as_its_bytes() {
    let bytes: [u8; 128] = std::array::from_fn(|i| i as u8);
    assert_eq!(UniqueId::from_bytes(bytes).to_bytes(), bytes);
    assert_eq!(format!("{:?}", UniqueId::from_bytes(bytes)), "UniqueId(..)");
}

#[test]
fn an_all_reduce_of_one_rank_equals_the_cpu_rings() {
    let Some(devices) = gpus(1) else { return };
    let device = &devices[0];
    let (major, minor, patch) = nccl::version().unwrap();
    eprintln!("NCCL {major}.{minor}.{patch} on {}", device.name());
    let mut comm = NcclComm::join(
        device,
        UniqueId::new().unwrap(),
        (0, 1),
        Duration::from_mins(1),
    )
    .unwrap();
    assert_eq!((comm.rank(), comm.world_size()), (0, 1));
    for len in LENGTHS {
        let mut buffer = device.upload(&values(0, len)).unwrap();
        comm.all_reduce_sum(&mut buffer).unwrap();
        assert_eq!(
            buffer.to_host().unwrap(),
            cpu_ring_sum(1, len),
            "{len} values"
        );
    }
    // Part of a buffer, as a pack of the gradients: the rest is untouched.
    let mut buffer = device.upload(&values(0, 100)).unwrap();
    comm.all_reduce_sum_range(&mut buffer, 10..20).unwrap();
    assert_eq!(buffer.to_host().unwrap(), values(0, 100));
    let mut root = device.upload(&[1.0, 2.0]).unwrap();
    comm.broadcast(&mut root, 0).unwrap();
    assert_eq!(root.to_host().unwrap(), [1.0, 2.0]);
}

#[test]
fn an_all_reduce_over_every_local_gpu_equals_the_cpu_rings() {
    let Some(devices) = gpus(1) else { return };
    let ranks = devices.len();
    let mut comms = NcclComm::local_group(&devices, Duration::from_mins(1)).unwrap();
    for len in LENGTHS {
        // One thread per rank, as the replicas of a process call.
        let sums: Vec<Vec<f32>> = std::thread::scope(|scope| {
            let handles: Vec<_> = comms
                .iter_mut()
                .enumerate()
                .map(|(rank, comm)| {
                    scope.spawn(move || {
                        let mut buffer = comm.device().upload(&values(rank, len)).unwrap();
                        comm.all_reduce_sum(&mut buffer).unwrap();
                        buffer.to_host().unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let ring = cpu_ring_sum(ranks, len);
        for sum in &sums {
            assert_within_reduction_order(sum, &ring, ranks);
            // Every rank holds the same bits.
            assert_eq!(sum, &sums[0]);
        }
    }
}

#[test]
fn a_rank_that_never_joins_ends_the_join_with_a_timeout_error() {
    let Some(devices) = gpus(1) else { return };
    let timeout = Duration::from_secs(3);
    let started = Instant::now();
    let err = NcclComm::join(&devices[0], UniqueId::new().unwrap(), (0, 2), timeout).unwrap_err();
    let waited = started.elapsed();
    eprintln!("a rank that never joins: {err} after {waited:?} (timeout {timeout:?})");
    assert!(
        matches!(
            err,
            CudaError::CollectiveTimeout {
                rank: 0,
                world_size: 2,
                ..
            }
        ),
        "{err}"
    );
    // Bounded: the timeout and the abort, not NCCL's own wait (which has none).
    assert!(
        waited < timeout + Duration::from_secs(30),
        "waited {waited:?}"
    );
}

#[test]
fn a_peer_the_side_channel_sees_gone_ends_the_wait_within_seconds_naming_it() {
    let Some(devices) = gpus(1) else { return };
    // Rank 1 never joins; its process is gone, which the side channel (the cluster's TCP
    // connection to it, here a stand-in) tells after 200 ms, long before the timeout.
    let timeout = Duration::from_mins(10);
    let started = Instant::now();
    let peers: nccl::PeerCheck = Box::new(move || {
        (started.elapsed() > Duration::from_millis(200))
            .then(|| (1, "connection closed".to_owned()))
    });
    let err = NcclComm::join_watched(
        &devices[0],
        UniqueId::new().unwrap(),
        (0, 2),
        timeout,
        Some(peers),
    )
    .unwrap_err();
    assert!(
        matches!(&err, CudaError::PeerLost { rank: 0, peer: 1, why, .. } if why == "connection closed"),
        "{err}"
    );
    assert!(err.to_string().contains("rank 1 is gone"), "{err}");
    eprintln!("a peer gone: {err} after {:?}", started.elapsed());
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "waited {:?}",
        started.elapsed()
    );
}

#[test]
fn a_rank_that_stops_calling_ends_the_others_collective_with_a_timeout_error() {
    let Some(devices) = gpus(2) else { return };
    let mut comms = NcclComm::local_group(&devices[..2], Duration::from_secs(3)).unwrap();
    let mut buffer = devices[0].upload(&values(0, 1024)).unwrap();
    let started = Instant::now();
    // Rank 1 never calls.
    let err = comms[0].all_reduce_sum(&mut buffer).unwrap_err();
    assert!(
        matches!(err, CudaError::CollectiveTimeout { rank: 0, .. }),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "waited {:?}",
        started.elapsed()
    );
    assert!(
        comms[0].all_reduce_sum(&mut buffer).is_err(),
        "an aborted communicator refuses"
    );
}

#[test]
fn a_buffer_of_another_device_or_a_range_outside_it_is_refused() {
    let Some(devices) = gpus(1) else { return };
    let mut comm = NcclComm::join(
        &devices[0],
        UniqueId::new().unwrap(),
        (0, 1),
        Duration::from_mins(1),
    )
    .unwrap();
    let mut buffer = devices[0].zeros(8).unwrap();
    assert!(matches!(
        comm.all_reduce_sum_range(&mut buffer, 4..9),
        Err(CudaError::Invalid { .. })
    ));
    assert!(matches!(
        comm.broadcast(&mut buffer, 1),
        Err(CudaError::Invalid { .. })
    ));
    if let Some(other) = devices.get(1) {
        let mut elsewhere = other.zeros(8).unwrap();
        assert!(matches!(
            comm.all_reduce_sum(&mut elsewhere),
            Err(CudaError::Invalid { .. })
        ));
    }
    // Refusals do not break the communicator.
    comm.all_reduce_sum(&mut buffer).unwrap();
}
