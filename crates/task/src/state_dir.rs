//! A directory for a program's default state that only its user can write.

use std::path::{Path, PathBuf};

use crate::error::TaskError;

/// A directory for this user's default state (backups, checkpoints, model directories) under
/// the system's temporary directory: `lockstep-<uid>`, made readable and writable by this user
/// only when missing. The names inside stay predictable, so a restarted task finds its backup,
/// but no other local user can plant a checkpoint there: a directory of that name that is a
/// link, belongs to another user, or is open to others is refused.
///
/// # Errors
///
/// When the directory cannot be made, or is not this user's alone.
pub fn private_state_dir() -> Result<PathBuf, TaskError> {
    private_dir_in(&std::env::temp_dir())
}

/// [`private_state_dir`] under `base`.
fn private_dir_in(base: &Path) -> Result<PathBuf, TaskError> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
    let uid = nix::unistd::geteuid().as_raw();
    let dir = base.join(format!("lockstep-{uid}"));
    let io = |what: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |error| TaskError::Io { what, path, error }
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io("making", &dir)(e)),
    }
    let metadata = std::fs::symlink_metadata(&dir).map_err(io("checking", &dir))?;
    if !metadata.is_dir() || metadata.uid() != uid || metadata.mode() & 0o077 != 0 {
        return Err(TaskError::NotPrivate {
            path: dir,
            owner: metadata.uid(),
            mode: metadata.mode() & 0o7777,
        });
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        reason = "a test that meets an error must fail loudly"
    )]

    use super::*;

    #[test]
    fn the_private_state_dir_is_this_users_alone() {
        use std::os::unix::fs::PermissionsExt as _;
        let base = tempfile::tempdir().unwrap();
        let dir = private_dir_in(base.path()).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
        // Opened to others (as a planted directory would be), it is refused, naming it.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = private_dir_in(base.path()).unwrap_err().to_string();
        assert!(
            err.contains("not a directory of this user's alone"),
            "{err}"
        );
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(private_dir_in(base.path()).unwrap(), dir);
        // A link in its place is refused too.
        std::fs::remove_dir(&dir).unwrap();
        std::os::unix::fs::symlink(base.path(), &dir).unwrap();
        assert!(private_dir_in(base.path()).is_err());
    }
}
