//! A step's update still in flight when the step returns
//! (`CommunicationOptions::overlap_update`): a thread of its own sums the step's totals, then
//! its packs piece by piece in [`Packs::overlapping`]'s order, and the next step's forward pass
//! applies each pack's update as it first reads that pack's variables
//! ([`lockstep_nn::Network::forward_inputs_as_ready`]). The same collectives in the same order
//! as [`crate::packs::reduce_after`] over the same packs, and the same update of each value,
//! so the same bits; only when each is done changes.
//!
//! Between two steps the replica's weights are those before the update in flight, as a GPU
//! replica's host values are between syncs: [`crate::replica::Replica::sync_host`] lands it
//! first wherever anything reads the model.

use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lockstep_collective::ReduceOp;
use lockstep_nn::{Optimizer, Parameters};

use crate::error::TrainError;
use crate::packs::{Packs, Wire, reduce_pack, residuals_of};
use crate::strategy::PackLink;

/// What the thread hands back: the summed totals first, then each piece as it is summed.
enum Summed {
    Totals(Vec<f32>),
    Piece(usize, Vec<f32>),
}

/// The thread summing one step's packs, and what the next forward pass has applied of them.
pub(crate) struct UpdateInFlight {
    packs: Arc<Packs>,
    summed: Receiver<Summed>,
    thread: Option<JoinHandle<Result<Vec<f32>, TrainError>>>,
    /// Pieces of each pack not yet arrived.
    missing: Vec<usize>,
    /// Whether each pack's update is applied.
    applied: Vec<bool>,
    /// The variables `..ready` are updated.
    ready: usize,
    /// `1 / examples` of the step; `None` while the totals have not arrived, or when the step
    /// had no examples anywhere (no update, as [`crate::replica::Replica`]'s step).
    scale: Option<f32>,
    totals: Option<Vec<f32>>,
    /// Time spent waiting for the thread.
    pub(crate) blocked: Duration,
}

/// The sending end a backward pass hands its finished packs to (pack index, its values).
pub(crate) type PackSender = Sender<(usize, Vec<f32>)>;

impl UpdateInFlight {
    /// Starts the thread: it sums `totals` at once, then the pieces of the packs the backward
    /// pass sends, in order, each with its residuals (kept by error feedback, else empty),
    /// which the thread hands back when it ends.
    pub(crate) fn start(
        mut link: PackLink,
        packs: Arc<Packs>,
        wire: Wire,
        mut totals: Vec<f32>,
        mut residuals: Vec<f32>,
    ) -> Result<(Self, PackSender), TrainError> {
        let (send_pack, packed) = mpsc::channel::<(usize, Vec<f32>)>();
        let (send_summed, summed) = mpsc::channel::<Summed>();
        let order = Arc::clone(&packs);
        let thread = std::thread::Builder::new()
            .name("lockstep-update".into())
            .spawn(move || {
                link.all_reduce(&mut totals, ReduceOp::Sum)?;
                // The receiver is gone only when the step failed: nothing then reads on.
                let _ = send_summed.send(Summed::Totals(totals));
                let mut arrived: Vec<Option<Vec<f32>>> = vec![None; order.ranges.len()];
                for (index, piece) in order.pieces.iter().enumerate() {
                    while arrived[piece.pack].is_none() {
                        let Ok((pack, values)) = packed.recv() else {
                            return Err(TrainError::invalid(
                                "step",
                                "the backward pass stopped before it finished its packs",
                            ));
                        };
                        arrived[pack] = Some(values);
                    }
                    let start = order.ranges[piece.pack].start;
                    let within = piece.range.start - start..piece.range.end - start;
                    let mut values = arrived[piece.pack]
                        .as_ref()
                        .map(|pack| pack[within].to_vec())
                        .unwrap_or_default();
                    let residual = residuals_of(&mut residuals, piece.range.clone());
                    reduce_pack(&mut link, &mut values, wire, residual)?;
                    let _ = send_summed.send(Summed::Piece(index, values));
                }
                Ok(residuals)
            })
            .map_err(|e| {
                TrainError::invalid("step", format!("no thread to sum the step's packs: {e}"))
            })?;
        let mut missing = vec![0; packs.ranges.len()];
        for piece in &packs.pieces {
            missing[piece.pack] += 1;
        }
        let flight = Self {
            applied: vec![false; packs.ranges.len()],
            packs,
            summed,
            thread: Some(thread),
            missing,
            ready: 0,
            scale: None,
            totals: None,
            blocked: Duration::ZERO,
        };
        Ok((flight, send_pack))
    }

    /// The step's totals, summed over every replica (waits for them).
    pub(crate) fn totals(&mut self) -> Result<Vec<f32>, TrainError> {
        while self.totals.is_none() {
            self.receive(None, None)?;
        }
        Ok(self.totals.clone().unwrap_or_default())
    }

    /// Applies the update of every pack that holds one of the variables `..end`, waiting for
    /// their sums; `grads` is the gradient buffer to land them in (as long as the parameters).
    pub(crate) fn settle_upto(
        &mut self,
        end: usize,
        params: &mut Parameters,
        optimizer: &mut dyn Optimizer,
        grads: &mut [f32],
    ) -> Result<(), TrainError> {
        while self.ready < end.min(self.packs.pack_of.len()) {
            let pack = self.packs.pack_of[self.ready];
            while !self.applied[pack] {
                self.receive(Some(params), Some((optimizer, grads)))?;
            }
            self.ready += 1;
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
        self.settle_upto(usize::MAX, params, optimizer, grads)?;
        let residuals = self.join()?;
        if self.scale.is_some() {
            optimizer.finish_step();
        }
        Ok((residuals, self.blocked))
    }

    /// The time spent waiting for the thread so far, counted from zero again.
    pub(crate) fn take_blocked(&mut self) -> Duration {
        std::mem::take(&mut self.blocked)
    }

    /// Ends the thread: its error, or the residuals.
    fn join(&mut self) -> Result<Vec<f32>, TrainError> {
        let Some(thread) = self.thread.take() else {
            return Err(TrainError::invalid("step", "its packs were already summed"));
        };
        let waited = Instant::now();
        let joined = thread.join();
        self.blocked += waited.elapsed();
        match joined {
            Ok(result) => Ok(result?),
            Err(_) => Err(TrainError::invalid(
                "step",
                "the thread summing the step's packs panicked",
            )),
        }
    }

    /// Takes the thread's next message: the totals, or a piece, which lands in `grads` and
    /// completes its pack's update when it was the pack's last. The thread's error when it
    /// has stopped.
    fn receive(
        &mut self,
        params: Option<&mut Parameters>,
        update: Option<(&mut dyn Optimizer, &mut [f32])>,
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
                let (Some(params), Some((optimizer, grads))) = (params, update) else {
                    return Err(TrainError::invalid(
                        "step",
                        "a pack's sum arrived before the step's totals",
                    ));
                };
                let piece = &self.packs.pieces[index];
                grads[piece.range.clone()].copy_from_slice(&values);
                let pack = piece.pack;
                self.missing[pack] -= 1;
                if self.missing[pack] == 0 {
                    let range = self.packs.ranges[pack].clone();
                    if let Some(scale) = self.scale {
                        for g in &mut grads[range.clone()] {
                            *g *= scale;
                        }
                        lockstep_nn::apply_update_range(optimizer, params, grads, range, 1.0)?;
                    }
                    self.applied[pack] = true;
                }
            }
        }
        Ok(())
    }
}
