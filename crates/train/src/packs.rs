//! A step's gradients in packs (`CommunicationOptions::bytes_per_pack`, as TensorFlow's): runs
//! of whole variables, the last layers' first, each reduced by its own collective as soon as
//! the backward pass has finished every variable in it, on the replica's communication thread
//! (`update_in_flight.rs`) while the pass goes on with the earlier layers (PyTorch DDP's
//! buckets). The same collectives on the same
//! values in the same order whether they overlap the pass or follow it, so the two give the
//! same bits. One pack (the default for a model of up to `bytes_per_pack` of gradients) is one
//! all-reduce of the whole buffer, gradients and totals, as a step had before packs.

use std::collections::BTreeMap;
use std::ops::Range;

use lockstep_collective::{CollectiveError, Compression, Element, HalfFloat, ReduceOp, bf16, f16};
use lockstep_nn::ParamSpec;

use crate::strategy::{PackLink, ReplicaLink};

/// What sums a pack: a replica's link, or the handle a thread that outlives the step holds.
pub(crate) trait SumsPacks {
    fn all_reduce<E: Element>(
        &mut self,
        data: &mut [E],
        op: ReduceOp,
    ) -> Result<(), CollectiveError>;
}

impl SumsPacks for ReplicaLink {
    fn all_reduce<E: Element>(
        &mut self,
        data: &mut [E],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        ReplicaLink::all_reduce(self, data, op)
    }
}

impl SumsPacks for PackLink {
    fn all_reduce<E: Element>(
        &mut self,
        data: &mut [E],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        PackLink::all_reduce(self, data, op)
    }
}

/// The packs of a model's gradient buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Packs {
    /// Ranges of the gradient buffer, in the order the backward pass finishes them.
    pub(crate) ranges: Vec<Range<usize>>,
    /// A step's collectives in the order every replica issues them: each pack whole, or
    /// ([`Packs::overlapping`]) in pieces, the later packs' pieces among the earlier ones'.
    pub(crate) pieces: Vec<Piece>,
    /// Whether the step's totals, when the packs go in 16 bits, follow the first piece rather
    /// than the last (in `f32` they travel in the first piece's collective either way).
    pub(crate) totals_after_first: bool,
}

/// The most bytes of a pack's pieces after its first ([`Packs::overlapping`]), unless
/// `bytes_per_pack` is larger. With an update in flight, the tutorial's literal model (11 MB
/// of gradients a step) in bf16 at 10 Gbit/s ran 6,332–6,392 examples/s with pieces of 4 MiB
/// and 5,192–5,609 with pieces of 256 KiB; at 1 Gbit/s in `f32`, pieces from 256 KiB to
/// 16 MiB ran alike (PERFORMANCE, thirty-second session). Since each piece lands on its own,
/// at 1 Gbit/s in `f32` pieces of 4 MiB ran 1,277–1,280 examples/s against 1,253–1,264 for
/// 1 MiB (thirty-third session).
pub(crate) const LARGE_PIECE_BYTES: usize = 4 << 20;

/// The share of the earlier packs' bytes that goes before a later pack's
/// ([`Packs::overlapping`]).
const LATER_PACK_AFTER: (usize, usize) = (2, 3);

/// One collective of a step: `range` of the gradient buffer, part of pack `pack`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) pack: usize,
    pub(crate) range: Range<usize>,
}

impl Packs {
    /// Packs of whole variables of at least `bytes_per_pack` bytes each (the last one reduced,
    /// holding the first layers, may be smaller), from the last variable to the first; one pack
    /// when `bytes_per_pack` is 0.
    pub(crate) fn new(specs: &[ParamSpec], bytes_per_pack: usize) -> Self {
        let mut packs = Self {
            ranges: Vec::new(),
            pieces: Vec::new(),
            totals_after_first: false,
        };
        let mut end = specs.last().map_or(0, |s| s.range().end);
        for (index, spec) in specs.iter().enumerate().rev() {
            let start = spec.range().start;
            let full = bytes_per_pack > 0 && (end - start) * 4 >= bytes_per_pack;
            if full || index == 0 {
                packs.ranges.push(start..end);
                end = start;
            }
        }
        packs.pieces = (packs.ranges.iter().enumerate())
            .map(|(pack, range)| Piece {
                pack,
                range: range.clone(),
            })
            .collect();
        packs
    }

    /// [`Packs::new`]'s packs for a step whose update overlaps the next forward pass: each pack
    /// in pieces from its end, the first of at most `bytes_per_pack` (the first piece of the
    /// last layers' pack ends where the totals start, so that in `f32` they go in one
    /// collective, as with whole packs), the rest of at most [`LARGE_PIECE_BYTES`] (or
    /// `bytes_per_pack`, if larger), each later pack's pieces put after two thirds of the
    /// bytes of what is left of the earlier ones' (the piece there cut in two), and the totals
    /// (the update's scale, and what the step returns) with the first piece, or right after it
    /// in 16 bits. The first piece is small so that the step returns early and the wire starts
    /// as soon as the backward pass has its values; the rest are large because each
    /// collective costs its own round trips. The backward pass finishes the first layers'
    /// pack last and the next forward pass needs it first: so it is summed while the largest
    /// pack is, the bytes before it keeping the wire busy while the pass finishes it, and the
    /// next pass starts on the first layers while the rest of that pack is on the wire. Two
    /// thirds, where half of the pieces went before: at 1 Gbit/s the tutorial CNN's pass
    /// outlasted its first piece's collective and the link idled until the first layers'
    /// pack was finished; with two thirds of the bytes before it its steady speed there
    /// moved by −1% to +7% in four pairs, and 448 to 704 KiB before it ran alike
    /// (docs/PERFORMANCE.md). The order is the same on every replica (a ring needs every
    /// replica to issue the same collectives in the same order).
    ///
    /// Cut into pieces only `in_pieces`: where each value's sum does not depend on where its
    /// collective cuts the buffer (two processes, whose sum of two values is the same in
    /// either order; shared memory, which sums in rank order). Among more processes a ring
    /// sums each segment of a collective starting from another rank, so a piece would sum
    /// its values in another order than the whole pack: the packs then go whole, in
    /// [`Packs::new`]'s order, with only the totals (their own collective in 16 bits) first,
    /// and every value is summed as in the step that does not overlap.
    pub(crate) fn overlapping(specs: &[ParamSpec], bytes_per_pack: usize, in_pieces: bool) -> Self {
        let mut packs = Self::new(specs, bytes_per_pack);
        packs.totals_after_first = true;
        if !in_pieces {
            return packs;
        }
        let first = (bytes_per_pack / 4).max(1);
        let most = first.max(LARGE_PIECE_BYTES / 4);
        let pieces = |pack: usize, range: &Range<usize>| -> Vec<Piece> {
            let split = range.end.saturating_sub(first).max(range.start);
            let rest = range.start..split;
            std::iter::once(split..range.end)
                .chain(
                    (rest.clone().rev().step_by(most))
                        .map(|last| (last + 1).saturating_sub(most).max(rest.start)..last + 1),
                )
                .filter(|range| !range.is_empty())
                .map(|range| Piece { pack, range })
                .collect()
        };
        // The first pack's pieces; each later pack's after two thirds of the bytes that
        // follow the pack before it.
        let mut order: Vec<Piece> = Vec::new();
        let mut cursor = 0;
        for (pack, range) in packs.ranges.iter().enumerate() {
            let these = pieces(pack, range);
            let at = if pack == 0 {
                0
            } else {
                cut_at_share(&mut order, cursor, first)
            };
            let count = these.len();
            order.splice(at..at, these);
            cursor = if pack == 0 { 0 } else { at + count };
        }
        packs.pieces = order;
        packs
    }

    pub(crate) fn len(&self) -> usize {
        self.ranges.len()
    }

    /// For each pack, whether every variable its pieces cut satisfies `may_cut`: then each
    /// piece's update can be applied as soon as it lands, else the pack's once all its pieces
    /// have.
    pub(crate) fn pieces_cut_only(
        &self,
        specs: &[ParamSpec],
        may_cut: impl Fn(&ParamSpec) -> bool,
    ) -> Vec<bool> {
        let mut by_piece = vec![true; self.ranges.len()];
        for piece in &self.pieces {
            let cut = specs.iter().filter(|spec| {
                let v = spec.range();
                v.start < piece.range.end
                    && piece.range.start < v.end
                    && (v.start < piece.range.start || piece.range.end < v.end)
            });
            for spec in cut {
                by_piece[piece.pack] &= may_cut(spec);
            }
        }
        by_piece
    }
}

/// Where in `order` a later pack's pieces go: after [`LATER_PACK_AFTER`] of the bytes of the
/// pieces from `from` on, the piece that straddles that point cut in two (its upper values
/// first, as a pack goes from its end down), unless a part would be under a quarter of
/// `first` values (then at the nearer edge of that piece) or the piece is the step's first,
/// which carries the totals and is never cut or preceded (then right after it).
fn cut_at_share(order: &mut Vec<Piece>, from: usize, first: usize) -> usize {
    let (num, den) = LATER_PACK_AFTER;
    let total: usize = order[from..].iter().map(|p| p.range.len()).sum();
    let target = (total * num).div_ceil(den);
    let least = (first / 4).max(1);
    let mut before = 0;
    for index in from..order.len() {
        let len = order[index].range.len();
        if before + len <= target {
            before += len;
            continue;
        }
        let take = target - before;
        if index == 0 {
            return 1;
        }
        if take < least || len - take < least {
            return if take * 2 < len { index } else { index + 1 };
        }
        let piece = &mut order[index];
        let cut = piece.range.end - take;
        let lower = Piece {
            pack: piece.pack,
            range: piece.range.start..cut,
        };
        piece.range.start = cut;
        order.insert(index + 1, lower);
        return index + 1;
    }
    order.len()
}

/// Which of a step's pieces its backward pass has finished, from the ranges of the gradient
/// buffer the pass hands over as they become final (whole variables, or blocks of a dense
/// kernel): a pack is finished from its end down, as the backward pass runs from the last
/// layers to the first, and each piece is sent once every value from its start to its pack's
/// end is.
#[derive(Debug)]
pub(crate) struct Arrivals {
    /// Each pack's values from here to its end are final.
    low: Vec<usize>,
    /// Final ranges below `low`, not yet joined to it: by end, their starts.
    early: Vec<BTreeMap<usize, usize>>,
    /// Each pack's pieces not yet sent, the one nearest the pack's end last.
    unsent: Vec<Vec<usize>>,
}

impl Arrivals {
    pub(crate) fn new(packs: &Packs) -> Self {
        let mut unsent: Vec<Vec<usize>> = vec![Vec::new(); packs.ranges.len()];
        for (index, piece) in packs.pieces.iter().enumerate() {
            unsent[piece.pack].push(index);
        }
        for pieces in &mut unsent {
            pieces.sort_by_key(|&index| packs.pieces[index].range.start);
        }
        Self {
            low: packs.ranges.iter().map(|range| range.end).collect(),
            early: vec![BTreeMap::new(); packs.ranges.len()],
            unsent,
        }
    }

    /// Takes `range` as final: the pieces that can be sent now.
    pub(crate) fn arrived(&mut self, packs: &Packs, range: Range<usize>) -> Vec<usize> {
        let Some(pack) = (packs.ranges.iter())
            .position(|p| p.start <= range.start && range.end <= p.end && !range.is_empty())
        else {
            return Vec::new();
        };
        self.early[pack].insert(range.end, range.start);
        while let Some(start) = self.early[pack].remove(&self.low[pack]) {
            self.low[pack] = start;
        }
        let mut ready = Vec::new();
        while let Some(&index) = self.unsent[pack].last()
            && packs.pieces[index].range.start >= self.low[pack]
        {
            ready.push(index);
            self.unsent[pack].pop();
        }
        ready
    }
}

/// How one replica sends its packs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wire {
    pub(crate) compression: Compression,
    /// The replicas in sync (fp16's values are divided by it before they are rounded).
    pub(crate) replicas: usize,
    /// Whether a replica's rounding errors are carried into its next step
    /// ([`Residuals`]).
    pub(crate) error_feedback: bool,
}

impl Wire {
    /// How a replica of `replicas` sends its packs under `options`.
    pub(crate) fn new(
        options: &lockstep_collective::CommunicationOptions,
        replicas: usize,
    ) -> Self {
        Self {
            compression: options.compression,
            replicas,
            error_feedback: options.error_feedback,
        }
    }

    /// Whether the packs keep residuals: error feedback on a compressed wire.
    pub(crate) fn keeps_residuals(self) -> bool {
        self.error_feedback && self.compression != Compression::None
    }
}

/// One replica's rounding errors, one per gradient value: what its last compressed send of
/// each value dropped, added to that value's next gradient before it is rounded (error
/// feedback). Empty until a step keeps them.
#[derive(Debug, Default)]
pub(crate) struct Residuals(Vec<f32>);

impl Residuals {
    /// The residuals kept (empty before a step kept any).
    pub(crate) fn values(&self) -> &[f32] {
        &self.0
    }

    /// Replaces them (a restore).
    pub(crate) fn set(&mut self, values: Vec<f32>) {
        self.0 = values;
    }

    /// [`Residuals::for_step`] handed over, to a thread that sums the step's packs: what it
    /// gives back goes in again with [`Residuals::set`] (empty when `wire` keeps none).
    pub(crate) fn take_for_step(&mut self, n: usize, wire: Wire) -> Vec<f32> {
        if !wire.keeps_residuals() {
            return Vec::new();
        }
        self.for_step(n, wire);
        std::mem::take(&mut self.0)
    }

    /// The residuals of a gradient buffer of `n` values (zero at first) when `wire` keeps
    /// them, else an empty slice.
    pub(crate) fn for_step(&mut self, n: usize, wire: Wire) -> &mut [f32] {
        if !wire.keeps_residuals() {
            return &mut [];
        }
        if self.0.len() != n {
            self.0 = vec![0.0; n];
        }
        &mut self.0
    }
}

/// The residuals of `range` of the gradients, or an empty slice when none are kept.
pub(crate) fn residuals_of(residuals: &mut [f32], range: Range<usize>) -> &mut [f32] {
    if residuals.is_empty() {
        &mut []
    } else {
        &mut residuals[range]
    }
}

/// Sums `buffer` (the gradients, `..n`, then the step's totals) over every replica, pack by
/// pack in order, after the backward pass.
pub(crate) fn reduce_after(
    link: &mut ReplicaLink,
    buffer: &mut [f32],
    n: usize,
    (packs, wire, residuals): (&Packs, Wire, &mut [f32]),
) -> Result<(), CollectiveError> {
    for (k, piece) in packs.pieces.iter().enumerate() {
        let range = piece.range.clone();
        let end = if with_totals(k, wire) {
            buffer.len()
        } else {
            range.end
        };
        let residual = residuals_of(residuals, range.clone());
        reduce_pack(link, &mut buffer[range.start..end], wire, residual)?;
        if k == 0 && packs.totals_after_first {
            reduce_totals(link, &mut buffer[n..], wire)?;
        }
    }
    if packs.totals_after_first {
        return Ok(());
    }
    reduce_totals(link, &mut buffer[n..], wire)
}

/// Whether pack (or piece) `k` carries the totals: the first, when it goes in `f32`.
pub(crate) fn with_totals(k: usize, wire: Wire) -> bool {
    k == 0 && wire.compression == Compression::None
}

/// The totals' own collective, after the packs, when the packs go in 16 bits.
pub(crate) fn reduce_totals(
    link: &mut impl SumsPacks,
    totals: &mut [f32],
    wire: Wire,
) -> Result<(), CollectiveError> {
    if wire.compression == Compression::None {
        return Ok(());
    }
    link.all_reduce(totals, ReduceOp::Sum)
}

/// Sums one pack over every replica in `wire`'s type, carrying each value's rounding error in
/// `residual` (its values' residuals, or empty: none kept).
pub(crate) fn reduce_pack(
    link: &mut impl SumsPacks,
    values: &mut [f32],
    wire: Wire,
    residual: &mut [f32],
) -> Result<(), CollectiveError> {
    match wire.compression {
        Compression::None => link.all_reduce(values, ReduceOp::Sum),
        Compression::Bf16 => reduce_as::<bf16>(link, values, 1.0, residual),
        Compression::Fp16 => reduce_as::<f16>(link, values, wire.replicas as f32, residual),
    }
}

/// Sums `values` over every replica as `E`: each replica's values divided by `divisor` and
/// rounded to `E` ([`HalfFloat::round_from`], with `residual`), the sum multiplied back.
fn reduce_as<E: HalfFloat>(
    link: &mut impl SumsPacks,
    values: &mut [f32],
    divisor: f32,
    residual: &mut [f32],
) -> Result<(), CollectiveError> {
    let mut wire = E::round_from(values, divisor, residual);
    link.all_reduce(&mut wire, ReduceOp::Sum)?;
    E::widen_into(&wire, divisor, values);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_nn::{Dense, Sequential};

    /// 4 → 8 → 2: kernel 32, bias 8, kernel 16, bias 2 values.
    fn four_eight_two() -> Sequential {
        let layers: Vec<Box<dyn lockstep_nn::Layer>> =
            vec![Box::new(Dense::new(8)), Box::new(Dense::new(2))];
        Sequential::new(&[4], layers, 0).unwrap()
    }

    #[test]
    fn a_piece_is_sent_once_every_value_from_its_start_to_its_packs_end_is_final() {
        // 4 → 8 → 2 in packs of 40 bytes: pieces (0, 48..58), (0, 46..48), (1, 30..40),
        // (1, 0..30), (0, 40..46).
        let net = four_eight_two();
        let packs = Packs::overlapping(net.parameters().specs(), 40, true);
        let mut arrivals = Arrivals::new(&packs);
        // The last bias (56..58), then the last kernel (40..56): all of pack 0's pieces.
        assert_eq!(arrivals.arrived(&packs, 56..58), Vec::<usize>::new());
        assert_eq!(arrivals.arrived(&packs, 40..56), [0, 1, 4]);
        // The first kernel in blocks, the bias (32..40) after the first: nothing goes until
        // the values from its start up are in.
        assert_eq!(arrivals.arrived(&packs, 16..32), Vec::<usize>::new());
        assert_eq!(arrivals.arrived(&packs, 32..40), [2]);
        assert_eq!(arrivals.arrived(&packs, 0..16), [3]);
        // A range in no pack, or empty, sends nothing.
        assert_eq!(arrivals.arrived(&packs, 58..60), Vec::<usize>::new());
        assert_eq!(arrivals.arrived(&packs, 3..3), Vec::<usize>::new());
        // Pack 0's pieces cut the last kernel, pack 1's the first.
        let specs = net.parameters().specs();
        let last_layer = |spec: &ParamSpec| spec.name.starts_with("dense_1/");
        assert_eq!(packs.pieces_cut_only(specs, last_layer), [true, false]);
        assert_eq!(packs.pieces_cut_only(specs, |_| true), [true, true]);
        assert_eq!(
            Packs::new(specs, 40).pieces_cut_only(specs, |_| false),
            [true, true]
        );
    }

    fn pieces_of(packs: &Packs) -> Vec<(usize, Range<usize>)> {
        (packs.pieces.iter())
            .map(|p| (p.pack, p.range.clone()))
            .collect()
    }

    #[test]
    fn a_later_pack_never_cuts_or_precedes_the_first_piece_nor_leaves_a_sliver() {
        let net = four_eight_two();
        let specs = net.parameters().specs();
        // Packs of 64 bytes: pack 0's first piece (16 values) is past two thirds of its 18,
        // so pack 1 goes right after it, whole.
        assert_eq!(
            pieces_of(&Packs::overlapping(specs, 64, true)),
            [(0, 42..58), (1, 24..40), (1, 0..24), (0, 40..42)]
        );
        // Packs of 44 bytes (11 values): two thirds of pack 0's 18 values falls one value
        // into its second piece, under a quarter of 11: no sliver is cut off, and pack 1 goes
        // at that piece's nearer edge, before it.
        assert_eq!(
            pieces_of(&Packs::overlapping(specs, 44, true)),
            [(0, 47..58), (1, 29..40), (1, 0..29), (0, 40..47)]
        );
    }

    #[test]
    fn packs_hold_whole_variables_from_the_last_layer_back() {
        let net = four_eight_two();
        let specs = net.parameters().specs();
        let whole = vec![Range { start: 0, end: 58 }];
        assert_eq!(Packs::new(specs, 0).ranges, whole);
        assert_eq!(Packs::new(specs, 1 << 20).ranges, whole);
        // 40 bytes: the last bias and kernel (18 values) fill the first pack, then the first
        // bias (8, short of 10) and kernel.
        let packs = Packs::new(specs, 40);
        assert_eq!(packs.ranges, [40..58, 0..40]);
        // Overlapping: a first piece of at most 10 values (40 bytes) from each pack's end, the
        // rest in one (far below 4 MiB); the second pack's pieces go after two thirds of the
        // first's 18 values, its second piece cut there.
        let overlapping = Packs::overlapping(specs, 40, true);
        assert!(overlapping.totals_after_first && !packs.totals_after_first);
        assert_eq!(
            pieces_of(&overlapping),
            [
                (0, 48..58),
                (0, 46..48),
                (1, 30..40),
                (1, 0..30),
                (0, 40..46)
            ]
        );
        // A pack past 4 MiB: a first piece of `bytes_per_pack`, then pieces of 4 MiB.
        let big =
            lockstep_nn::Sequential::new(&[1100], vec![Box::new(lockstep_nn::Dense::new(2000))], 0)
                .unwrap();
        let lengths: Vec<usize> = Packs::overlapping(big.parameters().specs(), 1 << 18, true)
            .pieces
            .iter()
            .map(|p| p.range.len())
            .collect();
        // 1100 × 2000 + 2000 values: 65,536 first, then 1 Mi, 1 Mi and what is left.
        assert_eq!(
            lengths,
            [65_536, 1 << 20, 1 << 20, 2_202_000 - 65_536 - (2 << 20)]
        );
        // Not in pieces (more than two processes): the packs whole, in their order; only the
        // totals move up.
        let whole = Packs::overlapping(specs, 40, false);
        assert_eq!(whole.pieces, packs.pieces);
        assert!(whole.totals_after_first);
        // The packs of the fit tests' MLP at 4 KiB: several, so those tests overlap.
        let mlp = lockstep_nn::models::mnist_mlp(3).unwrap();
        assert!(Packs::new(mlp.parameters().specs(), 4 * 1024).len() > 1);
    }
}
