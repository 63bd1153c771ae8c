//! The `sbatch` script: one `srun` step of the program, every task finding its place through
//! the SLURM resolver, started again as a whole when a task fails.

use anyhow::Context as _;

use super::{Artefact, JobArgs, STATE_DIR_VARIABLE, Workload, header};

/// Options of `lockstep deploy slurm`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct SlurmArgs {
    #[command(flatten)]
    pub(super) job: JobArgs,
    /// Nodes to allocate.
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// Tasks (workers) on each node.
    #[arg(long, default_value_t = 1)]
    tasks_per_node: usize,
    /// CPU cores of each task (and the threads of its kernels).
    #[arg(long, default_value_t = 2)]
    cpus_per_task: u32,
    /// Wall-clock limit of the job, in SLURM's notation.
    #[arg(long, default_value = "01:00:00")]
    time: String,
    /// The partition to submit to (default: the cluster's).
    #[arg(long)]
    partition: Option<String>,
}

/// The file name of the script.
pub(crate) const SCRIPT: &str = "lockstep.sbatch";

/// The batch script.
pub(crate) fn files(args: &SlurmArgs) -> anyhow::Result<Vec<Artefact>> {
    Ok(vec![Artefact {
        name: SCRIPT,
        private: false,
        text: script(args)?,
    }])
}

fn quote(arg: &str) -> anyhow::Result<String> {
    Ok(shlex::try_quote(arg)
        .with_context(|| format!("{arg:?} cannot be written into a shell script"))?
        .into_owned())
}

fn script(args: &SlurmArgs) -> anyhow::Result<String> {
    let job = &args.job;
    let name = job.checked_name()?;
    for (flag, value) in [
        ("--nodes", args.nodes),
        ("--tasks-per-node", args.tasks_per_node),
        ("--cpus-per-task", args.cpus_per_task as usize),
    ] {
        if value == 0 {
            anyhow::bail!("{flag} 0: a job step needs at least one");
        }
    }
    let binary = job.binary()?;
    let (built, export_state) = match job.workload() {
        Workload::Example(..) => (
            "# The example, built where every node sees it: cargo build --release -p lockstep-examples".to_owned(),
            String::new(),
        ),
        Workload::Program(..) => (
            format!("# Your program, built where every node sees it: cargo build --release --bin {binary}"),
            // The program finds the shared storage in the environment.
            format!("export {STATE_DIR_VARIABLE}=\"$state\"\n"),
        ),
    };
    let state = format!("${{SLURM_SUBMIT_DIR:-$PWD}}/lockstep-state/{name}");
    let task_args = job
        .task_args("$state", false, args.cpus_per_task)
        .iter()
        .map(|a| {
            // The state directory is the script's variable, expanded when the script runs.
            match a.strip_prefix("$state") {
                Some(rest) => Ok(format!("\"$state\"{}", quote(rest)?)),
                None => quote(a),
            }
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let port = match job.port {
        Some(port) => port.to_string(),
        None => "$((20000 + SLURM_JOB_ID % 20000))".to_owned(),
    };
    let partition = match &args.partition {
        Some(partition) => format!("#SBATCH --partition={}\n", quote(partition)?),
        None => String::new(),
    };
    let time = quote(&args.time)?;
    let (nodes, per_node, cpus) = (args.nodes, args.tasks_per_node, args.cpus_per_task);
    let max_restarts = job.max_restarts;
    let args_text = task_args.join(" ");
    Ok(format!(
        "#!/bin/bash
{header}\
# Submit it with `sbatch {SCRIPT}`; arguments after the script's name go to every task
# (`sbatch {SCRIPT} --epochs 10`).
#SBATCH --job-name={name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={per_node}
#SBATCH --cpus-per-task={cpus}
#SBATCH --time={time}
#SBATCH --output={name}-%j.out
{partition}set -euo pipefail

{built}
bin=\"${{LOCKSTEP_BIN:-${{SLURM_SUBMIT_DIR:-$PWD}}/target/release/{binary}}}\"
# Where the chief keeps the backup a restart resumes from: storage every node sees.
state=\"${{LOCKSTEP_STATE_DIR:-{state}}}\"
{export_state}# The port of the first task on each node (the k-th task on a node listens k above it).
export LOCKSTEP_PORT=\"${{LOCKSTEP_PORT:-{port}}}\"
max_restarts={max_restarts}
# The cluster secret the tasks prove to each other (docs/SECURITY.md): unless one is given,
# a fresh one for this job, in a file only you can read, where every node sees it.
if [ -z \"${{LOCKSTEP_CLUSTER_SECRET:-}}${{LOCKSTEP_CLUSTER_SECRET_FILE:-}}\" ]; then
    mkdir -p \"$state\"
    secret_file=\"$state/cluster-secret-${{SLURM_JOB_ID:-$$}}\"
    (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > \"$secret_file\")
    trap 'rm -f \"$secret_file\"' EXIT
    export LOCKSTEP_CLUSTER_SECRET_FILE=\"$secret_file\"
fi

restarts=0
while true; do
    # --kill-on-bad-exit: one failed task ends the step, so every task starts again together.
    if srun --kill-on-bad-exit=1 --cpus-per-task={cpus} \"$bin\" {args_text} \"$@\"; then
        exit 0
    fi
    if [ \"$restarts\" -ge \"$max_restarts\" ]; then
        echo \"lockstep: a task failed and all $max_restarts restarts are spent\" >&2
        exit 1
    fi
    restarts=$((restarts + 1))
    echo \"lockstep: a task failed; starting every task again ($restarts of $max_restarts), resuming from $state\" >&2
done
",
        header = header("slurm", "A SLURM batch script: one Lockstep worker per task."),
    ))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        slurm: SlurmArgs,
    }

    fn script_for(args: &[&str]) -> anyhow::Result<String> {
        script(&Cli::parse_from(std::iter::once("slurm").chain(args.iter().copied())).slurm)
    }

    /// The `#SBATCH` options, as sbatch reads them: only before the first command.
    fn sbatch_options(text: &str) -> Vec<&str> {
        text.lines()
            .skip(1)
            .take_while(|l| l.starts_with('#'))
            .filter_map(|l| l.strip_prefix("#SBATCH "))
            .collect()
    }

    #[test]
    fn the_allocation_matches_the_settings() {
        let text = script_for(&[
            "--nodes",
            "4",
            "--tasks-per-node",
            "2",
            "--partition",
            "gpu",
        ])
        .unwrap();
        assert!(text.starts_with("#!/bin/bash\n"));
        assert_eq!(
            sbatch_options(&text),
            [
                "--job-name=lockstep-mnist",
                "--nodes=4",
                "--ntasks-per-node=2",
                "--cpus-per-task=2",
                "--time=01:00:00",
                "--output=lockstep-mnist-%j.out",
                "--partition=gpu",
            ]
        );
    }

    #[test]
    fn the_srun_line_runs_the_example_with_the_state_on_shared_storage() {
        let text =
            script_for(&["--example", "mnist-estimator", "--", "--max-steps", "a b"]).unwrap();
        let srun = text
            .lines()
            .find(|l| l.trim_start().starts_with("if srun"))
            .unwrap();
        let words = shlex::split(srun.trim_start().trim_start_matches("if ")).unwrap();
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        assert_eq!(
            words,
            [
                "srun",
                "--kill-on-bad-exit=1",
                "--cpus-per-task=2",
                "$bin",
                "--rendezvous-timeout-secs",
                "600",
                "--threads",
                "2",
                "--model-dir",
                "$state/model",
                "--max-steps",
                "a b",
                "$@;",
                "then",
            ]
        );
        assert!(text.contains("target/release/mnist_estimator"));
        assert!(text.contains("max_restarts=3\n"));
    }

    #[test]
    fn a_users_program_runs_from_its_crates_target_with_its_own_arguments_only() {
        let text = script_for(&["--", "my_trainer", "--epochs", "3"]).unwrap();
        assert!(text.contains("target/release/my_trainer}\""), "{text}");
        assert!(text.contains("cargo build --release --bin my_trainer"));
        assert!(text.contains("export LOCKSTEP_STATE_DIR=\"$state\"\n"));
        let srun = text
            .lines()
            .find(|l| l.trim_start().starts_with("if srun"))
            .unwrap();
        assert!(
            srun.ends_with("\"$bin\" --epochs 3 \"$@\"; then"),
            "no flags of the examples' for a program: {srun}"
        );
        let err = script_for(&["--", "../bin/x"]).unwrap_err();
        assert!(err.to_string().contains("is not a binary name"), "{err}");
    }

    #[test]
    fn a_given_port_replaces_the_one_derived_from_the_job_id() {
        assert!(
            script_for(&[])
                .unwrap()
                .contains("$((20000 + SLURM_JOB_ID % 20000))")
        );
        assert!(
            script_for(&["--port", "7000"])
                .unwrap()
                .contains("LOCKSTEP_PORT:-7000}")
        );
    }

    #[test]
    fn bad_settings_are_refused_naming_the_flag() {
        let err = script_for(&["--nodes", "0"]).unwrap_err();
        assert!(err.to_string().contains("--nodes 0"), "{err}");
        let err = script_for(&["--", "--epochs", "a\0b"]).unwrap_err();
        assert!(
            err.to_string()
                .contains("cannot be written into a shell script"),
            "{err}"
        );
    }
}
