//! Layer-sized operations: a product, its bias and a relu in one pass over the output (and a
//! convolution with the max pooling after it). They give the same values as the separate
//! operations; they exist because the separate passes over large activations (and their
//! allocations) cost as much as the products themselves.

use std::ops::Range;

use super::activation::relu_grad;
use super::conv::{Padding, geometry, max_pool2d};
use super::gpu::{self, On, on};
use crate::error::TensorError;
use crate::kernels::conv::{conv2d as conv_kernel, conv2d_backward};
use crate::kernels::conv_pool::PooledConv;
use crate::kernels::elementwise::{relu_in_place, repeat_rows};
use crate::kernels::gemm::{MatRef, matmul_block as gemm_block, matmul_new as gemm_new};
use crate::kernels::geometry::{Geometry, Grads, OutputGrad, PoolWindow, Wanted};
use crate::kernels::reduce::sum_rows;
use crate::kernels::window_max::PooledGrad;
use crate::tensor::{Tensor, count_values};

fn check_bias(
    op: &'static str,
    bias: Option<&Tensor>,
    x: &Tensor,
    units: usize,
) -> Result<(), TensorError> {
    match bias {
        Some(b) if b.shape() != [units] => Err(TensorError::mismatch(
            op,
            x.shape(),
            b.shape(),
            format!("the bias must have shape [{units}]"),
        )),
        _ => Ok(()),
    }
}

pub(super) fn inputs<'a>(
    first: &'a Tensor,
    second: &'a Tensor,
    bias: Option<&'a Tensor>,
) -> Vec<&'a Tensor> {
    [first, second].into_iter().chain(bias).collect()
}

/// The gradients a convolution's backward pass computes: those its operands want.
fn wanted(input: &Tensor, kernel: &Tensor, has_bias: bool) -> Wanted {
    Wanted {
        input: input.requires_grad(),
        kernel: kernel.requires_grad(),
        bias: has_bias,
    }
}

/// A convolution's gradients as the backward rule returns them: input, kernel, and the bias's
/// when there is one.
fn conv_grads(
    grads: Grads,
    input: &Tensor,
    kernel: &Tensor,
    has_bias: bool,
) -> Vec<Option<Tensor>> {
    let mut out = vec![
        grads.input.map(|v| Tensor::raw(v, input.shape().to_vec())),
        grads
            .kernel
            .map(|v| Tensor::raw(v, kernel.shape().to_vec())),
    ];
    if has_bias {
        let filters = kernel.shape().last().copied().unwrap_or(0);
        out.push(grads.bias.map(|v| Tensor::raw(v, vec![filters])));
    }
    out
}

/// The convolution's geometry and filter count, once `x`, the kernel and the bias are checked
/// to fit.
pub(super) fn conv_geometry(
    x: &Tensor,
    kernel: &Tensor,
    bias: Option<&Tensor>,
    stride: (usize, usize),
    padding: Padding,
) -> Result<(Geometry, usize), TensorError> {
    let &[kh, kw, c_in, filters] = kernel.shape() else {
        return Err(TensorError::mismatch(
            "conv2d",
            x.shape(),
            kernel.shape(),
            "the kernel must be [kh, kw, c_in, c_out]",
        ));
    };
    let g = geometry("conv2d", x.shape(), (kh, kw), stride, padding)?;
    if g.channels != c_in {
        return Err(TensorError::mismatch(
            "conv2d",
            x.shape(),
            kernel.shape(),
            format!(
                "the input has {} channels, the kernel expects {c_in}",
                g.channels
            ),
        ));
    }
    check_bias("conv2d", bias, x, filters)?;
    // The output and the kernel's sizes as the kernels compute them (a zero channel count
    // can hide an overflow of the others' product).
    count_values("conv2d", &[g.batch, g.out_h, g.out_w, filters])?;
    count_values("conv2d", &[kh, kw, c_in, filters])?;
    Ok((g, filters))
}

/// `relu?(conv2d(x, kernel) + bias)` — what a Keras `Conv2D` layer computes.
///
/// ```
/// use lockstep_tensor::{Tensor, ops::{self, Padding}};
///
/// let x = Tensor::from_vec(vec![1.0, -2.0, 3.0, -4.0], &[1, 2, 2, 1])?;
/// let k = Tensor::from_vec(vec![1.0], &[1, 1, 1, 1])?;
/// let b = Tensor::from_vec(vec![0.5], &[1])?;
/// let y = ops::conv2d_bias_relu(&x, &k, Some(&b), true, (1, 1), Padding::Valid)?;
/// assert_eq!(y.host_data()?, [1.5, 0.0, 3.5, 0.0]);
/// # Ok::<(), lockstep_tensor::TensorError>(())
/// ```
///
/// # Errors
///
/// As [`super::conv2d`], and when the bias is not `[filters]`.
pub fn conv2d_bias_relu(
    x: &Tensor,
    kernel: &Tensor,
    bias: Option<&Tensor>,
    relu: bool,
    stride: (usize, usize),
    padding: Padding,
) -> Result<Tensor, TensorError> {
    let (g, filters) = conv_geometry(x, kernel, bias, stride, padding)?;
    if let On::Cuda(buffers) = on("conv2d", &inputs(x, kernel, bias))? {
        return gpu::conv2d((x, kernel, bias), &buffers, &g, filters, relu);
    }
    let (out, lowering) = conv_kernel(
        x.host(),
        kernel.host(),
        bias.map(Tensor::host),
        relu,
        filters,
        &g,
    )?;
    let (input, weights, has_bias) = (x.clone(), kernel.clone(), bias.is_some());
    let shape = vec![g.batch, g.out_h, g.out_w, filters];
    Ok(Tensor::from_op(
        out,
        shape,
        &inputs(x, kernel, bias),
        move |d, y| {
            let wanted = wanted(&input, &weights, has_bias);
            let grad = OutputGrad {
                values: d.host(),
                relu_output: relu.then(|| y.host()),
            };
            let grads = conv2d_backward(
                &lowering,
                input.host(),
                weights.host(),
                grad,
                filters,
                &g,
                wanted,
            )?;
            Ok(conv_grads(grads, &input, &weights, has_bias))
        },
    ))
}

/// The max pooling that follows a convolution in [`conv2d_bias_relu_max_pool`]: its window,
/// stride and padding, as [`super::max_pool2d`] takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxPool {
    /// The window, rows × columns.
    pub size: (usize, usize),
    /// How far the window moves.
    pub stride: (usize, usize),
    /// How windows meet the border.
    pub padding: Padding,
}

/// `max_pool2d(relu?(conv2d(x, kernel) + bias))` — a Keras `Conv2D` layer followed by
/// `MaxPooling2D`, in one pass where that is faster.
///
/// With non-overlapping windows the full-size convolution output and its gradient are never
/// stored: a convolution with few kernel values per output (a first layer: 3×3 over grey or
/// colour pixels, whose input wants no gradient) is computed directly, window by window; one
/// that runs Winograd's algorithm pools each 4×4 (or 2×2) block of outputs as it leaves the
/// transform, when the windows fit those blocks. Otherwise this is exactly the two operations
/// one after the other. Either way the values are theirs up to rounding.
///
/// ```
/// use lockstep_tensor::{Tensor, ops::{self, MaxPool, Padding}};
///
/// let x = Tensor::from_vec((0..16).map(|v| v as f32).collect(), &[1, 4, 4, 1])?;
/// let k = Tensor::from_vec(vec![-1.0], &[1, 1, 1, 1])?;
/// let b = Tensor::from_vec(vec![10.0], &[1])?;
/// let pool = MaxPool { size: (2, 2), stride: (2, 2), padding: Padding::Valid };
/// let y = ops::conv2d_bias_relu_max_pool(&x, &k, Some(&b), true, (1, 1), Padding::Valid, pool)?;
/// assert_eq!(y.shape(), [1, 2, 2, 1]);
/// assert_eq!(y.host_data()?, [10.0, 8.0, 2.0, 0.0]);
/// # Ok::<(), lockstep_tensor::TensorError>(())
/// ```
///
/// # Errors
///
/// As [`conv2d_bias_relu`], and as [`super::max_pool2d`] for the pooling of its output.
pub fn conv2d_bias_relu_max_pool(
    x: &Tensor,
    kernel: &Tensor,
    bias: Option<&Tensor>,
    relu: bool,
    stride: (usize, usize),
    padding: Padding,
    pool: MaxPool,
) -> Result<Tensor, TensorError> {
    let (g, filters) = conv_geometry(x, kernel, bias, stride, padding)?;
    let conv_out = [g.batch, g.out_h, g.out_w, filters];
    let pooled = geometry(
        "max_pool2d",
        &conv_out,
        pool.size,
        pool.stride,
        pool.padding,
    )?;
    let window = PoolWindow {
        h: pool.size.0,
        w: pool.size.1,
    };
    // On a GPU, the two operations one after the other (a fused GPU kernel is later work).
    let on_cpu = matches!(on("conv2d", &inputs(x, kernel, bias))?, On::Cpu);
    let fused = (on_cpu && pool.stride == pool.size && pool.padding == Padding::Valid)
        .then(|| PooledConv::new(&g, filters, window, x.requires_grad()))
        .flatten();
    let Some(layer) = fused else {
        let y = conv2d_bias_relu(x, kernel, bias, relu, stride, padding)?;
        return max_pool2d(&y, pool.size, pool.stride, pool.padding);
    };
    let (out, argmax) = layer.forward(x.host(), kernel.host(), bias.map(Tensor::host), relu);
    let (input, weights, has_bias) = (x.clone(), kernel.clone(), bias.is_some());
    let shape = vec![g.batch, pooled.out_h, pooled.out_w, filters];
    Ok(Tensor::from_op(
        out,
        shape,
        &inputs(x, kernel, bias),
        move |d, y| {
            let grad = PooledGrad {
                values: d.host(),
                relu_output: relu.then(|| y.host()),
                argmax: &argmax,
            };
            let wanted = wanted(&input, &weights, has_bias);
            let grads = layer.backward(input.host(), weights.host(), grad, wanted);
            Ok(conv_grads(grads, &input, &weights, has_bias))
        },
    ))
}

/// `relu?(x · w + bias)` for `x [batch, in]`, `w [in, out]` — what a Keras `Dense` layer
/// computes.
///
/// # Errors
///
/// When the shapes do not fit, or the bias is not `[out]`.
pub fn dense(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    relu: bool,
) -> Result<Tensor, TensorError> {
    product("dense", x, w, bias, relu)
}

/// `relu?(x · w + bias)`, with errors named after `op` (`matmul` is this without bias or relu).
pub(crate) fn product(
    op: &'static str,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    relu: bool,
) -> Result<Tensor, TensorError> {
    let (&[m, k], &[k2, n]) = (x.shape(), w.shape()) else {
        return Err(TensorError::mismatch(
            op,
            x.shape(),
            w.shape(),
            "both operands must be 2-D",
        ));
    };
    if k != k2 {
        return Err(TensorError::mismatch(
            op,
            x.shape(),
            w.shape(),
            format!("inner dimensions {k} and {k2} differ"),
        ));
    }
    check_bias(op, bias, x, n)?;
    count_values(op, &[m, n])?;
    if let On::Cuda(buffers) = on(op, &inputs(x, w, bias))? {
        return gpu::product(op, (x, w, bias), &buffers, (m, k, n), relu);
    }
    let mut blocks = DenseByBlocks::new(x, (k, n), bias.map(Tensor::host))?;
    while let Some(rows) = blocks.next_rows() {
        blocks.add(&w.host()[rows])?;
    }
    blocks.finish(w, bias, relu)
}

/// Bytes of a dense layer's kernel in each block of rows its product is summed over
/// ([`dense_blocks`]).
pub const DENSE_BLOCK_BYTES: usize = 256 << 10;

/// The blocks of rows of a `k × n` dense kernel, in the order a dense layer's product sums
/// them, the last first: on the CPU the product is `bias + Σ x[:, rows] · w[rows, :]` summed
/// in this order in every path, and the kernel's gradient is computed block by block in it.
/// A pass can then take each block as soon as its rows are final (an update that lands piece by
/// piece from the end of the gradient buffer, [`DenseByBlocks`]) and a backward pass can hand
/// each block's gradient over as soon as it is computed, and both give the bits of a pass that
/// has the whole kernel at once. One block for a kernel of at most [`DENSE_BLOCK_BYTES`].
///
/// ```
/// use lockstep_tensor::ops::dense_blocks;
///
/// assert_eq!(dense_blocks(784, 10), [0..784]);
/// assert_eq!(dense_blocks(1200, 128), [1024..1200, 512..1024, 0..512]);
/// ```
pub fn dense_blocks(k: usize, n: usize) -> Vec<Range<usize>> {
    let rows = (DENSE_BLOCK_BYTES / 4 / n.max(1)).max(1);
    let mut blocks: Vec<Range<usize>> = (0..k)
        .step_by(rows)
        .map(|start| start..(start + rows).min(k))
        .collect();
    blocks.reverse();
    if blocks.is_empty() {
        blocks.push(0..0);
    }
    blocks
}

/// A dense layer's product `relu?(x · w + bias)` on the CPU computed one block of the kernel's
/// rows at a time, in [`dense_blocks`]' order, each as soon as the caller has its rows: the
/// same bits as [`dense`].
///
/// ```
/// use lockstep_tensor::{Tensor, ops::{self, DenseByBlocks}};
///
/// let x = Tensor::from_vec(vec![1.0, 2.0], &[1, 2])?;
/// let w = Tensor::from_vec(vec![3.0, 4.0], &[2, 1])?;
/// let mut blocks = DenseByBlocks::new(&x, (2, 1), None)?;
/// while let Some(rows) = blocks.next_rows() {
///     blocks.add(&w.host_data()?[rows])?;
/// }
/// let y = blocks.finish(&w, None, false)?;
/// assert_eq!(y.host_data()?, ops::dense(&x, &w, None, false)?.host_data()?);
/// # Ok::<(), lockstep_tensor::TensorError>(())
/// ```
pub struct DenseByBlocks {
    x: Tensor,
    m: usize,
    k: usize,
    n: usize,
    out: Vec<f32>,
    blocks: Vec<Range<usize>>,
    next: usize,
    has_bias: bool,
}

impl DenseByBlocks {
    /// The product of `x [m, k]` and a `k × n` kernel, started from the `n` values of
    /// `bias`.
    ///
    /// # Errors
    ///
    /// When `x` is not `[m, k]` on the CPU, or the bias does not hold `n` values.
    pub fn new(
        x: &Tensor,
        (k, n): (usize, usize),
        bias: Option<&[f32]>,
    ) -> Result<Self, TensorError> {
        let &[m, k2] = x.shape() else {
            return Err(TensorError::mismatch(
                "dense",
                x.shape(),
                &[k, n],
                "both operands must be 2-D",
            ));
        };
        if k2 != k {
            return Err(TensorError::mismatch(
                "dense",
                x.shape(),
                &[k, n],
                format!("inner dimensions {k2} and {k} differ"),
            ));
        }
        if let Some(bias) = bias.filter(|bias| bias.len() != n) {
            return Err(TensorError::mismatch(
                "dense",
                x.shape(),
                &[bias.len()],
                format!("the bias must hold {n} values"),
            ));
        }
        count_values("dense", &[m, n])?;
        if !matches!(on("dense", &[x])?, On::Cpu) {
            return Err(TensorError::invalid(
                "dense",
                "a product by blocks runs on the CPU",
            ));
        }
        let out = match bias {
            Some(bias) => repeat_rows(Some(bias), m, n),
            None => vec![0.0; m * n],
        };
        Ok(Self {
            x: x.clone(),
            m,
            k,
            n,
            out,
            blocks: dense_blocks(k, n),
            next: 0,
            has_bias: bias.is_some(),
        })
    }

    /// The kernel rows [`DenseByBlocks::add`] takes next, as a range of the kernel's values
    /// (row-major); `None` once every block is in.
    pub fn next_rows(&self) -> Option<Range<usize>> {
        let rows = self.blocks.get(self.next)?;
        Some(rows.start * self.n..rows.end * self.n)
    }

    /// Adds the product of the next block: `values` are the kernel's values
    /// [`DenseByBlocks::next_rows`] names.
    ///
    /// # Errors
    ///
    /// When every block is in, or `values` is not the block's length.
    pub fn add(&mut self, values: &[f32]) -> Result<(), TensorError> {
        let Some(rows) = self.blocks.get(self.next).cloned() else {
            return Err(TensorError::invalid(
                "dense",
                "every block of the kernel is in",
            ));
        };
        if values.len() != rows.len() * self.n {
            return Err(TensorError::invalid(
                "dense",
                format!(
                    "kernel rows {}..{} hold {} values, not {}",
                    rows.start,
                    rows.end,
                    rows.len() * self.n,
                    values.len()
                ),
            ));
        }
        // Without a bias the first block's product overwrites the zeros.
        let accumulate = self.has_bias || self.next > 0;
        gemm_block(
            &mut self.out,
            plain(&self.x, self.m, self.k),
            rows.clone(),
            MatRef {
                data: values,
                rows: rows.len(),
                cols: self.n,
                transposed: false,
            },
            accumulate,
        )?;
        self.next += 1;
        Ok(())
    }

    /// The layer's output, recorded for the backward pass with `w` as the kernel (the one
    /// whose rows were added) and `bias` as the bias (the one whose values
    /// [`DenseByBlocks::new`] took).
    ///
    /// # Errors
    ///
    /// When a block is missing, `w` is not `[k, n]`, or `bias` is not the one the product
    /// started from.
    pub fn finish(
        self,
        w: &Tensor,
        bias: Option<&Tensor>,
        relu: bool,
    ) -> Result<Tensor, TensorError> {
        let Self {
            x,
            m,
            k,
            n,
            mut out,
            blocks,
            next,
            has_bias,
        } = self;
        if next < blocks.len() {
            return Err(TensorError::invalid(
                "dense",
                format!("{} of {} kernel blocks are in", next, blocks.len()),
            ));
        }
        if w.shape() != [k, n] || bias.is_some() != has_bias {
            return Err(TensorError::mismatch(
                "dense",
                x.shape(),
                w.shape(),
                "not the kernel and bias the product started with",
            ));
        }
        if relu {
            relu_in_place(&mut out);
        }
        Ok(record_product(out, (&x, w, bias), (m, k, n), relu))
    }
}

/// The backward rule of `relu?(x · w + bias)`, recorded on its output `out`.
fn record_product(
    out: Vec<f32>,
    (x, w, bias): (&Tensor, &Tensor, Option<&Tensor>),
    (m, k, n): (usize, usize, usize),
    relu: bool,
) -> Tensor {
    let (input, weights, has_bias) = (x.clone(), w.clone(), bias.is_some());
    // In parts: the weights' and the bias' gradients can be asked for before the input's, so
    // that a data-parallel step sends them while the input's is computed, the weights' block
    // by block.
    Tensor::from_op_in_parts(
        out,
        vec![m, n],
        &inputs(x, w, bias),
        move |d, y, wanted, hand_over| {
            let wants = |index: usize| wanted.get(index).copied().unwrap_or(false);
            let d = if relu { relu_grad(d, y)? } else { d.clone() };
            let want_dx = wants(0) && input.requires_grad();
            let want_dw = wants(1) && weights.requires_grad();
            let dx = || {
                let dx = gemm_new(
                    plain(&d, m, n),
                    MatRef {
                        data: weights.host(),
                        rows: k,
                        cols: n,
                        transposed: true,
                    },
                )?;
                Ok::<_, TensorError>(Tensor::raw(dx, vec![m, k]))
            };
            // The bias' gradient, summed once: handed over first below, and returned.
            let db = (has_bias && wants(2)).then(|| sum_rows(d.host(), n));
            let (dx, dw) = if want_dx && want_dw {
                // The two products are independent: run side by side, each GEMM's own threads
                // have more to share (a 64-row product alone keeps two threads only ~70% busy).
                let (dx, dw) = rayon::join(dx, || {
                    weight_gradient(&input, &d, (m, k, n), &mut |_, _| Ok(()))
                });
                (Some(dx), Some(dw))
            } else {
                // The bias' gradient, cheap, goes first: it follows the kernel in the gradient
                // buffer, which a data-parallel step sends from its end.
                if let Some(db) = db.as_deref().filter(|_| want_dw) {
                    hand_over(2, 0..n, db)?;
                }
                let dw = want_dw.then(|| {
                    weight_gradient(&input, &d, (m, k, n), &mut |rows, values| {
                        hand_over(1, rows, values)
                    })
                });
                (want_dx.then(dx), dw)
            };
            let mut grads = vec![dx.transpose()?, dw.transpose()?];
            if has_bias {
                grads.push(db.map(|db| Tensor::raw(db, vec![n])));
            }
            Ok(grads)
        },
    )
}

/// Where a rule hands a block of one gradient: its range of values, and the values.
type RowsOf<'a> = dyn FnMut(Range<usize>, &[f32]) -> Result<(), TensorError> + 'a;

/// The kernel's gradient `x^T · d`, computed in [`dense_blocks`]' order, each block handed to
/// `hand_over` (its range of the kernel's values, and those values) as soon as it is computed
/// when there is more than one.
fn weight_gradient(
    input: &Tensor,
    d: &Tensor,
    (m, k, n): (usize, usize, usize),
    hand_over: &mut RowsOf<'_>,
) -> Result<Tensor, TensorError> {
    let blocks = dense_blocks(k, n);
    let read = MatRef {
        data: input.host(),
        rows: m,
        cols: k,
        transposed: true,
    };
    if blocks.len() == 1 {
        let dw = gemm_new(read, plain(d, m, n))?;
        return Ok(Tensor::raw(dw, vec![k, n]));
    }
    let mut dw = vec![0.0; k * n];
    for rows in blocks {
        let values = rows.start * n..rows.end * n;
        let slot = &mut dw[values.clone()];
        gemm_block(slot, read, rows, plain(d, m, n), false)?;
        hand_over(values, slot)?;
    }
    Ok(Tensor::raw(dw, vec![k, n]))
}

fn plain(t: &Tensor, rows: usize, cols: usize) -> MatRef<'_> {
    MatRef {
        data: t.host(),
        rows,
        cols,
        transposed: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.37 + seed).sin()).collect()
    }

    #[test]
    fn a_dense_product_over_several_blocks_is_the_product() {
        let (m, k, n) = (3, 1100, 130);
        let x = values(m * k, 0.1);
        let w = values(k * n, 0.2);
        let bias = values(n, 0.3);
        assert!(dense_blocks(k, n).len() > 1);
        let y = dense(
            &Tensor::from_vec(x.clone(), &[m, k]).unwrap(),
            &Tensor::from_vec(w.clone(), &[k, n]).unwrap(),
            Some(&Tensor::from_vec(bias.clone(), &[n]).unwrap()),
            false,
        )
        .unwrap();
        let y = y.host_data().unwrap();
        for i in 0..m {
            for j in 0..n {
                let expected: f64 = f64::from(bias[j])
                    + (0..k)
                        .map(|p| f64::from(x[i * k + p]) * f64::from(w[p * n + j]))
                        .sum::<f64>();
                let got = f64::from(y[i * n + j]);
                assert!(
                    (got - expected).abs() < 1e-3,
                    "[{i}][{j}]: {got} against {expected}"
                );
            }
        }
    }

    #[test]
    fn blocks_cover_the_rows_once_the_last_first() {
        for (k, n) in [
            (0, 5),
            (1, 1),
            (511, 128),
            (512, 128),
            (513, 128),
            (70_000, 1),
            (9, 100_000),
        ] {
            let blocks = dense_blocks(k, n);
            let mut covered: Vec<usize> = blocks.iter().rev().flat_map(Clone::clone).collect();
            covered.dedup();
            assert_eq!(covered, (0..k).collect::<Vec<_>>(), "{k}×{n}");
            assert!(blocks.windows(2).all(|pair| pair[1].end == pair[0].start));
        }
    }

    #[test]
    fn a_product_by_blocks_refuses_a_block_of_the_wrong_length_or_a_missing_one() {
        let x = Tensor::from_vec(values(2 * 1100, 0.1), &[2, 1100]).unwrap();
        let w = Tensor::from_vec(values(1100 * 130, 0.2), &[1100, 130]).unwrap();
        let mut blocks = DenseByBlocks::new(&x, (1100, 130), None).unwrap();
        assert!(blocks.add(&[1.0; 3]).is_err());
        let rows = blocks.next_rows().unwrap();
        blocks.add(&w.host_data().unwrap()[rows]).unwrap();
        assert!(blocks.finish(&w, None, false).is_err());
        assert!(DenseByBlocks::new(&x, (1000, 130), None).is_err());
    }
}
