//! Interleaved side-by-side comparison of Weir and its peers.
//!
//! This VM's host moves vCPUs between physical cores, so cross-core figures swing 3–5×
//! between and within runs. A fair comparison therefore runs Weir and each peer in short
//! turns, alternating, over several rounds in one process, and quotes medians and the
//! ratio of medians. The starting implementation rotates each round so no one always
//! runs first.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Value};

use crate::{pool_peers, ring_peers};

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
    /// Runs `ops` operations and returns the elapsed time.
    pub run: fn(u64) -> Duration,
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
    Case {
        experiment,
        implementation,
        is_weir: implementation.starts_with("weir"),
        ops: (ops as u64).max(1),
        run,
    }
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
                let elapsed = (c.run)(c.ops);
                let ns = elapsed.as_nanos() as f64 / c.ops as f64;
                summaries[index].samples_ns.push(ns);
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
            "| implementation | median ns/op | M ops/s | min–max ns/op | peer ÷ weir time |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|");
        for s in rows {
            let median = s.median_ns();
            let ratio = match weir {
                Some(w) if !s.is_weir => format!("{:.2}×", median / w),
                _ => "—".to_string(),
            };
            let _ = writeln!(
                out,
                "| {} | {:.1} | {:.1} | {:.1}–{:.1} | {} |",
                s.implementation,
                median,
                1e3 / median,
                s.min_ns(),
                s.max_ns(),
                ratio
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
