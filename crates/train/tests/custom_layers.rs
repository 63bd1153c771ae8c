//! A user's own layer, written outside the crates as a user's crate would: it trains in a
//! functional model, and a model holding it saves with `Model::save` and loads with
//! `Model::load` once its type is registered, and fails with an error naming the type
//! otherwise.

#![allow(
    clippy::unwrap_used,
    reason = "a test that meets an error must fail loudly"
)]

mod common;

use common::{digits, loss};
use lockstep_nn::{
    Activation, Adam, Dense, ForwardContext, Initializer, Input, Layer, LayerCall, LayerConfig,
    Network, NnError, ParamBuilder, register_layer,
};
use lockstep_tensor::{Tensor, ops};
use lockstep_train::{MirroredStrategy, Model, TrainError};
use serde::{Deserialize, Serialize};

/// `x · scale`, one trainable factor per feature of the last axis, starting at `initial`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Scale {
    initial: f32,
    #[serde(skip)]
    class_name: &'static str,
}

impl Layer for Scale {
    fn kind(&self) -> &'static str {
        self.class_name
    }

    fn stem(&self) -> &'static str {
        "scale"
    }

    fn config(&self) -> LayerConfig {
        LayerConfig::custom(self.class_name, self).unwrap()
    }

    fn build(
        &mut self,
        name: &str,
        input_shape: &[usize],
        params: &mut ParamBuilder,
    ) -> Result<Vec<usize>, NnError> {
        let features = *input_shape.last().ok_or_else(|| NnError::InvalidConfig {
            layer: name.to_owned(),
            why: "needs a feature axis".to_owned(),
        })?;
        params.add(
            format!("{name}/scale"),
            vec![features],
            Initializer::Constant {
                value: self.initial,
            },
        )?;
        Ok(input_shape.to_vec())
    }

    fn forward(
        &self,
        name: &str,
        x: &Tensor,
        params: &[Tensor],
        _ctx: ForwardContext<'_>,
    ) -> Result<Tensor, NnError> {
        ops::mul(x, &params[0]).map_err(|source| NnError::Tensor {
            layer: name.to_owned(),
            source,
        })
    }
}

fn model_with_scale(class_name: &'static str) -> Result<Network, NnError> {
    let inputs = Input::new(&[784]);
    let x = Scale {
        initial: 0.5,
        class_name,
    }
    .call(&inputs)?;
    let x = Dense::new(64).activation(Activation::Relu).call(&x)?;
    let outputs = Dense::new(10).call(&x)?;
    Network::new(&[&inputs], &[&outputs], 4)
}

fn trained(class_name: &'static str) -> Model {
    let mut model = Model::new(MirroredStrategy::new(2).unwrap(), || {
        model_with_scale(class_name)
    })
    .unwrap();
    model
        .compile(Adam::default(), loss(), &["accuracy"])
        .unwrap();
    let data = model.distribute_dataset(digits(), 64).unwrap();
    model.fit(&data).epochs(1).verbose(false).run().unwrap();
    model
}

#[test]
fn a_users_layer_trains_saves_and_loads_once_its_type_is_registered() {
    let model = trained("Scale");
    let scale = model.network().parameters().view("scale/scale").unwrap();
    assert!(
        scale.iter().any(|&s| s != 0.5),
        "the layer's variable trained"
    );
    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path()).unwrap();
    register_layer("Scale", |config| {
        let mut layer: Scale =
            serde_json::from_value(config.clone()).map_err(|e| NnError::InvalidConfig {
                layer: "Scale".to_owned(),
                why: e.to_string(),
            })?;
        layer.class_name = "Scale";
        Ok(Box::new(layer))
    })
    .unwrap();
    let loaded = Model::load(MirroredStrategy::new(1).unwrap(), dir.path()).unwrap();
    assert_eq!(loaded.network().parameters(), model.network().parameters());
    assert!(loaded.network().summary().contains("scale (Scale)"));
}

#[test]
fn a_model_with_an_unregistered_layer_type_fails_to_load_naming_the_type() {
    let model = trained("NeverRegisteredScale");
    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path()).unwrap();
    let err = Model::load(MirroredStrategy::new(1).unwrap(), dir.path())
        .err()
        .unwrap();
    let text = err.to_string();
    assert!(
        matches!(err, TrainError::Nn(_)) && text.contains("NeverRegisteredScale"),
        "{text}"
    );
    assert!(text.contains("register_layer"), "{text}");
}

#[test]
fn a_built_in_layer_name_is_refused_for_a_users_type() {
    let err = register_layer("Dense", |_| unreachable!()).unwrap_err();
    assert!(err.to_string().contains("built-in"), "{err}");
}
