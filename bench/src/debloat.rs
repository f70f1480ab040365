//! `weir debloat`: buffer debloating shown on a back-pressured exchange.
//!
//! A producer writes 100-byte records 1→1 as fast as its pool allows to a consumer
//! that reads at a fixed, slow rate (a slow operator): the producer is back-pressured
//! and its pool fills with buffers waiting to be read. Every `marker` interval the
//! producer puts a checkpoint-like marker in band (a watermark carrying its send
//! time); the consumer notes how long it waited behind the bytes in flight. The same
//! run with debloating on (the gate sizes buffers so the bytes in flight take about
//! `target` to read) shows the bytes in flight and the marker's wait shrink.
//!
//! A last run, at buffer timeout 0 with a producer slower than its consumer, reports
//! how many segments the subpartition holds (buffers read while written: at most two
//! when the consumer keeps up; a back-pressured one fills the pool, as it should).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{json, Value};
use weir_engine::exchange::codec::FixedBytes;
use weir_engine::exchange::{
    local_channel, DebloatConfig, Forward, GateEvent, InputChannel, InputGate, LocalBufferPool,
    LocalPoolConfig, NetworkBufferPool, RecordWriter, ResultPartition, WriterConfig,
};
use weir_engine::limits::SEGMENT_SIZE_DEFAULT;

use crate::affinity::{bench_cores, pin, StartLine};
use crate::async_peers::histogram;

/// Bytes of a record on the wire (4 of length prefix).
const RECORD_BYTES: u64 = 104;
/// Bytes of a watermark on the wire.
const MARKER_BYTES: u64 = 12;

/// What `weir debloat` runs.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Records per second the consumer reads.
    pub rate: u64,
    /// Length of each run.
    pub duration: Duration,
    /// Measurements start this long into a run (the debloater settles first).
    pub warm_up: Duration,
    /// Segments of the producer's pool (all may be in flight to the one channel).
    pub segments: usize,
    /// Interval between markers.
    pub marker: Duration,
    /// The debloater's settings (its `buffers_per_channel` is `segments`).
    pub debloat: DebloatConfig,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            rate: 10_000,
            duration: Duration::from_secs(4),
            warm_up: Duration::from_secs(2),
            segments: 16,
            marker: Duration::from_millis(50),
            debloat: DebloatConfig {
                target: Duration::from_millis(200),
                period: Duration::from_millis(50),
                samples: 5,
                ..DebloatConfig::new(16)
            },
        }
    }
}

/// The figures of one back-pressured run.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Whether the gate debloated.
    pub debloat: bool,
    /// The buffer size announced last (0: none).
    pub announced_size: u64,
    /// Bytes written and not yet read, sampled about every millisecond after warm-up.
    pub in_flight_mean: f64,
    /// Their maximum.
    pub in_flight_max: u64,
    /// How long markers waited behind the data, in ns.
    pub marker_wait_ns: Histogram<u64>,
    /// Records the consumer read per second (the whole run).
    pub records_per_s: f64,
}

/// Runs the producer against the slow consumer, with or without debloating.
pub fn back_pressured(settings: &Settings, debloat: bool) -> Outcome {
    let network =
        NetworkBufferPool::new(settings.segments + 8, SEGMENT_SIZE_DEFAULT).expect("network pool");
    let config =
        LocalPoolConfig::new(settings.segments, 1).with_max_per_subpartition(settings.segments);
    let pool = LocalBufferPool::new(&network, config).expect("pool");
    let (sender, receiver) = local_channel(settings.segments + 8, None);
    let partition = ResultPartition::new(pool, vec![sender]).expect("partition");
    let mut writer =
        RecordWriter::new(partition, Forward, WriterConfig::default()).expect("writer");
    let mut gate: InputGate<FixedBytes<100>> =
        InputGate::new(vec![Box::new(receiver) as Box<dyn InputChannel>]).expect("gate");
    if debloat {
        let config = DebloatConfig {
            buffers_per_channel: settings.segments,
            ..settings.debloat
        };
        gate.set_debloat(config)
            .expect("debloat settings checked by the caller");
    }
    let written = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let epoch = Instant::now();
    let ns = move || epoch.elapsed().as_nanos() as u64;
    let (core_a, core_b) = bench_cores();
    let producer = {
        let written = Arc::clone(&written);
        let stop = Arc::clone(&stop);
        let marker_ns = settings.marker.as_nanos() as u64;
        std::thread::spawn(move || {
            pin(core_a);
            let record = FixedBytes([3u8; 100]);
            let mut next_marker = marker_ns;
            while !stop.load(Ordering::Relaxed) {
                let now = ns();
                if !writer.poll_ready(now).expect("writer") {
                    // Back-pressured: the benchmark's pool has no notify; sleep a little.
                    std::thread::sleep(Duration::from_micros(200));
                    writer.on_timer(ns()).expect("timer");
                    continue;
                }
                if now >= next_marker {
                    writer.emit_watermark(now as i64, now).expect("marker");
                    next_marker = now + marker_ns;
                } else {
                    writer.emit(&record, now).expect("emit");
                }
                writer.on_timer(now).expect("timer");
                // Relaxed: a gauge, read approximately.
                written.store(writer.metrics().partition.bytes_out, Ordering::Relaxed);
            }
            drop(writer);
        })
    };
    pin(core_b);
    let warm_up_ns = settings.warm_up.as_nanos() as u64;
    let end_ns = settings.duration.as_nanos() as u64;
    let interval_ns = 1_000_000_000 / settings.rate.max(1);
    let mut records = 0u64;
    let mut read_bytes = 0u64;
    let mut waits = histogram();
    let mut in_flight_sum = 0f64;
    let mut in_flight_samples = 0u64;
    let mut in_flight_max = 0u64;
    loop {
        let now = ns();
        if now >= end_ns {
            break;
        }
        // The slow operator: `rate` records per second, caught up in batches.
        let due = now / interval_ns;
        while records < due {
            match gate.poll_next_at(ns()).expect("gate") {
                Some(GateEvent::Record { .. }) => {
                    records += 1;
                    read_bytes += RECORD_BYTES;
                }
                Some(GateEvent::Watermark(sent)) => {
                    read_bytes += MARKER_BYTES;
                    let at = ns();
                    if at >= warm_up_ns {
                        waits.saturating_record(at.saturating_sub(sent as u64).max(1));
                    }
                }
                Some(GateEvent::End) | None => break,
                Some(GateEvent::Barrier { .. } | GateEvent::CheckpointAborted { .. }) => {
                    unreachable!("no checkpoints in this measurement")
                }
            }
        }
        if now >= warm_up_ns {
            let in_flight = written.load(Ordering::Relaxed).saturating_sub(read_bytes);
            in_flight_sum += in_flight as f64;
            in_flight_samples += 1;
            in_flight_max = in_flight_max.max(in_flight);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    let elapsed = epoch.elapsed();
    producer.join().expect("producer");
    Outcome {
        debloat,
        announced_size: gate.metrics().announced_buffer_size,
        in_flight_mean: in_flight_sum / in_flight_samples.max(1) as f64,
        in_flight_max,
        marker_wait_ns: waits,
        records_per_s: records as f64 / elapsed.as_secs_f64(),
    }
}

/// Segments one subpartition held, at buffer timeout 0, with the producer writing
/// `rate` records per second (open loop, in bursts of 64) to a consumer that keeps up:
/// (mean and peak seen when starting buffers, records/s achieved).
pub fn steady_segments(records: u64, rate: u64) -> (f64, u64, f64) {
    let segments = 64;
    let network = NetworkBufferPool::new(segments + 8, SEGMENT_SIZE_DEFAULT).expect("pool");
    let config = LocalPoolConfig::new(segments, 1).with_max_per_subpartition(segments);
    let pool = LocalBufferPool::new(&network, config).expect("pool");
    let (sender, receiver) = local_channel(segments + 8, None);
    let partition = ResultPartition::new(pool, vec![sender]).expect("partition");
    let config = WriterConfig {
        buffer_timeout: Some(Duration::ZERO),
        ..WriterConfig::default()
    };
    let mut writer = RecordWriter::new(partition, Forward, config).expect("writer");
    let (core_a, core_b) = bench_cores();
    let line = StartLine::new(2);
    let consumer_line = Arc::clone(&line);
    let consumer = std::thread::spawn(move || {
        pin(core_b);
        consumer_line.wait();
        let mut gate: InputGate<FixedBytes<100>> =
            InputGate::new(vec![Box::new(receiver) as Box<dyn InputChannel>]).expect("gate");
        let mut count = 0u64;
        loop {
            match gate.poll_next().expect("gate") {
                Some(GateEvent::Record { .. }) => count += 1,
                Some(GateEvent::End) => return count,
                _ => std::hint::spin_loop(),
            }
        }
    });
    pin(core_a);
    line.wait();
    let start = Instant::now();
    let record = FixedBytes([1u8; 100]);
    let interval_ns = 1_000_000_000 / rate.max(1);
    for seq in 0..records {
        if seq % 64 == 0 {
            while (start.elapsed().as_nanos() as u64) < seq * interval_ns {
                std::hint::spin_loop();
            }
        }
        while !writer.poll_ready(0).expect("writer") {
            std::thread::yield_now();
        }
        writer.emit(&record, 0).expect("emit");
    }
    while !writer.poll_ready(0).expect("writer") {
        std::thread::yield_now();
    }
    writer.finish(0).expect("finish");
    while !writer.resume(0).expect("resume") {
        std::thread::yield_now();
    }
    let read = consumer.join().expect("consumer");
    assert_eq!(read, records, "records lost");
    let elapsed = start.elapsed();
    let metrics = writer.metrics().partition;
    (
        metrics.segments_held_total as f64 / metrics.segments_held_samples.max(1) as f64,
        metrics.segments_per_channel_peak,
        records as f64 / elapsed.as_secs_f64(),
    )
}

fn percentile_ms(histogram: &Histogram<u64>, q: f64) -> f64 {
    if histogram.is_empty() {
        return f64::NAN;
    }
    histogram.value_at_quantile(q) as f64 / 1e6
}

/// The runs as a table.
pub fn render(settings: &Settings, outcomes: &[Outcome], steady: (f64, u64, f64)) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "consumer {} records/s of 100 bytes, pool {} segments of 32 KiB, a marker every {} ms; \
         debloating: target {} ms, period {} ms, {} samples, threshold {} %, min {} bytes\n\n",
        settings.rate,
        settings.segments,
        settings.marker.as_millis(),
        settings.debloat.target.as_millis(),
        settings.debloat.period.as_millis(),
        settings.debloat.samples,
        settings.debloat.threshold_percent,
        settings.debloat.min_size,
    ));
    out.push_str("| debloating | buffer size | in flight mean / max KiB | marker wait p50 / p99 / max ms | records/s |\n");
    out.push_str("|---|---:|---:|---:|---:|\n");
    for o in outcomes {
        let size = if o.announced_size == 0 {
            format!("{SEGMENT_SIZE_DEFAULT} (segment)")
        } else {
            o.announced_size.to_string()
        };
        out.push_str(&format!(
            "| {} | {size} | {:.0} / {:.0} | {:.0} / {:.0} / {:.0} | {:.0} |\n",
            if o.debloat { "on" } else { "off" },
            o.in_flight_mean / 1024.0,
            o.in_flight_max as f64 / 1024.0,
            percentile_ms(&o.marker_wait_ns, 0.5),
            percentile_ms(&o.marker_wait_ns, 0.99),
            percentile_ms(&o.marker_wait_ns, 1.0),
            o.records_per_s,
        ));
    }
    out.push_str(&format!(
        "\nbuffer timeout 0, a consumer that keeps up ({:.1} M records/s): {:.2} segments per channel on average, {} at most\n",
        steady.2 / 1e6,
        steady.0,
        steady.1,
    ));
    out
}

/// The runs as JSON for the report.
pub fn to_json(
    settings: &Settings,
    outcomes: &[Outcome],
    steady: (f64, u64, f64),
    command: &str,
) -> Value {
    json!({
        "command": command,
        "rate": settings.rate,
        "segments": settings.segments,
        "marker_ms": settings.marker.as_millis() as u64,
        "target_ms": settings.debloat.target.as_millis() as u64,
        "period_ms": settings.debloat.period.as_millis() as u64,
        "samples": settings.debloat.samples,
        "runs": outcomes.iter().map(|o| json!({
            "debloat": o.debloat,
            "announced_size": o.announced_size,
            "in_flight_mean_bytes": o.in_flight_mean,
            "in_flight_max_bytes": o.in_flight_max,
            "marker_wait_ms": {
                "p50": percentile_ms(&o.marker_wait_ns, 0.5),
                "p99": percentile_ms(&o.marker_wait_ns, 0.99),
                "max": percentile_ms(&o.marker_wait_ns, 1.0),
            },
            "markers": o.marker_wait_ns.len(),
            "records_per_s": o.records_per_s,
        })).collect::<Vec<_>>(),
        "steady_segments_per_channel_mean": steady.0,
        "steady_segments_per_channel_peak": steady.1,
        "steady_records_per_s": steady.2,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short run of each: markers arrive, the debloater announces a size, and the
    /// steady run loses nothing (no figure is asserted).
    #[test]
    fn runs_end_to_end() {
        let settings = Settings {
            duration: Duration::from_millis(600),
            warm_up: Duration::from_millis(300),
            ..Settings::default()
        };
        let off = back_pressured(&settings, false);
        let on = back_pressured(&settings, true);
        assert!(!off.marker_wait_ns.is_empty());
        assert_eq!(off.announced_size, 0);
        assert!(on.announced_size > 0, "no size announced");
        let steady = steady_segments(100_000, 1_000_000);
        let text = render(&settings, &[off.clone(), on.clone()], steady);
        assert!(text.contains("| on |"));
        let json = to_json(&settings, &[off, on], steady, "weir debloat");
        assert_eq!(json["runs"].as_array().map(Vec::len), Some(2));
    }
}
