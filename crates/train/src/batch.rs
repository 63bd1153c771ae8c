//! What a replica trains on: a batch of inputs and their integer labels.

use lockstep_tensor::Tensor;
use ndarray::{ArrayBase, Data, Dimension, Ix1};

use crate::error::TrainError;

/// One replica's batch of a step: inputs `[batch, …]` and one class label per example. The
/// batches of `lockstep_data` pipelines (`(images, labels)` arrays) are such batches.
pub trait LabeledBatch: Send + 'static {
    /// The inputs as a tensor and the labels as class indices.
    ///
    /// # Errors
    ///
    /// When the inputs and labels disagree in length, or the inputs cannot form a tensor.
    fn into_parts(self) -> Result<(Tensor, Vec<usize>), TrainError>;
}

impl<S, D, L> LabeledBatch for (ArrayBase<S, D>, ArrayBase<L, Ix1>)
where
    S: Data<Elem = f32> + Send + 'static,
    D: Dimension + 'static,
    L: Data<Elem = u8> + Send + 'static,
{
    fn into_parts(self) -> Result<(Tensor, Vec<usize>), TrainError> {
        let (x, y) = self;
        let rows = x.shape().first().copied().unwrap_or(0);
        if rows != y.len() {
            return Err(TrainError::invalid(
                "batch",
                format!("{rows} inputs but {} labels", y.len()),
            ));
        }
        let shape = x.shape().to_vec();
        let values = match x.as_slice() {
            Some(values) => values.to_vec(),
            None => x.iter().copied().collect(),
        };
        let labels = y.iter().map(|&l| usize::from(l)).collect();
        Ok((Tensor::from_vec(values, &shape)?, labels))
    }
}
