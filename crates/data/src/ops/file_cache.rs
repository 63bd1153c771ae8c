use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::dataset::{Cardinality, Dataset, ElementStream, advance_by_reading};
use crate::element::Element;
use crate::error::DataError;
use crate::fingerprint::Fingerprint;

/// File layout, all integers little-endian:
/// header `MAGIC, VERSION: u32, fingerprint: u64`; records `len: u32, bytes`;
/// footer `count: u64, crc32c(records): u32, END`.
const MAGIC: &[u8; 8] = b"LSDCACHE";
const END: &[u8; 8] = b"LSDEND\0\0";
const VERSION: u32 = 1;
const HEADER: u64 = 8 + 4 + 8;
const FOOTER: u64 = 8 + 4 + 8;

/// The dataset of [`Dataset::cache_to_file`].
#[derive(Clone)]
pub struct FileCache<D> {
    inner: D,
    path: Arc<PathBuf>,
}

impl<D> FileCache<D> {
    pub(crate) fn new(inner: D, path: PathBuf) -> Self {
        Self {
            inner,
            path: Arc::new(path),
        }
    }
}

impl<D: Dataset> FileCache<D>
where
    D::Item: Element,
{
    /// What the file must have been built from: the input pipeline and the element type.
    fn content_fingerprint(&self) -> u64 {
        let mut fp = Fingerprint::new();
        fp.str("file_cache").str(std::any::type_name::<D::Item>());
        self.inner.fingerprint(&mut fp);
        fp.finish()
    }
}

impl<D: Dataset> Dataset for FileCache<D>
where
    D::Item: Element,
{
    fn options(&self) -> crate::DatasetOptions {
        self.inner.options()
    }

    type Item = D::Item;
    type Stream = FileCacheStream<D::Stream>;

    fn stream(&self, epoch: u64) -> Result<Self::Stream, DataError> {
        self.stream_at(epoch, 0)
    }

    fn stream_at(&self, _epoch: u64, offset: u64) -> Result<Self::Stream, DataError> {
        let fingerprint = self.content_fingerprint();
        let mut stream = match open_valid(&self.path, fingerprint) {
            Ok(reader) => reader,
            Err(why) => {
                if self.path.exists() {
                    tracing::warn!(path = %self.path.display(), %why, "rebuilding the cache file");
                }
                // Like the memory cache, the file holds the first pass of the input.
                let writer = CacheWriter::create(&self.path, fingerprint)
                    .inspect_err(|e| tracing::warn!(path = %self.path.display(), %e, "cannot write the cache file; reading the input uncached"))
                    .ok();
                FileCacheStream::Write {
                    inner: self.inner.stream(0)?,
                    writer,
                    scratch: Vec::new(),
                }
            }
        };
        stream.advance(offset)?;
        Ok(stream)
    }

    fn cardinality(&self) -> Cardinality {
        self.inner.cardinality()
    }

    fn fingerprint(&self, fp: &mut Fingerprint) {
        self.inner.fingerprint(fp);
    }
}

/// The stream of [`FileCache`]: reading a valid file, or building it during the first pass.
pub enum FileCacheStream<S: ElementStream> {
    /// Reading a complete, verified file.
    Read {
        /// Positioned at the next record.
        reader: BufReader<File>,
        /// The file, for error messages.
        path: Arc<PathBuf>,
        /// Records not yet read.
        remaining: u64,
        /// Reused record buffer.
        scratch: Vec<u8>,
    },
    /// The first pass: reading the input and writing every element.
    Write {
        /// The input.
        inner: S,
        /// `None` once writing has failed or the file is complete.
        writer: Option<CacheWriter>,
        /// Reused encoding buffer.
        scratch: Vec<u8>,
    },
}

impl<S: ElementStream> ElementStream for FileCacheStream<S>
where
    S::Item: Element,
{
    type Item = S::Item;

    fn next_element(&mut self) -> Option<Result<S::Item, DataError>> {
        match self {
            Self::Read {
                reader,
                path,
                remaining,
                scratch,
            } => {
                if *remaining == 0 {
                    return None;
                }
                *remaining -= 1;
                Some(
                    read_record(reader, scratch)
                        .map_err(|e| DataError::io(path.as_path(), e))
                        .and_then(|()| {
                            let mut bytes = scratch.as_slice();
                            let item = S::Item::decode(&mut bytes)?;
                            if bytes.is_empty() {
                                Ok(item)
                            } else {
                                Err(DataError::Decode(format!(
                                    "{} bytes left over in a record of {}",
                                    bytes.len(),
                                    path.display()
                                )))
                            }
                        }),
                )
            }
            Self::Write {
                inner,
                writer,
                scratch,
            } => match inner.next_element() {
                Some(Ok(item)) => {
                    if let Some(w) = writer {
                        scratch.clear();
                        item.encode(scratch);
                        if let Err(e) = w.append(scratch) {
                            tracing::warn!(%e, "cannot write the cache file; reading the input uncached");
                            *writer = None;
                        }
                    }
                    Some(Ok(item))
                }
                Some(Err(e)) => {
                    // A pass with an error is not the dataset: never cache it.
                    *writer = None;
                    Some(Err(e))
                }
                None => {
                    if let Some(w) = writer.take()
                        && let Err(e) = w.finish()
                    {
                        tracing::warn!(%e, "cannot complete the cache file");
                    }
                    None
                }
            },
        }
    }

    fn advance(&mut self, n: u64) -> Result<u64, DataError> {
        if let Self::Read {
            reader,
            path,
            remaining,
            ..
        } = self
        {
            let skip = n.min(*remaining);
            for _ in 0..skip {
                let mut len = [0_u8; 4];
                reader
                    .read_exact(&mut len)
                    .map_err(|e| DataError::io(path.as_path(), e))?;
                reader
                    .seek_relative(i64::from(u32::from_le_bytes(len)))
                    .map_err(|e| DataError::io(path.as_path(), e))?;
            }
            *remaining -= skip;
            return Ok(skip);
        }
        advance_by_reading(self, n)
    }
}

fn read_record(reader: &mut BufReader<File>, scratch: &mut Vec<u8>) -> io::Result<()> {
    let mut len = [0_u8; 4];
    reader.read_exact(&mut len)?;
    scratch.resize(u32::from_le_bytes(len) as usize, 0);
    reader.read_exact(scratch)
}

fn read_u64(bytes: &[u8]) -> u64 {
    let mut raw = [0_u8; 8];
    raw.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(raw)
}

/// Opens the cache file if it is complete, undamaged and built from this pipeline; otherwise
/// says why not.
fn open_valid<S: ElementStream>(
    path: &Arc<PathBuf>,
    fingerprint: u64,
) -> Result<FileCacheStream<S>, String> {
    let mut file = File::open(path.as_path()).map_err(|e| e.to_string())?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    if len < HEADER + FOOTER {
        return Err(format!("{len} bytes is too short to be a cache file"));
    }
    let mut header = [0_u8; HEADER as usize];
    file.read_exact(&mut header).map_err(|e| e.to_string())?;
    if &header[..8] != MAGIC || header[8..12] != VERSION.to_le_bytes() {
        return Err("not a cache file of this version".into());
    }
    if read_u64(&header[12..]) != fingerprint {
        return Err("built from a different pipeline or element type".into());
    }
    let mut footer = [0_u8; FOOTER as usize];
    file.seek(SeekFrom::Start(len - FOOTER))
        .map_err(|e| e.to_string())?;
    file.read_exact(&mut footer).map_err(|e| e.to_string())?;
    if &footer[12..] != END {
        return Err("incomplete (no end marker): a partial or truncated write".into());
    }
    let count = read_u64(&footer);
    let expected_crc = u32::from_le_bytes([footer[8], footer[9], footer[10], footer[11]]);
    file.seek(SeekFrom::Start(HEADER))
        .map_err(|e| e.to_string())?;
    let mut body = (&mut file).take(len - HEADER - FOOTER);
    let mut chunk = vec![0_u8; 1 << 20];
    let mut crc = 0;
    loop {
        let n = body.read(&mut chunk).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        crc = crc32c::crc32c_append(crc, &chunk[..n]);
    }
    if crc != expected_crc {
        return Err(format!(
            "damaged: checksum {crc:08x} where {expected_crc:08x} was written"
        ));
    }
    file.seek(SeekFrom::Start(HEADER))
        .map_err(|e| e.to_string())?;
    Ok(FileCacheStream::Read {
        reader: BufReader::with_capacity(1 << 20, file),
        path: Arc::clone(path),
        remaining: count,
        scratch: Vec::new(),
    })
}

/// Writes a cache file under a temporary name and renames it into place once complete and
/// synced, so the final name only ever holds a whole file.
pub struct CacheWriter {
    out: BufWriter<File>,
    temp: PathBuf,
    path: PathBuf,
    count: u64,
    crc: u32,
    done: bool,
}

impl CacheWriter {
    fn create(path: &Path, fingerprint: u64) -> io::Result<Self> {
        static UNIQUE: AtomicU64 = AtomicU64::new(0);
        let unique = UNIQUE.fetch_add(1, Ordering::Relaxed);
        let mut name = path.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".tmp.{}.{unique}", std::process::id()));
        let temp = path.with_file_name(name);
        let mut out = BufWriter::with_capacity(1 << 20, File::create(&temp)?);
        out.write_all(MAGIC)?;
        out.write_all(&VERSION.to_le_bytes())?;
        out.write_all(&fingerprint.to_le_bytes())?;
        Ok(Self {
            out,
            temp,
            path: path.to_path_buf(),
            count: 0,
            crc: 0,
            done: false,
        })
    }

    fn append(&mut self, record: &[u8]) -> io::Result<()> {
        let len = u32::try_from(record.len())
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "an element of 4 GiB or more cannot be cached",
                )
            })?
            .to_le_bytes();
        self.out.write_all(&len)?;
        self.out.write_all(record)?;
        self.crc = crc32c::crc32c_append(crc32c::crc32c_append(self.crc, &len), record);
        self.count += 1;
        Ok(())
    }

    fn finish(mut self) -> io::Result<()> {
        self.out.write_all(&self.count.to_le_bytes())?;
        self.out.write_all(&self.crc.to_le_bytes())?;
        self.out.write_all(END)?;
        self.out.flush()?;
        self.out.get_ref().sync_all()?;
        fs::rename(&self.temp, &self.path)?;
        self.done = true;
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            // Make the rename itself durable; some filesystems cannot sync a directory.
            let _ = File::open(dir).and_then(|d| d.sync_all());
        }
        Ok(())
    }
}

impl Drop for CacheWriter {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_file(&self.temp);
        }
    }
}
