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
//! produced) and appends each enriched record to a stream as well as checking it.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{json, Value};
use smallvec::SmallVec;
use weir_engine::async_io::AsyncMetrics;
use weir_engine::async_io::{
    AsyncConfig, AsyncError, BatchConfig, LookupCache, OperatorError, OutputMode, RetryStrategy,
};
use weir_engine::checkpoint::{AlignmentMode, RestartStrategy, Restarts};
use weir_engine::exchange::codec::{Codec, DecodeError, Decoder, Encoder};
use weir_engine::graph::{
    latency_histogram, CheckpointReport, Checkpointing, ExchangeSpec, FileSink, Graph, GraphError,
    IoHandler, LiveCounters, Sink, Source, SourceEvent, SubtaskInfo,
};
use weir_engine::runtime::Controller;
use weir_engine::runtime::{Cores, RunReport, Runtime, RuntimeError, TaskError, Wakeups};
use weir_net::cluster::TransportChannels;
use weir_net::lookup::{
    format_duration, ClientConfig, ClientIo, LookupBatchFunction, LookupClient, LookupFunction,
    LookupRequest,
};
use weir_net::redis::streams::{
    stream_sink, stream_source, Fields, StreamEntry, StreamSink, StreamSinkConfig, StreamSource,
    StreamSourceConfig,
};
use weir_net::redis::{
    Args, Lookup as RedisGet, RedisBatchFunction, RedisClient, RedisConfig, RedisError,
    RedisFunction, RedisIo, RedisRequest, RedisUrl, Reply, SharedStats,
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

/// A source record on its way to the lookup.
#[derive(Debug, Clone, Copy)]
pub struct Lookup(pub SourceRecord);

impl From<SourceRecord> for Lookup {
    fn from(record: SourceRecord) -> Self {
        Lookup(record)
    }
}

impl LookupRequest for Lookup {
    type Out = Enriched;
    fn key(&self) -> u64 {
        self.0.key
    }
    fn complete(self, value: &[u8]) -> Enriched {
        Enriched {
            id: self.0.id,
            key: self.0.key,
            created_ns: self.0.created_ns,
            value: LookupValue::from(value),
        }
    }
}

/// The job's keys in Redis: `weir:<key>`, as `weir load-redis` writes them.
pub const REDIS_KEY_PREFIX: &str = "weir:";

impl RedisRequest for Lookup {
    type Out = Enriched;
    fn lookup(&self, args: &mut Args) -> RedisGet {
        args.push_fmt(format_args!("{REDIS_KEY_PREFIX}{}", self.0.key));
        RedisGet::Get
    }
    /// A missing key is a value: the record goes on with an empty one (counted as a
    /// miss in [`RedisStore::stats`]).
    fn complete(self, reply: Reply<'_>) -> Enriched {
        Enriched {
            id: self.0.id,
            key: self.0.key,
            created_ns: self.0.created_ns,
            value: reply.value().map(LookupValue::from).unwrap_or_default(),
        }
    }
}

/// Redis as the store of the main job's lookups (`weir run --store`).
#[derive(Debug, Clone)]
pub struct RedisStore {
    /// The server.
    pub url: RedisUrl,
    /// Keys per `MGET` when the batched async operator cuts each turn's lookups into
    /// `MGET`s (`--mget N`); `None`: each `GET` on its own (plain pipelining).
    pub mget: Option<usize>,
    /// The clients' counters, summed over the workers.
    pub stats: Arc<SharedStats>,
}

impl RedisStore {
    /// The client settings for `settings`: its connections per subtask, room for its
    /// capacity, and (as for the lookup service) a request timeout short enough for
    /// the retries to run within the operator's timeout.
    pub fn client_config(&self, settings: &JobSettings) -> RedisConfig {
        let mut config = RedisConfig::new(self.url.clone());
        config.connections = settings.connections;
        config.capacity = settings.capacity * 4 + 64;
        config.request_timeout = settings.attempt_timeout().max(Duration::from_millis(1));
        config.connect_timeout = config.connect_timeout.min(config.request_timeout);
        config
    }
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

/// A record with its looked-up value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enriched {
    /// Source id.
    pub id: u64,
    /// Key.
    pub key: u64,
    /// Creation time at the source.
    pub created_ns: u64,
    /// The value from the lookup service.
    pub value: LookupValue,
}

/// A looked-up value: bytes kept inline up to [`VALUE_INLINE`] (the main job's default value size), on
/// the heap beyond: the main path makes no allocation per record for its values (a
/// `Vec` per record was a malloc at the lookup and a calloc at the sink, and their
/// frees, about a tenth of the job's CPU).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LookupValue(SmallVec<[u8; VALUE_INLINE]>);

/// Bytes a [`LookupValue`] holds without allocating.
pub const VALUE_INLINE: usize = 32;

impl From<&[u8]> for LookupValue {
    fn from(bytes: &[u8]) -> Self {
        LookupValue(SmallVec::from_slice(bytes))
    }
}

impl std::ops::Deref for LookupValue {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl PartialEq<Vec<u8>> for LookupValue {
    fn eq(&self, other: &Vec<u8>) -> bool {
        self.0.as_slice() == other.as_slice()
    }
}

impl Codec for LookupValue {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        (self.0.len() as u32).encode(out);
        out.write(&self.0);
    }
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        let len = u32::decode(input)? as usize;
        if len > input.remaining() {
            // Checked before sizing the value, so a corrupt length asks for nothing.
            return Err(DecodeError::Truncated {
                needed: len,
                remaining: input.remaining(),
            });
        }
        let mut bytes = SmallVec::from_elem(0, len);
        input.read(&mut bytes)?;
        Ok(LookupValue(bytes))
    }
}

/// A record held by the async operator at a checkpoint is stored as its source record.
impl Codec for Lookup {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        self.0.id.encode(out);
        self.0.key.encode(out);
        self.0.created_ns.encode(out);
    }
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        Ok(Lookup(SourceRecord {
            id: u64::decode(input)?,
            key: u64::decode(input)?,
            created_ns: u64::decode(input)?,
        }))
    }
}

impl Codec for Enriched {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        self.id.encode(out);
        self.key.encode(out);
        self.created_ns.encode(out);
        self.value.encode(out);
    }
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        Ok(Enriched {
            id: u64::decode(input)?,
            key: u64::decode(input)?,
            created_ns: u64::decode(input)?,
            value: LookupValue::decode(input)?,
        })
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

/// The main job's Redis streams: records read from streams instead of generated, and
/// each enriched record appended to a stream.
#[derive(Clone, Default)]
pub struct StreamIo {
    /// Where the records come from (`weir run --source`), instead of the generator.
    pub source: Option<StreamSourceConfig>,
    /// Where the enriched records also go (`weir run --sink`).
    pub sink: Option<StreamSinkConfig>,
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

/// A record as the source makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceRecord {
    /// Unique across the job: `0..records`.
    pub id: u64,
    /// The lookup key.
    pub key: u64,
    /// Creation time by the run's clock (the intended time in open-loop runs).
    pub created_ns: u64,
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
    /// Zipf over `0..keys`: key `k` drawn with weight `1 / (k + 1)^s` (`--key-distribution
    /// zipf:<s>`).
    Zipf(Zipf),
}

/// A Zipf distribution over `0..keys`, sampled without a table by rejection-inversion
/// (the algorithm of `rand_distr`'s `Zipf`; the job draws from its own xorshift, not
/// `rand`): a table of cumulative weights would be 8 bytes per key per source subtask.
/// A draw takes about 1.1 tries on average, each two uniform numbers and two `powf`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Zipf {
    keys: f64,
    exponent: f64,
    /// The bound's total mass and `1 / (1 - s)` (0 at `s = 1`).
    t: f64,
    q: f64,
}

impl Zipf {
    /// Zipf over `0..keys` (at least one) with exponent `exponent` (positive, finite).
    pub fn new(keys: u64, exponent: f64) -> Result<Self, String> {
        if keys == 0 || !(exponent > 0.0 && exponent.is_finite()) {
            return Err(format!(
                "zipf needs keys >= 1 and a positive exponent (got {keys} keys, exponent \
                 {exponent}); write e.g. zipf:1.1"
            ));
        }
        let n = keys as f64;
        let (t, q) = if exponent == 1.0 {
            (1.0 + n.ln(), 0.0)
        } else {
            let q = 1.0 / (1.0 - exponent);
            ((n.powf(1.0 - exponent) - exponent) * q, q)
        };
        Ok(Zipf {
            keys: n,
            exponent,
            t,
            q,
        })
    }

    /// A key: `first` and as many further draws of `random` (uniform `u64`s) as it takes.
    pub fn sample(&self, first: u64, mut random: impl FnMut() -> u64) -> u64 {
        let unit = |r: u64| (r >> 11) as f64 / (1u64 << 53) as f64;
        let s = self.exponent;
        let mut r = first;
        loop {
            // The inverse of the bound's cumulative mass, at a uniform point.
            let pt = unit(r) * self.t;
            let inv_b = if pt <= 1.0 {
                pt
            } else if s != 1.0 {
                (pt * (1.0 - s) + s).powf(self.q)
            } else {
                (pt - 1.0).exp()
            };
            let x = (inv_b + 1.0).floor();
            let mut ratio = x.powf(-s);
            if x > 1.0 {
                ratio *= inv_b.powf(s);
            }
            if unit(random()) < ratio {
                return (x.min(self.keys) as u64).max(1) - 1;
            }
            r = random();
        }
    }
}

/// `weir run --cache rows=<n>[,write=<dur>][,access=<dur>][,missing=on|off]`: a lookup
/// cache per async subtask (Flink's `PARTIAL` lookup cache; see
/// [`LookupCache`]). The job's lookups always yield one result (a missing key an empty
/// value), so `missing` changes nothing here; it is accepted for the flag's sake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheSettings {
    /// Rows per subtask (least recently used evicted).
    pub rows_max: usize,
    /// Rows expire this long after they were stored.
    pub expire_after_write: Option<Duration>,
    /// Rows expire this long after they were stored or last hit.
    pub expire_after_access: Option<Duration>,
    /// Cache lookups that found nothing.
    pub cache_missing_key: bool,
}

impl std::str::FromStr for CacheSettings {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let mut cache = CacheSettings {
            rows_max: 0,
            expire_after_write: None,
            expire_after_access: None,
            cache_missing_key: true,
        };
        let usage = "write rows=<n>[,write=<duration>][,access=<duration>][,missing=on|off]";
        for part in text.split(',') {
            let duration = |v: &str| match weir_net::lookup::parse_duration(v) {
                Ok(d) if !d.is_zero() => Ok(Some(d)),
                _ => Err(format!("{part:?}: expected a positive duration, e.g. 10s")),
            };
            match part.split_once('=') {
                Some(("rows", v)) => {
                    cache.rows_max = v
                        .parse()
                        .map_err(|_| format!("{part:?}: expected a row count"))?
                }
                Some(("write", v)) => cache.expire_after_write = duration(v)?,
                Some(("access", v)) => cache.expire_after_access = duration(v)?,
                Some(("missing", "on")) => cache.cache_missing_key = true,
                Some(("missing", "off")) => cache.cache_missing_key = false,
                _ => return Err(format!("{part:?} is not a cache setting; {usage}")),
            }
        }
        if cache.rows_max == 0 {
            return Err(format!("the cache needs rows=<n> with n >= 1; {usage}"));
        }
        Ok(cache)
    }
}

impl CacheSettings {
    /// The operator's cache: keyed by the record's key; a hit is the record with the
    /// cached value (its own id and creation time).
    fn lookup_cache(&self) -> LookupCache<Lookup, u64, Enriched> {
        let mut cache = LookupCache::new(self.rows_max, |input: &Lookup| input.0.key)
            .with_cache_missing_key(self.cache_missing_key)
            .with_join(|input: &Lookup, cached: &Enriched| Enriched {
                id: input.0.id,
                key: input.0.key,
                created_ns: input.0.created_ns,
                value: cached.value.clone(),
            });
        if let Some(after) = self.expire_after_write {
            cache = cache.with_expire_after_write(after);
        }
        if let Some(after) = self.expire_after_access {
            cache = cache.with_expire_after_access(after);
        }
        cache
    }
}

/// Makes subtask `i` of `n`'s key iterator on its worker's thread (an iterator source).
pub type KeyIterFactory = Arc<dyn Fn(usize, usize) -> Box<dyn Iterator<Item = u64>> + Send + Sync>;

/// Where a collecting sink puts every record it receives (for tests).
pub type Collected<T> = Arc<std::sync::Mutex<Vec<T>>>;

impl KeyDistribution {
    /// A key from the uniform `u64` `first` and as many further draws of `random` as
    /// it takes (Zipf may need more).
    pub fn draw(&self, first: u64, random: impl FnMut() -> u64) -> u64 {
        match *self {
            KeyDistribution::Zipf(zipf) => zipf.sample(first, random),
            KeyDistribution::Uniform { keys } => first % keys.max(1),
            KeyDistribution::Skewed {
                keys,
                hot_keys,
                hot_fraction,
            } => {
                let unit = (first >> 11) as f64 / (1u64 << 53) as f64;
                let r2 = first.rotate_left(32);
                if unit < hot_fraction {
                    r2 % hot_keys.max(1)
                } else {
                    r2 % keys.max(1)
                }
            }
        }
    }
}

/// xorshift64*: the generator's and the stream producer's random numbers.
pub fn xorshift64star(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    x.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

/// Seed of the key sampling.
const SEED: u64 = 42;

/// Nanoseconds of the host's wall clock (`CLOCK_REALTIME`).
fn wall_clock_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Maps a task's run-clock readings onto the wall clock, for latencies measured across
/// processes: each process's run clock starts at its own epoch, so a record's creation
/// time must travel in a clock both ends share. Exact between processes of one host;
/// across hosts as good as their clock synchronisation (PTP for microseconds). The
/// offset is taken once per task (a run clock and the wall clock advance together).
#[derive(Debug, Clone, Copy, Default)]
struct WallClock {
    offset: Option<u64>,
}

impl WallClock {
    #[inline]
    fn map(&mut self, now_ns: u64, t_ns: u64) -> u64 {
        let offset = *self
            .offset
            .get_or_insert_with(|| wall_clock_ns().saturating_sub(now_ns));
        t_ns + offset
    }
}

/// How far apart an open-loop source's wake-ups are at least: it emits every record
/// whose time has come, then waits for the next one's time but not less than this.
/// A timed wait costs a worker about 25–35 µs of CPU on a virtual machine however short
/// it is (`results/2026-12-01-vm-wakeup-latency.md`), so a source waking for each record
/// (every 3–10 µs at the report's rates) spent more CPU pacing itself than the records
/// cost to process. Records keep their intended creation time, so the wait shows in the
/// measured latency (half this on average).
const PACE_STEP_NS: u64 = 100_000;

/// The main job's source: `records` spread over the subtasks (ids `i, i + n, …` on
/// subtask `i` of `n`), keys drawn from the distribution (xorshift64*) or taken from
/// an iterator, as fast as accepted or at a rate (paced in steps of [`PACE_STEP_NS`]).
struct MainSource {
    subtask: u64,
    sources: u64,
    next: u64,
    count: u64,
    key_iter: Option<Box<dyn Iterator<Item = u64>>>,
    interval_ns: Option<u64>,
    start_ns: Option<u64>,
    keys: KeyDistribution,
    rng: u64,
    /// Over several processes: creation times in the wall clock.
    wall: Option<WallClock>,
    /// The record a restored source started at: its pacing counts from there.
    paced_from: u64,
}

impl MainSource {
    fn new(settings: &JobSettings, info: &SubtaskInfo) -> Self {
        let (subtask, sources) = (info.index as u64, info.parallelism as u64);
        let records = settings.records;
        let key_iter = settings
            .key_iter
            .as_ref()
            .map(|make| make(info.index, info.parallelism));
        MainSource {
            subtask,
            sources,
            next: 0,
            count: match key_iter {
                Some(_) => u64::MAX,
                None => records / sources + u64::from(subtask < records % sources),
            },
            key_iter,
            interval_ns: settings.rate.map(|r| (1e9 * sources as f64 / r) as u64),
            start_ns: None,
            keys: settings.keys,
            rng: (SEED ^ subtask.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1,
            wall: settings.cluster.as_ref().map(|_| WallClock::default()),
            paced_from: 0,
        }
    }

    fn next_random(&mut self) -> u64 {
        xorshift64star(&mut self.rng)
    }

    fn next_key(&mut self) -> u64 {
        let r = self.next_random();
        let keys = self.keys;
        keys.draw(r, || self.next_random())
    }
}

impl Source<Lookup> for MainSource {
    #[inline]
    fn poll_next(&mut self, now_ns: u64) -> SourceEvent<Lookup> {
        if self.next == self.count {
            return SourceEvent::End;
        }
        let start = *self.start_ns.get_or_insert(now_ns);
        let intended = match self.interval_ns {
            Some(interval) => {
                let at = start + (self.next - self.paced_from) * interval;
                if at > now_ns {
                    return SourceEvent::Idle {
                        until_ns: Some(at.max(now_ns + PACE_STEP_NS)),
                    };
                }
                at
            }
            None => now_ns,
        };
        let key = match self.key_iter.as_mut() {
            Some(keys) => match keys.next() {
                Some(key) => key,
                None => {
                    self.count = self.next;
                    return SourceEvent::End;
                }
            },
            None => self.next_key(),
        };
        let created_ns = match self.wall.as_mut() {
            Some(wall) => wall.map(now_ns, intended),
            None => intended,
        };
        let record = SourceRecord {
            id: self.subtask + self.next * self.sources,
            key,
            created_ns,
        };
        self.next += 1;
        SourceEvent::Record(Lookup(record), None)
    }

    /// Its position: records made and the key generator's state (an iterator of keys
    /// is made again and skipped to it on restore).
    fn snapshot_state(&mut self) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(16);
        (self.next, self.rng).encode(&mut out);
        Some(out)
    }

    fn restore_state(&mut self, mut state: &[u8]) -> Result<(), TaskError> {
        let (next, rng) = <(u64, u64)>::decode(&mut state)
            .map_err(|e| format!("the source's checkpointed position: {e}"))?;
        if let Some(keys) = self.key_iter.as_mut() {
            for _ in 0..next {
                if keys.next().is_none() {
                    return Err("the source's keys end before its checkpointed position".into());
                }
            }
        }
        if next > self.count {
            return Err(format!(
                "the source's checkpointed position {next} is past its {} records: restore \
                 with the --records of the run that wrote the checkpoint",
                self.count
            )
            .into());
        }
        self.next = next;
        self.paced_from = next;
        self.rng = rng;
        Ok(())
    }
}

/// The largest record id the checking sink takes from a stream: it keeps a bitmap of
/// the ids it saw (512 MiB at this bound).
pub const STREAM_ID_MAX: u64 = 1 << 32;

/// The main job's record from a stream entry as `weir produce-stream` writes it:
/// `id` (unique, below [`STREAM_ID_MAX`]), `key` (looked up) and optionally `t` (when it
/// was produced, nanoseconds since the Unix epoch).
pub fn record_fields(entry: &StreamEntry) -> Result<(u64, u64, Option<u64>), String> {
    let number = |name: &str| -> Result<Option<u64>, String> {
        match entry.field(name.as_bytes()) {
            None => Ok(None),
            Some(text) => std::str::from_utf8(text)
                .ok()
                .and_then(|t| t.parse::<u64>().ok())
                .map(Some)
                .ok_or_else(|| {
                    format!(
                        "entry {} of stream {:?}: field {name:?} is {:?}, not a decimal u64",
                        entry.id,
                        entry.stream,
                        String::from_utf8_lossy(text)
                    )
                }),
        }
    };
    let needed = |name: &str| -> Result<u64, String> {
        number(name)?.ok_or_else(|| {
            format!(
                "entry {} of stream {:?} has no field {name:?}: weir run's main job reads \
                 entries as `weir produce-stream` writes them (fields id, key and t); \
                 enrich streams of your own with a job like net/examples/stream_enrich.rs",
                entry.id, entry.stream
            )
        })
    };
    let id = needed("id")?;
    if id >= STREAM_ID_MAX {
        return Err(format!(
            "entry {} of stream {:?}: id {id} is not below {STREAM_ID_MAX} (the checking \
             sink keeps a bitmap of ids)",
            entry.id, entry.stream
        ));
    }
    Ok((id, needed("key")?, number("t")?))
}

/// The main job's source with `--source`: the stream source's entries as records, each
/// created when it was produced (its `t`, mapped onto the run's clock), or when read.
/// Positions, acknowledgements and failures are the stream source's.
struct StreamInput {
    inner: StreamSource,
    /// Wall clock minus the run's clock (taken at the first record).
    offset: Option<u64>,
    /// Over several processes: creation times stay in the wall clock.
    wall: bool,
}

impl Source<Lookup> for StreamInput {
    fn poll_next(&mut self, now_ns: u64) -> SourceEvent<Lookup> {
        match self.inner.poll_next(now_ns) {
            SourceEvent::Record(entry, timestamp) => match record_fields(&entry) {
                Ok((id, key, produced)) => {
                    let offset = *self
                        .offset
                        .get_or_insert_with(|| wall_clock_ns().saturating_sub(now_ns));
                    let created_ns = match (produced, self.wall) {
                        (Some(t), true) => t,
                        (None, true) => now_ns + offset,
                        // Produced before the run started: its age counts from the start.
                        (Some(t), false) => t.saturating_sub(offset).min(now_ns),
                        (None, false) => now_ns,
                    };
                    SourceEvent::Record(
                        Lookup(SourceRecord {
                            id,
                            key,
                            created_ns,
                        }),
                        timestamp,
                    )
                }
                Err(message) => SourceEvent::Failed(message),
            },
            SourceEvent::Watermark(w) => SourceEvent::Watermark(w),
            SourceEvent::Idle { until_ns } => SourceEvent::Idle { until_ns },
            SourceEvent::End => SourceEvent::End,
            SourceEvent::Failed(message) => SourceEvent::Failed(message),
        }
    }

    fn snapshot_state(&mut self) -> Option<Vec<u8>> {
        self.inner.snapshot_state()
    }

    fn restore_state(&mut self, state: &[u8]) -> Result<(), TaskError> {
        self.inner.restore_state(state)
    }

    fn notify_checkpoint_complete(&mut self, checkpoint: u64) -> Result<(), TaskError> {
        self.inner.notify_checkpoint_complete(checkpoint)
    }
}

/// Each enriched record as a stream entry: `id`, `key`, `value` (hex), and `t`, the
/// time its input was created (nanoseconds since the Unix epoch), for a reader that
/// measures end to end.
fn stream_fields(record: &Enriched, fields: &mut Fields) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hex = SmallVec::<[u8; 2 * VALUE_INLINE]>::new();
    for byte in record.value.iter() {
        hex.extend([HEX[usize::from(byte >> 4)], HEX[usize::from(byte & 15)]]);
    }
    fields
        .push_fmt("id", format_args!("{}", record.id))
        .push_fmt("key", format_args!("{}", record.key))
        .push("value", &hex[..])
        .push_fmt("t", format_args!("{}", record.created_ns));
}

/// The main job's sink with `--sink`: the checking sink, and each record appended to a
/// stream (at least once, or exactly once at checkpoints).
struct StreamOut {
    check: CheckSink,
    out: StreamSink<Enriched, fn(&Enriched, &mut Fields)>,
    /// Maps the records' creation times onto the wall clock (none over several
    /// processes: they are in it already).
    wall: Option<WallClock>,
}

impl Sink<Enriched> for StreamOut {
    fn invoke(
        &mut self,
        mut value: Enriched,
        timestamp: Option<i64>,
        now_ns: u64,
    ) -> Result<(), TaskError> {
        self.check.invoke(value.clone(), timestamp, now_ns)?;
        if let Some(wall) = self.wall.as_mut() {
            value.created_ns = wall.map(now_ns, value.created_ns);
        }
        self.out.invoke(value, timestamp, now_ns)
    }

    fn finish(&mut self) -> Result<(), TaskError> {
        self.out.finish()?;
        self.check.finish()
    }

    fn accepts(&mut self) -> bool {
        self.out.accepts()
    }

    fn poll(&mut self, now_ns: u64) -> Result<bool, TaskError> {
        self.out.poll(now_ns)
    }

    fn flushed(&mut self) -> bool {
        self.out.flushed()
    }

    fn snapshot_state(&mut self, checkpoint: u64) -> Result<Option<Vec<u8>>, TaskError> {
        self.out.snapshot_state(checkpoint)
    }

    fn notify_checkpoint_complete(&mut self, checkpoint: u64) -> Result<(), TaskError> {
        self.out.notify_checkpoint_complete(checkpoint)
    }

    fn restore_state(&mut self, state: &[u8]) -> Result<(), TaskError> {
        self.out.restore_state(state)
    }
}

/// The main job's sink with `--output`: the checking sink, and each record's line in
/// exactly-once part files.
struct OutputSink {
    check: CheckSink,
    files: FileSink<fn(&Enriched, &mut Vec<u8>)>,
}

/// `<id> <key> <value as hex>\n`.
pub fn output_line(record: &Enriched, line: &mut Vec<u8>) {
    use std::io::Write;
    let _ = write!(line, "{} {} ", record.id, record.key);
    for byte in record.value.iter() {
        let _ = write!(line, "{byte:02x}");
    }
    line.push(b'\n');
}

impl Sink<Enriched> for OutputSink {
    fn invoke(
        &mut self,
        value: Enriched,
        timestamp: Option<i64>,
        now_ns: u64,
    ) -> Result<(), TaskError> {
        Sink::<Enriched>::invoke(&mut self.files, value.clone(), timestamp, now_ns)?;
        self.check.invoke(value, timestamp, now_ns)
    }

    fn finish(&mut self) -> Result<(), TaskError> {
        Sink::<Enriched>::finish(&mut self.files)?;
        self.check.finish()
    }

    fn snapshot_state(&mut self, checkpoint: u64) -> Result<Option<Vec<u8>>, TaskError> {
        Sink::<Enriched>::snapshot_state(&mut self.files, checkpoint)
    }

    fn notify_checkpoint_complete(&mut self, checkpoint: u64) -> Result<(), TaskError> {
        Sink::<Enriched>::notify_checkpoint_complete(&mut self.files, checkpoint)
    }

    fn restore_state(&mut self, state: &[u8]) -> Result<(), TaskError> {
        Sink::<Enriched>::restore_state(&mut self.files, state)
    }
}

/// What one sink subtask received.
struct SinkResult {
    seen: Vec<u64>,
    received: u64,
    duplicates: u64,
    reordered: u64,
    latency: Histogram<u64>,
}

/// The main job's sink: counts, checks ids, measures latency.
struct CheckSink {
    sources: u64,
    /// The last id from each source subtask (ids are `subtask + n × sources`).
    last_id: Vec<Option<u64>>,
    seen: Vec<u64>,
    received: u64,
    duplicates: u64,
    reordered: u64,
    latency: Histogram<u64>,
    results: Arc<std::sync::Mutex<Vec<SinkResult>>>,
    live: Arc<LiveCounters>,
    reported: u64,
    collect: Option<(Vec<Enriched>, Collected<Enriched>)>,
    published: bool,
    /// Over several processes: latency measured in the wall clock (see `WallClock`).
    wall: Option<WallClock>,
    /// When the first record of the run reached a sink, in ns since the Unix epoch
    /// (the moment a restored job is processing again).
    first_output: Arc<AtomicU64>,
    /// Records from streams: ids are the entries' (the bitmap grows to the largest, up
    /// to [`STREAM_ID_MAX`]), and their order per source subtask is not the generator's.
    from_streams: bool,
}

impl CheckSink {
    /// Hands what the sink received to the report (once: at the end of its input, or
    /// when dropped before that in a failed run).
    fn publish(&mut self) {
        if std::mem::replace(&mut self.published, true) {
            return;
        }
        if let Some((local, shared)) = self.collect.take() {
            shared
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(local);
        }
        self.live.received.fetch_add(
            self.received - self.reported,
            std::sync::atomic::Ordering::Relaxed,
        );
        self.reported = self.received;
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
    }
}

impl Drop for CheckSink {
    fn drop(&mut self) {
        self.publish();
    }
}

impl Sink<Enriched> for CheckSink {
    #[inline]
    fn invoke(
        &mut self,
        value: Enriched,
        _timestamp: Option<i64>,
        now_ns: u64,
    ) -> Result<(), TaskError> {
        if self.received == 0 {
            self.first_output
                .fetch_min(wall_clock_ns(), std::sync::atomic::Ordering::Relaxed);
        }
        self.received += 1;
        if !self.from_streams {
            let source = (value.id % self.sources) as usize;
            if self.last_id[source].is_some_and(|last| last > value.id) {
                self.reordered += 1;
            }
            self.last_id[source] = Some(value.id);
        }
        let id = value.id as usize;
        if self.from_streams && id / 64 >= self.seen.len() && value.id < STREAM_ID_MAX {
            self.seen.resize((id / 64 + 1).next_power_of_two(), 0);
        }
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
        let now_ns = match self.wall.as_mut() {
            Some(wall) => wall.map(now_ns, now_ns),
            None => now_ns,
        };
        self.latency
            .saturating_record(now_ns.saturating_sub(value.created_ns).max(1));
        if let Some((local, _)) = self.collect.as_mut() {
            local.push(value);
        }
        if self.received - self.reported >= 1024 {
            self.live.received.fetch_add(
                self.received - self.reported,
                std::sync::atomic::Ordering::Relaxed,
            );
            self.reported = self.received;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), TaskError> {
        self.publish();
        Ok(())
    }
}

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

/// How a run starts, by the rule that keeps its output exactly once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartPoint {
    /// From this completed checkpoint (its id).
    Checkpoint(u64),
    /// From the start: no checkpoint to restore (none asked for, or none ever completed
    /// in the directory named), and no committed output to write again.
    Fresh,
}

/// Where a run with `settings` starts, or why it must not: the newest completed
/// checkpoint under `--restore` that cannot be read back whole is an error naming the
/// file (never a fresh start), and so is a fresh start over an `--output` that already
/// holds committed part files (they would be written a second time).
pub fn check_start(settings: &JobSettings) -> Result<StartPoint, RunError> {
    check_start_at(
        settings
            .checkpoints
            .as_ref()
            .and_then(|c| c.restore.as_deref()),
        settings.output.as_deref(),
    )
}

/// How `weir run` was asked to start: `--restore`, `--resume` (with the checkpoint
/// directory) and `--restore-fallback`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RestoreRequest<'a> {
    /// `--restore`: a checkpoint directory or one `chk-<id>` directory.
    pub restore: Option<&'a std::path::Path>,
    /// `--resume`: the checkpoint directory, which may not exist yet.
    pub resume: Option<&'a std::path::Path>,
    /// `--restore-fallback`.
    pub fallback: bool,
}

/// What a run restores, decided before anything starts and said on stderr: the path
/// to restore (`None`: from the beginning). `--resume` over a directory where no
/// checkpoint ever completed (or that does not exist yet) starts from the beginning;
/// `--restore-fallback` passes over a newest completed checkpoint that cannot be read
/// back for the newest older one that can, naming each one passed over. Everything
/// else is left to [`check_start_at`], which refuses what would break exactly-once.
pub fn resolve_restore(request: &RestoreRequest<'_>) -> Result<Option<PathBuf>, RunError> {
    use weir_engine::checkpoint::storage;
    if request.fallback && request.restore.is_none() && request.resume.is_none() {
        return Err(RunError::Setting(
            "--restore-fallback chooses among the checkpoints --restore DIR or --resume \
             restores: give one of them"
                .into(),
        ));
    }
    let Some(dir) = request.restore.or(request.resume) else {
        return Ok(None);
    };
    if request.resume.is_some() {
        let newest = storage::newest_completed(dir);
        if matches!(newest, Ok(None)) {
            eprintln!(
                "weir: --resume: no checkpoint ever completed under {}: starting from the \
                 beginning",
                dir.display()
            );
            return Ok(None);
        }
    }
    let explicit = dir.join(storage::METADATA).exists() || storage::checkpoint_id(dir).is_some();
    if !request.fallback || explicit || !dir.exists() {
        return Ok(Some(dir.to_path_buf()));
    }
    match storage::fallback_point(dir) {
        Ok(Some(restored)) if !restored.skipped.is_empty() => {
            for (path, error) in &restored.skipped {
                eprintln!(
                    "weir: --restore-fallback: passing over {}: {error}",
                    path.display()
                );
            }
            eprintln!(
                "weir: --restore-fallback: restoring the older checkpoint {} ({})",
                restored.metadata.id,
                restored.path.display()
            );
            Ok(Some(restored.path))
        }
        Ok(_) => Ok(Some(dir.to_path_buf())),
        Err(error) => Err(RunError::Setting(format!(
            "--restore-fallback: no completed checkpoint under {} can be read back: {error}",
            dir.display()
        ))),
    }
}

/// [`check_start`] for a run restoring from `restore` and writing `output`.
pub fn check_start_at(
    restore: Option<&std::path::Path>,
    output: Option<&std::path::Path>,
) -> Result<StartPoint, RunError> {
    let start = match restore {
        Some(path) => {
            if !path.exists() {
                return Err(RunError::Setting(format!(
                    "--restore {}: no such file or directory; name a checkpoint directory \
                     (--checkpoint-dir of the run to restore) or one of its chk-<id> directories",
                    path.display()
                )));
            }
            let explicit = path
                .join(weir_engine::checkpoint::storage::METADATA)
                .exists()
                || weir_engine::checkpoint::storage::checkpoint_id(path).is_some();
            let found = if explicit {
                weir_engine::checkpoint::storage::read_checkpoint(path).map(Some)
            } else {
                weir_engine::checkpoint::storage::restore_point(path)
            };
            match found {
                Ok(Some(restored)) => StartPoint::Checkpoint(restored.metadata.id),
                Ok(None) => StartPoint::Fresh,
                Err(error) => return Err(RunError::Setting(format!("--restore: {error}"))),
            }
        }
        None => StartPoint::Fresh,
    };
    if let (StartPoint::Fresh, Some(output)) = (&start, output) {
        let committed = committed_parts(output)?;
        if !committed.is_empty() {
            return Err(RunError::Setting(format!(
                "--output {} holds {} committed part files of an earlier run, and this run \
                 starts from the beginning ({}): it would write their records a second time. \
                 Restore the checkpoint that committed them, or remove the directory",
                output.display(),
                committed.len(),
                match restore {
                    Some(path) => format!("no checkpoint ever completed under {}", path.display()),
                    None => "no --restore".to_string(),
                }
            )));
        }
    }
    Ok(start)
}

/// The committed part files under `dir` (names `part-<subtask>-<n>`, no suffix); none
/// if it does not exist.
pub fn committed_parts(dir: &std::path::Path) -> Result<Vec<PathBuf>, RunError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(RunError::Setting(format!(
                "--output {}: cannot read it: {e}",
                dir.display()
            )))
        }
    };
    let mut parts = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let committed = name.strip_prefix("part-").is_some_and(|rest| {
            rest.split_once('-').is_some_and(|(subtask, n)| {
                subtask.parse::<u64>().is_ok() && n.parse::<u64>().is_ok()
            })
        });
        if committed {
            parts.push(entry.path());
        }
    }
    parts.sort();
    Ok(parts)
}

/// What the committed output holds, over every attempt that wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutputAudit {
    /// Committed part files.
    pub files: usize,
    /// Lines in them.
    pub lines: u64,
    /// Distinct record ids in `0..records`.
    pub unique: u64,
    /// Lines beyond the first of an id (or outside `0..records`, or unreadable).
    pub duplicated: u64,
    /// Ids of `0..records` no committed line holds.
    pub lost: u64,
}

/// An audit as the summaries print it.
pub fn audit_text(audit: &OutputAudit) -> String {
    format!(
        "{} lost / {} duplicated over every attempt ({} distinct ids, {} lines in {} \
         committed part files)",
        audit.lost, audit.duplicated, audit.unique, audit.lines, audit.files
    )
}

/// Reads every committed part file under `dir` and counts each record id of
/// `0..records` (the first field of each line): the exactly-once check over every
/// attempt of a run, restarts and restores included.
pub fn audit_output(dir: &std::path::Path, records: u64) -> Result<OutputAudit, RunError> {
    use std::io::BufRead;
    let mut seen = vec![0u64; (records as usize).div_ceil(64)];
    let mut audit = OutputAudit::default();
    for path in committed_parts(dir)? {
        audit.files += 1;
        let file = std::fs::File::open(&path)
            .map_err(|e| RunError::Setting(format!("cannot read {}: {e}", path.display())))?;
        for line in std::io::BufReader::new(file).split(b'\n') {
            let line = line
                .map_err(|e| RunError::Setting(format!("cannot read {}: {e}", path.display())))?;
            audit.lines += 1;
            let id = line
                .split(|b| *b == b' ')
                .next()
                .and_then(|f| std::str::from_utf8(f).ok())
                .and_then(|f| f.parse::<u64>().ok())
                .filter(|id| *id < records);
            match id {
                Some(id) => {
                    let (word, bit) = ((id / 64) as usize, 1u64 << (id % 64));
                    if seen[word] & bit != 0 {
                        audit.duplicated += 1;
                    } else {
                        seen[word] |= bit;
                        audit.unique += 1;
                    }
                }
                None => audit.duplicated += 1,
            }
        }
    }
    audit.lost = records - audit.unique;
    Ok(audit)
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
    let source = match &settings.streams.source {
        Some(config) => {
            let config = config.clone();
            let wall = settings.cluster.is_some();
            graph
                .from_source_io(move |info| {
                    let (inner, io) = stream_source(&config, info);
                    let input = StreamInput {
                        inner,
                        offset: None,
                        wall,
                    };
                    (input, io)
                })
                .name("redis-stream source")
        }
        None => {
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
    let from_streams = settings.streams.source.is_some();
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
        match (output, settings.streams.sink.clone()) {
            (_, Some(config)) => keyed.sink_io(move |info: &SubtaskInfo| {
                let format: fn(&Enriched, &mut Fields) = stream_fields;
                let (out, io) = stream_sink(&config, info, format);
                let sink = StreamOut {
                    check: check(),
                    out,
                    wall: (!wall_clock).then(WallClock::default),
                };
                (sink, io)
            }),
            (None, None) => keyed.sink(move |_| check()),
            (Some(dir), None) => keyed.sink(move |info: &SubtaskInfo| OutputSink {
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

/// "completed", or "failed" when the job stopped early.
pub fn outcome(finished: &Finished) -> &'static str {
    if finished.failure.is_some() {
        "failed"
    } else {
        "completed"
    }
}

/// What to change after a job failed, where the failure says.
pub fn failure_hint(error: &RuntimeError) -> Option<&'static str> {
    let RuntimeError::Task { error, .. } = error else {
        return None;
    };
    match error.downcast_ref::<OperatorError>()? {
        OperatorError::Async(AsyncError::Timeout) => Some(
            "a lookup outlived --timeout, which covers all its attempts: raise --timeout or \
             lower the service's --latency",
        ),
        // The client's and the service's messages (weir_net::lookup).
        OperatorError::Async(AsyncError::Call(cause)) => {
            let cause = cause.to_string();
            if cause.starts_with("no answer from the lookup service") {
                Some(
                    "an attempt got no answer within its share of --timeout (the timeout \
                     ÷ attempts): raise --timeout, or offer less load (--capacity, --cores, \
                     --rate)",
                )
            } else if cause.contains("failed at the service") {
                Some("a lookup failed on every attempt: raise --retries or lower --error-rate")
            } else {
                None
            }
        }
        _ => None,
    }
}

/// The end-of-run table (also for a failed job: what it did until it stopped).
pub fn render(settings: &JobSettings, finished: &Finished, mean_latency: Duration) -> String {
    let Finished {
        report,
        elapsed,
        failure,
    } = finished;
    let workers = report.run.drivers.len().max(1);
    let throughput = report.received as f64 / elapsed.as_secs_f64();
    let little = (settings.capacity * workers) as f64 / mean_latency.as_secs_f64().max(1e-9);
    let h = &report.latency_ns;
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
    let failed = report.async_metrics.failed;
    let mut out = String::new();
    let mut row = |name: &str, value: String| out.push_str(&format!("  {name:<28} {value}\n"));
    row("outcome", outcome(finished).to_string());
    if let Some(error) = failure {
        row("cause", error.to_string());
    }
    row(
        "workers / driver",
        format!(
            "{workers} / {}",
            report.run.drivers.first().copied().unwrap_or("none")
        ),
    );
    let pinned = report.run.pinned.iter().filter(|p| **p).count();
    row(
        "pinned",
        match (pinned, report.run.pinned.len()) {
            (_, 0) => "unknown (the job stopped early)".to_string(),
            (0, _) => "no".to_string(),
            (p, n) if p == n => "yes, every worker to its core".to_string(),
            (p, n) => format!("{p} of {}", workers_text(n)),
        },
    );
    row("records in", report.generated.to_string());
    row("records out", report.received.to_string());
    row("failed", failed.to_string());
    if failure.is_some() {
        // `missing` also counts the records never generated.
        let delivered = match settings.streams.source {
            Some(_) => report.unique,
            None => settings.records - report.missing,
        };
        row(
            "undelivered / duplicated",
            format!(
                "{} / {} (of the records generated before the job stopped)",
                report.generated.saturating_sub(delivered),
                report.duplicates
            ),
        );
    } else if let Some(restored) = report
        .checkpoints
        .as_ref()
        .and_then(|c| c.restored.as_ref())
    {
        row(
            "lost / duplicated",
            format!(
                "– / {} (this attempt only: it restored checkpoint {}, and records before it \
                 are not counted here; with --output, \"committed output\" counts every attempt)",
                report.duplicates, restored.id
            ),
        );
    } else {
        row(
            "lost / duplicated",
            format!("{} / {}", report.missing, report.duplicates),
        );
    }
    row("elapsed", format!("{:.3} s", elapsed.as_secs_f64()));
    row("throughput", format!("{:.0} records/s", throughput));
    if mean_latency > Duration::ZERO {
        row(
            "Little's limit",
            format!("{little:.0} records/s (capacity × parallelism ÷ mean latency)"),
        );
        row(
            "fraction of Little's limit",
            format!("{:.1}%", throughput / little * 100.0),
        );
    }
    if h.is_empty() {
        row("latency", "no record arrived".to_string());
    } else {
        row(
            "latency p50 / p99 / p99.9",
            format!("{:.0} / {:.0} / {:.0} µs", us(0.5), us(0.99), us(0.999)),
        );
        row("latency max", format!("{:.0} µs", h.max() as f64 / 1e3));
    }
    row(
        "retried / timed out",
        format!(
            "{} / {}",
            report.async_metrics.retried, report.async_metrics.timed_out
        ),
    );
    if let Some(rate) = report.async_metrics.cache_hit_rate() {
        let m = &report.async_metrics;
        row(
            "lookup cache",
            format!(
                "{:.1}% hits ({} hits, {} misses, {} loads, mean load {:.0} µs)",
                rate * 100.0,
                m.cache_hits,
                m.cache_misses,
                m.cache_loads,
                m.cache_load_ns as f64 / m.cache_loads.max(1) as f64 / 1e3
            ),
        );
    }
    row(
        "time back-pressured",
        format!(
            "{:.3} s (sum over sources)",
            report.backpressured_ns as f64 / 1e9
        ),
    );
    let mut wakeups = Wakeups::default();
    for worker in &report.run.wakeups {
        wakeups.merge(worker);
    }
    row(
        "worker wake-ups",
        format!(
            "{} notified, {} I/O, {} deadline, {} idle ({} rescued) (over {} parks); {} \
             timer-slack sleeps",
            wakeups.notified,
            wakeups.io,
            wakeups.deadline,
            wakeups.idle,
            wakeups.rescued,
            report.run.parks.iter().sum::<u64>(),
            wakeups.slack
        ),
    );
    row(
        "timers peak",
        format!(
            "{} timers (capacity {})",
            report.async_metrics.timers_peak, settings.capacity
        ),
    );
    if let Some(checkpoints) = &report.checkpoints {
        let summary = CheckpointSummary::of(checkpoints);
        if let Some(restored) = &checkpoints.restored {
            row(
                "restored from",
                format!(
                    "checkpoint {} ({}), read in {}{}",
                    restored.id,
                    restored.path.display(),
                    format_duration(restored.read_time),
                    match restored.skipped.len() {
                        0 => String::new(),
                        n => format!("; {n} newer one(s) passed over as incomplete or corrupt"),
                    }
                ),
            );
        }
        row(
            "checkpoints done / failed",
            format!("{} / {}", summary.completed, summary.failed),
        );
        row("restarts", report.restarts.to_string());
        if summary.completed > 0 {
            row(
                "checkpoint time p50 / max",
                format!(
                    "{} / {}",
                    format_duration(summary.duration_p50),
                    format_duration(summary.duration_max)
                ),
            );
            row(
                "alignment p50 / max",
                format!(
                    "{} / {}",
                    format_duration(summary.alignment_p50),
                    format_duration(summary.alignment_max)
                ),
            );
            row("checkpoint size (last)", bytes_text(summary.last_size));
        }
    }
    out
}

/// The settings as JSON (also written for a job that could not start).
pub fn settings_json(settings: &JobSettings) -> Value {
    json!({
        "records": settings.records,
        "rate": settings.rate,
        "mode": mode_name(settings.mode),
        "capacity": settings.capacity,
        "timeout_ms": settings.timeout.as_secs_f64() * 1e3,
        "retries": settings.retries,
        "attempt_timeout_ms": settings.attempt_timeout().as_secs_f64() * 1e3,
        "connections": settings.connections,
        "buffer_timeout_ms": settings.buffer_timeout.map(|t| t.as_secs_f64() * 1e3),
        "timer_slack_us": settings.timer_slack.as_secs_f64() * 1e6,
        "lookup_batch": settings.lookup_batch,
    })
}

/// The report as JSON, with the outcome and, for a failed job, its cause.
pub fn to_json(settings: &JobSettings, finished: &Finished) -> Value {
    let Finished {
        report,
        elapsed,
        failure,
    } = finished;
    let h = &report.latency_ns;
    json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "machine": crate::compare::machine(),
        "outcome": outcome(finished),
        "cause": failure.as_ref().map(|e| e.to_string()),
        "hint": failure.as_ref().and_then(failure_hint),
        "settings": settings_json(settings),
        "drivers": report.run.drivers,
        "records_in": report.generated,
        "records_out": report.received,
        "failed": report.async_metrics.failed,
        "lost": report.missing,
        "unique": report.unique,
        "duplicated": report.duplicates,
        "process": settings.cluster.as_ref().map(|c| c.process),
        "lost_connections": report.lost_connections,
        "processes": settings.cluster.as_ref().map_or(1, |c| c.peers.len()),
        "elapsed_s": elapsed.as_secs_f64(),
        "throughput_records_per_s": report.received as f64 / elapsed.as_secs_f64(),
        "latency_ns": if h.is_empty() { Value::Null } else { json!({
            "p50": h.value_at_quantile(0.5), "p90": h.value_at_quantile(0.9), "p99": h.value_at_quantile(0.99),
            "p99.9": h.value_at_quantile(0.999), "max": h.max(),
        }) },
        "retried": report.async_metrics.retried,
        "timed_out": report.async_metrics.timed_out,
        "backpressured_s": report.backpressured_ns as f64 / 1e9,
        "timers_peak": report.async_metrics.timers_peak,
        "cache": report.async_metrics.cache_hit_rate().map(|rate| {
            let m = &report.async_metrics;
            json!({
                "hit_rate": rate, "hits": m.cache_hits, "misses": m.cache_misses,
                "loads": m.cache_loads, "entries": m.cache_entries,
                "mean_load_ms": m.cache_load_ns as f64 / m.cache_loads.max(1) as f64 / 1e6,
            })
        }),
        "wakeups": report.run.wakeups.iter().map(|w| json!({
            "notified": w.notified, "io": w.io, "deadline": w.deadline, "idle": w.idle,
            "slack": w.slack,
        })).collect::<Vec<_>>(),
        "parks": report.run.parks,
        "first_output_unix_ms": report.first_output_unix_ns.map(|ns| ns as f64 / 1e6),
        "checkpoints": report.checkpoints.as_ref().map(|c| {
            let summary = CheckpointSummary::of(c);
            json!({
                "completed": summary.completed,
                "failed": summary.failed,
                "duration_ms": { "p50": summary.duration_p50.as_secs_f64() * 1e3, "max": summary.duration_max.as_secs_f64() * 1e3 },
                "alignment_ms": { "p50": summary.alignment_p50.as_secs_f64() * 1e3, "max": summary.alignment_max.as_secs_f64() * 1e3 },
                "last_size_bytes": summary.last_size,
                "restarts": report.restarts,
                "restored_from": c.restored.as_ref().map(|r| json!({
                    "id": r.id,
                    "path": r.path.display().to_string(),
                    "read_ms": r.read_time.as_secs_f64() * 1e3,
                })),
            })
        }),
    })
}

/// The JSON of a job that could not start: its settings, the outcome and the cause.
pub fn failed_to_start_json(settings: &JobSettings, error: &RunError) -> Value {
    json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "machine": crate::compare::machine(),
        "outcome": "failed",
        "cause": error.to_string(),
        "settings": settings_json(settings),
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
