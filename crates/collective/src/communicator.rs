//! `Communicator`: the collectives a training step calls, over any transport.

use std::time::{Duration, Instant};

use crate::algorithm::{self, Algorithm};
use crate::element::{Element, ReduceOp};
use crate::error::CollectiveError;
use crate::flight::{FlightRecord, FlightRecorder};
use crate::header::{DType, Header, Kind, Op};
use crate::secret::{ClusterSecret, SECRET_FILE_VARIABLE, SECRET_VARIABLE};
use crate::session::Session;
use crate::transport::{ClusterTransport, TcpOptions, Transport, inherited};
use lockstep_cluster::Cluster;

/// Which algorithm an all-reduce uses, as `tf.distribute.experimental.CommunicationImplementation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Implementation {
    /// [`Algorithm::Tree`] below [`AUTO_TREE_MAX_BYTES`], [`Algorithm::Ring`] above.
    #[default]
    Auto,
    /// Always the ring.
    Ring,
    /// Always the tree.
    Tree,
    /// NCCL on GPUs; needs the CUDA backend, which these transports are not.
    Nccl,
}

/// Buffers up to this size go through the tree under [`Implementation::Auto`]: its `2·log₂ n`
/// steps beat the ring's `2(n−1)` when latency, not bandwidth, dominates. Measured between
/// processes on 127.0.0.1 (`cargo xtask bench allreduce`, `docs/PERFORMANCE.md`): on 4 ranks
/// the tree is 2–4× faster up to 256 KiB and the ring faster from 1 MiB; on 2 ranks the two
/// are within noise of each other from 16 to 256 KiB and the ring is 2.5× faster at 1 MiB.
pub const AUTO_TREE_MAX_BYTES: usize = 256 * 1024;

/// Options of every collective on a communicator, as `tf.distribute.experimental.CommunicationOptions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommunicationOptions {
    /// The all-reduce algorithm.
    pub implementation: Implementation,
    /// Bytes per message: larger buffers are pipelined in pieces of this size.
    pub bytes_per_pack: usize,
    /// How long one collective may wait for its peers before failing.
    pub timeout: Duration,
    /// How a training step sends its gradients ([`Compression`]): a setting for the step,
    /// which picks the element type it all-reduces; the collectives themselves send the type
    /// they are given.
    pub compression: Compression,
    /// With a [`Compression`], carry each replica's rounding error into its next step's
    /// gradients before they are rounded (error feedback, as 1-bit SGD and `PowerSGD` do): what
    /// a step's rounding dropped is sent later instead of lost. A setting for the step, as
    /// `compression`; no effect without one.
    pub error_feedback: bool,
    /// A training step with several packs returns once its backward pass has handed every
    /// pack to the collectives, and each pack's update is applied when the next step's forward
    /// pass first reads its variables: the packs' sums then overlap that pass, and the first
    /// layers' pack is summed partway through the others, so that the next pass can start
    /// before the largest pack is summed. The same updates, bit for bit, with the same packs;
    /// a setting for the step, as `compression`.
    pub overlap_update: bool,
}

/// The element type gradients travel in, as Horovod's `Compression` and PyTorch DDP's
/// `bf16_compress_hook`/`fp16_compress_hook`: half the bytes of `f32` on the wire, each sum
/// taken in `f32` and rounded once to the 16-bit type. A step's loss and metric totals stay in
/// `f32` (counts of examples must stay exact).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    /// `f32`, as computed.
    #[default]
    None,
    /// bfloat16: `f32`'s range, 8 bits of mantissa.
    Bf16,
    /// IEEE half precision: 11 bits of mantissa, values up to 65,504; each replica's
    /// gradients are divided by the number of replicas before they are rounded (as PyTorch's
    /// hook does), so that their sum stays in range.
    Fp16,
}

impl Default for CommunicationOptions {
    fn default() -> Self {
        Self {
            implementation: Implementation::Auto,
            bytes_per_pack: 1 << 20,
            timeout: Duration::from_mins(5),
            compression: Compression::None,
            error_feedback: false,
            overlap_update: false,
        }
    }
}

/// A rank's handle on a group: all-reduce, reduce-scatter, all-gather, broadcast and barrier.
///
/// Every rank must call the same collectives in the same order with matching sizes and types;
/// a difference is detected ([`CollectiveError::Mismatch`]) rather than producing wrong data.
/// Once a collective fails, the communicator refuses further ones
/// ([`CollectiveError::Broken`]): peers may be anywhere in the protocol.
pub struct Communicator<T: Transport> {
    transport: T,
    options: CommunicationOptions,
    seq: u64,
    broken: Option<String>,
    recorder: FlightRecorder,
}

impl<T: Transport> Communicator<T> {
    /// A communicator over a connected transport.
    pub fn new(transport: T, options: CommunicationOptions) -> Self {
        Self {
            transport,
            options,
            seq: 0,
            broken: None,
            recorder: FlightRecorder::default(),
        }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.transport.rank()
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.transport.world_size()
    }

    /// The transport underneath (for its settings, say).
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// The transport underneath, to build another kind of communicator on it (a
    /// [`HierarchicalCommunicator`](crate::HierarchicalCommunicator) across processes).
    pub fn into_transport(self) -> T {
        self.transport
    }

    /// The options in force.
    pub fn options(&self) -> &CommunicationOptions {
        &self.options
    }

    /// Whether the transport's waits may spin ([`Transport::set_spinning`]).
    pub fn set_spinning(&mut self, spinning: bool) {
        self.transport.set_spinning(spinning);
    }

    /// Looks, without waiting, for a peer whose connection has ended
    /// ([`Transport::check_peers`]): a wait outside this communicator (NCCL's, on a GPU) asks
    /// it to learn of a dead peer process in moments rather than at its timeout.
    ///
    /// # Errors
    ///
    /// [`CollectiveError::PeerLost`] naming the first peer found gone.
    pub fn check_peers(&mut self) -> Result<(), CollectiveError> {
        self.transport.check_peers()
    }

    /// Changes the options of later collectives. Every rank must make the same change at the
    /// same point, as with any collective setting.
    pub fn set_options(&mut self, options: CommunicationOptions) {
        self.options = options;
    }

    /// The algorithm an all-reduce of `bytes` bytes uses under the current options.
    ///
    /// # Errors
    ///
    /// For [`Implementation::Nccl`], which these transports cannot run.
    pub fn algorithm_for(&self, bytes: usize) -> Result<Algorithm, CollectiveError> {
        match self.options.implementation {
            Implementation::Tree => Ok(Algorithm::Tree),
            Implementation::Auto if bytes <= AUTO_TREE_MAX_BYTES => Ok(Algorithm::Tree),
            Implementation::Ring | Implementation::Auto => Ok(Algorithm::Ring),
            Implementation::Nccl => Err(CollectiveError::InvalidArgument {
                op: "all_reduce",
                why: "NCCL needs GPU buffers and the CUDA backend; use Ring, Tree or Auto on this transport".into(),
            }),
        }
    }

    /// The most recent collectives, oldest first.
    pub fn flight_records(&self) -> impl Iterator<Item = &FlightRecord> {
        self.recorder.records()
    }

    /// Runs one collective: numbering, deadline, tracing span, flight record, and on failure
    /// the abort broadcast and the broken state.
    fn run<E: Element>(
        &mut self,
        op: Op,
        count: usize,
        reduce: Option<ReduceOp>,
        algorithm: &'static str,
        body: impl FnOnce(&mut Session<'_, T>) -> Result<(), CollectiveError>,
    ) -> Result<(), CollectiveError> {
        if let Some(cause) = &self.broken {
            return Err(CollectiveError::Broken {
                cause: cause.clone(),
            });
        }
        self.seq += 1;
        let (rank, seq, bytes) = (self.rank(), self.seq, count * std::mem::size_of::<E>());
        let span = tracing::debug_span!("collective", rank, %op, seq, bytes, algorithm);
        let _entered = span.enter();
        let dtype = if count == 0 && op == Op::Barrier {
            DType::None
        } else {
            E::DTYPE
        };
        let template = Header {
            kind: Kind::Data,
            op,
            dtype,
            reduce: reduce.map_or(0, ReduceOp::code),
            cluster: self.transport_cluster(),
            seq,
            count: count as u64,
            source: rank as u32,
        };
        let started = Instant::now();
        let mut session = Session {
            transport: &mut self.transport,
            template,
            deadline: started + self.options.timeout,
            timeout: self.options.timeout,
            bytes_per_pack: self.options.bytes_per_pack.max(1),
            peers: Vec::new(),
        };
        let result = body(&mut session).map_err(|e| session.root_cause(e));
        if let Err(e) = &result
            && !matches!(e, CollectiveError::Aborted { .. })
        {
            session.abort(&e.to_string(), matches!(e, CollectiveError::Timeout { .. }));
        }
        let peers = std::mem::take(&mut session.peers);
        self.recorder.record(FlightRecord {
            op,
            seq,
            bytes,
            algorithm,
            peers,
            elapsed: started.elapsed(),
            failure: result.as_ref().err().map(ToString::to_string),
        });
        if let Err(e) = &result {
            tracing::error!(rank, %op, seq, error = %e, "collective failed; this communicator is now broken");
            self.recorder.dump(rank);
            self.broken = Some(e.to_string());
        }
        result
    }

    /// Gives up this rank's next collective, `op`, without running it, because of `error`
    /// from elsewhere (a hierarchical all-reduce's cross-process step): the peers, waiting in
    /// theirs, receive an abort naming this rank and `error` instead of timing out, and this
    /// communicator is broken. Returns `error`.
    pub(crate) fn abandon_next(&mut self, op: Op, error: CollectiveError) -> CollectiveError {
        let reason = error.to_string();
        let timed_out = matches!(error, CollectiveError::Timeout { .. });
        let _ = self.run::<f32>(op, 0, None, "abandoned", |s| {
            s.abort(&reason, timed_out);
            Err(CollectiveError::Aborted {
                op,
                seq: s.template.seq,
                origin: s.rank(),
                reason: reason.clone(),
            })
        });
        error
    }

    fn transport_cluster(&self) -> u64 {
        self.transport.cluster()
    }
}

impl<T: ClusterTransport> Communicator<T> {
    /// Joins the collective group of a `TF_CONFIG`-style cluster over TCP or gRPC (the
    /// transport type chooses): this task's rank and
    /// every member's address come from `cluster`, and the cluster identity from its addresses,
    /// so tasks of another cluster cannot join by mistake. A listening socket handed to the
    /// process in systemd's socket-activation protocol (`LISTEN_FDS`, as `cargo xtask
    /// run-cluster` hands each task its port) is used instead of binding the address.
    ///
    /// # Errors
    ///
    /// [`CollectiveError::InvalidArgument`] for a task outside the collective group (`ps`,
    /// `evaluator`), [`CollectiveError::Setup`] when the group does not form in time.
    pub fn from_cluster(
        cluster: &Cluster,
        options: CommunicationOptions,
        rendezvous_timeout: Duration,
    ) -> Result<Self, CollectiveError> {
        let transport = TcpOptions {
            rendezvous_timeout,
            ..TcpOptions::default()
        };
        Self::from_cluster_with(cluster, options, &transport)
    }

    /// As [`Communicator::from_cluster`], with the transport's own options (how to reach
    /// peers on the same host, the rendezvous timeout); their `cluster` identity is replaced
    /// by the one computed from the cluster's addresses.
    ///
    /// # Errors
    ///
    /// As [`Communicator::from_cluster`].
    pub fn from_cluster_with(
        cluster: &Cluster,
        options: CommunicationOptions,
        transport: &TcpOptions,
    ) -> Result<Self, CollectiveError> {
        let rank = cluster.rank().ok_or_else(|| CollectiveError::InvalidArgument {
            op: "from_cluster",
            why: format!("task {} is outside the collective group (only the chief and workers all-reduce)", cluster.task()),
        })?;
        let addresses: Vec<String> = cluster
            .group_addresses()
            .into_iter()
            .map(str::to_owned)
            .collect();
        let secret = match &transport.secret {
            Some(secret) => Some(secret.clone()),
            None => ClusterSecret::from_env()?,
        };
        if secret.is_none()
            && addresses.len() > 1
            && !transport.bind.is_some_and(|ip| ip.is_loopback())
        {
            tracing::warn!(
                "this task listens on every interface and its cluster has no secret: anyone who can reach its port can take a rank's place. Give every task the same {SECRET_VARIABLE} (16 bytes or more), or {SECRET_FILE_VARIABLE} naming a file only its owner can read"
            );
        }
        let tcp = TcpOptions {
            cluster: cluster_identity(&addresses),
            secret,
            ..transport.clone()
        };
        let transport = if addresses.is_empty() {
            T::single()
        } else {
            let connected = match inherited::take_listener(&addresses[rank])? {
                Some(listener) => T::connect_on(listener, rank, &addresses, &tcp),
                None => T::connect(rank, &addresses, &tcp),
            };
            connected.map_err(|e| match e {
                // The transport knows ranks; the user knows tasks.
                CollectiveError::Setup(why) => {
                    CollectiveError::Setup(format!("{why} (ranks: {})", group_table(cluster)))
                }
                other => other,
            })?
        };
        Ok(Self::new(transport, options))
    }
}

/// `0 = worker:0 at host:port, 1 = …`: which task each rank of `cluster`'s group is.
fn group_table(cluster: &Cluster) -> String {
    cluster
        .collective_group()
        .iter()
        .enumerate()
        .map(|(rank, task)| {
            let at = cluster.peer_address(rank).unwrap_or("?");
            format!("{rank} = {task} at {at}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// FNV-1a over the group's addresses: equal for every member of one cluster, different for
/// another. It keeps two clusters that share hosts from joining each other by mistake; it is a
/// checksum anyone who knows the addresses can compute, not a credential, and proves nothing
/// about who presents it.
fn cluster_identity(addresses: &[String]) -> u64 {
    addresses
        .iter()
        .flat_map(|a| a.bytes().chain([0]))
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

impl<T: Transport> Communicator<T> {
    /// Replaces every rank's `data` with the elementwise reduction over all ranks.
    ///
    /// # Errors
    ///
    /// [`CollectiveError::Timeout`], [`CollectiveError::PeerLost`],
    /// [`CollectiveError::Mismatch`], [`CollectiveError::Aborted`], or
    /// [`CollectiveError::Broken`] after an earlier failure.
    pub fn all_reduce<E: Element>(
        &mut self,
        data: &mut [E],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        if self.transport.shared_memory().is_some() && self.world_size() > 1 {
            return self.run::<E>(Op::AllReduce, data.len(), Some(op), "shared-memory", |s| {
                let (seq, deadline, timeout) = (s.template.seq, s.deadline, s.timeout);
                match s.transport.shared_memory() {
                    Some(shared) => shared.all_reduce(data, op, seq, deadline, timeout),
                    None => unreachable!("checked above"),
                }
            });
        }
        let algorithm = self.algorithm_for(std::mem::size_of_val(data))?;
        self.run::<E>(
            Op::AllReduce,
            data.len(),
            Some(op),
            algorithm.name(),
            |s| match algorithm {
                Algorithm::Ring => algorithm::ring::all_reduce(s, data, op),
                Algorithm::Tree => algorithm::tree::all_reduce(s, data, op),
            },
        )
    }

    /// Reduces `input` (`world_size` equal blocks) across ranks and leaves block `rank` of the
    /// result in `output`.
    ///
    /// # Errors
    ///
    /// As [`Communicator::all_reduce`], and [`CollectiveError::InvalidArgument`] when
    /// `input.len() != world_size · output.len()`.
    pub fn reduce_scatter<E: Element>(
        &mut self,
        input: &[E],
        output: &mut [E],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let n = self.world_size();
        if input.len() != n * output.len() {
            return Err(CollectiveError::InvalidArgument {
                op: "reduce_scatter",
                why: format!(
                    "the input has {} elements, which is not {n} blocks of the output's {}",
                    input.len(),
                    output.len()
                ),
            });
        }
        let mut scratch = input.to_vec();
        self.run::<E>(Op::ReduceScatter, output.len(), Some(op), "ring", |s| {
            algorithm::ring::reduce_scatter(s, &mut scratch, op, n - 1)?;
            let own = algorithm::segment(scratch.len(), n, s.rank());
            op.finish(&mut scratch[own.clone()], n);
            output.copy_from_slice(&scratch[own]);
            Ok(())
        })
    }

    /// Concatenates every rank's `input`, in rank order, into every rank's `output`.
    ///
    /// # Errors
    ///
    /// As [`Communicator::all_reduce`], and [`CollectiveError::InvalidArgument`] when
    /// `output.len() != world_size · input.len()`.
    pub fn all_gather<E: Element>(
        &mut self,
        input: &[E],
        output: &mut [E],
    ) -> Result<(), CollectiveError> {
        let n = self.world_size();
        if output.len() != n * input.len() {
            return Err(CollectiveError::InvalidArgument {
                op: "all_gather",
                why: format!(
                    "the output has {} elements, which is not {n} blocks of the input's {}",
                    output.len(),
                    input.len()
                ),
            });
        }
        let rank = self.rank();
        let own = algorithm::segment(output.len(), n, rank);
        output[own].copy_from_slice(input);
        self.run::<E>(Op::AllGather, input.len(), None, "ring", |s| {
            algorithm::ring::all_gather(s, output, n - 1)
        })
    }

    /// Copies `root`'s `data` to every rank.
    ///
    /// # Errors
    ///
    /// As [`Communicator::all_reduce`], and [`CollectiveError::InvalidArgument`] when `root`
    /// is not a rank.
    pub fn broadcast<E: Element>(
        &mut self,
        data: &mut [E],
        root: usize,
    ) -> Result<(), CollectiveError> {
        if root >= self.world_size() {
            return Err(CollectiveError::InvalidArgument {
                op: "broadcast",
                why: format!(
                    "root {root} is not below the world size {}",
                    self.world_size()
                ),
            });
        }
        self.run::<E>(Op::Broadcast, data.len(), None, "tree", |s| {
            algorithm::tree::broadcast(s, data, root)
        })
    }

    /// Returns once every rank has called it.
    ///
    /// # Errors
    ///
    /// As [`Communicator::all_reduce`].
    pub fn barrier(&mut self) -> Result<(), CollectiveError> {
        self.run::<f32>(Op::Barrier, 0, None, "tree", |s| {
            algorithm::tree::all_reduce::<T, f32>(s, &mut [], ReduceOp::Sum)
        })
    }
}
