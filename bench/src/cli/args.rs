//! The command line: `weir`'s subcommands and their arguments, as clap parses them.
//! Their doc comments are the `--help` texts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use weir_bench::job;
use weir_engine::checkpoint::RestartStrategy;
use weir_net::kafka::{KafkaUrl, KafkaUrlError};
use weir_net::lookup::Latency;
use weir_net::redis::streams::{StartFrom, StreamUrl, StreamUrlError};
use weir_net::redis::RedisUrl;
use weir_net::DriverKind;

#[derive(Parser)]
#[command(
    name = "weir",
    version,
    about = "Weir: a thread-per-core, lock-free stream-processing core",
    // `weir --records 1000` is `weir run --records 1000`: without a subcommand, the
    // flags are `run`'s.
    args_conflicts_with_subcommands = true
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
    /// Without a subcommand: `weir run` with these flags.
    #[command(flatten)]
    pub(crate) run: Box<RunArgs>,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// The main job: embedded lookup service → async lookup → key-hash exchange → sink.
    Run(Box<RunArgs>),
    /// The lookup service alone, until interrupted.
    ServeLookup(ServeArgs),
    /// Loads the main job's keys (`weir:0` ...) into Redis for `weir run --store`,
    /// pipelined.
    LoadRedis(LoadRedisArgs),
    /// Appends main-job records (fields id, key, t) to a Redis stream for `weir run
    /// --source`, pipelined, as fast as Redis takes them or at a rate.
    ProduceStream(ProduceStreamArgs),
    /// Write test records to a Kafka topic for `weir run --source kafka://…` (values
    /// `id,key,t` as text, keyed by the key), created if missing.
    ProduceKafka(ProduceKafkaArgs),
    /// Weir against its peers in interleaved turns; prints medians and ratios.
    Compare {
        /// Which structures to compare.
        #[arg(value_enum)]
        suite: Suite,
        /// Rounds of turns (each implementation runs once per round).
        #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u32).range(1..=1000))]
        rounds: u32,
        /// Work per turn relative to the default (0.1 for a quick look).
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        /// Also write the figures as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Only the experiments whose name contains this text.
        #[arg(long)]
        only: Option<String>,
        /// Only the implementations whose name contains this text (e.g. to profile one);
        /// only the one so named, where a name is exactly this text.
        #[arg(long)]
        implementation: Option<String>,
    },
    /// What checkpoints cost (the main job and a keyed job with and without them,
    /// aligned and unaligned, under back-pressure) and how fast a stopped job is
    /// processing again after a restore; interleaved rounds, medians.
    CheckpointBench {
        /// Rounds (each case runs once per round).
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
        rounds: u32,
        /// Work per run relative to the default (0.1 for a quick look).
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        /// Only the experiments whose name contains this (e.g. `back-pressure`,
        /// `recovery`); all by default.
        #[arg(long)]
        only: Option<String>,
        /// Also write the figures as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Kafka source → sink against rdkafka's own consumer → producer loop: throughput
    /// and CPU per record over a topic read to its end, and latency end to end at a
    /// fixed rate; alternating turns, medians. Needs a broker (`scripts/kafka.sh start`).
    KafkaBench {
        /// The broker, host:port.
        #[arg(long, default_value = "127.0.0.1:19092")]
        brokers: String,
        /// Records of a throughput turn.
        #[arg(long, default_value_t = 500_000, value_parser = clap::value_parser!(u64).range(1000..))]
        records: u64,
        /// Records of a latency turn.
        #[arg(long, default_value_t = 50_000, value_parser = clap::value_parser!(u64).range(100..))]
        latency_records: u64,
        /// Records per second of the latency turns.
        #[arg(long, default_value_t = 10_000.0)]
        rate: f64,
        /// Rounds (each side runs each turn once per round).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
        rounds: u32,
        /// Also write the figures as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The main job from Redis streams to a Redis stream beside the generator →
    /// counting sink job: throughput and CPU per record, and latency end to end at a
    /// fixed rate; interleaved rounds, medians. Starts its own redis-server.
    StreamBench {
        /// Rounds (each case runs once per round).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
        rounds: u32,
        /// Work per run relative to the default (2 M records a throughput turn, 5 s a
        /// latency turn).
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        /// Records per second of the latency runs.
        #[arg(long, default_value_t = 50_000.0)]
        rate: f64,
        /// Also write the figures as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Prints the reference of every command and flag (markdown), generated from the
    /// definitions `--help` shows: `weir cli-reference > docs/cli-reference.md`.
    CliReference,
    /// Prints the reference of every public configuration struct and builder of the
    /// library crates (markdown), generated from their source and defaults:
    /// `weir config-reference > docs/config-reference.md`.
    ConfigReference,
    /// Writes REPORT.md and its plots from the JSON that scripts/report.sh collected.
    Report {
        /// Where the JSON is.
        #[arg(long, default_value = "results/report")]
        data: PathBuf,
        /// Where REPORT.md and plots/ go.
        #[arg(long, default_value = "results")]
        out: PathBuf,
        /// The commit measured.
        #[arg(long, default_value = "unknown")]
        commit: String,
    },
    /// Buffer debloating: a producer against a deliberately slow consumer, with and
    /// without debloating; bytes in flight and the wait of in-band markers.
    Debloat(DebloatArgs),
    /// Sums up the JSON reports of the processes of one `weir run` cluster (as
    /// `--processes` does by itself; for processes started by hand or by
    /// scripts/cluster.sh).
    Summarize {
        /// Each process's `--json` report.
        #[arg(required = true)]
        reports: Vec<PathBuf>,
        /// Also write the summary as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Lists the checkpoints in a checkpoint directory, newest first: id, when it was
    /// taken, how long it took, its size and tasks, and whether a restore can use it
    /// (and why not).
    Checkpoints {
        /// The checkpoint directory (holds `chk-<id>/`).
        dir: PathBuf,
    },
    /// What sleeping and waking cost a thread on this machine: the CPU of a short timed
    /// sleep that runs out, and of a wake-up by another thread (futex ping-pong between
    /// two cores); the yardstick of the low-load figures.
    WakeCost {
        /// Timed sleeps of 20 µs to measure.
        #[arg(long, default_value_t = 20_000)]
        sleeps: u64,
        /// Wake-up round trips to measure (two wake-ups each).
        #[arg(long, default_value_t = 50_000)]
        round_trips: u64,
        /// Also write the figures as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Samples a workload with the in-process profiler and writes a flamegraph SVG.
    Profile {
        /// What to profile.
        #[arg(value_enum)]
        target: ProfileTarget,
        /// The SVG to write.
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct DebloatArgs {
    /// Records per second the slow consumer reads.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) rate: u64,
    /// Length of each run (measured after the first half).
    #[arg(long, default_value = "4s", value_parser = parse_positive_duration)]
    pub(crate) duration: Duration,
    /// Debloat target: how long the bytes in flight should take to read.
    #[arg(long, default_value = "200ms", value_parser = parse_duration)]
    pub(crate) target: Duration,
    /// Debloat period.
    #[arg(long, default_value = "50ms", value_parser = parse_duration)]
    pub(crate) period: Duration,
    /// Debloat samples (smoothing).
    #[arg(long, default_value_t = 5)]
    pub(crate) samples: u32,
    /// Smallest buffer size announced, in bytes.
    #[arg(long, default_value_t = 256)]
    pub(crate) min_size: usize,
    /// Buffer size announced at the start, before anything was measured, in bytes
    /// (Flink's `taskmanager.memory.starting-segment-size`).
    #[arg(long, default_value_t = weir_engine::exchange::STARTING_SIZE_DEFAULT)]
    pub(crate) starting_size: usize,
    /// Segments of the producer's pool.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub(crate) segments: u64,
    /// Also write the figures as JSON here.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum ProfileTarget {
    /// The main job on its defaults (fewer records).
    MainJob,
    /// The async operator at latency 0.
    Async,
    /// The exchange, 100-byte records 1→1.
    Exchange,
}

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct RunArgs {
    /// Records to generate.
    #[arg(long, default_value_t = 2_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) records: u64,
    /// Records per second (open loop, latency counted from the intended time); default:
    /// as fast as the pipeline accepts.
    #[arg(long)]
    pub(crate) rate: Option<f64>,
    /// Output mode of the async lookup.
    #[arg(long, value_enum, default_value_t = Mode::Unordered)]
    pub(crate) mode: Mode,
    /// In-flight lookups per source subtask.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub(crate) capacity: u64,
    /// Lookup latency: fixed:<d>, uniform:<d>..<d>, lognormal:<median>,<sigma>.
    #[arg(long, default_value = "fixed:1ms", value_parser = parse_latency)]
    pub(crate) latency: Latency,
    /// Time limit of a record's lookup over all its attempts, as in Flink's async I/O
    /// (e.g. 1s, 500ms): with --retries N each attempt gets timeout ÷ (N + 1), which the
    /// run's header shows.
    #[arg(long, default_value = "1s", value_parser = parse_positive_duration)]
    pub(crate) timeout: Duration,
    /// Retries after a failed lookup (fixed delay, --retry-delay), all within --timeout.
    #[arg(long, default_value_t = 0)]
    pub(crate) retries: u32,
    /// Delay between retries.
    #[arg(long, default_value = "5ms", value_parser = parse_duration)]
    pub(crate) retry_delay: Duration,
    /// Workers: a count, or a comma-separated list of core ids (one core id with a
    /// trailing comma: `3,`); at most one per core of this machine unless
    /// --oversubscribe (default: one per core).
    #[arg(long)]
    pub(crate) cores: Option<String>,
    /// Allow more workers than cores (or a core listed twice): workers then share cores.
    #[arg(long)]
    pub(crate) oversubscribe: bool,
    /// Do not pin workers (nor the embedded lookup service) to cores.
    #[arg(long)]
    pub(crate) no_pin: bool,
    /// I/O driver (default: WEIR_DRIVER, else io_uring with epoll fallback).
    #[arg(long)]
    pub(crate) driver: Option<DriverKind>,
    /// Bytes per looked-up value.
    #[arg(long, default_value_t = 32)]
    pub(crate) value_size: usize,
    /// Distinct keys.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) keys: u64,
    /// Share of records on the hottest 1% of keys (skew); 0 = uniform.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) skew: f64,
    /// How keys are drawn over --keys: uniform, or zipf:<s> (key k with weight
    /// 1/(k+1)^s, e.g. zipf:1.1).
    #[arg(long, default_value = "uniform", value_parser = parse_key_distribution, conflicts_with = "skew")]
    pub(crate) key_distribution: KeyDraw,
    /// A lookup cache per async subtask (Flink's PARTIAL lookup cache), not checkpointed:
    /// rows=<n>[,write=<duration>][,access=<duration>][,missing=on|off], e.g.
    /// rows=10000,write=10s.
    #[arg(long, value_parser = parse_cache)]
    pub(crate) cache: Option<job::CacheSettings>,
    /// Lookup connections per source subtask.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub(crate) connections: u64,
    /// Use a running service at this address instead of the embedded one.
    #[arg(long)]
    pub(crate) lookup_addr: Option<SocketAddr>,
    /// Look the keys up in Redis instead (redis://[user:password@]host:port[/db]); load
    /// them first with `weir load-redis`.
    #[arg(long, value_parser = parse_boxed_redis_url)]
    pub(crate) store: Option<Box<RedisUrl>>,
    /// With --store: batch each task turn's lookups into MGETs of up to this many keys
    /// (the batched async operator, batch timeout 0); 0 sends each GET on its own
    /// (plain pipelining).
    #[arg(long, default_value_t = 0)]
    pub(crate) mget: usize,
    /// Send the lookup service's lookups as batch requests of up to this many keys (the
    /// batched async operator cuts each task turn's lookups into batches, batch
    /// timeout 0; the service answers each batch after one latency, as a batch API
    /// does); 0 sends a request per record.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=4096))]
    pub(crate) lookup_batch: u64,
    /// Injected error-response rate at the embedded service.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) error_rate: f64,
    /// Exchange buffer timeout: how long a record may wait in a partly filled buffer
    /// before the buffer is flushed to its reader (0 = flush every record). The default,
    /// 100 µs, keeps the wait well under the 1 ms lookup; at full load buffers fill long
    /// before it, and at low load it costs a reader's wake-up per flush (a longer one
    /// trades latency for less CPU at low load).
    #[arg(long, default_value = "100us", value_parser = parse_duration)]
    pub(crate) buffer_timeout: Duration,
    /// Write the report as JSON here (checked before the run; a failed job writes its
    /// outcome and cause too).
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Run the lookup written as an `async` block on the per-worker executor.
    #[arg(long)]
    pub(crate) futures: bool,
    /// No progress bar.
    #[arg(long)]
    pub(crate) quiet: bool,
    /// Run the job over this many local processes, the workers split among them and the
    /// key-by exchange crossing them over TCP with credit-based flow control; one summary
    /// at the end.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub(crate) processes: u64,
    /// Run one process of a job spread over several (on this host or others): its index
    /// in --peers. Every process gets the same --peers and the same job settings.
    #[arg(long, requires = "peers")]
    pub(crate) process: Option<usize>,
    /// With --process: every process's transport address, this one's included, in process
    /// order (host:port,host:port,...).
    #[arg(long, value_delimiter = ',', requires = "process")]
    pub(crate) peers: Option<Vec<SocketAddr>>,
    /// The cluster secret every process of the job shares (a file only its owner may
    /// read, 16 bytes or more, e.g. `head -c 32 /dev/urandom | xxd -p -c 64`): a peer
    /// that cannot prove it holds the same one is refused. `--processes` makes one
    /// itself; without one, processes of the same job still find each other but prove
    /// nothing (see "Who may talk to a job" in guide/src/transport.md).
    #[arg(long)]
    pub(crate) secret_file: Option<PathBuf>,
    /// Take a checkpoint this often (e.g. 1s, 200ms) into --checkpoint-dir: a crashed
    /// run restarted with --restore or --resume continues from the last one (see
    /// guide/src/fault-tolerance.md).
    #[arg(long, value_parser = parse_positive_duration, requires = "checkpoint_dir")]
    pub(crate) checkpoint_interval: Option<Duration>,
    /// Where checkpoints are written (`chk-<id>/` directories, the newest
    /// --checkpoints-retained kept).
    #[arg(long, requires = "checkpoint_interval")]
    pub(crate) checkpoint_dir: Option<PathBuf>,
    /// Unaligned checkpoints: barriers do not wait for each other at the key-by
    /// exchange; what is in flight there is stored with the checkpoint.
    #[arg(long, requires = "checkpoint_interval")]
    pub(crate) unaligned: bool,
    /// Aligned checkpoints that switch to unaligned when an alignment takes longer than
    /// this (Flink's aligned-checkpoint-timeout).
    #[arg(long, value_parser = parse_duration, requires = "checkpoint_interval", conflicts_with = "unaligned")]
    pub(crate) aligned_timeout: Option<Duration>,
    /// Restore from a checkpoint: a `chk-<id>` directory, or a checkpoint directory
    /// (its newest complete, valid checkpoint); the job must have the same settings.
    #[arg(long, requires = "checkpoint_interval")]
    pub(crate) restore: Option<PathBuf>,
    /// One command for every start under a supervisor (systemd, Kubernetes): restore
    /// the newest completed checkpoint under --checkpoint-dir if one ever completed
    /// there, start from the beginning if none did (the directory may not exist yet),
    /// and say which. A newest checkpoint that cannot be read is still refused by name.
    #[arg(long, requires = "checkpoint_interval", conflicts_with = "restore")]
    pub(crate) resume: bool,
    /// With --restore DIR or --resume: where the newest completed checkpoint cannot be
    /// read back, restore the newest older one that can (kept by
    /// --checkpoints-retained), naming each one passed over. Output committed after it
    /// is written again, which the transactional --output refuses, naming its files.
    /// One process only.
    #[arg(long)]
    pub(crate) restore_fallback: bool,
    /// The workers' timer slack: a worker woken by an arrival takes what else arrives
    /// within this long in the same turn instead of waking once per arrival (less CPU
    /// per record at low load, at most this much more latency; a busy worker never
    /// waits). 0s: every arrival wakes its worker.
    #[arg(long, default_value = "50us", value_parser = parse_duration)]
    pub(crate) timer_slack: Duration,
    /// The embedded lookup service's timer slack (as `weir serve-lookup
    /// --timer-slack`): the answers due within this long after the earliest leave
    /// together at one timer expiry, up to this much late. 0s: each answer leaves at its
    /// time, as the external service it stands in for would answer.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub(crate) service_timer_slack: Duration,
    /// Completed checkpoints kept in --checkpoint-dir (Flink's
    /// state.checkpoints.num-retained): older ones are what --restore-fallback can use.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000), requires = "checkpoint_interval")]
    pub(crate) checkpoints_retained: u32,
    /// With checkpoints, what a failure (a task's error or panic, failed checkpoints)
    /// does: none, fixed-delay:<attempts>:<delay>, or exponential-delay (Flink's default:
    /// 1 s growing by 1.5 to 1 min, jitter 0.1); a restart starts from the latest
    /// completed checkpoint.
    #[arg(
        long,
        default_value = "exponential-delay",
        requires = "checkpoint_interval"
    )]
    pub(crate) restart_strategy: RestartStrategy,
    /// Also write every record (`<id> <key> <value hex>` lines) as part files here,
    /// exactly once: committed when a checkpoint completes (at the end without
    /// checkpoints); a reader takes the files without a suffix.
    #[arg(long)]
    pub(crate) output: Option<PathBuf>,
    /// Serve live metrics (Prometheus text: Flink's task metrics per stage and
    /// subtask, the async operators', checkpoints', and the Redis clients') at
    /// http://ADDR/metrics while the job runs, e.g. 127.0.0.1:9249.
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics_addr: Option<String>,
    /// Read the records from Redis streams or Kafka topics instead of generating them:
    /// redis-stream://[user:password@]host:port/stream[,stream…][?db=N], entries as
    /// `weir produce-stream` writes them (fields id, key, t), each stream read whole by
    /// one source subtask (stream i by subtask i mod parallelism); or
    /// kafka://host:port[,host:port…]/topic[,topic…], messages as `weir produce-kafka`
    /// writes them (`id,key,t`), partitions spread over the subtasks as Flink's Kafka
    /// source spreads them. The run ends at the end of the input under --bounded, else on
    /// Ctrl-C (the sources stop, what they read drains).
    #[arg(long, value_name = "URL", value_parser = parse_endpoint, conflicts_with_all = ["rate", "records"])]
    pub(crate) source: Option<Endpoint>,
    /// With --source: read up to the entries the streams hold when the job starts (Kafka:
    /// to the end each partition has when reached), then end.
    #[arg(long, requires = "source")]
    pub(crate) bounded: bool,
    /// With --source: where reading starts: beginning, latest (entries added after the
    /// job starts), or after an entry id (e.g. 1764720000000-0). A restore reads on from
    /// its checkpoint instead.
    #[arg(long, default_value = "beginning", value_parser = parse_start, requires = "source")]
    pub(crate) source_start: StartFrom,
    /// With --source: read as consumer GROUP[:CONSUMER] of each stream (XREADGROUP; made
    /// at the start position where missing), acknowledging (XACK) what a completed
    /// checkpoint covers; for streams other consumers share. Consumer: weir. Kafka: the
    /// consumer group completed checkpoints commit the offsets to, for monitoring (a
    /// restore reads its checkpoint's offsets, never the group's).
    #[arg(long, value_name = "GROUP[:CONSUMER]", requires = "source")]
    pub(crate) consumer_group: Option<String>,
    /// With --source: a stream without entries for this long stops holding back the
    /// watermark (Flink's idleness), e.g. 5s; default: never idle.
    #[arg(long, value_parser = parse_positive_duration, requires = "source")]
    pub(crate) source_idle_timeout: Option<Duration>,
    /// Also write every enriched record to a Redis stream (fields id, key, value as hex,
    /// t): redis-stream://[user:password@]host:port/stream; or to a Kafka topic (values
    /// `id,key,value hex,t`, keyed by the key): kafka://host:port/topic, created if
    /// missing.
    #[arg(long, value_name = "URL", value_parser = parse_endpoint, conflicts_with = "output")]
    pub(crate) sink: Option<Endpoint>,
    /// With --sink: at-least-once (each record written at once; a connection lost may
    /// write some twice), or exactly-once (each checkpoint's records in one MULTI/EXEC,
    /// or one Kafka transaction per sink subtask, when it completes; needs
    /// --checkpoint-interval).
    #[arg(long, value_enum, default_value_t = SinkGuarantee::AtLeastOnce, requires = "sink")]
    pub(crate) sink_guarantee: SinkGuarantee,
    /// With --sink: trim the stream to about this many entries (XADD MAXLEN ~ N).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), requires = "sink")]
    pub(crate) sink_maxlen: Option<u64>,
    /// With a Kafka --sink exactly once: the transactional ids' prefix
    /// (`PREFIX-SUBTASK`); two jobs writing exactly once at a time need different ones.
    #[arg(long, default_value = "weir-run", requires = "sink")]
    pub(crate) transactional_id_prefix: String,
}

/// `--source` and `--sink`: a Redis stream or a Kafka topic.
#[derive(Debug, Clone)]
pub(crate) enum Endpoint {
    Redis(Box<StreamUrl>),
    Kafka(KafkaUrl),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Redis(url) => url.fmt(f),
            Endpoint::Kafka(url) => url.fmt(f),
        }
    }
}

impl Endpoint {
    pub(crate) fn redis(&self) -> Option<&StreamUrl> {
        match self {
            Endpoint::Redis(url) => Some(url),
            Endpoint::Kafka(_) => None,
        }
    }

    pub(crate) fn kafka(&self) -> Option<&KafkaUrl> {
        match self {
            Endpoint::Kafka(url) => Some(url),
            Endpoint::Redis(_) => None,
        }
    }
}

pub(crate) fn parse_endpoint(text: &str) -> Result<Endpoint, String> {
    if text.starts_with("kafka://") {
        parse_kafka_url(text).map(Endpoint::Kafka)
    } else if text.starts_with("redis-stream://") {
        parse_stream_url(text).map(Endpoint::Redis)
    } else {
        parse_stream_url(text)
            .map(Endpoint::Redis)
            .map_err(|e| format!("{e}; or, for Kafka, kafka://host:port/topic"))
    }
}

pub(crate) fn parse_kafka_url(text: &str) -> Result<KafkaUrl, String> {
    text.parse().map_err(|e: KafkaUrlError| e.to_string())
}

/// `--sink-guarantee`.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum SinkGuarantee {
    AtLeastOnce,
    ExactlyOnce,
}

pub(crate) fn parse_stream_url(text: &str) -> Result<Box<StreamUrl>, String> {
    text.parse()
        .map(Box::new)
        .map_err(|e: StreamUrlError| e.to_string())
}

pub(crate) fn parse_start(text: &str) -> Result<StartFrom, String> {
    match text {
        "beginning" => Ok(StartFrom::Beginning),
        "latest" => Ok(StartFrom::Latest),
        id => id.parse().map(StartFrom::Id).map_err(|e| {
            format!("{e}: write beginning, latest, or an entry id such as 1764720000000-0")
        }),
    }
}

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7878")]
    pub(crate) addr: SocketAddr,
    /// Latency distribution.
    #[arg(long, default_value = "fixed:1ms", value_parser = parse_latency)]
    pub(crate) latency: Latency,
    /// Bytes per value.
    #[arg(long, default_value_t = 32)]
    pub(crate) value_size: usize,
    /// Error-response rate.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) error_rate: f64,
    /// Connection-reset rate per request.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) reset_rate: f64,
    /// Rate of requests never answered.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) stall_rate: f64,
    /// Poll instead of sleeping when an answer is due within this long, so answers leave
    /// at their deadline and not one wake-up later (keeps a core busy meanwhile).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub(crate) spin: Duration,
    /// Timer slack: the answers due within this long after the earliest leave together
    /// at one timer expiry, up to this much late (never early).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub(crate) timer_slack: Duration,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum Mode {
    Ordered,
    Unordered,
    Keyed,
}

pub(crate) fn parse_redis_url(text: &str) -> Result<RedisUrl, String> {
    text.parse()
        .map_err(|e: weir_net::redis::UrlError| e.to_string())
}

/// Boxed, to keep `RunArgs` small beside the other commands.
pub(crate) fn parse_boxed_redis_url(text: &str) -> Result<Box<RedisUrl>, String> {
    parse_redis_url(text).map(Box::new)
}

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct LoadRedisArgs {
    /// The server.
    #[arg(long, default_value = "redis://127.0.0.1:6379", value_parser = parse_redis_url)]
    pub(crate) store: RedisUrl,
    /// Keys to write (`weir:0` .. `weir:<N-1>`; match `weir run --keys`).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) keys: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 32)]
    pub(crate) value_size: usize,
}

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct ProduceStreamArgs {
    /// The stream: redis-stream://[user:password@]host:port/stream[?db=N].
    #[arg(value_parser = parse_stream_url)]
    pub(crate) url: Box<StreamUrl>,
    /// Entries to append. Their ids are reserved on the server (INCRBY
    /// weir:produce-stream:next-id), so they are unique over every stream there.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) count: u64,
    /// Entries per second (default: as fast as Redis takes them).
    #[arg(long)]
    pub(crate) rate: Option<f64>,
    /// Distinct keys (match `weir run --keys`, and `weir load-redis --keys` for --store).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) keys: u64,
    /// How keys are drawn: uniform, or zipf:<s>.
    #[arg(long, default_value = "uniform", value_parser = parse_key_distribution)]
    pub(crate) key_distribution: KeyDraw,
    /// Trim the stream to about this many entries (XADD MAXLEN ~ N).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) maxlen: Option<u64>,
}

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct ProduceKafkaArgs {
    /// The topic: kafka://host:port[,host:port…]/topic.
    #[arg(value_parser = parse_kafka_url)]
    pub(crate) url: KafkaUrl,
    /// Records to write: ids --first-id, --first-id + 1, … (the checking sink of `weir
    /// run` counts an id seen twice as a duplicate: give later loads of one topic ids
    /// after the earlier ones).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) count: u64,
    /// The first record's id.
    #[arg(long, default_value_t = 0)]
    pub(crate) first_id: u64,
    /// Records per second (default: as fast as the broker takes them).
    #[arg(long)]
    pub(crate) rate: Option<f64>,
    /// Distinct keys (match `weir run --keys`).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) keys: u64,
    /// How keys are drawn: uniform, or zipf:<s>.
    #[arg(long, default_value = "uniform", value_parser = parse_key_distribution)]
    pub(crate) key_distribution: KeyDraw,
    /// Partitions of the topic, when it is created.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(i32).range(1..))]
    pub(crate) partitions: i32,
}

/// `--key-distribution`: uniform, or Zipf with an exponent.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KeyDraw {
    Uniform,
    Zipf(f64),
}

pub(crate) fn parse_key_distribution(text: &str) -> Result<KeyDraw, String> {
    match text.split_once(':') {
        None if text == "uniform" => Ok(KeyDraw::Uniform),
        Some(("zipf", s)) => match s.parse::<f64>() {
            Ok(s) if s > 0.0 && s.is_finite() => Ok(KeyDraw::Zipf(s)),
            _ => Err(format!(
                "zipf:{s}: the exponent must be a positive number, e.g. zipf:1.1"
            )),
        },
        _ => Err("write uniform or zipf:<exponent>, e.g. zipf:1.1".into()),
    }
}

pub(crate) fn parse_cache(text: &str) -> Result<job::CacheSettings, String> {
    text.parse()
}

pub(crate) fn parse_latency(text: &str) -> Result<Latency, String> {
    text.parse()
}

pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    weir_net::lookup::parse_duration(text)
}

pub(crate) fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    if duration.is_zero() {
        return Err("must be positive".into());
    }
    Ok(duration)
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Suite {
    Ring,
    Pool,
    Async,
    Exchange,
    Lookup,
    Redis,
    Remote,
}
/// `weir` with no subcommand: `weir run` on its defaults.
#[derive(Parser)]
pub(crate) struct DefaultRun {
    #[command(flatten)]
    pub(crate) args: RunArgs,
}
