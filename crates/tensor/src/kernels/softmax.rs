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
    fn log_softmax_rows_exponentiate_to_one() {
        let out = log_softmax(&[1.0, 2.0, 3.0, -50.0, 0.0, 50.0], 3);
        for row in out.chunks(3) {
            let total: f32 = row.iter().map(|v| v.exp()).sum();
            assert!((total - 1.0).abs() < 1e-6);
        }
    }
}
