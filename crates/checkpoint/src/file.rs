//! A single safetensors file of named tensors, written atomically: Keras' `save_weights`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::durable::Op;
use crate::error::CheckpointError;
use crate::tensors::{NamedTensor, decode_with_metadata, encode};

/// Writes `tensors` to `path` as safetensors: into a hidden temporary file beside it
/// (`.<name>.tmp-<pid>`, so a program watching the directory for new files can skip it),
/// flushed to disk, then renamed over `path`, so a reader sees the old file or the new one,
/// never part.
///
/// ```
/// use lockstep_checkpoint::{NamedTensor, read_tensors, write_tensors};
///
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("weights.safetensors");
/// write_tensors(&path, &[NamedTensor::new("dense/bias", vec![2], vec![1.0, 2.0])?])?;
/// assert_eq!(read_tensors(&path)?[0].values, [1.0, 2.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// [`CheckpointError::Io`] naming the path when it cannot be written (a missing or read-only
/// directory); [`CheckpointError::Invalid`] for tensors whose values do not fill their shape.
pub fn write_tensors(path: &Path, tensors: &[NamedTensor]) -> Result<(), CheckpointError> {
    write_tensors_with_metadata(path, tensors, &BTreeMap::new())
}

/// [`write_tensors`] with string `metadata` in the file's header (safetensors'
/// `__metadata__`), such as the training step the tensors are of.
///
/// ```
/// use std::collections::BTreeMap;
/// use lockstep_checkpoint::{NamedTensor, read_tensors_with_metadata, write_tensors_with_metadata};
///
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("ckpt-1");
/// let metadata = BTreeMap::from([("iterations".to_owned(), "63".to_owned())]);
/// write_tensors_with_metadata(&path, &[NamedTensor::new("w", vec![1], vec![0.5])?], &metadata)?;
/// let (tensors, read) = read_tensors_with_metadata(&path)?;
/// assert_eq!((tensors[0].values.as_slice(), read), ([0.5].as_slice(), metadata));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// As [`write_tensors`].
pub fn write_tensors_with_metadata(
    path: &Path,
    tensors: &[NamedTensor],
    metadata: &BTreeMap<String, String>,
) -> Result<(), CheckpointError> {
    let bytes = encode(tensors, metadata)?;
    let name = path
        .file_name()
        .ok_or_else(|| CheckpointError::Invalid(format!("{} names no file", path.display())))?;
    let mut temporary = std::ffi::OsString::from(".");
    temporary.push(name);
    temporary.push(format!(".tmp-{}", std::process::id()));
    let temporary = path.with_file_name(temporary);
    let dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let ops = [
        Op::Write {
            path: temporary.clone(),
            bytes,
        },
        Op::Rename {
            from: temporary.clone(),
            to: path.to_path_buf(),
        },
        Op::SyncDir(dir),
    ];
    for op in &ops {
        if let Err(e) = op.run() {
            let _ = Op::RemoveAll(temporary).run();
            return Err(e);
        }
    }
    Ok(())
}

/// Reads a safetensors file of `F32` tensors (any writer's: the names are the file's).
///
/// # Errors
///
/// [`CheckpointError::Damaged`] for a missing, truncated or foreign file.
pub fn read_tensors(path: &Path) -> Result<Vec<NamedTensor>, CheckpointError> {
    read_tensors_with_metadata(path).map(|(tensors, _)| tensors)
}

/// [`read_tensors`], and the metadata of the file's header (empty when it has none).
///
/// # Errors
///
/// As [`read_tensors`].
pub fn read_tensors_with_metadata(
    path: &Path,
) -> Result<(Vec<NamedTensor>, BTreeMap<String, String>), CheckpointError> {
    use std::io::Read as _;
    let (file, size) = open_regular(path, true)?;
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    // No more than the size the file had when opened, whatever is appended meanwhile.
    file.take(size)
        .read_to_end(&mut bytes)
        .map_err(CheckpointError::io("reading", path))?;
    decode_with_metadata(&bytes, path)
}

/// Opens `path` for reading if it is a regular file (through symbolic links when
/// `follow_links`), with its size: a FIFO, a device or (not following) a link is refused as
/// damage before anything is read, so neither a FIFO that never ends nor `/dev/zero` can hang
/// or exhaust the reader. A missing file is damage too.
pub(crate) fn open_regular(
    path: &Path,
    follow_links: bool,
) -> Result<(std::fs::File, u64), CheckpointError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut flags = nix::fcntl::OFlag::O_NONBLOCK;
    if !follow_links {
        flags |= nix::fcntl::OFlag::O_NOFOLLOW;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits())
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => CheckpointError::damaged(path, "the file is missing"),
            // O_NOFOLLOW on a link.
            _ if e.raw_os_error() == Some(nix::libc::ELOOP) => {
                CheckpointError::damaged(path, "a symbolic link, not a file")
            }
            _ => CheckpointError::io("opening", path)(e),
        })?;
    let meta = file
        .metadata()
        .map_err(CheckpointError::io("reading", path))?;
    if !meta.is_file() {
        return Err(CheckpointError::damaged(
            path,
            format!("not a regular file ({:?})", meta.file_type()),
        ));
    }
    Ok((file, meta.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_that_does_not_exist_is_an_error_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing/w.safetensors");
        let err = write_tensors(&path, &[]).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
        let err = read_tensors(&path).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
    }

    #[test]
    fn writing_again_replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        for fill in [1.0, 2.0] {
            write_tensors(
                &path,
                &[NamedTensor::new("w", vec![3], vec![fill; 3]).unwrap()],
            )
            .unwrap();
        }
        assert_eq!(read_tensors(&path).unwrap()[0].values, [2.0; 3]);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
