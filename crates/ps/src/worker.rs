//! A worker's side of parameter-server training: it serves the coordinator's requests to run
//! steps, one at a time, from its [`StepRegistry`] on its own state.
//!
//! The worker listens on its task's address; the coordinator connects, proves the cluster
//! secret (service [`STEP_SERVICE`], on a thread of its own as the parameter server's
//! connections do, so a peer that never finishes its handshake never holds the service) and
//! sends [`RunStep`]s, each answered with a [`StepOutcome`]. When that connection ends (the
//! coordinator restarted, or gave this worker up), the worker waits for the next one: the
//! state, and with it the dataset iterators, live on. A step that is not registered here, or that fails, is answered as failed; the
//! connection goes on. [`SHUTDOWN_STEP`] is answered and ends the service: training is over.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use lockstep_collective::ClusterSecret;
use prost::Message as _;

use crate::connection::Handshakes;
use crate::error::PsError;
use crate::protocol::{self, RunStep, SHUTDOWN_STEP, STEP_SERVICE, StepOutcome, StepResult};
use crate::steps::StepRegistry;

/// How often a worker asked to stop looks up from waiting for its coordinator.
const ACCEPT_POLL: Duration = Duration::from_millis(20);

/// A worker's step service.
pub struct StepServer<S> {
    registry: StepRegistry<S>,
    secret: Option<ClusterSecret>,
}

/// A step service running on a thread of its own ([`StepServer::spawn`]).
pub struct RunningWorker {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    /// The coordinator's connection being served, to cut on [`RunningWorker::kill`].
    serving: Arc<Mutex<Option<TcpStream>>>,
    thread: Option<JoinHandle<()>>,
}

impl<S: Send + 'static> StepServer<S> {
    /// A service running `registry`'s steps for a coordinator that proves `secret`.
    pub fn new(registry: StepRegistry<S>, secret: Option<ClusterSecret>) -> Self {
        Self { registry, secret }
    }

    /// Serves coordinators on this thread until `stop` is set, running each step on `state`.
    ///
    /// # Errors
    ///
    /// When the listener cannot be set up.
    pub fn serve(
        &self,
        listener: &TcpListener,
        state: &mut S,
        stop: &AtomicBool,
    ) -> Result<(), PsError> {
        self.serve_recording(listener, state, stop, &Mutex::new(None))
    }

    /// Serves on a thread of its own, with the state `make` returns there.
    ///
    /// # Errors
    ///
    /// When the listener cannot be set up or the thread cannot start.
    pub fn spawn(
        self,
        listener: TcpListener,
        make: impl FnOnce() -> S + Send + 'static,
    ) -> Result<RunningWorker, PsError> {
        let address = listener
            .local_addr()
            .map_err(|e| protocol::connection("the step listener", "reading its address", &e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let serving = Arc::new(Mutex::new(None));
        let (stopped, recorded) = (Arc::clone(&stop), Arc::clone(&serving));
        let thread = std::thread::Builder::new()
            .name(format!("lockstep-steps-{address}"))
            .spawn(move || {
                let mut state = make();
                if let Err(e) = self.serve_recording(&listener, &mut state, &stopped, &recorded) {
                    tracing::error!(error = %e, "the step service stopped");
                }
            })
            .map_err(|e| protocol::connection(&address.to_string(), "starting its thread", &e))?;
        Ok(RunningWorker {
            address,
            stop,
            serving,
            thread: Some(thread),
        })
    }

    fn serve_recording(
        &self,
        listener: &TcpListener,
        state: &mut S,
        stop: &AtomicBool,
        serving: &Mutex<Option<TcpStream>>,
    ) -> Result<(), PsError> {
        listener
            .set_nonblocking(true)
            .map_err(|e| protocol::connection("the step listener", "setting up", &e))?;
        let handshakes = Handshakes::new(self.secret.clone(), STEP_SERVICE);
        let (proven, ready) = mpsc::channel::<(TcpStream, SocketAddr)>();
        while !stop.load(Ordering::Relaxed) {
            let next = match listener.accept() {
                Ok((stream, from)) => {
                    let proven = proven.clone();
                    handshakes.start(stream, from, move |stream, from| {
                        // The service's loop holds the other end while it runs.
                        let _ = proven.send((stream, from));
                    });
                    ready.try_recv().ok()
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ready.recv_timeout(ACCEPT_POLL).ok()
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a coordinator's connection failed");
                    std::thread::sleep(ACCEPT_POLL);
                    None
                }
            };
            let Some((stream, from)) = next else {
                continue;
            };
            let served = {
                let _recorded = Serving::record(serving, &stream);
                self.serve_coordinator(stream, from, state, stop)
            };
            match served {
                Ok(Ended::ShutDown) => {
                    tracing::info!(%from, "the coordinator ended training");
                    return Ok(());
                }
                Ok(Ended::Closed) => {}
                Err(e) => {
                    tracing::warn!(%from, error = %e, "a coordinator's connection ended");
                }
            }
        }
        Ok(())
    }

    /// One proven coordinator's connection: steps until it closes or sends [`SHUTDOWN_STEP`].
    fn serve_coordinator(
        &self,
        mut stream: TcpStream,
        from: SocketAddr,
        state: &mut S,
        stop: &AtomicBool,
    ) -> Result<Ended, PsError> {
        let peer = from.to_string();
        while !stop.load(Ordering::Relaxed) {
            let Some(run) = protocol::read_frame::<RunStep>(&mut stream, &peer)? else {
                return Ok(Ended::Closed);
            };
            if run.step == SHUTDOWN_STEP {
                let outcome = StepOutcome {
                    id: run.id,
                    result: Some(StepResult::Output(Vec::new())),
                };
                protocol::write_frame(&mut stream, &outcome, &peer)?;
                return Ok(Ended::ShutDown);
            }
            let result = match self.registry.get(&run.step) {
                Some(step) => match step(state, &run.args) {
                    Ok(output) => StepResult::Output(output),
                    Err(why) => StepResult::Failed(why),
                },
                None => StepResult::Failed(format!(
                    "no step {:?} is registered on this worker (it has {:?})",
                    run.step,
                    self.registry.names().collect::<Vec<_>>()
                )),
            };
            let mut outcome = StepOutcome {
                id: run.id,
                result: Some(result),
            };
            if outcome.encoded_len() > protocol::MAX_FRAME {
                outcome.result = Some(StepResult::Failed(format!(
                    "its output of {} bytes is over the frame limit of {}",
                    outcome.encoded_len(),
                    protocol::MAX_FRAME
                )));
            }
            protocol::write_frame(&mut stream, &outcome, &peer)?;
        }
        Ok(Ended::Closed)
    }
}

/// The coordinator's connection as [`RunningWorker::kill`] may cut it, recorded while it is
/// served and forgotten when that ends, a panicking step included: the copy must not keep
/// the connection open once the server is done with it.
struct Serving<'a>(&'a Mutex<Option<TcpStream>>);

impl<'a> Serving<'a> {
    fn record(slot: &'a Mutex<Option<TcpStream>>, stream: &TcpStream) -> Self {
        if let Ok(copy) = stream.try_clone() {
            *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(copy);
        }
        Self(slot)
    }
}

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// How a coordinator's connection ended.
enum Ended {
    /// It closed (or this worker was stopped): wait for the next.
    Closed,
    /// It sent [`SHUTDOWN_STEP`]: stop serving.
    ShutDown,
}

impl RunningWorker {
    /// Where it listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Stops serving at once, cutting the coordinator's connection mid-step as a crash would
    /// (the coordinator sees the connection end), and waits for the step in progress to end.
    pub fn kill(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(stream) = self
            .serving
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for RunningWorker {
    fn drop(&mut self) {
        self.stop_now();
    }
}
