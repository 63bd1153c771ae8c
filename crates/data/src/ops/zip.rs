use crate::dataset::{Cardinality, Dataset, ElementStream};
use crate::error::DataError;
use crate::fingerprint::Fingerprint;

/// The dataset of [`Dataset::zip`].
#[derive(Clone)]
pub struct Zip<A, B> {
    a: A,
    b: B,
}

impl<A, B> Zip<A, B> {
    pub(crate) fn new(a: A, b: B) -> Self {
        Self { a, b }
    }
}

impl<A: Dataset, B: Dataset> Dataset for Zip<A, B> {
    fn options(&self) -> crate::DatasetOptions {
        self.a.options()
    }

    type Item = (A::Item, B::Item);
    type Stream = ZipStream<A::Stream, B::Stream>;

    fn stream(&self, epoch: u64) -> Result<Self::Stream, DataError> {
        self.stream_at(epoch, 0)
    }

    fn stream_at(&self, epoch: u64, offset: u64) -> Result<Self::Stream, DataError> {
        Ok(ZipStream {
            a: self.a.stream_at(epoch, offset)?,
            b: self.b.stream_at(epoch, offset)?,
        })
    }

    fn cardinality(&self) -> Cardinality {
        use Cardinality::{Finite, Infinite, Unknown};
        match (self.a.cardinality(), self.b.cardinality()) {
            (Finite(x), Finite(y)) => Finite(x.min(y)),
            (Finite(x), _) | (_, Finite(x)) if x == 0 => Finite(0),
            (Infinite, Infinite) => Infinite,
            (Finite(x), Infinite) | (Infinite, Finite(x)) => Finite(x),
            _ => Unknown,
        }
    }

    fn fingerprint(&self, fp: &mut Fingerprint) {
        fp.str("zip");
        self.a.fingerprint(fp);
        self.b.fingerprint(fp);
    }
}

/// The stream of [`Zip`].
pub struct ZipStream<A, B> {
    a: A,
    b: B,
}

impl<A: ElementStream, B: ElementStream> ElementStream for ZipStream<A, B> {
    type Item = (A::Item, B::Item);

    fn next_element(&mut self) -> Option<Result<Self::Item, DataError>> {
        let a = self.a.next_element()?;
        let b = self.b.next_element()?;
        Some(a.and_then(|a| b.map(|b| (a, b))))
    }

    fn advance(&mut self, n: u64) -> Result<u64, DataError> {
        let a = self.a.advance(n)?;
        let b = self.b.advance(a)?;
        Ok(a.min(b))
    }
}
