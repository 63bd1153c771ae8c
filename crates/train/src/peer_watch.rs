//! How a wait on the GPUs learns that a worker process died. NCCL waits for its peers without
//! knowing whether they are alive; each replica's communicator asks this side channel, the
//! cluster's own connections, while it waits ([`PeerCheck`]), and ends the wait with an error
//! naming the peer in moments rather than at the collective timeout.
//!
//! A process's first replica holds its connections to the other processes. Every replica of
//! the process looks at them through that replica's link, at most every [`EVERY`]; the first
//! to find a process gone tells the others through a flag they share, so all of the process's
//! replicas end their waits, each naming the same peer, and each aborts its communicator.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use lockstep_collective::CollectiveError;
use lockstep_cuda::nccl::PeerCheck;

use crate::error::TrainError;
use crate::strategy::{LinkProbe, ReplicaLink};

/// How often a waiting replica looks at the connections: a dead peer is seen within this
/// (plus the kernel's notice of the closed socket), at the cost of one non-blocking read per
/// connection.
pub(crate) const EVERY: Duration = Duration::from_millis(20);

/// What the replicas of one process know of the other processes: the first replica's
/// connections to them, and the peer found gone, once one is.
pub(crate) struct PeerWatch {
    probe: LinkProbe,
    local_replicas: usize,
    found: OnceLock<(usize, String)>,
}

impl PeerWatch {
    /// The watch of the process whose replicas are `links` (in local order: the first holds
    /// the connections to other processes); `None` without replicas.
    pub(crate) fn of(links: &[ReplicaLink]) -> Option<Arc<Self>> {
        let first = links.first()?;
        Some(Arc::new(Self {
            probe: first.probe(),
            local_replicas: links.len(),
            found: OnceLock::new(),
        }))
    }

    /// A side channel for one replica's NCCL communicator: the peer found gone, looked for at
    /// most every [`EVERY`]. A peer is named by its first replica's rank among all replicas,
    /// and the reason says which process it was and how its connection ended.
    pub(crate) fn check(self: &Arc<Self>) -> PeerCheck {
        let watch = Arc::clone(self);
        let mut looked = None::<Instant>;
        Box::new(move || {
            if let Some(gone) = watch.found.get() {
                return Some(gone.clone());
            }
            if looked.is_some_and(|at| at.elapsed() < EVERY) {
                return None;
            }
            looked = Some(Instant::now());
            let lost = watch.probe.lost_process()?;
            watch.report(&lost)
        })
    }

    /// Tells every replica of the process that replica `replica` (this process's first)
    /// failed carrying the worker's sum to the others, so their NCCL waits (for the broadcast
    /// it will not send) end too, naming it and `why`; a lost peer is named as
    /// [`PeerWatch::report`] names it.
    pub(crate) fn fail(&self, replica: usize, error: &TrainError) {
        if let TrainError::Collective(lost @ CollectiveError::PeerLost { .. }) = error {
            self.report(lost);
            return;
        }
        let why = format!("replica {replica} failed carrying this worker's sum: {error}");
        let _ = self.found.get_or_init(|| (replica, why));
    }

    /// Tells every replica of the process that `error` lost a peer (found gone through the
    /// connections), so their NCCL waits end too. Returns the peer found gone first, or `None`
    /// when `error` names no peer.
    pub(crate) fn report(&self, error: &CollectiveError) -> Option<(usize, String)> {
        let CollectiveError::PeerLost {
            rank,
            address,
            reason,
        } = error
        else {
            return None;
        };
        let gone = (
            rank * self.local_replicas,
            format!("the worker process of rank {rank} ({address}) is gone: {reason}"),
        );
        Some(self.found.get_or_init(|| gone).clone())
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, TcpListener};
    use std::thread;

    use lockstep_cluster::{Cluster, TfConfig};
    use lockstep_collective::{CommunicationOptions, ReduceOp, TcpOptions, TcpTransport};

    use super::*;
    use crate::strategy::{MultiWorkerMirroredStrategy, Strategy};

    /// This process's two replicas of a cluster of two workers on loopback.
    fn two_workers(replicas: usize) -> Vec<Vec<ReplicaLink>> {
        let listeners: Vec<TcpListener> = (0..2)
            .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a free port"))
            .collect();
        let addresses: Vec<String> = listeners
            .iter()
            .map(|l| l.local_addr().expect("a bound port").to_string())
            .collect();
        let handles: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(rank, listener)| {
                let addresses = addresses.clone();
                thread::spawn(move || {
                    let json = format!(
                        r#"{{"cluster": {{"worker": {addresses:?}}}, "task": {{"type": "worker", "index": {rank}}}}}"#
                    );
                    let cluster = Cluster::new(TfConfig::parse(&json).ok()?).ok()?;
                    let options = TcpOptions {
                        rendezvous_timeout: Duration::from_secs(30),
                        ..TcpOptions::default()
                    };
                    let transport =
                        TcpTransport::connect_on(listener, rank, &addresses, &options).ok()?;
                    let mut strategy = MultiWorkerMirroredStrategy::from_transport(
                        &cluster,
                        transport,
                        CommunicationOptions::default(),
                        replicas,
                    )
                    .ok()?;
                    strategy.take_replicas().ok()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().ok().flatten().expect("a worker's replicas"))
            .collect()
    }

    /// Every replica of `links` in one all-reduce, each on its own thread.
    fn all_reduce(links: Vec<ReplicaLink>) -> Vec<ReplicaLink> {
        let handles: Vec<_> = links
            .into_iter()
            .map(|mut link| {
                thread::spawn(move || {
                    let mut one = [1.0_f32];
                    link.all_reduce(&mut one, ReduceOp::Sum).map(|()| link)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().ok().and_then(Result::ok).expect("an all-reduce"))
            .collect()
    }

    #[test]
    fn every_replica_of_a_worker_learns_within_moments_that_another_worker_died() {
        let mut workers = two_workers(2);
        let dying = workers.pop().expect("worker 1");
        let living = workers.pop().expect("worker 0");
        let (living, dying) = thread::scope(|scope| {
            let dying = scope.spawn(|| all_reduce(dying));
            let living = all_reduce(living);
            (living, dying.join().expect("worker 1's all-reduce"))
        });
        let watch = PeerWatch::of(&living).expect("replicas");
        let mut checks: Vec<PeerCheck> = living.iter().map(|_| watch.check()).collect();
        // Both alive: nothing to report, however often asked.
        for _ in 0..3 {
            assert!(checks.iter_mut().all(|check| check().is_none()));
            thread::sleep(EVERY);
        }
        drop(dying); // worker 1's connections close, as when its process is killed
        let started = Instant::now();
        let mut seen = vec![None; checks.len()];
        while seen.iter().any(Option::is_none) && started.elapsed() < Duration::from_secs(10) {
            for (check, seen) in checks.iter_mut().zip(&mut seen) {
                if seen.is_none() {
                    *seen = check();
                }
            }
            thread::sleep(Duration::from_millis(1));
        }
        // Seen by the closed connections; the loop above gives up after 10 s, with no tighter
        // bound that a loaded machine would stretch.
        for seen in seen {
            let (peer, why) = seen.expect("a peer named");
            // Worker 1's first replica is rank 2 of the four.
            assert_eq!(peer, 2, "{why}");
            assert!(why.contains("rank 1"), "{why}");
        }
    }

    #[test]
    fn a_peer_lost_in_the_first_replicas_collective_ends_every_replicas_wait() {
        let mut workers = two_workers(2);
        let living = workers.remove(0);
        let watch = PeerWatch::of(&living).expect("replicas");
        let mut checks: Vec<PeerCheck> = living.iter().map(|_| watch.check()).collect();
        assert!(checks.iter_mut().all(|check| check().is_none()));
        // An error that names no peer is not a peer lost.
        assert_eq!(
            watch.report(&CollectiveError::Setup("no room".into())),
            None
        );
        let lost = CollectiveError::PeerLost {
            rank: 1,
            address: "10.0.0.2:2222".into(),
            reason: "connection reset".into(),
        };
        assert_eq!(watch.report(&lost).map(|(peer, _)| peer), Some(2));
        for check in &mut checks {
            let (peer, why) = check().expect("the peer reported");
            assert_eq!(peer, 2);
            assert!(
                why.contains("10.0.0.2:2222") && why.contains("connection reset"),
                "{why}"
            );
        }
        drop(workers);
    }

    #[test]
    fn any_failure_of_the_first_replica_ends_the_other_replicas_waits_naming_it() {
        let mut workers = two_workers(2);
        let living = workers.remove(0);
        let watch = PeerWatch::of(&living).expect("replicas");
        let mut other = watch.check();
        assert_eq!(other(), None);
        watch.fail(0, &TrainError::invalid("upload", "out of device memory"));
        let (replica, why) = other().expect("the failure reported");
        assert_eq!(replica, 0);
        assert!(why.contains("out of device memory"), "{why}");
        drop(workers);
    }
}
