//! SGEMM throughput (GFLOP/s) at square sizes and at the im2col shapes of the tutorial CNN,
//! on 1 and 2 threads, with the machine's peak (a loop of independent fused multiply-adds) and
//! ndarray's own product beside it for same-run ratios; the tutorial CNN's second convolution
//! (Winograd), its two convolutions with their max pooling (fused, and apart) and its first
//! dense layer, forward, and forward with the gradients.
//!
//! `cargo bench -p lockstep-benches --features bench --bench kernels`

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use lockstep_tensor::Tensor;
use lockstep_tensor::kernels::gemm::{MatRef, matmul};
use lockstep_tensor::ops::{self, MaxPool, Padding};
use ndarray::Array2;
use rayon::prelude::*;

/// As in the training-step bench: a caching allocator, so page faults on the layers' buffers
/// do not swamp the kernels (every ML framework ships one).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool")
}

fn operands(m: usize, k: usize, n: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let a = (0..m * k).map(|i| ((i * 7) % 13) as f32 * 0.1).collect();
    let b = (0..k * n).map(|i| ((i * 5) % 11) as f32 * 0.1).collect();
    (a, b, vec![0.0; m * n])
}

/// Independent accumulators in [`fma_chains`]: more than an FMA's latency times the units
/// that run them (4 cycles × 2 on current x86 cores), so none waits on its last result.
const CHAINS: usize = 12;

/// Steps of [`fma_chains`].
const STEPS: usize = 1 << 16;

/// FLOPs of one [`fma_chains`] call: a multiply and an add per lane per step.
const PEAK_FLOPS: usize = 2 * 8 * CHAINS * STEPS;

/// [`CHAINS`] vectors of 8 lanes, each stepped [`STEPS`] times by a fused multiply-add, with no
/// memory traffic: the most FLOPs a core can do with the vectors the kernels use (AVX2, or
/// AVX-512 on a core that runs it at half rate, as Zen 4 does).
/// Compiled for AVX2 + FMA where the CPU has them, as the kernels are.
#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
fn fma_chains(seed: f32) -> f32 {
    let mut acc = [[seed; 8]; CHAINS];
    let (scale, step) = (0.999_9_f32, 1e-4_f32);
    for _ in 0..STEPS {
        for a in &mut acc {
            for lane in a.iter_mut() {
                *lane = lane.mul_add(scale, step);
            }
        }
    }
    acc.iter().flatten().sum()
}

fn sgemm(c: &mut Criterion) {
    // (name, m, k, n): squares, then conv1 and conv2 of the CNN at batch 64, forward and the
    // kernel gradient (colsᵀ · d_out), and the input gradient of conv2 (d_out · kernelᵀ).
    let shapes = [
        ("square_256", 256, 256, 256),
        ("square_512", 512, 512, 512),
        ("square_1024", 1024, 1024, 1024),
        ("conv1_fwd_43264x9x32", 43_264, 9, 32),
        ("conv2_fwd_7744x288x64", 7744, 288, 64),
        ("conv2_kernel_grad_288x7744x64", 288, 7744, 64),
        ("conv2_input_grad_7744x64x288", 7744, 64, 288),
    ];
    let mut group = c.benchmark_group("sgemm");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for threads in [1, 2] {
        let pool = pool(threads);
        for &(name, m, k, n) in &shapes {
            let (a, b, mut out) = operands(m, k, n);
            group.throughput(Throughput::Elements((2 * m * k * n) as u64));
            group.bench_function(BenchmarkId::new(name, format!("{threads}t")), |bench| {
                pool.install(|| {
                    bench.iter(|| {
                        let lhs = MatRef {
                            data: &a,
                            rows: m,
                            cols: k,
                            transposed: false,
                        };
                        let rhs = MatRef {
                            data: &b,
                            rows: k,
                            cols: n,
                            transposed: false,
                        };
                        matmul(black_box(&mut out), lhs, rhs, false).expect("operands fit");
                    });
                });
            });
        }
    }
    // The yardstick: the machine's peak, as independent fused multiply-adds reach it.
    for threads in [1, 2] {
        let pool = pool(threads);
        group.throughput(Throughput::Elements((PEAK_FLOPS * threads) as u64));
        group.bench_function(
            BenchmarkId::new("peak_fma", format!("{threads}t")),
            |bench| {
                pool.install(|| {
                    bench.iter(|| {
                        (0..threads)
                            .into_par_iter()
                            .map(|t| fma_chains(black_box(t as f32)))
                            .sum::<f32>()
                    });
                });
            },
        );
    }
    // The reference: ndarray's `dot` (matrixmultiply, one thread).
    let a = Array2::from_shape_fn((512, 512), |(i, j)| ((i * 7 + j) % 13) as f32 * 0.1);
    group.throughput(Throughput::Elements(2 * 512 * 512 * 512));
    group.bench_function(BenchmarkId::new("ndarray_dot_square_512", "1t"), |bench| {
        bench.iter(|| black_box(a.dot(&a)));
    });
    group.finish();
}

/// Values in [-0.6, 0.6).
fn values(len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7) % 13) as f32 * 0.1 - 0.6)
        .collect()
}

/// A loss whose own cost is negligible beside a layer's: the sum of `y` as a product with a
/// vector of ones (its backward is one outer product).
fn sum_loss(y: &Tensor) -> Tensor {
    let outputs = y.len();
    let ones = Tensor::from_vec(vec![1.0; outputs], &[outputs, 1]).expect("ones");
    let row = ops::reshape(y, &[1, outputs]).expect("reshape");
    ops::matmul(&row, &ones).expect("matmul")
}

/// `layer` forward, and forward with its gradients, on 1 and 2 threads; `flops` is the
/// forward's count, the backward's taken as twice it.
fn bench_layer(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    flops: u64,
    layer: &(dyn Fn() -> Tensor + Sync),
) {
    for threads in [1, 2] {
        let pool = pool(threads);
        group.throughput(Throughput::Elements(flops));
        group.bench_function(
            BenchmarkId::new(format!("{name}_forward"), format!("{threads}t")),
            |bench| {
                pool.install(|| bench.iter(|| black_box(layer())));
            },
        );
        group.throughput(Throughput::Elements(3 * flops));
        group.bench_function(
            BenchmarkId::new(format!("{name}_forward_backward"), format!("{threads}t")),
            |bench| {
                pool.install(|| {
                    bench.iter(|| black_box(sum_loss(&layer()).backward().expect("backward")));
                });
            },
        );
    }
}

/// `relu(conv2d(x, kernel) + bias)` at the CNN's second layer, batch 64: `[64, 13, 13, 32]`
/// into 64 filters. Throughput counts the direct method's multiply-adds (×2 for FLOPs; ×3 for
/// the forward and both gradients), so Winograd's saving shows as more than the GEMM's peak.
fn conv2d(c: &mut Criterion) {
    let x = Tensor::parameter(values(64 * 13 * 13 * 32), &[64, 13, 13, 32]).expect("x");
    let kernel = Tensor::parameter(values(3 * 3 * 32 * 64), &[3, 3, 32, 64]).expect("kernel");
    let bias = Tensor::parameter(values(64), &[64]).expect("bias");
    let mut group = c.benchmark_group("conv2d");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    bench_layer(&mut group, "conv2", 2 * 64 * 11 * 11 * 64 * 288, &|| {
        ops::conv2d_bias_relu(&x, &kernel, Some(&bias), true, (1, 1), Padding::Valid)
            .expect("conv2d")
    });
    group.finish();
}

/// The CNN's two convolutions with their pooling, batch 64: `[64, 28, 28, 1]` through 32 3×3
/// filters and relu, max-pooled 2×2 to `[64, 13, 13, 32]`; then through 64 filters to
/// `[64, 5, 5, 64]`; fused, and as the two operations apart. Throughput counts the
/// convolution's direct multiply-adds (×2 for FLOPs).
fn conv2d_max_pool(c: &mut Criterion) {
    let x = Tensor::from_vec(values(64 * 28 * 28), &[64, 28, 28, 1]).expect("x");
    let kernel = Tensor::parameter(values(3 * 3 * 32), &[3, 3, 1, 32]).expect("kernel");
    let bias = Tensor::parameter(values(32), &[32]).expect("bias");
    let pool = MaxPool {
        size: (2, 2),
        stride: (2, 2),
        padding: Padding::Valid,
    };
    let flops = 2 * 64 * 26 * 26 * 32 * 9;
    let mut group = c.benchmark_group("conv2d_max_pool");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    bench_layer(&mut group, "conv1_pool_fused", flops, &|| {
        ops::conv2d_bias_relu_max_pool(&x, &kernel, Some(&bias), true, (1, 1), Padding::Valid, pool)
            .expect("fused")
    });
    bench_layer(&mut group, "conv1_pool_apart", flops, &|| {
        let y = ops::conv2d_bias_relu(&x, &kernel, Some(&bias), true, (1, 1), Padding::Valid)
            .expect("conv2d");
        ops::max_pool2d(&y, pool.size, pool.stride, pool.padding).expect("max_pool2d")
    });
    // The same first layer in the CNN with batch normalization: no bias, the normalization (a
    // training pass), relu and the pooling after it; folded into one pass, and apart (the
    // convolution, then the normalization, relu and pooling as one pass).
    let gamma = Tensor::parameter(vec![1.0; 32], &[32]).expect("gamma");
    let beta = Tensor::parameter(vec![0.0; 32], &[32]).expect("beta");
    let normalization = ops::Affine {
        gamma: Some(&gamma),
        beta: Some(&beta),
    };
    bench_layer(&mut group, "conv1_batch_norm_pool_fused", flops, &|| {
        let conv = ((1, 1), Padding::Valid);
        ops::conv2d_batch_norm_max_pool(
            &x,
            (&kernel, None),
            conv,
            normalization,
            1e-3,
            None,
            true,
            pool,
        )
        .expect("conv2d_batch_norm_max_pool")
        .0
    });
    bench_layer(&mut group, "conv1_batch_norm_pool_apart", flops, &|| {
        let y = ops::conv2d_bias_relu(&x, &kernel, None, false, (1, 1), Padding::Valid)
            .expect("conv2d");
        ops::batch_norm_max_pool(&y, normalization, 1e-3, None, true, pool)
            .expect("batch_norm_max_pool")
            .0
    });
    // The second layer and its pooling: Winograd tiles pooled as they are transformed back.
    let x = Tensor::parameter(values(64 * 13 * 13 * 32), &[64, 13, 13, 32]).expect("x");
    let kernel = Tensor::parameter(values(3 * 3 * 32 * 64), &[3, 3, 32, 64]).expect("kernel");
    let bias = Tensor::parameter(values(64), &[64]).expect("bias");
    let flops = 2 * 64 * 11 * 11 * 64 * 288;
    bench_layer(&mut group, "conv2_pool_fused", flops, &|| {
        ops::conv2d_bias_relu_max_pool(&x, &kernel, Some(&bias), true, (1, 1), Padding::Valid, pool)
            .expect("fused")
    });
    bench_layer(&mut group, "conv2_pool_apart", flops, &|| {
        let y = ops::conv2d_bias_relu(&x, &kernel, Some(&bias), true, (1, 1), Padding::Valid)
            .expect("conv2d");
        ops::max_pool2d(&y, pool.size, pool.stride, pool.padding).expect("max_pool2d")
    });
    group.finish();
}

/// The CNN's first dense layer, batch 64: `[64, 1600]` through 128 units with bias and relu (the
/// input wants a gradient, as a hidden layer's does).
fn dense(c: &mut Criterion) {
    let x = Tensor::parameter(values(64 * 1600), &[64, 1600]).expect("x");
    let kernel = Tensor::parameter(values(1600 * 128), &[1600, 128]).expect("kernel");
    let bias = Tensor::parameter(values(128), &[128]).expect("bias");
    let mut group = c.benchmark_group("dense");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    bench_layer(&mut group, "dense1600x128", 2 * 64 * 1600 * 128, &|| {
        ops::dense(&x, &kernel, Some(&bias), true).expect("dense")
    });
    group.finish();
}

criterion_group!(benches, sgemm, conv2d, conv2d_max_pool, dense);
criterion_main!(benches);
