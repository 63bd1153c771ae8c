//! Every operation's backward rule against central finite differences, on random shapes and
//! values, including broadcasting and padding edge cases.
//!
//! The check: for a random weighting `R` of the output, the analytic gradient of
//! `L = Σ op(inputs) · R` must match `(L(x + h) − L(x − h)) / 2h` for every input value where
//! `L` is smooth (the one-sided differences agree). Values near a kink are skipped, but at
//! least [`MIN_COMPARED`] of the input values must be compared: a case whose points all lie
//! near kinks fails instead of passing with nothing checked.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use lockstep_tensor::ops::{self, MaxPool, Padding};
use lockstep_tensor::{Tensor, TensorError};
use proptest::prelude::*;

const H: f32 = 1e-2;

/// The share of a check's input values (all inputs together) that must be away from kinks
/// and compared, and at least one. The generators keep values away from relu's and division's
/// kinks and make maxima unique, so most values are smooth; a value that feeds many relu
/// outputs (a bias, a kernel value) meets a kink more often.
const MIN_COMPARED: f64 = 0.25;

fn weighted_sum(out: &Tensor, weights: &[f32]) -> f64 {
    out.host_data()
        .unwrap()
        .iter()
        .zip(weights)
        .map(|(&o, &w)| f64::from(o) * f64::from(w))
        .sum()
}

fn check<F>(inputs: &[(Vec<f32>, Vec<usize>)], op: &F) -> Result<(), TestCaseError>
where
    F: Fn(&[Tensor]) -> Result<Tensor, TensorError>,
{
    let params: Vec<Tensor> = inputs
        .iter()
        .map(|(d, s)| Tensor::parameter(d.clone(), s).unwrap())
        .collect();
    let out = op(&params).unwrap();
    let weights: Vec<f32> = (0..out.len())
        .map(|i| ((i * 7 + 3) % 11) as f32 / 5.0 - 1.0)
        .collect();
    let r = Tensor::from_vec(weights.clone(), out.shape()).unwrap();
    let loss = ops::sum(
        &ops::mul(&out, &r).unwrap(),
        &(0..out.rank()).collect::<Vec<_>>(),
        false,
    )
    .unwrap();
    let grads = loss.backward().unwrap();
    let mut compared = 0_usize;
    for (which, (data, shape)) in inputs.iter().enumerate() {
        let analytic = grads.get(&params[which]).map_or_else(
            || vec![0.0; data.len()],
            |g| g.host_data().unwrap().to_vec(),
        );
        prop_assert_eq!(analytic.len(), data.len());
        for i in 0..data.len() {
            let at = |delta: f32| {
                let mut moved = data.clone();
                moved[i] += delta;
                let mut args: Vec<Tensor> = params.iter().map(Tensor::detach).collect();
                args[which] = Tensor::from_vec(moved, shape).unwrap();
                weighted_sum(&op(&args).unwrap(), &weights)
            };
            let (up, here, down) = (at(H), at(0.0), at(-H));
            let (forward, backward) = ((up - here) / f64::from(H), (here - down) / f64::from(H));
            // A kink (relu at 0, a max changing hands) within ±h shows as one-sided slopes that
            // disagree. Below this threshold a single kink is harmless: the derivative is one
            // of the two slopes, and the central difference lies within half the threshold
            // of either, inside the comparison's tolerance below. (Steep but smooth curvature,
            // as of 1/x, also separates the slopes; a lower threshold skipped such points.)
            if (forward - backward).abs() > 3e-2 * (1.0 + forward.abs().max(backward.abs())) {
                continue;
            }
            let numeric = ((up - down) / (2.0 * f64::from(H))) as f32;
            let tolerance = 2e-2 * (1.0 + numeric.abs().max(analytic[i].abs()));
            prop_assert!(
                (numeric - analytic[i]).abs() <= tolerance,
                "input {} element {}: analytic {} vs numeric {}",
                which,
                i,
                analytic[i],
                numeric
            );
            compared += 1;
        }
    }
    let total: usize = inputs.iter().map(|(data, _)| data.len()).sum();
    let wanted = ((total as f64 * MIN_COMPARED).ceil() as usize).max(1);
    prop_assert!(
        total == 0 || compared >= wanted,
        "compared {} of {} input values (at least {} wanted): too many lie near a kink",
        compared,
        total,
        wanted
    );
    Ok(())
}

/// Floats in `[low, high)` on a grid of `steps` points. proptest's own `f32` range sampler
/// trips a debug assertion of its own on some seeds (proptest 1.12 `float_samplers.rs`), so
/// values are drawn as integers and scaled.
fn grid(low: f32, high: f32, steps: u32) -> impl Strategy<Value = f32> {
    (0..steps).prop_map(move |i| low + (high - low) * (i as f32 / steps as f32))
}

/// Values in ±[0.1, 2]: away from zero, where relu and division are smooth.
fn values(len: usize) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(
        (grid(0.1, 2.0, 1 << 20), any::<bool>()).prop_map(|(v, neg)| if neg { -v } else { v }),
        len,
    )
}

/// Distinct values 0.1 apart in random order, so every max is unique by more than 2h.
fn distinct(len: usize) -> impl Strategy<Value = Vec<f32>> {
    Just((0..len).map(|i| i as f32 * 0.1 - 1.0).collect::<Vec<_>>()).prop_shuffle()
}

/// `bias`, each value moved up in steps of 3h until every pre-activation `z` of its channel
/// (channels last) lies `margin` or more from relu's kink. A value that feeds every output of
/// a channel (a kernel value, a bias) meets one of a hundred outputs near zero often, and
/// kinks of opposite sign can cancel in the check's kink detection; clear of the kink, the
/// finite differences are smooth. The search is bounded: once `bias` is `margin` above the
/// largest `|z|`, every `z + bias` is clear.
fn bias_clear_of_relu_kink(z: &[f32], bias: &[f32], margin: f32) -> Vec<f32> {
    let channels = bias.len();
    let largest = z.iter().fold(0.0_f32, |m, v| m.max(v.abs()));
    let clear = |c: usize, bias: f32| {
        z.iter()
            .skip(c)
            .step_by(channels)
            .all(|v| (v + bias).abs() >= margin)
    };
    bias.iter()
        .enumerate()
        .map(|(c, &b)| {
            let steps = ((largest + margin + b.abs()) / (3.0 * H)).ceil() as u32 + 1;
            (0..=steps)
                .map(|step| b + step as f32 * 3.0 * H)
                .find(|&b| clear(c, b))
                .unwrap()
        })
        .collect()
}

fn dims(max: usize) -> impl Strategy<Value = usize> {
    1..=max
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn matmul_gradients((m, k, n) in (dims(4), dims(4), dims(4)), seed in any::<u64>()) {
        let a = (0..m * k).map(|i| ((i as u64 ^ seed) % 17) as f32 / 8.0 - 1.0).collect();
        let b = (0..k * n).map(|i| (((i as u64 * 3) ^ seed) % 13) as f32 / 6.0 - 1.0).collect();
        check(&[(a, vec![m, k]), (b, vec![k, n])], &|t| ops::matmul(&t[0], &t[1]))?;
    }

    #[test]
    fn broadcasting_arithmetic_gradients(
        (m, n) in (dims(3), dims(4)),
        pattern in 0..5_usize,
        a in values(24),
        b in values(24),
    ) {
        let (sa, sb): (Vec<usize>, Vec<usize>) = match pattern {
            0 => (vec![m, n], vec![m, n]),
            1 => (vec![m, n], vec![n]),
            2 => (vec![m, 1], vec![1, n]),
            3 => (vec![], vec![m, n]),
            _ => (vec![2, m, n], vec![m, 1]),
        };
        let (la, lb) = (sa.iter().product::<usize>(), sb.iter().product::<usize>());
        let inputs = [(a[..la].to_vec(), sa), (b[..lb].to_vec(), sb)];
        check(&inputs, &|t| ops::add(&t[0], &t[1]))?;
        check(&inputs, &|t| ops::sub(&t[0], &t[1]))?;
        check(&inputs, &|t| ops::mul(&t[0], &t[1]))?;
        // Denominators in ±[0.575, 2]: near zero, 1/x bends so sharply within ±h that its
        // one-sided slopes part like a kink's.
        let away = |v: &f32| v.signum() * (0.5 + v.abs() * 0.75);
        let inputs = [inputs[0].clone(), (inputs[1].0.iter().map(away).collect(), inputs[1].1.clone())];
        check(&inputs, &|t| ops::div(&t[0], &t[1]))?;
    }

    #[test]
    fn bias_add_relu_scale_and_log_gradients((m, n) in (dims(4), dims(5)), x in values(20), b in values(5)) {
        let inputs = [(x[..m * n].to_vec(), vec![m, n]), (b[..n].to_vec(), vec![n])];
        // With one row, a sum `x + b` within ±h of zero puts both of its inputs on the kink and
        // leaves nothing compared: the bias is moved clear of it, as in the convolution's check.
        let clear = [inputs[0].clone(), (bias_clear_of_relu_kink(&inputs[0].0, &inputs[1].0, 2.0 * H), vec![n])];
        check(&clear, &|t| ops::relu(&ops::bias_add(&t[0], &t[1])?))?;
        check(&inputs[..1], &|t| ops::scale(&t[0], -1.5))?;
        let positive: Vec<f32> = x[..m * n].iter().map(|v| v.abs() + 0.5).collect();
        check(&[(positive, vec![m, n])], &|t| ops::log(&t[0]))?;
        check(&inputs[..1], &|t| ops::clip(&t[0], -0.05, 0.05))?;
        check(&inputs[..1], &|t| ops::exp(&t[0]))?;
        let other = [(b[..m].to_vec(), vec![m, 1]), (x[..m * n].to_vec(), vec![m, n])];
        check(&other, &|t| ops::concat(&[&t[0], &t[1]], 1))?;
        check(&[(x[..m * n].to_vec(), vec![m, n]), (b[..n].to_vec(), vec![1, n])], &|t| ops::concat(&[&t[0], &t[1]], 0))?;
        check(&inputs[..1], &|t| ops::abs(&t[0]))?;
        check(&inputs[..1], &|t| ops::sigmoid(&t[0]))?;
        check(&inputs[..1], &|t| ops::gather_rows(&t[0], &[m - 1, 0, m - 1]))?;
    }

    #[test]
    fn conv2d_gradients(
        batch in dims(2), (h, w) in (3..6_usize, 3..6_usize), (c_in, c_out) in (dims(2), dims(3)),
        (kh, kw) in (dims(3), dims(3)), stride in (dims(2), dims(2)), same: bool, seed in any::<u64>(),
    ) {
        let padding = if same { Padding::Same } else { Padding::Valid };
        let x = (0..batch * h * w * c_in).map(|i| (((i as u64 * 5) ^ seed) % 19) as f32 / 9.0 - 1.0).collect();
        let k = (0..kh * kw * c_in * c_out).map(|i| (((i as u64 * 3) ^ seed) % 11) as f32 / 5.0 - 1.0).collect();
        check(&[(x, vec![batch, h, w, c_in]), (k, vec![kh, kw, c_in, c_out])], &|t| ops::conv2d(&t[0], &t[1], stride, padding))?;
    }

    #[test]
    fn fused_conv_and_dense_gradients(
        (h, w) in (3..6_usize, 3..6_usize), (c_in, c_out) in (dims(2), dims(3)), relu: bool, same: bool, x in values(2 * 5 * 5 * 2), k in values(9 * 2 * 3), b in values(3),
    ) {
        // With the relu on, the pre-activations are kept `RELU_MARGIN` from zero: moving one
        // input, kernel or bias value by ±h moves them by at most 2h (values lie within ±2),
        // so no finite difference crosses the kink (see `bias_clear_of_relu_kink`). The
        // bias-less cases whose pre-activations come near zero are rejected; the bias is moved.
        const RELU_MARGIN: f32 = 2.5 * H;
        let padding = if same { Padding::Same } else { Padding::Valid };
        let (x, k) = (x[..2 * h * w * c_in].to_vec(), k[..9 * c_in * c_out].to_vec());
        let z = ops::conv2d(&Tensor::from_vec(x.clone(), &[2, h, w, c_in]).unwrap(), &Tensor::from_vec(k.clone(), &[3, 3, c_in, c_out]).unwrap(), (1, 1), padding).unwrap();
        prop_assume!(!relu || z.host_data().unwrap().iter().all(|v| v.abs() >= RELU_MARGIN));
        let b = if relu { bias_clear_of_relu_kink(z.host_data().unwrap(), &b[..c_out], RELU_MARGIN) } else { b[..c_out].to_vec() };
        let inputs = [(x, vec![2, h, w, c_in]), (k, vec![3, 3, c_in, c_out]), (b, vec![c_out])];
        check(&inputs, &|t| ops::conv2d_bias_relu(&t[0], &t[1], Some(&t[2]), relu, (1, 1), padding))?;
        check(&inputs[..2], &|t| ops::conv2d_bias_relu(&t[0], &t[1], None, relu, (1, 1), padding))?;
        let (dense_x, dense_w) = (inputs[0].0[..4 * c_in * 3].to_vec(), inputs[1].0[..c_in * 3 * c_out].to_vec());
        let z = ops::matmul(&Tensor::from_vec(dense_x.clone(), &[4, c_in * 3]).unwrap(), &Tensor::from_vec(dense_w.clone(), &[c_in * 3, c_out]).unwrap()).unwrap();
        let dense_b = if relu { bias_clear_of_relu_kink(z.host_data().unwrap(), &inputs[2].0, RELU_MARGIN) } else { inputs[2].0.clone() };
        let dense_inputs = [(dense_x, vec![4, c_in * 3]), (dense_w, vec![c_in * 3, c_out]), (dense_b, vec![c_out])];
        check(&dense_inputs, &|t| ops::dense(&t[0], &t[1], Some(&t[2]), relu))?;
    }

    #[test]
    fn fused_operations_equal_their_separate_parts(x in values(2 * 5 * 5 * 2), k in values(9 * 2 * 3), b in values(3)) {
        let x = Tensor::from_vec(x, &[2, 5, 5, 2]).unwrap();
        let k = Tensor::from_vec(k, &[3, 3, 2, 3]).unwrap();
        let b = Tensor::from_vec(b, &[3]).unwrap();
        let fused = ops::conv2d_bias_relu(&x, &k, Some(&b), true, (1, 1), Padding::Valid).unwrap();
        let separate = ops::relu(&ops::bias_add(&ops::conv2d(&x, &k, (1, 1), Padding::Valid).unwrap(), &b).unwrap()).unwrap();
        for (f, s) in fused.host_data().unwrap().iter().zip(separate.host_data().unwrap()) {
            prop_assert!((f - s).abs() <= 1e-5 * (1.0 + s.abs()), "{} vs {}", f, s);
        }
    }

    #[test]
    fn fused_conv_and_max_pool_gradients(
        (h, w) in (4..8_usize, 4..8_usize), c_in in dims(3), c_out in dims(20), pool in (dims(3), dims(3)),
        relu: bool, same: bool, x in values(2 * 7 * 7 * 3), k in values(9 * 3 * 20), b in values(20),
    ) {
        // The input is a constant, as a first layer's is: the direct path computes no input
        // gradient (an input that wants one takes another path, checked in the next test).
        // A kernel value moves outputs of a filter by different amounts, so near-ties in a
        // window make the max change hands within ±h often enough to defeat the kink detection:
        // the kernel is checked with one-output windows, the bias (which moves a filter's
        // outputs alike) with any, and the pooling itself against the separate operations in
        // the next test. For the same reason the kernel is checked without the relu: a kernel
        // value feeds every output of its filter, and relu kinks of opposite sign among them
        // can cancel in the kink detection; the fused relu's gradients are compared with the
        // separate operations' in the next test.
        let padding = if same { Padding::Same } else { Padding::Valid };
        let pool = MaxPool { size: pool, stride: pool, padding: Padding::Valid };
        let single = MaxPool { size: (1, 1), stride: (1, 1), padding: Padding::Valid };
        let out = if same { (h, w) } else { (h - 2, w - 2) };
        prop_assume!(pool.size.0 <= out.0 && pool.size.1 <= out.1);
        let x = Tensor::from_vec(x[..2 * h * w * c_in].to_vec(), &[2, h, w, c_in]).unwrap();
        let (k, b) = ((k[..9 * c_in * c_out].to_vec(), vec![3, 3, c_in, c_out]), (b[..c_out].to_vec(), vec![c_out]));
        let kernel = Tensor::from_vec(k.0.clone(), &k.1).unwrap();
        let bias = Tensor::from_vec(b.0.clone(), &b.1).unwrap();
        check(std::slice::from_ref(&k), &|t| ops::conv2d_bias_relu_max_pool(&x, &t[0], Some(&bias), false, (1, 1), padding, single))?;
        check(&[k], &|t| ops::conv2d_bias_relu_max_pool(&x, &t[0], None, false, (1, 1), padding, single))?;
        // A bias value moves every output of its filter: with the relu on, one pre-activation
        // among a hundred within ±h of zero makes it a kink, and with one filter nothing would be
        // compared. Each bias value is moved until its filter's pre-activations all lie 2h or more
        // from zero.
        let b = if relu {
            let z = ops::conv2d_bias_relu_max_pool(&x, &kernel, None, false, (1, 1), padding, single).unwrap();
            (bias_clear_of_relu_kink(z.host_data().unwrap(), &b.0, 2.0 * H), b.1)
        } else {
            b
        };
        check(&[b], &|t| ops::conv2d_bias_relu_max_pool(&x, &kernel, Some(&t[0]), relu, (1, 1), padding, pool))?;
    }

    #[test]
    fn fused_conv_and_max_pool_equal_their_separate_parts(
        c_in in prop::sample::select(vec![1_usize, 9]), c_out in 8..40_usize, pool in (1..3_usize, 1..3_usize), relu: bool, same: bool,
        overlapping: bool, x in values(3 * 9 * 9 * 9), k in values(81 * 40), b in values(40),
    ) {
        // One input channel: the direct method (the input a constant); nine: Winograd (the
        // input's gradient too), whose gradients are checked here against the separate
        // operations' (checked against finite differences above) rather than against finite
        // differences directly: an input value feeds ninety outputs, and the relu and max kinks
        // among them cancel in the test's kink detection often enough to make it flaky.
        // Overlapping windows take the separate operations' path.
        let padding = if same { Padding::Same } else { Padding::Valid };
        let stride = if overlapping { (1, 1) } else { pool };
        let pool = MaxPool { size: pool, stride, padding: Padding::Valid };
        let x = if c_in == 1 {
            Tensor::from_vec(x[..3 * 81].to_vec(), &[3, 9, 9, 1]).unwrap()
        } else {
            Tensor::parameter(x, &[3, 9, 9, 9]).unwrap()
        };
        let k = Tensor::parameter(k[..9 * c_in * c_out].to_vec(), &[3, 3, c_in, c_out]).unwrap();
        let b = Tensor::parameter(b[..c_out].to_vec(), &[c_out]).unwrap();
        let fused = ops::conv2d_bias_relu_max_pool(&x, &k, Some(&b), relu, (1, 1), padding, pool).unwrap();
        let conv = ops::conv2d_bias_relu(&x, &k, Some(&b), relu, (1, 1), padding).unwrap();
        let separate = ops::max_pool2d(&conv, pool.size, pool.stride, pool.padding).unwrap();
        prop_assert_eq!(fused.shape(), separate.shape());
        let scale = separate.host_data().unwrap().iter().fold(1.0_f32, |m, v| m.max(v.abs()));
        let near = |f: &[f32], s: &[f32], scale: f32| f.iter().zip(s).all(|(f, s)| (f - s).abs() <= 1e-5 * scale);
        prop_assert!(near(fused.host_data().unwrap(), separate.host_data().unwrap(), scale));
        let weights: Vec<f32> = (0..fused.len()).map(|i| (i % 5) as f32 - 2.0).collect();
        let weights = Tensor::from_vec(weights, fused.shape()).unwrap();
        let grads = |y: &Tensor| {
            let loss = ops::sum(&ops::mul(y, &weights).unwrap(), &[0, 1, 2, 3], false).unwrap();
            let g = loss.backward().unwrap();
            [&x, &k, &b].map(|t| g.get(t).map(|g| g.host_data().unwrap().to_vec()).unwrap_or_default())
        };
        for (fused, separate) in grads(&fused).iter().zip(grads(&separate).iter()) {
            prop_assert_eq!(fused.len(), separate.len());
            let scale = separate.iter().fold(1.0_f32, |m, v| m.max(v.abs()));
            prop_assert!(near(fused, separate, scale), "{:?} vs {:?}", fused, separate);
        }
    }

    #[test]
    fn batch_norm_with_relu_and_max_pool_is_the_three_operations_bit_for_bit(
        batch in dims(3), (h, w) in (2..8_usize, 2..8_usize), c in dims(5), pool in (1..4_usize, 1..4_usize),
        relu: bool, overlapping: bool, affine: bool, x in values(3 * 7 * 7 * 5), gb in values(10),
    ) {
        // Non-overlapping windows take the fused pass (sizes the window does not divide leave
        // rows and columns out); overlapping ones the three operations.
        prop_assume!(pool.0 <= h && pool.1 <= w);
        let stride = if overlapping { (1, 1) } else { pool };
        let pool = MaxPool { size: pool, stride, padding: Padding::Valid };
        let x = Tensor::parameter(x[..batch * h * w * c].to_vec(), &[batch, h, w, c]).unwrap();
        let gamma = Tensor::parameter(gb[..c].to_vec(), &[c]).unwrap();
        let beta = Tensor::parameter(gb[5..5 + c].to_vec(), &[c]).unwrap();
        let parts = if affine { ops::Affine { gamma: Some(&gamma), beta: Some(&beta) } } else { ops::Affine::default() };
        let (fused, moments) = ops::batch_norm_max_pool(&x, parts, 1e-3, None, relu, pool).unwrap();
        let (y, apart_moments) = ops::batch_norm(&x, parts, 1e-3, None).unwrap();
        let apart = ops::max_pool2d(&y, pool.size, pool.stride, pool.padding).unwrap();
        let apart = if relu { ops::relu(&apart).unwrap() } else { apart };
        prop_assert_eq!(moments, apart_moments);
        prop_assert_eq!(fused.shape(), apart.shape());
        prop_assert_eq!(fused.host_data().unwrap(), apart.host_data().unwrap());
        let weights: Vec<f32> = (0..fused.len()).map(|i| (i % 5) as f32 - 2.0).collect();
        let weights = Tensor::from_vec(weights, fused.shape()).unwrap();
        let grads = |y: &Tensor| {
            let loss = ops::sum(&ops::mul(y, &weights).unwrap(), &[0, 1, 2, 3], false).unwrap();
            let g = loss.backward().unwrap();
            [&x, &gamma, &beta].map(|t| g.get(t).map(|g| g.host_data().unwrap().to_vec()).unwrap_or_default())
        };
        prop_assert_eq!(grads(&fused), grads(&apart));
    }

    #[test]
    fn a_first_convolution_with_batch_norm_and_max_pool_equals_the_operations_apart(
        batch in dims(3), (h, w) in (3..9_usize, 3..9_usize), c_in in prop::sample::select(vec![1_usize, 3]),
        c_out in 1..20_usize, pool in (1..4_usize, 1..4_usize), stride in dims(2), relu: bool, same: bool,
        use_bias: bool, affine: bool, x in distinct(3 * 8 * 8 * 3), k in values(9 * 3 * 19), b in values(19),
        gb in values(38),
    ) {
        // Inputs of a first layer's size (within about ±2) and distinct, and a kernel whose one
        // large tap dominates: the convolution's outputs stay apart by far more than rounding,
        // so both paths pool the same positions and route the gradient to the same places.
        let padding = if same { Padding::Same } else { Padding::Valid };
        let out = |size: usize| if same { size.div_ceil(stride) } else { (size - 3) / stride + 1 };
        let pool = (pool.0.min(out(h)), pool.1.min(out(w)));
        let pool = MaxPool { size: pool, stride: pool, padding: Padding::Valid };
        let x: Vec<f32> = x[..batch * h * w * c_in].iter().map(|v| v / 30.0).collect();
        let x = Tensor::from_vec(x, &[batch, h, w, c_in]).unwrap();
        let dominant = 4 * c_in * c_out;
        let k: Vec<f32> = (0..9 * c_in * c_out)
            .map(|i| if (dominant..dominant + c_out).contains(&i) { k[i] } else { k[i] * 1e-6 })
            .collect();
        let k = Tensor::parameter(k, &[3, 3, c_in, c_out]).unwrap();
        let b = Tensor::parameter(b[..c_out].to_vec(), &[c_out]).unwrap();
        let bias = use_bias.then_some(&b);
        let gamma = Tensor::parameter(gb[..c_out].to_vec(), &[c_out]).unwrap();
        let beta = Tensor::parameter(gb[19..19 + c_out].to_vec(), &[c_out]).unwrap();
        let parts = if affine { ops::Affine { gamma: Some(&gamma), beta: Some(&beta) } } else { ops::Affine::default() };
        let (fused, moments) = ops::conv2d_batch_norm_max_pool(
            &x, (&k, bias), ((stride, stride), padding), parts, 1e-3, None, relu, pool,
        ).unwrap();
        let conv = ops::conv2d_bias_relu(&x, &k, bias, false, (stride, stride), padding).unwrap();
        let (apart, apart_moments) = ops::batch_norm_max_pool(&conv, parts, 1e-3, None, relu, pool).unwrap();
        // Relative to the largest value, or to 1 where all are small: a gradient that batch
        // normalization makes (nearly) zero is the difference of terms near 1 in both paths.
        let near = |f: &[f32], s: &[f32], tolerance: f32| {
            let scale = s.iter().fold(1.0_f32, |m, v| m.max(v.abs()));
            f.len() == s.len() && f.iter().zip(s).all(|(f, s)| (f - s).abs() <= tolerance * scale)
        };
        prop_assert!(near(&moments.mean, &apart_moments.mean, 1e-5), "{:?} vs {:?}", moments, apart_moments);
        prop_assert!(near(&moments.variance, &apart_moments.variance, 1e-4), "{:?} vs {:?}", moments, apart_moments);
        prop_assert_eq!(fused.shape(), apart.shape());
        prop_assert!(near(fused.host_data().unwrap(), apart.host_data().unwrap(), 1e-4));
        let weights: Vec<f32> = (0..fused.len()).map(|i| (i % 5) as f32 - 2.0).collect();
        let weights = Tensor::from_vec(weights, fused.shape()).unwrap();
        let grads = |y: &Tensor| {
            let loss = ops::sum(&ops::mul(y, &weights).unwrap(), &[0, 1, 2, 3], false).unwrap();
            let g = loss.backward().unwrap();
            [&k, &gamma, &beta, &b].map(|t| g.get(t).map(|g| g.host_data().unwrap().to_vec()).unwrap_or_default())
        };
        let (fused, apart) = (grads(&fused), grads(&apart));
        for (fused, apart) in fused.iter().zip(&apart).take(3) {
            prop_assert!(near(fused, apart, 1e-3), "{:?} vs {:?}", fused, apart);
        }
        // Batch normalization subtracts the mean, and with it any bias: the bias's gradient is
        // zero but for rounding (both paths' rounding, so not compared with each other).
        let zeros = vec![0.0; fused[3].len()];
        prop_assert!(near(&fused[3], &zeros, 1e-2), "{:?}", fused[3]);
    }

    #[test]
    fn max_pool_gradients(
        batch in dims(2), (h, w) in (2..7_usize, 2..7_usize), c in dims(3), pool in (dims(3), dims(3)),
        stride in (dims(3), dims(3)), same: bool, x in distinct(2 * 6 * 6 * 3),
    ) {
        let padding = if same { Padding::Same } else { Padding::Valid };
        prop_assume!(same || (pool.0 <= h && pool.1 <= w));
        let len = batch * h * w * c;
        check(&[(x[..len].to_vec(), vec![batch, h, w, c])], &|t| ops::max_pool2d(&t[0], pool, stride, padding))?;
    }

    #[test]
    fn reduction_and_reshape_gradients(shape in prop::collection::vec(dims(3), 1..4), x in values(27), axes_mask in 0..8_u8, keep: bool) {
        let len = shape.iter().product::<usize>();
        let axes: Vec<usize> = (0..shape.len()).filter(|a| axes_mask & (1 << a) != 0).collect();
        let inputs = [(x[..len].to_vec(), shape.clone())];
        check(&inputs, &|t| ops::sum(&t[0], &axes, keep))?;
        check(&inputs, &|t| ops::mean(&t[0], &axes, keep))?;
        check(&inputs, &|t| ops::reshape(&t[0], &[len]))?;
        check(&inputs, &|t| ops::flatten(&t[0]))?;
    }

    #[test]
    fn softmax_family_gradients(
        (rows, classes) in (dims(4), 2..6_usize), x in prop::collection::vec(grid(-3.0, 3.0, 1 << 20), 24), labels in prop::collection::vec(0..6_usize, 4),
    ) {
        let inputs = [(x[..rows * classes].to_vec(), vec![rows, classes])];
        let labels: Vec<usize> = labels[..rows].iter().map(|l| l % classes).collect();
        check(&inputs, &|t| ops::log_softmax(&t[0], -1))?;
        check(&inputs, &|t| ops::softmax(&t[0], -1))?;
        check(&inputs, &|t| ops::sparse_softmax_cross_entropy_with_logits(&t[0], &labels))?;
    }

    #[test]
    fn softmax_family_gradients_along_every_axis(
        shape in prop::collection::vec(2..4_usize, 3), x in prop::collection::vec(grid(-3.0, 3.0, 1 << 20), 27), axis in -3..3_isize,
    ) {
        let len = shape.iter().product::<usize>();
        let inputs = [(x[..len].to_vec(), shape)];
        check(&inputs, &|t| ops::log_softmax(&t[0], axis))?;
        check(&inputs, &|t| ops::softmax(&t[0], axis))?;
    }

    #[test]
    fn batched_matmul_gradients_with_broadcast_leading_axes(
        (m, k, n) in (dims(3), dims(3), dims(3)), lead_a in prop::collection::vec(1..3_usize, 0..3), lead_b in prop::collection::vec(1..3_usize, 0..3), ones in 0..16_u8, x in values(256), y in values(256),
    ) {
        // Leading axes that broadcast: the shorter list aligned right, some of them 1.
        let rank = lead_a.len().max(lead_b.len());
        let mut a_shape: Vec<usize> = lead_a.clone();
        let mut b_shape: Vec<usize> = lead_b.clone();
        for d in 0..rank.min(a_shape.len()).min(b_shape.len()) {
            let (ia, ib) = (a_shape.len() - 1 - d, b_shape.len() - 1 - d);
            if ones & (1 << d) != 0 { a_shape[ia] = 1 } else { a_shape[ia] = b_shape[ib] }
        }
        a_shape.extend([m, k]);
        b_shape.extend([k, n]);
        let (la, lb) = (a_shape.iter().product::<usize>(), b_shape.iter().product::<usize>());
        let inputs = [(x[..la].to_vec(), a_shape), (y[..lb].to_vec(), b_shape)];
        check(&inputs, &|t| ops::matmul(&t[0], &t[1]))?;
    }

    #[test]
    fn permute_and_transpose_gradients(x in values(24), order in Just(vec![0_usize, 1, 2]).prop_shuffle()) {
        let inputs = [(x, vec![2, 3, 4])];
        check(&inputs, &|t| ops::permute(&t[0], &order))?;
        check(&inputs, &|t| ops::transpose(&t[0], -1, 0))?;
    }

    #[test]
    fn smooth_function_gradients(x in values(12), positive in prop::collection::vec(grid(0.2, 3.0, 1 << 20), 12)) {
        let inputs = [(x, vec![3, 4])];
        check(&inputs, &|t| ops::tanh(&t[0]))?;
        check(&inputs, &|t| ops::gelu(&t[0], ops::Gelu::Exact))?;
        check(&inputs, &|t| ops::gelu(&t[0], ops::Gelu::Tanh))?;
        check(&inputs, &|t| ops::silu(&t[0]))?;
        let positive = [(positive, vec![3, 4])];
        check(&positive, &|t| ops::sqrt(&t[0]))?;
        check(&positive, &|t| ops::rsqrt(&t[0]))?;
    }

    #[test]
    fn select_gradients_with_a_broadcast_mask(x in values(12), y in values(4), mask in prop::collection::vec(any::<bool>(), 4)) {
        let mask = Tensor::from_vec(mask.iter().map(|&m| f32::from(u8::from(m))).collect(), &[4]).unwrap();
        check(&[(x, vec![3, 4]), (y, vec![4])], &|t| ops::select(&mask, &t[0], &t[1]))?;
    }

    #[test]
    fn dropout_gradients(x in values(24), rate in grid(0.0, 0.9, 1 << 20), seed in any::<u64>()) {
        check(&[(x, vec![4, 6])], &|t| ops::dropout(&t[0], rate, seed))?;
    }
}

#[test]
fn cross_entropy_is_stable_for_huge_logits() {
    let logits = Tensor::parameter(vec![1e30, -1e30, 3e38, 0.0], &[2, 2]).unwrap();
    let loss = ops::sparse_softmax_cross_entropy_with_logits(&logits, &[1, 0]).unwrap();
    assert!(
        loss.host_data().unwrap().iter().all(|l| l.is_finite()),
        "{loss:?}"
    );
    let total = ops::sum(&loss, &[0], false).unwrap();
    let grads = total.backward().unwrap();
    assert!(
        grads
            .get(&logits)
            .unwrap()
            .host_data()
            .unwrap()
            .iter()
            .all(|g| g.is_finite())
    );
}

#[test]
fn bad_shapes_and_arguments_are_errors_not_panics() {
    let a = Tensor::zeros(&[2, 3]).unwrap();
    assert!(ops::matmul(&a, &a).is_err());
    assert!(ops::matmul(&a, &Tensor::zeros(&[3]).unwrap()).is_err());
    assert!(ops::bias_add(&a, &Tensor::zeros(&[2]).unwrap()).is_err());
    assert!(ops::reshape(&a, &[4]).is_err());
    assert!(ops::sum(&a, &[2], false).is_err());
    assert!(ops::sum(&a, &[0, 0], false).is_err());
    assert!(ops::sparse_softmax_cross_entropy_with_logits(&a, &[0]).is_err());
    assert!(ops::sparse_softmax_cross_entropy_with_logits(&a, &[0, 3]).is_err());
    assert!(ops::dropout(&a, 1.0, 0).is_err());
    assert!(ops::clip(&a, 1.0, 0.0).is_err());
    assert!(ops::softmax(&Tensor::scalar(1.0), -1).is_err());
    assert!(ops::softmax(&a, 2).is_err());
    assert!(ops::log_softmax(&a, -3).is_err());
    assert!(ops::permute(&a, &[0, 0]).is_err());
    assert!(ops::permute(&a, &[1]).is_err());
    assert!(ops::transpose(&a, 0, 2).is_err());
    let batch = Tensor::zeros(&[2, 2, 3]).unwrap();
    assert!(ops::matmul(&batch, &batch).is_err());
    assert!(ops::matmul(&batch, &Tensor::zeros(&[3, 3, 1]).unwrap()).is_err());
    assert!(ops::matmul(&batch, &Tensor::zeros(&[3]).unwrap()).is_err());
    assert!(ops::select(&Tensor::zeros(&[2]).unwrap(), &a, &a).is_err());
    assert!(ops::flatten(&Tensor::scalar(1.0)).is_err());
    assert!(
        ops::conv2d(
            &Tensor::zeros(&[1, 2, 2, 1]).unwrap(),
            &Tensor::zeros(&[3, 3, 1, 1]).unwrap(),
            (1, 1),
            Padding::Valid
        )
        .is_err()
    );
    let pool = MaxPool {
        size: (3, 3),
        stride: (3, 3),
        padding: Padding::Valid,
    };
    let err = ops::conv2d_bias_relu_max_pool(
        &Tensor::zeros(&[1, 4, 4, 1]).unwrap(),
        &Tensor::zeros(&[3, 3, 1, 2]).unwrap(),
        None,
        true,
        (1, 1),
        Padding::Valid,
        pool,
    )
    .unwrap_err();
    assert!(err.to_string().contains("max_pool2d"), "{err}");
    assert!(Tensor::zeros(&[2]).unwrap().backward().is_err());
}

#[test]
fn results_are_bit_identical_from_run_to_run() {
    let run = || {
        let x = Tensor::from_vec(
            (0..64 * 28 * 28)
                .map(|i| ((i * 31) % 97) as f32 / 97.0)
                .collect(),
            &[64, 28, 28, 1],
        )
        .unwrap();
        let k = Tensor::parameter(
            (0..9 * 8)
                .map(|i| ((i * 13) % 7) as f32 / 7.0 - 0.5)
                .collect(),
            &[3, 3, 1, 8],
        )
        .unwrap();
        let y = ops::max_pool2d(
            &ops::relu(&ops::conv2d(&x, &k, (1, 1), Padding::Valid).unwrap()).unwrap(),
            (2, 2),
            (2, 2),
            Padding::Valid,
        )
        .unwrap();
        let loss = ops::mean(&y, &[0, 1, 2, 3], false).unwrap();
        let grads = loss.backward().unwrap();
        (
            y.host_data().unwrap().to_vec(),
            grads.get(&k).unwrap().host_data().unwrap().to_vec(),
        )
    };
    assert_eq!(run(), run());
}
