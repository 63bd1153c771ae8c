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
        self.backward_with(&mut |_, _| Ok(()))
    }

    /// [`Tensor::backward`], calling `complete(parameter, gradient)` as soon as each
    /// parameter's gradient is final, before the rest of the pass: what a data-parallel step
    /// needs to start reducing the last layers' gradients while the first layers' are still
    /// being computed. Parameters come in the pass's fixed order, each once.
    ///
    /// # Errors
    ///
    /// As [`Tensor::backward`], and the first error `complete` returns, which ends the pass.
    pub fn backward_with(
        &self,
        complete: &mut dyn FnMut(&Tensor, &Tensor) -> Result<(), TensorError>,
    ) -> Result<Gradients, TensorError> {
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
                    // Every operation that reads a leaf comes after it in the order, so its
                    // gradient is whole once the reverse walk reaches it.
                    complete(node, &grad)?;
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

#[cfg(test)]
mod tests {
    use crate::{Tensor, ops};

    #[test]
    fn each_parameter_is_handed_over_once_as_soon_as_its_gradient_is_whole() {
        // loss = Σ((x · w1) · w2): w2's gradient is whole before w1's is computed.
        let x = Tensor::from_vec(vec![1.0, 2.0], &[1, 2]).unwrap();
        let w1 = Tensor::parameter(vec![1.0, 0.5, -1.0, 2.0], &[2, 2]).unwrap();
        let w2 = Tensor::parameter(vec![3.0, -1.0], &[2, 1]).unwrap();
        let y = ops::matmul(&ops::matmul(&x, &w1).unwrap(), &w2).unwrap();
        let loss = ops::sum(&y, &[0, 1], false).unwrap();
        let mut seen = Vec::new();
        let grads = loss
            .backward_with(&mut |parameter, gradient| {
                seen.push((parameter.id(), gradient.to_vec()?));
                Ok(())
            })
            .unwrap();
        let ids: Vec<_> = seen.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, [w2.id(), w1.id()]);
        for (parameter, (_, handed)) in [&w2, &w1].into_iter().zip(&seen) {
            assert_eq!(&grads.get(parameter).unwrap().to_vec().unwrap(), handed);
        }
    }
}
