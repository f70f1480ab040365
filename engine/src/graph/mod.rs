//! Job graphs: a user's pipeline, from sources through chained operators and
//! exchanges to sinks, run on the thread-per-core [`Runtime`].
//!
//! The shape is Flink's DataStream API. A [`Graph`] holds the stages; a [`Stream`] is
//! the output of the operators chained so far. `map`, `filter`, `flat_map` and
//! `async_wait` chain onto the current stage: they run in the same task, on the same
//! thread, as Flink chains operators. An exchange (`forward`,
//! `rebalance`, `rescale`, `key_by`, `broadcast`, `global`, `partition_custom`)
//! ends the stage in a record writer and starts a new one behind an input gate; its
//! records cross threads through the exchange's buffers (see
//! [`exchange`](crate::exchange)) with their timestamps. A sink ends the stream.
//!
//! Every stage has a parallelism (the graph's default unless set), and each of its
//! subtasks runs on one worker: by default stage after stage on consecutive workers
//! (subtask `i` of the `k`-th stage on worker `(p₀ + … + pₖ₋₁ + i) mod workers`), or
//! where [`Stream::place`] says. Watermarks flow end to end: sources emit them, every
//! operator forwards them (the async operator in order with its records, as Flink's),
//! a gate emits the minimum over its channels, and a bounded source's end emits the
//! final watermark `i64::MAX`.
//!
//! Records move in runs. A task takes its input a run at a time (up to 256 records
//! per turn): a source fills a run ([`Source::poll_batch`]),
//! an input gate decodes the records lying whole in one buffer in one pass
//! ([`InputGate::poll_run_at`](crate::exchange::InputGate::poll_run_at)), `map` and
//! `filter` work through the run in a loop, a record writer selects the channels of the
//! whole run and then encodes each stretch bound for one channel into its buffer with
//! the buffer's bookkeeping once
//! ([`RecordWriter::emit_run`](crate::exchange::RecordWriter::emit_run)), and a sink
//! takes the run ([`Sink::invoke_batch`]). The semantics are
//! the per-record ones: a watermark, barrier or end of input ends a run, so everything
//! keeps its position; back-pressure is checked once per run, and a run is never larger
//! than what the chain has room for (an async operator's free capacity, a sink's
//! [`Sink::room`]); a checkpointed task shrinks the runs it takes from its gate to about
//! 100 µs of its chain's work, so that barriers announced ahead of the data are acted on
//! within about that time. Which form to write: the per-record
//! methods (`Source::poll_next`, `Sink::invoke`) are what a source or sink must have,
//! and the batch forms default to calling them; implement the batch form too when the
//! work has a cheaper way for many records at once (a fetched batch handed over in
//! one go, one request or one buffer append for a run). An async stage takes its input
//! in runs of up to its free capacity
//! ([`AsyncWaitOperator::process_run`](crate::async_io::AsyncWaitOperator::process_run));
//! its function is still called per record, and gives the answers it knows without a
//! call in [`AsyncFunction::ready`].
//!
//! Nothing starts before the whole graph is checked: [`Graph::plan`] and
//! [`Graph::execute`] refuse a graph that cannot run with a [`GraphError`] naming the
//! stage and what to change. A graph built with this API is acyclic by construction:
//! each exchange starts a new stage fed by an existing one, and a stream is consumed
//! once.
//!
//! ```
//! use weir_engine::graph::{Graph, SubtaskInfo};
//! use weir_engine::runtime::{Cores, Runtime};
//!
//! // Word lengths, keyed by length: two stages of two subtasks each.
//! let graph = Graph::new().with_parallelism(2);
//! let lines = ["to be or not to be", "that is the question"];
//! let out = graph
//!     .from_iter(move |subtask: &SubtaskInfo| lines.into_iter().skip(subtask.index).step_by(2))
//!     .flat_map(|line: &str| line.split(' ').map(|w| w.len() as u64).collect::<Vec<_>>())
//!     .filter(|len| *len > 1)
//!     .key_by(|len: &u64| *len)
//!     .map(|len| len * 10)
//!     .collect();
//! let runtime = Runtime::builder().cores(Cores::Count(2)).pin(false).build()?;
//! graph.execute(runtime)?;
//! let mut lengths = out.records();
//! lengths.sort();
//! assert_eq!(lengths, [20, 20, 20, 20, 20, 20, 30, 30, 40, 80]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod chain;
mod checkpointing;
pub mod cluster;
pub mod keys;
pub mod metrics;
pub mod partition;
pub mod sink;
pub mod source;

use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::collections::VecDeque;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::rc::Rc;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::async_io::futures::{FutureFunction, LocalExecutor};
use crate::async_io::{AsyncConfig, AsyncError, AsyncFunction, AsyncMetrics, AsyncWaitOperator};
use crate::element::Record;
use crate::error::ConfigError;
use crate::exchange::codec::Codec;
use crate::exchange::{
    local_channel, DebloatConfig, InputChannel, InputGate, LocalBufferPool, LocalPoolConfig,
    NetworkBufferPool, RecordWriter, ResultPartition, WriterConfig,
};
use crate::park::Unparker;
use crate::runtime::{
    signal, Controller, Driver, DriverEvent, RunReport, Running, Runtime, RuntimeError, Task,
    TaskError, TaskId,
};

use crate::checkpoint::elements::decode_elements;
use crate::checkpoint::{
    CheckpointError, CheckpointService, CheckpointStore, KeyedState, ServicePart,
};
use chain::{
    AsyncLink, CheckpointSignals, FilterLink, FlatMapLink, KeyedMapLink, Link, MapLink, SinkLink,
    StageInput, StageTask, TaskCheckpoint, WriterLink, CHANNEL_SECTION, SOURCE_SECTION,
};
use checkpointing::{task_file_name, GraphHooks, RestorePlan};
pub use checkpointing::{CheckpointListener, CheckpointReport, Checkpointing, RestoredFrom};
pub use cluster::{Cluster, RemoteChannels};
pub use keys::KeyHashCode;
pub use metrics::{TaskMetrics, TaskRates, TaskSample};
pub use partition::{Partitioner, Partitioning};
use partition::{Route, Selector};
pub use sink::{latency_histogram, Collected, Counted, FileSink, Sink};
pub use source::{Generator, IterSource, Source, SourceEvent, SourceFailed};

/// Hooks an async function's I/O (e.g. a lookup client's connections) into its
/// worker's driver; the task calls it each turn.
pub trait IoHandler {
    /// Hands queued requests to the driver; `now_ns` drives request expiry.
    fn flush(&mut self, driver: &mut dyn Driver, now_ns: u64);
    /// Takes an event if it is for one of this handler's connections.
    fn on_event(&mut self, event: &DriverEvent<'_>) -> bool;
    /// When the handler next needs a flush even without I/O (a reconnection attempt, a
    /// timeout), by the run's clock.
    fn next_deadline(&self) -> Option<u64> {
        None
    }
}

/// Which subtask a user function, source or sink is built for (on its worker's
/// thread).
#[derive(Debug, Clone)]
pub struct SubtaskInfo {
    /// The stage's name.
    pub stage: String,
    /// The subtask's index in `0..parallelism`.
    pub index: usize,
    /// The stage's parallelism.
    pub parallelism: usize,
    /// The worker it runs on.
    pub worker: usize,
    /// Wakes this subtask's task (rings its doorbell, so its worker polls it), e.g.
    /// when another thread completes a call or feeds a source.
    pub unparker: Unparker,
    /// Whether the job checkpoints (a sink that commits at checkpoints commits at its
    /// end otherwise).
    pub checkpointing: bool,
}

/// Live counters of a running graph, for a progress display.
#[derive(Debug, Default)]
pub struct LiveCounters {
    /// Records the sources emitted.
    pub generated: AtomicU64,
    /// Records the counting sinks received.
    pub received: AtomicU64,
    /// Elements in the async operators.
    pub in_flight: AtomicU64,
    /// Each task's live figures, when [`enable_task_metrics`](Self::enable_task_metrics)
    /// was called before the graph started.
    tasks: Mutex<Vec<Arc<TaskMetrics>>>,
    task_metrics: std::sync::atomic::AtomicBool,
}

impl LiveCounters {
    /// Makes every task of a graph started with these counters keep its live figures
    /// ([`TaskMetrics`]; a clock read per poll), e.g. for a metrics endpoint.
    pub fn enable_task_metrics(&self) {
        self.task_metrics
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The tasks' live figures, in the order they were built (empty unless enabled).
    pub fn tasks(&self) -> Vec<Arc<TaskMetrics>> {
        lock(&self.tasks).clone()
    }

    fn register(&self, info: &SubtaskInfo) -> Option<Arc<TaskMetrics>> {
        if !self.task_metrics.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let metrics = Arc::new(TaskMetrics::new(&info.stage, info.index, info.parallelism));
        lock(&self.tasks).push(Arc::clone(&metrics));
        Some(metrics)
    }
}

/// Exchange settings, for every exchange of a graph. The buffer budget is Flink's, by
/// channel: a partition of `n` subpartitions has `buffers_per_channel × n +
/// floating_buffers` segments (`taskmanager.network.memory.buffers-per-channel`, 2, and
/// `floating-buffers-per-gate`, 8), of which one subpartition may hold at most
/// `max_buffers_per_channel` (`max-buffers-per-channel`, 10), plus the overdraft (5)
/// for a record that spans buffers. A local channel's consumer reads the producer's
/// segments in place, so these are also the bytes in flight on a channel: at most
/// `max_buffers_per_channel` segments, which an aligned barrier waits behind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExchangeSpec {
    /// Bytes per segment (Flink's `taskmanager.memory.segment-size`, 32 KiB).
    pub segment_size: usize,
    /// Segments per subpartition in a partition's pool (Flink's exclusive buffers per
    /// channel, 2).
    pub buffers_per_channel: usize,
    /// Segments a partition's pool has beyond those, shared by its subpartitions
    /// (Flink's floating buffers per gate, 8).
    pub floating_buffers: usize,
    /// Segments one subpartition may hold at most (Flink's max buffers per channel,
    /// 10): what one slow consumer can keep in flight.
    pub max_buffers_per_channel: usize,
    /// Buffer timeout: `Some(0)` flushes after every record, `None` only when full.
    pub buffer_timeout: Option<Duration>,
    /// Buffer debloating at every input gate (`None`: off). Its `buffers_per_channel`
    /// is replaced by the buffers a partition may hold per channel.
    pub debloat: Option<DebloatConfig>,
}

impl Default for ExchangeSpec {
    fn default() -> Self {
        ExchangeSpec {
            segment_size: 32 * 1024,
            buffers_per_channel: 2,
            floating_buffers: 8,
            max_buffers_per_channel: 10,
            buffer_timeout: Some(Duration::from_millis(1)),
            debloat: None,
        }
    }
}

/// Smallest segment an exchange shrinks its segments to when a partition fans out to
/// many subtasks (see [`ExchangeSpec::sizing`]).
pub const FAN_OUT_SEGMENT_MIN: usize = 1024;

/// Bytes of a partition's pool beyond which its segments shrink rather than grow in
/// number (2 MiB: 64 segments of 32 KiB, Flink's budget at a fan-out of 28).
pub const FAN_OUT_BUDGET_BYTES: usize = 2 * 1024 * 1024;

/// Bytes of one buffer slot in a channel's ring.
const CHANNEL_SLOT_BYTES: usize = std::mem::size_of::<crate::exchange::SharedBuffer>();
/// Bytes of a channel besides its slots: the ring's two cache-padded indices, its
/// flags and both ends.
const CHANNEL_FIXED_BYTES: usize = 512;

/// How an exchange is sized for a number of upstream and downstream subtasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExchangeSizing {
    /// Bytes per segment.
    pub segment_size: usize,
    /// Segments each upstream subtask's partition reserves (at least one per channel,
    /// plus one).
    pub segments_per_partition: usize,
    /// Segments one subpartition may hold (at least 1, at most the partition's).
    pub max_per_channel: usize,
    /// Buffers each channel can hold: the partition's segments plus its overdraft, so
    /// a send never finds it full.
    pub channel_capacity: usize,
    /// Segments of the network buffer pool.
    pub network_segments: usize,
    /// Bytes of the network buffer pool.
    pub network_bytes: usize,
    /// Bytes of every channel's ring together.
    pub channel_bytes: usize,
}

impl ExchangeSizing {
    /// Everything the exchange allocates at start-up, in bytes.
    pub fn bytes(&self) -> usize {
        self.network_bytes.saturating_add(self.channel_bytes)
    }
}

impl ExchangeSpec {
    /// Checks the settings: every count and size at least 1.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (what, value) in [
            ("exchange segment size", self.segment_size),
            ("exchange buffers per channel", self.buffers_per_channel),
            (
                "exchange max buffers per channel",
                self.max_buffers_per_channel,
            ),
        ] {
            if value == 0 {
                return Err(ConfigError::ZeroCapacity { what });
            }
        }
        Ok(())
    }

    /// The exchange's sizes for `sources` partitions of `sinks` subpartitions each.
    ///
    /// A partition has `buffers_per_channel × sinks + floating_buffers` segments, and
    /// never fewer than a segment per channel and one more (Flink's minimum for a
    /// result partition's pool): each channel may hold a buffer being written, which
    /// comes back only once it is full, so with no spare the writer could wait for a
    /// segment that nothing returns. A large fan-out would make that
    /// `sources × sinks` segments in all (and every channel's ring as long as its
    /// partition's pool); past [`FAN_OUT_BUDGET_BYTES`] a partition keeps what fits in
    /// that budget, or that minimum if it is more, in segments that shrink (halving,
    /// down to [`FAN_OUT_SEGMENT_MIN`] bytes), so that the network pool grows with the
    /// number of sources, not with sources × sinks.
    pub fn sizing(&self, sources: usize, sinks: usize) -> ExchangeSizing {
        let overdraft = crate::limits::OVERDRAFT_SEGMENTS_DEFAULT;
        let budget = FAN_OUT_BUDGET_BYTES.max(self.segment_size);
        let minimum = sinks.saturating_add(1).max(2);
        let flink = self
            .buffers_per_channel
            .saturating_mul(sinks)
            .saturating_add(self.floating_buffers);
        let per_partition = if flink.saturating_mul(self.segment_size) <= budget {
            flink.max(minimum)
        } else {
            // Past the budget: what it holds in full-size segments, or a segment per
            // channel and one more (then smaller ones), whichever is more.
            (budget / self.segment_size).max(minimum)
        };
        let max_per_channel = self.max_buffers_per_channel.clamp(1, per_partition);
        let mut segment_size = self.segment_size;
        while segment_size / 2 >= FAN_OUT_SEGMENT_MIN
            && per_partition.saturating_mul(segment_size) > budget
        {
            segment_size /= 2;
        }
        let network_segments = sources
            .saturating_mul(per_partition + overdraft)
            .saturating_add(8);
        let channel_capacity = per_partition + overdraft;
        let ring_bytes = channel_capacity
            .checked_next_power_of_two()
            .unwrap_or(usize::MAX)
            .saturating_mul(CHANNEL_SLOT_BYTES)
            .saturating_add(CHANNEL_FIXED_BYTES);
        ExchangeSizing {
            segment_size,
            segments_per_partition: per_partition,
            max_per_channel,
            channel_capacity,
            network_segments,
            network_bytes: network_segments.saturating_mul(segment_size),
            channel_bytes: sources.saturating_mul(sinks).saturating_mul(ring_bytes),
        }
    }
}

/// Why a graph cannot run: found before any thread starts.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// No stage at all.
    #[error("the graph has no stage; start one with a source (from_iter, from_generator, from_source) and end it with a sink")]
    Empty,
    /// A stream was dropped without a sink or an exchange after it.
    #[error("stage {stage:?} has no sink; end its stream with sink(), collect() or count()")]
    NoSink {
        /// The stage.
        stage: String,
    },
    /// A cluster whose process index is not below its process count.
    #[error("process {process} of a cluster of {processes}: the index must be below the count (and the count at least 1)")]
    BadCluster {
        /// Processes in all.
        processes: usize,
        /// This process's index.
        process: usize,
    },
    /// More than 2^32 channels.
    #[error("the graph needs more than 2^32 channels; lower the parallelism")]
    TooManyChannels,
    /// Parallelism 0.
    #[error("stage {stage:?} has parallelism 0; give it at least 1")]
    ZeroParallelism {
        /// The stage.
        stage: String,
    },
    /// A max parallelism below the stage's parallelism.
    #[error(
        "stage {stage:?} has max parallelism {max_parallelism}, below its parallelism \
         {parallelism}; raise the max parallelism to at least {parallelism} (it is the \
         number of key groups, the most subtasks the stage can ever have)"
    )]
    MaxParallelismBelowParallelism {
        /// The stage.
        stage: String,
        /// Its max parallelism.
        max_parallelism: usize,
        /// Its parallelism.
        parallelism: usize,
    },
    /// A max parallelism above Flink's bound.
    #[error("stage {stage:?} has max parallelism {max_parallelism}, above the limit of {limit}; lower it")]
    MaxParallelismTooLarge {
        /// The stage.
        stage: String,
        /// Its max parallelism.
        max_parallelism: usize,
        /// The largest accepted (2^15).
        limit: usize,
    },
    /// A forward exchange between stages of different parallelism.
    #[error(
        "forward from stage {from:?} (parallelism {from_parallelism}) to stage {to:?} \
         (parallelism {to_parallelism}) needs equal parallelisms; give both the same \
         parallelism, or use rebalance() or rescale() instead"
    )]
    ForwardParallelismMismatch {
        /// The upstream stage.
        from: String,
        /// Its parallelism.
        from_parallelism: usize,
        /// The downstream stage.
        to: String,
        /// Its parallelism.
        to_parallelism: usize,
    },
    /// A placement that does not list one worker per subtask.
    #[error("stage {stage:?} is placed on {listed} workers but has {parallelism} subtasks; list one worker per subtask")]
    PlacementLength {
        /// The stage.
        stage: String,
        /// Its parallelism.
        parallelism: usize,
        /// Workers listed.
        listed: usize,
    },
    /// A placement on a worker the runtime does not have.
    #[error("stage {stage:?} is placed on worker {worker}, but the runtime has {workers} workers (0..{workers}); place it on one of those")]
    NoSuchWorker {
        /// The stage.
        stage: String,
        /// The worker listed.
        worker: usize,
        /// Workers of the runtime.
        workers: usize,
    },
    /// The exchange's debloating settings are refused.
    #[error(transparent)]
    Debloat(#[from] crate::error::DebloatError),
    /// The exchange's allocation or the runtime refused.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The checkpoint settings are refused, or the checkpoint to restore cannot be read.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

/// Why a running graph failed (a task's error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GraphRunError {
    /// A custom partitioner chose a channel that does not exist.
    #[error("the partitioner of stage {stage:?} returned {partition} for {partitions} subtasks; it must return a value in 0..{partitions}")]
    PartitionOutOfRange {
        /// The stage whose output it routes.
        stage: String,
        /// What it returned.
        partition: usize,
        /// How many downstream subtasks there are.
        partitions: usize,
    },
}

/// How one stage runs, as [`Graph::plan`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagePlan {
    /// Its name.
    pub name: String,
    /// Subtasks.
    pub parallelism: usize,
    /// Key groups (the max parallelism).
    pub max_parallelism: usize,
    /// The worker of each subtask.
    pub workers: Vec<usize>,
    /// How its input arrives, if it is not a source.
    pub input: Option<Partitioning>,
}

/// What a stage did.
#[derive(Debug, Clone, Default)]
pub struct StageReport {
    /// Its name.
    pub name: String,
    /// Records its subtasks took in (from the source or the gate).
    pub records_in: u64,
    /// Time its subtasks could not take input because the chain after it did not
    /// accept (async operator full, writer out of buffers), ns.
    pub backpressured_ns: u64,
    /// Its async operators' counters, summed, if it has any.
    pub async_metrics: Option<AsyncMetrics>,
}

/// What a run of a graph did.
#[derive(Debug, Clone)]
pub struct JobResult {
    /// The runtime's report (per worker).
    pub run: RunReport,
    /// Each stage's counters, in the order stages were made.
    pub stages: Vec<StageReport>,
    /// Its checkpoints, when it took them.
    pub checkpoints: Option<CheckpointReport>,
}

impl JobResult {
    /// Every async operator's counters, summed.
    pub fn async_metrics(&self) -> AsyncMetrics {
        let mut all = AsyncMetrics::default();
        for metrics in self.stages.iter().filter_map(|s| s.async_metrics.as_ref()) {
            all.merge(metrics);
        }
        all
    }
}

#[derive(Default)]
struct StageStats {
    records_in: u64,
    backpressured_ns: u64,
    async_metrics: Option<AsyncMetrics>,
}

/// What the tasks of a run share: live counters, each stage's counters, the first
/// failure.
pub(crate) struct Shared {
    pub(crate) live: Arc<LiveCounters>,
    stats: Mutex<Vec<StageStats>>,
    /// The first error any task returned, with its worker, kept as the task returned
    /// it. The runtime keeps the first failure it is *told* of, and a failing worker
    /// drops its tasks (closing their channels) before it tells: a task on another
    /// worker may then fail with "producer gone" and be told first.
    first_failure: Mutex<Option<(usize, TaskError)>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn merge_async(&self, stage: usize, metrics: &AsyncMetrics) {
        let mut stats = lock(&self.stats);
        if let Some(stats) = stats.get_mut(stage) {
            stats
                .async_metrics
                .get_or_insert_with(AsyncMetrics::default)
                .merge(metrics);
        }
    }

    fn merge_task(&self, stage: usize, records_in: u64, backpressured_ns: u64) {
        let mut stats = lock(&self.stats);
        if let Some(stats) = stats.get_mut(stage) {
            stats.records_in += records_in;
            stats.backpressured_ns += backpressured_ns;
        }
    }

    /// Notes `error` as the first failure if there was none; returns its message for
    /// the runtime.
    fn note_failure(&self, worker: usize, error: TaskError) -> TaskError {
        let message = error.to_string();
        let mut first = lock(&self.first_failure);
        if first.is_none() {
            *first = Some((worker, error));
        }
        message.into()
    }
}

/// What a subtask's task is built from, on its worker's thread.
pub(crate) struct Wiring {
    info: SubtaskInfo,
    stage: usize,
    partition: Option<ResultPartition>,
    channels: Option<Vec<Box<dyn InputChannel>>>,
    downstream_max_parallelism: usize,
    writer: WriterConfig,
    /// Debloating for this subtask's input gate, if on.
    debloat: Option<DebloatConfig>,
    shared: Arc<Shared>,
    /// The stage's max parallelism (its key groups).
    max_parallelism: usize,
    /// Its part in checkpoints, if the job takes them.
    checkpoint: Option<TaskCheckpoint>,
    /// The checkpoint restored, if any.
    restore: Option<Arc<RestorePlan>>,
}

impl Wiring {
    /// This subtask's restored section `position`, if any.
    fn restored(&self, position: u32) -> Result<Option<&[u8]>, TaskError> {
        match &self.restore {
            Some(plan) => plan.own(self.stage, self.info.index, self.info.parallelism, position),
            None => Ok(None),
        }
    }

    /// A stage task over `input` and `chain`, taking part in checkpoints if the job
    /// does.
    fn task<T: 'static>(&mut self, input: StageInput<T>, chain: Box<dyn Link<T>>) -> Box<dyn Task> {
        self.task_with_io(input, chain, None)
    }

    fn task_with_io<T: 'static>(
        &mut self,
        input: StageInput<T>,
        chain: Box<dyn Link<T>>,
        io: Option<Box<dyn IoHandler>>,
    ) -> Box<dyn Task> {
        Box::new(
            StageTask::new(
                input,
                chain,
                Arc::clone(&self.shared),
                self.stage,
                &self.info,
            )
            .with_checkpoint(self.checkpoint.take())
            .with_source_io(io)
            .with_metrics(self.shared.live.register(&self.info)),
        )
    }
}

type Open<T> =
    Arc<dyn Fn(&mut Wiring, Box<dyn Link<T>>) -> Result<Box<dyn Task>, TaskError> + Send + Sync>;
type Build = Arc<dyn Fn(&mut Wiring) -> Result<Box<dyn Task>, TaskError> + Send + Sync>;

struct StageDef {
    name: String,
    parallelism: Option<usize>,
    max_parallelism: Option<usize>,
    placement: Option<Vec<usize>>,
    input: Option<usize>,
    output: Option<usize>,
    build: Option<Build>,
    /// Operators chained so far (each link's position in the task's snapshot).
    ops: u32,
}

struct EdgeDef {
    from: usize,
    to: usize,
    partitioning: Partitioning,
}

struct Inner {
    stages: Vec<StageDef>,
    edges: Vec<EdgeDef>,
    parallelism: usize,
    exchange: ExchangeSpec,
}

/// A job graph under construction; see the [module docs](self).
///
/// ```
/// use weir_engine::graph::Graph;
/// use weir_engine::runtime::{Cores, Runtime};
///
/// // Every tenth number of 0..1000, spread over two subtasks and collected.
/// let graph = Graph::new().with_parallelism(2);
/// let out = graph
///     .from_generator(1_000, None, |n| n)
///     .filter(|n| n % 10 == 0)
///     .rebalance()
///     .collect();
/// graph.execute(Runtime::builder().cores(Cores::Count(2)).pin(false).build()?)?;
/// assert_eq!(out.records().len(), 100);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Graph {
    inner: RefCell<Inner>,
    live: Arc<LiveCounters>,
    cluster: Option<Cluster>,
    checkpointing: Option<Checkpointing>,
}

impl Default for Graph {
    fn default() -> Self {
        Self::new()
    }
}

/// A stream of `T`: the output of the operators chained so far in one stage.
///
/// ```
/// use weir_engine::graph::Graph;
/// use weir_engine::runtime::{Cores, Runtime};
///
/// // A running sum per key (n mod 3), keyed onto two subtasks.
/// let graph = Graph::new().with_parallelism(2);
/// let sums = graph
///     .from_generator(30, None, |n| n)
///     .key_by(|n: &u64| n % 3)
///     .map_with_state(|n: &u64| n % 3, |n: u64, sum: &mut Option<u64>| {
///         let total = sum.unwrap_or(0) + n;
///         *sum = Some(total);
///         (n % 3, total)
///     })
///     .collect();
/// graph.execute(Runtime::builder().cores(Cores::Count(2)).pin(false).build()?)?;
/// let mut last = [0u64; 3];
/// for (key, total) in sums.records() {
///     last[key as usize] = last[key as usize].max(total);
/// }
/// assert_eq!(last, [135, 145, 155]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "a stream does nothing until it ends in a sink"]
pub struct Stream<'g, T> {
    graph: &'g Graph,
    stage: usize,
    open: Open<T>,
}

fn missing(what: &str) -> TaskError {
    format!("internal wiring error: the subtask has no {what}").into()
}

/// The elements an async operator held at the checkpoint restored.
fn restored_elements<T: Codec>(
    wiring: &Wiring,
    position: u32,
) -> Result<Vec<crate::element::StreamElement<T>>, TaskError> {
    match wiring.restored(position)? {
        Some(bytes) => decode_elements(bytes).map_err(|e| {
            format!(
                "{}: the async operator's checkpointed elements: {e}",
                wiring.info.stage
            )
            .into()
        }),
        None => Ok(Vec::new()),
    }
}

/// A random start for each rebalancing subtask (Flink starts at a random channel).
fn random_seed(index: usize) -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_usize(index);
    hasher.finish()
}

impl Graph {
    /// An empty graph; stages get parallelism 1 unless told otherwise.
    pub fn new() -> Self {
        Graph {
            inner: RefCell::new(Inner {
                stages: Vec::new(),
                edges: Vec::new(),
                parallelism: 1,
                exchange: ExchangeSpec::default(),
            }),
            live: Arc::new(LiveCounters::default()),
            cluster: None,
            checkpointing: None,
        }
    }

    /// Takes checkpoints as `checkpointing` says, and restores from one if it names
    /// one (see [`checkpoint`](crate::checkpoint)): sources must be replayable, and the
    /// job's output is exactly once where its sinks commit at checkpoints
    /// ([`Stream::sink_to_files`]).
    pub fn with_checkpointing(mut self, checkpointing: Checkpointing) -> Self {
        self.checkpointing = Some(checkpointing);
        self
    }

    /// Runs this process's part of a graph spread over several processes (see
    /// [`cluster`]): every process builds the same graph and passes its own index.
    /// Workers are then numbered over the cluster (process `p` holds workers
    /// `p·W .. (p+1)·W` of `W` each: every process must have as many).
    pub fn with_cluster(mut self, cluster: Cluster) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// The parallelism of stages that do not set theirs.
    pub fn with_parallelism(self, parallelism: usize) -> Self {
        self.inner.borrow_mut().parallelism = parallelism;
        self
    }

    /// Counts into `live` (e.g. counters a progress display already holds).
    pub fn with_live(mut self, live: Arc<LiveCounters>) -> Self {
        self.live = live;
        self
    }

    /// The settings of every exchange.
    pub fn with_exchange(self, exchange: ExchangeSpec) -> Self {
        self.inner.borrow_mut().exchange = exchange;
        self
    }

    /// The counters a progress display can read while the graph runs.
    pub fn live(&self) -> Arc<LiveCounters> {
        Arc::clone(&self.live)
    }

    fn open_stage(&self, name: String, input: Option<usize>) -> usize {
        let mut inner = self.inner.borrow_mut();
        inner.stages.push(StageDef {
            name,
            parallelism: None,
            max_parallelism: None,
            placement: None,
            input,
            output: None,
            build: None,
            ops: 0,
        });
        inner.stages.len() - 1
    }

    /// A stream from a user source: `make` builds subtask `i`'s on its worker.
    pub fn from_source<T, S, M>(&self, make: M) -> Stream<'_, T>
    where
        T: 'static,
        S: Source<T>,
        M: Fn(&SubtaskInfo) -> S + Send + Sync + 'static,
    {
        self.from_source_io(move |info| (make(info), None))
    }

    /// [`from_source`](Self::from_source) for a source that does its own I/O on the
    /// worker's driver (e.g. reads a log over TCP): `make` also returns the
    /// [`IoHandler`] the task drives each turn. The source answers
    /// [`SourceEvent::Idle`] while it waits for a reply; a driver event for one of the
    /// handler's connections polls it again.
    pub fn from_source_io<T, S, M>(&self, make: M) -> Stream<'_, T>
    where
        T: 'static,
        S: Source<T>,
        M: Fn(&SubtaskInfo) -> (S, Option<Box<dyn IoHandler>>) + Send + Sync + 'static,
    {
        let stage = self.open_stage("source".into(), None);
        let open: Open<T> = Arc::new(move |wiring: &mut Wiring, chain| {
            let (source, io) = make(&wiring.info);
            let mut source: Box<dyn Source<T>> = Box::new(source);
            if wiring.checkpoint.is_some() && source.snapshot_state().is_none() {
                // Refused up front: a checkpoint could never hold it, and its channels
                // would never bring a barrier downstream.
                return Err(format!(
                    "{}: its source cannot be replayed from a position (implement \
                     Source::snapshot_state and restore_state), so a checkpointed job cannot \
                     hold it; run the job without checkpoints",
                    wiring.info.stage
                )
                .into());
            }
            if let Some(state) = wiring.restored(SOURCE_SECTION)? {
                source
                    .restore_state(state)
                    .map_err(|e| format!("{}: {e}", wiring.info.stage))?;
            }
            Ok(wiring.task_with_io(StageInput::Source(source), chain, io))
        });
        Stream {
            graph: self,
            stage,
            open,
        }
    }

    /// A stream of the items of subtask `i`'s iterator, without timestamps.
    pub fn from_iter<T, I, M>(&self, make: M) -> Stream<'_, T>
    where
        T: 'static,
        I: IntoIterator<Item = T>,
        I::IntoIter: 'static,
        M: Fn(&SubtaskInfo) -> I + Send + Sync + 'static,
    {
        self.from_source(move |info| IterSource::new(make(info).into_iter()))
            .name("iterator source")
    }

    /// A stream of `make(n)` for `n` in `0..count`, spread over the subtasks, as fast
    /// as accepted (`rate: None`) or at `rate` records per second over all subtasks.
    pub fn from_generator<T, F>(&self, count: u64, rate: Option<f64>, make: F) -> Stream<'_, T>
    where
        T: 'static,
        F: FnMut(u64) -> T + Clone + Send + Sync + 'static,
    {
        self.from_source(move |info| {
            Generator::new(make.clone(), count, info.index, info.parallelism, rate)
        })
        .name("generator")
    }

    /// Checks the graph for `workers` workers and places its subtasks; nothing is
    /// allocated.
    pub fn plan(&self, workers: usize) -> Result<Vec<StagePlan>, GraphError> {
        let inner = self.inner.borrow();
        if inner.stages.is_empty() {
            return Err(GraphError::Empty);
        }
        if let Some(debloat) = inner.exchange.debloat {
            debloat.validate()?;
        }
        inner
            .exchange
            .validate()
            .map_err(|e| GraphError::Runtime(RuntimeError::Config(e)))?;
        let mut plans = Vec::with_capacity(inner.stages.len());
        let mut offset = 0usize;
        for stage in &inner.stages {
            if stage.build.is_none() {
                return Err(GraphError::NoSink {
                    stage: stage.name.clone(),
                });
            }
            let parallelism = stage.parallelism.unwrap_or(inner.parallelism);
            if parallelism == 0 {
                return Err(GraphError::ZeroParallelism {
                    stage: stage.name.clone(),
                });
            }
            let max_parallelism = stage
                .max_parallelism
                .unwrap_or_else(|| keys::default_max_parallelism(parallelism));
            if max_parallelism < parallelism {
                return Err(GraphError::MaxParallelismBelowParallelism {
                    stage: stage.name.clone(),
                    max_parallelism,
                    parallelism,
                });
            }
            if max_parallelism > keys::MAX_PARALLELISM_UPPER_BOUND {
                return Err(GraphError::MaxParallelismTooLarge {
                    stage: stage.name.clone(),
                    max_parallelism,
                    limit: keys::MAX_PARALLELISM_UPPER_BOUND,
                });
            }
            let placed = match &stage.placement {
                Some(list) => {
                    if list.len() != parallelism {
                        return Err(GraphError::PlacementLength {
                            stage: stage.name.clone(),
                            parallelism,
                            listed: list.len(),
                        });
                    }
                    if let Some(&worker) = list.iter().find(|&&w| w >= workers) {
                        return Err(GraphError::NoSuchWorker {
                            stage: stage.name.clone(),
                            worker,
                            workers,
                        });
                    }
                    list.clone()
                }
                None => (0..parallelism)
                    .map(|i| (offset + i) % workers.max(1))
                    .collect(),
            };
            offset += parallelism;
            plans.push(StagePlan {
                name: stage.name.clone(),
                parallelism,
                max_parallelism,
                workers: placed,
                input: stage.input.map(|e| inner.edges[e].partitioning),
            });
        }
        for edge in &inner.edges {
            let (from, to) = (&plans[edge.from], &plans[edge.to]);
            if edge.partitioning == Partitioning::Forward && from.parallelism != to.parallelism {
                return Err(GraphError::ForwardParallelismMismatch {
                    from: from.name.clone(),
                    from_parallelism: from.parallelism,
                    to: to.name.clone(),
                    to_parallelism: to.parallelism,
                });
            }
        }
        Ok(plans)
    }

    /// Runs the graph on `runtime` to its end; the first task failure stops it.
    pub fn execute(self, runtime: Runtime) -> Result<JobResult, GraphError> {
        match self.execute_to_end(runtime)? {
            (result, None) => Ok(result),
            (_, Some(error)) => Err(error.into()),
        }
    }

    /// Runs the graph on `runtime` to its end, successful or not: a run that fails
    /// still reports what its tasks had done, with the error beside it. `Err` only
    /// when it cannot start (the graph is refused, the exchange cannot be allocated).
    pub fn execute_to_end(
        self,
        runtime: Runtime,
    ) -> Result<(JobResult, Option<RuntimeError>), GraphError> {
        Ok(self.start(runtime)?.join())
    }

    /// Starts the graph on `runtime` and returns at once; [`JobRun::join`] waits for
    /// its end, and [`JobRun::controller`] stops or cancels it from any thread. `Err`
    /// when it cannot start (the graph is refused, the exchange cannot be allocated).
    ///
    /// An unbounded source, stopped with drain once enough was read:
    ///
    /// ```
    /// use std::sync::atomic::Ordering;
    /// use weir_engine::graph::{Graph, Source, SourceEvent, SubtaskInfo};
    /// use weir_engine::runtime::{Cores, Runtime};
    ///
    /// struct Ticks(u64);
    /// impl Source<u64> for Ticks {
    ///     fn poll_next(&mut self, now_ns: u64) -> SourceEvent<u64> {
    ///         self.0 += 1;
    ///         if self.0 % 100 == 0 {
    ///             return SourceEvent::Idle { until_ns: Some(now_ns + 50_000) };
    ///         }
    ///         SourceEvent::Record(self.0, None)
    ///     }
    /// }
    ///
    /// let graph = Graph::new();
    /// let live = graph.live();
    /// let counted = graph.from_source(|_: &SubtaskInfo| Ticks(0)).rebalance().count();
    /// let runtime = Runtime::builder().cores(Cores::Count(2)).pin(false).build()?;
    /// let job = graph.start(runtime)?;
    /// while live.generated.load(Ordering::Relaxed) < 1_000 {
    ///     std::thread::sleep(std::time::Duration::from_millis(1));
    /// }
    /// job.controller().end_input();
    /// let (_result, failure) = job.join();
    /// assert!(failure.is_none());
    /// assert_eq!(counted.records(), live.generated.load(Ordering::Relaxed));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn start(mut self, mut runtime: Runtime) -> Result<JobRun, GraphError> {
        let checkpointing = self.checkpointing.take();
        let local_workers = runtime.workers();
        let (processes, me) = match &self.cluster {
            Some(cluster) if cluster.processes == 0 || cluster.process >= cluster.processes => {
                return Err(GraphError::BadCluster {
                    processes: cluster.processes,
                    process: cluster.process,
                })
            }
            Some(cluster) => (cluster.processes, cluster.process),
            None => (1, 0),
        };
        // Workers are numbered over the whole cluster: this process holds
        // `me * local_workers ..` (see `cluster`).
        let workers = local_workers.saturating_mul(processes);
        let process_of = |worker: usize| worker / local_workers;
        let plans = self.plan(workers)?;
        let inner = self.inner.into_inner();
        let shared = Arc::new(Shared {
            live: Arc::clone(&self.live),
            stats: Mutex::new((0..plans.len()).map(|_| StageStats::default()).collect()),
            first_failure: Mutex::new(None),
        });
        let overdraft = crate::limits::OVERDRAFT_SEGMENTS_DEFAULT;
        // Each stage subtask's partition (its output) and gate channels (its input).
        let mut partitions: Vec<Vec<Option<ResultPartition>>> = plans
            .iter()
            .map(|p| (0..p.parallelism).map(|_| None).collect())
            .collect();
        let mut gates: Vec<Vec<Vec<Box<dyn InputChannel>>>> = plans
            .iter()
            .map(|p| (0..p.parallelism).map(|_| Vec::new()).collect())
            .collect();
        // Every subtask's place first (this process's only), so that wiring can name the
        // task each channel, pool and operator wakes (its doorbell), not just its worker.
        let ids: Vec<Vec<Option<TaskId>>> = plans
            .iter()
            .map(|p| {
                p.workers
                    .iter()
                    .map(|&w| (process_of(w) == me).then(|| runtime.add_task(w % local_workers)))
                    .collect()
            })
            .collect();
        let mut networks = Vec::new();
        // Per stage: its input gate's debloating, with the buffers per channel its
        // producers' partitions may hold.
        let mut debloat: Vec<Option<DebloatConfig>> = vec![None; plans.len()];
        // Channel ids, numbered identically in every process.
        let mut next_channel: u32 = 0;
        for edge in &inner.edges {
            let (from, to) = (&plans[edge.from], &plans[edge.to]);
            let fan_out = (0..from.parallelism)
                .map(|i| {
                    partition::connected(edge.partitioning, from.parallelism, to.parallelism, i)
                        .len()
                })
                .max()
                .unwrap_or(1);
            let sizing = inner.exchange.sizing(from.parallelism, fan_out);
            let per_partition = sizing.segments_per_partition;
            debloat[edge.to] = inner.exchange.debloat.map(|config| {
                let max_size = sizing.segment_size.max(config.min_size);
                DebloatConfig {
                    buffers_per_channel: sizing.max_per_channel,
                    max_size,
                    // Segments smaller than the starting size start whole.
                    starting_size: config.starting_size.min(max_size),
                    ..config
                }
            });
            // What crosses processes on this edge: channel ids by (consumer, producer's
            // process), and the ids this process serves.
            let mut remote_in: std::collections::BTreeMap<(usize, usize), Vec<u32>> =
                Default::default();
            let mut ids_of_edge = Vec::with_capacity(from.parallelism);
            for i in 0..from.parallelism {
                let targets =
                    partition::connected(edge.partitioning, from.parallelism, to.parallelism, i);
                let mut row = Vec::with_capacity(targets.len());
                for j in targets {
                    let id = next_channel;
                    next_channel = next_channel
                        .checked_add(1)
                        .ok_or(GraphError::TooManyChannels)?;
                    let (pi, pj) = (process_of(from.workers[i]), process_of(to.workers[j]));
                    if pj == me && pi != me {
                        remote_in.entry((j, pi)).or_default().push(id);
                    }
                    row.push((j, id));
                }
                ids_of_edge.push(row);
            }
            let mine = (0..from.parallelism)
                .filter(|&i| process_of(from.workers[i]) == me)
                .count();
            let receive: usize = match &self.cluster {
                Some(cluster) => remote_in
                    .values()
                    .map(|ids| cluster.remote.receive_segments(ids.len()))
                    .sum(),
                None => 0,
            };
            let network_segments = mine
                .saturating_mul(per_partition + overdraft)
                .saturating_add(receive)
                .saturating_add(8);
            let network = NetworkBufferPool::new(network_segments, sizing.segment_size)
                .map_err(RuntimeError::from)?;
            for (i, row) in ids_of_edge.into_iter().enumerate() {
                let Some(producer) = ids[edge.from][i] else {
                    continue;
                };
                let config = LocalPoolConfig::new(per_partition, row.len())
                    .with_max_per_subpartition(sizing.max_per_channel)
                    .with_overdraft(overdraft);
                let pool = LocalBufferPool::with_notify(
                    &network,
                    config,
                    runtime.task_unparker(producer, signal::OUTPUT),
                )
                .map_err(RuntimeError::from)?;
                let mut senders = Vec::with_capacity(row.len());
                for (j, id) in row {
                    match (ids[edge.to][j], &self.cluster) {
                        (Some(consumer), _) => {
                            let notify: Arc<dyn crate::park::Notify> =
                                Arc::new(runtime.task_unparker(consumer, signal::INPUT));
                            let (sender, receiver) =
                                local_channel(sizing.channel_capacity, Some(notify));
                            senders.push(sender);
                            gates[edge.to][j].push(Box::new(receiver));
                        }
                        (None, Some(cluster)) => {
                            let (sender, receiver) = local_channel(
                                sizing.channel_capacity,
                                Some(cluster.remote.producer_notify()),
                            );
                            senders.push(sender);
                            cluster
                                .remote
                                .serve(id, process_of(to.workers[j]), receiver);
                        }
                        (None, None) => unreachable!("one process runs every subtask"),
                    }
                }
                partitions[edge.from][i] =
                    Some(ResultPartition::new(pool, senders).map_err(RuntimeError::from)?);
            }
            if let Some(cluster) = &self.cluster {
                for ((j, process), channel_ids) in remote_in {
                    let consumer = ids[edge.to][j].expect("a consumer of this process");
                    let notify: Arc<dyn crate::park::Notify> =
                        Arc::new(runtime.task_unparker(consumer, signal::INPUT));
                    let channels = cluster
                        .remote
                        .consume(process, &channel_ids, &network, notify)
                        .map_err(RuntimeError::Setup)?;
                    gates[edge.to][j].extend(channels);
                }
            }
            networks.push(network);
        }
        let writer = WriterConfig {
            buffer_timeout: inner.exchange.buffer_timeout,
            ..WriterConfig::default()
        };
        // Checkpoints: the restored state, the service, each task's number and file.
        let mut checkpoints = None;
        let mut task_checkpoints: Vec<Vec<Option<TaskCheckpoint>>> = plans
            .iter()
            .map(|p| (0..p.parallelism).map(|_| None).collect())
            .collect();
        let mut restore_plan = None;
        if let Some(settings) = checkpointing {
            settings.config.validate()?;
            // The job's identity: its stages, whatever their parallelism.
            let job = plans
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(" | ");
            let names = plans.iter().map(|p| p.name.clone()).collect();
            let restored = match &settings.restore {
                Some(path) => match RestorePlan::read(path, &job, names)? {
                    Some((plan, from)) => {
                        restore_plan = Some(Arc::new(plan));
                        Some(from)
                    }
                    // No checkpoint ever completed there: a fresh start.
                    None => None,
                },
                None => None,
            };
            let restored_id = restored.as_ref().map_or(0, |r| r.id);
            let store = CheckpointStore::open(&settings.dir, settings.config.retain)?;
            if restored.is_none() {
                // A fresh start would number its checkpoints from 1 over a previous run's:
                // say so rather than lose the previous run's recovery point.
                if let Some(newest) = store.newest_complete()? {
                    return Err(GraphError::Checkpoint(CheckpointError::Config(format!(
                        "{} holds checkpoint {newest} of an earlier run: restore from it \
                         (--restore {0}), or remove the directory to start afresh",
                        settings.dir.display()
                    ))));
                }
            }
            // Checkpoints newer than the newest completed one were left unfinished by
            // the run that wrote them: removed. Completed ones newer than the one
            // restored (an older checkpoint named, or a fallback past a damaged newest
            // one) are kept for the operator, and this run numbers its own after them,
            // so that the newest completed checkpoint stays the newest until this run
            // completes a newer one. Over several processes, process 0 removes the
            // unfinished ones before its transport starts (see `Checkpointing`), so
            // that no process removes another's files.
            let mut first_id = restored_id + 1;
            if self.cluster.is_none() {
                let listings = store.list()?;
                let marked = store.newest_complete().ok().flatten().unwrap_or(0);
                let newest = listings
                    .iter()
                    .filter(|l| l.path.join(crate::checkpoint::storage::METADATA).exists())
                    .map(|l| l.id)
                    .chain([marked, restored_id])
                    .max()
                    .unwrap_or(0);
                for listing in listings {
                    if listing.id > newest {
                        store.discard(listing.id)?;
                    }
                }
                first_id = newest + 1;
            }
            let signals = Arc::new(CheckpointSignals::default());
            let mut unparkers = Vec::new();
            // Tasks are numbered over the whole job, whichever process runs them, so that
            // one coordinator counts every process's acknowledgements.
            let mut tasks = 0;
            let mut numbers: Vec<Vec<Option<(usize, String)>>> =
                plans.iter().map(|p| vec![None; p.parallelism]).collect();
            for (s, plan) in plans.iter().enumerate() {
                for (i, id) in ids[s].iter().enumerate() {
                    if let Some(task) = id {
                        unparkers.push(runtime.task_unparker(*task, signal::USER));
                        numbers[s][i] = Some((tasks, task_file_name(s, i, plan.parallelism)));
                    }
                    tasks += 1;
                }
            }
            let part = match &self.cluster {
                None => None,
                Some(cluster) => Some(ServicePart {
                    process: cluster.process,
                    processes: cluster.processes,
                    link: cluster.checkpoints.clone().ok_or_else(|| {
                        GraphError::Checkpoint(CheckpointError::Config(
                            "a checkpointed graph over several processes needs a checkpoint \
                             link between them (Cluster::checkpoints; weir-net's \
                             TransportChannels gives one)"
                                .into(),
                        ))
                    })?,
                    restored: restored_id,
                }),
            };
            let controller = Arc::new(OnceLock::new());
            let failure = Arc::new(Mutex::new(None));
            let hooks = GraphHooks {
                signals: Arc::clone(&signals),
                unparkers,
                controller: Arc::clone(&controller),
                failure: Arc::clone(&failure),
                listener: settings.listener.clone(),
                abort_listener: settings.abort_listener.clone(),
            };
            let service = CheckpointService::start_part(
                settings.config.clone(),
                store,
                job,
                tasks,
                first_id,
                hooks,
                part,
            )?;
            let acks = service.acks();
            task_checkpoints = numbers
                .into_iter()
                .map(|row| {
                    row.into_iter()
                        .map(|slot| {
                            slot.map(|(task, name)| {
                                TaskCheckpoint::new(
                                    acks.clone(),
                                    task,
                                    name,
                                    Arc::clone(&signals),
                                    settings.alignment,
                                    // This run's checkpoints are numbered from here on.
                                    first_id - 1,
                                )
                            })
                        })
                        .collect()
                })
                .collect();
            checkpoints = Some(RunCheckpoints {
                service,
                controller,
                failure,
                restored,
            });
        }
        for (s, (stage, plan)) in inner.stages.iter().zip(&plans).enumerate() {
            let build = stage
                .build
                .clone()
                .expect("plan() checked every stage is built");
            let downstream_max_parallelism = stage
                .output
                .map_or(keys::MAX_PARALLELISM_DEFAULT_LOWER_BOUND, |e| {
                    plans[inner.edges[e].to].max_parallelism
                });
            for (i, &worker) in plan.workers.iter().enumerate() {
                let Some(task) = ids[s][i] else {
                    // Another process runs this subtask.
                    continue;
                };
                let mut wiring = Wiring {
                    info: SubtaskInfo {
                        stage: plan.name.clone(),
                        index: i,
                        parallelism: plan.parallelism,
                        worker,
                        unparker: runtime.task_unparker(task, signal::COMPLETION),
                        checkpointing: checkpoints.is_some(),
                    },
                    stage: s,
                    partition: partitions[s][i].take(),
                    channels: stage.input.map(|_| std::mem::take(&mut gates[s][i])),
                    downstream_max_parallelism,
                    writer,
                    debloat: debloat[s],
                    shared: Arc::clone(&shared),
                    max_parallelism: plan.max_parallelism,
                    checkpoint: task_checkpoints[s][i].take(),
                    restore: restore_plan.clone(),
                };
                let build = Arc::clone(&build);
                runtime.set_task(
                    task,
                    Box::new(move |_driver: &mut dyn Driver| build(&mut wiring)),
                );
            }
        }
        let drivers: Vec<&'static str> =
            (0..local_workers).map(|w| runtime.driver_name(w)).collect();
        let running = runtime.start()?;
        if let Some(checkpoints) = &checkpoints {
            let _ = checkpoints.controller.set(running.controller());
            if checkpoints.service.has_failed() {
                running.controller().cancel();
            }
        }
        Ok(JobRun {
            running,
            shared,
            plans,
            networks,
            drivers,
            checkpoints,
        })
    }
}

/// Runs the job `build` makes, and when it fails (a task's error or panic, failed
/// checkpoints) makes it again and restarts it from its latest completed checkpoint, as
/// `strategy` allows (Flink's restart strategies; a job without checkpoints restarts
/// from its start). `on_restart` hears of each restart: its number, the delay before
/// it and the failure. Returns the last run's result, its failure if the strategy gave
/// up, and the restarts made.
pub fn execute_with_restarts(
    strategy: crate::checkpoint::RestartStrategy,
    mut build: impl FnMut() -> Result<(Graph, Runtime), GraphError>,
    mut on_restart: impl FnMut(u32, Duration, &RuntimeError),
) -> Result<(JobResult, Option<RuntimeError>, u32), GraphError> {
    strategy.validate()?;
    let mut restarts = crate::checkpoint::Restarts::new(strategy, std::time::Instant::now());
    let mut restore_latest = false;
    loop {
        let (mut graph, runtime) = build()?;
        if restore_latest {
            if let Some(checkpointing) = graph.checkpointing.as_mut() {
                // From the newest checkpoint that completed; from the start only if none
                // ever did; a newest one that cannot be read fails the restart (never a
                // fresh start, which would commit output again).
                checkpointing.restore = Some(checkpointing.dir.clone());
            }
        }
        let (result, failure) = graph.execute_to_end(runtime)?;
        let restartable = matches!(
            failure,
            Some(
                RuntimeError::Task { .. }
                    | RuntimeError::Panic { .. }
                    | RuntimeError::Checkpoint(_)
            )
        );
        if let (true, Some(error)) = (restartable, &failure) {
            if let Some(delay) = restarts.on_failure(std::time::Instant::now()) {
                on_restart(restarts.total(), delay, error);
                std::thread::sleep(delay);
                restore_latest = true;
                continue;
            }
        }
        return Ok((result, failure, restarts.total()));
    }
}

/// A job started with [`Graph::start`]: stop it, cancel it, or wait for its end.
pub struct JobRun {
    running: Running,
    shared: Arc<Shared>,
    plans: Vec<StagePlan>,
    networks: Vec<NetworkBufferPool>,
    drivers: Vec<&'static str>,
    checkpoints: Option<RunCheckpoints>,
}

/// A run's checkpoint service and what it restored from.
struct RunCheckpoints {
    service: CheckpointService,
    controller: Arc<OnceLock<crate::runtime::Controller>>,
    failure: Arc<Mutex<Option<String>>>,
    restored: Option<RestoredFrom>,
}

impl JobRun {
    /// Sends control mail to the job's tasks from any thread: [`Controller::end_input`]
    /// stops the sources and lets what they emitted drain (Flink's stop with drain; the
    /// way to end a job over an unbounded source), [`Controller::cancel`] stops every
    /// task at once.
    pub fn controller(&self) -> Controller {
        self.running.controller()
    }

    /// Waits for the job's end, successful or not: a run that fails still reports what
    /// its tasks had done, with the error beside it.
    pub fn join(self) -> (JobResult, Option<RuntimeError>) {
        let JobRun {
            running,
            shared,
            plans,
            networks,
            drivers,
            checkpoints,
        } = self;
        let joined = running.join();
        // The service stops once the tasks are gone: no checkpoint completes after. Over
        // several processes a job that ended well here still takes part in checkpoints
        // until every process's tasks ended (their sinks may wait for one to commit).
        let checkpoints = checkpoints.map(|c| {
            let stats = if joined.is_ok() {
                c.service.stop()
            } else {
                c.service.abandon()
            };
            let failure = lock(&c.failure).take();
            let failure = match (failure, &stats) {
                (Some(why), _) => Some(why),
                (None, Err(error)) => Some(error.to_string()),
                (None, Ok(_)) => None,
            };
            (
                CheckpointReport {
                    stats: stats.unwrap_or_default(),
                    restored: c.restored,
                },
                failure,
            )
        });
        let checkpoint_failure = checkpoints.as_ref().and_then(|(_, f)| f.clone());
        let joined = match (joined, checkpoint_failure) {
            (Ok(_) | Err(RuntimeError::Cancelled { .. }), Some(why)) => {
                Err(RuntimeError::Checkpoint(why))
            }
            (joined, _) => joined,
        };
        let (run, failure) = match joined {
            Ok(run) => (run, None),
            Err(error) => {
                let root = lock(&shared.first_failure).take();
                let error = match (error, root) {
                    (RuntimeError::Task { .. }, Some((worker, error))) => {
                        RuntimeError::Task { worker, error }
                    }
                    (error, _) => error,
                };
                (
                    RunReport {
                        drivers,
                        ..RunReport::default()
                    },
                    Some(error),
                )
            }
        };
        drop(networks);
        let stats = std::mem::take(&mut *lock(&shared.stats));
        let stages = stats
            .into_iter()
            .zip(plans)
            .map(|(stats, plan)| StageReport {
                name: plan.name,
                records_in: stats.records_in,
                backpressured_ns: stats.backpressured_ns,
                async_metrics: stats.async_metrics,
            })
            .collect();
        (
            JobResult {
                run,
                stages,
                checkpoints: checkpoints.map(|(report, _)| report),
            },
            failure,
        )
    }
}

impl core::fmt::Debug for JobRun {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("JobRun")
            .field("stages", &self.plans.len())
            .finish_non_exhaustive()
    }
}

/// Runs an executor's ready futures around the I/O of the handler it wraps.
struct ExecutorIo {
    executor: Rc<RefCell<LocalExecutor>>,
    inner: Option<Box<dyn IoHandler>>,
}

impl IoHandler for ExecutorIo {
    fn flush(&mut self, driver: &mut dyn Driver, now_ns: u64) {
        self.executor.borrow_mut().run_ready();
        if let Some(inner) = self.inner.as_mut() {
            inner.flush(driver, now_ns);
        }
    }

    fn on_event(&mut self, event: &DriverEvent<'_>) -> bool {
        let mine = self.inner.as_mut().is_some_and(|io| io.on_event(event));
        if mine {
            // Resume the futures the event woke now, on this thread.
            self.executor.borrow_mut().run_ready();
        }
        mine
    }

    fn next_deadline(&self) -> Option<u64> {
        self.inner.as_ref().and_then(|io| io.next_deadline())
    }
}

impl<'g, T: 'static> Stream<'g, T> {
    fn with_stage<R>(&self, f: impl FnOnce(&mut StageDef) -> R) -> R {
        f(&mut self.graph.inner.borrow_mut().stages[self.stage])
    }

    fn chain<U: 'static>(
        self,
        what: &str,
        link: impl Fn(&mut Wiring, u32, Box<dyn Link<U>>) -> Result<Box<dyn Link<T>>, TaskError>
            + Send
            + Sync
            + 'static,
    ) -> Stream<'g, U> {
        let position = self.with_stage(|s| {
            s.name.push_str(" → ");
            s.name.push_str(what);
            s.ops += 1;
            s.ops
        });
        let open = self.open;
        Stream {
            graph: self.graph,
            stage: self.stage,
            open: Arc::new(move |wiring: &mut Wiring, next| {
                let link = link(wiring, position, next)?;
                open(wiring, link)
            }),
        }
    }

    /// Names the stage (in errors and reports).
    pub fn name(self, name: &str) -> Self {
        self.with_stage(|s| s.name = name.to_string());
        self
    }

    /// The parallelism of this stage: every operator chained in it, as Flink chains
    /// only operators of equal parallelism (put an exchange between operators that
    /// need different ones).
    pub fn parallelism(self, parallelism: usize) -> Self {
        self.with_stage(|s| s.parallelism = Some(parallelism));
        self
    }

    /// The stage's max parallelism: its number of key groups, when it is keyed
    /// (default: Flink's, 1.5 × parallelism rounded up to a power of two, ≥ 128).
    pub fn max_parallelism(self, max_parallelism: usize) -> Self {
        self.with_stage(|s| s.max_parallelism = Some(max_parallelism));
        self
    }

    /// Runs subtask `i` of this stage on `workers[i]`.
    pub fn place(self, workers: Vec<usize>) -> Self {
        self.with_stage(|s| s.placement = Some(workers));
        self
    }

    /// `f` of each record (Flink's `map`); each subtask calls its own clone.
    pub fn map<U: 'static, F>(self, f: F) -> Stream<'g, U>
    where
        F: FnMut(T) -> U + Clone + Send + Sync + 'static,
    {
        self.chain("map", move |_, _, next| {
            Ok(Box::new(MapLink {
                f: f.clone(),
                next,
                run: Vec::new(),
            }))
        })
    }

    /// The records for which `f` holds.
    pub fn filter<F>(self, f: F) -> Stream<'g, T>
    where
        F: FnMut(&T) -> bool + Clone + Send + Sync + 'static,
    {
        self.chain("filter", move |_, _, next| {
            Ok(Box::new(FilterLink { f: f.clone(), next }))
        })
    }

    /// Every item of `f` of each record, with the record's timestamp.
    pub fn flat_map<U: 'static, I, F>(self, f: F) -> Stream<'g, U>
    where
        I: IntoIterator<Item = U>,
        F: FnMut(T) -> I + Clone + Send + Sync + 'static,
    {
        self.chain("flat_map", move |_, _, next| {
            Ok(Box::new(FlatMapLink {
                f: f.clone(),
                next,
                run: Vec::new(),
            }))
        })
    }

    /// Flink's `AsyncDataStream`: each record calls `make(subtask)`'s function, with
    /// up to `config`'s capacity in flight, results emitted as its mode says.
    pub fn async_wait<F, M>(self, make: M, config: AsyncConfig<F::Out>) -> Stream<'g, F::Out>
    where
        T: Codec + Clone,
        F: AsyncFunction<In = T>,
        M: Fn(&SubtaskInfo) -> F + Send + Sync + 'static,
        AsyncConfig<F::Out>: Send + Sync,
    {
        self.async_wait_io(move |info| (make(info), None), config)
    }

    /// [`async_wait`](Self::async_wait) for a function that does its own I/O on the
    /// worker's driver: `make` also returns the [`IoHandler`] the task drives.
    pub fn async_wait_io<F, M>(self, make: M, config: AsyncConfig<F::Out>) -> Stream<'g, F::Out>
    where
        T: Codec + Clone,
        F: AsyncFunction<In = T>,
        M: Fn(&SubtaskInfo) -> (F, Option<Box<dyn IoHandler>>) + Send + Sync + 'static,
        AsyncConfig<F::Out>: Send + Sync,
    {
        self.chain("async_wait", move |wiring, position, next| {
            let (function, io) = make(&wiring.info);
            let operator =
                AsyncWaitOperator::new(function, config.clone(), wiring.info.unparker.clone())?;
            let restored = restored_elements::<T>(wiring, position)?;
            Ok(Box::new(AsyncLink::new(
                operator,
                io,
                next,
                Arc::clone(&wiring.shared),
                wiring.stage,
                position,
                restored,
            )))
        })
    }

    /// One async call per batch of records (Flink's `AsyncBatchFunction`): `make`
    /// returns subtask `i`'s `AsyncBatchFunction` and the [`IoHandler`] of its I/O
    /// (if any); batches are cut at `batch.max_batch_size` records or
    /// `batch.batch_timeout` after their first, and at watermarks, a full operator and
    /// end of input. Otherwise it is [`async_wait_io`](Self::async_wait_io): capacity
    /// counts records, output in `config`'s mode, timeouts and retries per record,
    /// buffered and in-flight records checkpointed as records. See
    /// [`crate::async_io::Batched`].
    pub fn async_wait_batch<F, M>(
        self,
        make: M,
        config: AsyncConfig<F::Out>,
        batch: crate::async_io::BatchConfig,
    ) -> Stream<'g, F::Out>
    where
        T: Codec + Clone,
        F: crate::async_io::AsyncBatchFunction<In = T>,
        M: Fn(&SubtaskInfo) -> (F, Option<Box<dyn IoHandler>>) + Send + Sync + 'static,
        AsyncConfig<F::Out>: Send + Sync,
    {
        self.async_wait_io(
            move |info| {
                let (function, io) = make(info);
                (crate::async_io::Batched::new(function, batch), io)
            },
            config,
        )
    }

    /// [`async_wait`](Self::async_wait) with the call written as an `async` block:
    /// `make` returns subtask `i`'s call (a closure returning a future of the results)
    /// and the [`IoHandler`] of whatever the futures wait on; the futures run on a
    /// per-subtask executor on the worker's thread.
    pub fn async_wait_futures<U, C, Fut, M>(self, make: M, config: AsyncConfig<U>) -> Stream<'g, U>
    where
        T: Codec + Clone,
        U: Send + 'static,
        C: FnMut(&T) -> Fut + 'static,
        Fut: Future<Output = Result<Vec<U>, AsyncError>> + 'static,
        M: Fn(&SubtaskInfo) -> (C, Option<Box<dyn IoHandler>>) + Send + Sync + 'static,
        AsyncConfig<U>: Send + Sync,
    {
        self.async_on_executor(
            move |info, executor| {
                let (call, io) = make(info);
                (FutureFunction::<T, U, C>::new(executor, call), io)
            },
            config,
        )
    }

    /// [`async_wait_batch`](Self::async_wait_batch) with the call written as an `async`
    /// block: `make` returns subtask `i`'s call (a closure from the batch's inputs to a
    /// future of one result list per input) and the [`IoHandler`] of whatever the
    /// futures wait on; the futures run on a per-worker executor, as in
    /// [`async_wait_futures`](Self::async_wait_futures).
    pub fn async_wait_batch_futures<U, C, Fut, M>(
        self,
        make: M,
        config: AsyncConfig<U>,
        batch: crate::async_io::BatchConfig,
    ) -> Stream<'g, U>
    where
        T: Codec + Clone,
        U: Send + 'static,
        C: FnMut(&[T]) -> Fut + 'static,
        Fut: Future<Output = Result<Vec<Vec<U>>, AsyncError>> + 'static,
        M: Fn(&SubtaskInfo) -> (C, Option<Box<dyn IoHandler>>) + Send + Sync + 'static,
        AsyncConfig<U>: Send + Sync,
    {
        use crate::async_io::futures::FutureBatchFunction;
        self.async_on_executor(
            move |info, executor| {
                let (call, io) = make(info);
                let function = FutureBatchFunction::<T, U, C>::new(executor, call);
                (crate::async_io::Batched::new(function, batch), io)
            },
            config,
        )
    }

    /// An async stage whose function runs its calls as futures on a per-subtask
    /// executor: `make` builds subtask `i`'s function over the executor, and the task
    /// polls the executor beside the function's own I/O.
    fn async_on_executor<F, M>(self, make: M, config: AsyncConfig<F::Out>) -> Stream<'g, F::Out>
    where
        T: Codec + Clone,
        F: AsyncFunction<In = T>,
        M: Fn(&SubtaskInfo, Rc<RefCell<LocalExecutor>>) -> (F, Option<Box<dyn IoHandler>>)
            + Send
            + Sync
            + 'static,
        AsyncConfig<F::Out>: Send + Sync,
    {
        // A future per call (or batch): twice the capacity leaves room for calls whose
        // futures finish after their records left.
        let futures = config.capacity().saturating_mul(2).saturating_add(16);
        self.chain("async_wait", move |wiring, position, next| {
            let executor = Rc::new(RefCell::new(LocalExecutor::new(
                futures,
                Some(wiring.info.unparker.clone()),
            )?));
            let (function, io) = make(&wiring.info, Rc::clone(&executor));
            let io: Box<dyn IoHandler> = Box::new(ExecutorIo {
                executor,
                inner: io,
            });
            let operator =
                AsyncWaitOperator::new(function, config.clone(), wiring.info.unparker.clone())?;
            let restored = restored_elements::<T>(wiring, position)?;
            Ok(Box::new(AsyncLink::new(
                operator,
                Some(io),
                next,
                Arc::clone(&wiring.shared),
                wiring.stage,
                position,
                restored,
            )))
        })
    }

    /// `f` of each record and the value state of its key (Flink's `ValueState` in a
    /// keyed `map`): `f` reads, replaces or clears (`None`) the value, and returns the
    /// output. Map state (Flink's `MapState`) is a value that is a map: a
    /// `BTreeMap<UK, UV>` per key, which `f` reads and updates in place. The stage must follow a [`key_by`](Stream::key_by) whose key `key`
    /// repeats. The state is kept per key group and checkpointed, so a restored job
    /// may run this stage at another parallelism: each key's value goes where
    /// `key_by` now sends the key. Keys and values are `Clone + Send + Sync`: a
    /// checkpoint takes a copy-on-write view of the state at the barrier and encodes it
    /// on the checkpoint service's thread (see [`KeyedState`]).
    pub fn map_with_state<K, V, U, KF, F>(self, key: KF, f: F) -> Stream<'g, U>
    where
        U: 'static,
        K: KeyHashCode + Codec + Eq + std::hash::Hash + Clone + Send + Sync + 'static,
        V: Codec + Clone + Send + Sync + 'static,
        KF: Fn(&T) -> K + Clone + Send + Sync + 'static,
        F: FnMut(T, &mut Option<V>) -> U + Clone + Send + Sync + 'static,
    {
        self.chain("map_with_state", move |wiring, position, next| {
            let (max_parallelism, parallelism, index) = (
                wiring.max_parallelism,
                wiring.info.parallelism,
                wiring.info.index,
            );
            let state = match &wiring.restore {
                Some(plan) => KeyedState::restore(
                    max_parallelism,
                    parallelism,
                    index,
                    plan.all(wiring.stage, position),
                ),
                None => KeyedState::new(max_parallelism, parallelism, index),
            }
            .map_err(|e| format!("{}: keyed state: {e}", wiring.info.stage))?;
            Ok(Box::new(KeyedMapLink {
                key: key.clone(),
                f: f.clone(),
                state,
                position,
                stage: wiring.info.stage.clone(),
                next,
            }))
        })
    }

    /// Ends the stream in part files under `dir`, each record written by `format`
    /// (e.g. as a line), exactly once when the job checkpoints: files are
    /// pre-committed at each barrier and committed when the checkpoint completes (see
    /// [`FileSink`]); without checkpoints, committed at the end of a successful run.
    pub fn sink_to_files<F>(self, dir: impl Into<std::path::PathBuf>, format: F)
    where
        F: FnMut(&T, &mut Vec<u8>) + Clone + Send + Sync + 'static,
    {
        let dir = dir.into();
        self.sink(move |info| {
            FileSink::new(dir.clone(), info.index, info.checkpointing, format.clone())
        });
    }

    /// Ends the stream in a user sink: `make` builds subtask `i`'s.
    pub fn sink<S, M>(self, make: M)
    where
        S: Sink<T>,
        M: Fn(&SubtaskInfo) -> S + Send + Sync + 'static,
    {
        self.sink_io(move |info| (make(info), None))
    }

    /// [`sink`](Self::sink) for a sink that does its own I/O on the worker's driver
    /// (e.g. writes to a server over TCP): `make` also returns the [`IoHandler`] the
    /// task drives each turn. Such a sink says when it takes no more input
    /// ([`Sink::accepts`], back-pressure) and when all it was given is written
    /// ([`Sink::flushed`]).
    pub fn sink_io<S, M>(self, make: M)
    where
        S: Sink<T>,
        M: Fn(&SubtaskInfo) -> (S, Option<Box<dyn IoHandler>>) + Send + Sync + 'static,
    {
        let position = self.with_stage(|s| {
            s.ops += 1;
            s.ops
        });
        let open = self.open;
        let build: Build = Arc::new(move |wiring: &mut Wiring| {
            let (mut sink, io) = make(&wiring.info);
            if let Some(state) = wiring.restored(position)? {
                sink.restore_state(state)
                    .map_err(|e| format!("{}: {e}", wiring.info.stage))?;
            }
            open(
                wiring,
                Box::new(SinkLink {
                    sink,
                    io,
                    finished: false,
                    position,
                }),
            )
        });
        self.graph.inner.borrow_mut().stages[self.stage].build = Some(build);
    }

    /// Ends the stream in collecting sinks (for tests): every element, per subtask.
    pub fn collect(self) -> Collected<T>
    where
        T: Send,
    {
        let collected = Collected::default();
        let handle = collected.clone();
        self.sink(move |info| handle.sink(info.index, info.parallelism));
        collected
    }

    /// Ends the stream in counting sinks that discard the records.
    pub fn count(self) -> Counted {
        self.count_inner(None)
    }

    /// Ends the stream in counting sinks that also record each record's latency from
    /// `created_ns(record)`, its creation time by the run's clock (the `now_ns` sources
    /// and sinks are given), in an HDR histogram.
    pub fn count_with_latency<F>(self, created_ns: F) -> Counted
    where
        F: Fn(&T) -> u64 + Send + Sync + 'static,
    {
        self.count_inner(Some(Arc::new(created_ns)))
    }

    fn count_inner(self, created: Option<sink::CreatedFn<T>>) -> Counted {
        let counted = Counted::default();
        let handle = counted.clone();
        let live = self.graph.live();
        self.sink(move |_| {
            sink::CountSink::new(handle.clone(), created.clone(), Arc::clone(&live))
        });
        counted
    }
}

impl<'g, T: Codec + 'static> Stream<'g, T> {
    fn exchange(self, route: Route<T>) -> Stream<'g, T> {
        let graph = self.graph;
        let partitioning = route.partitioning();
        let (edge, stage) = {
            let mut inner = graph.inner.borrow_mut();
            let edge = inner.edges.len();
            let to = inner.stages.len();
            inner.edges.push(EdgeDef {
                from: self.stage,
                to,
                partitioning,
            });
            inner.stages[self.stage].output = Some(edge);
            (edge, to)
        };
        let opened = graph.open_stage(format!("{} exchange", partitioning.name()), Some(edge));
        debug_assert_eq!(opened, stage);
        let open = self.open;
        let build: Build = Arc::new(move |wiring: &mut Wiring| {
            let partition = wiring
                .partition
                .take()
                .ok_or_else(|| missing("partition"))?;
            let channels = partition.subpartitions();
            let selector = Selector::new(
                route.clone(),
                wiring.downstream_max_parallelism,
                channels,
                random_seed(wiring.info.index),
            );
            let writer = RecordWriter::new(partition, selector, wiring.writer)?;
            let link = Box::new(WriterLink {
                writer,
                overflow: VecDeque::new(),
                finished: false,
                stage: wiring.info.stage.clone(),
            });
            open(wiring, link)
        });
        graph.inner.borrow_mut().stages[self.stage].build = Some(build);
        Stream {
            graph,
            stage,
            open: Arc::new(move |wiring: &mut Wiring, chain| {
                let channels = wiring.channels.take().ok_or_else(|| missing("input"))?;
                let mut gate = InputGate::<Record<T>>::new(channels)?;
                if let Some(config) = wiring.debloat {
                    gate.set_debloat(config)?;
                }
                if let Some(checkpoint) = &wiring.checkpoint {
                    gate.set_alignment(checkpoint.mode);
                }
                if let Some(state) = wiring.restored(CHANNEL_SECTION)? {
                    gate.restore_channel_state(state)?;
                }
                Ok(wiring.task(StageInput::Gate(Box::new(gate)), chain))
            }),
        }
    }

    /// Subtask `i` to subtask `i` of the next stage (equal parallelism), as a new
    /// stage: Flink's `forward()` (use it to break a chain).
    pub fn forward(self) -> Stream<'g, T> {
        self.exchange(Route::Plain(Partitioning::Forward))
    }

    /// Round robin over every subtask of the next stage, each upstream subtask
    /// starting at a random one: Flink's `rebalance()`.
    pub fn rebalance(self) -> Stream<'g, T> {
        self.exchange(Route::Plain(Partitioning::Rebalance))
    }

    /// Round robin over a pointwise subset of the next stage's subtasks: Flink's
    /// `rescale()`.
    pub fn rescale(self) -> Stream<'g, T> {
        self.exchange(Route::Plain(Partitioning::Rescale))
    }

    /// By key, through key groups as Flink's `keyBy`: equal keys reach the same
    /// subtask, and the key → subtask mapping equals Flink's for the same key hash
    /// codes, max parallelism and parallelism (see [`keys`]).
    pub fn key_by<K, F>(self, key: F) -> Stream<'g, T>
    where
        K: KeyHashCode,
        F: Fn(&T) -> K + Send + Sync + 'static,
    {
        self.exchange(Route::KeyGroups(Arc::new(move |v: &T| key(v).hash_code())))
    }

    /// Every record to every subtask of the next stage: Flink's `broadcast()`.
    pub fn broadcast(self) -> Stream<'g, T> {
        self.exchange(Route::Plain(Partitioning::Broadcast))
    }

    /// Every record to subtask 0 of the next stage: Flink's `global()`.
    pub fn global(self) -> Stream<'g, T> {
        self.exchange(Route::Plain(Partitioning::Global))
    }

    /// By `partitioner` of `key(record)`: Flink's `partitionCustom`.
    pub fn partition_custom<K, P, F>(self, partitioner: P, key: F) -> Stream<'g, T>
    where
        P: Partitioner<K>,
        F: Fn(&T) -> K + Send + Sync + 'static,
    {
        self.exchange(Route::Custom(Arc::new(move |v: &T, n| {
            partitioner.partition(&key(v), n)
        })))
    }
}

#[cfg(test)]
mod sizing_tests {
    use super::*;

    /// Flink's budget at a small fan-out: 2 per channel and 8 floating, at most 10 on
    /// one channel; 32 KiB segments.
    #[test]
    fn a_small_fan_out_gets_flink_s_budget() {
        let sizing = ExchangeSpec::default().sizing(2, 2);
        assert_eq!(sizing.segments_per_partition, 2 * 2 + 8);
        assert_eq!(sizing.max_per_channel, 10);
        assert_eq!(sizing.segment_size, 32 * 1024);
        assert_eq!(
            sizing.channel_capacity,
            12 + crate::limits::OVERDRAFT_SEGMENTS_DEFAULT
        );
    }

    /// A large fan-out keeps a segment per channel and one more, in smaller segments,
    /// so a partition stays near the fan-out budget.
    #[test]
    fn a_large_fan_out_shrinks_its_segments() {
        let sizing = ExchangeSpec::default().sizing(200, 200);
        assert!(sizing.segments_per_partition > 200);
        assert!(sizing.segment_size < 32 * 1024);
        assert!(sizing.segment_size >= FAN_OUT_SEGMENT_MIN);
        assert!(
            sizing.segments_per_partition * sizing.segment_size <= 2 * FAN_OUT_BUDGET_BYTES,
            "{sizing:?}"
        );
    }

    /// A zero count or size is refused by name; a channel's maximum never exceeds its
    /// partition's pool.
    #[test]
    fn zero_settings_are_refused_and_maxima_are_clamped() {
        for spec in [
            ExchangeSpec {
                segment_size: 0,
                ..ExchangeSpec::default()
            },
            ExchangeSpec {
                buffers_per_channel: 0,
                ..ExchangeSpec::default()
            },
            ExchangeSpec {
                max_buffers_per_channel: 0,
                ..ExchangeSpec::default()
            },
        ] {
            let error = spec.validate().expect_err("refused");
            assert!(error.to_string().contains("exchange"), "{error}");
        }
        let spec = ExchangeSpec {
            max_buffers_per_channel: 1000,
            ..ExchangeSpec::default()
        };
        let sizing = spec.sizing(1, 1);
        assert_eq!(sizing.max_per_channel, sizing.segments_per_partition);
        // A graph with such an exchange is refused before anything starts.
        let graph = Graph::new().with_exchange(ExchangeSpec {
            buffers_per_channel: 0,
            ..ExchangeSpec::default()
        });
        let _counted = graph.from_iter(|_: &SubtaskInfo| 0..10u64).count();
        let error = graph.plan(1).expect_err("refused");
        assert!(error.to_string().contains("buffers per channel"), "{error}");
    }
}
