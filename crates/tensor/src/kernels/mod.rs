//! CPU kernels on plain slices: no shapes checks beyond what memory safety needs, no autograd.
//! The operations in [`crate::ops`] check shapes, call these, and record backward rules.
//!
//! Parallel kernels split work into fixed pieces that do not depend on the thread count or on
//! scheduling, and combine partial results in a fixed order: results are bit-identical from run
//! to run (and, except inside GEMM, across thread counts).
//!
//! The hot kernels are compiled twice, for x86-64's SSE2 baseline and for AVX2 + FMA, and pick
//! one when called: `#[multiversion]` on the function that does one chunk of the parallel
//! work (a rayon closure calling it, never holding the work itself: rayon's call shims inline
//! a closure without its features), with what it calls `#[inline(always)]` so that it is
//! compiled with the same features. A crate that depends on this one thus runs AVX2 wherever
//! the CPU has it, with no `target-cpu` flag, and gets the same bits either way ([`lanes`]).

#![allow(
    clippy::inline_always,
    reason = "helpers must be inlined into the AVX2 clones of the functions that call them"
)]

pub(crate) mod attention;
pub(crate) mod batch_norm;
pub(crate) mod batch_norm_pool;
pub(crate) mod conv;
pub(crate) mod conv_pool;
pub(crate) mod elementwise;
pub mod gemm;
pub(crate) mod geometry;
pub(crate) mod lanes;
pub(crate) mod patch_gram;
pub(crate) mod permute;
pub(crate) mod pool;
pub(crate) mod reduce;
pub(crate) mod softmax;
pub(crate) mod window_max;
pub(crate) mod winograd;

/// Elements per parallel task in elementwise kernels: large enough to amortise a task.
pub(crate) const CHUNK: usize = 1 << 14;
