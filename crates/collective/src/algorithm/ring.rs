//! Ring algorithms: reduce-scatter, all-gather, and all-reduce as the two in a row, each run
//! as one pipelined flow of packs around the ring.
//!
//! An all-reduce takes `2(n−1)` steps; in step `t` rank `r` sends segment `(r + shift − t) mod
//! n` to `r + 1` and receives segment `(r + shift − t − 1) mod n` from `r − 1`: reducing it in
//! the first `n − 1` steps, copying it in the rest. What a rank receives in step `t` it sends
//! in step `t + 1`, so the steps are not run one after the other: each pack is forwarded as
//! soon as it has been reduced (or has arrived), while it is still in cache, and no rank waits
//! at a step boundary.

use std::ops::Range;

use super::segment;
use crate::element::{Element, ReduceOp};
use crate::error::CollectiveError;
use crate::header::Header;
use crate::session::{Session, belongs, check, check_size};
use crate::transport::{Arrival, Flow, Transport};

/// One message of a ring flow: which elements it carries, in which step.
#[derive(Debug, Clone)]
struct Pack {
    step: usize,
    elems: Range<usize>,
    /// For an outgoing pack, how many incoming packs must have been applied first.
    needs: usize,
}

/// Steps `steps` of a ring all-reduce of `data` as one [`Flow`].
struct RingFlow<'d, E> {
    data: &'d mut [E],
    op: ReduceOp,
    template: Header,
    world: usize,
    to: usize,
    from: usize,
    /// The step whose incoming packs complete this rank's segment, to be finished (divided,
    /// for `Mean`) before they travel on: every rank then receives the same final values.
    finish_step: Option<usize>,
    outgoing: Vec<Pack>,
    incoming: Vec<Pack>,
}

impl<'d, E: Element> RingFlow<'d, E> {
    fn new<T: Transport>(
        s: &Session<'_, T>,
        data: &'d mut [E],
        op: ReduceOp,
        shift: usize,
        steps: Range<usize>,
        finish_step: Option<usize>,
    ) -> Self {
        let (n, r) = (s.world_size(), s.rank());
        let per_pack = s.pack_elems::<E>();
        let len = data.len();
        let segment_of = |t: usize| segment(len, n, (r + shift + 2 * n - t) % n);
        let packs = |step: usize, elems: Range<usize>| {
            let count = elems.len().div_ceil(per_pack).max(1);
            (0..count).map(move |j| Pack {
                step,
                elems: (elems.start + j * per_pack).min(elems.end)
                    ..(elems.start + (j + 1) * per_pack).min(elems.end),
                needs: 0,
            })
        };
        let incoming: Vec<Pack> = steps
            .clone()
            .flat_map(|t| packs(t, segment_of(t + 1)))
            .collect();
        // What arrives in step t − 1 leaves in step t, cut into the same packs: outgoing pack
        // j of step t needs incoming pack j of step t − 1.
        let first_incoming_of = |t: usize| incoming.iter().position(|p| p.step == t);
        let outgoing = steps
            .clone()
            .flat_map(|t| {
                let after = (t > steps.start)
                    .then(|| first_incoming_of(t - 1))
                    .flatten();
                packs(t, segment_of(t))
                    .enumerate()
                    .map(move |(j, pack)| Pack {
                        needs: after.map_or(0, |first| first + j + 1),
                        ..pack
                    })
            })
            .collect();
        Self {
            data,
            op,
            template: s.template,
            world: n,
            to: (r + 1) % n,
            from: (r + n - 1) % n,
            finish_step,
            outgoing,
            incoming,
        }
    }

    /// Whether incoming packs of `step` are reduced (else copied).
    fn reduces(&self, step: usize) -> bool {
        step + 1 < self.world
    }
}

impl<E: Element> Flow for RingFlow<'_, E> {
    fn to(&self) -> usize {
        self.to
    }

    fn from(&self) -> usize {
        self.from
    }

    fn outgoing(&self) -> usize {
        self.outgoing.len()
    }

    fn incoming(&self) -> usize {
        self.incoming.len()
    }

    fn needs(&self, index: usize) -> usize {
        self.outgoing[index].needs
    }

    fn message(&self, index: usize) -> (Header, &[u8]) {
        let elems = self.outgoing[index].elems.clone();
        (self.template, bytemuck::cast_slice(&self.data[elems]))
    }

    fn place(&mut self, index: usize, header: &Header, len: usize) -> Option<&mut [u8]> {
        let pack = self.incoming.get(index)?;
        let elems = pack.elems.clone();
        (!self.reduces(pack.step)
            && belongs(&self.template, header)
            && len == elems.len() * size_of::<E>())
        .then(|| bytemuck::cast_slice_mut(&mut self.data[elems]))
    }

    fn apply(&mut self, index: usize, arrival: Arrival<'_>) -> Result<(), CollectiveError> {
        let Pack { step, elems, .. } = self.incoming[index].clone();
        let Arrival::Message(message) = arrival else {
            // Placed: `place` checked the header and the bytes are where they belong.
            return Ok(());
        };
        check(&self.template, self.from, message)?;
        check_size(elems.len() * size_of::<E>(), message, self.from)?;
        let reduces = self.reduces(step);
        let target = &mut self.data[elems];
        // Payloads are normally aligned for E (allocators align to 16 bytes): view them in
        // place, and copy only when they are not.
        let unaligned;
        let incoming = if let Ok(values) = bytemuck::try_cast_slice::<u8, E>(&message.payload) {
            values
        } else {
            unaligned = bytemuck::pod_collect_to_vec::<u8, E>(&message.payload);
            &unaligned
        };
        if reduces {
            self.op.combine(target, incoming);
        } else {
            target.copy_from_slice(incoming);
        }
        if self.finish_step == Some(step) {
            self.op.finish(target, self.world);
        }
        Ok(())
    }
}

/// After this, rank `r` holds the complete reduction of segment `(r + shift + 1) mod n` of
/// `data` (segments as [`segment`] cuts `data.len()` into `n`).
pub(crate) fn reduce_scatter<T: Transport, E: Element>(
    s: &mut Session<'_, T>,
    data: &mut [E],
    op: ReduceOp,
    shift: usize,
) -> Result<(), CollectiveError> {
    let n = s.world_size();
    if n > 1 {
        let mut flow = RingFlow::new(s, data, op, shift, 0..n - 1, None);
        s.exchange(&mut flow)?;
    }
    Ok(())
}

/// Starting with rank `r` holding segment `(r + shift + 1) mod n`, leaves every rank holding
/// every segment.
pub(crate) fn all_gather<T: Transport, E: Element>(
    s: &mut Session<'_, T>,
    data: &mut [E],
    shift: usize,
) -> Result<(), CollectiveError> {
    let n = s.world_size();
    if n > 1 {
        // The op is never used: all-gather steps only copy.
        let mut flow = RingFlow::new(s, data, ReduceOp::Sum, shift, n - 1..2 * n - 2, None);
        s.exchange(&mut flow)?;
    }
    Ok(())
}

/// Ring all-reduce: correct for any length, including 0 and lengths below the world size.
pub(crate) fn all_reduce<T: Transport, E: Element>(
    s: &mut Session<'_, T>,
    data: &mut [E],
    op: ReduceOp,
) -> Result<(), CollectiveError> {
    let n = s.world_size();
    if n > 1 {
        let mut flow = RingFlow::new(s, data, op, 0, 0..2 * n - 2, Some(n - 2));
        s.exchange(&mut flow)?;
    } else {
        op.finish(data, n);
    }
    Ok(())
}
