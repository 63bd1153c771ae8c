//! A `ps` task's service: a [`ShardStore`] served over TCP, a thread per connection.
//!
//! Each connection first proves the cluster secret both ways
//! (`lockstep_collective::authenticate_stream`, bound to [`SERVICE`]), on a thread of its own,
//! at most [`crate::MAX_HANDSHAKES`] at once, within [`crate::HANDSHAKE_TIMEOUT`] in all; then
//! it may stay open and idle as long as its client likes (a worker between steps). A request
//! the store refuses is answered with the reason and the connection goes on; bytes that are
//! not a frame of the protocol end that connection (there is no way to find the next frame),
//! and never the server or another connection.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use lockstep_collective::ClusterSecret;
use prost::Message as _;

use crate::connection::Handshakes;
use crate::error::PsError;
use crate::protocol::{
    self, Done, Refusal, Request, RequestKind, Response, ResponseKind, SERVICE, Shards, Values,
    f32_bytes, f32s,
};
use crate::store::{ShardStore, refused_all};

/// How often a server that was asked to stop looks up from waiting for connections.
const ACCEPT_POLL: Duration = Duration::from_millis(20);

/// A parameter server: its shards and the secret its clients must prove.
pub struct PsServer {
    store: Arc<ShardStore>,
    secret: Option<ClusterSecret>,
    /// Set once a client asked it to shut down.
    shut_down: Arc<(Mutex<bool>, Condvar)>,
}

/// A server running on threads of its own ([`PsServer::spawn`]): its address, and a way to
/// stop it.
pub struct RunningServer {
    address: SocketAddr,
    store: Arc<ShardStore>,
    shut_down: Arc<(Mutex<bool>, Condvar)>,
    stop: Arc<AtomicBool>,
    accepting: Option<JoinHandle<()>>,
}

impl PsServer {
    /// A server with no shards yet, whose clients must prove `secret` (none: a cluster
    /// without a secret, which trusts whoever reaches it).
    pub fn new(secret: Option<ClusterSecret>) -> Self {
        Self {
            store: Arc::new(ShardStore::new()),
            secret,
            shut_down: Arc::new((Mutex::new(false), Condvar::new())),
        }
    }

    /// The shards.
    pub fn store(&self) -> &Arc<ShardStore> {
        &self.store
    }

    /// Serves `listener`'s connections on threads of their own until the returned handle
    /// stops it or is dropped.
    ///
    /// # Errors
    ///
    /// When the listener's address cannot be read or it cannot be made non-blocking.
    pub fn spawn(self, listener: TcpListener) -> Result<RunningServer, PsError> {
        let address = listener
            .local_addr()
            .map_err(|e| protocol::connection("the listening socket", "reading its address", &e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| protocol::connection(&address.to_string(), "setting up", &e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let store = Arc::clone(&self.store);
        let shut_down = Arc::clone(&self.shut_down);
        let stopped = Arc::clone(&stop);
        let accepting = std::thread::Builder::new()
            .name(format!("lockstep-ps-{address}"))
            .spawn(move || self.accept_until(&listener, &stopped))
            .map_err(|e| protocol::connection(&address.to_string(), "starting its thread", &e))?;
        Ok(RunningServer {
            address,
            store,
            shut_down,
            stop,
            accepting: Some(accepting),
        })
    }

    /// Accepts connections until `stop` is set, each served on a thread of its own once it
    /// proved the secret.
    fn accept_until(self, listener: &TcpListener, stop: &AtomicBool) {
        let handshakes = Handshakes::new(self.secret.clone(), SERVICE);
        let server = Arc::new(self);
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((stream, from)) => {
                    let server = Arc::clone(&server);
                    handshakes.start(stream, from, move |stream, from| {
                        server.serve_connection(stream, from);
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a parameter-server connection failed");
                    std::thread::sleep(ACCEPT_POLL);
                }
            }
        }
    }

    /// One proven connection: requests until the client closes it.
    fn serve_connection(&self, mut stream: TcpStream, from: SocketAddr) {
        let peer = from.to_string();
        loop {
            let request = match protocol::read_frame::<Request>(&mut stream, &peer) {
                Ok(Some(request)) => request,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(%from, error = %e, "closed a parameter-server connection");
                    return;
                }
            };
            let asks_shutdown = matches!(request.kind, Some(RequestKind::Shutdown(_)));
            let mut response = self.answer(request);
            if response.encoded_len() > protocol::MAX_FRAME {
                response = Response {
                    kind: Some(ResponseKind::Refused(Refusal {
                        why: format!(
                            "the answer of {} bytes is over the frame limit of {}: ask for fewer \
                             shards at a time",
                            response.encoded_len(),
                            protocol::MAX_FRAME
                        ),
                    })),
                };
            }
            let written = protocol::write_frame(&mut stream, &response, &peer);
            if asks_shutdown {
                // Only once its answer is on the wire: the task's process ends as soon as
                // `wait_for_shutdown` returns, and the chief must not see the connection
                // close before the answer.
                self.signal_shutdown();
            }
            if let Err(e) = written {
                tracing::warn!(%from, error = %e, "a parameter-server answer was not delivered");
                return;
            }
        }
    }

    /// Wakes [`RunningServer::wait_for_shutdown`].
    fn signal_shutdown(&self) {
        let (flag, changed) = &*self.shut_down;
        *flag.lock().unwrap_or_else(PoisonError::into_inner) = true;
        changed.notify_all();
    }

    /// The store's answer to `request`.
    fn answer(&self, request: Request) -> Response {
        let store = &self.store;
        let key = |key: Option<protocol::ShardKey>| key.unwrap_or_default();
        let answered = match request.kind {
            None => Err(PsError::Request {
                shard: String::new(),
                why: "an empty request".into(),
            }),
            Some(RequestKind::Create(create)) => {
                let state = create.state.unwrap_or_default();
                store.create(&state).map(|(created, iterations)| {
                    ResponseKind::Done(Done {
                        iterations,
                        created,
                    })
                })
            }
            Some(RequestKind::Pull(pull)) => store.pull(&key(pull.key)).map(|v| values(&v)),
            Some(RequestKind::PullRows(pull)) => store
                .pull_rows(&key(pull.key), &pull.rows)
                .map(|v| values(&v)),
            Some(RequestKind::Push(push)) => store.push(&key(push.key), &push.gradient).map(done),
            Some(RequestKind::PushRows(push)) => store
                .push_rows(&key(push.key), &push.rows, &push.gradient)
                .map(done),
            Some(RequestKind::Export(_)) => store
                .export()
                .map(|shards| ResponseKind::Shards(Shards { shards })),
            Some(RequestKind::Import(import)) => store.import(&import.shards).map(|()| done(0)),
            Some(RequestKind::PullShards(pull)) => store
                .pull_shard_rows(&pull.keys, &pull.rows)
                .map(|v| values(&v)),
            Some(RequestKind::PushShards(push)) => f32s(&push.gradient)
                .ok_or_else(|| {
                    let why = format!(
                        "a gradient of {} bytes: not whole f32s",
                        push.gradient.len()
                    );
                    refused_all(&push.keys, why)
                })
                .and_then(|gradient| {
                    store.push_shard_rows(&push.keys, &push.rows, &gradient, push.step)
                })
                .map(done),
            // Signalled by `serve_connection` once this answer is sent.
            Some(RequestKind::Shutdown(_)) => Ok(done(0)),
        };
        Response {
            kind: Some(
                answered.unwrap_or_else(|e| ResponseKind::Refused(Refusal { why: e.to_string() })),
            ),
        }
    }
}

fn values(values: &[f32]) -> ResponseKind {
    ResponseKind::Values(Values {
        values: f32_bytes(values).into(),
    })
}

fn done(iterations: u64) -> ResponseKind {
    ResponseKind::Done(Done {
        iterations,
        created: false,
    })
}

impl RunningServer {
    /// Where it listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Its shards.
    pub fn store(&self) -> &Arc<ShardStore> {
        &self.store
    }

    /// Waits until a client has asked the server to shut down (the chief, when training is
    /// over) and been answered.
    pub fn wait_for_shutdown(&self) {
        let (flag, changed) = &*self.shut_down;
        let mut asked = flag.lock().unwrap_or_else(PoisonError::into_inner);
        while !*asked {
            asked = changed.wait(asked).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Stops accepting connections (those open are served until their clients close them)
    /// and waits for the accepting thread.
    pub fn stop(mut self) {
        self.stop_accepting();
    }

    fn stop_accepting(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(accepting) = self.accepting.take() {
            let _ = accepting.join();
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.stop_accepting();
    }
}
