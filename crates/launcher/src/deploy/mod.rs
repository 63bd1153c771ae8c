//! `lockstep deploy k8s|slurm`: the files that run a Lockstep job on the engines users
//! already start processes with: the user's program (`-- PROGRAM ARGS`, a binary of their
//! crate) or one of the examples (`--example`, the default). Nothing here talks to a cluster: it writes manifests, a
//! container build file and a batch script for the user to apply, build and submit.
//!
//! Every artefact follows the same contract with the example binaries: the task finds its
//! cluster through `AutoResolver` (`TF_CONFIG` from Kubeflow's TFJob, the JobSet variables the
//! manifests pass down, or SLURM's), the chief keeps its `BackupAndRestore` state on storage
//! every task can reach, and a failed task restarts every task, a bounded number of times, so
//! training resumes from the backup as `lockstep run --restart-on-failure` does.

mod container;
mod kubernetes;
mod slurm;

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use clap::{Subcommand, ValueEnum};

/// Options of `lockstep deploy`.
#[derive(Debug, clap::Args)]
pub(crate) struct DeployArgs {
    #[command(subcommand)]
    target: Target,
}

#[derive(Debug, Subcommand)]
enum Target {
    /// Kubernetes: a JobSet, a Kubeflow Trainer v2 TrainJob with its TrainingRuntime, a legacy
    /// Kubeflow TFJob (Chief/Worker/Evaluator), each with its shared volume, and the
    /// Containerfile of the image they run.
    K8s(kubernetes::KubernetesArgs),
    /// SLURM: an sbatch script that starts one task per process with `srun` and the SLURM
    /// resolver, and restarts them all when one fails.
    Slurm(slurm::SlurmArgs),
}

/// Writes the artefacts `args` ask for.
pub(crate) fn run(args: &DeployArgs) -> anyhow::Result<()> {
    let (files, out) = match &args.target {
        Target::K8s(args) => (kubernetes::files(args)?, args.job.out_dir("k8s")),
        Target::Slurm(args) => (slurm::files(args)?, args.job.out_dir("slurm")),
    };
    write_files(&out, &files)
}

/// What every deployment shares: the job's name, what each task runs, and how failures are
/// survived.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct JobArgs {
    /// The job's name, which names its pods, volume and output (lower-case letters, digits
    /// and `-`, starting with a letter: a DNS label).
    #[arg(long, default_value = "lockstep-mnist")]
    name: String,
    /// The example every task runs, when no PROGRAM is given [default: mnist-keras].
    #[arg(long, value_enum)]
    example: Option<Trainer>,
    /// The port every task listens on (Kubernetes: 8888 by default; SLURM: one per job,
    /// derived from the job id, so jobs sharing a node do not collide).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    port: Option<u16>,
    /// When a task fails, start every task again, up to this many times in all; training
    /// resumes from the chief's backup.
    #[arg(long, value_name = "K", default_value_t = 3)]
    max_restarts: u32,
    /// How long a starting task waits for the others: pods and job steps start minutes apart
    /// when images are pulled or nodes are busy.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    rendezvous_timeout_secs: u64,
    /// Where to write the files (default: `target/deploy/k8s` or `target/deploy/slurm` under
    /// the current directory).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// After `--`: PROGRAM, a binary of your crate, and its arguments (`-- my_trainer --epochs
    /// 10`); or, with `--example` or when they begin with an option, the example's arguments
    /// (`-- --epochs 10`).
    #[arg(last = true, value_name = "PROGRAM [ARGS]")]
    trailing: Vec<String>,
}

/// The variable that tells a user's program where the job's shared storage is (the examples
/// are given flags instead).
pub(crate) const STATE_DIR_VARIABLE: &str = "LOCKSTEP_STATE_DIR";

/// What every task of a deployment runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Workload<'a> {
    /// One of the examples, with the flags that keep its state on shared storage.
    Example(Trainer, &'a [String]),
    /// The user's program, a binary of their crate, and its arguments as given; it finds its
    /// shared storage in `LOCKSTEP_STATE_DIR`.
    Program(&'a str, &'a [String]),
}

impl JobArgs {
    fn out_dir(&self, target: &str) -> PathBuf {
        self.out
            .clone()
            .unwrap_or_else(|| Path::new("target/deploy").join(target))
    }

    /// The example or the user's program.
    pub(crate) fn workload(&self) -> Workload<'_> {
        match (self.example, self.trailing.split_first()) {
            (None, Some((program, args))) if !program.starts_with('-') => {
                Workload::Program(program, args)
            }
            (example, _) => {
                Workload::Example(example.unwrap_or(Trainer::MnistKeras), &self.trailing)
            }
        }
    }

    /// The binary every task runs, checked to be a cargo binary name (it names a file in the
    /// image and under `target/release`, and the Containerfile builds it with `--bin`).
    pub(crate) fn binary(&self) -> anyhow::Result<&str> {
        let binary = match self.workload() {
            Workload::Example(trainer, _) => trainer.binary(),
            Workload::Program(program, _) => program,
        };
        let valid = !binary.is_empty()
            && binary
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            bail!(
                "PROGRAM {binary:?} is not a binary name of your crate (letters, digits, '_' and \
                 '-'): the image holds it under its name, and SLURM's nodes run it from \
                 target/release"
            );
        }
        Ok(binary)
    }

    /// The job's name, checked to be a DNS label (RFC 1035) as pod and service names must be.
    fn checked_name(&self) -> anyhow::Result<&str> {
        let name = self.name.as_str();
        let valid = name.len() <= DNS_LABEL_MAX
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && !name.ends_with('-')
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !valid {
            bail!(
                "--name {name:?} is not a DNS label: use at most {DNS_LABEL_MAX} lower-case \
                 letters, digits and '-', starting with a letter and not ending with '-'"
            );
        }
        Ok(name)
    }

    /// Every task's arguments. An example's: the deployment's own (unless the user gives the
    /// same flag), the flags that keep the task's state under `state_dir`, then the user's. A
    /// program's: its arguments as given.
    fn task_args(&self, state_dir: &str, evaluator: bool, threads: u32) -> Vec<String> {
        let (example, given) = match self.workload() {
            Workload::Program(_, args) => return args.to_vec(),
            Workload::Example(example, args) => (example, args),
        };
        let mut args = Vec::new();
        let mut default = |flag: &str, value: String| {
            let given = given
                .iter()
                .any(|a| a == flag || a.starts_with(&format!("{flag}=")));
            if !given {
                args.extend([flag.to_owned(), value]);
            }
        };
        default(
            "--rendezvous-timeout-secs",
            self.rendezvous_timeout_secs.to_string(),
        );
        default("--threads", threads.to_string());
        for (flag, value) in example.state_args(state_dir, evaluator) {
            default(flag, value);
        }
        args.extend(given.iter().cloned());
        args
    }
}

/// The longest DNS label: pod host names and service names must fit.
const DNS_LABEL_MAX: usize = 63;

/// Checks that the host name `host`, built from the job's name, is still a DNS label.
fn check_host_name(host: &str, what: &str) -> anyhow::Result<()> {
    if host.len() > DNS_LABEL_MAX {
        bail!(
            "the {what} host name {host:?} would be {} characters, over DNS's {DNS_LABEL_MAX}: \
             choose a shorter --name",
            host.len()
        );
    }
    Ok(())
}

/// The examples a deployment runs: the two that train with a chief that saves, so a restart
/// resumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Trainer {
    /// The Keras tutorial: `fit` with `BackupAndRestore` (an evaluator runs `SidecarEvaluator`).
    MnistKeras,
    /// The Estimator tutorial: `train_and_evaluate` (an evaluator evaluates each checkpoint).
    MnistEstimator,
}

impl Trainer {
    /// The binary's name.
    fn binary(self) -> &'static str {
        match self {
            Self::MnistKeras => "mnist_keras",
            Self::MnistEstimator => "mnist_estimator",
        }
    }

    /// The flags that put the chief's state under `dir`, where a restarted chief and the
    /// evaluator find it. `with_evaluator`: the chief also saves checkpoints for an evaluator.
    fn state_args(self, dir: &str, with_evaluator: bool) -> Vec<(&'static str, String)> {
        match self {
            Self::MnistKeras if with_evaluator => vec![
                ("--backup-dir", format!("{dir}/backup")),
                ("--checkpoint-dir", format!("{dir}/checkpoints")),
            ],
            Self::MnistKeras => vec![("--backup-dir", format!("{dir}/backup"))],
            Self::MnistEstimator => vec![("--model-dir", format!("{dir}/model"))],
        }
    }
}

/// A file to write: its name in the output folder and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Artefact {
    name: &'static str,
    text: String,
    /// Holds a secret: written readable by its owner only.
    private: bool,
}

fn write_files(out: &Path, files: &[Artefact]) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for file in files {
        let path = out.join(file.name);
        let write = || -> std::io::Result<()> {
            use std::io::Write as _;
            use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
            let mode = if file.private { 0o600 } else { 0o644 };
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(mode)
                .open(&path)?;
            // A file there already keeps its mode through `open`: set it.
            out.set_permissions(std::fs::Permissions::from_mode(mode))?;
            out.write_all(file.text.as_bytes())
        };
        write().with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// The first lines of every file written, as comments (`#`, which YAML, shell and
/// Containerfiles share): where it came from and where it is explained.
fn header(target: &str, what: &str) -> String {
    format!(
        "# {what}\n# Written by `lockstep deploy {target}` (`--help` lists its settings); \
         docs/DEPLOY.md explains it.\n"
    )
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        job: JobArgs,
    }

    fn job(args: &[&str]) -> JobArgs {
        Cli::parse_from(std::iter::once("deploy").chain(args.iter().copied())).job
    }

    #[test]
    fn names_that_are_not_dns_labels_are_refused_with_the_rule() {
        for bad in ["Mnist", "1mnist", "mnist-", "mn_ist", "", &"a".repeat(64)] {
            let err = job(&["--name", bad]).checked_name().unwrap_err();
            assert!(
                err.to_string().contains("is not a DNS label"),
                "{bad}: {err}"
            );
        }
        assert_eq!(job(&["--name", "a-1"]).checked_name().unwrap(), "a-1");
    }

    #[test]
    fn the_users_flags_replace_the_deployments_defaults() {
        let args = job(&["--", "--threads=8", "--epochs", "5"]).task_args("/s", false, 2);
        assert_eq!(
            args,
            [
                "--rendezvous-timeout-secs",
                "600",
                "--backup-dir",
                "/s/backup",
                "--threads=8",
                "--epochs",
                "5"
            ]
        );
        let args = job(&["--example", "mnist-estimator"]).task_args("/s", true, 2);
        assert!(args.ends_with(&["--model-dir".to_owned(), "/s/model".to_owned()]));
    }

    #[test]
    fn port_zero_is_refused_by_the_parser() {
        let err = Cli::try_parse_from(["deploy", "--port", "0"]).unwrap_err();
        assert!(err.to_string().contains("--port"), "{err}");
    }

    #[test]
    fn long_host_names_are_refused_naming_the_host() {
        let err = check_host_name(&"a".repeat(64), "pod").unwrap_err();
        assert!(err.to_string().contains("choose a shorter --name"), "{err}");
        assert!(check_host_name(&"a".repeat(63), "pod").is_ok());
    }

    #[test]
    fn a_private_artefact_is_written_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let files = [
            Artefact {
                name: "secret.yaml",
                private: true,
                text: "s".into(),
            },
            Artefact {
                name: "open.yaml",
                private: false,
                text: "o".into(),
            },
        ];
        // Twice: a file that exists already gets the mode too.
        for _ in 0..2 {
            write_files(dir.path(), &files).unwrap();
            let mode = |name: &str| {
                std::fs::metadata(dir.path().join(name))
                    .unwrap()
                    .permissions()
                    .mode()
                    & 0o777
            };
            assert_eq!(mode("secret.yaml"), 0o600);
            assert_eq!(mode("open.yaml"), 0o644);
        }
    }
}
