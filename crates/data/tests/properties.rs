//! Property tests of the pipeline's promises: sharding partitions, shuffling permutes,
//! batching keeps every element once, order survives parallel map and prefetch, and a
//! restored iterator continues exactly where the saved one stood.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::collections::HashSet;

use lockstep_data::mnist::read_idx;
use lockstep_data::{AutoShardPolicy, Dataset, Element, InputContext, distribute, from_vec};
use proptest::prelude::*;

fn collect<D: Dataset>(ds: &D) -> Vec<D::Item> {
    ds.iter().unwrap().collect::<Result<Vec<_>, _>>().unwrap()
}

fn collect_epoch<D: Dataset>(ds: &D, epoch: u64) -> Vec<D::Item> {
    ds.iter_epoch(epoch)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
}

/// Takes `stop` elements, saves the state, and checks that a restored iterator yields the
/// rest exactly as the original does.
fn check_resume<D>(ds: &D, epoch: u64, stop: usize) -> Result<(), TestCaseError>
where
    D: Dataset,
    D::Item: PartialEq + std::fmt::Debug,
{
    let mut original = ds.iter_epoch(epoch).unwrap();
    for _ in 0..stop {
        if original.next().is_none() {
            break;
        }
    }
    let state = original.state();
    let rest: Vec<_> = original.map(Result::unwrap).collect();
    let resumed: Vec<_> = ds.iter_from(&state).unwrap().map(Result::unwrap).collect();
    prop_assert_eq!(resumed, rest);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn shards_are_disjoint_and_cover_the_data(n in 0..300_u32, num in 1..9_usize) {
        let ds = from_vec((0..n).collect());
        let mut seen = HashSet::new();
        for index in 0..num {
            let shard = ds.clone().shard(num, index).unwrap();
            let items = collect(&shard);
            prop_assert_eq!(Some(items.len() as u64), shard.cardinality().finite());
            for item in items {
                prop_assert!(seen.insert(item), "element {} is in two shards", item);
                prop_assert_eq!(item as usize % num, index);
            }
        }
        prop_assert_eq!(seen.len(), n as usize);
    }

    #[test]
    fn shuffle_is_a_seeded_permutation_that_changes_per_epoch(n in 8..300_u32, buffer in 1..400_usize, seed: u64) {
        let ds = from_vec((0..n).collect()).shuffle(buffer, seed, true);
        let first = collect_epoch(&ds, 0);
        let mut sorted = first.clone();
        sorted.sort_unstable();
        prop_assert_eq!(sorted, (0..n).collect::<Vec<_>>());
        prop_assert_eq!(&collect_epoch(&ds, 0), &first, "same seed and epoch, same order");
        if buffer > 1 {
            prop_assert_ne!(&collect_epoch(&ds, 1), &first, "a new epoch reshuffles");
        }
        let fixed = from_vec((0..n).collect()).shuffle(buffer, seed, false);
        prop_assert_eq!(collect_epoch(&fixed, 0), collect_epoch(&fixed, 5));
    }

    #[test]
    fn batching_keeps_every_element_once(n in 0..300_u32, size in 1..40_usize, drop_remainder: bool) {
        let ds = from_vec((0..n).collect()).batch(size, drop_remainder);
        let batches = collect(&ds);
        prop_assert_eq!(Some(batches.len() as u64), ds.cardinality().finite());
        let flat: Vec<u32> = batches.iter().flat_map(|b| b.iter().copied()).collect();
        let kept = if drop_remainder { (n as usize / size) * size } else { n as usize };
        prop_assert_eq!(flat, (0..kept as u32).collect::<Vec<_>>());
        prop_assert!(batches.iter().all(|b| b.len() == size || (!drop_remainder && b.len() < size)));
    }

    #[test]
    fn parallel_map_and_prefetch_preserve_order(n in 0..2000_u32, buffer in 0..8_usize) {
        let ds = from_vec((0..n).collect()).map(|x| u64::from(x) * 3 + 1).prefetch(buffer);
        let expected: Vec<u64> = (0..n).map(|x| u64::from(x) * 3 + 1).collect();
        prop_assert_eq!(collect(&ds), expected);
    }

    #[test]
    fn repeat_yields_count_passes_each_reshuffled(n in 1..50_u32, count in 0..5_u64, seed: u64) {
        let ds = from_vec((0..n).collect()).shuffle(64, seed, true).repeat(Some(count));
        let items = collect(&ds);
        prop_assert_eq!(items.len() as u64, u64::from(n) * count);
        for (rep, pass) in items.chunks(n as usize).enumerate() {
            let inner = from_vec((0..n).collect()).shuffle(64, seed, true);
            let expected = collect_epoch(&inner, rep as u64);
            prop_assert_eq!(pass, expected.as_slice());
        }
    }

    #[test]
    fn a_restored_shuffled_batched_repeated_pipeline_continues_exactly(
        n in 1..200_u32, batch in 1..17_usize, seed: u64, stop in 0..100_usize, epoch in 0..4_u64, buffer in 0..4_usize,
    ) {
        let ds = from_vec((0..n).collect())
            .map(|x| x * 2)
            .shuffle(50, seed, true)
            .batch(batch, false)
            .repeat(Some(3))
            .prefetch(buffer);
        check_resume(&ds, epoch, stop)?;
    }

    #[test]
    fn a_restored_pipeline_with_filter_shard_cache_and_take_continues_exactly(
        n in 0..300_u32, shards in 1..4_usize, seed: u64, stop in 0..200_usize, take in 0..250_u64,
    ) {
        let ds = from_vec((0..n).collect())
            .filter(|x| x % 3 != 0)
            .shard(shards, shards - 1).unwrap()
            .cache()
            .shuffle(7, seed, true)
            .enumerate()
            .skip(2)
            .take(take)
            .repeat(None)
            .take(400);
        check_resume(&ds, 1, stop)?;
        // A second pass reads the filled cache: still the same.
        check_resume(&ds, 2, stop)?;
    }

    #[test]
    fn a_restored_zip_continues_exactly(n in 0..100_u32, m in 0..100_u32, stop in 0..120_usize) {
        let ds = from_vec((0..n).collect()).zip(from_vec((0..m).map(u64::from).collect()).shuffle(10, 1, true));
        check_resume(&ds, 3, stop)?;
    }

    #[test]
    fn data_sharding_gives_every_worker_the_same_steps_and_covers_each_global_batch(
        n in 0..400_u32, workers in 1..5_usize, per_replica in 1..9_usize, replicas_per_worker in 1..3_usize,
    ) {
        let replicas = workers * replicas_per_worker;
        let global = per_replica * replicas;
        let ds = from_vec((0..n).collect());
        let mut per_worker_steps = Vec::new();
        for worker in 0..workers {
            let ctx = InputContext::new(workers, worker, replicas).unwrap();
            let steps = collect(&distribute(ds.clone(), global, &ctx, AutoShardPolicy::Data).unwrap());
            per_worker_steps.push(steps);
        }
        let expected_steps = n as usize / global;
        for steps in &per_worker_steps {
            prop_assert_eq!(steps.len(), expected_steps);
        }
        for step in 0..expected_steps {
            let mut global_batch: Vec<u32> = per_worker_steps
                .iter()
                .flat_map(|steps| steps[step].iter().flat_map(|b| {
                    assert_eq!(b.len(), per_replica);
                    b.iter().copied()
                }))
                .collect();
            global_batch.sort_unstable();
            let start = (step * global) as u32;
            prop_assert_eq!(global_batch, (start..start + global as u32).collect::<Vec<_>>());
        }
    }

    #[test]
    fn keeping_the_remainder_gives_every_element_to_exactly_one_replica_once(
        n in 0..400_u32, workers in 1..5_usize, per_replica in 1..9_usize, replicas_per_worker in 1..3_usize,
        stop in 0..60_usize,
    ) {
        let replicas = workers * replicas_per_worker;
        let global = per_replica * replicas;
        let ds = from_vec((0..n).collect());
        let mut seen = Vec::new();
        for worker in 0..workers {
            let ctx = InputContext::new(workers, worker, replicas).unwrap();
            let distributed = distribute(ds.clone(), global, &ctx, AutoShardPolicy::Data)
                .unwrap()
                .keep_remainder();
            let steps = collect(&distributed);
            prop_assert_eq!(Some(steps.len() as u64), distributed.cardinality().finite());
            prop_assert!(steps.len() <= (n as usize).div_ceil(global));
            for step in &steps {
                prop_assert!(!step.is_empty() && step.len() <= replicas_per_worker);
                for batch in step {
                    prop_assert!(!batch.is_empty() && batch.len() <= per_replica);
                    seen.extend(batch.iter().copied());
                }
            }
            check_resume(&distributed, 1, stop)?;
        }
        seen.sort_unstable();
        prop_assert_eq!(seen, (0..n).collect::<Vec<_>>());
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let _ = <(ndarray::Array3<f32>, u8)>::decode(&mut bytes.as_slice());
        let _ = <Vec<String>>::decode(&mut bytes.as_slice());
        let _ = read_idx(&bytes, "fuzz".as_ref());
    }

    #[test]
    fn mangled_idx_files_never_panic(cut in 0..800_usize, flip in 0..800_usize, value: u8, gz: bool) {
        let mut bytes = vec![0, 0, 8, 3, 0, 0, 0, 1, 0, 0, 0, 28, 0, 0, 0, 28];
        bytes.extend(std::iter::repeat_n(7_u8, 784));
        if gz {
            use std::io::Write;
            let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            encoder.write_all(&bytes).unwrap();
            bytes = encoder.finish().unwrap();
        }
        if flip < bytes.len() {
            bytes[flip] = value;
        }
        bytes.truncate(cut.max(1));
        let _ = read_idx(&bytes, "fuzz".as_ref());
    }
}
