//! A worker under `ParameterServerStrategy`: the steps it serves, and the state they run on.

use std::sync::atomic::AtomicBool;

use lockstep_data::{Dataset, InputContext};
use lockstep_nn::{Embedding, ForwardContext, Loss, Network, NnError};
use lockstep_ps::{PsClient, StepId, StepRegistry, StepServer};
use lockstep_tensor::Tensor;

use super::variables::{ShardedVariables, TableRows};
use super::{ParameterServerStrategy, PsRole};
use crate::batch::{LabeledBatch, LabeledParts};
use crate::error::TrainError;
use crate::kill_switch::KillSwitch;
use crate::model::metrics_named;
use crate::replica::Objective;

/// The registered name of the training step every worker serves: pull the variables, one
/// batch of the worker's dataset forward and backward, push the gradients. Its arguments are
/// empty or the step's [`StepId`] (its run and number, two little-endian `u64`s), with which
/// each `ps` task applies the step's push once however often the step runs. Its output is the
/// batch's totals (loss sum, examples, 0 where `fit`'s step counts the replicas with more
/// data, each metric's state), `f64`s in little-endian bytes.
pub const TRAIN_STEP: &str = "lockstep.train_step";

/// [`TRAIN_STEP`]'s arguments for step `id`.
pub(crate) fn step_args(id: StepId) -> Vec<u8> {
    [id.run.to_le_bytes(), id.number.to_le_bytes()].concat()
}

/// The [`StepId`] in [`TRAIN_STEP`]'s arguments: `None` for none.
fn step_id(args: &[u8]) -> Result<Option<StepId>, TrainError> {
    if args.is_empty() {
        return Ok(None);
    }
    if args.len() != 16 {
        return Err(TrainError::invalid(
            "a training step",
            format!("arguments of {} bytes: a step id takes 16", args.len()),
        ));
    }
    let word = |at: usize| {
        let mut bytes = [0; 8];
        bytes.copy_from_slice(&args[at..at + 8]);
        u64::from_le_bytes(bytes)
    };
    Ok(Some(StepId {
        run: word(0),
        number: word(8),
    }))
}

/// What a worker's steps run on.
pub(crate) struct WorkerState {
    net: Network,
    loss: Box<dyn Loss>,
    metrics: Vec<Box<dyn lockstep_nn::PredictionMetric>>,
    variables: ShardedVariables,
    clients: Vec<PsClient>,
    batches: Box<dyn Iterator<Item = Result<LabeledParts, TrainError>> + Send>,
    gradients: Vec<f32>,
    /// The embedding tables whose looked-up rows alone travel.
    lookups: Lookups,
    steps: u64,
    /// `--kill worker:N@STEP` and `--slow`: after this worker's own step STEP.
    kill_switch: KillSwitch,
}

/// Serves this worker's steps until the chief says training is over: builds the model with `build` (as the
/// chief builds it), connects to every `ps` task, makes its dataset with `dataset_fn` from its
/// [`InputContext`] (pipeline `index` of the workers), and runs each step the coordinator
/// sends ([`TRAIN_STEP`]).
///
/// # Errors
///
/// When this task is not a worker, the model cannot be built, a `ps` task does not answer
/// within the strategy's timeout, or the dataset cannot be made.
pub fn serve_steps<N, D, F>(
    strategy: &ParameterServerStrategy,
    build: impl Fn() -> Result<N, NnError>,
    loss: impl Loss + 'static,
    metrics: &[&str],
    dataset_fn: F,
) -> Result<(), TrainError>
where
    N: Into<Network>,
    F: Fn(&InputContext) -> Result<D, TrainError>,
    D: Dataset,
    D::Item: LabeledBatch,
{
    let PsRole::Worker(index) = strategy.role()? else {
        return Err(TrainError::invalid(
            "serve_steps",
            "only a worker serves steps",
        ));
    };
    let address = strategy.own_address()?;
    // Listen first: the coordinator may try this worker while it connects to the ps tasks.
    let listener = lockstep_collective::task_listener(&address)?;
    // Every value is pulled before a step reads it: the worker's model holds zeros, and the
    // pages of a table it only looks rows up in are never touched.
    let (net, variables, clients) =
        strategy.build_sharded(|| lockstep_nn::without_initial_values(&build))?;
    let context = InputContext::new(strategy.num_workers(), index, strategy.num_workers())?;
    let dataset = dataset_fn(&context)?;
    let batches = dataset.iter()?.map(|item| {
        item.map_err(TrainError::from)
            .and_then(LabeledBatch::into_parts)
    });
    // Never written where a table's rows travel alone: those pages are never touched.
    let gradients = vec![0.0; net.parameters().len()];
    let lookups = Lookups::of(&net);
    let mut state = WorkerState {
        net,
        loss: Box::new(loss),
        metrics: metrics_named(metrics)?,
        variables,
        clients,
        batches: Box::new(batches),
        gradients,
        lookups,
        steps: 0,
        kill_switch: KillSwitch::from_env()?,
    };
    // Each step runs on a thread of the worker's own kernel pool (`kernel_threads`): its
    // kernels then run there, not handed one by one to rayon's threads from this one.
    let kernels = crate::kernel_threads::own_pool();
    let registry =
        StepRegistry::new().with(TRAIN_STEP, move |state: &mut WorkerState, args: &[u8]| {
            let mut step = move || step_id(args).and_then(|id| train_step(state, id));
            match &kernels {
                Some(kernels) => kernels.pool.install(step),
                None => step(),
            }
            .map_err(|e| e.to_string())
        });
    tracing::info!(index, %address, "serving steps");
    StepServer::new(registry, strategy.secret().cloned()).serve(
        &listener,
        &mut state,
        &AtomicBool::new(false),
    )?;
    tracing::info!(index, steps = state.steps, "served steps");
    Ok(())
}

/// One training step on this worker: the newest variables, one batch, the gradient of its
/// mean loss to the `ps` tasks. Of an embedding table read from the input, only the rows the
/// batch names travel, each way ([`TableRows`]).
fn train_step(state: &mut WorkerState, id: Option<StepId>) -> Result<Vec<u8>, TrainError> {
    let parts = state.batches.next().ok_or_else(|| {
        TrainError::invalid(
            "the per-worker dataset",
            "it ran out: repeat it (`repeat(None)`), as TensorFlow's dataset functions do",
        )
    })??;
    let (inputs, mut tables) = state.lookups.renumber(&state.net, &parts.inputs)?;
    state.variables.pull_rows(
        &mut state.clients,
        state.net.parameters_mut().values_mut(),
        &mut tables,
    )?;
    let objective = Objective {
        loss: &*state.loss,
        metrics: &state.metrics,
        more_data: false,
    };
    let ctx = ForwardContext::training(state.steps, 0);
    let compact = tables
        .iter_mut()
        .map(|t| {
            let rows = t.ids.len();
            Tensor::from_vec(std::mem::take(&mut t.values), &[rows, t.cols])
                .map(|table| (t.variable, table))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let forward = state.net.forward_with_rows(&[inputs], ctx, compact)?;
    let (summed, totals) = objective.measure(&forward.output, &parts)?;
    let grads = summed.backward()?;
    state
        .net
        .gradients(&forward, &grads, &mut state.gradients)?;
    for table in &mut tables {
        table.gradient = match forward.variable(table.variable).and_then(|v| grads.get(v)) {
            Some(g) => g.to_vec()?,
            None => vec![0.0; table.ids.len() * table.cols],
        };
    }
    let examples = totals.get(1).copied().unwrap_or(0.0);
    if examples > 0.0 {
        let scale = (1.0 / examples) as f32;
        state
            .variables
            .push_rows(&mut state.clients, (&state.gradients, scale), &tables, id)?;
    }
    state.steps += 1;
    // A kill here lands after the gradients were pushed and before the coordinator hears
    // of the step: the step runs again elsewhere, and its second push is not applied.
    state.kill_switch.after_step(state.steps);
    Ok(super::model::encode_totals(&totals))
}

/// The model's embedding tables that read their ids from its input
/// ([`Network::row_lookups`]): a step pulls and pushes only the rows its batch names.
pub(crate) struct Lookups {
    /// `(variable, rows, cols)` of each table.
    tables: Vec<(usize, usize, usize)>,
}

impl Lookups {
    /// The row lookups of `net`, a model of one input.
    pub(crate) fn of(net: &Network) -> Self {
        let specs = net.parameters().specs();
        Self {
            tables: net
                .row_lookups()
                .into_iter()
                .filter(|l| l.input == 0)
                .filter_map(|l| {
                    let spec = specs.get(l.variable)?;
                    let rows = *spec.shape.first()?;
                    Some((l.variable, rows, spec.len().checked_div(rows)?))
                })
                .collect(),
        }
    }

    /// The batch's `inputs` with their ids renumbered into the compact tables of the rows
    /// they name, and those tables (to be pulled); `inputs` itself without tables.
    ///
    /// # Errors
    ///
    /// An input value that is not an id of the table (negative, fractional, past its rows).
    fn renumber(
        &self,
        net: &Network,
        inputs: &Tensor,
    ) -> Result<(Tensor, Vec<TableRows>), TrainError> {
        // One input read by one table: `row_lookups` names an input no other layer reads.
        let Some(&(variable, rows, cols)) = self.tables.first() else {
            return Ok((inputs.clone(), Vec::new()));
        };
        let ids = Embedding::ids(&inputs.to_vec()?, rows).map_err(|v| {
            TrainError::invalid(
                "an embedding lookup",
                format!(
                    "input {v} is not an id of {}, a table of {rows} rows",
                    net.parameters().specs()[variable].name
                ),
            )
        })?;
        let mut unique = ids.clone();
        unique.sort_unstable();
        unique.dedup();
        let renumbered: Vec<f32> = ids
            .iter()
            .map(|id| unique.partition_point(|u| u < id) as f32)
            .collect();
        let table = TableRows {
            variable,
            cols,
            ids: unique,
            values: Vec::new(),
            gradient: Vec::new(),
        };
        Ok((Tensor::from_vec(renumbered, inputs.shape())?, vec![table]))
    }
}
