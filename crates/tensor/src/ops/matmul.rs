//! Matrix product.

use crate::error::TensorError;
use crate::tensor::Tensor;

/// `a [m, k] · b [k, n] → [m, n]`.
///
/// # Errors
///
/// When an operand is not 2-D or the inner dimensions differ.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    super::fused::product("matmul", a, b, None, false)
}
