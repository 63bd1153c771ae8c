//! Functional models under the strategies: the guide's functional MLP trains under
//! `MirroredStrategy` to the weights of the same `Sequential` model, and saves and loads as a
//! whole model.

#![allow(
    clippy::unwrap_used,
    reason = "a test that meets an error must fail loudly"
)]

mod common;

use common::{digits, loss};
use lockstep_nn::{Activation, Adam, Dense, Input, LayerCall, Network, NnError, models};
use lockstep_train::{MirroredStrategy, Model, Strategy};

/// The guide's MLP (as `models::mnist_mlp`) written with the functional API.
fn functional_mlp() -> Result<Network, NnError> {
    let inputs = Input::named(&[784], "digits");
    let x = Dense::new(256).activation(Activation::Relu).call(&inputs)?;
    let x = Dense::new(256).activation(Activation::Relu).call(&x)?;
    let outputs = Dense::new(10).call(&x)?;
    Network::new(&[&inputs], &[&outputs], 3)
}

fn trained(strategy: impl Strategy, functional: bool) -> Model {
    let mut model = if functional {
        Model::new(strategy, functional_mlp).unwrap()
    } else {
        Model::new(strategy, || models::mnist_mlp(3)).unwrap()
    };
    model
        .compile(Adam::default(), loss(), &["accuracy"])
        .unwrap();
    let data = model.distribute_dataset(digits(), 64).unwrap();
    model.fit(&data).epochs(2).verbose(false).run().unwrap();
    model
}

#[test]
fn the_functional_mlp_trains_under_mirrored_replicas_to_the_sequential_models_weights() {
    let functional = trained(MirroredStrategy::new(2).unwrap(), true);
    let sequential = trained(MirroredStrategy::new(2).unwrap(), false);
    assert_eq!(
        functional.network().parameters().values(),
        sequential.network().parameters().values()
    );
    assert!(
        functional
            .network()
            .summary()
            .contains("digits (InputLayer)")
    );
}

#[test]
fn a_functional_model_saves_and_loads_as_a_whole_model() {
    let model = trained(MirroredStrategy::new(1).unwrap(), true);
    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path()).unwrap();
    let loaded = Model::load(MirroredStrategy::new(2).unwrap(), dir.path()).unwrap();
    assert_eq!(loaded.network().parameters(), model.network().parameters());
    assert_eq!(loaded.network().summary(), model.network().summary());
}
