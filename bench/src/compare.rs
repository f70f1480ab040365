//! Interleaved side-by-side comparison of Weir and its peers.
//!
//! This VM's host moves vCPUs between physical cores, so cross-core figures swing 3–5×
//! between and within runs. A fair comparison therefore runs Weir and each peer in short
//! turns, alternating, over several rounds in one process, and quotes medians and the
//! ratio of medians. The starting implementation rotates each round so no one always
//! runs first.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{json, Value};
use weir_engine::async_io::OutputMode;

use crate::async_peers::{self, Measurement};
use crate::exchange_peers::{self, Routing};
use crate::lookup_peers;
use crate::{pool_peers, ring_peers};
use weir_net::lookup::Latency;
use weir_net::DriverKind;

/// A workload: runs `n` operations.
pub type Workload = Arc<dyn Fn(u64) -> Measurement + Send + Sync>;

/// One implementation of one experiment.
#[derive(Clone)]
pub struct Case {
    /// Experiment name, shared by Weir and its peers.
    pub experiment: &'static str,
    /// Implementation name.
    pub implementation: &'static str,
    /// Whether this is Weir's side (the others are compared against it).
    pub is_weir: bool,
    /// Operations per turn.
    pub ops: u64,
    /// Runs `ops` operations.
    pub run: Workload,
    /// The physical limit in operations per second, if the experiment has one (e.g.
    /// Little's law: capacity ÷ latency).
    pub limit_ops_per_s: Option<f64>,
}

/// Medians over the rounds for one case.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Experiment name.
    pub experiment: &'static str,
    /// Implementation name.
    pub implementation: &'static str,
    /// Whether this is Weir's side.
    pub is_weir: bool,
    /// Nanoseconds per operation, one per round.
    pub samples_ns: Vec<f64>,
    /// Per-operation latency over all rounds, if the workload records one.
    pub latency_ns: Option<Histogram<u64>>,
    /// The physical limit in operations per second, if any.
    pub limit_ops_per_s: Option<f64>,
}

impl Summary {
    /// Median ns per operation.
    pub fn median_ns(&self) -> f64 {
        let mut sorted = self.samples_ns.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        if n == 0 {
            return f64::NAN;
        }
        if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        }
    }

    /// Fastest round.
    pub fn min_ns(&self) -> f64 {
        self.samples_ns
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min)
    }

    /// Slowest round.
    pub fn max_ns(&self) -> f64 {
        self.samples_ns.iter().copied().fold(0.0, f64::max)
    }
}

fn case(
    experiment: &'static str,
    implementation: &'static str,
    ops: f64,
    run: fn(u64) -> Duration,
) -> Case {
    workload(
        experiment,
        implementation,
        ops,
        Arc::new(move |n| run(n).into()),
        None,
    )
}

fn workload(
    experiment: &'static str,
    implementation: &'static str,
    ops: f64,
    run: Workload,
    limit_ops_per_s: Option<f64>,
) -> Case {
    Case {
        experiment,
        implementation,
        is_weir: implementation.starts_with("weir"),
        ops: (ops as u64).max(1),
        run,
        limit_ops_per_s,
    }
}

/// The async operator experiments: latency-0 overhead, other-thread completion, and
/// timer-driven latency against Little's limit, with tokio + futures as the peer.
pub fn async_cases(scale: f64) -> Vec<Case> {
    let immediate = 2_000_000.0 * scale;
    let mut cases = Vec::new();
    let modes = [
        (
            "async latency 0, capacity 100, ordered",
            OutputMode::Ordered,
            "weir ordered",
            true,
            "tokio buffered",
        ),
        (
            "async latency 0, capacity 100, unordered",
            OutputMode::Unordered,
            "weir unordered",
            false,
            "tokio buffer_unordered",
        ),
        (
            "async latency 0, capacity 100, keyed-ordered",
            OutputMode::KeyedOrdered,
            "weir keyed-ordered",
            true,
            "tokio buffered",
        ),
    ];
    for (experiment, mode, weir, ordered, tokio) in modes {
        cases.push(workload(
            experiment,
            weir,
            immediate,
            Arc::new(move |n| async_peers::weir_immediate(mode, 100, n)),
            None,
        ));
        cases.push(workload(
            experiment,
            tokio,
            immediate,
            Arc::new(move |n| async_peers::tokio_immediate(ordered, 100, n)),
            None,
        ));
    }
    let cross = 300_000.0 * scale;
    for (mode, name) in [
        (OutputMode::Ordered, "weir ordered"),
        (OutputMode::Unordered, "weir unordered"),
        (OutputMode::KeyedOrdered, "weir keyed-ordered"),
    ] {
        cases.push(workload(
            "async completed on another thread, capacity 100",
            name,
            cross,
            Arc::new(move |n| async_peers::weir_cross_thread(mode, 100, n)),
            None,
        ));
    }
    let timers: [(&'static str, u64, usize); 4] = [
        ("async unordered, latency 1 ms, capacity 10", 1, 10),
        ("async unordered, latency 1 ms, capacity 100", 1, 100),
        ("async unordered, latency 1 ms, capacity 1000", 1, 1000),
        ("async unordered, latency 10 ms, capacity 1000", 10, 1000),
    ];
    for (experiment, latency_ms, capacity) in timers {
        let latency = Duration::from_millis(latency_ms);
        let limit = capacity as f64 / latency.as_secs_f64();
        let ops = (limit * 0.25 * scale).max(capacity as f64 * 4.0);
        cases.push(workload(
            experiment,
            "weir unordered",
            ops,
            Arc::new(move |n| async_peers::weir_timer(OutputMode::Unordered, capacity, latency, n)),
            Some(limit),
        ));
        cases.push(workload(
            experiment,
            "tokio buffer_unordered",
            ops,
            Arc::new(move |n| async_peers::tokio_timer(false, capacity, latency, n)),
            Some(limit),
        ));
    }
    let latency = Duration::from_millis(1);
    cases.push(workload(
        "async ordered, latency 1 ms, capacity 1000",
        "weir ordered",
        250_000.0 * scale,
        Arc::new(move |n| async_peers::weir_timer(OutputMode::Ordered, 1000, latency, n)),
        Some(1_000_000.0),
    ));
    cases.push(workload(
        "async ordered, latency 1 ms, capacity 1000",
        "tokio buffered",
        250_000.0 * scale,
        Arc::new(move |n| async_peers::tokio_timer(true, 1000, latency, n)),
        Some(1_000_000.0),
    ));
    cases
}

/// The exchange experiments: records/s and latency through writer → channel → gate,
/// against a crossbeam channel of records and the single-thread memcpy ceiling.
pub fn exchange_cases(scale: f64) -> Vec<Case> {
    let mut cases = Vec::new();
    let timeout = Some(Duration::from_millis(100));
    macro_rules! one_to_one {
        ($experiment:expr, $n:literal, $ops:expr) => {{
            let ops = $ops * scale;
            cases.push(workload(
                $experiment,
                "weir exchange",
                ops,
                Arc::new(move |n| {
                    exchange_peers::weir_exchange::<$n>(1, 1, Routing::RoundRobin, timeout, n)
                }),
                None,
            ));
            cases.push(workload(
                $experiment,
                "crossbeam_channel",
                ops,
                Arc::new(move |n| exchange_peers::crossbeam_channel::<$n>(n)),
                None,
            ));
            // Weir frames each record with a 4-byte length prefix.
            cases.push(workload(
                $experiment,
                "memcpy ceiling (one thread)",
                ops,
                Arc::new(move |n| exchange_peers::memcpy_ceiling($n, n)),
                None,
            ));
        }};
    }
    one_to_one!(
        "exchange 1→1, 8-byte records, round robin, timeout 100 ms",
        8,
        4_000_000.0
    );
    one_to_one!(
        "exchange 1→1, 100-byte records, round robin, timeout 100 ms",
        100,
        2_000_000.0
    );
    one_to_one!(
        "exchange 1→1, 1000-byte records, round robin, timeout 100 ms",
        1000,
        500_000.0
    );
    let ops = 1_000_000.0 * scale;
    cases.push(workload(
        "exchange 1→2, 100-byte records, key hash, timeout 100 ms",
        "weir exchange",
        ops,
        Arc::new(move |n| exchange_peers::weir_exchange::<100>(1, 2, Routing::KeyHash, timeout, n)),
        None,
    ));
    cases.push(workload(
        "exchange 2→2, 100-byte records, round robin, timeout 100 ms",
        "weir exchange",
        ops,
        Arc::new(move |n| {
            exchange_peers::weir_exchange::<100>(2, 2, Routing::RoundRobin, timeout, n)
        }),
        None,
    ));
    cases.push(workload(
        "exchange 1→1, 100-byte records, round robin, timeout 0",
        "weir exchange",
        ops / 4.0,
        Arc::new(move |n| {
            exchange_peers::weir_exchange::<100>(1, 1, Routing::RoundRobin, Some(Duration::ZERO), n)
        }),
        None,
    ));
    let rate = 10_000u64;
    cases.push(workload(
        "exchange latency, open loop 10 k records/s, 100-byte records, timeout 0",
        "weir exchange",
        (rate as f64 * 0.5 * scale).max(1000.0),
        Arc::new(move |n| exchange_peers::weir_open_loop::<100>(rate, n)),
        Some(rate as f64),
    ));
    cases
}

/// The lookup experiments: lookups per second on one worker against the embedded
/// service (pinned to the other core), through the async operator with each driver,
/// through a tokio client, and the raw socket ceiling; and the 1 ms closed loop.
pub fn lookup_cases(scale: f64) -> Vec<Case> {
    fn with_service(
        latency: Latency,
        run: impl Fn(std::net::SocketAddr, u64) -> Measurement + Send + Sync + 'static,
    ) -> Workload {
        Arc::new(move |n| {
            let server = lookup_peers::service(latency);
            let measured = run(server.addr(), n);
            drop(server);
            measured
        })
    }
    let zero = Latency::Fixed(Duration::ZERO);
    let uring = weir_net::build_driver(DriverKind::Uring).is_ok();
    let driver = if uring {
        DriverKind::Uring
    } else {
        DriverKind::Epoll
    };
    let mut cases = Vec::new();
    let sweeps: [(&'static str, usize, f64); 4] = [
        ("lookup latency 0, 1 in flight", 1, 5_000.0),
        ("lookup latency 0, 16 in flight", 16, 100_000.0),
        ("lookup latency 0, 256 in flight", 256, 400_000.0),
        ("lookup latency 0, 1024 in flight", 1024, 400_000.0),
    ];
    for (experiment, c, ops) in sweeps {
        let ops = ops * scale;
        if uring {
            cases.push(workload(
                experiment,
                "weir io_uring",
                ops,
                with_service(zero, move |a, n| {
                    lookup_peers::weir(DriverKind::Uring, a, c, n)
                }),
                None,
            ));
        }
        cases.push(workload(
            experiment,
            "weir epoll",
            ops,
            with_service(zero, move |a, n| {
                lookup_peers::weir(DriverKind::Epoll, a, c, n)
            }),
            None,
        ));
        cases.push(workload(
            experiment,
            "tokio client",
            ops,
            with_service(zero, move |a, n| lookup_peers::tokio(a, c, n)),
            None,
        ));
        cases.push(workload(
            experiment,
            "raw ceiling (no operator)",
            ops,
            with_service(zero, move |a, n| lookup_peers::raw(a, c, n)),
            None,
        ));
    }
    let one_ms = Latency::Fixed(Duration::from_millis(1));
    let limit = 1024.0 / 1e-3;
    let ops = 500_000.0 * scale;
    cases.push(workload(
        "lookup latency 1 ms, 1024 in flight",
        if uring { "weir io_uring" } else { "weir epoll" },
        ops,
        with_service(one_ms, move |a, n| lookup_peers::weir(driver, a, 1024, n)),
        Some(limit),
    ));
    cases.push(workload(
        "lookup latency 1 ms, 1024 in flight",
        "tokio client",
        ops,
        with_service(one_ms, |a, n| lookup_peers::tokio(a, 1024, n)),
        Some(limit),
    ));
    cases
}

/// The ring experiments (issue: streaming single and batched, round trip), scaled.
pub fn ring_cases(scale: f64) -> Vec<Case> {
    use ring_peers::*;
    let stream_ops = 4_000_000.0 * scale;
    let trips = 100_000.0 * scale;
    vec![
        case(
            "ring streaming, one at a time (u64, capacity 1024)",
            Weir::NAME,
            stream_ops,
            stream::<Weir>,
        ),
        case(
            "ring streaming, one at a time (u64, capacity 1024)",
            Rtrb::NAME,
            stream_ops,
            stream::<Rtrb>,
        ),
        case(
            "ring streaming, one at a time (u64, capacity 1024)",
            ArrayQueue::NAME,
            stream_ops,
            stream::<ArrayQueue>,
        ),
        case(
            "ring streaming, one at a time (u64, capacity 1024)",
            StdSync::NAME,
            stream_ops / 4.0,
            stream::<StdSync>,
        ),
        case(
            "ring streaming, batches of 64",
            Weir::NAME,
            stream_ops * 2.0,
            stream_batched::<Weir>,
        ),
        case(
            "ring streaming, batches of 64",
            Rtrb::NAME,
            stream_ops * 2.0,
            stream_batched::<Rtrb>,
        ),
        case(
            "ring ping-pong round trip",
            Weir::NAME,
            trips,
            round_trip::<Weir>,
        ),
        case(
            "ring ping-pong round trip",
            Rtrb::NAME,
            trips,
            round_trip::<Rtrb>,
        ),
        case(
            "ring ping-pong round trip",
            ArrayQueue::NAME,
            trips,
            round_trip::<ArrayQueue>,
        ),
        case(
            "ring ping-pong round trip",
            StdSync::NAME,
            trips / 4.0,
            round_trip::<StdSync>,
        ),
    ]
}

/// The pool experiments (acquire + recycle on one thread and across threads), scaled.
pub fn pool_cases(scale: f64) -> Vec<Case> {
    use pool_peers::*;
    let single = 4_000_000.0 * scale;
    let cross = 500_000.0 * scale;
    vec![
        case(
            "pool acquire+recycle, one thread",
            Weir::NAME,
            single,
            single_thread::<Weir>,
        ),
        case(
            "pool acquire+recycle, one thread",
            MutexPool::NAME,
            single,
            single_thread::<MutexPool>,
        ),
        case(
            "pool acquire+recycle, one thread",
            ArrayQueuePool::NAME,
            single,
            single_thread::<ArrayQueuePool>,
        ),
        case(
            "pool acquire here, recycle on the other core",
            Weir::NAME,
            cross,
            cross_thread::<Weir>,
        ),
        case(
            "pool acquire here, recycle on the other core",
            MutexPool::NAME,
            cross,
            cross_thread::<MutexPool>,
        ),
        case(
            "pool acquire here, recycle on the other core",
            ArrayQueuePool::NAME,
            cross,
            cross_thread::<ArrayQueuePool>,
        ),
    ]
}

/// Runs every case of each experiment in turns, `rounds` times, rotating the order.
/// `progress` is told each finished turn.
pub fn run(cases: &[Case], rounds: usize, mut progress: impl FnMut(&Case, f64)) -> Vec<Summary> {
    let mut summaries: Vec<Summary> = cases
        .iter()
        .map(|c| Summary {
            experiment: c.experiment,
            implementation: c.implementation,
            is_weir: c.is_weir,
            samples_ns: Vec::with_capacity(rounds),
            latency_ns: None,
            limit_ops_per_s: c.limit_ops_per_s,
        })
        .collect();
    let mut experiments: Vec<&'static str> = cases.iter().map(|c| c.experiment).collect();
    experiments.dedup();
    for round in 0..rounds {
        for experiment in &experiments {
            let members: Vec<usize> = (0..cases.len())
                .filter(|&i| cases[i].experiment == *experiment)
                .collect();
            for k in 0..members.len() {
                let index = members[(k + round) % members.len()];
                let c = &cases[index];
                let measured = (c.run)(c.ops);
                let ns = measured.elapsed.as_nanos() as f64 / c.ops as f64;
                let summary = &mut summaries[index];
                summary.samples_ns.push(ns);
                if let Some(latency) = measured.latency_ns {
                    match &mut summary.latency_ns {
                        Some(all) => all.add(&latency).expect("histograms share bounds"),
                        None => summary.latency_ns = Some(latency),
                    }
                }
                progress(c, ns);
            }
        }
    }
    summaries
}

/// A Markdown table per experiment: median ns/op, million ops/s, range, and each
/// peer's time over Weir's (above 1: Weir is faster).
pub fn render(summaries: &[Summary]) -> String {
    let mut out = String::new();
    let mut experiments: Vec<&'static str> = summaries.iter().map(|s| s.experiment).collect();
    experiments.dedup();
    for experiment in experiments {
        let rows: Vec<&Summary> = summaries
            .iter()
            .filter(|s| s.experiment == experiment)
            .collect();
        let weir = rows.iter().find(|s| s.is_weir).map(|s| s.median_ns());
        let _ = writeln!(out, "\n### {experiment}\n");
        let _ = writeln!(
            out,
            "| implementation | median ns/op | M ops/s | min–max ns/op | peer ÷ weir time | of limit | p50 / p99 / p99.9 / max µs |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
        for s in rows {
            let median = s.median_ns();
            let ratio = match weir {
                Some(w) if !s.is_weir => format!("{:.2}×", median / w),
                _ => "—".to_string(),
            };
            let fraction = match s.limit_ops_per_s {
                Some(limit) => format!("{:.1}%", 1e9 / median / limit * 100.0),
                None => "—".to_string(),
            };
            let latency = match &s.latency_ns {
                Some(h) => format!(
                    "{:.0} / {:.0} / {:.0} / {:.0}",
                    h.value_at_quantile(0.5) as f64 / 1e3,
                    h.value_at_quantile(0.99) as f64 / 1e3,
                    h.value_at_quantile(0.999) as f64 / 1e3,
                    h.max() as f64 / 1e3
                ),
                None => "—".to_string(),
            };
            let _ = writeln!(
                out,
                "| {} | {:.1} | {:.3} | {:.1}–{:.1} | {} | {} | {} |",
                s.implementation,
                median,
                1e3 / median,
                s.min_ns(),
                s.max_ns(),
                ratio,
                fraction,
                latency
            );
        }
    }
    out
}

/// The same figures as JSON, with the machine and the command.
pub fn to_json(summaries: &[Summary], command: &str, rounds: usize) -> Value {
    let rows: Vec<Value> = summaries
        .iter()
        .map(|s| {
            let weir = summaries
                .iter()
                .find(|w| w.is_weir && w.experiment == s.experiment)
                .map(Summary::median_ns);
            json!({
                "experiment": s.experiment,
                "implementation": s.implementation,
                "is_weir": s.is_weir,
                "median_ns_per_op": s.median_ns(),
                "min_ns_per_op": s.min_ns(),
                "max_ns_per_op": s.max_ns(),
                "samples_ns_per_op": s.samples_ns,
                "peer_over_weir": weir.filter(|_| !s.is_weir).map(|w| s.median_ns() / w),
                "limit_ops_per_s": s.limit_ops_per_s,
                "fraction_of_limit": s.limit_ops_per_s.map(|l| 1e9 / s.median_ns() / l),
                "latency_ns": s.latency_ns.as_ref().map(|h| json!({
                    "p50": h.value_at_quantile(0.5),
                    "p90": h.value_at_quantile(0.9),
                    "p99": h.value_at_quantile(0.99),
                    "p99.9": h.value_at_quantile(0.999),
                    "max": h.max(),
                    "count": h.len(),
                })),
            })
        })
        .collect();
    json!({ "command": command, "rounds": rounds, "machine": machine(), "results": rows })
}

/// CPU model, cores and kernel of this machine.
pub fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    json!({ "cpu": cpu, "cores": cores, "kernel": kernel })
}
