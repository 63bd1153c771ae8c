//! A parameter server's update of its shards (`lockstep_ps::ShardStore`), without the
//! network: a push of the tutorial CNN's whole gradient (its four variables' shards, 225,034
//! values), as a worker's step sends it, with Adam, SGD with momentum and plain SGD; and a
//! push of 110 rows of an embedding table's shard (2^19 rows of 16), the rows a batch of the
//! `recommender` example names, with Adam. Criterion's throughput is the gradient's bytes.
//!
//! `cargo bench -p lockstep-benches --features bench --bench parameter_server`

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use lockstep_nn::{Adam, Optimizer, OptimizerConfig, Sgd};
use lockstep_ps::{ShardKey, ShardState, ShardStore};

/// The tutorial CNN's variables as (rows, columns): two convolutions' kernels and biases
/// folded into one shard each, the dense layers' likewise.
const CNN: [(u64, u64); 4] = [(10, 32), (289, 64), (1601, 128), (129, 10)];

fn shard(key: &ShardKey, rows: u64, cols: u64, optimizer: &OptimizerConfig) -> ShardState {
    ShardState {
        key: Some(key.clone()),
        rows,
        cols,
        values: (0..rows * cols).map(|i| (i % 97) as f32 * 1e-3).collect(),
        optimizer: serde_json::to_string(optimizer).expect("an optimizer's settings"),
        iterations: 0,
        slots: Vec::new(),
    }
}

fn dense_push(c: &mut Criterion) {
    let mut group = c.benchmark_group("ps_push_cnn");
    let optimizers = [
        ("adam", Adam::default().config()),
        (
            "sgd_momentum",
            Sgd::with_momentum(0.01, 0.9, false).config(),
        ),
        ("sgd", Sgd::new(0.01).config()),
    ];
    for (name, optimizer) in optimizers {
        let store = ShardStore::new();
        let keys: Vec<ShardKey> = (0..CNN.len())
            .map(|i| ShardKey::new(format!("cnn/{i}"), 0))
            .collect();
        for (key, &(rows, cols)) in keys.iter().zip(&CNN) {
            store
                .create(&shard(key, rows, cols, &optimizer))
                .expect("a shard");
        }
        let len: u64 = CNN.iter().map(|(r, c)| r * c).sum();
        let gradient: Vec<f32> = (0..len).map(|i| (i % 13) as f32 * 1e-4 - 6e-4).collect();
        group.throughput(Throughput::Bytes(len * 4));
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| store.push_shards(&keys, &gradient).expect("a push"));
        });
    }
    group.finish();
}

fn sparse_push(c: &mut Criterion) {
    let mut group = c.benchmark_group("ps_push_rows");
    let (rows, cols) = (1_u64 << 19, 16_u64);
    let key = ShardKey::new("embedding/embeddings", 0);
    let store = ShardStore::new();
    store
        .create(&shard(&key, rows, cols, &Adam::default().config()))
        .expect("a shard");
    // 110 rows spread over the table, as a batch names them.
    let named: Vec<u64> = (0..110_u64).map(|i| (i * 4_767) % rows).collect();
    let gradient = vec![1e-3_f32; named.len() * cols as usize];
    group.throughput(Throughput::Bytes(gradient.len() as u64 * 4));
    group.bench_function(BenchmarkId::from_parameter("adam_110_rows"), |b| {
        b.iter(|| store.push_rows(&key, &named, &gradient).expect("a push"));
    });
    group.finish();
}

criterion_group!(benches, dense_push, sparse_push);
criterion_main!(benches);
