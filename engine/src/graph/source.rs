//! Sources: where a graph's records come from.
//!
//! A [`Source`] is polled by its subtask's task, one event at a time, while the chain
//! after it accepts input: a record (with an optional event timestamp), a watermark,
//! "nothing now" (with the time to poll again, for a rate-limited source), or its end.
//! A bounded source ends; an unbounded one never does. As in Flink, the end of a source
//! emits the final watermark (`i64::MAX`) downstream.
//!
//! Checkpoints need a source that can be replayed: at each checkpoint it gives its
//! position ([`Source::snapshot_state`]), and a restored job rebuilds it and hands that
//! position back ([`Source::restore_state`]) so that it emits again everything after it
//! (Flink's replayable sources, e.g. a Kafka offset). The [`Generator`] is replayable by
//! its sequence number, an [`IterSource`] by how many items it yielded (its iterator must
//! yield the same items each time it is made). A source that cannot be replayed makes
//! every checkpoint of its job fail, saying so.

use crate::element::Record;
use crate::exchange::codec::Codec;
use crate::runtime::TaskError;

/// What a source has next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceEvent<T> {
    /// A record and its event timestamp, if the stream has event time.
    Record(T, Option<i64>),
    /// No record with a timestamp at or below this one follows.
    Watermark(i64),
    /// Nothing now: poll again at `until_ns` by the run's clock (`None`: when woken,
    /// e.g. by a thread the source feeds from through an
    /// [`Unparker`](crate::park::Unparker)).
    Idle {
        /// When to poll again.
        until_ns: Option<u64>,
    },
    /// The source is done.
    End,
    /// The source cannot go on (a reply it cannot read, refused credentials, a record
    /// it cannot decode): its subtask fails with this message, and with it the job,
    /// as for any failed task. A job with checkpoints restarts from the last completed
    /// one and re-reads from the position held there; what the source emitted before
    /// failing stays emitted (nothing is lost, and exactly-once sinks write it once).
    Failed(String),
}

/// A source's subtask failed: what [`SourceEvent::Failed`] ends a job with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("source {stage} failed: {message}")]
pub struct SourceFailed {
    /// The stage (its chain's name).
    pub stage: String,
    /// What the source said.
    pub message: String,
}

/// A user source: one instance per subtask, built on its worker's thread.
///
/// ```
/// use weir_engine::graph::{Graph, Source, SourceEvent, SubtaskInfo};
/// use weir_engine::runtime::{Cores, Runtime};
///
/// /// Numbers below `end`, each subtask its share, with event time and a final
/// /// watermark; replayable from the next number it would emit.
/// struct Numbers { next: u64, step: u64, end: u64 }
///
/// impl Source<u64> for Numbers {
///     fn poll_next(&mut self, _now_ns: u64) -> SourceEvent<u64> {
///         if self.next >= self.end {
///             return SourceEvent::End;
///         }
///         let n = self.next;
///         self.next += self.step;
///         SourceEvent::Record(n, Some(n as i64))
///     }
///     fn snapshot_state(&mut self) -> Option<Vec<u8>> {
///         Some(self.next.to_le_bytes().to_vec())
///     }
/// }
///
/// let graph = Graph::new().with_parallelism(2);
/// let out = graph
///     .from_source(|s: &SubtaskInfo| Numbers { next: s.index as u64, step: 2, end: 100 })
///     .collect();
/// graph.execute(Runtime::builder().cores(Cores::Count(2)).pin(false).build()?)?;
/// let mut numbers = out.records();
/// numbers.sort();
/// assert!(numbers.into_iter().eq(0..100));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Source<T>: 'static {
    /// The next event; `now_ns` is the run's clock (nanoseconds since it started,
    /// shared by all workers).
    fn poll_next(&mut self, now_ns: u64) -> SourceEvent<T>;

    /// The batch form of [`poll_next`](Self::poll_next): appends up to `max` records
    /// to `run` and returns the event that ended the batch, or `None` when it ended
    /// because `max` records were appended (the event is never
    /// [`SourceEvent::Record`]; the records before it come first). The task calls this
    /// form, with `max` at most the room its chain has. The default polls
    /// [`poll_next`](Self::poll_next) until it gives something else than a record; a
    /// source that has its records in bulk (a fetched batch, a generator) fills the run
    /// in a loop of its own.
    fn poll_batch(
        &mut self,
        now_ns: u64,
        run: &mut Vec<Record<T>>,
        max: usize,
    ) -> Option<SourceEvent<T>> {
        for _ in 0..max {
            match self.poll_next(now_ns) {
                SourceEvent::Record(value, timestamp) => run.push(Record { value, timestamp }),
                event => return Some(event),
            }
        }
        None
    }

    /// Its position at a checkpoint barrier: everything it emitted so far is before
    /// it. `None` (the default): it cannot be replayed, and no checkpoint can hold it.
    fn snapshot_state(&mut self) -> Option<Vec<u8>> {
        None
    }

    /// Checkpoint `checkpoint` completed: every position snapshotted for it and before
    /// it is durable (e.g. a source reading a shared log acknowledges what it read up to
    /// there, as Flink's Kafka source commits its offsets). May come twice.
    fn notify_checkpoint_complete(&mut self, checkpoint: u64) -> Result<(), TaskError> {
        let _ = checkpoint;
        Ok(())
    }

    /// Continues from a position [`snapshot_state`](Self::snapshot_state) returned,
    /// before its first poll.
    fn restore_state(&mut self, state: &[u8]) -> Result<(), TaskError> {
        let _ = state;
        Err("this source cannot be replayed from a checkpoint".into())
    }
}

/// Reads a position written as one `u64`.
fn read_position(mut state: &[u8], what: &str) -> Result<u64, TaskError> {
    let position =
        u64::decode(&mut state).map_err(|e| format!("{what}: a checkpointed position: {e}"))?;
    if !state.is_empty() {
        return Err(format!("{what}: a checkpointed position with trailing bytes").into());
    }
    Ok(position)
}

/// A source over an iterator: its items, without timestamps, then the end.
pub struct IterSource<I> {
    iter: I,
    /// Items yielded: its position.
    yielded: u64,
}

impl<I> IterSource<I> {
    /// The items of `iter`.
    pub fn new(iter: I) -> Self {
        IterSource { iter, yielded: 0 }
    }
}

impl<I: Iterator + 'static> Source<I::Item> for IterSource<I> {
    #[inline]
    fn poll_next(&mut self, _now_ns: u64) -> SourceEvent<I::Item> {
        match self.iter.next() {
            Some(item) => {
                self.yielded += 1;
                SourceEvent::Record(item, None)
            }
            None => SourceEvent::End,
        }
    }

    fn snapshot_state(&mut self) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(8);
        self.yielded.encode(&mut out);
        Some(out)
    }

    /// Skips the items yielded before the checkpoint: the iterator, made again, must
    /// yield the same items in the same order.
    fn restore_state(&mut self, state: &[u8]) -> Result<(), TaskError> {
        let position = read_position(state, "iterator source")?;
        for _ in 0..position {
            if self.iter.next().is_none() {
                return Err(format!(
                    "iterator source: the checkpoint is at item {position}, but the \
                     iterator now ends before it; a restored iterator must yield the same items"
                )
                .into());
            }
        }
        self.yielded = position;
        Ok(())
    }
}

/// A generated sequence: record `n` is `make(n)` for `n` in `0..count`, spread over
/// the subtasks (subtask `i` of `p` makes `i, i + p, i + 2p, …`), as fast as the
/// chain accepts or at a fixed rate over all subtasks.
pub struct Generator<F> {
    make: F,
    next: u64,
    step: u64,
    count: u64,
    interval_ns: Option<u64>,
    start_ns: Option<u64>,
    made: u64,
}

impl<F> Generator<F> {
    /// Subtask `index` of `parallelism`'s share of `0..count`; `rate`: records per
    /// second over all subtasks (`None`: as fast as accepted).
    pub fn new(make: F, count: u64, index: usize, parallelism: usize, rate: Option<f64>) -> Self {
        let step = parallelism.max(1) as u64;
        Generator {
            make,
            next: index as u64,
            step,
            count,
            interval_ns: rate
                .filter(|r| *r > 0.0)
                .map(|r| (1e9 * step as f64 / r).max(1.0) as u64),
            start_ns: None,
            made: 0,
        }
    }
}

impl<T, F: FnMut(u64) -> T + 'static> Source<T> for Generator<F> {
    #[inline]
    fn poll_next(&mut self, now_ns: u64) -> SourceEvent<T> {
        if self.next >= self.count {
            return SourceEvent::End;
        }
        if let Some(interval) = self.interval_ns {
            let start = *self.start_ns.get_or_insert(now_ns);
            let at = start.saturating_add(self.made.saturating_mul(interval));
            if at > now_ns {
                return SourceEvent::Idle { until_ns: Some(at) };
            }
        }
        let n = self.next;
        self.next += self.step;
        self.made += 1;
        SourceEvent::Record((self.make)(n), None)
    }

    /// Makes every record due (all that are left, unpaced), up to `max`, in one loop.
    fn poll_batch(
        &mut self,
        now_ns: u64,
        run: &mut Vec<Record<T>>,
        max: usize,
    ) -> Option<SourceEvent<T>> {
        let left = if self.next >= self.count {
            0
        } else {
            (self.count - self.next - 1) / self.step + 1
        };
        let mut take = left.min(max as u64);
        if let Some(interval) = self.interval_ns {
            let start = *self.start_ns.get_or_insert(now_ns);
            // Record `made + i` is due at `start + (made + i) × interval`.
            let due = now_ns.saturating_sub(start) / interval + 1;
            take = take.min(due.saturating_sub(self.made));
        }
        run.reserve(take as usize);
        for _ in 0..take {
            let n = self.next;
            self.next += self.step;
            run.push(Record {
                value: (self.make)(n),
                timestamp: None,
            });
        }
        self.made += take;
        if take as usize == max {
            return None;
        }
        // Ended, or the next one is not due yet: say which.
        match self.poll_next(now_ns) {
            SourceEvent::Record(value, timestamp) => {
                run.push(Record { value, timestamp });
                None
            }
            event => Some(event),
        }
    }

    fn snapshot_state(&mut self) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(8);
        self.next.encode(&mut out);
        Some(out)
    }

    /// Continues at the sequence number checkpointed; a rate starts its pacing anew.
    fn restore_state(&mut self, state: &[u8]) -> Result<(), TaskError> {
        let next = read_position(state, "generator")?;
        if next % self.step != self.next % self.step {
            return Err(format!(
                "generator: the checkpointed position {next} belongs to another subtask \
                 (restore at the parallelism the checkpoint was taken at)"
            )
            .into());
        }
        self.next = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generator_splits_the_sequence_over_subtasks() {
        let mut all = Vec::new();
        for index in 0..3 {
            let mut source = Generator::new(|n| n * 10, 8, index, 3, None);
            while let SourceEvent::Record(value, None) = source.poll_next(0) {
                all.push(value);
            }
            assert_eq!(source.poll_next(0), SourceEvent::End);
        }
        all.sort_unstable();
        assert_eq!(all, (0..8).map(|n| n * 10).collect::<Vec<_>>());
    }

    #[test]
    fn a_rate_limited_generator_waits_for_its_time() {
        // 1000 records/s over 2 subtasks: one every 2 ms per subtask.
        let mut source = Generator::new(|n| n, 10, 0, 2, Some(1000.0));
        assert_eq!(source.poll_next(5), SourceEvent::Record(0, None));
        assert_eq!(
            source.poll_next(6),
            SourceEvent::Idle {
                until_ns: Some(2_000_005)
            }
        );
        assert_eq!(source.poll_next(2_000_005), SourceEvent::Record(2, None));
    }
}
