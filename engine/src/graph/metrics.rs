//! Live task metrics: what each subtask of a running graph is doing, for an exporter
//! (e.g. a Prometheus endpoint) to read while the job runs.
//!
//! Flink's task metrics, per subtask: records in and out, and how the task spends its
//! time, `busyTimeMsPerSecond`, `backPressuredTimeMsPerSecond` and
//! `idleTimeMsPerSecond`. Here a task is *busy* while its worker polls it, and
//! *back-pressured* while its input waits because the chain after it takes nothing
//! (an exchange whose pool is dry, an async operator at capacity, a sink holding its
//! input back); the rest of its life it is *idle*. A worker runs several tasks, so
//! these are each task's share of its worker, as Flink's are of a task's thread.
//!
//! Each task writes its own [`TaskMetrics`] after each poll, with relaxed stores (one
//! writer per field); readers see values at most one poll old. The figures are kept
//! only when asked for ([`LiveCounters::enable_task_metrics`](super::LiveCounters)),
//! so a job without an exporter pays a branch per poll and no clock reads.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// One subtask's live figures; see the module docs.
#[derive(Debug)]
pub struct TaskMetrics {
    /// The stage's name.
    pub stage: String,
    /// The subtask's index in `0..parallelism`.
    pub subtask: usize,
    /// The stage's parallelism.
    pub parallelism: usize,
    /// When the task was built.
    pub started: Instant,
    /// Records the task took in (from its source or input gate).
    pub records_in: AtomicU64,
    /// Records the task wrote to its exchange (a sink's task writes none).
    pub records_out: AtomicU64,
    /// Nanoseconds its worker spent polling it.
    pub busy_ns: AtomicU64,
    /// Nanoseconds its input waited for the chain to take more.
    pub backpressured_ns: AtomicU64,
    /// Elements in its async operators now.
    pub async_in_flight: AtomicU64,
    /// Calls its async operators timed out.
    pub async_timeouts: AtomicU64,
    /// Records its async operators answered with `AsyncFunction::ready`, no call made.
    pub async_ready: AtomicU64,
    /// Its output pool's usage in parts per million of its reserved segments (Flink's
    /// `outPoolUsage`); 0 for a task without an exchange after it.
    pub out_pool_usage_ppm: AtomicU64,
    /// Its input gate's usage in parts per million (Flink's `inPoolUsage`: buffers
    /// waiting in its channels over what they hold); 0 for a source's task.
    pub in_pool_usage_ppm: AtomicU64,
    /// Bytes in flight on its input channels: published (or arrived) and not yet read
    /// by it ([`InputGate::in_flight_bytes`](crate::exchange::InputGate::in_flight_bytes));
    /// 0 for a source's task.
    pub in_flight_bytes: AtomicU64,
    /// The same on its fullest input channel.
    pub in_flight_bytes_max_channel: AtomicU64,
    /// The task ended (its figures stay as they were at the end).
    pub finished: AtomicBool,
}

impl TaskMetrics {
    /// Zeroed figures for subtask `subtask` of `stage`.
    pub fn new(stage: &str, subtask: usize, parallelism: usize) -> Self {
        TaskMetrics {
            stage: stage.to_string(),
            subtask,
            parallelism,
            started: Instant::now(),
            records_in: AtomicU64::new(0),
            records_out: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            backpressured_ns: AtomicU64::new(0),
            async_in_flight: AtomicU64::new(0),
            async_timeouts: AtomicU64::new(0),
            async_ready: AtomicU64::new(0),
            out_pool_usage_ppm: AtomicU64::new(0),
            in_pool_usage_ppm: AtomicU64::new(0),
            in_flight_bytes: AtomicU64::new(0),
            in_flight_bytes_max_channel: AtomicU64::new(0),
            finished: AtomicBool::new(false),
        }
    }

    /// The figures now.
    pub fn sample(&self) -> TaskSample {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TaskSample {
            at: Instant::now(),
            records_in: get(&self.records_in),
            records_out: get(&self.records_out),
            busy_ns: get(&self.busy_ns),
            backpressured_ns: get(&self.backpressured_ns),
            async_in_flight: get(&self.async_in_flight),
            async_timeouts: get(&self.async_timeouts),
            async_ready: get(&self.async_ready),
            out_pool_usage: get(&self.out_pool_usage_ppm) as f64 / 1e6,
            in_pool_usage: get(&self.in_pool_usage_ppm) as f64 / 1e6,
            in_flight_bytes: get(&self.in_flight_bytes),
            in_flight_bytes_max_channel: get(&self.in_flight_bytes_max_channel),
            finished: self.finished.load(Ordering::Relaxed),
        }
    }

    /// Stores `value` (single writer: a plain store, no read-modify-write).
    #[inline]
    pub(crate) fn set(field: &AtomicU64, value: u64) {
        field.store(value, Ordering::Relaxed);
    }
}

/// [`TaskMetrics`] read at one moment.
#[derive(Debug, Clone, Copy)]
pub struct TaskSample {
    /// When it was read.
    pub at: Instant,
    /// See [`TaskMetrics::records_in`].
    pub records_in: u64,
    /// See [`TaskMetrics::records_out`].
    pub records_out: u64,
    /// See [`TaskMetrics::busy_ns`].
    pub busy_ns: u64,
    /// See [`TaskMetrics::backpressured_ns`].
    pub backpressured_ns: u64,
    /// See [`TaskMetrics::async_in_flight`].
    pub async_in_flight: u64,
    /// See [`TaskMetrics::async_timeouts`].
    pub async_timeouts: u64,
    /// See [`TaskMetrics::async_ready`].
    pub async_ready: u64,
    /// Fraction of the output pool in use.
    pub out_pool_usage: f64,
    /// Fraction of the input channels' buffers in use.
    pub in_pool_usage: f64,
    /// See [`TaskMetrics::in_flight_bytes`].
    pub in_flight_bytes: u64,
    /// See [`TaskMetrics::in_flight_bytes_max_channel`].
    pub in_flight_bytes_max_channel: u64,
    /// See [`TaskMetrics::finished`].
    pub finished: bool,
}

/// Per-second rates between two samples of one task (Flink's meters).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TaskRates {
    /// Records in per second.
    pub records_in_per_second: f64,
    /// Records out per second.
    pub records_out_per_second: f64,
    /// Milliseconds busy per second (0–1000).
    pub busy_ms_per_second: f64,
    /// Milliseconds back-pressured per second (0–1000).
    pub backpressured_ms_per_second: f64,
    /// Milliseconds idle per second: the rest (0–1000).
    pub idle_ms_per_second: f64,
}

impl TaskRates {
    /// The rates from `before` to `now` (`before` taken earlier of the same task).
    pub fn between(before: &TaskSample, now: &TaskSample) -> TaskRates {
        let seconds = now.at.saturating_duration_since(before.at).as_secs_f64();
        if seconds <= 0.0 {
            return TaskRates::default();
        }
        let per_second = |a: u64, b: u64| a.saturating_sub(b) as f64 / seconds;
        let ms = |a: u64, b: u64| (per_second(a, b) / 1e6).min(1000.0);
        let busy = ms(now.busy_ns, before.busy_ns);
        let backpressured = ms(now.backpressured_ns, before.backpressured_ns).min(1000.0 - busy);
        TaskRates {
            records_in_per_second: per_second(now.records_in, before.records_in),
            records_out_per_second: per_second(now.records_out, before.records_out),
            busy_ms_per_second: busy,
            backpressured_ms_per_second: backpressured,
            idle_ms_per_second: (1000.0 - busy - backpressured).max(0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sample(at: Instant, records: u64, busy_ms: u64, bp_ms: u64) -> TaskSample {
        TaskSample {
            at,
            records_in: records,
            records_out: records,
            busy_ns: busy_ms * 1_000_000,
            backpressured_ns: bp_ms * 1_000_000,
            async_in_flight: 0,
            async_timeouts: 0,
            async_ready: 0,
            out_pool_usage: 0.0,
            in_pool_usage: 0.0,
            in_flight_bytes: 0,
            in_flight_bytes_max_channel: 0,
            finished: false,
        }
    }

    #[test]
    fn rates_split_each_second_into_busy_back_pressured_and_idle() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(2);
        let rates = TaskRates::between(&sample(t0, 0, 0, 0), &sample(t1, 5000, 600, 400));
        assert_eq!(rates.records_in_per_second, 2500.0);
        assert_eq!(rates.busy_ms_per_second, 300.0);
        assert_eq!(rates.backpressured_ms_per_second, 200.0);
        assert_eq!(rates.idle_ms_per_second, 500.0);
        // Clock skew between the task's figures and the reader's never exceeds a second.
        let rates = TaskRates::between(&sample(t0, 0, 0, 0), &sample(t1, 0, 1900, 900));
        assert_eq!(rates.busy_ms_per_second, 950.0);
        assert_eq!(rates.backpressured_ms_per_second, 50.0);
        assert_eq!(rates.idle_ms_per_second, 0.0);
    }
}
