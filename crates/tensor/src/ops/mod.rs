//! Differentiable operations. Each checks its operands' shapes (a mismatch is an error naming
//! the operation and both shapes), runs a kernel, and records its backward rule when an
//! operand needs a gradient.

mod activation;
mod all_reduce;
mod arith;
mod attention;
mod batch_norm;
mod broadcast;
mod concat;
mod conv;
mod conv_batch_norm;
mod dropout;
mod fused;
mod gather;
pub(crate) mod gpu;
mod loss;
mod matmul;
mod narrow;
mod permute;
mod pointwise;
mod reduce;
mod reshape;
mod select;
mod softmax;

pub use activation::{abs, clip, exp, log, relu, sigmoid};
pub use all_reduce::{AllReduceSum, all_reduce_sum};
pub use arith::{add, bias_add, div, mul, scale, sub};
pub use attention::{Attention, AttentionDropout, scaled_dot_product_attention};
pub use batch_norm::{Affine, Moments, batch_norm, batch_norm_inference, batch_norm_max_pool};
pub use concat::concat;
pub use conv::{Padding, avg_pool2d, conv2d, max_pool2d};
pub use conv_batch_norm::conv2d_batch_norm_max_pool;
pub use dropout::dropout;
pub use fused::{
    DENSE_BLOCK_BYTES, DenseByBlocks, MaxPool, conv2d_bias_relu, conv2d_bias_relu_max_pool, dense,
    dense_blocks,
};
pub use gather::gather_rows;
pub use loss::{argmax, sparse_softmax_cross_entropy_with_logits};
pub use matmul::matmul;
pub use narrow::narrow;
pub use permute::{permute, transpose};
pub use pointwise::{Gelu, Pointwise, gelu, rsqrt, silu, sqrt, tanh};
pub use reduce::{mean, sum};
pub use reshape::{flatten, reshape};
pub use select::select;
pub use softmax::{log_softmax, softmax};
