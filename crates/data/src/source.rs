//! Where elements come from: in-memory vectors and arrays, or files.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use ndarray::{Array, Axis, RemoveAxis};

use crate::dataset::{Cardinality, Dataset, ElementStream, Shared};
use crate::element::{Element, Scalar};
use crate::error::DataError;
use crate::fingerprint::Fingerprint;

/// Data that can be cut into elements along its first axis, like the argument of
/// `tf.data.Dataset.from_tensor_slices`: a `Vec`, an ndarray array (one element per row), or a
/// tuple of those with equal lengths.
pub trait Slices: Send + Sync + 'static {
    /// One slice.
    type Item: Send + 'static;
    /// The number of slices, or an error when the parts of a tuple disagree.
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`] for parts of different lengths.
    fn count(&self) -> Result<usize, DataError>;
    /// Slice `index` (below `count()`).
    fn get(&self, index: usize) -> Self::Item;
    /// Mixes the content into a fingerprint.
    fn fingerprint(&self, fp: &mut Fingerprint);
}

impl<T: Element> Slices for Vec<T> {
    type Item = T;
    fn count(&self) -> Result<usize, DataError> {
        Ok(self.len())
    }
    fn get(&self, index: usize) -> T {
        self[index].clone()
    }
    fn fingerprint(&self, fp: &mut Fingerprint) {
        fp.str(std::any::type_name::<T>())
            .u64(self.len() as u64)
            .elements(self);
    }
}

impl<A: Scalar, D: RemoveAxis + 'static> Slices for Array<A, D> {
    type Item = Array<A, D::Smaller>;
    fn count(&self) -> Result<usize, DataError> {
        Ok(self.len_of(Axis(0)))
    }
    fn get(&self, index: usize) -> Self::Item {
        self.index_axis(Axis(0), index).to_owned()
    }
    fn fingerprint(&self, fp: &mut Fingerprint) {
        fp.str(std::any::type_name::<Self>()).elements([self]);
    }
}

impl<S1: Slices, S2: Slices> Slices for (S1, S2) {
    type Item = (S1::Item, S2::Item);
    fn count(&self) -> Result<usize, DataError> {
        let (a, b) = (self.0.count()?, self.1.count()?);
        if a == b {
            Ok(a)
        } else {
            Err(DataError::invalid(
                "from_slices",
                format!("the parts have different lengths: {a} and {b}"),
            ))
        }
    }
    fn get(&self, index: usize) -> Self::Item {
        (self.0.get(index), self.1.get(index))
    }
    fn fingerprint(&self, fp: &mut Fingerprint) {
        self.0.fingerprint(fp);
        self.1.fingerprint(fp);
    }
}

/// A dataset of the slices of in-memory data; see [`from_slices`] and [`from_vec`].
pub struct FromSlices<S> {
    data: Arc<S>,
    len: usize,
    fingerprint: Arc<OnceLock<u64>>,
}

impl<S> Clone for FromSlices<S> {
    fn clone(&self) -> Self {
        Self {
            data: Arc::clone(&self.data),
            len: self.len,
            fingerprint: Arc::clone(&self.fingerprint),
        }
    }
}

/// A dataset whose elements are the slices of `data` along its first axis.
///
/// ```
/// use lockstep_data::{Dataset, from_slices};
/// use ndarray::array;
///
/// let images = array![[0.0_f32, 0.1], [0.2, 0.3], [0.4, 0.5]];
/// let labels = vec![1_u8, 2, 3];
/// let ds = from_slices((images, labels))?;
/// let (row, label) = ds.iter()?.nth(1).unwrap()?;
/// assert_eq!((row.to_vec(), label), (vec![0.2, 0.3], 2));
/// assert!(from_slices((array![[1.0_f32]], vec![1_u8, 2])).is_err());
/// # Ok::<(), lockstep_data::DataError>(())
/// ```
///
/// # Errors
///
/// [`DataError::InvalidArgument`] when the parts of a tuple have different lengths.
pub fn from_slices<S: Slices>(data: S) -> Result<FromSlices<S>, DataError> {
    let len = data.count()?;
    Ok(FromSlices {
        data: Arc::new(data),
        len,
        fingerprint: Arc::new(OnceLock::new()),
    })
}

/// A dataset of the items of a vector.
///
/// ```
/// use lockstep_data::{Dataset, from_vec};
///
/// let ds = from_vec(vec![3_i32, 1, 2]);
/// assert_eq!(ds.iter()?.collect::<Result<Vec<_>, _>>()?, [3, 1, 2]);
/// # Ok::<(), lockstep_data::DataError>(())
/// ```
pub fn from_vec<T: Element>(items: Vec<T>) -> FromSlices<Vec<T>> {
    FromSlices {
        len: items.len(),
        data: Arc::new(items),
        fingerprint: Arc::new(OnceLock::new()),
    }
}

impl<S: Slices> Dataset for FromSlices<S> {
    type Item = S::Item;
    type Stream = SliceStream<S>;

    fn stream(&self, epoch: u64) -> Result<Self::Stream, DataError> {
        self.stream_at(epoch, 0)
    }

    fn stream_at(&self, _epoch: u64, offset: u64) -> Result<Self::Stream, DataError> {
        let pos = usize::try_from(offset).unwrap_or(usize::MAX).min(self.len);
        Ok(SliceStream {
            data: Arc::clone(&self.data),
            pos,
            len: self.len,
        })
    }

    fn cardinality(&self) -> Cardinality {
        Cardinality::Finite(self.len as u64)
    }

    fn fingerprint(&self, fp: &mut Fingerprint) {
        // Hashing the content is a pass over the data: do it once per dataset.
        let content = *self.fingerprint.get_or_init(|| {
            let mut own = Fingerprint::new();
            self.data.fingerprint(&mut own);
            own.finish()
        });
        fp.str("from_slices").u64(content);
    }
}

/// The stream of [`FromSlices`].
pub struct SliceStream<S> {
    data: Arc<S>,
    pos: usize,
    len: usize,
}

impl<S: Slices> ElementStream for SliceStream<S> {
    type Item = S::Item;

    fn next_element(&mut self) -> Option<Result<S::Item, DataError>> {
        (self.pos < self.len).then(|| {
            self.pos += 1;
            Ok(self.data.get(self.pos - 1))
        })
    }

    fn advance(&mut self, n: u64) -> Result<u64, DataError> {
        let skipped = usize::try_from(n)
            .unwrap_or(usize::MAX)
            .min(self.len - self.pos);
        self.pos += skipped;
        Ok(skipped as u64)
    }
}

/// A dataset read from files, each turned into elements by a reader function; files are read
/// one at a time, as the stream reaches them. It supports file-level auto-sharding.
///
/// ```
/// use lockstep_data::{Dataset, from_files};
///
/// let dir = tempfile::tempdir()?;
/// for (name, text) in [("a.txt", "1 2"), ("b.txt", "3")] {
///     std::fs::write(dir.path().join(name), text)?;
/// }
/// let paths = vec![dir.path().join("a.txt"), dir.path().join("b.txt")];
/// let numbers = from_files(paths, |path| {
///     let text = std::fs::read_to_string(path).map_err(|e| lockstep_data::DataError::Io { path: path.into(), source: e })?;
///     Ok(text.split_whitespace().filter_map(|w| w.parse::<u32>().ok()).collect())
/// });
/// assert_eq!(numbers.iter()?.collect::<Result<Vec<_>, _>>()?, [1, 2, 3]);
/// assert_eq!(numbers.file_count(), Some(2));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn from_files<T, F>(paths: Vec<PathBuf>, read: F) -> FromFiles<F>
where
    T: Send + 'static,
    F: Fn(&Path) -> Result<Vec<T>, DataError> + Send + Sync + 'static,
{
    FromFiles {
        paths: paths.into(),
        read: Arc::new(read),
    }
}

/// The dataset of [`from_files`].
pub struct FromFiles<F> {
    paths: Arc<[PathBuf]>,
    read: Shared<F>,
}

impl<F> Clone for FromFiles<F> {
    fn clone(&self) -> Self {
        Self {
            paths: Arc::clone(&self.paths),
            read: Arc::clone(&self.read),
        }
    }
}

impl<T, F> Dataset for FromFiles<F>
where
    T: Send + 'static,
    F: Fn(&Path) -> Result<Vec<T>, DataError> + Send + Sync + 'static,
{
    type Item = T;
    type Stream = FileStream<T, F>;

    fn stream(&self, _epoch: u64) -> Result<Self::Stream, DataError> {
        Ok(FileStream {
            paths: Arc::clone(&self.paths),
            read: Arc::clone(&self.read),
            next_file: 0,
            pending: VecDeque::new(),
        })
    }

    fn cardinality(&self) -> Cardinality {
        if self.paths.is_empty() {
            Cardinality::Finite(0)
        } else {
            Cardinality::Unknown
        }
    }

    fn fingerprint(&self, fp: &mut Fingerprint) {
        fp.str("from_files").str(std::any::type_name::<F>());
        for path in self.paths.iter() {
            fp.str(&path.to_string_lossy());
            // Size and modification time stand in for the content, as in make.
            match std::fs::metadata(path) {
                Ok(meta) => {
                    let modified = meta
                        .modified()
                        .ok()
                        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                        .map_or(0, |d| d.as_nanos() as u64);
                    fp.u64(meta.len()).u64(modified);
                }
                Err(_) => {
                    fp.str("missing");
                }
            }
        }
    }

    fn file_count(&self) -> Option<usize> {
        Some(self.paths.len())
    }

    fn shard_files(&self, num_shards: usize, index: usize) -> Option<Self> {
        let paths = self
            .paths
            .iter()
            .skip(index)
            .step_by(num_shards.max(1))
            .cloned()
            .collect();
        Some(Self {
            paths,
            read: Arc::clone(&self.read),
        })
    }
}

/// The stream of [`FromFiles`].
pub struct FileStream<T, F> {
    paths: Arc<[PathBuf]>,
    read: Shared<F>,
    next_file: usize,
    pending: VecDeque<T>,
}

impl<T, F> ElementStream for FileStream<T, F>
where
    T: Send + 'static,
    F: Fn(&Path) -> Result<Vec<T>, DataError> + Send + Sync + 'static,
{
    type Item = T;

    fn next_element(&mut self) -> Option<Result<T, DataError>> {
        loop {
            if let Some(item) = self.pending.pop_front() {
                return Some(Ok(item));
            }
            let path = self.paths.get(self.next_file)?;
            self.next_file += 1;
            match (self.read)(path) {
                Ok(items) => self.pending = items.into(),
                Err(e) => return Some(Err(e)),
            }
        }
    }
}
