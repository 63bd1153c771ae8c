//! One replica: its copy of the model and optimizer, its collective handle, and the work it
//! does in a step. Replicas of one process run on threads of their own for each step.

use lockstep_collective::ReduceOp;
use lockstep_nn::{
    ForwardContext, Metric, Network, Optimizer, Reduction, SparseCategoricalAccuracy,
    SparseCategoricalCrossentropy,
};
use lockstep_tensor::Tensor;

use crate::error::TrainError;
use crate::strategy::ReplicaLink;

/// Statistics of one step (or evaluation batch) summed over every replica in sync.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct StepTotals {
    pub(crate) loss_sum: f64,
    pub(crate) examples: f64,
    pub(crate) correct: f64,
}

impl StepTotals {
    pub(crate) fn add(&mut self, other: StepTotals) {
        self.loss_sum += other.loss_sum;
        self.examples += other.examples;
        self.correct += other.correct;
    }
}

/// One replica's part of a step: inputs and labels, or nothing once its data has run out.
pub(crate) type ReplicaBatch = Option<(Tensor, Vec<usize>)>;

/// Values appended to the gradient buffer so that one all-reduce also sums the step's loss,
/// example count and correct predictions.
const TOTALS: usize = 3;

pub(crate) struct Replica {
    pub(crate) link: ReplicaLink,
    pub(crate) net: Network,
    pub(crate) optimizer: Option<Box<dyn Optimizer>>,
    /// Gradients, then the step's totals.
    pub(crate) buffer: Vec<f32>,
}

impl Replica {
    pub(crate) fn new(link: ReplicaLink, net: Network) -> Self {
        Self {
            link,
            net,
            optimizer: None,
            buffer: Vec::new(),
        }
    }

    /// Forward and backward on this replica's batch (none when it has run out of data), the
    /// all-reduce of gradients and totals, and the update every replica applies alike.
    ///
    /// Losses are summed per replica and the summed gradients divided by the number of
    /// examples in the whole step, so the update is the gradient of the mean loss over the
    /// global batch, exactly, also for a last batch that is short or missing on some
    /// replicas.
    pub(crate) fn train_step(
        &mut self,
        batch: ReplicaBatch,
        loss: SparseCategoricalCrossentropy,
        step: u64,
    ) -> Result<StepTotals, TrainError> {
        let n = self.net.parameters().len();
        self.buffer.clear();
        self.buffer.resize(n + TOTALS, 0.0);
        if let Some((x, labels)) = batch.filter(|(_, labels)| !labels.is_empty()) {
            let ctx = ForwardContext {
                training: true,
                step,
                replica: self.link.replica_id(),
            };
            let forward = self.net.forward(&x, ctx)?;
            let loss_fn = SparseCategoricalCrossentropy {
                reduction: Reduction::Sum,
                ..loss
            };
            let value = loss_fn.call(&forward.output, &labels)?;
            self.net
                .gradients(&forward, &value.backward()?, &mut self.buffer[..n])?;
            self.buffer[n] = value.item()?;
            self.buffer[n + 1] = labels.len() as f32;
            self.buffer[n + 2] = correct(&forward.output, &labels)?;
        }
        self.link.all_reduce(&mut self.buffer, ReduceOp::Sum)?;
        let totals = StepTotals {
            loss_sum: f64::from(self.buffer[n]),
            examples: f64::from(self.buffer[n + 1]),
            correct: f64::from(self.buffer[n + 2]),
        };
        if totals.examples > 0.0 {
            let scale = (1.0 / totals.examples) as f32;
            for g in &mut self.buffer[..n] {
                *g *= scale;
            }
            let optimizer = self.optimizer.as_mut().ok_or_else(not_compiled)?;
            optimizer.apply(self.net.parameters_mut().values_mut(), &self.buffer[..n])?;
        }
        Ok(totals)
    }

    /// Loss and correct predictions of this replica's batch, summed over every replica.
    pub(crate) fn evaluate_batch(
        &mut self,
        batch: ReplicaBatch,
        loss: SparseCategoricalCrossentropy,
    ) -> Result<StepTotals, TrainError> {
        let mut totals = [0.0_f64; TOTALS];
        if let Some((x, labels)) = batch.filter(|(_, labels)| !labels.is_empty()) {
            let output = self.net.predict(&x)?;
            let loss_fn = SparseCategoricalCrossentropy {
                reduction: Reduction::Sum,
                ..loss
            };
            totals = [
                f64::from(loss_fn.call(&output, &labels)?.item()?),
                labels.len() as f64,
                f64::from(correct(&output, &labels)?),
            ];
        }
        self.link.all_reduce(&mut totals, ReduceOp::Sum)?;
        Ok(StepTotals {
            loss_sum: totals[0],
            examples: totals[1],
            correct: totals[2],
        })
    }
}

fn correct(output: &Tensor, labels: &[usize]) -> Result<f32, TrainError> {
    let mut accuracy = SparseCategoricalAccuracy::default();
    accuracy.update(output, labels)?;
    Ok(accuracy.state().first().copied().unwrap_or(0.0) as f32)
}

pub(crate) fn not_compiled() -> TrainError {
    TrainError::invalid(
        "model",
        "compile it (optimizer, loss, metrics) before fit or evaluate",
    )
}

/// Runs `work` on every replica with its input, the first on this thread and the others on
/// threads of their own (their collectives meet in the middle); returns the first replica's
/// result, or the first error.
pub(crate) fn on_replicas<I, R>(
    replicas: &mut [Replica],
    inputs: Vec<I>,
    work: impl Fn(&mut Replica, I) -> Result<R, TrainError> + Sync,
) -> Result<R, TrainError>
where
    I: Send,
    R: Send,
{
    if inputs.len() != replicas.len() {
        return Err(TrainError::invalid(
            "input",
            format!(
                "{} batches for {} replicas in this process",
                inputs.len(),
                replicas.len()
            ),
        ));
    }
    let mut inputs = inputs.into_iter();
    let Some((first, rest)) = replicas.split_first_mut() else {
        return Err(TrainError::invalid("model", "it has no replicas"));
    };
    let first_input = inputs
        .next()
        .ok_or_else(|| TrainError::invalid("input", "no batch for replica 0"))?;
    if rest.is_empty() {
        return work(first, first_input);
    }
    let work = &work;
    std::thread::scope(|scope| {
        let handles: Vec<_> = rest
            .iter_mut()
            .zip(inputs)
            .map(|(replica, input)| scope.spawn(move || work(replica, input)))
            .collect();
        let result = work(first, first_input);
        let mut others = Ok(());
        for (index, handle) in handles.into_iter().enumerate() {
            match handle.join() {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    if others.is_ok() {
                        others = Err(e);
                    }
                }
                Err(panic) => {
                    let message = panic
                        .downcast_ref::<&str>()
                        .map(ToString::to_string)
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    others = Err(TrainError::ReplicaPanicked {
                        replica: index + 1,
                        message,
                    });
                }
            }
        }
        let value = result?;
        others.map(|()| value)
    })
}
