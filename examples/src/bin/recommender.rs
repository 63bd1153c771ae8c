//! A recommender trained asynchronously under `ParameterServerStrategy`, the kind of model the
//! strategy is for: one embedding table of users and items, of `--rows` rows (a million by
//! default), cut into `--shards` shards over the `ps` tasks, and a small network on top that
//! predicts a click from a (user, item) pair. A step fetches only the table rows its batch
//! names and sends back only their gradients; each `ps` task applies the optimizer to the
//! rows it holds.
//!
//! The clicks are generated: every user has a hidden taste and every item a hidden genre (one
//! of 8) and quality (good or not, half each). A user clicks an item 10% of the time, 40
//! points more when it is good and 40 more when it is of their taste; half the items a user
//! is shown are of their taste. Users are drawn with a long tail (a few are frequent, most
//! rare), items evenly. The model learns which items are good, and the tastes of the users it
//! sees often; `baseline_accuracy` is the share of the test split's most frequent label.
//!
//! ```text
//! $ cargo xtask run-cluster --example recommender --workers 2 --ps 2 --chief
//! [chief:0] Epoch 1/3 - 1000 steps - 0.2s - accuracy: 0.6177 - loss: 0.6560
//! [chief:0] Epoch 2/3 - 1000 steps - 0.1s - accuracy: 0.6860 - loss: 0.6209
//! [chief:0] Epoch 3/3 - 1000 steps - 0.2s - accuracy: 0.6943 - loss: 0.6166
//! [chief:0] test_accuracy=0.6999 baseline_accuracy=0.5234 rows=1048576 shards=4 steps=3000 examples=192000 examples_per_s=174718 ps_tasks=2 workers=2
//! ```
//!
//! (Stdout; the chief prints, and every task its `peak_rss_mib`. Steps are asynchronous, so the figures vary a little from run to
//! run; times and `examples_per_s` depend on the machine.)

use std::time::Instant;

use anyhow::Context as _;
use clap::Parser;
use lockstep_data::{Dataset, InputContext, from_vec};
use lockstep_examples::{ClusterArgs, ClusterTrainingArgs};
use lockstep_nn::{
    Activation, Adam, Dense, Embedding, Flatten, Layer, NnError, Optimizer, Sequential, Sgd,
    SparseCategoricalCrossentropy,
};
use lockstep_ps::FixedShardsPartitioner;
use lockstep_train::{
    ParameterServerModel, ParameterServerStrategy, PsRole, TrainError, serve_steps,
};
use ndarray::Array1;
use rand_core::{Rng as _, SeedableRng as _};
use rand_pcg::Pcg64Mcg;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Hidden tastes and genres.
const GENRES: u64 = 8;
/// The bit of an item's hidden traits that makes it a good one (half the items).
const GOOD: u64 = 1 << 20;

/// Train a click model with a sharded embedding table under `ParameterServerStrategy`
/// across the tasks of `TF_CONFIG` (a chief, workers and `ps` tasks).
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    training: ClusterTrainingArgs,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Rows of the embedding table: users and items together.
    #[arg(long, default_value_t = 1 << 20)]
    rows: usize,
    /// Of those, the items (the last rows).
    #[arg(long, default_value_t = 4096)]
    items: usize,
    /// Values of each row.
    #[arg(long, default_value_t = 16)]
    embedding_dim: usize,
    /// Shards of the table (`FixedShardsPartitioner`), placed on the `ps` tasks in turn.
    #[arg(long, default_value_t = 4)]
    shards: usize,
    /// Steps the chief schedules an epoch.
    #[arg(long, default_value_t = 1000)]
    steps_per_epoch: u64,
    /// Clicks each worker generates (and goes round).
    #[arg(long, default_value_t = 200_000)]
    examples_per_worker: usize,
    /// `adam` (the default) or `sgd`.
    #[arg(long, default_value = "adam", value_parser = ["adam", "sgd"])]
    optimizer: String,
    /// The optimizer's step size.
    #[arg(long, default_value_t = 0.005)]
    learning_rate: f32,
}

fn loss() -> SparseCategoricalCrossentropy {
    SparseCategoricalCrossentropy {
        from_logits: true,
        ..Default::default()
    }
}

fn main() -> anyhow::Result<()> {
    lockstep_examples::init_logging();
    lockstep_examples::keep_freed_memory_mapped();
    let args = Args::parse();
    if args.rows > Embedding::MAX_IDS {
        anyhow::bail!(
            "--rows must be at most {}: ids are held as f32, exact up to 2^24",
            Embedding::MAX_IDS
        );
    }
    if args.items == 0 || args.items >= args.rows {
        anyhow::bail!(
            "--items must be at least 1 and below --rows ({}): the other rows are users",
            args.rows
        );
    }
    let clicks = Clicks {
        users: (args.rows - args.items) as u64,
        items: args.items as u64,
    };
    let strategy = lockstep_examples::parameter_server_strategy(&args.training, &args.cluster)?
        .with_partitioner(FixedShardsPartitioner::new(args.shards)?);
    let (seed, rows, dim) = (args.training.seed, args.rows, args.embedding_dim);
    let build = move || -> Result<Sequential, NnError> {
        let layers: Vec<Box<dyn Layer>> = vec![
            Box::new(Embedding::new(rows, dim)),
            Box::new(Flatten),
            Box::new(Dense::new(64).activation(Activation::Relu)),
            Box::new(Dense::new(2)),
        ];
        Sequential::new(&[2], layers, seed)
    };
    let role = strategy.role()?;
    match role {
        PsRole::ParameterServer(_) => lockstep_examples::serve_parameters(&strategy)?,
        PsRole::Worker(index) => {
            let (count, batch) = (args.examples_per_worker, args.training.batch_per_worker);
            let dataset_fn = move |_: &InputContext| -> Result<_, TrainError> {
                // Each worker its own clicks: a stream of its own seed.
                let stream = seed.wrapping_add(1 + index as u64);
                Ok(from_vec(clicks.generate(stream, count))
                    .batch(batch, false)
                    .repeat(None))
            };
            serve_steps(&strategy, build, loss(), &["accuracy"], dataset_fn)?;
        }
        PsRole::Coordinator => train(&args, clicks, strategy, build)?,
        PsRole::Evaluator => anyhow::bail!("this example has no evaluator task"),
    }
    if let Some(mib) = lockstep_examples::peak_rss_mib() {
        println!("peak_rss_mib={mib} role={role:?}");
    }
    Ok(())
}

/// The chief: compile, fit, evaluate on clicks no worker trained on, end the cluster's
/// training.
fn train(
    args: &Args,
    clicks: Clicks,
    strategy: ParameterServerStrategy,
    build: impl Fn() -> Result<Sequential, NnError>,
) -> anyhow::Result<()> {
    let (workers, ps) = (strategy.num_workers(), strategy.num_ps());
    let mut model = ParameterServerModel::new(strategy, build)?;
    let optimizer: Box<dyn Optimizer> = match args.optimizer.as_str() {
        "sgd" => Box::new(Sgd::new(args.learning_rate)),
        _ => Box::new(Adam::new(args.learning_rate)),
    };
    model.compile(&*optimizer, loss(), &["accuracy"])?;
    let started = Instant::now();
    let history = match model.fit(args.training.epochs, args.steps_per_epoch, true) {
        Ok(history) => history,
        Err(e) => {
            if let Err(also) = model.shutdown_cluster() {
                eprintln!("ending the cluster's training after the failure: {also}");
            }
            return Err(e).context("training");
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    // Stream `seed` is no worker's: theirs are `seed + 1 + index`.
    let test = clicks.generate(args.training.seed, 20_000);
    let ones = test.iter().filter(|(_, label)| *label == 1).count();
    let baseline = ones.max(test.len() - ones) as f64 / test.len() as f64;
    let logs = model.evaluate(&from_vec(test).batch(1024, false))?;
    println!(
        "test_accuracy={:.4} baseline_accuracy={baseline:.4} rows={} shards={} steps={} \
         examples={} examples_per_s={:.0} ps_tasks={ps} workers={workers}",
        logs.get("accuracy").unwrap_or(f64::NAN),
        args.rows,
        args.shards,
        history.steps,
        history.examples,
        history.examples as f64 / seconds
    );
    model.shutdown_cluster()?;
    Ok(())
}

/// The generated clicks: users are rows `0..users`, items the `items` rows after them.
#[derive(Debug, Clone, Copy)]
struct Clicks {
    users: u64,
    items: u64,
}

impl Clicks {
    /// `count` examples of stream `stream`: `([user row, item row], clicked)`.
    fn generate(self, stream: u64, count: usize) -> Vec<(Array1<f32>, u8)> {
        let mut random = Draws(Pcg64Mcg::seed_from_u64(stream));
        let mut by_genre = vec![Vec::new(); GENRES as usize];
        for item in 0..self.items {
            by_genre[(hidden(self.users + item) % GENRES) as usize].push(item);
        }
        (0..count)
            .map(|_| {
                // A long tail: the cube of a uniform draw puts most draws on the first users.
                let u = random.unit();
                let user = ((u * u * u * self.users as f64) as u64).min(self.users - 1);
                let taste = hidden(user) % GENRES;
                let of_taste = &by_genre[taste as usize];
                let item = if random.unit() < 0.5 && !of_taste.is_empty() {
                    // An item of the user's taste (when there is one).
                    of_taste[random.below(of_taste.len() as u64) as usize]
                } else {
                    random.below(self.items)
                };
                let traits = hidden(self.users + item);
                let liked = traits % GENRES == taste;
                let good = traits & GOOD != 0;
                let chance =
                    0.1 + 0.4 * f64::from(u8::from(good)) + 0.4 * f64::from(u8::from(liked));
                let clicked = random.unit() < chance;
                let ids = Array1::from(vec![user as f32, (self.users + item) as f32]);
                (ids, u8::from(clicked))
            })
            .collect()
    }
}

/// A row's hidden traits: a hash of its index.
fn hidden(row: u64) -> u64 {
    Pcg64Mcg::seed_from_u64(row).next_u64() >> 7
}

/// Uniform draws from `rand_pcg`'s generator.
struct Draws(Pcg64Mcg);

impl Draws {
    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 / (1_u64 << 53) as f64
    }

    /// Uniform in `0..n` (`n` at least 1).
    fn below(&mut self, n: u64) -> u64 {
        ((self.unit() * n as f64) as u64).min(n - 1)
    }
}
