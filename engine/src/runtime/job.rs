//! A small job graph: `generator → async_wait → exchange(key hash) → sink`.
//!
//! The generator and the async operator of one subtask are chained on one thread, as
//! Flink chains operators, and write into a record writer; `sinks` subtasks read their
//! input gates, count records, check that each id arrives exactly once, and record the
//! latency from each record's creation at the source (an open-loop source stamps its
//! *intended* time, so a late source is charged: coordinated omission is corrected).
//! Source subtask `i` runs on worker `i`, sink subtask `j` on worker `sources + j`,
//! both modulo the worker count.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;

use super::{
    Driver, DriverEvent, Progress, RunReport, Runtime, RuntimeError, Task, TaskContext, TaskError,
};
use crate::async_io::{AsyncConfig, AsyncFunction, AsyncMetrics, AsyncWaitOperator};
use crate::element::StreamElement;
use crate::error::ConfigError;
use crate::exchange::codec::Codec;
use crate::exchange::{
    local_channel, GateEvent, InputChannel, InputGate, KeyHash, LocalBufferPool, LocalPoolConfig,
    NetworkBufferPool, RecordWriter, ResultPartition, WriterConfig,
};

/// A record as the generator makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceRecord {
    /// Unique across the job: `0..records`.
    pub id: u64,
    /// The lookup key.
    pub key: u64,
    /// Creation time by the run's clock (the intended time in open-loop runs).
    pub created_ns: u64,
}

/// What reaches the sinks: it carries its id, key and creation time.
pub trait JobRecord: Codec + Send + 'static {
    /// The source record's id.
    fn id(&self) -> u64;
    /// The key the exchange routes by.
    fn key(&self) -> u64;
    /// The source record's creation time.
    fn created_ns(&self) -> u64;
}

/// How keys are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyDistribution {
    /// Uniform over `0..keys`.
    Uniform {
        /// Distinct keys.
        keys: u64,
    },
    /// `hot_fraction` of records use the first `hot_keys` keys, the rest are uniform.
    Skewed {
        /// Distinct keys.
        keys: u64,
        /// Keys that are hot.
        hot_keys: u64,
        /// Share of records on hot keys.
        hot_fraction: f64,
    },
}

/// The generator source.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GeneratorSpec {
    /// Records in all.
    pub records: u64,
    /// Records per second over all subtasks (`None`: as fast as accepted, closed loop).
    pub rate: Option<f64>,
    /// Key distribution.
    pub keys: KeyDistribution,
    /// Seed of the key sampling.
    pub seed: u64,
}

/// Exchange settings of the job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExchangeSpec {
    /// Bytes per segment.
    pub segment_size: usize,
    /// Segments per source subtask's partition.
    pub segments: usize,
    /// Buffer timeout.
    pub buffer_timeout: Option<Duration>,
}

impl Default for ExchangeSpec {
    fn default() -> Self {
        ExchangeSpec {
            segment_size: 32 * 1024,
            segments: 64,
            buffer_timeout: Some(Duration::from_millis(1)),
        }
    }
}

/// Hooks a task's I/O (e.g. a lookup client) into its worker's driver.
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

/// Makes subtask `i`'s async function (and its I/O handler) on its worker's thread;
/// the [`Unparker`](crate::park::Unparker) wakes that worker (e.g. for a future's waker).
pub type FunctionFactory<F> =
    Arc<dyn Fn(usize, crate::park::Unparker) -> (F, Option<Box<dyn IoHandler>>) + Send + Sync>;

/// Makes subtask `i` of `n`'s key iterator on its worker's thread (an iterator source).
pub type KeyIterFactory = Arc<dyn Fn(usize, usize) -> Box<dyn Iterator<Item = u64>> + Send + Sync>;

/// Where a collecting sink puts every record it receives (for tests).
pub type Collected<T> = Arc<Mutex<Vec<T>>>;

/// The job.
pub struct JobSpec<F: AsyncFunction> {
    /// The source: record count, rate and key distribution. With [`JobSpec::keys`] the
    /// keys come from iterators instead, and `records` must be how many they yield in all.
    pub generator: GeneratorSpec,
    /// An iterator source: subtask `i`'s keys, in order; its records end with them.
    pub keys: Option<KeyIterFactory>,
    /// A collecting sink: every record received is also appended here.
    pub collect: Option<Collected<F::Out>>,
    /// Source (and async) subtasks.
    pub sources: usize,
    /// Sink subtasks.
    pub sinks: usize,
    /// The async operator's settings.
    pub async_config: AsyncConfig<F::Out>,
    /// The async function of each subtask.
    pub function: FunctionFactory<F>,
    /// The exchange.
    pub exchange: ExchangeSpec,
}

/// Live counters, for a progress display.
#[derive(Debug, Default)]
pub struct JobProgress {
    /// Records generated.
    pub generated: AtomicU64,
    /// Records received by the sinks.
    pub received: AtomicU64,
    /// Elements in the async operators.
    pub in_flight: AtomicU64,
}

/// What the job did.
#[derive(Debug, Clone)]
pub struct JobReport {
    /// Records generated.
    pub generated: u64,
    /// Records received by the sinks (duplicates included).
    pub received: u64,
    /// Ids received more than once.
    pub duplicates: u64,
    /// Ids never received.
    pub missing: u64,
    /// Records that reached a sink with a lower id than the one before them on the same
    /// channel (0 in ordered mode with one source subtask: order is kept end to end).
    pub reordered: u64,
    /// Source-to-sink latency, ns.
    pub latency_ns: Histogram<u64>,
    /// The async operators' counters, summed (the histogram merged).
    pub async_metrics: AsyncMetrics,
    /// Time the source tasks spent unable to emit (writer back-pressure), ns.
    pub backpressured_ns: u64,
    /// The runtime's report.
    pub run: RunReport,
}

struct SinkResult {
    seen: Vec<u64>,
    received: u64,
    duplicates: u64,
    reordered: u64,
    latency: Histogram<u64>,
}

/// Runs `spec` on `runtime` (which is consumed).
pub fn run_job<F>(
    mut runtime: Runtime,
    spec: JobSpec<F>,
    progress: Arc<JobProgress>,
) -> Result<JobReport, RuntimeError>
where
    F: AsyncFunction,
    F::In: From<SourceRecord>,
    F::Out: JobRecord,
{
    if spec.sources == 0 {
        return Err(ConfigError::ZeroCapacity {
            what: "source parallelism",
        }
        .into());
    }
    if spec.sinks == 0 {
        return Err(ConfigError::ZeroCapacity {
            what: "sink parallelism",
        }
        .into());
    }
    let workers = runtime.workers();
    let overdraft = crate::limits::OVERDRAFT_SEGMENTS_DEFAULT;
    let per_partition = spec.exchange.segments.max(spec.sinks);
    let network = NetworkBufferPool::new(
        spec.sources * (per_partition + overdraft) + 8,
        spec.exchange.segment_size,
    )?;
    let mut gates: Vec<Vec<Box<dyn InputChannel>>> = (0..spec.sinks).map(|_| Vec::new()).collect();
    let mut partitions = Vec::new();
    for source in 0..spec.sources {
        let worker = source % workers;
        let config = LocalPoolConfig::new(per_partition, spec.sinks)
            .with_max_per_subpartition(per_partition)
            .with_overdraft(overdraft);
        let pool = LocalBufferPool::with_notify(&network, config, runtime.unparker(worker))?;
        let mut senders = Vec::new();
        for (sink, gate) in gates.iter_mut().enumerate() {
            let sink_worker = (spec.sources + sink) % workers;
            let notify: Arc<dyn crate::park::Notify> = Arc::new(runtime.unparker(sink_worker));
            let (sender, receiver) = local_channel(per_partition + overdraft, Some(notify));
            senders.push(sender);
            gate.push(Box::new(receiver));
        }
        partitions.push(ResultPartition::new(pool, senders)?);
    }
    let metrics: Arc<Mutex<Vec<(AsyncMetrics, u64)>>> = Arc::new(Mutex::new(Vec::new()));
    let records = spec.generator.records;
    for (source, partition) in partitions.into_iter().enumerate() {
        let worker = source % workers;
        let function = Arc::clone(&spec.function);
        let config = spec.async_config.clone();
        let generator = spec.generator;
        let key_iter = spec.keys.clone();
        let sources = spec.sources;
        let timeout = spec.exchange.buffer_timeout;
        let progress = Arc::clone(&progress);
        let metrics = Arc::clone(&metrics);
        // Completions from other threads wake the source's worker.
        let unparker = runtime.unparker(worker);
        runtime.spawn(
            worker,
            Box::new(
                move |_driver: &mut dyn Driver| -> Result<Box<dyn Task>, TaskError> {
                    let (function, io) = function(source, unparker.clone());
                    let key_iter = key_iter.map(|make| make(source, sources));
                    let operator = AsyncWaitOperator::new(function, config, unparker)?;
                    let writer_config = WriterConfig {
                        buffer_timeout: timeout,
                        ..WriterConfig::default()
                    };
                    let selector = KeyHash::new(route::<F::Out> as fn(&F::Out) -> u64);
                    let writer = RecordWriter::new(partition, selector, writer_config)?;
                    Ok(Box::new(SourceTask::<F> {
                        subtask: source as u64,
                        sources: sources as u64,
                        next: 0,
                        count: match key_iter {
                            Some(_) => u64::MAX,
                            None => {
                                records / sources as u64
                                    + u64::from((source as u64) < records % sources as u64)
                            }
                        },
                        key_iter,
                        interval_ns: generator.rate.map(|r| (1e9 * sources as f64 / r) as u64),
                        start_ns: None,
                        keys: generator.keys,
                        rng: (generator.seed ^ (source as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                            | 1,
                        operator,
                        io,
                        writer,
                        overflow: VecDeque::new(),
                        phase: Phase::Running,
                        blocked_since: None,
                        backpressured_ns: 0,
                        progress,
                        metrics,
                    }))
                },
            ),
        );
    }
    let results: Arc<Mutex<Vec<SinkResult>>> = Arc::new(Mutex::new(Vec::new()));
    for (sink, channels) in gates.into_iter().enumerate() {
        let worker = (spec.sources + sink) % workers;
        let results = Arc::clone(&results);
        let collect = spec.collect.clone();
        let progress = Arc::clone(&progress);
        runtime.spawn(
            worker,
            Box::new(
                move |_driver: &mut dyn Driver| -> Result<Box<dyn Task>, TaskError> {
                    let gate = InputGate::<F::Out>::new(channels)?;
                    Ok(Box::new(SinkTask {
                        last_id: vec![None; gate.channels()],
                        gate,
                        seen: vec![0; (records as usize).div_ceil(64)],
                        received: 0,
                        duplicates: 0,
                        reordered: 0,
                        latency: Histogram::new_with_bounds(1, 60_000_000_000, 3)
                            .expect("static bounds"),
                        results,
                        progress,
                        reported: 0,
                        collect: collect.map(|shared| (Vec::new(), shared)),
                    }))
                },
            ),
        );
    }
    let run = runtime.run()?;
    drop(network);
    let mut sinks = std::mem::take(&mut *results.lock().unwrap_or_else(|e| e.into_inner()));
    let mut merged = vec![0u64; (records as usize).div_ceil(64)];
    let mut report = JobReport {
        generated: progress.generated.load(Ordering::Relaxed),
        received: 0,
        duplicates: 0,
        missing: 0,
        reordered: 0,
        latency_ns: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("static bounds"),
        async_metrics: AsyncMetrics::default(),
        backpressured_ns: 0,
        run,
    };
    for sink in sinks.drain(..) {
        report.received += sink.received;
        report.duplicates += sink.duplicates;
        report.reordered += sink.reordered;
        report.latency_ns.add(&sink.latency).expect("same bounds");
        for (word, bits) in merged.iter_mut().zip(&sink.seen) {
            report.duplicates += u64::from((*word & bits).count_ones());
            *word |= bits;
        }
    }
    let unique: u64 = merged.iter().map(|w| u64::from(w.count_ones())).sum();
    report.missing = records - unique;
    for (operator, backpressured) in metrics.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        report.async_metrics.merge(operator);
        report.backpressured_ns += backpressured;
    }
    Ok(report)
}

/// The job's exchange routing: a hash of the record's key.
type KeyRoute<T> = KeyHash<fn(&T) -> u64>;

fn route<T: JobRecord>(record: &T) -> u64 {
    record.key()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    Draining,
    Ending,
    Done,
}

/// Records a subtask handles per poll before yielding to its worker's other duties.
const POLL_BATCH_MAX: usize = 256;

struct SourceTask<F: AsyncFunction>
where
    F::Out: JobRecord,
{
    subtask: u64,
    sources: u64,
    next: u64,
    count: u64,
    key_iter: Option<Box<dyn Iterator<Item = u64>>>,
    interval_ns: Option<u64>,
    start_ns: Option<u64>,
    keys: KeyDistribution,
    rng: u64,
    operator: AsyncWaitOperator<F>,
    io: Option<Box<dyn IoHandler>>,
    writer: RecordWriter<F::Out, KeyRoute<F::Out>>,
    overflow: VecDeque<StreamElement<F::Out>>,
    phase: Phase,
    blocked_since: Option<u64>,
    backpressured_ns: u64,
    progress: Arc<JobProgress>,
    metrics: Arc<Mutex<Vec<(AsyncMetrics, u64)>>>,
}

impl<F: AsyncFunction> SourceTask<F>
where
    F::In: From<SourceRecord>,
    F::Out: JobRecord,
{
    fn next_key(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        match self.keys {
            KeyDistribution::Uniform { keys } => r % keys.max(1),
            KeyDistribution::Skewed {
                keys,
                hot_keys,
                hot_fraction,
            } => {
                let unit = (r >> 11) as f64 / (1u64 << 53) as f64;
                let r2 = r.rotate_left(32);
                if unit < hot_fraction {
                    r2 % hot_keys.max(1)
                } else {
                    r2 % keys.max(1)
                }
            }
        }
    }

    /// Moves operator output into the writer while it accepts.
    fn push_output(&mut self, now_ns: u64) -> Result<bool, TaskError> {
        let mut moved = false;
        if self.writer.has_pending() && !self.writer.resume(now_ns)? {
            return Ok(false);
        }
        while let Some(element) = self.overflow.front() {
            if !self.writer.is_available() {
                break;
            }
            match element {
                StreamElement::Record(record) => self.writer.emit(&record.value, now_ns)?,
                StreamElement::Watermark(w) => self.writer.emit_watermark(w.0, now_ns)?,
            }
            self.overflow.pop_front();
            moved = true;
        }
        Ok(moved)
    }
}

impl<F: AsyncFunction> Task for SourceTask<F>
where
    F::In: From<SourceRecord>,
    F::Out: JobRecord,
{
    fn poll(&mut self, cx: &mut TaskContext<'_>) -> Result<Progress, TaskError> {
        let now = cx.now_ns;
        let start = *self.start_ns.get_or_insert(now);
        let mut busy = self.operator.drain(now, &mut self.overflow)? > 0;
        while let Some(_deadline) = self.operator.fire_due_timer(now, &mut self.overflow)? {
            busy = true;
        }
        busy |= self.push_output(now)?;
        let mut generated = 0;
        while self.phase == Phase::Running && generated < POLL_BATCH_MAX {
            if self.next == self.count {
                // The source is done, but the operator's end of input waits until its
                // elements are out: Flink's finish would attempt waiting retries at once
                // and keep their outcome, and a job should not lose records to that.
                self.phase = Phase::Draining;
                break;
            }
            let intended = match self.interval_ns {
                Some(interval) => {
                    let at = start + self.next * interval;
                    if at > now {
                        break;
                    }
                    at
                }
                None => now,
            };
            if self.operator.is_full()
                || !self.writer.is_available()
                || self.overflow.len() >= POLL_BATCH_MAX
            {
                self.blocked_since.get_or_insert(now);
                break;
            }
            if let Some(since) = self.blocked_since.take() {
                self.backpressured_ns += now.saturating_sub(since);
            }
            let key = match self.key_iter.as_mut() {
                Some(keys) => match keys.next() {
                    Some(key) => key,
                    None => {
                        self.count = self.next;
                        continue;
                    }
                },
                None => self.next_key(),
            };
            let record = SourceRecord {
                id: self.subtask + self.next * self.sources,
                key,
                created_ns: intended,
            };
            self.next += 1;
            generated += 1;
            self.operator
                .process_record(record.into(), None, now, &mut self.overflow)?;
        }
        if generated > 0 {
            busy = true;
            self.progress
                .generated
                .fetch_add(generated as u64, Ordering::Relaxed);
        }
        if let Some(io) = self.io.as_mut() {
            io.flush(cx.driver, now);
        }
        busy |= self.push_output(now)?;
        self.writer.on_timer(now)?;
        if !self.writer.is_available() && self.writer.poll_ready(now)? {
            // Back-pressured: the pool's wake-up is now armed (a recycled buffer unparks
            // this worker), but a buffer came back meanwhile, so go on instead of parking.
            busy = true;
        }
        if self.phase == Phase::Draining {
            busy |= self.operator.drain(now, &mut self.overflow)? > 0;
            busy |= self.push_output(now)?;
            if self.operator.in_flight() == 0
                && self.overflow.is_empty()
                && !self.writer.has_pending()
            {
                self.operator.begin_finish(now, &mut self.overflow)?;
                self.operator.close();
                self.writer.finish(now)?;
                self.phase = Phase::Ending;
            }
        }
        if self.phase == Phase::Ending && self.writer.resume(now)? {
            self.phase = Phase::Done;
            let mut metrics = self.metrics.lock().unwrap_or_else(|e| e.into_inner());
            metrics.push((self.operator.metrics().clone(), self.backpressured_ns));
            return Ok(Progress::Done);
        }
        self.progress
            .in_flight
            .store(self.operator.in_flight() as u64, Ordering::Relaxed);
        Ok(if busy { Progress::Busy } else { Progress::Idle })
    }

    fn on_io(&mut self, event: &DriverEvent<'_>) -> bool {
        self.io.as_mut().is_some_and(|io| io.on_event(event))
    }

    fn next_deadline(&self) -> Option<u64> {
        let mut deadline = self.operator.next_timer_deadline();
        if let (Some(interval), Some(start), Phase::Running) =
            (self.interval_ns, self.start_ns, self.phase)
        {
            let at = start + self.next * interval;
            deadline = Some(deadline.map_or(at, |d| d.min(at)));
        }
        if let Some(flush) = self.writer.next_flush_deadline() {
            deadline = Some(deadline.map_or(flush, |d| d.min(flush)));
        }
        if let Some(io) = self.io.as_ref().and_then(|io| io.next_deadline()) {
            deadline = Some(deadline.map_or(io, |d| d.min(io)));
        }
        deadline
    }
}

struct SinkTask<T: JobRecord> {
    gate: InputGate<T>,
    last_id: Vec<Option<u64>>,
    seen: Vec<u64>,
    received: u64,
    duplicates: u64,
    reordered: u64,
    latency: Histogram<u64>,
    results: Arc<Mutex<Vec<SinkResult>>>,
    progress: Arc<JobProgress>,
    reported: u64,
    collect: Option<(Vec<T>, Collected<T>)>,
}

impl<T: JobRecord> Task for SinkTask<T> {
    fn poll(&mut self, cx: &mut TaskContext<'_>) -> Result<Progress, TaskError> {
        let mut busy = false;
        for _ in 0..POLL_BATCH_MAX * 4 {
            match self.gate.poll_next_at(cx.now_ns)? {
                Some(GateEvent::Record { value, channel }) => {
                    busy = true;
                    self.received += 1;
                    if self.last_id[channel].is_some_and(|last| last > value.id()) {
                        self.reordered += 1;
                    }
                    self.last_id[channel] = Some(value.id());
                    let id = value.id() as usize;
                    match self.seen.get_mut(id / 64) {
                        Some(word) => {
                            let bit = 1u64 << (id % 64);
                            if *word & bit != 0 {
                                self.duplicates += 1;
                            }
                            *word |= bit;
                        }
                        None => self.duplicates += 1,
                    }
                    self.latency
                        .saturating_record(cx.now_ns.saturating_sub(value.created_ns()).max(1));
                    if let Some((local, _)) = self.collect.as_mut() {
                        local.push(value);
                    }
                }
                Some(GateEvent::Watermark(_)) => busy = true,
                Some(GateEvent::End) => {
                    if let Some((local, shared)) = self.collect.take() {
                        shared
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .extend(local);
                    }
                    self.progress
                        .received
                        .fetch_add(self.received - self.reported, Ordering::Relaxed);
                    let result = SinkResult {
                        seen: std::mem::take(&mut self.seen),
                        received: self.received,
                        duplicates: self.duplicates,
                        reordered: self.reordered,
                        latency: self.latency.clone(),
                    };
                    self.results
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(result);
                    return Ok(Progress::Done);
                }
                None => break,
            }
        }
        if self.received - self.reported >= 1024 {
            self.progress
                .received
                .fetch_add(self.received - self.reported, Ordering::Relaxed);
            self.reported = self.received;
        }
        Ok(if busy { Progress::Busy } else { Progress::Idle })
    }
}
