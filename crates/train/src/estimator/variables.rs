//! The variables a `model_fn` creates: its network, built on the first call and kept.

use lockstep_nn::{Forward, ForwardContext, Network, NnError};
use lockstep_tensor::Tensor;

use crate::error::TrainError;

/// The `model_fn`'s handle on its variables, as the variable scope of a TensorFlow graph:
/// [`apply`](Self::apply) builds the network on the first call of a run and applies the same
/// network on every later call. In training the application is recorded, so the loss's
/// gradients reach the variables.
pub struct Variables<'a> {
    network: Held<'a>,
    context: ForwardContext<'a>,
    record: bool,
    random_seed: u64,
    global_step: u64,
    forward: Option<Forward>,
}

/// The network a call applies: the model's, or the one the first call builds.
enum Held<'a> {
    Built(&'a Network),
    ToBuild(Option<Network>),
}

impl<'a> Variables<'a> {
    /// For the first call: `apply` builds the network.
    pub(crate) fn to_build(context: ForwardContext<'a>, random_seed: u64) -> Self {
        Self {
            network: Held::ToBuild(None),
            context,
            record: false,
            random_seed,
            global_step: context.step,
            forward: None,
        }
    }

    /// For a call on `network`, recorded for gradients when `record`.
    pub(crate) fn of(
        network: &'a Network,
        context: ForwardContext<'a>,
        record: bool,
        random_seed: u64,
    ) -> Self {
        Self {
            network: Held::Built(network),
            context,
            record,
            random_seed,
            global_step: context.step,
            forward: None,
        }
    }

    /// The network's output for `x`; the first call of a run builds the network with
    /// `build` (later calls ignore it). The network is applied once per `model_fn` call.
    ///
    /// # Errors
    ///
    /// When `build` fails, `x` does not fit the network, or the network was applied already
    /// in this call.
    pub fn apply<N: Into<Network>>(
        &mut self,
        build: impl FnOnce() -> Result<N, NnError>,
        x: &Tensor,
    ) -> Result<Tensor, TrainError> {
        if let Held::ToBuild(network @ None) = &mut self.network {
            *network = Some(build()?.into());
        }
        let network = match &self.network {
            Held::Built(network) => *network,
            Held::ToBuild(network) => network.as_ref().ok_or_else(|| {
                TrainError::invalid("Variables::apply", "the network was not built")
            })?,
        };
        if !self.record {
            return Ok(network.predict(x)?);
        }
        if self.forward.is_some() {
            return Err(TrainError::invalid(
                "Variables::apply",
                "a model_fn applies its network once per call",
            ));
        }
        let forward = network.forward(x, self.context)?;
        let output = forward.output.clone();
        self.forward = Some(forward);
        Ok(output)
    }

    /// `RunConfig::random_seed` (0 when unset): the seed to build the network with.
    pub fn random_seed(&self) -> u64 {
        self.random_seed
    }

    /// The global step of this call: steps trained before it.
    pub fn global_step(&self) -> u64 {
        self.global_step
    }

    /// The network `apply` built, after a first call.
    pub(crate) fn into_built(self) -> Option<Network> {
        match self.network {
            Held::ToBuild(network) => network,
            Held::Built(_) => None,
        }
    }

    /// The recorded application, after a training call.
    pub(crate) fn take_forward(&mut self) -> Option<Forward> {
        self.forward.take()
    }
}
