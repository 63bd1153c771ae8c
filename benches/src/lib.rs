//! Criterion benchmarks of Lockstep's crates, one bench target per concern (`benches/`).
//! The library is empty: the package exists to hold the benchmarks and their dependencies.
//!
//! ```text
//! cargo bench -p lockstep-benches --bench data_pipeline
//! ```
