//! Counts of the copies between host and device that the calling thread has asked for: what
//! shows that a training step keeps its parameters, gradients and optimizer state on the GPU
//! and reads back only its loss.
//!
//! Counted per thread because work is queued by the thread that calls an operation: a test or
//! a training loop sees exactly its own copies, whatever other threads do on the same device.

use std::cell::Cell;

/// Host↔device copies asked for by one thread since it started.
///
/// ```
/// use lockstep_cuda::Transfers;
///
/// let before = Transfers::on_this_thread();
/// // … a training step on the GPU …
/// let step = Transfers::on_this_thread() - before;
/// assert_eq!(step.to_host, 0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Transfers {
    /// Copies from host memory to a device (uploads of values and of labels).
    pub to_device: u64,
    /// Copies from a device back to host memory; each waits for the device's queued work.
    pub to_host: u64,
}

thread_local! {
    static COUNTS: Cell<Transfers> = const { Cell::new(Transfers { to_device: 0, to_host: 0 }) };
}

impl Transfers {
    /// The copies this thread has asked for so far.
    pub fn on_this_thread() -> Self {
        COUNTS.with(Cell::get)
    }
}

impl std::ops::Sub for Transfers {
    type Output = Self;

    fn sub(self, earlier: Self) -> Self {
        Self {
            to_device: self.to_device.saturating_sub(earlier.to_device),
            to_host: self.to_host.saturating_sub(earlier.to_host),
        }
    }
}

#[cfg(feature = "cuda")]
pub(crate) fn count_to_device() {
    COUNTS.with(|c| {
        let mut t = c.get();
        t.to_device += 1;
        c.set(t);
    });
}

#[cfg(feature = "cuda")]
pub(crate) fn count_to_host() {
    COUNTS.with(|c| {
        let mut t = c.get();
        t.to_host += 1;
        c.set(t);
    });
}
