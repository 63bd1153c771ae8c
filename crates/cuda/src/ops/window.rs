//! Kernels over convolution and pooling windows of NHWC images: im2col and its adjoint
//! col2im, max pooling and its gradient, and the checked geometry they share.

#![allow(
    unsafe_code,
    reason = "kernel launches; each states its reasoning in a SAFETY comment"
)]

use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};

use super::Geometry;
use super::{count, grid, launched};
use crate::buffer::CudaBuffer;
use crate::error::CudaError;

/// [`Geometry`] as the kernels take it (`struct Geometry` of `training.cu`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct KernelGeometry([u32; 12]);

/// The largest size, and buffer length, the geometry kernels take: they take positions apart
/// with 32-bit arithmetic, and their sums of a position and a padding must not wrap. (cuDNN
/// has the same limit, its sizes being `int`s.)
const GEOMETRY_LIMIT: usize = i32::MAX as usize;

// SAFETY: twelve `u32`s in `repr(C)`, the layout of the kernels' `struct Geometry`.
unsafe impl DeviceRepr for KernelGeometry {}

impl Geometry {
    fn input_len(&self) -> Option<usize> {
        [self.batch, self.height, self.width, self.channels]
            .into_iter()
            .try_fold(1_usize, usize::checked_mul)
    }

    fn output_len(&self) -> Option<usize> {
        [self.batch, self.out_h, self.out_w, self.channels]
            .into_iter()
            .try_fold(1_usize, usize::checked_mul)
    }

    fn cols_len(&self) -> Option<usize> {
        [
            self.batch,
            self.out_h,
            self.out_w,
            self.kernel_h,
            self.kernel_w,
            self.channels,
        ]
        .into_iter()
        .try_fold(1_usize, usize::checked_mul)
    }

    /// Checked: strides are non-zero (the kernels divide by them), and every size and every
    /// buffer's length is at most [`GEOMETRY_LIMIT`]. The kernels read input positions only
    /// inside the image and index rows and windows only below the output's sizes, so with
    /// buffers of these lengths no index leaves its buffer, whatever the sizes.
    fn checked(&self, op: &'static str) -> Result<KernelGeometry, CudaError> {
        let sizes = [
            self.batch,
            self.height,
            self.width,
            self.channels,
            self.kernel_h,
            self.kernel_w,
            self.stride_h,
            self.stride_w,
            self.pad_top,
            self.pad_left,
            self.out_h,
            self.out_w,
        ];
        let within = |len: Option<usize>| len.is_some_and(|len| len <= GEOMETRY_LIMIT);
        if self.stride_h == 0 || self.stride_w == 0 {
            return Err(CudaError::invalid(
                op,
                format!("a stride of zero in {self:?}"),
            ));
        }
        if !(within(self.cols_len())
            && within(self.input_len())
            && within(self.output_len())
            && sizes.iter().all(|&size| size <= GEOMETRY_LIMIT))
        {
            return Err(CudaError::invalid(
                op,
                format!("sizes or buffers beyond {GEOMETRY_LIMIT} values in {self:?}"),
            ));
        }
        Ok(KernelGeometry(
            sizes.map(|size| u32::try_from(size).unwrap_or(u32::MAX)),
        ))
    }
}

fn check_len(op: &'static str, buffer: &CudaBuffer, want: Option<usize>) -> Result<(), CudaError> {
    if want == Some(buffer.len()) {
        Ok(())
    } else {
        Err(CudaError::invalid(
            op,
            format!("{} values where the geometry needs {want:?}", buffer.len()),
        ))
    }
}

/// Every kernel window of `input` unfolded into a row:
/// `[batch·out_h·out_w, kernel_h·kernel_w·channels]`.
///
/// # Errors
///
/// An input that does not match `g`; the driver's error.
pub fn im2col(input: &CudaBuffer, g: &Geometry) -> Result<CudaBuffer, CudaError> {
    let kg = g.checked("im2col")?;
    check_len("im2col", input, g.input_len())?;
    let n = g.cols_len().unwrap_or(0);
    let device = input.device();
    let mut cols = CudaBuffer::output(device, n)?;
    let f = device.kernels()?.get("im2col_f32")?;
    let n_arg = count(n);
    let mut launch = device.stream().launch_builder(f);
    launch
        .arg(input.slice())
        .arg(cols.slice_mut())
        .arg(&kg)
        .arg(&n_arg);
    // SAFETY: `g` is checked: each row value reads an input position inside `input` (its
    // length checked against `g`) or writes zero; `cols` holds the `n` values written.
    launched(unsafe { launch.launch(grid(n)) }.map(drop))?;
    Ok(cols)
}

/// The adjoint of [`im2col`]: each input position gathers the row values that read it.
///
/// # Errors
///
/// Rows that do not match `g`; the driver's error.
pub fn col2im(cols: &CudaBuffer, g: &Geometry) -> Result<CudaBuffer, CudaError> {
    let kg = g.checked("col2im")?;
    check_len("col2im", cols, g.cols_len())?;
    let n = g.input_len().unwrap_or(0);
    let device = cols.device();
    let mut input = CudaBuffer::output(device, n)?;
    let f = device.kernels()?.get("col2im_f32")?;
    let n_arg = count(n);
    let mut launch = device.stream().launch_builder(f);
    launch
        .arg(cols.slice())
        .arg(input.slice_mut())
        .arg(&kg)
        .arg(&n_arg);
    // SAFETY: as in `im2col`, with reads and writes exchanged.
    launched(unsafe { launch.launch(grid(n)) }.map(drop))?;
    Ok(input)
}

/// Indices into a max pooling's input: where each pooled value came from.
#[derive(Debug)]
pub struct Argmax {
    slice: CudaSlice<u64>,
    len: usize,
}

impl Argmax {
    /// The number of indices.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` when there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Max pooling with windows `kernel_h × kernel_w` of `g`: `(pooled [batch, out_h, out_w,
/// channels], argmax)`, ties and NaN as on the CPU.
///
/// # Errors
///
/// An input that does not match `g`; the driver's error.
pub fn max_pool(input: &CudaBuffer, g: &Geometry) -> Result<(CudaBuffer, Argmax), CudaError> {
    let kg = g.checked("max_pool")?;
    check_len("max_pool", input, g.input_len())?;
    let n = g.output_len().unwrap_or(0);
    let device = input.device();
    let mut out = CudaBuffer::output(device, n)?;
    // SAFETY: `max_pool_f32` writes all `n` positions (the one extra of an empty output is
    // never read).
    let mut argmax: CudaSlice<u64> =
        unsafe { device.stream().alloc(n.max(1)) }.map_err(CudaError::driver("allocating"))?;
    let f = device.kernels()?.get("max_pool_f32")?;
    let n_arg = count(n);
    let mut launch = device.stream().launch_builder(f);
    launch
        .arg(input.slice())
        .arg(out.slice_mut())
        .arg(&mut argmax)
        .arg(&kg)
        .arg(&n_arg);
    // SAFETY: `g` is checked; each of the `n` outputs reads positions inside `input` and
    // writes one value and one index.
    launched(unsafe { launch.launch(grid(n)) }.map(drop))?;
    Ok((
        out,
        Argmax {
            slice: argmax,
            len: n,
        },
    ))
}

/// The gradient of [`max_pool`] with respect to its input.
///
/// # Errors
///
/// A gradient or argmax that does not match `g`; the driver's error.
pub fn max_pool_grad(
    dy: &CudaBuffer,
    argmax: &Argmax,
    g: &Geometry,
) -> Result<CudaBuffer, CudaError> {
    let kg = g.checked("max_pool_grad")?;
    check_len("max_pool_grad", dy, g.output_len())?;
    if argmax.len != dy.len() {
        return Err(CudaError::invalid(
            "max_pool_grad",
            "argmax and gradient lengths differ",
        ));
    }
    let n = g.input_len().unwrap_or(0);
    let device = dy.device();
    let mut dx = CudaBuffer::output(device, n)?;
    let f = device.kernels()?.get("max_pool_grad_f32")?;
    let n_arg = count(n);
    let mut launch = device.stream().launch_builder(f);
    launch
        .arg(dy.slice())
        .arg(&argmax.slice)
        .arg(dx.slice_mut())
        .arg(&kg)
        .arg(&n_arg);
    // SAFETY: `g` is checked; each input position reads the gradients and indices of the
    // windows over it, all inside buffers of `g`'s output size, and writes one value.
    launched(unsafe { launch.launch(grid(n)) }.map(drop))?;
    Ok(dx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pooling() -> Geometry {
        Geometry {
            batch: 2,
            height: 4,
            width: 6,
            channels: 3,
            kernel_h: 2,
            kernel_w: 2,
            stride_h: 2,
            stride_w: 2,
            pad_top: 0,
            pad_left: 1,
            out_h: 2,
            out_w: 4,
        }
    }

    #[test]
    fn a_geometry_reaches_the_kernels_field_by_field_in_their_order() {
        let KernelGeometry(fields) = pooling().checked("max_pool").unwrap();
        assert_eq!(fields, [2, 4, 6, 3, 2, 2, 2, 2, 0, 1, 2, 4]);
    }

    #[test]
    fn a_geometry_the_kernels_cannot_index_is_an_error_naming_the_operation() {
        let huge = 1 << 31;
        for bad in [
            Geometry {
                stride_w: 0,
                ..pooling()
            },
            Geometry {
                pad_top: huge,
                ..pooling()
            },
            Geometry {
                batch: huge / 8,
                ..pooling()
            },
            Geometry {
                height: usize::MAX,
                ..pooling()
            },
        ] {
            let err = bad.checked("im2col").unwrap_err();
            assert!(err.to_string().contains("im2col"), "{err}");
        }
    }
}
