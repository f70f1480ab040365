//! `weir`: the command of the Weir stream-processing core.
// The doc comments of the argument structs are clap's `--help` text, written for a
// terminal (`redis://[user:password@]host:port`), not rustdoc links.
#![allow(
    rustdoc::broken_intra_doc_links,
    rustdoc::invalid_html_tags,
    rustdoc::bare_urls
)]

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::Value;
use weir_bench::job::{JobProgress, KeyDistribution};
use weir_bench::job::{RunError, WorkerPlan};
use weir_bench::{compare, job};
use weir_engine::async_io::OutputMode;
use weir_engine::checkpoint::{AlignmentMode, RestartStrategy};
use weir_net::lookup::{Faults, Latency, LookupServer, ServerConfig};
use weir_net::redis::streams::{
    ConsumerGroup, Guarantee, StartFrom, StreamSinkConfig, StreamSourceConfig, StreamUrl,
    StreamUrlError,
};
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
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Without a subcommand: `weir run` with these flags.
    #[command(flatten)]
    run: Box<RunArgs>,
}

#[derive(Subcommand)]
enum Command {
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
        /// Only the implementations whose name contains this text (e.g. to profile one).
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
struct DebloatArgs {
    /// Records per second the slow consumer reads.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    rate: u64,
    /// Length of each run (measured after the first half).
    #[arg(long, default_value = "4s", value_parser = parse_positive_duration)]
    duration: Duration,
    /// Debloat target: how long the bytes in flight should take to read.
    #[arg(long, default_value = "200ms", value_parser = parse_duration)]
    target: Duration,
    /// Debloat period.
    #[arg(long, default_value = "50ms", value_parser = parse_duration)]
    period: Duration,
    /// Debloat samples (smoothing).
    #[arg(long, default_value_t = 5)]
    samples: u32,
    /// Smallest buffer size announced, in bytes.
    #[arg(long, default_value_t = 256)]
    min_size: usize,
    /// Segments of the producer's pool.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=4096))]
    segments: u64,
    /// Also write the figures as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ProfileTarget {
    /// The main job on its defaults (fewer records).
    MainJob,
    /// The async operator at latency 0.
    Async,
    /// The exchange, 100-byte records 1→1.
    Exchange,
}

#[derive(clap::Args, Debug, Clone)]
struct RunArgs {
    /// Records to generate.
    #[arg(long, default_value_t = 2_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    records: u64,
    /// Records per second (open loop, latency counted from the intended time); default:
    /// as fast as the pipeline accepts.
    #[arg(long)]
    rate: Option<f64>,
    /// Output mode of the async lookup.
    #[arg(long, value_enum, default_value_t = Mode::Unordered)]
    mode: Mode,
    /// In-flight lookups per source subtask.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    capacity: u64,
    /// Lookup latency: fixed:<d>, uniform:<d>..<d>, lognormal:<median>,<sigma>.
    #[arg(long, default_value = "fixed:1ms", value_parser = parse_latency)]
    latency: Latency,
    /// Time limit of a record's lookup over all its attempts, as in Flink's async I/O
    /// (e.g. 1s, 500ms): with --retries N each attempt gets timeout ÷ (N + 1), which the
    /// run's header shows.
    #[arg(long, default_value = "1s", value_parser = parse_positive_duration)]
    timeout: Duration,
    /// Retries after a failed lookup (fixed delay, --retry-delay), all within --timeout.
    #[arg(long, default_value_t = 0)]
    retries: u32,
    /// Delay between retries.
    #[arg(long, default_value = "5ms", value_parser = parse_duration)]
    retry_delay: Duration,
    /// Workers: a count, or a comma-separated list of core ids (one core id with a
    /// trailing comma: `3,`); at most one per core of this machine unless
    /// --oversubscribe (default: one per core).
    #[arg(long)]
    cores: Option<String>,
    /// Allow more workers than cores (or a core listed twice): workers then share cores.
    #[arg(long)]
    oversubscribe: bool,
    /// Do not pin workers (nor the embedded lookup service) to cores.
    #[arg(long)]
    no_pin: bool,
    /// I/O driver (default: WEIR_DRIVER, else io_uring with epoll fallback).
    #[arg(long)]
    driver: Option<DriverKind>,
    /// Bytes per looked-up value.
    #[arg(long, default_value_t = 32)]
    value_size: usize,
    /// Distinct keys.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    keys: u64,
    /// Share of records on the hottest 1% of keys (skew); 0 = uniform.
    #[arg(long, default_value_t = 0.0)]
    skew: f64,
    /// How keys are drawn over --keys: uniform, or zipf:<s> (key k with weight
    /// 1/(k+1)^s, e.g. zipf:1.1).
    #[arg(long, default_value = "uniform", value_parser = parse_key_distribution, conflicts_with = "skew")]
    key_distribution: KeyDraw,
    /// A lookup cache per async subtask (Flink's PARTIAL lookup cache), not checkpointed:
    /// rows=<n>[,write=<duration>][,access=<duration>][,missing=on|off], e.g.
    /// rows=10000,write=10s.
    #[arg(long, value_parser = parse_cache)]
    cache: Option<job::CacheSettings>,
    /// Lookup connections per source subtask.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    connections: u64,
    /// Use a running service at this address instead of the embedded one.
    #[arg(long)]
    lookup_addr: Option<SocketAddr>,
    /// Look the keys up in Redis instead (redis://[user:password@]host:port[/db]); load
    /// them first with `weir load-redis`.
    #[arg(long, value_parser = parse_boxed_redis_url)]
    store: Option<Box<RedisUrl>>,
    /// With --store: batch each task turn's lookups into MGETs of up to this many keys
    /// (the batched async operator, batch timeout 0); 0 sends each GET on its own
    /// (plain pipelining).
    #[arg(long, default_value_t = 0)]
    mget: usize,
    /// Send the lookup service's lookups as batch requests of up to this many keys (the
    /// batched async operator cuts each task turn's lookups into batches, batch
    /// timeout 0; the service answers each batch after one latency, as a batch API
    /// does); 0 sends a request per record.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=4096))]
    lookup_batch: u64,
    /// Injected error-response rate at the embedded service.
    #[arg(long, default_value_t = 0.0)]
    error_rate: f64,
    /// Exchange buffer timeout: how long a record may wait in a partly filled buffer
    /// before the buffer is flushed to its reader (0 = flush every record). The default,
    /// 100 µs, keeps the wait well under the 1 ms lookup; at full load buffers fill long
    /// before it, and at low load it costs a reader's wake-up per flush (a longer one
    /// trades latency for less CPU at low load).
    #[arg(long, default_value = "100us", value_parser = parse_duration)]
    buffer_timeout: Duration,
    /// Write the report as JSON here (checked before the run; a failed job writes its
    /// outcome and cause too).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Run the lookup written as an `async` block on the per-worker executor.
    #[arg(long)]
    futures: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Run the job over this many local processes, the workers split among them and the
    /// key-by exchange crossing them over TCP with credit-based flow control; one summary
    /// at the end.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    processes: u64,
    /// Run one process of a job spread over several (on this host or others): its index
    /// in --peers. Every process gets the same --peers and the same job settings.
    #[arg(long, requires = "peers")]
    process: Option<usize>,
    /// With --process: every process's transport address, this one's included, in process
    /// order (host:port,host:port,...).
    #[arg(long, value_delimiter = ',', requires = "process")]
    peers: Option<Vec<SocketAddr>>,
    /// The cluster secret every process of the job shares (a file only its owner may
    /// read, 16 bytes or more, e.g. `head -c 32 /dev/urandom | xxd -p -c 64`): a peer
    /// that cannot prove it holds the same one is refused. `--processes` makes one
    /// itself; without one, processes of the same job still find each other but prove
    /// nothing (see "Who may talk to a job" in guide/src/transport.md).
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Take a checkpoint this often (e.g. 1s, 200ms) into --checkpoint-dir: a crashed
    /// run restarted with --restore or --resume continues from the last one (see
    /// guide/src/fault-tolerance.md).
    #[arg(long, value_parser = parse_positive_duration, requires = "checkpoint_dir")]
    checkpoint_interval: Option<Duration>,
    /// Where checkpoints are written (`chk-<id>/` directories, the newest
    /// --checkpoints-retained kept).
    #[arg(long, requires = "checkpoint_interval")]
    checkpoint_dir: Option<PathBuf>,
    /// Unaligned checkpoints: barriers do not wait for each other at the key-by
    /// exchange; what is in flight there is stored with the checkpoint.
    #[arg(long, requires = "checkpoint_interval")]
    unaligned: bool,
    /// Aligned checkpoints that switch to unaligned when an alignment takes longer than
    /// this (Flink's aligned-checkpoint-timeout).
    #[arg(long, value_parser = parse_duration, requires = "checkpoint_interval", conflicts_with = "unaligned")]
    aligned_timeout: Option<Duration>,
    /// Restore from a checkpoint: a `chk-<id>` directory, or a checkpoint directory
    /// (its newest complete, valid checkpoint); the job must have the same settings.
    #[arg(long, requires = "checkpoint_interval")]
    restore: Option<PathBuf>,
    /// One command for every start under a supervisor (systemd, Kubernetes): restore
    /// the newest completed checkpoint under --checkpoint-dir if one ever completed
    /// there, start from the beginning if none did (the directory may not exist yet),
    /// and say which. A newest checkpoint that cannot be read is still refused by name.
    #[arg(long, requires = "checkpoint_interval", conflicts_with = "restore")]
    resume: bool,
    /// With --restore DIR or --resume: where the newest completed checkpoint cannot be
    /// read back, restore the newest older one that can (kept by
    /// --checkpoints-retained), naming each one passed over. Output committed after it
    /// is written again, which the transactional --output refuses, naming its files.
    /// One process only.
    #[arg(long)]
    restore_fallback: bool,
    /// The workers' timer slack: a worker woken by an arrival takes what else arrives
    /// within this long in the same turn instead of waking once per arrival (less CPU
    /// per record at low load, at most this much more latency; a busy worker never
    /// waits). 0s: every arrival wakes its worker.
    #[arg(long, default_value = "50us", value_parser = parse_duration)]
    timer_slack: Duration,
    /// Completed checkpoints kept in --checkpoint-dir (Flink's
    /// state.checkpoints.num-retained): older ones are what --restore-fallback can use.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000), requires = "checkpoint_interval")]
    checkpoints_retained: u32,
    /// With checkpoints, what a failure (a task's error or panic, failed checkpoints)
    /// does: none, fixed-delay:<attempts>:<delay>, or exponential-delay (Flink's default:
    /// 1 s growing by 1.5 to 1 min, jitter 0.1); a restart starts from the latest
    /// completed checkpoint.
    #[arg(
        long,
        default_value = "exponential-delay",
        requires = "checkpoint_interval"
    )]
    restart_strategy: RestartStrategy,
    /// Also write every record (`<id> <key> <value hex>` lines) as part files here,
    /// exactly once: committed when a checkpoint completes (at the end without
    /// checkpoints); a reader takes the files without a suffix.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Serve live metrics (Prometheus text: Flink's task metrics per stage and
    /// subtask, the async operators', checkpoints', and the Redis clients') at
    /// http://ADDR/metrics while the job runs, e.g. 127.0.0.1:9249.
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<String>,
    /// Read the records from Redis streams instead of generating them:
    /// redis-stream://[user:password@]host:port/stream[,stream…][?db=N], entries as
    /// `weir produce-stream` writes them (fields id, key, t). Each stream is read whole by
    /// one source subtask (stream i by subtask i mod parallelism); the run ends with the
    /// streams under --bounded, else on Ctrl-C (the sources stop, what they read drains).
    #[arg(long, value_name = "URL", value_parser = parse_stream_url, conflicts_with_all = ["rate", "records"])]
    source: Option<Box<StreamUrl>>,
    /// With --source: read up to the entries the streams hold when the job starts, then
    /// end.
    #[arg(long, requires = "source")]
    bounded: bool,
    /// With --source: where reading starts: beginning, latest (entries added after the
    /// job starts), or after an entry id (e.g. 1764720000000-0). A restore reads on from
    /// its checkpoint instead.
    #[arg(long, default_value = "beginning", value_parser = parse_start, requires = "source")]
    source_start: StartFrom,
    /// With --source: read as consumer GROUP[:CONSUMER] of each stream (XREADGROUP; made
    /// at the start position where missing), acknowledging (XACK) what a completed
    /// checkpoint covers; for streams other consumers share. Consumer: weir.
    #[arg(long, value_name = "GROUP[:CONSUMER]", requires = "source")]
    consumer_group: Option<String>,
    /// With --source: a stream without entries for this long stops holding back the
    /// watermark (Flink's idleness), e.g. 5s; default: never idle.
    #[arg(long, value_parser = parse_positive_duration, requires = "source")]
    source_idle_timeout: Option<Duration>,
    /// Also append every enriched record to a Redis stream (fields id, key, value as hex,
    /// t): redis-stream://[user:password@]host:port/stream.
    #[arg(long, value_name = "URL", value_parser = parse_stream_url, conflicts_with = "output")]
    sink: Option<Box<StreamUrl>>,
    /// With --sink: at-least-once (each record appended at once; a connection lost may
    /// append some twice), or exactly-once (each checkpoint's records in one MULTI/EXEC
    /// when it completes; needs --checkpoint-interval).
    #[arg(long, value_enum, default_value_t = SinkGuarantee::AtLeastOnce, requires = "sink")]
    sink_guarantee: SinkGuarantee,
    /// With --sink: trim the stream to about this many entries (XADD MAXLEN ~ N).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), requires = "sink")]
    sink_maxlen: Option<u64>,
}

/// `--sink-guarantee`.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum SinkGuarantee {
    AtLeastOnce,
    ExactlyOnce,
}

fn parse_stream_url(text: &str) -> Result<Box<StreamUrl>, String> {
    text.parse()
        .map(Box::new)
        .map_err(|e: StreamUrlError| e.to_string())
}

fn parse_start(text: &str) -> Result<StartFrom, String> {
    match text {
        "beginning" => Ok(StartFrom::Beginning),
        "latest" => Ok(StartFrom::Latest),
        id => id.parse().map(StartFrom::Id).map_err(|e| {
            format!("{e}: write beginning, latest, or an entry id such as 1764720000000-0")
        }),
    }
}

#[derive(clap::Args, Debug, Clone)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7878")]
    addr: SocketAddr,
    /// Latency distribution.
    #[arg(long, default_value = "fixed:1ms", value_parser = parse_latency)]
    latency: Latency,
    /// Bytes per value.
    #[arg(long, default_value_t = 32)]
    value_size: usize,
    /// Error-response rate.
    #[arg(long, default_value_t = 0.0)]
    error_rate: f64,
    /// Connection-reset rate per request.
    #[arg(long, default_value_t = 0.0)]
    reset_rate: f64,
    /// Rate of requests never answered.
    #[arg(long, default_value_t = 0.0)]
    stall_rate: f64,
    /// Poll instead of sleeping when an answer is due within this long, so answers leave
    /// at their deadline and not one wake-up later (keeps a core busy meanwhile).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    spin: Duration,
    /// Timer slack: the answers due within this long after the earliest leave together
    /// at one timer expiry, up to this much late (never early).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    timer_slack: Duration,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Mode {
    Ordered,
    Unordered,
    Keyed,
}

fn parse_redis_url(text: &str) -> Result<RedisUrl, String> {
    text.parse()
        .map_err(|e: weir_net::redis::UrlError| e.to_string())
}

/// Boxed, to keep `RunArgs` small beside the other commands.
fn parse_boxed_redis_url(text: &str) -> Result<Box<RedisUrl>, String> {
    parse_redis_url(text).map(Box::new)
}

#[derive(clap::Args, Debug, Clone)]
struct LoadRedisArgs {
    /// The server.
    #[arg(long, default_value = "redis://127.0.0.1:6379", value_parser = parse_redis_url)]
    store: RedisUrl,
    /// Keys to write (`weir:0` .. `weir:<N-1>`; match `weir run --keys`).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    keys: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 32)]
    value_size: usize,
}

#[derive(clap::Args, Debug, Clone)]
struct ProduceStreamArgs {
    /// The stream: redis-stream://[user:password@]host:port/stream[?db=N].
    #[arg(value_parser = parse_stream_url)]
    url: Box<StreamUrl>,
    /// Entries to append. Their ids are reserved on the server (INCRBY
    /// weir:produce-stream:next-id), so they are unique over every stream there.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    count: u64,
    /// Entries per second (default: as fast as Redis takes them).
    #[arg(long)]
    rate: Option<f64>,
    /// Distinct keys (match `weir run --keys`, and `weir load-redis --keys` for --store).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    keys: u64,
    /// How keys are drawn: uniform, or zipf:<s>.
    #[arg(long, default_value = "uniform", value_parser = parse_key_distribution)]
    key_distribution: KeyDraw,
    /// Trim the stream to about this many entries (XADD MAXLEN ~ N).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    maxlen: Option<u64>,
}

/// `--key-distribution`: uniform, or Zipf with an exponent.
#[derive(Debug, Clone, Copy)]
enum KeyDraw {
    Uniform,
    Zipf(f64),
}

fn parse_key_distribution(text: &str) -> Result<KeyDraw, String> {
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

fn parse_cache(text: &str) -> Result<job::CacheSettings, String> {
    text.parse()
}

fn parse_latency(text: &str) -> Result<Latency, String> {
    text.parse()
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    weir_net::lookup::parse_duration(text)
}

fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    if duration.is_zero() {
        return Err("must be positive".into());
    }
    Ok(duration)
}

#[derive(Clone, Copy, ValueEnum)]
enum Suite {
    Ring,
    Pool,
    Async,
    Exchange,
    Lookup,
    Redis,
    Remote,
}

/// Every command and flag of `weir` as markdown tables: the flag, its value, its
/// default and its help text, taken from the same definitions as `--help`, so the
/// reference cannot drift from the command (`docs/cli-reference.md` is checked against
/// it by a test).
fn cli_reference() -> String {
    use clap::CommandFactory;
    use std::fmt::Write as _;
    fn cell(text: &str) -> String {
        text.split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .replace('|', "\\|")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    }
    fn table(out: &mut String, command: &clap::Command) {
        let args: Vec<&clap::Arg> = command
            .get_arguments()
            .filter(|a| !a.is_hide_set() && a.get_id() != "help" && a.get_id() != "version")
            .collect();
        if args.is_empty() {
            let _ = writeln!(out, "No flags.\n");
            return;
        }
        let _ = writeln!(out, "| flag | value | default | what it does |");
        let _ = writeln!(out, "|---|---|---|---|");
        for arg in args {
            let flag = match (arg.get_long(), arg.get_short()) {
                (Some(long), Some(short)) => format!("`-{short}`, `--{long}`"),
                (Some(long), None) => format!("`--{long}`"),
                (None, Some(short)) => format!("`-{short}`"),
                (None, None) => format!("`{}` (positional)", arg.get_id()),
            };
            let takes_value =
                arg.get_num_args().is_some_and(|n| n.takes_values()) || arg.is_positional();
            let possible: Vec<String> = arg
                .get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| v.get_name().to_string())
                .collect();
            let value = if !possible.is_empty() {
                possible.join(" | ")
            } else if takes_value {
                arg.get_value_names()
                    .map(|names| {
                        names
                            .iter()
                            .map(|n| n.to_string())
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                    .unwrap_or_else(|| arg.get_id().to_string().to_uppercase())
            } else {
                "—".to_string()
            };
            let default: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().to_string())
                .collect();
            let default = if default.is_empty() || !takes_value {
                "—".to_string()
            } else {
                format!("`{}`", default.join(","))
            };
            let help = arg
                .get_long_help()
                .or(arg.get_help())
                .map(|h| h.to_string())
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "| {flag} | {} | {default} | {} |",
                cell(&value),
                cell(&help)
            );
        }
        let _ = writeln!(out);
    }
    let mut root = Cli::command();
    // Resolves what the derive leaves to clap (which flags take values).
    root.build();
    let mut out = String::from(
        "# `weir` command reference\n\nGenerated by `weir cli-reference` from the definitions `--help` shows (a \
         test checks this file against them). `weir` without a command runs `weir run` with \
         the flags of `weir run`. Durations are written like `1s`, `200ms`, `50us`.\n\n",
    );
    for command in root.get_subcommands().filter(|c| !c.is_hide_set()) {
        let name = command.get_name();
        if name == "cli-reference" || name == "help" {
            continue;
        }
        let about = command
            .get_long_about()
            .or(command.get_about())
            .map(|a| a.to_string())
            .unwrap_or_default();
        let _ = writeln!(out, "## `weir {name}`\n\n{}\n", cell(&about));
        table(&mut out, command);
    }
    out
}

/// `weir` with no subcommand: `weir run` on its defaults.
#[derive(Parser)]
struct DefaultRun {
    #[command(flatten)]
    args: RunArgs,
}

/// `ms` since the Unix epoch as `YYYY-MM-DD hh:mm:ss.mmm` in UTC (days to a civil date by
/// Howard Hinnant's algorithm, which needs no time-zone data).
fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let (h, mi, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {h:02}:{mi:02}:{s:02}.{:03}",
        ms % 1000
    )
}

/// `weir checkpoints`' table: one line per checkpoint directory, newest first. The
/// newest completed one (`newest`) is what `--restore DIR` takes, and only it: where it
/// cannot be read back, the restore is refused (an older one is restored only when its
/// directory is named, or with `--restore-fallback`).
fn checkpoint_table(
    listing: &[weir_engine::checkpoint::storage::Listing],
    newest: Option<u64>,
) -> String {
    use std::fmt::Write as _;
    if listing.is_empty() {
        return match newest {
            Some(id) => format!(
                "no checkpoint directories, though checkpoint {id} completed here: --restore \
                 refuses this directory\n"
            ),
            None => "no checkpoints\n".to_string(),
        };
    }
    let mut out = String::from(
        "| id | taken (UTC) | duration | size | tasks | restore |\n|---:|---|---:|---:|---:|---|\n",
    );
    for entry in listing {
        let latest = Some(entry.id) == newest;
        match &entry.metadata {
            Ok(m) => {
                let note = if latest {
                    "valid, the latest: --restore takes it"
                } else {
                    "valid (older: restored when named, or by --restore-fallback)"
                };
                let _ = writeln!(
                    out,
                    "| {} | {} | {:.1} ms | {} B | {} | {note} |",
                    m.id,
                    utc(m.triggered_unix_ms),
                    m.duration.as_secs_f64() * 1e3,
                    m.state_bytes(),
                    m.tasks.len()
                );
            }
            Err(error) => {
                let note = if latest {
                    "the latest completed, unreadable: --restore refuses it, --restore-fallback passes over it"
                } else if newest.is_some_and(|n| entry.id > n) {
                    "never completed: skipped"
                } else {
                    "not usable"
                };
                let _ = writeln!(out, "| {} | — | — | — | — | {note}: {error} |", entry.id);
            }
        }
    }
    out
}

fn main() {
    // The producing side of the two-process remote benchmark: this binary re-executed
    // by `weir compare remote` (not a user-facing command).
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(weir_bench::remote_peers::PRODUCER_COMMAND) {
        match weir_bench::remote_peers::ProducerArgs::parse(&args[2..]) {
            Ok(producer) => {
                std::process::exit(weir_bench::remote_peers::run_remote_producer(producer))
            }
            Err(error) => {
                eprintln!("error: {error}");
                std::process::exit(2);
            }
        }
    }
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Run(cli.run));
    match command {
        Command::Run(args) => std::process::exit(run_job(*args)),
        Command::ServeLookup(args) => std::process::exit(serve(args)),
        Command::LoadRedis(args) => std::process::exit(load_redis(args)),
        Command::ProduceStream(args) => std::process::exit(produce_stream(args)),
        Command::CliReference => {
            print!("{}", cli_reference());
            std::process::exit(0)
        }
        Command::Report { data, out, commit } => {
            if let Err(error) = weir_bench::report::generate(&data, &out, &commit) {
                eprintln!("error: {error}");
                std::process::exit(1);
            }
            eprintln!("wrote {}", out.join("REPORT.md").display());
        }
        Command::Summarize { reports, json } => {
            match weir_bench::cluster::summarize_files(&reports, json.as_deref()) {
                Ok(code) => std::process::exit(code),
                Err(error) => {
                    eprintln!("error: {error}");
                    std::process::exit(2);
                }
            }
        }
        Command::Checkpoints { dir } => {
            match weir_engine::checkpoint::storage::list(&dir).and_then(|listing| {
                weir_engine::checkpoint::storage::newest_completed(&dir).map(|n| (listing, n))
            }) {
                Ok((listing, newest)) => {
                    print!("{}", checkpoint_table(&listing, newest));
                    std::process::exit(0);
                }
                Err(error) => {
                    eprintln!("error: {error}");
                    std::process::exit(2);
                }
            }
        }
        Command::Profile { target, out } => std::process::exit(profile(target, &out)),
        Command::Debloat(args) => std::process::exit(debloat(args)),
        Command::StreamBench {
            rounds,
            scale,
            rate,
            json,
        } => {
            use weir_bench::stream_bench;
            if !(scale.is_finite() && scale > 0.0 && scale <= 100.0) {
                eprintln!("error: --scale must be in (0, 100], got {scale}");
                std::process::exit(2);
            }
            if !(rate.is_finite() && rate >= 1000.0) {
                eprintln!("error: --rate must be at least 1000 records/s, got {rate}");
                std::process::exit(2);
            }
            let value =
                match stream_bench::run(scale, rounds as usize, rate, |line| eprintln!("{line}")) {
                    Ok(value) => value,
                    Err(error) => {
                        eprintln!("error: {error}");
                        std::process::exit(1);
                    }
                };
            print!("{}", stream_bench::render(&value));
            if let Some(path) = json {
                let text = serde_json::to_string_pretty(&value).expect("JSON of plain values");
                if let Err(error) = std::fs::write(&path, text) {
                    eprintln!("error: cannot write {}: {error}", path.display());
                    std::process::exit(1);
                }
            }
        }
        Command::CheckpointBench {
            rounds,
            scale,
            json,
        } => {
            use weir_bench::checkpoint_bench;
            if !(scale.is_finite() && scale > 0.0 && scale <= 100.0) {
                eprintln!("error: --scale must be in (0, 100], got {scale}");
                std::process::exit(2);
            }
            let value =
                match checkpoint_bench::run(scale, rounds as usize, |line| eprintln!("{line}")) {
                    Ok(value) => value,
                    Err(error) => {
                        eprintln!("error: {error}");
                        std::process::exit(1);
                    }
                };
            print!("{}", checkpoint_bench::render(&value));
            if let Some(path) = json {
                let text = serde_json::to_string_pretty(&value).expect("JSON of plain values");
                if let Err(error) = std::fs::write(&path, text) {
                    eprintln!("error: cannot write {}: {error}", path.display());
                    std::process::exit(1);
                }
            }
        }
        Command::Compare {
            suite,
            rounds,
            scale,
            json,
            only,
            implementation,
        } => {
            if !(scale.is_finite() && scale > 0.0 && scale <= 100.0) {
                eprintln!("error: --scale must be in (0, 100], got {scale}");
                std::process::exit(2);
            }
            let mut cases = match suite {
                Suite::Ring => compare::ring_cases(scale),
                Suite::Pool => compare::pool_cases(scale),
                Suite::Async => compare::async_cases(scale),
                Suite::Exchange => compare::exchange_cases(scale),
                Suite::Lookup => compare::lookup_cases(scale),
                Suite::Remote => compare::remote_cases(scale),
                Suite::Redis => match compare::redis_cases(scale) {
                    Ok(cases) => cases,
                    Err(error) => {
                        eprintln!("error: the redis suite needs a redis-server: {error}");
                        std::process::exit(1);
                    }
                },
            };
            if let Some(only) = &only {
                cases.retain(|c| c.experiment.contains(only.as_str()));
                if cases.is_empty() {
                    eprintln!("error: no experiment of this suite matches --only {only:?}");
                    std::process::exit(2);
                }
            }
            if let Some(implementation) = &implementation {
                cases.retain(|c| c.implementation.contains(implementation.as_str()));
                if cases.is_empty() {
                    eprintln!(
                        "error: no implementation in these experiments matches \
                         --implementation {implementation:?}"
                    );
                    std::process::exit(2);
                }
            }
            let summaries = compare::run(&cases, rounds as usize, |case, ns| {
                eprint!(
                    "\r{:<60} {:<24} {:>9.1} ns/op",
                    case.experiment, case.implementation, ns
                );
                let _ = std::io::stderr().flush();
            });
            eprintln!();
            print!("{}", compare::render(&summaries));
            if let Some(path) = json {
                let command: Vec<String> = std::env::args().collect();
                let value = compare::to_json(&summaries, &command.join(" "), rounds as usize);
                let text = serde_json::to_string_pretty(&value).expect("JSON of plain values");
                if let Err(error) = std::fs::write(&path, text) {
                    eprintln!("error: cannot write {}: {error}", path.display());
                    std::process::exit(1);
                }
            }
        }
    }
}

/// `--source` and `--sink` as the job's stream settings, checked, and the server asked
/// for a `PING` so that one not running is an error now, not a job that waits on it.
fn stream_io(args: &RunArgs) -> Result<job::StreamIo, RunError> {
    let reachable = |what: &str, url: &StreamUrl| -> Result<(), RunError> {
        weir_net::redis::BlockingConnection::connect(&url.redis, Duration::from_secs(2))
            .and_then(|mut c| c.command(&[b"PING"]))
            .map(|_| ())
            .map_err(|e| {
                RunError::Setting(format!(
                    "{what} {url}: {e} (is Redis running there? `scripts/redis.sh start` starts \
                     one on 127.0.0.1:6399)"
                ))
            })
    };
    let source = match &args.source {
        Some(url) => {
            let mut config = StreamSourceConfig::new(url.redis.clone(), url.streams.clone());
            config.bounded = args.bounded;
            config.start = args.source_start;
            config.idle_timeout = args.source_idle_timeout;
            if let Some(text) = &args.consumer_group {
                let (group, consumer) = text.split_once(':').unwrap_or((text, "weir"));
                if group.is_empty() || consumer.is_empty() {
                    return Err(RunError::Setting(format!(
                        "--consumer-group {text:?}: write GROUP or GROUP:CONSUMER, both non-empty"
                    )));
                }
                config.group = Some(ConsumerGroup {
                    group: group.into(),
                    consumer: consumer.into(),
                    create_group: true,
                });
            }
            config.stats = Some(Arc::default());
            let addr = config
                .check()
                .map_err(|e| RunError::Setting(format!("--source {url}: {e}")))?;
            config.addr = Some(addr);
            reachable("--source", url)?;
            Some(config)
        }
        None => None,
    };
    let sink = match &args.sink {
        Some(url) => {
            let [stream] = url.streams.as_slice() else {
                return Err(RunError::Setting(format!(
                    "--sink {url}: name one stream to append to"
                )));
            };
            let mut config = StreamSinkConfig::new(url.redis.clone(), stream.clone());
            config.maxlen = args.sink_maxlen;
            config.guarantee = match args.sink_guarantee {
                SinkGuarantee::AtLeastOnce => Guarantee::AtLeastOnce,
                SinkGuarantee::ExactlyOnce if args.checkpoint_interval.is_none() => {
                    return Err(RunError::Setting(
                        "--sink-guarantee exactly-once commits each checkpoint's records when \
                         it completes: add --checkpoint-interval and --checkpoint-dir"
                            .into(),
                    ))
                }
                SinkGuarantee::ExactlyOnce => Guarantee::ExactlyOnce,
            };
            config
                .check()
                .map_err(|e| RunError::Setting(format!("--sink {url}: {e}")))?;
            reachable("--sink", url)?;
            Some(config)
        }
        None => None,
    };
    Ok(job::StreamIo { source, sink })
}

fn run_job(args: RunArgs) -> i32 {
    match run_main_job(&args) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error}");
            error.exit_code()
        }
    }
}

/// `weir run`: every setting is checked, and the JSON path opened, before anything
/// sizeable is allocated or started.
fn run_main_job(args: &RunArgs) -> Result<i32, RunError> {
    let cluster = match (&args.process, &args.peers) {
        (Some(process), Some(peers)) => {
            if args.processes > 1 {
                return Err(RunError::Setting(
                    "--processes starts local processes itself; with --process and --peers \
                     this process is one of a cluster started elsewhere: give one or the other"
                        .into(),
                ));
            }
            if *process >= peers.len() {
                return Err(RunError::Setting(format!(
                    "--process {process} with {} peers: the index must be below the number of \
                     --peers (process 0 is the first address)",
                    peers.len()
                )));
            }
            let secret = match &args.secret_file {
                Some(path) => Some(
                    weir_net::transport::Secret::from_file(path)
                        .map_err(|e| RunError::Setting(e.to_string()))?,
                ),
                None => None,
            };
            Some(job::ClusterSettings {
                process: *process,
                peers: peers.clone(),
                secret,
            })
        }
        _ => None,
    };
    // Where the run starts, checked before anything starts: a newest completed
    // checkpoint that cannot be read, or a fresh start over committed output, is
    // refused here by name (every process, and the launcher, check the same).
    if args.restore_fallback && (args.processes > 1 || args.process.is_some()) {
        return Err(RunError::Setting(
            "--restore-fallback runs in one process: over several, every process would \
             have to fall back to the same older checkpoint; restore one by naming its \
             chk-<id> directory with --restore instead"
                .into(),
        ));
    }
    let restore = job::resolve_restore(&job::RestoreRequest {
        restore: args.restore.as_deref(),
        resume: args
            .resume
            .then_some(args.checkpoint_dir.as_deref())
            .flatten(),
        fallback: args.restore_fallback,
    })?;
    if args.output.is_some() || restore.is_some() {
        job::check_start_at(restore.as_deref(), args.output.as_deref())?;
    }
    if args.processes > 1 && (args.source.is_some() || args.sink.is_some()) {
        return Err(RunError::Setting(
            "--source and --sink run in one process: the launcher of --processes neither \
             counts records read from streams nor forwards Ctrl-C's drain to its processes; \
             drop --processes (or start each process with --process and --peers)"
                .into(),
        ));
    }
    if args.processes > 1 && args.metrics_addr.is_some() {
        return Err(RunError::Setting(
            "--metrics-addr with --processes: every process would bind the same address; \
             start each process with --process, --peers and an address of its own"
                .into(),
        ));
    }
    if args.processes > 1 {
        let launch = weir_bench::cluster::Launch {
            processes: args.processes as usize,
            cores: args.cores.as_deref(),
            records: args.records,
            capacity: args.capacity as usize,
            mean_latency: match &args.store {
                Some(_) => Duration::ZERO,
                None => args.latency.mean(),
            },
            json: args.json.as_deref(),
            secret_file: args.secret_file.as_deref(),
            restart: args
                .checkpoint_dir
                .as_deref()
                .map(|dir| (args.restart_strategy.clone(), dir)),
            output: args.output.as_deref(),
        };
        if let Some(path) = &args.json {
            open_json(path)?;
        }
        let run_args: Vec<String> = std::env::args()
            .skip_while(|a| a != "run")
            .skip(1)
            .collect();
        return weir_bench::cluster::launch(&launch, &run_args);
    }
    let driver = match args.driver {
        Some(kind) => kind,
        None => weir_net::driver::kind_from_env()
            .map_err(|error| RunError::Setting(format!("WEIR_DRIVER: {error}")))?,
    };
    let plan = WorkerPlan::new(args.cores.as_deref(), args.oversubscribe)?;
    if let Some(rate) = args.rate {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(RunError::Setting(
                "--rate must be a positive number of records per second".into(),
            ));
        }
    }
    if !(0.0..=1.0).contains(&args.skew) {
        return Err(RunError::Setting("--skew must be in 0..=1".into()));
    }
    if args.store.is_none() && args.mget > 0 {
        return Err(RunError::Setting(
            "--mget batches Redis lookups; use it with --store".into(),
        ));
    }
    if args.store.is_some() && args.lookup_batch > 0 {
        return Err(RunError::Setting(
            "--lookup-batch batches the lookup service's requests; with --store use --mget".into(),
        ));
    }
    if args.lookup_batch > 0 {
        let len = weir_net::lookup::protocol::batch_response_len(
            args.lookup_batch as usize,
            args.value_size,
        );
        if len > weir_net::lookup::protocol::RESPONSE_LEN_MAX {
            return Err(RunError::Setting(format!(
                "--lookup-batch {} of --value-size {} values needs {len}-byte responses, over \
                 the protocol's {} bytes; lower one of them",
                args.lookup_batch,
                args.value_size,
                weir_net::lookup::protocol::RESPONSE_LEN_MAX
            )));
        }
    }
    if args.futures && args.lookup_batch > 0 {
        return Err(RunError::Setting(
            "--lookup-batch and --futures are two ways to write the lookup; pick one".into(),
        ));
    }
    if args.store.is_some() && args.futures {
        return Err(RunError::Setting(
            "--futures applies to the lookup service; drop it with --store".into(),
        ));
    }
    if args.store.is_some() && args.lookup_addr.is_some() {
        return Err(RunError::Setting(
            "--lookup-addr and --store both say where the lookups go; give one of them".into(),
        ));
    }
    // Read again when the job starts; checked here so that a bad value stops the run
    // before anything starts.
    job::spin_from_env().map_err(RunError::Setting)?;
    let streams = stream_io(args)?;
    let records = match streams.source {
        Some(_) => 0,
        None => args.records,
    };
    job::check_memory(plan.workers(), records, args.capacity as usize)?;
    let mut json = match &args.json {
        Some(path) => Some(open_json(path)?),
        None => None,
    };
    let redis = args.store.as_ref().map(|url| job::RedisStore {
        url: (**url).clone(),
        mget: (args.mget > 0).then_some(args.mget),
        stats: Arc::default(),
    });
    let progress = Arc::new(JobProgress::default());
    let checkpoint_gauges = Arc::new(weir_net::metrics::CheckpointGauges::default());
    let _metrics = match &args.metrics_addr {
        Some(addr) => {
            let mut sources = weir_net::metrics::MetricsSources::new(Arc::clone(&progress));
            if let Some(store) = &redis {
                sources
                    .redis
                    .push(("lookup".to_string(), Arc::clone(&store.stats)));
            }
            if args.checkpoint_interval.is_some() {
                sources.checkpoints = Some(Arc::clone(&checkpoint_gauges));
            }
            if let Some(stats) = streams.source.as_ref().and_then(|c| c.stats.clone()) {
                sources.stream_sources.push(("source".to_string(), stats));
            }
            if let Some(config) = &streams.sink {
                sources
                    .stream_sinks
                    .push(("sink".to_string(), Arc::clone(&config.stats)));
            }
            let server = weir_net::metrics::MetricsServer::start(addr, sources)
                .map_err(|e| RunError::Setting(e.to_string()))?;
            eprintln!("weir run: metrics at http://{}/metrics", server.addr());
            Some(server)
        }
        None => None,
    };
    // The embedded service gets a core of its own when the workers leave one free.
    let service_core = match (args.lookup_addr, args.no_pin) {
        (None, false) => plan.free_core(),
        _ => None,
    };
    let server = match args.lookup_addr.or(redis.as_ref().map(|_| UNUSED_SERVICE)) {
        Some(_) => None,
        None => {
            let config = ServerConfig {
                latency: args.latency,
                value_size: args.value_size,
                faults: Faults {
                    error_rate: args.error_rate,
                    ..Faults::default()
                },
                core: service_core,
                ..ServerConfig::default()
            };
            Some(LookupServer::start(config).map_err(RunError::Service)?)
        }
    };
    let service = match (&server, args.lookup_addr) {
        (Some(server), _) => server.addr(),
        (None, Some(addr)) => addr,
        (None, None) => UNUSED_SERVICE,
    };
    let keys = if let KeyDraw::Zipf(exponent) = args.key_distribution {
        KeyDistribution::Zipf(job::Zipf::new(args.keys, exponent).map_err(RunError::Setting)?)
    } else if args.skew > 0.0 {
        KeyDistribution::Skewed {
            keys: args.keys,
            hot_keys: (args.keys / 100).max(1),
            hot_fraction: args.skew,
        }
    } else {
        KeyDistribution::Uniform { keys: args.keys }
    };
    let settings = job::JobSettings {
        records,
        rate: args.rate,
        mode: match args.mode {
            Mode::Ordered => OutputMode::Ordered,
            Mode::Unordered => OutputMode::Unordered,
            Mode::Keyed => OutputMode::KeyedOrdered,
        },
        capacity: args.capacity as usize,
        timeout: args.timeout,
        retries: args.retries,
        retry_delay: args.retry_delay,
        cores: plan.cores.clone(),
        pin: !args.no_pin,
        driver,
        timer_slack: args.timer_slack,
        service,
        connections: args.connections as usize,
        keys,
        buffer_timeout: Some(args.buffer_timeout),
        futures: args.futures,
        lookup_batch: (args.lookup_batch > 0).then_some(args.lookup_batch as usize),
        key_iter: None,
        collect: None,
        cluster,
        checkpoints: args
            .checkpoint_interval
            .map(|interval| job::JobCheckpoints {
                interval,
                dir: args
                    .checkpoint_dir
                    .clone()
                    .expect("clap requires --checkpoint-dir"),
                alignment: match (args.unaligned, args.aligned_timeout) {
                    (true, _) => AlignmentMode::Unaligned,
                    (false, Some(timeout)) => AlignmentMode::AlignedWithTimeout(timeout),
                    (false, None) => AlignmentMode::Aligned,
                },
                restore: restore.clone(),
                retain: args.checkpoints_retained as usize,
                restart: args.restart_strategy.clone(),
                gauges: Some(Arc::clone(&checkpoint_gauges)),
            }),
        output: args.output.clone(),
        streams,
        stop: job::JobStop::default(),
    };
    if settings.cluster.is_none() {
        // Ctrl-C stops the job with drain (how a run over unbounded streams ends); a
        // second one quits at once.
        let stop = settings.stop.clone();
        let _ = ctrlc::set_handler(move || {
            if stop.requested() {
                std::process::exit(130);
            }
            eprintln!(
                "\nweir run: stopping: the sources end and what they read drains (Ctrl-C again \
                 quits at once)"
            );
            stop.stop();
        });
    }
    let service_core = server.as_ref().and_then(|s| s.core());
    let service_place = match &server {
        None => "external".to_string(),
        Some(server) => match server.core() {
            Some(core) => format!("core {core} (own)"),
            None if args.no_pin => "unpinned, shared with workers".to_string(),
            None => "shared with workers".to_string(),
        },
    };
    eprintln!(
        "weir run: {}, {} mode, capacity {}, {}timeout {}",
        match (&args.source, args.bounded) {
            (Some(url), true) => format!("records from {url} up to its entries at start"),
            (Some(url), false) => format!("records from {url} until Ctrl-C"),
            (None, _) => format!("{} records", settings.records),
        },
        job::mode_name(settings.mode),
        settings.capacity,
        match &redis {
            Some(_) => String::new(),
            None => format!("latency {}, ", args.latency),
        },
        settings.timeout_text(),
    );
    if let Some(cache) = &args.cache {
        eprintln!("weir run: a lookup cache per async subtask (not checkpointed): {cache:?}");
    }
    let lookups = match &redis {
        Some(store) => format!(
            "lookups in Redis at {} ({}), keys {}<key>",
            store.url,
            match store.mget {
                None => "GETs, plain pipelining".to_string(),
                Some(max_keys) => format!("GETs batched into MGETs of up to {max_keys}"),
            },
            job::REDIS_KEY_PREFIX
        ),
        None => format!(
            "lookup service {service} ({}){}",
            match server.as_ref().map(|s| s.core()) {
                None => "external".to_string(),
                Some(Some(core)) => format!("embedded, on its own core {core}"),
                Some(None) => "embedded, sharing the workers' cores".to_string(),
            },
            match args.lookup_batch {
                0 => String::new(),
                max => format!(", batch requests of up to {max} keys"),
            }
        ),
    };
    eprintln!(
        "weir run: {} {}, {lookups}",
        job::workers_text(plan.workers()),
        match (args.no_pin, plan.workers()) {
            (true, _) => "unpinned".to_string(),
            (false, 1) => format!("on core {}", job::cores_text(&plan.placement)),
            (false, _) => format!("on cores {}", job::cores_text(&plan.placement)),
        },
    );
    let cpu_start = weir_bench::compare::process_cpu();
    let handle = {
        let settings = settings.clone();
        let progress = Arc::clone(&progress);
        let redis = redis.clone();
        let cache = args.cache;
        std::thread::spawn(move || match &redis {
            Some(store) => job::run_redis_to_end_cached(&settings, cache, store, progress),
            None => job::run_to_end_cached(&settings, cache, progress),
        })
    };
    let bar = if args.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        let (bar, template) = match settings.streams.source {
            Some(_) => (
                indicatif::ProgressBar::no_length(),
                "{pos} records  {rate}  in flight {msg}  [{elapsed_precise}]",
            ),
            None => (
                indicatif::ProgressBar::new(settings.records),
                "{bar:40} {pos}/{len} records  {rate}  in flight {msg}  [{elapsed_precise}]",
            ),
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template(template)
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .with_key(
                    "rate",
                    |state: &indicatif::ProgressState, out: &mut dyn std::fmt::Write| {
                        let _ = write!(out, "{:.0} records/s", state.per_sec());
                    },
                ),
        );
        bar
    };
    while !handle.is_finished() {
        bar.set_position(progress.received.load(Ordering::Relaxed));
        bar.set_message(progress.in_flight.load(Ordering::Relaxed).to_string());
        std::thread::sleep(Duration::from_millis(100));
    }
    bar.finish_and_clear();
    let result = handle.join();
    let stats = server.map(|s| s.stop());
    // Every thread of the process, the ended ones included: workers, the embedded
    // service, the progress bar.
    let cpu = weir_bench::compare::process_cpu().saturating_sub(cpu_start);
    let finished = match result {
        Ok(Ok(finished)) => finished,
        Ok(Err(error)) => {
            if let Some((path, file)) = json.as_mut() {
                let value = job::failed_to_start_json(&settings, &error);
                write_json(path, file, &value)?;
            }
            return Err(error);
        }
        Err(_) => return Err(RunError::Panicked),
    };
    let mean_latency = match &redis {
        // Little's limit needs the service's latency, which Redis does not announce.
        Some(_) => Duration::ZERO,
        None => args.latency.mean(),
    };
    println!("{}", job::render(&settings, &finished, mean_latency));
    match (&redis, stats) {
        (Some(store), _) => {
            let stats = store.stats.snapshot();
            println!(
                "  {:<28} {} hits, {} misses, {} error replies, {} failed, {} commands ({} MGETs), {} connections",
                "redis",
                stats.hits,
                stats.misses,
                stats.errors,
                stats.failed,
                stats.commands,
                stats.batches,
                stats.connects
            );
        }
        (None, Some(stats)) => println!(
            "  {:<28} {service_place}, {} requests, {} errors injected",
            "lookup service", stats.requests, stats.errors
        ),
        (None, None) => println!("  {:<28} external at {service}", "lookup service"),
    }
    let stream_source = settings
        .streams
        .source
        .as_ref()
        .and_then(|c| c.stats.as_ref())
        .map(|s| s.snapshot());
    if let Some(s) = &stream_source {
        println!(
            "  {:<28} {} entries in {} reads ({}), {} acknowledged, {} reconnects, {} errors",
            "redis stream source",
            s.entries,
            s.reads,
            job::bytes_text(s.bytes),
            s.acknowledged,
            s.reconnects,
            s.errors
        );
    }
    let stream_sink = settings.streams.sink.as_ref().map(|c| c.stats.snapshot());
    if let Some(s) = &stream_sink {
        println!(
            "  {:<28} {} entries written, {} commands, {} transactions, {} reconnects, {} errors",
            "redis stream sink", s.entries, s.commands, s.transactions, s.reconnects, s.errors
        );
    }
    let records = finished.report.received.max(1);
    let cpu_per_record_ns = cpu.as_nanos() as f64 / records as f64;
    let service_share = stats
        .filter(|s| s.cpu_ns > 0 && !cpu.is_zero())
        .map(|s| s.cpu_ns as f64 / cpu.as_nanos() as f64);
    println!(
        "  {:<28} {:.3} µs (user + sys of all threads {:.2} s ÷ records out){}",
        "CPU per record",
        cpu_per_record_ns / 1e3,
        cpu.as_secs_f64(),
        match service_share {
            Some(share) => format!("; the embedded service {:.0}% of it", share * 100.0),
            None => String::new(),
        }
    );
    if let Some((path, file)) = json.as_mut() {
        let mut value = job::to_json(&settings, &finished);
        value["settings"]["key_distribution"] = Value::from(format!("{:?}", args.key_distribution));
        value["settings"]["cache"] = Value::from(args.cache.map(|c| format!("{c:?}")));
        value["workers"] = Value::from(plan.workers());
        value["worker_cores"] = Value::from(plan.placement.clone());
        value["lookup_service"] = match &redis {
            Some(_) => Value::Null,
            None => serde_json::json!({
                "address": service.to_string(),
                "embedded": stats.is_some(),
                "placement": service_place,
                "core": service_core,
                "requests": stats.map(|s| s.requests),
                "errors_injected": stats.map(|s| s.errors),
                "cpu_s": stats.map(|s| s.cpu_ns as f64 / 1e9),
            }),
        };
        value["redis"] = match &redis {
            Some(store) => {
                let stats = store.stats.snapshot();
                serde_json::json!({
                    "url": store.url.to_string(),
                    "mget_max_keys": store.mget,
                    "hits": stats.hits,
                    "misses": stats.misses,
                    "error_replies": stats.errors,
                    "failed": stats.failed,
                    "commands": stats.commands,
                    "mgets": stats.batches,
                    "connections": stats.connects,
                })
            }
            None => Value::Null,
        };
        value["stream_source"] = match (&args.source, &stream_source) {
            (Some(url), Some(s)) => serde_json::json!({
                "url": url.to_string(),
                "bounded": args.bounded,
                "entries": s.entries,
                "reads": s.reads,
                "bytes": s.bytes,
                "acknowledged": s.acknowledged,
                "reconnects": s.reconnects,
                "errors": s.errors,
            }),
            _ => Value::Null,
        };
        value["stream_sink"] = match (&args.sink, &stream_sink) {
            (Some(url), Some(s)) => serde_json::json!({
                "url": url.to_string(),
                "guarantee": format!("{:?}", args.sink_guarantee),
                "entries": s.entries,
                "commands": s.commands,
                "transactions": s.transactions,
                "reconnects": s.reconnects,
                "errors": s.errors,
            }),
            _ => Value::Null,
        };
        value["cpu_s"] = Value::from(cpu.as_secs_f64());
        value["lookup_mean_latency_ms"] = match &redis {
            Some(_) => Value::Null,
            None => Value::from(args.latency.mean().as_secs_f64() * 1e3),
        };
        value["cpu_per_record_ns"] = Value::from(cpu_per_record_ns);
        value["service_cpu_share"] = service_share.map_or(Value::Null, Value::from);
        write_json(path, file, &value)?;
    }
    if let Some(error) = &finished.failure {
        match job::failure_hint(error) {
            Some(hint) => eprintln!("error: the job failed: {error}; {hint}"),
            None => eprintln!("error: the job failed: {error}"),
        }
        for lost in &finished.report.lost_connections {
            eprintln!("error: another process of the job went away: {lost}");
        }
        return Ok(1);
    }
    let report = &finished.report;
    if report.missing > 0 || report.duplicates > 0 {
        eprintln!(
            "error: {} records lost and {} duplicated",
            report.missing, report.duplicates
        );
        return Ok(1);
    }
    // The exactly-once check over every attempt that wrote the output (restarts and
    // restores included): what the sinks committed.
    if let (Some(output), None) = (&settings.output, &settings.streams.source) {
        let audit = job::audit_output(output, settings.records)?;
        println!("  {:<28} {}", "committed output", job::audit_text(&audit));
        if audit.lost > 0 || audit.duplicated > 0 {
            eprintln!(
                "error: the committed output under {} lost {} records and holds {} twice",
                output.display(),
                audit.lost,
                audit.duplicated
            );
            return Ok(1);
        }
    }
    Ok(0)
}

/// Opens (creating, not yet truncating) the `--json` file, so that an unwritable path
/// fails before the run rather than after it.
fn open_json(path: &std::path::Path) -> Result<(PathBuf, std::fs::File), RunError> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map(|file| (path.to_path_buf(), file))
        .map_err(|source| RunError::Json {
            path: path.to_path_buf(),
            source,
        })
}

/// Replaces the `--json` file's content with `value`.
fn write_json(
    path: &std::path::Path,
    file: &mut std::fs::File,
    value: &Value,
) -> Result<(), RunError> {
    let text = serde_json::to_string_pretty(value).expect("JSON of plain values");
    file.set_len(0)
        .and_then(|()| std::io::Write::write_all(file, text.as_bytes()))
        .map_err(|source| RunError::Json {
            path: path.to_path_buf(),
            source,
        })
}

/// The lookup service address when Redis is the store (never connected to).
const UNUSED_SERVICE: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    0,
));

fn produce_stream(args: ProduceStreamArgs) -> i32 {
    let [stream] = args.url.streams.as_slice() else {
        eprintln!("error: {}: name one stream to append to", args.url);
        return 2;
    };
    if let Some(rate) = args.rate {
        if !(rate.is_finite() && rate > 0.0) {
            eprintln!("error: --rate must be a positive number of entries per second");
            return 2;
        }
    }
    let keys = match args.key_distribution {
        KeyDraw::Uniform => KeyDistribution::Uniform { keys: args.keys },
        KeyDraw::Zipf(s) => match job::Zipf::new(args.keys, s) {
            Ok(zipf) => KeyDistribution::Zipf(zipf),
            Err(error) => {
                eprintln!("error: {error}");
                return 2;
            }
        },
    };
    eprintln!(
        "weir produce-stream: {} entries to {}{}",
        args.count,
        args.url,
        args.rate
            .map(|r| format!(" at {r} entries/s"))
            .unwrap_or_default()
    );
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        let _ = ctrlc::set_handler(move || stop.store(true, Ordering::Relaxed));
    }
    let bar = indicatif::ProgressBar::new(args.count);
    let produced = weir_bench::streams::produce_records(
        &args.url.redis,
        stream,
        weir_bench::streams::ProduceSpec {
            count: args.count,
            rate: args.rate,
            keys,
            maxlen: args.maxlen,
        },
        |done| bar.set_position(done),
        &|| stop.load(Ordering::Relaxed),
    );
    bar.finish_and_clear();
    match produced {
        Ok(p) => {
            let seconds = p.elapsed.as_secs_f64().max(1e-9);
            println!(
                "appended {} entries (ids {}..{}, {}) to {} in {seconds:.2} s: {:.0} entries/s",
                p.entries,
                p.first_id,
                p.first_id + p.entries,
                job::bytes_text(p.bytes),
                args.url,
                p.entries as f64 / seconds
            );
            0
        }
        Err(error) => {
            eprintln!("error: {error}");
            1
        }
    }
}

fn load_redis(args: LoadRedisArgs) -> i32 {
    eprintln!(
        "weir load-redis: {} keys of {} bytes into {}",
        args.keys, args.value_size, args.store
    );
    let bar = indicatif::ProgressBar::new(args.keys);
    let started = std::time::Instant::now();
    let loaded = weir_net::redis::load_keys(
        &args.store,
        args.keys,
        args.value_size,
        job::REDIS_KEY_PREFIX,
        |done| bar.set_position(done),
    );
    bar.finish_and_clear();
    match loaded {
        Ok(loaded) => {
            let seconds = started.elapsed().as_secs_f64();
            println!(
                "loaded {} keys ({} MB of values) in {seconds:.2} s: {:.0} keys/s",
                loaded.keys,
                loaded.bytes / 1_000_000,
                loaded.keys as f64 / seconds.max(1e-9)
            );
            0
        }
        Err(error) => {
            eprintln!("error: {error}");
            1
        }
    }
}

fn serve(args: ServeArgs) -> i32 {
    let config = ServerConfig {
        addr: args.addr,
        latency: args.latency,
        value_size: args.value_size,
        faults: Faults {
            error_rate: args.error_rate,
            reset_rate: args.reset_rate,
            stall_rate: args.stall_rate,
            malformed_rate: 0.0,
        },
        seed: 1,
        core: None,
        spin: args.spin,
        slack: args.timer_slack,
    };
    match LookupServer::start(config) {
        Ok(server) => {
            eprintln!(
                "weir lookup service listening on {} (latency {}); Ctrl-C stops it",
                server.addr(),
                args.latency
            );
            loop {
                std::thread::sleep(Duration::from_secs(10));
                let stats = server.stats();
                eprintln!(
                    "weir lookup service: {} requests, {} answered",
                    stats.requests, stats.answered
                );
            }
        }
        Err(error) => {
            eprintln!("error: {error}");
            1
        }
    }
}

fn profile(target: ProfileTarget, out: &std::path::Path) -> i32 {
    let guard = match pprof::ProfilerGuardBuilder::default()
        .frequency(999)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
    {
        Ok(guard) => guard,
        Err(error) => {
            eprintln!("error: cannot start the profiler: {error}");
            return 1;
        }
    };
    match target {
        ProfileTarget::MainJob => {
            let code = run_job(RunArgs {
                records: 1_000_000,
                quiet: true,
                ..DefaultRun::parse_from(["weir"]).args
            });
            if code != 0 {
                return code;
            }
        }
        ProfileTarget::Async => {
            for _ in 0..5 {
                weir_bench::async_peers::weir_immediate(OutputMode::Unordered, 100, 2_000_000);
            }
        }
        ProfileTarget::Exchange => {
            for _ in 0..3 {
                weir_bench::exchange_peers::weir_exchange::<100>(
                    1,
                    1,
                    weir_bench::exchange_peers::Routing::RoundRobin,
                    Some(Duration::from_millis(100)),
                    3_000_000,
                );
            }
        }
    }
    let report = match guard.report().build() {
        Ok(report) => report,
        Err(error) => {
            eprintln!("error: cannot build the profile: {error}");
            return 1;
        }
    };
    let written = std::fs::File::create(out)
        .map_err(|e| e.to_string())
        .and_then(|file| report.flamegraph(file).map_err(|e| e.to_string()));
    match written {
        Ok(()) => {
            eprintln!("wrote {}", out.display());
            0
        }
        Err(error) => {
            eprintln!("error: cannot write {}: {error}", out.display());
            1
        }
    }
}

/// Records per second of `weir debloat`'s steady run: below what one consumer reads.
const STEADY_RATE: u64 = 4_000_000;

/// `weir debloat`: the back-pressured runs with and without debloating.
fn debloat(args: DebloatArgs) -> i32 {
    use weir_bench::debloat::{self, Settings};
    use weir_engine::exchange::DebloatConfig;
    let segments = args.segments as usize;
    let settings = Settings {
        rate: args.rate,
        duration: args.duration,
        warm_up: args.duration / 2,
        segments,
        debloat: DebloatConfig {
            target: args.target,
            period: args.period,
            samples: args.samples,
            min_size: args.min_size,
            ..DebloatConfig::new(segments)
        },
        ..Settings::default()
    };
    if let Err(error) = settings.debloat.validate() {
        eprintln!("error: {error}");
        return 2;
    }
    let json = match args.json.as_deref().map(std::fs::File::create).transpose() {
        Ok(file) => file,
        Err(error) => {
            eprintln!("error: cannot write the JSON file: {error}");
            return 1;
        }
    };
    let outcomes: Vec<_> = [false, true]
        .into_iter()
        .map(|on| {
            eprintln!("debloating {}…", if on { "on" } else { "off" });
            debloat::back_pressured(&settings, on)
        })
        .collect();
    eprintln!("steady state at buffer timeout 0…");
    let steady = debloat::steady_segments(STEADY_RATE * 2, STEADY_RATE);
    print!("{}", debloat::render(&settings, &outcomes, steady));
    if let Some(mut file) = json {
        let command: Vec<String> = std::env::args().collect();
        let value = debloat::to_json(&settings, &outcomes, steady, &command.join(" "));
        let text = serde_json::to_string_pretty(&value).expect("JSON of plain values");
        if let Err(error) = file.write_all(text.as_bytes()) {
            eprintln!("error: cannot write the JSON file: {error}");
            return 1;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    /// `docs/cli-reference.md` is what `weir cli-reference` prints now.
    #[test]
    fn the_cli_reference_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/cli-reference.md");
        let written = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            written == super::cli_reference(),
            "docs/cli-reference.md is stale: regenerate it with \
             `cargo run --release -- cli-reference > docs/cli-reference.md`"
        );
    }

    /// Without a subcommand the flags are `weir run`'s.
    #[test]
    fn flags_without_a_subcommand_are_run_s() {
        use clap::Parser;
        let cli = super::Cli::try_parse_from(["weir", "--records", "5", "--cores", "0"])
            .expect("parses as run's flags");
        assert!(cli.command.is_none());
        assert_eq!(cli.run.records, 5);
        assert!(super::Cli::try_parse_from(["weir", "run", "--records", "5"]).is_ok());
    }
}
