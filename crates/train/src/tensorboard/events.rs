//! `TensorBoard` event files: `Event` protocol buffers in `TFRecord` framing.
//!
//! No maintained Rust crate writes these, so this is a small writer of its own: the two
//! messages `TensorBoard`'s scalar dashboard reads (`tensorflow/core/util/event.proto`,
//! `tensorflow/core/framework/summary.proto`), declared with `prost`, and the `TFRecord` framing
//! (length, masked CRC32C of the length, data, masked CRC32C of the data).

use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use prost::Message as _;

use crate::error::TrainError;

/// `tensorflow.Event`, the fields a scalar log uses.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Event {
    #[prost(double, tag = "1")]
    pub(crate) wall_time: f64,
    #[prost(int64, tag = "2")]
    pub(crate) step: i64,
    #[prost(oneof = "What", tags = "3, 5")]
    pub(crate) what: Option<What>,
}

/// `Event.what`: the first event of a file names the format; the others carry summaries.
#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum What {
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(Summary),
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub(crate) value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value` with a scalar.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SummaryValue {
    #[prost(string, tag = "1")]
    pub(crate) tag: String,
    #[prost(float, tag = "2")]
    pub(crate) simple_value: f32,
}

/// `TFRecord`'s CRC: CRC32C, rotated and offset so that a CRC of data holding CRCs is not
/// trivially related to them.
fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Appends framed records of scalar events to one event file.
pub(crate) struct EventWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl EventWriter {
    /// Creates `dir` and an event file in it named as TensorFlow names them, starting with
    /// the `brain.Event:2` version event.
    pub(crate) fn create(dir: &Path) -> Result<Self, TrainError> {
        let fail = |e: std::io::Error| {
            TrainError::invalid("TensorBoard", format!("{}: {e}", dir.display()))
        };
        std::fs::create_dir_all(dir).map_err(fail)?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map_or_else(|_| "localhost".into(), |h| h.trim().to_owned());
        let path = dir.join(format!(
            "events.out.tfevents.{}.{host}.{}.{}.v2",
            now.as_secs(),
            std::process::id(),
            now.subsec_nanos()
        ));
        let file = File::create(&path).map_err(fail)?;
        let mut writer = Self {
            path,
            out: BufWriter::new(file),
        };
        writer.write(&Event {
            wall_time: now.as_secs_f64(),
            step: 0,
            what: Some(What::FileVersion("brain.Event:2".into())),
        })?;
        writer.flush()?;
        Ok(writer)
    }

    /// Appends one event holding the scalars `values` (tag, value) at `step`.
    pub(crate) fn scalars(
        &mut self,
        step: u64,
        values: &[(String, f64)],
    ) -> Result<(), TrainError> {
        let wall_time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        self.write(&Event {
            wall_time,
            step: i64::try_from(step).unwrap_or(i64::MAX),
            what: Some(What::Summary(Summary {
                value: values
                    .iter()
                    .map(|(tag, value)| SummaryValue {
                        tag: tag.clone(),
                        simple_value: *value as f32,
                    })
                    .collect(),
            })),
        })
    }

    fn write(&mut self, event: &Event) -> Result<(), TrainError> {
        let data = event.encode_to_vec();
        let length = (data.len() as u64).to_le_bytes();
        let mut record = Vec::with_capacity(data.len() + 16);
        record.extend_from_slice(&length);
        record.extend_from_slice(&masked_crc(&length).to_le_bytes());
        record.extend_from_slice(&data);
        record.extend_from_slice(&masked_crc(&data).to_le_bytes());
        self.out.write_all(&record).map_err(|e| self.io(&e))
    }

    /// Pushes buffered events to the file, so `TensorBoard` sees them while training runs.
    pub(crate) fn flush(&mut self) -> Result<(), TrainError> {
        self.out.flush().map_err(|e| self.io(&e))
    }

    fn io(&self, e: &std::io::Error) -> TrainError {
        TrainError::invalid("TensorBoard", format!("{}: {e}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the records of an event file back, checking both CRCs of each.
    fn records(bytes: &[u8]) -> Vec<Event> {
        let mut events = Vec::new();
        let mut rest = bytes;
        while !rest.is_empty() {
            let (length, after) = rest.split_at(8);
            let (length_crc, after) = after.split_at(4);
            assert_eq!(masked_crc(length).to_le_bytes(), length_crc);
            let n = u64::from_le_bytes(length.try_into().unwrap()) as usize;
            let (data, after) = after.split_at(n);
            let (data_crc, after) = after.split_at(4);
            assert_eq!(masked_crc(data).to_le_bytes(), data_crc);
            events.push(Event::decode(data).unwrap());
            rest = after;
        }
        events
    }

    #[test]
    fn an_event_file_starts_with_its_version_and_holds_framed_scalars() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = EventWriter::create(&dir.path().join("train")).unwrap();
        writer
            .scalars(
                3,
                &[("epoch_loss".into(), 0.25), ("epoch_accuracy".into(), 0.5)],
            )
            .unwrap();
        writer.flush().unwrap();
        let bytes = std::fs::read(&writer.path).unwrap();
        let events = records(&bytes);
        assert_eq!(
            events[0].what,
            Some(What::FileVersion("brain.Event:2".into()))
        );
        assert_eq!(events[1].step, 3);
        let Some(What::Summary(summary)) = &events[1].what else {
            panic!("a summary")
        };
        assert_eq!(summary.value[0].tag, "epoch_loss");
        assert_eq!(summary.value[1].simple_value, 0.5);
        assert!(
            writer
                .path
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("events.out.tfevents.")
        );
    }
}
