//! The GPU paths of the operations: where every operand lives on one GPU, an operation runs
//! here instead of on the CPU kernels, through `lockstep-cuda`'s kernels and cuBLAS. Each
//! function takes operands already checked by the operation (shapes, arguments) and records
//! a backward rule whose gradients stay on the GPU.
//!
//! Results equal the CPU's up to rounding: element-wise work, relu, bias and the gathers
//! (im2col, pooling) exactly; sums, `exp`/`log` and products within the tolerances
//! `lockstep-cuda`'s tests state. Dropout's mask is a hash of the seed and the position on the
//! GPU, a PCG stream on the CPU: the same seed gives the same mask on one device, not across.

use lockstep_cuda::ops::{self as cuda, Binary, MatRef, Pointwise};
use lockstep_cuda::{CudaBuffer, CudaError};

use crate::device::Device;
use crate::error::TensorError;
use crate::kernels::geometry::Geometry;
use crate::storage::Storage;
use crate::tensor::Tensor;

/// Where an operation runs, from its operands.
pub(crate) enum On<'a> {
    /// Every operand is in host memory.
    Cpu,
    /// Every operand is on one GPU: their buffers, in operand order.
    Cuda(Vec<&'a CudaBuffer>),
}

/// Where `op` runs on `operands`.
///
/// # Errors
///
/// When the operands lie on different devices.
pub(crate) fn on<'a>(op: &'static str, operands: &[&'a Tensor]) -> Result<On<'a>, TensorError> {
    let device = operands.first().map_or(Device::Cpu, |t| t.device());
    if let Some(other) = operands.iter().find(|t| t.device() != device) {
        return Err(TensorError::device(
            op,
            device,
            format!(
                "an operand is on {}: move every operand to one device with to_device",
                other.device()
            ),
        ));
    }
    match device {
        Device::Cpu => Ok(On::Cpu),
        Device::Cuda(_) => Ok(On::Cuda(
            operands
                .iter()
                .map(|t| buffer(op, t))
                .collect::<Result<_, _>>()?,
        )),
    }
}

/// The GPU buffer of `t`.
fn buffer<'a>(op: &'static str, t: &'a Tensor) -> Result<&'a CudaBuffer, TensorError> {
    match t.storage() {
        Storage::Cuda(buffer) => Ok(buffer),
        Storage::Cpu(_) => Err(TensorError::device(
            op,
            Device::Cpu,
            "a GPU operation met a tensor in host memory",
        )),
    }
}

/// Maps `lockstep-cuda`'s error to one naming `op` and the device.
fn failed(op: &'static str, on: &CudaBuffer) -> impl Fn(CudaError) -> TensorError + use<> {
    let device = Device::Cuda(on.device().ordinal());
    move |e| TensorError::device(op, device, e)
}

/// The one buffer of `ops` (operands of a unary operation).
fn first<'a>(op: &'static str, buffers: &[&'a CudaBuffer]) -> Result<&'a CudaBuffer, TensorError> {
    buffers
        .first()
        .copied()
        .ok_or_else(|| TensorError::invalid(op, "no operand"))
}

/// A tensor of `shape` filled with `value` on the device of `like`, with no host transfer.
pub(crate) fn full_like(
    like: &CudaBuffer,
    shape: &[usize],
    value: f32,
) -> Result<Tensor, TensorError> {
    let len = crate::tensor::count_values("full", shape)?;
    let out = cuda::fill(like.device(), len, value).map_err(failed("full", like))?;
    Ok(Tensor::raw(out, shape.to_vec()))
}

/// `a + b` for gradients of one shape meeting in the backward pass.
pub(crate) fn add_gradients(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    let (x, y) = (buffer("backward", a)?, buffer("backward", b)?);
    let sum = cuda::binary(Binary::Add, x, y).map_err(failed("backward", x))?;
    Ok(Tensor::raw(sum, a.shape().to_vec()))
}

/// The element-wise arithmetic of operands of one shape (broadcasting on the GPU is left to a
/// later kernel: the models' layers do not need it).
pub(crate) fn arithmetic(
    op: &'static str,
    kind: Binary,
    (a, b): (&Tensor, &Tensor),
    buffers: &[&CudaBuffer],
) -> Result<Tensor, TensorError> {
    let &[x, y] = buffers else {
        return Err(TensorError::invalid(op, "two operands"));
    };
    if a.shape() != b.shape() {
        return Err(TensorError::device(
            op,
            a.device(),
            format!(
                "broadcasting {:?} with {:?} runs on the CPU only; operands of one shape run here",
                a.shape(),
                b.shape()
            ),
        ));
    }
    let out = cuda::binary(kind, x, y).map_err(failed(op, x))?;
    let (ca, cb) = (a.clone(), b.clone());
    let shape = a.shape().to_vec();
    Ok(Tensor::from_op(out, shape.clone(), &[a, b], move |g, _| {
        let d = buffer(op, g)?;
        let (x, y) = (buffer(op, &ca)?, buffer(op, &cb)?);
        let e = failed(op, d);
        let (da, db) = match kind {
            Binary::Add => (g.clone(), g.clone()),
            Binary::Sub => (
                g.clone(),
                Tensor::raw(cuda::scale(d, -1.0).map_err(&e)?, shape.clone()),
            ),
            Binary::Mul => (
                Tensor::raw(cuda::binary(Binary::Mul, d, y).map_err(&e)?, shape.clone()),
                Tensor::raw(cuda::binary(Binary::Mul, d, x).map_err(&e)?, shape.clone()),
            ),
            Binary::Div => {
                // −g·x / (y·y), rounded as the CPU rounds it.
                let gx = cuda::binary(Binary::Mul, d, x).map_err(&e)?;
                let yy = cuda::binary(Binary::Mul, y, y).map_err(&e)?;
                let quotient = cuda::binary(Binary::Div, &gx, &yy).map_err(&e)?;
                (
                    Tensor::raw(cuda::binary(Binary::Div, d, y).map_err(&e)?, shape.clone()),
                    Tensor::raw(cuda::scale(&quotient, -1.0).map_err(&e)?, shape.clone()),
                )
            }
        };
        Ok(vec![Some(da), Some(db)])
    }))
}

/// `x · factor`.
pub(crate) fn scale(
    x: &Tensor,
    buffers: &[&CudaBuffer],
    factor: f32,
) -> Result<Tensor, TensorError> {
    const OP: &str = "scale";
    let input = first(OP, buffers)?;
    let out = cuda::scale(input, factor).map_err(failed(OP, input))?;
    Ok(Tensor::from_op(
        out,
        x.shape().to_vec(),
        &[x],
        move |g, _| {
            let d = buffer(OP, g)?;
            let dx = cuda::scale(d, factor).map_err(failed(OP, d))?;
            Ok(vec![Some(Tensor::raw(dx, g.shape().to_vec()))])
        },
    ))
}

/// `max(x, 0)`.
pub(crate) fn relu(x: &Tensor, buffers: &[&CudaBuffer]) -> Result<Tensor, TensorError> {
    const OP: &str = "relu";
    let input = first(OP, buffers)?;
    let out = cuda::relu(input).map_err(failed(OP, input))?;
    Ok(Tensor::from_op(out, x.shape().to_vec(), &[x], |g, y| {
        Ok(vec![Some(relu_grad(g, y)?)])
    }))
}

/// The gradient through a relu, from its output.
pub(crate) fn relu_grad(g: &Tensor, y: &Tensor) -> Result<Tensor, TensorError> {
    const OP: &str = "relu";
    let (d, out) = (buffer(OP, g)?, buffer(OP, y)?);
    let dx = cuda::relu_grad(d, out).map_err(failed(OP, d))?;
    Ok(Tensor::raw(dx, y.shape().to_vec()))
}

/// A smooth function of each value, its gradient from the input or the output as `f` says.
pub(crate) fn pointwise(
    op: &'static str,
    f: Pointwise,
    x: &Tensor,
    buffers: &[&CudaBuffer],
) -> Result<Tensor, TensorError> {
    let input = first(op, buffers)?;
    let out = cuda::pointwise(f, input).map_err(failed(op, input))?;
    let kept = x.clone();
    Ok(Tensor::from_op(
        out,
        x.shape().to_vec(),
        &[x],
        move |g, y| {
            let at = if f.grad_from_output() { y } else { &kept };
            let (d, at) = (buffer(op, g)?, buffer(op, at)?);
            let dx = cuda::pointwise_grad(f, d, at).map_err(failed(op, d))?;
            Ok(vec![Some(Tensor::raw(dx, kept.shape().to_vec()))])
        },
    ))
}

/// `a` where `condition` is non-zero, else `b`, all of one shape; the gradient goes to the
/// operand chosen.
pub(crate) fn select(
    condition: &Tensor,
    (a, b): (&Tensor, &Tensor),
    buffers: &[&CudaBuffer],
) -> Result<Tensor, TensorError> {
    const OP: &str = "select";
    let &[c, x, y] = buffers else {
        return Err(TensorError::invalid(OP, "three operands"));
    };
    if a.shape() != b.shape() || condition.shape() != a.shape() {
        return Err(TensorError::device(
            OP,
            a.device(),
            format!(
                "broadcasting {:?}, {:?} and {:?} runs on the CPU only; operands of one shape \
                 run here",
                condition.shape(),
                a.shape(),
                b.shape()
            ),
        ));
    }
    let out = cuda::select(c, x, y).map_err(failed(OP, x))?;
    let kept = condition.detach();
    let shape = a.shape().to_vec();
    Ok(Tensor::from_op(out, shape.clone(), &[a, b], move |g, _| {
        let (d, c) = (buffer(OP, g)?, buffer(OP, &kept)?);
        let zero = cuda::fill(d.device(), d.len(), 0.0).map_err(failed(OP, d))?;
        let da = cuda::select(c, d, &zero).map_err(failed(OP, d))?;
        let db = cuda::select(c, &zero, d).map_err(failed(OP, d))?;
        Ok(vec![
            Some(Tensor::raw(da, shape.clone())),
            Some(Tensor::raw(db, shape.clone())),
        ])
    }))
}

/// `x` with its axes reordered (`axes` checked by the operation); the gradient reorders back.
pub(crate) fn permute(
    x: &Tensor,
    buffers: &[&CudaBuffer],
    axes: &[usize],
    shape: Vec<usize>,
    inverse: Vec<usize>,
) -> Result<Tensor, TensorError> {
    const OP: &str = "permute";
    let input = first(OP, buffers)?;
    let out = cuda::permute(input, x.shape(), axes).map_err(failed(OP, input))?;
    Ok(Tensor::from_op(out, shape, &[x], move |g, _| {
        let d = buffer(OP, g)?;
        let dx = cuda::permute(d, g.shape(), &inverse).map_err(failed(OP, d))?;
        let back: Vec<usize> = inverse.iter().map(|&a| g.shape()[a]).collect();
        Ok(vec![Some(Tensor::raw(dx, back))])
    }))
}

/// The natural logarithm.
pub(crate) fn log(x: &Tensor, buffers: &[&CudaBuffer]) -> Result<Tensor, TensorError> {
    const OP: &str = "log";
    let input = first(OP, buffers)?;
    let out = cuda::log(input).map_err(failed(OP, input))?;
    let kept = x.clone();
    Ok(Tensor::from_op(
        out,
        x.shape().to_vec(),
        &[x],
        move |g, _| {
            let (d, v) = (buffer(OP, g)?, buffer(OP, &kept)?);
            let dx = cuda::binary(Binary::Div, d, v).map_err(failed(OP, d))?;
            Ok(vec![Some(Tensor::raw(dx, kept.shape().to_vec()))])
        },
    ))
}

/// `e` to the power of each value; its gradient is `g · exp(x)`, the output itself.
pub(crate) fn exp(x: &Tensor, buffers: &[&CudaBuffer]) -> Result<Tensor, TensorError> {
    const OP: &str = "exp";
    let input = first(OP, buffers)?;
    let out = cuda::exp(input).map_err(failed(OP, input))?;
    Ok(Tensor::from_op(
        out,
        x.shape().to_vec(),
        &[x],
        move |g, y| {
            let (d, e) = (buffer(OP, g)?, buffer(OP, y)?);
            let dx = cuda::binary(Binary::Mul, d, e).map_err(failed(OP, d))?;
            Ok(vec![Some(Tensor::raw(dx, y.shape().to_vec()))])
        },
    ))
}

/// Values limited to `[min, max]`.
pub(crate) fn clip(
    x: &Tensor,
    buffers: &[&CudaBuffer],
    (min, max): (f32, f32),
) -> Result<Tensor, TensorError> {
    const OP: &str = "clip";
    let input = first(OP, buffers)?;
    let out = cuda::clip(input, min, max).map_err(failed(OP, input))?;
    let kept = x.clone();
    Ok(Tensor::from_op(
        out,
        x.shape().to_vec(),
        &[x],
        move |g, _| {
            let (d, v) = (buffer(OP, g)?, buffer(OP, &kept)?);
            let dx = cuda::clip_grad(d, v, min, max).map_err(failed(OP, d))?;
            Ok(vec![Some(Tensor::raw(dx, kept.shape().to_vec()))])
        },
    ))
}

/// Softmax over the last axis of `classes` values.
pub(crate) fn softmax(
    x: &Tensor,
    buffers: &[&CudaBuffer],
    classes: usize,
) -> Result<Tensor, TensorError> {
    const OP: &str = "softmax";
    let input = first(OP, buffers)?;
    let out = cuda::softmax(input, classes).map_err(failed(OP, input))?;
    Ok(Tensor::from_op(
        out,
        x.shape().to_vec(),
        &[x],
        move |g, y| {
            let (d, probs) = (buffer(OP, g)?, buffer(OP, y)?);
            let dx = cuda::softmax_grad(probs, d, classes).map_err(failed(OP, d))?;
            Ok(vec![Some(Tensor::raw(dx, y.shape().to_vec()))])
        },
    ))
}

/// `x [..., c] + bias [c]`.
pub(crate) fn bias_add(
    x: &Tensor,
    bias: &Tensor,
    buffers: &[&CudaBuffer],
) -> Result<Tensor, TensorError> {
    const OP: &str = "bias_add";
    let &[input, b] = buffers else {
        return Err(TensorError::invalid(OP, "two operands"));
    };
    let out = cuda::bias_add(input, b, false).map_err(failed(OP, input))?;
    let c = bias.len();
    Ok(Tensor::from_op(
        out,
        x.shape().to_vec(),
        &[x, bias],
        move |g, _| {
            let d = buffer(OP, g)?;
            let db = cuda::column_sums(d, c).map_err(failed(OP, d))?;
            Ok(vec![Some(g.clone()), Some(Tensor::raw(db, vec![c]))])
        },
    ))
}

/// The sum over the leading `reduced` axes of `x` (all of them included), as `[inner]` values
/// shaped `out_shape`. Other axes are reduced on the CPU only.
pub(crate) fn sum_leading(
    x: &Tensor,
    buffers: &[&CudaBuffer],
    inner: usize,
    out_shape: Vec<usize>,
) -> Result<Tensor, TensorError> {
    const OP: &str = "sum";
    let input = first(OP, buffers)?;
    let out = if inner == 1 {
        cuda::sum(input)
    } else {
        cuda::column_sums(input, inner)
    }
    .map_err(failed(OP, input))?;
    let input_shape = x.shape().to_vec();
    let n = x.len();
    Ok(Tensor::from_op(out, out_shape, &[x], move |g, _| {
        // Every input value receives the gradient of the sum it went into: the kept values
        // repeated along the reduced leading axes, as a bias is added to every row.
        let d = buffer(OP, g)?;
        let e = failed(OP, d);
        let zeros = d.device().zeros(n).map_err(&e)?;
        let dx = cuda::bias_add(&zeros, d, false).map_err(&e)?;
        Ok(vec![Some(Tensor::raw(dx, input_shape.clone()))])
    }))
}

/// The per-example softmax cross-entropy of `[rows, classes]` logits.
pub(crate) fn sparse_softmax_cross_entropy(
    logits: &Tensor,
    buffers: &[&CudaBuffer],
    labels: &[usize],
    classes: usize,
) -> Result<Tensor, TensorError> {
    const OP: &str = "sparse_softmax_cross_entropy_with_logits";
    let input = first(OP, buffers)?;
    let (losses, grad) =
        cuda::sparse_softmax_cross_entropy(input, labels, classes).map_err(failed(OP, input))?;
    let rows = labels.len();
    Ok(Tensor::from_op(
        losses,
        vec![rows],
        &[logits],
        move |g, _| {
            let d = buffer(OP, g)?;
            let dx = cuda::scale_rows(&grad, d).map_err(failed(OP, d))?;
            Ok(vec![Some(Tensor::raw(dx, vec![rows, classes]))])
        },
    ))
}

/// Dropout with the GPU's hashed mask.
pub(crate) fn dropout(
    x: &Tensor,
    buffers: &[&CudaBuffer],
    rate: f32,
    seed: u64,
) -> Result<Tensor, TensorError> {
    const OP: &str = "dropout";
    let input = first(OP, buffers)?;
    let (out, mask) = cuda::dropout(input, rate, seed).map_err(failed(OP, input))?;
    Ok(Tensor::from_op(
        out,
        x.shape().to_vec(),
        &[x],
        move |g, _| {
            let d = buffer(OP, g)?;
            let dx = cuda::binary(Binary::Mul, d, &mask).map_err(failed(OP, d))?;
            Ok(vec![Some(Tensor::raw(dx, g.shape().to_vec()))])
        },
    ))
}

fn plain(buffer: &CudaBuffer, rows: usize, cols: usize) -> MatRef<'_> {
    MatRef {
        buffer,
        rows,
        cols,
        transposed: false,
    }
}

fn transposed(buffer: &CudaBuffer, rows: usize, cols: usize) -> MatRef<'_> {
    MatRef {
        buffer,
        rows,
        cols,
        transposed: true,
    }
}

/// `relu?(z + bias)` of a product's output `z [rows, n]`, in one kernel with the bias.
fn bias_relu(
    op: &'static str,
    z: CudaBuffer,
    bias: Option<&CudaBuffer>,
    relu: bool,
) -> Result<CudaBuffer, TensorError> {
    let e = failed(op, &z);
    match (bias, relu) {
        (Some(b), relu) => cuda::bias_add(&z, b, relu).map_err(e),
        (None, true) => cuda::relu(&z).map_err(e),
        (None, false) => Ok(z),
    }
}

/// The gradient of a product's output before its relu, `[rows, n]`.
fn before_relu(
    op: &'static str,
    d: &Tensor,
    y: &Tensor,
    relu: bool,
) -> Result<CudaBuffer, TensorError> {
    let g = buffer(op, d)?;
    if relu {
        cuda::relu_grad(g, buffer(op, y)?).map_err(failed(op, g))
    } else {
        g.try_clone().map_err(failed(op, g))
    }
}

/// `relu?(x [m, k] · w [k, n] + bias)`.
pub(crate) fn product(
    op: &'static str,
    (x, w, bias): (&Tensor, &Tensor, Option<&Tensor>),
    buffers: &[&CudaBuffer],
    (m, k, n): (usize, usize, usize),
    relu: bool,
) -> Result<Tensor, TensorError> {
    let (&[a, b], rest) = buffers.split_at(2.min(buffers.len())) else {
        return Err(TensorError::invalid(op, "two operands"));
    };
    let z = cuda::matmul(plain(a, m, k), plain(b, k, n)).map_err(failed(op, a))?;
    let out = bias_relu(op, z, rest.first().copied(), relu)?;
    let (input, weights, has_bias) = (x.clone(), w.clone(), bias.is_some());
    let operands: Vec<&Tensor> = [x, w].into_iter().chain(bias).collect();
    Ok(Tensor::from_op(out, vec![m, n], &operands, move |d, y| {
        let dz = before_relu(op, d, y, relu)?;
        let e = failed(op, &dz);
        let (xb, wb) = (buffer(op, &input)?, buffer(op, &weights)?);
        let dx = input
            .requires_grad()
            .then(|| cuda::matmul(plain(&dz, m, n), transposed(wb, k, n)))
            .transpose()
            .map_err(&e)?
            .map(|v| Tensor::raw(v, vec![m, k]));
        let dw = weights
            .requires_grad()
            .then(|| cuda::matmul(transposed(xb, m, k), plain(&dz, m, n)))
            .transpose()
            .map_err(&e)?
            .map(|v| Tensor::raw(v, vec![k, n]));
        let mut grads = vec![dx, dw];
        if has_bias {
            let db = cuda::column_sums(&dz, n).map_err(&e)?;
            grads.push(Some(Tensor::raw(db, vec![n])));
        }
        Ok(grads)
    }))
}

fn kernel_geometry(g: &Geometry) -> cuda::Geometry {
    cuda::Geometry {
        batch: g.batch,
        height: g.height,
        width: g.width,
        channels: g.channels,
        kernel_h: g.kernel_h,
        kernel_w: g.kernel_w,
        stride_h: g.stride_h,
        stride_w: g.stride_w,
        pad_top: g.pad_top,
        pad_left: g.pad_left,
        out_h: g.out_h,
        out_w: g.out_w,
    }
}

/// `relu?(conv2d(x, kernel) + bias)` as im2col and one cuBLAS product: the windows unfolded
/// into rows `[batch·out_h·out_w, kh·kw·c_in]` times the kernel `[kh·kw·c_in, filters]`, which is
/// the kernel's Keras layout read as a matrix.
pub(crate) fn conv2d(
    (x, kernel, bias): (&Tensor, &Tensor, Option<&Tensor>),
    buffers: &[&CudaBuffer],
    g: &Geometry,
    filters: usize,
    relu: bool,
) -> Result<Tensor, TensorError> {
    const OP: &str = "conv2d";
    let (&[input, weights], rest) = buffers.split_at(2.min(buffers.len())) else {
        return Err(TensorError::invalid(OP, "two operands"));
    };
    let geometry = kernel_geometry(g);
    let e = failed(OP, input);
    let cols = cuda::im2col(input, &geometry).map_err(&e)?;
    let (rows, patch) = (g.batch * g.out_pixels(), g.patch());
    let z = cuda::matmul(plain(&cols, rows, patch), plain(weights, patch, filters)).map_err(&e)?;
    let out = bias_relu(OP, z, rest.first().copied(), relu)?;
    let (input_t, weights_t, has_bias) = (x.clone(), kernel.clone(), bias.is_some());
    let operands: Vec<&Tensor> = [x, kernel].into_iter().chain(bias).collect();
    let shape = vec![g.batch, g.out_h, g.out_w, filters];
    Ok(Tensor::from_op(out, shape, &operands, move |d, y| {
        let dz = before_relu(OP, d, y, relu)?;
        let e = failed(OP, &dz);
        let wb = buffer(OP, &weights_t)?;
        let dx = if input_t.requires_grad() {
            let dcols = cuda::matmul(plain(&dz, rows, filters), transposed(wb, patch, filters))
                .map_err(&e)?;
            let dx = cuda::col2im(&dcols, &geometry).map_err(&e)?;
            Some(Tensor::raw(dx, input_t.shape().to_vec()))
        } else {
            None
        };
        let dk = weights_t
            .requires_grad()
            .then(|| cuda::matmul(transposed(&cols, rows, patch), plain(&dz, rows, filters)))
            .transpose()
            .map_err(&e)?
            .map(|v| Tensor::raw(v, weights_t.shape().to_vec()));
        let mut grads = vec![dx, dk];
        if has_bias {
            let db = cuda::column_sums(&dz, filters).map_err(&e)?;
            grads.push(Some(Tensor::raw(db, vec![filters])));
        }
        Ok(grads)
    }))
}

/// Max pooling with the windows of `g`.
pub(crate) fn max_pool2d(
    x: &Tensor,
    buffers: &[&CudaBuffer],
    g: &Geometry,
) -> Result<Tensor, TensorError> {
    const OP: &str = "max_pool2d";
    let input = first(OP, buffers)?;
    let geometry = kernel_geometry(g);
    let (out, argmax) = cuda::max_pool(input, &geometry).map_err(failed(OP, input))?;
    let shape = x.shape().to_vec();
    Ok(Tensor::from_op(
        out,
        vec![g.batch, g.out_h, g.out_w, g.channels],
        &[x],
        move |d, _| {
            let dy = buffer(OP, d)?;
            let dx = cuda::max_pool_grad(dy, &argmax, &geometry).map_err(failed(OP, dy))?;
            Ok(vec![Some(Tensor::raw(dx, shape.clone()))])
        },
    ))
}
