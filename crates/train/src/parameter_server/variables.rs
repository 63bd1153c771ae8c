//! Where a model's variables live under `ParameterServerStrategy`: each trainable variable
//! cut into shards along its first axis by the strategy's partitioner (one shard without
//! one), the shards placed on the `ps` tasks round-robin in the order the variables come, and
//! each shard's range in the model's flat parameter buffer (rows are contiguous there, so a
//! shard is one range).

use std::ops::Range;

use lockstep_nn::ParamSpec;
use lockstep_ps::protocol::f32s_into;
use lockstep_ps::{
    Partitioner, PsClient, RoundRobin, Rows, ShardKey, ShardState, StepId, shard_rows,
};

use crate::error::TrainError;

/// One shard: its key, its `ps` task, its values' range in the flat buffer, its shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlacedShard {
    pub(crate) key: ShardKey,
    pub(crate) ps: usize,
    pub(crate) range: Range<usize>,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// The variable's index, and the variable's row this shard starts at.
    pub(crate) variable: usize,
    pub(crate) first_row: usize,
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
        for (variable, spec) in specs.iter().enumerate() {
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
                    variable,
                    first_row: part.start,
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
        self.pull_rows(clients, values, &mut [])
    }

    /// Reads every shard into `values`, except the tables `tables` names: of those only the
    /// rows a batch looks up, into each table's compact `values`. One request to each `ps`
    /// task.
    pub(crate) fn pull_rows(
        &self,
        clients: &mut [PsClient],
        values: &mut [f32],
        tables: &mut [TableRows],
    ) -> Result<(), TrainError> {
        for table in tables.iter_mut() {
            table.values.resize(table.ids.len() * table.cols, 0.0);
        }
        for (ps, parts) in self
            .parts_by_ps(clients.len(), tables)
            .into_iter()
            .enumerate()
        {
            if parts.is_empty() {
                continue;
            }
            let (keys, rows) = request(&parts, tables);
            // The answer's bytes go straight where they belong: a table's shards are copied
            // once on their way in.
            let pulled = client(clients, ps)?
                .pull_shard_rows_bytes(&keys, rows)
                .map_err(|e| on_ps(ps, &e))?;
            let wanted: usize = parts.iter().map(Part::len).sum();
            if pulled.len() != wanted * size_of::<f32>() {
                return Err(TrainError::invalid(
                    "ParameterServerStrategy",
                    format!(
                        "ps:{ps} answered {} bytes for this model's {wanted} values of its \
                         shards: the cluster's programs build different models",
                        pulled.len()
                    ),
                ));
            }
            let mut at = 0;
            for part in parts {
                let len = part.len();
                let from = &pulled[at * size_of::<f32>()..(at + len) * size_of::<f32>()];
                let to = match part.place {
                    Place::Dense => &mut values[part.shard.range.clone()],
                    Place::Table {
                        table,
                        ref positions,
                    } => {
                        let cols = tables[table].cols;
                        &mut tables[table].values[positions.start * cols..positions.end * cols]
                    }
                };
                if !f32s_into(from, to) {
                    return Err(TrainError::invalid(
                        "ParameterServerStrategy",
                        format!("ps:{ps} answered {len} values for {} places", to.len()),
                    ));
                }
                at += len;
            }
        }
        Ok(())
    }

    /// Sends every shard's part of `gradients` times `scale`, except the tables `tables`
    /// names: of those only the rows the batch looked up, from each table's compact
    /// `gradient`. One request to each `ps` task, marked with `step` when it has one (a `ps`
    /// task applies one push per step).
    pub(crate) fn push_rows(
        &self,
        clients: &mut [PsClient],
        (gradients, scale): (&[f32], f32),
        tables: &[TableRows],
        step: Option<StepId>,
    ) -> Result<(), TrainError> {
        for (ps, parts) in self
            .parts_by_ps(clients.len(), tables)
            .into_iter()
            .enumerate()
        {
            if parts.is_empty() {
                continue;
            }
            let (keys, rows) = request(&parts, tables);
            let mut gradient = Vec::with_capacity(parts.iter().map(Part::len).sum());
            for part in &parts {
                let from = match part.place {
                    Place::Dense => &gradients[part.shard.range.clone()],
                    Place::Table {
                        table,
                        ref positions,
                    } => {
                        let cols = tables[table].cols;
                        &tables[table].gradient[positions.start * cols..positions.end * cols]
                    }
                };
                gradient.extend(from.iter().map(|g| g * scale));
            }
            client(clients, ps)?
                .push_shard_rows(&keys, rows, &gradient, step)
                .map_err(|e| on_ps(ps, &e))?;
        }
        Ok(())
    }

    /// What each of `num_ps` tasks is asked for, in layout order: its shards whole, and the
    /// looked-up rows of the shards of `tables` (a shard none of whose rows a batch names is
    /// left out).
    fn parts_by_ps<'a>(&'a self, num_ps: usize, tables: &[TableRows]) -> Vec<Vec<Part<'a>>> {
        let mut by_ps: Vec<Vec<Part<'a>>> = vec![Vec::new(); num_ps];
        for shard in &self.shards {
            let Some(list) = by_ps.get_mut(shard.ps) else {
                continue;
            };
            let place = match tables.iter().position(|t| t.variable == shard.variable) {
                None => Place::Dense,
                Some(table) => {
                    // The ids are sorted: the shard's are one run of them.
                    let ids = &tables[table].ids;
                    let start = ids.partition_point(|&id| id < shard.first_row);
                    let end = ids.partition_point(|&id| id < shard.first_row + shard.rows);
                    if start == end {
                        continue;
                    }
                    Place::Table {
                        table,
                        positions: start..end,
                    }
                }
            };
            list.push(Part { shard, place });
        }
        by_ps
    }
}

/// The rows of one table variable a batch looks up, for a pull and push of only those.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TableRows {
    /// The variable's index.
    pub(crate) variable: usize,
    /// Its row width.
    pub(crate) cols: usize,
    /// The rows looked up, sorted, each once: the compact table's row `i` is row `ids[i]`.
    pub(crate) ids: Vec<usize>,
    /// The compact table, `ids.len() · cols` values (filled by a pull).
    pub(crate) values: Vec<f32>,
    /// Its gradient, as long (read by a push).
    pub(crate) gradient: Vec<f32>,
}

/// One shard's part of a request to its `ps` task.
#[derive(Debug, Clone)]
struct Part<'a> {
    shard: &'a PlacedShard,
    place: Place,
}

/// Where a part's values come from and go to.
#[derive(Debug, Clone)]
enum Place {
    /// The shard's range of the flat buffer, every row.
    Dense,
    /// Rows `positions` of table `table`'s compact buffer.
    Table {
        table: usize,
        positions: Range<usize>,
    },
}

impl Part<'_> {
    /// Its values.
    fn len(&self) -> usize {
        match &self.place {
            Place::Dense => self.shard.range.len(),
            Place::Table { positions, .. } => positions.len() * self.shard.cols,
        }
    }
}

/// The keys and row selections of a request for `parts`.
fn request(parts: &[Part<'_>], tables: &[TableRows]) -> (Vec<ShardKey>, Vec<Rows>) {
    let keys = parts.iter().map(|p| p.shard.key.clone()).collect();
    let rows = if parts.iter().all(|p| matches!(p.place, Place::Dense)) {
        Vec::new()
    } else {
        parts
            .iter()
            .map(|p| match &p.place {
                Place::Dense => Rows::every(),
                Place::Table { table, positions } => Rows::some(
                    tables[*table].ids[positions.clone()]
                        .iter()
                        .map(|&id| (id - p.shard.first_row) as u64)
                        .collect(),
                ),
            })
            .collect()
    };
    (keys, rows)
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
