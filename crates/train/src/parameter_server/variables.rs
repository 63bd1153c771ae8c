//! Where a model's variables live under `ParameterServerStrategy`: each trainable variable
//! cut into shards along its first axis by the strategy's partitioner (one shard without
//! one), the shards placed on the `ps` tasks round-robin in the order the variables come, and
//! each shard's range in the model's flat parameter buffer (rows are contiguous there, so a
//! shard is one range).

use std::ops::Range;

use lockstep_nn::ParamSpec;
use lockstep_ps::{Partitioner, PsClient, RoundRobin, ShardKey, ShardState, shard_rows};

use crate::error::TrainError;

/// One shard: its key, its `ps` task, its values' range in the flat buffer, its shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlacedShard {
    pub(crate) key: ShardKey,
    pub(crate) ps: usize,
    pub(crate) range: Range<usize>,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
}

/// Every shard of a model's variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShardedVariables {
    pub(crate) shards: Vec<PlacedShard>,
}

impl ShardedVariables {
    /// The shards of the variables `specs` describes, on `num_ps` tasks.
    ///
    /// # Errors
    ///
    /// A variable that is not trainable (its layer updates it: batch normalization's moving
    /// statistics, which no parameter server applies), or a partitioner's error.
    pub(crate) fn lay_out(
        specs: &[ParamSpec],
        num_ps: usize,
        partitioner: Option<&dyn Partitioner>,
    ) -> Result<Self, TrainError> {
        let mut placement = RoundRobin::new(num_ps)?;
        let mut shards = Vec::new();
        for spec in specs {
            if !spec.is_trainable() {
                return Err(TrainError::invalid(
                    "ParameterServerStrategy",
                    format!(
                        "variable {} is updated by its layer, not an optimizer (batch \
                         normalization's statistics): parameter servers hold trainable \
                         variables only",
                        spec.name
                    ),
                ));
            }
            let rows = spec.shape.first().copied().unwrap_or(1);
            let cols = spec.len().checked_div(rows).unwrap_or(0);
            let count = match partitioner {
                Some(p) if !spec.shape.is_empty() => p.num_shards(&spec.shape, size_of::<f32>())?,
                _ => 1,
            };
            let places = placement.place(count);
            for (index, (part, ps)) in shard_rows(rows, count).into_iter().zip(places).enumerate() {
                shards.push(PlacedShard {
                    key: ShardKey::new(spec.name.clone(), index as u32),
                    ps,
                    range: spec.offset + part.start * cols..spec.offset + part.end * cols,
                    rows: part.len(),
                    cols,
                });
            }
        }
        Ok(Self { shards })
    }

    /// Creates every shard from `values` with the optimizer `optimizer` (Keras' config as
    /// JSON), where the `ps` tasks do not hold it yet; returns how many this call made.
    pub(crate) fn create(
        &self,
        clients: &mut [PsClient],
        values: &[f32],
        optimizer: &str,
    ) -> Result<usize, TrainError> {
        let mut made = 0;
        for shard in &self.shards {
            let state = ShardState {
                key: Some(shard.key.clone()),
                rows: shard.rows as u64,
                cols: shard.cols as u64,
                values: values[shard.range.clone()].to_vec(),
                optimizer: optimizer.to_owned(),
                ..ShardState::default()
            };
            let (created, _) = client(clients, shard.ps)?
                .create(state)
                .map_err(|e| on_ps(shard.ps, &e))?;
            made += usize::from(created);
        }
        Ok(made)
    }

    /// Reads every shard into `values`: one request to each `ps` task.
    pub(crate) fn pull(
        &self,
        clients: &mut [PsClient],
        values: &mut [f32],
    ) -> Result<(), TrainError> {
        for (ps, shards) in self.by_ps(clients.len()).into_iter().enumerate() {
            if shards.is_empty() {
                continue;
            }
            let keys: Vec<ShardKey> = shards.iter().map(|s| s.key.clone()).collect();
            let pulled = client(clients, ps)?
                .pull_shards(&keys)
                .map_err(|e| on_ps(ps, &e))?;
            let wanted: usize = shards.iter().map(|s| s.range.len()).sum();
            if pulled.len() != wanted {
                return Err(TrainError::invalid(
                    "ParameterServerStrategy",
                    format!(
                        "ps:{ps} holds {} values of this model's shards, {wanted} here: the \
                         cluster's programs build different models",
                        pulled.len()
                    ),
                ));
            }
            let mut at = 0;
            for shard in shards {
                let len = shard.range.len();
                values[shard.range.clone()].copy_from_slice(&pulled[at..at + len]);
                at += len;
            }
        }
        Ok(())
    }

    /// The shards on each of `num_ps` tasks, in layout order.
    fn by_ps(&self, num_ps: usize) -> Vec<Vec<&PlacedShard>> {
        let mut by_ps = vec![Vec::new(); num_ps];
        for shard in &self.shards {
            if let Some(list) = by_ps.get_mut(shard.ps) {
                list.push(shard);
            }
        }
        by_ps
    }

    /// Sends every shard's part of `gradients`: one request to each `ps` task.
    pub(crate) fn push(
        &self,
        clients: &mut [PsClient],
        gradients: &[f32],
    ) -> Result<(), TrainError> {
        for (ps, shards) in self.by_ps(clients.len()).into_iter().enumerate() {
            if shards.is_empty() {
                continue;
            }
            let keys: Vec<ShardKey> = shards.iter().map(|s| s.key.clone()).collect();
            let gradient: Vec<f32> = shards
                .iter()
                .flat_map(|s| gradients[s.range.clone()].iter().copied())
                .collect();
            client(clients, ps)?
                .push_shards(&keys, gradient)
                .map_err(|e| on_ps(ps, &e))?;
        }
        Ok(())
    }
}

/// `e`, from `ps` task `ps`, as an error that names the task.
pub(crate) fn on_ps(ps: usize, e: &lockstep_ps::PsError) -> TrainError {
    TrainError::invalid("a parameter server", format!("ps:{ps}: {e}"))
}

fn client(clients: &mut [PsClient], ps: usize) -> Result<&mut PsClient, TrainError> {
    let count = clients.len();
    clients.get_mut(ps).ok_or_else(|| {
        TrainError::invalid(
            "ParameterServerStrategy",
            format!("a shard placed on ps {ps} of {count}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_nn::Update;
    use lockstep_ps::FixedShardsPartitioner;

    fn spec(name: &str, shape: &[usize], offset: usize) -> ParamSpec {
        ParamSpec {
            name: name.into(),
            shape: shape.to_vec(),
            offset,
            update: Update::Trainable,
        }
    }

    #[test]
    fn shards_cover_every_value_once_and_go_round_the_ps_tasks() {
        let specs = [
            spec("dense/kernel", &[5, 3], 0),
            spec("dense/bias", &[3], 15),
        ];
        let partitioner = FixedShardsPartitioner::new(2).unwrap();
        let laid = ShardedVariables::lay_out(&specs, 2, Some(&partitioner)).unwrap();
        let ranges: Vec<_> = laid
            .shards
            .iter()
            .map(|s| (s.range.clone(), s.ps, s.rows))
            .collect();
        assert_eq!(
            ranges,
            [(0..9, 0, 3), (9..15, 1, 2), (15..17, 0, 2), (17..18, 1, 1)]
        );
        let unsharded = ShardedVariables::lay_out(&specs, 2, None).unwrap();
        let places: Vec<_> = unsharded
            .shards
            .iter()
            .map(|s| (s.range.clone(), s.ps))
            .collect();
        assert_eq!(places, [(0..15, 0), (15..18, 1)]);
    }

    #[test]
    fn a_variable_its_layer_updates_is_refused_by_name() {
        let mut moving = spec("bn/moving_mean", &[4], 0);
        moving.update = Update::MovingAverage { momentum: 0.99 };
        let e = ShardedVariables::lay_out(&[moving], 1, None).unwrap_err();
        assert!(e.to_string().contains("bn/moving_mean"), "{e}");
    }
}
