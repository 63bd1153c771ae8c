//! Convolution and max pooling over NHWC tensors.

use super::gpu::{self, On, on};
use crate::error::TensorError;
use crate::kernels::geometry::Geometry;
use crate::kernels::pool;
use crate::tensor::{Tensor, count_values};

/// How windows meet the border, as in Keras.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Padding {
    /// Only windows entirely inside the input: `out = (in − window) / stride + 1`.
    #[default]
    Valid,
    /// Zero padding split evenly (the extra on the bottom/right): `out = ⌈in / stride⌉`.
    Same,
}

/// Output size and leading padding of one spatial dimension.
fn output_size(
    op: &'static str,
    input: usize,
    window: usize,
    stride: usize,
    padding: Padding,
) -> Result<(usize, usize), TensorError> {
    if window == 0 || stride == 0 {
        return Err(TensorError::invalid(
            op,
            "window and stride must be at least 1",
        ));
    }
    match padding {
        Padding::Valid if input < window => Err(TensorError::invalid(
            op,
            format!("a window of {window} does not fit in an input of {input} with valid padding"),
        )),
        Padding::Valid => Ok(((input - window) / stride + 1, 0)),
        Padding::Same => {
            let out = input.div_ceil(stride);
            // (out − 1)·stride < input, so only adding the window can overflow.
            let reach = (out.saturating_sub(1) * stride)
                .checked_add(window)
                .ok_or_else(|| {
                    TensorError::invalid(op, format!("a window of {window} overflows the padding"))
                })?;
            Ok((out, reach.saturating_sub(input) / 2))
        }
    }
}

pub(crate) fn geometry(
    op: &'static str,
    input: &[usize],
    window: (usize, usize),
    stride: (usize, usize),
    padding: Padding,
) -> Result<Geometry, TensorError> {
    let &[batch, height, width, channels] = input else {
        return Err(TensorError::invalid(
            op,
            format!("the input must be NHWC (4-D), not shape {input:?}"),
        ));
    };
    let (out_h, pad_top) = output_size(op, height, window.0, stride.0, padding)?;
    let (out_w, pad_left) = output_size(op, width, window.1, stride.1, padding)?;
    // Every size the kernels compute from a geometry, checked once here so that none of
    // their products can overflow: the output, a window across all channels, and the
    // im2col rows of all windows.
    for sizes in [
        &[batch, out_h, out_w, channels][..],
        &[window.0, window.1, channels],
        &[batch, out_h, out_w, window.0, window.1, channels],
    ] {
        count_values(op, sizes)?;
    }
    Ok(Geometry {
        batch,
        height,
        width,
        channels,
        kernel_h: window.0,
        kernel_w: window.1,
        stride_h: stride.0,
        stride_w: stride.1,
        pad_top,
        pad_left,
        out_h,
        out_w,
    })
}

/// 2-D convolution: `x [batch, h, w, c_in]` with `kernel [kh, kw, c_in, c_out]` (Keras layout)
/// → `[batch, out_h, out_w, c_out]`.
///
/// ```
/// use lockstep_tensor::{Tensor, ops::{self, Padding}};
///
/// let x = Tensor::from_vec((0..16).map(|v| v as f32).collect(), &[1, 4, 4, 1])?;
/// let k = Tensor::from_vec(vec![1.0; 9], &[3, 3, 1, 1])?; // a 3×3 box sum
/// let y = ops::conv2d(&x, &k, (1, 1), Padding::Valid)?;
/// assert_eq!(y.shape(), [1, 2, 2, 1]);
/// assert_eq!(y.host_data()?, [45.0, 54.0, 81.0, 90.0]);
/// # Ok::<(), lockstep_tensor::TensorError>(())
/// ```
///
/// # Errors
///
/// When `x` is not 4-D, the kernel's input channels differ from `x`'s, a stride is 0, or a
/// valid window does not fit.
pub fn conv2d(
    x: &Tensor,
    kernel: &Tensor,
    stride: (usize, usize),
    padding: Padding,
) -> Result<Tensor, TensorError> {
    super::fused::conv2d_bias_relu(x, kernel, None, false, stride, padding)
}

/// Max pooling of NHWC `x` with a `pool` window moved by `stride`.
///
/// # Errors
///
/// When `x` is not 4-D, a size is 0, or a valid window does not fit.
pub fn max_pool2d(
    x: &Tensor,
    pool: (usize, usize),
    stride: (usize, usize),
    padding: Padding,
) -> Result<Tensor, TensorError> {
    let g = geometry("max_pool2d", x.shape(), pool, stride, padding)?;
    if let On::Cuda(buffers) = on("max_pool2d", &[x])? {
        return gpu::max_pool2d(x, &buffers, &g);
    }
    let (out, argmax) = pool::max_pool(x.host(), &g);
    let shape = x.shape().to_vec();
    Ok(Tensor::from_op(
        out,
        vec![g.batch, g.out_h, g.out_w, g.channels],
        &[x],
        move |d, _| {
            Ok(vec![Some(Tensor::raw(
                pool::max_pool_grad(d.host(), &argmax, &g),
                shape.clone(),
            ))])
        },
    ))
}

/// Average pooling of NHWC `x` with a `pool` window moved by `stride`, as Keras'
/// `AveragePooling2D`: with `same` padding, a window at the border averages only the inputs
/// inside the image. Runs on the CPU (on a GPU it is an error naming the operation).
///
/// ```
/// use lockstep_tensor::{Tensor, ops, ops::Padding};
///
/// let x = Tensor::from_vec((1..=9).map(|v| v as f32).collect(), &[1, 3, 3, 1])?;
/// let y = ops::avg_pool2d(&x, (2, 2), (2, 2), Padding::Same)?;
/// // Windows {1,2,4,5}, {3,6}, {7,8}, {9}.
/// assert_eq!(y.to_vec()?, [3.0, 4.5, 7.5, 9.0]);
/// # Ok::<(), lockstep_tensor::TensorError>(())
/// ```
///
/// # Errors
///
/// When `x` is not 4-D, a size is 0, a valid window does not fit, or `x` is on a GPU.
pub fn avg_pool2d(
    x: &Tensor,
    pool: (usize, usize),
    stride: (usize, usize),
    padding: Padding,
) -> Result<Tensor, TensorError> {
    const OP: &str = "avg_pool2d";
    let g = geometry(OP, x.shape(), pool, stride, padding)?;
    if let On::Cuda(_) = on(OP, &[x])? {
        return Err(TensorError::device(OP, x.device(), "runs on the CPU only"));
    }
    let out = pool::avg_pool(x.host(), &g);
    let shape = x.shape().to_vec();
    Ok(Tensor::from_op(
        out,
        vec![g.batch, g.out_h, g.out_w, g.channels],
        &[x],
        move |d, _| {
            Ok(vec![Some(Tensor::raw(
                pool::avg_pool_grad(d.host(), &g),
                shape.clone(),
            ))])
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn average_pooling_shares_each_gradient_among_its_window() {
        let x = Tensor::parameter((1..=8).map(|v| v as f32).collect(), &[1, 2, 4, 1]).unwrap();
        let y = avg_pool2d(&x, (2, 2), (1, 2), Padding::Valid).unwrap();
        assert_eq!(y.to_vec().unwrap(), [3.5, 5.5]);
        let loss =
            crate::ops::sum(&crate::ops::scale(&y, 4.0).unwrap(), &[0, 1, 2, 3], false).unwrap();
        let grads = loss.backward().unwrap();
        assert_eq!(grads.get(&x).unwrap().to_vec().unwrap(), [1.0; 8]);
    }

    #[test]
    fn same_padding_matches_keras_output_sizes() {
        assert_eq!(output_size("t", 28, 3, 1, Padding::Same).unwrap(), (28, 1));
        assert_eq!(output_size("t", 28, 3, 2, Padding::Same).unwrap(), (14, 0));
        assert_eq!(output_size("t", 5, 2, 2, Padding::Same).unwrap(), (3, 0));
        assert_eq!(output_size("t", 28, 3, 1, Padding::Valid).unwrap(), (26, 0));
        assert_eq!(output_size("t", 13, 2, 2, Padding::Valid).unwrap(), (6, 0));
        assert!(output_size("t", 2, 3, 1, Padding::Valid).is_err());
        assert!(output_size("t", 2, 3, 0, Padding::Same).is_err());
    }

    #[test]
    fn mismatched_channels_are_an_error_naming_both_shapes() {
        let x = Tensor::zeros(&[1, 5, 5, 2]).unwrap();
        let k = Tensor::zeros(&[3, 3, 3, 4]).unwrap();
        let err = conv2d(&x, &k, (1, 1), Padding::Valid).unwrap_err();
        assert!(
            err.to_string().contains("[1, 5, 5, 2] and [3, 3, 3, 4]"),
            "{err}"
        );
        assert!(
            max_pool2d(
                &Tensor::zeros(&[5, 5]).unwrap(),
                (2, 2),
                (2, 2),
                Padding::Valid
            )
            .is_err()
        );
    }

    #[test]
    fn max_pool_takes_each_window_maximum() {
        let x = Tensor::from_vec((0..16).map(|v| v as f32).collect(), &[1, 4, 4, 1]).unwrap();
        let y = max_pool2d(&x, (2, 2), (2, 2), Padding::Valid).unwrap();
        assert_eq!(y.host(), [5.0, 7.0, 13.0, 15.0]);
    }
}
