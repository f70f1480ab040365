//! The Redis Streams source: `XREAD` (or `XREADGROUP`) pipelined on the worker's own
//! driver, one connection per subtask, positions checkpointed per stream.
//!
//! Reading: each subtask reads its streams (see the module docs of `super` for how
//! they are split) with one command for all of them, `XREAD COUNT n BLOCK ms STREAMS
//! s1 s2 .. id1 id2 ..`, from the last ID it received of each. One read is in flight at
//! a time, and the next one goes out as soon as fewer than `count` entries are queued:
//! the next batch is on its way while the current one is handed out, so a busy stream
//! is read without a round trip's pause per batch. (`COUNT` bounds each stream's
//! entries in a reply, so at most `count × (streams + 1)` entries are buffered.) `BLOCK` makes the server hold the read until an entry arrives (or
//! `block` passes), so new entries are read within a round trip without polling; a
//! bounded source never blocks (see below). The reply's entries are queued in order and
//! handed out one per `poll_next`, each with its event time; after the last entry of a
//! reply comes the watermark, if it advanced.
//!
//! Positions: the last ID handed out per stream is the checkpointed position; a
//! restore reads strictly after it. Entries queued but not handed out at a barrier are
//! after the position, so they are read again after a restore: nothing is lost or
//! emitted twice. A lost connection (reset, timeout, a server restart) is made again
//! with the connection's back-off, and reading goes on from the last ID received: the
//! queued entries are still good, and the read whose reply was lost is sent again.
//!
//! What Redis does under the reader, and what the source does about it:
//! - a stream deleted (or never created) reads as empty: the source waits for entries
//!   (a bounded source counts it as done);
//! - entries trimmed (`XTRIM`, `MAXLEN`) or deleted (`XDEL`) before they were read are
//!   skipped: Redis returns the next entry still there, and the source cannot know what
//!   was lost (as a Kafka consumer past the retention);
//! - a reply that is not the shape of the command's (or whose IDs are not ascending
//!   after the position) fails the source: that is not Redis.
//!
//! Start: [`StartFrom::Beginning`] is after `0-0`; [`StartFrom::Id`] after the given ID
//! (exclusive, as `XREAD` reads); [`StartFrom::Latest`] after the IDs that are the
//! streams' last when the source opens (one `XREVRANGE key + - COUNT 1` each: `$`
//! cannot be used, since each read would mean "after the newest entry now" and skip
//! what arrived between two reads). A checkpoint taken before those IDs came back holds
//! no position for the stream, and a restore from it looks them up again.
//!
//! Bounded: the last IDs at open are the end (a stream empty or missing then is done at
//! once); entries after them are not read. A bounded source reads without `BLOCK`, so
//! a stream whose end entry was deleted meanwhile does not hold it for ever: a read
//! that returns fewer than `count` entries of a stream finds it done. The ends are
//! checkpointed with the positions, so a restored bounded job ends where it would have.
//!
//! Event time and watermarks: an entry's time is its ID's milliseconds
//! ([`EventTime::EntryId`]) or an integer field ([`EventTime::Field`]; an entry without
//! it, or with a value that is not a decimal integer, fails the source with
//! [`RedisError::EventTime`]). Watermarks are per stream, as Flink's Kafka source keeps
//! them per partition: the subtask's watermark is the minimum over its streams of the
//! largest time each handed out, less `out_of_orderness`, less 1 ms. A stream's IDs
//! ascend, so with event time from IDs no later entry is ever below it; a single
//! maximum over all streams would make a lagging stream's entries late. A stream that
//! has handed out nothing holds the watermark back, until it is idle.
//!
//! Idleness (`idle_timeout`): a stream with no entry for that long leaves the minimum;
//! when all of a subtask's streams are idle, the subtask emits [`IDLE_WATERMARK`]
//! (Flink's idle status), so that operators downstream take their watermark from the
//! other subtasks. Its next entry makes it active again: the watermark after that
//! entry's batch is emitted even if it did not advance. A subtask with no stream is idle from its first poll.
//!
//! Consumer groups ([`ConsumerGroup`]): `XREADGROUP GROUP g c` instead of `XREAD`, all
//! subtasks as the one consumer `c` (each stream is read by one subtask, so one name
//! suffices, and a stream's entries pending for `c` are found again whichever subtask
//! reads it after a change of parallelism). The source first reads `c`'s pending
//! entries (`XREADGROUP ... STREAMS s 0`: delivered before, not acknowledged): those at
//! or before a restored position are acknowledged (`XACK`) and skipped, the others
//! emitted; a pending entry whose data was deleted (nil fields) is acknowledged and
//! skipped. Then it reads new entries (`>`). With `create_group`, the group is made at
//! open (`XGROUP CREATE s g <start> MKSTREAM`; an existing group is kept as it is);
//! without it, a missing group fails the source with [`RedisError::NoGroup`].
//!
//! Acknowledgement: with checkpoints, the IDs handed out between two barriers are kept
//! (16 bytes each) and acknowledged once a checkpoint after them completed
//! ([`Source::notify_checkpoint_complete`]). A snapshot is not told its checkpoint's id,
//! so the source cannot tell which of the snapshots it took the completed checkpoint
//! is; it acknowledges every snapshot's entries except the newest snapshot's, which may
//! belong to a checkpoint still pending (one triggered just before this completion was
//! seen). That is exact, never early, with one checkpoint pending at a time (the
//! coordinator's default): acknowledgements trail by one checkpoint, which costs
//! nothing but a longer pending list, since a restore skips what its position covers.
//! Entries after the last completed checkpoint of a job that ended stay pending for
//! `c`. (An `XACK` queues behind a blocked read on the source's one connection: it goes
//! out within `block`.) Without checkpoints, each reply's entries are acknowledged once
//! handed out: if the job dies, what was acknowledged and not yet processed is lost
//! (at-most-once), and what was handed out and not yet acknowledged is delivered again
//! by the next run's pending read. A bounded group source's
//! last read may deliver entries past the end; they stay pending for `c`.
//!
//! Failures: a connection loss is retried; anything else (a malformed reply, an error
//! reply, refused credentials, a missing group, an entry without event time) fails the
//! source: `poll_next` returns [`SourceEvent::Failed`] with the error's message, and
//! the runtime fails the job with it (as for any failed task; a job with checkpoints
//! re-reads from the last completed one). Every reply is checked before it is used: a
//! malformed one is an error, never a panic.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::rc::Rc;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis_protocol::resp2::types::OwnedFrame;
use weir_engine::element::IDLE_WATERMARK;
use weir_engine::exchange::codec::{Codec, DecodeError, Decoder, Encoder};
use weir_engine::graph::{IoHandler, Source, SourceEvent, SubtaskInfo};
use weir_engine::runtime::TaskError;

use super::conn::{nanos, ConnEvent, ConnIo, ConnSettings, StreamConn};
use crate::redis::client::{Backoff, MAX_REPLY_BYTES_DEFAULT};
use crate::redis::error::RedisError;
use crate::redis::url::RedisUrl;

/// A stream entry's ID: milliseconds and a sequence number, written `ms-seq`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EntryId {
    /// Milliseconds (the server's clock when it added the entry, for IDs it made).
    pub ms: u64,
    /// The sequence number within the millisecond.
    pub seq: u64,
}

impl EntryId {
    /// `0-0`, before every entry.
    pub const ZERO: EntryId = EntryId { ms: 0, seq: 0 };

    /// The ID `ms-seq`.
    pub const fn new(ms: u64, seq: u64) -> Self {
        EntryId { ms, seq }
    }

    /// Parses `ms-seq` (or `ms`, meaning `ms-0`) from bytes.
    pub fn parse(text: &[u8]) -> Option<EntryId> {
        let decimal = |digits: &[u8]| -> Option<u64> {
            if digits.is_empty() || digits.len() > 20 || !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            std::str::from_utf8(digits).ok()?.parse().ok()
        };
        match text.iter().position(|&b| b == b'-') {
            Some(dash) => Some(EntryId {
                ms: decimal(&text[..dash])?,
                seq: decimal(&text[dash + 1..])?,
            }),
            None => Some(EntryId {
                ms: decimal(text)?,
                seq: 0,
            }),
        }
    }

    fn to_arg(self) -> Vec<u8> {
        self.to_string().into_bytes()
    }
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// Why text is not an [`EntryId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a stream entry ID: write milliseconds-sequence in decimal, e.g. 1700000000000-0")]
pub struct EntryIdError {
    /// The text given.
    pub text: String,
}

impl FromStr for EntryId {
    type Err = EntryIdError;
    fn from_str(text: &str) -> Result<Self, EntryIdError> {
        EntryId::parse(text.as_bytes()).ok_or_else(|| EntryIdError { text: text.into() })
    }
}

impl Codec for EntryId {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        self.ms.encode(out);
        self.seq.encode(out);
    }
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        Ok(EntryId {
            ms: u64::decode(input)?,
            seq: u64::decode(input)?,
        })
    }
}

/// One entry of a stream, as the source emits it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamEntry {
    /// The stream (key) it was read from.
    pub stream: String,
    /// Its ID.
    pub id: EntryId,
    /// Its field-value pairs, in the order they were added.
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
}

impl StreamEntry {
    /// The value of the first field named `name`.
    pub fn field(&self, name: &[u8]) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(field, _)| field.as_slice() == name)
            .map(|(_, value)| value.as_slice())
    }
}

impl Codec for StreamEntry {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        self.stream.encode(out);
        self.id.encode(out);
        (self.fields.len() as u32).encode(out);
        for (field, value) in &self.fields {
            field.encode(out);
            value.encode(out);
        }
    }
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        let stream = String::decode(input)?;
        let id = EntryId::decode(input)?;
        let count = u32::decode(input)? as usize;
        // Each pair takes at least its two 4-byte lengths: a corrupt count cannot make
        // the vector bigger than the record.
        let mut fields = Vec::with_capacity(count.min(input.remaining() / 8));
        for _ in 0..count {
            fields.push((Vec::<u8>::decode(input)?, Vec::<u8>::decode(input)?));
        }
        Ok(StreamEntry { stream, id, fields })
    }
}

/// Where a stream source starts when it is not restored from a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    /// Every entry (after `0-0`).
    Beginning,
    /// Entries added after the source opened (after each stream's last ID then).
    Latest,
    /// Entries after this ID (exclusive).
    Id(EntryId),
}

/// Where an entry's event time comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventTime {
    /// The ID's milliseconds.
    EntryId,
    /// A field holding milliseconds as a decimal integer.
    Field(String),
}

/// A consumer group to read through (`XREADGROUP`, `XACK`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroup {
    /// The group.
    pub group: String,
    /// The consumer name every subtask reads as.
    pub consumer: String,
    /// Make the group at open (`XGROUP CREATE ... MKSTREAM`, at the configured start)
    /// where it does not exist; an existing group keeps its position.
    pub create_group: bool,
}

/// Counters of the stream sources that share them (e.g. every subtask of a job), for
/// a metrics endpoint; each source adds to them as it goes.
#[derive(Debug, Default)]
pub struct StreamSourceStats {
    /// Entries received.
    pub entries: AtomicU64,
    /// `XREAD`/`XREADGROUP` commands sent.
    pub reads: AtomicU64,
    /// Entries acknowledged (`XACK` answered), in group mode.
    pub acknowledged: AtomicU64,
    /// Connections made again after one was lost.
    pub reconnects: AtomicU64,
    /// Connection losses and failures.
    pub errors: AtomicU64,
    /// Bytes received.
    pub bytes: AtomicU64,
}

/// The values of a [`StreamSourceStats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamSourceCounts {
    /// See [`StreamSourceStats::entries`].
    pub entries: u64,
    /// See [`StreamSourceStats::reads`].
    pub reads: u64,
    /// See [`StreamSourceStats::acknowledged`].
    pub acknowledged: u64,
    /// See [`StreamSourceStats::reconnects`].
    pub reconnects: u64,
    /// See [`StreamSourceStats::errors`].
    pub errors: u64,
    /// See [`StreamSourceStats::bytes`].
    pub bytes: u64,
}

impl StreamSourceStats {
    /// The counts now.
    pub fn snapshot(&self) -> StreamSourceCounts {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StreamSourceCounts {
            entries: get(&self.entries),
            reads: get(&self.reads),
            acknowledged: get(&self.acknowledged),
            reconnects: get(&self.reconnects),
            errors: get(&self.errors),
            bytes: get(&self.bytes),
        }
    }
}

fn add(counter: &AtomicU64, n: u64) {
    if n > 0 {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// Settings of a stream source.
#[derive(Debug, Clone)]
pub struct StreamSourceConfig {
    /// The server, credentials and database (RESP2 is spoken whatever the URL says).
    pub url: RedisUrl,
    /// The server's address as [`check`](Self::check) resolved it; `None`: each subtask
    /// resolves the URL when it is built (blocking its worker on DNS for a host name).
    pub addr: Option<SocketAddr>,
    /// The streams (keys) to read; stream `i` goes to subtask `i % parallelism`.
    pub streams: Vec<String>,
    /// Where to start without a checkpoint.
    pub start: StartFrom,
    /// Entries per read at most (`COUNT`).
    pub count: usize,
    /// How long the server holds a read that finds nothing (`BLOCK`): new entries are
    /// read within a round trip of their arrival without polling, and an idle source
    /// costs one command per `block`. Rounded down to milliseconds; at least 1 ms
    /// (`BLOCK 0` would wait for ever).
    pub block: Duration,
    /// Read up to the last IDs current at open, then end.
    pub bounded: bool,
    /// Where event time comes from.
    pub event_time: EventTime,
    /// How far entries may come out of event-time order: the watermark trails the
    /// largest time seen by this much (and 1 ms).
    pub out_of_orderness: Duration,
    /// A stream without entries for this long is idle (see the module docs); `None`:
    /// never.
    pub idle_timeout: Option<Duration>,
    /// Read through a consumer group.
    pub group: Option<ConsumerGroup>,
    /// Connect plus `AUTH`/`SELECT` within this.
    pub connect_timeout: Duration,
    /// Each reply within this of its command being sent (a blocking read gets `block`
    /// more).
    pub response_timeout: Duration,
    /// Reconnection back-off.
    pub backoff: Backoff,
    /// Largest reply buffered (a read's reply holds up to `count` entries).
    pub max_reply_bytes: usize,
    /// Counters to add to, e.g. shared with a metrics endpoint; `None`: each source
    /// keeps its own.
    pub stats: Option<Arc<StreamSourceStats>>,
}

impl StreamSourceConfig {
    /// Defaults for reading `streams` at `url`: from the beginning, 1000 entries per
    /// read, `BLOCK` 100 ms, unbounded, event time from entry IDs with no
    /// out-of-orderness, never idle, no group; 1 s connect timeout, 10 s response
    /// timeout, back-off 10 ms doubling to 1 s, replies up to 64 MiB.
    pub fn new(url: RedisUrl, streams: Vec<String>) -> Self {
        StreamSourceConfig {
            url,
            addr: None,
            streams,
            start: StartFrom::Beginning,
            count: 1000,
            block: Duration::from_millis(100),
            bounded: false,
            event_time: EventTime::EntryId,
            out_of_orderness: Duration::ZERO,
            idle_timeout: None,
            group: None,
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(10),
            backoff: Backoff {
                initial: Duration::from_millis(10),
                max: Duration::from_secs(1),
            },
            max_reply_bytes: MAX_REPLY_BYTES_DEFAULT,
            stats: None,
        }
    }

    /// Checks the settings; [`RedisError::Config`] says what to fix.
    pub fn validate(&self) -> Result<(), RedisError> {
        let problem = if self.streams.is_empty() {
            Some("no streams: name at least one stream to read".to_string())
        } else if let Some(twice) = self
            .streams
            .iter()
            .enumerate()
            .find(|(i, s)| self.streams[..*i].contains(s))
        {
            Some(format!(
                "stream {:?} is named twice; name each stream once",
                twice.1
            ))
        } else if self.count == 0 {
            Some("count must be at least 1 (entries per XREAD)".into())
        } else if self.block < Duration::from_millis(1) {
            Some("block must be at least 1 ms (XREAD BLOCK 0 would wait for ever)".into())
        } else if self.event_time == EventTime::Field(String::new()) {
            Some(
                "the event-time field's name is empty; name the field, or use EventTime::EntryId"
                    .into(),
            )
        } else if self.idle_timeout.is_some_and(|t| t.is_zero()) {
            Some("idle_timeout must be positive; None means never idle".into())
        } else if self
            .group
            .as_ref()
            .is_some_and(|g| g.group.is_empty() || g.consumer.is_empty())
        {
            Some("a consumer group needs a group name and a consumer name".into())
        } else if self.connect_timeout.is_zero() || self.response_timeout.is_zero() {
            Some("connect and response timeouts must be positive".into())
        } else if self.backoff.initial > self.backoff.max {
            Some("the initial back-off must not exceed the maximum".into())
        } else if self.max_reply_bytes == 0 {
            Some("max_reply_bytes must be positive".into())
        } else {
            None
        };
        match problem {
            Some(problem) => Err(RedisError::Config(format!("stream source: {problem}"))),
            None => Ok(()),
        }
    }

    /// Checks the settings and resolves the server's address (blocking, once, before
    /// the graph is built): set [`addr`](Self::addr) to it.
    pub fn check(&self) -> Result<SocketAddr, RedisError> {
        self.validate()?;
        Ok(self.url.resolve()?)
    }

    /// The streams subtask `index` of `parallelism` reads, round robin.
    pub fn streams_of(&self, index: usize, parallelism: usize) -> Vec<String> {
        let parallelism = parallelism.max(1);
        self.streams
            .iter()
            .enumerate()
            .filter(|(i, _)| i % parallelism == index)
            .map(|(_, s)| s.clone())
            .collect()
    }
}

/// Builds subtask `info`'s source and the I/O handler its task drives, for
/// [`Graph::from_source_io`](weir_engine::graph::Graph::from_source_io):
/// `graph.from_source_io(move |info| stream_source(&config, info))`. Settings that
/// [`validate`](StreamSourceConfig::validate) refuses, or a host that does not resolve,
/// fail the source at its first poll.
pub fn stream_source(
    config: &StreamSourceConfig,
    info: &SubtaskInfo,
) -> (StreamSource, Option<Box<dyn IoHandler>>) {
    let source = StreamSource::new(config, info.index, info.parallelism, info.checkpointing);
    let io = ConnIo(Rc::clone(&source.conn));
    (source, Some(Box::new(io)))
}

/// One of a subtask's streams.
#[derive(Debug)]
struct Tracked {
    name: String,
    /// The last ID handed out (or the start); `None` until known (see the module docs).
    position: Option<EntryId>,
    /// Read strictly after this: the last ID received (the start before any). In group
    /// mode, the pending entries' cursor.
    cursor: Option<EntryId>,
    /// Bounded: the last ID at open (`0-0` for an empty stream).
    end: Option<EntryId>,
    /// Bounded: nothing more to read.
    done: bool,
    /// Group mode: reading this consumer's pending entries.
    pending: bool,
    /// Group mode after a restore: pending entries at or before this were emitted.
    skip_to: Option<EntryId>,
    /// The largest event time handed out.
    max_ts: Option<i64>,
    /// When it last handed out an entry (or the source started), by the run's clock.
    active_ns: u64,
    /// Group mode: IDs handed out and not yet put in a snapshot (with checkpoints) or
    /// acknowledged (without).
    handed: Vec<EntryId>,
    /// Group mode: IDs to acknowledge at once (skipped pending entries).
    skipped: Vec<EntryId>,
}

/// What a command sent is, to match its reply.
#[derive(Debug)]
enum Sent {
    /// `XGROUP CREATE` of stream `i`.
    Create(usize),
    /// `XREVRANGE key + - COUNT 1` of stream `i`.
    Last(usize),
    /// A read of these streams (pending entries in group mode, or new ones).
    Read { streams: Vec<usize>, pending: bool },
    /// `XACK` of these IDs of stream `i`.
    Ack(usize, Vec<EntryId>),
}

/// An entry queued, or the end of a reply's entries (where the watermark goes).
#[derive(Debug)]
enum Item {
    Entry {
        stream: usize,
        entry: StreamEntry,
        ts: i64,
    },
    BatchEnd,
}

/// IDs per `XACK` at most.
const ACK_CHUNK: usize = 1024;

/// How long to wait before asking a server that answered `LOADING` (restarted, reading
/// its data) again.
const LOADING_RETRY: Duration = Duration::from_millis(100);

/// One subtask's reader; see the module docs.
pub struct StreamSource {
    config: StreamSourceConfig,
    conn: Rc<RefCell<StreamConn>>,
    streams: Vec<Tracked>,
    /// Commands sent, in order, matched to their replies.
    sent: VecDeque<Sent>,
    queue: VecDeque<Item>,
    queued_entries: usize,
    started: bool,
    /// Set-up commands (`XGROUP CREATE`, `XREVRANGE`) not yet answered.
    opening: usize,
    read_in_flight: bool,
    /// No command before this (the server answered `LOADING`).
    hold_until_ns: u64,
    /// Commands to send again once the hold is over.
    deferred: Vec<Sent>,
    checkpointing: bool,
    /// Group mode with checkpoints: the IDs handed out between snapshots, per stream,
    /// oldest first.
    segments: VecDeque<Vec<Vec<EntryId>>>,
    emitted_watermark: i64,
    idle: bool,
    reactivated: bool,
    stats: Arc<StreamSourceStats>,
    seen_bytes: u64,
    seen_reconnects: u64,
    now_ns: u64,
    /// A failure found outside `poll_next` (or at build), raised at the next poll.
    error: Option<RedisError>,
    /// It returned [`SourceEvent::Failed`]; it stays failed.
    failed: bool,
    count_arg: Vec<u8>,
    block_arg: Vec<u8>,
}

impl StreamSource {
    /// Subtask `index` of `parallelism`'s source; `checkpointing`: whether the job
    /// checkpoints (group mode acknowledges at checkpoints then).
    pub fn new(
        config: &StreamSourceConfig,
        index: usize,
        parallelism: usize,
        checkpointing: bool,
    ) -> Self {
        let mut error = config.validate().err();
        let addr = match config.addr {
            Some(addr) => addr,
            None => config.url.resolve().unwrap_or_else(|e| {
                error.get_or_insert(e.into());
                SocketAddr::from(([127, 0, 0, 1], config.url.port))
            }),
        };
        let settings = ConnSettings {
            connect_timeout: config.connect_timeout,
            response_timeout: config.response_timeout,
            backoff: config.backoff,
            max_reply_bytes: config.max_reply_bytes,
        };
        let group = config.group.is_some();
        let start = match config.start {
            StartFrom::Beginning => Some(EntryId::ZERO),
            StartFrom::Id(id) => Some(id),
            StartFrom::Latest => None,
        };
        let streams = config
            .streams_of(index, parallelism)
            .into_iter()
            .map(|name| Tracked {
                name,
                // In group mode the group holds the start; nothing is handed out yet.
                position: if group { None } else { start },
                cursor: if group { Some(EntryId::ZERO) } else { start },
                end: None,
                done: false,
                pending: group,
                skip_to: None,
                max_ts: None,
                active_ns: 0,
                handed: Vec::new(),
                skipped: Vec::new(),
            })
            .collect();
        StreamSource {
            conn: Rc::new(RefCell::new(StreamConn::new(
                config.url.clone(),
                addr,
                settings,
            ))),
            streams,
            sent: VecDeque::new(),
            queue: VecDeque::new(),
            queued_entries: 0,
            started: false,
            opening: 0,
            read_in_flight: false,
            hold_until_ns: 0,
            deferred: Vec::new(),
            checkpointing,
            segments: VecDeque::new(),
            emitted_watermark: i64::MIN,
            idle: false,
            reactivated: false,
            stats: config.stats.clone().unwrap_or_default(),
            seen_bytes: 0,
            seen_reconnects: 0,
            now_ns: 0,
            error,
            failed: false,
            count_arg: config.count.to_string().into_bytes(),
            block_arg: config.block.as_millis().to_string().into_bytes(),
            config: config.clone(),
        }
    }

    /// The I/O handler driving this source's connection (what [`stream_source`]
    /// returns beside it).
    pub fn io(&self) -> Box<dyn IoHandler> {
        Box::new(ConnIo(Rc::clone(&self.conn)))
    }

    /// The streams this subtask reads.
    pub fn streams(&self) -> Vec<&str> {
        self.streams.iter().map(|s| s.name.as_str()).collect()
    }

    /// Its counters.
    pub fn stats(&self) -> &Arc<StreamSourceStats> {
        &self.stats
    }

    /// Fails the source: see the module docs ("Failures").
    fn fail(&mut self, error: RedisError) -> SourceEvent<StreamEntry> {
        add(&self.stats.errors, 1);
        self.failed = true;
        SourceEvent::Failed(format!("redis stream source: {error}"))
    }

    /// The first poll: set-up commands, or the end/idleness of a subtask without
    /// streams.
    fn start(&mut self) -> Option<SourceEvent<StreamEntry>> {
        self.started = true;
        for stream in &mut self.streams {
            stream.active_ns = self.now_ns;
        }
        if self.streams.is_empty() {
            if self.config.bounded {
                return Some(SourceEvent::End);
            }
            self.idle = true;
            return Some(SourceEvent::Watermark(IDLE_WATERMARK));
        }
        for i in 0..self.streams.len() {
            if self.config.group.as_ref().is_some_and(|g| g.create_group) {
                self.issue(Sent::Create(i));
                self.opening += 1;
            }
            self.open_stream(i);
        }
        self.settle();
        None
    }

    /// Asks for stream `i`'s last ID if its start or end needs it.
    fn open_stream(&mut self, i: usize) {
        let stream = &self.streams[i];
        let group = self.config.group.is_some();
        let needs_start = !group && stream.position.is_none();
        let needs_end = self.config.bounded && stream.end.is_none();
        if needs_start || needs_end {
            self.issue(Sent::Last(i));
            self.opening += 1;
        }
    }

    /// Encodes `sent`'s command into the connection and notes it.
    fn issue(&mut self, sent: Sent) {
        let mut conn = self.conn.borrow_mut();
        let group = self.config.group.as_ref();
        match &sent {
            Sent::Create(i) => {
                let group = group.expect("only group mode creates groups");
                let start = match self.config.start {
                    StartFrom::Beginning => b"0".to_vec(),
                    StartFrom::Latest => b"$".to_vec(),
                    StartFrom::Id(id) => id.to_arg(),
                };
                conn.command(&[
                    b"XGROUP",
                    b"CREATE",
                    self.streams[*i].name.as_bytes(),
                    group.group.as_bytes(),
                    &start,
                    b"MKSTREAM",
                ]);
            }
            Sent::Last(i) => {
                conn.command(&[
                    b"XREVRANGE",
                    self.streams[*i].name.as_bytes(),
                    b"+",
                    b"-",
                    b"COUNT",
                    b"1",
                ]);
            }
            Sent::Read { streams, pending } => {
                let mut args: Vec<Vec<u8>> = Vec::with_capacity(10 + 2 * streams.len());
                match group {
                    Some(group) => {
                        args.push(b"XREADGROUP".to_vec());
                        args.push(b"GROUP".to_vec());
                        args.push(group.group.as_bytes().to_vec());
                        args.push(group.consumer.as_bytes().to_vec());
                    }
                    None => args.push(b"XREAD".to_vec()),
                }
                args.push(b"COUNT".to_vec());
                args.push(self.count_arg.clone());
                // Pending entries are history, answered at once; a bounded source
                // never waits (see the module docs).
                let block = !*pending && !self.config.bounded;
                if block {
                    args.push(b"BLOCK".to_vec());
                    args.push(self.block_arg.clone());
                }
                args.push(b"STREAMS".to_vec());
                for &i in streams {
                    args.push(self.streams[i].name.as_bytes().to_vec());
                }
                for &i in streams {
                    let stream = &self.streams[i];
                    args.push(match (group, *pending) {
                        (Some(_), false) => b">".to_vec(),
                        _ => stream.cursor.unwrap_or(EntryId::ZERO).to_arg(),
                    });
                }
                let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
                let allowance = if block {
                    self.config.block
                } else {
                    Duration::ZERO
                };
                conn.command_with_timeout(&args, allowance);
                add(&self.stats.reads, 1);
            }
            Sent::Ack(i, ids) => {
                let group = group.expect("only group mode acknowledges");
                let ids: Vec<Vec<u8>> = ids.iter().map(|id| id.to_arg()).collect();
                let mut args: Vec<&[u8]> = vec![
                    b"XACK",
                    self.streams[*i].name.as_bytes(),
                    group.group.as_bytes(),
                ];
                args.extend(ids.iter().map(Vec::as_slice));
                conn.command(&args);
            }
        }
        drop(conn);
        self.sent.push_back(sent);
    }

    /// Acknowledges `ids` of stream `i`, in chunks.
    fn acknowledge(&mut self, i: usize, ids: Vec<EntryId>) {
        for chunk in ids.chunks(ACK_CHUNK) {
            self.issue(Sent::Ack(i, chunk.to_vec()));
        }
    }

    /// Takes what the connection has: replies and losses.
    fn take_events(&mut self) -> Result<(), RedisError> {
        loop {
            let event = self.conn.borrow_mut().next_event();
            let Some(event) = event else { break };
            match event {
                ConnEvent::Reply(frame) => {
                    let Some(sent) = self.sent.pop_front() else {
                        return Err(self.malformed("a reply to no command".into()));
                    };
                    self.on_reply(sent, frame)?;
                }
                ConnEvent::Lost(error) => {
                    add(&self.stats.errors, 1);
                    let fatal = !error.is_transient()
                        || matches!(
                            error,
                            RedisError::Malformed { .. } | RedisError::TooDeep { .. }
                        );
                    if fatal {
                        return Err(error);
                    }
                    for sent in std::mem::take(&mut self.sent) {
                        self.redo(sent);
                    }
                }
            }
        }
        let conn = self.conn.borrow();
        let bytes = conn.received_bytes();
        // Every connection after the first is a reconnection.
        let reconnects = conn.connects().saturating_sub(1);
        drop(conn);
        add(&self.stats.bytes, bytes - self.seen_bytes);
        add(&self.stats.reconnects, reconnects - self.seen_reconnects);
        self.seen_bytes = bytes;
        self.seen_reconnects = reconnects;
        Ok(())
    }

    /// Sends again (or, for a read, lets the next poll send again) a command whose
    /// reply was lost or refused for now.
    fn redo(&mut self, sent: Sent) {
        match sent {
            Sent::Read { streams, .. } => {
                self.read_in_flight = false;
                if self.config.group.is_some() {
                    // A `>` read whose reply was lost delivered its entries all the same:
                    // they are pending for the consumer, after the cursor. Read them from
                    // the pending list before reading new ones again.
                    for i in streams {
                        if !self.streams[i].done {
                            self.streams[i].pending = true;
                        }
                    }
                }
            }
            other => self.issue(other),
        }
    }

    fn malformed(&self, reason: String) -> RedisError {
        RedisError::Malformed {
            addr: self.conn.borrow().peer().to_string(),
            reason,
        }
    }

    fn on_reply(&mut self, sent: Sent, frame: OwnedFrame) -> Result<(), RedisError> {
        if let OwnedFrame::Error(message) = &frame {
            if message.starts_with("LOADING") {
                // A server restarted and still loading its data: ask again shortly.
                self.hold_until_ns = self.now_ns + nanos(LOADING_RETRY);
                match sent {
                    Sent::Read { .. } => self.read_in_flight = false,
                    other => self.deferred.push(other),
                }
                return Ok(());
            }
        }
        match sent {
            Sent::Create(i) => {
                self.opening -= 1;
                match frame {
                    OwnedFrame::Error(message) if message.starts_with("BUSYGROUP") => {}
                    OwnedFrame::Error(message) => {
                        return Err(RedisError::Server {
                            command: format!("XGROUP CREATE of stream {:?}", self.streams[i].name),
                            message,
                        })
                    }
                    _ => {}
                }
            }
            Sent::Last(i) => {
                self.opening -= 1;
                let entries = match frame {
                    OwnedFrame::Error(message) => {
                        return Err(RedisError::Server {
                            command: format!("XREVRANGE of stream {:?}", self.streams[i].name),
                            message,
                        })
                    }
                    frame => parse_entries(frame).map_err(|r| {
                        self.malformed(format!("XREVRANGE of {:?}: {r}", self.streams[i].name))
                    })?,
                };
                let last = entries.first().map_or(EntryId::ZERO, |(id, _)| *id);
                let stream = &mut self.streams[i];
                if self.config.group.is_none() && stream.position.is_none() {
                    stream.position = Some(last);
                    stream.cursor = Some(last);
                }
                if self.config.bounded && stream.end.is_none() {
                    stream.end = Some(last);
                }
            }
            Sent::Read { streams, pending } => {
                self.read_in_flight = false;
                self.on_read(frame, &streams, pending)?;
            }
            Sent::Ack(i, ids) => match frame {
                OwnedFrame::Integer(_) => add(&self.stats.acknowledged, ids.len() as u64),
                OwnedFrame::Error(message) => return Err(self.refused(&[i], "XACK", message)),
                _ => return Err(self.malformed("XACK expects an integer".into())),
            },
        }
        self.settle();
        Ok(())
    }

    /// The error for an error reply to a command on `streams`.
    fn refused(&self, streams: &[usize], command: &str, message: String) -> RedisError {
        let names: Vec<&str> = streams
            .iter()
            .map(|&i| self.streams[i].name.as_str())
            .collect();
        match &self.config.group {
            Some(group) if message.starts_with("NOGROUP") => RedisError::NoGroup {
                group: group.group.clone(),
                stream: names.join(", "),
                message,
            },
            _ => RedisError::Server {
                command: format!("{command} of streams {names:?}"),
                message,
            },
        }
    }

    /// Marks bounded streams done once their position reached their end.
    fn settle(&mut self) {
        if self.opening > 0 {
            return;
        }
        for stream in &mut self.streams {
            if let (Some(end), Some(position)) = (stream.end, stream.position) {
                if position >= end && !stream.pending {
                    stream.done = true;
                }
            }
        }
    }

    /// Queues the entries of a read's reply.
    fn on_read(
        &mut self,
        frame: OwnedFrame,
        streams: &[usize],
        pending: bool,
    ) -> Result<(), RedisError> {
        let command = if self.config.group.is_some() {
            "XREADGROUP"
        } else {
            "XREAD"
        };
        let items = match frame {
            OwnedFrame::Null => Vec::new(),
            OwnedFrame::Array(items) => items,
            OwnedFrame::Error(message) => return Err(self.refused(streams, command, message)),
            _ => {
                return Err(self.malformed(format!("{command} expects an array of streams or nil")))
            }
        };
        let mut answered = vec![false; self.streams.len()];
        let before = self.queued_entries;
        for item in items {
            let (name, entries) = match item {
                OwnedFrame::Array(pair) if pair.len() == 2 => {
                    let mut pair = pair.into_iter();
                    match (pair.next(), pair.next()) {
                        (Some(OwnedFrame::BulkString(name)), Some(entries)) => (name, entries),
                        _ => {
                            return Err(self.malformed(format!(
                                "{command} expects [stream name, entries] per stream"
                            )))
                        }
                    }
                }
                _ => {
                    return Err(self.malformed(format!(
                        "{command} expects [stream name, entries] per stream"
                    )))
                }
            };
            let Some(&i) = streams
                .iter()
                .find(|&&i| self.streams[i].name.as_bytes() == name.as_slice())
            else {
                return Err(self.malformed(format!(
                    "{command} answered for stream {:?}, which it did not read",
                    String::from_utf8_lossy(&name)
                )));
            };
            if std::mem::replace(&mut answered[i], true) {
                return Err(self.malformed(format!(
                    "{command} answered twice for stream {:?}",
                    self.streams[i].name
                )));
            }
            let entries = parse_entries(entries).map_err(|reason| {
                self.malformed(format!("{command} of {:?}: {reason}", self.streams[i].name))
            })?;
            let got = entries.len();
            for (id, fields) in entries {
                if !self.take_entry(i, id, fields, pending)? {
                    break;
                }
            }
            if got < self.config.count {
                // Fewer than asked: nothing more there now.
                self.exhausted(i, pending);
            }
        }
        for &i in streams {
            if !answered[i] {
                self.exhausted(i, pending);
            }
        }
        add(&self.stats.entries, (self.queued_entries - before) as u64);
        if self.queued_entries > before {
            self.queue.push_back(Item::BatchEnd);
        }
        for i in 0..self.streams.len() {
            let skipped = std::mem::take(&mut self.streams[i].skipped);
            if !skipped.is_empty() {
                self.acknowledge(i, skipped);
            }
        }
        Ok(())
    }

    /// A read found nothing more of stream `i`: its pending entries are all read, or
    /// (bounded) the stream is done.
    fn exhausted(&mut self, i: usize, pending: bool) {
        let stream = &mut self.streams[i];
        if pending {
            stream.pending = false;
        } else if self.config.bounded {
            stream.done = true;
        }
    }

    /// Queues one entry of stream `i` (or skips it); whether to go on with the
    /// stream's entries in this reply.
    fn take_entry(
        &mut self,
        i: usize,
        id: EntryId,
        fields: Option<Vec<(Vec<u8>, Vec<u8>)>>,
        pending: bool,
    ) -> Result<bool, RedisError> {
        let stream = &mut self.streams[i];
        if let Some(cursor) = stream.cursor {
            if id <= cursor {
                let name = stream.name.clone();
                return Err(self.malformed(format!(
                    "entry {id} of stream {name:?} is not after {cursor}, where the read started"
                )));
            }
        }
        stream.cursor = Some(id);
        if stream.end.is_some_and(|end| id > end) {
            // Past a bounded stream's end: not read (see the module docs).
            stream.done = true;
            stream.pending = false;
            return Ok(false);
        }
        let Some(fields) = fields else {
            // A pending entry whose data is gone.
            stream.skipped.push(id);
            return Ok(true);
        };
        if pending && stream.skip_to.is_some_and(|to| id <= to) {
            stream.skipped.push(id);
            return Ok(true);
        }
        let entry = StreamEntry {
            stream: stream.name.clone(),
            id,
            fields,
        };
        let ts = self.event_time(&entry)?;
        if self.streams[i].end == Some(id) {
            self.streams[i].done = true;
        }
        self.queue.push_back(Item::Entry {
            stream: i,
            entry,
            ts,
        });
        self.queued_entries += 1;
        Ok(true)
    }

    fn event_time(&self, entry: &StreamEntry) -> Result<i64, RedisError> {
        match &self.config.event_time {
            EventTime::EntryId => Ok(i64::try_from(entry.id.ms).unwrap_or(i64::MAX)),
            EventTime::Field(name) => {
                let fail = |reason: String| RedisError::EventTime {
                    stream: entry.stream.clone(),
                    id: entry.id.to_string(),
                    reason,
                };
                let value = entry
                    .field(name.as_bytes())
                    .ok_or_else(|| fail(format!("it has no field {name:?}")))?;
                std::str::from_utf8(value)
                    .ok()
                    .and_then(|text| text.parse::<i64>().ok())
                    .ok_or_else(|| {
                        fail(format!(
                            "field {name:?} is {:?}, not an integer",
                            String::from_utf8_lossy(value)
                        ))
                    })
            }
        }
    }

    /// Sends the next read if one is due, and acknowledgements owed.
    fn request(&mut self) {
        if !self.started || self.now_ns < self.hold_until_ns {
            return;
        }
        for sent in std::mem::take(&mut self.deferred) {
            self.issue(sent);
        }
        if self.opening > 0 {
            return;
        }
        if self.read_in_flight || self.queued_entries >= self.config.count {
            return;
        }
        let live = |s: &Tracked| !s.done;
        let pending: Vec<usize> = (0..self.streams.len())
            .filter(|&i| live(&self.streams[i]) && self.streams[i].pending)
            .collect();
        let (streams, pending) = if pending.is_empty() {
            let all = (0..self.streams.len())
                .filter(|&i| live(&self.streams[i]))
                .collect();
            (all, false)
        } else {
            (pending, true)
        };
        if streams.is_empty() {
            return;
        }
        self.read_in_flight = true;
        self.issue(Sent::Read { streams, pending });
    }

    /// Notes an entry of stream `i` handed out.
    fn hand_out(&mut self, i: usize, id: EntryId, ts: i64) {
        let stream = &mut self.streams[i];
        stream.position = Some(id);
        stream.max_ts = Some(stream.max_ts.map_or(ts, |max| max.max(ts)));
        stream.active_ns = self.now_ns;
        if self.config.group.is_some() {
            stream.handed.push(id);
        }
        if self.idle {
            self.idle = false;
            self.reactivated = true;
        }
    }

    /// The watermark to emit now, if it advanced (or the source came back from idle).
    fn watermark(&mut self) -> Option<i64> {
        let mut min: Option<i64> = None;
        for stream in &self.streams {
            if stream.done || self.stream_idle(stream) {
                continue;
            }
            let max = stream.max_ts?;
            min = Some(min.map_or(max, |m| m.min(max)));
        }
        let bound = i64::try_from(self.config.out_of_orderness.as_millis()).unwrap_or(i64::MAX);
        let watermark = min?.saturating_sub(bound).saturating_sub(1);
        if watermark > self.emitted_watermark || self.reactivated {
            let watermark = watermark.max(self.emitted_watermark);
            self.emitted_watermark = watermark;
            self.reactivated = false;
            return Some(watermark);
        }
        None
    }

    fn stream_idle(&self, stream: &Tracked) -> bool {
        self.config
            .idle_timeout
            .is_some_and(|t| self.now_ns.saturating_sub(stream.active_ns) >= nanos(t))
    }

    /// With nothing to hand out: the idle mark when every stream went idle, or the
    /// watermark that streams going idle let advance.
    fn idleness(&mut self) -> Option<SourceEvent<StreamEntry>> {
        self.config.idle_timeout?;
        if self.idle {
            return None;
        }
        let mut live = self.streams.iter().filter(|s| !s.done).peekable();
        live.peek()?;
        if live.all(|s| self.stream_idle(s)) {
            self.idle = true;
            self.reactivated = false;
            return Some(SourceEvent::Watermark(IDLE_WATERMARK));
        }
        self.watermark().map(SourceEvent::Watermark)
    }

    /// When to poll again without I/O: a stream's idle timeout, or the end of a hold.
    fn wake_at(&self) -> Option<u64> {
        let hold = (self.hold_until_ns > self.now_ns).then_some(self.hold_until_ns);
        let idle = match self.config.idle_timeout {
            Some(timeout) if !self.idle => self
                .streams
                .iter()
                .filter(|s| !s.done && !self.stream_idle(s))
                .map(|s| s.active_ns.saturating_add(nanos(timeout)))
                .min(),
            _ => None,
        };
        [hold, idle].into_iter().flatten().min()
    }

    /// Whether a bounded source read everything and its acknowledgements were answered.
    fn finished(&self) -> bool {
        self.config.bounded
            && self.opening == 0
            && self.queue.is_empty()
            && self.sent.is_empty()
            && self.deferred.is_empty()
            && self.streams.iter().all(|s| s.done)
    }

    /// Without checkpoints, group mode acknowledges what it handed out.
    fn acknowledge_handed(&mut self) {
        if self.config.group.is_none() || self.checkpointing {
            return;
        }
        for i in 0..self.streams.len() {
            let handed = std::mem::take(&mut self.streams[i].handed);
            if !handed.is_empty() {
                self.acknowledge(i, handed);
            }
        }
    }
}

impl Source<StreamEntry> for StreamSource {
    fn poll_next(&mut self, now_ns: u64) -> SourceEvent<StreamEntry> {
        self.now_ns = now_ns;
        if let Some(error) = self.error.take() {
            return self.fail(error);
        }
        if self.failed {
            return SourceEvent::Failed("redis stream source: polled after it failed".into());
        }
        if !self.started {
            if let Some(event) = self.start() {
                return event;
            }
        }
        if let Err(error) = self.take_events() {
            return self.fail(error);
        }
        loop {
            match self.queue.pop_front() {
                Some(Item::Entry { stream, entry, ts }) => {
                    self.queued_entries -= 1;
                    self.hand_out(stream, entry.id, ts);
                    self.request();
                    return SourceEvent::Record(entry, Some(ts));
                }
                Some(Item::BatchEnd) => {
                    self.acknowledge_handed();
                    if let Some(watermark) = self.watermark() {
                        return SourceEvent::Watermark(watermark);
                    }
                }
                None => break,
            }
        }
        self.request();
        if self.finished() {
            return SourceEvent::End;
        }
        if let Some(event) = self.idleness() {
            return event;
        }
        SourceEvent::Idle {
            until_ns: self.wake_at(),
        }
    }

    /// The last ID handed out and the end of each of this subtask's streams.
    fn snapshot_state(&mut self) -> Option<Vec<u8>> {
        if self.config.group.is_some() && self.checkpointing {
            let segment = self
                .streams
                .iter_mut()
                .map(|s| std::mem::take(&mut s.handed))
                .collect();
            self.segments.push_back(segment);
        }
        let mut out = Vec::with_capacity(8 + self.streams.len() * 48);
        STATE_VERSION.encode(&mut out);
        (self.streams.len() as u32).encode(&mut out);
        for stream in &self.streams {
            stream.name.encode(&mut out);
            stream.position.encode(&mut out);
            stream.end.encode(&mut out);
        }
        Some(out)
    }

    /// Acknowledges (group mode) the entries of every snapshot but the newest: see the
    /// module docs.
    fn notify_checkpoint_complete(&mut self, _checkpoint: u64) -> Result<(), TaskError> {
        if self.config.group.is_none() || !self.checkpointing {
            return Ok(());
        }
        // Replies first, so that the commands noted match the connection's.
        self.take_events()
            .map_err(|e| format!("redis stream source: {e}"))?;
        while self.segments.len() > 1 {
            let segment = self.segments.pop_front().expect("more than one");
            for (i, ids) in segment.into_iter().enumerate() {
                if !ids.is_empty() {
                    self.acknowledge(i, ids);
                }
            }
        }
        Ok(())
    }

    /// Continues strictly after the checkpointed positions (see the module docs).
    fn restore_state(&mut self, state: &[u8]) -> Result<(), TaskError> {
        let restored = decode_state(state).map_err(|reason| {
            RedisError::Position(format!("{reason}; it was not written by this source"))
        })?;
        let names: Vec<&str> = restored.iter().map(|(n, ..)| n.as_str()).collect();
        let mine = self.streams();
        if names != mine {
            return Err(RedisError::Position(format!(
                "it holds positions of streams {names:?}, and this subtask reads {mine:?}; \
                 restore with the streams and parallelism the checkpoint was taken with"
            ))
            .into());
        }
        let group = self.config.group.is_some();
        for (stream, (_, position, end)) in self.streams.iter_mut().zip(restored) {
            if group {
                // The group holds the read position; pending entries up to this one
                // were emitted.
                stream.skip_to = position;
                stream.position = position;
            } else if let Some(position) = position {
                stream.position = Some(position);
                stream.cursor = Some(position);
            }
            if end.is_some() {
                stream.end = end;
            }
        }
        Ok(())
    }
}

/// The layout of [`StreamSource::snapshot_state`]: this byte, a `u32` count, then per
/// stream its name, position and end (each an `Option<EntryId>`).
const STATE_VERSION: u8 = 1;

type Position = (String, Option<EntryId>, Option<EntryId>);

fn decode_state(mut state: &[u8]) -> Result<Vec<Position>, String> {
    let input = &mut state;
    let version = u8::decode(input).map_err(|e| e.to_string())?;
    if version != STATE_VERSION {
        return Err(format!(
            "state version {version}, and this source reads version {STATE_VERSION}"
        ));
    }
    let count = u32::decode(input).map_err(|e| e.to_string())? as usize;
    let mut out = Vec::with_capacity(count.min(input.len() / 6));
    for _ in 0..count {
        let name = String::decode(input).map_err(|e| e.to_string())?;
        let position = Option::<EntryId>::decode(input).map_err(|e| e.to_string())?;
        let end = Option::<EntryId>::decode(input).map_err(|e| e.to_string())?;
        out.push((name, position, end));
    }
    if !input.is_empty() {
        return Err(format!("{} bytes after the positions", input.len()));
    }
    Ok(out)
}

type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// A stream's entries: `[[id, [field, value, ...]], ...]`; nil fields (a pending entry
/// deleted since) are `None`.
fn parse_entries(frame: OwnedFrame) -> Result<Vec<(EntryId, Option<Fields>)>, String> {
    let items = match frame {
        OwnedFrame::Array(items) => items,
        // A missing key in some replies.
        OwnedFrame::Null => return Ok(Vec::new()),
        _ => return Err("expected an array of entries".into()),
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let OwnedFrame::Array(pair) = item else {
            return Err("expected [id, fields] per entry".into());
        };
        let mut pair = pair.into_iter();
        let (Some(OwnedFrame::BulkString(id)), Some(fields), None) =
            (pair.next(), pair.next(), pair.next())
        else {
            return Err("expected [id, fields] per entry".into());
        };
        let id = EntryId::parse(&id).ok_or_else(|| {
            format!(
                "{:?} is not an entry ID",
                String::from_utf8_lossy(&id[..id.len().min(64)])
            )
        })?;
        let fields = match fields {
            OwnedFrame::Null => None,
            OwnedFrame::Array(values) => {
                if values.len() % 2 != 0 {
                    return Err(format!("entry {id} has an odd number of fields and values"));
                }
                let mut fields = Vec::with_capacity(values.len() / 2);
                let mut values = values.into_iter();
                while let (Some(field), Some(value)) = (values.next(), values.next()) {
                    match (field, value) {
                        (OwnedFrame::BulkString(field), OwnedFrame::BulkString(value)) => {
                            fields.push((field, value))
                        }
                        _ => return Err(format!("entry {id} has a field that is not a string")),
                    }
                }
                Some(fields)
            }
            _ => return Err(format!("entry {id}'s fields are not an array")),
        };
        out.push((id, fields));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_ids_parse_print_and_order() {
        let id: EntryId = "1700000000000-7".parse().expect("id");
        assert_eq!(id, EntryId::new(1_700_000_000_000, 7));
        assert_eq!(id.to_string(), "1700000000000-7");
        assert_eq!("5".parse::<EntryId>(), Ok(EntryId::new(5, 0)));
        for bad in [
            "",
            "-",
            "1-",
            "-1",
            "a-1",
            "1-2-3",
            "1 -2",
            "99999999999999999999999-0",
        ] {
            let error = bad.parse::<EntryId>().expect_err(bad);
            assert!(
                error.to_string().contains("milliseconds-sequence"),
                "{error}"
            );
        }
        assert!(EntryId::new(1, 9) < EntryId::new(2, 0));
        assert!(EntryId::new(2, 0) < EntryId::new(2, 1));
    }

    #[test]
    fn entries_round_trip_through_the_codec() {
        let entry = StreamEntry {
            stream: "s".into(),
            id: EntryId::new(3, 4),
            fields: vec![(b"f".to_vec(), b"v".to_vec()), (Vec::new(), b"x".to_vec())],
        };
        let mut bytes = Vec::new();
        entry.encode(&mut bytes);
        let mut input = bytes.as_slice();
        assert_eq!(StreamEntry::decode(&mut input), Ok(entry));
        assert!(input.is_empty());
        // A corrupt field count fails, it does not allocate for it.
        let mut bytes = Vec::new();
        "s".to_string().encode(&mut bytes);
        EntryId::ZERO.encode(&mut bytes);
        u32::MAX.encode(&mut bytes);
        assert!(StreamEntry::decode(&mut bytes.as_slice()).is_err());
    }

    fn bulk(text: &str) -> OwnedFrame {
        OwnedFrame::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn entries_are_checked_before_they_are_used() {
        let good = OwnedFrame::Array(vec![OwnedFrame::Array(vec![
            bulk("1-1"),
            OwnedFrame::Array(vec![bulk("f"), bulk("v")]),
        ])]);
        let parsed = parse_entries(good).expect("entries");
        assert_eq!(
            parsed,
            vec![(
                EntryId::new(1, 1),
                Some(vec![(b"f".to_vec(), b"v".to_vec())])
            )]
        );
        let bad = [
            (OwnedFrame::Integer(1), "array of entries"),
            (OwnedFrame::Array(vec![bulk("1-1")]), "[id, fields]"),
            (
                OwnedFrame::Array(vec![OwnedFrame::Array(vec![
                    bulk("x"),
                    OwnedFrame::Array(vec![]),
                ])]),
                "not an entry ID",
            ),
            (
                OwnedFrame::Array(vec![OwnedFrame::Array(vec![
                    bulk("1-1"),
                    OwnedFrame::Array(vec![bulk("f")]),
                ])]),
                "odd number",
            ),
            (
                OwnedFrame::Array(vec![OwnedFrame::Array(vec![
                    bulk("1-1"),
                    OwnedFrame::Array(vec![bulk("f"), OwnedFrame::Integer(3)]),
                ])]),
                "not a string",
            ),
        ];
        for (frame, hint) in bad {
            let error = parse_entries(frame).expect_err(hint);
            assert!(error.contains(hint), "{hint}: {error}");
        }
    }

    fn config(streams: &[&str]) -> StreamSourceConfig {
        let mut config = StreamSourceConfig::new(
            "redis://127.0.0.1:9".parse().expect("url"),
            streams.iter().map(|s| s.to_string()).collect(),
        );
        config.addr = Some("127.0.0.1:9".parse().expect("addr"));
        config
    }

    #[test]
    fn settings_are_checked_with_what_to_fix() {
        for (change, hint) in [
            (
                (|c: &mut StreamSourceConfig| c.streams.clear()) as fn(&mut StreamSourceConfig),
                "no streams",
            ),
            (|c| c.streams.push("a".into()), "named twice"),
            (|c| c.count = 0, "count"),
            (|c| c.block = Duration::ZERO, "BLOCK 0"),
            (|c| c.event_time = EventTime::Field(String::new()), "field"),
            (|c| c.idle_timeout = Some(Duration::ZERO), "idle_timeout"),
            (
                |c| {
                    c.group = Some(ConsumerGroup {
                        group: String::new(),
                        consumer: "c".into(),
                        create_group: false,
                    })
                },
                "group name",
            ),
        ] {
            let mut config = config(&["a", "b"]);
            change(&mut config);
            let error = config.validate().expect_err(hint);
            assert!(matches!(error, RedisError::Config(_)), "{error}");
            assert!(error.to_string().contains(hint), "{hint}: {error}");
        }
        assert!(config(&["a"]).validate().is_ok());
    }

    #[test]
    fn streams_go_to_subtasks_round_robin() {
        let config = config(&["a", "b", "c", "d", "e"]);
        assert_eq!(config.streams_of(0, 2), ["a", "c", "e"]);
        assert_eq!(config.streams_of(1, 2), ["b", "d"]);
        assert!(config.streams_of(5, 6).is_empty());
    }

    /// Positions round-trip; a state of other streams, another version or trailing
    /// bytes is refused with what to do.
    #[test]
    fn positions_restore_only_onto_the_same_streams() {
        let config = config(&["a", "b", "c"]);
        let mut source = StreamSource::new(&config, 0, 2, true);
        source.streams[0].position = Some(EntryId::new(5, 1));
        source.streams[1].end = Some(EntryId::new(9, 0));
        let state = source.snapshot_state().expect("state");
        let mut restored = StreamSource::new(&config, 0, 2, true);
        restored.restore_state(&state).expect("restores");
        assert_eq!(restored.streams[0].cursor, Some(EntryId::new(5, 1)));
        assert_eq!(restored.streams[1].cursor, Some(EntryId::ZERO));
        assert_eq!(restored.streams[1].end, Some(EntryId::new(9, 0)));

        let mut other = StreamSource::new(&config, 1, 2, true);
        let error = other.restore_state(&state).expect_err("other streams");
        assert!(error.to_string().contains("parallelism"), "{error}");
        let mut bad = state.clone();
        bad[0] = 9;
        let error = restored.restore_state(&bad).expect_err("version");
        assert!(error.to_string().contains("version 9"), "{error}");
        let mut long = state.clone();
        long.push(0);
        assert!(restored.restore_state(&long).is_err());
        assert!(restored.restore_state(&state[..state.len() - 1]).is_err());
    }

    fn entry(stream: usize, id: u64) -> Item {
        Item::Entry {
            stream,
            entry: StreamEntry {
                stream: String::new(),
                id: EntryId::new(id, 0),
                fields: Vec::new(),
            },
            ts: id as i64,
        }
    }

    /// The watermark is the minimum over streams of their largest time, less the
    /// bound and 1 ms; a stream without entries holds it back until it is idle, and
    /// the idle mark comes once every stream is idle.
    #[test]
    fn watermarks_are_per_stream_and_idle_streams_leave_the_minimum() {
        let mut config = config(&["a", "b"]);
        config.out_of_orderness = Duration::from_millis(10);
        config.idle_timeout = Some(Duration::from_secs(1));
        let mut source = StreamSource::new(&config, 0, 1, false);
        source.started = true;
        source.opening = 1; // no reads: nothing to send them on
        let ms = 1_000_000;
        source
            .queue
            .extend([entry(0, 100), entry(0, 150), Item::BatchEnd]);
        source.queued_entries = 2;
        let mut events = Vec::new();
        for now in [0, 1, 2, 3] {
            events.push(source.poll_next(now * ms));
        }
        // Stream b has nothing yet: no watermark.
        assert!(matches!(events[0], SourceEvent::Record(_, Some(100))));
        assert!(matches!(events[1], SourceEvent::Record(_, Some(150))));
        assert_eq!(
            events[2],
            SourceEvent::Idle {
                until_ns: Some(1000 * ms)
            }
        );
        source.queue.extend([entry(1, 120), Item::BatchEnd]);
        source.queued_entries = 1;
        assert!(matches!(
            source.poll_next(4 * ms),
            SourceEvent::Record(_, Some(120))
        ));
        assert_eq!(source.poll_next(5 * ms), SourceEvent::Watermark(109));
        // Stream b goes quiet; a keeps going: the watermark follows a alone.
        source.queue.extend([entry(0, 400), Item::BatchEnd]);
        source.queued_entries = 1;
        assert!(matches!(
            source.poll_next(600 * ms),
            SourceEvent::Record(..)
        ));
        assert!(matches!(
            source.poll_next(600 * ms),
            SourceEvent::Idle { .. }
        ));
        assert_eq!(source.poll_next(1004 * ms), SourceEvent::Watermark(389));
        // Both quiet: the idle mark, once.
        assert_eq!(
            source.poll_next(1600 * ms),
            SourceEvent::Watermark(IDLE_WATERMARK)
        );
        assert_eq!(
            source.poll_next(1700 * ms),
            SourceEvent::Idle { until_ns: None }
        );
        // An entry makes it active again, with a watermark even if it did not advance.
        source.queue.extend([entry(1, 200), Item::BatchEnd]);
        source.queued_entries = 1;
        assert!(matches!(
            source.poll_next(1800 * ms),
            SourceEvent::Record(..)
        ));
        assert_eq!(source.poll_next(1800 * ms), SourceEvent::Watermark(389));
    }
}
