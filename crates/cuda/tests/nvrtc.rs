//! The kernels' source against NVRTC, which needs no GPU: run wherever NVRTC's library is
//! found, a skip that the log shows otherwise. CI installs pip's `nvidia-cuda-nvrtc` and sets
//! `LOCKSTEP_REQUIRE_NVRTC=1`, which turns a skip into a failure.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "a test that meets an error must fail loudly"
)]

use lockstep_cuda::{CudaError, SOURCE, compile_kernels, compile_kernels_to_cubin};
use lockstep_testenv::{Need, skip};

/// The kernel names the source defines.
fn defined_kernels() -> Vec<&'static str> {
    SOURCE
        .split("extern \"C\" __global__ void ")
        .skip(1)
        .map(|rest| rest.split('(').next().unwrap())
        .collect()
}

fn compiled(arch: &str) -> Option<String> {
    match compile_kernels(arch) {
        Ok(ptx) => Some(ptx),
        Err(e @ CudaError::MissingLibrary { .. }) => {
            skip(Need::Nvrtc, e);
            None
        }
        Err(e) => panic!("the kernels do not compile for {arch}: {e}"),
    }
}

#[test]
fn every_kernel_compiles_for_hopper_and_ampere() {
    let kernels = defined_kernels();
    assert!(kernels.len() >= 20, "{kernels:?}");
    for arch in ["compute_90", "compute_80"] {
        let Some(ptx) = compiled(arch) else { return };
        for kernel in &kernels {
            assert!(
                ptx.contains(&format!(".entry {kernel}(")),
                "{kernel} missing from the PTX for {arch}"
            );
        }
        assert!(
            ptx.contains(&format!(".target sm_{}", &arch["compute_".len()..])),
            "{arch}"
        );
    }
}

#[test]
fn an_unknown_architecture_is_a_compile_error_with_the_compilers_words() {
    match compile_kernels("compute_1") {
        Err(CudaError::Compile { arch, log }) => {
            assert_eq!(arch, "compute_1");
            assert!(!log.is_empty());
        }
        Err(e @ CudaError::MissingLibrary { .. }) => skip(Need::Nvrtc, e),
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn every_kernel_compiles_to_machine_code_for_hopper_and_ampere() {
    let kernels = defined_kernels();
    for arch in ["sm_90", "sm_80"] {
        let cubin = match compile_kernels_to_cubin(arch) {
            Ok(cubin) => cubin,
            Err(e @ CudaError::MissingLibrary { .. }) => {
                skip(Need::Nvrtc, e);
                return;
            }
            Err(e) => panic!("the kernels do not compile to machine code for {arch}: {e}"),
        };
        assert!(cubin.starts_with(b"\x7fELF"), "{arch}: not an ELF image");
        for kernel in &kernels {
            assert!(
                cubin.windows(kernel.len()).any(|w| w == kernel.as_bytes()),
                "{kernel} missing from the machine code for {arch}"
            );
        }
    }
    match compile_kernels_to_cubin("sm_1") {
        Err(CudaError::Compile { arch, log }) => assert!(arch == "sm_1" && !log.is_empty()),
        other => panic!("expected a compile error, got {other:?}"),
    }
}

/// Set in the child process of the test below.
const SHADOWED_CHILD: &str = "LOCKSTEP_TEST_SHADOWED_CHILD";

#[test]
fn nvrtc_named_by_the_variable_is_refused_where_the_loader_finds_another_under_cudarcs_name() {
    if std::env::var_os(SHADOWED_CHILD).is_some() {
        match compile_kernels("compute_90") {
            Err(e @ CudaError::ShadowedLibrary { .. }) => println!("refused: {e}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        return;
    }
    let nvrtc = lockstep_cuda::libraries::locations()
        .into_iter()
        .find(|report| report.library == "libnvrtc.so.13")
        .and_then(|report| report.location.path().map(std::path::Path::to_path_buf));
    let Some(nvrtc) = nvrtc else {
        skip(Need::Nvrtc, "libnvrtc.so.13 is found nowhere");
        return;
    };
    // Another file the loader finds under `libnvrtc.so`, the first name cudarc asks for.
    let shadow = tempfile::tempdir().unwrap();
    std::fs::copy(&nvrtc, shadow.path().join("libnvrtc.so")).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "nvrtc_named_by_the_variable_is_refused_where_the_loader_finds_another_under_cudarcs_name",
            "--nocapture",
        ])
        .env(SHADOWED_CHILD, "1")
        .env("LD_LIBRARY_PATH", shadow.path())
        .env(
            lockstep_cuda::libraries::LIBRARY_PATH_VAR,
            nvrtc.parent().unwrap(),
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let said = format!(
        "but the loader finds another libnvrtc.so at {}",
        shadow.path().join("libnvrtc.so").display()
    );
    assert!(stdout.contains(&said), "{stdout}");
}
