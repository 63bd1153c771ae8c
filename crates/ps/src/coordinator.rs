//! The coordinator of parameter-server training, TensorFlow's `ClusterCoordinator`: it hands
//! scheduled steps to free workers, returns a handle to each step's result, and survives lost
//! workers.
//!
//! One thread per worker keeps a connection to it ([`STEP_SERVICE`], behind the cluster
//! secret) and, while connected, takes the next step from the shared queue, sends it and waits
//! for its outcome: a free worker is one whose thread is not waiting. When the connection
//! fails (the worker died or was killed), the step it held goes back to the front of the queue
//! for another worker, and the thread keeps trying to reconnect, so a restarted worker
//! rejoins. A step is therefore run *at least once*, as TensorFlow promises: a worker lost
//! after it pushed gradients but before it answered has had its effect, and the step runs
//! again elsewhere (a step whose pushes carry a [`StepId`](crate::StepId) is applied once by
//! each server all the same); a step that loses [`MAX_LOST_WORKERS_PER_STEP`] workers fails instead. A
//! step that fails on its worker (its function's error) is not retried: its handle and
//! [`ClusterCoordinator::join`] report the error.

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use lockstep_collective::ClusterSecret;

use crate::error::PsError;
use crate::protocol::{self, RunStep, SHUTDOWN_STEP, STEP_SERVICE, StepOutcome, StepResult};

/// How a coordinator reaches its workers.
#[derive(Debug, Clone)]
pub struct CoordinatorOptions {
    /// The cluster secret the workers hold (none: a cluster without one).
    pub secret: Option<ClusterSecret>,
    /// How long a connection attempt and its handshake may take.
    pub connect_timeout: Duration,
    /// How long to wait before trying a lost worker again (doubling up to 16 times this).
    pub retry_interval: Duration,
}

impl Default for CoordinatorOptions {
    fn default() -> Self {
        Self {
            secret: None,
            connect_timeout: Duration::from_secs(10),
            retry_interval: Duration::from_millis(100),
        }
    }
}

/// A step's result once it has one, and the signal that it came.
type ResultSlot = (Mutex<Option<Result<Vec<u8>, PsError>>>, Condvar);

/// The eventual result of a scheduled step: TensorFlow's `RemoteValue`.
#[derive(Clone)]
pub struct RemoteValue {
    slot: Arc<ResultSlot>,
}

impl RemoteValue {
    fn new() -> Self {
        Self {
            slot: Arc::new((Mutex::new(None), Condvar::new())),
        }
    }

    fn set(&self, result: Result<Vec<u8>, PsError>) {
        let (slot, ready) = &*self.slot;
        *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(result);
        ready.notify_all();
    }

    /// Waits for the step and returns its output.
    ///
    /// # Errors
    ///
    /// [`PsError::Step`] when the step failed on its worker; [`PsError::Cancelled`] when the
    /// coordinator shut down first.
    pub fn fetch(&self) -> Result<Vec<u8>, PsError> {
        let (slot, ready) = &*self.slot;
        let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(result) = slot.as_ref() {
                return result.clone();
            }
            slot = ready.wait(slot).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Whether the step has finished (or failed).
    pub fn is_ready(&self) -> bool {
        self.slot
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }
}

/// A scheduled step.
struct Closure {
    id: u64,
    step: String,
    args: Vec<u8>,
    value: RemoteValue,
    /// Workers lost while running it.
    lost: u32,
}

/// Workers a step may lose before it fails instead of running again: a step that ends every
/// worker that runs it (or its connection) must not go round them for ever.
pub const MAX_LOST_WORKERS_PER_STEP: u32 = 3;

/// What the worker threads and the callers share.
#[derive(Default)]
struct Queue {
    pending: VecDeque<Closure>,
    in_flight: usize,
    closed: bool,
    /// The first step error not yet reported by `join`.
    error: Option<PsError>,
    /// Steps run again after their worker was lost.
    retried: u64,
    /// Set with `closed` by [`ClusterCoordinator::shutdown_workers`]: each connected worker
    /// is told that training is over.
    shutting_down: bool,
    /// Workers told so.
    told: usize,
}

struct Shared {
    queue: Mutex<Queue>,
    changed: Condvar,
    /// Steps that have finished (with an output or a failure) since the coordinator was made.
    finished: Arc<AtomicU64>,
    /// Each worker's connection, to cut at shutdown.
    connections: Mutex<Vec<Option<TcpStream>>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// TensorFlow's `ClusterCoordinator`: schedules steps on workers.
pub struct ClusterCoordinator {
    shared: Arc<Shared>,
    next_id: AtomicU64,
    threads: Vec<JoinHandle<()>>,
}

impl ClusterCoordinator {
    /// A coordinator of the workers at `workers` (their step services), connecting to each on
    /// a thread of its own.
    ///
    /// # Errors
    ///
    /// When a thread cannot start.
    pub fn new(workers: &[SocketAddr], options: &CoordinatorOptions) -> Result<Self, PsError> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            changed: Condvar::new(),
            finished: Arc::new(AtomicU64::new(0)),
            connections: Mutex::new(workers.iter().map(|_| None).collect()),
        });
        let threads = workers
            .iter()
            .enumerate()
            .map(|(index, &address)| {
                let (shared, options) = (Arc::clone(&shared), options.clone());
                std::thread::Builder::new()
                    .name(format!("lockstep-coordinator-{index}"))
                    .spawn(move || drive_worker(&shared, index, address, &options))
                    .map_err(|e| {
                        protocol::connection(&address.to_string(), "starting its thread", &e)
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            shared,
            next_id: AtomicU64::new(0),
            threads,
        })
    }

    /// Queues the registered step `step` with `args` for the next free worker; the handle
    /// gives its result.
    pub fn schedule(&self, step: &str, args: Vec<u8>) -> RemoteValue {
        let value = RemoteValue::new();
        let closure = Closure {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            step: step.to_owned(),
            args,
            value: value.clone(),
            lost: 0,
        };
        let mut queue = self.shared.lock();
        if queue.closed {
            value.set(Err(PsError::Cancelled {
                step: step.to_owned(),
            }));
        } else {
            queue.pending.push_back(closure);
            self.shared.changed.notify_all();
        }
        value
    }

    /// Waits until every scheduled step has finished.
    ///
    /// # Errors
    ///
    /// The first step error since the last `join` (the other steps still ran).
    pub fn join(&self) -> Result<(), PsError> {
        let mut queue = self.shared.lock();
        while !queue.pending.is_empty() || queue.in_flight > 0 {
            queue = self
                .shared
                .changed
                .wait(queue)
                .unwrap_or_else(PoisonError::into_inner);
        }
        queue.error.take().map_or(Ok(()), Err)
    }

    /// Whether every scheduled step has finished.
    pub fn done(&self) -> bool {
        let queue = self.shared.lock();
        queue.pending.is_empty() && queue.in_flight == 0
    }

    /// A counter of the steps that have finished (with an output or a failure) since this
    /// coordinator was made, readable from any thread while `join` waits.
    pub fn finished_steps(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.shared.finished)
    }

    /// Workers connected now.
    pub fn connected(&self) -> usize {
        self.shared
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|c| c.is_some())
            .count()
    }

    /// Steps run again because the worker running them was lost.
    pub fn retried(&self) -> u64 {
        self.shared.lock().retried
    }
}

impl ClusterCoordinator {
    /// Tells every connected worker that training is over ([`SHUTDOWN_STEP`]: its service
    /// ends), after the steps already scheduled; returns how many were told. A worker lost at
    /// that moment is not told.
    pub fn shutdown_workers(mut self) -> usize {
        // Whatever was scheduled runs first.
        let _ = self.join();
        {
            let mut queue = self.shared.lock();
            queue.closed = true;
            queue.shutting_down = true;
        }
        self.shared.changed.notify_all();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        self.shared.lock().told
    }
}

impl Drop for ClusterCoordinator {
    fn drop(&mut self) {
        let cancelled: Vec<Closure> = {
            let mut queue = self.shared.lock();
            queue.closed = true;
            queue.pending.drain(..).collect()
        };
        for closure in cancelled {
            closure
                .value
                .set(Err(PsError::Cancelled { step: closure.step }));
        }
        self.shared.changed.notify_all();
        for stream in self
            .shared
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .flatten()
        {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// One worker's thread: connect (again and again while it is lost), then run the queue's
/// steps there one at a time.
fn drive_worker(shared: &Shared, index: usize, address: SocketAddr, options: &CoordinatorOptions) {
    let peer = address.to_string();
    let mut backoff = options.retry_interval;
    loop {
        if shared.lock().closed {
            return;
        }
        let mut stream = match connect(address, options) {
            Ok(stream) => stream,
            Err(e) => {
                if matches!(&e, PsError::Connection { why, .. } if why.contains("handshake")) {
                    tracing::warn!(worker = %peer, error = %e, "a worker refused this coordinator (another cluster secret?); trying again");
                } else {
                    tracing::debug!(worker = %peer, error = %e, "worker not reachable; trying again");
                }
                wait_unless_closed(shared, backoff);
                backoff = (backoff * 2).min(options.retry_interval * 16);
                continue;
            }
        };
        backoff = options.retry_interval;
        if let Ok(copy) = stream.try_clone() {
            shared
                .connections
                .lock()
                .unwrap_or_else(PoisonError::into_inner)[index] = Some(copy);
        }
        tracing::info!(worker = %peer, "connected to a worker");
        let lost = run_steps(shared, &mut stream, &peer);
        shared
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)[index] = None;
        let Some(e) = lost else { return };
        tracing::warn!(worker = %peer, error = %e, "lost a worker; its step goes to another");
    }
}

/// Sleeps `wait`, or less when the coordinator closes.
fn wait_unless_closed(shared: &Shared, wait: Duration) {
    let queue = shared.lock();
    if !queue.closed {
        let _ = shared
            .changed
            .wait_timeout_while(queue, wait, |q| !q.closed);
    }
}

fn connect(address: SocketAddr, options: &CoordinatorOptions) -> Result<TcpStream, PsError> {
    let stream = crate::connection::dial(
        address,
        options.secret.as_ref(),
        STEP_SERVICE,
        options.connect_timeout,
    )?;
    // A step takes as long as it takes: a lost worker shows as the connection's end, or,
    // for a host that vanished, as keepalive's error.
    stream
        .set_read_timeout(None)
        .map_err(|e| protocol::connection(&address.to_string(), "setting up", &e))?;
    Ok(stream)
}

/// Runs steps from the queue on one connected worker until the coordinator closes (`None`) or
/// the connection fails (the error; the step it held is back in the queue).
fn run_steps(shared: &Shared, stream: &mut TcpStream, peer: &str) -> Option<PsError> {
    loop {
        let closure = next_step(shared, stream, peer)?;
        let run = RunStep {
            id: closure.id,
            step: closure.step.clone(),
            args: closure.args.clone(),
        };
        let mut sent = false;
        let answer = protocol::write_frame(stream, &run, peer)
            .and_then(|()| {
                sent = true;
                protocol::read_frame::<StepOutcome>(stream, peer)
            })
            .and_then(|outcome| {
                outcome
                    .filter(|o| o.id == closure.id)
                    .and_then(|o| o.result)
                    .ok_or_else(|| PsError::Connection {
                        peer: peer.to_owned(),
                        why: "closed, or answered another step, before the step's outcome".into(),
                    })
            });
        let mut queue = shared.lock();
        queue.in_flight -= 1;
        if answer.is_ok() {
            shared.finished.fetch_add(1, Ordering::Relaxed);
        }
        match answer {
            Ok(StepResult::Output(output)) => closure.value.set(Ok(output)),
            Ok(StepResult::Failed(why)) => {
                let e = PsError::Step {
                    step: closure.step.clone(),
                    worker: peer.to_owned(),
                    why,
                };
                if queue.error.is_none() {
                    queue.error = Some(e.clone());
                }
                closure.value.set(Err(e));
            }
            // This side could not even write the request: the step fails, the worker stays.
            Err(e @ PsError::Wire { .. }) if !sent => {
                let e = PsError::Step {
                    step: closure.step.clone(),
                    worker: peer.to_owned(),
                    why: format!("it could not be sent: {e}"),
                };
                if queue.error.is_none() {
                    queue.error = Some(e.clone());
                }
                closure.value.set(Err(e));
            }
            Err(e) => {
                let mut closure = closure;
                closure.lost += 1;
                if queue.closed {
                    closure
                        .value
                        .set(Err(PsError::Cancelled { step: closure.step }));
                } else if closure.lost >= MAX_LOST_WORKERS_PER_STEP {
                    let failed = PsError::Step {
                        step: closure.step.clone(),
                        worker: peer.to_owned(),
                        why: format!(
                            "{} workers were lost while running it, the last with: {e}",
                            closure.lost
                        ),
                    };
                    if queue.error.is_none() {
                        queue.error = Some(failed.clone());
                    }
                    closure.value.set(Err(failed));
                } else {
                    queue.retried += 1;
                    queue.pending.push_front(closure);
                }
                shared.changed.notify_all();
                return Some(e);
            }
        }
        shared.changed.notify_all();
    }
}

/// The queue's next step for this worker, counted in flight; `None` once the coordinator
/// closes (after telling the worker that training is over, when it is shutting down).
fn next_step(shared: &Shared, stream: &mut TcpStream, peer: &str) -> Option<Closure> {
    let mut queue = shared.lock();
    loop {
        if queue.closed {
            if queue.shutting_down {
                drop(queue);
                let told = tell_shutdown(stream, peer);
                shared.lock().told += usize::from(told);
            }
            return None;
        }
        if let Some(closure) = queue.pending.pop_front() {
            queue.in_flight += 1;
            return Some(closure);
        }
        queue = shared
            .changed
            .wait(queue)
            .unwrap_or_else(PoisonError::into_inner);
    }
}

/// Sends [`SHUTDOWN_STEP`] and waits for its answer (within the connection's timeouts);
/// whether the worker answered.
fn tell_shutdown(stream: &mut TcpStream, peer: &str) -> bool {
    let run = RunStep {
        id: u64::MAX,
        step: SHUTDOWN_STEP.to_owned(),
        args: Vec::new(),
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    match protocol::write_frame(stream, &run, peer)
        .and_then(|()| protocol::read_frame::<StepOutcome>(stream, peer))
    {
        Ok(Some(_)) => true,
        Ok(None) => false,
        Err(e) => {
            tracing::warn!(worker = %peer, error = %e, "a worker was not told that training is over");
            false
        }
    }
}
