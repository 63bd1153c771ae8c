//! The flight recorder: the last collectives of a communicator, dumped when one fails, so the
//! log shows what every rank was doing.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use crate::header::Op;

/// How many collectives the recorder keeps.
pub const FLIGHT_RECORDS: usize = 32;

/// One collective as the recorder saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlightRecord {
    /// The collective.
    pub op: Op,
    /// Its sequence number.
    pub seq: u64,
    /// Bytes of payload on this rank.
    pub bytes: usize,
    /// `ring`, `tree` or `local`.
    pub algorithm: &'static str,
    /// The ranks this rank exchanged with.
    pub peers: Vec<usize>,
    /// How long it took (or ran before failing).
    pub elapsed: Duration,
    /// `None` on success, else the error.
    pub failure: Option<String>,
}

impl fmt::Display for FlightRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} #{} {} bytes via {} with ranks {:?} in {:?}: {}",
            self.op,
            self.seq,
            self.bytes,
            self.algorithm,
            self.peers,
            self.elapsed,
            self.failure.as_deref().unwrap_or("ok")
        )
    }
}

/// A bounded history of collectives.
#[derive(Debug, Default)]
pub(crate) struct FlightRecorder {
    records: VecDeque<FlightRecord>,
}

impl FlightRecorder {
    pub(crate) fn record(&mut self, record: FlightRecord) {
        if self.records.len() == FLIGHT_RECORDS {
            self.records.pop_front();
        }
        self.records.push_back(record);
    }

    pub(crate) fn records(&self) -> impl Iterator<Item = &FlightRecord> {
        self.records.iter()
    }

    pub(crate) fn dump(&self, rank: usize) {
        for record in &self.records {
            tracing::error!(rank, "flight recorder: {record}");
        }
    }
}
