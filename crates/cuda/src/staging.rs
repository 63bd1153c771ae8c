//! Uploads through page-locked ("pinned") host memory, so that a copy to the device is queued
//! on the stream and the caller goes on.
//!
//! A copy from ordinary (pageable) memory makes the driver stage the values itself, and for
//! anything but small copies that call returns only once the copy is done, which waits for
//! every kernel queued before it: a training step that uploads its batch while the last step's
//! backward pass still runs would stall there, and the GPU would then idle while the host
//! prepares the next launches. Here the values are first copied into a pinned buffer of this
//! device and the copy from it is queued (`cuMemcpyHtoDAsync` from pinned memory returns at
//! once); each buffer has an event recorded after its copy, and is written again only once
//! that event has passed (this module records it: with the device's event tracking off,
//! cudarc records none). [`SLOTS`] buffers of each length take turns, so an upload waits
//! only on the copy made [`SLOTS`] uploads of that length earlier, long finished in a training
//! loop, whose batches have a few lengths that recur.
//!
//! When the driver refuses pinned memory (a limit on locked pages), uploads fall back to the
//! pageable path, once said in the log.
#![allow(
    unsafe_code,
    reason = "pinned host memory is allocated through an unsafe driver call (contents unset)"
)]

use std::collections::VecDeque;
use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DeviceRepr};
use cudarc::driver::{DriverError, PinnedHostSlice, ValidAsZeroBits};

/// Buffers per length that take turns.
const SLOTS: usize = 3;

/// Lengths kept at once; the one used longest ago goes first.
const LENGTHS: usize = 16;

/// Uploads of more values than this use the pageable path: pinned memory is a scarce
/// resource of the host, and a copy this large (16 MiB of `f32`) takes long enough that its
/// wait hardly shows.
const LARGEST: usize = 4 << 20;

/// Values kept pinned at most, over every length (256 MiB of `f32`): past it the lengths used
/// longest ago are freed first.
const BUDGET: usize = 64 << 20;

/// A pinned buffer and the event recorded after the copy made from it last.
struct Slot<T> {
    pinned: PinnedHostSlice<T>,
    copied: CudaEvent,
}

impl<T> Drop for Slot<T> {
    fn drop(&mut self) {
        // The last copy from it must have left before its memory goes back: cudarc's own
        // event in the slice was never recorded (event tracking is off).
        if let Err(e) = self.copied.synchronize() {
            tracing::warn!(error = %e, "waiting for a pinned buffer's last copy");
        }
    }
}

/// One element type's pinned buffers, by length.
pub(crate) struct Ring<T> {
    /// `(length, buffers, the next to use)`, most recently used last.
    lengths: VecDeque<(usize, Vec<Slot<T>>, usize)>,
    /// Set once pinned memory was refused: every later upload is pageable.
    refused: bool,
}

impl<T> Default for Ring<T> {
    fn default() -> Self {
        Self {
            lengths: VecDeque::new(),
            refused: false,
        }
    }
}

impl<T: DeviceRepr + ValidAsZeroBits + Copy> Ring<T> {
    /// A device copy of `values`: queued from a pinned buffer where one can be had, else
    /// copied from `values` directly.
    ///
    /// # Errors
    ///
    /// The driver's error.
    pub(crate) fn upload(
        &mut self,
        context: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        values: &[T],
    ) -> Result<CudaSlice<T>, DriverError> {
        if values.is_empty() {
            return stream.clone_htod(values);
        }
        // SAFETY: `write` fills all of it before anything can read it (on the same stream).
        let mut copy = unsafe { stream.alloc::<T>(values.len()) }?;
        self.write(context, stream, values, &mut copy)?;
        Ok(copy)
    }

    /// Copies `values` into the start of `dst` (at least as long), as [`Ring::upload`] does.
    ///
    /// # Errors
    ///
    /// The driver's error.
    pub(crate) fn write(
        &mut self,
        context: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        values: &[T],
        dst: &mut CudaSlice<T>,
    ) -> Result<(), DriverError> {
        if self.refused || values.len() > LARGEST || values.is_empty() {
            return stream.memcpy_htod(values, dst);
        }
        match self.slot(context, values.len()) {
            Ok(Slot { pinned, copied }) => {
                // The copy this buffer made last has left it: it can be filled again.
                copied.synchronize()?;
                pinned.as_mut_slice()?.copy_from_slice(values);
                stream.memcpy_htod(&*pinned, dst)?;
                copied.record(stream)
            }
            Err(e) => {
                tracing::warn!(error = %e, "pinned host memory refused: uploads to this GPU wait for the work queued before them");
                self.refused = true;
                self.lengths.clear();
                stream.memcpy_htod(values, dst)
            }
        }
    }

    /// The next pinned buffer of `len` values, made when fewer than [`SLOTS`] exist.
    fn slot(
        &mut self,
        context: &Arc<CudaContext>,
        len: usize,
    ) -> Result<&mut Slot<T>, DriverError> {
        let (len, mut buffers, mut next) = self
            .lengths
            .iter()
            .position(|(l, _, _)| *l == len)
            .and_then(|at| self.lengths.remove(at))
            .unwrap_or_else(|| (len, Vec::new(), 0));
        if buffers.len() < SLOTS {
            // Within the budget: the lengths used longest ago give theirs up first.
            let held = |lengths: &VecDeque<(usize, Vec<Slot<T>>, usize)>| -> usize {
                lengths.iter().map(|(l, b, _)| l * b.len()).sum()
            };
            while held(&self.lengths) + (buffers.len() + 1) * len > BUDGET
                && self.lengths.pop_front().is_some()
            {}
            // SAFETY: the buffer's contents are unset until `upload` writes all `len` values,
            // before any copy reads them.
            let pinned = unsafe { context.alloc_pinned::<T>(len) }?;
            let copied = context.new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))?;
            buffers.push(Slot { pinned, copied });
            next = buffers.len() - 1;
        } else {
            next = (next + 1) % SLOTS;
        }
        if self.lengths.len() == LENGTHS {
            self.lengths.pop_front();
        }
        // The most recently used goes last.
        self.lengths.push_back((len, buffers, next));
        let last = self.lengths.len() - 1;
        let (_, buffers, next) = &mut self.lengths[last];
        Ok(&mut buffers[*next])
    }
}
