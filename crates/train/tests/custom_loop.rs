//! A custom training loop (`Model::run`, `ReplicaContext`, `Model::reduce`) under each
//! strategy: the same weights as `fit`, bit for bit, and the collectives a step can call.

#![allow(
    clippy::unwrap_used,
    reason = "a test that meets an error must fail loudly"
)]

mod common;

use common::{digits, loss, mlp, workers};
use lockstep_collective::ReduceOp;
use lockstep_data::Dataset;
use lockstep_nn::{Adam, Loss, Reduction};
use lockstep_train::{
    LabeledBatch, MirroredStrategy, Model, OneDeviceStrategy, Strategy, TrainError,
};

/// The MLP trained by `fit` (Adam, loss and accuracy) for `epochs` with `global_batch`:
/// its weights and its per-epoch losses.
fn with_fit(strategy: impl Strategy, global_batch: usize, epochs: u64) -> (Vec<f32>, Vec<f64>) {
    let mut model = Model::new(strategy, mlp).unwrap();
    model
        .compile(Adam::default(), loss(), &["accuracy"])
        .unwrap();
    let data = model.distribute_dataset(digits(), global_batch).unwrap();
    let history = model
        .fit(&data)
        .epochs(epochs)
        .verbose(false)
        .run()
        .unwrap();
    let weights = model.network().parameters().values().to_vec();
    (weights, history.get("loss").unwrap().to_vec())
}

/// The same training as a custom loop: each replica sums its examples' losses, takes their
/// gradients and applies them; the summed loss rides in `apply_gradients`' all-reduce.
fn with_custom_loop(
    strategy: impl Strategy,
    global_batch: usize,
    epochs: u64,
) -> (Vec<f32>, Vec<f64>) {
    let mut model = Model::new(strategy, mlp).unwrap();
    model.set_optimizer(Adam::default());
    let summed = lockstep_nn::SparseCategoricalCrossentropy {
        from_logits: true,
        reduction: Reduction::Sum,
    };
    let data = model.distribute_dataset(digits(), global_batch).unwrap();
    let mut losses = Vec::new();
    for epoch in 0..epochs {
        let (mut loss_sum, mut examples) = (0.0_f64, 0.0_f64);
        let mut batches = data.iter_epoch(epoch).unwrap();
        loop {
            // Steps without data until no worker has any, as `fit` takes them.
            let step = batches.next().transpose().unwrap().unwrap_or_default();
            let totals = model
                .run(step, |replica, batch| {
                    let mut loss_total = [0.0_f64];
                    let gradients = match batch {
                        Some(batch) => {
                            let parts = batch.into_parts()?;
                            let forward = replica.forward(&parts.inputs)?;
                            let value = Loss::call(
                                &summed,
                                &forward.output,
                                parts.targets.as_targets(),
                                None,
                            )?;
                            loss_total[0] = f64::from(value.item()?);
                            replica.gradients(&forward, &value, parts.targets.len())?
                        }
                        None => replica.no_gradients()?,
                    };
                    let examples = replica.apply_gradients(gradients, &mut loss_total)?;
                    Ok((loss_total[0], examples))
                })
                .unwrap();
            // Every replica holds the same all-reduced totals.
            assert!(totals.windows(2).all(|t| t[0] == t[1]), "{totals:?}");
            if totals[0].1 == 0.0 {
                break;
            }
            loss_sum += totals[0].0;
            examples += totals[0].1;
        }
        losses.push(loss_sum / examples);
    }
    (model.network().parameters().values().to_vec(), losses)
}

#[test]
fn a_custom_loop_on_one_device_ends_bit_identical_to_fit() {
    let (fit, fit_losses) = with_fit(OneDeviceStrategy::new(), 64, 2);
    let (custom, custom_losses) = with_custom_loop(OneDeviceStrategy::new(), 64, 2);
    assert_eq!(fit, custom);
    assert_eq!(fit_losses, custom_losses);
    assert!(custom_losses[1] < custom_losses[0], "{custom_losses:?}");
}

#[test]
fn a_custom_loop_on_two_mirrored_replicas_ends_bit_identical_to_fit() {
    // 96 does not divide 640: the last step reaches the second replica in part.
    let (fit, fit_losses) = with_fit(MirroredStrategy::new(2).unwrap(), 96, 2);
    let (custom, custom_losses) = with_custom_loop(MirroredStrategy::new(2).unwrap(), 96, 2);
    assert_eq!(fit, custom);
    assert_eq!(fit_losses, custom_losses);
}

#[test]
fn a_custom_loop_on_two_workers_ends_bit_identical_to_fit_on_every_worker() {
    // 640 examples in global batches of 192: 64 left at the end, a whole batch for the first
    // worker and nothing for the second, which takes the last step without data.
    let fit = workers(2, 1, |strategy| with_fit(strategy, 192, 2));
    let custom = workers(2, 1, |strategy| with_custom_loop(strategy, 192, 2));
    assert_eq!(fit[0], custom[0]);
    assert_eq!(custom[0], custom[1], "the workers agree");
}

#[test]
fn reduce_combines_every_replica_of_every_worker() {
    let results = workers(2, 2, |strategy| {
        let mut model = Model::new(strategy, mlp).unwrap();
        let ids = model
            .run(Vec::<()>::new(), |replica, _| {
                Ok(replica.replica_id() as f64)
            })
            .unwrap();
        [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min]
            .map(|op| model.reduce(op, &ids).unwrap())
    });
    // Replica ids 0..4 across two workers of two replicas.
    assert_eq!(results[0], [6.0, 1.5, 3.0, 0.0]);
    assert_eq!(results[0], results[1]);
}

#[test]
fn all_gather_returns_every_replicas_values_in_replica_order() {
    let mut model = Model::new(MirroredStrategy::new(3).unwrap(), mlp).unwrap();
    let gathered = model
        .run(Vec::<()>::new(), |replica, _| {
            let id = replica.replica_id() as f32;
            replica.all_gather(&[id, 10.0 + id])
        })
        .unwrap();
    for values in &gathered {
        assert_eq!(values, &[0.0, 10.0, 1.0, 11.0, 2.0, 12.0]);
    }
    let mut summed = model
        .run(Vec::<()>::new(), |replica, _| {
            let mut values = [replica.replica_id() as f32 + 1.0];
            replica.all_reduce(&mut values, ReduceOp::Sum)?;
            Ok(values[0])
        })
        .unwrap();
    summed.dedup();
    assert_eq!(summed, [6.0]);
}

#[test]
fn gathers_of_different_lengths_fail_on_every_replica() {
    let mut model = Model::new(MirroredStrategy::new(2).unwrap(), mlp).unwrap();
    let outcomes = model
        .run(Vec::<()>::new(), |replica, _| {
            let values = vec![1.0; 1 + replica.replica_id()];
            Ok(replica.all_gather(&values).map_err(|e| e.to_string()))
        })
        .unwrap();
    for outcome in outcomes {
        let err = outcome.unwrap_err();
        assert!(err.contains("between 1 and 2 values"), "{err}");
    }
}

#[test]
fn misuse_is_a_clear_error() {
    let mut model = Model::new(MirroredStrategy::new(2).unwrap(), mlp).unwrap();
    let err = model
        .run(vec![(); 3], |_, _| Ok(()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("3 batches for 2 replicas"), "{err}");
    // Gradients of examples, but no optimizer set: every replica says so.
    let summed = lockstep_nn::SparseCategoricalCrossentropy {
        from_logits: true,
        reduction: Reduction::Sum,
    };
    let outcomes = model
        .run(Vec::<()>::new(), |replica, _| {
            let x = lockstep_tensor::Tensor::from_vec(vec![0.5; 784], &[1, 784])?;
            let forward = replica.forward(&x)?;
            let value = summed.call(&forward.output, &[3])?;
            let gradients = replica.gradients(&forward, &value, 1)?;
            Ok(replica
                .apply_gradients(gradients, &mut [])
                .map_err(|e| e.to_string()))
        })
        .unwrap();
    for outcome in outcomes {
        let err = outcome.unwrap_err();
        assert!(err.contains("set_optimizer"), "{err}");
    }
    let err = model.reduce(ReduceOp::Sum, &[1.0]).unwrap_err();
    assert!(matches!(err, TrainError::Invalid { .. }), "{err}");
    assert!(err.to_string().contains("1 values for 2 replicas"), "{err}");
}
