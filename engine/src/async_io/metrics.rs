//! Counters and the latency histogram of one async operator.

use hdrhistogram::Histogram;

/// What an operator has done so far. Read with [`AsyncWaitOperator::metrics`].
///
/// [`AsyncWaitOperator::metrics`]: super::AsyncWaitOperator::metrics
#[derive(Debug, Clone)]
pub struct AsyncMetrics {
    /// Records whose result stood (emitted or waiting to be).
    pub completed: u64,
    /// Retries scheduled.
    pub retried: u64,
    /// Elements whose timeout fired.
    pub timed_out: u64,
    /// Errors that failed the operator.
    pub failed: u64,
    /// Records emitted (each may emit zero or more results).
    pub emitted: u64,
    /// Nanoseconds the task spent waiting for capacity.
    pub backpressured_ns: u64,
    /// The most timers pending at once: timeouts running (the operator's deadline list)
    /// plus retry delays (its wheel). Bounded by twice the capacity: a completed
    /// record's timeout stops at once. Merged as a maximum over subtasks.
    pub timers_peak: u64,
    /// Invoke-to-emit latency of every `LATENCY_SAMPLE_EVERY`-th record (by input order),
    /// in ns of the operator's clock.
    pub latency_ns: Histogram<u64>,
}

impl AsyncMetrics {
    pub(crate) fn new() -> Self {
        AsyncMetrics {
            completed: 0,
            retried: 0,
            timed_out: 0,
            failed: 0,
            emitted: 0,
            backpressured_ns: 0,
            timers_peak: 0,
            latency_ns: Histogram::new_with_bounds(1, 60_000_000_000, 3)
                .expect("static histogram bounds are valid"),
        }
    }
}

impl Default for AsyncMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl AsyncMetrics {
    /// Adds `other`'s counts and latencies to these (for several subtasks).
    pub fn merge(&mut self, other: &AsyncMetrics) {
        self.completed += other.completed;
        self.retried += other.retried;
        self.timed_out += other.timed_out;
        self.failed += other.failed;
        self.emitted += other.emitted;
        self.backpressured_ns += other.backpressured_ns;
        self.timers_peak = self.timers_peak.max(other.timers_peak);
        self.latency_ns
            .add(&other.latency_ns)
            .expect("histograms share bounds");
    }
}
