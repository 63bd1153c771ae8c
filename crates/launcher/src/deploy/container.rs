//! The Containerfile of the image the Kubernetes manifests run: the example binaries, or the
//! user's program built from their crate, on a minimal base.

use super::{Artefact, Workload, header};

/// Where the image keeps the binaries; the manifests' commands start with it.
pub(super) const BIN_DIR: &str = "/usr/local/bin";
/// The user and group distroless' `nonroot` images run as.
pub(super) const NONROOT_ID: u32 = 65532;
/// The Rust toolchain image of the build stage: the workspace's `rust-version`.
const BUILD_IMAGE: &str = "docker.io/library/rust:1.95-bookworm";
/// The base of the final image: glibc and libgcc (which the binaries link, and which a GPU
/// build's `dlopen` of the CUDA driver needs), no shell, no package manager.
const RUN_IMAGE: &str = "gcr.io/distroless/cc-debian12:nonroot";
/// The binaries the image holds: the trainers the manifests can run, and `cluster_info`, which
/// prints how a pod resolved its cluster (`kubectl exec` is of no use without a shell, but a
/// debug pod can run it).
pub(super) const BINARIES: [&str; 3] = ["mnist_keras", "mnist_estimator", "cluster_info"];

/// The Containerfile and the ignore file that keeps the build context small.
pub(super) fn files(workload: Workload<'_>) -> Vec<Artefact> {
    let text = match workload {
        Workload::Example(..) => containerfile(),
        Workload::Program(program, _) => program_containerfile(program),
    };
    vec![
        Artefact {
            name: "Containerfile",
            private: false,
            text,
        },
        Artefact {
            // BuildKit and Podman read `<file>.dockerignore` beside the file given with `-f`.
            name: "Containerfile.dockerignore",
            private: false,
            text: "/target\n/.git\n".to_owned(),
        },
    ]
}

fn containerfile() -> String {
    let bins: Vec<String> = BINARIES.iter().map(|b| format!("--bin {b}")).collect();
    let built: Vec<String> = BINARIES
        .iter()
        .map(|b| format!("/src/target/release/{b}"))
        .collect();
    format!(
        "{header}\
# Build it from the repository root (the build context is the whole workspace):
#   docker build -f target/deploy/k8s/Containerfile -t lockstep-examples:{version} .
# The MNIST digits are compiled into the binaries; the image needs no data files.

FROM {BUILD_IMAGE} AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p lockstep-examples {bins}

FROM {RUN_IMAGE}
COPY --from=build {built} {BIN_DIR}/
USER {NONROOT_ID}:{NONROOT_ID}
ENTRYPOINT [\"{BIN_DIR}/{first}\"]
",
        header = header(
            "k8s",
            "The image of the Lockstep examples, built in two stages."
        ),
        version = env!("CARGO_PKG_VERSION"),
        bins = bins.join(" "),
        built = built.join(" "),
        first = BINARIES[0],
    )
}

/// The image of the user's `program`: a binary of the crate the build context holds.
fn program_containerfile(program: &str) -> String {
    format!(
        "{header}\
# Build it from your crate's root (the build context is the crate, or its workspace):
#   docker build -f target/deploy/k8s/Containerfile -t {program}:latest .

FROM {BUILD_IMAGE} AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin {program}

FROM {RUN_IMAGE}
COPY --from=build /src/target/release/{program} {BIN_DIR}/
USER {NONROOT_ID}:{NONROOT_ID}
ENTRYPOINT [\"{BIN_DIR}/{program}\"]
",
        header = header(
            "k8s",
            "The image of your Lockstep program, built in two stages."
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace_root() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    fn read(path: &str) -> String {
        std::fs::read_to_string(workspace_root().join(path)).unwrap()
    }

    #[test]
    fn the_build_stage_uses_the_workspaces_rust_version() {
        let manifest: toml_edit::DocumentMut = read("Cargo.toml").parse().unwrap();
        let version = manifest["workspace"]["package"]["rust-version"]
            .as_str()
            .unwrap();
        assert!(
            BUILD_IMAGE.contains(&format!(":{version}-")),
            "{BUILD_IMAGE} is not Rust {version}"
        );
    }

    #[test]
    fn every_binary_copied_is_an_example_of_the_package_built() {
        let manifest: toml_edit::DocumentMut = read("examples/Cargo.toml").parse().unwrap();
        assert_eq!(
            manifest["package"]["name"].as_str(),
            Some("lockstep-examples")
        );
        let bins: Vec<&str> = manifest["bin"]
            .as_array_of_tables()
            .unwrap()
            .iter()
            .filter_map(|b| b["name"].as_str())
            .collect();
        for binary in BINARIES {
            assert!(
                bins.contains(&binary),
                "{binary} is not a [[bin]] of lockstep-examples"
            );
        }
        for trainer in [
            super::super::Trainer::MnistKeras,
            super::super::Trainer::MnistEstimator,
        ] {
            assert!(BINARIES.contains(&trainer.binary()));
        }
    }

    #[test]
    fn the_containerfile_builds_in_one_stage_and_runs_in_another() {
        let text = containerfile();
        let froms: Vec<&str> = text.lines().filter(|l| l.starts_with("FROM ")).collect();
        assert_eq!(
            froms,
            [
                format!("FROM {BUILD_IMAGE} AS build"),
                format!("FROM {RUN_IMAGE}")
            ]
        );
        let copy = text
            .lines()
            .find(|l| l.starts_with("COPY --from=build"))
            .unwrap();
        for binary in BINARIES {
            assert!(
                copy.contains(&format!("/src/target/release/{binary} ")),
                "{copy}"
            );
        }
        assert!(copy.ends_with(&format!(" {BIN_DIR}/")));
        assert!(text.contains(&format!("USER {NONROOT_ID}:{NONROOT_ID}")));
    }

    #[test]
    fn a_programs_image_builds_that_binary_of_the_users_crate() {
        let text = program_containerfile("my_trainer");
        assert!(text.contains("RUN cargo build --release --locked --bin my_trainer\n"));
        assert!(text.contains(&format!(
            "COPY --from=build /src/target/release/my_trainer {BIN_DIR}/\n"
        )));
        assert!(text.contains(&format!("ENTRYPOINT [\"{BIN_DIR}/my_trainer\"]")));
        assert!(!text.contains("lockstep-examples"));
    }
}
