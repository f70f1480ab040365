//! The job's closing table and its JSON.

use super::*;

use std::time::Duration;

use serde_json::{json, Value};
use weir_engine::async_io::{AsyncError, OperatorError};
use weir_engine::runtime::{RuntimeError, Wakeups};
use weir_net::lookup::format_duration;

/// Why `weir run` cannot run, or why its job stopped: each message says what to change.
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
            "{} notified, {} I/O, {} deadline, {} idle ({} rescued) (over {} parks, {} of \
             them returning before a sleep); {} timer-slack sleeps",
            wakeups.notified,
            wakeups.io,
            wakeups.deadline,
            wakeups.idle,
            wakeups.rescued,
            report.run.parks.iter().sum::<u64>(),
            wakeups.pending,
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
            "slack": w.slack, "pending": w.pending,
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
