//! Generates the gRPC service from `proto/collective.proto` with `protox`, a protobuf compiler
//! in pure Rust: building needs no system `protoc`.

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
