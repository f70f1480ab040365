//! The job's sources: the generator (paced or as fast as accepted, stamping each
//! record's creation time) and the Redis Streams input.

use super::*;

use weir_engine::exchange::codec::Codec;
use weir_engine::graph::{Source, SourceEvent, SubtaskInfo};
use weir_engine::runtime::TaskError;
use weir_net::kafka::{KafkaMessage, KafkaSource};
use weir_net::redis::streams::{StreamEntry, StreamSource};

/// Nanoseconds of the host's wall clock (`CLOCK_REALTIME`).
pub fn wall_clock_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Maps a task's run-clock readings onto the wall clock, for latencies measured across
/// processes: each process's run clock starts at its own epoch, so a record's creation
/// time must travel in a clock both ends share. Exact between processes of one host;
/// across hosts as good as their clock synchronisation (PTP for microseconds). The
/// offset is taken once per task (a run clock and the wall clock advance together).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WallClock {
    pub(crate) offset: Option<u64>,
}

impl WallClock {
    #[inline]
    pub(crate) fn map(&mut self, now_ns: u64, t_ns: u64) -> u64 {
        let offset = *self
            .offset
            .get_or_insert_with(|| wall_clock_ns().saturating_sub(now_ns));
        t_ns + offset
    }
}

/// How far apart an open-loop source's wake-ups are at least: it emits every record
/// whose time has come, then waits for the next one's time but not less than this.
/// A timed wait costs a worker about 25–35 µs of CPU on a virtual machine however short
/// it is (`results/2026-12-01-vm-wakeup-latency.md`), so a source waking for each record
/// (every 3–10 µs at the report's rates) spent more CPU pacing itself than the records
/// cost to process. Records keep their intended creation time, so the wait shows in the
/// measured latency (half this on average).
pub(crate) const PACE_STEP_NS: u64 = 100_000;

/// The main job's source: `records` spread over the subtasks (ids `i, i + n, …` on
/// subtask `i` of `n`), keys drawn from the distribution (xorshift64*) or taken from
/// an iterator, as fast as accepted or at a rate (paced in steps of [`PACE_STEP_NS`]).
pub(crate) struct MainSource {
    pub(crate) subtask: u64,
    pub(crate) sources: u64,
    pub(crate) next: u64,
    pub(crate) count: u64,
    pub(crate) key_iter: Option<Box<dyn Iterator<Item = u64>>>,
    pub(crate) interval_ns: Option<u64>,
    pub(crate) start_ns: Option<u64>,
    pub(crate) keys: KeyDistribution,
    pub(crate) rng: u64,
    /// Over several processes: creation times in the wall clock.
    pub(crate) wall: Option<WallClock>,
    /// The record a restored source started at: its pacing counts from there.
    pub(crate) paced_from: u64,
}

impl MainSource {
    pub(crate) fn new(settings: &JobSettings, info: &SubtaskInfo) -> Self {
        let (subtask, sources) = (info.index as u64, info.parallelism as u64);
        let records = settings.records;
        let key_iter = settings
            .key_iter
            .as_ref()
            .map(|make| make(info.index, info.parallelism));
        MainSource {
            subtask,
            sources,
            next: 0,
            count: match key_iter {
                Some(_) => u64::MAX,
                None => records / sources + u64::from(subtask < records % sources),
            },
            key_iter,
            interval_ns: settings.rate.map(|r| (1e9 * sources as f64 / r) as u64),
            start_ns: None,
            keys: settings.keys,
            rng: (SEED ^ subtask.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1,
            wall: settings.cluster.as_ref().map(|_| WallClock::default()),
            paced_from: 0,
        }
    }

    fn next_random(&mut self) -> u64 {
        xorshift64star(&mut self.rng)
    }

    fn next_key(&mut self) -> u64 {
        let r = self.next_random();
        let keys = self.keys;
        keys.draw(r, || self.next_random())
    }
}

impl Source<Lookup> for MainSource {
    #[inline]
    fn poll_next(&mut self, now_ns: u64) -> SourceEvent<Lookup> {
        if self.next == self.count {
            return SourceEvent::End;
        }
        let start = *self.start_ns.get_or_insert(now_ns);
        let intended = match self.interval_ns {
            Some(interval) => {
                let at = start + (self.next - self.paced_from) * interval;
                if at > now_ns {
                    return SourceEvent::Idle {
                        until_ns: Some(at.max(now_ns + PACE_STEP_NS)),
                    };
                }
                at
            }
            None => now_ns,
        };
        let key = match self.key_iter.as_mut() {
            Some(keys) => match keys.next() {
                Some(key) => key,
                None => {
                    self.count = self.next;
                    return SourceEvent::End;
                }
            },
            None => self.next_key(),
        };
        let created_ns = match self.wall.as_mut() {
            Some(wall) => wall.map(now_ns, intended),
            None => intended,
        };
        let record = SourceRecord {
            id: self.subtask + self.next * self.sources,
            key,
            created_ns,
        };
        self.next += 1;
        SourceEvent::Record(Lookup(record), None)
    }

    /// Its position: records made and the key generator's state (an iterator of keys
    /// is made again and skipped to it on restore).
    fn snapshot_state(&mut self) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(16);
        (self.next, self.rng).encode(&mut out);
        Some(out)
    }

    fn restore_state(&mut self, mut state: &[u8]) -> Result<(), TaskError> {
        let (next, rng) = <(u64, u64)>::decode(&mut state)
            .map_err(|e| format!("the source's checkpointed position: {e}"))?;
        if let Some(keys) = self.key_iter.as_mut() {
            for _ in 0..next {
                if keys.next().is_none() {
                    return Err("the source's keys end before its checkpointed position".into());
                }
            }
        }
        if next > self.count {
            return Err(format!(
                "the source's checkpointed position {next} is past its {} records: restore \
                 with the --records of the run that wrote the checkpoint",
                self.count
            )
            .into());
        }
        self.next = next;
        self.paced_from = next;
        self.rng = rng;
        Ok(())
    }
}

/// The largest record id the checking sink takes from a stream: it keeps a bitmap of
/// the ids it saw (512 MiB at this bound).
pub const STREAM_ID_MAX: u64 = 1 << 32;

/// The main job's record from a stream entry as `weir produce-stream` writes it:
/// `id` (unique, below [`STREAM_ID_MAX`]), `key` (looked up) and optionally `t` (when it
/// was produced, nanoseconds since the Unix epoch).
pub fn record_fields(entry: &StreamEntry) -> Result<(u64, u64, Option<u64>), String> {
    let number = |name: &str| -> Result<Option<u64>, String> {
        match entry.field(name.as_bytes()) {
            None => Ok(None),
            Some(text) => std::str::from_utf8(text)
                .ok()
                .and_then(|t| t.parse::<u64>().ok())
                .map(Some)
                .ok_or_else(|| {
                    format!(
                        "entry {} of stream {:?}: field {name:?} is {:?}, not a decimal u64",
                        entry.id,
                        entry.stream,
                        String::from_utf8_lossy(text)
                    )
                }),
        }
    };
    let needed = |name: &str| -> Result<u64, String> {
        number(name)?.ok_or_else(|| {
            format!(
                "entry {} of stream {:?} has no field {name:?}: weir run's main job reads \
                 entries as `weir produce-stream` writes them (fields id, key and t); \
                 enrich streams of your own with a job like net/examples/stream_enrich.rs",
                entry.id, entry.stream
            )
        })
    };
    let id = needed("id")?;
    if id >= STREAM_ID_MAX {
        return Err(format!(
            "entry {} of stream {:?}: id {id} is not below {STREAM_ID_MAX} (the checking \
             sink keeps a bitmap of ids)",
            entry.id, entry.stream
        ));
    }
    Ok((id, needed("key")?, number("t")?))
}

/// When a record read from a log was created, by the run's clock (or the wall clock
/// over several processes): `produced` (its `t`, the wall clock when it was written)
/// mapped onto the run's clock, or when read. `offset` is the wall clock minus the
/// run's, taken at the first record.
fn created_at(produced: Option<u64>, now_ns: u64, offset: &mut Option<u64>, wall: bool) -> u64 {
    let offset = *offset.get_or_insert_with(|| wall_clock_ns().saturating_sub(now_ns));
    match (produced, wall) {
        (Some(t), true) => t,
        (None, true) => now_ns + offset,
        // Produced before the run started: its age counts from the start.
        (Some(t), false) => t.saturating_sub(offset).min(now_ns),
        (None, false) => now_ns,
    }
}

/// The main job's record from a Kafka message as `weir produce-kafka` writes it: the
/// value `id,key[,t]` in decimal (`t`: when it was produced, nanoseconds since the Unix
/// epoch), `id` below [`STREAM_ID_MAX`]. Anything else fails the job naming the message
/// (the source's decode policy is to fail).
pub fn kafka_record_fields(message: &KafkaMessage<'_>) -> Result<(u64, u64, Option<u64>), String> {
    let refuse = |why: &str| {
        format!(
            "{why}: weir run's main job reads messages as `weir produce-kafka` writes them \
             (the value id,key,t in decimal); enrich topics of your own with a job like \
             net/examples/kafka_enrich.rs"
        )
    };
    let text = std::str::from_utf8(message.payload().unwrap_or_default())
        .map_err(|_| refuse("the value is not UTF-8 text"))?;
    let mut numbers = text.split(',').map(|f| f.parse::<u64>());
    let (id, key, t) = match (
        numbers.next(),
        numbers.next(),
        numbers.next(),
        numbers.next(),
    ) {
        (Some(Ok(id)), Some(Ok(key)), None, None) => (id, key, None),
        (Some(Ok(id)), Some(Ok(key)), Some(Ok(t)), None) => (id, key, Some(t)),
        _ => return Err(refuse(&format!("the value {text:?} is not id,key,t"))),
    };
    if id >= STREAM_ID_MAX {
        return Err(refuse(&format!(
            "id {id} is not below {STREAM_ID_MAX} (the checking sink keeps a bitmap of ids)"
        )));
    }
    Ok((id, key, t))
}

/// Takes an item's id, key and `t` (if it has one), or says why it has none.
pub(crate) type Fields<E> = fn(&E) -> Result<(u64, u64, Option<u64>), String>;

/// The main job's source with `--source`: a log's entries or messages (a Redis stream
/// source's, a Kafka source's) as records, each created when it was produced (its `t`,
/// mapped onto the run's clock) or when read; `fields` takes an item's id, key and `t`,
/// or says why it has none. Positions, acknowledgements and failures are the inner
/// source's.
pub(crate) struct LogInput<S, E> {
    pub(crate) inner: S,
    pub(crate) fields: Fields<E>,
    /// Wall clock minus the run's clock (taken at the first record).
    pub(crate) offset: Option<u64>,
    /// Over several processes: creation times stay in the wall clock.
    pub(crate) wall: bool,
}

/// `--source redis-stream://…`.
pub(crate) type StreamInput = LogInput<StreamSource, StreamEntry>;

/// `--source kafka://…`: the Kafka source decodes each message's fields itself
/// ([`kafka_record_fields`]).
pub(crate) type KafkaInput =
    LogInput<KafkaSource<(u64, u64, Option<u64>)>, (u64, u64, Option<u64>)>;

impl<S: Source<E>, E: 'static> Source<Lookup> for LogInput<S, E> {
    fn poll_next(&mut self, now_ns: u64) -> SourceEvent<Lookup> {
        match self.inner.poll_next(now_ns) {
            SourceEvent::Record(item, timestamp) => match (self.fields)(&item) {
                Ok((id, key, produced)) => SourceEvent::Record(
                    Lookup(SourceRecord {
                        id,
                        key,
                        created_ns: created_at(produced, now_ns, &mut self.offset, self.wall),
                    }),
                    timestamp,
                ),
                Err(message) => SourceEvent::Failed(message),
            },
            SourceEvent::Watermark(w) => SourceEvent::Watermark(w),
            SourceEvent::Idle { until_ns } => SourceEvent::Idle { until_ns },
            SourceEvent::End => SourceEvent::End,
            SourceEvent::Failed(message) => SourceEvent::Failed(message),
        }
    }

    fn snapshot_state(&mut self) -> Option<Vec<u8>> {
        self.inner.snapshot_state()
    }

    fn restore_state(&mut self, state: &[u8]) -> Result<(), TaskError> {
        self.inner.restore_state(state)
    }

    fn notify_checkpoint_complete(&mut self, checkpoint: u64) -> Result<(), TaskError> {
        self.inner.notify_checkpoint_complete(checkpoint)
    }
}
