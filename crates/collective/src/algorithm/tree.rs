//! Binary-tree algorithms: reduce to a root, broadcast from a root.

use crate::element::{Element, ReduceOp};
use crate::error::CollectiveError;
use crate::session::Session;
use crate::transport::Transport;

/// Children of virtual rank `v` in a binary tree of `n`.
fn children(v: usize, n: usize) -> impl Iterator<Item = usize> {
    [2 * v + 1, 2 * v + 2].into_iter().filter(move |&c| c < n)
}

/// Real rank of virtual rank `v` in a tree rooted at `root`.
fn real(v: usize, root: usize, n: usize) -> usize {
    (v + root) % n
}

/// Reduces every rank's `data` into rank 0's, children in order, so the sum order is fixed.
fn reduce<T: Transport, E: Element>(
    s: &mut Session<'_, T>,
    data: &mut [E],
    op: ReduceOp,
) -> Result<(), CollectiveError> {
    let (n, r) = (s.world_size(), s.rank());
    for child in children(r, n) {
        s.recv(child, data.len(), |offset, incoming: &[E]| {
            op.combine(&mut data[offset..offset + incoming.len()], incoming);
        })?;
    }
    if r != 0 {
        s.send((r - 1) / 2, data)?;
    }
    Ok(())
}

/// Copies `root`'s `data` to every rank down a binary tree.
pub(crate) fn broadcast<T: Transport, E: Element>(
    s: &mut Session<'_, T>,
    data: &mut [E],
    root: usize,
) -> Result<(), CollectiveError> {
    let (n, r) = (s.world_size(), s.rank());
    let v = (r + n - root) % n;
    if v != 0 {
        let parent = real((v - 1) / 2, root, n);
        s.recv(parent, data.len(), |offset, incoming: &[E]| {
            data[offset..offset + incoming.len()].copy_from_slice(incoming);
        })?;
    }
    for child in children(v, n) {
        s.send(real(child, root, n), data)?;
    }
    Ok(())
}

/// Tree all-reduce: reduce to rank 0, finish there, broadcast back.
pub(crate) fn all_reduce<T: Transport, E: Element>(
    s: &mut Session<'_, T>,
    data: &mut [E],
    op: ReduceOp,
) -> Result<(), CollectiveError> {
    reduce(s, data, op)?;
    if s.rank() == 0 {
        op.finish(data, s.world_size());
    }
    broadcast(s, data, 0)
}
