//! The operations on device buffers: each checks its arguments, then queues one kernel (or one
//! cuBLAS call) on the device's stream. Nothing waits for the GPU here; reading a result back
//! ([`CudaBuffer::to_host`]) does.

#![allow(
    unsafe_code,
    reason = "kernel launches and cuBLAS calls; each states its reasoning in a SAFETY comment"
)]

use cudarc::cublas::{Gemm, GemmConfig, sys::cublasOperation_t};
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};

use crate::buffer::CudaBuffer;
use crate::device::CudaDevice;
use crate::error::CudaError;

/// Threads per block of the element-wise kernels.
const THREADS: u32 = 256;

/// Most blocks launched: the kernels' grid-stride loops cover any size with these.
const MAX_BLOCKS: usize = 1 << 16;

fn grid(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS);
    LaunchConfig {
        grid_dim: (u32::try_from(blocks).unwrap_or(u32::MAX), 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn count(n: usize) -> u64 {
    n as u64
}

fn launched(result: Result<(), cudarc::driver::DriverError>) -> Result<(), CudaError> {
    result.map_err(CudaError::driver("launching a kernel"))
}

/// The device every buffer is on, or an error naming `op`.
fn same_device<'a>(
    op: &'static str,
    buffers: &[&'a CudaBuffer],
) -> Result<&'a CudaDevice, CudaError> {
    let (first, rest) = buffers
        .split_first()
        .ok_or_else(|| CudaError::invalid(op, "no buffer"))?;
    if rest.iter().any(|b| b.device() != first.device()) {
        return Err(CudaError::invalid(op, "buffers on different devices"));
    }
    Ok(first.device())
}

fn same_len(op: &'static str, buffers: &[&CudaBuffer]) -> Result<usize, CudaError> {
    let len = buffers.first().map_or(0, |b| b.len());
    if buffers.iter().any(|b| b.len() != len) {
        let lens: Vec<usize> = buffers.iter().map(|b| b.len()).collect();
        return Err(CudaError::invalid(op, format!("lengths differ: {lens:?}")));
    }
    Ok(len)
}

/// An element-wise operation of two buffers of one length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
}

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
    let mut out = device.zeros(len)?;
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
    let mut out = device.zeros(n)?;
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
    let mut out = device.zeros(x.len())?;
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

/// `max(x, 0)`, NaN giving 0 as on the CPU.
///
/// # Errors
///
/// The driver's error.
pub fn relu(x: &CudaBuffer) -> Result<CudaBuffer, CudaError> {
    let device = x.device();
    let mut out = device.zeros(x.len())?;
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
    let mut out = device.zeros(n)?;
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
    let mut out = device.zeros(x.len())?;
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

/// Rows summed into one partial sum by [`column_sums`]: lockstep-tensor's CPU kernel sums
/// blocks of as many rows, then adds the block sums in order, so both give the same bits.
pub const COLUMN_SUM_BLOCK_ROWS: usize = 256;

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
    let mut partials = device.zeros(blocks * cols)?;
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
    let mut out = device.zeros(cols)?;
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
    let mut out = device.zeros(1)?;
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
        stream.clone_htod(&labels)
    }
    .map_err(CudaError::driver("copying labels to the device"))?;
    let rows = logits.len() / classes;
    let mut loss = device.zeros(rows)?;
    let mut grad = device.zeros(logits.len())?;
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
    let mut out = device.zeros(x.len())?;
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
    let mut out = device.zeros(n)?;
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
    let mut out = device.zeros(x.len())?;
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

/// The natural logarithm of each value.
///
/// # Errors
///
/// The driver's error.
pub fn log(x: &CudaBuffer) -> Result<CudaBuffer, CudaError> {
    let device = x.device();
    let mut out = device.zeros(x.len())?;
    let f = device.kernels()?.get("log_f32")?;
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
    let mut out = device.zeros(x.len())?;
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
    let mut out = device.zeros(n)?;
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

/// The sizes of a convolution or pooling window over NHWC input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(missing_docs, reason = "the fields are the sizes their names say")]
pub struct Geometry {
    pub batch: usize,
    pub height: usize,
    pub width: usize,
    pub channels: usize,
    pub kernel_h: usize,
    pub kernel_w: usize,
    pub stride_h: usize,
    pub stride_w: usize,
    pub pad_top: usize,
    pub pad_left: usize,
    pub out_h: usize,
    pub out_w: usize,
}

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
    let mut cols = device.zeros(n)?;
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
    let mut input = device.zeros(n)?;
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
    let mut out = device.zeros(n)?;
    let mut argmax: CudaSlice<u64> = device
        .stream()
        .alloc_zeros(n.max(1))
        .map_err(CudaError::driver("allocating"))?;
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
    let mut dx = device.zeros(n)?;
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
    let mut out = device.zeros(x.len())?;
    let mut mask = device.zeros(x.len())?;
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

/// Adam's constants for one step: `alpha = lr · sqrt(1 - beta_2^t) / (1 - beta_1^t)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamStep {
    /// The step size of this step.
    pub alpha: f32,
    /// The first moment's decay.
    pub beta_1: f32,
    /// The second moment's decay.
    pub beta_2: f32,
    /// Added to the second moment's root.
    pub epsilon: f32,
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

/// One operand of [`matmul`]: a row-major `rows × cols` matrix, read transposed when
/// `transposed`.
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a> {
    /// The values.
    pub buffer: &'a CudaBuffer,
    /// Rows as stored.
    pub rows: usize,
    /// Columns as stored.
    pub cols: usize,
    /// Whether the product reads the matrix transposed.
    pub transposed: bool,
}

impl MatRef<'_> {
    /// `(rows, cols)` as the product reads it.
    fn shape(&self) -> (usize, usize) {
        if self.transposed {
            (self.cols, self.rows)
        } else {
            (self.rows, self.cols)
        }
    }

    fn operation(&self) -> cublasOperation_t {
        if self.transposed {
            cublasOperation_t::CUBLAS_OP_T
        } else {
            cublasOperation_t::CUBLAS_OP_N
        }
    }
}

fn int(op: &'static str, value: usize) -> Result<i32, CudaError> {
    i32::try_from(value.max(1))
        .map_err(|_| CudaError::invalid(op, format!("dimension {value} exceeds cuBLAS's i32")))
}

/// `a · b` by cuBLAS SGEMM (full `f32`, no TF32), row-major `[m, n]`.
///
/// # Errors
///
/// Shapes that do not match each other or their buffers, buffers on different devices, or a
/// dimension past `i32`; cuBLAS's error.
pub fn matmul(a: MatRef<'_>, b: MatRef<'_>) -> Result<CudaBuffer, CudaError> {
    const OP: &str = "matmul";
    let device = same_device(OP, &[a.buffer, b.buffer])?;
    let ((m, k), (k2, n)) = (a.shape(), b.shape());
    for operand in [&a, &b] {
        if operand.rows.checked_mul(operand.cols) != Some(operand.buffer.len()) {
            return Err(CudaError::invalid(
                OP,
                format!(
                    "{}×{} does not fit {} values",
                    operand.rows,
                    operand.cols,
                    operand.buffer.len()
                ),
            ));
        }
    }
    if k != k2 {
        return Err(CudaError::invalid(OP, format!("[{m}, {k}] · [{k2}, {n}]")));
    }
    let len = m
        .checked_mul(n)
        .ok_or_else(|| CudaError::invalid(OP, "the product's size overflows"))?;
    let mut c = device.zeros(len)?;
    if len == 0 || k == 0 {
        return Ok(c);
    }
    // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ: cuBLAS multiplies B's storage by A's.
    let config = GemmConfig {
        transa: b.operation(),
        transb: a.operation(),
        m: int(OP, n)?,
        n: int(OP, m)?,
        k: int(OP, k)?,
        alpha: 1.0_f32,
        lda: int(OP, b.cols)?,
        ldb: int(OP, a.cols)?,
        beta: 0.0_f32,
        ldc: int(OP, n)?,
    };
    let blas = device.blas()?;
    // SAFETY: the shapes are checked against each other and against the buffers' lengths, and
    // the leading dimensions are the stored rows' lengths, so cuBLAS stays inside the buffers.
    unsafe { blas.gemm(config, b.buffer.slice(), a.buffer.slice(), c.slice_mut()) }.map_err(
        |source| CudaError::Blas {
            what: "sgemm",
            source,
        },
    )?;
    Ok(c)
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
