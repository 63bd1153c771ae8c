//! `lockstep run`: a local cluster on 127.0.0.1, one process of the program per task.

use std::ffi::OsString;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use lockstep_cluster::{SECRET_FILE_VARIABLE, SECRET_VARIABLE, TaskId, TfConfig};

use crate::cluster_plan::{Shape, plan};
use crate::ports::TaskListeners;
use crate::supervise::{Outcome, Supervisor};

/// `lockstep_train::KILL_AT_STEP`, `KILL_IN_SAVE` and `SLOW_STEP_MS`, the variables of the
/// training crate's fault injection, named here so that the launcher builds without the
/// training crates (a test checks that they agree).
const KILL_AT_STEP: &str = "LOCKSTEP_KILL_AT_STEP";
const KILL_IN_SAVE: &str = "LOCKSTEP_KILL_IN_SAVE";
const SLOW_STEP_MS: &str = "LOCKSTEP_SLOW_STEP_MS";

/// Options of `lockstep run`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct RunArgs {
    /// Number of worker tasks.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Add a chief task (rank 0); without it worker:0 is the chief.
    #[arg(long)]
    chief: bool,
    /// Add an evaluator task, outside the collective group.
    #[arg(long)]
    evaluator: bool,
    /// Number of parameter-server tasks.
    #[arg(long, default_value_t = 0)]
    ps: usize,
    /// Stop every task and fail if the cluster runs longer than this many seconds.
    #[arg(long, value_name = "SECONDS")]
    timeout_secs: Option<u64>,
    /// Seconds a task gets between SIGTERM and SIGKILL when the cluster is stopped.
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    grace_secs: u64,
    /// Let the other tasks run on when one fails (to see how they react); the run still fails.
    #[arg(long)]
    keep_going: bool,
    /// When a task fails, stop every task and start them all again (on the same addresses),
    /// up to this many times in all; training resumes from its `BackupAndRestore` state.
    #[arg(long, value_name = "K", default_value_t = 0)]
    restart_on_failure: u32,
    /// SIGKILL a task once its training step STEP has ended, on its first start only
    /// (`worker:1@30`; repeatable): a crash on demand, for demonstrations and tests. With
    /// `TASK@save:STEP` the task is killed while it writes the backup (or the Estimator's
    /// checkpoint) of step STEP: its files written, not yet published. The program must be
    /// a Lockstep training program for the crash to happen.
    #[arg(long, value_name = "TASK@[save:]STEP", value_parser = parse_kill)]
    kill: Vec<Kill>,
    /// Make a task sleep MS milliseconds after each of its training steps, on every start
    /// (`worker:1@50`; repeatable): a straggler on demand, which the chief's straggler report
    /// then names. The program must be a Lockstep training program.
    #[arg(long, value_name = "TASK@MS", value_parser = parse_slow)]
    slow: Vec<Slow>,
    /// The program every task runs and its arguments, after `--` (a path, or a name looked
    /// up in `PATH`).
    #[arg(last = true, required = true, value_name = "PROGRAM [ARGS]")]
    command: Vec<OsString>,
}

/// A crash to inject: `task` SIGKILLs itself after its training step `step`, or while it
/// writes that step's backup (`in_save`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Kill {
    task: TaskId,
    step: u64,
    in_save: bool,
}

/// A straggler to inject: `task` sleeps `ms` milliseconds after each training step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Slow {
    task: TaskId,
    ms: u64,
}

fn parse_slow(text: &str) -> Result<Slow, String> {
    let (task, ms) = text
        .rsplit_once('@')
        .ok_or_else(|| format!("{text:?} is not TASK@MS, such as worker:1@50"))?;
    Ok(Slow {
        task: task.parse().map_err(|e| format!("{e}"))?,
        ms: ms
            .parse()
            .map_err(|_| format!("{ms:?} in {text:?} is not a number of milliseconds"))?,
    })
}

fn parse_kill(text: &str) -> Result<Kill, String> {
    let (task, step) = text
        .rsplit_once('@')
        .ok_or_else(|| format!("{text:?} is not TASK@STEP, such as worker:1@30"))?;
    let (step, in_save) = match step.strip_prefix("save:") {
        Some(step) => (step, true),
        None => (step, false),
    };
    Ok(Kill {
        in_save,
        task: task.parse().map_err(|e| format!("{e}"))?,
        step: step
            .parse()
            .map_err(|_| format!("{step:?} in {text:?} is not a step number"))?,
    })
}

/// Set by Ctrl-C, SIGTERM or SIGHUP. The handler can be installed once per process, so it
/// is installed on first use.
fn interrupted_flag() -> anyhow::Result<Arc<AtomicBool>> {
    static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
    if let Some(flag) = FLAG.get() {
        return Ok(Arc::clone(flag));
    }
    let flag = Arc::new(AtomicBool::new(false));
    let handler_flag = Arc::clone(&flag);
    ctrlc::set_handler(move || handler_flag.store(true, Ordering::SeqCst))
        .context("installing the Ctrl-C handler")?;
    Ok(Arc::clone(FLAG.get_or_init(|| flag)))
}

/// One command per task: the program with its arguments and the task's `TF_CONFIG`, and on
/// the `first` start the `--kill` crashes to inject.
fn task_commands(
    planned: &[(TaskId, TfConfig)],
    (program, program_args): (&OsString, &[OsString]),
    args: &RunArgs,
    (first, secret): (bool, Option<&str>),
) -> Vec<(TaskId, Command)> {
    planned
        .iter()
        .map(|(task, config)| {
            let mut command = Command::new(program);
            command
                .args(program_args)
                .env("TF_CONFIG", config.to_json())
                .env_remove(KILL_AT_STEP)
                .env_remove(KILL_IN_SAVE)
                .env_remove(SLOW_STEP_MS);
            if let Some(slow) = args.slow.iter().find(|s| s.task == *task) {
                command.env(SLOW_STEP_MS, slow.ms.to_string());
            }
            if let Some(secret) = secret {
                command.env(SECRET_VARIABLE, secret);
            }
            if let Some(kill) = args.kill.iter().find(|k| k.task == *task).filter(|_| first) {
                let var = if kill.in_save {
                    KILL_IN_SAVE
                } else {
                    KILL_AT_STEP
                };
                command.env(var, kill.step.to_string());
            }
            (task.clone(), command)
        })
        .collect()
}

/// The cluster secret this job's tasks are given: a fresh one per job (kept across its
/// restarts), unless this process's environment gives one already (`LOCKSTEP_CLUSTER_SECRET`
/// or `LOCKSTEP_CLUSTER_SECRET_FILE`), which the tasks then inherit.
fn job_secret() -> anyhow::Result<Option<String>> {
    let given = [SECRET_VARIABLE, SECRET_FILE_VARIABLE]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()));
    if given {
        return Ok(None);
    }
    Ok(Some(
        lockstep_cluster::generate_secret_hex().context("making the job's cluster secret")?,
    ))
}

/// Starts the cluster and waits for it.
pub(crate) fn run(args: &RunArgs) -> anyhow::Result<()> {
    let shape = Shape {
        workers: args.workers,
        chief: args.chief,
        ps: args.ps,
        evaluator: args.evaluator,
    };
    let listeners =
        TaskListeners::bind(shape.tasks().len()).context("binding ports on 127.0.0.1")?;
    let ports = listeners.ports().context("reading the bound ports")?;
    let planned = plan(shape, &ports)?;
    if let Some(kill) = args
        .kill
        .iter()
        .find(|k| !planned.iter().any(|(task, _)| *task == k.task))
    {
        bail!("--kill names {}, a task this cluster lacks", kill.task);
    }
    if let Some(slow) = args
        .slow
        .iter()
        .find(|s| !planned.iter().any(|(task, _)| *task == s.task))
    {
        bail!("--slow names {}, a task this cluster lacks", slow.task);
    }
    let Some(program_and_args) = args.command.split_first() else {
        bail!("no program to run: give it after `--`, as in `lockstep run -- ./trainer`");
    };
    let program = program_and_args.0.to_string_lossy().into_owned();
    let secret = job_secret()?;
    let interrupted = interrupted_flag()?;
    let count = planned.len();
    let deadline = args
        .timeout_secs
        .map(|s| Instant::now() + Duration::from_secs(s));
    let mut listeners = Some(listeners);
    let mut restarts = 0;
    let outcome = loop {
        let listeners = match listeners.take() {
            Some(listeners) => listeners,
            None => TaskListeners::rebind(&ports)
                .context("binding the cluster's ports again to restart it")?,
        };
        let mut commands = task_commands(
            &planned,
            program_and_args,
            args,
            (restarts == 0, secret.as_deref()),
        );
        listeners.hand_over(commands.iter_mut().map(|(_, command)| command))?;
        tracing::info!(%program, tasks = count, restarts, "starting local cluster");
        let supervisor = Supervisor::start(commands, Duration::from_secs(args.grace_secs))?;
        match supervisor.wait(&interrupted, deadline, args.keep_going) {
            Outcome::Failed { task, status } if restarts < args.restart_on_failure => {
                restarts += 1;
                tracing::warn!(
                    "task {task} failed ({status}); restarting every task ({restarts} of {})",
                    args.restart_on_failure
                );
            }
            outcome => break outcome,
        }
    };
    match outcome {
        Outcome::Succeeded => {
            tracing::info!(tasks = count, restarts, "every task finished successfully");
            Ok(())
        }
        Outcome::Failed { task, status } => {
            bail!("task {task} failed ({status}); stopped the other tasks of the cluster")
        }
        Outcome::Interrupted => bail!("interrupted; stopped all {count} tasks"),
        Outcome::TimedOut => bail!(
            "the cluster ran past --timeout-secs {}; stopped all {count} tasks",
            args.timeout_secs.unwrap_or_default()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kill_variables_are_the_training_crates() {
        assert_eq!(KILL_AT_STEP, lockstep_train::KILL_AT_STEP);
        assert_eq!(KILL_IN_SAVE, lockstep_train::KILL_IN_SAVE);
        assert_eq!(SLOW_STEP_MS, lockstep_train::SLOW_STEP_MS);
    }

    #[test]
    fn a_slow_task_names_a_task_and_milliseconds() {
        assert_eq!(
            parse_slow("worker:1@50").unwrap(),
            Slow {
                task: TaskId::worker(1),
                ms: 50,
            }
        );
        for bad in [
            "worker:1",
            "worker:1@",
            "worker:1@-5",
            "@5",
            "worker:1@fast",
        ] {
            assert!(parse_slow(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_kill_names_a_task_and_a_step() {
        assert_eq!(
            parse_kill("worker:1@30").unwrap(),
            Kill {
                task: TaskId::worker(1),
                step: 30,
                in_save: false,
            }
        );
        assert_eq!(
            parse_kill("chief:0@save:7").unwrap(),
            Kill {
                task: TaskId::chief(),
                step: 7,
                in_save: true,
            }
        );
        for bad in [
            "worker:1",
            "worker@3",
            "worker:1@",
            "worker:1@-2",
            "@5",
            "worker:0@save:",
        ] {
            assert!(parse_kill(bad).is_err(), "{bad}");
        }
    }

    /// A job name as `TF_CONFIG` allows one: a letter, then letters, digits or `_`.
    const JOB: &str = "[a-zA-Z][a-zA-Z0-9_]{0,11}";

    proptest::proptest! {
        #[test]
        fn a_slow_task_reads_back_as_written(job in JOB, index in 0_usize..1000, ms: u64) {
            let task = TaskId::new(job, index);
            proptest::prop_assert_eq!(parse_slow(&format!("{task}@{ms}")), Ok(Slow { task, ms }));
        }

        #[test]
        fn a_kill_reads_back_as_written(
            job in JOB,
            index in 0_usize..1000,
            step: u64,
            in_save: bool,
        ) {
            let task = TaskId::new(job, index);
            let save = if in_save { "save:" } else { "" };
            proptest::prop_assert_eq!(
                parse_kill(&format!("{task}@{save}{step}")),
                Ok(Kill { task, step, in_save })
            );
        }

        #[test]
        fn any_text_is_a_switch_that_reads_back_or_an_error(
            text in proptest::prop_oneof![
                "\\PC{0,24}",
                "[a-z_]{0,7}:?[0-9]{0,3}@(save:)?-?[0-9a-z]{0,4}",
            ],
        ) {
            if let Ok(slow) = parse_slow(&text) {
                let written = format!("{}@{}", slow.task, slow.ms);
                proptest::prop_assert_eq!(parse_slow(&written), Ok(slow));
            }
            if let Ok(kill) = parse_kill(&text) {
                let save = if kill.in_save { "save:" } else { "" };
                let written = format!("{}@{save}{}", kill.task, kill.step);
                proptest::prop_assert_eq!(parse_kill(&written), Ok(kill));
            }
        }
    }
}
