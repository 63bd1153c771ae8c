//! Criterion benchmarks of Lockstep's crates, one bench target per concern (`benches/`).
//! The library is empty: the package exists to hold the benchmarks and their dependencies:
//! `criterion` runs them (behind the package's `bench` feature, which every benchmark asks for,
//! so that the workspace's test build neither compiles it nor lets it change the features of
//! the crates the libraries share with it); `mimalloc` is the caching allocator every ML framework ships (the
//! training benches would otherwise time the system allocator's page faults); `ndarray` is the
//! reference matrix product; `rayon` builds the 1- and 2-thread pools; `wide` gives the peak-FLOP
//! loop the 8-lane vectors the kernels use; `serde_json` writes the optimizer settings of the
//! parameter server's shards (`lockstep-ps`) as their protocol carries them.
//!
//! ```text
//! cargo bench -p lockstep-benches --features bench --bench data_pipeline
//! ```
