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

/// A smooth function applied value by value ([`pointwise`](super::pointwise)), with its
/// derivative ([`pointwise_grad`](super::pointwise_grad)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pointwise {
    /// `tanh(x)`; its derivative from the output, `1 − y²`.
    Tanh,
    /// The exact GELU, `x·Φ(x)` (`Φ` the standard normal's CDF, through `erf`); its
    /// derivative from the input.
    Gelu,
    /// GELU's tanh approximation, `½x(1 + tanh(√(2/π)(x + 0.044715x³)))`; its derivative
    /// from the input.
    GeluTanh,
    /// `x·σ(x)` (swish); its derivative from the input.
    Silu,
    /// `√x`; its derivative from the output, `1 / 2y`.
    Sqrt,
    /// `1 / √x`; its derivative from the output, `−y³ / 2`.
    Rsqrt,
}

impl Pointwise {
    /// Whether [`pointwise_grad`](super::pointwise_grad) takes the function's output (`true`)
    /// or its input.
    pub fn grad_from_output(self) -> bool {
        matches!(self, Self::Tanh | Self::Sqrt | Self::Rsqrt)
    }
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
