//! What a `model_fn` returns: `tf.estimator.EstimatorSpec` and the mode it was called in.

use std::fmt;

use lockstep_nn::{Metric, Optimizer};
use lockstep_tensor::Tensor;

/// Why the `model_fn` is called: `tf.estimator.ModeKeys`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModeKeys {
    /// Training: the spec needs a loss and a `train_op`.
    Train,
    /// Evaluation: the spec needs a loss; `eval_metric_ops` are optional.
    Eval,
    /// Inference: the spec needs predictions.
    Predict,
}

impl fmt::Display for ModeKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Train => "train",
            Self::Eval => "eval",
            Self::Predict => "infer",
        })
    }
}

/// A metric of the evaluation, updated on the batch of one `model_fn` call; its state is
/// summed over every batch (and replica) before its result is read.
pub type EvalMetricOp = Box<dyn Metric + Send>;

/// What a `model_fn` returns for one batch, as `tf.estimator.EstimatorSpec`: the loss (a
/// one-value tensor computed from the output of [`Variables::apply`](super::Variables::apply),
/// so its gradients reach the variables), the optimizer that minimizes it, predictions, and
/// evaluation metrics.
///
/// ```
/// use lockstep_nn::{Sgd, SparseCategoricalAccuracy};
/// use lockstep_tensor::Tensor;
/// use lockstep_train::{EstimatorSpec, ModeKeys};
///
/// let loss = Tensor::scalar(0.5);
/// let spec = EstimatorSpec::train(loss.clone(), Sgd::new(1e-4));
/// assert!(spec.train_op.is_some());
/// let spec = EstimatorSpec::eval(loss).eval_metric_op("accuracy", SparseCategoricalAccuracy::default());
/// assert_eq!((spec.mode, spec.eval_metric_ops.len()), (ModeKeys::Eval, 1));
/// ```
pub struct EstimatorSpec {
    /// The mode the spec answers.
    pub mode: ModeKeys,
    /// The batch's loss; required in `Train` and `Eval`.
    pub loss: Option<Tensor>,
    /// The optimizer that minimizes `loss` (TensorFlow's `optimizer.minimize(loss,
    /// global_step)`); required in `Train`. The optimizer of the first training call keeps
    /// its state for the whole run (its slots are variables, checkpointed); later calls only
    /// set its learning rate, so a `model_fn` may compute a schedule from the global step.
    pub train_op: Option<Box<dyn Optimizer>>,
    /// The outputs to return; required in `Predict`.
    pub predictions: Option<Tensor>,
    /// Named metrics updated on this batch, as `eval_metric_ops`.
    pub eval_metric_ops: Vec<(String, EvalMetricOp)>,
}

impl EstimatorSpec {
    /// The spec of a training call: `loss` minimized by `optimizer`.
    pub fn train(loss: Tensor, optimizer: impl Optimizer + 'static) -> Self {
        Self {
            mode: ModeKeys::Train,
            loss: Some(loss),
            train_op: Some(Box::new(optimizer)),
            predictions: None,
            eval_metric_ops: Vec::new(),
        }
    }

    /// The spec of an evaluation call.
    pub fn eval(loss: Tensor) -> Self {
        Self {
            mode: ModeKeys::Eval,
            loss: Some(loss),
            train_op: None,
            predictions: None,
            eval_metric_ops: Vec::new(),
        }
    }

    /// The spec of a prediction call.
    pub fn predict(predictions: Tensor) -> Self {
        Self {
            mode: ModeKeys::Predict,
            loss: None,
            train_op: None,
            predictions: Some(predictions),
            eval_metric_ops: Vec::new(),
        }
    }

    /// Adds a metric updated on this batch (`metric.update(&logits, labels)` first).
    #[must_use]
    pub fn eval_metric_op(
        mut self,
        name: impl Into<String>,
        metric: impl Metric + Send + 'static,
    ) -> Self {
        self.eval_metric_ops.push((name.into(), Box::new(metric)));
        self
    }
}

impl fmt::Debug for EstimatorSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EstimatorSpec")
            .field("mode", &self.mode)
            .field("loss", &self.loss)
            .field("train_op", &self.train_op.as_ref().map(|o| o.name()))
            .field("predictions", &self.predictions.as_ref().map(Tensor::shape))
            .field(
                "eval_metric_ops",
                &self
                    .eval_metric_ops
                    .iter()
                    .map(|(n, _)| n)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}
