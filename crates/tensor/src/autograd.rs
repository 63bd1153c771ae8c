//! Reverse-mode differentiation over the graph that operations record.

use std::collections::{HashMap, HashSet};

use crate::error::TensorError;
use crate::ops::gpu::{self, On, on};
use crate::storage::Storage;
use crate::tensor::{Grad, Tensor, TensorId};

/// An operation's backward rule: from the gradient of its output (and the output itself, handed
/// over at call time so no rule has to hold on to its own result), the gradients of its inputs
/// in input order (`None` for inputs that need none).
pub(crate) trait Backward:
    Fn(&Tensor, &Tensor) -> Result<Vec<Option<Tensor>>, TensorError> + Send + Sync + 'static
{
}

impl<F> Backward for F where
    F: Fn(&Tensor, &Tensor) -> Result<Vec<Option<Tensor>>, TensorError> + Send + Sync + 'static
{
}

/// A recorded operation: its inputs and its backward rule.
pub(crate) struct GradFn {
    inputs: Vec<Tensor>,
    backward: Box<dyn Backward>,
}

impl GradFn {
    pub(crate) fn new(inputs: Vec<Tensor>, backward: impl Backward) -> Self {
        Self {
            inputs,
            backward: Box::new(backward),
        }
    }
}

/// The gradients of one [`Tensor::backward`] call, by parameter.
#[derive(Debug, Default)]
pub struct Gradients {
    by_id: HashMap<TensorId, Tensor>,
}

impl Gradients {
    /// The gradient of the loss with respect to `parameter`; `None` when the loss does not
    /// depend on it.
    pub fn get(&self, parameter: &Tensor) -> Option<&Tensor> {
        self.by_id.get(&parameter.id())
    }

    /// How many parameters received a gradient.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// `true` when no parameter received a gradient.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

impl Tensor {
    /// The gradients of this scalar with respect to every parameter it was computed from.
    ///
    /// Operations are visited in a fixed order and gradients that meet are summed in that
    /// order, so the result is the same bit for bit on every run.
    ///
    /// # Errors
    ///
    /// When the tensor is not a single value, or an operation's backward rule fails.
    pub fn backward(&self) -> Result<Gradients, TensorError> {
        if self.len() != 1 {
            return Err(TensorError::invalid(
                "backward",
                format!("the loss must be one value, not shape {:?}", self.shape()),
            ));
        }
        let order = topological_order(self);
        let mut pending: HashMap<TensorId, Tensor> = HashMap::new();
        pending.insert(self.id(), seed(self)?);
        let mut result = Gradients::default();
        for node in order.iter().rev() {
            let Some(grad) = pending.remove(&node.id()) else {
                continue;
            };
            match &node.inner.grad {
                Grad::None => {}
                Grad::Leaf => {
                    result.by_id.insert(node.id(), grad);
                }
                Grad::Node(f) => {
                    let input_grads = (f.backward)(&grad, node)?;
                    for (input, input_grad) in f.inputs.iter().zip(input_grads) {
                        let Some(input_grad) = input_grad else {
                            continue;
                        };
                        if !input.requires_grad() {
                            continue;
                        }
                        let summed = match pending.remove(&input.id()) {
                            Some(earlier) => add_same_shape(&earlier, &input_grad)?,
                            None => input_grad,
                        };
                        pending.insert(input.id(), summed);
                    }
                }
            }
        }
        Ok(result)
    }
}

/// The gradient of the loss with respect to itself: a one, on the loss's device.
fn seed(loss: &Tensor) -> Result<Tensor, TensorError> {
    match loss.storage() {
        Storage::Cpu(_) => Tensor::full(loss.shape(), 1.0),
        Storage::Cuda(buffer) => gpu::full_like(buffer, loss.shape(), 1.0),
    }
}

fn add_same_shape(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    if let On::Cuda(_) = on("backward", &[a, b])? {
        return gpu::add_gradients(a, b);
    }
    let data: Vec<f32> = a.host().iter().zip(b.host()).map(|(x, y)| x + y).collect();
    Ok(Tensor::raw(data, a.shape().to_vec()))
}

/// Every tensor the root depends on through recorded operations, inputs before the results
/// computed from them. Iterative, so deep graphs cannot overflow the stack.
fn topological_order(root: &Tensor) -> Vec<Tensor> {
    let mut order = Vec::new();
    let mut visited = HashSet::new();
    let mut stack = vec![(root.clone(), false)];
    while let Some((tensor, inputs_done)) = stack.pop() {
        if inputs_done {
            order.push(tensor);
            continue;
        }
        if !visited.insert(tensor.id()) {
            continue;
        }
        stack.push((tensor.clone(), true));
        if let Grad::Node(f) = &tensor.inner.grad {
            for input in f
                .inputs
                .iter()
                .rev()
                .filter(|t| t.requires_grad() && !visited.contains(&t.id()))
            {
                stack.push((input.clone(), false));
            }
        }
    }
    order
}
