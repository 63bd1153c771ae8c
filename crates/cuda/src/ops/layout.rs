//! Reordering a row-major array's axes.

#![allow(
    unsafe_code,
    reason = "kernel launches; each states its reasoning in a SAFETY comment"
)]

use cudarc::driver::{DeviceRepr, PushKernelArg};

use super::{count, grid, launched};
use crate::buffer::CudaBuffer;
use crate::error::CudaError;

/// The most axes [`permute`] takes (`PERMUTE_MAX_RANK` of `training.cu`).
const MAX_RANK: usize = 8;

/// `struct Permutation` of `training.cu`: the output's dimensions, and for each output axis
/// the input's stride along it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct KernelPermutation {
    rank: u64,
    dims: [u64; MAX_RANK],
    strides: [u64; MAX_RANK],
}

// SAFETY: `repr(C)` of `u64`s only, the layout of the kernel's `struct Permutation`.
unsafe impl DeviceRepr for KernelPermutation {}

/// `x`, of `shape`, with its axes reordered: axis `i` of the result is axis `axes[i]` of `x`.
///
/// # Errors
///
/// A `shape` that `x` does not fill, `axes` that are not a permutation of its axes, more than
/// eight axes; the driver's error.
pub fn permute(x: &CudaBuffer, shape: &[usize], axes: &[usize]) -> Result<CudaBuffer, CudaError> {
    let rank = shape.len();
    if rank > MAX_RANK {
        return Err(CudaError::invalid(
            "permute",
            format!("{rank} axes, at most {MAX_RANK}"),
        ));
    }
    let len = shape.iter().try_fold(1_usize, |n, &d| n.checked_mul(d));
    if len != Some(x.len()) {
        return Err(CudaError::invalid(
            "permute",
            format!("{} values do not fill shape {shape:?}", x.len()),
        ));
    }
    let mut seen = [false; MAX_RANK];
    if axes.len() != rank
        || !axes
            .iter()
            .all(|&a| a < rank && !std::mem::replace(&mut seen[a], true))
    {
        return Err(CudaError::invalid(
            "permute",
            format!("{axes:?} is not a permutation of {rank} axes"),
        ));
    }
    let mut in_strides = [0_u64; MAX_RANK];
    let mut stride = 1_u64;
    for d in (0..rank).rev() {
        in_strides[d] = stride;
        stride *= count(shape[d]);
    }
    let mut p = KernelPermutation {
        rank: count(rank),
        dims: [1; MAX_RANK],
        strides: [0; MAX_RANK],
    };
    for (i, &a) in axes.iter().enumerate() {
        p.dims[i] = count(shape[a]);
        p.strides[i] = in_strides[a];
    }
    let device = x.device();
    let mut out = CudaBuffer::output(device, x.len())?;
    if x.is_empty() {
        return Ok(out);
    }
    let f = device.kernels()?.get("permute_f32")?;
    let n_arg = count(x.len());
    let mut launch = device.stream().launch_builder(f);
    launch
        .arg(x.slice())
        .arg(out.slice_mut())
        .arg(&p)
        .arg(&n_arg);
    // SAFETY: output value `i < n` is taken apart by the output's dimensions, whose product is
    // `n` (checked above: `shape` fills `x`, and a permutation keeps the product), so each
    // index is below its dimension and the offset read is below `x.len()`.
    launched(unsafe { launch.launch(grid(x.len())) }.map(drop))?;
    Ok(out)
}
