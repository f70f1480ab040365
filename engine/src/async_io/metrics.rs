//! Counters and the latency histogram of one async operator.
//!
//! The `cache_*` counters are Flink's lookup-cache metrics (`hitCount`, `missCount`,
//! `loadCount`, `latestLoadTime`, `numCachedRecords`), kept as totals; they stay 0
//! without a [`LookupCache`](super::LookupCache).

use hdrhistogram::Histogram;

/// What an operator has done so far. Read with [`AsyncWaitOperator::metrics`].
///
/// [`AsyncWaitOperator::metrics`]: super::AsyncWaitOperator::metrics
#[derive(Debug, Clone)]
pub struct AsyncMetrics {
    /// Records whose result stood (emitted or waiting to be).
    pub completed: u64,
    /// Records answered by [`AsyncFunction::ready`](super::AsyncFunction::ready), with no
    /// call made (counted in `completed` and `emitted` too).
    pub ready: u64,
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
    /// Records whose key was in the lookup cache (completed without a call; counted in
    /// `completed` and `emitted` like any record).
    pub cache_hits: u64,
    /// Records whose key was not in the lookup cache (or only in an expired row): each
    /// made a call.
    pub cache_misses: u64,
    /// Calls made after a miss whose results stood and were stored in the cache.
    pub cache_loads: u64,
    /// Nanoseconds of the operator's clock from the first invocation to the completion
    /// of those loads, summed (retries included); divide by `cache_loads` for the mean.
    pub cache_load_ns: u64,
    /// Rows in the lookup cache at the last lookup or store (summed over subtasks),
    /// expired rows not yet looked up included.
    pub cache_entries: u64,
}

impl AsyncMetrics {
    pub(crate) fn new() -> Self {
        AsyncMetrics {
            completed: 0,
            ready: 0,
            retried: 0,
            timed_out: 0,
            failed: 0,
            emitted: 0,
            backpressured_ns: 0,
            timers_peak: 0,
            latency_ns: Histogram::new_with_bounds(1, 60_000_000_000, 3)
                .expect("static histogram bounds are valid"),
            cache_hits: 0,
            cache_misses: 0,
            cache_loads: 0,
            cache_load_ns: 0,
            cache_entries: 0,
        }
    }
}

impl Default for AsyncMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl AsyncMetrics {
    /// The share of lookup-cache lookups that hit, if any was made.
    pub fn cache_hit_rate(&self) -> Option<f64> {
        let lookups = self.cache_hits + self.cache_misses;
        (lookups > 0).then(|| self.cache_hits as f64 / lookups as f64)
    }

    /// Adds `other`'s counts and latencies to these (for several subtasks).
    pub fn merge(&mut self, other: &AsyncMetrics) {
        self.completed += other.completed;
        self.ready += other.ready;
        self.retried += other.retried;
        self.timed_out += other.timed_out;
        self.failed += other.failed;
        self.emitted += other.emitted;
        self.backpressured_ns += other.backpressured_ns;
        self.timers_peak = self.timers_peak.max(other.timers_peak);
        self.cache_hits += other.cache_hits;
        self.cache_misses += other.cache_misses;
        self.cache_loads += other.cache_loads;
        self.cache_load_ns += other.cache_load_ns;
        self.cache_entries += other.cache_entries;
        self.latency_ns
            .add(&other.latency_ns)
            .expect("histograms share bounds");
    }
}
