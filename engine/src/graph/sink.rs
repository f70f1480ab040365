//! Sinks: where a graph's records end.
//!
//! A [`Sink`] gets every record of its subtask with its timestamp, every watermark, and
//! the end of its input. The built-in ones: [`Collected`] (every element, per subtask,
//! for tests) and [`Counted`] (a count and, optionally, an HDR histogram of latency).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use hdrhistogram::Histogram;

use std::path::PathBuf;

use crate::checkpoint::TransactionalFiles;
use crate::element::{Record, StreamElement};
use crate::runtime::TaskError;

use super::LiveCounters;

/// A user sink: one instance per subtask, built on its worker's thread.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use weir_engine::graph::{Graph, Sink, SubtaskInfo};
/// use weir_engine::runtime::{Cores, Runtime, TaskError};
///
/// /// Sums what it gets, refuses zero, and adds its sum to a shared total at the end.
/// struct Sum { sum: u64, total: Arc<AtomicU64> }
///
/// impl Sink<u64> for Sum {
///     fn invoke(&mut self, n: u64, _ts: Option<i64>, _now_ns: u64) -> Result<(), TaskError> {
///         if n == 0 {
///             return Err("a zero reached the sink".into());
///         }
///         self.sum += n;
///         Ok(())
///     }
///     fn finish(&mut self) -> Result<(), TaskError> {
///         self.total.fetch_add(self.sum, Ordering::Relaxed);
///         Ok(())
///     }
/// }
///
/// let total = Arc::new(AtomicU64::new(0));
/// let shared = Arc::clone(&total);
/// let graph = Graph::new().with_parallelism(2);
/// graph
///     .from_generator(100, None, |n| n + 1)
///     .rebalance()
///     .sink(move |_: &SubtaskInfo| Sum { sum: 0, total: Arc::clone(&shared) });
/// graph.execute(Runtime::builder().cores(Cores::Count(2)).pin(false).build()?)?;
/// assert_eq!(total.load(Ordering::Relaxed), 5050);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Sink<T>: 'static {
    /// Takes one record; `now_ns` is the run's clock. An error fails the job.
    fn invoke(&mut self, value: T, timestamp: Option<i64>, now_ns: u64) -> Result<(), TaskError>;
    /// The batch form of [`invoke`](Self::invoke): a run of records, in order, at most
    /// [`room`](Self::room) of them (a `flat_map` just before the sink may add to a run,
    /// as it may push past `accepts` one record at a time). The default invokes each
    /// record; a sink that writes in batches (one request for the run, one buffer
    /// append) takes the run here instead.
    fn invoke_batch(
        &mut self,
        records: std::vec::Drain<'_, Record<T>>,
        now_ns: u64,
    ) -> Result<(), TaskError> {
        for record in records {
            self.invoke(record.value, record.timestamp, now_ns)?;
        }
        Ok(())
    }
    /// The input's watermark advanced.
    fn on_watermark(&mut self, watermark: i64) -> Result<(), TaskError> {
        let _ = watermark;
        Ok(())
    }
    /// The input ended; called once, after the last record.
    fn finish(&mut self) -> Result<(), TaskError> {
        Ok(())
    }
    /// Whether it takes another record now. `false` holds its input back
    /// (back-pressure: the task reads no more, and its upstream fills) until a later
    /// poll, e.g. while a sink that writes over the network has its limit of writes
    /// unanswered. The default: always.
    fn accepts(&mut self) -> bool {
        true
    }
    /// How many records it takes now: the longest run its task hands it (0 holds its
    /// input back, as `accepts` returning `false` does). The default: any number while
    /// it [`accepts`](Self::accepts). A sink that bounds its input (a limit of writes
    /// unanswered) says here how many more it takes, so a run never goes past the bound.
    fn room(&mut self) -> usize {
        if self.accepts() {
            usize::MAX
        } else {
            0
        }
    }
    /// Called each time its task is polled (a driver event for the sink's I/O polls
    /// it): moves its own work along; whether anything moved.
    fn poll(&mut self, now_ns: u64) -> Result<bool, TaskError> {
        let _ = now_ns;
        Ok(false)
    }
    /// Whether everything it was given (and committed) is written: its task ends only
    /// once it is, after [`finish`](Self::finish) and after the final commit. The
    /// default: always.
    fn flushed(&mut self) -> bool {
        true
    }
    /// Checkpoint `checkpoint`'s barrier arrived (every record before it was given to
    /// [`invoke`](Self::invoke)): an exactly-once sink pre-commits what it wrote since the
    /// last barrier and returns the state a restore needs (Flink's
    /// `TwoPhaseCommitSinkFunction.preCommit` and `snapshotState`). Also called once
    /// after [`finish`](Self::finish), for the output since the last barrier; the task
    /// then waits for a checkpoint to complete before it ends. `None` (the default): the
    /// sink keeps nothing.
    fn snapshot_state(&mut self, checkpoint: u64) -> Result<Option<Vec<u8>>, TaskError> {
        let _ = checkpoint;
        Ok(None)
    }
    /// Checkpoint `checkpoint` completed: commit what was pre-committed for it and for
    /// every one before it. May come twice, or after a restore: committing again must
    /// change nothing.
    fn notify_checkpoint_complete(&mut self, checkpoint: u64) -> Result<(), TaskError> {
        let _ = checkpoint;
        Ok(())
    }
    /// Called before the first record of a restored job with the state
    /// [`snapshot_state`](Self::snapshot_state) returned at the checkpoint restored:
    /// what it pre-committed is committed (the checkpoint completed), the rest dropped.
    fn restore_state(&mut self, state: &[u8]) -> Result<(), TaskError> {
        let _ = state;
        Ok(())
    }
}

/// Exactly-once part files (Flink's `FileSink` in streaming mode): each record is
/// written by the format function into the subtask's part file in progress, which is
/// pre-committed (flushed, fsync'd, renamed pending) at each checkpoint barrier and
/// committed (renamed into place) when that checkpoint completes; see
/// [`TransactionalFiles`] for the file names and what a restore does. Without
/// checkpoints, the files are committed at the end of a successful run.
pub struct FileSink<F> {
    dir: PathBuf,
    subtask: usize,
    checkpointing: bool,
    /// Opened at the first use, or by the restore (which must see the files first).
    files: Option<TransactionalFiles>,
    format: F,
    scratch: Vec<u8>,
}

impl<F> FileSink<F> {
    /// Subtask `subtask`'s part files under `dir`; `checkpointing`: whether the job
    /// checkpoints ([`SubtaskInfo::checkpointing`](super::SubtaskInfo::checkpointing)).
    pub fn new(dir: impl Into<PathBuf>, subtask: usize, checkpointing: bool, format: F) -> Self {
        FileSink {
            dir: dir.into(),
            subtask,
            checkpointing,
            files: None,
            format,
            scratch: Vec::new(),
        }
    }

    fn files(&mut self) -> Result<&mut TransactionalFiles, TaskError> {
        if self.files.is_none() {
            self.files = Some(TransactionalFiles::new(&self.dir, self.subtask)?);
        }
        Ok(self.files.as_mut().expect("opened"))
    }
}

impl<T, F: FnMut(&T, &mut Vec<u8>) + 'static> Sink<T> for FileSink<F> {
    fn invoke(&mut self, value: T, _timestamp: Option<i64>, _now_ns: u64) -> Result<(), TaskError> {
        self.scratch.clear();
        (self.format)(&value, &mut self.scratch);
        let line = std::mem::take(&mut self.scratch);
        let written = self.files()?.write(&line);
        self.scratch = line;
        Ok(written?)
    }

    fn finish(&mut self) -> Result<(), TaskError> {
        if !self.checkpointing {
            let files = self.files()?;
            files.pre_commit(0)?;
            files.commit(u64::MAX)?;
        }
        Ok(())
    }

    fn snapshot_state(&mut self, checkpoint: u64) -> Result<Option<Vec<u8>>, TaskError> {
        Ok(Some(self.files()?.pre_commit(checkpoint)?))
    }

    fn notify_checkpoint_complete(&mut self, checkpoint: u64) -> Result<(), TaskError> {
        Ok(self.files()?.commit(checkpoint)?)
    }

    fn restore_state(&mut self, state: &[u8]) -> Result<(), TaskError> {
        self.files = Some(TransactionalFiles::restore(
            &self.dir,
            self.subtask,
            Some(state),
        )?);
        Ok(())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// What collecting sinks received: every element of each subtask, in order.
pub struct Collected<T> {
    shared: Arc<Mutex<Vec<Vec<StreamElement<T>>>>>,
}

impl<T> Clone for Collected<T> {
    fn clone(&self) -> Self {
        Collected {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T> Default for Collected<T> {
    fn default() -> Self {
        Collected {
            shared: Arc::new(Mutex::new(Vec::new())),
        }
    }
}

impl<T> Collected<T> {
    /// Every record received, all subtasks together (subtask by subtask).
    pub fn records(&self) -> Vec<T>
    where
        T: Clone,
    {
        lock(&self.shared)
            .iter()
            .flatten()
            .filter_map(|e| e.as_record().map(|r| r.value.clone()))
            .collect()
    }

    /// Each subtask's elements (records and watermarks) in the order it received them.
    pub fn by_subtask(&self) -> Vec<Vec<StreamElement<T>>>
    where
        T: Clone,
    {
        lock(&self.shared).clone()
    }

    pub(crate) fn sink(&self, index: usize, parallelism: usize) -> CollectSink<T> {
        let mut shared = lock(&self.shared);
        if shared.len() < parallelism {
            shared.resize_with(parallelism, Vec::new);
        }
        CollectSink {
            index,
            local: Vec::new(),
            shared: Arc::clone(&self.shared),
        }
    }
}

pub(crate) struct CollectSink<T> {
    index: usize,
    local: Vec<StreamElement<T>>,
    shared: Arc<Mutex<Vec<Vec<StreamElement<T>>>>>,
}

impl<T> CollectSink<T> {
    fn publish(&mut self) {
        if !self.local.is_empty() {
            let local = std::mem::take(&mut self.local);
            lock(&self.shared)[self.index].extend(local);
        }
    }
}

impl<T> Drop for CollectSink<T> {
    fn drop(&mut self) {
        self.publish();
    }
}

impl<T: 'static> Sink<T> for CollectSink<T> {
    fn invoke(&mut self, value: T, timestamp: Option<i64>, _now_ns: u64) -> Result<(), TaskError> {
        self.local.push(StreamElement::record(value, timestamp));
        Ok(())
    }
    fn on_watermark(&mut self, watermark: i64) -> Result<(), TaskError> {
        self.local.push(StreamElement::watermark(watermark));
        Ok(())
    }
    fn finish(&mut self) -> Result<(), TaskError> {
        self.publish();
        Ok(())
    }
}

/// Latency is recorded from 1 ns to a minute, 3 significant digits.
const LATENCY_MAX_NS: u64 = 60_000_000_000;

/// A histogram for latencies in nanoseconds (1 ns to a minute, 3 significant digits).
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_NS, 3).expect("static bounds are valid")
}

struct CountState {
    records: u64,
    latency: Histogram<u64>,
}

/// What counting sinks received: how many records, and their latency if asked.
#[derive(Clone)]
pub struct Counted {
    shared: Arc<Mutex<CountState>>,
}

impl Default for Counted {
    fn default() -> Self {
        Counted {
            shared: Arc::new(Mutex::new(CountState {
                records: 0,
                latency: latency_histogram(),
            })),
        }
    }
}

impl Counted {
    /// Records received by every subtask together.
    pub fn records(&self) -> u64 {
        lock(&self.shared).records
    }

    /// Latency from each record's creation (by the run's clock) to its sink, ns.
    pub fn latency(&self) -> Histogram<u64> {
        lock(&self.shared).latency.clone()
    }
}

/// The creation time of a record by the run's clock, for latency.
pub(crate) type CreatedFn<T> = Arc<dyn Fn(&T) -> u64 + Send + Sync>;

pub(crate) struct CountSink<T> {
    pub(crate) created: Option<CreatedFn<T>>,
    pub(crate) records: u64,
    pub(crate) reported: u64,
    pub(crate) latency: Histogram<u64>,
    pub(crate) shared: Counted,
    pub(crate) live: Arc<LiveCounters>,
    pub(crate) published: bool,
}

impl<T> CountSink<T> {
    pub(crate) fn new(
        shared: Counted,
        created: Option<CreatedFn<T>>,
        live: Arc<LiveCounters>,
    ) -> Self {
        CountSink {
            created,
            records: 0,
            reported: 0,
            latency: latency_histogram(),
            shared,
            live,
            published: false,
        }
    }

    fn report_live(&mut self) {
        self.live
            .received
            .fetch_add(self.records - self.reported, Ordering::Relaxed);
        self.reported = self.records;
    }

    fn publish(&mut self) {
        if std::mem::replace(&mut self.published, true) {
            return;
        }
        self.report_live();
        let mut shared = lock(&self.shared.shared);
        shared.records += self.records;
        // Same bounds on both sides: adding cannot fail.
        let _ = shared.latency.add(&self.latency);
    }
}

impl<T> Drop for CountSink<T> {
    fn drop(&mut self) {
        self.publish();
    }
}

impl<T: 'static> Sink<T> for CountSink<T> {
    #[inline]
    fn invoke(&mut self, value: T, _timestamp: Option<i64>, now_ns: u64) -> Result<(), TaskError> {
        self.records += 1;
        if let Some(created) = &self.created {
            self.latency
                .saturating_record(now_ns.saturating_sub(created(&value)).max(1));
        }
        if self.records - self.reported >= 1024 {
            self.report_live();
        }
        Ok(())
    }
    fn finish(&mut self) -> Result<(), TaskError> {
        self.publish();
        Ok(())
    }
}
