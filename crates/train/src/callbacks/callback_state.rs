//! A callback's own state, as a backup holds it.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::TrainError;

/// What a stateful callback carries from one step to the next (`ModelCheckpoint`'s best value,
/// `EarlyStopping`'s wait), named by the callback that made it. `BackupAndRestore` saves every
/// callback's state with the model, so a resumed run goes on as the uninterrupted one would.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallbackState {
    /// The callback's type, as `EarlyStopping`: a state goes back only to a callback of its
    /// own type.
    pub callback: String,
    /// The state itself.
    pub value: serde_json::Value,
}

impl CallbackState {
    /// The state `value` of the callback named `callback`.
    ///
    /// # Errors
    ///
    /// When `value` does not serialize to JSON (a map with keys that are not strings).
    pub fn new(callback: impl Into<String>, value: &impl Serialize) -> Result<Self, TrainError> {
        let callback = callback.into();
        let value = serde_json::to_value(value).map_err(|e| {
            TrainError::invalid(
                "callback state",
                format!("{callback}'s state does not serialize: {e}"),
            )
        })?;
        Ok(Self { callback, value })
    }

    /// The state read back as `T`.
    ///
    /// # Errors
    ///
    /// When the state is another callback's, or not a `T`.
    pub fn value<T: DeserializeOwned>(&self, callback: &str) -> Result<T, TrainError> {
        if self.callback != callback {
            return Err(TrainError::invalid(
                "BackupAndRestore",
                format!(
                    "the backup holds a {}'s state where a {callback}'s belongs",
                    self.callback
                ),
            ));
        }
        serde_json::from_value(self.value.clone()).map_err(|e| {
            TrainError::invalid(
                "BackupAndRestore",
                format!("the backup's state of {callback} is unreadable: {e}"),
            )
        })
    }
}

/// Floats as their bits, so a state survives JSON exactly (infinities included, which JSON
/// numbers cannot hold).
pub(crate) mod f64_bits {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[allow(
        clippy::ref_option,
        reason = "serde's `with` hands the field by reference"
    )]
    pub(crate) fn serialize<S: Serializer>(
        value: &Option<f64>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        value.map(f64::to_bits).serialize(serializer)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<f64>, D::Error> {
        Ok(Option::<u64>::deserialize(deserializer)?.map(f64::from_bits))
    }
}
