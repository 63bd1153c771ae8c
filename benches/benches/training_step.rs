//! One training step — forward, backward, gradient gather and Adam update — of the tutorial
//! CNN (batch 64; as a `Sequential` model and written with the functional API), the CNN with
//! batch normalization after each convolution (batch 64) and the Keras
//! guide's MLP (batch 32), in examples per second, on 1 and 2 threads.
//!
//! `cargo bench -p lockstep-benches --features bench --bench training_step`

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use lockstep_data::mnist::Mnist;
use lockstep_nn::{
    Adam, ForwardContext, Network, Optimizer, Reduction, SparseCategoricalCrossentropy, models,
};
use lockstep_tensor::Tensor;

fn cnn() -> Network {
    models::mnist_cnn(0).expect("cnn").into()
}

fn functional_cnn() -> Network {
    models::mnist_cnn_functional(0).expect("functional cnn")
}

fn cnn_batch_norm() -> Network {
    models::cnn_batch_norm(0, false).expect("cnn with batch normalization")
}

fn mlp() -> Network {
    models::mnist_mlp(0).expect("mlp").into()
}

/// The first `batch` training images, scaled, shaped for the model, and their labels.
fn batch(mnist: &Mnist, batch: usize, shape: &[usize]) -> (Tensor, Vec<usize>) {
    let pixels: Vec<f32> = mnist
        .train
        .images
        .iter()
        .take(batch * 784)
        .map(|&p| f32::from(p) / 255.0)
        .collect();
    let labels = mnist
        .train
        .labels
        .iter()
        .take(batch)
        .map(|&l| usize::from(l))
        .collect();
    (Tensor::from_vec(pixels, shape).expect("batch"), labels)
}

fn step(
    model: &mut Network,
    adam: &mut Adam,
    grads: &mut [f32],
    x: &Tensor,
    labels: &[usize],
    step: u64,
) {
    let loss_fn = SparseCategoricalCrossentropy {
        from_logits: true,
        reduction: Reduction::SumOverBatchSize,
    };
    let forward = model
        .forward(x, ForwardContext::training(step, 0))
        .expect("forward");
    let loss = loss_fn.call(&forward.output, labels).expect("loss");
    model
        .gradients(&forward, &loss.backward().expect("backward"), grads)
        .expect("gradients");
    adam.apply(model.parameters_mut().values_mut(), grads)
        .expect("update");
}

/// A caching allocator, as every ML framework ships: tensors of a few MB are allocated and
/// freed every step, and the system allocator returns them to the OS each time (page faults).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn training_step(c: &mut Criterion) {
    let mnist = Mnist::embedded().expect("embedded MNIST");
    let mut group = c.benchmark_group("training_step");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_secs(1));
    for (name, make, size, shape) in [
        (
            "cnn_batch64",
            cnn as fn() -> Network,
            64,
            vec![64, 28, 28, 1],
        ),
        (
            "cnn_functional_batch64",
            functional_cnn,
            64,
            vec![64, 28, 28, 1],
        ),
        (
            "cnn_batch_norm_batch64",
            cnn_batch_norm,
            64,
            vec![64, 28, 28, 1],
        ),
        ("mlp_batch32", mlp, 32, vec![32, 784]),
    ] {
        let (x, labels) = batch(&mnist, size, &shape);
        group.throughput(Throughput::Elements(size as u64));
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("thread pool");
            let mut model = make();
            let mut adam = Adam::default();
            let mut grads = vec![0.0; model.parameters().len()];
            let mut n = 0;
            group.bench_function(BenchmarkId::new(name, format!("{threads}t")), |bench| {
                pool.install(|| {
                    bench.iter(|| {
                        n += 1;
                        step(&mut model, &mut adam, &mut grads, &x, &labels, n);
                    });
                });
            });
        }
    }
    group.finish();
}

criterion_group!(benches, training_step);
criterion_main!(benches);
