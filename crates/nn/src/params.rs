//! All of a model's trainable values in one contiguous buffer, with a named view per variable.

use std::ops::Range;

use lockstep_tensor::{Tensor, TensorError};
use rand_core::SeedableRng;
use rand_pcg::Pcg64Mcg;
use rayon::prelude::*;

use crate::error::{NnError, count_values};
use crate::initializers::Initializer;

/// How a variable changes in training.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Update {
    /// The optimizer moves it along its gradient.
    #[default]
    Trainable,
    /// Non-trainable state (Keras' `trainable=False` weight), such as batch normalization's
    /// moving statistics: each training step its layer observes a value
    /// ([`ForwardContext::observe`](crate::ForwardContext::observe)), the observations are
    /// averaged over every replica in the step's all-reduce, and the variable moves to
    /// `momentum · value + (1 − momentum) · observation`. No optimizer touches it.
    MovingAverage {
        /// The weight of the old value.
        momentum: f32,
    },
}

/// One named variable inside [`Parameters`].
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// Keras-style name: `dense/kernel`, `conv2d_1/bias`.
    pub name: String,
    /// The variable's shape.
    pub shape: Vec<usize>,
    /// Where its values start in the buffer.
    pub offset: usize,
    /// Trained by the optimizer, or state its layer updates.
    pub update: Update,
}

impl ParamSpec {
    /// This variable as a tensor of `values`: a parameter when it is trainable, else a
    /// constant.
    pub(crate) fn tensor_of(&self, values: Vec<f32>) -> Result<Tensor, TensorError> {
        if self.is_trainable() {
            Tensor::parameter(values, &self.shape)
        } else {
            Tensor::from_vec(values, &self.shape)
        }
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// `true` for a variable with no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its range in the buffer.
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.len()
    }

    /// `true` for a variable the optimizer trains.
    pub fn is_trainable(&self) -> bool {
        self.update == Update::Trainable
    }
}

/// A model's variables, back to back in one `Vec<f32>`: one all-reduce moves a whole model's
/// gradients (laid out the same way), and a checkpoint names every variable. Non-trainable
/// state ([`Update::MovingAverage`]) lives in the same buffer, so checkpoints, restores and the
/// initial broadcast carry it as they carry the weights; its slots in the gradient buffer carry
/// the layers' observations instead of gradients.
///
/// ```
/// use lockstep_nn::{Dense, Sequential};
///
/// let model = Sequential::new(&[4], vec![Box::new(Dense::new(3))], 0)?;
/// let params = model.parameters();
/// assert_eq!(params.len(), 4 * 3 + 3);
/// assert_eq!(params.specs()[1].name, "dense/bias");
/// assert_eq!(params.view("dense/bias").unwrap(), [0.0, 0.0, 0.0]);
/// # Ok::<(), lockstep_nn::NnError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parameters {
    values: Vec<f32>,
    specs: Vec<ParamSpec>,
}

impl Parameters {
    /// Every value, variable after variable.
    pub fn values(&self) -> &[f32] {
        &self.values
    }

    /// Every value, for optimizers and for loading checkpoints.
    pub fn values_mut(&mut self) -> &mut [f32] {
        &mut self.values
    }

    /// The variables, in creation order.
    pub fn specs(&self) -> &[ParamSpec] {
        &self.specs
    }

    /// The total number of values.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// The number of values the optimizer trains (Keras' "Trainable params").
    pub fn trainable_len(&self) -> usize {
        self.specs
            .iter()
            .filter(|s| s.is_trainable())
            .map(ParamSpec::len)
            .sum()
    }

    /// `true` when some variable is non-trainable state.
    pub fn has_state(&self) -> bool {
        self.specs.iter().any(|s| !s.is_trainable())
    }

    /// Moves every non-trainable variable towards its observation in `grads` (laid out as the
    /// parameters, each observation times `scale` being its mean over the step) and zeroes
    /// those slots, so that clipping and the optimizer then see only the trainable gradients.
    /// Returns the new values, for [`Parameters::set_state`] after the optimizer's update.
    pub(crate) fn next_state(
        &self,
        grads: &mut [f32],
        scale: f32,
    ) -> Vec<(Range<usize>, Vec<f32>)> {
        self.next_state_within(grads, scale, &(0..self.values.len()))
    }

    /// [`Parameters::next_state`] of the variables within `within` only.
    pub(crate) fn next_state_within(
        &self,
        grads: &mut [f32],
        scale: f32,
        within: &Range<usize>,
    ) -> Vec<(Range<usize>, Vec<f32>)> {
        let mut next = Vec::new();
        for spec in &self.specs {
            let Update::MovingAverage { momentum } = spec.update else {
                continue;
            };
            let range = spec.range();
            if range.start < within.start || range.end > within.end {
                continue;
            }
            let values = self.values[range.clone()]
                .iter()
                .zip(&mut grads[range.clone()])
                .map(|(&old, observed)| {
                    // Keras' `assign_moving_average`: old − (old − observed)·(1 − momentum).
                    let new = old - (old - *observed * scale) * (1.0 - momentum);
                    *observed = 0.0;
                    new
                })
                .collect();
            next.push((range, values));
        }
        next
    }

    /// Writes the values [`Parameters::next_state`] computed.
    pub(crate) fn set_state(&mut self, next: Vec<(Range<usize>, Vec<f32>)>) {
        for (range, values) in next {
            self.values[range].copy_from_slice(&values);
        }
    }

    /// `true` for a model with no trainable values.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Each variable's range in the flat buffer, in declaration order.
    pub fn ranges(&self) -> Vec<std::ops::Range<usize>> {
        self.specs.iter().map(ParamSpec::range).collect()
    }

    /// The values of the variable called `name`.
    pub fn view(&self, name: &str) -> Option<&[f32]> {
        self.specs
            .iter()
            .find(|s| s.name == name)
            .map(|s| &self.values[s.range()])
    }

    /// The variables as tensors whose gradients [`Tensor::backward`] reports (a copy: the
    /// buffer stays free for the optimizer); non-trainable state as constants.
    ///
    /// # Errors
    ///
    /// Only if a variable's values no longer fill its shape.
    pub fn tensors(&self) -> Result<Vec<Tensor>, NnError> {
        self.tensors_replacing(Vec::new())
    }

    /// Variable `index` as [`Parameters::tensors`] makes it.
    ///
    /// # Errors
    ///
    /// An index past the variables; as [`Parameters::tensors`].
    pub fn tensor(&self, index: usize) -> Result<Tensor, NnError> {
        let spec = self
            .specs
            .get(index)
            .ok_or_else(|| NnError::InvalidConfig {
                layer: "parameters".into(),
                why: format!("variable {index} of {}", self.specs.len()),
            })?;
        self.copy_of(spec).map_err(|source| NnError::Tensor {
            layer: spec.name.clone(),
            source,
        })
    }

    /// A copy of `spec`'s values: a parameter when it is trainable, else a constant.
    fn copy_of(&self, spec: &ParamSpec) -> Result<Tensor, TensorError> {
        // Copied in parallel: a dense kernel of a few hundred thousand values copied on one
        // thread left the other idle at the start of every training step.
        spec.tensor_of(self.values[spec.range()].par_iter().copied().collect())
    }

    /// [`Parameters::tensors`] with the variables `replacing` names (`(index, tensor)`)
    /// replaced by their tensor as a trainable parameter: the variables' own values are not
    /// copied (a replacement's are, once).
    ///
    /// # Errors
    ///
    /// As [`Parameters::tensors`]; an index past the variables.
    pub fn tensors_replacing(
        &self,
        replacing: Vec<(usize, Tensor)>,
    ) -> Result<Vec<Tensor>, NnError> {
        let mut replacing: Vec<Option<Tensor>> = {
            let mut slots = vec![None; self.specs.len()];
            for (index, tensor) in replacing {
                let slot = slots.get_mut(index).ok_or_else(|| NnError::InvalidConfig {
                    layer: "parameters".into(),
                    why: format!("variable {index} of {}", self.specs.len()),
                })?;
                *slot = Some(tensor);
            }
            slots
        };
        self.specs
            .iter()
            .zip(&mut replacing)
            .map(|(s, replaced)| {
                let tensor = if let Some(t) = replaced.take() {
                    t.to_vec()
                        .and_then(|values| Tensor::parameter(values, t.shape()))
                } else {
                    self.copy_of(s)
                };
                tensor.map_err(|source| NnError::Tensor {
                    layer: s.name.clone(),
                    source,
                })
            })
            .collect()
    }

    /// The variables as constants, for inference.
    ///
    /// # Errors
    ///
    /// Only if a variable's values no longer fill its shape.
    pub fn constants(&self) -> Result<Vec<Tensor>, NnError> {
        self.specs
            .iter()
            .map(|s| {
                Tensor::from_vec(self.values[s.range()].to_vec(), &s.shape).map_err(|source| {
                    NnError::Tensor {
                        layer: s.name.clone(),
                        source,
                    }
                })
            })
            .collect()
    }
}

/// Collects the variables layers declare while a model is built.
#[derive(Debug)]
pub struct ParamBuilder {
    params: Parameters,
    seed: u64,
    /// Declarations only, no values: a layer built to learn its output shape (a functional
    /// graph's layer called on a symbolic tensor).
    shapes_only: bool,
    /// Under [`without_initial_values`]: every variable zero, the values allocated at once
    /// when the model is finished; the values declared so far.
    zeros: Option<usize>,
}

thread_local! {
    /// Set inside [`without_initial_values`].
    static WITHOUT_INITIAL_VALUES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `build`, in which every model built on this thread holds zeros instead of its
/// initializers' draws, allocated in one piece that the operating system maps lazily: memory
/// no one writes is never taken. For a process that loads every value before it reads any,
/// as TensorFlow's variable-creator scope lets a strategy place variables elsewhere: a
/// parameter-server worker pulls the values each step, and never holds an embedding table it
/// only looks rows up in.
///
/// ```
/// use lockstep_nn::{Embedding, Sequential, Layer, without_initial_values};
///
/// let build = || Sequential::new(&[2], vec![Box::new(Embedding::new(1 << 20, 16)) as Box<dyn Layer>], 7);
/// let model = without_initial_values(build)?;
/// assert_eq!(model.parameters().len(), 16 << 20);
/// assert!(model.parameters().values().iter().take(8).all(|&v| v == 0.0));
/// # Ok::<(), lockstep_nn::NnError>(())
/// ```
pub fn without_initial_values<T>(build: impl FnOnce() -> T) -> T {
    /// Restores the setting, also when `build` panics.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            WITHOUT_INITIAL_VALUES.with(|flag| flag.set(self.0));
        }
    }
    let _restore = Restore(WITHOUT_INITIAL_VALUES.with(|flag| flag.replace(true)));
    build()
}

impl ParamBuilder {
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            params: Parameters::default(),
            seed,
            shapes_only: false,
            zeros: WITHOUT_INITIAL_VALUES
                .with(std::cell::Cell::get)
                .then_some(0),
        }
    }

    /// A builder that records declarations without drawing any value.
    pub(crate) fn shapes_only() -> Self {
        Self {
            shapes_only: true,
            zeros: None,
            ..Self::new(0)
        }
    }

    /// Declares a variable, initialises it, and returns its index among the model's variables.
    /// Each variable's initial values are a function of the model seed and its index alone.
    ///
    /// # Errors
    ///
    /// [`NnError::InvalidConfig`] naming the variable when its shape holds more values than a
    /// `usize` counts or than memory can hold.
    pub fn add(
        &mut self,
        name: String,
        shape: Vec<usize>,
        init: Initializer,
    ) -> Result<usize, NnError> {
        self.declare(name, shape, init, Update::Trainable)
    }

    /// Declares non-trainable state that moves towards what its layer observes each training
    /// step ([`Update::MovingAverage`]), as batch normalization's moving mean and variance.
    ///
    /// # Errors
    ///
    /// As [`ParamBuilder::add`]; a momentum outside `[0, 1]`.
    pub fn add_moving_average(
        &mut self,
        name: String,
        shape: Vec<usize>,
        init: Initializer,
        momentum: f32,
    ) -> Result<usize, NnError> {
        if !(0.0..=1.0).contains(&momentum) {
            return Err(NnError::InvalidConfig {
                layer: name,
                why: format!("momentum {momentum} must lie in [0, 1]"),
            });
        }
        self.declare(name, shape, init, Update::MovingAverage { momentum })
    }

    fn declare(
        &mut self,
        name: String,
        shape: Vec<usize>,
        init: Initializer,
        update: Update,
    ) -> Result<usize, NnError> {
        let len = count_values(&name, &shape)?;
        if self.shapes_only {
            let index = self.params.specs.len();
            self.params.specs.push(ParamSpec {
                name,
                shape,
                offset: 0,
                update,
            });
            return Ok(index);
        }
        if let Some(declared) = self.zeros {
            // The one allocation `finish` makes must be one an allocator can be asked for.
            let fits = |total: &usize| {
                total
                    .checked_mul(size_of::<f32>())
                    .is_some_and(|bytes| isize::try_from(bytes).is_ok())
            };
            let Some(total) = declared.checked_add(len).filter(fits) else {
                return Err(NnError::InvalidConfig {
                    layer: name,
                    why: format!("{len} values of shape {shape:?} do not fit in memory"),
                });
            };
            let index = self.params.specs.len();
            self.params.specs.push(ParamSpec {
                name,
                shape,
                offset: declared,
                update,
            });
            self.zeros = Some(total);
            return Ok(index);
        }
        self.params
            .values
            .try_reserve(len)
            .map_err(|e| NnError::InvalidConfig {
                layer: name.clone(),
                why: format!("{len} values of shape {shape:?} do not fit in memory: {e}"),
            })?;
        let index = self.params.specs.len();
        let offset = self.params.values.len();
        let spec = ParamSpec {
            name,
            shape,
            offset,
            update,
        };
        let mut rng =
            Pcg64Mcg::seed_from_u64(self.seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        self.params
            .values
            .extend(init.sample(&spec.shape, &mut rng));
        self.params.specs.push(spec);
        Ok(index)
    }

    /// How many variables are declared so far.
    pub fn count(&self) -> usize {
        self.params.specs.len()
    }

    pub(crate) fn finish(mut self) -> Parameters {
        if let Some(declared) = self.zeros {
            // Zeroed in one allocation: the allocator asks the system for fresh pages, which
            // it maps on first write.
            self.params.values = vec![0.0; declared];
        }
        self.params
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models;

    #[test]
    fn a_model_built_without_initial_values_has_the_same_variables_all_zero_and_the_next_draws() {
        let drawn = models::mnist_cnn(3).unwrap();
        let zeros = without_initial_values(|| models::mnist_cnn(3)).unwrap();
        assert_eq!(zeros.parameters().specs(), drawn.parameters().specs());
        assert_eq!(zeros.parameters().len(), drawn.parameters().len());
        assert!(zeros.parameters().values().iter().all(|&v| v == 0.0));
        // The setting ends with the call, also when the build panics.
        let panicked = std::panic::catch_unwind(|| {
            without_initial_values(|| panic!("a build that fails"));
        });
        assert!(panicked.is_err());
        let again = models::mnist_cnn(3).unwrap();
        assert_eq!(again.parameters().values(), drawn.parameters().values());
        // A table no allocator could hold is an error naming it, as it is with values drawn.
        let huge = without_initial_values(|| {
            let layers: Vec<Box<dyn crate::Layer>> = vec![Box::new(crate::Dense::new(1 << 61))];
            crate::Sequential::new(&[4], layers, 0)
        });
        let e = huge.err().unwrap();
        assert!(e.to_string().contains("do not fit in memory"), "{e}");
    }
}
