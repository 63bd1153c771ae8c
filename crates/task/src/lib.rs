//! What the `main` of every Lockstep training program does before it trains: its logs, its
//! kernel threads, its cluster (from `TF_CONFIG`, SLURM or Kubernetes) and the standard flags
//! that configure them, and a private directory for default state.
//!
//! ```no_run
//! use clap::Parser;
//! use lockstep_task::{ClusterArgs, ClusterTrainingArgs};
//!
//! #[derive(Parser)]
//! struct Args {
//!     #[command(flatten)]
//!     training: ClusterTrainingArgs,
//!     #[command(flatten)]
//!     cluster: ClusterArgs,
//! }
//!
//! lockstep_task::init_logging();
//! let args = Args::parse();
//! let cluster = args.cluster.resolve()?;
//! args.training.start_kernel_threads(cluster.group_tasks_on_this_host())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Dependencies: `clap` for the flags, `tracing-subscriber` for the log format, `rayon` for the
//! kernel threads, `rustix` to pin them to cores, `nix` for the user id of the private
//! directory, `thiserror` for errors, and the Lockstep crates the flags configure (cluster,
//! collective); none of the training crates, so a launcher can take it too.

mod cpus;
mod error;
mod flags;
mod logging;
mod state_dir;
mod threads;

pub use cpus::{CpuList, CpuListError, MAX_CPUS};
pub use error::TaskError;
pub use flags::{ClusterArgs, ClusterTrainingArgs, CommunicationArgs, KernelThreadArgs};
pub use logging::{colour_logs, init_logging};
pub use state_dir::private_state_dir;
pub use threads::{start_kernel_threads, start_kernel_threads_on};
