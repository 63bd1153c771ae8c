//! The parameter servers' wire protocol: what a worker or the chief asks a `ps` task, and
//! what it answers, one request and one response at a time on a connection.
//!
//! A connection opens with the cluster secret's mutual proof
//! (`lockstep_collective::authenticate_stream`, bound to [`SERVICE`]); then each message is a
//! frame: its length as a little-endian `u32`, then that many bytes of a Protocol Buffers
//! message ([`Request`] one way, [`Response`] the other), at most [`MAX_FRAME`] bytes. The
//! messages are written here with `prost`'s derive rather than generated from a `.proto`: they
//! are few, and the tags below are the schema (a field is never renumbered).

use std::io::{self, Read, Write};

use bytes::Bytes;
use prost::Message;

use crate::error::PsError;

/// The service name both ends bind into the handshake's proofs, with the protocol's version:
/// a client of another version fails the handshake instead of misreading messages.
pub const SERVICE: &str = "lockstep-ps/1";

/// The largest frame read or written: 1 GiB. It bounds each message whole: a pull of several
/// shards, or an export of every shard with its optimizer's slots, must fit in it (a server
/// refuses, naming the size, an answer that would not).
pub const MAX_FRAME: usize = 1 << 30;

/// A shard: a variable's name and the shard's index among its shards.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Message)]
pub struct ShardKey {
    /// The variable's name, as the model names it (`dense_1/kernel`).
    #[prost(string, tag = "1")]
    pub variable: String,
    /// The shard's index among the variable's shards.
    #[prost(uint32, tag = "2")]
    pub shard: u32,
}

impl ShardKey {
    /// The shard `shard` of `variable`.
    pub fn new(variable: impl Into<String>, shard: u32) -> Self {
        Self {
            variable: variable.into(),
            shard,
        }
    }
}

impl std::fmt::Display for ShardKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.variable, self.shard)
    }
}

/// One optimizer slot of a shard (Adam's `m`, say), as saved.
#[derive(Clone, PartialEq, Message)]
pub struct SlotValues {
    /// The slot's name, as the optimizer names it.
    #[prost(string, tag = "1")]
    pub name: String,
    /// One value per value of the shard.
    #[prost(float, repeated, tag = "2")]
    pub values: Vec<f32>,
}

/// A shard whole: its values, its optimizer and the optimizer's state. What a server exports
/// for the chief's checkpoint and imports on a restore.
#[derive(Clone, PartialEq, Message)]
pub struct ShardState {
    /// Which shard.
    #[prost(message, optional, tag = "1")]
    pub key: Option<ShardKey>,
    /// Rows (the first axis' share of this shard).
    #[prost(uint64, tag = "2")]
    pub rows: u64,
    /// Values per row (the product of the other axes).
    #[prost(uint64, tag = "3")]
    pub cols: u64,
    /// `rows · cols` values, row after row.
    #[prost(float, repeated, tag = "4")]
    pub values: Vec<f32>,
    /// The optimizer's settings, as Keras' `get_config` (`{"class_name": …, "config": …}`).
    #[prost(string, tag = "5")]
    pub optimizer: String,
    /// Updates applied so far.
    #[prost(uint64, tag = "6")]
    pub iterations: u64,
    /// The optimizer's slots, each as long as `values` (none: the optimizer's initial state).
    #[prost(message, repeated, tag = "7")]
    pub slots: Vec<SlotValues>,
}

/// Creates a shard with these values unless it exists: the first creator's values stay, so
/// every worker may send the same request, and a restarted one finds the trained values.
#[derive(Clone, PartialEq, Message)]
pub struct Create {
    /// Its state: values and optimizer (`iterations` and `slots` are ignored).
    #[prost(message, optional, tag = "1")]
    pub state: Option<ShardState>,
}

/// Every value of a shard.
#[derive(Clone, PartialEq, Message)]
pub struct Pull {
    /// Which shard.
    #[prost(message, optional, tag = "1")]
    pub key: Option<ShardKey>,
}

/// Some rows of a shard (an embedding lookup), in the order asked, repeats included.
#[derive(Clone, PartialEq, Message)]
pub struct PullRows {
    /// Which shard.
    #[prost(message, optional, tag = "1")]
    pub key: Option<ShardKey>,
    /// Row indices within the shard.
    #[prost(uint64, repeated, tag = "2")]
    pub rows: Vec<u64>,
}

/// A gradient of the whole shard: the server applies its optimizer.
#[derive(Clone, PartialEq, Message)]
pub struct Push {
    /// Which shard.
    #[prost(message, optional, tag = "1")]
    pub key: Option<ShardKey>,
    /// One value per value of the shard.
    #[prost(float, repeated, tag = "2")]
    pub gradient: Vec<f32>,
}

/// A gradient of some rows (an embedding lookup's): the server sums the gradients of a row
/// named more than once and updates only the rows named.
#[derive(Clone, PartialEq, Message)]
pub struct PushRows {
    /// Which shard.
    #[prost(message, optional, tag = "1")]
    pub key: Option<ShardKey>,
    /// Row indices within the shard.
    #[prost(uint64, repeated, tag = "2")]
    pub rows: Vec<u64>,
    /// `rows.len() · cols` values, one row per index.
    #[prost(float, repeated, tag = "3")]
    pub gradient: Vec<f32>,
}

/// Every shard this server holds, whole.
#[derive(Clone, PartialEq, Message)]
pub struct Export {}

/// Replaces every shard this server holds with these (a restore from a checkpoint).
#[derive(Clone, PartialEq, Message)]
pub struct Import {
    /// The shards.
    #[prost(message, repeated, tag = "1")]
    pub shards: Vec<ShardState>,
}

/// Which rows of a shard a [`PullShards`] or [`PushShards`] entry covers: every row, or those
/// named (an embedding lookup's), in the order named.
#[derive(Clone, PartialEq, Message)]
pub struct Rows {
    /// Every row of the shard, in order (`rows` is then ignored).
    #[prost(bool, tag = "1")]
    pub every: bool,
    /// Row indices within the shard.
    #[prost(uint64, repeated, tag = "2")]
    pub rows: Vec<u64>,
}

impl Rows {
    /// Every row of the shard.
    pub fn every() -> Self {
        Self {
            every: true,
            rows: Vec::new(),
        }
    }

    /// The rows `rows`, in that order.
    pub fn some(rows: Vec<u64>) -> Self {
        Self { every: false, rows }
    }

    /// The rows named, or `None` for every row.
    pub fn named(&self) -> Option<&[u64]> {
        (!self.every).then_some(self.rows.as_slice())
    }
}

/// Values of several shards, one after another in the order named: a worker's pull of all it
/// needs from one server in one round trip.
#[derive(Clone, PartialEq, Message)]
pub struct PullShards {
    /// The shards.
    #[prost(message, repeated, tag = "1")]
    pub keys: Vec<ShardKey>,
    /// Which rows of each shard, in the order of `keys`; empty: every row of every shard.
    #[prost(message, repeated, tag = "2")]
    pub rows: Vec<Rows>,
}

/// Gradients of several shards, one after another in the order named: a worker's push to one
/// server in one round trip. The lengths are checked before any is applied.
#[derive(Clone, PartialEq, Message)]
pub struct PushShards {
    /// The shards.
    #[prost(message, repeated, tag = "1")]
    pub keys: Vec<ShardKey>,
    /// Each shard's gradient, as long as the rows it covers, in the order of `keys`: `f32`s
    /// as [`f32_bytes`] writes them.
    #[prost(bytes = "bytes", tag = "2")]
    pub gradient: Bytes,
    /// Which rows of each shard, in the order of `keys`; empty: every row of every shard.
    /// Rows named more than once have their gradients summed, as [`PushRows`]'.
    #[prost(message, repeated, tag = "3")]
    pub rows: Vec<Rows>,
    /// The step these gradients are of: a server applies one push per step and answers a
    /// repeat (the step run again after its worker was lost) without applying it. None: every
    /// push applies.
    #[prost(message, optional, tag = "4")]
    pub step: Option<StepId>,
}

/// A scheduled step, unique in a cluster's life: the coordinator's run (drawn when it starts)
/// and the step's number in that run.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Message)]
pub struct StepId {
    /// The coordinator's run.
    #[prost(uint64, tag = "1")]
    pub run: u64,
    /// The step's number in the run.
    #[prost(uint64, tag = "2")]
    pub number: u64,
}

/// Ends the server's service once it has answered: training is over (the chief sends it).
#[derive(Clone, PartialEq, Message)]
pub struct Shutdown {}

/// What a client asks.
#[derive(Clone, PartialEq, Message)]
pub struct Request {
    /// The request.
    #[prost(oneof = "RequestKind", tags = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10")]
    pub kind: Option<RequestKind>,
}

/// The requests.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum RequestKind {
    /// [`Create`].
    #[prost(message, tag = "1")]
    Create(Create),
    /// [`Pull`].
    #[prost(message, tag = "2")]
    Pull(Pull),
    /// [`PullRows`].
    #[prost(message, tag = "3")]
    PullRows(PullRows),
    /// [`Push`].
    #[prost(message, tag = "4")]
    Push(Push),
    /// [`PushRows`].
    #[prost(message, tag = "5")]
    PushRows(PushRows),
    /// [`Export`].
    #[prost(message, tag = "6")]
    Export(Export),
    /// [`Import`].
    #[prost(message, tag = "7")]
    Import(Import),
    /// [`Shutdown`].
    #[prost(message, tag = "8")]
    Shutdown(Shutdown),
    /// [`PullShards`].
    #[prost(message, tag = "9")]
    PullShards(PullShards),
    /// [`PushShards`].
    #[prost(message, tag = "10")]
    PushShards(PushShards),
}

/// A request carried out: how many updates the shard has had since it was created (a
/// create, push or import answers this).
#[derive(Clone, PartialEq, Message)]
pub struct Done {
    /// The shard's updates so far (0 after a create or an import of several shards).
    #[prost(uint64, tag = "1")]
    pub iterations: u64,
    /// For a create: whether this request made the shard (else it existed).
    #[prost(bool, tag = "2")]
    pub created: bool,
}

/// Values asked for by a pull.
#[derive(Clone, PartialEq, Message)]
pub struct Values {
    /// The values, row after row: `f32`s as [`f32_bytes`] writes them.
    #[prost(bytes = "bytes", tag = "1")]
    pub values: Bytes,
}

/// `values` as the bytes of a packed `repeated float` field: each little-endian, one after
/// another. The hot messages ([`Values`], [`PushShards`]' gradient) hold their `f32`s so,
/// the same bytes on the wire as `repeated float`, so that a million values are copied rather
/// than encoded and decoded one by one (a quarter of a parameter-server step's time was
/// spent so).
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    if cfg!(target_endian = "little") {
        // The wire's order is the machine's: one copy of the block.
        return bytemuck::cast_slice(values).to_vec();
    }
    let mut bytes = Vec::with_capacity(size_of_val(values));
    for v in values {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    bytes
}

/// The `f32`s [`f32_bytes`] wrote; `None` for a length that is not a whole number of them.
pub fn f32s(bytes: &[u8]) -> Option<Vec<f32>> {
    if !bytes.len().is_multiple_of(size_of::<f32>()) {
        return None;
    }
    let mut values = vec![0.0; bytes.len() / size_of::<f32>()];
    f32s_into(bytes, &mut values).then_some(values)
}

/// Writes the `f32`s [`f32_bytes`] wrote into `out`; `false` (and `out` untouched) unless
/// `bytes` holds exactly `out.len()` of them.
pub fn f32s_into(bytes: &[u8], out: &mut [f32]) -> bool {
    if bytes.len() != size_of_val(out) {
        return false;
    }
    if cfg!(target_endian = "little") {
        bytemuck::cast_slice_mut::<f32, u8>(out).copy_from_slice(bytes);
        return true;
    }
    for (v, b) in out.iter_mut().zip(bytes.chunks_exact(size_of::<f32>())) {
        *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
    true
}

/// Every shard, for an export.
#[derive(Clone, PartialEq, Message)]
pub struct Shards {
    /// The shards, ordered by key.
    #[prost(message, repeated, tag = "1")]
    pub shards: Vec<ShardState>,
}

/// A request refused, in the server's words.
#[derive(Clone, PartialEq, Message)]
pub struct Refusal {
    /// Why.
    #[prost(string, tag = "1")]
    pub why: String,
}

/// What a server answers.
#[derive(Clone, PartialEq, Message)]
pub struct Response {
    /// The answer.
    #[prost(oneof = "ResponseKind", tags = "1, 2, 3, 4")]
    pub kind: Option<ResponseKind>,
}

/// The answers.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum ResponseKind {
    /// [`Done`].
    #[prost(message, tag = "1")]
    Done(Done),
    /// [`Values`].
    #[prost(message, tag = "2")]
    Values(Values),
    /// [`Shards`].
    #[prost(message, tag = "3")]
    Shards(Shards),
    /// [`Refusal`].
    #[prost(message, tag = "4")]
    Refused(Refusal),
}

/// The service name of a worker's step service (see [`crate::coordinator`]), with its
/// version.
pub const STEP_SERVICE: &str = "lockstep-steps/1";

/// The step every worker's service knows without registering it: it answers, then stops
/// serving (training is over).
pub const SHUTDOWN_STEP: &str = "lockstep.shutdown";

/// What a coordinator asks a worker: run the registered step `step` on `args`.
#[derive(Clone, PartialEq, Message)]
pub struct RunStep {
    /// The coordinator's number for this scheduling of the step (a retry keeps it).
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// The step's registered name.
    #[prost(string, tag = "2")]
    pub step: String,
    /// Its arguments, as the step reads them.
    #[prost(bytes = "vec", tag = "3")]
    pub args: Vec<u8>,
}

/// A worker's answer to [`RunStep`].
#[derive(Clone, PartialEq, Message)]
pub struct StepOutcome {
    /// The [`RunStep::id`] answered.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// What came of it.
    #[prost(oneof = "StepResult", tags = "2, 3")]
    pub result: Option<StepResult>,
}

/// A step's result, or why it failed.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum StepResult {
    /// The step's output, as it wrote it.
    #[prost(bytes = "vec", tag = "2")]
    Output(Vec<u8>),
    /// The step failed (or is not registered on the worker), in its words.
    #[prost(string, tag = "3")]
    Failed(String),
}

/// Writes `message` as one frame.
///
/// # Errors
///
/// [`PsError::Wire`] for a message over [`MAX_FRAME`]; [`PsError::Connection`] when the
/// write fails.
pub fn write_frame(
    out: &mut impl Write,
    message: &impl Message,
    peer: &str,
) -> Result<(), PsError> {
    let len = message.encoded_len();
    if len > MAX_FRAME {
        return Err(PsError::Wire {
            peer: peer.to_owned(),
            why: format!("a message of {len} bytes for it, over the limit of {MAX_FRAME}"),
        });
    }
    let mut bytes = Vec::with_capacity(4 + len);
    bytes.extend_from_slice(&(len as u32).to_le_bytes());
    message.encode(&mut bytes).map_err(|e| PsError::Wire {
        peer: peer.to_owned(),
        why: e.to_string(),
    })?;
    out.write_all(&bytes)
        .and_then(|()| out.flush())
        .map_err(|e| connection(peer, "sending", &e))
}

/// Reads one frame's message; `None` when the stream ends cleanly before a frame.
///
/// # Errors
///
/// [`PsError::Wire`] for a length over [`MAX_FRAME`] or bytes that are not an `M`;
/// [`PsError::Connection`] when the stream fails or ends inside a frame.
pub fn read_frame<M: Message + Default>(
    input: &mut impl Read,
    peer: &str,
) -> Result<Option<M>, PsError> {
    let mut len = [0_u8; 4];
    match input.read(&mut len[..1]) {
        Ok(0) => return Ok(None),
        Ok(_) => {}
        Err(e) => return Err(connection(peer, "reading", &e)),
    }
    input
        .read_exact(&mut len[1..])
        .map_err(|e| connection(peer, "reading a frame's length", &e))?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(PsError::Wire {
            peer: peer.to_owned(),
            why: format!("a frame of {len} bytes, over the limit of {MAX_FRAME}"),
        });
    }
    let mut bytes = vec![0_u8; len];
    input
        .read_exact(&mut bytes)
        .map_err(|e| connection(peer, "reading a frame", &e))?;
    decode(bytes).map(Some).map_err(|e| PsError::Wire {
        peer: peer.to_owned(),
        why: e.to_string(),
    })
}

/// A frame's message. Decoded from `Bytes`, its `bytes` fields (the hot messages' `f32`s)
/// share the frame's buffer instead of copying it.
fn decode<M: Message + Default>(frame: Vec<u8>) -> Result<M, prost::DecodeError> {
    M::decode(Bytes::from(frame))
}

/// [`PsError::Connection`] for an I/O failure while `doing`.
pub(crate) fn connection(peer: &str, doing: &str, e: &io::Error) -> PsError {
    PsError::Connection {
        peer: peer.to_owned(),
        why: format!("{doing}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn push(rows: Vec<u64>, gradient: Vec<f32>) -> Request {
        Request {
            kind: Some(RequestKind::PushRows(PushRows {
                key: Some(ShardKey::new("embedding/embeddings", 3)),
                rows,
                gradient,
            })),
        }
    }

    #[test]
    fn a_frame_over_the_limit_is_refused_before_its_bytes_are_read() {
        let mut bytes = ((MAX_FRAME + 1) as u32).to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0; 16]);
        let e = read_frame::<Request>(&mut bytes.as_slice(), "w0").unwrap_err();
        assert!(
            matches!(&e, PsError::Wire { why, .. } if why.contains("over the limit")),
            "{e}"
        );
    }

    #[test]
    fn a_stream_that_ends_inside_a_frame_is_an_error_and_one_that_ends_between_is_none() {
        let mut bytes = Vec::new();
        write_frame(&mut bytes, &push(vec![1, 2], vec![0.5; 8]), "w0").unwrap();
        let whole = bytes.clone();
        assert!(
            read_frame::<Request>(&mut &whole[..0], "w0")
                .unwrap()
                .is_none()
        );
        for cut in 1..whole.len() {
            let e = read_frame::<Request>(&mut &whole[..cut], "w0").unwrap_err();
            assert!(matches!(e, PsError::Connection { .. }), "cut at {cut}: {e}");
        }
    }

    /// `Values` as a packed `repeated float`, the way the hot messages' `f32`s are described
    /// to other Protocol Buffers readers.
    #[derive(Clone, PartialEq, Message)]
    struct PackedValues {
        #[prost(float, repeated, tag = "1")]
        values: Vec<f32>,
    }

    #[test]
    fn a_frames_f32s_share_its_buffer_instead_of_being_copied() {
        let values: Vec<f32> = (0..1000).map(|i| i as f32 / 7.0).collect();
        let answer = Response {
            kind: Some(ResponseKind::Values(Values {
                values: f32_bytes(&values).into(),
            })),
        };
        let frame = answer.encode_to_vec();
        let buffer = frame.as_ptr_range();
        let Some(ResponseKind::Values(read)) = decode::<Response>(frame).unwrap().kind else {
            panic!("not values");
        };
        assert!(
            buffer.contains(&read.values.as_ptr()),
            "the f32s were copied"
        );
        assert_eq!(f32s(&read.values), Some(values));
    }

    proptest! {
        #[test]
        fn f32s_held_as_bytes_are_the_bytes_of_a_packed_repeated_float(
            values in proptest::collection::vec(any::<f32>().prop_filter("not NaN", |v| !v.is_nan()), 0..64),
        ) {
            let held = Values { values: f32_bytes(&values).into() }.encode_to_vec();
            let packed = PackedValues { values: values.clone() }.encode_to_vec();
            prop_assert_eq!(&held, &packed);
            let read = Values::decode(packed.as_slice()).unwrap();
            prop_assert_eq!(f32s(&read.values), Some(values));
        }

        #[test]
        fn f32s_copied_into_place_are_the_f32s_read_and_other_lengths_are_refused(
            values in proptest::collection::vec(any::<f32>().prop_filter("not NaN", |v| !v.is_nan()), 0..64),
            other in 0..70_usize,
        ) {
            let bytes = f32_bytes(&values);
            let mut out = vec![f32::NAN; values.len()];
            prop_assert!(f32s_into(&bytes, &mut out));
            prop_assert_eq!(&out, &values);
            let mut wrong = vec![1.5_f32; other];
            prop_assert_eq!(f32s_into(&bytes, &mut wrong), other == values.len());
            if other != values.len() {
                prop_assert!(wrong.iter().all(|&v| v == 1.5), "untouched");
            }
        }

        #[test]
        fn bytes_that_are_not_whole_f32s_read_as_none_never_a_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let read = f32s(&bytes);
            prop_assert_eq!(read.is_some(), bytes.len() % 4 == 0);
            if let Some(values) = read {
                prop_assert_eq!(f32_bytes(&values), bytes);
            }
        }

        #[test]
        fn requests_round_trip_through_frames(
            rows in proptest::collection::vec(any::<u64>(), 0..20),
            gradient in proptest::collection::vec(any::<f32>().prop_filter("not NaN", |v| !v.is_nan()), 0..40),
        ) {
            let request = push(rows, gradient);
            let mut bytes = Vec::new();
            write_frame(&mut bytes, &request, "w0").unwrap();
            let mut input = bytes.as_slice();
            prop_assert_eq!(read_frame::<Request>(&mut input, "w0").unwrap(), Some(request));
            prop_assert!(read_frame::<Request>(&mut input, "w0").unwrap().is_none());
        }

        #[test]
        fn any_bytes_read_as_a_message_an_error_or_the_end_never_a_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            let mut input = bytes.as_slice();
            for _ in 0..8 {
                if !matches!(read_frame::<Request>(&mut input, "w0"), Ok(Some(_))) {
                    break;
                }
            }
            let mut input = bytes.as_slice();
            let _ = read_frame::<Response>(&mut input, "ps0");
        }

        #[test]
        fn any_payload_in_a_well_formed_frame_reads_as_a_message_or_an_error(
            payload in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            let mut bytes = (payload.len() as u32).to_le_bytes().to_vec();
            bytes.extend_from_slice(&payload);
            match read_frame::<Request>(&mut bytes.as_slice(), "w0") {
                Ok(Some(_)) | Err(PsError::Wire { .. }) => {}
                other => prop_assert!(false, "{other:?}"),
            }
            let _ = read_frame::<Response>(&mut bytes.as_slice(), "ps0");
        }
    }
}
