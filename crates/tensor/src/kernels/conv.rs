//! 2-D convolution in NHWC layout, as Keras lays tensors out: 3×3 kernels at stride 1 with
//! enough channels by Winograd's algorithm ([`super::winograd`]), everything else by im2col
//! and GEMM.

use rayon::prelude::*;

use super::elementwise::{relu_in_place, zip};
use super::gemm::{MatRef, matmul, matmul_new};
use super::geometry::{Geometry, Grads, OutputGrad, Wanted};
use super::reduce::sum_rows;
use super::winograd::{self, Tiling};
use crate::error::TensorError;

/// Unfolds every kernel window into a row: `[batch·out_h·out_w, kernel_h·kernel_w·channels]`.
pub(crate) fn im2col(input: &[f32], g: &Geometry) -> Vec<f32> {
    let (patch, c) = (g.patch(), g.channels);
    let image_in = g.height * g.width * c;
    let mut cols = vec![0.0_f32; g.batch * g.out_pixels() * patch];
    if cols.is_empty() {
        // No window or no channel: nothing to unfold (and no chunk size to split by).
        return cols;
    }
    cols.par_chunks_mut(g.out_pixels() * patch)
        .enumerate()
        .for_each(|(b, image_cols)| {
            let image = &input[b * image_in..(b + 1) * image_in];
            for (pixel, row) in image_cols.chunks_exact_mut(patch).enumerate() {
                let (oy, ox) = (pixel / g.out_w, pixel % g.out_w);
                if let Some((y0, x0)) = g.window_inside(oy, ox) {
                    // The whole window in the image: each kernel row is one run of the input.
                    let span = g.kernel_w * c;
                    for (ky, run) in row.chunks_exact_mut(span).enumerate() {
                        let from = ((y0 + ky) * g.width + x0) * c;
                        for (to, &v) in run.iter_mut().zip(&image[from..from + span]) {
                            *to = v;
                        }
                    }
                    continue;
                }
                for ky in 0..g.kernel_h {
                    for kx in 0..g.kernel_w {
                        if let Some((y, x)) = g.source(oy, ox, ky, kx) {
                            let at = (ky * g.kernel_w + kx) * c;
                            let from = (y * g.width + x) * c;
                            if c == 1 {
                                // One channel (a first layer): a plain store beats a slice copy.
                                row[at] = image[from];
                            } else {
                                row[at..at + c].copy_from_slice(&image[from..from + c]);
                            }
                        }
                    }
                }
            }
        });
    cols
}

/// The inverse scatter of [`im2col`]: adds each row's values back into the input positions
/// they came from. Parallel over images, each image summed in a fixed order.
pub(crate) fn col2im(cols: &[f32], g: &Geometry) -> Vec<f32> {
    let (patch, c) = (g.patch(), g.channels);
    let image_in = g.height * g.width * c;
    let mut input = vec![0.0_f32; g.batch * image_in];
    input
        .par_chunks_mut(image_in)
        .enumerate()
        .for_each(|(b, image)| {
            let image_cols = &cols[b * g.out_pixels() * patch..(b + 1) * g.out_pixels() * patch];
            for (pixel, row) in image_cols.chunks_exact(patch).enumerate() {
                let (oy, ox) = (pixel / g.out_w, pixel % g.out_w);
                for ky in 0..g.kernel_h {
                    for kx in 0..g.kernel_w {
                        if let Some((y, x)) = g.source(oy, ox, ky, kx) {
                            let at = (ky * g.kernel_w + kx) * c;
                            let to = (y * g.width + x) * c;
                            for (dst, &v) in image[to..to + c].iter_mut().zip(&row[at..at + c]) {
                                *dst += v;
                            }
                        }
                    }
                }
            }
        });
    input
}

/// How a convolution was computed, with what its kernel's gradient needs from the forward
/// pass.
#[derive(Debug)]
pub(crate) enum Lowering {
    /// By im2col: the rows, which the kernel's gradient multiplies again.
    Im2col(Vec<f32>),
    /// By Winograd's algorithm: the backward pass transforms the input again (cheaper than
    /// keeping every tile).
    Winograd(Tiling),
}

/// `relu?(conv2d(input, kernel) + bias)` as `[batch, out_h, out_w, filters]`, and how it was
/// computed.
pub(crate) fn conv2d(
    input: &[f32],
    kernel: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    filters: usize,
    g: &Geometry,
) -> Result<(Vec<f32>, Lowering), TensorError> {
    if let Some(t) = winograd::tiling(g, filters) {
        let out = winograd::conv2d(t, input, kernel, bias, relu, filters, g);
        return Ok((out, Lowering::Winograd(t)));
    }
    let (mut out, cols) = im2col_conv2d(input, kernel, bias, filters, g)?;
    if relu {
        relu_in_place(&mut out);
    }
    Ok((out, Lowering::Im2col(cols)))
}

/// The gradients of `relu?(conv2d(input, kernel) + bias)`, computed as `lowering` computed the
/// forward pass.
pub(crate) fn conv2d_backward(
    lowering: &Lowering,
    input: &[f32],
    kernel: &[f32],
    grad: OutputGrad<'_>,
    filters: usize,
    g: &Geometry,
    wanted: Wanted,
) -> Result<Grads, TensorError> {
    let cols = match lowering {
        Lowering::Winograd(t) => {
            let grad = winograd::OutputGradient::Whole(grad);
            return Ok(winograd::backward(
                *t, input, kernel, grad, filters, g, wanted,
            ));
        }
        Lowering::Im2col(cols) => cols,
    };
    let masked;
    let d_out = match grad.relu_output {
        Some(out) => {
            masked = zip(grad.values, out, |d, y| if y > 0.0 { d } else { 0.0 });
            &masked
        }
        None => grad.values,
    };
    Ok(Grads {
        input: wanted
            .input
            .then(|| im2col_conv2d_input_grad(kernel, d_out, filters, g))
            .transpose()?,
        kernel: wanted
            .kernel
            .then(|| im2col_conv2d_kernel_grad(cols, d_out, filters, g))
            .transpose()?,
        bias: wanted.bias.then(|| sum_rows(d_out, filters)),
    })
}

/// Forward convolution by im2col: returns `(output [batch, out_h, out_w, filters], im2col
/// rows)`; the rows are kept for the kernel's gradient. With a bias, the output starts as the
/// bias and the product accumulates onto it: no separate pass.
pub(crate) fn im2col_conv2d(
    input: &[f32],
    kernel: &[f32],
    bias: Option<&[f32]>,
    filters: usize,
    g: &Geometry,
) -> Result<(Vec<f32>, Vec<f32>), TensorError> {
    let rows = g.batch * g.out_pixels();
    let cols = im2col(input, g);
    let (lhs, rhs) = (
        MatRef {
            data: &cols,
            rows,
            cols: g.patch(),
            transposed: false,
        },
        MatRef {
            data: kernel,
            rows: g.patch(),
            cols: filters,
            transposed: false,
        },
    );
    let out = match bias {
        // Without a bias the product overwrites its destination: none is zero-filled first
        // (a pass over the whole output, megabytes for a first layer).
        None => matmul_new(lhs, rhs)?,
        Some(bias) => {
            let mut out = super::elementwise::repeat_rows(Some(bias), rows, filters);
            matmul(&mut out, lhs, rhs, true)?;
            out
        }
    };
    Ok((out, cols))
}

/// Gradient of the kernel by im2col: `colsᵀ · d_out`, shaped
/// `[kernel_h, kernel_w, channels, filters]`.
pub(crate) fn im2col_conv2d_kernel_grad(
    cols: &[f32],
    d_out: &[f32],
    filters: usize,
    g: &Geometry,
) -> Result<Vec<f32>, TensorError> {
    let rows = g.batch * g.out_pixels();
    matmul_new(
        MatRef {
            data: cols,
            rows,
            cols: g.patch(),
            transposed: true,
        },
        MatRef {
            data: d_out,
            rows,
            cols: filters,
            transposed: false,
        },
    )
}

/// Gradient of the input by im2col: `col2im(d_out · kernelᵀ)`.
pub(crate) fn im2col_conv2d_input_grad(
    kernel: &[f32],
    d_out: &[f32],
    filters: usize,
    g: &Geometry,
) -> Result<Vec<f32>, TensorError> {
    let rows = g.batch * g.out_pixels();
    let d_cols = matmul_new(
        MatRef {
            data: d_out,
            rows,
            cols: filters,
            transposed: false,
        },
        MatRef {
            data: kernel,
            rows: g.patch(),
            cols: filters,
            transposed: true,
        },
    )?;
    Ok(col2im(&d_cols, g))
}
