//! What the training tests share: a small slice of real MNIST and the guide's MLP.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "a test helper that meets an error must fail the test loudly"
)]
#![allow(
    dead_code,
    reason = "each test file uses its own part of these helpers"
)]

use std::net::{Ipv4Addr, TcpListener};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lockstep_cluster::{Cluster, TfConfig};
use lockstep_collective::{CommunicationOptions, TcpOptions, TcpTransport};

use lockstep_data::mnist::{Mnist, scale};
use lockstep_data::{Dataset, from_vec};
use lockstep_nn::{Adam, Sequential, SparseCategoricalCrossentropy, models};
use lockstep_testenv::Need;
use lockstep_train::{
    Callback, History, MirroredStrategy, Model, MultiWorkerMirroredStrategy, Strategy, TrainError,
    TrainingContext,
};
use ndarray::Array1;

pub(crate) const EXAMPLES: usize = 640;

pub(crate) fn loss() -> SparseCategoricalCrossentropy {
    SparseCategoricalCrossentropy {
        from_logits: true,
        ..Default::default()
    }
}

/// The first `EXAMPLES` training digits, scaled and flattened for the MLP.
pub(crate) fn digits() -> impl Dataset<Item = (Array1<f32>, u8)> {
    let mnist = Mnist::embedded().unwrap();
    let (x, y): (Vec<Array1<f32>>, Vec<u8>) = mnist
        .train
        .dataset()
        .unwrap()
        .iter()
        .unwrap()
        .take(EXAMPLES)
        .map(|e| {
            let (x, y) = e.unwrap();
            let flat: Array1<f32> = scale(&x).into_iter().collect();
            (flat, y)
        })
        .unzip();
    from_vec(x.into_iter().zip(y).collect())
}

pub(crate) fn mlp() -> Result<Sequential, lockstep_nn::NnError> {
    models::mnist_mlp(3)
}

/// The MLP under `replicas` mirrored replicas, compiled with Adam for loss and accuracy.
pub(crate) fn compiled(replicas: usize) -> Model {
    let mut model = Model::new(MirroredStrategy::new(replicas).unwrap(), mlp).unwrap();
    model
        .compile(Adam::default(), loss(), &["accuracy"])
        .unwrap();
    model
}

/// The steps of the summary events in the one event file of `dir` (`TFRecord` framing;
/// each event's `step`, field 2, follows its `wall_time`, field 1).
pub(crate) fn event_steps(dir: &Path) -> Vec<u64> {
    let files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let bytes = std::fs::read(&files[0]).unwrap();
    let mut steps = Vec::new();
    let mut at = 0;
    while at + 12 <= bytes.len() {
        let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
        let data = &bytes[at + 12..at + 12 + len];
        at += 12 + len + 4;
        // wall_time: tag 0x09 + 8 bytes; step: tag 0x10 + varint (absent when 0).
        if data.get(9) != Some(&0x10) {
            continue;
        }
        let mut step = 0_u64;
        for (shift, byte) in data[10..].iter().enumerate() {
            step |= u64::from(byte & 0x7f) << (7 * shift);
            if byte & 0x80 == 0 {
                break;
            }
        }
        steps.push(step);
    }
    steps
}

/// A cluster of `n` workers on 127.0.0.1 with `replicas` replicas each, formed on threads;
/// runs `body` with each worker's strategy and returns the results in rank order.
pub(crate) fn workers<R: Send + 'static>(
    n: usize,
    replicas: usize,
    body: fn(MultiWorkerMirroredStrategy) -> R,
) -> Vec<R> {
    workers_with(n, replicas, CommunicationOptions::default(), body)
}

/// [`workers`] whose collectives run with `communication`.
#[allow(dead_code, reason = "not every test binary uses every helper")]
pub(crate) fn workers_with<R, F>(
    n: usize,
    replicas: usize,
    communication: CommunicationOptions,
    body: F,
) -> Vec<R>
where
    R: Send + 'static,
    F: Fn(MultiWorkerMirroredStrategy) -> R + Clone + Send + 'static,
{
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let identity = (u64::from(std::process::id()) << 32) | NEXT.fetch_add(1, Ordering::Relaxed);
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap())
        .collect();
    let addresses: Vec<String> = listeners
        .iter()
        .map(|l| l.local_addr().unwrap().to_string())
        .collect();
    let handles: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(rank, listener)| {
            let addresses = addresses.clone();
            let body = body.clone();
            std::thread::spawn(move || {
                let json = format!(
                    r#"{{"cluster": {{"worker": {addresses:?}}}, "task": {{"type": "worker", "index": {rank}}}}}"#
                );
                let cluster = Cluster::new(TfConfig::parse(&json).unwrap()).unwrap();
                let options = TcpOptions {
                    cluster: identity,
                    rendezvous_timeout: Duration::from_secs(30),
                    ..TcpOptions::default()
                };
                let transport =
                    TcpTransport::connect_on(listener, rank, &addresses, &options).unwrap();
                let strategy = MultiWorkerMirroredStrategy::from_transport(
                    &cluster,
                    transport,
                    communication,
                    replicas,
                )
                .unwrap();
                body(strategy)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Fails training with an error after `at` steps, as a crash would stop it.
pub(crate) struct CrashAt(pub(crate) u64);

impl Callback for CrashAt {
    fn on_train_batch_end(
        &mut self,
        _batch: u64,
        _logs: &lockstep_train::Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), TrainError> {
        if ctx.step() == self.0 {
            return Err(TrainError::Invalid {
                what: "test",
                why: "crashed on purpose".into(),
            });
        }
        Ok(())
    }
}

/// Three epochs of `train` at global batch 64 with a backup every 4 steps in `dir`, crashed at
/// step 17 (mid-epoch, after the backup of step 16), then run again to the end from that
/// backup: the resumed run's weights and history.
pub(crate) fn crash_and_resume<S: Strategy>(
    strategy: impl Fn() -> S,
    dir: &Path,
) -> (Vec<f32>, History) {
    crash_and_resume_at(strategy, dir, 4, 17)
}

/// [`crash_and_resume`] with a backup every `every` steps and the crash at step `crash`.
pub(crate) fn crash_and_resume_at<S: Strategy>(
    strategy: impl Fn() -> S,
    dir: &Path,
    every: u64,
    crash: u64,
) -> (Vec<f32>, History) {
    let backup = || {
        lockstep_train::BackupAndRestore::new(dir.join("backup"))
            .save_freq(lockstep_train::SaveFreq::Steps(every))
    };
    let err = train(
        strategy(),
        64,
        3,
        vec![Box::new(backup()), Box::new(CrashAt(crash))],
    )
    .unwrap_err();
    assert!(err.to_string().contains("crashed on purpose"), "{err}");
    train(strategy(), 64, 3, vec![Box::new(backup())]).unwrap()
}

/// GPU 0, or `None` after a skip that the log shows: GPU tests skip without one, unless
/// `LOCKSTEP_REQUIRE_GPU=1` makes that a failure.
#[track_caller]
pub(crate) fn gpu() -> Option<lockstep_tensor::Device> {
    use lockstep_tensor::{Device, Tensor};
    let found = Tensor::scalar(0.0).to_device(Device::Cuda(0));
    lockstep_testenv::available(Need::Gpu, found).map(|_| Device::Cuda(0))
}

/// Whether this machine has two GPUs (a skip that the log shows where not).
#[track_caller]
pub(crate) fn two_gpus() -> bool {
    if gpu().is_none() {
        return false;
    }
    let count = lockstep_cuda::device_count().unwrap_or(0);
    if count < 2 {
        lockstep_testenv::skip(Need::TwoGpus, format!("this machine has {count}"));
    }
    count >= 2
}

/// Trains the MLP under `strategy` for `epochs` with `global_batch`, with the callbacks.
pub(crate) fn train(
    strategy: impl Strategy,
    global_batch: usize,
    epochs: u64,
    callbacks: Vec<Box<dyn Callback>>,
) -> Result<(Vec<f32>, History), TrainError> {
    let mut model = Model::new(strategy, mlp)?;
    model.compile(Adam::default(), loss(), &["accuracy"])?;
    let data = model.distribute_dataset(digits(), global_batch)?;
    let mut fit = model.fit(&data).epochs(epochs).verbose(false);
    for callback in callbacks {
        fit = fit.callback(callback);
    }
    let history = fit.run()?;
    Ok((model.network().parameters().values().to_vec(), history))
}
