//! Every GPU operation against a plain CPU reference on random inputs, gradients included.
//! Runs where a GPU is present; elsewhere each test is a skip that the log shows
//! (`LOCKSTEP_REQUIRE_GPU=1`, set by `cargo xtask gpu-check`'s runner, makes it a failure).
//!
//! Tolerances: element-wise arithmetic, relu, bias, the optimizers and the gathers (im2col,
//! col2im, pooling and its gradient) are exact (the kernels compile without fused multiply-add and sum in the CPU's
//! order); `exp`/`log` within `1e-5` relative to the largest finite value; sums and GEMM in
//! another order than the reference's within the bound of any order, `n·ε·Σ|terms|`, around
//! a reference computed in `f64`.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "a test that meets an error must fail loudly"
)]

use lockstep_cuda::ops::{self, AdamStep, Binary, Geometry, MatRef};
use lockstep_cuda::{CudaDevice, CudaError, Transfers, device_count};
use lockstep_testenv::{Need, available};
use proptest::prelude::*;

/// GPU 0, or `None` after a visible skip (a failure under `LOCKSTEP_REQUIRE_GPU=1`).
fn gpu() -> Option<CudaDevice> {
    available(Need::Gpu, CudaDevice::open(0))
}

/// Each GPU value equals the CPU's (infinities and NaN included), or lies within `relative`
/// times the largest finite CPU value (at least 1) of it. The scale comes from finite values
/// only: a division by zero in the reference must not make every tolerance infinite (and
/// `0 · ∞` NaN).
fn close(gpu: &[f32], cpu: &[f32], relative: f32) -> Result<(), TestCaseError> {
    prop_assert_eq!(gpu.len(), cpu.len());
    let scale = cpu
        .iter()
        .filter(|v| v.is_finite())
        .fold(1.0_f32, |m, v| m.max(v.abs()));
    for (i, (g, c)) in gpu.iter().zip(cpu).enumerate() {
        let equal = g == c || (g.is_nan() && c.is_nan());
        prop_assert!(
            equal || (c.is_finite() && (g - c).abs() <= relative * scale),
            "value {}: gpu {} vs cpu {}",
            i,
            g,
            c
        );
    }
    Ok(())
}

/// A sum of `terms` in `f64`, and the bound any order of adding them in `f32` stays within:
/// `n·ε·Σ|term|` (ε = 2⁻²⁴, the unit round-off), the classic bound of recursive summation,
/// which holds for pairwise and blocked orders too.
fn sum_and_bound(terms: impl Iterator<Item = f32>) -> (f64, f64) {
    let (mut sum, mut magnitude, mut n) = (0.0_f64, 0.0_f64, 0_u32);
    for term in terms {
        sum += f64::from(term);
        magnitude += f64::from(term.abs());
        n += 1;
    }
    (
        sum,
        f64::from(n) * f64::from(f32::EPSILON / 2.0) * magnitude,
    )
}

/// The GPU's sums against references in `f64` with their bounds.
fn close_to_sums(gpu: &[f32], sums: &[(f64, f64)]) -> Result<(), TestCaseError> {
    prop_assert_eq!(gpu.len(), sums.len());
    for (i, (g, (sum, bound))) in gpu.iter().zip(sums).enumerate() {
        // The reference rounded to f32 counts as one more term's error.
        let bound = bound + sum.abs() * f64::from(f32::EPSILON);
        prop_assert!(
            (f64::from(*g) - sum).abs() <= bound,
            "sum {}: gpu {} vs {} ± {}",
            i,
            g,
            sum,
            bound
        );
    }
    Ok(())
}

/// Column sums as lockstep-tensor's CPU kernel adds them: rows in order within blocks of
/// [`ops::COLUMN_SUM_BLOCK_ROWS`], then the block sums in order.
fn column_sums_in_blocks(x: &[f32], cols: usize) -> Vec<f32> {
    let mut out = vec![0.0_f32; cols];
    for block in x.chunks(ops::COLUMN_SUM_BLOCK_ROWS * cols) {
        let mut partial = vec![0.0_f32; cols];
        for row in block.chunks_exact(cols) {
            for (p, v) in partial.iter_mut().zip(row) {
                *p += v;
            }
        }
        for (o, p) in out.iter_mut().zip(partial) {
            *o += p;
        }
    }
    out
}

/// A CPU reference of a binary operation.
type Reference = fn(f32, f32) -> f32;

fn values(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec((-2000_i32..2000).prop_map(|v| v as f32 / 1000.0), len)
}

#[test]
fn opening_a_device_never_panics_and_says_why_it_failed() {
    match (device_count(), CudaDevice::open(0)) {
        (Ok(count), Ok(device)) => {
            assert!(count >= 1);
            assert_eq!(device.ordinal(), 0);
            assert_eq!(
                CudaDevice::open(0).unwrap(),
                device,
                "opened once per process"
            );
        }
        (
            Ok(count),
            Err(CudaError::NoDevice {
                ordinal,
                count: seen,
            }),
        ) => {
            assert_eq!((ordinal, seen, count), (0, 0, 0));
        }
        (Err(CudaError::NoDriver), Err(CudaError::NoDriver)) => {
            eprintln!("no CUDA driver on this machine: the error says so");
        }
        (count, open) => {
            let open = open.map(|_| ());
            assert!(open.is_err(), "{count:?} {open:?}");
            assert!(!open.unwrap_err().to_string().is_empty());
        }
    }
    if let Ok(count) = device_count() {
        let err = CudaDevice::open(count + 7).unwrap_err();
        assert!(err.to_string().contains("no CUDA device"), "{err}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn ranges_copy_and_land_on_the_device_as_slices_do_on_the_host(values in values(0..300), a in 0..300_usize, b in 0..300_usize) {
        let Some(gpu) = gpu() else { return Ok(()) };
        let (start, end) = (a.min(b), a.max(b));
        let buffer = gpu.upload(&values).unwrap();
        let before = Transfers::on_this_thread();
        let part = buffer.copy_range(start..end);
        let mut target = gpu.upload(&vec![-1.0; values.len()]).unwrap();
        if end > values.len() {
            prop_assert!(part.is_err());
            prop_assert!(target.write_at(start, &gpu.upload(&vec![0.0; end - start]).unwrap()).is_err());
            return Ok(());
        }
        let part = part.unwrap();
        target.write_at(start, &part).unwrap();
        // One upload (the target, unless it is empty), and no copy through the host.
        let uploads = u64::from(!values.is_empty());
        prop_assert_eq!(Transfers::on_this_thread() - before, Transfers { to_device: uploads, to_host: 0 });
        prop_assert_eq!(part.to_host().unwrap(), &values[start..end]);
        let mut want = vec![-1.0; values.len()];
        want[start..end].copy_from_slice(&values[start..end]);
        prop_assert_eq!(target.to_host().unwrap(), want);
        prop_assert!(target.write_at(values.len() - (end - start) + 1, &part).is_err());
        target.fill_zero().unwrap();
        prop_assert_eq!(target.to_host().unwrap(), vec![0.0; values.len()]);
    }

    #[test]
    fn element_wise_operations_equal_the_cpus(a in values(0..3000), b in values(3000..3001), factor in -3.0_f32..3.0) {
        let Some(gpu) = gpu() else { return Ok(()) };
        let b = &b[..a.len()];
        let (ga, gb) = (gpu.upload(&a).unwrap(), gpu.upload(b).unwrap());
        let cases: [(Binary, Reference); 4] = [
            (Binary::Add, |x, y| x + y),
            (Binary::Sub, |x, y| x - y),
            (Binary::Mul, |x, y| x * y),
            (Binary::Div, |x, y| x / y),
        ];
        for (op, cpu) in cases {
            let want: Vec<f32> = a.iter().zip(b).map(|(&x, &y)| cpu(x, y)).collect();
            close(&ops::binary(op, &ga, &gb).unwrap().to_host().unwrap(), &want, 0.0)?;
        }
        let want: Vec<f32> = a.iter().map(|x| x * factor).collect();
        close(&ops::scale(&ga, factor).unwrap().to_host().unwrap(), &want, 0.0)?;
        let mut in_place = gpu.upload(&a).unwrap();
        ops::scale_in_place(&mut in_place, factor).unwrap();
        close(&in_place.to_host().unwrap(), &want, 0.0)?;
        let relu: Vec<f32> = a.iter().map(|x| x.max(0.0)).collect();
        let grelu = ops::relu(&ga).unwrap();
        close(&grelu.to_host().unwrap(), &relu, 0.0)?;
        let want: Vec<f32> = b.iter().zip(&relu).map(|(&d, &y)| if y > 0.0 { d } else { 0.0 }).collect();
        close(&ops::relu_grad(&gb, &grelu).unwrap().to_host().unwrap(), &want, 0.0)?;
        close(&ops::fill(&gpu, 5, factor).unwrap().to_host().unwrap(), &[factor; 5], 0.0)?;
        close_to_sums(&ops::sum(&ga).unwrap().to_host().unwrap(), &[sum_and_bound(a.iter().copied())])?;
        prop_assert!(ops::binary(Binary::Add, &ga, &gpu.upload(&[1.0; 3001]).unwrap()).is_err());
    }

    #[test]
    fn column_sums_add_the_same_blocks_in_the_same_order_as_the_cpu(rows in 0..1200_usize, cols in 1..40_usize, x in values(48_000..48_001)) {
        let Some(gpu) = gpu() else { return Ok(()) };
        let x = &x[..rows * cols];
        let got = ops::column_sums(&gpu.upload(x).unwrap(), cols).unwrap().to_host().unwrap();
        close(&got, &column_sums_in_blocks(x, cols), 0.0)?;
        prop_assert!(ops::column_sums(&gpu.upload(&[1.0; 7]).unwrap(), 2).is_err());
    }

    #[test]
    fn bias_softmax_and_cross_entropy_equal_the_cpus(rows in 1..40_usize, cols in 1..12_usize, x in values(480..481), seed: u64) {
        let Some(gpu) = gpu() else { return Ok(()) };
        let x = &x[..rows * cols];
        let bias: Vec<f32> = (0..cols).map(|j| j as f32 * 0.25 - 1.0).collect();
        let (gx, gbias) = (gpu.upload(x).unwrap(), gpu.upload(&bias).unwrap());
        for relu in [false, true] {
            let want: Vec<f32> = x.iter().enumerate().map(|(i, v)| {
                let s = v + bias[i % cols];
                if relu { s.max(0.0) } else { s }
            }).collect();
            close(&ops::bias_add(&gx, &gbias, relu).unwrap().to_host().unwrap(), &want, 0.0)?;
        }
        close(&ops::column_sums(&gx, cols).unwrap().to_host().unwrap(), &column_sums_in_blocks(x, cols), 0.0)?;
        let labels: Vec<usize> = (0..rows).map(|r| ((seed as usize).wrapping_add(r * 7)) % cols).collect();
        let (mut loss, mut grad) = (Vec::new(), Vec::new());
        let mut probs = Vec::new();
        for (r, &label) in labels.iter().enumerate() {
            let row = &x[r * cols..(r + 1) * cols];
            let top = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let total: f32 = row.iter().map(|v| (v - top).exp()).sum();
            loss.push(total.ln() - (row[label] - top));
            for (k, v) in row.iter().enumerate() {
                let p = (v - top).exp() / total;
                probs.push(p);
                grad.push(if k == label { p - 1.0 } else { p });
            }
        }
        let exp: Vec<f32> = x.iter().map(|v| v.exp()).collect();
        close(&ops::exp(&gx).unwrap().to_host().unwrap(), &exp, 1e-5)?;
        let (gl, gg) = ops::sparse_softmax_cross_entropy(&gx, &labels, cols).unwrap();
        close(&gl.to_host().unwrap(), &loss, 1e-5)?;
        close(&gg.to_host().unwrap(), &grad, 1e-5)?;
        close(&ops::softmax(&gx, cols).unwrap().to_host().unwrap(), &probs, 1e-5)?;
        let mut bad = labels.clone();
        bad[0] = cols;
        prop_assert!(ops::sparse_softmax_cross_entropy(&gx, &bad, cols).is_err());
    }

    #[test]
    fn matmul_equals_the_cpus(m in 1..70_usize, k in 1..70_usize, n in 1..70_usize, ta: bool, tb: bool, a in values(4900..4901), b in values(4900..4901)) {
        let Some(gpu) = gpu() else { return Ok(()) };
        let (a, b) = (&a[..m * k], &b[..k * n]);
        // Stored transposed when read transposed.
        let stored = |v: &[f32], rows: usize, cols: usize, t: bool| -> Vec<f32> {
            if t { (0..cols).flat_map(|j| (0..rows).map(move |i| v[i * cols + j])).collect() } else { v.to_vec() }
        };
        let (sa, sb) = (stored(a, m, k, ta), stored(b, k, n, tb));
        let (ga, gb) = (gpu.upload(&sa).unwrap(), gpu.upload(&sb).unwrap());
        let ra = MatRef { buffer: &ga, rows: if ta { k } else { m }, cols: if ta { m } else { k }, transposed: ta };
        let rb = MatRef { buffer: &gb, rows: if tb { n } else { k }, cols: if tb { k } else { n }, transposed: tb };
        // Each product of two f32 values is exact in f64; its rounding to f32 is one more ε.
        let want: Vec<(f64, f64)> = (0..m).flat_map(|i| (0..n).map(move |j| {
            let (sum, bound) = sum_and_bound((0..k).map(|l| a[i * k + l] * b[l * n + j]));
            let exact: f64 = (0..k).map(|l| f64::from(a[i * k + l]) * f64::from(b[l * n + j])).sum();
            (exact, bound + (exact - sum).abs())
        })).collect();
        close_to_sums(&ops::matmul(ra, rb).unwrap().to_host().unwrap(), &want)?;
        let wrong = MatRef { rows: rb.rows + 1, ..rb };
        prop_assert!(ops::matmul(ra, wrong).is_err());
    }

    #[test]
    fn im2col_col2im_and_max_pooling_equal_the_cpus(
        batch in 1..3_usize, (height, width) in (1..9_usize, 1..9_usize), channels in 1..4_usize,
        (kernel_h, kernel_w) in (1..4_usize, 1..4_usize), (stride_h, stride_w) in (1..3_usize, 1..3_usize),
        same: bool, x in values(432..433),
    ) {
        let Some(gpu) = gpu() else { return Ok(()) };
        let (pad_top, pad_left) = if same { ((kernel_h - 1) / 2, (kernel_w - 1) / 2) } else { (0, 0) };
        let out = |size: usize, k: usize, s: usize, p: usize| (size + 2 * p).checked_sub(k).map(|v| v / s + 1);
        let (Some(out_h), Some(out_w)) = (out(height, kernel_h, stride_h, pad_top), out(width, kernel_w, stride_w, pad_left)) else { return Ok(()) };
        let g = Geometry { batch, height, width, channels, kernel_h, kernel_w, stride_h, stride_w, pad_top, pad_left, out_h, out_w };
        let input = &x[..batch * height * width * channels];
        let at = |b: usize, oy: usize, ox: usize, ky: usize, kx: usize| -> Option<usize> {
            let y = (oy * stride_h + ky).checked_sub(pad_top).filter(|&y| y < height)?;
            let x = (ox * stride_w + kx).checked_sub(pad_left).filter(|&x| x < width)?;
            Some(((b * height + y) * width + x) * channels)
        };
        let mut cols = Vec::new();
        let mut pooled = Vec::new();
        let mut winners = Vec::new();
        for b in 0..batch { for oy in 0..out_h { for ox in 0..out_w {
            for ky in 0..kernel_h { for kx in 0..kernel_w { for c in 0..channels {
                cols.push(at(b, oy, ox, ky, kx).map_or(0.0, |i| input[i + c]));
            }}}
            for c in 0..channels {
                let (mut best, mut arg) = (f32::NEG_INFINITY, None);
                for ky in 0..kernel_h { for kx in 0..kernel_w {
                    if let Some(i) = at(b, oy, ox, ky, kx) && input[i + c] > best {
                        best = input[i + c];
                        arg = Some(i + c);
                    }
                }}
                pooled.push(best);
                winners.push(arg);
            }
        }}}
        let gx = gpu.upload(input).unwrap();
        let gcols = ops::im2col(&gx, &g).unwrap();
        close(&gcols.to_host().unwrap(), &cols, 0.0)?;
        // col2im of the rows sums each input value once per window reading it.
        let mut back = vec![0.0_f32; input.len()];
        let mut row = 0;
        for b in 0..batch { for oy in 0..out_h { for ox in 0..out_w {
            for ky in 0..kernel_h { for kx in 0..kernel_w { for c in 0..channels {
                if let Some(i) = at(b, oy, ox, ky, kx) { back[i + c] += cols[row]; }
                row += 1;
            }}}
        }}}
        // Exact: the GPU gathers each position's windows in the order the CPU scatters them.
        close(&ops::col2im(&gcols, &g).unwrap().to_host().unwrap(), &back, 0.0)?;
        let (gp, argmax) = ops::max_pool(&gx, &g).unwrap();
        close(&gp.to_host().unwrap(), &pooled, 0.0)?;
        let dy: Vec<f32> = (0..pooled.len()).map(|i| (i % 7) as f32 - 3.0).collect();
        let mut dx = vec![0.0_f32; input.len()];
        for (d, w) in dy.iter().zip(&winners) { if let Some(i) = w { dx[*i] += d; } }
        let gdx = ops::max_pool_grad(&gpu.upload(&dy).unwrap(), &argmax, &g).unwrap();
        close(&gdx.to_host().unwrap(), &dx, 0.0)?;
        let (no_stride, too_big) = (Geometry { stride_h: 0, ..g }, Geometry { batch: 3, ..g });
        prop_assert!(ops::im2col(&gx, &no_stride).is_err());
        prop_assert!(ops::im2col(&gx, &too_big).is_err());
    }

    #[test]
    fn optimizer_updates_equal_the_cpus(p in values(1000..1001), g in values(1000..1001), steps in 1..4_i32) {
        let Some(gpu) = gpu() else { return Ok(()) };
        let (lr, momentum, b1, b2, eps) = (0.01_f32, 0.9_f32, 0.9_f32, 0.999_f32, 1e-7_f32);
        let grads = gpu.upload(&g).unwrap();
        let mut sgd = gpu.upload(&p).unwrap();
        let mut nesterov = gpu.upload(&p).unwrap();
        let mut velocity = gpu.zeros(p.len()).unwrap();
        let mut adam = gpu.upload(&p).unwrap();
        let (mut m, mut v) = (gpu.zeros(p.len()).unwrap(), gpu.zeros(p.len()).unwrap());
        let (mut cs, mut cn, mut cv, mut ca, mut cm, mut cv2) = (p.clone(), p.clone(), vec![0.0_f32; p.len()], p.clone(), vec![0.0_f32; p.len()], vec![0.0_f32; p.len()]);
        for t in 1..=steps {
            ops::sgd(&mut sgd, &grads, lr).unwrap();
            ops::sgd_momentum(&mut nesterov, &grads, &mut velocity, (lr, momentum, true)).unwrap();
            let alpha = (f64::from(lr) * (1.0 - f64::from(b2).powi(t)).sqrt() / (1.0 - f64::from(b1).powi(t))) as f32;
            ops::adam(&mut adam, &grads, (&mut m, &mut v), AdamStep { alpha, beta_1: b1, beta_2: b2, epsilon: eps }).unwrap();
            for i in 0..p.len() {
                cs[i] -= lr * g[i];
                cv[i] = momentum * cv[i] - lr * g[i];
                cn[i] += momentum * cv[i] - lr * g[i];
                cm[i] += (g[i] - cm[i]) * (1.0 - b1);
                cv2[i] += (g[i] * g[i] - cv2[i]) * (1.0 - b2);
                ca[i] -= cm[i] * alpha / (cv2[i].sqrt() + eps);
            }
        }
        close(&sgd.to_host().unwrap(), &cs, 0.0)?;
        close(&nesterov.to_host().unwrap(), &cn, 0.0)?;
        close(&adam.to_host().unwrap(), &ca, 0.0)?;
    }

    #[test]
    fn dropout_keeps_about_the_rate_deterministically(x in values(4000..4001), rate in 0.0_f32..0.9, seed: u64) {
        let Some(gpu) = gpu() else { return Ok(()) };
        let gx = gpu.upload(&x).unwrap();
        let (out, mask) = ops::dropout(&gx, rate, seed).unwrap();
        let (out, mask) = (out.to_host().unwrap(), mask.to_host().unwrap());
        let keep = 1.0 / (1.0 - rate);
        prop_assert!(mask.iter().all(|&m| m == 0.0 || m == keep));
        let kept = mask.iter().filter(|&&m| m != 0.0).count() as f32 / mask.len() as f32;
        prop_assert!((kept - (1.0 - rate)).abs() < 0.05, "kept {} at rate {}", kept, rate);
        for ((o, v), m) in out.iter().zip(&x).zip(&mask) { prop_assert_eq!(*o, v * m); }
        prop_assert_eq!(ops::dropout(&gx, rate, seed).unwrap().1.to_host().unwrap(), mask);
        prop_assert!(ops::dropout(&gx, 1.0, seed).is_err());
    }
}
