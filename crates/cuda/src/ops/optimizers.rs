//! The optimizers' updates in place: SGD, SGD with momentum (Nesterov too) and Adam.

#![allow(
    unsafe_code,
    reason = "kernel launches; each states its reasoning in a SAFETY comment"
)]

use cudarc::driver::PushKernelArg;

use super::AdamStep;
use super::{count, grid, launched, same_device, same_len};
use crate::buffer::CudaBuffer;
use crate::error::CudaError;

/// SGD in place: `params -= lr · grads`.
///
/// # Errors
///
/// Buffers of different lengths or devices; the driver's error.
pub fn sgd(params: &mut CudaBuffer, grads: &CudaBuffer, lr: f32) -> Result<(), CudaError> {
    let device = same_device("sgd", &[params, grads])?.clone();
    let n = same_len("sgd", &[params, grads])?;
    let f = device.kernels()?.get("sgd_f32")?;
    let n_arg = count(n);
    let mut launch = device.stream().launch_builder(f);
    launch
        .arg(params.slice_mut())
        .arg(grads.slice())
        .arg(&lr)
        .arg(&n_arg);
    // SAFETY: reads and writes `n` values of buffers `n` long.
    launched(unsafe { launch.launch(grid(n)) }.map(drop))
}

/// SGD with momentum in place, as Keras applies it.
///
/// # Errors
///
/// Buffers of different lengths or devices; the driver's error.
pub fn sgd_momentum(
    params: &mut CudaBuffer,
    grads: &CudaBuffer,
    velocity: &mut CudaBuffer,
    (lr, momentum, nesterov): (f32, f32, bool),
) -> Result<(), CudaError> {
    let device = same_device("sgd_momentum", &[params, grads, velocity])?.clone();
    let n = same_len("sgd_momentum", &[params, grads, velocity])?;
    let f = device.kernels()?.get("sgd_momentum_f32")?;
    let (nesterov_arg, n_arg) = (i32::from(nesterov), count(n));
    let mut launch = device.stream().launch_builder(f);
    launch
        .arg(params.slice_mut())
        .arg(grads.slice())
        .arg(velocity.slice_mut())
        .arg(&lr)
        .arg(&momentum)
        .arg(&nesterov_arg)
        .arg(&n_arg);
    // SAFETY: reads and writes `n` values of buffers `n` long.
    launched(unsafe { launch.launch(grid(n)) }.map(drop))
}

/// Adam in place, as Keras (and lockstep-nn on the CPU) applies it.
///
/// # Errors
///
/// Buffers of different lengths or devices; the driver's error.
pub fn adam(
    params: &mut CudaBuffer,
    grads: &CudaBuffer,
    (m, v): (&mut CudaBuffer, &mut CudaBuffer),
    step: AdamStep,
) -> Result<(), CudaError> {
    let device = same_device("adam", &[params, grads, m, v])?.clone();
    let n = same_len("adam", &[params, grads, m, v])?;
    let f = device.kernels()?.get("adam_f32")?;
    let n_arg = count(n);
    let mut launch = device.stream().launch_builder(f);
    launch
        .arg(params.slice_mut())
        .arg(grads.slice())
        .arg(m.slice_mut())
        .arg(v.slice_mut())
        .arg(&step.alpha)
        .arg(&step.beta_1)
        .arg(&step.beta_2)
        .arg(&step.epsilon)
        .arg(&n_arg);
    // SAFETY: reads and writes `n` values of buffers `n` long.
    launched(unsafe { launch.launch(grid(n)) }.map(drop))
}
