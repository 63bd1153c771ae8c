//! The GPU machine's list of tests (`xtask/src/gpu_check/expected.rs`) against this build:
//! every test it names exists, and every GPU test is named, so that a renamed or new GPU test
//! cannot drop out of the GPU run unnoticed on the machines that have no GPU. The check lists
//! the tests of the workspace's test build, which the README's test command has made by the
//! time this test runs (run alone, it builds them first).

#![allow(
    clippy::unwrap_used,
    reason = "a test that meets an error must fail loudly"
)]

use lockstep_e2e::xtask;

#[test]
fn the_gpu_machines_list_names_every_gpu_test_of_this_build_and_nothing_else() {
    let out = xtask(&["gpu-check", "--check-names"]).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("tests the GPU machine runs exists, and no GPU test is left unnamed"),
        "{stdout}"
    );
}
