//! Batching: stacking consecutive elements into one.

use ndarray::{Array, Array1, ArrayBase, ArrayD, Data, Dimension, IxDyn};

use crate::dataset::{Cardinality, Dataset, ElementStream};
use crate::error::DataError;
use crate::fingerprint::Fingerprint;

/// Elements that can be stacked into a batch: scalars become a 1-D array, arrays gain a first
/// axis, tuples stack component by component.
///
/// ```
/// use lockstep_data::Batchable;
/// use ndarray::array;
///
/// let (x, y) = <(ndarray::Array1<f32>, u8)>::stack(vec![(array![1.0, 2.0], 0), (array![3.0, 4.0], 1)])?;
/// assert_eq!(x, array![[1.0, 2.0], [3.0, 4.0]]);
/// assert_eq!(y, array![0, 1]);
/// # Ok::<(), lockstep_data::DataError>(())
/// ```
pub trait Batchable: Sized + Send + 'static {
    /// The stacked type.
    type Batched: Send + 'static;

    /// Stacks a non-empty list of elements.
    ///
    /// # Errors
    ///
    /// [`DataError::ShapeMismatch`] when arrays in the list have different shapes.
    fn stack(items: Vec<Self>) -> Result<Self::Batched, DataError>;
}

macro_rules! scalar_batchable {
    ($($t:ty),*) => {$(
        impl Batchable for $t {
            type Batched = Array1<$t>;
            fn stack(items: Vec<Self>) -> Result<Self::Batched, DataError> {
                Ok(Array1::from(items))
            }
        }
    )*};
}
scalar_batchable!(u8, u16, u32, u64, i8, i16, i32, i64, f32, f64, bool);

impl<A, S, D> Batchable for ArrayBase<S, D>
where
    A: Clone + Send + Sync + 'static,
    S: Data<Elem = A> + Send + 'static,
    D: Dimension + 'static,
{
    type Batched = Array<A, D::Larger>;

    fn stack(items: Vec<Self>) -> Result<Self::Batched, DataError> {
        let expected = items
            .first()
            .map(|a| a.shape().to_vec())
            .unwrap_or_default();
        let per_item: usize = expected.iter().product();
        let mut data = Vec::with_capacity(per_item * items.len());
        for (index, item) in items.iter().enumerate() {
            if item.shape() != expected.as_slice() {
                return Err(DataError::ShapeMismatch {
                    index,
                    expected,
                    got: item.shape().to_vec(),
                });
            }
            match item.as_slice() {
                Some(contiguous) => data.extend_from_slice(contiguous),
                None => data.extend(item.iter().cloned()),
            }
        }
        let shape: Vec<usize> = std::iter::once(items.len())
            .chain(expected.iter().copied())
            .collect();
        ArrayD::from_shape_vec(IxDyn(&shape), data)
            .and_then(ndarray::ArrayBase::into_dimensionality::<D::Larger>)
            .map_err(|e| {
                DataError::invalid("batch", format!("cannot stack into shape {shape:?}: {e}"))
            })
    }
}

impl<A: Batchable, B: Batchable> Batchable for (A, B) {
    type Batched = (A::Batched, B::Batched);
    fn stack(items: Vec<Self>) -> Result<Self::Batched, DataError> {
        let (a, b): (Vec<A>, Vec<B>) = items.into_iter().unzip();
        Ok((A::stack(a)?, B::stack(b)?))
    }
}

impl<A: Batchable, B: Batchable, C: Batchable> Batchable for (A, B, C) {
    type Batched = (A::Batched, B::Batched, C::Batched);
    fn stack(items: Vec<Self>) -> Result<Self::Batched, DataError> {
        let mut a = Vec::with_capacity(items.len());
        let mut b = Vec::with_capacity(items.len());
        let mut c = Vec::with_capacity(items.len());
        for (x, y, z) in items {
            a.push(x);
            b.push(y);
            c.push(z);
        }
        Ok((A::stack(a)?, B::stack(b)?, C::stack(c)?))
    }
}

/// The dataset of [`Dataset::batch`].
#[derive(Clone)]
pub struct Batch<D> {
    inner: D,
    size: usize,
    drop_remainder: bool,
}

impl<D> Batch<D> {
    pub(crate) fn new(inner: D, size: usize, drop_remainder: bool) -> Self {
        Self {
            inner,
            size,
            drop_remainder,
        }
    }
}

impl<D: Dataset> Dataset for Batch<D>
where
    D::Item: Batchable,
{
    fn options(&self) -> crate::DatasetOptions {
        self.inner.options()
    }

    type Item = <D::Item as Batchable>::Batched;
    type Stream = BatchStream<D::Stream>;

    fn stream(&self, epoch: u64) -> Result<Self::Stream, DataError> {
        self.stream_at(epoch, 0)
    }

    fn stream_at(&self, epoch: u64, offset: u64) -> Result<Self::Stream, DataError> {
        if self.size == 0 {
            return Err(DataError::invalid(
                "batch",
                "the batch size must be at least 1",
            ));
        }
        let inner = self
            .inner
            .stream_at(epoch, offset.saturating_mul(self.size as u64))?;
        Ok(BatchStream {
            inner,
            size: self.size,
            drop_remainder: self.drop_remainder,
        })
    }

    fn cardinality(&self) -> Cardinality {
        let size = self.size.max(1) as u64;
        let drop = self.drop_remainder;
        self.inner
            .cardinality()
            .map(|n| if drop { n / size } else { n.div_ceil(size) })
    }

    fn fingerprint(&self, fp: &mut Fingerprint) {
        fp.str("batch")
            .u64(self.size as u64)
            .u64(u64::from(self.drop_remainder));
        self.inner.fingerprint(fp);
    }

    fn file_count(&self) -> Option<usize> {
        self.inner.file_count()
    }

    fn shard_files(&self, num_shards: usize, index: usize) -> Option<Self> {
        Some(Self {
            inner: self.inner.shard_files(num_shards, index)?,
            ..*self
        })
    }
}

/// The stream of [`Batch`].
pub struct BatchStream<S> {
    inner: S,
    size: usize,
    drop_remainder: bool,
}

impl<S: ElementStream> ElementStream for BatchStream<S>
where
    S::Item: Batchable,
{
    type Item = <S::Item as Batchable>::Batched;

    fn next_element(&mut self) -> Option<Result<Self::Item, DataError>> {
        let mut items = Vec::with_capacity(self.size);
        while items.len() < self.size {
            match self.inner.next_element() {
                Some(Ok(item)) => items.push(item),
                Some(Err(e)) => return Some(Err(e)),
                None => break,
            }
        }
        if items.is_empty() || (self.drop_remainder && items.len() < self.size) {
            return None;
        }
        Some(<S::Item as Batchable>::stack(items))
    }

    fn advance(&mut self, n: u64) -> Result<u64, DataError> {
        let size = self.size as u64;
        let got = self.inner.advance(n.saturating_mul(size))?;
        let partial = u64::from(!self.drop_remainder && got % size != 0);
        Ok(got / size + partial)
    }
}
