//! `manifest.json`: where training stood, the trainer's own state, and a checksum per file.

use serde::{Deserialize, Serialize};

/// Written in every manifest, so another program's JSON is never taken for one.
pub(crate) const FORMAT: &str = "lockstep-checkpoint";
/// The manifest layout this crate writes and reads.
pub(crate) const VERSION: u32 = 1;
/// Manifests are small; a larger file is not one of ours.
pub(crate) const MAX_MANIFEST_BYTES: u64 = 16 << 20;

/// Where training stood when a checkpoint was taken. Every count is global (over all workers),
/// so a checkpoint restores on a cluster of another size.
///
/// Lockstep draws every random number from the seed, the epoch and the step (initial weights,
/// the shuffle of each epoch, dropout masks), so `seed` with the counts is the whole random
/// state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// Optimizer steps taken.
    pub step: u64,
    /// The epoch in progress, from 0 (an epoch just finished: the next one, at 0 examples).
    pub epoch: u64,
    /// Examples of `epoch` consumed, over all workers.
    pub examples_into_epoch: u64,
    /// Workers that trained up to here.
    pub worker_count: usize,
    /// The seed every random choice derives from.
    pub seed: u64,
}

/// One file of a checkpoint and what it must hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FileEntry {
    /// The key the caller used (`model`, `optimizer`); the file is `<key>.safetensors`.
    pub(crate) key: String,
    /// Its tensors' names, in the order the caller gave them (safetensors sorts by name).
    pub(crate) tensors: Vec<String>,
    pub(crate) bytes: u64,
    pub(crate) crc32c: u32,
}

/// The manifest as it lies on disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Manifest {
    pub(crate) format: String,
    pub(crate) version: u32,
    pub(crate) progress: Progress,
    /// The trainer's own state (optimizer settings and iterations, callbacks' state).
    pub(crate) meta: serde_json::Value,
    pub(crate) files: Vec<FileEntry>,
}

impl Manifest {
    /// Parses a manifest; the error says what is wrong with it.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, String> {
        let manifest: Self =
            serde_json::from_slice(bytes).map_err(|e| format!("manifest.json: {e}"))?;
        if manifest.format != FORMAT {
            return Err(format!(
                "manifest.json is of format {:?}, not {FORMAT:?}",
                manifest.format
            ));
        }
        if manifest.version != VERSION {
            return Err(format!(
                "manifest.json is version {}; this build reads version {VERSION}",
                manifest.version
            ));
        }
        if let Some(bad) = manifest.files.iter().find(|f| !valid_key(&f.key)) {
            return Err(format!("manifest.json names a file {:?}", bad.key));
        }
        Ok(manifest)
    }
}

/// File keys become file names: short, lowercase ASCII, digits, `_` and `-`.
pub(crate) fn valid_key(key: &str) -> bool {
    (1..=64).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn manifest() -> Manifest {
        Manifest {
            format: FORMAT.into(),
            version: VERSION,
            progress: Progress {
                step: 7,
                epoch: 1,
                examples_into_epoch: 128,
                worker_count: 2,
                seed: 42,
            },
            meta: serde_json::json!({"optimizer": {"iterations": 7}}),
            files: vec![FileEntry {
                key: "model".into(),
                tensors: vec!["dense/kernel".into()],
                bytes: 10,
                crc32c: 3,
            }],
        }
    }

    #[test]
    fn a_manifest_reads_back_as_written() {
        let bytes = serde_json::to_vec(&manifest()).unwrap();
        assert_eq!(Manifest::parse(&bytes).unwrap(), manifest());
    }

    #[test]
    fn foreign_json_and_other_versions_are_refused_with_a_reason() {
        let other = serde_json::json!({"format": "x", "version": 1, "progress": manifest().progress, "meta": null, "files": []});
        let err = Manifest::parse(other.to_string().as_bytes()).unwrap_err();
        assert!(err.contains("format"), "{err}");
        let mut newer = manifest();
        newer.version = 2;
        let err = Manifest::parse(&serde_json::to_vec(&newer).unwrap()).unwrap_err();
        assert!(err.contains("version 2"), "{err}");
        let mut escape = manifest();
        escape.files[0].key = "../../etc/passwd".into();
        assert!(Manifest::parse(&serde_json::to_vec(&escape).unwrap()).is_err());
    }

    proptest! {
        #[test]
        fn any_bytes_parse_or_give_a_reason(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            if let Err(why) = Manifest::parse(&bytes) {
                prop_assert!(why.starts_with("manifest.json"));
            }
        }

        #[test]
        fn damaged_manifests_give_a_reason(cut in 0_usize..300, at in 0_usize..300, byte in any::<u8>()) {
            let mut bytes = serde_json::to_vec(&manifest()).unwrap();
            let at = at % bytes.len();
            bytes[at] = byte;
            bytes.truncate(cut);
            if let Err(why) = Manifest::parse(&bytes) {
                prop_assert!(why.starts_with("manifest.json"));
            }
        }
    }
}
