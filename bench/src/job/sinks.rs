//! The job's sinks: the checking sink (each id exactly once, order per source subtask,
//! latency), and the Redis Streams and file outputs.

use super::*;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use hdrhistogram::Histogram;
use smallvec::SmallVec;
use weir_engine::graph::{FileSink, LiveCounters, Sink};
use weir_engine::runtime::TaskError;
use weir_net::kafka::{KafkaOut, KafkaSink};
use weir_net::redis::streams::{Fields, StreamSink};

/// Each enriched record as a stream entry: `id`, `key`, `value` (hex), and `t`, the
/// time its input was created (nanoseconds since the Unix epoch), for a reader that
/// measures end to end.
pub(crate) fn stream_fields(record: &Enriched, fields: &mut Fields) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hex = SmallVec::<[u8; 2 * VALUE_INLINE]>::new();
    for byte in record.value.iter() {
        hex.extend([HEX[usize::from(byte >> 4)], HEX[usize::from(byte & 15)]]);
    }
    fields
        .push_fmt("id", format_args!("{}", record.id))
        .push_fmt("key", format_args!("{}", record.key))
        .push("value", &hex[..])
        .push_fmt("t", format_args!("{}", record.created_ns));
}

/// The main job's sink with `--sink`: the checking sink, and each record written to a
/// log (a Redis stream or a Kafka topic; at least once, or exactly once at
/// checkpoints) by `out`, which the wrapper hands every call of the sink's life.
pub(crate) struct LogOutput<S> {
    pub(crate) check: CheckSink,
    pub(crate) out: S,
    /// Maps the records' creation times onto the wall clock (none over several
    /// processes: they are in it already).
    pub(crate) wall: Option<WallClock>,
}

/// `--sink redis-stream://…`.
pub(crate) type StreamOut = LogOutput<StreamSink<Enriched, fn(&Enriched, &mut Fields)>>;

/// `--sink kafka://…`.
pub(crate) type KafkaOutput = LogOutput<KafkaSink<Enriched>>;

impl<S: Sink<Enriched>> Sink<Enriched> for LogOutput<S> {
    fn invoke(
        &mut self,
        mut value: Enriched,
        timestamp: Option<i64>,
        now_ns: u64,
    ) -> Result<(), TaskError> {
        self.check.invoke(value.clone(), timestamp, now_ns)?;
        if let Some(wall) = self.wall.as_mut() {
            value.created_ns = wall.map(now_ns, value.created_ns);
        }
        self.out.invoke(value, timestamp, now_ns)
    }

    fn finish(&mut self) -> Result<(), TaskError> {
        self.out.finish()?;
        self.check.finish()
    }

    fn accepts(&mut self) -> bool {
        self.out.accepts()
    }

    fn room(&mut self) -> usize {
        self.out.room()
    }

    fn poll(&mut self, now_ns: u64) -> Result<bool, TaskError> {
        self.out.poll(now_ns)
    }

    fn flushed(&mut self) -> bool {
        self.out.flushed()
    }

    fn snapshot_state(&mut self, checkpoint: u64) -> Result<Option<Vec<u8>>, TaskError> {
        self.out.snapshot_state(checkpoint)
    }

    fn notify_checkpoint_complete(&mut self, checkpoint: u64) -> Result<(), TaskError> {
        self.out.notify_checkpoint_complete(checkpoint)
    }

    fn restore_state(&mut self, state: &[u8]) -> Result<(), TaskError> {
        self.out.restore_state(state)
    }
}

/// Each enriched record as a Kafka message: the value `id,key,value hex,t` (`t` as in
/// [`stream_fields`]), keyed by the key in decimal.
pub(crate) fn kafka_value(record: &Enriched, _timestamp: Option<i64>, out: &mut KafkaOut) {
    use std::io::Write;
    out.key = Some(record.key.to_string().into_bytes());
    let _ = write!(out.payload, "{},{},", record.id, record.key);
    for byte in record.value.iter() {
        let _ = write!(out.payload, "{byte:02x}");
    }
    let _ = write!(out.payload, ",{}", record.created_ns);
}

/// The main job's sink with `--output`: the checking sink, and each record's line in
/// exactly-once part files.
pub(crate) struct OutputSink {
    pub(crate) check: CheckSink,
    pub(crate) files: FileSink<fn(&Enriched, &mut Vec<u8>)>,
}

/// `<id> <key> <value as hex>\n`.
pub fn output_line(record: &Enriched, line: &mut Vec<u8>) {
    use std::io::Write;
    let _ = write!(line, "{} {} ", record.id, record.key);
    for byte in record.value.iter() {
        let _ = write!(line, "{byte:02x}");
    }
    line.push(b'\n');
}

impl Sink<Enriched> for OutputSink {
    fn invoke(
        &mut self,
        value: Enriched,
        timestamp: Option<i64>,
        now_ns: u64,
    ) -> Result<(), TaskError> {
        Sink::<Enriched>::invoke(&mut self.files, value.clone(), timestamp, now_ns)?;
        self.check.invoke(value, timestamp, now_ns)
    }

    fn finish(&mut self) -> Result<(), TaskError> {
        Sink::<Enriched>::finish(&mut self.files)?;
        self.check.finish()
    }

    fn snapshot_state(&mut self, checkpoint: u64) -> Result<Option<Vec<u8>>, TaskError> {
        Sink::<Enriched>::snapshot_state(&mut self.files, checkpoint)
    }

    fn notify_checkpoint_complete(&mut self, checkpoint: u64) -> Result<(), TaskError> {
        Sink::<Enriched>::notify_checkpoint_complete(&mut self.files, checkpoint)
    }

    fn restore_state(&mut self, state: &[u8]) -> Result<(), TaskError> {
        Sink::<Enriched>::restore_state(&mut self.files, state)
    }
}

/// What one sink subtask received.
pub(crate) struct SinkResult {
    pub(crate) seen: Vec<u64>,
    pub(crate) received: u64,
    pub(crate) duplicates: u64,
    pub(crate) reordered: u64,
    pub(crate) latency: Histogram<u64>,
}

/// The main job's sink: counts, checks ids, measures latency.
pub(crate) struct CheckSink {
    pub(crate) sources: u64,
    /// The last id from each source subtask (ids are `subtask + n × sources`).
    pub(crate) last_id: Vec<Option<u64>>,
    pub(crate) seen: Vec<u64>,
    pub(crate) received: u64,
    pub(crate) duplicates: u64,
    pub(crate) reordered: u64,
    pub(crate) latency: Histogram<u64>,
    pub(crate) results: Arc<std::sync::Mutex<Vec<SinkResult>>>,
    pub(crate) live: Arc<LiveCounters>,
    pub(crate) reported: u64,
    pub(crate) collect: Option<(Vec<Enriched>, Collected<Enriched>)>,
    pub(crate) published: bool,
    /// Over several processes: latency measured in the wall clock (see `WallClock`).
    pub(crate) wall: Option<WallClock>,
    /// When the first record of the run reached a sink, in ns since the Unix epoch
    /// (the moment a restored job is processing again).
    pub(crate) first_output: Arc<AtomicU64>,
    /// Records from streams: ids are the entries' (the bitmap grows to the largest, up
    /// to [`STREAM_ID_MAX`]), and their order per source subtask is not the generator's.
    pub(crate) from_streams: bool,
}

impl CheckSink {
    /// Hands what the sink received to the report (once: at the end of its input, or
    /// when dropped before that in a failed run).
    fn publish(&mut self) {
        if std::mem::replace(&mut self.published, true) {
            return;
        }
        if let Some((local, shared)) = self.collect.take() {
            shared
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(local);
        }
        self.live.received.fetch_add(
            self.received - self.reported,
            std::sync::atomic::Ordering::Relaxed,
        );
        self.reported = self.received;
        let result = SinkResult {
            seen: std::mem::take(&mut self.seen),
            received: self.received,
            duplicates: self.duplicates,
            reordered: self.reordered,
            latency: self.latency.clone(),
        };
        self.results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(result);
    }
}

impl Drop for CheckSink {
    fn drop(&mut self) {
        self.publish();
    }
}

impl Sink<Enriched> for CheckSink {
    #[inline]
    fn invoke(
        &mut self,
        value: Enriched,
        _timestamp: Option<i64>,
        now_ns: u64,
    ) -> Result<(), TaskError> {
        if self.received == 0 {
            self.first_output
                .fetch_min(wall_clock_ns(), std::sync::atomic::Ordering::Relaxed);
        }
        self.received += 1;
        if !self.from_streams {
            let source = (value.id % self.sources) as usize;
            if self.last_id[source].is_some_and(|last| last > value.id) {
                self.reordered += 1;
            }
            self.last_id[source] = Some(value.id);
        }
        let id = value.id as usize;
        if self.from_streams && id / 64 >= self.seen.len() && value.id < STREAM_ID_MAX {
            self.seen.resize((id / 64 + 1).next_power_of_two(), 0);
        }
        match self.seen.get_mut(id / 64) {
            Some(word) => {
                let bit = 1u64 << (id % 64);
                if *word & bit != 0 {
                    self.duplicates += 1;
                }
                *word |= bit;
            }
            None => self.duplicates += 1,
        }
        let now_ns = match self.wall.as_mut() {
            Some(wall) => wall.map(now_ns, now_ns),
            None => now_ns,
        };
        self.latency
            .saturating_record(now_ns.saturating_sub(value.created_ns).max(1));
        if let Some((local, _)) = self.collect.as_mut() {
            local.push(value);
        }
        if self.received - self.reported >= 1024 {
            self.live.received.fetch_add(
                self.received - self.reported,
                std::sync::atomic::Ordering::Relaxed,
            );
            self.reported = self.received;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), TaskError> {
        self.publish();
        Ok(())
    }
}
