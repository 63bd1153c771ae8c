//! Waiting for the chief's checkpoints: what an evaluator task does between evaluations.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use lockstep_checkpoint::{Checkpoint, CheckpointManager};

use crate::error::TrainError;

/// Hands out the newest intact checkpoint of a directory once each, skipping any that a
/// newer one overtook before it was looked at. Checkpoints appear by an atomic rename, so a
/// half-written one is never seen.
pub(crate) struct CheckpointWatcher {
    dir: PathBuf,
    last: Option<u64>,
    poll: Duration,
}

impl CheckpointWatcher {
    pub(crate) fn new(dir: impl Into<PathBuf>, poll: Duration) -> Self {
        Self {
            dir: dir.into(),
            last: None,
            poll,
        }
    }

    /// The newest checkpoint not handed out before, if one is there now.
    pub(crate) fn newest_unseen(&mut self) -> Result<Option<Checkpoint>, TrainError> {
        if !self.dir.is_dir() {
            return Ok(None);
        }
        let manager = CheckpointManager::new(&self.dir, None)?;
        let newest = manager.steps()?.into_iter().max();
        if newest.is_none() || newest <= self.last {
            return Ok(None);
        }
        let Some(checkpoint) = manager.latest()? else {
            return Ok(None);
        };
        if Some(checkpoint.progress.step) <= self.last {
            return Ok(None);
        }
        self.last = Some(checkpoint.progress.step);
        Ok(Some(checkpoint))
    }

    /// Waits until [`newest_unseen`](Self::newest_unseen) has one or `deadline` passes.
    pub(crate) fn wait_for_new(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<Option<Checkpoint>, TrainError> {
        loop {
            if let Some(checkpoint) = self.newest_unseen()? {
                return Ok(Some(checkpoint));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
            std::thread::sleep(self.poll);
        }
    }
}
