//! File-system operations that reach the disk before the next one starts.
//!
//! A save is a list of these, run in order ([`Op::run`]); every prefix of the list leaves the
//! directory in a state where the newest intact checkpoint is the previous one or the new
//! one (the crate's tests run every prefix).

use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::error::CheckpointError;

/// One step of a save.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    CreateDir(PathBuf),
    /// Creates (or replaces) a file with these bytes and flushes it to disk.
    Write {
        path: PathBuf,
        bytes: Vec<u8>,
    },
    /// Flushes a directory's entries (creations and renames in it) to disk.
    SyncDir(PathBuf),
    Rename {
        from: PathBuf,
        to: PathBuf,
    },
    /// Swaps two directories in one step (`renameat2` with `RENAME_EXCHANGE`): a checkpoint
    /// saved again takes its old copy's name while that copy takes the new one's, so the name
    /// never stands empty. Where the file system cannot swap, the old copy is renamed to
    /// `aside` first, and a writer that finds it there after a crash, with no checkpoint under
    /// its name, puts it back.
    Exchange {
        new: PathBuf,
        old: PathBuf,
        aside: PathBuf,
    },
    /// Removes a file, or a directory and everything in it, if present.
    RemoveAll(PathBuf),
}

impl Op {
    pub(crate) fn run(&self) -> Result<(), CheckpointError> {
        match self {
            Op::CreateDir(path) => {
                fs::create_dir_all(path).map_err(CheckpointError::io("creating", path))
            }
            Op::Write { path, bytes } => {
                let mut file = File::create(path).map_err(CheckpointError::io("creating", path))?;
                file.write_all(bytes)
                    .map_err(CheckpointError::io("writing", path))?;
                file.sync_all()
                    .map_err(CheckpointError::io("syncing", path))
            }
            Op::SyncDir(path) => sync_dir(path),
            Op::Rename { from, to } => {
                fs::rename(from, to).map_err(CheckpointError::io("renaming", from))
            }
            Op::Exchange { new, old, aside } => {
                if exchange(new, old)? {
                    return Ok(());
                }
                fs::rename(old, aside).map_err(CheckpointError::io("renaming", old))?;
                fs::rename(new, old).map_err(CheckpointError::io("renaming", new))
            }
            Op::RemoveAll(path) => {
                let removed = match fs::symlink_metadata(path) {
                    Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
                    Ok(_) => fs::remove_file(path),
                    Err(e) => Err(e),
                };
                match removed {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        Err(CheckpointError::io("removing", path)(e))
                    }
                    _ => Ok(()),
                }
            }
        }
    }
}

/// Flushes a directory's entries to disk, so that a rename in it survives a power cut.
pub(crate) fn sync_dir(path: &Path) -> Result<(), CheckpointError> {
    File::open(path)
        .and_then(|dir| dir.sync_all())
        .map_err(CheckpointError::io("syncing", path))
}

/// Swaps `a` and `b` atomically; `false` where the system or file system cannot.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn exchange(a: &Path, b: &Path) -> Result<bool, CheckpointError> {
    use nix::errno::Errno;
    use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
    match renameat2(AT_FDCWD, a, AT_FDCWD, b, RenameFlags::RENAME_EXCHANGE) {
        Ok(()) => Ok(true),
        Err(Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP) => Ok(false),
        Err(e) => Err(CheckpointError::io("exchanging", a)(std::io::Error::from(
            e,
        ))),
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn exchange(_a: &Path, _b: &Path) -> Result<bool, CheckpointError> {
    Ok(false)
}
