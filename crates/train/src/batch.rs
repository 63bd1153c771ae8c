//! What a replica trains on: a batch of inputs, their targets (class ids of any integer type,
//! or float values of any shape), and optionally a weight per example.

use lockstep_nn::Targets;
use lockstep_tensor::Tensor;
use ndarray::{ArrayBase, Data, Dimension, Ix1};

use crate::error::TrainError;

/// A batch's targets: class ids (integer labels), or values (float labels: regression
/// targets, one-hot or multi-label rows, or class ids held as floats, as the Keras guide casts
/// them).
#[derive(Debug, Clone)]
pub enum BatchTargets {
    /// One class id per example.
    ClassIds(Vec<usize>),
    /// Values, `[batch, …]`.
    Values(Tensor),
}

impl BatchTargets {
    /// The number of examples.
    pub fn len(&self) -> usize {
        match self {
            Self::ClassIds(ids) => ids.len(),
            Self::Values(values) => values.shape().first().copied().unwrap_or(0),
        }
    }

    /// `true` for a batch of no examples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The targets as a loss or metric takes them.
    pub fn as_targets(&self) -> Targets<'_> {
        match self {
            Self::ClassIds(ids) => Targets::ClassIds(ids),
            Self::Values(values) => Targets::Values(values),
        }
    }

    /// The targets as class ids: integer labels, or float ones that are whole numbers.
    ///
    /// # Errors
    ///
    /// Values that are not one whole non-negative number per example.
    pub fn into_class_ids(self) -> Result<Vec<usize>, TrainError> {
        let values = match self {
            Self::ClassIds(ids) => return Ok(ids),
            Self::Values(values) => values,
        };
        let rows = values.shape().first().copied().unwrap_or(0);
        if values.len() != rows {
            return Err(TrainError::invalid(
                "batch",
                format!("targets of shape {:?} are not class ids", values.shape()),
            ));
        }
        values
            .to_vec()?
            .into_iter()
            .map(|v| {
                if v >= 0.0 && v.fract() == 0.0 && v < 16_777_216.0 {
                    Ok(v as usize)
                } else {
                    Err(TrainError::invalid(
                        "batch",
                        format!("target {v} is not a class id"),
                    ))
                }
            })
            .collect()
    }
}

/// One replica's batch, taken apart: inputs, targets, and a weight per example where the
/// batch has them.
#[derive(Debug, Clone)]
pub struct LabeledParts {
    /// The inputs, `[batch, …]`.
    pub inputs: Tensor,
    /// One target per example.
    pub targets: BatchTargets,
    /// One weight per example (Keras' `sample_weight`), or none.
    pub sample_weight: Option<Vec<f32>>,
}

/// One replica's batch of a step: inputs `[batch, …]` and their targets, and optionally
/// sample weights. The batches of `lockstep_data` pipelines are such batches: `(inputs,
/// labels)` with integer labels of any width (class ids) or `f32` labels of any shape, and
/// `(inputs, labels, weights)` with `f32` weights.
pub trait LabeledBatch: Send + 'static {
    /// The batch taken apart.
    ///
    /// # Errors
    ///
    /// When the inputs, targets and weights disagree in length, a label is negative, or the
    /// inputs cannot form a tensor.
    fn into_parts(self) -> Result<LabeledParts, TrainError>;
}

/// The element types of labels: integers are class ids, `f32` values.
pub trait Label: Copy + Send + Sync + 'static {
    /// The targets of a batch of these labels, `shape` `[batch, …]`.
    ///
    /// # Errors
    ///
    /// A negative class id, or integer labels of more than one per example.
    fn targets(labels: Vec<Self>, shape: &[usize]) -> Result<BatchTargets, TrainError>;
}

impl Label for f32 {
    fn targets(labels: Vec<Self>, shape: &[usize]) -> Result<BatchTargets, TrainError> {
        Ok(BatchTargets::Values(Tensor::from_vec(labels, shape)?))
    }
}

macro_rules! integer_labels {
    ($($t:ty),*) => {$(
        impl Label for $t {
            fn targets(labels: Vec<Self>, shape: &[usize]) -> Result<BatchTargets, TrainError> {
                if shape.iter().skip(1).any(|&d| d != 1) {
                    return Err(TrainError::invalid(
                        "batch",
                        format!("integer labels of shape {shape:?}: one class id per example"),
                    ));
                }
                labels
                    .into_iter()
                    .map(|l| {
                        usize::try_from(l).map_err(|_| {
                            TrainError::invalid("batch", format!("label {l} is not a class id"))
                        })
                    })
                    .collect::<Result<_, _>>()
                    .map(BatchTargets::ClassIds)
            }
        }
    )*};
}
integer_labels!(u8, u16, u32, u64, usize, i8, i16, i32, i64);

fn tensor_of<S, D>(x: &ArrayBase<S, D>) -> Result<Tensor, TrainError>
where
    S: Data<Elem = f32>,
    D: Dimension,
{
    let shape = x.shape().to_vec();
    let values = match x.as_slice() {
        Some(values) => values.to_vec(),
        None => x.iter().copied().collect(),
    };
    Ok(Tensor::from_vec(values, &shape)?)
}

fn parts<S, D, L, T, E>(
    x: &ArrayBase<S, D>,
    y: &ArrayBase<L, E>,
    weights: Option<Vec<f32>>,
) -> Result<LabeledParts, TrainError>
where
    S: Data<Elem = f32>,
    D: Dimension,
    L: Data<Elem = T>,
    T: Label,
    E: Dimension,
{
    let rows = x.shape().first().copied().unwrap_or(0);
    let labels = y.shape().first().copied().unwrap_or(0);
    if rows != labels {
        return Err(TrainError::invalid(
            "batch",
            format!("{rows} inputs but {labels} labels"),
        ));
    }
    if let Some(w) = &weights
        && w.len() != rows
    {
        return Err(TrainError::invalid(
            "batch",
            format!("{rows} inputs but {} sample weights", w.len()),
        ));
    }
    let shape = y.shape().to_vec();
    let values = match y.as_slice() {
        Some(values) => values.to_vec(),
        None => y.iter().copied().collect(),
    };
    Ok(LabeledParts {
        inputs: tensor_of(x)?,
        targets: T::targets(values, &shape)?,
        sample_weight: weights,
    })
}

impl<S, D, L, T, E> LabeledBatch for (ArrayBase<S, D>, ArrayBase<L, E>)
where
    S: Data<Elem = f32> + Send + 'static,
    D: Dimension + 'static,
    L: Data<Elem = T> + Send + 'static,
    T: Label,
    E: Dimension + 'static,
{
    fn into_parts(self) -> Result<LabeledParts, TrainError> {
        let (x, y) = self;
        parts(&x, &y, None)
    }
}

impl<S, D, L, T, E, W> LabeledBatch for (ArrayBase<S, D>, ArrayBase<L, E>, ArrayBase<W, Ix1>)
where
    S: Data<Elem = f32> + Send + 'static,
    D: Dimension + 'static,
    L: Data<Elem = T> + Send + 'static,
    T: Label,
    E: Dimension + 'static,
    W: Data<Elem = f32> + Send + 'static,
{
    fn into_parts(self) -> Result<LabeledParts, TrainError> {
        let (x, y, w) = self;
        parts(&x, &y, Some(w.to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use ndarray::{Array1, Array2, array};

    use super::*;

    #[test]
    fn labels_of_any_integer_width_are_class_ids_and_floats_are_values() {
        let x = Array2::<f32>::zeros((2, 3));
        let parts = (x.clone(), array![3_i64, 1]).into_parts().unwrap();
        assert!(matches!(parts.targets, BatchTargets::ClassIds(ref ids) if ids == &[3, 1]));
        let parts = (x.clone(), array![[0.5_f32, 1.0], [2.0, 3.0]])
            .into_parts()
            .unwrap();
        let BatchTargets::Values(values) = &parts.targets else {
            panic!("float labels are values");
        };
        assert_eq!(values.shape(), [2, 2]);
        let ids = (x.clone(), array![2.0_f32, 0.0]).into_parts().unwrap();
        assert_eq!(ids.targets.into_class_ids().unwrap(), [2, 0]);
        let weighted = (
            x.clone(),
            array![1_u16, 2],
            Array1::from(vec![0.5_f32, 2.0]),
        )
            .into_parts()
            .unwrap();
        assert_eq!(weighted.sample_weight, Some(vec![0.5, 2.0]));
    }

    #[test]
    fn labels_that_cannot_be_targets_are_errors() {
        let x = Array2::<f32>::zeros((2, 3));
        assert!((x.clone(), array![-1_i32, 0]).into_parts().is_err());
        assert!((x.clone(), array![1_u8]).into_parts().is_err());
        assert!((x.clone(), array![[1_u8, 2], [3, 4]]).into_parts().is_err());
        assert!(
            (x.clone(), array![1_u8, 2], Array1::from(vec![1.0_f32]))
                .into_parts()
                .is_err()
        );
        let fractional = (x, array![0.5_f32, 1.0]).into_parts().unwrap();
        assert!(fractional.targets.into_class_ids().is_err());
    }
}
