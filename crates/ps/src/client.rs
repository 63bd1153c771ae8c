//! A connection to one parameter server: what a worker and the chief call.

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use lockstep_collective::ClusterSecret;

use crate::error::PsError;
use crate::protocol::{
    self, Create, Export, Import, Pull, PullRows, PullShards, Push, PushRows, PushShards, Request,
    RequestKind, Response, ResponseKind, Rows, SERVICE, ShardKey, ShardState, Shutdown, StepId,
};

/// One authenticated connection to a parameter server; a request waits for its answer at most
/// the timeout it was opened with, so a server that died or stopped answering is an error,
/// never a hang. After a failed exchange the connection is spent: every later call returns
/// that error (connect again).
pub struct PsClient {
    stream: TcpStream,
    peer: String,
    /// Set by a failed exchange: the connection may hold a late answer (after a timeout) or
    /// half a frame, so every later call fails with this error rather than misread it.
    broken: Option<PsError>,
}

impl PsClient {
    /// Connects to the server at `address` and proves `secret` (none: a cluster without a
    /// secret) to it; `timeout` bounds the connection, the handshake and every later request.
    ///
    /// # Errors
    ///
    /// [`PsError::Connection`] when the server cannot be reached within `timeout` or the
    /// handshake fails (the two hold different secrets, say).
    pub fn connect(
        address: SocketAddr,
        secret: Option<&ClusterSecret>,
        timeout: Duration,
    ) -> Result<Self, PsError> {
        let stream = crate::connection::dial(address, secret, SERVICE, timeout)?;
        let peer = address.to_string();
        Ok(Self {
            stream,
            peer,
            broken: None,
        })
    }

    /// The server's address.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Sends one request and reads its answer; a refusal is [`PsError::Refused`].
    fn call(&mut self, kind: RequestKind) -> Result<ResponseKind, PsError> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let request = Request { kind: Some(kind) };
        let exchanged = protocol::write_frame(&mut self.stream, &request, &self.peer)
            .and_then(|()| protocol::read_frame::<Response>(&mut self.stream, &self.peer))
            .and_then(|response| {
                response.ok_or_else(|| PsError::Connection {
                    peer: self.peer.clone(),
                    why: "closed before it answered".into(),
                })
            });
        let response = match exchanged {
            Ok(response) => response,
            Err(e) => {
                self.broken = Some(e.clone());
                return Err(e);
            }
        };
        match response.kind {
            Some(ResponseKind::Refused(refusal)) => Err(PsError::Refused {
                peer: self.peer.clone(),
                why: refusal.why,
            }),
            Some(kind) => Ok(kind),
            None => Err(self.unexpected("an empty answer")),
        }
    }

    fn unexpected(&self, what: &str) -> PsError {
        PsError::Wire {
            peer: self.peer.clone(),
            why: format!("{what} where another was due"),
        }
    }

    fn values(&mut self, kind: RequestKind) -> Result<Vec<f32>, PsError> {
        let bytes = self.value_bytes(kind)?;
        protocol::f32s(&bytes).ok_or_else(|| self.unexpected("values that are not whole f32s"))
    }

    fn value_bytes(&mut self, kind: RequestKind) -> Result<Bytes, PsError> {
        match self.call(kind)? {
            ResponseKind::Values(values) => Ok(values.values),
            _ => Err(self.unexpected("an answer other than values")),
        }
    }

    fn done(&mut self, kind: RequestKind) -> Result<(bool, u64), PsError> {
        match self.call(kind)? {
            ResponseKind::Done(done) => Ok((done.created, done.iterations)),
            _ => Err(self.unexpected("an answer other than done")),
        }
    }

    /// Creates a shard unless the server has it: returns whether this call made it, and the
    /// shard's updates so far (a worker that restarts finds the trained shard).
    ///
    /// # Errors
    ///
    /// The server's refusal (another shape, an optimizer it cannot build), or the connection's
    /// failure.
    pub fn create(&mut self, state: ShardState) -> Result<(bool, u64), PsError> {
        self.done(RequestKind::Create(Create { state: Some(state) }))
    }

    /// Every value of a shard.
    ///
    /// # Errors
    ///
    /// As [`PsClient::create`].
    pub fn pull(&mut self, key: &ShardKey) -> Result<Vec<f32>, PsError> {
        self.values(RequestKind::Pull(Pull {
            key: Some(key.clone()),
        }))
    }

    /// Rows of a shard, in the order asked (an embedding lookup's).
    ///
    /// # Errors
    ///
    /// As [`PsClient::create`]; a row outside the shard.
    pub fn pull_rows(&mut self, key: &ShardKey, rows: &[u64]) -> Result<Vec<f32>, PsError> {
        self.values(RequestKind::PullRows(PullRows {
            key: Some(key.clone()),
            rows: rows.to_vec(),
        }))
    }

    /// Every value of the shards `keys`, one after another: one round trip.
    ///
    /// # Errors
    ///
    /// As [`PsClient::create`]; an unknown shard.
    pub fn pull_shards(&mut self, keys: &[ShardKey]) -> Result<Vec<f32>, PsError> {
        self.pull_shard_rows(keys, Vec::new())
    }

    /// The rows `rows` names of each of the shards `keys` (empty: every row of each), one
    /// shard after another: one round trip.
    ///
    /// # Errors
    ///
    /// As [`PsClient::pull_shards`]; a row outside its shard.
    pub fn pull_shard_rows(
        &mut self,
        keys: &[ShardKey],
        rows: Vec<Rows>,
    ) -> Result<Vec<f32>, PsError> {
        self.values(RequestKind::PullShards(PullShards {
            keys: keys.to_vec(),
            rows,
        }))
    }

    /// [`PsClient::pull_shard_rows`]'s values as they came, in [`protocol::f32_bytes`]' layout
    /// and sharing the buffer the answer was read into: for a caller that copies them where
    /// they belong ([`protocol::f32s_into`]) with no `f32` copy in between (a table's shards
    /// are copied once, not three times).
    ///
    /// # Errors
    ///
    /// As [`PsClient::pull_shard_rows`].
    pub fn pull_shard_rows_bytes(
        &mut self,
        keys: &[ShardKey],
        rows: Vec<Rows>,
    ) -> Result<Bytes, PsError> {
        self.value_bytes(RequestKind::PullShards(PullShards {
            keys: keys.to_vec(),
            rows,
        }))
    }

    /// Gradients of the whole shards `keys`, one after another: one round trip.
    ///
    /// # Errors
    ///
    /// As [`PsClient::create`]; lengths that are not the shards' (nothing is applied then).
    pub fn push_shards(&mut self, keys: &[ShardKey], gradient: &[f32]) -> Result<(), PsError> {
        self.push_shard_rows(keys, Vec::new(), gradient, None)
            .map(drop)
    }

    /// Gradients of the rows `rows` names of each of the shards `keys` (empty: every row of
    /// each), one shard after another: one round trip. With a `step`, the server applies them
    /// unless it applied a push of that step already; returns how many shards it updated (0
    /// for a repeat).
    ///
    /// # Errors
    ///
    /// As [`PsClient::push_shards`]; a row outside its shard (nothing is applied then).
    pub fn push_shard_rows(
        &mut self,
        keys: &[ShardKey],
        rows: Vec<Rows>,
        gradient: &[f32],
        step: Option<StepId>,
    ) -> Result<u64, PsError> {
        self.done(RequestKind::PushShards(PushShards {
            keys: keys.to_vec(),
            gradient: protocol::f32_bytes(gradient).into(),
            rows,
            step,
        }))
        .map(|(_, applied)| applied)
    }

    /// A gradient of the whole shard; returns the shard's updates so far.
    ///
    /// # Errors
    ///
    /// As [`PsClient::create`]; a gradient of another length.
    pub fn push(&mut self, key: &ShardKey, gradient: &[f32]) -> Result<u64, PsError> {
        self.done(RequestKind::Push(Push {
            key: Some(key.clone()),
            gradient: gradient.to_vec(),
        }))
        .map(|(_, iterations)| iterations)
    }

    /// A gradient of some rows; returns the shard's updates so far.
    ///
    /// # Errors
    ///
    /// As [`PsClient::push`]; a row outside the shard.
    pub fn push_rows(
        &mut self,
        key: &ShardKey,
        rows: &[u64],
        gradient: &[f32],
    ) -> Result<u64, PsError> {
        self.done(RequestKind::PushRows(PushRows {
            key: Some(key.clone()),
            rows: rows.to_vec(),
            gradient: gradient.to_vec(),
        }))
        .map(|(_, iterations)| iterations)
    }

    /// Every shard the server holds, whole (for the chief's checkpoint).
    ///
    /// # Errors
    ///
    /// The connection's failure.
    pub fn export(&mut self) -> Result<Vec<ShardState>, PsError> {
        match self.call(RequestKind::Export(Export {}))? {
            ResponseKind::Shards(shards) => Ok(shards.shards),
            _ => Err(self.unexpected("an answer other than shards")),
        }
    }

    /// Replaces every shard the server holds with `shards` (a restore).
    ///
    /// # Errors
    ///
    /// The server's refusal (a shard that does not hold together: nothing changes then), or
    /// the connection's failure.
    pub fn import(&mut self, shards: Vec<ShardState>) -> Result<(), PsError> {
        self.done(RequestKind::Import(Import { shards })).map(drop)
    }

    /// Asks the server to end its service once it has answered: training is over.
    ///
    /// # Errors
    ///
    /// The connection's failure.
    pub fn shutdown(&mut self) -> Result<(), PsError> {
        self.done(RequestKind::Shutdown(Shutdown {})).map(drop)
    }
}
