//! The main job: embedded lookup service, `generator → async lookup → key-by
//! exchange → checking sink` over the workers, built with the job-graph API
//! ([`weir_engine::graph`]), with its record types, source, sink and report. The
//! lookups go to the lookup service or, with a [`RedisStore`], to Redis
//! (`GET weir:<key>`); the graph is the same either way.
//!
//! The source stamps each record with its creation time by the run's clock (an
//! open-loop source stamps its *intended* time, so a late source is charged:
//! coordinated omission is corrected); the sink checks that each id arrives exactly
//! once (a bitmap of ids per sink subtask, merged at the end), counts records that
//! arrive out of order from one source subtask, and records latency in an HDR
//! histogram.
//!
//! With [`StreamIo`] the job reads its records from Redis streams instead (entries as
//! `weir produce-stream` writes them: fields `id`, `key` and `t`, the time it was
//! produced) and appends each enriched record to a stream as well as checking it; or
//! from Kafka topics (messages as `weir produce-kafka` writes them: `id,key,t` as
//! text) and writes each enriched record to a topic.

mod keys;
mod records;
mod render;
mod restore;
mod sinks;
mod sources;

pub use keys::*;
pub use records::*;
pub use render::*;
pub use restore::*;
pub use sinks::*;
pub use sources::*;

use std::cell::RefCell;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use weir_engine::async_io::AsyncMetrics;
use weir_engine::async_io::{AsyncConfig, BatchConfig, OutputMode, RetryStrategy};
use weir_engine::checkpoint::{AlignmentMode, RestartStrategy, Restarts};
use weir_engine::graph::{
    latency_histogram, CheckpointReport, Checkpointing, ExchangeSpec, FileSink, Graph, GraphError,
    IoHandler, LiveCounters, SubtaskInfo,
};
use weir_engine::runtime::Controller;
use weir_engine::runtime::{Cores, RunReport, Runtime, RuntimeError};
use weir_net::cluster::TransportChannels;
use weir_net::kafka::{
    KafkaSink, KafkaSinkConfig, KafkaSinkStats, KafkaSource, KafkaSourceConfig, KafkaSourceStats,
};
use weir_net::lookup::{
    format_duration, ClientConfig, ClientIo, LookupBatchFunction, LookupClient, LookupFunction,
    LookupRequest,
};
use weir_net::redis::streams::{
    stream_sink, stream_source, Fields, StreamSinkConfig, StreamSourceConfig,
};
use weir_net::redis::{
    RedisBatchFunction, RedisClient, RedisConfig, RedisError, RedisFunction, RedisIo, SharedStats,
};
use weir_net::transport::{JobId, TransportConfig};
use weir_net::{DriverKind, NetError};

/// Why `weir run` cannot run, or why its job stopped: each message says what to change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// `--cores 0` or an empty list.
    #[error("--cores asks for no workers; a job needs at least one (use --cores 1 or more)")]
    NoWorkers,
    /// More workers than the cores this process may run on.
    #[error(
        "--cores {requested} asks for more workers than the {cores} cores this process may \
         run on; use --cores {cores} or fewer, or add --oversubscribe to let workers share cores"
    )]
    TooManyWorkers {
        /// Workers asked for.
        requested: usize,
        /// Cores available.
        cores: usize,
    },
    /// A listed core this process may not run on.
    #[error(
        "--cores lists core {core}, which this process may not run on; \
         list cores from {available}"
    )]
    NoSuchCore {
        /// The core listed.
        core: usize,
        /// The cores it may run on, as a list.
        available: String,
    },
    /// A core listed twice.
    #[error(
        "--cores lists core {core} more than once; list each core once, or add \
         --oversubscribe to put several workers on it"
    )]
    CoreTwice {
        /// The core listed.
        core: usize,
    },
    /// `--cores` that is neither a count nor a list of core ids.
    #[error("--cores takes a count or a comma-separated list of core ids, got {0:?}")]
    BadCores(String),
    /// The job would need more memory than the machine has available.
    #[error(
        "{workers} would need about {needed} for the exchange and the sinks, more than the \
         {available} this machine has available; use fewer workers (--cores) or fewer records"
    )]
    NotEnoughMemory {
        /// "N workers and M records".
        workers: String,
        /// What the job would allocate, in words.
        needed: String,
        /// `MemAvailable`, in words.
        available: String,
    },
    /// The `--json` path cannot be written.
    #[error(
        "cannot write the JSON report to {}: {source}; give --json a path in a writable \
         directory",
        path.display()
    )]
    Json {
        /// The path given.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Another invalid setting.
    #[error("{0}")]
    Setting(String),
    /// The embedded lookup service did not start.
    #[error("cannot start the embedded lookup service: {0}")]
    Service(#[source] NetError),
    /// The lookup client refused its settings.
    #[error("invalid lookup client settings: {0}")]
    Client(#[source] NetError),
    /// The Redis client refused its settings, or the server's address did not resolve.
    #[error("--store: {0}")]
    Store(#[source] RedisError),
    /// This process could not join the other processes of the job.
    #[error("cluster: {0}")]
    Cluster(#[source] weir_net::transport::TransportError),
    /// The runtime or the job failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The thread running the job panicked (a bug; its message is on stderr).
    #[error("the job's thread panicked; this is a bug in Weir, please report it")]
    Panicked,
}

impl RunError {
    /// The process exit status: 2 for settings to change, 1 for a run that failed.
    pub fn exit_code(&self) -> i32 {
        match self {
            RunError::Service(_)
            | RunError::Runtime(_)
            | RunError::Cluster(_)
            | RunError::Panicked => 1,
            _ => 2,
        }
    }
}

/// "1 worker", "2 workers".
pub fn workers_text(workers: usize) -> String {
    if workers == 1 {
        "1 worker".into()
    } else {
        format!("{workers} workers")
    }
}

/// The output mode as `--mode` takes it.
pub fn mode_name(mode: OutputMode) -> &'static str {
    match mode {
        OutputMode::Ordered => "ordered",
        OutputMode::Unordered => "unordered",
        OutputMode::KeyedOrdered => "keyed",
    }
}

/// Core ids as a short list: `0-3, 6, 8-9`.
pub fn cores_text(cores: &[usize]) -> String {
    let mut sorted = cores.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        parts.push(match j - i {
            0 => sorted[i].to_string(),
            1 => format!("{}, {}", sorted[i], sorted[j]),
            _ => format!("{}-{}", sorted[i], sorted[j]),
        });
        i = j + 1;
    }
    parts.join(", ")
}

/// Bytes in words: `512 KiB`, `3.2 GiB`.
pub fn bytes_text(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Where the workers run: one per core of this machine unless `--oversubscribe`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerPlan {
    /// What the runtime is given.
    pub cores: Cores,
    /// The core of each worker (where it is pinned unless `--no-pin`).
    pub placement: Vec<usize>,
    /// The cores this process may run on.
    pub machine: Vec<usize>,
}

impl WorkerPlan {
    /// The cores this process may run on (its affinity mask).
    pub fn machine_cores() -> Vec<usize> {
        match core_affinity::get_core_ids() {
            Some(ids) if !ids.is_empty() => ids.into_iter().map(|c| c.id).collect(),
            _ => (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect(),
        }
    }

    /// The plan for `--cores` (`None`: one worker per core), checked against the
    /// machine's cores before anything is allocated.
    pub fn new(cores: Option<&str>, oversubscribe: bool) -> Result<Self, RunError> {
        Self::for_machine(cores, oversubscribe, Self::machine_cores())
    }

    /// As [`new`](Self::new), on a machine with these cores.
    pub fn for_machine(
        cores: Option<&str>,
        oversubscribe: bool,
        machine: Vec<usize>,
    ) -> Result<Self, RunError> {
        let text = cores.map(str::trim);
        let (cores, placement) = match text {
            None => (Cores::Count(machine.len()), machine.clone()),
            Some(text) if !text.contains(',') && text.parse::<usize>().is_ok() => {
                let count: usize = text.parse().unwrap_or(0);
                if count == 0 {
                    return Err(RunError::NoWorkers);
                }
                if count > machine.len() && !oversubscribe {
                    return Err(RunError::TooManyWorkers {
                        requested: count,
                        cores: machine.len(),
                    });
                }
                // As the runtime places them: worker i on the i-th core, round robin.
                let placement = (0..count).map(|i| machine[i % machine.len()]).collect();
                (Cores::Count(count), placement)
            }
            Some(text) => {
                // A trailing comma makes one core id a list: `3,` is core 3, `3` three
                // workers.
                let list = text
                    .split(',')
                    .filter(|c| !c.trim().is_empty())
                    .map(|c| c.trim().parse::<usize>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| RunError::BadCores(text.to_string()))?;
                if list.is_empty() {
                    return Err(RunError::NoWorkers);
                }
                for (i, &core) in list.iter().enumerate() {
                    if !machine.contains(&core) {
                        return Err(RunError::NoSuchCore {
                            core,
                            available: cores_text(&machine),
                        });
                    }
                    if !oversubscribe && list[..i].contains(&core) {
                        return Err(RunError::CoreTwice { core });
                    }
                }
                (Cores::List(list.clone()), list)
            }
        };
        Ok(WorkerPlan {
            cores,
            placement,
            machine,
        })
    }

    /// Workers.
    pub fn workers(&self) -> usize {
        self.placement.len()
    }

    /// A core no worker runs on, for the embedded lookup service.
    pub fn free_core(&self) -> Option<usize> {
        self.machine
            .iter()
            .copied()
            .find(|core| !self.placement.contains(core))
    }
}

/// Bytes `MemAvailable` in `/proc/meminfo` says, if it can be read.
pub fn memory_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// What the job allocates that grows with its workers and records: the exchange (the
/// network buffer pool and a channel per source and sink), each sink's bitmap of the
/// ids it received (and their merge), and each source's in-flight state.
pub fn memory_needed(workers: usize, records: u64, capacity: usize) -> u64 {
    let exchange = ExchangeSpec::default().sizing(workers, workers).bytes() as u64;
    let bitmap = records.div_ceil(64).saturating_mul(8);
    let bitmaps = bitmap.saturating_mul(workers as u64 + 1);
    // Slab entry, lookup client request and output queue slot per in-flight record.
    let in_flight = (workers as u64)
        .saturating_mul(capacity as u64)
        .saturating_mul(1024);
    exchange.saturating_add(bitmaps).saturating_add(in_flight)
}

/// Refuses a job that would not fit in the memory this machine has available.
pub fn check_memory(workers: usize, records: u64, capacity: usize) -> Result<(), RunError> {
    let Some(available) = memory_available() else {
        return Ok(());
    };
    let needed = memory_needed(workers, records, capacity);
    if needed > available {
        return Err(RunError::NotEnoughMemory {
            workers: format!("{} and {records} records", workers_text(workers)),
            needed: bytes_text(needed),
            available: bytes_text(available),
        });
    }
    Ok(())
}

/// How long idle workers poll before they park: `WEIR_SPIN` (e.g. `100us`; see
/// `RuntimeBuilder::spin`), by default not at all.
pub fn spin_from_env() -> Result<Duration, String> {
    match std::env::var("WEIR_SPIN") {
        Ok(text) => weir_net::lookup::parse_duration(&text)
            .map_err(|e| format!("WEIR_SPIN={text:?}: {e}; write e.g. 100us")),
        Err(_) => Ok(Duration::ZERO),
    }
}

/// Settings of one run of the main job.
#[derive(Clone)]
pub struct JobSettings {
    /// Records in all.
    pub records: u64,
    /// Records per second (open loop), or as fast as possible.
    pub rate: Option<f64>,
    /// Output mode of the async operator.
    pub mode: OutputMode,
    /// Async capacity per subtask.
    pub capacity: usize,
    /// Async timeout: a record's limit over all its attempts (Flink's rule).
    pub timeout: Duration,
    /// Attempts after the first.
    pub retries: u32,
    /// Retry delay.
    pub retry_delay: Duration,
    /// Workers.
    pub cores: Cores,
    /// Pin workers.
    pub pin: bool,
    /// Driver.
    pub driver: DriverKind,
    /// The workers' timer slack ([`RuntimeBuilder::timer_slack`](weir_engine::runtime::RuntimeBuilder::timer_slack)).
    pub timer_slack: Duration,
    /// The lookup service.
    pub service: SocketAddr,
    /// Connections per source subtask.
    pub connections: usize,
    /// Distinct keys (and the skew).
    pub keys: KeyDistribution,
    /// Exchange buffer timeout.
    pub buffer_timeout: Option<Duration>,
    /// Write the lookup as an `async` block (futures adapter) instead of a callback.
    pub futures: bool,
    /// Lookups at the service as batch requests of up to this many keys (the batched
    /// async operator, batch timeout 0: each task turn's records); `None`: a request
    /// per record.
    pub lookup_batch: Option<usize>,
    /// An iterator source instead of the generator (`records` = what it yields in all).
    pub key_iter: Option<KeyIterFactory>,
    /// A collecting sink (tests).
    pub collect: Option<Collected<Enriched>>,
    /// This process's place when the job spans processes (`None`: all of it here).
    pub cluster: Option<ClusterSettings>,
    /// Checkpoints, and the one to restore from.
    pub checkpoints: Option<JobCheckpoints>,
    /// Also write each record's id, key and value as exactly-once part files here
    /// (committed at checkpoints; at the end without them).
    pub output: Option<PathBuf>,
    /// Redis streams in and out instead of the generator and beside the checking sink.
    pub streams: StreamIo,
    /// Ends the job's input from another thread (Ctrl-C).
    pub stop: JobStop,
}

/// The main job's input and output logs, Redis streams or Kafka topics: records read
/// from them instead of generated, and each enriched record written to one.
#[derive(Clone, Default)]
pub struct StreamIo {
    /// Where the records come from (`weir run --source redis-stream://…`), instead of
    /// the generator.
    pub source: Option<StreamSourceConfig>,
    /// Where the enriched records also go (`weir run --sink redis-stream://…`).
    pub sink: Option<StreamSinkConfig>,
    /// Where the records come from (`weir run --source kafka://…`), instead of the
    /// generator, with the counters its subtasks share.
    pub kafka_source: Option<(KafkaSourceConfig, Arc<KafkaSourceStats>)>,
    /// Where the enriched records also go (`weir run --sink kafka://…`), with the
    /// counters its subtasks share.
    pub kafka_sink: Option<(KafkaSinkConfig, Arc<KafkaSinkStats>)>,
}

impl StreamIo {
    /// Whether the records are read from a log (ids as written there), not generated.
    pub fn reads_input(&self) -> bool {
        self.source.is_some() || self.kafka_source.is_some()
    }
}

/// Stops a running job with drain from another thread (`weir run` on Ctrl-C): its
/// sources end, what they emitted flows through and the sinks finish, so the report is
/// whole. The way to end a job over an unbounded stream.
#[derive(Clone, Default)]
pub struct JobStop(Arc<std::sync::Mutex<(bool, Option<Controller>)>>);

impl JobStop {
    /// Ends the job's input (now, or as soon as it starts); a failed job is not
    /// restarted after this.
    pub fn stop(&self) {
        let mut state = self.0.lock().unwrap_or_else(|e| e.into_inner());
        state.0 = true;
        if let Some(controller) = &state.1 {
            controller.end_input();
        }
    }

    /// Whether [`stop`](Self::stop) was called.
    pub fn requested(&self) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    fn attach(&self, controller: Controller) {
        let mut state = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if state.0 {
            controller.end_input();
        }
        state.1 = Some(controller);
    }
}

/// How the main job checkpoints.
#[derive(Debug, Clone)]
pub struct JobCheckpoints {
    /// Between checkpoints.
    pub interval: Duration,
    /// Where they go.
    pub dir: PathBuf,
    /// Barrier alignment.
    pub alignment: AlignmentMode,
    /// A checkpoint (or a directory of them: the newest valid) to start from.
    pub restore: Option<PathBuf>,
    /// Completed checkpoints kept (at least 1).
    pub retain: usize,
    /// What a failure does.
    pub restart: RestartStrategy,
    /// Checkpoint figures for a metrics endpoint.
    pub gauges: Option<Arc<weir_net::metrics::CheckpointGauges>>,
}

/// One process of a job over several: its index and every process's transport address
/// (its own included), the same list in every process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSettings {
    /// This process's index in `peers`.
    pub process: usize,
    /// Each process's transport address.
    pub peers: Vec<SocketAddr>,
    /// The cluster secret the processes share, if any.
    pub secret: Option<weir_net::transport::Secret>,
}

/// How long a process of a cluster waits for the others to start, and for its
/// consumers to take what it produced.
pub const CLUSTER_WAIT: Duration = Duration::from_secs(60);

impl JobSettings {
    /// The time each attempt of a lookup gets: the timeout covers all attempts, so a
    /// request the service never answers fails (retryably) early enough for its
    /// retries to run within it.
    pub fn attempt_timeout(&self) -> Duration {
        self.timeout / (self.retries.saturating_add(1))
    }

    /// The timeout in words: `1s` or `1s over 3 attempts (333.333ms each)`.
    pub fn timeout_text(&self) -> String {
        if self.retries == 0 {
            format_duration(self.timeout)
        } else {
            format!(
                "{} over {} attempts ({} each)",
                format_duration(self.timeout),
                u64::from(self.retries) + 1,
                format_duration(self.attempt_timeout())
            )
        }
    }
}

/// A job that ran, to its end or until it failed.
pub struct Finished {
    /// What its tasks did (up to the failure, if any).
    pub report: JobReport,
    /// Wall time.
    pub elapsed: Duration,
    /// Why it stopped early.
    pub failure: Option<RuntimeError>,
}

/// Live counters of the job, for the progress display.
pub type JobProgress = LiveCounters;

/// A run's checkpoints in figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CheckpointSummary {
    /// Completed.
    pub completed: u64,
    /// Failed.
    pub failed: u64,
    /// Trigger to completion, median.
    pub duration_p50: Duration,
    /// Trigger to completion, longest.
    pub duration_max: Duration,
    /// Longest alignment of each checkpoint, median.
    pub alignment_p50: Duration,
    /// Longest alignment, longest.
    pub alignment_max: Duration,
    /// The last checkpoint's size.
    pub last_size: u64,
}

impl CheckpointSummary {
    /// The figures of `report`.
    pub fn of(report: &CheckpointReport) -> Self {
        let median = |values: &[Duration]| {
            let mut sorted = values.to_vec();
            sorted.sort_unstable();
            sorted.get(sorted.len() / 2).copied().unwrap_or_default()
        };
        let stats = &report.stats;
        CheckpointSummary {
            completed: stats.completed,
            failed: stats.failed,
            duration_p50: median(&stats.durations),
            duration_max: stats.durations.iter().max().copied().unwrap_or_default(),
            alignment_p50: median(&stats.alignments),
            alignment_max: stats.alignments.iter().max().copied().unwrap_or_default(),
            last_size: stats.sizes.last().copied().unwrap_or_default(),
        }
    }
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
    /// Ids never received (in one process of a cluster: not known here, 0; the
    /// launcher adds up `unique` over the processes).
    pub missing: u64,
    /// Distinct ids received.
    pub unique: u64,
    /// Records that reached a sink with a lower id than the one before them from the
    /// same source subtask (0 in ordered mode: order is kept end to end per channel).
    pub reordered: u64,
    /// Source-to-sink latency, ns.
    pub latency_ns: Histogram<u64>,
    /// The async operators' counters, summed (the histogram merged).
    pub async_metrics: AsyncMetrics,
    /// Time the source tasks spent unable to emit (async operator full or writer
    /// back-pressure), ns.
    pub backpressured_ns: u64,
    /// The runtime's report.
    pub run: RunReport,
    /// Over several processes: why connections to other processes broke, if any did.
    pub lost_connections: Vec<String>,
    /// Its checkpoints, when it took them (of its last run after restarts).
    pub checkpoints: Option<CheckpointReport>,
    /// Restarts after failures.
    pub restarts: u32,
    /// When the first record reached a sink, in ns since the Unix epoch.
    pub first_output_unix_ns: Option<u64>,
}

/// Builds and runs the job; returns its report and wall time, or why it failed.
pub fn run(
    settings: &JobSettings,
    progress: Arc<JobProgress>,
) -> Result<(JobReport, Duration), RunError> {
    finished_ok(run_to_end(settings, progress)?)
}

/// [`run`] with the lookups going to Redis instead of the lookup service
/// (`settings.service` and `settings.futures` are not used).
pub fn run_redis(
    settings: &JobSettings,
    store: &RedisStore,
    progress: Arc<JobProgress>,
) -> Result<(JobReport, Duration), RunError> {
    finished_ok(run_redis_to_end(settings, store, progress)?)
}

fn finished_ok(finished: Finished) -> Result<(JobReport, Duration), RunError> {
    match finished.failure {
        None => Ok((finished.report, finished.elapsed)),
        Some(error) => Err(error.into()),
    }
}

/// Builds and runs the job to its end, successful or not: a job that fails (lookups
/// timed out or failed after their retries) still reports what it did. `Err` when it
/// could not start.
pub fn run_to_end(
    settings: &JobSettings,
    progress: Arc<JobProgress>,
) -> Result<Finished, RunError> {
    run_to_end_cached(settings, None, progress)
}

/// [`run_to_end`] with a lookup cache in front of the lookups (`--cache`).
pub fn run_to_end_cached(
    settings: &JobSettings,
    cache: Option<CacheSettings>,
    progress: Arc<JobProgress>,
) -> Result<Finished, RunError> {
    let client_config = ClientConfig {
        addr: settings.service,
        connections: settings.connections,
        capacity: settings.capacity * 4 + 64,
        request_timeout: settings.attempt_timeout(),
        connect_timeout: ClientConfig::CONNECT_TIMEOUT_DEFAULT,
    };
    // Checked here, once, so that making each subtask's client cannot fail.
    LookupClient::<Lookup>::new(client_config.clone()).map_err(RunError::Client)?;
    execute_restarting(settings, cache, progress, Store::Service(client_config))
}

/// [`run_to_end`] with the lookups going to Redis.
pub fn run_redis_to_end(
    settings: &JobSettings,
    store: &RedisStore,
    progress: Arc<JobProgress>,
) -> Result<Finished, RunError> {
    run_redis_to_end_cached(settings, None, store, progress)
}

/// [`run_redis_to_end`] with a lookup cache in front of the lookups (`--cache`).
pub fn run_redis_to_end_cached(
    settings: &JobSettings,
    cache: Option<CacheSettings>,
    store: &RedisStore,
    progress: Arc<JobProgress>,
) -> Result<Finished, RunError> {
    let config = store.client_config(settings);
    // Checked (and the address resolved) here, once, so that making each subtask's
    // client cannot fail.
    let addr = config.check().map_err(RunError::Store)?;
    let stats = Arc::clone(&store.stats);
    execute_restarting(
        settings,
        cache,
        progress,
        Store::Redis(config, addr, stats, store.mget),
    )
}

/// Runs the job, and when it fails (a task's error or panic, failed checkpoints)
/// restarts it from its latest completed checkpoint as its restart strategy allows.
fn execute_restarting(
    settings: &JobSettings,
    cache: Option<CacheSettings>,
    progress: Arc<JobProgress>,
    store: Store,
) -> Result<Finished, RunError> {
    let Some(checkpoints) = &settings.checkpoints else {
        return execute(settings, cache, progress, store);
    };
    if settings.cluster.is_some() {
        // One process of several cannot restart alone: its failure ends it, and the
        // launcher (or the user's supervisor) restarts every process.
        return execute(settings, cache, progress, store);
    }
    checkpoints
        .restart
        .validate()
        .map_err(|e| RunError::Setting(e.to_string()))?;
    let mut restarts = Restarts::new(checkpoints.restart.clone(), Instant::now());
    let mut settings = settings.clone();
    loop {
        let mut finished = execute(&settings, cache, Arc::clone(&progress), store.clone())?;
        let restartable = matches!(
            finished.failure,
            Some(
                RuntimeError::Task { .. }
                    | RuntimeError::Panic { .. }
                    | RuntimeError::Checkpoint(_)
            )
        );
        if let (true, Some(error), false) =
            (restartable, &finished.failure, settings.stop.requested())
        {
            if let Some(delay) = restarts.on_failure(Instant::now()) {
                let from =
                    match weir_engine::checkpoint::storage::newest_completed(&checkpoints.dir) {
                        Ok(Some(id)) => format!("from checkpoint {id} (the latest completed)"),
                        Ok(None) => format!(
                            "from the start (no checkpoint ever completed under {})",
                            checkpoints.dir.display()
                        ),
                        Err(e) => format!("from the latest completed checkpoint ({e})"),
                    };
                eprintln!(
                    "weir: the job failed ({error}); restart {} in {} {from}",
                    restarts.total(),
                    format_duration(delay)
                );
                std::thread::sleep(delay);
                // From the newest completed checkpoint, or from the start if none ever
                // completed; one that cannot be read fails the run (by name) instead.
                let checkpoints = settings.checkpoints.as_mut().expect("checked");
                checkpoints.restore = Some(checkpoints.dir.clone());
                continue;
            }
        }
        finished.report.restarts = restarts.total();
        return Ok(finished);
    }
}

/// Where the job's lookups go, with its checked client settings.
#[derive(Clone)]
enum Store {
    /// The lookup service.
    Service(ClientConfig),
    /// Redis at the resolved address, its clients adding to the shared counters, and
    /// the keys per `MGET` when the lookups are batched.
    Redis(RedisConfig, SocketAddr, Arc<SharedStats>, Option<usize>),
}

/// Builds the job's graph with its lookups going to `store`, and runs it to its end.
fn execute(
    settings: &JobSettings,
    cache: Option<CacheSettings>,
    progress: Arc<JobProgress>,
    store: Store,
) -> Result<Finished, RunError> {
    let spin = spin_from_env().map_err(RunError::Setting)?;
    let driver_kind = settings.driver;
    let runtime = Runtime::builder()
        .cores(settings.cores.clone())
        .pin(settings.pin)
        .spin(spin)
        .timer_slack(settings.timer_slack)
        .driver(Arc::new(move || {
            weir_net::build_driver(driver_kind).map_err(|e| std::io::Error::other(e.to_string()))
        }))
        .build()?;
    let workers = runtime.workers();
    eprintln!(
        "weir: {} on the {} driver",
        workers_text(workers),
        runtime.driver_name(0)
    );
    let mut async_config =
        AsyncConfig::new(settings.mode, settings.capacity).with_timeout(settings.timeout);
    if settings.retries > 0 {
        // `--retries` retries every failed lookup (errors and closed connections): the
        // explicit retry-all, since a strategy retries nothing by itself.
        async_config = async_config.with_retry(
            RetryStrategy::fixed_delay(settings.retries + 1, settings.retry_delay)
                .retry_on_any_error(),
        );
    }
    if let Some(cache) = &cache {
        async_config = async_config.with_cache(cache.lookup_cache());
    }
    // Where this run starts: refused here, before anything starts, when the newest
    // completed checkpoint cannot be read, or when a fresh start would write output
    // that is already committed.
    match (check_start(settings)?, &settings.checkpoints) {
        (StartPoint::Checkpoint(id), Some(checkpoints)) => eprintln!(
            "weir: restoring checkpoint {id} from {}",
            checkpoints
                .restore
                .as_deref()
                .unwrap_or(&checkpoints.dir)
                .display()
        ),
        (StartPoint::Fresh, Some(checkpoints)) => {
            if let Some(restore) = &checkpoints.restore {
                eprintln!(
                    "weir: starting from the beginning: no checkpoint ever completed under {}",
                    restore.display()
                );
            }
        }
        _ => {}
    }
    // Over several processes: what the crashed run left unfinished goes first, in
    // process 0 before its transport starts, which no other process's run can pass.
    if let (Some(cluster), Some(checkpoints)) = (&settings.cluster, &settings.checkpoints) {
        if cluster.process == 0 {
            weir_engine::checkpoint::CheckpointStore::open(&checkpoints.dir, 1)
                .and_then(|store| store.discard_unfinished())
                .map_err(|e| RunError::Setting(e.to_string()))?;
        }
    }
    // Over several processes: this process's transport, once every peer listens.
    let transport = match &settings.cluster {
        Some(cluster) => {
            // What every process must agree on to run the same job: the settings that
            // shape its graph and data, the worker layout and the peers. A process
            // started with others is refused in the handshake, not after a timeout.
            let description = format!(
                "weir run main job; records {}; rate {:?}; mode {:?}; capacity {}; keys {:?}; \
                 buffer timeout {:?}; iterator source {}; workers per process {workers}; \
                 peers {:?}",
                settings.records,
                settings.rate,
                settings.mode,
                settings.capacity,
                settings.keys,
                settings.buffer_timeout,
                settings.key_iter.is_some(),
                cluster.peers,
            );
            let config = TransportConfig {
                listen: cluster.peers[cluster.process],
                secret: cluster.secret.clone(),
                job: JobId::of(description.as_bytes()),
                ..TransportConfig::new(cluster.process as u32)
            };
            let channels = Arc::new(
                TransportChannels::with_config(config, &cluster.peers)
                    .map_err(RunError::Cluster)?,
            );
            channels
                .wait_for_peers(CLUSTER_WAIT)
                .map_err(RunError::Cluster)?;
            Some(channels)
        }
        None => None,
    };
    let processes = settings.cluster.as_ref().map_or(1, |c| c.peers.len());
    // Every stage has a subtask per worker of the whole job.
    let subtasks = workers * processes;
    let mut graph = Graph::new()
        .with_parallelism(subtasks)
        .with_live(progress)
        .with_exchange(ExchangeSpec {
            buffer_timeout: settings.buffer_timeout,
            ..ExchangeSpec::default()
        });
    if let Some(channels) = &transport {
        graph = graph.with_cluster(channels.cluster());
    }
    if let Some(checkpoints) = &settings.checkpoints {
        let gauges = checkpoints.gauges.clone().unwrap_or_default();
        let failures = Arc::clone(&gauges);
        let mut checkpointing = Checkpointing::new(&checkpoints.dir, checkpoints.interval)
            .with_alignment(checkpoints.alignment)
            .with_abort_listener(move |_, _| {
                failures
                    .failed
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            })
            .with_listener(move |metadata, alignment| {
                gauges.record(
                    metadata.id,
                    metadata.duration,
                    metadata.state_bytes(),
                    alignment,
                );
                eprintln!(
                    "weir: checkpoint {} complete: {}, {} (alignment {})",
                    metadata.id,
                    bytes_text(metadata.state_bytes()),
                    format_duration(metadata.duration),
                    format_duration(alignment),
                );
            });
        checkpointing.config.retain = checkpoints.retain;
        if let Some(path) = &checkpoints.restore {
            checkpointing = checkpointing.restore_from(path);
        }
        graph = graph.with_checkpointing(checkpointing);
    }
    let source = match (&settings.streams.source, &settings.streams.kafka_source) {
        (_, Some((config, stats))) => {
            let (config, stats) = (config.clone(), Arc::clone(stats));
            let wall = settings.cluster.is_some();
            graph
                .from_source(move |info| KafkaInput {
                    inner: KafkaSource::new(&config, info, kafka_record_fields)
                        .with_stats(Arc::clone(&stats)),
                    fields: |fields| Ok(*fields),
                    offset: None,
                    wall,
                })
                .name("kafka source")
        }
        (Some(config), None) => {
            let config = config.clone();
            let wall = settings.cluster.is_some();
            graph
                .from_source_io(move |info| {
                    let (inner, io) = stream_source(&config, info);
                    let input = StreamInput {
                        inner,
                        fields: |entry| record_fields(entry),
                        offset: None,
                        wall,
                    };
                    (input, io)
                })
                .name("redis-stream source")
        }
        (None, None) => {
            let source_settings = settings.clone();
            graph
                .from_source(move |info| MainSource::new(&source_settings, info))
                .name("generator")
        }
    };
    let enriched = match store {
        Store::Redis(config, addr, stats, mget) => {
            // `--mget N`: the operator cuts each turn's lookups into batches of up to N,
            // and each batch goes as one MGET.
            let client = move || {
                let client = RedisClient::<Lookup>::with_addr(config.clone(), addr)
                    .expect("client settings checked up front")
                    .with_shared_stats(Arc::clone(&stats));
                let client = Rc::new(RefCell::new(client));
                let io: Box<dyn IoHandler> = Box::new(RedisIo(Rc::clone(&client)));
                (client, Some(io))
            };
            match mget {
                Some(max_keys) => source.async_wait_batch(
                    move |_| {
                        let (client, io) = client();
                        (RedisBatchFunction::new(client), io)
                    },
                    async_config,
                    BatchConfig::new(max_keys, Duration::ZERO),
                ),
                None => source.async_wait_io(
                    move |_| {
                        let (client, io) = client();
                        (RedisFunction::new(client), io)
                    },
                    async_config,
                ),
            }
        }
        Store::Service(client_config) if settings.futures => source.async_wait_futures(
            move |_| {
                let client = Rc::new(RefCell::new(
                    LookupClient::<Lookup>::new(client_config.clone())
                        .expect("client settings validated up front"),
                ));
                let lookups = Rc::clone(&client);
                let call = move |input: &Lookup| {
                    let get = lookups.borrow_mut().get(input.0.key);
                    let input = *input;
                    async move {
                        let value = get.await?;
                        Ok(vec![LookupRequest::complete(input, &value)])
                    }
                };
                let io: Box<dyn IoHandler> = Box::new(ClientIo(client));
                (call, Some(io))
            },
            async_config,
        ),
        Store::Service(client_config) if settings.lookup_batch.is_some() => {
            let max = settings.lookup_batch.unwrap_or(1);
            source.async_wait_batch(
                move |_| {
                    let client = Rc::new(RefCell::new(
                        LookupClient::<Lookup>::new(client_config.clone())
                            .expect("client settings validated up front"),
                    ));
                    let io: Box<dyn IoHandler> = Box::new(ClientIo(Rc::clone(&client)));
                    (LookupBatchFunction::new(client), Some(io))
                },
                async_config,
                BatchConfig::new(max, Duration::ZERO),
            )
        }
        Store::Service(client_config) => source.async_wait_io(
            move |_| {
                let client = Rc::new(RefCell::new(
                    LookupClient::<Lookup>::new(client_config.clone())
                        .expect("client settings validated up front"),
                ));
                let io: Box<dyn IoHandler> = Box::new(ClientIo(Rc::clone(&client)));
                (LookupFunction::new(client), Some(io))
            },
            async_config,
        ),
    };
    let results: Arc<std::sync::Mutex<Vec<SinkResult>>> = Arc::default();
    let first_output = Arc::new(AtomicU64::new(u64::MAX));
    let from_streams = settings.streams.reads_input();
    let records = if from_streams { 0 } else { settings.records };
    let wall_clock = settings.cluster.is_some();
    {
        let results = Arc::clone(&results);
        let collect = settings.collect.clone();
        let live = graph.live();
        let output = settings.output.clone();
        let first_output = Arc::clone(&first_output);
        let check = move || CheckSink {
            sources: subtasks as u64,
            last_id: vec![None; subtasks],
            seen: touched_bitmap((records as usize).div_ceil(64)),
            received: 0,
            duplicates: 0,
            reordered: 0,
            latency: latency_histogram(),
            results: Arc::clone(&results),
            live: Arc::clone(&live),
            first_output: Arc::clone(&first_output),
            reported: 0,
            collect: collect.clone().map(|shared| (Vec::new(), shared)),
            published: false,
            wall: wall_clock.then(WallClock::default),
            from_streams,
        };
        let keyed = enriched.key_by(|record: &Enriched| record.key);
        match (
            output,
            settings.streams.sink.clone(),
            settings.streams.kafka_sink.clone(),
        ) {
            (_, _, Some((config, stats))) => keyed.sink(move |info: &SubtaskInfo| KafkaOutput {
                check: check(),
                out: KafkaSink::new(&config, info, kafka_value).with_stats(Arc::clone(&stats)),
                wall: (!wall_clock).then(WallClock::default),
            }),
            (_, Some(config), None) => keyed.sink_io(move |info: &SubtaskInfo| {
                let format: fn(&Enriched, &mut Fields) = stream_fields;
                let (out, io) = stream_sink(&config, info, format);
                let sink = StreamOut {
                    check: check(),
                    out,
                    wall: (!wall_clock).then(WallClock::default),
                };
                (sink, io)
            }),
            (None, None, None) => keyed.sink(move |_| check()),
            (Some(dir), None, None) => keyed.sink(move |info: &SubtaskInfo| OutputSink {
                check: check(),
                files: FileSink::new(
                    dir.clone(),
                    info.index,
                    info.checkpointing,
                    output_line as fn(&Enriched, &mut Vec<u8>),
                ),
            }),
        }
    }
    let live = graph.live();
    let started = Instant::now();
    let job = graph.start(runtime).map_err(|error| match error {
        GraphError::Runtime(error) => RunError::Runtime(error),
        error => RunError::Setting(error.to_string()),
    })?;
    settings.stop.attach(job.controller());
    let (result, failure) = job.join();
    let elapsed = started.elapsed();
    if let Some(channels) = &transport {
        // Keep serving until the other processes have everything this one produced.
        if failure.is_none() {
            channels.drain(CLUSTER_WAIT).map_err(RunError::Cluster)?;
        }
    }
    let mut merged = vec![0u64; (records as usize).div_ceil(64)];
    let mut results = results.lock().unwrap_or_else(|e| e.into_inner());
    let longest = results.iter().map(|s| s.seen.len()).max().unwrap_or(0);
    if merged.len() < longest {
        merged.resize(longest, 0);
    }
    let mut report = JobReport {
        generated: live.generated.load(std::sync::atomic::Ordering::Relaxed),
        received: 0,
        duplicates: 0,
        missing: 0,
        unique: 0,
        reordered: 0,
        latency_ns: latency_histogram(),
        async_metrics: result.async_metrics(),
        backpressured_ns: result.stages.first().map_or(0, |s| s.backpressured_ns),
        run: result.run,
        lost_connections: transport
            .as_ref()
            .map(|t| t.lost_connections())
            .unwrap_or_default(),
        checkpoints: result.checkpoints.clone(),
        restarts: 0,
        first_output_unix_ns: match first_output.load(std::sync::atomic::Ordering::Relaxed) {
            u64::MAX => None,
            at => Some(at),
        },
    };
    for sink in results.drain(..) {
        report.received += sink.received;
        report.duplicates += sink.duplicates;
        report.reordered += sink.reordered;
        // Same bounds on both sides: adding cannot fail.
        let _ = report.latency_ns.add(&sink.latency);
        for (word, bits) in merged.iter_mut().zip(&sink.seen) {
            report.duplicates += u64::from((*word & bits).count_ones());
            *word |= bits;
        }
    }
    let unique: u64 = merged.iter().map(|w| u64::from(w.count_ones())).sum();
    report.unique = unique;
    // Each id's key names one sink subtask, so duplicates are caught where they land;
    // what is missing is known only over every process.
    report.missing = match (&settings.cluster, &report.checkpoints) {
        (Some(_), _) => 0,
        // A restored run's sinks see only what came after the checkpoint: the output
        // files (--output) hold the exactly-once check across runs.
        (
            None,
            Some(CheckpointReport {
                restored: Some(_), ..
            }),
        ) => 0,
        // From streams: what was read and did not arrive (an id the input holds twice
        // arrives twice: a duplicate, not a loss).
        (None, _) if from_streams => report.generated.saturating_sub(report.received),
        // Stopped with drain (Ctrl-C): what was generated and did not arrive.
        (None, _) if settings.stop.requested() => report.generated.saturating_sub(unique),
        (None, _) => records - unique,
    };
    Ok(Finished {
        report,
        elapsed,
        failure,
    })
}

/// A zeroed bitmap of `words` words whose pages are all touched now: `vec![0; n]` maps
/// them lazily, so the process's resident memory would grow by the bitmap's size as
/// the run reaches higher ids, which a soak run would read as a leak.
fn touched_bitmap(words: usize) -> Vec<u64> {
    let mut bitmap = vec![0u64; words];
    for word in bitmap.iter_mut().step_by(4096 / std::mem::size_of::<u64>()) {
        // black_box: a store the optimizer keeps although the page already reads 0.
        *std::hint::black_box(word) = 0;
    }
    bitmap
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(cores: Option<&str>, oversubscribe: bool) -> Result<WorkerPlan, RunError> {
        WorkerPlan::for_machine(cores, oversubscribe, vec![0, 1, 2, 3])
    }

    #[test]
    fn workers_are_bounded_by_the_machines_cores() {
        let all = plan(None, false).unwrap();
        assert_eq!((all.workers(), all.free_core()), (4, None));
        let two = plan(Some("2"), false).unwrap();
        assert_eq!(
            (two.placement.clone(), two.free_core()),
            (vec![0, 1], Some(2))
        );
        assert!(matches!(
            plan(Some("5"), false),
            Err(RunError::TooManyWorkers {
                requested: 5,
                cores: 4
            })
        ));
        let shared = plan(Some("6"), true).unwrap();
        assert_eq!(shared.placement, vec![0, 1, 2, 3, 0, 1]);
        assert!(matches!(plan(Some("0"), true), Err(RunError::NoWorkers)));
        let listed = plan(Some("3, 1"), false).unwrap();
        assert_eq!(
            (listed.cores.clone(), listed.free_core()),
            (Cores::List(vec![3, 1]), Some(0))
        );
        assert!(matches!(
            plan(Some("1,7"), true),
            Err(RunError::NoSuchCore { core: 7, .. })
        ));
        assert!(matches!(
            plan(Some("1,1"), false),
            Err(RunError::CoreTwice { core: 1 })
        ));
        assert!(plan(Some("1,1"), true).is_ok());
        assert!(matches!(
            plan(Some("two"), false),
            Err(RunError::BadCores(_))
        ));
    }

    /// `--cache` takes its settings in any order, and refuses what it does not know.
    #[test]
    fn cache_settings_parse() {
        let cache: CacheSettings = "rows=10,access=2s,missing=off".parse().unwrap();
        assert_eq!(
            cache,
            CacheSettings {
                rows_max: 10,
                expire_after_write: None,
                expire_after_access: Some(Duration::from_secs(2)),
                cache_missing_key: false,
            }
        );
        assert!("rows=5,write=10ms".parse::<CacheSettings>().is_ok());
        let bad = "|rows=0|write=1s|rows=5,write=0s|rows=5,x=3|rows=x";
        for text in bad.split('|') {
            assert!(text.parse::<CacheSettings>().is_err(), "{text:?} accepted");
        }
    }

    /// Zipf draws stay in range and keys come up as often as their weights say (within
    /// 10%, seeded), for exponents below, at and above 1 (the sampler's three branches).
    #[test]
    fn zipf_draws_follow_the_weights() {
        let keys = 1000u64;
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut random = move || {
            rng ^= rng >> 12;
            rng ^= rng << 25;
            rng ^= rng >> 27;
            rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
        };
        for exponent in [0.5, 1.0, 1.1] {
            let zipf = Zipf::new(keys, exponent).unwrap();
            let draws = 200_000;
            let mut counts = vec![0u32; keys as usize];
            for _ in 0..draws {
                let first = random();
                counts[zipf.sample(first, &mut random) as usize] += 1;
            }
            let h: f64 = (1..=keys).map(|k| (k as f64).powf(-exponent)).sum();
            for k in [0usize, 1, 9] {
                let expected = ((k + 1) as f64).powf(-exponent) / h;
                let seen = f64::from(counts[k]) / f64::from(draws);
                assert!(
                    (seen / expected - 1.0).abs() < 0.1,
                    "s = {exponent}, key {k}: {seen} drawn, {expected} expected"
                );
            }
        }
        assert!(Zipf::new(keys, 0.0).is_err());
        assert_eq!(Zipf::new(1, 2.0).unwrap().sample(7, || 0), 0);
    }

    #[test]
    fn words_for_the_user() {
        assert_eq!(workers_text(1), "1 worker");
        assert_eq!(workers_text(2), "2 workers");
        assert_eq!(mode_name(OutputMode::KeyedOrdered), "keyed");
        assert_eq!(cores_text(&[3, 0, 1, 2, 6, 8, 9]), "0-3, 6, 8, 9");
        assert_eq!(bytes_text(512), "512 bytes");
        assert_eq!(bytes_text(3 << 30), "3.0 GiB");
    }
}
