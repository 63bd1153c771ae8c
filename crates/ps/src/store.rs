//! What a parameter server holds: its shards, each with its values, its optimizer's settings
//! and the optimizer's state, updated in place by the gradients workers push.
//!
//! The update rule is lockstep-nn's optimizer, the same code a synchronous step runs, so a
//! shard moves as the variable would under `fit` with that optimizer. A gradient of some rows
//! (an embedding lookup's) updates those rows only: duplicate rows' gradients are summed
//! first, as TensorFlow deduplicates an `IndexedSlices`, then the rows and their slots are
//! gathered, updated and written back. That is TensorFlow's rule for SGD, momentum and
//! Adagrad's sparse updates; for Adam it is `LazyAdam`'s (the moments of rows not in the batch
//! do not decay).
//!
//! Each shard has its own lock: pushes to different shards proceed in parallel, pushes to
//! one shard apply one after the other (TensorFlow's `use_locking`). Asynchronous training
//! accepts that a worker's gradient may be computed from values other workers have updated
//! since it pulled them.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use lockstep_nn::{Optimizer, OptimizerConfig};

use crate::error::PsError;
use crate::protocol::{Rows, ShardKey, ShardState, SlotValues, StepId};

/// One shard and its optimizer's state.
struct Shard {
    rows: usize,
    cols: usize,
    values: Vec<f32>,
    optimizer: ShardOptimizer,
    iterations: u64,
}

/// A shard's optimizer: its settings and its slots, each as long as the shard (made with it).
struct ShardOptimizer {
    config: OptimizerConfig,
    /// The slots, when `built` does not hold them.
    slots: Vec<(String, Vec<f32>)>,
    /// An optimizer at the shard's step holding every slot, or `None` when `slots` holds
    /// them. A push of the whole shard applies it, so its update copies nothing; a push of
    /// some rows reads and writes just those rows of the plain slots. A shard takes one kind
    /// of push (a dense layer's or an embedding table's), so its slots change hands, at one
    /// copy, only when the kind does.
    built: Option<Box<dyn Optimizer>>,
}

/// Every shard of one parameter server, by key.
#[derive(Default)]
pub struct ShardStore {
    shards: RwLock<HashMap<ShardKey, Arc<Mutex<Shard>>>>,
    /// Gradients applied since the store was made, over every shard.
    updates: AtomicU64,
    /// The steps whose push this store applied, newest last.
    applied: Mutex<AppliedSteps>,
}

/// The last [`AppliedSteps::WINDOW`] steps a store applied a push of: a step run again after
/// its worker was lost finds its first run's push here and is not applied twice. A repeat
/// that comes after that many other steps is applied (at-least-once, as without ids).
#[derive(Default)]
struct AppliedSteps {
    seen: HashSet<StepId>,
    order: VecDeque<StepId>,
}

impl AppliedSteps {
    /// Steps remembered: far more than a cluster runs while it notices a lost worker.
    const WINDOW: usize = 1 << 16;

    /// Records `step`; `false` when it was recorded already.
    fn claim(&mut self, step: StepId) -> bool {
        if !self.seen.insert(step) {
            return false;
        }
        self.order.push_back(step);
        if self.order.len() > Self::WINDOW
            && let Some(oldest) = self.order.pop_front()
        {
            self.seen.remove(&oldest);
        }
        true
    }
}

fn refused(key: &ShardKey, why: impl Into<String>) -> PsError {
    PsError::Request {
        shard: key.to_string(),
        why: why.into(),
    }
}

fn optimizer_error(key: &ShardKey, why: impl std::fmt::Display) -> PsError {
    PsError::Optimizer {
        shard: key.to_string(),
        why: why.to_string(),
    }
}

impl ShardOptimizer {
    fn slot_views(&self) -> Vec<(&str, &[f32])> {
        match &self.built {
            Some(optimizer) => optimizer.slots(),
            None => self
                .slots
                .iter()
                .map(|(name, values)| (name.as_str(), values.as_slice()))
                .collect(),
        }
    }

    /// The optimizer at step `iterations` holding every slot, built from the plain slots if
    /// they hold them.
    fn built(&mut self, key: &ShardKey, iterations: u64) -> Result<&mut dyn Optimizer, PsError> {
        let optimizer = if let Some(optimizer) = self.built.take() {
            optimizer
        } else {
            let optimizer = self.fresh(key, iterations, &self.slot_views())?;
            self.slots = Vec::new();
            optimizer
        };
        Ok(self.built.insert(optimizer).as_mut())
    }

    /// The plain slots, taken out of the built optimizer if it holds them.
    fn slots_mut(&mut self) -> &mut Vec<(String, Vec<f32>)> {
        if let Some(optimizer) = self.built.take() {
            self.slots = optimizer
                .slots()
                .into_iter()
                .map(|(name, values)| (name.to_owned(), values.to_vec()))
                .collect();
        }
        &mut self.slots
    }

    /// A new optimizer at step `iterations` holding `slots` (the whole shard's, or the rows
    /// an update touches).
    fn fresh(
        &self,
        key: &ShardKey,
        iterations: u64,
        slots: &[(&str, &[f32])],
    ) -> Result<Box<dyn Optimizer>, PsError> {
        let mut optimizer = self.config.build();
        optimizer
            .restore(iterations, slots)
            .map_err(|e| optimizer_error(key, e))?;
        Ok(optimizer)
    }
}

impl Shard {
    /// A shard from `state`, its lengths checked.
    fn from_state(key: &ShardKey, state: &ShardState) -> Result<Self, PsError> {
        let rows = usize::try_from(state.rows).map_err(|_| refused(key, "too many rows"))?;
        let cols = usize::try_from(state.cols).map_err(|_| refused(key, "too many columns"))?;
        let len = rows
            .checked_mul(cols)
            .ok_or_else(|| refused(key, "rows × columns overflows"))?;
        if state.values.len() != len {
            return Err(refused(
                key,
                format!("{} values for {rows} rows of {cols}", state.values.len()),
            ));
        }
        let config: OptimizerConfig =
            serde_json::from_str(&state.optimizer).map_err(|e| optimizer_error(key, e))?;
        let built = config.build();
        if built.schedule().is_some() {
            return Err(optimizer_error(
                key,
                "a parameter server applies a constant learning rate: a schedule needs the \
                 global step, which no shard holds",
            ));
        }
        let mut slots: Vec<(String, Vec<f32>)> = state
            .slots
            .iter()
            .map(|slot| (slot.name.clone(), slot.values.clone()))
            .collect();
        if slots.is_empty() {
            slots = initial_slots(key, &config, &state.values)?;
        }
        // A count at its limit could not count this shard's next update.
        if state.iterations == u64::MAX {
            return Err(refused(key, "an update count at its limit"));
        }
        if let Some(slot) = slots.iter().find(|(_, values)| values.len() != len) {
            return Err(refused(
                key,
                format!(
                    "slot {:?} holds {} values, the shard {len}",
                    slot.0,
                    slot.1.len()
                ),
            ));
        }
        let mut optimizer = ShardOptimizer {
            config,
            slots,
            built: None,
        };
        // The optimizer must take these slots back: refuse a state it would refuse later.
        optimizer.built(key, state.iterations)?;
        Ok(Self {
            rows,
            cols,
            values: state.values.clone(),
            optimizer,
            iterations: state.iterations,
        })
    }

    fn state(&self, key: &ShardKey) -> Result<ShardState, PsError> {
        Ok(ShardState {
            key: Some(key.clone()),
            rows: self.rows as u64,
            cols: self.cols as u64,
            values: self.values.clone(),
            optimizer: serde_json::to_string(&self.optimizer.config)
                .map_err(|e| optimizer_error(key, e))?,
            iterations: self.iterations,
            slots: self
                .optimizer
                .slot_views()
                .into_iter()
                .map(|(name, values)| SlotValues {
                    name: name.to_owned(),
                    values: values.to_vec(),
                })
                .collect(),
        })
    }

    /// Applies a gradient of every value.
    fn push(&mut self, key: &ShardKey, gradient: &[f32]) -> Result<u64, PsError> {
        if gradient.len() != self.values.len() {
            return Err(refused(
                key,
                format!(
                    "a gradient of {} values for a shard of {}",
                    gradient.len(),
                    self.values.len()
                ),
            ));
        }
        self.optimizer
            .built(key, self.iterations)?
            .apply(&mut self.values, gradient)
            .map_err(|e| optimizer_error(key, e))?;
        self.iterations = self.iterations.saturating_add(1);
        Ok(self.iterations)
    }

    /// Applies a gradient of some rows.
    fn push_rows(
        &mut self,
        key: &ShardKey,
        rows: &[u64],
        gradient: &[f32],
    ) -> Result<u64, PsError> {
        let cols = self.cols;
        if gradient.len() != rows.len().saturating_mul(cols) {
            return Err(refused(
                key,
                format!(
                    "a gradient of {} values for {} rows of {cols}",
                    gradient.len(),
                    rows.len()
                ),
            ));
        }
        // Duplicate rows' gradients summed, in row order: the order of the sums is fixed.
        let mut summed: BTreeMap<usize, Vec<f32>> = BTreeMap::new();
        for (&row, g) in rows.iter().zip(gradient.chunks(cols.max(1))) {
            let row = self.row(key, row)?;
            let sum = summed.entry(row).or_insert_with(|| vec![0.0; cols]);
            for (s, &v) in sum.iter_mut().zip(g) {
                *s += v;
            }
        }
        let gather = |source: &[f32]| -> Vec<f32> {
            summed
                .keys()
                .flat_map(|&row| source[row * cols..(row + 1) * cols].iter().copied())
                .collect()
        };
        let mut values = gather(&self.values);
        let gathered_slots: Vec<(String, Vec<f32>)> = self
            .optimizer
            .slots_mut()
            .iter()
            .map(|(name, slot)| (name.clone(), gather(slot)))
            .collect();
        let views: Vec<(&str, &[f32])> = gathered_slots
            .iter()
            .map(|(name, values)| (name.as_str(), values.as_slice()))
            .collect();
        let mut optimizer = self.optimizer.fresh(key, self.iterations, &views)?;
        let gradient: Vec<f32> = summed.values().flatten().copied().collect();
        optimizer
            .apply(&mut values, &gradient)
            .map_err(|e| optimizer_error(key, e))?;
        let len = self.values.len();
        let slots = self.optimizer.slots_mut();
        for (name, updated) in optimizer.slots() {
            let slot = slots
                .iter_mut()
                .find(|(n, _)| n == name)
                .filter(|(_, slot)| slot.len() == len)
                .ok_or_else(|| optimizer_error(key, format!("a slot {name:?} the shard lacks")))?;
            scatter(&mut slot.1, summed.keys(), cols, updated);
        }
        scatter(&mut self.values, summed.keys(), cols, &values);
        self.iterations = self.iterations.saturating_add(1);
        Ok(self.iterations)
    }

    fn row(&self, key: &ShardKey, row: u64) -> Result<usize, PsError> {
        usize::try_from(row)
            .ok()
            .filter(|&r| r < self.rows)
            .ok_or_else(|| refused(key, format!("row {row} of a shard of {} rows", self.rows)))
    }
}

/// A refusal of a request about all of `keys`.
pub(crate) fn refused_all(keys: &[ShardKey], why: impl Into<String>) -> PsError {
    PsError::Request {
        shard: keys
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        why: why.into(),
    }
}

/// Each key's rows: `None` for every row; `rows` empty names every row of every key.
fn selections<'a>(keys: &[ShardKey], rows: &'a [Rows]) -> Result<Vec<Option<&'a [u64]>>, PsError> {
    if rows.is_empty() {
        return Ok(vec![None; keys.len()]);
    }
    if rows.len() != keys.len() {
        return Err(refused_all(
            keys,
            format!("{} row selections for {} shards", rows.len(), keys.len()),
        ));
    }
    Ok(rows.iter().map(Rows::named).collect())
}

/// The optimizer's slots before its first update, for every value: its state after a step of
/// zero gradient on a copy of `values` (Adagrad's accumulator at its initial value, every
/// other slot of lockstep-nn's optimizers at zero). Made when the shard is, so that a sparse
/// update finds every row's slots as the optimizer would have started them.
fn initial_slots(
    key: &ShardKey,
    config: &OptimizerConfig,
    values: &[f32],
) -> Result<Vec<(String, Vec<f32>)>, PsError> {
    let mut optimizer = config.build();
    let mut scratch = values.to_vec();
    optimizer
        .apply(&mut scratch, &vec![0.0; values.len()])
        .map_err(|e| optimizer_error(key, e))?;
    Ok(optimizer
        .slots()
        .into_iter()
        .map(|(name, values)| (name.to_owned(), values.to_vec()))
        .collect())
}

/// Writes `rows`' values from `from` (one row after another) into `into`.
fn scatter<'a>(into: &mut [f32], rows: impl Iterator<Item = &'a usize>, cols: usize, from: &[f32]) {
    for (&row, values) in rows.zip(from.chunks(cols.max(1))) {
        into[row * cols..(row + 1) * cols].copy_from_slice(values);
    }
}

impl ShardStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn get(&self, key: &ShardKey) -> Result<Arc<Mutex<Shard>>, PsError> {
        self.shards
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned()
            .ok_or_else(|| refused(key, "no such shard on this parameter server"))
    }

    /// Creates the shard `state` describes unless it exists (then it must have the same
    /// shape); returns whether this call made it, and its updates so far.
    ///
    /// # Errors
    ///
    /// A state whose lengths disagree, an optimizer the server cannot build, or an existing
    /// shard of another shape.
    pub fn create(&self, state: &ShardState) -> Result<(bool, u64), PsError> {
        let key = state.key.clone().unwrap_or_default();
        let shard = Shard::from_state(&key, state)?;
        let mut shards = self.shards.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(existing) = shards.get(&key) {
            let existing = existing.lock().unwrap_or_else(PoisonError::into_inner);
            if (existing.rows, existing.cols) != (shard.rows, shard.cols) {
                return Err(refused(
                    &key,
                    format!(
                        "exists with {} rows of {}, asked for {} rows of {}",
                        existing.rows, existing.cols, shard.rows, shard.cols
                    ),
                ));
            }
            return Ok((false, existing.iterations));
        }
        shards.insert(key, Arc::new(Mutex::new(shard)));
        Ok((true, 0))
    }

    /// Every value of a shard.
    ///
    /// # Errors
    ///
    /// An unknown shard.
    pub fn pull(&self, key: &ShardKey) -> Result<Vec<f32>, PsError> {
        let shard = self.get(key)?;
        let shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(shard.values.clone())
    }

    /// Rows of a shard, in the order asked.
    ///
    /// # Errors
    ///
    /// An unknown shard or a row outside it.
    pub fn pull_rows(&self, key: &ShardKey, rows: &[u64]) -> Result<Vec<f32>, PsError> {
        let shard = self.get(key)?;
        let shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
        let cols = shard.cols;
        let rows = rows
            .iter()
            .map(|&row| shard.row(key, row))
            .collect::<Result<Vec<_>, _>>()?;
        // The answer must fit one frame: checked before anything is allocated for it.
        let len = rows
            .len()
            .checked_mul(cols)
            .filter(|&len| len <= crate::protocol::MAX_FRAME / size_of::<f32>())
            .ok_or_else(|| {
                refused(
                    key,
                    format!("{} rows of {cols} values: over one frame", rows.len()),
                )
            })?;
        let mut out = Vec::with_capacity(len);
        for row in rows {
            out.extend_from_slice(&shard.values[row * cols..(row + 1) * cols]);
        }
        Ok(out)
    }

    /// Applies a gradient of every value of a shard; returns its updates so far.
    ///
    /// # Errors
    ///
    /// An unknown shard, a gradient of another length, or the optimizer's error.
    pub fn push(&self, key: &ShardKey, gradient: &[f32]) -> Result<u64, PsError> {
        let shard = self.get(key)?;
        let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
        let iterations = shard.push(key, gradient)?;
        self.updates.fetch_add(1, Ordering::Relaxed);
        Ok(iterations)
    }

    /// Applies a gradient of some rows of a shard; returns its updates so far.
    ///
    /// # Errors
    ///
    /// An unknown shard, a row outside it, a gradient of another length, or the optimizer's
    /// error. The shard is unchanged then.
    pub fn push_rows(
        &self,
        key: &ShardKey,
        rows: &[u64],
        gradient: &[f32],
    ) -> Result<u64, PsError> {
        let shard = self.get(key)?;
        let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
        let iterations = shard.push_rows(key, rows, gradient)?;
        self.updates.fetch_add(1, Ordering::Relaxed);
        Ok(iterations)
    }

    /// Every value of several shards, one after another in the order of `keys`.
    ///
    /// # Errors
    ///
    /// An unknown shard.
    pub fn pull_shards(&self, keys: &[ShardKey]) -> Result<Vec<f32>, PsError> {
        self.pull_shard_rows(keys, &[])
    }

    /// The rows `rows` names of several shards (empty: every row of each), one shard after
    /// another in the order of `keys`.
    ///
    /// # Errors
    ///
    /// An unknown shard, a row outside its shard, a `rows` of another length than `keys`, or
    /// an answer over one frame.
    pub fn pull_shard_rows(&self, keys: &[ShardKey], rows: &[Rows]) -> Result<Vec<f32>, PsError> {
        let selections = selections(keys, rows)?;
        let mut values = Vec::new();
        for (key, selection) in keys.iter().zip(selections) {
            let shard = self.get(key)?;
            let shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            let len = selection.map_or(shard.values.len(), |rows| {
                rows.len().saturating_mul(shard.cols)
            });
            // The answer must fit one frame: checked before anything is allocated for it.
            if values.len().saturating_add(len) > crate::protocol::MAX_FRAME / size_of::<f32>() {
                return Err(refused(key, "the shards asked for are over one frame"));
            }
            match selection {
                None => values.extend_from_slice(&shard.values),
                Some(rows) => {
                    let cols = shard.cols;
                    for &row in rows {
                        let row = shard.row(key, row)?;
                        values.extend_from_slice(&shard.values[row * cols..(row + 1) * cols]);
                    }
                }
            }
        }
        Ok(values)
    }

    /// Applies the gradients of several whole shards, one after another in the order of
    /// `keys`; returns how many it applied. Every shard and the total length are checked
    /// first: a request that does not fit changes nothing.
    ///
    /// # Errors
    ///
    /// An unknown shard, a total length that is not the shards', or an optimizer's error
    /// (the shards before it have been updated then).
    pub fn push_shards(&self, keys: &[ShardKey], gradient: &[f32]) -> Result<u64, PsError> {
        self.push_shard_rows(keys, &[], gradient, None)
    }

    /// [`ShardStore::push_shards`] of the rows `rows` names of each shard (empty: every row
    /// of each); rows named more than once have their gradients summed. With a `step`, a push
    /// of a step this store took a push of already is answered with 0 and not applied: each
    /// step moves the shards of one store once. A push refused whole (it does not fit) does
    /// not count as the step's.
    ///
    /// # Errors
    ///
    /// As [`ShardStore::push_shards`]; a row outside its shard or a `rows` of another length
    /// than `keys` (nothing is applied then).
    pub fn push_shard_rows(
        &self,
        keys: &[ShardKey],
        rows: &[Rows],
        gradient: &[f32],
        step: Option<StepId>,
    ) -> Result<u64, PsError> {
        let selections = selections(keys, rows)?;
        let shards = keys
            .iter()
            .map(|key| self.get(key))
            .collect::<Result<Vec<_>, _>>()?;
        let mut lengths = Vec::with_capacity(keys.len());
        for ((key, shard), selection) in keys.iter().zip(&shards).zip(&selections) {
            let shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            lengths.push(match selection {
                None => shard.values.len(),
                Some(rows) => {
                    for &row in *rows {
                        shard.row(key, row)?;
                    }
                    rows.len().saturating_mul(shard.cols)
                }
            });
        }
        let total = lengths.iter().fold(0_usize, |a, &b| a.saturating_add(b));
        if total != gradient.len() {
            return Err(refused_all(
                keys,
                format!(
                    "a gradient of {} values for shards of {total}",
                    gradient.len()
                ),
            ));
        }
        // Claimed once the push is known to fit and before anything is applied: a repeat
        // arriving meanwhile is not applied, and a step whose push failed part way (an
        // optimizer's error) stays claimed, so that no shard takes its gradient twice.
        if let Some(step) = step
            && !self.applied().claim(step)
        {
            tracing::info!(
                run = step.run,
                step = step.number,
                "a repeated step's push was not applied"
            );
            return Ok(0);
        }
        let mut at = 0;
        for (((key, shard), len), selection) in
            keys.iter().zip(&shards).zip(lengths).zip(selections)
        {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            let part = &gradient[at..at + len];
            match selection {
                None => shard.push(key, part)?,
                Some(rows) => shard.push_rows(key, rows, part)?,
            };
            self.updates.fetch_add(1, Ordering::Relaxed);
            at += len;
        }
        Ok(keys.len() as u64)
    }

    fn applied(&self) -> std::sync::MutexGuard<'_, AppliedSteps> {
        self.applied.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Gradients applied since the store was made, over every shard.
    pub fn updates(&self) -> u64 {
        self.updates.load(Ordering::Relaxed)
    }

    /// Every shard whole, ordered by key.
    ///
    /// # Errors
    ///
    /// An optimizer whose settings cannot be written (never for lockstep-nn's).
    pub fn export(&self) -> Result<Vec<ShardState>, PsError> {
        let shards = self.shards.read().unwrap_or_else(PoisonError::into_inner);
        let mut keys: Vec<&ShardKey> = shards.keys().collect();
        keys.sort();
        keys.into_iter()
            .map(|key| {
                let shard = shards[key].lock().unwrap_or_else(PoisonError::into_inner);
                shard.state(key)
            })
            .collect()
    }

    /// Replaces every shard with `states` (all checked first: on an error nothing changes).
    ///
    /// # Errors
    ///
    /// A state that does not hold together, or two states of one shard.
    pub fn import(&self, states: &[ShardState]) -> Result<(), PsError> {
        let mut fresh = HashMap::with_capacity(states.len());
        for state in states {
            let key = state.key.clone().unwrap_or_default();
            let shard = Shard::from_state(&key, state)?;
            if fresh
                .insert(key.clone(), Arc::new(Mutex::new(shard)))
                .is_some()
            {
                return Err(refused(&key, "named twice in one import"));
            }
        }
        *self.shards.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(key: &ShardKey, rows: u64, cols: u64, optimizer: &OptimizerConfig) -> ShardState {
        ShardState {
            key: Some(key.clone()),
            rows,
            cols,
            values: (0..rows * cols).map(|v| v as f32 * 0.1).collect(),
            optimizer: serde_json::to_string(optimizer).unwrap(),
            iterations: 0,
            slots: Vec::new(),
        }
    }

    fn adagrad() -> OptimizerConfig {
        lockstep_nn::Adagrad::default().config()
    }

    fn adam() -> OptimizerConfig {
        lockstep_nn::Adam::default().config()
    }

    #[test]
    fn a_dense_push_moves_a_shard_as_the_optimizer_moves_the_variable() {
        let key = ShardKey::new("dense/kernel", 0);
        let store = ShardStore::new();
        let initial = state(&key, 3, 4, &adam());
        assert_eq!(store.create(&initial).unwrap(), (true, 0));
        let gradient: Vec<f32> = (0..12).map(|v| (v as f32 - 5.0) * 0.3).collect();
        let mut expected = initial.values.clone();
        let mut optimizer = adam().build();
        for step in 1..=3 {
            optimizer.apply(&mut expected, &gradient).unwrap();
            assert_eq!(store.push(&key, &gradient).unwrap(), step);
        }
        assert_eq!(store.pull(&key).unwrap(), expected);
    }

    #[test]
    fn a_sparse_push_updates_only_the_rows_named_with_repeats_summed() {
        let key = ShardKey::new("embedding/embeddings", 1);
        let store = ShardStore::new();
        let initial = state(&key, 5, 2, &adagrad());
        store.create(&initial).unwrap();
        // Row 3 twice, row 0 once: as a dense push of the summed rows onto rows 0 and 3.
        store
            .push_rows(&key, &[3, 0, 3], &[1.0, 2.0, 0.5, 0.5, 3.0, 4.0])
            .unwrap();
        let after = store.pull(&key).unwrap();
        let mut expected_rows = vec![
            initial.values[0],
            initial.values[1],
            initial.values[6],
            initial.values[7],
        ];
        let mut optimizer = adagrad().build();
        optimizer
            .apply(&mut expected_rows, &[0.5, 0.5, 4.0, 6.0])
            .unwrap();
        assert_eq!(&after[0..2], &expected_rows[0..2]);
        assert_eq!(&after[6..8], &expected_rows[2..4]);
        for untouched in [1, 2, 4] {
            assert_eq!(
                &after[untouched * 2..untouched * 2 + 2],
                &initial.values[untouched * 2..untouched * 2 + 2],
                "row {untouched}"
            );
        }
        assert_eq!(
            store.pull_rows(&key, &[3, 3]).unwrap(),
            [after[6], after[7], after[6], after[7]]
        );
    }

    #[test]
    fn bad_requests_are_refused_and_leave_the_shard_as_it_was() {
        let key = ShardKey::new("v", 0);
        let store = ShardStore::new();
        store.create(&state(&key, 2, 3, &adam())).unwrap();
        let before = store.pull(&key).unwrap();
        let refusals = [
            store.push(&key, &[1.0; 5]).unwrap_err(),
            store.push_rows(&key, &[2], &[1.0; 3]).unwrap_err(),
            store.push_rows(&key, &[0], &[1.0; 2]).unwrap_err(),
            store.pull_rows(&key, &[u64::MAX]).unwrap_err(),
            store.pull(&ShardKey::new("v", 1)).unwrap_err(),
            store.create(&state(&key, 3, 2, &adam())).unwrap_err(),
        ];
        for e in refusals {
            assert!(matches!(e, PsError::Request { .. }), "{e}");
        }
        let mut broken = state(&ShardKey::new("w", 0), 2, 2, &adam());
        broken.values.pop();
        assert!(store.create(&broken).is_err());
        // A count at its limit: the next update could not be counted (nor Adam's step).
        broken = state(&ShardKey::new("w", 0), 2, 2, &adam());
        broken.iterations = u64::MAX;
        assert!(matches!(
            store.create(&broken),
            Err(PsError::Request { .. })
        ));
        broken = state(&ShardKey::new("w", 0), 2, 2, &adam());
        broken.optimizer = "{\"class_name\": \"Nope\"}".into();
        assert!(matches!(
            store.create(&broken),
            Err(PsError::Optimizer { .. })
        ));
        assert_eq!(store.pull(&key).unwrap(), before);
    }

    #[test]
    fn an_export_imported_elsewhere_goes_on_exactly_as_the_original() {
        let key = ShardKey::new("embedding/embeddings", 0);
        let original = ShardStore::new();
        original.create(&state(&key, 4, 3, &adam())).unwrap();
        original.push_rows(&key, &[1, 2], &[0.1; 6]).unwrap();
        original.push(&key, &[0.2; 12]).unwrap();
        let copy = ShardStore::new();
        copy.import(&original.export().unwrap()).unwrap();
        for store in [&original, &copy] {
            store.push_rows(&key, &[0, 2], &[0.3; 6]).unwrap();
        }
        assert_eq!(original.export().unwrap(), copy.export().unwrap());
        // A second create keeps the trained values.
        assert_eq!(
            copy.create(&state(&key, 4, 3, &adam())).unwrap(),
            (false, 3)
        );
        assert_eq!(copy.pull(&key).unwrap(), original.pull(&key).unwrap());
    }

    #[test]
    fn a_shard_that_keeps_its_optimizer_moves_as_one_rebuilt_from_its_slots_at_every_push() {
        // The reference is exported and imported again before each push, so each of its
        // pushes starts from plain slots, as every push did when a shard kept no optimizer.
        let key = ShardKey::new("v", 0);
        let kept = ShardStore::new();
        kept.create(&state(&key, 4, 3, &adam())).unwrap();
        let mut rebuilt = ShardStore::new();
        rebuilt.import(&kept.export().unwrap()).unwrap();
        let gradient = |step: usize, len: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((i * 7 + step * 3) % 11) as f32 * 0.1 - 0.5)
                .collect()
        };
        // Dense pushes in a row, then the kinds alternating, then dense again.
        let pushes: [Option<&[u64]>; 7] = [
            None,
            None,
            Some(&[1, 3]),
            None,
            Some(&[0, 0, 2]),
            Some(&[3]),
            None,
        ];
        for (step, rows) in pushes.into_iter().enumerate() {
            for store in [&kept, &rebuilt] {
                match rows {
                    None => store.push(&key, &gradient(step, 12)).unwrap(),
                    Some(rows) => store
                        .push_rows(&key, rows, &gradient(step, rows.len() * 3))
                        .unwrap(),
                };
            }
            assert_eq!(
                kept.export().unwrap(),
                rebuilt.export().unwrap(),
                "push {step}"
            );
            let fresh = ShardStore::new();
            fresh.import(&rebuilt.export().unwrap()).unwrap();
            rebuilt = fresh;
        }
    }
}
