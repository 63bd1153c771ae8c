//! What Lockstep's tests take from the machine they run on: resources that some machines
//! lack (a GPU, network namespaces, SLURM…), and TCP ports that no other test holds.
//!
//! # Skips that a passing run shows
//!
//! libtest has no way for a test to say that it did not run: a test that returns early passes,
//! and what it printed is hidden with the rest of a passing test's output. A test that cannot
//! run here calls [`skip`] (or [`available`]), which
//!
//! - fails the test when the environment says the resource was provided
//!   (`LOCKSTEP_REQUIRE_<RESOURCE>=1`, see [`Need::variable`]): a machine that was set up for
//!   a test runs it, or the suite is red;
//! - otherwise writes `SKIPPED <file> <test>: needs <resource> (<why>)` to the process's
//!   standard error itself, past libtest's capture, so the line stands in the log of a
//!   passing run, and appends the same skip to the file named by `LOCKSTEP_SKIP_LOG`, where
//!   CI counts the skips of the whole run and names them.
//!
//! ```
//! use lockstep_testenv::{Need, available};
//!
//! fn gpu_count() -> Result<usize, String> {
//!     Err("no CUDA driver".to_owned())
//! }
//!
//! # fn a_test() {
//! let Some(count) = available(Need::Gpu, gpu_count()) else {
//!     return; // skipped, and the log says so
//! };
//! assert!(count > 0);
//! # }
//! ```
//!
//! # Ports
//!
//! [`unused_ports`] picks neighbouring free ports for tests whose processes bind them by
//! number; tests that bind in-process hand a bound listener over instead.
//!
//! This crate is a dev-dependency of the workspace's crates and is not published.

use std::fmt::Display;
use std::io::Write as _;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

mod ports;

pub use ports::unused_ports;

/// The variable that names the file skips are appended to, one line each:
/// `file<TAB>test<TAB>resource<TAB>why`.
pub const SKIP_LOG_VAR: &str = "LOCKSTEP_SKIP_LOG";

/// The skips this process has reported: (file, test, resource).
static SKIPPED: Mutex<Vec<(&'static str, String, Need)>> = Mutex::new(Vec::new());

/// A resource some tests need and some machines lack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Need {
    /// A CUDA GPU with NVIDIA's driver and libraries.
    Gpu,
    /// Two CUDA GPUs, for groups of GPUs in one process.
    TwoGpus,
    /// NVIDIA's runtime compiler, NVRTC (no GPU needed).
    Nvrtc,
    /// Network namespaces joined by veth pairs and shaped by `tc` (root or `CAP_NET_ADMIN`,
    /// iproute2).
    NetworkNamespaces,
    /// SLURM: its commands, and for a job a running controller and node.
    Slurm,
    /// Debian's `dataset-fashion-mnist` under `/usr/share/datasets/fashion-mnist`.
    FashionMnist,
    /// Root, to run a process as another user.
    Root,
    /// A pseudo-terminal, through util-linux's `script`.
    Terminal,
    /// A `python3` on `PATH`.
    Python,
}

impl Need {
    /// Every resource, in the order CI reports them.
    pub const ALL: [Self; 9] = [
        Self::Gpu,
        Self::TwoGpus,
        Self::Nvrtc,
        Self::NetworkNamespaces,
        Self::Slurm,
        Self::FashionMnist,
        Self::Root,
        Self::Terminal,
        Self::Python,
    ];

    /// The variable that, set to `1`, says this resource is provided and turns a skip for
    /// want of it into a failure.
    pub fn variable(self) -> &'static str {
        match self {
            Self::Gpu => "LOCKSTEP_REQUIRE_GPU",
            Self::TwoGpus => "LOCKSTEP_REQUIRE_TWO_GPUS",
            Self::Nvrtc => "LOCKSTEP_REQUIRE_NVRTC",
            Self::NetworkNamespaces => "LOCKSTEP_REQUIRE_NETNS",
            Self::Slurm => "LOCKSTEP_REQUIRE_SLURM",
            Self::FashionMnist => "LOCKSTEP_REQUIRE_FASHION_MNIST",
            Self::Root => "LOCKSTEP_REQUIRE_ROOT",
            Self::Terminal => "LOCKSTEP_REQUIRE_TERMINAL",
            Self::Python => "LOCKSTEP_REQUIRE_PYTHON",
        }
    }

    /// What the resource is, in words.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Gpu => "a GPU",
            Self::TwoGpus => "two GPUs",
            Self::Nvrtc => "NVRTC",
            Self::NetworkNamespaces => "network namespaces",
            Self::Slurm => "SLURM",
            Self::FashionMnist => "Fashion-MNIST",
            Self::Root => "root",
            Self::Terminal => "a terminal",
            Self::Python => "python3",
        }
    }

    /// Whether the environment says this resource is provided (its [`Need::variable`] is
    /// `1`), so that a test wanting it must run.
    pub fn is_required(self) -> bool {
        std::env::var_os(self.variable()).is_some_and(|v| v == "1")
    }
}

impl Display for Need {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

/// The calling test cannot run here for want of `need`, because of `why`: a failure when
/// `need` is required ([`Need::is_required`]), else a skip that the log shows and
/// `LOCKSTEP_SKIP_LOG` records. The caller returns after it.
///
/// # Panics
///
/// When `need` is required: the test fails, naming the variable and `why`.
#[track_caller]
pub fn skip(need: Need, why: impl Display) {
    let file = std::panic::Location::caller().file();
    let why = why.to_string();
    assert!(
        !need.is_required(),
        "{}=1 says {need} is provided, but {why}",
        need.variable()
    );
    let test = std::thread::current()
        .name()
        .map_or_else(|| "(unnamed thread)".to_owned(), str::to_owned);
    // A property test asks once per case: one skip is reported per test and resource.
    {
        let mut skipped = SKIPPED.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (file, test.clone(), need);
        if skipped.contains(&key) {
            return;
        }
        skipped.push(key);
    }
    let line = format!(
        "SKIPPED {file} {test}: needs {need} ({why}); {}=1 makes this a failure\n",
        need.variable()
    );
    // Straight to the file descriptor: `eprintln!` would be captured, and hidden, with the
    // rest of a passing test's output.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
    if let Some(log) = std::env::var_os(SKIP_LOG_VAR) {
        record(Path::new(&log), &[file, &test, need.describe(), &why]);
    }
}

/// `found`'s value, or `None` after [`skip`] for want of `need`, with the error as the reason.
///
/// # Panics
///
/// When `found` is an error and `need` is required.
#[track_caller]
pub fn available<T, E: Display>(need: Need, found: Result<T, E>) -> Option<T> {
    match found {
        Ok(value) => Some(value),
        Err(e) => {
            skip(need, e);
            None
        }
    }
}

/// Appends one skip to the log as a line of tab-separated fields (tabs and line breaks inside
/// a field become spaces). One `write` of the whole line to a file opened for appending, so
/// test processes that skip at once do not interleave.
fn record(log: &Path, fields: &[&str]) {
    let mut line = fields
        .iter()
        .map(|field| field.replace(['\t', '\n', '\r'], " "))
        .collect::<Vec<_>>()
        .join("\t");
    line.push('\n');
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .and_then(|mut file| file.write_all(line.as_bytes()));
    if let Err(e) = written {
        let _ = writeln!(
            std::io::stderr(),
            "{SKIP_LOG_VAR}: cannot append to {}: {e}",
            log.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_resource_has_its_own_variable() {
        let mut variables: Vec<&str> = Need::ALL.iter().map(|n| n.variable()).collect();
        variables.sort_unstable();
        variables.dedup();
        assert_eq!(variables.len(), Need::ALL.len());
        assert!(variables.iter().all(|v| v.starts_with("LOCKSTEP_REQUIRE_")));
    }

    #[test]
    fn a_skip_is_appended_to_the_log_as_one_line_of_fields() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("skips.tsv");
        record(&log, &["a.rs", "t::one", "a GPU", "no\tdriver\nat all"]);
        record(&log, &["b.rs", "t::two", "SLURM", "down"]);
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(
            text,
            "a.rs\tt::one\ta GPU\tno driver at all\nb.rs\tt::two\tSLURM\tdown\n"
        );
    }

    #[test]
    fn an_available_resource_hands_its_value_over() {
        assert_eq!(available(Need::Python, Ok::<_, String>(3)), Some(3));
    }

    /// Runs this very test in a child process (the child takes the other branch), with
    /// `require` as `LOCKSTEP_REQUIRE_PYTHON`: (whether it passed, its stderr, the log).
    fn skip_in_a_child(require: &str) -> (bool, String, String) {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("skips.tsv");
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "tests::a_skip_is_shown_and_logged_unless_required_where_it_fails",
            ])
            .env(CHILD_VAR, "1")
            .env(Need::Python.variable(), require)
            .env(SKIP_LOG_VAR, &log)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        (out.status.success(), stderr + &stdout, logged)
    }

    const CHILD_VAR: &str = "LOCKSTEP_TESTENV_CHILD";

    #[test]
    fn a_skip_is_shown_and_logged_unless_required_where_it_fails() {
        if std::env::var_os(CHILD_VAR).is_some() {
            skip(Need::Python, "the parent test asked for a skip");
            return;
        }
        let (passed, output, logged) = skip_in_a_child("0");
        assert!(passed, "{output}");
        assert!(
            output.contains(
                "SKIPPED crates/testenv/src/lib.rs tests::a_skip_is_shown_and_logged_unless_required_where_it_fails: needs python3 (the parent test asked for a skip)"
            ),
            "{output}"
        );
        assert_eq!(
            logged,
            "crates/testenv/src/lib.rs\ttests::a_skip_is_shown_and_logged_unless_required_where_it_fails\tpython3\tthe parent test asked for a skip\n"
        );
        let (passed, output, logged) = skip_in_a_child("1");
        assert!(!passed, "{output}");
        assert!(
            output.contains(
                "LOCKSTEP_REQUIRE_PYTHON=1 says python3 is provided, but the parent test asked for a skip"
            ),
            "{output}"
        );
        assert_eq!(logged, "");
    }
}
