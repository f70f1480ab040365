//! `weir stream-bench`: the main job from Redis streams to a Redis stream, beside the
//! same job from the generator to the counting sink, on this machine, in interleaved
//! turns (the order rotated each round), medians over the rounds.
//!
//! Every case is `weir run`'s job (1 ms lookups at the embedded service, capacity 1000,
//! unordered, key-by exchange, two workers unpinned: the Redis server shares the cores)
//! and differs only in where records come from and go to. The benchmark starts its own
//! `redis-server` (no persistence) on a free port.
//!
//! - **Throughput**: `records` records through the job. The generator case makes them
//!   in the source; the stream cases first append them (untimed) to two streams, one
//!   per source subtask, with `weir produce-stream`'s entries, and read them bounded:
//!   *stream → counting sink* (the source's cost), *stream → stream* (each output
//!   appended with a pipelined `XADD`, at least once), and *stream → stream, exactly
//!   once* (checkpoints every second; each checkpoint's output in one `MULTI`/`EXEC`).
//!   Records per second over the job's run, and CPU per record: this process's user +
//!   system time plus the Redis server's, over the run.
//! - **Latency at a fixed rate**: the generator open loop at `rate` records/s (latency
//!   from each record's intended time to the sink), against two producer threads
//!   appending `rate / 2` entries/s each to the input streams while the job runs
//!   unbounded to the output stream and a reader thread follows the output stream
//!   (`XREAD BLOCK`): end to end from each entry's `t` (when the producer appended it) to
//!   when the reader got it, through Redis twice. Also the job's own figure, from `t` to
//!   the sink.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use redis_protocol::resp2::types::OwnedFrame;
use serde_json::{json, Value};
use weir_engine::async_io::OutputMode;
use weir_engine::checkpoint::{AlignmentMode, RestartStrategy};
use weir_engine::graph::latency_histogram;
use weir_engine::runtime::Cores;
use weir_net::lookup::{Latency, LookupServer, ServerConfig};
use weir_net::redis::streams::{Guarantee, StreamSinkConfig, StreamSourceConfig};
use weir_net::redis::{BlockingConnection, RedisServer, RedisUrl, ServerOptions};
use weir_net::DriverKind;

use crate::compare::median;
use crate::job::{self, Finished, JobCheckpoints, JobSettings, KeyDistribution, StreamIo};
use crate::streams::{produce_records, ProduceSpec};

/// Distinct keys (the main job's default).
const KEYS: u64 = 1_000_000;
/// Input streams: one per source subtask.
const INPUTS: usize = 2;

/// Where a throughput case's records come from and go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Generator,
    StreamToCount,
    StreamToStream,
    StreamToStreamExactlyOnce,
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::Generator => "generator → lookup → key-by → counting sink",
            Shape::StreamToCount => "stream → lookup → key-by → counting sink",
            Shape::StreamToStream => "stream → lookup → key-by → stream (at least once)",
            Shape::StreamToStreamExactlyOnce => {
                "stream → lookup → key-by → stream (exactly once, checkpoints every 1 s)"
            }
        }
    }
}

/// One throughput turn.
struct Turn {
    records_per_s: f64,
    cpu_ns_per_record: f64,
    redis_cpu_ns_per_record: f64,
    p50_us: f64,
    p99_us: f64,
    /// Entries a second appending the input (untimed in the job's figure).
    fill_per_s: Option<f64>,
}

/// The shared pieces: the lookup service and the Redis server.
struct Bench {
    service: LookupServer,
    redis: RedisServer,
    next: AtomicU64,
}

impl Bench {
    fn url(&self) -> RedisUrl {
        self.redis.url()
    }

    /// Fresh stream names for one turn.
    fn streams(&self, what: &str) -> (Vec<String>, String) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let inputs = (0..INPUTS)
            .map(|i| format!("weir:bench:{n}:{what}:in{i}"))
            .collect();
        (inputs, format!("weir:bench:{n}:{what}:out"))
    }

    fn settings(&self, records: u64, rate: Option<f64>) -> JobSettings {
        JobSettings {
            records,
            rate,
            mode: OutputMode::Unordered,
            capacity: 1000,
            timeout: Duration::from_secs(1),
            retries: 0,
            retry_delay: Duration::from_millis(5),
            cores: Cores::Count(2),
            pin: false,
            driver: DriverKind::Auto,
            timer_slack: weir_engine::runtime::TIMER_SLACK_DEFAULT,
            service: self.service.addr(),
            connections: 1,
            keys: KeyDistribution::Uniform { keys: KEYS },
            buffer_timeout: Some(Duration::from_millis(1)),
            futures: false,
            lookup_batch: None,
            key_iter: None,
            collect: None,
            cluster: None,
            checkpoints: None,
            output: None,
            streams: StreamIo::default(),
            stop: Default::default(),
        }
    }

    fn stream_io(&self, inputs: &[String], output: Option<&str>, bounded: bool) -> StreamIo {
        let url = self.url();
        let mut source = StreamSourceConfig::new(url.clone(), inputs.to_vec());
        source.bounded = bounded;
        source.addr = source.check().ok();
        StreamIo {
            source: Some(source),
            sink: output.map(|stream| StreamSinkConfig::new(url, stream)),
            ..StreamIo::default()
        }
    }

    /// Appends `records` entries over the inputs, as fast as Redis takes them.
    fn fill(&self, inputs: &[String], records: u64) -> Result<(), String> {
        let per_stream = records / inputs.len() as u64;
        for (i, stream) in inputs.iter().enumerate() {
            let count = if i == 0 {
                records - per_stream * (inputs.len() as u64 - 1)
            } else {
                per_stream
            };
            produce_records(
                &self.url(),
                stream,
                ProduceSpec {
                    count,
                    rate: None,
                    keys: KeyDistribution::Uniform { keys: KEYS },
                    maxlen: None,
                },
                |_| {},
                &|| false,
            )
            .map_err(|e| format!("filling {stream}: {e}"))?;
        }
        Ok(())
    }

    fn delete(&self, keys: &[String]) {
        if let Ok(mut c) = BlockingConnection::connect(&self.url(), Duration::from_secs(2)) {
            for key in keys {
                let _ = c.command(&[b"DEL", key.as_bytes()]);
            }
        }
    }

    fn redis_cpu(&self) -> Duration {
        proc_cpu(self.redis.pid())
    }
}

/// User + system CPU time of process `pid` (from `/proc/<pid>/stat`), zero if unknown.
fn proc_cpu(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // Fields after the command name (which may hold spaces) end with ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_nanos((ticks(11) + ticks(12)) * 1_000_000_000 / hz)
}

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        return f64::NAN;
    }
    h.value_at_quantile(q) as f64 / 1e3
}

/// A finished job that delivered `expected` records once, or why not.
fn check(finished: &Finished, expected: Option<u64>) -> Result<(), String> {
    if let Some(error) = &finished.failure {
        return Err(format!("the job failed: {error}"));
    }
    let r = &finished.report;
    if r.duplicates != 0 || r.missing != 0 || expected.is_some_and(|n| r.received != n) {
        return Err(format!(
            "the job delivered {} records of {:?} ({} duplicates, {} missing)",
            r.received, expected, r.duplicates, r.missing
        ));
    }
    Ok(())
}

/// One throughput turn of `shape` over `records` records.
fn throughput(bench: &Bench, shape: Shape, records: u64) -> Result<Turn, String> {
    let (inputs, output) = bench.streams("throughput");
    let mut settings = bench.settings(records, None);
    let dir = std::env::temp_dir().join(format!(
        "weir-stream-bench-{}-{}",
        std::process::id(),
        bench.next.fetch_add(1, Ordering::Relaxed)
    ));
    match shape {
        Shape::Generator => {}
        Shape::StreamToCount => settings.streams = bench.stream_io(&inputs, None, true),
        Shape::StreamToStream | Shape::StreamToStreamExactlyOnce => {
            settings.streams = bench.stream_io(&inputs, Some(&output), true)
        }
    }
    if shape == Shape::StreamToStreamExactlyOnce {
        if let Some(sink) = settings.streams.sink.as_mut() {
            sink.guarantee = Guarantee::ExactlyOnce;
            sink.transaction_prefix = format!("{output}:committed");
        }
        settings.checkpoints = Some(JobCheckpoints {
            interval: Duration::from_secs(1),
            dir: dir.clone(),
            alignment: AlignmentMode::Aligned,
            restore: None,
            retain: 1,
            restart: RestartStrategy::None,
            gauges: None,
        });
    }
    let mut fill_per_s = None;
    if shape != Shape::Generator {
        bench.delete(&[crate::streams::ID_COUNTER.to_string()]);
        let started = Instant::now();
        bench.fill(&inputs, records)?;
        fill_per_s = Some(records as f64 / started.elapsed().as_secs_f64());
    }
    let cpu = crate::compare::process_cpu();
    let redis_cpu = bench.redis_cpu();
    let finished = job::run_to_end(&settings, Arc::default()).map_err(|e| e.to_string());
    let cpu = crate::compare::process_cpu().saturating_sub(cpu);
    let redis_cpu = bench.redis_cpu().saturating_sub(redis_cpu);
    let _ = std::fs::remove_dir_all(&dir);
    let finished = finished?;
    check(&finished, Some(records))?;
    if let Some(sink) = &settings.streams.sink {
        let written = sink.stats.snapshot().entries;
        let len = crate::streams::stream_len(&bench.url(), &output).map_err(|e| e.to_string())?;
        if len != records || written != records {
            return Err(format!(
                "the output stream holds {len} entries ({written} written) of {records}"
            ));
        }
    }
    let mut keys = inputs;
    keys.push(output.clone());
    keys.push(format!("{output}:committed:0"));
    keys.push(format!("{output}:committed:1"));
    bench.delete(&keys);
    let h = &finished.report.latency_ns;
    Ok(Turn {
        records_per_s: records as f64 / finished.elapsed.as_secs_f64(),
        cpu_ns_per_record: cpu.as_nanos() as f64 / records as f64,
        redis_cpu_ns_per_record: redis_cpu.as_nanos() as f64 / records as f64,
        p50_us: us(h, 0.5),
        p99_us: us(h, 0.99),
        fill_per_s,
    })
}

/// One latency turn: the figures in µs.
struct Latencies {
    /// From the producer's append to the reader's read (stream case), or from the
    /// intended time to the sink (generator).
    end_to_end: Histogram<u64>,
    /// The job's own: from `t` (or the intended time) to the sink.
    job: Histogram<u64>,
    cpu_ns_per_record: f64,
    redis_cpu_ns_per_record: f64,
}

fn generator_latency(bench: &Bench, rate: f64, records: u64) -> Result<Latencies, String> {
    let settings = bench.settings(records, Some(rate));
    let cpu = crate::compare::process_cpu();
    let finished = job::run_to_end(&settings, Arc::default()).map_err(|e| e.to_string())?;
    let cpu = crate::compare::process_cpu().saturating_sub(cpu);
    check(&finished, Some(records))?;
    Ok(Latencies {
        end_to_end: finished.report.latency_ns.clone(),
        job: finished.report.latency_ns,
        cpu_ns_per_record: cpu.as_nanos() as f64 / records as f64,
        redis_cpu_ns_per_record: 0.0,
    })
}

fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Follows `stream` from its start until `records` entries were read or `done` is
/// set, recording `now - t` of each.
fn follow(
    url: &RedisUrl,
    stream: &str,
    records: u64,
    done: &AtomicBool,
) -> Result<Histogram<u64>, String> {
    let mut connection =
        BlockingConnection::connect(url, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    let mut latency = latency_histogram();
    let mut last = b"0-0".to_vec();
    let mut read = 0;
    while read < records && !done.load(Ordering::Relaxed) {
        let reply = connection
            .command(&[
                b"XREAD",
                b"COUNT",
                b"4096",
                b"BLOCK",
                b"100",
                b"STREAMS",
                stream.as_bytes(),
                &last,
            ])
            .map_err(|e| format!("XREAD {stream}: {e}"))?;
        let now = wall_ns();
        let OwnedFrame::Array(streams) = reply else {
            continue; // nil: nothing within the block
        };
        for s in streams {
            let OwnedFrame::Array(pair) = s else { continue };
            let Some(OwnedFrame::Array(entries)) = pair.into_iter().nth(1) else {
                continue;
            };
            for entry in entries {
                let OwnedFrame::Array(mut entry) = entry else {
                    continue;
                };
                let fields = entry.pop();
                if let Some(OwnedFrame::BulkString(id)) = entry.pop() {
                    last = id;
                }
                let Some(OwnedFrame::Array(fields)) = fields else {
                    continue;
                };
                for kv in fields.chunks(2) {
                    if let [OwnedFrame::BulkString(k), OwnedFrame::BulkString(v)] = kv {
                        if k == b"t" {
                            let t = std::str::from_utf8(v)
                                .ok()
                                .and_then(|t| t.parse::<u64>().ok())
                                .unwrap_or(now);
                            latency.saturating_record(now.saturating_sub(t).max(1));
                        }
                    }
                }
                read += 1;
            }
        }
    }
    Ok(latency)
}

fn stream_latency(bench: &Bench, rate: f64, records: u64) -> Result<Latencies, String> {
    let (inputs, output) = bench.streams("latency");
    let mut settings = bench.settings(0, None);
    settings.streams = bench.stream_io(&inputs, Some(&output), false);
    // Ids from 0 each turn: the checking sink's bitmap stays small.
    bench.delete(&[crate::streams::ID_COUNTER.to_string()]);
    let stop = settings.stop.clone();
    let cpu = crate::compare::process_cpu();
    let redis_cpu = bench.redis_cpu();
    let job = {
        let settings = settings.clone();
        std::thread::spawn(move || job::run_to_end(&settings, Arc::default()))
    };
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (url, output, done) = (bench.url(), output.clone(), Arc::clone(&done));
        std::thread::spawn(move || follow(&url, &output, records, &done))
    };
    let producers: Vec<_> = inputs
        .iter()
        .enumerate()
        .map(|(i, stream)| {
            let (url, stream) = (bench.url(), stream.clone());
            let count = records / INPUTS as u64 + u64::from((i as u64) < records % INPUTS as u64);
            std::thread::spawn(move || {
                produce_records(
                    &url,
                    &stream,
                    ProduceSpec {
                        count,
                        rate: Some(rate / INPUTS as f64),
                        keys: KeyDistribution::Uniform { keys: KEYS },
                        maxlen: None,
                    },
                    |_| {},
                    &|| false,
                )
            })
        })
        .collect();
    let mut failure = None;
    for producer in producers {
        match producer.join() {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => failure = Some(format!("producer: {e}")),
            Err(_) => failure = Some("a producer panicked".into()),
        }
    }
    // Everything produced reaches the output within a few seconds, or it is a failure.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !reader.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    done.store(true, Ordering::Relaxed);
    stop.stop();
    let end_to_end = reader
        .join()
        .map_err(|_| "the reader panicked".to_string())??;
    let finished = job
        .join()
        .map_err(|_| "the job panicked".to_string())?
        .map_err(|e| e.to_string())?;
    let cpu = crate::compare::process_cpu().saturating_sub(cpu);
    let redis_cpu = bench.redis_cpu().saturating_sub(redis_cpu);
    if let Some(failure) = failure {
        return Err(failure);
    }
    check(&finished, Some(records))?;
    if end_to_end.len() != records {
        return Err(format!(
            "the reader got {} of {records} entries within 30 s",
            end_to_end.len()
        ));
    }
    let mut keys = inputs;
    keys.push(output);
    bench.delete(&keys);
    Ok(Latencies {
        end_to_end,
        job: finished.report.latency_ns,
        // The reader's and producers' threads are in this process too: a little more
        // than the job's own.
        cpu_ns_per_record: cpu.as_nanos() as f64 / records as f64,
        redis_cpu_ns_per_record: redis_cpu.as_nanos() as f64 / records as f64,
    })
}

/// Runs every case `rounds` times at `scale` (1: 2 M records a throughput turn, 5 s at
/// `rate` a latency turn) and returns the figures as JSON.
pub fn run(
    scale: f64,
    rounds: usize,
    rate: f64,
    mut progress: impl FnMut(&str),
) -> Result<Value, String> {
    let redis = RedisServer::start(ServerOptions {
        port: 0,
        core: None,
        dir: None,
        args: vec![
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            "no".into(),
        ],
    })
    .map_err(|e| format!("cannot start redis-server: {e}"))?;
    let service = LookupServer::start(ServerConfig {
        latency: Latency::Fixed(Duration::from_millis(1)),
        ..ServerConfig::default()
    })
    .map_err(|e| e.to_string())?;
    let bench = Bench {
        service,
        redis,
        next: AtomicU64::new(0),
    };
    let records = (2_000_000.0 * scale).max(20_000.0) as u64;
    let latency_records = ((5.0 * scale).max(0.5) * rate) as u64;
    let shapes = [
        Shape::Generator,
        Shape::StreamToCount,
        Shape::StreamToStream,
        Shape::StreamToStreamExactlyOnce,
    ];
    let mut turns: Vec<Vec<Turn>> = shapes.iter().map(|_| Vec::new()).collect();
    let mut generator: Vec<Latencies> = Vec::new();
    let mut streamed: Vec<Latencies> = Vec::new();
    for round in 0..rounds {
        for k in 0..shapes.len() {
            let index = (k + round) % shapes.len();
            let turn = throughput(&bench, shapes[index], records)?;
            progress(&format!(
                "round {}: {}: {:.0} records/s",
                round + 1,
                shapes[index].name(),
                turn.records_per_s
            ));
            turns[index].push(turn);
        }
        let pair: [bool; 2] = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for streams in pair {
            let l = if streams {
                stream_latency(&bench, rate, latency_records)?
            } else {
                generator_latency(&bench, rate, latency_records)?
            };
            progress(&format!(
                "round {}: latency at {rate} records/s, {}: p50 {:.0} µs, p99 {:.0} µs",
                round + 1,
                if streams {
                    "stream → stream"
                } else {
                    "generator"
                },
                us(&l.end_to_end, 0.5),
                us(&l.end_to_end, 0.99),
            ));
            if streams {
                streamed.push(l)
            } else {
                generator.push(l)
            }
        }
    }
    let rows: Vec<Value> = shapes
        .iter()
        .zip(&turns)
        .map(|(shape, turns)| {
            let pick = |f: fn(&Turn) -> f64| median(&turns.iter().map(f).collect::<Vec<_>>());
            json!({
                "case": shape.name(),
                "records_per_s": pick(|t| t.records_per_s),
                "samples_records_per_s": turns.iter().map(|t| t.records_per_s).collect::<Vec<_>>(),
                "cpu_ns_per_record": pick(|t| t.cpu_ns_per_record),
                "redis_cpu_ns_per_record": pick(|t| t.redis_cpu_ns_per_record),
                "latency_p50_us": pick(|t| t.p50_us),
                "latency_p99_us": pick(|t| t.p99_us),
            })
        })
        .collect();
    let fills: Vec<f64> = turns
        .iter()
        .flatten()
        .filter_map(|t| t.fill_per_s)
        .collect();
    let latency = |side: &[Latencies]| {
        let q = |f: &dyn Fn(&Latencies) -> f64| median(&side.iter().map(f).collect::<Vec<_>>());
        json!({
            "end_to_end_p50_us": q(&|l| us(&l.end_to_end, 0.5)),
            "end_to_end_p99_us": q(&|l| us(&l.end_to_end, 0.99)),
            "end_to_end_p999_us": q(&|l| us(&l.end_to_end, 0.999)),
            "job_p50_us": q(&|l| us(&l.job, 0.5)),
            "job_p99_us": q(&|l| us(&l.job, 0.99)),
            "cpu_ns_per_record": q(&|l| l.cpu_ns_per_record),
            "redis_cpu_ns_per_record": q(&|l| l.redis_cpu_ns_per_record),
            "samples_end_to_end_p50_us": side.iter().map(|l| us(&l.end_to_end, 0.5)).collect::<Vec<_>>(),
        })
    };
    Ok(json!({
        "suite": "streams",
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "machine": crate::compare::machine(),
        "rounds": rounds,
        "scale": scale,
        "records": records,
        "rate": rate,
        "latency_records": latency_records,
        "rows": rows,
        "fill_entries_per_s": median(&fills),
        "latency": {
            "generator": latency(&generator),
            "stream_to_stream": latency(&streamed),
        },
    }))
}

/// The figures as Markdown.
pub fn render(value: &Value) -> String {
    let f0 = |v: &Value| v.as_f64().map_or("–".to_string(), |x| format!("{x:.0}"));
    let rows = value["rows"].as_array().cloned().unwrap_or_default();
    let base = rows
        .first()
        .and_then(|r| r["records_per_s"].as_f64())
        .unwrap_or(f64::NAN);
    let mut out = format!(
        "\n### Throughput ({} records a turn, medians of {} rounds)\n\n\
         | case | records/s | vs generator → counting sink | CPU ns/record (weir) | CPU ns/record (redis-server) | latency p50 / p99 (µs) |\n|---|---:|---:|---:|---:|---:|\n",
        value["records"], value["rounds"]
    );
    for row in &rows {
        let rate = row["records_per_s"].as_f64().unwrap_or(f64::NAN);
        out.push_str(&format!(
            "| {} | {:.0} | {:.2}× | {} | {} | {} / {} |\n",
            row["case"].as_str().unwrap_or("?"),
            rate,
            rate / base,
            f0(&row["cpu_ns_per_record"]),
            f0(&row["redis_cpu_ns_per_record"]),
            f0(&row["latency_p50_us"]),
            f0(&row["latency_p99_us"]),
        ));
    }
    out.push_str(&format!(
        "\nFor scale: appending the input before each stream turn (one client, `XADD`s pipelined 1024 a write, one stream after the other) ran at {} entries/s (median): what this Redis takes from one connection on this machine, a bound on the stream → stream rows' sink side, whose two subtasks write through a connection each while Redis also serves the reads.\n\n\
         The latency of a bounded stream case counts from the run's start for entries appended before it (all of them here): it is how long the backlog took to drain, not the pipeline's delay (see the next table for that).\n",
        f0(&value["fill_entries_per_s"])
    ));
    let l = &value["latency"];
    out.push_str(&format!(
        "\n### Latency at {} records/s ({} records a turn, medians of {} rounds)\n\n\
         | case | p50 (µs) | p99 (µs) | p99.9 (µs) | in the job p50 / p99 (µs) | CPU ns/record (weir) | CPU ns/record (redis-server) |\n|---|---:|---:|---:|---:|---:|---:|\n",
        value["rate"], value["latency_records"], value["rounds"]
    ));
    for (name, side) in [
        (
            "generator (open loop) → counting sink: intended time to sink",
            &l["generator"],
        ),
        (
            "producer XADD → stream → job → XADD → reader's XREAD",
            &l["stream_to_stream"],
        ),
    ] {
        out.push_str(&format!(
            "| {name} | {} | {} | {} | {} / {} | {} | {} |\n",
            f0(&side["end_to_end_p50_us"]),
            f0(&side["end_to_end_p99_us"]),
            f0(&side["end_to_end_p999_us"]),
            f0(&side["job_p50_us"]),
            f0(&side["job_p99_us"]),
            f0(&side["cpu_ns_per_record"]),
            f0(&side["redis_cpu_ns_per_record"]),
        ));
    }
    out
}
