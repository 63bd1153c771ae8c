//! Sums: per column in the CPU's blocked order, and of a whole buffer.

#![allow(
    unsafe_code,
    reason = "kernel launches; each states its reasoning in a SAFETY comment"
)]

use cudarc::driver::PushKernelArg;

use super::COLUMN_SUM_BLOCK_ROWS;
use super::{THREADS, count, grid, launched};
use crate::buffer::CudaBuffer;
use crate::error::CudaError;
use cudarc::driver::LaunchConfig;

/// The sum of each column of `x` as a `[rows, cols]` matrix: rows summed in order within
/// blocks of [`COLUMN_SUM_BLOCK_ROWS`], then the block sums added in order. (One pass over
/// all rows in order would leave one thread per column to sum a convolution's bias gradient,
/// hundreds of thousands of rows.)
///
/// # Errors
///
/// `cols` that does not divide `x` into rows; the driver's error.
pub fn column_sums(x: &CudaBuffer, cols: usize) -> Result<CudaBuffer, CudaError> {
    if cols == 0 || !x.len().is_multiple_of(cols) {
        return Err(CudaError::invalid(
            "column_sums",
            format!("{} values do not form rows of {cols}", x.len()),
        ));
    }
    let device = x.device();
    let rows = x.len() / cols;
    let blocks = rows.div_ceil(COLUMN_SUM_BLOCK_ROWS);
    let mut partials = CudaBuffer::output(device, blocks * cols)?;
    let f = device.kernels()?.get("column_block_sums_f32")?;
    let (rows_arg, cols_arg, block_rows_arg) =
        (count(rows), count(cols), count(COLUMN_SUM_BLOCK_ROWS));
    let mut launch = device.stream().launch_builder(f);
    launch
        .arg(x.slice())
        .arg(partials.slice_mut())
        .arg(&rows_arg)
        .arg(&cols_arg)
        .arg(&block_rows_arg);
    // SAFETY: reads `rows · cols = x.len()` values and writes `ceil(rows / block_rows) · cols`,
    // the length of `partials`; `block_rows` is not zero.
    launched(unsafe { launch.launch(grid(blocks * cols)) }.map(drop))?;
    let mut out = CudaBuffer::output(device, cols)?;
    let f = device.kernels()?.get("column_sums_f32")?;
    let blocks_arg = count(blocks);
    let mut launch = device.stream().launch_builder(f);
    launch
        .arg(partials.slice())
        .arg(out.slice_mut())
        .arg(&blocks_arg)
        .arg(&cols_arg);
    // SAFETY: reads `blocks · cols = partials.len()` values and writes `cols`.
    launched(unsafe { launch.launch(grid(cols)) }.map(drop))?;
    Ok(out)
}

/// The sum of all values, in a fixed order, as a one-value buffer.
///
/// # Errors
///
/// The driver's error.
pub fn sum(x: &CudaBuffer) -> Result<CudaBuffer, CudaError> {
    let device = x.device();
    let mut out = CudaBuffer::output(device, 1)?;
    let f = device.kernels()?.get("sum_f32")?;
    let n_arg = count(x.len());
    let mut launch = device.stream().launch_builder(f);
    launch.arg(x.slice()).arg(out.slice_mut()).arg(&n_arg);
    let one_block = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: one block of `THREADS` (the kernel's shared array's size) reads `x.len()` values
    // and writes one.
    launched(unsafe { launch.launch(one_block) }.map(drop))?;
    Ok(out)
}
