//! `CSVLogger`: one line of logs per epoch in a CSV file.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::PathBuf;

use crate::callbacks::{Callback, TrainingContext};
use crate::error::TrainError;
use crate::history::Logs;

/// Writes `epoch` and every logged value, one row per epoch, as
/// `tf.keras.callbacks.CSVLogger`; the chief writes, other workers do nothing. Each row is
/// flushed as it is written.
#[derive(Debug)]
pub struct CsvLogger {
    path: PathBuf,
    append: bool,
    file: Option<File>,
    header_written: bool,
}

impl CsvLogger {
    /// Logs to `path`, replacing it (or appending with [`CsvLogger::append`]).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            append: false,
            file: None,
            header_written: false,
        }
    }

    /// Appends to an existing file (a resumed run) instead of replacing it.
    #[must_use]
    pub fn append(mut self) -> Self {
        self.append = true;
        self
    }

    fn io(&self, e: &std::io::Error) -> TrainError {
        TrainError::invalid("CSVLogger", format!("{}: {e}", self.path.display()))
    }
}

impl Callback for CsvLogger {
    fn on_train_begin(&mut self, ctx: &mut TrainingContext<'_>) -> Result<(), TrainError> {
        if !ctx.is_chief() {
            return Ok(());
        }
        let had_rows = self.append && self.path.metadata().is_ok_and(|m| m.len() > 0);
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .append(self.append)
            .truncate(!self.append)
            .open(&self.path)
            .map_err(|e| self.io(&e))?;
        self.file = Some(file);
        // An appended file has its header already.
        self.header_written = had_rows;
        Ok(())
    }

    fn on_epoch_end(
        &mut self,
        epoch: u64,
        logs: &Logs,
        _ctx: &mut TrainingContext<'_>,
    ) -> Result<(), TrainError> {
        let Some(file) = &mut self.file else {
            return Ok(());
        };
        let mut text = String::new();
        if !self.header_written {
            self.header_written = true;
            text.push_str("epoch");
            for name in logs.0.keys() {
                text.push(',');
                text.push_str(name);
            }
            text.push('\n');
        }
        text.push_str(&epoch.to_string());
        for value in logs.0.values() {
            text.push(',');
            text.push_str(&value.to_string());
        }
        text.push('\n');
        let written = file.write_all(text.as_bytes()).and_then(|()| file.flush());
        written.map_err(|e| self.io(&e))
    }
}
