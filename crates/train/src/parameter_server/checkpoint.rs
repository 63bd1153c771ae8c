//! The chief's checkpoint of every shard under `ParameterServerStrategy`, and its restore on
//! any number of `ps` tasks.
//!
//! A save exports every `ps` task's shards and joins each variable's shards, rows in order,
//! into whole variables: file `model` holds the values under each variable's name, file
//! `optimizer` each slot as `VARIABLE/SLOT`, and the manifest's meta the optimizer's settings
//! and each shard's update count. A restore cuts the whole variables again by the layout of
//! the cluster that restores, which may have another number of `ps` tasks or another
//! partitioner, and imports each `ps` task's shards whole. A shard's update count (an
//! optimizer's `iterations`: Adam's bias correction) comes back as saved where the layout is
//! the same; a shard cut differently takes the largest count of the saved shards it overlaps.

use std::collections::BTreeMap;

use lockstep_checkpoint::{Checkpoint, NamedTensor, Progress};
use lockstep_nn::ParamSpec;
use lockstep_ps::{ShardState, protocol::SlotValues};
use serde::{Deserialize, Serialize};

use super::variables::ShardedVariables;
use crate::error::TrainError;

/// What a checkpoint's meta holds besides the tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Meta {
    /// The optimizer's settings, Keras' config as JSON.
    optimizer: String,
    /// Each saved shard's rows and update count, by variable, in shard order.
    shards: BTreeMap<String, Vec<(u64, u64)>>,
}

/// A checkpoint of `states` (every shard of every `ps` task) for the variables `specs`.
///
/// # Errors
///
/// A variable whose shards are missing or do not join into its shape.
pub(crate) fn save(
    specs: &[ParamSpec],
    states: Vec<ShardState>,
    progress: Progress,
) -> Result<Checkpoint, TrainError> {
    let mut by_variable: BTreeMap<String, Vec<ShardState>> = BTreeMap::new();
    for state in states {
        let key = state.key.clone().unwrap_or_default();
        by_variable.entry(key.variable).or_default().push(state);
    }
    let mut checkpoint = Checkpoint::new(progress);
    let (mut model, mut optimizer) = (Vec::new(), Vec::new());
    let mut meta = Meta {
        optimizer: String::new(),
        shards: BTreeMap::new(),
    };
    for spec in specs {
        let mut shards = by_variable.remove(&spec.name).unwrap_or_default();
        shards.sort_by_key(|s| s.key.as_ref().map_or(0, |k| k.shard));
        let values: Vec<f32> = shards
            .iter()
            .flat_map(|s| s.values.iter().copied())
            .collect();
        model.push(
            NamedTensor::new(&spec.name, spec.shape.clone(), values)
                .map_err(|e| broken(&spec.name, e))?,
        );
        let slot_names: Vec<String> = shards
            .first()
            .map(|s| s.slots.iter().map(|slot| slot.name.clone()).collect())
            .unwrap_or_default();
        for name in slot_names {
            let values: Vec<f32> = shards
                .iter()
                .flat_map(|s| {
                    s.slots
                        .iter()
                        .find(|slot| slot.name == name)
                        .map(|slot| slot.values.clone())
                        .unwrap_or_default()
                })
                .collect();
            optimizer.push(
                NamedTensor::new(format!("{}/{name}", spec.name), spec.shape.clone(), values)
                    .map_err(|e| broken(&spec.name, e))?,
            );
        }
        if let Some(first) = shards.first() {
            meta.optimizer.clone_from(&first.optimizer);
        }
        meta.shards.insert(
            spec.name.clone(),
            shards.iter().map(|s| (s.rows, s.iterations)).collect(),
        );
    }
    checkpoint.files.insert("model".into(), model);
    checkpoint.files.insert("optimizer".into(), optimizer);
    checkpoint.meta = serde_json::to_value(&meta)
        .map_err(|e| TrainError::invalid("checkpoint", e.to_string()))?;
    Ok(checkpoint)
}

fn broken(variable: &str, e: impl std::fmt::Display) -> TrainError {
    TrainError::invalid(
        "parameter-server checkpoint",
        format!("variable {variable}: {e}"),
    )
}

/// Every shard of `layout` from `checkpoint`, for each `ps` task (`num_ps` of them), for a
/// model compiled with `optimizer` (Keras' config as JSON).
///
/// # Errors
///
/// A checkpoint that lacks a variable of the model, holds one of another shape, was trained
/// with another optimizer, or was not written by a parameter-server chief.
pub(crate) fn restore(
    checkpoint: &Checkpoint,
    specs: &[ParamSpec],
    layout: &ShardedVariables,
    (num_ps, optimizer): (usize, &str),
) -> Result<Vec<Vec<ShardState>>, TrainError> {
    let meta: Meta = serde_json::from_value(checkpoint.meta.clone()).map_err(|e| {
        TrainError::invalid(
            "parameter-server checkpoint",
            format!("its meta is not a parameter-server chief's: {e}"),
        )
    })?;
    // The optimizer's state means nothing to another optimizer: refuse rather than switch.
    let settings = |json: &str| serde_json::from_str::<serde_json::Value>(json).ok();
    if settings(&meta.optimizer) != settings(optimizer) {
        return Err(TrainError::invalid(
            "parameter-server checkpoint",
            format!(
                "it was trained with the optimizer {}, and the model is compiled with {optimizer}",
                meta.optimizer
            ),
        ));
    }
    let mut per_ps: Vec<Vec<ShardState>> = vec![Vec::new(); num_ps];
    let slots = checkpoint.file("optimizer")?;
    for spec in specs {
        let values = &checkpoint.tensor("model", &spec.name)?;
        if values.shape != spec.shape {
            return Err(broken(
                &spec.name,
                format!(
                    "saved with shape {:?}, the model's is {:?}",
                    values.shape, spec.shape
                ),
            ));
        }
        let prefix = format!("{}/", spec.name);
        let saved_slots: Vec<&NamedTensor> = slots
            .iter()
            .filter(|t| t.name.starts_with(&prefix))
            .collect();
        let saved_shards = meta.shards.get(&spec.name).cloned().unwrap_or_default();
        for shard in layout.shards.iter().filter(|s| s.key.variable == spec.name) {
            let local = shard.range.start - spec.offset..shard.range.end - spec.offset;
            let cut = |all: &[f32]| all.get(local.clone()).map(<[f32]>::to_vec);
            let state = ShardState {
                key: Some(shard.key.clone()),
                rows: shard.rows as u64,
                cols: shard.cols as u64,
                values: cut(&values.values).ok_or_else(|| broken(&spec.name, "too few values"))?,
                optimizer: meta.optimizer.clone(),
                iterations: iterations_of(&saved_shards, shard.cols, &local),
                slots: saved_slots
                    .iter()
                    .map(|t| {
                        Ok(SlotValues {
                            name: t.name[prefix.len()..].to_owned(),
                            values: cut(&t.values)
                                .ok_or_else(|| broken(&spec.name, "too few slot values"))?,
                        })
                    })
                    .collect::<Result<_, TrainError>>()?,
            };
            per_ps
                .get_mut(shard.ps)
                .ok_or_else(|| broken(&spec.name, "a shard placed past the ps tasks"))?
                .push(state);
        }
    }
    Ok(per_ps)
}

/// The update count of the new shard whose values are `local` (of a variable of `cols`
/// values a row): the largest of the saved shards it overlaps.
fn iterations_of(saved: &[(u64, u64)], cols: usize, local: &std::ops::Range<usize>) -> u64 {
    let mut start = 0_usize;
    let mut largest = 0;
    for &(rows, iterations) in saved {
        let end = start + rows as usize * cols;
        if start < local.end.max(local.start + 1) && local.start < end.max(start + 1) {
            largest = largest.max(iterations);
        }
        start = end;
    }
    largest
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_nn::{Optimizer, Update};
    use lockstep_ps::{FixedShardsPartitioner, ShardStore};

    fn specs() -> Vec<ParamSpec> {
        vec![
            ParamSpec {
                name: "embedding/embeddings".into(),
                shape: vec![7, 2],
                offset: 0,
                update: Update::Trainable,
            },
            ParamSpec {
                name: "dense/bias".into(),
                shape: vec![3],
                offset: 14,
                update: Update::Trainable,
            },
        ]
    }

    fn adam() -> String {
        serde_json::to_string(&lockstep_nn::Adam::default().config()).unwrap()
    }

    /// Stores holding `layout`'s shards of `values`, trained a little with Adam.
    fn trained(layout: &ShardedVariables, num_ps: usize, values: &[f32]) -> Vec<ShardStore> {
        let stores: Vec<ShardStore> = (0..num_ps).map(|_| ShardStore::new()).collect();
        let adam = adam();
        for shard in &layout.shards {
            stores[shard.ps]
                .create(&ShardState {
                    key: Some(shard.key.clone()),
                    rows: shard.rows as u64,
                    cols: shard.cols as u64,
                    values: values[shard.range.clone()].to_vec(),
                    optimizer: adam.clone(),
                    ..ShardState::default()
                })
                .unwrap();
            let gradient: Vec<f32> = (0..shard.range.len()).map(|i| i as f32 - 1.5).collect();
            for _ in 0..=shard.key.shard {
                stores[shard.ps].push(&shard.key, &gradient).unwrap();
            }
        }
        stores
    }

    fn whole(stores: &[ShardStore], layout: &ShardedVariables, len: usize) -> Vec<f32> {
        let mut values = vec![f32::NAN; len];
        for shard in &layout.shards {
            values[shard.range.clone()]
                .copy_from_slice(&stores[shard.ps].pull(&shard.key).unwrap());
        }
        values
    }

    fn progress() -> Progress {
        Progress {
            step: 10,
            epoch: 1,
            examples_into_epoch: 0,
            worker_count: 2,
            seed: 0,
        }
    }

    #[test]
    fn shards_saved_from_two_ps_tasks_restore_onto_three_with_every_value_and_slot() {
        let specs = specs();
        let values: Vec<f32> = (0..17).map(|v| v as f32 * 0.25).collect();
        let two = FixedShardsPartitioner::new(2).unwrap();
        let saved_layout = ShardedVariables::lay_out(&specs, 2, Some(&two)).unwrap();
        let stores = trained(&saved_layout, 2, &values);
        let exported: Vec<ShardState> = stores.iter().flat_map(|s| s.export().unwrap()).collect();
        let checkpoint = save(&specs, exported, progress()).unwrap();
        let trained_values = whole(&stores, &saved_layout, 17);

        let three = FixedShardsPartitioner::new(3).unwrap();
        let new_layout = ShardedVariables::lay_out(&specs, 3, Some(&three)).unwrap();
        let per_ps = restore(&checkpoint, &specs, &new_layout, (3, &adam())).unwrap();
        let restored: Vec<ShardStore> = per_ps
            .iter()
            .map(|states| {
                let store = ShardStore::new();
                store.import(states).unwrap();
                store
            })
            .collect();
        assert_eq!(whole(&restored, &new_layout, 17), trained_values);
        // Saved again from the new layout, the checkpoint's tensors are the same.
        let again: Vec<ShardState> = restored.iter().flat_map(|s| s.export().unwrap()).collect();
        let resaved = save(&specs, again, progress()).unwrap();
        assert_eq!(resaved.files, checkpoint.files);
    }

    #[test]
    fn the_same_layout_restores_each_shards_update_count() {
        let specs = specs();
        let values = vec![0.5; 17];
        let two = FixedShardsPartitioner::new(2).unwrap();
        let layout = ShardedVariables::lay_out(&specs, 2, Some(&two)).unwrap();
        let stores = trained(&layout, 2, &values);
        let exported: Vec<ShardState> = stores.iter().flat_map(|s| s.export().unwrap()).collect();
        let checkpoint = save(&specs, exported.clone(), progress()).unwrap();
        let per_ps = restore(&checkpoint, &specs, &layout, (2, &adam())).unwrap();
        let mut restored: Vec<ShardState> = per_ps.into_iter().flatten().collect();
        restored.sort_by(|a, b| a.key.cmp(&b.key));
        let mut original = exported;
        original.sort_by(|a, b| a.key.cmp(&b.key));
        assert_eq!(restored, original);
    }

    #[test]
    fn a_checkpoint_of_another_model_is_refused_naming_the_variable() {
        let specs = specs();
        let layout = ShardedVariables::lay_out(&specs, 1, None).unwrap();
        let stores = trained(&layout, 1, &[1.0; 17]);
        let checkpoint = save(&specs, stores[0].export().unwrap(), progress()).unwrap();
        let mut other = specs.clone();
        other[1].shape = vec![4];
        let e = restore(&checkpoint, &other, &layout, (1, &adam())).unwrap_err();
        assert!(e.to_string().contains("dense/bias"), "{e}");
        let sgd = serde_json::to_string(&lockstep_nn::Sgd::new(0.1).config()).unwrap();
        let e = restore(&checkpoint, &specs, &layout, (1, &sgd)).unwrap_err();
        assert!(e.to_string().contains("compiled with"), "{e}");
    }
}
