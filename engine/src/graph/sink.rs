//! Sinks: where a graph's records end.
//!
//! A [`Sink`] gets every record of its subtask with its timestamp, every watermark, and
//! the end of its input. The built-in ones: [`Collected`] (every element, per subtask,
//! for tests) and [`Counted`] (a count and, optionally, an HDR histogram of latency).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use hdrhistogram::Histogram;

use crate::element::StreamElement;
use crate::runtime::TaskError;

use super::LiveCounters;

/// A user sink: one instance per subtask, built on its worker's thread.
pub trait Sink<T>: 'static {
    /// Takes one record; `now_ns` is the run's clock. An error fails the job.
    fn invoke(&mut self, value: T, timestamp: Option<i64>, now_ns: u64) -> Result<(), TaskError>;
    /// The input's watermark advanced.
    fn on_watermark(&mut self, watermark: i64) -> Result<(), TaskError> {
        let _ = watermark;
        Ok(())
    }
    /// The input ended; called once, after the last record.
    fn finish(&mut self) -> Result<(), TaskError> {
        Ok(())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// What collecting sinks received: every element of each subtask, in order.
pub struct Collected<T> {
    shared: Arc<Mutex<Vec<Vec<StreamElement<T>>>>>,
}

impl<T> Clone for Collected<T> {
    fn clone(&self) -> Self {
        Collected {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T> Default for Collected<T> {
    fn default() -> Self {
        Collected {
            shared: Arc::new(Mutex::new(Vec::new())),
        }
    }
}

impl<T> Collected<T> {
    /// Every record received, all subtasks together (subtask by subtask).
    pub fn records(&self) -> Vec<T>
    where
        T: Clone,
    {
        lock(&self.shared)
            .iter()
            .flatten()
            .filter_map(|e| e.as_record().map(|r| r.value.clone()))
            .collect()
    }

    /// Each subtask's elements (records and watermarks) in the order it received them.
    pub fn by_subtask(&self) -> Vec<Vec<StreamElement<T>>>
    where
        T: Clone,
    {
        lock(&self.shared).clone()
    }

    pub(crate) fn sink(&self, index: usize, parallelism: usize) -> CollectSink<T> {
        let mut shared = lock(&self.shared);
        if shared.len() < parallelism {
            shared.resize_with(parallelism, Vec::new);
        }
        CollectSink {
            index,
            local: Vec::new(),
            shared: Arc::clone(&self.shared),
        }
    }
}

pub(crate) struct CollectSink<T> {
    index: usize,
    local: Vec<StreamElement<T>>,
    shared: Arc<Mutex<Vec<Vec<StreamElement<T>>>>>,
}

impl<T> CollectSink<T> {
    fn publish(&mut self) {
        if !self.local.is_empty() {
            let local = std::mem::take(&mut self.local);
            lock(&self.shared)[self.index].extend(local);
        }
    }
}

impl<T> Drop for CollectSink<T> {
    fn drop(&mut self) {
        self.publish();
    }
}

impl<T: 'static> Sink<T> for CollectSink<T> {
    fn invoke(&mut self, value: T, timestamp: Option<i64>, _now_ns: u64) -> Result<(), TaskError> {
        self.local.push(StreamElement::record(value, timestamp));
        Ok(())
    }
    fn on_watermark(&mut self, watermark: i64) -> Result<(), TaskError> {
        self.local.push(StreamElement::watermark(watermark));
        Ok(())
    }
    fn finish(&mut self) -> Result<(), TaskError> {
        self.publish();
        Ok(())
    }
}

/// Latency is recorded from 1 ns to a minute, 3 significant digits.
const LATENCY_MAX_NS: u64 = 60_000_000_000;

/// A histogram for latencies in nanoseconds (1 ns to a minute, 3 significant digits).
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_NS, 3).expect("static bounds are valid")
}

struct CountState {
    records: u64,
    latency: Histogram<u64>,
}

/// What counting sinks received: how many records, and their latency if asked.
#[derive(Clone)]
pub struct Counted {
    shared: Arc<Mutex<CountState>>,
}

impl Default for Counted {
    fn default() -> Self {
        Counted {
            shared: Arc::new(Mutex::new(CountState {
                records: 0,
                latency: latency_histogram(),
            })),
        }
    }
}

impl Counted {
    /// Records received by every subtask together.
    pub fn records(&self) -> u64 {
        lock(&self.shared).records
    }

    /// Latency from each record's creation (by the run's clock) to its sink, ns.
    pub fn latency(&self) -> Histogram<u64> {
        lock(&self.shared).latency.clone()
    }
}

/// The creation time of a record by the run's clock, for latency.
pub(crate) type CreatedFn<T> = Arc<dyn Fn(&T) -> u64 + Send + Sync>;

pub(crate) struct CountSink<T> {
    pub(crate) created: Option<CreatedFn<T>>,
    pub(crate) records: u64,
    pub(crate) reported: u64,
    pub(crate) latency: Histogram<u64>,
    pub(crate) shared: Counted,
    pub(crate) live: Arc<LiveCounters>,
    pub(crate) published: bool,
}

impl<T> CountSink<T> {
    pub(crate) fn new(
        shared: Counted,
        created: Option<CreatedFn<T>>,
        live: Arc<LiveCounters>,
    ) -> Self {
        CountSink {
            created,
            records: 0,
            reported: 0,
            latency: latency_histogram(),
            shared,
            live,
            published: false,
        }
    }

    fn report_live(&mut self) {
        self.live
            .received
            .fetch_add(self.records - self.reported, Ordering::Relaxed);
        self.reported = self.records;
    }

    fn publish(&mut self) {
        if std::mem::replace(&mut self.published, true) {
            return;
        }
        self.report_live();
        let mut shared = lock(&self.shared.shared);
        shared.records += self.records;
        // Same bounds on both sides: adding cannot fail.
        let _ = shared.latency.add(&self.latency);
    }
}

impl<T> Drop for CountSink<T> {
    fn drop(&mut self) {
        self.publish();
    }
}

impl<T: 'static> Sink<T> for CountSink<T> {
    #[inline]
    fn invoke(&mut self, value: T, _timestamp: Option<i64>, now_ns: u64) -> Result<(), TaskError> {
        self.records += 1;
        if let Some(created) = &self.created {
            self.latency
                .saturating_record(now_ns.saturating_sub(created(&value)).max(1));
        }
        if self.records - self.reported >= 1024 {
            self.report_live();
        }
        Ok(())
    }
    fn finish(&mut self) -> Result<(), TaskError> {
        self.publish();
        Ok(())
    }
}
