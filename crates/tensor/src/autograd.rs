//! Reverse-mode differentiation over the graph that operations record.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

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

/// A backward rule that computes only the inputs' gradients `wanted` names (one flag per
/// input; `None` for the others): so that a parameter's gradient can be handed over before
/// the rest of the operation's are computed.
pub(crate) trait BackwardInParts:
    Fn(&Tensor, &Tensor, &[bool], &mut HandOver<'_>) -> Result<Vec<Option<Tensor>>, TensorError>
    + Send
    + Sync
    + 'static
{
}

impl<F> BackwardInParts for F where
    F: Fn(&Tensor, &Tensor, &[bool], &mut HandOver<'_>) -> Result<Vec<Option<Tensor>>, TensorError>
        + Send
        + Sync
        + 'static
{
}

/// Where [`Tensor::backward_in_blocks`] hands a block of a parameter's gradient: the
/// parameter, the block's range of its values (row-major), and the values, final.
pub type BlockOf<'a> = dyn FnMut(&Tensor, Range<usize>, &[f32]) -> Result<(), TensorError> + 'a;

/// Where a rule in parts hands over a block of an input's gradient before it returns: the
/// input's index, the block's range of its values (row-major), and the values, final.
pub(crate) type HandOver<'a> =
    dyn FnMut(usize, Range<usize>, &[f32]) -> Result<(), TensorError> + 'a;

enum Rule {
    Whole(Box<dyn Backward>),
    InParts(Box<dyn BackwardInParts>),
}

/// A recorded operation: its inputs and its backward rule.
pub(crate) struct GradFn {
    inputs: Vec<Tensor>,
    rule: Rule,
}

impl GradFn {
    pub(crate) fn new(inputs: Vec<Tensor>, backward: impl Backward) -> Self {
        Self {
            inputs,
            rule: Rule::Whole(Box::new(backward)),
        }
    }

    pub(crate) fn in_parts(inputs: Vec<Tensor>, backward: impl BackwardInParts) -> Self {
        Self {
            inputs,
            rule: Rule::InParts(Box::new(backward)),
        }
    }

    /// The gradients of the inputs `wanted` names (all of them when `None`).
    fn run(
        &self,
        grad: &Tensor,
        output: &Tensor,
        wanted: Option<&[bool]>,
        hand_over: &mut HandOver<'_>,
    ) -> Result<Vec<Option<Tensor>>, TensorError> {
        match (&self.rule, wanted) {
            (Rule::Whole(rule), _) => rule(grad, output),
            (Rule::InParts(rule), Some(wanted)) => rule(grad, output, wanted, hand_over),
            (Rule::InParts(rule), None) => {
                rule(grad, output, &vec![true; self.inputs.len()], hand_over)
            }
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
        self.backward_in_blocks(complete, &mut |_, _, _| Ok(()))
    }

    /// [`Tensor::backward_with`], also calling `block(parameter, range, values)` with blocks
    /// of a parameter's gradient (`range` of its values, row-major) that are final before the
    /// rule that computes them returns: a dense layer's bias, whole, then its kernel's blocks
    /// of rows one at a time ([`crate::ops::dense_blocks`]), when the pass runs the layer's
    /// rule in parts (on one thread) and the layer is their only reader. `complete` is still
    /// called with each whole gradient afterwards.
    ///
    /// # Errors
    ///
    /// As [`Tensor::backward_with`], and the first error `block` returns.
    pub fn backward_in_blocks(
        &self,
        complete: &mut dyn FnMut(&Tensor, &Tensor) -> Result<(), TensorError>,
        block: &mut BlockOf<'_>,
    ) -> Result<Gradients, TensorError> {
        if self.len() != 1 {
            return Err(TensorError::invalid(
                "backward",
                format!("the loss must be one value, not shape {:?}", self.shape()),
            ));
        }
        let order = topological_order(self);
        // How many recorded operations read each tensor that needs a gradient: a parameter's
        // gradient is whole once the last of them has run, and is handed over then.
        let mut readers: HashMap<TensorId, usize> = HashMap::new();
        for node in &order {
            if let Grad::Node(f) = &node.inner.grad {
                for input in f.inputs.iter().filter(|t| t.requires_grad()) {
                    *readers.entry(input.id()).or_default() += 1;
                }
            }
        }
        // A rule in parts computes the gradients of the parameters it is the last to read
        // first, and they are handed over before the rest of its gradients are computed. On
        // one thread its parts would run one after the other anyway; on more, run whole, they
        // run side by side.
        let split = rayon::current_num_threads() == 1;
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
                    // The loss itself, or a parameter one of whose readers got no gradient
                    // (so it was not handed over at its last reader): every reader comes
                    // before it in this walk, so its gradient is whole here.
                    complete(node, &grad)?;
                    result.by_id.insert(node.id(), grad);
                }
                Grad::Node(f) => {
                    let completes: Vec<bool> = f
                        .inputs
                        .iter()
                        .map(|t| {
                            matches!(t.inner.grad, Grad::Leaf) && readers.get(&t.id()) == Some(&1)
                        })
                        .collect();
                    let parts: Vec<Option<Vec<bool>>> = match &f.rule {
                        Rule::InParts(_) if split && completes.contains(&true) => {
                            let rest = completes.iter().map(|c| !c).collect();
                            vec![Some(completes.clone()), Some(rest)]
                        }
                        _ => vec![None],
                    };
                    for wanted in parts {
                        // Blocks are handed over only of the parameters this part completes.
                        let input_grads = f.run(
                            &grad,
                            node,
                            wanted.as_deref(),
                            &mut |index, range, values| match (&wanted, f.inputs.get(index)) {
                                (Some(wanted), Some(input))
                                    if wanted.get(index) == Some(&true)
                                        && completes.get(index) == Some(&true) =>
                                {
                                    block(input, range, values)
                                }
                                _ => Ok(()),
                            },
                        )?;
                        for (index, (input, input_grad)) in
                            f.inputs.iter().zip(input_grads).enumerate()
                        {
                            if !input.requires_grad()
                                || wanted.as_ref().is_some_and(|w| w.get(index) != Some(&true))
                            {
                                continue;
                            }
                            if let Some(input_grad) = input_grad {
                                let summed = match pending.remove(&input.id()) {
                                    Some(earlier) => add_same_shape(&earlier, &input_grad)?,
                                    None => input_grad,
                                };
                                pending.insert(input.id(), summed);
                            }
                            let left = readers.entry(input.id()).or_default();
                            *left = left.saturating_sub(1);
                            // Every operation that reads this parameter has run: its
                            // gradient is whole.
                            if *left == 0
                                && matches!(input.inner.grad, Grad::Leaf)
                                && let Some(whole) = pending.remove(&input.id())
                            {
                                complete(input, &whole)?;
                                result.by_id.insert(input.id(), whole);
                            }
                        }
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

    /// `Σ relu(relu(x · w1 + b1) · w2 + b2)` on values that make every gradient non-trivial.
    fn two_dense_layers() -> (Tensor, Vec<Tensor>) {
        let values = |n: usize, seed: f32| -> Vec<f32> {
            (0..n).map(|i| (i as f32 * 0.37 + seed).sin()).collect()
        };
        let x = Tensor::from_vec(values(6 * 40, 0.1), &[6, 40]).unwrap();
        let w1 = Tensor::parameter(values(40 * 30, 0.2), &[40, 30]).unwrap();
        let b1 = Tensor::parameter(values(30, 0.3), &[30]).unwrap();
        let w2 = Tensor::parameter(values(30 * 5, 0.4), &[30, 5]).unwrap();
        let b2 = Tensor::parameter(values(5, 0.5), &[5]).unwrap();
        let h = ops::dense(&x, &w1, Some(&b1), true).unwrap();
        let y = ops::dense(&h, &w2, Some(&b2), true).unwrap();
        (ops::sum(&y, &[0, 1], false).unwrap(), vec![w1, b1, w2, b2])
    }

    /// `f` run on a rayon pool of `threads` threads.
    fn on_threads<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(f)
    }

    #[test]
    fn gradients_taken_in_parts_on_one_thread_are_the_bits_of_those_taken_whole() {
        let on = |threads: usize| {
            on_threads(threads, || {
                let (loss, parameters) = two_dense_layers();
                let mut order = Vec::new();
                let grads = loss
                    .backward_with(&mut |parameter, _| {
                        order.push(parameters.iter().position(|p| p.id() == parameter.id()));
                        Ok(())
                    })
                    .unwrap();
                let values: Vec<Vec<u32>> = parameters
                    .iter()
                    .map(|p| {
                        let g = grads.get(p).unwrap().to_vec().unwrap();
                        g.iter().map(|v| v.to_bits()).collect()
                    })
                    .collect();
                (order, values)
            })
        };
        let (in_parts, whole) = (on(1), on(2));
        assert_eq!(in_parts.1, whole.1);
        // The last layer's weights, then its bias, then the first layer's.
        assert_eq!(in_parts.0, [Some(2), Some(3), Some(0), Some(1)]);
        assert_eq!(whole.0, in_parts.0);
    }

    #[test]
    fn a_parameter_read_twice_is_handed_over_once_its_last_reader_has_run() {
        let x = Tensor::from_vec(vec![1.0, 2.0, -1.0, 0.5], &[2, 2]).unwrap();
        let w = Tensor::parameter(vec![1.0, 0.5, -1.0, 2.0], &[2, 2]).unwrap();
        let v = Tensor::parameter(vec![0.25, -2.0], &[2, 1]).unwrap();
        // loss = Σ(x · w) + Σ((x · w) · v): w feeds two products.
        let xw = ops::dense(&x, &w, None, false).unwrap();
        let first = ops::sum(&xw, &[0, 1], false).unwrap();
        let second = ops::sum(&ops::dense(&xw, &v, None, false).unwrap(), &[0, 1], false).unwrap();
        let loss = ops::add(&first, &second).unwrap();
        for threads in [1, 2] {
            let mut seen = Vec::new();
            let grads = on_threads(threads, || {
                loss.backward_with(&mut |parameter, gradient| {
                    seen.push((parameter.id(), gradient.to_vec()?));
                    Ok(())
                })
            })
            .unwrap();
            let ids: Vec<_> = seen.iter().map(|(id, _)| *id).collect();
            assert_eq!(ids, [v.id(), w.id()], "on {threads} threads");
            // d/dw[i][j] = (Σ_r x[r][i]) · (1 + v[j]), the two readers' parts summed:
            // x's column sums are [0, 2.5].
            let whole = grads.get(&w).unwrap().to_vec().unwrap();
            assert_eq!(seen[1].1, whole);
            assert_eq!(whole, [0.0, 0.0, 3.125, -2.5]);
        }
    }

    #[test]
    fn a_large_kernels_gradient_is_handed_over_block_by_block_before_it_is_whole() {
        // A kernel of three blocks of rows (`dense_blocks`), the layer's only reader.
        let (m, k, n) = (4, 1200, 128);
        let values = |n: usize, seed: f32| -> Vec<f32> {
            (0..n).map(|i| (i as f32 * 0.37 + seed).sin()).collect()
        };
        let x = Tensor::from_vec(values(m * k, 0.1), &[m, k]).unwrap();
        let w = Tensor::parameter(values(k * n, 0.2), &[k, n]).unwrap();
        let b = Tensor::parameter(values(n, 0.3), &[n]).unwrap();
        let loss = ops::sum(&ops::dense(&x, &w, Some(&b), true).unwrap(), &[0, 1], false).unwrap();
        for threads in [1, 2] {
            let events = std::sync::Mutex::new(Vec::new());
            let mut assembled = vec![f32::NAN; k * n];
            let grads = on_threads(threads, || {
                loss.backward_in_blocks(
                    &mut |parameter, _| {
                        events.lock().unwrap().push((parameter.id(), None));
                        Ok(())
                    },
                    &mut |parameter, range, block| {
                        if parameter.id() == w.id() {
                            assembled[range.clone()].copy_from_slice(block);
                        }
                        events.lock().unwrap().push((parameter.id(), Some(range)));
                        Ok(())
                    },
                )
            })
            .unwrap();
            let events = events.into_inner().unwrap();
            let whole = grads.get(&w).unwrap().to_vec().unwrap();
            if threads == 1 {
                let blocks: Vec<_> = ops::dense_blocks(k, n)
                    .into_iter()
                    .map(|rows| (w.id(), Some(rows.start * n..rows.end * n)))
                    .collect();
                assert_eq!(blocks.len(), 3);
                // The bias first, whole, then the kernel's blocks, the last rows first.
                assert_eq!(events[0], (b.id(), Some(0..n)));
                assert_eq!(events[1..4], blocks[..]);
                assert_eq!(events[4], (w.id(), None));
                assert_eq!(assembled, whole);
            } else {
                // Run whole, the rule hands over no block.
                assert!(events.iter().all(|(_, range)| range.is_none()));
            }
            let expected = on_threads(1, || loss.backward().unwrap());
            assert_eq!(whole, expected.get(&w).unwrap().to_vec().unwrap());
        }
    }
}
