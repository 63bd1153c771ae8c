//! Groups of ranks on threads of this process, over every transport: what each collective
//! computes and how it is numbered (`conformance`, `hierarchical`), where a rank listens
//! (`binding`), ranks on one host (`same_host`), and how failures and hostile peers are met
//! (`failures`, `hostile_peers`).
//!
//! One test executable: many of these tests wait on a peer's timeout, and in one executable
//! they wait side by side (and the crate's generic code is compiled once for all of them).

mod binding;
mod common;
mod conformance;
mod failures;
mod hierarchical;
mod hostile_peers;
mod same_host;
