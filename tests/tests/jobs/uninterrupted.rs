//! The weights that one uninterrupted epoch of `mnist_keras` on 2 workers ends with
//! ([`lockstep_e2e::keras_epoch`] with no launcher options), which every job killed and
//! restarted from its backups must end with too. One run serves every test that compares
//! against it: the same seeds and layout give the same bits each time, and each comparison
//! is with a run of the test's own.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::sync::OnceLock;

/// Each worker's weights checksum after the uninterrupted epoch; the first caller runs it,
/// the others wait for its result.
pub(crate) fn weights() -> Vec<String> {
    static WEIGHTS: OnceLock<Result<Vec<String>, String>> = OnceLock::new();
    WEIGHTS
        .get_or_init(|| {
            let backup = tempfile::tempdir().map_err(|e| e.to_string())?;
            lockstep_e2e::keras_epoch(backup.path(), &[]).map(|(_, weights)| weights)
        })
        .clone()
        .unwrap()
}
