//! Scaled dot-product attention as one operation, in memory linear in the sequence length.

use super::gpu::{On, on};
use crate::error::TensorError;
use crate::kernels::attention::{self as kernel, MaskView, Rules, Sizes, WeightDropout};
use crate::tensor::{Tensor, count_values};

/// Dropout on the attention weights, keyed by the example, never by the replica: the weight of
/// query `i` on key `j` in head `h` of example `e` is dropped by a hash of
/// `(seed, e, h, i, j)`, `e` being `first_example` plus the row in the batch. A caller that
/// passes each example's index in the global batch (and a seed that names the step) gets the
/// same mask for that example wherever it is computed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionDropout {
    /// The share of weights dropped, in `[0, 1)`; the others are scaled by `1 / (1 − rate)`.
    pub rate: f32,
    /// The seed (a layer's seed and the step, mixed by the caller).
    pub seed: u64,
    /// The global index of the batch's first example.
    pub first_example: u64,
}

/// How [`scaled_dot_product_attention`] weighs the keys.
#[derive(Debug, Clone, Copy, Default)]
pub struct Attention<'a> {
    /// The scores' factor; `None` for `1/√depth`.
    pub scale: Option<f32>,
    /// Query `i` attends to keys `0..=i` only (Keras' `use_causal_mask`).
    pub causal: bool,
    /// Where each query may attend: a tensor that broadcasts to
    /// `[batch, heads, queries, keys]`, non-zero where it may (Keras' boolean
    /// `attention_mask`; a padding mask `[batch, 1, 1, keys]`). Read in place, never stretched.
    pub mask: Option<&'a Tensor>,
    /// Dropout on the weights, in training.
    pub dropout: Option<AttentionDropout>,
}

/// `softmax(q·kᵀ·scale, masked) · v` for `q [batch, heads, queries, depth]`,
/// `k [batch, heads, keys, depth]` and `v [batch, heads, keys, value_depth]`, giving
/// `[batch, heads, queries, value_depth]`.
///
/// Computed in tiles with a running softmax (the idea of `FlashAttention`), so no
/// `queries × keys` matrix is ever held: memory grows linearly with the sequence. The backward
/// pass recomputes the scores tile by tile from each query's log-sum-exp, the one statistic
/// kept. Equal to the composed operations ([`super::matmul`], [`super::softmax`],
/// [`super::select`]) up to rounding, and the same bits from run to run and on any thread
/// count. A query that may attend to no key gets zeros (the composed softmax would give NaN).
///
/// ```
/// use lockstep_tensor::{Tensor, ops};
///
/// // One head, two positions, depth 1: causal, so the first query sees only the first key.
/// let q = Tensor::from_vec(vec![1.0, 1.0], &[1, 1, 2, 1])?;
/// let k = Tensor::from_vec(vec![0.0, 0.0], &[1, 1, 2, 1])?;
/// let v = Tensor::from_vec(vec![2.0, 4.0], &[1, 1, 2, 1])?;
/// let options = ops::Attention { causal: true, ..Default::default() };
/// let y = ops::scaled_dot_product_attention(&q, &k, &v, &options)?;
/// assert_eq!(y.host_data()?, [2.0, 3.0]);
/// # Ok::<(), lockstep_tensor::TensorError>(())
/// ```
///
/// # Errors
///
/// When the operands are not 4-D or their sizes disagree, a depth is zero, the mask does not
/// broadcast, the scale is not finite or the dropout rate is outside `[0, 1)`; on a GPU (the
/// operation runs on the CPU only).
pub fn scaled_dot_product_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    options: &Attention<'_>,
) -> Result<Tensor, TensorError> {
    const OP: &str = "scaled_dot_product_attention";
    let n = sizes(q, k, v)?;
    let scale = options.scale.unwrap_or(1.0 / (n.depth as f32).sqrt());
    if !scale.is_finite() {
        return Err(TensorError::invalid(
            OP,
            format!("scale {scale} is not finite"),
        ));
    }
    if let Some(d) = options.dropout
        && !(0.0..1.0).contains(&d.rate)
    {
        return Err(TensorError::invalid(
            OP,
            format!("dropout rate {} must be in [0, 1)", d.rate),
        ));
    }
    let full = [n.batch, n.heads, n.queries, n.keys];
    let mask = options
        .mask
        .map(|m| Ok::<_, TensorError>((m.to_host()?, mask_strides(m.shape(), &full)?)))
        .transpose()?;
    let mut operands = vec![q, k, v];
    operands.extend(options.mask);
    if let On::Cuda(_) = on(OP, &operands)? {
        return Err(TensorError::device(OP, q.device(), "runs on the CPU only"));
    }
    let weighing = Weighing {
        scale,
        causal: options.causal,
        dropout: options.dropout.map(|d| WeightDropout {
            rate: d.rate,
            seed: d.seed,
            first_example: d.first_example,
        }),
    };
    let (out, lse) = kernel::forward(
        q.host(),
        k.host(),
        v.host(),
        n,
        weighing.rules(mask.as_ref()),
    )?;
    let shape = vec![n.batch, n.heads, n.queries, n.value_depth];
    let (kq, kk, kv) = (q.detach(), k.detach(), v.detach());
    Ok(Tensor::from_op(out, shape, &[q, k, v], move |g, y| {
        let (dq, dk, dv) = kernel::backward(
            (kq.host(), kk.host(), kv.host()),
            (y.host(), &lse, g.host()),
            n,
            weighing.rules(mask.as_ref()),
        )?;
        Ok(vec![
            Some(Tensor::raw(dq, kq.shape().to_vec())),
            Some(Tensor::raw(dk, kk.shape().to_vec())),
            Some(Tensor::raw(dv, kv.shape().to_vec())),
        ])
    }))
}

/// The settings of one call that the backward pass needs again.
#[derive(Debug, Clone, Copy)]
struct Weighing {
    scale: f32,
    causal: bool,
    dropout: Option<WeightDropout>,
}

impl Weighing {
    /// The kernel's rules, with the mask (on the host) and its strides.
    fn rules(self, mask: Option<&(Tensor, [usize; 4])>) -> Rules<'_> {
        Rules {
            scale: self.scale,
            causal: self.causal,
            mask: mask.map(|(m, strides)| MaskView {
                data: m.host(),
                strides: *strides,
            }),
            dropout: self.dropout,
        }
    }
}

/// The sizes of `q`, `k` and `v`, checked against each other.
fn sizes(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Sizes, TensorError> {
    const OP: &str = "scaled_dot_product_attention";
    let (&[batch, heads, queries, depth], &[kb, kh, keys, kd], &[vb, vh, vk, value_depth]) =
        (q.shape(), k.shape(), v.shape())
    else {
        return Err(TensorError::invalid(
            OP,
            format!(
                "q, k and v must be [batch, heads, positions, depth], not {:?}, {:?} and {:?}",
                q.shape(),
                k.shape(),
                v.shape()
            ),
        ));
    };
    if (kb, kh, kd) != (batch, heads, depth) {
        return Err(TensorError::mismatch(
            OP,
            q.shape(),
            k.shape(),
            "the keys' batch, heads and depth must be the queries'",
        ));
    }
    if (vb, vh, vk) != (batch, heads, keys) {
        return Err(TensorError::mismatch(
            OP,
            k.shape(),
            v.shape(),
            "the values' batch, heads and positions must be the keys'",
        ));
    }
    if depth == 0 || value_depth == 0 {
        return Err(TensorError::invalid(
            OP,
            format!("a depth of zero in {:?} and {:?}", q.shape(), v.shape()),
        ));
    }
    count_values(OP, &[batch, heads, queries, keys.max(value_depth)])?;
    Ok(Sizes {
        batch,
        heads,
        queries,
        keys,
        depth,
        value_depth,
    })
}

/// The strides to read a mask of `shape` at each position of `full` (aligned on the right,
/// zero along axes it broadcasts over).
fn mask_strides(shape: &[usize], full: &[usize; 4]) -> Result<[usize; 4], TensorError> {
    const OP: &str = "scaled_dot_product_attention";
    if shape.len() > 4 {
        return Err(TensorError::mismatch(
            OP,
            shape,
            full,
            "a mask has at most four axes",
        ));
    }
    let mut strides = [0_usize; 4];
    let mut stride = 1;
    for (i, &dim) in shape.iter().enumerate().rev() {
        let axis = i + 4 - shape.len();
        if dim == full[axis] && dim != 1 {
            strides[axis] = stride;
        } else if dim != 1 {
            return Err(TensorError::mismatch(
                OP,
                shape,
                full,
                format!(
                    "the mask's dimension {dim} cannot broadcast to {}",
                    full[axis]
                ),
            ));
        }
        stride *= dim;
    }
    Ok(strides)
}
