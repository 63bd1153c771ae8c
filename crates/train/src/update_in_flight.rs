//! A replica's communication thread ([`PackThread`]) and the sums of a step it runs
//! ([`UpdateInFlight`]): the step's pieces, each handed over by its backward pass as soon as
//! the pass has finished its values ([`crate::packs::Arrivals`]), summed in [`Packs`]' order
//! with the totals, each handed back once summed.
//!
//! A step that sums its packs during the backward pass collects them all at its end
//! ([`UpdateInFlight::collect`]) and applies its update whole. A step whose update overlaps the
//! next forward pass (`CommunicationOptions::overlap_update`, [`Packs::overlapping`]'s order:
//! the totals with the first piece, the first layers' pack partway through the largest)
//! returns once the totals are summed, and the next step's forward pass applies each piece's
//! update (or, where a piece cuts a variable whose update needs it whole, its pack's) before
//! it reads that piece's values ([`lockstep_nn::Network::forward_inputs_as_ready`]). Either
//! way the collectives are [`crate::packs::reduce_after`]'s over the same pieces, in the same
//! order, and each value's update is the same; where the pieces cut packs that the step
//! without overlap sums whole (at most two processes), no value's sum depends on the cut. So
//! the bits are the same; only when each is done changes.
//!
//! Between two steps a replica's weights are those before an update in flight, as a GPU
//! replica's host values are between syncs: [`crate::replica::Replica::sync_host`] lands it
//! first wherever anything reads the model.

use std::ops::Range;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lockstep_nn::{Optimizer, Parameters};
use rustix::thread::CpuSet;

use crate::error::TrainError;
use crate::kernel_threads::keep_to_cores;
use crate::packs::{Packs, Wire, reduce_pack, reduce_totals, residuals_of, with_totals};
use crate::strategy::PackLink;

/// A replica's communication thread, which outlives its steps: each step hands it the work of
/// summing its packs. Made once, it sleeps between steps, so a step wakes it rather than
/// starting it: on a machine whose cores the steps keep busy, a thread started anew waited
/// milliseconds for a core (the scheduler puts a new thread behind those already running, a
/// woken one ahead), and the link idled meanwhile.
pub(crate) struct PackThread {
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

type Job = Box<dyn FnOnce() + Send>;

impl PackThread {
    /// The thread, on `cores` where the step's kernels were pinned to them (else where the
    /// calling thread runs).
    pub(crate) fn start(cores: Option<CpuSet>) -> Result<Self, TrainError> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("lockstep-packs".into())
            .spawn(move || {
                keep_to_cores(cores.as_ref());
                ask_for_priority();
                for job in queue {
                    job();
                }
            })
            .map_err(|e| TrainError::invalid("step", format!("no thread to sum packs: {e}")))?;
        Ok(Self {
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    fn run(&self, job: Job) -> Result<(), TrainError> {
        self.jobs
            .as_ref()
            .and_then(|jobs| jobs.send(job).ok())
            .ok_or_else(|| TrainError::invalid("step", "the thread summing packs has stopped"))
    }
}

impl Drop for PackThread {
    fn drop(&mut self) {
        // Its queue closed, the thread ends after the job in hand.
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What the thread hands back: the summed totals, and each piece once summed.
enum Summed {
    Totals(Vec<f32>),
    Piece(usize, Vec<f32>),
}

/// The thread summing one step's packs, and what the next forward pass has applied of them.
pub(crate) struct UpdateInFlight {
    packs: Arc<Packs>,
    summed: Receiver<Summed>,
    /// The job's end: its error, or the residuals; `None` once taken.
    done: Option<Receiver<Result<Vec<f32>, TrainError>>>,
    /// Whether each piece's update is applied (landed only, for [`UpdateInFlight::collect`]).
    applied: Vec<bool>,
    /// Whether each pack's pieces are applied as each lands, or the pack's update once all
    /// have ([`Packs::pieces_cut_only`]).
    by_piece: Vec<bool>,
    /// The pieces of each pack not landed yet.
    unlanded: Vec<usize>,
    /// `1 / examples` of the step; `None` while the totals have not arrived, or when the step
    /// had no examples anywhere (no update, as [`crate::replica::Replica`]'s step).
    scale: Option<f32>,
    totals: Option<Vec<f32>>,
    /// Whether the packs only land in the gradient buffer, their update applied whole later
    /// ([`UpdateInFlight::collect`]).
    land_only: bool,
    /// Time spent waiting for the thread.
    blocked: Duration,
}

/// The sending end a backward pass hands its finished pieces to (piece index, its values).
pub(crate) type PieceSender = Sender<(usize, Vec<f32>)>;

impl UpdateInFlight {
    /// Hands `thread` the step's sums: the pieces the backward pass sends, in order, each with
    /// its residuals (kept by error feedback, else empty), which it hands back at the end, and
    /// `totals` with the first piece (in `f32`) or right after it. `by_piece` says, for each
    /// pack, whether its pieces' updates may be applied one at a time.
    pub(crate) fn start(
        thread: &PackThread,
        mut link: PackLink,
        packs: Arc<Packs>,
        wire: Wire,
        (mut totals, mut residuals): (Vec<f32>, Vec<f32>),
        by_piece: Vec<bool>,
    ) -> Result<(Self, PieceSender), TrainError> {
        let (send_piece, handed) = mpsc::channel::<(usize, Vec<f32>)>();
        let (send_summed, summed) = mpsc::channel::<Summed>();
        let order = Arc::clone(&packs);
        // The totals' collective: with the first piece's, right after it, or (whole packs in
        // 16 bits, as `reduce_after`) after the last.
        let totals_after = if with_totals(0, wire) || packs.totals_after_first {
            0
        } else {
            packs.pieces.len().saturating_sub(1)
        };
        let (send_done, done) = mpsc::channel();
        let job = move || -> Result<Vec<f32>, TrainError> {
            let mut arrived: Vec<Option<Vec<f32>>> = vec![None; order.pieces.len()];
            for (index, piece) in order.pieces.iter().enumerate() {
                let mut values = loop {
                    if let Some(values) = arrived[index].take() {
                        break values;
                    }
                    let Ok((at, values)) = handed.recv() else {
                        return Err(TrainError::invalid(
                            "step",
                            "the backward pass stopped before it finished its packs",
                        ));
                    };
                    if let Some(slot) = arrived.get_mut(at) {
                        *slot = Some(values);
                    }
                };
                let residual = residuals_of(&mut residuals, piece.range.clone());
                if with_totals(index, wire) {
                    // In `f32` the totals follow the first piece, its pack's last values, in
                    // its collective.
                    let length = values.len();
                    values.extend_from_slice(&totals);
                    reduce_pack(&mut link, &mut values, wire, residual)?;
                    totals = values.split_off(length);
                } else {
                    reduce_pack(&mut link, &mut values, wire, residual)?;
                    if index == totals_after {
                        reduce_totals(&mut link, &mut totals, wire)?;
                    }
                }
                if index == totals_after {
                    // The receiver is gone only when the step failed: nothing then reads on.
                    let _ = send_summed.send(Summed::Totals(std::mem::take(&mut totals)));
                }
                let _ = send_summed.send(Summed::Piece(index, values));
            }
            Ok(residuals)
        };
        thread.run(Box::new(move || {
            // The receiver is gone only when the step failed.
            let _ = send_done.send(job());
        }))?;
        let mut unlanded = vec![0; packs.ranges.len()];
        for piece in &packs.pieces {
            unlanded[piece.pack] += 1;
        }
        let flight = Self {
            applied: vec![false; packs.pieces.len()],
            by_piece,
            unlanded,
            packs,
            summed,
            done: Some(done),
            scale: None,
            totals: None,
            land_only: false,
            blocked: Duration::ZERO,
        };
        Ok((flight, send_piece))
    }

    /// The step's totals, summed over every replica (waits for them).
    pub(crate) fn totals(&mut self) -> Result<Vec<f32>, TrainError> {
        while self.totals.is_none() {
            self.receive(None, None)?;
        }
        Ok(self.totals.clone().unwrap_or_default())
    }

    /// Applies the update of every piece that holds one of the values `range`, waiting for
    /// their sums; `grads` is the gradient buffer to land them in (as long as the parameters).
    pub(crate) fn settle(
        &mut self,
        range: Range<usize>,
        params: &mut Parameters,
        optimizer: &mut dyn Optimizer,
        grads: &mut [f32],
    ) -> Result<(), TrainError> {
        for index in 0..self.packs.pieces.len() {
            let piece = &self.packs.pieces[index].range;
            if piece.start >= range.end || range.start >= piece.end {
                continue;
            }
            while !self.applied[index] {
                self.receive(Some((&mut *params, &mut *optimizer)), Some(&mut *grads))?;
            }
        }
        Ok(())
    }

    /// Lands every pack, ends the thread and counts the step: returns the residuals it kept
    /// and the time spent waiting since [`UpdateInFlight::take_blocked`].
    pub(crate) fn finish(
        mut self,
        params: &mut Parameters,
        optimizer: &mut dyn Optimizer,
        grads: &mut [f32],
    ) -> Result<(Vec<f32>, Duration), TrainError> {
        self.settle(0..usize::MAX, params, optimizer, grads)?;
        let residuals = self.join()?;
        if self.scale.is_some() {
            optimizer.finish_step();
        }
        Ok((residuals, self.blocked))
    }

    /// Waits for every pack's sum and lands it in `grads` without applying any: for a step
    /// that sums its packs during the backward pass and applies its whole update at its end.
    /// Returns the totals and the residuals.
    pub(crate) fn collect(mut self, grads: &mut [f32]) -> Result<(Vec<f32>, Vec<f32>), TrainError> {
        self.land_only = true;
        while self.applied.iter().any(|applied| !applied) || self.totals.is_none() {
            self.receive(None, Some(grads))?;
        }
        let residuals = self.join()?;
        Ok((self.totals.take().unwrap_or_default(), residuals))
    }

    /// The time spent waiting for the thread so far, counted from zero again.
    pub(crate) fn take_blocked(&mut self) -> Duration {
        std::mem::take(&mut self.blocked)
    }

    /// Ends the thread: its error, or the residuals.
    fn join(&mut self) -> Result<Vec<f32>, TrainError> {
        let Some(done) = self.done.take() else {
            return Err(TrainError::invalid("step", "its packs were already summed"));
        };
        let waited = Instant::now();
        let joined = done.recv();
        self.blocked += waited.elapsed();
        joined.unwrap_or_else(|_| {
            Err(TrainError::invalid(
                "step",
                "the thread summing the step's packs panicked",
            ))
        })
    }

    /// Takes the thread's next message: the totals, or a pack's sum, which lands in `grads`
    /// and, given `update`, is applied there. The thread's error when it has stopped.
    fn receive(
        &mut self,
        update: Option<(&mut Parameters, &mut dyn Optimizer)>,
        grads: Option<&mut [f32]>,
    ) -> Result<(), TrainError> {
        let waited = Instant::now();
        let message = self.summed.recv();
        self.blocked += waited.elapsed();
        let Ok(message) = message else {
            // The thread ended early: its error says why.
            self.join()?;
            return Err(TrainError::invalid(
                "step",
                "the thread summing the step's packs ended before the last",
            ));
        };
        match message {
            Summed::Totals(totals) => {
                let examples = totals.get(1).copied().unwrap_or(0.0);
                self.scale = (examples > 0.0).then(|| (1.0 / f64::from(examples)) as f32);
                self.totals = Some(totals);
            }
            Summed::Piece(index, values) => {
                let Some(grads) = grads else {
                    return Err(TrainError::invalid(
                        "step",
                        "a pack's sum arrived before the step's totals",
                    ));
                };
                let Some(piece) = self.packs.pieces.get(index) else {
                    return Err(TrainError::invalid(
                        "step",
                        "a piece the step does not have",
                    ));
                };
                let (range, pack) = (piece.range.clone(), piece.pack);
                self.unlanded[pack] = self.unlanded[pack].saturating_sub(1);
                if let (Some(scale), Some((params, optimizer)), false) =
                    (self.scale, update, self.land_only)
                {
                    // Scaled as it lands: one pass over the piece, where a copy and then the
                    // scale took two.
                    for (g, v) in grads[range.clone()].iter_mut().zip(&values) {
                        *g = v * scale;
                    }
                    if self.by_piece[pack] {
                        lockstep_nn::apply_update_range(optimizer, params, grads, range, 1.0)?;
                        self.applied[index] = true;
                    } else if self.unlanded[pack] == 0 {
                        let whole = self.packs.ranges[pack].clone();
                        lockstep_nn::apply_update_range(optimizer, params, grads, whole, 1.0)?;
                        for (applied, piece) in self.applied.iter_mut().zip(&self.packs.pieces) {
                            *applied |= piece.pack == pack;
                        }
                    }
                } else {
                    grads[range].copy_from_slice(&values);
                    self.applied[index] = true;
                }
            }
        }
        Ok(())
    }
}

/// How much higher than the process's own priority the thread that sums packs asks to run.
const PRIORITY_ABOVE_STEPS: i32 = 10;

/// Asks the scheduler to run the calling thread (the one that sums packs) ahead of the
/// process's other threads, where the process may (root, or `CAP_SYS_NICE`): a nice value
/// `PRIORITY_ABOVE_STEPS` below its own. When a pack is ready the thread then takes a core
/// from the steps' kernels at once rather than after their time slice, and the link does not
/// wait for it. Elsewhere it runs at the process's priority, as before.
fn ask_for_priority() {
    let thread = rustix::thread::gettid();
    let Ok(nice) = rustix::process::getpriority_process(Some(thread)) else {
        return;
    };
    let wanted = (nice - PRIORITY_ABOVE_STEPS).max(-20);
    if let Err(e) = rustix::process::setpriority_process(Some(thread), wanted) {
        tracing::debug!(error = %e, nice, "the thread that sums packs runs at the process's priority");
    }
}
