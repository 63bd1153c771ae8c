//! Layer-sized operations: a product, its bias and a relu in one pass over the output (and a
//! convolution with the max pooling after it). They give the same values as the separate
//! operations; they exist because the separate passes over large activations (and their
//! allocations) cost as much as the products themselves.

use super::activation::relu_grad;
use super::conv::{Padding, geometry, max_pool2d};
use super::gpu::{self, On, on};
use crate::error::TensorError;
use crate::kernels::conv::{conv2d as conv_kernel, conv2d_backward};
use crate::kernels::conv_pool::PooledConv;
use crate::kernels::elementwise::{relu_in_place, repeat_rows};
use crate::kernels::gemm::{MatRef, matmul as gemm, matmul_new as gemm_new};
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
    let mut out = match bias {
        // Without a bias the product overwrites its destination: none is zero-filled first.
        None => gemm_new(plain(x, m, k), plain(w, k, n))?,
        Some(bias) => {
            let mut out = repeat_rows(Some(bias.host()), m, n);
            gemm(&mut out, plain(x, m, k), plain(w, k, n), true)?;
            out
        }
    };
    if relu {
        relu_in_place(&mut out);
    }
    let (input, weights, has_bias) = (x.clone(), w.clone(), bias.is_some());
    // In parts: the weights' and the bias' gradients can be asked for before the input's, so
    // that a data-parallel step sends them while the input's is computed.
    Ok(Tensor::from_op_in_parts(
        out,
        vec![m, n],
        &inputs(x, w, bias),
        move |d, y, wanted| {
            let wants = |index: usize| wanted.get(index).copied().unwrap_or(false);
            let d = if relu { relu_grad(d, y)? } else { d.clone() };
            // The two products are independent: run side by side, each GEMM's own threads
            // have more to share (a 64-row product alone keeps two threads only ~70% busy).
            let (dx, dw) = rayon::join(
                || {
                    (wants(0) && input.requires_grad()).then(|| {
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
                    })
                },
                || {
                    (wants(1) && weights.requires_grad()).then(|| {
                        let dw = gemm_new(
                            MatRef {
                                data: input.host(),
                                rows: m,
                                cols: k,
                                transposed: true,
                            },
                            plain(&d, m, n),
                        )?;
                        Ok::<_, TensorError>(Tensor::raw(dw, vec![k, n]))
                    })
                },
            );
            let mut grads = vec![dx.transpose()?, dw.transpose()?];
            if has_bias {
                grads.push(wants(2).then(|| Tensor::raw(sum_rows(d.host(), n), vec![n])));
            }
            Ok(grads)
        },
    ))
}

fn plain(t: &Tensor, rows: usize, cols: usize) -> MatRef<'_> {
    MatRef {
        data: t.host(),
        rows,
        cols,
        transposed: false,
    }
}
