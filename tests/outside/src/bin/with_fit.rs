//! Keras-style: `compile`, `fit`, `evaluate`.

use lockstep_nn::{Adam, SparseCategoricalCrossentropy};

fn main() -> Result<(), my_trainer::Error> {
    let (args, mut model) = my_trainer::start()?;
    let loss = SparseCategoricalCrossentropy { from_logits: true, ..Default::default() };
    model.compile(Adam::default(), loss, &["accuracy"])?;
    let global_batch = args.training.global_batch(model.num_replicas_in_sync());
    let seed = args.training.seed;
    let train = model.distribute_dataset(my_trainer::digits(true, seed, args.train_examples)?, global_batch)?;
    let test = model.distribute_dataset(my_trainer::digits(false, seed, None)?, global_batch)?;
    model.fit(&train).epochs(args.training.epochs).verbose(false).run()?;
    let accuracy = model.evaluate(&test)?.get("accuracy").ok_or("no accuracy")?;
    my_trainer::report(&model, accuracy);
    Ok(())
}
