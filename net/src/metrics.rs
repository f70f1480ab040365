//! A running job's live metrics as Prometheus text, served off the workers.
//!
//! [`MetricsServer::start`] binds an address and serves `GET /metrics` from a thread of
//! its own: each scrape reads the tasks' live figures
//! ([`LiveCounters::tasks`](weir_engine::graph::LiveCounters::tasks), which the tasks
//! write with relaxed stores after each poll) and whatever else the job registered
//! ([`MetricsSources`]), and encodes them with the `prometheus-client` crate (the
//! Prometheus project's Rust client) in the OpenMetrics text format. The workers never
//! wait on a scrape, and a job without an endpoint keeps no task figures at all.
//!
//! The names follow Flink's task and checkpoint metrics, under `weir_`:
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `weir_task_numRecordsIn_total`, `weir_task_numRecordsOut_total` | stage, subtask | records in and out since the task started |
//! | `weir_task_numRecordsInPerSecond`, `weir_task_numRecordsOutPerSecond` | stage, subtask | the same per second since the last scrape |
//! | `weir_task_busyTimeMsPerSecond`, `weir_task_backPressuredTimeMsPerSecond`, `weir_task_idleTimeMsPerSecond` | stage, subtask | how each second since the last scrape was spent (they add up to 1000) |
//! | `weir_task_outPoolUsage` | stage, subtask | fraction of the output pool's segments in use |
//! | `weir_task_inPoolUsage` | stage, subtask | fraction of the buffers its input channels hold that wait to be read (0 for a source's task) |
//! | `weir_task_inFlightBytes` | stage, subtask | bytes on its input channels not yet read by it: published by the producers (local) or arrived (remote; what waits at the sender for credit is not counted) |
//! | `weir_task_inFlightBytesMaxChannel` | stage, subtask | the same on its fullest input channel |
//! | `weir_async_inFlight`, `weir_async_timeouts_total`, `weir_async_ready_total` | stage, subtask | the async operators' elements in flight, calls timed out, and records answered by `AsyncFunction::ready` with no call made |
//! | `weir_checkpoint_*` | — | completed and failed checkpoints, the last one's id, duration and size (when the job checkpoints) |
//! | `weir_redis_*_total` | client | the Redis clients' counters |
//! | `weir_stream_source_*_total` | source | Redis Streams sources: entries, reads, acknowledgements, reconnects, errors, bytes |
//! | `weir_stream_sink_*_total` | sink | Redis Streams sinks: entries, commands, transactions, reconnects, errors |
//!
//! Rates are averages over the time since the previous scrape (or since the task
//! started, at the first), as a counter's `rate()` over the scrape interval would be.
//! A task that ended keeps its last figures, with rates of zero.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use weir_engine::graph::{LiveCounters, TaskRates, TaskSample};

use crate::redis::streams::{StreamSinkStats, StreamSourceStats};
use crate::redis::SharedStats;

/// A job's checkpoint figures, for the endpoint; whoever listens to the job's
/// checkpoints updates them.
#[derive(Debug, Default)]
pub struct CheckpointGauges {
    /// Checkpoints completed.
    pub completed: AtomicU64,
    /// Checkpoints failed or declined.
    pub failed: AtomicU64,
    /// The last completed checkpoint's id.
    pub last_id: AtomicU64,
    /// The last completed checkpoint's duration, milliseconds.
    pub last_duration_ms: AtomicU64,
    /// The last completed checkpoint's size, bytes.
    pub last_size_bytes: AtomicU64,
    /// The last completed checkpoint's longest alignment, milliseconds.
    pub last_alignment_ms: AtomicU64,
}

impl CheckpointGauges {
    /// Notes completed checkpoint `id`.
    pub fn record(&self, id: u64, duration: Duration, bytes: u64, alignment: Duration) {
        let set = |a: &AtomicU64, v: u64| a.store(v, Ordering::Relaxed);
        self.completed.fetch_add(1, Ordering::Relaxed);
        set(&self.last_id, id);
        set(&self.last_duration_ms, duration.as_millis() as u64);
        set(&self.last_size_bytes, bytes);
        set(&self.last_alignment_ms, alignment.as_millis() as u64);
    }
}

/// Registers a source's own metrics in a scrape's registry (e.g. a stream source's
/// counters), called once per scrape.
pub type Extra = Box<dyn Fn(&mut Registry) + Send + Sync>;

/// What the endpoint reports.
pub struct MetricsSources {
    /// The graph's live counters; call
    /// [`enable_task_metrics`](LiveCounters::enable_task_metrics) before it starts.
    pub live: Arc<LiveCounters>,
    /// Redis clients' counters, by a name for the `client` label.
    pub redis: Vec<(String, Arc<SharedStats>)>,
    /// Checkpoint figures, when the job checkpoints.
    pub checkpoints: Option<Arc<CheckpointGauges>>,
    /// Redis Streams sources' counters, by a name for the `source` label.
    pub stream_sources: Vec<(String, Arc<StreamSourceStats>)>,
    /// Redis Streams sinks' counters, by a name for the `sink` label.
    pub stream_sinks: Vec<(String, Arc<StreamSinkStats>)>,
    /// Anything else.
    pub extra: Vec<Extra>,
}

impl MetricsSources {
    /// The tasks' figures only.
    pub fn new(live: Arc<LiveCounters>) -> Self {
        live.enable_task_metrics();
        MetricsSources {
            live,
            redis: Vec::new(),
            checkpoints: None,
            stream_sources: Vec::new(),
            stream_sinks: Vec::new(),
            extra: Vec::new(),
        }
    }
}

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address could not be bound.
    #[error("metrics endpoint: cannot listen on {addr}: {source} (pick a free port, e.g. --metrics-addr 127.0.0.1:9249)")]
    Bind {
        /// The address asked for.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabels {
    stage: String,
    subtask: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClientLabels {
    client: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StreamSourceLabels {
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StreamSinkLabels {
    sink: String,
}

/// The previous scrape's sample of each task, for the rates.
type Previous = HashMap<usize, TaskSample>;

/// The endpoint; stops when dropped.
///
/// Served by hyper's HTTP/1 server on a current-thread tokio runtime of its own
/// thread: each connection is a task, so idle or slow clients never hold a scrape
/// back; a connection that sends no complete request header within
/// [`REQUEST_TIMEOUT`] is closed, and at most [`CONNECTIONS_MAX`] are open at once
/// (one more is answered `503` and closed at once).
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// Longest a client may take to send a request's header (also how long a kept-alive
/// connection may stay idle between requests).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections open at once; Prometheus keeps one per target.
pub const CONNECTIONS_MAX: usize = 256;
/// Largest request header read.
const REQUEST_MAX: usize = 8 << 10;

impl MetricsServer {
    /// Listens on `addr` (port 0: any free one; see [`addr`](Self::addr)).
    pub fn start(addr: &str, sources: MetricsSources) -> Result<Self, MetricsError> {
        let bind = |source| MetricsError::Bind {
            addr: addr.to_string(),
            source,
        };
        // Bound here, so that a port in use is an error of `start`.
        let listener = TcpListener::bind(addr).map_err(bind)?;
        let local = listener.local_addr().map_err(bind)?;
        listener.set_nonblocking(true).map_err(bind)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(bind)?;
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let shared = Arc::new(Shared {
            sources,
            previous: Mutex::new(Previous::new()),
        });
        let thread = std::thread::Builder::new()
            .name("weir-metrics".into())
            .spawn(move || runtime.block_on(accept_loop(listener, shared, stopped)))
            .map_err(bind)?;
        Ok(MetricsServer {
            addr: local,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What every connection's task reads.
struct Shared {
    sources: MetricsSources,
    previous: Mutex<Previous>,
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    let open = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_MAX));
    loop {
        let stream = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of descriptors, a connection reset before it was accepted: the
                // next accept may work; a short pause keeps this from spinning.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        match Arc::clone(&open).try_acquire_owned() {
            Ok(permit) => {
                let shared = Arc::clone(&shared);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let answer = answer(&shared, &request);
                        async move { Ok::<_, std::convert::Infallible>(answer) }
                    });
                    // A broken or slow client only loses its own answer.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .timer(hyper_util::rt::TokioTimer::new())
                        .header_read_timeout(REQUEST_TIMEOUT)
                        .max_buf_size(REQUEST_MAX)
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                    drop(permit);
                });
            }
            Err(_) => {
                // Over the bound: say so and close, without reading anything.
                tokio::spawn(async move {
                    use tokio::io::AsyncWriteExt;
                    let mut stream = stream;
                    let _ = tokio::time::timeout(
                        Duration::from_millis(100),
                        stream.write_all(
                            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\
                              Connection: close\r\n\r\n",
                        ),
                    )
                    .await;
                });
            }
        }
    }
}

type Body = http_body_util::Full<hyper::body::Bytes>;

/// The answer to one request: `GET /metrics` only.
fn answer<B>(shared: &Shared, request: &hyper::Request<B>) -> hyper::Response<Body> {
    let reply = |status: u16, kind: &str, body: String| {
        let mut response = hyper::Response::new(Body::new(body.into()));
        *response.status_mut() =
            hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
        if let Ok(value) = hyper::header::HeaderValue::from_str(kind) {
            response
                .headers_mut()
                .insert(hyper::header::CONTENT_TYPE, value);
        }
        response
    };
    if request.method() != hyper::Method::GET {
        return reply(405, "text/plain", "GET only\n".into());
    }
    if request.uri().path() != "/metrics" {
        return reply(404, "text/plain", "try /metrics\n".into());
    }
    let body = {
        let mut previous = shared.previous.lock().unwrap_or_else(|e| e.into_inner());
        render(&shared.sources, &mut previous)
    };
    reply(
        200,
        "application/openmetrics-text; version=1.0.0; charset=utf-8",
        body,
    )
}

fn gauge_family(
    registry: &mut Registry,
    name: &str,
    help: &str,
) -> Family<TaskLabels, Gauge<f64, AtomicU64>> {
    let family = Family::<TaskLabels, Gauge<f64, AtomicU64>>::default();
    registry.register(name, help, family.clone());
    family
}

fn counter_family<L>(registry: &mut Registry, name: &str, help: &str) -> Family<L, Counter>
where
    L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
{
    let family = Family::<L, Counter>::default();
    registry.register(name, help, family.clone());
    family
}

/// One scrape's text.
pub(crate) fn render(sources: &MetricsSources, previous: &mut Previous) -> String {
    let mut registry = Registry::with_prefix("weir");
    let records_in = counter_family::<TaskLabels>(
        &mut registry,
        "task_numRecordsIn",
        "Records the task took in",
    );
    let records_out = counter_family::<TaskLabels>(
        &mut registry,
        "task_numRecordsOut",
        "Records the task wrote to its exchange",
    );
    let in_rate = gauge_family(
        &mut registry,
        "task_numRecordsInPerSecond",
        "Records in per second since the last scrape",
    );
    let out_rate = gauge_family(
        &mut registry,
        "task_numRecordsOutPerSecond",
        "Records out per second since the last scrape",
    );
    let busy = gauge_family(
        &mut registry,
        "task_busyTimeMsPerSecond",
        "Milliseconds per second its worker polled the task",
    );
    let backpressured = gauge_family(
        &mut registry,
        "task_backPressuredTimeMsPerSecond",
        "Milliseconds per second its input waited on the chain after it",
    );
    let idle = gauge_family(
        &mut registry,
        "task_idleTimeMsPerSecond",
        "Milliseconds per second the task had nothing to do",
    );
    let pool = gauge_family(
        &mut registry,
        "task_outPoolUsage",
        "Fraction of the output pool's segments in use",
    );
    let in_pool = gauge_family(
        &mut registry,
        "task_inPoolUsage",
        "Fraction of the input channels' buffers waiting to be read",
    );
    let in_flight_bytes = gauge_family(
        &mut registry,
        "task_inFlightBytes",
        "Bytes on the task's input channels not yet read by it",
    );
    let in_flight_bytes_max = gauge_family(
        &mut registry,
        "task_inFlightBytesMaxChannel",
        "Bytes not yet read on the task's fullest input channel",
    );
    let in_flight = gauge_family(
        &mut registry,
        "async_inFlight",
        "Elements in the task's async operators",
    );
    let timeouts = counter_family::<TaskLabels>(
        &mut registry,
        "async_timeouts",
        "Calls the task's async operators timed out",
    );
    let ready = counter_family::<TaskLabels>(
        &mut registry,
        "async_ready",
        "Records the task's async operators answered with AsyncFunction::ready, no call made",
    );

    for (index, task) in sources.live.tasks().iter().enumerate() {
        let labels = TaskLabels {
            stage: task.stage.clone(),
            subtask: task.subtask.to_string(),
        };
        let now = task.sample();
        let before = previous.get(&index).copied().unwrap_or(TaskSample {
            at: task.started,
            records_in: 0,
            records_out: 0,
            busy_ns: 0,
            backpressured_ns: 0,
            ..now
        });
        let rates = if now.finished && before.finished {
            TaskRates::default()
        } else {
            TaskRates::between(&before, &now)
        };
        records_in.get_or_create(&labels).inc_by(now.records_in);
        records_out.get_or_create(&labels).inc_by(now.records_out);
        in_rate
            .get_or_create(&labels)
            .set(rates.records_in_per_second);
        out_rate
            .get_or_create(&labels)
            .set(rates.records_out_per_second);
        busy.get_or_create(&labels).set(rates.busy_ms_per_second);
        backpressured
            .get_or_create(&labels)
            .set(rates.backpressured_ms_per_second);
        idle.get_or_create(&labels).set(rates.idle_ms_per_second);
        pool.get_or_create(&labels).set(now.out_pool_usage);
        in_pool.get_or_create(&labels).set(now.in_pool_usage);
        in_flight_bytes
            .get_or_create(&labels)
            .set(now.in_flight_bytes as f64);
        in_flight_bytes_max
            .get_or_create(&labels)
            .set(now.in_flight_bytes_max_channel as f64);
        in_flight
            .get_or_create(&labels)
            .set(now.async_in_flight as f64);
        timeouts.get_or_create(&labels).inc_by(now.async_timeouts);
        ready.get_or_create(&labels).inc_by(now.async_ready);
        previous.insert(index, now);
    }

    if let Some(checkpoints) = &sources.checkpoints {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let completed = Counter::<u64>::default();
        completed.inc_by(get(&checkpoints.completed));
        registry.register(
            "checkpoint_numberOfCompletedCheckpoints",
            "Checkpoints completed",
            completed,
        );
        let failed = Counter::<u64>::default();
        failed.inc_by(get(&checkpoints.failed));
        registry.register(
            "checkpoint_numberOfFailedCheckpoints",
            "Checkpoints failed or declined",
            failed,
        );
        for (name, help, value) in [
            (
                "checkpoint_lastCompletedCheckpointId",
                "The last completed checkpoint's id",
                &checkpoints.last_id,
            ),
            (
                "checkpoint_lastCheckpointDuration",
                "The last completed checkpoint's duration, milliseconds",
                &checkpoints.last_duration_ms,
            ),
            (
                "checkpoint_lastCheckpointSize",
                "The last completed checkpoint's size, bytes",
                &checkpoints.last_size_bytes,
            ),
            (
                "checkpoint_lastCheckpointAlignmentMs",
                "The last completed checkpoint's longest alignment, milliseconds",
                &checkpoints.last_alignment_ms,
            ),
        ] {
            let gauge = Gauge::<i64>::default();
            gauge.set(get(value) as i64);
            registry.register(name, help, gauge);
        }
    }

    if !sources.redis.is_empty() {
        let families = [
            ("redis_calls", "Calls submitted to the Redis clients"),
            ("redis_commands", "Commands sent"),
            ("redis_hits", "Calls answered with a value"),
            ("redis_misses", "Calls answered with no value"),
            ("redis_errors", "Calls answered with an error reply"),
            (
                "redis_failed",
                "Calls failed otherwise (connection, timeout, overload)",
            ),
            ("redis_connects", "Connections made"),
        ]
        .map(|(name, help)| counter_family::<ClientLabels>(&mut registry, name, help));
        for (client, stats) in &sources.redis {
            let labels = ClientLabels {
                client: client.clone(),
            };
            let s = stats.snapshot();
            let values = [
                s.calls, s.commands, s.hits, s.misses, s.errors, s.failed, s.connects,
            ];
            for (family, value) in families.iter().zip(values) {
                family.get_or_create(&labels).inc_by(value);
            }
        }
    }

    if !sources.stream_sources.is_empty() {
        let families = [
            ("stream_source_entries", "Stream entries read"),
            ("stream_source_reads", "XREAD/XREADGROUP commands sent"),
            ("stream_source_acknowledged", "Entries acknowledged (XACK)"),
            (
                "stream_source_reconnects",
                "Connections made after the first (failed attempts included)",
            ),
            (
                "stream_source_errors",
                "Connection losses and errors (a loss is retried; any other error fails the source)",
            ),
            ("stream_source_bytes", "Reply bytes read"),
        ]
        .map(|(name, help)| counter_family::<StreamSourceLabels>(&mut registry, name, help));
        for (source, stats) in &sources.stream_sources {
            let labels = StreamSourceLabels {
                source: source.clone(),
            };
            let s = stats.snapshot();
            let values = [
                s.entries,
                s.reads,
                s.acknowledged,
                s.reconnects,
                s.errors,
                s.bytes,
            ];
            for (family, value) in families.iter().zip(values) {
                family.get_or_create(&labels).inc_by(value);
            }
        }
    }

    if !sources.stream_sinks.is_empty() {
        let families = [
            (
                "stream_sink_entries",
                "Stream entries written (answered or committed)",
            ),
            (
                "stream_sink_commands",
                "Commands sent, re-sent ones included",
            ),
            (
                "stream_sink_transactions",
                "Exactly-once transactions committed",
            ),
            (
                "stream_sink_reconnects",
                "Connections lost once made (failed attempts to make one again not counted)",
            ),
            (
                "stream_sink_errors",
                "Error replies (transient ones retried)",
            ),
        ]
        .map(|(name, help)| counter_family::<StreamSinkLabels>(&mut registry, name, help));
        for (sink, stats) in &sources.stream_sinks {
            let labels = StreamSinkLabels { sink: sink.clone() };
            let s = stats.snapshot();
            let values = [
                s.entries,
                s.commands,
                s.transactions,
                s.reconnects,
                s.errors,
            ];
            for (family, value) in families.iter().zip(values) {
                family.get_or_create(&labels).inc_by(value);
            }
        }
    }

    for extra in &sources.extra {
        extra(&mut registry);
    }

    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut text, &registry);
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    #[test]
    fn a_scrape_lists_every_task_and_answers_only_get_metrics() {
        let live = Arc::new(LiveCounters::default());
        let sources = MetricsSources::new(Arc::clone(&live));
        let server = MetricsServer::start("127.0.0.1:0", sources).unwrap();
        let get = |request: &str| {
            let mut stream = TcpStream::connect(server.addr()).unwrap();
            stream.write_all(request.as_bytes()).unwrap();
            let mut answer = String::new();
            stream.read_to_string(&mut answer).unwrap();
            answer
        };
        let ok = get("GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        assert!(ok.contains("# EOF"), "{ok}");
        assert!(get("GET / HTTP/1.1\r\nConnection: close\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(
            get("POST /metrics HTTP/1.1\r\nConnection: close\r\n\r\n").starts_with("HTTP/1.1 405")
        );
        let mut previous = Previous::new();
        let text = render(&MetricsSources::new(live), &mut previous);
        assert!(text.contains("weir_task_busyTimeMsPerSecond"), "{text}");
    }

    /// The Kafka connectors' counters, registered through `extra`, appear once under
    /// the endpoint's `weir_` prefix, labelled by their name.
    #[test]
    fn kafka_counters_are_scraped_under_one_prefix() {
        use crate::kafka::{KafkaSinkStats, KafkaSourceStats};
        let live = Arc::new(LiveCounters::default());
        let mut sources = MetricsSources::new(live);
        let source = Arc::new(KafkaSourceStats::default());
        source
            .records
            .store(7, std::sync::atomic::Ordering::Relaxed);
        let sink = Arc::new(KafkaSinkStats::default());
        sink.transactions_committed
            .store(3, std::sync::atomic::Ordering::Relaxed);
        let (a, b) = (Arc::clone(&source), Arc::clone(&sink));
        sources.extra.push(Box::new(move |r| a.register("in", r)));
        sources.extra.push(Box::new(move |r| b.register("out", r)));
        let text = render(&sources, &mut Previous::new());
        assert!(
            text.contains("weir_kafka_source_records_total{source=\"in\"} 7"),
            "{text}"
        );
        assert!(
            text.contains("weir_kafka_sink_transactions_committed_total{sink=\"out\"} 3"),
            "{text}"
        );
        assert!(!text.contains("weir_weir_"), "{text}");
    }

    /// Idle clients (connected, sending nothing) never hold a scrape back: with 100 of
    /// them open, a scrape is answered within 100 ms.
    #[test]
    fn idle_connections_do_not_delay_a_scrape() {
        let live = Arc::new(LiveCounters::default());
        let server = MetricsServer::start("127.0.0.1:0", MetricsSources::new(live)).unwrap();
        let idle: Vec<TcpStream> = (0..100)
            .map(|_| TcpStream::connect(server.addr()).unwrap())
            .collect();
        // And one that sent half a header.
        let mut half = TcpStream::connect(server.addr()).unwrap();
        half.write_all(b"GET /metrics HTTP/1.1\r\nHo").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        for _ in 0..3 {
            let started = std::time::Instant::now();
            let mut stream = TcpStream::connect(server.addr()).unwrap();
            stream
                .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut answer = String::new();
            stream.read_to_string(&mut answer).unwrap();
            let took = started.elapsed();
            assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
            assert!(
                took < Duration::from_millis(100),
                "a scrape took {took:?} with 100 idle connections open"
            );
        }
        drop(idle);
    }

    /// Past the bound, a connection is answered 503 at once; a slot freed is used again.
    #[test]
    fn connections_are_bounded() {
        let live = Arc::new(LiveCounters::default());
        let server = MetricsServer::start("127.0.0.1:0", MetricsSources::new(live)).unwrap();
        let idle: Vec<TcpStream> = (0..CONNECTIONS_MAX)
            .map(|_| TcpStream::connect(server.addr()).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        let mut over = TcpStream::connect(server.addr()).unwrap();
        over.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut answer = String::new();
        over.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        drop(idle);
        // The server sees the closed sockets and frees their slots.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let mut stream = TcpStream::connect(server.addr()).unwrap();
            stream
                .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut answer = String::new();
            let _ = stream.read_to_string(&mut answer);
            if answer.starts_with("HTTP/1.1 200") {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{answer}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_port_in_use_is_a_clear_error() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let live = Arc::new(LiveCounters::default());
        let Err(error) = MetricsServer::start(&addr, MetricsSources::new(live)) else {
            panic!("a second listener on {addr} started");
        };
        assert!(error.to_string().contains("--metrics-addr"), "{error}");
    }
}
