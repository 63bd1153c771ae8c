//! Buffers kept between calls: each thread's transformed tiles and products, and the backward
//! passes' per-part kernel-gradient sums, so that a training step does not zero-fill and fault
//! in megabytes of fresh memory.

use std::cell::Cell;
use std::sync::{Mutex, PoisonError};

use super::BACKWARD_PARTS;

/// Buffers a thread reuses from chunk to chunk.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    /// Transformed input, `[points][tiles][c]`.
    pub(super) transformed: Vec<f32>,
    /// Products, or the transformed output gradient, `[points][tiles][f]`.
    pub(super) products: Vec<f32>,
}

thread_local! {
    /// Each thread's scratch between tasks, so that its buffers are sized (and zero-filled)
    /// once per thread rather than once per task.
    static KEPT: Cell<Scratch> = Cell::new(Scratch::default());
}

/// A task's scratch: the thread's kept buffers, put back when the task ends. A task that runs
/// inside another on the same thread (rayon may steal work while one waits) finds the store
/// empty and starts afresh; one of the two sets of buffers is kept.
#[derive(Debug)]
pub(super) struct KeptScratch(Scratch);

impl KeptScratch {
    pub(super) fn take() -> Self {
        KeptScratch(KEPT.take())
    }
}

impl Drop for KeptScratch {
    fn drop(&mut self) {
        KEPT.set(std::mem::take(&mut self.0));
    }
}

impl std::ops::Deref for KeptScratch {
    type Target = Scratch;
    fn deref(&self) -> &Scratch {
        &self.0
    }
}

impl std::ops::DerefMut for KeptScratch {
    fn deref_mut(&mut self) -> &mut Scratch {
        &mut self.0
    }
}

/// The first `len` values of `buffer`, grown (with zeros) if it is shorter: every caller
/// overwrites what it uses, so what a buffer held before does not matter.
pub(super) fn sized(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buffer.len() < len {
        buffer.resize(len, 0.0);
    }
    &mut buffer[..len]
}

/// The backward passes' per-part kernel-gradient sums, kept from call to call: a part's first
/// chunk writes its sums, so a kept buffer needs no zero-fill, where fresh ones (2.4 MB a step
/// for the tutorial CNN's conv2) were zero-filled and faulted in every step.
pub(super) static KEPT_SUMS: Mutex<Vec<Vec<f32>>> = Mutex::new(Vec::new());

/// A buffer of `len` values whose contents are left over from an earlier call.
pub(super) fn kept_sums(len: usize) -> Vec<f32> {
    let kept = KEPT_SUMS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pop();
    let mut sums = kept.unwrap_or_default();
    sums.resize(len, 0.0);
    sums
}

/// Keeps `buffers` for later calls, up to two passes' worth.
pub(super) fn keep_sums(buffers: impl Iterator<Item = Vec<f32>>) {
    let mut kept = KEPT_SUMS.lock().unwrap_or_else(PoisonError::into_inner);
    for buffer in buffers {
        if kept.len() < 2 * BACKWARD_PARTS && !buffer.is_empty() {
            kept.push(buffer);
        }
    }
}
