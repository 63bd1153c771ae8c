//! The small header every message carries, checked at every hop: a message from another
//! cluster, another collective or another step is an error, never data.

use std::fmt;

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Identifies the protocol on the wire.
const MAGIC: u32 = 0x4C53_4331; // "LSC1"
/// Bumped whenever the layout changes.
const VERSION: u8 = 1;
/// Encoded header size in bytes.
pub const HEADER_LEN: usize = 44;

/// The collective a message belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `all_reduce`.
    AllReduce,
    /// `reduce_scatter`.
    ReduceScatter,
    /// `all_gather`.
    AllGather,
    /// `broadcast`.
    Broadcast,
    /// `barrier`.
    Barrier,
}

impl Op {
    fn code(self) -> u8 {
        match self {
            Self::AllReduce => 1,
            Self::ReduceScatter => 2,
            Self::AllGather => 3,
            Self::Broadcast => 4,
            Self::Barrier => 5,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => Self::AllReduce,
            2 => Self::ReduceScatter,
            3 => Self::AllGather,
            4 => Self::Broadcast,
            5 => Self::Barrier,
            _ => return None,
        })
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::AllReduce => "all_reduce",
            Self::ReduceScatter => "reduce_scatter",
            Self::AllGather => "all_gather",
            Self::Broadcast => "broadcast",
            Self::Barrier => "barrier",
        })
    }
}

/// The element type of a message's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// No payload elements (barriers).
    None,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// bfloat16.
    Bf16,
    /// IEEE half precision.
    F16,
}

impl DType {
    fn code(self) -> u8 {
        match self {
            Self::None => 0,
            Self::F32 => 1,
            Self::F64 => 2,
            Self::Bf16 => 3,
            Self::F16 => 4,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => Self::None,
            1 => Self::F32,
            2 => Self::F64,
            3 => Self::Bf16,
            4 => Self::F16,
            _ => return None,
        })
    }
}

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Part of a collective's data.
    Data,
    /// The sender failed this collective; the payload says why.
    Abort,
}

/// The fields every message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    /// Data or abort.
    pub kind: Kind,
    /// The collective.
    pub op: Op,
    /// The payload's element type.
    pub dtype: DType,
    /// The reduction's code (0 when none).
    pub reduce: u8,
    /// The cluster identity both sides must share.
    pub cluster: u64,
    /// The collective's sequence number on its communicator.
    pub seq: u64,
    /// The collective's total element count at the sender.
    pub count: u64,
    /// The sender's rank.
    pub source: u32,
}

/// A header and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// What the payload is.
    pub header: Header,
    /// The raw bytes (little-endian elements, or an abort's reason).
    pub payload: Bytes,
}

/// Why bytes do not decode to a header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad message header: {0}")]
pub struct HeaderError(pub String);

impl Header {
    /// Appends the header and the payload length.
    pub fn encode(&self, payload_len: u32, out: &mut BytesMut) {
        out.put_u32_le(MAGIC);
        out.put_u8(VERSION);
        out.put_u8(match self.kind {
            Kind::Data => 0,
            Kind::Abort => 1,
        });
        out.put_u8(self.op.code());
        out.put_u8(self.dtype.code());
        out.put_u8(self.reduce);
        out.put_bytes(0, 3);
        out.put_u64_le(self.cluster);
        out.put_u64_le(self.seq);
        out.put_u64_le(self.count);
        out.put_u32_le(self.source);
        out.put_u32_le(payload_len);
    }

    /// Decodes a header and the payload length that follows it.
    ///
    /// # Errors
    ///
    /// When the bytes are not a header of this protocol version.
    pub fn decode(mut bytes: &[u8]) -> Result<(Self, u32), HeaderError> {
        if bytes.len() < HEADER_LEN {
            return Err(HeaderError(format!(
                "{} bytes, a header has {HEADER_LEN}",
                bytes.len()
            )));
        }
        let magic = bytes.get_u32_le();
        let version = bytes.get_u8();
        if magic != MAGIC || version != VERSION {
            return Err(HeaderError(format!(
                "magic {magic:08x} version {version} is not Lockstep collective protocol {VERSION}"
            )));
        }
        let kind = match bytes.get_u8() {
            0 => Kind::Data,
            1 => Kind::Abort,
            k => return Err(HeaderError(format!("unknown kind {k}"))),
        };
        let op =
            Op::from_code(bytes.get_u8()).ok_or_else(|| HeaderError("unknown operation".into()))?;
        let dtype = DType::from_code(bytes.get_u8())
            .ok_or_else(|| HeaderError("unknown element type".into()))?;
        let reduce = bytes.get_u8();
        bytes.advance(3);
        let header = Self {
            kind,
            op,
            dtype,
            reduce,
            cluster: bytes.get_u64_le(),
            seq: bytes.get_u64_le(),
            count: bytes.get_u64_le(),
            source: bytes.get_u32_le(),
        };
        Ok((header, bytes.get_u32_le()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_garbage_is_refused() {
        let header = Header {
            kind: Kind::Abort,
            op: Op::Broadcast,
            dtype: DType::Bf16,
            reduce: 2,
            cluster: 7,
            seq: 9,
            count: 11,
            source: 3,
        };
        let mut out = BytesMut::new();
        header.encode(5, &mut out);
        assert_eq!(out.len(), HEADER_LEN);
        assert_eq!(Header::decode(&out), Ok((header, 5)));
        assert!(Header::decode(&out[..HEADER_LEN - 1]).is_err());
        let mut bad = out.clone();
        bad[0] ^= 1;
        assert!(Header::decode(&bad).is_err());
        let mut bad_op = out;
        bad_op[6] = 99;
        assert!(Header::decode(&bad_op).is_err());
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_decode_to_a_header_that_encodes_back_or_an_error(
            mut raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80),
            framed: bool,
        ) {
            // Half the cases start as a header does, so that more of them get past the magic.
            if framed && raw.len() >= 6 {
                raw[..4].copy_from_slice(&MAGIC.to_le_bytes());
                raw[4] = VERSION;
                raw[5] %= 2;
            }
            if let Ok((header, len)) = Header::decode(&raw) {
                let mut out = BytesMut::new();
                header.encode(len, &mut out);
                // The three reserved bytes are not read: they encode back as zeros.
                let mut want = raw[..HEADER_LEN].to_vec();
                want[9..12].fill(0);
                proptest::prop_assert_eq!(&out[..], &want[..]);
            }
        }
    }
}
