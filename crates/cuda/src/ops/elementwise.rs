//! Element-wise kernels: arithmetic of one shape, scaling, relu, bias (+ relu), log, clip
//! and dropout, with the gradients the models need.

#![allow(
    unsafe_code,
    reason = "kernel launches; each states its reasoning in a SAFETY comment"
)]

use cudarc::driver::PushKernelArg;

use super::{Binary, Pointwise};
use super::{count, grid, launched, same_device, same_len};
use crate::buffer::CudaBuffer;
use crate::device::CudaDevice;
use crate::error::CudaError;

impl Binary {
    fn kernel(self) -> &'static str {
        match self {
            Self::Add => "add_f32",
            Self::Sub => "sub_f32",
            Self::Mul => "mul_f32",
            Self::Div => "div_f32",
        }
    }
}

/// A buffer of `len` copies of `value`.
///
/// # Errors
///
/// The driver's error.
pub fn fill(device: &CudaDevice, len: usize, value: f32) -> Result<CudaBuffer, CudaError> {
    let mut out = CudaBuffer::output(device, len)?;
    let f = device.kernels()?.get("fill_f32")?;
    let n_arg = count(len);
    let mut launch = device.stream().launch_builder(f);
    launch.arg(out.slice_mut()).arg(&value).arg(&n_arg);
    // SAFETY: `fill_f32(float*, float, u64 n)` writes `n` values; `out` holds `len`.
    launched(unsafe { launch.launch(grid(len)) }.map(drop))?;
    Ok(out)
}

/// `a op b`, element by element.
///
/// # Errors
///
/// Buffers of different lengths or devices; the driver's error.
pub fn binary(op: Binary, a: &CudaBuffer, b: &CudaBuffer) -> Result<CudaBuffer, CudaError> {
    let device = same_device("binary", &[a, b])?;
    let n = same_len("binary", &[a, b])?;
    let mut out = CudaBuffer::output(device, n)?;
    let f = device.kernels()?.get(op.kernel())?;
    let n_arg = count(n);
    let mut launch = device.stream().launch_builder(f);
    launch
        .arg(a.slice())
        .arg(b.slice())
        .arg(out.slice_mut())
        .arg(&n_arg);
    // SAFETY: the kernel reads `n` values of `a` and `b` and writes `n` of `out`, all `n` long.
    launched(unsafe { launch.launch(grid(n)) }.map(drop))?;
    Ok(out)
}

/// `x · factor`.
///
/// # Errors
///
/// The driver's error.
pub fn scale(x: &CudaBuffer, factor: f32) -> Result<CudaBuffer, CudaError> {
    let device = x.device();
    let mut out = CudaBuffer::output(device, x.len())?;
    let f = device.kernels()?.get("scale_f32")?;
    let n_arg = count(x.len());
    let mut launch = device.stream().launch_builder(f);
    launch
        .arg(x.slice())
        .arg(&factor)
        .arg(out.slice_mut())
        .arg(&n_arg);
    // SAFETY: reads and writes `x.len()` values of buffers that long.
    launched(unsafe { launch.launch(grid(x.len())) }.map(drop))?;
    Ok(out)
}

/// `x · factor`, in `x`: no buffer allocated (the gradients' scaling each step).
///
/// # Errors
///
/// The driver's error.
pub fn scale_in_place(x: &mut CudaBuffer, factor: f32) -> Result<(), CudaError> {
    let device = x.device().clone();
    let f = device.kernels()?.get("scale_in_place_f32")?;
    let len = x.len();
    let n_arg = count(len);
    let mut launch = device.stream().launch_builder(f);
    launch.arg(x.slice_mut()).arg(&factor).arg(&n_arg);
    // SAFETY: reads and writes `len` values of a buffer that long.
    launched(unsafe { launch.launch(grid(len)) }.map(drop))
}

/// `max(x, 0)`, NaN giving 0 as on the CPU.
///
/// # Errors
///
/// The driver's error.
pub fn relu(x: &CudaBuffer) -> Result<CudaBuffer, CudaError> {
    let device = x.device();
    let mut out = CudaBuffer::output(device, x.len())?;
    let f = device.kernels()?.get("relu_f32")?;
    let n_arg = count(x.len());
    let mut launch = device.stream().launch_builder(f);
    launch.arg(x.slice()).arg(out.slice_mut()).arg(&n_arg);
    // SAFETY: reads and writes `x.len()` values of buffers that long.
    launched(unsafe { launch.launch(grid(x.len())) }.map(drop))?;
    Ok(out)
}

/// `dy` where the relu's output `y` is positive, else 0.
///
/// # Errors
///
/// Buffers of different lengths or devices; the driver's error.
pub fn relu_grad(dy: &CudaBuffer, y: &CudaBuffer) -> Result<CudaBuffer, CudaError> {
    let device = same_device("relu_grad", &[dy, y])?;
    let n = same_len("relu_grad", &[dy, y])?;
    let mut out = CudaBuffer::output(device, n)?;
    let f = device.kernels()?.get("relu_grad_f32")?;
    let n_arg = count(n);
    let mut launch = device.stream().launch_builder(f);
    launch
        .arg(dy.slice())
        .arg(y.slice())
        .arg(out.slice_mut())
        .arg(&n_arg);
    // SAFETY: reads and writes `n` values of buffers `n` long.
    launched(unsafe { launch.launch(grid(n)) }.map(drop))?;
    Ok(out)
}

/// `x + bias` along the last axis (`bias.len()` values a row), then a relu when `relu`.
///
/// # Errors
///
/// A bias that does not divide `x` into rows; buffers on different devices; the driver's error.
pub fn bias_add(x: &CudaBuffer, bias: &CudaBuffer, relu: bool) -> Result<CudaBuffer, CudaError> {
    let device = same_device("bias_add", &[x, bias])?;
    let cols = bias.len();
    if cols == 0 || !x.len().is_multiple_of(cols) {
        return Err(CudaError::invalid(
            "bias_add",
            format!("{} values do not form rows of {cols}", x.len()),
        ));
    }
    let mut out = CudaBuffer::output(device, x.len())?;
    let f = device.kernels()?.get("bias_add_f32")?;
    let (cols_arg, relu_arg, n_arg) = (count(cols), i32::from(relu), count(x.len()));
    let mut launch = device.stream().launch_builder(f);
    launch
        .arg(x.slice())
        .arg(bias.slice())
        .arg(out.slice_mut())
        .arg(&cols_arg)
        .arg(&relu_arg)
        .arg(&n_arg);
    // SAFETY: value `i` reads `bias[i % cols]`, `cols` being the bias's length and non-zero.
    launched(unsafe { launch.launch(grid(x.len())) }.map(drop))?;
    Ok(out)
}

/// The natural logarithm of each value.
///
/// # Errors
///
/// The driver's error.
pub fn log(x: &CudaBuffer) -> Result<CudaBuffer, CudaError> {
    unary("log_f32", x)
}

/// `e` to the power of each value.
///
/// # Errors
///
/// The driver's error.
pub fn exp(x: &CudaBuffer) -> Result<CudaBuffer, CudaError> {
    unary("exp_f32", x)
}

impl Pointwise {
    fn kernels(self) -> (&'static str, &'static str) {
        match self {
            Self::Tanh => ("tanh_f32", "tanh_grad_f32"),
            Self::Gelu => ("gelu_f32", "gelu_grad_f32"),
            Self::GeluTanh => ("gelu_tanh_f32", "gelu_tanh_grad_f32"),
            Self::Silu => ("silu_f32", "silu_grad_f32"),
            Self::Sqrt => ("sqrt_f32", "sqrt_grad_f32"),
            Self::Rsqrt => ("rsqrt_f32", "rsqrt_grad_f32"),
        }
    }
}

/// `f` of each value.
///
/// # Errors
///
/// The driver's error.
pub fn pointwise(f: Pointwise, x: &CudaBuffer) -> Result<CudaBuffer, CudaError> {
    unary(f.kernels().0, x)
}

/// `g` times `f`'s derivative, value by value, at `at`: `f`'s output where
/// [`Pointwise::grad_from_output`], else its input.
///
/// # Errors
///
/// Buffers of different lengths or devices; the driver's error.
pub fn pointwise_grad(
    f: Pointwise,
    g: &CudaBuffer,
    at: &CudaBuffer,
) -> Result<CudaBuffer, CudaError> {
    let device = same_device("pointwise_grad", &[g, at])?;
    let n = same_len("pointwise_grad", &[g, at])?;
    let mut out = CudaBuffer::output(device, n)?;
    let kernel = device.kernels()?.get(f.kernels().1)?;
    let n_arg = count(n);
    let mut launch = device.stream().launch_builder(kernel);
    launch
        .arg(g.slice())
        .arg(at.slice())
        .arg(out.slice_mut())
        .arg(&n_arg);
    // SAFETY: reads and writes `n` values of buffers `n` long.
    launched(unsafe { launch.launch(grid(n)) }.map(drop))?;
    Ok(out)
}

/// `a` where `condition` is non-zero, else `b`, value by value.
///
/// # Errors
///
/// Buffers of different lengths or devices; the driver's error.
pub fn select(
    condition: &CudaBuffer,
    a: &CudaBuffer,
    b: &CudaBuffer,
) -> Result<CudaBuffer, CudaError> {
    let device = same_device("select", &[condition, a, b])?;
    let n = same_len("select", &[condition, a, b])?;
    let mut out = CudaBuffer::output(device, n)?;
    let kernel = device.kernels()?.get("select_f32")?;
    let n_arg = count(n);
    let mut launch = device.stream().launch_builder(kernel);
    launch
        .arg(condition.slice())
        .arg(a.slice())
        .arg(b.slice())
        .arg(out.slice_mut())
        .arg(&n_arg);
    // SAFETY: reads and writes `n` values of buffers `n` long.
    launched(unsafe { launch.launch(grid(n)) }.map(drop))?;
    Ok(out)
}

/// A kernel of one input and one output of its length, value by value.
fn unary(kernel: &'static str, x: &CudaBuffer) -> Result<CudaBuffer, CudaError> {
    let device = x.device();
    let mut out = CudaBuffer::output(device, x.len())?;
    let f = device.kernels()?.get(kernel)?;
    let n_arg = count(x.len());
    let mut launch = device.stream().launch_builder(f);
    launch.arg(x.slice()).arg(out.slice_mut()).arg(&n_arg);
    // SAFETY: reads and writes `x.len()` values of buffers that long.
    launched(unsafe { launch.launch(grid(x.len())) }.map(drop))?;
    Ok(out)
}

/// Each value limited to `[min, max]` (NaN kept).
///
/// # Errors
///
/// The driver's error.
pub fn clip(x: &CudaBuffer, min: f32, max: f32) -> Result<CudaBuffer, CudaError> {
    let device = x.device();
    let mut out = CudaBuffer::output(device, x.len())?;
    let f = device.kernels()?.get("clip_f32")?;
    let n_arg = count(x.len());
    let mut launch = device.stream().launch_builder(f);
    launch
        .arg(x.slice())
        .arg(out.slice_mut())
        .arg(&min)
        .arg(&max)
        .arg(&n_arg);
    // SAFETY: reads and writes `x.len()` values of buffers that long.
    launched(unsafe { launch.launch(grid(x.len())) }.map(drop))?;
    Ok(out)
}

/// The gradient through [`clip`]: `g` where the input `x` lay inside `[min, max]`, else 0.
///
/// # Errors
///
/// Buffers of different lengths or devices; the driver's error.
pub fn clip_grad(
    g: &CudaBuffer,
    x: &CudaBuffer,
    min: f32,
    max: f32,
) -> Result<CudaBuffer, CudaError> {
    let device = same_device("clip_grad", &[g, x])?;
    let n = same_len("clip_grad", &[g, x])?;
    let mut out = CudaBuffer::output(device, n)?;
    let f = device.kernels()?.get("clip_grad_f32")?;
    let n_arg = count(n);
    let mut launch = device.stream().launch_builder(f);
    launch
        .arg(g.slice())
        .arg(x.slice())
        .arg(out.slice_mut())
        .arg(&min)
        .arg(&max)
        .arg(&n_arg);
    // SAFETY: reads and writes `n` values of buffers `n` long.
    launched(unsafe { launch.launch(grid(n)) }.map(drop))?;
    Ok(out)
}

/// Inverted dropout: `(x · mask, mask)`, the mask `1 / (1 - rate)` or 0 by a hash of `seed`
/// and the position.
///
/// # Errors
///
/// A rate outside `[0, 1)`; the driver's error.
pub fn dropout(
    x: &CudaBuffer,
    rate: f32,
    seed: u64,
) -> Result<(CudaBuffer, CudaBuffer), CudaError> {
    if !(0.0..1.0).contains(&rate) {
        return Err(CudaError::invalid(
            "dropout",
            format!("rate {rate} is not in [0, 1)"),
        ));
    }
    let device = x.device();
    let mut out = CudaBuffer::output(device, x.len())?;
    let mut mask = CudaBuffer::output(device, x.len())?;
    let f = device.kernels()?.get("dropout_f32")?;
    let n_arg = count(x.len());
    let mut launch = device.stream().launch_builder(f);
    launch
        .arg(x.slice())
        .arg(out.slice_mut())
        .arg(mask.slice_mut())
        .arg(&rate)
        .arg(&seed)
        .arg(&n_arg);
    // SAFETY: reads and writes `x.len()` values of buffers that long.
    launched(unsafe { launch.launch(grid(x.len())) }.map(drop))?;
    Ok((out, mask))
}
