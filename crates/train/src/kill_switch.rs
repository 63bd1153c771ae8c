//! Fault injection for demonstrations and tests: a process that kills itself at a step.

use crate::error::TrainError;

/// The environment variable that makes a training process SIGKILL itself once its training
/// step of this number has ended (callbacks and saves of the step included): a crash at a
/// chosen point, for demonstrations and tests. `cargo xtask run-cluster --kill TASK@STEP`
/// sets it for one task's first start.
pub const KILL_AT_STEP: &str = "LOCKSTEP_KILL_AT_STEP";

/// `LOCKSTEP_KILL_AT_STEP=N` makes the process SIGKILL itself once its training step N (the
/// optimizer's `iterations`, the Estimator's global step) has ended, callbacks and saves of
/// that step included: a crash with no chance to clean up, at a chosen point.
/// `cargo xtask run-cluster --kill TASK@STEP` sets it for one task's first start.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KillSwitch(Option<u64>);

impl KillSwitch {
    /// Reads the environment once, at the start of training.
    pub(crate) fn from_env() -> Result<Self, TrainError> {
        match std::env::var(KILL_AT_STEP) {
            Err(std::env::VarError::NotPresent) => Ok(Self(None)),
            Ok(text) => text
                .trim()
                .parse()
                .map(|step| Self(Some(step)))
                .map_err(|_| {
                    TrainError::invalid(KILL_AT_STEP, format!("{text:?} is not a step number"))
                }),
            Err(std::env::VarError::NotUnicode(text)) => Err(TrainError::invalid(
                KILL_AT_STEP,
                format!("{} is not a step number", text.display()),
            )),
        }
    }

    /// Kills the process with SIGKILL if `step` is the armed one.
    pub(crate) fn after_step(self, step: u64) {
        if self.0 == Some(step) {
            tracing::warn!(step, "{KILL_AT_STEP}: killing this process");
            // SIGKILL cannot be caught, so raising it does not return.
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
    }
}
