//! Softmax, its gradient, the softmax cross-entropy against class ids, and per-row scaling.

#![allow(
    unsafe_code,
    reason = "kernel launches; each states its reasoning in a SAFETY comment"
)]

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::{count, grid, launched, same_device, same_len};
use crate::buffer::CudaBuffer;
use crate::error::CudaError;

/// Per row of `[rows, classes]` logits: `(loss [rows], gradient [rows, classes])` of the
/// softmax cross-entropy against `labels`.
///
/// # Errors
///
/// A label out of range, or logits that do not form rows of `classes`; the driver's error.
pub fn sparse_softmax_cross_entropy(
    logits: &CudaBuffer,
    labels: &[usize],
    classes: usize,
) -> Result<(CudaBuffer, CudaBuffer), CudaError> {
    const OP: &str = "sparse_softmax_cross_entropy";
    if classes == 0 || logits.len() != labels.len() * classes {
        return Err(CudaError::invalid(
            OP,
            format!(
                "{} logits are not {} rows of {classes}",
                logits.len(),
                labels.len()
            ),
        ));
    }
    let labels: Vec<u32> = labels
        .iter()
        .map(|&l| {
            u32::try_from(l)
                .ok()
                .filter(|_| l < classes)
                .ok_or_else(|| CudaError::invalid(OP, format!("label {l} of {classes} classes")))
        })
        .collect::<Result<_, _>>()?;
    let device = logits.device();
    let stream = device.stream();
    let labels: CudaSlice<u32> = if labels.is_empty() {
        stream.alloc_zeros(1)
    } else {
        crate::transfers::count_to_device();
        device.upload_u32(&labels)
    }
    .map_err(CudaError::driver("copying labels to the device"))?;
    let rows = logits.len() / classes;
    let mut loss = CudaBuffer::output(device, rows)?;
    let mut grad = CudaBuffer::output(device, logits.len())?;
    let f = device.kernels()?.get("sparse_softmax_cross_entropy_f32")?;
    let rows_arg = count(rows);
    let classes_arg = count(classes);
    let mut launch = stream.launch_builder(f);
    launch
        .arg(logits.slice())
        .arg(&labels)
        .arg(loss.slice_mut())
        .arg(grad.slice_mut())
        .arg(&rows_arg)
        .arg(&classes_arg);
    // SAFETY: `rows` labels, each below `classes` (checked above), index rows of `classes`
    // logits; the outputs hold `rows` and `rows · classes` values.
    launched(unsafe { launch.launch(grid(rows)) }.map(drop))?;
    Ok((loss, grad))
}

/// Softmax along rows of `classes` values.
///
/// # Errors
///
/// Values that do not form rows of `classes`; the driver's error.
pub fn softmax(x: &CudaBuffer, classes: usize) -> Result<CudaBuffer, CudaError> {
    if classes == 0 || !x.len().is_multiple_of(classes) {
        return Err(CudaError::invalid(
            "softmax",
            format!("{} values do not form rows of {classes}", x.len()),
        ));
    }
    let device = x.device();
    let mut out = CudaBuffer::output(device, x.len())?;
    let f = device.kernels()?.get("softmax_f32")?;
    let rows = x.len() / classes;
    let (rows_arg, classes_arg) = (count(rows), count(classes));
    let mut launch = device.stream().launch_builder(f);
    launch
        .arg(x.slice())
        .arg(out.slice_mut())
        .arg(&rows_arg)
        .arg(&classes_arg);
    // SAFETY: reads and writes `rows · classes = x.len()` values.
    launched(unsafe { launch.launch(grid(rows)) }.map(drop))?;
    Ok(out)
}

/// The gradient through [`softmax`] from its output `y` and the output's gradient `g`, rows of
/// `classes` values: `y · (g − Σ y·g)` per row.
///
/// # Errors
///
/// Buffers of different lengths or devices, or values that do not form rows of `classes`; the
/// driver's error.
pub fn softmax_grad(
    y: &CudaBuffer,
    g: &CudaBuffer,
    classes: usize,
) -> Result<CudaBuffer, CudaError> {
    let device = same_device("softmax_grad", &[y, g])?;
    let n = same_len("softmax_grad", &[y, g])?;
    if classes == 0 || !n.is_multiple_of(classes) {
        return Err(CudaError::invalid(
            "softmax_grad",
            format!("{n} values do not form rows of {classes}"),
        ));
    }
    let mut out = CudaBuffer::output(device, n)?;
    let f = device.kernels()?.get("softmax_grad_f32")?;
    let rows = n / classes;
    let (rows_arg, classes_arg) = (count(rows), count(classes));
    let mut launch = device.stream().launch_builder(f);
    launch
        .arg(y.slice())
        .arg(g.slice())
        .arg(out.slice_mut())
        .arg(&rows_arg)
        .arg(&classes_arg);
    // SAFETY: reads two and writes one buffer of `rows · classes = n` values.
    launched(unsafe { launch.launch(grid(rows)) }.map(drop))?;
    Ok(out)
}

/// Each row of `x` (`x.len() / scales.len()` values a row) times its own value of `scales`.
///
/// # Errors
///
/// Buffers on different devices, or `x` not forming `scales.len()` rows; the driver's error.
pub fn scale_rows(x: &CudaBuffer, scales: &CudaBuffer) -> Result<CudaBuffer, CudaError> {
    let device = same_device("scale_rows", &[x, scales])?;
    let rows = scales.len();
    if rows == 0 || !x.len().is_multiple_of(rows) {
        return Err(CudaError::invalid(
            "scale_rows",
            format!("{} values do not form {rows} rows", x.len()),
        ));
    }
    let cols = x.len() / rows;
    let mut out = CudaBuffer::output(device, x.len())?;
    if cols == 0 {
        return Ok(out);
    }
    let f = device.kernels()?.get("scale_rows_f32")?;
    let (cols_arg, n_arg) = (count(cols), count(x.len()));
    let mut launch = device.stream().launch_builder(f);
    launch
        .arg(x.slice())
        .arg(scales.slice())
        .arg(out.slice_mut())
        .arg(&cols_arg)
        .arg(&n_arg);
    // SAFETY: value `i` reads `scales[i / cols]`, below `rows` since `i < rows · cols`.
    launched(unsafe { launch.launch(grid(x.len())) }.map(drop))?;
    Ok(out)
}
