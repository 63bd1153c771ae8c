//! The Estimator: `model_fn` specs, `train` with a persistent global step and checkpoints,
//! `evaluate`, `predict`, `train_and_evaluate` with and without an evaluator task.

#![allow(
    clippy::unwrap_used,
    reason = "a test that meets an error must fail loudly"
)]

mod common;

use std::path::Path;

use common::{EXAMPLES, digits, event_steps, gpu, mlp};
use lockstep_checkpoint::CheckpointManager;
use lockstep_cluster::{Cluster, TfConfig};
use lockstep_collective::CommunicationOptions;
use lockstep_data::{Dataset, InputContext};
use lockstep_nn::{Reduction, Sgd, SparseCategoricalAccuracy, SparseCategoricalCrossentropy};
use lockstep_tensor::Tensor;
use lockstep_tensor::ops::scale;
use lockstep_train::{
    Estimator, EstimatorSpec, EvalSpec, MirroredStrategy, ModeKeys, Params, RunConfig, TrainError,
    TrainSpec, Variables, train_and_evaluate,
};

const BATCH: usize = 32;

/// The tutorial's `model_fn` on the guide's MLP: the summed loss times 1/global batch.
fn model_fn(
    features: &Tensor,
    labels: Option<&[usize]>,
    mode: ModeKeys,
    _params: &Params,
    variables: &mut Variables<'_>,
) -> Result<EstimatorSpec, TrainError> {
    let logits = variables.apply(mlp, features)?;
    if mode == ModeKeys::Predict {
        return Ok(EstimatorSpec::predict(logits));
    }
    let labels = labels.unwrap_or_default();
    let loss_fn = SparseCategoricalCrossentropy {
        from_logits: true,
        reduction: Reduction::Sum,
    };
    let loss = scale(&loss_fn.call(&logits, labels)?, 1.0 / BATCH as f32)?;
    if mode == ModeKeys::Train {
        return Ok(EstimatorSpec::train(loss, Sgd::new(0.05)));
    }
    let mut accuracy = SparseCategoricalAccuracy::default();
    accuracy.update(&logits, labels)?;
    Ok(EstimatorSpec::eval(loss).eval_metric_op("accuracy", accuracy))
}

/// `input_fn`: the digits sharded by worker, repeated for training, in batches of `BATCH`.
fn input_fn(
    mode: ModeKeys,
    context: &InputContext,
) -> Result<impl Dataset<Item = (ndarray::Array2<f32>, ndarray::Array1<u8>)> + use<>, TrainError> {
    let passes = (mode != ModeKeys::Train).then_some(1);
    Ok(digits()
        .shard(context.num_input_pipelines, context.input_pipeline_id)?
        .repeat(passes)
        .batch(BATCH, false))
}

fn estimator(dir: &Path) -> Estimator {
    Estimator::new(model_fn, RunConfig::new(dir).save_checkpoints_steps(10))
}

fn weights(estimator: &mut Estimator) -> Vec<f32> {
    let checkpoint = CheckpointManager::new(estimator.model_dir(), None)
        .unwrap()
        .latest()
        .unwrap()
        .unwrap();
    checkpoint
        .file("model")
        .unwrap()
        .iter()
        .flat_map(|t| t.values.clone())
        .collect()
}

#[test]
fn train_counts_a_global_step_that_a_new_estimator_resumes_from() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = estimator(dir.path());
    assert_eq!(first.train(input_fn, Some(15), None).unwrap(), 15);
    let manager = CheckpointManager::new(dir.path(), None).unwrap();
    assert_eq!(manager.steps().unwrap(), [10, 15]);

    let mut second = estimator(dir.path());
    assert_eq!(second.train(input_fn, None, Some(25)).unwrap(), 25);
    assert_eq!(manager.steps().unwrap(), [10, 15, 20, 25]);
    // Already at max_steps: nothing to do.
    assert_eq!(second.train(input_fn, None, Some(20)).unwrap(), 25);

    // 15 + 10 steps in two runs train as 25 steps in one when the input restarts alike.
    let resumed = weights(&mut second);
    let other = tempfile::tempdir().unwrap();
    let mut straight = estimator(other.path());
    straight.train(input_fn, Some(25), None).unwrap();
    assert_ne!(
        weights(&mut straight),
        resumed,
        "the input restarts at each train call"
    );
    assert_eq!(
        CheckpointManager::new(other.path(), None)
            .unwrap()
            .steps()
            .unwrap(),
        [10, 20, 25]
    );
}

#[test]
fn an_estimator_whose_replica_is_on_a_gpu_trains_and_evaluates_as_on_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let run = |strategy: MirroredStrategy| {
        let dir = tempfile::tempdir().unwrap();
        let config = RunConfig::new(dir.path()).train_distribute(strategy);
        let mut estimator = Estimator::new(model_fn, config);
        estimator.train(input_fn, Some(20), None).unwrap();
        let logs = estimator.evaluate(input_fn, None).unwrap();
        let predictions = estimator.predict(input_fn).unwrap();
        let first = predictions[0].host_data().unwrap().to_vec();
        (weights(&mut estimator), logs, first)
    };
    let on_gpu = MirroredStrategy::with_devices(&[gpu], CommunicationOptions::default()).unwrap();
    let (gpu_weights, gpu_logs, gpu_predictions) = run(on_gpu);
    let (cpu_weights, cpu_logs, cpu_predictions) = run(MirroredStrategy::new(1).unwrap());
    // Plain SGD for 20 steps: the two part by no more than their rounding.
    let largest = gpu_weights
        .iter()
        .zip(&cpu_weights)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0_f32, f32::max);
    assert!(largest < 1e-4, "weights differ by up to {largest}");
    let (a, b) = (gpu_logs.get("loss").unwrap(), cpu_logs.get("loss").unwrap());
    assert!(
        (a - b).abs() <= 1e-4 * b.abs(),
        "loss {a} on the GPU, {b} on the CPU"
    );
    assert_eq!(gpu_logs.get("global_step"), Some(20.0));
    for (a, b) in gpu_predictions.iter().zip(&cpu_predictions) {
        assert!(
            (a - b).abs() <= 1e-3 * b.abs().max(1.0),
            "prediction {a} vs {b}"
        );
    }
}

#[test]
fn training_lowers_the_loss_and_evaluate_reports_loss_metrics_and_global_step() {
    let dir = tempfile::tempdir().unwrap();
    let mut estimator = estimator(dir.path());
    estimator.train(input_fn, Some(1), None).unwrap();
    let before = estimator.evaluate(input_fn, None).unwrap();
    estimator.train(input_fn, Some(60), None).unwrap();
    let after = estimator.evaluate(input_fn, None).unwrap();
    assert_eq!(after.get("global_step"), Some(61.0));
    assert!(
        after.get("loss").unwrap() < before.get("loss").unwrap() * 0.8,
        "{before:?} {after:?}"
    );
    assert!(after.get("accuracy").unwrap() > 0.75, "{after:?}");
    let limited = estimator.evaluate(input_fn, Some(2)).unwrap();
    assert_ne!(limited.get("loss"), after.get("loss"));
    // The event file of training holds the loss.
    assert!(std::fs::read_dir(dir.path()).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("events.out.tfevents.")
    }));
}

#[test]
fn predict_yields_one_output_per_batch_from_the_newest_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut estimator = estimator(dir.path());
    let err = estimator.predict(input_fn).unwrap_err();
    assert!(
        err.to_string().contains("no intact checkpoint")
            || err.to_string().contains(&dir.path().display().to_string()),
        "{err}"
    );
    estimator.train(input_fn, Some(3), None).unwrap();
    let outputs = estimator.predict(input_fn).unwrap();
    assert_eq!(outputs.len(), EXAMPLES / BATCH);
    assert_eq!(outputs[0].shape(), [BATCH, 10]);
}

#[test]
fn mirrored_replicas_summing_gradients_train_as_one_replica_on_their_union() {
    // Two replicas × 16 examples with the loss scaled by 1/32 sum to the gradient of one
    // replica's 32 examples scaled by 1/32.
    let one = tempfile::tempdir().unwrap();
    let two = tempfile::tempdir().unwrap();
    let mut single = estimator(one.path());
    single.train(input_fn, Some(20), None).unwrap();
    let mut mirrored = Estimator::new(
        model_fn,
        RunConfig::new(two.path())
            .save_checkpoints_steps(10)
            .train_distribute(MirroredStrategy::new(2).unwrap()),
    );
    mirrored.train(input_fn, Some(20), None).unwrap();
    let (a, b) = (weights(&mut single), weights(&mut mirrored));
    let worst = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0_f32, f32::max);
    assert!(worst < 1e-4, "largest difference {worst}");
}

#[test]
fn a_model_fn_without_loss_or_predictions_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let no_loss =
        |x: &Tensor, _: Option<&[usize]>, _: ModeKeys, _: &Params, v: &mut Variables<'_>| {
            let logits = v.apply(mlp, x)?;
            Ok(EstimatorSpec::predict(logits))
        };
    let mut estimator = Estimator::new(no_loss, RunConfig::new(dir.path()));
    let err = estimator.train(input_fn, Some(1), None).unwrap_err();
    assert!(err.to_string().contains("no loss in TRAIN mode"), "{err}");

    let mut trained = self::estimator(dir.path());
    trained.train(input_fn, Some(1), None).unwrap();
    let no_predictions =
        |x: &Tensor, l: Option<&[usize]>, m: ModeKeys, p: &Params, v: &mut Variables<'_>| {
            let mut spec = model_fn(x, l, m, p, v)?;
            spec.predictions = None;
            Ok(spec)
        };
    let mut estimator = Estimator::new(no_predictions, RunConfig::new(dir.path()));
    let err = estimator.predict(input_fn).unwrap_err();
    assert!(
        err.to_string().contains("no predictions in PREDICT mode"),
        "{err}"
    );
    let err = trained.train(input_fn, Some(1), Some(5)).unwrap_err();
    assert!(err.to_string().contains("not both"), "{err}");
}

#[test]
fn without_an_evaluator_the_chief_evaluates_the_final_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut estimator = estimator(dir.path());
    let logs = train_and_evaluate(
        &mut estimator,
        &TrainSpec::new(input_fn, Some(12)),
        &EvalSpec::new(input_fn),
    )
    .unwrap()
    .unwrap();
    assert_eq!(logs.get("global_step"), Some(12.0));
    assert_eq!(logs, estimator.evaluate(input_fn, Some(100)).unwrap());
    assert_eq!(event_steps(&dir.path().join("eval")), [12]);
}

#[test]
fn the_evaluator_evaluates_each_new_checkpoint_once_until_max_steps() {
    let dir = tempfile::tempdir().unwrap();
    let json = r#"{"cluster": {"worker": ["localhost:1"], "evaluator": ["localhost:2"]}, "task": {"type": "%", "index": 0}}"#;
    let cluster =
        |task: &str| Cluster::new(TfConfig::parse(&json.replace('%', task)).unwrap()).unwrap();
    let evaluator_dir = dir.path().to_path_buf();
    let evaluator = std::thread::spawn(move || {
        let mut estimator = Estimator::new(
            model_fn,
            RunConfig::new(&evaluator_dir).cluster(cluster("evaluator")),
        );
        let mut eval_spec = EvalSpec::new(input_fn);
        eval_spec.name = Some("digits".into());
        eval_spec.start_delay_secs = 0;
        eval_spec.throttle_secs = 0;
        train_and_evaluate(
            &mut estimator,
            &TrainSpec::new(input_fn, Some(40)),
            &eval_spec,
        )
        .unwrap()
        .unwrap()
    });
    let mut trainer = Estimator::new(
        model_fn,
        RunConfig::new(dir.path())
            .save_checkpoints_steps(10)
            .cluster(cluster("worker")),
    );
    let none = train_and_evaluate(
        &mut trainer,
        &TrainSpec::new(input_fn, Some(40)),
        &EvalSpec::new(input_fn),
    )
    .unwrap();
    assert!(
        none.is_none(),
        "the worker leaves evaluation to the evaluator"
    );
    let logs = evaluator.join().unwrap();
    assert_eq!(logs.get("global_step"), Some(40.0));
    let mut fresh = Estimator::new(model_fn, RunConfig::new(dir.path()));
    assert_eq!(logs, fresh.evaluate(input_fn, Some(100)).unwrap());
    let steps = event_steps(&dir.path().join("eval_digits"));
    assert_eq!(steps.last(), Some(&40));
    assert!(
        steps.windows(2).all(|w| w[0] < w[1]),
        "each checkpoint at most once: {steps:?}"
    );
    assert!(
        steps.iter().all(|s| [10, 20, 30, 40].contains(s)),
        "{steps:?}"
    );
}

/// One pass over the digits, whatever the mode: training that ends before any `max_steps`.
fn one_pass(
    _mode: ModeKeys,
    context: &InputContext,
) -> Result<impl Dataset<Item = (ndarray::Array2<f32>, ndarray::Array1<u8>)> + use<>, TrainError> {
    Ok(digits()
        .shard(context.num_input_pipelines, context.input_pipeline_id)?
        .batch(BATCH, false))
}

#[test]
fn the_evaluator_stops_after_the_last_checkpoint_when_the_input_ends_before_max_steps() {
    let dir = tempfile::tempdir().unwrap();
    let json = r#"{"cluster": {"worker": ["localhost:1"], "evaluator": ["localhost:2"]}, "task": {"type": "%", "index": 0}}"#;
    let cluster =
        |task: &str| Cluster::new(TfConfig::parse(&json.replace('%', task)).unwrap()).unwrap();
    let evaluator_dir = dir.path().to_path_buf();
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut estimator = Estimator::new(
            model_fn,
            RunConfig::new(&evaluator_dir).cluster(cluster("evaluator")),
        );
        let mut eval_spec = EvalSpec::new(input_fn);
        eval_spec.start_delay_secs = 0;
        eval_spec.throttle_secs = 0;
        let logs = train_and_evaluate(
            &mut estimator,
            &TrainSpec::new(one_pass, Some(1_000)),
            &eval_spec,
        );
        let _ = done.send(logs.map(Option::unwrap_or_default));
    });
    let mut trainer = Estimator::new(
        model_fn,
        RunConfig::new(dir.path())
            .save_checkpoints_steps(4)
            .cluster(cluster("worker")),
    );
    train_and_evaluate(
        &mut trainer,
        &TrainSpec::new(one_pass, Some(1_000)),
        &EvalSpec::new(input_fn),
    )
    .unwrap();
    let steps = (EXAMPLES / BATCH) as f64;
    let logs = result
        .recv_timeout(std::time::Duration::from_mins(2))
        .expect("the evaluator returns instead of waiting for step 1000")
        .unwrap();
    assert_eq!(logs.get("global_step"), Some(steps));
}

#[test]
fn a_ps_task_under_train_and_evaluate_trains_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let json = r#"{"cluster": {"worker": ["localhost:1"], "ps": ["localhost:2"]}, "task": {"type": "ps", "index": 0}}"#;
    let cluster = Cluster::new(TfConfig::parse(json).unwrap()).unwrap();
    let model_dir = dir.path().join("model");
    let mut estimator = Estimator::new(model_fn, RunConfig::new(&model_dir).cluster(cluster));
    let result = train_and_evaluate(
        &mut estimator,
        &TrainSpec::new(input_fn, Some(10)),
        &EvalSpec::new(input_fn),
    )
    .unwrap();
    assert!(result.is_none());
    assert!(
        !model_dir.exists(),
        "a ps task wrote {:?}",
        std::fs::read_dir(&model_dir).map(Iterator::count)
    );
}

/// Set in a copy of this test binary that runs one scenario of
/// [`a_run_config_without_a_cluster_takes_the_environments_as_tensorflows_reads_tf_config`]
/// with `TF_CONFIG` in its environment: the scenario's name and a directory.
const ENVIRONMENT_CHILD: &str = "LOCKSTEP_TEST_RUN_CONFIG_CHILD";

/// In the child: `train_and_evaluate` with a `RunConfig` that names no cluster, as the
/// scenario expects; writes `ran` in the directory when its assertions held.
fn run_config_child(scenario: &str, dir: &Path) {
    let model_dir = dir.join("model");
    let mut estimator = Estimator::new(model_fn, RunConfig::new(&model_dir));
    let result = train_and_evaluate(
        &mut estimator,
        &TrainSpec::new(input_fn, Some(10)),
        &EvalSpec::new(input_fn),
    );
    if scenario == "ps" {
        assert!(result.unwrap().is_none());
    } else {
        let err = result.unwrap_err().to_string();
        assert!(err.contains("MultiWorkerMirroredStrategy"), "{err}");
        assert!(err.contains("worker:1"), "{err}");
    }
    assert!(
        !model_dir.exists(),
        "{scenario}: the task wrote its model_dir"
    );
    std::fs::write(dir.join("ran"), scenario).unwrap();
}

#[test]
fn a_run_config_without_a_cluster_takes_the_environments_as_tensorflows_reads_tf_config() {
    if let Ok(value) = std::env::var(ENVIRONMENT_CHILD) {
        let (scenario, dir) = value.split_once(':').unwrap();
        run_config_child(scenario, Path::new(dir));
        return;
    }
    let cluster = r#""cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"], "ps": ["127.0.0.1:3"]}"#;
    let tasks = [
        ("ps", r#"{"type": "ps", "index": 0}"#),
        ("worker", r#"{"type": "worker", "index": 1}"#),
    ];
    for (scenario, task) in tasks {
        let dir = tempfile::tempdir().unwrap();
        let tf_config = format!(r#"{{{cluster}, "task": {task}}}"#);
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "a_run_config_without_a_cluster_takes_the_environments_as_tensorflows_reads_tf_config",
            ])
            .env(
                ENVIRONMENT_CHILD,
                format!("{scenario}:{}", dir.path().display()),
            )
            .env("TF_CONFIG", &tf_config)
            .status()
            .unwrap();
        assert!(status.success(), "{scenario} with {tf_config}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("ran")).unwrap(),
            scenario
        );
    }
}
