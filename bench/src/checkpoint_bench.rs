//! `weir checkpoint-bench`: what checkpoints cost and how fast a job recovers, in
//! interleaved turns (every case of an experiment once per round, the order rotated),
//! medians over the rounds. Flink's side of the same jobs comes from
//! `scripts/flink-peer.sh checkpoints`; the report puts them beside each other.
//!
//! - **Overhead of the main job**: `weir run`'s job (embedded lookup service, 1 ms
//!   lookups, capacity 1000, key-by exchange) with no checkpoints and with aligned
//!   checkpoints every second; records per second and CPU per record (the whole process).
//! - **Overhead** on the job Flink's side runs too: a generator of 64-byte records at
//!   parallelism 2 → key-by → counting sink at parallelism 2; no checkpoints, aligned and
//!   unaligned every second.
//! - **Under back-pressure**: that job with a sink that spins 20 µs per record, the
//!   source unthrottled (the exchange's buffers full), for about 6 s with checkpoints
//!   every second: aligned, unaligned, aligned with buffer debloating (Flink's
//!   defaults: target 1 s, period 200 ms, 20 samples, starting at 1 KiB), aligned with a
//!   50 ms timeout (then unaligned, Flink's `aligned-checkpoint-timeout`). Each sink
//!   subtask has a worker of its own and the sources share a third (Flink runs every
//!   task on a thread of its own), so both sides sustain some 2 × 50,000 records/s;
//!   buffer timeout 100 ms as Flink's side sets it. Checkpoint durations (trigger to
//!   the last acknowledgement) and alignments.
//! - **Keyed state snapshot** (`--only keyed`, and in the full run): one subtask's
//!   keyed state of 10 MB, 100 MB and 1 GB (100-byte entries: a u64 key, a 92-byte
//!   value), and what a checkpoint costs it: the task's pause (the synchronous part:
//!   [`KeyedState::snapshot_view`](weir_engine::checkpoint::KeyedState::snapshot_view),
//!   a reference count per key group), the writes of 1%
//!   of the keys right after (the first write to a group copies it), and the
//!   encoding of the view on another thread (the asynchronous part); beside it, the
//!   encoding on the worker that the pause was before views (`KeyedState::snapshot`).
//! - **Recovery**: a job with keyed state and exactly-once files stopped at once after
//!   its second checkpoint (every task dropped, as a crash drops them), then restarted
//!   from that checkpoint: the time from the stop to the first record reaching the sink
//!   again (stopping, reading the checkpoint, starting the tasks, replaying), and the
//!   records replayed. The job's sources emit 1 M records/s, its checkpoints come every
//!   200 ms, and the stop comes at a pseudo-random moment of the interval.
//! - **Recovery of the main job after kill -9**: `weir run` (1 M records/s, 200 ms
//!   checkpoints, exactly-once output) killed with SIGKILL after its second checkpoint,
//!   at a pseudo-random moment of the interval, then started again with `--restore`:
//!   from the kill to the first record reaching a sink of the new process (the
//!   process's start, reading the checkpoint, its tasks' and lookup connections'
//!   start). In one process: a process restart (`weir run --restore`) adds
//!   the process's own start.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use weir_engine::async_io::OutputMode;
use weir_engine::checkpoint::AlignmentMode;
use weir_engine::exchange::codec::FixedBytes;
use weir_engine::exchange::DebloatConfig;
use weir_engine::graph::{
    CheckpointReport, Checkpointing, ExchangeSpec, Graph, JobResult, LiveCounters, Sink,
    SubtaskInfo,
};
use weir_engine::runtime::{Cores, Runtime, TaskError};
use weir_net::lookup::{Latency, LookupServer, ServerConfig};
use weir_net::DriverKind;

use crate::compare::median;
use crate::job::{self, CheckpointSummary, JobCheckpoints, JobSettings, KeyDistribution};

/// Checkpoint interval of the overhead and back-pressure runs.
const INTERVAL: Duration = Duration::from_secs(1);
/// The back-pressured sink's work per record.
const SINK_SPIN: Duration = Duration::from_micros(20);

/// One measured run.
#[derive(Debug, Clone, Default)]
struct Turn {
    ops_per_s: f64,
    cpu_ns_per_op: Option<f64>,
    checkpoints: Option<CheckpointSummary>,
    /// Every completed checkpoint's duration and longest alignment, ms.
    durations_ms: Vec<f64>,
    alignments_ms: Vec<f64>,
    /// Every completed checkpoint's channel state (in-flight data persisted), bytes.
    persisted_bytes: Vec<f64>,
    /// Bytes in flight on the sinks' fullest input channel, sampled every 10 ms.
    in_flight_bytes: Vec<f64>,
    /// Bytes in flight on all the sinks' input channels together, at the same samples.
    in_flight_bytes_total: Vec<f64>,
}

impl Turn {
    fn new(ops_per_s: f64, cpu_ns_per_op: Option<f64>, report: Option<&CheckpointReport>) -> Self {
        Turn {
            ops_per_s,
            cpu_ns_per_op,
            checkpoints: report.map(CheckpointSummary::of),
            durations_ms: report.map_or_else(Vec::new, |r| {
                r.stats.durations.iter().map(|d| ms(*d)).collect()
            }),
            alignments_ms: report.map_or_else(Vec::new, |r| {
                r.stats.alignments.iter().map(|d| ms(*d)).collect()
            }),
            persisted_bytes: report.map_or_else(Vec::new, |r| {
                r.stats.channel_state.iter().map(|b| *b as f64).collect()
            }),
            in_flight_bytes: Vec::new(),
            in_flight_bytes_total: Vec::new(),
        }
    }
}

/// A case: its experiment, its name, and how to run it once.
struct Case {
    experiment: &'static str,
    implementation: &'static str,
    run: Box<dyn Fn() -> Result<Turn, String>>,
}

fn scratch(name: &str) -> std::path::PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "weir-checkpoint-bench-{}-{name}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

fn runtime() -> Result<Runtime, String> {
    Runtime::builder()
        .cores(Cores::Count(2))
        .pin(false)
        .build()
        .map_err(|e| e.to_string())
}

/// The main job with `checkpoints` (none, or aligned every [`INTERVAL`]).
fn main_job(server: &LookupServer, records: u64, checkpoints: bool) -> Result<Turn, String> {
    let dir = scratch("main");
    let settings = JobSettings {
        records,
        rate: None,
        mode: OutputMode::Unordered,
        capacity: 1000,
        timeout: Duration::from_secs(1),
        retries: 0,
        retry_delay: Duration::from_millis(5),
        cores: Cores::Count(2),
        pin: false,
        driver: DriverKind::Uring,
        timer_slack: weir_engine::runtime::TIMER_SLACK_DEFAULT,
        service: server.addr(),
        connections: 1,
        keys: KeyDistribution::Uniform { keys: 1_000_000 },
        buffer_timeout: Some(Duration::from_millis(1)),
        futures: false,
        lookup_batch: None,
        key_iter: None,
        collect: None,
        cluster: None,
        checkpoints: checkpoints.then(|| JobCheckpoints {
            interval: INTERVAL,
            dir: dir.clone(),
            alignment: AlignmentMode::Aligned,
            restore: None,
            retain: 1,
            restart: weir_engine::checkpoint::RestartStrategy::None,
            gauges: None,
        }),
        output: None,
        streams: Default::default(),
        stop: Default::default(),
    };
    let cpu = crate::compare::process_cpu();
    let result = job::run(&settings, Arc::default());
    let cpu = crate::compare::process_cpu().saturating_sub(cpu);
    let _ = std::fs::remove_dir_all(&dir);
    let (report, elapsed) = result.map_err(|e| e.to_string())?;
    if report.received != records || report.duplicates != 0 {
        return Err(format!(
            "the main job delivered {} of {records} records ({} duplicates)",
            report.received, report.duplicates
        ));
    }
    Ok(Turn::new(
        records as f64 / elapsed.as_secs_f64(),
        Some(cpu.as_nanos() as f64 / records as f64),
        report.checkpoints.as_ref(),
    ))
}

/// A sink that spins `spin` per record and counts.
struct SlowSink {
    spin: Duration,
    count: Arc<AtomicU64>,
}

impl Sink<FixedBytes<64>> for SlowSink {
    fn invoke(&mut self, _: FixedBytes<64>, _: Option<i64>, _: u64) -> Result<(), TaskError> {
        let start = Instant::now();
        while start.elapsed() < self.spin {
            std::hint::spin_loop();
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// How the generator → key-by → sink job checkpoints.
#[derive(Clone, Copy)]
enum Mode {
    None,
    Aligned,
    Unaligned,
    AlignedDebloat,
    /// Aligned, unaligned once the alignment took [`ALIGNED_TIMEOUT`].
    AlignedTimeout,
}

impl Mode {
    /// How the gates align barriers (none: no checkpoints).
    fn alignment(self) -> Option<AlignmentMode> {
        match self {
            Mode::None => None,
            Mode::Aligned | Mode::AlignedDebloat => Some(AlignmentMode::Aligned),
            Mode::Unaligned => Some(AlignmentMode::Unaligned),
            Mode::AlignedTimeout => Some(AlignmentMode::AlignedWithTimeout(ALIGNED_TIMEOUT)),
        }
    }
}

/// A back-pressured run of `records` with a sink spinning so long per record, in a mode.
type PressuredJob = fn(u64, Duration, Mode) -> Result<Turn, String>;

/// The back-pressure case's aligned checkpoint timeout (Flink's side sets the same).
const ALIGNED_TIMEOUT: Duration = Duration::from_millis(50);

/// The generator → key-by → sink job: `records` 64-byte records, the sink spinning
/// `spin` per record.
fn keyed_job(records: u64, spin: Duration, mode: Mode) -> Result<Turn, String> {
    let dir = scratch("keyed");
    // Flink's side sets a buffer timeout of 100 ms.
    let mut exchange = ExchangeSpec {
        buffer_timeout: Some(Duration::from_millis(100)),
        ..ExchangeSpec::default()
    };
    if matches!(mode, Mode::AlignedDebloat) {
        exchange.debloat = Some(DebloatConfig::new(1));
    }
    // The sinks' input channels are sampled while it runs (each task's live figures).
    let live = Arc::new(LiveCounters::default());
    live.enable_task_metrics();
    let mut graph = Graph::new()
        .with_parallelism(2)
        .with_exchange(exchange)
        .with_live(Arc::clone(&live));
    if let Some(alignment) = mode.alignment() {
        graph =
            graph.with_checkpointing(Checkpointing::new(&dir, INTERVAL).with_alignment(alignment));
    }
    let count = Arc::new(AtomicU64::new(0));
    {
        let count = Arc::clone(&count);
        let source = graph.from_generator(records, None, |n| {
            let mut bytes = [0u8; 64];
            bytes[..8].copy_from_slice(&n.to_le_bytes());
            FixedBytes(bytes)
        });
        // Each slow sink subtask gets a worker of its own, away from the sources (as
        // Flink runs each task on a thread of its own), so that the sources fill the
        // exchange and both sinks spin at once.
        let source = if spin > Duration::ZERO {
            source.place(vec![0, 0])
        } else {
            source
        };
        let keyed =
            source.key_by(|r: &FixedBytes<64>| u64::from_le_bytes(r.0[..8].try_into().expect("8")));
        let keyed = if spin > Duration::ZERO {
            keyed.place(vec![1, 2])
        } else {
            keyed
        };
        keyed.sink(move |_: &SubtaskInfo| SlowSink {
            spin,
            count: Arc::clone(&count),
        });
    }
    let runtime = if spin > Duration::ZERO {
        // The sources' worker and one per sink subtask (more workers than this
        // machine's 2 cores: the sinks spin, the sources mostly wait for buffers).
        Runtime::builder()
            .cores(Cores::Count(3))
            .pin(false)
            .build()
            .map_err(|e| e.to_string())?
    } else {
        runtime()?
    };
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = in_flight_sampler(Arc::clone(&live), Arc::clone(&done));
    let started = Instant::now();
    let result = graph.execute(runtime);
    let elapsed = started.elapsed();
    done.store(true, Ordering::Relaxed);
    let (in_flight_bytes, in_flight_bytes_total) = sampler.join().unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    let result = result.map_err(|e| e.to_string())?;
    let received = count.load(Ordering::Relaxed);
    if received != records {
        return Err(format!("the job delivered {received} of {records} records"));
    }
    Ok(Turn {
        in_flight_bytes,
        in_flight_bytes_total,
        ..Turn::new(
            records as f64 / elapsed.as_secs_f64(),
            None,
            result.checkpoints.as_ref(),
        )
    })
}

/// [`keyed_job`] under back-pressure over two processes, as Flink's MiniCluster runs it
/// with two task managers: two transports in this process on loopback (each a process of
/// the job, with its own runtime of 2 workers and its own network thread), the sources
/// in process 0 and both sink subtasks in process 1, so that every record crosses the
/// transport (credit-based flow control, remote barriers and announcements). Process 0's
/// checkpoint service coordinates; the figures are its.
fn keyed_job_two_processes(records: u64, spin: Duration, mode: Mode) -> Result<Turn, String> {
    use weir_net::cluster::TransportChannels;
    let dir = scratch("keyed-two");
    let peers: Vec<std::net::SocketAddr> = {
        let listeners: Vec<std::net::TcpListener> = (0..2)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("no free loopback port: {e}"))?;
        listeners
            .iter()
            .map(|l| l.local_addr())
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?
    };
    let count = Arc::new(AtomicU64::new(0));
    let live = Arc::new(LiveCounters::default());
    live.enable_task_metrics();
    let started = Arc::new(std::sync::Barrier::new(2));
    let processes: Vec<_> = (0..2)
        .map(|process| {
            let (peers, dir, count, live, started) = (
                peers.clone(),
                dir.clone(),
                Arc::clone(&count),
                Arc::clone(&live),
                Arc::clone(&started),
            );
            std::thread::spawn(move || -> Result<(JobResult, Duration), String> {
                let channels =
                    Arc::new(TransportChannels::start(process, &peers).map_err(|e| e.to_string())?);
                channels
                    .wait_for_peers(Duration::from_secs(20))
                    .map_err(|e| e.to_string())?;
                let mut exchange = ExchangeSpec {
                    buffer_timeout: Some(Duration::from_millis(100)),
                    ..ExchangeSpec::default()
                };
                if matches!(mode, Mode::AlignedDebloat) {
                    exchange.debloat = Some(DebloatConfig::new(1));
                }
                let mut graph = Graph::new()
                    .with_parallelism(2)
                    .with_exchange(exchange)
                    .with_cluster(channels.cluster())
                    .with_live(live);
                if let Some(alignment) = mode.alignment() {
                    graph = graph.with_checkpointing(
                        Checkpointing::new(&dir, INTERVAL).with_alignment(alignment),
                    );
                }
                // Global workers: 0–1 are process 0's, 2–3 process 1's.
                graph
                    .from_generator(records, None, |n| {
                        let mut bytes = [0u8; 64];
                        bytes[..8].copy_from_slice(&n.to_le_bytes());
                        FixedBytes(bytes)
                    })
                    .place(vec![0, 0])
                    .key_by(|r: &FixedBytes<64>| {
                        u64::from_le_bytes(r.0[..8].try_into().expect("8"))
                    })
                    .place(vec![2, 3])
                    .sink(move |_: &SubtaskInfo| SlowSink {
                        spin,
                        count: Arc::clone(&count),
                    });
                let runtime = Runtime::builder()
                    .cores(Cores::Count(2))
                    .pin(false)
                    .build()
                    .map_err(|e| e.to_string())?;
                started.wait();
                let began = Instant::now();
                let (result, failure) = graph.execute_to_end(runtime).map_err(|e| e.to_string())?;
                let elapsed = began.elapsed();
                if let Some(failure) = failure {
                    return Err(format!("process {process}: {failure}"));
                }
                channels
                    .drain(Duration::from_secs(20))
                    .map_err(|e| e.to_string())?;
                Ok((result, elapsed))
            })
        })
        .collect();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = in_flight_sampler(Arc::clone(&live), Arc::clone(&done));
    let results: Vec<Result<(JobResult, Duration), String>> = processes
        .into_iter()
        .map(|p| {
            p.join()
                .unwrap_or_else(|_| Err("a process panicked".into()))
        })
        .collect();
    done.store(true, Ordering::Relaxed);
    let (in_flight_bytes, in_flight_bytes_total) = sampler.join().unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    let mut results = results.into_iter().collect::<Result<Vec<_>, String>>()?;
    let elapsed = results.iter().map(|(_, e)| *e).max().unwrap_or_default();
    let (coordinator, _) = results.swap_remove(0);
    let received = count.load(Ordering::Relaxed);
    if received != records {
        return Err(format!("the job delivered {received} of {records} records"));
    }
    Ok(Turn {
        in_flight_bytes,
        in_flight_bytes_total,
        ..Turn::new(
            records as f64 / elapsed.as_secs_f64(),
            None,
            coordinator.checkpoints.as_ref(),
        )
    })
}

/// Samples, every 10 ms until `done`, the bytes in flight on the fullest input channel
/// of each running task that reads an exchange (the sinks here), and the bytes in flight
/// on all their input channels together (one figure per sample: what the exchange
/// holds, published or arrived and not yet read).
fn in_flight_sampler(
    live: Arc<LiveCounters>,
    done: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<(Vec<f64>, Vec<f64>)> {
    std::thread::spawn(move || {
        let (mut fullest, mut totals) = (Vec::new(), Vec::new());
        while !done.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
            let mut total = None;
            for task in live.tasks() {
                let now = task.sample();
                if task.stage.ends_with("exchange") && !now.finished {
                    fullest.push(now.in_flight_bytes_max_channel as f64);
                    *total.get_or_insert(0.0) += now.in_flight_bytes as f64;
                }
            }
            totals.extend(total);
        }
        (fullest, totals)
    })
}

/// Bytes of one keyed-state entry as encoded: a u64 key and a 92-byte value.
const KEYED_ENTRY_BYTES: usize = 100;

/// One size's figures of a keyed-state snapshot, medians over the rounds (µs).
#[derive(Debug, Clone, Default)]
struct KeyedSnapshot {
    size_bytes: usize,
    entries: usize,
    view_us: Vec<f64>,
    writes_after_us: Vec<f64>,
    writes_before_us: Vec<f64>,
    /// The same writes into a plain std HashMap of the same entries (no views at all).
    writes_std_us: Vec<f64>,
    encode_async_us: Vec<f64>,
    encode_sync_us: Vec<f64>,
}

/// Builds one subtask's keyed state of `entries` entries, then per round: a view (the
/// pause), 1% of the keys written, the view encoded on another thread, and a
/// synchronous snapshot for comparison.
fn keyed_snapshot(entries: usize, rounds: usize) -> Result<KeyedSnapshot, String> {
    use weir_engine::checkpoint::KeyedState;
    let mut state: KeyedState<u64, FixedBytes<92>> =
        KeyedState::new(128, 1, 0).map_err(|e| e.to_string())?;
    for key in 0..entries as u64 {
        state
            .insert(key, FixedBytes([key as u8; 92]))
            .map_err(|e| e.to_string())?;
    }
    let mut figures = KeyedSnapshot {
        size_bytes: entries * KEYED_ENTRY_BYTES,
        entries,
        ..KeyedSnapshot::default()
    };
    let writes = (entries / 100).max(1) as u64;
    // A key spread over the state: the writes touch paths all over it.
    let key_of = |i: u64, round: usize| (i * 97 + round as u64) % entries as u64;
    {
        let mut flat: std::collections::HashMap<u64, FixedBytes<92>> = (0..entries as u64)
            .map(|key| (key, FixedBytes([key as u8; 92])))
            .collect();
        for round in 0..rounds {
            let started = Instant::now();
            for i in 0..writes {
                flat.insert(key_of(i, round), FixedBytes([round as u8; 92]));
            }
            figures.writes_std_us.push(us(started.elapsed()));
        }
        std::hint::black_box(&flat);
    }
    for round in 0..rounds {
        // Writes with no snapshot in the way, for comparison.
        let started = Instant::now();
        for i in 0..writes {
            state
                .insert(key_of(i, round), FixedBytes([round as u8; 92]))
                .map_err(|e| e.to_string())?;
        }
        figures.writes_before_us.push(us(started.elapsed()));
        let started = Instant::now();
        let view = state.snapshot_view();
        figures.view_us.push(us(started.elapsed()));
        // The task goes on while the service encodes the view.
        let encoder = std::thread::spawn(move || {
            let started = Instant::now();
            let bytes = view();
            (bytes.len(), started.elapsed())
        });
        let started = Instant::now();
        for i in 0..writes {
            state
                .insert(key_of(i, round + 1), FixedBytes([round as u8 + 1; 92]))
                .map_err(|e| e.to_string())?;
        }
        figures.writes_after_us.push(us(started.elapsed()));
        let (len, encode) = encoder.join().map_err(|_| "the encoder panicked")?;
        figures.encode_async_us.push(us(encode));
        let started = Instant::now();
        let bytes = state.snapshot();
        figures.encode_sync_us.push(us(started.elapsed()));
        if bytes.len() != len {
            return Err(format!(
                "the view encoded {len} bytes, the state {} (both {entries} entries)",
                bytes.len()
            ));
        }
    }
    Ok(figures)
}

fn us(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

/// One recovery: figures of a stop and restore.
#[derive(Debug, Clone, Copy)]
struct Recovery {
    /// From the stop to the first record at the sink of the restored run.
    to_processing: Duration,
    /// Reading the checkpoint.
    read: Duration,
    /// Records the sources emitted again.
    replayed: u64,
}

/// Records per second of the recovery job's sources.
const RECOVERY_RATE: f64 = 1_000_000.0;

/// Keyed counts into exactly-once files, 200 ms checkpoints, `records` at
/// [`RECOVERY_RATE`].
fn recovery_graph(
    dir: &std::path::Path,
    records: u64,
    restore: bool,
    first: Arc<AtomicU64>,
    epoch: Instant,
) -> Graph {
    let mut checkpointing = Checkpointing::new(dir.join("chk"), Duration::from_millis(200));
    if restore {
        checkpointing = checkpointing.restore_from(dir.join("chk"));
    }
    let graph = Graph::new()
        .with_parallelism(2)
        .with_checkpointing(checkpointing);
    let out = dir.join("out");
    graph
        .from_generator(records, Some(RECOVERY_RATE), |n| n)
        .key_by(|n: &u64| *n % 10_000)
        .map_with_state(
            |n: &u64| *n % 10_000,
            |n, count: &mut Option<u64>| {
                let c = count.unwrap_or(0) + 1;
                *count = Some(c);
                (n, c)
            },
        )
        .map(move |record| {
            if first.load(Ordering::Relaxed) == u64::MAX {
                first.fetch_min(epoch.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
            record
        })
        .sink_to_files(out, |(n, c): &(u64, u64), line: &mut Vec<u8>| {
            line.extend_from_slice(format!("{n} {c}\n").as_bytes());
        });
    graph
}

fn recovery(records: u64) -> Result<Recovery, String> {
    let dir = scratch("recovery");
    let completed = Arc::new(AtomicU64::new(0));
    let epoch = Instant::now();
    let first = Arc::new(AtomicU64::new(u64::MAX));
    let mut graph = recovery_graph(&dir, records, false, Arc::clone(&first), epoch);
    {
        let completed = Arc::clone(&completed);
        graph = graph.with_checkpointing(
            Checkpointing::new(dir.join("chk"), Duration::from_millis(200)).with_listener(
                move |metadata, _| {
                    completed.fetch_max(metadata.id, Ordering::Relaxed);
                },
            ),
        );
    }
    let live = graph.live();
    let job = graph.start(runtime()?).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while completed.load(Ordering::Relaxed) < 2 {
        if Instant::now() > deadline {
            return Err("no second checkpoint in 60 s".into());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    // A crash comes at any moment of the interval: wait a pseudo-random part of it.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    std::thread::sleep(Duration::from_millis(u64::from(nanos % 200)));
    let generated = live.generated.load(Ordering::Relaxed);
    let stopped = Instant::now();
    job.controller().cancel();
    let _ = job.join();
    let first = Arc::new(AtomicU64::new(u64::MAX));
    let graph = recovery_graph(&dir, records, true, Arc::clone(&first), stopped);
    let live = graph.live();
    let result = graph.execute(runtime()?).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    let restored = result
        .checkpoints
        .and_then(|c| c.restored)
        .ok_or("the second run did not restore")?;
    // The restored sources emit from the checkpoint's position to the end.
    let position = records - live.generated.load(Ordering::Relaxed);
    Ok(Recovery {
        to_processing: Duration::from_nanos(first.load(Ordering::Relaxed)),
        read: restored.read_time,
        replayed: generated.saturating_sub(position),
    })
}

fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The main job killed with SIGKILL after its second checkpoint and started again from
/// it: from the kill to the new process's first record at a sink.
fn main_job_kill_recovery() -> Result<Duration, String> {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let exe = std::env::current_exe().map_err(|e| format!("the weir executable: {e}"))?;
    let dir = scratch("kill");
    let chk = dir.join("chk");
    let out = dir.join("out");
    let json = dir.join("restored.json");
    let args = |restore: bool| {
        let mut args: Vec<std::ffi::OsString> = [
            "run",
            "--records",
            "3000000",
            "--rate",
            "1000000",
            "--cores",
            "2",
            "--oversubscribe",
            "--no-pin",
            "--quiet",
            "--checkpoint-interval",
            "200ms",
        ]
        .iter()
        .map(Into::into)
        .collect();
        args.push("--checkpoint-dir".into());
        args.push(chk.clone().into());
        args.push("--output".into());
        args.push(out.clone().into());
        if restore {
            args.push("--restore".into());
            args.push(chk.clone().into());
            args.push("--json".into());
            args.push(json.clone().into());
        }
        args
    };
    let mut child = Command::new(&exe)
        .args(args(false))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start weir run: {e}"))?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let found = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|line| line.contains("checkpoint 2 complete"));
    if !found {
        let _ = child.kill();
        return Err("the main job ended before its second checkpoint".into());
    }
    std::thread::sleep(Duration::from_millis(u64::from(
        (wall_ns() % 200_000_000 / 1_000_000) as u32,
    )));
    child
        .kill()
        .map_err(|e| format!("cannot kill weir run: {e}"))?;
    let killed = wall_ns();
    let _ = child.wait();
    drop(lines);
    let status = Command::new(&exe)
        .args(args(true))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("cannot start weir run --restore: {e}"))?;
    let report: Value = std::fs::read(&json)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .ok_or("the restored run wrote no report")?;
    let _ = std::fs::remove_dir_all(&dir);
    if !status.success() {
        return Err(format!("the restored main job failed: {}", report["cause"]));
    }
    let first = report["first_output_unix_ms"]
        .as_f64()
        .ok_or("the restored run reports no first record")?;
    Ok(Duration::from_nanos(
        ((first * 1e6) as u64).saturating_sub(killed),
    ))
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// Runs every experiment `rounds` times at `scale` and returns the figures as JSON.
/// `only`: just the experiments whose name contains it ("recovery" names both
/// recovery figures).
pub fn run(
    scale: f64,
    rounds: usize,
    only: Option<&str>,
    mut progress: impl FnMut(&str),
) -> Result<Value, String> {
    let server = Arc::new(
        LookupServer::start(ServerConfig {
            latency: Latency::Fixed(Duration::from_millis(1)),
            ..ServerConfig::default()
        })
        .map_err(|e| e.to_string())?,
    );
    let main_records = (6_000_000.0 * scale).max(10_000.0) as u64;
    let keyed_records = (40_000_000.0 * scale).max(10_000.0) as u64;
    // What the spinning sinks sustain in about 6 s: 50,000 records/s each (Flink's
    // side runs as many).
    let pressured_records = (600_000.0 * scale).max(5_000.0) as u64;
    let mut cases: Vec<Case> = Vec::new();
    for (implementation, checkpoints) in [
        ("weir main job, no checkpoints", false),
        ("weir main job, aligned checkpoints every 1 s", true),
    ] {
        let server = Arc::clone(&server);
        cases.push(Case {
            experiment: "checkpoint overhead (main job)",
            implementation,
            run: Box::new(move || main_job(&server, main_records, checkpoints)),
        });
    }
    for (implementation, mode) in [
        ("weir, no checkpoints", Mode::None),
        ("weir, aligned checkpoints every 1 s", Mode::Aligned),
        ("weir, unaligned checkpoints every 1 s", Mode::Unaligned),
    ] {
        cases.push(Case {
            experiment: "checkpoint overhead",
            implementation,
            run: Box::new(move || keyed_job(keyed_records, Duration::ZERO, mode)),
        });
    }
    // The back-pressured job in one process, then over two.
    let pressured: [(&'static str, PressuredJob); 2] = [
        ("checkpoints under back-pressure", keyed_job),
        (
            "checkpoints under back-pressure, two processes",
            keyed_job_two_processes,
        ),
    ];
    for (experiment, job) in pressured {
        for (implementation, mode) in [
            ("weir, aligned", Mode::Aligned),
            ("weir, unaligned", Mode::Unaligned),
            ("weir, aligned with buffer debloating", Mode::AlignedDebloat),
            ("weir, aligned with a 50 ms timeout", Mode::AlignedTimeout),
        ] {
            cases.push(Case {
                experiment,
                implementation,
                run: Box::new(move || job(pressured_records, SINK_SPIN, mode)),
            });
        }
    }
    cases.retain(|case| only.is_none_or(|only| case.experiment.contains(only)));
    let recoveries_too = only.is_none_or(|only| "recovery".contains(only));
    let keyed_wanted = only.is_none_or(|only| "keyed state snapshot".contains(only));
    if cases.is_empty() && !recoveries_too && !keyed_wanted {
        return Err(format!(
            "no experiment matches --only {}",
            only.unwrap_or_default()
        ));
    }
    let mut turns: Vec<Vec<Turn>> = cases.iter().map(|_| Vec::new()).collect();
    let mut recoveries = Vec::new();
    let mut kills: Vec<f64> = Vec::new();
    let mut experiments: Vec<&'static str> = cases.iter().map(|c| c.experiment).collect();
    experiments.dedup();
    for round in 0..rounds {
        for experiment in &experiments {
            let members: Vec<usize> = (0..cases.len())
                .filter(|&i| cases[i].experiment == *experiment)
                .collect();
            for k in 0..members.len() {
                let index = members[(k + round) % members.len()];
                let case = &cases[index];
                let turn = (case.run)()?;
                progress(&format!(
                    "round {}: {} / {}: {:.0} records/s",
                    round + 1,
                    case.experiment,
                    case.implementation,
                    turn.ops_per_s
                ));
                turns[index].push(turn);
            }
        }
        if !recoveries_too {
            continue;
        }
        let recovery = recovery((3_000_000.0 * scale).max(1_500_000.0) as u64)?;
        progress(&format!(
            "round {}: recovery {:.1} ms, {} records replayed",
            round + 1,
            ms(recovery.to_processing),
            recovery.replayed
        ));
        recoveries.push(recovery);
        let killed = main_job_kill_recovery()?;
        progress(&format!(
            "round {}: main job, kill -9 to processing again {:.1} ms",
            round + 1,
            ms(killed)
        ));
        kills.push(ms(killed));
    }
    let rows: Vec<Value> = cases
        .iter()
        .zip(&turns)
        .map(|(case, turns)| {
            let rates: Vec<f64> = turns.iter().map(|t| t.ops_per_s).collect();
            let samples = rates.clone();
            let cpu: Vec<f64> = turns.iter().filter_map(|t| t.cpu_ns_per_op).collect();
            let summaries: Vec<&CheckpointSummary> = turns
                .iter()
                .filter_map(|t| t.checkpoints.as_ref())
                .collect();
            // Every completed checkpoint of every round, pooled.
            let checkpoints = (!summaries.is_empty()).then(|| {
                let durations: Vec<f64> =
                    turns.iter().flat_map(|t| t.durations_ms.clone()).collect();
                let max = durations.iter().copied().fold(0.0, f64::max);
                let alignments: Vec<f64> =
                    turns.iter().flat_map(|t| t.alignments_ms.clone()).collect();
                let align_max = alignments.iter().copied().fold(0.0, f64::max);
                let persisted: Vec<f64> = turns
                    .iter()
                    .flat_map(|t| t.persisted_bytes.clone())
                    .collect();
                let in_flight: Vec<f64> = turns
                    .iter()
                    .flat_map(|t| t.in_flight_bytes.clone())
                    .collect();
                let in_exchange: Vec<f64> = turns
                    .iter()
                    .flat_map(|t| t.in_flight_bytes_total.clone())
                    .collect();
                json!({
                    "completed": summaries.iter().map(|s| s.completed).sum::<u64>(),
                    "failed": summaries.iter().map(|s| s.failed).sum::<u64>(),
                    "duration_ms": {
                        "p50": median(&durations),
                        "p99": rank_quantile(&durations, 0.99),
                        "max": max,
                    },
                    "alignment_ms": { "p50": median(&alignments), "max": align_max },
                    "persisted_bytes": {
                        "p50": median(&persisted),
                        "max": persisted.iter().copied().fold(0.0, f64::max),
                    },
                    "in_flight_bytes_channel": (!in_flight.is_empty()).then(|| json!({
                        "p50": median(&in_flight),
                        "max": in_flight.iter().copied().fold(0.0, f64::max),
                    })),
                    "in_flight_bytes_exchange": (!in_exchange.is_empty()).then(|| json!({
                        "p50": median(&in_exchange),
                        "max": in_exchange.iter().copied().fold(0.0, f64::max),
                    })),
                    "size_bytes_last": summaries.last().map(|s| s.last_size),
                })
            });
            json!({
                "experiment": case.experiment,
                "implementation": case.implementation,
                "ops_per_s": median(&rates),
                "samples_ops_per_s": samples,
                "cpu_ns_per_op": (!cpu.is_empty()).then(|| median(&cpu)),
                "checkpoints": checkpoints,
            })
        })
        .collect();
    let mut keyed = Vec::new();
    if keyed_wanted {
        for mb in [10.0, 100.0, 1000.0] {
            let entries = ((mb * scale * 1e6) as usize / KEYED_ENTRY_BYTES).max(1000);
            let figures = keyed_snapshot(entries, rounds.max(3))?;
            progress(&format!(
                "keyed state of {} MB: pause {:.1} µs, encoded in {:.1} ms off the worker \
                 ({:.1} ms on it)",
                figures.size_bytes / 1_000_000,
                median(&figures.view_us),
                median(&figures.encode_async_us) / 1e3,
                median(&figures.encode_sync_us) / 1e3
            ));
            keyed.push(json!({
                "size_bytes": figures.size_bytes,
                "entries": figures.entries,
                "pause_us": { "p50": median(&figures.view_us), "max": figures.view_us.iter().copied().fold(0.0, f64::max) },
                "writes_1pct_after_snapshot_us": median(&figures.writes_after_us),
                "writes_1pct_without_snapshot_us": median(&figures.writes_before_us),
                "writes_1pct_std_hashmap_us": median(&figures.writes_std_us),
                "encode_async_us": median(&figures.encode_async_us),
                "encode_sync_us": median(&figures.encode_sync_us),
            }));
        }
    }
    let to_processing: Vec<f64> = recoveries.iter().map(|r| ms(r.to_processing)).collect();
    let read: Vec<f64> = recoveries.iter().map(|r| ms(r.read)).collect();
    let replayed: Vec<f64> = recoveries.iter().map(|r| r.replayed as f64).collect();
    Ok(json!({
        "suite": "checkpoints",
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "machine": crate::compare::machine(),
        "rounds": rounds,
        "scale": scale,
        "interval_ms": ms(INTERVAL),
        "sink_spin_us": SINK_SPIN.as_secs_f64() * 1e6,
        "rows": rows,
        "main_job_kill_recovery_ms": {
            "p50": median(&kills),
            "max": kills.iter().copied().fold(0.0, f64::max),
            "samples": kills,
        },
        "keyed_snapshot": keyed,
        "recovery": {
            "to_processing_ms": { "p50": median(&to_processing), "max": to_processing.iter().copied().fold(0.0, f64::max), "samples": to_processing },
            "read_ms": { "p50": median(&read) },
            "replayed_records": { "p50": median(&replayed), "samples": replayed },
        },
    }))
}

/// The ceil(q·n)-th smallest of `samples` (None for none), as HdrHistogram ranks.
fn rank_quantile(samples: &[f64], q: f64) -> Option<f64> {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len().max(1)) - 1).copied()
}

/// The side a row belongs to: the implementation's first word ("weir", "flink").
fn side(row: &Value) -> &str {
    row["implementation"]
        .as_str()
        .and_then(|i| i.split([' ', ',']).next())
        .unwrap_or("?")
}

/// The figures as Markdown tables: Weir's rows (`value`) and, if given, Flink's rows of
/// the same experiments beside them; each side's throughput against its own run without
/// checkpoints.
pub fn render(value: &Value) -> String {
    render_with(value, None)
}

/// Flink's heap backend on the same keyed state (`flink["keyed"]`, from
/// `scripts/flink-peer.sh keyed`), beside Weir's pause of each size (`weir`: Weir's
/// keyed rows).
fn flink_keyed(weir: &[Value], flink: Option<&Value>) -> String {
    let Some(flink) = flink.filter(|f| !f.is_null()) else {
        return "\nApache Flink's heap backend on the same state: not measured in this run (`scripts/flink-peer.sh keyed`).\n".into();
    };
    if let Some(reason) = flink["unavailable"].as_str() {
        return format!("\nApache Flink's heap backend on the same state: not measured in this run: {reason}.\n");
    }
    // Median (the mean of the middle two of an even count, as the peer prints it) and
    // maximum.
    let stats = |v: &Value| -> Option<(f64, f64)> {
        let mut xs: Vec<f64> = v.as_array()?.iter().filter_map(Value::as_f64).collect();
        xs.sort_by(f64::total_cmp);
        let n = xs.len().checked_sub(1)?;
        Some(((xs[n / 2] + xs[n.div_ceil(2)]) / 2.0, xs[n]))
    };
    let ms = |v: Option<(f64, f64)>| {
        v.map_or("–".to_string(), |(p50, max)| {
            format!("{p50:.0} / {max:.0}")
        })
    };
    let mut out = format!(
        "\nApache Flink {} on the same state (`{}`): {}. Flink reports the parts in whole milliseconds, for checkpoints of the whole state (within 1% of the largest a run took). Its synchronous part is measured in a running job, under writes, and leaves out the barrier's own handling: it is a lower bound of the task's pause. Weir's pause is `snapshot_view` timed alone, outside a job (the table above). Flink's asynchronous part includes writing the checkpoint file; Weir's encoding off the worker does not.\n\n| state | checkpoints of the whole state | Flink synchronous part p50 / max (ms) | Weir `snapshot_view` p50 (ms) | Flink's ÷ Weir's | Flink asynchronous part p50 / max (ms) | Flink end to end p50 / max (ms) |\n|---:|---:|---:|---:|---:|---:|---:|\n",
        flink["flink"].as_str().unwrap_or("?"),
        flink["command"].as_str().unwrap_or("scripts/flink-peer.sh keyed"),
        flink["job"].as_str().unwrap_or("?"),
    );
    for row in flink["results"].as_array().into_iter().flatten() {
        let size = row["size_bytes"].as_u64().unwrap_or(0);
        let sync = stats(&row["sync_ms"]);
        let weir_pause_ms = weir
            .iter()
            .find(|w| w["size_bytes"].as_u64() == Some(size))
            .and_then(|w| w["pause_us"]["p50"].as_f64())
            .map(|us| us / 1e3);
        let ratio = match (sync, weir_pause_ms) {
            (Some((p50, _)), Some(weir)) if weir > 0.0 && p50 > 0.0 => {
                format!("{:.0}×", p50 / weir)
            }
            (Some((0.0, _)), Some(_)) => "below Flink's 1 ms resolution".into(),
            _ => "–".into(),
        };
        out.push_str(&format!(
            "| {} MB | {} | {} | {} | {ratio} | {} | {} |\n",
            size / 1_000_000,
            row["checkpoints"].as_u64().unwrap_or(0),
            ms(sync),
            weir_pause_ms.map_or("–".to_string(), |p| format!("{p:.4}")),
            ms(stats(&row["async_ms"])),
            ms(stats(&row["total_ms"])),
        ));
    }
    out
}

/// [`render`] with Flink's figures (`scripts/flink-peer.sh checkpoints`) beside Weir's.
pub fn render_with(value: &Value, flink: Option<&Value>) -> String {
    let mut out = String::new();
    let mut rows = value["rows"].as_array().cloned().unwrap_or_default();
    if let Some(flink) = flink {
        rows.extend(flink["results"].as_array().cloned().unwrap_or_default());
    }
    let mut experiments: Vec<String> = Vec::new();
    for row in &rows {
        if let Some(e) = row["experiment"].as_str() {
            if !experiments.iter().any(|x| x == e) {
                experiments.push(e.to_string());
            }
        }
    }
    let f = |v: &Value| v.as_f64().map_or("–".to_string(), |x| format!("{x:.1}"));
    if let Some(keyed) = value["keyed_snapshot"].as_array().filter(|k| !k.is_empty()) {
        out.push_str("\n### keyed state snapshot (one subtask)\n\n");
        out.push_str("| state | entries | task pause p50 / max (µs) | encoding off the worker (ms) | encoding on the worker, before views (ms) | 1% of keys written after a snapshot / without / into a std HashMap (ms) |\n|---:|---:|---:|---:|---:|---:|\n");
        for row in keyed {
            let ms_of = |v: &Value| {
                v.as_f64()
                    .map_or("–".to_string(), |x| format!("{:.1}", x / 1e3))
            };
            out.push_str(&format!(
                "| {} MB | {} | {} / {} | {} | {} | {} / {} / {} |\n",
                row["size_bytes"].as_u64().unwrap_or(0) / 1_000_000,
                row["entries"].as_u64().unwrap_or(0),
                f(&row["pause_us"]["p50"]),
                f(&row["pause_us"]["max"]),
                ms_of(&row["encode_async_us"]),
                ms_of(&row["encode_sync_us"]),
                ms_of(&row["writes_1pct_after_snapshot_us"]),
                ms_of(&row["writes_1pct_without_snapshot_us"]),
                ms_of(&row["writes_1pct_std_hashmap_us"]),
            ));
        }
        out.push_str(&flink_keyed(keyed, flink.map(|f| &f["keyed"])));
    }
    for experiment in experiments {
        out.push_str(&format!("\n### {experiment}\n\n"));
        out.push_str("| implementation | records/s | vs its run without checkpoints | CPU ns/record | checkpoints | duration p50 / p99 / max (ms) | alignment p50 / max (ms) | in-flight data persisted p50 / max (KiB) | in flight on the fullest input channel p50 / max (KiB) | in flight in the exchange p50 / max (KiB) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        let of_experiment: Vec<&Value> = rows
            .iter()
            .filter(|r| r["experiment"] == experiment.as_str())
            .collect();
        for row in &of_experiment {
            let base = of_experiment
                .iter()
                .find(|r| {
                    side(r) == side(row)
                        && r["implementation"]
                            .as_str()
                            .is_some_and(|i| i.contains("no checkpoints"))
                })
                .and_then(|r| r["ops_per_s"].as_f64());
            let rate = row["ops_per_s"].as_f64().unwrap_or(f64::NAN);
            let c = &row["checkpoints"];
            // "p50 / max" of one of the checkpoints' figures, each shown by `show`.
            let p50_max = |figure: &Value, show: &dyn Fn(&Value) -> String| {
                if figure.is_object() {
                    format!("{} / {}", show(&figure["p50"]), show(&figure["max"]))
                } else {
                    "–".to_string()
                }
            };
            let kib = |v: &Value| {
                v.as_f64()
                    .map_or("–".to_string(), |x| format!("{:.1}", x / 1024.0))
            };
            let alignment = p50_max(&c["alignment_ms"], &f);
            let persisted = p50_max(&c["persisted_bytes"], &kib);
            let in_flight = p50_max(&c["in_flight_bytes_channel"], &kib);
            let in_exchange = p50_max(&c["in_flight_bytes_exchange"], &kib);
            out.push_str(&format!(
                "| {} | {:.0} | {} | {} | {} | {} / {} / {} | {alignment} | {persisted} | {in_flight} | {in_exchange} |\n",
                row["implementation"].as_str().unwrap_or("?"),
                rate,
                base.map_or("–".to_string(), |b| format!("{:.3}", rate / b)),
                f(&row["cpu_ns_per_op"]),
                c["completed"]
                    .as_u64()
                    .map_or("–".to_string(), |n| n.to_string()),
                f(&c["duration_ms"]["p50"]),
                f(&c["duration_ms"]["p99"]),
                f(&c["duration_ms"]["max"]),
            ));
        }
    }
    let r = &value["recovery"];
    let measured = r["to_processing_ms"]["samples"]
        .as_array()
        .is_some_and(|s| !s.is_empty());
    if !measured {
        // Not run (`--only`).
        return out;
    }
    out.push_str(&format!(
        "\n### recovery (one process)\n\nThe main job killed with `kill -9` and started again with `--restore`, from the kill to the new process's first record at a sink: p50 {} ms, max {} ms.\n\n\
         A keyed job stopped in its process and restarted there, from the stop to the first record at the sink again: p50 {} ms, max {} ms \
         (reading the checkpoint: p50 {} ms); records replayed: p50 {}\n",
        f(&value["main_job_kill_recovery_ms"]["p50"]),
        f(&value["main_job_kill_recovery_ms"]["max"]),
        f(&r["to_processing_ms"]["p50"]),
        f(&r["to_processing_ms"]["max"]),
        f(&r["read_ms"]["p50"]),
        f(&r["replayed_records"]["p50"]),
    ));
    out
}

/// The targets against the figures: the main job's overhead (≤ 3%), unaligned
/// checkpoints under back-pressure (≤ 100 ms), recovery (≤ 1 s).
pub fn targets(value: &Value) -> Vec<String> {
    let rows = value["rows"].as_array().cloned().unwrap_or_default();
    let find = |experiment: &str, implementation: &str| {
        rows.iter()
            .find(|r| r["experiment"] == experiment && r["implementation"] == implementation)
            .cloned()
    };
    let mut lines = Vec::new();
    if let (Some(none), Some(with)) = (
        find(
            "checkpoint overhead (main job)",
            "weir main job, no checkpoints",
        ),
        find(
            "checkpoint overhead (main job)",
            "weir main job, aligned checkpoints every 1 s",
        ),
    ) {
        let rate = |r: &Value| r["ops_per_s"].as_f64().unwrap_or(f64::NAN);
        let cpu = |r: &Value| r["cpu_ns_per_op"].as_f64().unwrap_or(f64::NAN);
        lines.push(format!(
            "main job with 1 s checkpoints: throughput {:+.1}%, CPU per record {:+.1}% against no checkpoints (target: within 3%)",
            (rate(&with) / rate(&none) - 1.0) * 100.0,
            (cpu(&with) / cpu(&none) - 1.0) * 100.0,
        ));
    }
    if let Some(unaligned) = find("checkpoints under back-pressure", "weir, unaligned") {
        let d = &unaligned["checkpoints"]["duration_ms"];
        lines.push(format!(
            "unaligned checkpoints under back-pressure: p50 {:.1} ms, max {:.1} ms (target: ≤ 100 ms)",
            d["p50"].as_f64().unwrap_or(f64::NAN),
            d["max"].as_f64().unwrap_or(f64::NAN),
        ));
    }
    let r = &value["main_job_kill_recovery_ms"];
    if let Some(p50) = r["p50"].as_f64() {
        lines.push(format!(
            "the main job after kill -9, to processing again in a new process: p50 {p50:.1} ms, max {:.1} ms (target: ≤ 1 s)",
            r["max"].as_f64().unwrap_or(f64::NAN)
        ));
    }
    lines
}
