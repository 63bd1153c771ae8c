//! `Tensor`: an immutable, cheaply cloned `f32` array that remembers how it was computed when
//! gradients are wanted.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use lockstep_cuda::CudaBuffer;
use ndarray::{ArrayD, ArrayViewD, IxDyn};

use crate::autograd::{Backward, BackwardInParts, GradFn};
use crate::device::Device;
use crate::error::TensorError;
use crate::storage::Storage;

/// Identifies a tensor for the lifetime of the process (gradients are keyed by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(u64);

impl TensorId {
    fn fresh() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Self(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// How a tensor takes part in differentiation.
pub(crate) enum Grad {
    /// A constant: no gradient flows to or through it.
    None,
    /// A leaf whose gradient is wanted (a parameter).
    Leaf,
    /// The output of an operation on tensors that need gradients.
    Node(GradFn),
}

pub(crate) struct Inner {
    pub(crate) id: TensorId,
    pub(crate) storage: Storage,
    pub(crate) shape: Vec<usize>,
    pub(crate) grad: Grad,
}

/// An n-dimensional array of `f32`, row-major, immutable. Cloning shares the data.
///
/// The values live on a [`Device`]: host memory, or a GPU's after [`Tensor::to_device`].
/// Operations run where their operands are; reading values needs them on the host
/// ([`Tensor::host_data`]) or copies them there ([`Tensor::to_vec`], [`Tensor::item`]).
///
/// Operations (in [`crate::ops`]) record how each result was computed only when some input
/// needs a gradient — a [`Tensor::parameter`] or a result computed from one — so inference
/// builds no graph. [`Tensor::backward`] then gives the gradient of a scalar with respect to
/// every parameter it depends on, like `tf.GradientTape.gradient`.
///
/// ```
/// use lockstep_tensor::{Tensor, ops};
///
/// let w = Tensor::parameter(vec![1.0, 2.0, 3.0, 4.0], &[2, 2])?;
/// let x = Tensor::from_vec(vec![1.0, 1.0], &[1, 2])?;
/// let y = ops::sum(&ops::matmul(&x, &w)?, &[0, 1], false)?; // y = sum(x · w)
/// let grads = y.backward()?;
/// assert_eq!(grads.get(&w).unwrap().host_data()?, [1.0, 1.0, 1.0, 1.0]);
/// # Ok::<(), lockstep_tensor::TensorError>(())
/// ```
#[derive(Clone)]
pub struct Tensor {
    pub(crate) inner: Arc<Inner>,
}

/// The number of values a tensor of `shape` holds, or `None` when the product of its non-zero
/// dimensions does not fit in `usize`.
///
/// A zero dimension does not excuse the others: kernels multiply subsets of a shape's
/// dimensions (rows, columns, windows), so every such product must fit, not only the total.
///
/// ```
/// use lockstep_tensor::element_count;
///
/// assert_eq!(element_count(&[2, 3, 4]), Some(24));
/// assert_eq!(element_count(&[]), Some(1));
/// assert_eq!(element_count(&[0, 5]), Some(0));
/// assert_eq!(element_count(&[0, usize::MAX, 2]), None);
/// ```
pub fn element_count(shape: &[usize]) -> Option<usize> {
    let nonzero = shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1_usize, |acc, &d| acc.checked_mul(d))?;
    Some(if shape.contains(&0) { 0 } else { nonzero })
}

/// [`element_count`], as an error naming `op` when it overflows.
pub(crate) fn count_values(op: &'static str, shape: &[usize]) -> Result<usize, TensorError> {
    element_count(shape).ok_or_else(|| {
        TensorError::invalid(
            op,
            format!("shape {shape:?} has more values than a usize can count"),
        )
    })
}

fn check_len(op: &'static str, len: usize, shape: &[usize]) -> Result<(), TensorError> {
    if count_values(op, shape)? == len {
        Ok(())
    } else {
        Err(TensorError::invalid(
            op,
            format!("{len} values do not fill shape {shape:?}"),
        ))
    }
}

impl Tensor {
    fn build(storage: Storage, shape: Vec<usize>, grad: Grad) -> Self {
        Self {
            inner: Arc::new(Inner {
                id: TensorId::fresh(),
                storage,
                shape,
                grad,
            }),
        }
    }

    /// A constant tensor.
    ///
    /// # Errors
    ///
    /// When `data.len()` is not the product of `shape`.
    pub fn from_vec(data: Vec<f32>, shape: &[usize]) -> Result<Self, TensorError> {
        check_len("from_vec", data.len(), shape)?;
        Ok(Self::build(data.into(), shape.to_vec(), Grad::None))
    }

    /// A leaf whose gradient [`Tensor::backward`] reports: a trainable variable.
    ///
    /// # Errors
    ///
    /// When `data.len()` is not the product of `shape`.
    pub fn parameter(data: Vec<f32>, shape: &[usize]) -> Result<Self, TensorError> {
        check_len("parameter", data.len(), shape)?;
        Ok(Self::build(data.into(), shape.to_vec(), Grad::Leaf))
    }

    /// A constant whose values are `buffer`, on its GPU (no copy).
    ///
    /// # Errors
    ///
    /// When `buffer.len()` is not the product of `shape`.
    pub fn from_cuda(buffer: CudaBuffer, shape: &[usize]) -> Result<Self, TensorError> {
        check_len("from_cuda", buffer.len(), shape)?;
        Ok(Self::build(buffer.into(), shape.to_vec(), Grad::None))
    }

    /// A trainable variable whose values are `buffer`, on its GPU (no copy): how a model whose
    /// parameters live on a GPU between steps hands them to a forward pass.
    ///
    /// # Errors
    ///
    /// When `buffer.len()` is not the product of `shape`.
    pub fn parameter_from_cuda(buffer: CudaBuffer, shape: &[usize]) -> Result<Self, TensorError> {
        check_len("parameter_from_cuda", buffer.len(), shape)?;
        Ok(Self::build(buffer.into(), shape.to_vec(), Grad::Leaf))
    }

    /// A constant copied from an ndarray array of any layout.
    pub fn from_array(array: &ArrayViewD<'_, f32>) -> Self {
        let data: Vec<f32> = array.as_standard_layout().iter().copied().collect();
        Self::build(data.into(), array.shape().to_vec(), Grad::None)
    }

    /// A constant of zeros.
    ///
    /// # Errors
    ///
    /// When the shape's element count does not fit in `usize`.
    pub fn zeros(shape: &[usize]) -> Result<Self, TensorError> {
        Self::full(shape, 0.0)
    }

    /// A constant filled with `value`.
    ///
    /// ```
    /// use lockstep_tensor::Tensor;
    ///
    /// assert_eq!(Tensor::full(&[2, 2], 1.5)?.host_data()?, [1.5; 4]);
    /// assert!(Tensor::full(&[usize::MAX, 2], 0.0).is_err());
    /// # Ok::<(), lockstep_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// When the shape's element count does not fit in `usize`.
    pub fn full(shape: &[usize], value: f32) -> Result<Self, TensorError> {
        let len = count_values("full", shape)?;
        Ok(Self::build(
            vec![value; len].into(),
            shape.to_vec(),
            Grad::None,
        ))
    }

    /// A rank-0 constant.
    pub fn scalar(value: f32) -> Self {
        Self::build(vec![value].into(), Vec::new(), Grad::None)
    }

    /// The result of an operation: records `backward` when some input needs a gradient.
    pub(crate) fn from_op(
        data: impl Into<Storage>,
        shape: Vec<usize>,
        inputs: &[&Tensor],
        backward: impl Backward,
    ) -> Self {
        Self::recorded(data.into(), shape, inputs, |inputs| {
            GradFn::new(inputs, backward)
        })
    }

    /// [`Tensor::from_op`] whose backward rule computes the gradients of the inputs it is
    /// asked for only, so that a parameter's can be handed over first
    /// ([`Tensor::backward_with`]).
    pub(crate) fn from_op_in_parts(
        data: impl Into<Storage>,
        shape: Vec<usize>,
        inputs: &[&Tensor],
        backward: impl BackwardInParts,
    ) -> Self {
        Self::recorded(data.into(), shape, inputs, |inputs| {
            GradFn::in_parts(inputs, backward)
        })
    }

    /// An operation's result, with the rule `record` makes of its inputs when some input
    /// needs a gradient.
    fn recorded(
        data: Storage,
        shape: Vec<usize>,
        inputs: &[&Tensor],
        record: impl FnOnce(Vec<Tensor>) -> GradFn,
    ) -> Self {
        debug_assert_eq!(Some(data.len()), element_count(&shape));
        let grad = if inputs.iter().any(|t| t.requires_grad()) {
            Grad::Node(record(inputs.iter().map(|t| (*t).clone()).collect()))
        } else {
            Grad::None
        };
        Self::build(data, shape, grad)
    }

    /// A result that shares its input's data under another shape (reshape, flatten).
    pub(crate) fn view_op(input: &Tensor, shape: Vec<usize>, backward: impl Backward) -> Self {
        let grad = if input.requires_grad() {
            Grad::Node(GradFn::new(vec![input.clone()], backward))
        } else {
            Grad::None
        };
        Self::build(input.inner.storage.clone(), shape, grad)
    }

    /// A plain tensor for gradients and kernel results.
    pub(crate) fn raw(data: impl Into<Storage>, shape: Vec<usize>) -> Self {
        Self::build(data.into(), shape, Grad::None)
    }

    /// The same values under another shape, sharing them, with no history (a gradient
    /// passed through a reshape).
    pub(crate) fn reshaped(&self, shape: Vec<usize>) -> Self {
        Self::build(self.inner.storage.clone(), shape, Grad::None)
    }

    /// The same values with no history: gradients stop here.
    #[must_use]
    pub fn detach(&self) -> Self {
        Self::build(
            self.inner.storage.clone(),
            self.inner.shape.clone(),
            Grad::None,
        )
    }

    /// `true` for parameters and for results computed from them.
    pub fn requires_grad(&self) -> bool {
        !matches!(self.inner.grad, Grad::None)
    }

    /// This tensor's identity.
    pub fn id(&self) -> TensorId {
        self.inner.id
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.inner.shape
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.inner.shape.len()
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        self.inner.storage.len()
    }

    /// `true` when the tensor holds no values.
    pub fn is_empty(&self) -> bool {
        self.inner.storage.len() == 0
    }

    /// Where the data lives.
    pub fn device(&self) -> Device {
        self.inner.storage.device()
    }

    pub(crate) fn storage(&self) -> &Storage {
        &self.inner.storage
    }

    /// The GPU buffer holding the values, when the tensor is on a GPU: for work outside the
    /// operations, such as a gradient copied into a flat buffer on the device.
    pub fn cuda_buffer(&self) -> Option<&CudaBuffer> {
        match &self.inner.storage {
            Storage::Cuda(buffer) => Some(buffer),
            Storage::Cpu(_) => None,
        }
    }

    /// The values of a tensor in host memory, for the CPU paths of operations, which run only
    /// once [`crate::ops`]' dispatch has found every operand on the CPU. A tensor on a GPU
    /// has no host values: it reads as empty here, and the kernel's length checks fail.
    pub(crate) fn host(&self) -> &[f32] {
        match &self.inner.storage {
            Storage::Cpu(values) => values,
            Storage::Cuda(_) => &[],
        }
    }

    /// The values, row-major, when they are in host memory.
    ///
    /// # Errors
    ///
    /// When the tensor is on a GPU: copy it with [`Tensor::to_host`] or [`Tensor::to_vec`].
    pub fn host_data(&self) -> Result<&[f32], TensorError> {
        match &self.inner.storage {
            Storage::Cpu(values) => Ok(values),
            Storage::Cuda(_) => Err(TensorError::device(
                "host_data",
                self.device(),
                "the values are in GPU memory: copy them with to_host() or to_vec()",
            )),
        }
    }

    /// The values, row-major, copied to host memory (waiting for the GPU's queued work when
    /// the tensor is on one).
    ///
    /// # Errors
    ///
    /// The GPU's error.
    pub fn to_vec(&self) -> Result<Vec<f32>, TensorError> {
        self.inner.storage.to_vec()
    }

    /// This tensor on `device`: the same tensor when it is there already, else a copy.
    ///
    /// The copy takes part in differentiation as the tensor did: a parameter's copy is a
    /// parameter on `device` (how a model's variables move to a GPU), and a computed tensor's
    /// copy passes gradients back to the device it came from.
    ///
    /// ```
    /// use lockstep_tensor::{Device, Tensor};
    ///
    /// let x = Tensor::from_vec(vec![1.0, 2.0], &[2])?;
    /// match x.to_device(Device::Cuda(0)) {
    ///     Ok(gpu) => assert_eq!(gpu.to_host()?.host_data()?, [1.0, 2.0]),
    ///     // No driver, no GPU or no NVRTC: the error names the cause; stay on the CPU.
    ///     Err(e) => eprintln!("no GPU: {e}"),
    /// }
    /// # Ok::<(), lockstep_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// When the device cannot be opened (no driver, no such GPU) or the copy fails.
    pub fn to_device(&self, device: Device) -> Result<Tensor, TensorError> {
        if self.device() == device {
            return Ok(self.clone());
        }
        let storage = self.inner.storage.to_device(device)?;
        let shape = self.inner.shape.clone();
        Ok(match &self.inner.grad {
            Grad::None => Self::build(storage, shape, Grad::None),
            Grad::Leaf => Self::build(storage, shape, Grad::Leaf),
            Grad::Node(_) => {
                let source = self.device();
                Self::from_op(storage, shape, &[self], move |g, _| {
                    Ok(vec![Some(g.to_device(source)?)])
                })
            }
        })
    }

    /// This tensor in host memory: [`Tensor::to_device`] with [`Device::Cpu`].
    ///
    /// # Errors
    ///
    /// The GPU's error.
    pub fn to_host(&self) -> Result<Tensor, TensorError> {
        self.to_device(Device::Cpu)
    }

    /// The values as an ndarray view.
    ///
    /// # Errors
    ///
    /// When the tensor is on a GPU (see [`Tensor::host_data`]).
    pub fn view(&self) -> Result<ArrayViewD<'_, f32>, TensorError> {
        ArrayViewD::from_shape(IxDyn(&self.inner.shape), self.host_data()?)
            .map_err(|e| TensorError::invalid("view", e.to_string()))
    }

    /// The values copied into an ndarray array, from any device.
    ///
    /// # Errors
    ///
    /// The GPU's error.
    pub fn to_array(&self) -> Result<ArrayD<f32>, TensorError> {
        ArrayD::from_shape_vec(IxDyn(&self.inner.shape), self.to_vec()?)
            .map_err(|e| TensorError::invalid("to_array", e.to_string()))
    }

    /// The single value of a one-element tensor, copied from the GPU when it is on one (the
    /// one read-back of a training step: its loss).
    ///
    /// # Errors
    ///
    /// When the tensor does not hold exactly one value; the GPU's error.
    pub fn item(&self) -> Result<f32, TensorError> {
        if self.len() != 1 {
            return Err(TensorError::invalid(
                "item",
                format!("the tensor holds {} values, not 1", self.len()),
            ));
        }
        let values = self.to_vec()?;
        values
            .first()
            .copied()
            .ok_or_else(|| TensorError::invalid("item", "the device returned no value"))
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("Tensor");
        out.field("shape", &self.shape())
            .field("device", &self.device())
            .field("requires_grad", &self.requires_grad());
        // GPU values are not read back for a debug print: that would wait for the device.
        if let Ok(values) = self.host_data() {
            let preview: Vec<f32> = values.iter().take(8).copied().collect();
            out.field(
                "data",
                &format_args!("{preview:?}{}", if self.len() > 8 { " …" } else { "" }),
            );
        }
        out.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_check_that_data_fills_the_shape() {
        assert!(Tensor::from_vec(vec![1.0; 6], &[2, 3]).is_ok());
        let err = Tensor::from_vec(vec![1.0; 5], &[2, 3]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "from_vec: 5 values do not fill shape [2, 3]"
        );
        assert!(Tensor::parameter(vec![], &[usize::MAX, 2]).is_err());
        let err = Tensor::zeros(&[1 << 40, 1 << 40]).unwrap_err();
        assert!(
            err.to_string().contains("more values than a usize"),
            "{err}"
        );
    }

    #[test]
    fn clones_share_data_and_identity() {
        let t = Tensor::from_vec(vec![1.0, 2.0], &[2]).unwrap();
        let u = t.clone();
        assert_eq!(t.id(), u.id());
        assert!(std::ptr::eq(t.host().as_ptr(), u.host().as_ptr()));
        assert_ne!(t.detach().id(), t.id());
    }

    #[test]
    fn ndarray_round_trips() {
        let a = ndarray::Array::from_shape_fn((2, 3), |(i, j)| (i * 3 + j) as f32).into_dyn();
        let t = Tensor::from_array(&a.t());
        assert_eq!(t.shape(), [3, 2]);
        assert_eq!(t.to_array().unwrap(), a.t().to_owned());
        assert_eq!(t.view().unwrap(), a.t());
        assert_eq!(Tensor::scalar(2.5).item(), Ok(2.5));
        assert!(t.item().is_err());
    }
}
