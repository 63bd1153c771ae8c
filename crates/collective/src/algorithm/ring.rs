//! Ring algorithms: reduce-scatter, all-gather, and all-reduce as the two in a row.

use super::{read_and_write, segment};
use crate::element::{Element, ReduceOp};
use crate::error::CollectiveError;
use crate::session::Session;
use crate::transport::Transport;

/// After this, rank `r` holds the complete reduction of segment `(r + shift + 1) mod n` of
/// `data` (segments as [`segment`] cuts `data.len()` into `n`).
pub(crate) fn reduce_scatter<T: Transport, E: Element>(
    s: &mut Session<'_, T>,
    data: &mut [E],
    op: ReduceOp,
    shift: usize,
) -> Result<(), CollectiveError> {
    let (n, r) = (s.world_size(), s.rank());
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    for step in 0..n - 1 {
        let send = segment(data.len(), n, (r + shift + n - step) % n);
        let recv = segment(data.len(), n, (r + shift + 2 * n - step - 1) % n);
        let len = recv.len();
        let (outgoing, target) = read_and_write(data, send, recv);
        s.send_recv(next, outgoing, prev, len, |offset, incoming: &[E]| {
            op.combine(&mut target[offset..offset + incoming.len()], incoming);
        })?;
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
    let (n, r) = (s.world_size(), s.rank());
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    for step in 0..n - 1 {
        let send = segment(data.len(), n, (r + shift + 1 + n - step) % n);
        let recv = segment(data.len(), n, (r + shift + n - step) % n);
        let len = recv.len();
        let (outgoing, target) = read_and_write(data, send, recv);
        s.send_recv(next, outgoing, prev, len, |offset, incoming: &[E]| {
            target[offset..offset + incoming.len()].copy_from_slice(incoming);
        })?;
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
        reduce_scatter(s, data, op, 0)?;
        // Finish (divide, for Mean) the one complete segment before sharing it: every rank
        // then receives the same final values.
        let own = segment(data.len(), n, (s.rank() + 1) % n);
        op.finish(&mut data[own], n);
        all_gather(s, data, 0)?;
    } else {
        op.finish(data, n);
    }
    Ok(())
}
