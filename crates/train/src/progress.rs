//! What `fit` shows of an epoch: a progress bar on a terminal, a line at its end.

use std::io::IsTerminal as _;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::history::Logs;

/// One epoch's display on the chief: with a terminal, a bar with steps, ETA and the running
/// logs, as Keras draws it; in every case a line when the epoch ends.
pub(crate) struct EpochProgress {
    bar: Option<ProgressBar>,
    started: Instant,
    title: String,
}

impl EpochProgress {
    /// Starts epoch `epoch` of `epochs` (from 0) of `total` steps (when known); shows nothing
    /// unless `show`.
    pub(crate) fn start(show: bool, epoch: u64, epochs: u64, total: Option<u64>) -> Self {
        let title = format!("Epoch {}/{epochs}", epoch + 1);
        let bar = (show && std::io::stdout().is_terminal()).then(|| {
            // On stdout, beside the epoch lines, as Keras draws it.
            let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stdout());
            let template = "{prefix} {pos}/{len} [{bar:30}] {elapsed_precise} ETA {eta} - {msg}";
            if let Ok(style) = ProgressStyle::with_template(template) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_prefix(title.clone());
            bar
        });
        Self {
            bar,
            started: Instant::now(),
            title,
        }
    }

    /// After `done` steps of the epoch, with the running logs.
    pub(crate) fn step(&self, done: u64, logs: &Logs) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            bar.set_message(logs.line());
        }
    }

    /// Clears the bar and prints the epoch's line (when shown at all).
    pub(crate) fn finish(self, show: bool, steps: u64, logs: &Logs) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if show {
            println!(
                "{} - {steps} steps - {:.1}s - {}",
                self.title,
                self.started.elapsed().as_secs_f64(),
                logs.line()
            );
        }
    }
}
