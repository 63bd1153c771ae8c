//! The MNIST input pipeline of the tutorials — `map(scale) → cache → shuffle → batch(64) →
//! prefetch` — in images per second, so we know training steps never wait for data.
//!
//! `taskset -c 0 cargo bench -p lockstep-benches --features bench --bench data_pipeline` pins it to one core.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use lockstep_data::mnist::{Mnist, scale};
use lockstep_data::{AutoShardPolicy, Dataset, InputContext, distribute};

fn drain<D: Dataset>(ds: &D, epoch: u64) -> usize {
    let mut n = 0;
    for item in ds.iter_epoch(epoch).expect("pipeline starts") {
        black_box(item.expect("pipeline element"));
        n += 1;
    }
    n
}

fn pipeline(c: &mut Criterion) {
    let mnist = Mnist::embedded().expect("embedded MNIST");
    let images = mnist.train.len() as u64;
    let source = mnist.train.dataset().expect("dataset");

    let mut group = c.benchmark_group("mnist_pipeline");
    group
        .throughput(Throughput::Elements(images))
        .sample_size(20)
        .measurement_time(Duration::from_secs(6));

    // Shared (reference-counted) images: a cache replay clones a pointer, not 3 KiB of pixels.
    let cached = source
        .clone()
        .map(|(x, y)| (scale(&x).into_shared(), y))
        .cache();
    drain(&cached, 0); // fill the cache once, as the first epoch does
    let from_cache = cached
        .clone()
        .shuffle(10_000, 7, true)
        .batch(64, false)
        .prefetch(2);
    let mut epoch = 0;
    group.bench_function("cached_shuffle_batch64_prefetch", |b| {
        b.iter(|| {
            epoch += 1;
            drain(&from_cache, epoch)
        });
    });

    let owned = source.clone().map(|(x, y)| (scale(&x), y)).cache();
    drain(&owned, 0);
    let owned_from_cache = owned.shuffle(10_000, 7, true).batch(64, false).prefetch(2);
    group.bench_function("cached_owned_arrays_shuffle_batch64_prefetch", |b| {
        b.iter(|| {
            epoch += 1;
            drain(&owned_from_cache, epoch)
        });
    });

    let unprefetched = cached.clone().shuffle(10_000, 7, true).batch(64, false);
    group.bench_function("cached_shuffle_batch64", |b| {
        b.iter(|| {
            epoch += 1;
            drain(&unprefetched, epoch)
        });
    });

    let uncached = source
        .map(|(x, y)| (scale(&x), y))
        .shuffle(10_000, 7, true)
        .batch(64, false)
        .prefetch(2);
    group.bench_function("scale_shuffle_batch64_prefetch_uncached", |b| {
        b.iter(|| {
            epoch += 1;
            drain(&uncached, epoch)
        });
    });

    let ctx = InputContext::new(2, 0, 2).expect("context");
    let distributed = distribute(
        cached.shuffle(10_000, 7, true),
        128,
        &ctx,
        AutoShardPolicy::Data,
    )
    .expect("distribute")
    .prefetch(2);
    group.throughput(Throughput::Elements(images / 2));
    group.bench_function("cached_shuffle_distribute_worker0_of_2", |b| {
        b.iter(|| {
            epoch += 1;
            drain(&distributed, epoch)
        });
    });
    group.finish();
}

criterion_group!(benches, pipeline);
criterion_main!(benches);
