//! Scaled dot-product attention in tiles, with a running softmax (the idea of `FlashAttention`):
//! the scores of one tile of queries against one tile of keys are computed, folded into each
//! query's running maximum, sum and output, and dropped, so memory grows with the sequence
//! length, not with its square. The backward pass recomputes each tile's scores from the
//! queries, keys and each query's log-sum-exp (the only statistic kept), `FlashAttention-2`'s
//! order: for each key tile, every query tile.
//!
//! Heads (`batch · heads` of them) run in parallel; inside one, tiles come in a fixed order
//! and every product is on one thread (`matmul_on_this_thread`), so the bits depend on the
//! sizes alone, never on the thread count.

use rayon::prelude::*;

use super::gemm::{MatRef, matmul_on_this_thread};
use crate::error::TensorError;

/// Query rows per tile.
const QUERY_TILE: usize = 64;
/// Key rows per tile.
const KEY_TILE: usize = 64;

/// The problem's sizes: `batch · heads` independent heads, each `queries × depth` queries
/// against `keys × depth` keys and `keys × value_depth` values.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    pub(crate) batch: usize,
    pub(crate) heads: usize,
    pub(crate) queries: usize,
    pub(crate) keys: usize,
    pub(crate) depth: usize,
    pub(crate) value_depth: usize,
}

/// A mask over `[batch, heads, queries, keys]` read through strides (zero along an axis it
/// broadcasts over), so that a mask of one row per example is never stretched in memory:
/// non-zero where the query may attend to the key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MaskView<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) strides: [usize; 4],
}

/// Dropout on the attention weights: weight `(example, head, query, key)` is dropped when a
/// hash of `seed` and those four indices falls below `rate`, the example counted from
/// `first_example` (its index in the global batch). No replica, thread or device enters it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WeightDropout {
    pub(crate) rate: f32,
    pub(crate) seed: u64,
    pub(crate) first_example: u64,
}

impl WeightDropout {
    /// The factor weight `(b, h, i, j)` is multiplied by: 0, or `1 / (1 − rate)`.
    fn factor(&self, b: usize, h: usize, i: usize, j: usize) -> f32 {
        let example = self.first_example.wrapping_add(b as u64);
        let mut hash = self.seed;
        for v in [example, h as u64, i as u64, j as u64] {
            hash = mix(hash ^ v.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        }
        // 24 random bits: a uniform f32 in [0, 1), exactly.
        let uniform = (hash >> 40) as f32 * (1.0 / (1 << 24) as f32);
        if uniform < self.rate {
            0.0
        } else {
            1.0 / (1.0 - self.rate)
        }
    }
}

/// `SplitMix64`'s finaliser: every input bit reaches every output bit.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Which scores take part, and what multiplies the weights.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules<'a> {
    /// The scores' factor, usually `1/√depth`.
    pub(crate) scale: f32,
    /// Query `i` sees keys `0..=i` only.
    pub(crate) causal: bool,
    pub(crate) mask: Option<MaskView<'a>>,
    pub(crate) dropout: Option<WeightDropout>,
}

impl Rules<'_> {
    fn visible(&self, b: usize, h: usize, i: usize, j: usize) -> bool {
        (!self.causal || j <= i)
            && self.mask.is_none_or(|m| {
                let s = m.strides;
                m.data[b * s[0] + h * s[1] + i * s[2] + j * s[3]] != 0.0
            })
    }

    /// The keys a tile of queries `rows` may see at all: causal attention stops at the last
    /// query's position.
    fn key_end(&self, keys: usize, rows: std::ops::Range<usize>) -> usize {
        if self.causal {
            keys.min(rows.end)
        } else {
            keys
        }
    }

    fn dropout_factor(&self, b: usize, h: usize, i: usize, j: usize) -> f32 {
        self.dropout.map_or(1.0, |d| d.factor(b, h, i, j))
    }
}

/// The forward pass: the output `[batch·heads, queries, value_depth]` and each query's
/// log-sum-exp of its visible scores `[batch·heads, queries]` (`+∞` for a query that sees no
/// key, whose output is zeros).
pub(crate) fn forward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: Sizes,
    rules: Rules<'_>,
) -> Result<(Vec<f32>, Vec<f32>), TensorError> {
    let mut out = vec![0.0_f32; n.batch * n.heads * n.queries * n.value_depth];
    let mut lse = vec![0.0_f32; n.batch * n.heads * n.queries];
    if n.queries == 0 || n.batch * n.heads == 0 {
        return Ok((out, lse));
    }
    let per_head_out = (n.queries * n.value_depth).max(1);
    out.par_chunks_mut(per_head_out)
        .zip(lse.par_chunks_mut(n.queries))
        .enumerate()
        .try_for_each(|(bh, (out, lse))| {
            let (qh, kh, vh) = head(q, k, v, n, bh);
            out.par_chunks_mut((QUERY_TILE * n.value_depth).max(1))
                .zip(lse.par_chunks_mut(QUERY_TILE))
                .enumerate()
                .try_for_each(|(tile, (out, lse))| {
                    let rows = tile * QUERY_TILE..(tile * QUERY_TILE + lse.len());
                    forward_tile((qh, kh, vh), n, rules, (bh, rows), (out, lse))
                })
        })?;
    Ok((out, lse))
}

/// One head's queries, keys and values.
fn head<'a>(
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    n: Sizes,
    bh: usize,
) -> (&'a [f32], &'a [f32], &'a [f32]) {
    let (qs, ks, vs) = (
        n.queries * n.depth,
        n.keys * n.depth,
        n.keys * n.value_depth,
    );
    (
        &q[bh * qs..(bh + 1) * qs],
        &k[bh * ks..(bh + 1) * ks],
        &v[bh * vs..(bh + 1) * vs],
    )
}

fn mat(data: &[f32], rows: usize, cols: usize, transposed: bool) -> MatRef<'_> {
    MatRef {
        data,
        rows,
        cols,
        transposed,
    }
}

/// The scores of queries `rows` against keys `cols` of head `bh`, scaled, `−∞` where not
/// visible: `s[r·cols.len() + c]`.
fn scores(
    (qh, kh): (&[f32], &[f32]),
    n: Sizes,
    rules: Rules<'_>,
    (bh, rows, cols): (usize, std::ops::Range<usize>, std::ops::Range<usize>),
    s: &mut [f32],
) -> Result<(), TensorError> {
    let (r, c, d) = (rows.len(), cols.len(), n.depth);
    let s = &mut s[..r * c];
    matmul_on_this_thread(
        s,
        mat(&qh[rows.start * d..rows.end * d], r, d, false),
        mat(&kh[cols.start * d..cols.end * d], c, d, true),
        false,
    )?;
    let (b, h) = (bh / n.heads, bh % n.heads);
    for (row, i) in s.chunks_exact_mut(c).zip(rows) {
        for (value, j) in row.iter_mut().zip(cols.clone()) {
            *value = if rules.visible(b, h, i, j) {
                *value * rules.scale
            } else {
                f32::NEG_INFINITY
            };
        }
    }
    Ok(())
}

fn forward_tile(
    (qh, kh, vh): (&[f32], &[f32], &[f32]),
    n: Sizes,
    rules: Rules<'_>,
    (bh, rows): (usize, std::ops::Range<usize>),
    (out, lse): (&mut [f32], &mut [f32]),
) -> Result<(), TensorError> {
    let (b, h) = (bh / n.heads, bh % n.heads);
    let r = rows.len();
    let dv = n.value_depth;
    let mut max = vec![f32::NEG_INFINITY; r];
    let mut sum = vec![0.0_f32; r];
    let mut s = vec![0.0_f32; r * KEY_TILE];
    let key_end = rules.key_end(n.keys, rows.clone());
    for start in (0..key_end).step_by(KEY_TILE) {
        let cols = start..(start + KEY_TILE).min(key_end);
        let c = cols.len();
        scores((qh, kh), n, rules, (bh, rows.clone(), cols.clone()), &mut s)?;
        for (((row, i), (m, l)), o) in s[..r * c]
            .chunks_exact_mut(c)
            .zip(rows.clone())
            .zip(max.iter_mut().zip(sum.iter_mut()))
            .zip(out.chunks_exact_mut(dv.max(1)))
        {
            let tile_max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let new_max = m.max(tile_max);
            if new_max == f32::NEG_INFINITY {
                // Nothing visible yet: the weights are zeros.
                row.fill(0.0);
                continue;
            }
            let rescale = (*m - new_max).exp();
            let mut tile_sum = 0.0_f32;
            for (p, j) in row.iter_mut().zip(cols.clone()) {
                let weight = (*p - new_max).exp();
                tile_sum += weight;
                *p = weight * rules.dropout_factor(b, h, i, j);
            }
            *l = *l * rescale + tile_sum;
            *m = new_max;
            for o in o.iter_mut().take(dv) {
                *o *= rescale;
            }
        }
        matmul_on_this_thread(
            &mut out[..r * dv],
            mat(&s[..r * c], r, c, false),
            mat(&vh[cols.start * dv..cols.end * dv], c, dv, false),
            true,
        )?;
    }
    for ((o, &m), (&l, lse)) in out
        .chunks_exact_mut(dv.max(1))
        .zip(&max)
        .zip(sum.iter().zip(lse.iter_mut()))
    {
        if l > 0.0 {
            for o in o.iter_mut().take(dv) {
                *o /= l;
            }
            *lse = m + l.ln();
        } else {
            o.fill(0.0);
            *lse = f32::INFINITY;
        }
    }
    Ok(())
}

/// The gradients of the queries, keys and values, in that order.
pub(crate) type Gradients = (Vec<f32>, Vec<f32>, Vec<f32>);

/// The gradients of the queries, keys and values from the output's gradient `g`, the output
/// `out` and the log-sum-exps `lse` the forward pass kept.
pub(crate) fn backward(
    (q, k, v): (&[f32], &[f32], &[f32]),
    (out, lse, g): (&[f32], &[f32], &[f32]),
    n: Sizes,
    rules: Rules<'_>,
) -> Result<Gradients, TensorError> {
    let heads = n.batch * n.heads;
    let (qs, ks, vs) = (
        n.queries * n.depth,
        n.keys * n.depth,
        n.keys * n.value_depth,
    );
    let mut dq = vec![0.0_f32; heads * qs];
    let mut dk = vec![0.0_f32; heads * ks];
    let mut dv = vec![0.0_f32; heads * vs];
    if heads == 0 || n.queries == 0 || n.keys == 0 {
        return Ok((dq, dk, dv));
    }
    dq.par_chunks_mut(qs.max(1))
        .zip(dk.par_chunks_mut(ks.max(1)))
        .zip(dv.par_chunks_mut(vs.max(1)))
        .enumerate()
        .try_for_each(|(bh, ((dq, dk), dv))| {
            let os = n.queries * n.value_depth;
            let grads = HeadGrads {
                out: &out[bh * os..(bh + 1) * os],
                g: &g[bh * os..(bh + 1) * os],
                lse: &lse[bh * n.queries..(bh + 1) * n.queries],
            };
            backward_head(head(q, k, v, n, bh), grads, n, rules, bh, (dq, dk, dv))
        })?;
    Ok((dq, dk, dv))
}

/// What one head's backward pass reads besides its inputs.
#[derive(Clone, Copy)]
struct HeadGrads<'a> {
    out: &'a [f32],
    g: &'a [f32],
    lse: &'a [f32],
}

fn backward_head(
    (qh, kh, vh): (&[f32], &[f32], &[f32]),
    grads: HeadGrads<'_>,
    n: Sizes,
    rules: Rules<'_>,
    bh: usize,
    (dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]),
) -> Result<(), TensorError> {
    let (b, h) = (bh / n.heads, bh % n.heads);
    let (d, dvd) = (n.depth, n.value_depth);
    // Dᵢ = Σ gᵢ·outᵢ: each query's Σⱼ Pᵢⱼ·dPᵢⱼ, what the softmax's gradient subtracts.
    let delta: Vec<f32> = grads
        .g
        .chunks_exact(dvd.max(1))
        .zip(grads.out.chunks_exact(dvd.max(1)))
        .map(|(g, o)| g.iter().zip(o).map(|(g, o)| g * o).sum())
        .take(n.queries)
        .collect();
    let mut s = vec![0.0_f32; QUERY_TILE * KEY_TILE];
    let mut weights = vec![0.0_f32; QUERY_TILE * KEY_TILE];
    let mut dp = vec![0.0_f32; QUERY_TILE * KEY_TILE];
    for key_start in (0..n.keys).step_by(KEY_TILE) {
        let cols = key_start..(key_start + KEY_TILE).min(n.keys);
        let c = cols.len();
        // Causal attention: query tiles that end before this key tile see none of it.
        let first_query = if rules.causal { key_start } else { 0 };
        let first_tile = first_query / QUERY_TILE * QUERY_TILE;
        for query_start in (first_tile..n.queries).step_by(QUERY_TILE) {
            let rows = query_start..(query_start + QUERY_TILE).min(n.queries);
            let r = rows.len();
            scores((qh, kh), n, rules, (bh, rows.clone(), cols.clone()), &mut s)?;
            // P = exp(S − lse), and the weights as dropout left them.
            for (((p, w), i), &l) in s[..r * c]
                .chunks_exact_mut(c)
                .zip(weights[..r * c].chunks_exact_mut(c))
                .zip(rows.clone())
                .zip(&grads.lse[rows.clone()])
            {
                for ((p, w), j) in p.iter_mut().zip(w.iter_mut()).zip(cols.clone()) {
                    *p = if l.is_finite() { (*p - l).exp() } else { 0.0 };
                    *w = *p * rules.dropout_factor(b, h, i, j);
                }
            }
            let g_rows = &grads.g[rows.start * dvd..rows.end * dvd];
            // dV += Wᵀ · G.
            matmul_on_this_thread(
                &mut dv[cols.start * dvd..cols.end * dvd],
                mat(&weights[..r * c], r, c, true),
                mat(g_rows, r, dvd, false),
                true,
            )?;
            // dW = G · Vᵀ; dS = P ∘ (dW ∘ dropout − D), times the scores' scale.
            matmul_on_this_thread(
                &mut dp[..r * c],
                mat(g_rows, r, dvd, false),
                mat(&vh[cols.start * dvd..cols.end * dvd], c, dvd, true),
                false,
            )?;
            for (((ds, p), i), &delta) in dp[..r * c]
                .chunks_exact_mut(c)
                .zip(s[..r * c].chunks_exact(c))
                .zip(rows.clone())
                .zip(&delta[rows.clone()])
            {
                for ((ds, &p), j) in ds.iter_mut().zip(p).zip(cols.clone()) {
                    let dw = *ds * rules.dropout_factor(b, h, i, j);
                    *ds = p * (dw - delta) * rules.scale;
                }
            }
            // dQ += dS · K; dK += dSᵀ · Q.
            matmul_on_this_thread(
                &mut dq[rows.start * d..rows.end * d],
                mat(&dp[..r * c], r, c, false),
                mat(&kh[cols.start * d..cols.end * d], c, d, false),
                true,
            )?;
            matmul_on_this_thread(
                &mut dk[cols.start * d..cols.end * d],
                mat(&dp[..r * c], r, c, true),
                mat(&qh[rows.start * d..rows.end * d], r, d, false),
                true,
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropout_keeps_about_the_share_asked_and_depends_on_the_example_not_the_batch_row() {
        let d = WeightDropout {
            rate: 0.25,
            seed: 7,
            first_example: 0,
        };
        let kept = (0..10_000).filter(|&j| d.factor(0, 0, 0, j) > 0.0).count();
        assert!((7_200..7_800).contains(&kept), "{kept} of 10000 kept");
        // Example 5 as row 5 of a batch from 0, or as row 0 of a batch from 5: one mask.
        let later = WeightDropout {
            first_example: 5,
            ..d
        };
        for j in 0..100 {
            assert_eq!(d.factor(5, 1, 2, j), later.factor(0, 1, 2, j));
        }
    }
}
