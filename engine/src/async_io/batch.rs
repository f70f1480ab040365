//! Batched async calls: one call per batch of inputs (Flink's `AsyncBatchFunction`), for
//! batch APIs (`MGET`, multi-row queries, model inference).
//!
//! [`Batched`] turns an [`AsyncBatchFunction`] into an [`AsyncFunction`] for the one
//! [`AsyncWaitOperator`](super::AsyncWaitOperator): each record is an entry of the
//! operator as before (so capacity counts records, results leave in the operator's
//! mode with watermarks fencing them, each record has its timeout and retries, and a
//! snapshot holds buffered and in-flight records alike, as records), and the adapter
//! collects the records' calls into a batch, cut:
//! - at `max_batch_size` records;
//! - `batch_timeout` after the batch's first record (the operator's timers call it back
//!   at that deadline: [`AsyncFunction::pending_deadline`]); with a timeout of 0, at the
//!   operator's next timer pass: on a worker, the end of the task's turn;
//! - when a watermark arrives (the records before it go now, so that the watermark is
//!   not held back a batch timeout);
//! - when the operator is full (nothing else could free a slot before the timeout);
//! - at end of input.
//!
//! The batch function gets the inputs and a [`BatchResult`], which completes every
//! record's handle: with one result list per input, in input order, or with one error
//! for all, or record by record ([`BatchResult::into_handles`], for partial results).
//! Results map back to their inputs by position; a batch answered with the wrong
//! number of result lists fails each of its records with an error that says so.
//!
//! Timeouts and retries are the operator's, per record: a record's timeout runs from
//! when it joined its batch, so a batch that never completes times out record by record
//! (the first record's first, all within `batch_timeout` of each other), and a retried
//! record joins the batch being collected then.
//!
//! Invariants: the buffer holds at most `max_batch_size - 1` records between calls
//! (the record that fills it cuts it); `first_ns` is set exactly when the buffer is not
//! empty.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{AsyncError, AsyncFunction, ResultFuture};
use crate::error::ConfigError;

/// The user's batched call.
pub trait AsyncBatchFunction: 'static {
    /// Input records (cloned into the batch: the operator keeps each input for its
    /// retries and snapshots).
    type In: Clone + 'static;
    /// Results; several (or none) may come back per input.
    type Out: Send + 'static;

    /// Starts one call for `inputs` (in input order; at least one); `result` completes
    /// them, now or later, on this thread or another.
    fn invoke_batch(&mut self, inputs: &[Self::In], result: BatchResult<Self::Out>);

    /// An answer known without a call, as [`AsyncFunction::ready`]'s: `Some(result)`
    /// stands for a batch call that completed the input with that one result, and the
    /// record never joins a batch. [`Batched`] forwards it; the operator asks only where
    /// the record may leave at once (see [`AsyncFunction::ready`]), and otherwise the
    /// input joins a batch, so an answer given here must be the one the batch call
    /// would give. The default (`None`) batches every input.
    #[inline(always)]
    fn ready(&mut self, input: &Self::In) -> Option<Self::Out> {
        let _ = input;
        None
    }

    /// Called for a record whose timeout passed before its batch's call completed it
    /// (measured from when it joined its batch, across retries): its completion decides
    /// the record, as [`AsyncFunction::timeout`]'s. The default fails with
    /// [`AsyncError::Timeout`].
    fn timeout(&mut self, input: &Self::In, result: ResultFuture<Self::Out>) {
        let _ = input;
        result.complete_err(AsyncError::Timeout);
    }

    /// The key of `input` for keyed-ordered output.
    fn key(&self, input: &Self::In) -> u64 {
        let _ = input;
        0
    }

    /// Called once before the first record.
    fn open(&mut self) {}

    /// Called once after the last element was emitted.
    fn close(&mut self) {}
}

/// When a batch is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchConfig {
    /// Records per batch at most (at least 1).
    pub max_batch_size: usize,
    /// The longest a batch's first record waits for the batch to fill. Zero: the batch
    /// is cut at the operator's next timer pass, which on a runtime worker is the end
    /// of the task's turn: a batch is what the task took in at once, and no record
    /// waits for one (a thread-per-core engine's natural batch, as a client coalescing
    /// each turn's requests).
    pub batch_timeout: Duration,
}

impl BatchConfig {
    /// Batches of up to `max_batch_size` records, cut `batch_timeout` after their first.
    pub fn new(max_batch_size: usize, batch_timeout: Duration) -> Self {
        BatchConfig {
            max_batch_size,
            batch_timeout,
        }
    }

    /// Checks the settings; the error says what to fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_batch_size == 0 {
            return Err(ConfigError::Inconsistent(
                "max_batch_size is 0: a batch holds at least one record",
            ));
        }
        Ok(())
    }
}

/// Batch figures, shared with whoever reads them (e.g. a metrics endpoint): every
/// field is a counter or a sum, added to by the operator's thread and, for completions,
/// by whichever thread completes a batch.
#[derive(Debug, Default)]
pub struct BatchMetrics {
    /// Batches called.
    pub batches: AtomicU64,
    /// Records in them (÷ `batches`: the mean batch size).
    pub records: AtomicU64,
    /// Batches cut full, by their timeout, by a watermark or a full operator or the end
    /// of input ("forced").
    pub cut_full: AtomicU64,
    /// See [`cut_full`](Self::cut_full).
    pub cut_timeout: AtomicU64,
    /// See [`cut_full`](Self::cut_full).
    pub cut_forced: AtomicU64,
    /// Nanoseconds from each batch's first record to its call, summed.
    pub wait_ns: AtomicU64,
    /// Batches completed (their [`BatchResult`] used or dropped).
    pub completed: AtomicU64,
    /// Nanoseconds from each batch's call to its completion, summed (by the wall clock).
    pub call_ns: AtomicU64,
    /// Sizes: how many batches had `2^i ..= 2^(i+1) - 1` records (bucket `i`).
    pub size_buckets: [AtomicU64; 16],
}

impl BatchMetrics {
    /// Batches called and not yet completed.
    pub fn in_flight(&self) -> u64 {
        self.batches
            .load(Ordering::Relaxed)
            .saturating_sub(self.completed.load(Ordering::Relaxed))
    }

    /// Mean records per batch.
    pub fn mean_size(&self) -> f64 {
        self.records.load(Ordering::Relaxed) as f64
            / self.batches.load(Ordering::Relaxed).max(1) as f64
    }

    fn note_size(&self, size: usize) {
        let bucket = (usize::BITS - 1 - size.max(1).leading_zeros()) as usize;
        self.size_buckets[bucket.min(15)].fetch_add(1, Ordering::Relaxed);
    }
}

/// Completes the records of one batch; see the module docs. Dropping it unused fails
/// every record with [`AsyncError::Dropped`].
pub struct BatchResult<T> {
    handles: Vec<ResultFuture<T>>,
    metrics: Arc<BatchMetrics>,
    called: std::time::Instant,
}

impl<T> BatchResult<T> {
    /// Records in the batch.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Whether the batch is empty (never, for a batch the adapter calls).
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// One result list per input, in input order. Another number of lists fails every
    /// record with an error naming both counts.
    pub fn complete<R: IntoIterator<Item = T>>(mut self, results: Vec<R>) {
        let handles = std::mem::take(&mut self.handles);
        if results.len() != handles.len() {
            let message = format!(
                "the batch function answered {} result lists for {} inputs: give one per input, \
                 in input order",
                results.len(),
                handles.len()
            );
            for handle in handles {
                handle.complete_err(AsyncError::call(message.clone()));
            }
            return;
        }
        for (handle, result) in handles.into_iter().zip(results) {
            handle.complete(result);
        }
    }

    /// Fails every record with `error` (each gets its own copy: a timeout stays a
    /// timeout, anything else its message).
    pub fn complete_err(mut self, error: AsyncError) {
        for handle in std::mem::take(&mut self.handles) {
            handle.complete_err(duplicate(&error));
        }
    }

    /// The records' handles, in input order, to complete one by one (partial results:
    /// some answered, others failed, and so retried if a retry applies).
    pub fn into_handles(mut self) -> Vec<ResultFuture<T>> {
        std::mem::take(&mut self.handles)
    }
}

impl<T> Drop for BatchResult<T> {
    fn drop(&mut self) {
        // Dropping the handles fails them with `Dropped` (ResultFuture's rule).
        self.handles.clear();
        self.metrics.completed.fetch_add(1, Ordering::Relaxed);
        self.metrics.call_ns.fetch_add(
            self.called.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64,
            Ordering::Relaxed,
        );
    }
}

fn duplicate(error: &AsyncError) -> AsyncError {
    match error {
        AsyncError::Timeout => AsyncError::Timeout,
        AsyncError::Dropped => AsyncError::Dropped,
        other => AsyncError::call(other.to_string()),
    }
}

/// An [`AsyncBatchFunction`] as the operator's [`AsyncFunction`]: collects its
/// records' calls into batches; see the module docs.
pub struct Batched<F: AsyncBatchFunction> {
    config: BatchConfig,
    inner: F,
    max_batch_size: usize,
    batch_timeout_ns: u64,
    inputs: Vec<F::In>,
    handles: Vec<ResultFuture<F::Out>>,
    /// When the buffered batch's first record came (`None`: the buffer is empty).
    first_ns: Option<u64>,
    /// The operator's clock at its last call into this adapter.
    now_ns: u64,
    metrics: Arc<BatchMetrics>,
}

impl<F: AsyncBatchFunction> Batched<F> {
    /// `inner` called once per batch cut as `config` says. The operator built over it
    /// checks `config` ([`BatchConfig::validate`]) and refuses an invalid one.
    pub fn new(inner: F, config: BatchConfig) -> Self {
        Batched {
            config,
            inner,
            max_batch_size: config.max_batch_size.max(1),
            batch_timeout_ns: config
                .batch_timeout
                .as_nanos()
                .min(u128::from(u64::MAX / 2)) as u64,
            inputs: Vec::with_capacity(config.max_batch_size.min(4096)),
            handles: Vec::with_capacity(config.max_batch_size.min(4096)),
            first_ns: None,
            now_ns: 0,
            metrics: Arc::default(),
        }
    }

    /// The batch figures (shared: clone the `Arc` for a reader on another thread).
    pub fn metrics(&self) -> &Arc<BatchMetrics> {
        &self.metrics
    }

    /// The user's function.
    pub fn inner(&self) -> &F {
        &self.inner
    }

    /// Records buffered, waiting for their batch to be cut.
    pub fn buffered(&self) -> usize {
        self.inputs.len()
    }

    /// Calls the batch function with what is buffered.
    /// `reason`: the counter of why it is cut.
    fn cut(&mut self, now_ns: u64, reason: fn(&BatchMetrics) -> &AtomicU64) {
        let Some(first_ns) = self.first_ns.take() else {
            return;
        };
        let size = self.inputs.len();
        let m = &self.metrics;
        m.batches.fetch_add(1, Ordering::Relaxed);
        m.records.fetch_add(size as u64, Ordering::Relaxed);
        m.wait_ns
            .fetch_add(now_ns.saturating_sub(first_ns), Ordering::Relaxed);
        reason(m).fetch_add(1, Ordering::Relaxed);
        m.note_size(size);
        let result = BatchResult {
            handles: std::mem::replace(
                &mut self.handles,
                Vec::with_capacity(self.max_batch_size.min(4096)),
            ),
            metrics: Arc::clone(&self.metrics),
            called: std::time::Instant::now(),
        };
        self.inner.invoke_batch(&self.inputs, result);
        self.inputs.clear();
    }
}

impl<F: AsyncBatchFunction> AsyncFunction for Batched<F> {
    type In = F::In;
    type Out = F::Out;

    const BUFFERS: bool = true;

    #[inline(always)]
    fn ready(&mut self, input: &F::In) -> Option<F::Out> {
        self.inner.ready(input)
    }

    fn invoke(&mut self, input: &F::In, result: ResultFuture<F::Out>) {
        let now_ns = self.now_ns;
        self.invoke_at(input, result, now_ns);
    }

    fn invoke_at(&mut self, input: &F::In, result: ResultFuture<F::Out>, now_ns: u64) {
        self.now_ns = now_ns;
        self.inputs.push(input.clone());
        self.handles.push(result);
        self.first_ns.get_or_insert(now_ns);
        if self.inputs.len() >= self.max_batch_size {
            self.cut(now_ns, |m| &m.cut_full);
        }
    }

    fn pending_deadline(&self) -> Option<u64> {
        self.first_ns
            .map(|first| first.saturating_add(self.batch_timeout_ns))
    }

    fn flush_pending(&mut self, now_ns: u64, force: bool) {
        self.now_ns = now_ns;
        let Some(deadline) = self.pending_deadline() else {
            return;
        };
        if force {
            self.cut(now_ns, |m| &m.cut_forced);
        } else if now_ns >= deadline {
            self.cut(now_ns, |m| &m.cut_timeout);
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.config.validate()
    }

    fn timeout(&mut self, input: &F::In, result: ResultFuture<F::Out>) {
        self.inner.timeout(input, result);
    }

    fn key(&self, input: &F::In) -> u64 {
        self.inner.key(input)
    }

    fn open(&mut self) {
        self.inner.open();
    }

    fn close(&mut self) {
        self.inner.close();
    }
}
