//! Fault injection for demonstrations and tests: a process that kills itself at a step, or
//! that is slow at every step.

use crate::error::TrainError;

/// The environment variable that makes a training process SIGKILL itself once its training
/// step of this number has ended (callbacks and saves of the step included): a crash at a
/// chosen point, for demonstrations and tests. `cargo xtask run-cluster --kill TASK@STEP`
/// sets it for one task's first start.
pub const KILL_AT_STEP: &str = "LOCKSTEP_KILL_AT_STEP";

/// The environment variable that makes the chief SIGKILL itself in the middle of writing the
/// `BackupAndRestore` backup (or the Estimator's checkpoint) of this step: its files written,
/// not yet published.
/// `cargo xtask run-cluster --kill TASK@save:STEP` sets it for one task's first start.
pub const KILL_IN_SAVE: &str = "LOCKSTEP_KILL_IN_SAVE";

/// The environment variable that makes a training process sleep this many milliseconds after
/// each of its training steps: a straggler on demand, which the others then wait for in the
/// next step's collectives. `cargo xtask run-cluster --slow TASK@MS` sets it for one task.
pub const SLOW_STEP_MS: &str = "LOCKSTEP_SLOW_STEP_MS";

/// `LOCKSTEP_KILL_AT_STEP=N` makes the process SIGKILL itself once its training step N (the
/// optimizer's `iterations`, the Estimator's global step) has ended, callbacks and saves of
/// that step included; `LOCKSTEP_KILL_IN_SAVE=N` while it writes step N's backup or checkpoint: a crash with
/// no chance to clean up, at a chosen point.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct KillSwitch {
    after_step: Option<u64>,
    in_save: Option<u64>,
    slow_step: Option<u64>,
}

impl KillSwitch {
    /// Reads the environment once, at the start of training.
    pub(crate) fn from_env() -> Result<Self, TrainError> {
        Ok(Self {
            after_step: number_var(KILL_AT_STEP, "a step number")?,
            in_save: number_var(KILL_IN_SAVE, "a step number")?,
            slow_step: number_var(SLOW_STEP_MS, "a number of milliseconds")?,
        })
    }

    /// Kills the process with SIGKILL if `step` is the armed one; sleeps when every step is
    /// to be slow.
    pub(crate) fn after_step(self, step: u64) {
        if let Some(ms) = self.slow_step {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        if self.after_step == Some(step) {
            kill(KILL_AT_STEP, step);
        }
    }

    /// The count a parameter-server task is killed at: `LOCKSTEP_KILL_AT_STEP` read as the
    /// updates a `ps` task has applied (it has no steps of its own), or the steps a
    /// parameter-server chief has seen finish.
    pub(crate) fn kill_at_updates(self) -> Option<u64> {
        self.after_step
    }

    /// Kills the process with SIGKILL: the armed count was reached.
    pub(crate) fn kill_now(updates: u64) {
        kill(KILL_AT_STEP, updates);
    }

    /// Kills the process with SIGKILL if `step` is the one whose save is armed.
    pub(crate) fn in_save(self, step: u64) {
        if self.in_save == Some(step) {
            kill(KILL_IN_SAVE, step);
        }
    }
}

fn kill(var: &str, step: u64) {
    tracing::warn!(step, "{var}: killing this process");
    // SIGKILL cannot be caught, so raising it does not return.
    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
}

/// A whole number (`what`, for the error) from `var`, `None` when unset.
fn number_var(var: &'static str, what: &str) -> Result<Option<u64>, TrainError> {
    match std::env::var(var) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Ok(text) => text
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| TrainError::invalid(var, format!("{text:?} is not {what}"))),
        Err(std::env::VarError::NotUnicode(text)) => Err(TrainError::invalid(
            var,
            format!("{} is not {what}", text.display()),
        )),
    }
}
