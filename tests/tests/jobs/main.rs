//! Jobs started the way users start them, which may share the machine with each other: clusters
//! through `cargo xtask run-cluster` or the `lockstep` launcher and their failures, restarts
//! and hostile peers (`collectives`, `failures`, `restarts`, `training`, `estimator`,
//! `parameter_server`, `run_cluster`), hosts joined by a lossy link (`impaired_link`),
//! deployments (`deploy`, `slurm`), a project outside the workspace (`outside_workspace`), and
//! the documentation's lists (`docs`, `gpu_check`).
//!
//! One test executable: while one test waits on a peer's timeout, a lossy link, a SLURM job or
//! a build, another runs. The tests that name a straggler need the machine to themselves (a
//! straggler shows only against workers no other job starves) and are executables of their
//! own: `multi_host.rs`, `scale.rs`, `stragglers.rs`.

mod collectives;
mod deploy;
mod docs;
mod estimator;
mod failures;
mod gpu_check;
mod impaired_link;
mod outside_workspace;
mod parameter_server;
mod restarts;
mod run_cluster;
mod slurm;
mod training;
mod uninterrupted;
