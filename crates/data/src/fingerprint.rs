//! Fingerprints: a 64-bit digest of what a pipeline is, so a file cache built from one
//! pipeline is never read back as the output of another.

use xxhash_rust::xxh3::Xxh3;

use crate::element::Element;

/// Accumulates a description of a pipeline: its operations, their arguments and the content
/// of its sources.
///
/// Closures cannot be inspected, so a `map` contributes its closure's type name; changing a
/// closure's body without renaming anything is not detected (give the cache file a new name).
#[derive(Default, Clone)]
pub struct Fingerprint {
    hasher: Xxh3,
}

impl Fingerprint {
    /// An empty fingerprint.
    pub fn new() -> Self {
        Self::default()
    }

    /// Mixes in a string, length-prefixed so `("ab", "c")` and `("a", "bc")` differ.
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.hasher.update(s.as_bytes());
        self
    }

    /// Mixes in a number.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.hasher.update(&v.to_le_bytes());
        self
    }

    /// Mixes in raw bytes.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.u64(b.len() as u64);
        self.hasher.update(b);
        self
    }

    /// Mixes in the encoded content of elements.
    pub fn elements<'a, T: Element>(
        &mut self,
        items: impl IntoIterator<Item = &'a T>,
    ) -> &mut Self {
        let mut buffer = Vec::new();
        for item in items {
            buffer.clear();
            item.encode(&mut buffer);
            self.hasher.update(&buffer);
        }
        self
    }

    /// The digest so far.
    pub fn finish(&self) -> u64 {
        self.hasher.digest()
    }
}

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fingerprint({:016x})", self.finish())
    }
}
