//! `cargo xtask run-cluster`: builds an example and the `lockstep` launcher, then becomes
//! `lockstep run [OPTIONS] -- EXAMPLE [ARGS]`.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt as _;
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::build_example::build_example;

/// The example run when `--example` is not given: synchronous training on the embedded MNIST.
const DEFAULT_EXAMPLE: &str = "mnist_keras";

/// What `cargo xtask run-cluster --help` prints before the launcher's own help.
const HELP: &str = "\
Build an example and start it as a local cluster with `lockstep run`.

Usage: cargo xtask run-cluster [--example NAME] [--profile PROFILE] [LAUNCHER OPTIONS] [-- ARGS]

  --example NAME       the example binary every task runs [default: mnist_keras]
  --profile PROFILE    the cargo profile to build it with [default: release]

Every other option is `lockstep run`'s, and ARGS go to every task:
";

/// `run-cluster`'s own options, taken out of the arguments; the rest go to the launcher.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct RunCluster {
    pub(crate) example: String,
    pub(crate) profile: String,
    /// The launcher's options, before the `--`.
    pub(crate) launcher_options: Vec<OsString>,
    /// The example's arguments, after the `--`.
    pub(crate) example_args: Vec<OsString>,
    pub(crate) help: bool,
}

impl RunCluster {
    /// Reads the arguments that follow `run-cluster`.
    pub(crate) fn parse(args: impl IntoIterator<Item = OsString>) -> anyhow::Result<Self> {
        let mut parsed = Self {
            example: DEFAULT_EXAMPLE.to_owned(),
            profile: "release".to_owned(),
            launcher_options: Vec::new(),
            example_args: Vec::new(),
            help: false,
        };
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            if arg == "--" {
                parsed.example_args.extend(args);
                break;
            }
            let text = arg.to_string_lossy();
            let (name, inline) = match text.split_once('=') {
                Some((name, value)) => (name, Some(value.to_owned())),
                None => (text.as_ref(), None),
            };
            let slot = match name {
                "--example" => &mut parsed.example,
                "--profile" => &mut parsed.profile,
                "--help" | "-h" => {
                    parsed.help = true;
                    continue;
                }
                _ => {
                    parsed.launcher_options.push(arg);
                    continue;
                }
            };
            *slot = match inline {
                Some(value) => value,
                None => args
                    .next()
                    .with_context(|| format!("{name} needs a value"))?
                    .into_string()
                    .map_err(|v| anyhow::anyhow!("{name} {} is not UTF-8", v.display()))?,
            };
        }
        Ok(parsed)
    }

    /// The launcher's command line for the example built at `example`.
    pub(crate) fn launcher_args(&self, example: &OsStr) -> Vec<OsString> {
        let mut args = vec![OsString::from("run")];
        args.extend(self.launcher_options.iter().cloned());
        args.push("--".into());
        args.push(example.to_owned());
        args.extend(self.example_args.iter().cloned());
        args
    }
}

/// Builds the example and the launcher, then replaces this process with the launcher, so that
/// signals sent to `cargo xtask run-cluster` reach it directly.
pub(crate) fn run(args: impl IntoIterator<Item = OsString>) -> anyhow::Result<()> {
    let parsed = RunCluster::parse(args)?;
    let built = build_example(&parsed.example, &parsed.profile)?;
    if parsed.help {
        print!("{HELP}");
        let status = Command::new(&built.launcher)
            .args(["run", "--help"])
            .status()?;
        if !status.success() {
            bail!("`lockstep run --help` failed with {status}");
        }
        return Ok(());
    }
    let err = Command::new(&built.launcher)
        .args(parsed.launcher_args(built.example.as_os_str()))
        .exec();
    Err(err).with_context(|| format!("starting {}", built.launcher.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> RunCluster {
        RunCluster::parse(args.iter().map(OsString::from)).unwrap()
    }

    #[test]
    fn the_example_and_profile_are_taken_anywhere_before_the_separator() {
        let parsed = parse(&[
            "--workers",
            "3",
            "--example=cluster_info",
            "--profile",
            "dev",
            "--chief",
            "--",
            "--example",
            "x",
        ]);
        assert_eq!(parsed.example, "cluster_info");
        assert_eq!(parsed.profile, "dev");
        assert_eq!(parsed.launcher_options, ["--workers", "3", "--chief"]);
        assert_eq!(parsed.example_args, ["--example", "x"]);
        assert_eq!(
            parsed.launcher_args(OsStr::new("/t/cluster_info")),
            [
                "run",
                "--workers",
                "3",
                "--chief",
                "--",
                "/t/cluster_info",
                "--example",
                "x"
            ]
        );
    }

    #[test]
    fn no_arguments_run_the_default_example_in_release() {
        let parsed = parse(&[]);
        assert_eq!(
            (parsed.example.as_str(), parsed.profile.as_str()),
            (DEFAULT_EXAMPLE, "release")
        );
        assert_eq!(parsed.launcher_args(OsStr::new("e")), ["run", "--", "e"]);
    }

    #[test]
    fn an_option_without_its_value_is_an_error() {
        assert!(RunCluster::parse([OsString::from("--example")]).is_err());
    }
}
