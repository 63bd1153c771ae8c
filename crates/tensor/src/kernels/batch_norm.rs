//! Batch normalization over the last axis of row-major data: rows of `channels` values, each
//! channel normalised with its own statistics. Sums accumulate in `f64` per block of rows, and
//! the blocks' sums are added in block order: deterministic for any thread count.

use rayon::prelude::*;

use super::window_max::{NO_POSITION, PooledGrad};

/// Rows per parallel task.
const ROWS: usize = 512;

/// Writes the output gradient of one row of the input, for the passes that never hold the
/// whole `dy`. A trait rather than a closure: the implementation's `#[inline(always)]` puts it
/// inside the AVX2 clone of the pass that calls it, where a closure would stay a function of
/// its own, compiled for the baseline.
pub(crate) trait RowGradient: Sync {
    /// Writes the gradient of row `row` (its index among all rows) into `dy`.
    fn fill(&self, row: usize, dy: &mut [f32]);
}

/// Adds per-block partial sums (each `2 · channels` long) in block order.
fn combine(partials: Vec<Vec<f64>>, channels: usize) -> (Vec<f64>, Vec<f64>) {
    let mut total = vec![0.0_f64; 2 * channels];
    for partial in partials {
        for (t, p) in total.iter_mut().zip(partial) {
            *t += p;
        }
    }
    let second = total.split_off(channels);
    (total, second)
}

/// Per channel, `Σx` and `Σx²`.
pub(crate) fn channel_sums(x: &[f32], channels: usize) -> (Vec<f64>, Vec<f64>) {
    if channels == 0 {
        return (Vec::new(), Vec::new());
    }
    let partials = x
        .par_chunks(ROWS * channels)
        .map(|block| block_sums(block, channels))
        .collect();
    combine(partials, channels)
}

/// `Σx` then `Σx²` of one block's rows.
#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
fn block_sums(block: &[f32], channels: usize) -> Vec<f64> {
    let mut sums = vec![0.0_f64; 2 * channels];
    let (s1, s2) = sums.split_at_mut(channels);
    for row in block.chunks_exact(channels) {
        for ((a, b), &v) in s1.iter_mut().zip(s2.iter_mut()).zip(row) {
            let v = f64::from(v);
            *a += v;
            *b += v * v;
        }
    }
    sums
}

/// Per channel, `Σdy` and `Σdy · x̂`, where `x̂ = (x − mean) · inverse_deviation`.
pub(crate) fn gradient_sums(
    dy: &[f32],
    x: &[f32],
    mean: &[f32],
    inverse_deviation: &[f32],
) -> (Vec<f64>, Vec<f64>) {
    let channels = mean.len();
    if channels == 0 {
        return (Vec::new(), Vec::new());
    }
    let partials = dy
        .par_chunks(ROWS * channels)
        .zip(x.par_chunks(ROWS * channels))
        .map(|(dy, x)| gradient_block(dy, x, mean, inverse_deviation))
        .collect();
    combine(partials, channels)
}

/// [`gradient_sums`] of one block's rows.
#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
fn gradient_block(dy: &[f32], x: &[f32], mean: &[f32], inverse_deviation: &[f32]) -> Vec<f64> {
    let channels = mean.len();
    let mut sums = vec![0.0_f64; 2 * channels];
    for (dy, x) in dy.chunks_exact(channels).zip(x.chunks_exact(channels)) {
        add_gradient_row(&mut sums, dy, x, mean, inverse_deviation);
    }
    sums
}

/// [`gradient_sums`] where `dy` is given row by row: `fill_dy` writes the gradient of
/// each row of `x` (its index among all rows). The sums are the same, term for term, as those
/// of the whole `dy`.
pub(crate) fn gradient_sums_by_row(
    x: &[f32],
    mean: &[f32],
    inverse_deviation: &[f32],
    fill_dy: &impl RowGradient,
) -> (Vec<f64>, Vec<f64>) {
    let channels = mean.len();
    if channels == 0 {
        return (Vec::new(), Vec::new());
    }
    let partials = x
        .par_chunks(ROWS * channels)
        .enumerate()
        .map(|(block, x)| gradient_block_by_row(block, x, (mean, inverse_deviation), fill_dy))
        .collect();
    combine(partials, channels)
}

/// [`gradient_sums_by_row`] of block `block`'s rows `x`.
#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
fn gradient_block_by_row<F: RowGradient>(
    block: usize,
    x: &[f32],
    (mean, inverse_deviation): (&[f32], &[f32]),
    fill_dy: &F,
) -> Vec<f64> {
    let channels = mean.len();
    let mut sums = vec![0.0_f64; 2 * channels];
    let mut dy = vec![0.0_f32; channels];
    for (i, x) in x.chunks_exact(channels).enumerate() {
        fill_dy.fill(block * ROWS + i, &mut dy);
        add_gradient_row(&mut sums, &dy, x, mean, inverse_deviation);
    }
    sums
}

/// Per channel, `Σdy` and `Σdy · x̂` where `x̂` is given (`normalized`, laid out as the pooled
/// values) and `dy` is the pooled gradient `grad` where it reached its window's argmax (and a
/// relu passed it), zero elsewhere: batch normalization's backward sums over the only rows of
/// its output that a max pooling after it routes gradient to.
pub(crate) fn pooled_gradient_sums(
    grad: PooledGrad<'_>,
    normalized: &[f32],
    channels: usize,
) -> (Vec<f64>, Vec<f64>) {
    if channels == 0 {
        return (Vec::new(), Vec::new());
    }
    let block = ROWS * channels;
    let partials = normalized
        .par_chunks(block)
        .enumerate()
        .map(|(i, x)| {
            let range = i * block..i * block + x.len();
            let relu = grad.relu_output.map(|y| &y[range.clone()]);
            let routed = (&grad.values[range.clone()], &grad.argmax[range]);
            pooled_gradient_block(routed, relu, x, channels)
        })
        .collect();
    combine(partials, channels)
}

/// [`pooled_gradient_sums`] of one block of pooled rows.
#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
fn pooled_gradient_block(
    (d, argmax): (&[f32], &[u8]),
    relu_output: Option<&[f32]>,
    x: &[f32],
    channels: usize,
) -> Vec<f64> {
    let mut sums = vec![0.0_f64; 2 * channels];
    let (s1, s2) = sums.split_at_mut(channels);
    let rows = d.chunks_exact(channels).zip(argmax.chunks_exact(channels));
    for (r, ((d, argmax), x)) in rows.zip(x.chunks_exact(channels)).enumerate() {
        let relu = relu_output.map(|y| &y[r * channels..(r + 1) * channels]);
        for c in 0..channels {
            let passed = argmax[c] != NO_POSITION && relu.is_none_or(|y| y[c] > 0.0);
            let d = if passed { f64::from(d[c]) } else { 0.0 };
            s1[c] += d;
            s2[c] += d * f64::from(x[c]);
        }
    }
    sums
}

/// Adds one row's `dy` and `dy · x̂` to `sums` (`Σdy` then `Σdy · x̂`, `channels` each).
#[inline(always)]
fn add_gradient_row(sums: &mut [f64], dy: &[f32], x: &[f32], mean: &[f32], inverse: &[f32]) {
    let (s1, s2) = sums.split_at_mut(mean.len());
    let row = dy.iter().zip(x).zip(mean.iter().zip(inverse));
    for ((a, b), ((&d, &v), (&m, &s))) in s1.iter_mut().zip(s2.iter_mut()).zip(row) {
        let d = f64::from(d);
        *a += d;
        *b += d * f64::from((v - m) * s);
    }
}

/// `out = x · a[c] + b[c]`, and with `x2`, `+ x2 · k[c]` (the input gradient's form).
pub(crate) fn affine(x: &[f32], a: &[f32], b: &[f32], extra: Option<(&[f32], &[f32])>) -> Vec<f32> {
    let channels = a.len();
    let mut out = vec![0.0_f32; x.len()];
    if channels == 0 {
        return out;
    }
    let block = ROWS * channels;
    out.par_chunks_mut(block).enumerate().for_each(|(i, out)| {
        let x = &x[i * block..i * block + out.len()];
        let extra = extra.map(|(x2, k)| (&x2[i * block..i * block + out.len()], k));
        affine_block(out, x, (a, b), extra);
    });
    out
}

/// [`affine`] of one block of rows (`extra`'s `x2` the block's own).
#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
fn affine_block(
    out: &mut [f32],
    x: &[f32],
    (a, b): (&[f32], &[f32]),
    extra: Option<(&[f32], &[f32])>,
) {
    let channels = a.len();
    match extra {
        None => {
            for (out, x) in out.chunks_exact_mut(channels).zip(x.chunks_exact(channels)) {
                for (((o, &v), &a), &b) in out.iter_mut().zip(x).zip(a).zip(b) {
                    *o = v * a + b;
                }
            }
        }
        Some((x2, k)) => {
            let rows = out
                .chunks_exact_mut(channels)
                .zip(x.chunks_exact(channels))
                .zip(x2.chunks_exact(channels));
            for ((out, x), x2) in rows {
                input_gradient_row(out, x, (a, b), x2, k);
            }
        }
    }
}

/// The input gradient `dx = dy · a[c] + k1[c] + x · k2[c]` of rows of `x`, where `fill_dy`
/// writes the output gradient of each row: [`affine`] with `extra`, without the whole
/// `dy`, to the same bits.
pub(crate) fn input_gradient_by_row(
    x: &[f32],
    a: &[f32],
    (k1, k2): (&[f32], &[f32]),
    fill_dy: &impl RowGradient,
) -> Vec<f32> {
    let channels = a.len();
    let mut out = vec![0.0_f32; x.len()];
    if channels == 0 {
        return out;
    }
    let block = ROWS * channels;
    out.par_chunks_mut(block).enumerate().for_each(|(i, out)| {
        let x = &x[i * block..i * block + out.len()];
        input_gradient_block(i, out, x, (a, k1, k2), fill_dy);
    });
    out
}

/// [`input_gradient_by_row`] of block `i`'s rows.
#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
fn input_gradient_block<F: RowGradient>(
    i: usize,
    out: &mut [f32],
    x: &[f32],
    (a, k1, k2): (&[f32], &[f32], &[f32]),
    fill_dy: &F,
) {
    let channels = a.len();
    let mut dy = vec![0.0_f32; channels];
    let rows = out.chunks_exact_mut(channels).zip(x.chunks_exact(channels));
    for (r, (out, x)) in rows.enumerate() {
        fill_dy.fill(i * ROWS + r, &mut dy);
        input_gradient_row(out, &dy, (a, k1), x, k2);
    }
}

/// `out = dy · a + k1 + x · k2`, channel by channel.
#[inline(always)]
fn input_gradient_row(
    out: &mut [f32],
    dy: &[f32],
    (a, k1): (&[f32], &[f32]),
    x: &[f32],
    k2: &[f32],
) {
    let terms = dy.iter().zip(x).zip(a.iter().zip(k1).zip(k2));
    for (o, ((&v, &w), ((&a, &b), &k))) in out.iter_mut().zip(terms) {
        *o = v * a + b + w * k;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_over_many_blocks_are_those_of_one_pass() {
        let channels = 3;
        let x: Vec<f32> = (0..(ROWS * 5 + 7) * channels)
            .map(|i| ((i * 13) % 29) as f32 / 7.0 - 2.0)
            .collect();
        let (s1, s2) = channel_sums(&x, channels);
        for c in 0..channels {
            let column = x.iter().skip(c).step_by(channels).map(|&v| f64::from(v));
            let (a, b) = column.fold((0.0, 0.0), |(a, b), v| (a + v, b + v * v));
            assert!((s1[c] - a).abs() < 1e-9 && (s2[c] - b).abs() < 1e-9);
        }
    }

    #[test]
    fn the_affine_map_scales_and_shifts_each_channel() {
        let out = affine(&[1.0, 2.0, 3.0, 4.0], &[2.0, 10.0], &[0.5, -1.0], None);
        assert_eq!(out, [2.5, 19.0, 6.5, 39.0]);
        let k = [1.0, 0.0];
        let out = affine(
            &[1.0, 2.0],
            &[2.0, 10.0],
            &[0.5, -1.0],
            Some((&[3.0, 3.0], &k)),
        );
        assert_eq!(out, [5.5, 19.0]);
    }
}
