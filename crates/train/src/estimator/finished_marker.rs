//! The file by which the chief tells an evaluator task that training has ended, and at which
//! global step: training can end short of `max_steps` (the input ran out), and an evaluator
//! waiting for a checkpoint of `max_steps` would otherwise wait for ever.

use std::fs;
use std::path::Path;

use crate::error::TrainError;

/// The marker's name in `model_dir`.
const NAME: &str = "training_finished";

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> TrainError {
    let path = path.display().to_string();
    move |e| TrainError::invalid("model_dir", format!("{what} {path}: {e}"))
}

/// Removes the marker of an earlier run, when training starts.
pub(crate) fn clear(model_dir: &Path) -> Result<(), TrainError> {
    let path = model_dir.join(NAME);
    match fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("removing", &path)(e)),
        _ => Ok(()),
    }
}

/// Records that training ended at `step`: written aside and renamed, so a reader sees the
/// whole marker or none.
pub(crate) fn write(model_dir: &Path, step: u64) -> Result<(), TrainError> {
    let path = model_dir.join(NAME);
    let temporary = model_dir.join(format!(".{NAME}-{}", std::process::id()));
    fs::create_dir_all(model_dir).map_err(io("creating", model_dir))?;
    fs::write(&temporary, format!("{step}\n")).map_err(io("writing", &temporary))?;
    fs::rename(&temporary, &path).map_err(io("renaming", &temporary))
}

/// The step at which training ended, when the marker is there and whole.
pub(crate) fn read(model_dir: &Path) -> Option<u64> {
    fs::read_to_string(model_dir.join(NAME))
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_holds_the_final_step_until_cleared() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()), None);
        write(dir.path(), 37).unwrap();
        assert_eq!(read(dir.path()), Some(37));
        clear(dir.path()).unwrap();
        clear(dir.path()).unwrap();
        assert_eq!(read(dir.path()), None);
        fs::write(dir.path().join(NAME), "not a step").unwrap();
        assert_eq!(read(dir.path()), None);
    }
}
