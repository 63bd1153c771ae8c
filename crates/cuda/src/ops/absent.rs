//! The operations of a build without the `cuda` feature. Every one takes a [`CudaBuffer`] or a
//! [`CudaDevice`], and no value of either exists in such a build
//! ([`CudaDevice::open`] is [`CudaError::NotBuilt`]), so none of them can be called; they are
//! here so that code written for both builds compiles in both. Their documentation is the
//! `cuda` build's.

#![allow(
    missing_docs,
    clippy::missing_errors_doc,
    reason = "the `cuda` build documents each"
)]

use super::{AdamStep, Binary, Geometry, MatRef, Pointwise};
use crate::buffer::CudaBuffer;
use crate::device::CudaDevice;
use crate::error::CudaError;

pub fn fill(device: &CudaDevice, _len: usize, _value: f32) -> Result<CudaBuffer, CudaError> {
    device.absent()
}

pub fn binary(_op: Binary, a: &CudaBuffer, _b: &CudaBuffer) -> Result<CudaBuffer, CudaError> {
    a.absent()
}

pub fn scale(x: &CudaBuffer, _factor: f32) -> Result<CudaBuffer, CudaError> {
    x.absent()
}

pub fn scale_in_place(x: &mut CudaBuffer, _factor: f32) -> Result<(), CudaError> {
    x.absent()
}

pub fn relu(x: &CudaBuffer) -> Result<CudaBuffer, CudaError> {
    x.absent()
}

pub fn relu_grad(dy: &CudaBuffer, _y: &CudaBuffer) -> Result<CudaBuffer, CudaError> {
    dy.absent()
}

pub fn bias_add(x: &CudaBuffer, _bias: &CudaBuffer, _relu: bool) -> Result<CudaBuffer, CudaError> {
    x.absent()
}

pub fn log(x: &CudaBuffer) -> Result<CudaBuffer, CudaError> {
    x.absent()
}

pub fn exp(x: &CudaBuffer) -> Result<CudaBuffer, CudaError> {
    x.absent()
}

pub fn clip(x: &CudaBuffer, _min: f32, _max: f32) -> Result<CudaBuffer, CudaError> {
    x.absent()
}

pub fn clip_grad(
    g: &CudaBuffer,
    _x: &CudaBuffer,
    _min: f32,
    _max: f32,
) -> Result<CudaBuffer, CudaError> {
    g.absent()
}

pub fn dropout(
    x: &CudaBuffer,
    _rate: f32,
    _seed: u64,
) -> Result<(CudaBuffer, CudaBuffer), CudaError> {
    x.absent()
}

pub fn pointwise(_f: Pointwise, x: &CudaBuffer) -> Result<CudaBuffer, CudaError> {
    x.absent()
}

pub fn pointwise_grad(
    _f: Pointwise,
    g: &CudaBuffer,
    _at: &CudaBuffer,
) -> Result<CudaBuffer, CudaError> {
    g.absent()
}

pub fn select(
    condition: &CudaBuffer,
    _a: &CudaBuffer,
    _b: &CudaBuffer,
) -> Result<CudaBuffer, CudaError> {
    condition.absent()
}

pub fn permute(x: &CudaBuffer, _shape: &[usize], _axes: &[usize]) -> Result<CudaBuffer, CudaError> {
    x.absent()
}

pub fn matmul(a: MatRef<'_>, _b: MatRef<'_>) -> Result<CudaBuffer, CudaError> {
    a.buffer.absent()
}

pub fn sgd(params: &mut CudaBuffer, _grads: &CudaBuffer, _lr: f32) -> Result<(), CudaError> {
    params.absent()
}

pub fn sgd_momentum(
    params: &mut CudaBuffer,
    _grads: &CudaBuffer,
    _velocity: &mut CudaBuffer,
    _options: (f32, f32, bool),
) -> Result<(), CudaError> {
    params.absent()
}

pub fn adam(
    params: &mut CudaBuffer,
    _grads: &CudaBuffer,
    _moments: (&mut CudaBuffer, &mut CudaBuffer),
    _step: AdamStep,
) -> Result<(), CudaError> {
    params.absent()
}

pub fn column_sums(x: &CudaBuffer, _cols: usize) -> Result<CudaBuffer, CudaError> {
    x.absent()
}

pub fn sum(x: &CudaBuffer) -> Result<CudaBuffer, CudaError> {
    x.absent()
}

pub fn sparse_softmax_cross_entropy(
    logits: &CudaBuffer,
    _labels: &[usize],
    _classes: usize,
) -> Result<(CudaBuffer, CudaBuffer), CudaError> {
    logits.absent()
}

pub fn softmax(x: &CudaBuffer, _classes: usize) -> Result<CudaBuffer, CudaError> {
    x.absent()
}

pub fn softmax_grad(
    y: &CudaBuffer,
    _g: &CudaBuffer,
    _classes: usize,
) -> Result<CudaBuffer, CudaError> {
    y.absent()
}

pub fn scale_rows(x: &CudaBuffer, _scales: &CudaBuffer) -> Result<CudaBuffer, CudaError> {
    x.absent()
}

pub fn im2col(input: &CudaBuffer, _g: &Geometry) -> Result<CudaBuffer, CudaError> {
    input.absent()
}

pub fn col2im(cols: &CudaBuffer, _g: &Geometry) -> Result<CudaBuffer, CudaError> {
    cols.absent()
}

pub fn max_pool(input: &CudaBuffer, _g: &Geometry) -> Result<(CudaBuffer, Argmax), CudaError> {
    input.absent()
}

pub fn max_pool_grad(
    _dy: &CudaBuffer,
    argmax: &Argmax,
    _g: &Geometry,
) -> Result<CudaBuffer, CudaError> {
    match argmax.never {}
}

/// Indices into a max pooling's input; without the `cuda` feature there are none.
#[derive(Debug)]
pub struct Argmax {
    never: std::convert::Infallible,
}

impl Argmax {
    pub fn len(&self) -> usize {
        match self.never {}
    }

    pub fn is_empty(&self) -> bool {
        match self.never {}
    }
}
