//! `cargo xtask deploy ARGS`: builds the launcher, then becomes `lockstep deploy ARGS`.

use std::ffi::OsString;
use std::os::unix::process::CommandExt as _;
use std::process::Command;

use anyhow::Context as _;

use crate::build_example::{build_launcher, workspace_root};

/// Builds the launcher and replaces this process with `lockstep deploy ARGS`, run in the
/// workspace root (where `target/deploy` is its default output).
pub(crate) fn run(args: impl IntoIterator<Item = OsString>) -> anyhow::Result<()> {
    let launcher = build_launcher()?;
    let err = Command::new(&launcher)
        .arg("deploy")
        .args(args)
        .current_dir(workspace_root())
        .exec();
    Err(err).with_context(|| format!("starting {}", launcher.display()))
}
