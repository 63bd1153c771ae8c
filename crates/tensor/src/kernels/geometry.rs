//! The sizes of a convolution or pooling over NHWC input, and the plumbing of a convolution's
//! gradients: the leaf types every convolution kernel (im2col, Winograd, fused with pooling)
//! and the pooling kernels share.

/// The sizes of one convolution (or pooling window) over NHWC input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub(crate) batch: usize,
    pub(crate) height: usize,
    pub(crate) width: usize,
    pub(crate) channels: usize,
    pub(crate) kernel_h: usize,
    pub(crate) kernel_w: usize,
    pub(crate) stride_h: usize,
    pub(crate) stride_w: usize,
    pub(crate) pad_top: usize,
    pub(crate) pad_left: usize,
    pub(crate) out_h: usize,
    pub(crate) out_w: usize,
}

impl Geometry {
    /// Output positions per image.
    pub(crate) fn out_pixels(&self) -> usize {
        self.out_h * self.out_w
    }

    /// Values of one im2col row: a kernel window across all channels.
    pub(crate) fn patch(&self) -> usize {
        self.kernel_h * self.kernel_w * self.channels
    }

    /// Input row and column read by output (`oy`, `ox`) at kernel offset (`ky`, `kx`), or
    /// `None` in the padding.
    #[inline]
    pub(crate) fn source(
        &self,
        oy: usize,
        ox: usize,
        ky: usize,
        kx: usize,
    ) -> Option<(usize, usize)> {
        let y = (oy * self.stride_h + ky).checked_sub(self.pad_top)?;
        let x = (ox * self.stride_w + kx).checked_sub(self.pad_left)?;
        (y < self.height && x < self.width).then_some((y, x))
    }

    /// The input row and column of the top-left corner of output (`oy`, `ox`)'s window, when
    /// the whole window lies in the image (no tap in the padding).
    #[inline]
    pub(crate) fn window_inside(&self, oy: usize, ox: usize) -> Option<(usize, usize)> {
        let y = (oy * self.stride_h).checked_sub(self.pad_top)?;
        let x = (ox * self.stride_w).checked_sub(self.pad_left)?;
        (y + self.kernel_h <= self.height && x + self.kernel_w <= self.width).then_some((y, x))
    }
}

/// The gradient arriving at a convolution's output, masked where a fused relu was zero.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OutputGrad<'a> {
    /// `dL/dy`, `[batch, out_h, out_w, filters]`.
    pub(crate) values: &'a [f32],
    /// The relu's output, when the convolution had one: the gradient passes where it is
    /// positive.
    pub(crate) relu_output: Option<&'a [f32]>,
}

/// Which gradients a backward pass computes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wanted {
    pub(crate) input: bool,
    pub(crate) kernel: bool,
    pub(crate) bias: bool,
}

/// A convolution's gradients, each present when it was wanted.
#[derive(Debug, Default)]
pub(crate) struct Grads {
    pub(crate) input: Option<Vec<f32>>,
    pub(crate) kernel: Option<Vec<f32>>,
    pub(crate) bias: Option<Vec<f32>>,
}

/// Non-overlapping max-pooling windows (stride equal to the window, valid padding) over a
/// convolution's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PoolWindow {
    pub(crate) h: usize,
    pub(crate) w: usize,
}

impl PoolWindow {
    pub(crate) fn positions(self) -> usize {
        self.h * self.w
    }
}
