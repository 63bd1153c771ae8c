//! Generates the gRPC service from `proto/collective.proto` with `protox`, a protobuf compiler
//! in pure Rust: building needs no system `protoc`.

#[cfg_attr(
    not(feature = "grpc"),
    allow(
        clippy::unnecessary_wraps,
        reason = "without the grpc feature there is nothing to generate, and nothing to fail"
    )
)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/collective.proto");
    #[cfg(feature = "grpc")]
    generate()?;
    Ok(())
}

/// The service's Rust code, with the `grpc` feature only.
#[cfg(feature = "grpc")]
fn generate() -> Result<(), Box<dyn std::error::Error>> {
    let descriptors = protox::compile(["proto/collective.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .bytes(".")
        .compile_fds(descriptors)?;
    Ok(())
}
