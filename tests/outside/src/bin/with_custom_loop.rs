//! TensorFlow's custom training loop: `Model::run` with a step function that takes its
//! gradients and applies them, and `Model::reduce`.

use lockstep_collective::ReduceOp;
use lockstep_data::Dataset;
use lockstep_nn::{Adam, Loss, Metric, PredictionMetric, Reduction};
use lockstep_nn::{SparseCategoricalAccuracy, SparseCategoricalCrossentropy};
use lockstep_train::LabeledBatch;

fn main() -> Result<(), my_trainer::Error> {
    let (args, mut model) = my_trainer::start()?;
    model.set_optimizer(Adam::default());
    let summed = SparseCategoricalCrossentropy { from_logits: true, reduction: Reduction::Sum };
    let global_batch = args.training.global_batch(model.num_replicas_in_sync());
    let seed = args.training.seed;
    let train = model.distribute_dataset(my_trainer::digits(true, seed, args.train_examples)?, global_batch)?;
    for epoch in 0..args.training.epochs {
        let mut batches = train.iter_epoch(epoch)?;
        loop {
            // Until no worker has data left (one whose part ran out steps without a batch).
            let step = batches.next().transpose()?.unwrap_or_default();
            let examples = model.run(step, |replica, batch| {
                let gradients = match batch {
                    Some(batch) => {
                        let parts = batch.into_parts()?;
                        let forward = replica.forward(&parts.inputs)?;
                        let loss = Loss::call(&summed, &forward.output, parts.targets.as_targets(), None)?;
                        replica.gradients(&forward, &loss, parts.targets.len())?
                    }
                    None => replica.no_gradients()?,
                };
                replica.apply_gradients(gradients, &mut [])
            })?;
            if examples[0] == 0.0 {
                break;
            }
        }
    }
    // Accuracy on the test split: each replica counts its part, `reduce` sums the counts.
    let test = model.distribute_dataset(my_trainer::digits(false, seed, None)?, global_batch)?;
    let (mut correct, mut seen) = (0.0, 0.0);
    let mut batches = test.iter_epoch(0)?;
    loop {
        let step = batches.next().transpose()?.unwrap_or_default();
        let states = model.run(step, |replica, batch| {
            let mut accuracy = SparseCategoricalAccuracy::default();
            if let Some(batch) = batch {
                let parts = batch.into_parts()?;
                let output = replica.network().predict(&parts.inputs)?;
                accuracy.update_state(&output, parts.targets.as_targets(), None)?;
            }
            Ok(accuracy.state())
        })?;
        let summed = model.reduce_each(ReduceOp::Sum, &states)?;
        if summed[1] == 0.0 {
            break;
        }
        correct += summed[0];
        seen += summed[1];
    }
    my_trainer::report(&model, correct / seen);
    Ok(())
}
