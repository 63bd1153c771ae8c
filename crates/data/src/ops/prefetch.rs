use std::sync::mpsc::{Receiver, sync_channel};
use std::thread::{self, JoinHandle};

use crate::dataset::{Cardinality, Dataset, ElementStream};
use crate::error::DataError;
use crate::fingerprint::Fingerprint;

/// The dataset of [`Dataset::prefetch`].
#[derive(Clone)]
pub struct Prefetch<D> {
    inner: D,
    buffer: usize,
}

impl<D> Prefetch<D> {
    pub(crate) fn new(inner: D, buffer: usize) -> Self {
        Self { inner, buffer }
    }
}

impl<D: Dataset> Dataset for Prefetch<D> {
    fn options(&self) -> crate::DatasetOptions {
        self.inner.options()
    }

    type Item = D::Item;
    type Stream = PrefetchStream<D::Item>;

    fn stream(&self, epoch: u64) -> Result<Self::Stream, DataError> {
        self.stream_at(epoch, 0)
    }

    fn stream_at(&self, epoch: u64, offset: u64) -> Result<Self::Stream, DataError> {
        // Position the input before handing it to the thread: skipping is then as cheap as
        // the input allows, and the thread only ever produces elements that will be used.
        PrefetchStream::spawn(self.inner.stream_at(epoch, offset)?, self.buffer.max(1))
    }

    fn cardinality(&self) -> Cardinality {
        self.inner.cardinality()
    }

    fn fingerprint(&self, fp: &mut Fingerprint) {
        // Prefetching changes when elements are computed, not what they are.
        self.inner.fingerprint(fp);
    }

    fn file_count(&self) -> Option<usize> {
        self.inner.file_count()
    }

    fn shard_files(&self, num_shards: usize, index: usize) -> Option<Self> {
        Some(Self {
            inner: self.inner.shard_files(num_shards, index)?,
            buffer: self.buffer,
        })
    }
}

/// The stream of [`Prefetch`]: a background thread fills a bounded queue.
pub struct PrefetchStream<T> {
    queue: Option<Receiver<Result<T, DataError>>>,
    producer: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> PrefetchStream<T> {
    fn spawn<S: ElementStream<Item = T>>(mut input: S, buffer: usize) -> Result<Self, DataError> {
        let (sender, queue) = sync_channel(buffer);
        let producer = thread::Builder::new()
            .name("lockstep-prefetch".into())
            .spawn(move || {
                while let Some(item) = input.next_element() {
                    if sender.send(item).is_err() {
                        return; // the consumer is gone
                    }
                }
            })
            .map_err(|e| DataError::io("<prefetch thread>", e))?;
        Ok(Self {
            queue: Some(queue),
            producer: Some(producer),
        })
    }
}

impl<T: Send + 'static> ElementStream for PrefetchStream<T> {
    type Item = T;

    fn next_element(&mut self) -> Option<Result<T, DataError>> {
        if let Ok(item) = self.queue.as_ref()?.recv() {
            return Some(item);
        }
        // The producer is done: normally at the end of the pass, but a panic in a user
        // closure also lands here, and must not pass for a normal end.
        self.queue = None;
        match self.producer.take()?.join() {
            Ok(()) => None,
            Err(_) => Some(Err(DataError::invalid(
                "prefetch",
                "a pipeline stage panicked on the prefetch thread",
            ))),
        }
    }
}

impl<T> Drop for PrefetchStream<T> {
    fn drop(&mut self) {
        // Closing the queue stops the producer at its next send; waiting for it bounds its
        // life to this stream's, so no thread outlives the pipeline.
        self.queue = None;
        if let Some(producer) = self.producer.take() {
            let _ = producer.join();
        }
    }
}
