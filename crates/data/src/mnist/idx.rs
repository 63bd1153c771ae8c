//! The IDX file format of MNIST: a magic number giving the element type and rank, the
//! dimensions as big-endian `u32`s, then the data; optionally gzip-compressed.

use std::io::Read;
use std::path::Path;

use flate2::read::GzDecoder;

use crate::error::DataError;

/// The gzip magic bytes.
const GZIP: [u8; 2] = [0x1f, 0x8b];
/// IDX type code of unsigned bytes, the only type MNIST uses.
const UNSIGNED_BYTE: u8 = 0x08;
/// No real IDX file is this large once decompressed; a gzip bomb is stopped here.
const MAX_DECOMPRESSED: u64 = 1 << 32;
/// Deflate expands a byte to at most about 1,032 bytes.
const MAX_DEFLATE_RATIO: usize = 1032;

/// A decoded IDX array of unsigned bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxArray {
    /// The dimensions, outermost first.
    pub dims: Vec<usize>,
    /// The values, row-major.
    pub data: Vec<u8>,
}

/// Decodes an IDX file of unsigned bytes, gzip-compressed or raw (told apart by the magic
/// bytes). `name` only labels errors.
///
/// ```
/// use lockstep_data::mnist::read_idx;
///
/// // A 2×2 array: magic 0x00000802 (unsigned bytes, rank 2), dims 2 and 2, then 4 bytes.
/// let bytes = [0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 2, 1, 2, 3, 4];
/// let array = read_idx(&bytes, "tiny".as_ref())?;
/// assert_eq!((array.dims, array.data), (vec![2, 2], vec![1, 2, 3, 4]));
/// assert!(read_idx(&bytes[..15], "tiny".as_ref()).is_err());
/// # Ok::<(), lockstep_data::DataError>(())
/// ```
///
/// # Errors
///
/// [`DataError::BadFile`] naming `name` and what is wrong: corrupt or truncated gzip, a bad
/// magic number, an unsupported element type, or data shorter or longer than the dimensions
/// say.
pub fn read_idx(bytes: &[u8], name: &Path) -> Result<IdxArray, DataError> {
    if bytes.starts_with(&GZIP) {
        // Reserving the size the gzip trailer states saves the doubling copies of a growing
        // buffer (peak memory); the trailer is untrusted, so the reservation is capped by what
        // deflate can expand this many bytes to.
        let stated = bytes
            .last_chunk::<4>()
            .map_or(0, |isize| u32::from_le_bytes(*isize) as usize);
        let mut raw = Vec::with_capacity(stated.min(bytes.len().saturating_mul(MAX_DEFLATE_RATIO)));
        GzDecoder::new(bytes)
            .take(MAX_DECOMPRESSED)
            .read_to_end(&mut raw)
            .map_err(|e| {
                DataError::bad_file(name, format!("corrupt or truncated gzip data: {e}"))
            })?;
        return parse(raw, name);
    }
    parse(bytes.to_vec(), name)
}

/// Takes the decoded file by value so that the data stays in its buffer (no second copy).
fn parse(mut bytes: Vec<u8>, name: &Path) -> Result<IdxArray, DataError> {
    let bad = |what: String| DataError::bad_file(name, what);
    if bytes.len() < 4 {
        return Err(bad(format!(
            "{} bytes is too short for an IDX header",
            bytes.len()
        )));
    }
    if bytes[0] != 0 || bytes[1] != 0 {
        return Err(bad(format!(
            "bad magic number {:02x}{:02x}{:02x}{:02x}: an IDX file starts with two zero bytes",
            bytes[0], bytes[1], bytes[2], bytes[3]
        )));
    }
    if bytes[2] != UNSIGNED_BYTE {
        return Err(bad(format!(
            "element type 0x{:02x} is not supported; MNIST stores unsigned bytes (0x08)",
            bytes[2]
        )));
    }
    let rank = usize::from(bytes[3]);
    if rank == 0 {
        return Err(bad(
            "rank 0 in the magic number: an IDX array has at least one dimension".into(),
        ));
    }
    let header = 4 + 4 * rank;
    if bytes.len() < header {
        return Err(bad(format!(
            "truncated header: rank {rank} needs {header} bytes, the file has {}",
            bytes.len()
        )));
    }
    let dims: Vec<usize> = bytes[4..header]
        .chunks_exact(4)
        .map(|d| u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize)
        .collect();
    let expected = dims
        .iter()
        .try_fold(1_usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad(format!("dimensions {dims:?} overflow")))?;
    let actual = bytes.len() - header;
    if actual < expected {
        return Err(bad(format!(
            "truncated: dimensions {dims:?} need {expected} bytes of data, the file has {actual}"
        )));
    }
    if actual > expected {
        return Err(bad(format!(
            "{} bytes of trailing data after the {expected} that dimensions {dims:?} describe",
            actual - expected
        )));
    }
    bytes.drain(..header);
    Ok(IdxArray { dims, data: bytes })
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::Compression;
    use flate2::write::GzEncoder;

    use super::*;

    fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0, 0, UNSIGNED_BYTE, dims.len() as u8];
        for d in dims {
            bytes.extend_from_slice(&d.to_be_bytes());
        }
        bytes.extend_from_slice(data);
        bytes
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    fn error(bytes: &[u8]) -> String {
        read_idx(bytes, Path::new("f.idx")).unwrap_err().to_string()
    }

    #[test]
    fn raw_and_gzip_files_decode_the_same() {
        let raw = idx(&[2, 3], &[1, 2, 3, 4, 5, 6]);
        let a = read_idx(&raw, Path::new("raw")).unwrap();
        let b = read_idx(&gzip(&raw), Path::new("gz")).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.dims, [2, 3]);
    }

    #[test]
    fn malformed_files_name_the_file_and_the_problem() {
        assert!(error(&[0, 0]).starts_with("f.idx: 2 bytes is too short"));
        assert!(error(&[1, 0, 8, 1, 0, 0, 0, 0]).contains("bad magic number 01000801"));
        assert!(error(&[0, 0, 0x0d, 1, 0, 0, 0, 0]).contains("element type 0x0d"));
        assert!(error(&[0, 0, 8, 0]).contains("rank 0"));
        assert!(error(&[0, 0, 8, 2, 0, 0, 0, 1]).contains("truncated header"));
        assert!(error(&idx(&[3], &[1, 2])).contains("need 3 bytes of data, the file has 2"));
        assert!(error(&idx(&[1], &[1, 2])).contains("1 bytes of trailing data"));
    }

    #[test]
    fn corrupt_or_truncated_gzip_is_an_error() {
        let gz = gzip(&idx(&[100], &[7; 100]));
        assert!(error(&gz[..gz.len() / 2]).contains("corrupt or truncated gzip"));
        let mut flipped = gz.clone();
        let middle = flipped.len() / 2;
        flipped[middle] ^= 0xff;
        assert!(read_idx(&flipped, Path::new("f")).is_err());
    }

    #[test]
    fn a_gzip_trailer_that_lies_about_the_size_is_an_error_not_an_allocation() {
        let mut gz = gzip(&idx(&[100], &[7; 100]));
        let trailer = gz.len() - 4;
        gz[trailer..].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(error(&gz).contains("corrupt or truncated gzip"));
    }
}
