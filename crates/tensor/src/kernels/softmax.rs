//! Row-wise softmax family, numerically stable: every exponent is taken after subtracting the
//! row's maximum, so large logits neither overflow nor lose the answer.

use rayon::prelude::*;

/// Rows per parallel task.
const ROWS: usize = 64;

/// `log_softmax` of each row of `x[rows×cols]`.
pub(crate) fn log_softmax(x: &[f32], cols: usize) -> Vec<f32> {
    let mut out = vec![0.0_f32; x.len()];
    out.par_chunks_mut(ROWS * cols)
        .zip(x.par_chunks(ROWS * cols))
        .for_each(|(o, x)| {
            for (o, x) in o.chunks_exact_mut(cols).zip(x.chunks_exact(cols)) {
                let lse = log_sum_exp(x);
                for (o, &v) in o.iter_mut().zip(x) {
                    *o = v - lse;
                }
            }
        });
    out
}

/// `log Σ exp(x)`, stable.
pub(crate) fn log_sum_exp(x: &[f32]) -> f32 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY || max.is_nan() {
        return max;
    }
    max + x.iter().map(|&v| (v - max).exp()).sum::<f32>().ln()
}

/// A row-major array seen along one of its axes: `outer` blocks, each `len` steps of `inner`
/// contiguous values (the axis is the middle one; `inner == 1` for the last axis).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Along {
    pub(crate) outer: usize,
    pub(crate) len: usize,
    pub(crate) inner: usize,
}

impl Along {
    /// `shape` seen along `axis` (below `shape.len()`).
    pub(crate) fn axis(shape: &[usize], axis: usize) -> Self {
        Self {
            outer: shape[..axis].iter().product(),
            len: shape[axis],
            inner: shape[axis + 1..].iter().product(),
        }
    }

    fn block(self) -> usize {
        self.len * self.inner
    }
}

/// `log_softmax` of `x` along an axis. The last axis takes [`log_softmax`]'s row path; any
/// other reads `inner` lanes side by side, each with the same stable recipe (maximum, sum of
/// exponents, logarithm) in the same order.
pub(crate) fn log_softmax_along(x: &[f32], along: Along) -> Vec<f32> {
    if along.inner == 1 {
        return log_softmax(x, along.len);
    }
    let mut out = vec![0.0_f32; x.len()];
    if along.block() == 0 {
        return out;
    }
    let inner = along.inner;
    out.par_chunks_mut(along.block())
        .zip(x.par_chunks(along.block()))
        .for_each(|(o, x)| {
            let mut max = vec![f32::NEG_INFINITY; inner];
            for row in x.chunks_exact(inner) {
                for (m, &v) in max.iter_mut().zip(row) {
                    *m = m.max(v);
                }
            }
            let mut sum = vec![0.0_f32; inner];
            for row in x.chunks_exact(inner) {
                for ((s, &m), &v) in sum.iter_mut().zip(&max).zip(row) {
                    *s += (v - m).exp();
                }
            }
            let lse: Vec<f32> = max
                .iter()
                .zip(&sum)
                .map(|(&m, &s)| {
                    if m == f32::NEG_INFINITY || m.is_nan() {
                        m
                    } else {
                        m + s.ln()
                    }
                })
                .collect();
            for (o, row) in o.chunks_exact_mut(inner).zip(x.chunks_exact(inner)) {
                for ((o, &v), &l) in o.iter_mut().zip(row).zip(&lse) {
                    *o = v - l;
                }
            }
        });
    out
}

/// For each lane along the axis, `Σ f(a, b)` over the axis: `outer · inner` sums, each in the
/// axis's order.
fn sums_along(a: &[f32], b: &[f32], along: Along, f: impl Fn(f32, f32) -> f32) -> Vec<f32> {
    let inner = along.inner;
    let mut sums = vec![0.0_f32; along.outer * inner];
    if along.block() == 0 {
        return sums;
    }
    for ((s, a), b) in sums
        .chunks_exact_mut(inner)
        .zip(a.chunks_exact(along.block()))
        .zip(b.chunks_exact(along.block()))
    {
        for (a, b) in a.chunks_exact(inner).zip(b.chunks_exact(inner)) {
            for ((s, &a), &b) in s.iter_mut().zip(a).zip(b) {
                *s += f(a, b);
            }
        }
    }
    sums
}

/// `out = f(a, b, sum)` value by value, `sum` being the lane's entry of `sums`.
fn apply_along(
    a: &[f32],
    b: &[f32],
    sums: &[f32],
    along: Along,
    f: impl Fn(f32, f32, f32) -> f32,
) -> Vec<f32> {
    let inner = along.inner;
    let mut out = vec![0.0_f32; a.len()];
    if along.block() == 0 {
        return out;
    }
    for (((o, a), b), s) in out
        .chunks_exact_mut(along.block())
        .zip(a.chunks_exact(along.block()))
        .zip(b.chunks_exact(along.block()))
        .zip(sums.chunks_exact(inner))
    {
        for ((o, a), b) in o
            .chunks_exact_mut(inner)
            .zip(a.chunks_exact(inner))
            .zip(b.chunks_exact(inner))
        {
            for (((o, &a), &b), &s) in o.iter_mut().zip(a).zip(b).zip(s) {
                *o = f(a, b, s);
            }
        }
    }
    out
}

/// The gradient through a softmax from its output `y`: `y·(g − Σ y·g)` along the axis.
pub(crate) fn softmax_grad_along(y: &[f32], g: &[f32], along: Along) -> Vec<f32> {
    if along.inner == 1 {
        let cols = along.len;
        let mut d = vec![0.0_f32; y.len()];
        if cols == 0 {
            return d;
        }
        for ((d, y), g) in d
            .chunks_exact_mut(cols)
            .zip(y.chunks_exact(cols))
            .zip(g.chunks_exact(cols))
        {
            let dot: f32 = y.iter().zip(g).map(|(y, g)| y * g).sum();
            for ((d, &y), &g) in d.iter_mut().zip(y).zip(g) {
                *d = y * (g - dot);
            }
        }
        return d;
    }
    let dots = sums_along(y, g, along, |y, g| y * g);
    apply_along(y, g, &dots, along, |y, g, dot| y * (g - dot))
}

/// The gradient through a log-softmax from its output `y`: `g − exp(y)·Σ g` along the axis.
pub(crate) fn log_softmax_grad_along(y: &[f32], g: &[f32], along: Along) -> Vec<f32> {
    if along.inner == 1 {
        let classes = along.len;
        let mut d = vec![0.0_f32; y.len()];
        if classes == 0 {
            return d;
        }
        for ((d, y), g) in d
            .chunks_exact_mut(classes)
            .zip(y.chunks_exact(classes))
            .zip(g.chunks_exact(classes))
        {
            let total: f32 = g.iter().sum();
            for ((d, &y), &g) in d.iter_mut().zip(y).zip(g) {
                *d = g - y.exp() * total;
            }
        }
        return d;
    }
    let totals = sums_along(y, g, along, |_, g| g);
    apply_along(y, g, &totals, along, |y, g, total| g - y.exp() * total)
}

/// Per-row cross-entropy of softmax(`logits`) against integer `labels`, and its gradient with
/// respect to the logits (`softmax − one_hot`), computed together.
pub(crate) fn sparse_softmax_cross_entropy(
    logits: &[f32],
    labels: &[usize],
    cols: usize,
) -> (Vec<f32>, Vec<f32>) {
    let mut losses = vec![0.0_f32; labels.len()];
    let mut grad = vec![0.0_f32; logits.len()];
    losses
        .par_chunks_mut(ROWS)
        .zip(grad.par_chunks_mut(ROWS * cols))
        .zip(logits.par_chunks(ROWS * cols))
        .zip(labels.par_chunks(ROWS))
        .for_each(|(((losses, grad), logits), labels)| {
            for (((loss, g), x), &label) in losses
                .iter_mut()
                .zip(grad.chunks_exact_mut(cols))
                .zip(logits.chunks_exact(cols))
                .zip(labels)
            {
                let lse = log_sum_exp(x);
                *loss = lse - x[label];
                for (g, &v) in g.iter_mut().zip(x) {
                    *g = (v - lse).exp();
                }
                g[label] -= 1.0;
            }
        });
    (losses, grad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_logits_give_finite_losses() {
        let (loss, grad) =
            sparse_softmax_cross_entropy(&[1e30, -1e30, 0.0, 1000.0, 1001.0, 999.0], &[1, 0], 3);
        assert!(loss.iter().all(|l| l.is_finite()), "{loss:?}");
        assert!(grad.iter().all(|g| g.is_finite()), "{grad:?}");
        assert_eq!(loss[0], 2e30);
        assert!((loss[1] - (1.0 + (1.0 + (-1.0_f32).exp() + (-2.0_f32).exp()).ln())).abs() < 1e-4);
    }

    #[test]
    fn a_middle_axis_gives_the_rows_of_its_transpose() {
        // [2, 3, 2] along axis 1: each of the four lanes is a row of three.
        let x = [
            0.5, -1.0, 2.0, 3.0, -4.0, 0.25, 1.0, 1.5, 7.0, -2.0, 0.0, 0.0,
        ];
        let along = Along::axis(&[2, 3, 2], 1);
        let out = log_softmax_along(&x, along);
        for (outer, inner) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
            let at = |i: usize| outer * 6 + i * 2 + inner;
            let row: Vec<f32> = (0..3).map(|i| x[at(i)]).collect();
            let want = log_softmax(&row, 3);
            for i in 0..3 {
                assert_eq!(out[at(i)], want[i], "lane ({outer}, {inner}) value {i}");
            }
        }
    }

    #[test]
    fn log_softmax_rows_exponentiate_to_one() {
        let out = log_softmax(&[1.0, 2.0, 3.0, -50.0, 0.0, 50.0], 3);
        for row in out.chunks(3) {
            let total: f32 = row.iter().map(|v| v.exp()).sum();
            assert!((total - 1.0).abs() < 1e-6);
        }
    }
}
