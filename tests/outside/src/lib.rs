//! What both programs share: the command line, the model under the cluster's strategy, the
//! data, and the line each worker prints at the end.

use clap::Parser;
use lockstep_collective::CommunicationOptions;
use lockstep_data::Dataset;
use lockstep_data::mnist::{Mnist, scale};
use lockstep_task::{ClusterArgs, ClusterTrainingArgs};
use lockstep_train::{Model, MultiWorkerMirroredStrategy};
use ndarray::{Array1, Array3};

pub type Error = Box<dyn std::error::Error>;

#[derive(Parser)]
pub struct Args {
    #[command(flatten)]
    pub training: ClusterTrainingArgs,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Train on the first N digits of each epoch's order only (every training digit by
    /// default): a short run.
    #[arg(long, value_name = "N")]
    pub train_examples: Option<u64>,
}

/// The command line, the kernel threads, and the guide's MLP under
/// `MultiWorkerMirroredStrategy` on the cluster the launcher described.
pub fn start() -> Result<(Args, Model), Error> {
    lockstep_task::init_logging();
    let args = Args::parse();
    let cluster = args.cluster.resolve()?;
    args.training
        .start_kernel_threads(cluster.group_tasks_on_this_host())?;
    let strategy = MultiWorkerMirroredStrategy::with_transport_options(
        &cluster,
        CommunicationOptions::default(),
        1,
        &args.cluster.transport(),
    )?;
    let seed = args.training.seed;
    let model = Model::new(strategy, || lockstep_nn::models::mnist_mlp(seed))?;
    Ok((args, model))
}

/// The embedded MNIST digits, scaled and flattened, at most `limit` of them; the training
/// split shuffled each epoch.
pub fn digits(
    train: bool,
    seed: u64,
    limit: Option<u64>,
) -> Result<impl Dataset<Item = (Array1<f32>, u8)>, Error> {
    let mnist = Mnist::embedded()?;
    let flat = |(x, y): (Array3<u8>, u8)| (scale(&x).into_iter().collect::<Array1<f32>>(), y);
    let split = if train { mnist.train } else { mnist.test };
    let digits = split.dataset()?.shuffle(10_000, seed, train);
    Ok(digits.take(limit.unwrap_or(u64::MAX)).map(flat))
}

/// The line every worker prints: its test accuracy and a checksum of its weights.
pub fn report(model: &Model, accuracy: f64) {
    let checksum = model
        .network()
        .parameters()
        .values()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, v| {
            (h ^ u64::from(v.to_bits())).wrapping_mul(0x0100_0000_01b3)
        });
    println!("test_accuracy={accuracy:.4} weights_checksum={checksum:016x}");
}
