//! The main job: embedded lookup service, `generator → async lookup → key-hash
//! exchange → counting sink` over the workers, with its record types and report.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::future::Future;
use std::pin::Pin;

use serde_json::{json, Value};
use weir_engine::async_io::futures::{FutureFunction, LocalExecutor};
use weir_engine::async_io::{AsyncConfig, AsyncError, AsyncFunction, OutputMode, RetryStrategy};
use weir_engine::exchange::codec::{Codec, DecodeError, Decoder, Encoder};
use weir_engine::runtime::job::{
    run_job, Collected, ExchangeSpec, FunctionFactory, GeneratorSpec, IoHandler, JobProgress,
    JobRecord, JobReport, JobSpec, KeyDistribution, KeyIterFactory, SourceRecord,
};
use weir_engine::runtime::{Cores, Runtime, RuntimeError};
use weir_net::lookup::{ClientConfig, ClientIo, LookupClient, LookupFunction, LookupRequest};
use weir_net::redis::{
    Args, Batching, Lookup as RedisGet, RedisClient, RedisConfig, RedisFunction, RedisIo,
    RedisRequest, RedisUrl, Reply, SharedStats,
};
use weir_net::DriverKind;

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
            value: value.to_vec(),
        }
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
    pub value: Vec<u8>,
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
            value: Vec::decode(input)?,
        })
    }
}

impl JobRecord for Enriched {
    fn id(&self) -> u64 {
        self.id
    }
    fn key(&self) -> u64 {
        self.key
    }
    fn created_ns(&self) -> u64 {
        self.created_ns
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
    /// Async timeout.
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
    /// An iterator source instead of the generator (`records` = what it yields in all).
    pub key_iter: Option<KeyIterFactory>,
    /// A collecting sink (tests).
    pub collect: Option<Collected<Enriched>>,
}

/// A boxed local future of a lookup's results.
type LookupFuture = Pin<Box<dyn Future<Output = Result<Vec<Enriched>, AsyncError>>>>;
/// The lookup written as an `async` block.
type AsyncLookup = FutureFunction<Lookup, Enriched, Box<dyn FnMut(&Lookup) -> LookupFuture>>;

/// The lookup client's I/O plus the executor running the futures it wakes.
struct FuturesIo {
    client: ClientIo<Lookup>,
    executor: Rc<RefCell<LocalExecutor>>,
}

impl IoHandler for FuturesIo {
    fn flush(&mut self, driver: &mut dyn weir_engine::runtime::Driver, now_ns: u64) {
        self.executor.borrow_mut().run_ready();
        self.client.flush(driver, now_ns);
    }

    fn on_event(&mut self, event: &weir_engine::runtime::DriverEvent<'_>) -> bool {
        let mine = self.client.on_event(event);
        if mine {
            // Resume the futures the event woke now, on this thread.
            self.executor.borrow_mut().run_ready();
        }
        mine
    }
}

/// Builds and runs the job; returns its report and wall time.
pub fn run(
    settings: &JobSettings,
    progress: Arc<JobProgress>,
) -> Result<(JobReport, Duration), RuntimeError> {
    let driver_kind = settings.driver;
    let runtime = Runtime::builder()
        .cores(settings.cores.clone())
        .pin(settings.pin)
        .spin(spin_from_env().map_err(|e| RuntimeError::Setup(e.into()))?)
        .driver(Arc::new(move || {
            weir_net::build_driver(driver_kind).map_err(|e| std::io::Error::other(e.to_string()))
        }))
        .build()?;
    let client_config = ClientConfig {
        addr: settings.service,
        connections: settings.connections,
        capacity: settings.capacity * 4 + 64,
        // With retries, a request the service never answers fails (retryably) early
        // enough for its retries to run within the operator's timeout.
        request_timeout: settings.timeout / (settings.retries + 1),
    };
    let capacity = settings.capacity;
    if settings.futures {
        let function: FunctionFactory<AsyncLookup> = Arc::new(move |_subtask, unparker| {
            let client = Rc::new(RefCell::new(
                LookupClient::<Lookup>::new(client_config.clone())
                    .expect("client settings validated up front"),
            ));
            let executor = Rc::new(RefCell::new(
                LocalExecutor::new(capacity * 2 + 16, Some(unparker)).expect("positive capacity"),
            ));
            let lookups = Rc::clone(&client);
            let call: Box<dyn FnMut(&Lookup) -> LookupFuture> = Box::new(move |input: &Lookup| {
                let get = lookups.borrow_mut().get(input.0.key);
                let input = *input;
                Box::pin(async move {
                    let value = get.await?;
                    Ok(vec![input.complete(&value)])
                })
            });
            let io: Box<dyn IoHandler> = Box::new(FuturesIo {
                client: ClientIo(client),
                executor: Rc::clone(&executor),
            });
            (FutureFunction::new(executor, call), Some(io))
        });
        return run_with(settings, runtime, function, progress);
    }
    let function: FunctionFactory<LookupFunction<Lookup>> = Arc::new(move |_subtask, _unparker| {
        let client = Rc::new(RefCell::new(
            LookupClient::<Lookup>::new(client_config.clone())
                .expect("client settings validated up front"),
        ));
        let io: Box<dyn IoHandler> = Box::new(ClientIo(Rc::clone(&client)));
        (LookupFunction::new(client), Some(io))
    });
    run_with(settings, runtime, function, progress)
}

fn run_with<F>(
    settings: &JobSettings,
    runtime: Runtime,
    function: FunctionFactory<F>,
    progress: Arc<JobProgress>,
) -> Result<(JobReport, Duration), RuntimeError>
where
    F: AsyncFunction<Out = Enriched>,
    F::In: From<SourceRecord>,
{
    let workers = runtime.workers();
    eprintln!(
        "weir: {workers} workers on the {} driver",
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
    let spec = JobSpec {
        generator: GeneratorSpec {
            records: settings.records,
            rate: settings.rate,
            keys: settings.keys,
            seed: 42,
        },
        keys: settings.key_iter.clone(),
        collect: settings.collect.clone(),
        sources: workers,
        sinks: workers,
        async_config,
        function,
        exchange: ExchangeSpec {
            buffer_timeout: settings.buffer_timeout,
            ..ExchangeSpec::default()
        },
    };
    let started = Instant::now();
    let report = run_job(runtime, spec, progress)?;
    Ok((report, started.elapsed()))
}

/// The end-of-run table.
pub fn render(
    settings: &JobSettings,
    report: &JobReport,
    elapsed: Duration,
    mean_latency: Duration,
) -> String {
    let workers = report.run.drivers.len().max(1);
    let throughput = report.received as f64 / elapsed.as_secs_f64();
    let little = (settings.capacity * workers) as f64 / mean_latency.as_secs_f64().max(1e-9);
    let h = &report.latency_ns;
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
    let failed = report.async_metrics.failed;
    let mut out = String::new();
    let mut row = |name: &str, value: String| out.push_str(&format!("  {name:<28} {value}\n"));
    row(
        "workers / driver",
        format!(
            "{workers} / {}",
            report.run.drivers.first().copied().unwrap_or("none")
        ),
    );
    row("pinned", format!("{:?}", report.run.pinned));
    row("records in", report.generated.to_string());
    row("records out", report.received.to_string());
    row("failed", failed.to_string());
    row(
        "lost / duplicated",
        format!("{} / {}", report.missing, report.duplicates),
    );
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
    row(
        "latency p50 / p99 / p99.9",
        format!("{:.0} / {:.0} / {:.0} µs", us(0.5), us(0.99), us(0.999)),
    );
    row("latency max", format!("{:.0} µs", h.max() as f64 / 1e3));
    row(
        "retried / timed out",
        format!(
            "{} / {}",
            report.async_metrics.retried, report.async_metrics.timed_out
        ),
    );
    row(
        "time back-pressured",
        format!(
            "{:.3} s (sum over sources)",
            report.backpressured_ns as f64 / 1e9
        ),
    );
    out
}

/// The report as JSON.
pub fn to_json(settings: &JobSettings, report: &JobReport, elapsed: Duration) -> Value {
    let h = &report.latency_ns;
    json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "machine": crate::compare::machine(),
        "settings": {
            "records": settings.records,
            "rate": settings.rate,
            "mode": format!("{:?}", settings.mode),
            "capacity": settings.capacity,
            "timeout_ms": settings.timeout.as_secs_f64() * 1e3,
            "retries": settings.retries,
            "connections": settings.connections,
        },
        "drivers": report.run.drivers,
        "records_in": report.generated,
        "records_out": report.received,
        "failed": report.async_metrics.failed,
        "lost": report.missing,
        "duplicated": report.duplicates,
        "elapsed_s": elapsed.as_secs_f64(),
        "throughput_records_per_s": report.received as f64 / elapsed.as_secs_f64(),
        "latency_ns": {
            "p50": h.value_at_quantile(0.5), "p90": h.value_at_quantile(0.9), "p99": h.value_at_quantile(0.99),
            "p99.9": h.value_at_quantile(0.999), "max": h.max(),
        },
        "retried": report.async_metrics.retried,
        "timed_out": report.async_metrics.timed_out,
        "backpressured_s": report.backpressured_ns as f64 / 1e9,
    })
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

/// The job's keys in Redis: `weir:<key>`, as `weir load-redis` writes them.
pub const REDIS_KEY_PREFIX: &str = "weir:";

/// A source record on its way to a Redis lookup (`GET weir:<key>`).
#[derive(Debug, Clone, Copy)]
pub struct RedisLookup(pub SourceRecord);

impl From<SourceRecord> for RedisLookup {
    fn from(record: SourceRecord) -> Self {
        RedisLookup(record)
    }
}

impl RedisRequest for RedisLookup {
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
            value: reply.value().map(<[u8]>::to_vec).unwrap_or_default(),
        }
    }
}

/// Redis as the store of the main job's lookups (`weir run --store`).
#[derive(Debug, Clone)]
pub struct RedisStore {
    /// The server.
    pub url: RedisUrl,
    /// `MGET` batching of each turn's lookups, or plain pipelining.
    pub batching: Batching,
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
        config.batching = self.batching;
        config.request_timeout =
            (settings.timeout / (settings.retries + 1)).max(std::time::Duration::from_millis(1));
        config.connect_timeout = config.connect_timeout.min(config.request_timeout);
        config
    }
}

/// [`run`] with the lookups going to Redis instead of the lookup service
/// (`settings.service` and `settings.futures` are not used).
pub fn run_redis(
    settings: &JobSettings,
    store: &RedisStore,
    progress: Arc<JobProgress>,
) -> Result<(JobReport, Duration), RuntimeError> {
    let config = store.client_config(settings);
    let addr = config
        .check()
        .map_err(|error| RuntimeError::Setup(Box::new(error)))?;
    let driver_kind = settings.driver;
    let runtime = Runtime::builder()
        .cores(settings.cores.clone())
        .pin(settings.pin)
        .spin(spin_from_env().map_err(|e| RuntimeError::Setup(e.into()))?)
        .driver(Arc::new(move || {
            weir_net::build_driver(driver_kind).map_err(|e| std::io::Error::other(e.to_string()))
        }))
        .build()?;
    let stats = Arc::clone(&store.stats);
    let function: FunctionFactory<RedisFunction<RedisLookup>> =
        Arc::new(move |_subtask, _unparker| {
            let client = RedisClient::<RedisLookup>::with_addr(config.clone(), addr)
                .expect("client settings checked up front")
                .with_shared_stats(Arc::clone(&stats));
            let client = Rc::new(RefCell::new(client));
            let io: Box<dyn IoHandler> = Box::new(RedisIo(Rc::clone(&client)));
            (RedisFunction::new(client), Some(io))
        });
    run_with(settings, runtime, function, progress)
}
