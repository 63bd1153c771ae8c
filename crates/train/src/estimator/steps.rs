//! What one replica does in an Estimator's training step and evaluation.

use lockstep_collective::ReduceOp;
use lockstep_nn::ForwardContext;
use lockstep_tensor::Tensor;

use super::{EstimatorSpec, EvalMetricOp, ModeKeys, ModelFn, Params, Variables};
use crate::error::TrainError;
use crate::history::Logs;
use crate::replica::Replica;

/// One replica's part of an Estimator step: inputs and class ids (a `model_fn` takes labels
/// as class ids), or nothing once its data has run out.
pub(crate) type ReplicaBatch = Option<(Tensor, Vec<usize>)>;

/// Values appended to the gradients so one all-reduce also sums the step's loss, its
/// examples, and the chief's request to save a checkpoint now.
const EXTRAS: usize = 3;

/// One training step summed over every replica.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct TrainTotals {
    pub(super) loss_sum: f64,
    pub(super) examples: f64,
    pub(super) save_requested: bool,
}

/// Splits one worker batch among `parts` local replicas by rows, the first ones one row
/// longer when it does not divide; a replica left without rows gets `None`.
pub(super) fn split_batch(
    x: Tensor,
    labels: Vec<usize>,
    parts: usize,
) -> Result<Vec<ReplicaBatch>, TrainError> {
    let rows = x.shape().first().copied().unwrap_or(0);
    if rows != labels.len() {
        return Err(TrainError::invalid(
            "input_fn",
            format!("a batch of {rows} inputs has {} labels", labels.len()),
        ));
    }
    if parts <= 1 {
        return Ok(vec![Some((x, labels))]);
    }
    let row = x.len() / rows.max(1);
    let mut out = Vec::with_capacity(parts);
    let mut start = 0;
    for part in 0..parts {
        let count = rows / parts + usize::from(part < rows % parts);
        if count == 0 {
            out.push(None);
            continue;
        }
        let mut shape = x.shape().to_vec();
        shape[0] = count;
        let values = x.host_data()?[start * row..(start + count) * row].to_vec();
        out.push(Some((
            Tensor::from_vec(values, &shape)?,
            labels[start..start + count].to_vec(),
        )));
        start += count;
    }
    Ok(out)
}

/// A training spec has a loss and an optimizer.
pub(super) fn check_train_spec(spec: &EstimatorSpec) -> Result<(), TrainError> {
    if spec.loss.is_none() {
        return Err(TrainError::invalid(
            "model_fn",
            "it returned no loss in TRAIN mode (EstimatorSpec::train)",
        ));
    }
    if spec.train_op.is_none() {
        return Err(TrainError::invalid(
            "model_fn",
            "it returned no train_op in TRAIN mode (EstimatorSpec::train)",
        ));
    }
    Ok(())
}

/// The `model_fn` on this replica's batch (none once its input ended), gradients and extras
/// all-reduced (summed), then the same update on every replica.
pub(super) fn train_step(
    replica: &mut Replica,
    batch: ReplicaBatch,
    model_fn: &dyn ModelFn,
    params: &Params,
    step: u64,
    seed: u64,
    request_save: bool,
) -> Result<TrainTotals, TrainError> {
    let n = replica.net.parameters().len();
    let mut buffer = std::mem::take(&mut replica.buffer);
    buffer.clear();
    buffer.resize(n + EXTRAS, 0.0);
    if let Some((x, labels)) = batch.filter(|(_, labels)| !labels.is_empty()) {
        let context = ForwardContext::training(step, replica.link.replica_id());
        let mut variables = Variables::of(&replica.net, context, true, seed);
        let spec = model_fn.call(&x, Some(&labels), ModeKeys::Train, params, &mut variables)?;
        check_train_spec(&spec)?;
        let forward = variables.take_forward().ok_or_else(|| {
            TrainError::invalid(
                "model_fn",
                "its loss does not come from Variables::apply, so it has no gradients",
            )
        })?;
        let loss = spec
            .loss
            .as_ref()
            .ok_or_else(|| TrainError::invalid("model_fn", "no loss"))?;
        replica
            .net
            .gradients(&forward, &loss.backward()?, &mut buffer[..n])?;
        buffer[n] = loss.item()?;
        buffer[n + 1] = labels.len() as f32;
        if let (Some(optimizer), Some(requested)) = (&mut replica.optimizer, &spec.train_op)
            && optimizer.schedule().is_none()
        {
            optimizer.set_learning_rate(requested.learning_rate());
        }
    }
    buffer[n + 2] = f32::from(u8::from(request_save));
    replica.link.all_reduce(&mut buffer, ReduceOp::Sum)?;
    let totals = TrainTotals {
        loss_sum: f64::from(buffer[n]),
        examples: f64::from(buffer[n + 1]),
        save_requested: buffer[n + 2] > 0.0,
    };
    if totals.examples > 0.0 {
        let optimizer = replica
            .optimizer
            .as_mut()
            .ok_or_else(|| TrainError::invalid("Estimator", "a replica has no optimizer"))?;
        // The model_fn's loss is a replica's own (its gradients are summed, not scaled);
        // observations of non-trainable state are weighed by examples, so scaled here.
        lockstep_nn::apply_update(
            &mut **optimizer,
            replica.net.parameters_mut(),
            &mut buffer[..n],
            (1.0 / totals.examples) as f32,
        )?;
    }
    replica.buffer = buffer;
    Ok(totals)
}

/// An evaluation's sums: the batches' losses and count, and each metric's state.
pub(super) struct EvalTotals {
    loss_sum: f64,
    batches: f64,
    metrics: Vec<(String, EvalMetricOp, Vec<f64>)>,
}

impl EvalTotals {
    /// Sums the totals of every replica of every worker (all must have the same metrics).
    pub(super) fn all_reduce(&mut self, replica: &mut Replica) -> Result<(), TrainError> {
        let mut flat = vec![self.loss_sum, self.batches];
        for (_, _, state) in &self.metrics {
            flat.extend_from_slice(state);
        }
        replica.link.all_reduce(&mut flat, ReduceOp::Sum)?;
        self.loss_sum = flat[0];
        self.batches = flat[1];
        let mut at = 2;
        for (_, _, state) in &mut self.metrics {
            let len = state.len();
            state.copy_from_slice(&flat[at..at + len]);
            at += len;
        }
        Ok(())
    }

    /// `loss` and each metric's result.
    pub(super) fn logs(mut self) -> Result<Logs, TrainError> {
        let mut logs = Logs::default();
        let loss = if self.batches > 0.0 {
            self.loss_sum / self.batches
        } else {
            0.0
        };
        logs.0.insert("loss".into(), loss);
        for (name, metric, state) in &mut self.metrics {
            metric.set_state(state)?;
            logs.0.insert(name.clone(), metric.result());
        }
        Ok(logs)
    }
}

/// The `model_fn` in `Eval` mode over `batches` on this replica.
pub(super) fn evaluate_batches(
    replica: &Replica,
    batches: &[(Tensor, Vec<usize>)],
    model_fn: &dyn ModelFn,
    params: &Params,
    seed: u64,
) -> Result<EvalTotals, TrainError> {
    let mut totals = EvalTotals {
        loss_sum: 0.0,
        batches: 0.0,
        metrics: Vec::new(),
    };
    for (x, labels) in batches {
        let mut context = ForwardContext::inference();
        context.step = 0;
        context.replica = replica.link.replica_id();
        let mut variables = Variables::of(&replica.net, context, false, seed);
        let spec = model_fn.call(x, Some(labels), ModeKeys::Eval, params, &mut variables)?;
        let loss = spec.loss.ok_or_else(|| {
            TrainError::invalid(
                "model_fn",
                "it returned no loss in EVAL mode (EstimatorSpec::eval)",
            )
        })?;
        totals.loss_sum += f64::from(loss.item()?);
        totals.batches += 1.0;
        for (name, metric) in spec.eval_metric_ops {
            let state = metric.state();
            match totals.metrics.iter_mut().find(|(n, _, _)| *n == name) {
                Some((_, _, sum)) if sum.len() == state.len() => {
                    for (s, v) in sum.iter_mut().zip(&state) {
                        *s += v;
                    }
                }
                Some(_) => {
                    return Err(TrainError::invalid(
                        "model_fn",
                        format!("metric {name:?} changed its state's size between batches"),
                    ));
                }
                None => totals.metrics.push((name, metric, state)),
            }
        }
    }
    Ok(totals)
}
