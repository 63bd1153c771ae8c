//! The operations' arguments that are plain values: the same types whether or not the crate
//! is built with its `cuda` feature.

use crate::buffer::CudaBuffer;

/// An element-wise operation of two buffers of one length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
}

/// One operand of [`matmul`](super::matmul): a row-major `rows × cols` matrix, read transposed when
/// `transposed`.
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a> {
    /// The values.
    pub buffer: &'a CudaBuffer,
    /// Rows as stored.
    pub rows: usize,
    /// Columns as stored.
    pub cols: usize,
    /// Whether the product reads the matrix transposed.
    pub transposed: bool,
}

/// Adam's constants for one step: `alpha = lr · sqrt(1 - beta_2^t) / (1 - beta_1^t)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamStep {
    /// The step size of this step.
    pub alpha: f32,
    /// The first moment's decay.
    pub beta_1: f32,
    /// The second moment's decay.
    pub beta_2: f32,
    /// Added to the second moment's root.
    pub epsilon: f32,
}

/// Rows summed into one partial sum by [`column_sums`](super::column_sums): lockstep-tensor's CPU kernel sums
/// blocks of as many rows, then adds the block sums in order, so both give the same bits.
pub const COLUMN_SUM_BLOCK_ROWS: usize = 256;

/// The sizes of a convolution or pooling window over NHWC input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(missing_docs, reason = "the fields are the sizes their names say")]
pub struct Geometry {
    pub batch: usize,
    pub height: usize,
    pub width: usize,
    pub channels: usize,
    pub kernel_h: usize,
    pub kernel_w: usize,
    pub stride_h: usize,
    pub stride_w: usize,
    pub pad_top: usize,
    pub pad_left: usize,
    pub out_h: usize,
    pub out_w: usize,
}
