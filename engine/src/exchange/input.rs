//! The consumer side of an exchange: an input gate over N channels.
//!
//! The gate reads each channel's buffers in place (a local channel hands over the
//! producer's own segments), decodes records that lie inside one buffer directly from
//! it, reassembles records and length prefixes that span buffers in a per-channel
//! scratch vector, and drops (recycles) each buffer as soon as its last byte is read.
//!
//! Records come one at a time ([`InputGate::poll_next`]) or in runs
//! ([`InputGate::poll_run_at`]): the records lying whole, one after another, in one
//! channel's buffer, decoded in one pass, up to a count the caller sets. A run stops at
//! an event, at a record that continues in the next buffer, and at the buffer's end, so
//! the two forms yield the same records and events in the same order. In place
//! ([`InputGate::poll_run_in_place_at`]), each record of a run is handed over as its
//! bytes where they lie in the buffer, not decoded, so a large record is copied once on
//! its way (into the segment, by the writer).
//!
//! Watermarks combine as Flink's `StatusWatermarkValve` does: the gate's watermark is
//! the minimum over channels that have not ended and are not idle, and it is emitted
//! only when it advances. A channel that sends [`IDLE_WATERMARK`] is idle until it
//! sends a real watermark again; when every live channel is idle, the gate emits the
//! idle mark once itself. A channel's end-of-partition removes it from the minimum;
//! when every channel has ended the gate emits [`GateEvent::End`] once.
//!
//! Fairness: the gate reads one buffer of a channel, then moves on to the next channel
//! that has data (round robin at buffer granularity, as Flink's gate polls channels).
//! A buffer that ends inside a record ends the channel's turn too: the record waits in
//! the channel's partial until its next turn, so a channel that keeps writing records
//! larger than its buffers gets one buffer per round like any other.
//!
//! Buffers arrive as views of what the producer published (see `channel`); a view may
//! end inside a record, which the next view of the channel continues.
//!
//! Checkpoint barriers (see [`checkpoint::alignment`](crate::checkpoint::alignment)):
//! a barrier frame goes to the gate's [`BarrierAligner`]. Aligned, a channel whose
//! barrier arrived is not read until every channel's has; then the gate yields
//! [`GateEvent::Barrier`] (the task snapshots and forwards it) and reads every channel
//! again. Unaligned, the first barrier yields it at once, and the records still arriving
//! on a channel before that channel's barrier are copied, as they were framed, into the
//! checkpoint's channel state ([`InputGate::take_channel_state`]); a restored gate yields
//! such records ([`InputGate::restore_channel_state`]) before anything its channels bring.
//!
//! Debloating (off unless [`InputGate::set_debloat`]): [`InputGate::poll_next_at`]
//! feeds the gate's [`Debloater`] its bytes and idle time once per period, and passes
//! each new buffer size to every channel ([`InputChannel::announce_buffer_size`]).

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::time::Duration;

use crate::checkpoint::{Alignment, AlignmentMode, BarrierAligner};
use crate::element::IDLE_WATERMARK;
use crate::error::{ConfigError, DebloatError, ExchangeError};
use crate::exchange::channel::InputChannel;
use crate::exchange::codec::{Codec, Decoder};
use crate::exchange::debloat::{DebloatConfig, Debloater};
use crate::exchange::pool::SharedBuffer;
use crate::exchange::writer::{BARRIER_TAG, END_TAG, WATERMARK_TAG};
use crate::limits::{EVENT_TAG_MIN, RECORD_SIZE_MAX_DEFAULT};

/// Polls between two looks at the channels' barrier announcements.
const ANNOUNCEMENT_POLLS: u32 = 32;

/// What the gate yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateEvent<T> {
    /// A record and the channel it came from.
    Record {
        /// The record.
        value: T,
        /// The input channel.
        channel: usize,
    },
    /// The combined watermark advanced to this timestamp.
    Watermark(i64),
    /// Every channel has ended.
    End,
    /// Checkpoint `id`'s barriers are aligned (or, unaligned, the first came): the task
    /// snapshots its state now and forwards the barrier.
    Barrier {
        /// The checkpoint.
        id: u64,
        /// From its first barrier to this moment.
        alignment: Duration,
        /// Whether it is unaligned: its channel state follows from
        /// [`InputGate::take_channel_state`].
        unaligned: bool,
    },
    /// Checkpoint `id` cannot complete at this gate (a newer barrier overtook its
    /// alignment).
    CheckpointAborted {
        /// The checkpoint.
        id: u64,
        /// Why (boxed: this rare event must not make every event the gate returns
        /// larger, nor give it a field to drop).
        reason: Box<String>,
    },
}

/// What [`InputGate::poll_run_at`] yields: a run of records, or the event that splits
/// runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateRun<T> {
    /// `count` records of `channel`, in order, were appended to the caller's run.
    Records {
        /// The input channel they all came from.
        channel: usize,
        /// How many were appended (at least one).
        count: usize,
    },
    /// An event (never [`GateEvent::Record`]): everything before it was in earlier
    /// runs, nothing after it is.
    Event(GateEvent<T>),
}

/// A record as [`InputGate::poll_run_in_place_at`] hands it over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordRef<'a, T> {
    /// The record's encoding (without its length prefix) where it lies in the
    /// channel's buffer: read it in place, with no copy; the buffer is recycled once the
    /// run is done. The bytes are not decoded by the gate: [`decode`](Self::decode)
    /// checks them as [`InputGate::poll_next`] does.
    Bytes(&'a [u8]),
    /// A record that spanned buffers (or was taken out of its channel ahead of its
    /// turn), decoded.
    Value(T),
}

impl<T: Codec> RecordRef<'_, T> {
    /// The record as a value: decoded from the bytes (an error if they are not a whole
    /// `T`), or the value itself.
    pub fn decode(self) -> Result<T, crate::exchange::codec::DecodeError> {
        match self {
            RecordRef::Bytes(mut bytes) => {
                let value = T::decode(&mut bytes)?;
                if !bytes.is_empty() {
                    return Err(crate::exchange::codec::DecodeError::Trailing(bytes.len()));
                }
                Ok(value)
            }
            RecordRef::Value(value) => Ok(value),
        }
    }
}

/// Counters of a gate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GateMetrics {
    /// Records decoded.
    pub records_in: u64,
    /// Bytes read (records and events, with prefixes).
    pub bytes_in: u64,
    /// Buffers consumed: views of the bytes a producer published, so a buffer read
    /// while it was written counts once per view.
    pub buffers_in: u64,
    /// Nanoseconds the gate had nothing to give (measured by [`InputGate::poll_next_at`]).
    pub idle_ns: u64,
    /// The buffer size last announced to the channels (debloating; 0: none).
    pub announced_buffer_size: u64,
    /// Buffer sizes announced.
    pub announcements: u64,
}

/// A frame being reassembled across buffers.
#[derive(Debug, Default)]
struct Partial {
    header: [u8; 4],
    header_len: usize,
    body: Vec<u8>,
    body_len: usize,
}

struct ChannelState {
    input: Box<dyn InputChannel>,
    buffer: Option<SharedBuffer>,
    offset: usize,
    partial: Partial,
    watermark: i64,
    /// It sent [`IDLE_WATERMARK`] and no watermark since.
    idle: bool,
    ended: bool,
    /// Its end was read ahead (it waits in `drained`): nothing more is read from it.
    end_read: bool,
}

enum Frame<T> {
    Record(T),
    Watermark(i64),
    Barrier(u64),
    End,
    /// The channel's buffer is used up in the middle of a frame: its turn ends (the
    /// frame waits in its partial), though it may have more buffers already.
    TurnEnded,
}

/// An input gate decoding records of type `T`.
///
/// Reading a run in place: each record's bytes where they lie in the buffer (a `u64`
/// is its 8 little-endian bytes), decoded only where a record spanned buffers.
///
/// ```
/// use weir_engine::exchange::{
///     local_channel, GateEvent, GateRun, InputGate, LocalBufferPool, LocalPoolConfig,
///     NetworkBufferPool, RecordRef, RecordWriter, ResultPartition, RoundRobin, WriterConfig,
/// };
///
/// // One partition of one subpartition, its channel and the gate reading it.
/// let network = NetworkBufferPool::new(16, 4096)?;
/// let pool = LocalBufferPool::new(&network, LocalPoolConfig::new(8, 1).with_overdraft(0))?;
/// let (sender, receiver) = local_channel(8, None);
/// let partition = ResultPartition::new(pool, vec![sender])?;
/// let mut writer = RecordWriter::new(partition, RoundRobin::default(), WriterConfig::default())?;
/// let mut gate: InputGate<u64> = InputGate::new(vec![Box::new(receiver)])?;
///
/// let records: Vec<u64> = (0..1_000).collect();
/// let mut written = 0;
/// while written < records.len() {
///     // A run: the channels chosen first, then each stretch encoded into its buffer.
///     written += writer.emit_run(&records[written..], 0)?;
/// }
/// writer.finish(0)?;
///
/// let mut sum = 0;
/// loop {
///     let next = gate.poll_run_in_place(256, |_channel, record| {
///         sum += match record {
///             RecordRef::Bytes(bytes) => u64::from_le_bytes(bytes.try_into().unwrap()),
///             RecordRef::Value(value) => value,
///         };
///     })?;
///     if let Some(GateRun::Event(GateEvent::End)) = next {
///         break;
///     }
/// }
/// assert_eq!(sum, records.iter().sum::<u64>());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct InputGate<T: Codec> {
    channels: Vec<ChannelState>,
    /// The channel being read (its current buffer is not finished) or to look at next.
    cursor: usize,
    watermark: i64,
    /// The idle mark went downstream and no channel became active since.
    idle_emitted: bool,
    ended_channels: usize,
    end_emitted: bool,
    max_record_size: usize,
    metrics: GateMetrics,
    idle_since_ns: Option<u64>,
    debloat: Option<Debloater>,
    /// Barrier alignment; made at the first barrier if not set before.
    aligner: Option<BarrierAligner>,
    /// Some channel may be blocked (an aligned checkpoint is aligning), or a checkpoint
    /// may time out: the clock is looked at.
    blocking: bool,
    /// The unaligned checkpoint whose channel state is being recorded.
    recording: Option<Recording>,
    /// Channel state recorded whole, for the task to take.
    recorded: Option<(u64, Vec<u8>)>,
    /// What the aligner asked for that is still to be yielded.
    events: VecDeque<GateEvent<T>>,
    /// Frames taken out of their channels ahead of their turn (restored channel state,
    /// and what an announced unaligned barrier overtook), yielded before anything the
    /// channels still hold.
    drained: VecDeque<(usize, Frame<T>)>,
    /// Channels being read ahead to their barrier, which was announced ahead of them.
    draining: Vec<bool>,
    /// Some channel may be read ahead (recomputed at each look at announcements).
    any_draining: bool,
    /// The newest barrier announcement acted on.
    announced: u64,
    /// The newest aligned barrier announcement (one that may time out) acted on.
    aligned_announced: u64,
    /// Polls since announcements were last looked at.
    polls: u32,
    /// The clock of the last [`poll_next_at`](Self::poll_next_at).
    now_ns: u64,
    _records: PhantomData<fn() -> T>,
}

/// The channel state of an unaligned checkpoint being recorded: the frames of the
/// channels whose barrier has not come yet.
struct Recording {
    id: u64,
    channels: Vec<bool>,
    bytes: Vec<u8>,
}

impl<T: Codec> InputGate<T> {
    /// A gate over `channels`, accepting records up to the default maximum size.
    pub fn new(channels: Vec<Box<dyn InputChannel>>) -> Result<Self, ConfigError> {
        Self::with_max_record_size(channels, RECORD_SIZE_MAX_DEFAULT)
    }

    /// A gate over `channels`; a length prefix above `max_record_size` is a malformed frame.
    pub fn with_max_record_size(
        channels: Vec<Box<dyn InputChannel>>,
        max_record_size: usize,
    ) -> Result<Self, ConfigError> {
        if channels.is_empty() {
            return Err(ConfigError::ZeroCapacity {
                what: "input gate channel count",
            });
        }
        let channels = channels
            .into_iter()
            .map(|input| ChannelState {
                input,
                buffer: None,
                offset: 0,
                partial: Partial::default(),
                watermark: i64::MIN,
                idle: false,
                ended: false,
                end_read: false,
            })
            .collect();
        Ok(InputGate {
            channels,
            cursor: 0,
            watermark: i64::MIN,
            idle_emitted: false,
            ended_channels: 0,
            end_emitted: false,
            max_record_size,
            metrics: GateMetrics::default(),
            idle_since_ns: None,
            debloat: None,
            aligner: None,
            blocking: false,
            recording: None,
            recorded: None,
            events: VecDeque::new(),
            drained: VecDeque::new(),
            draining: Vec::new(),
            any_draining: false,
            announced: 0,
            aligned_announced: 0,
            polls: 0,
            now_ns: 0,
            _records: PhantomData,
        })
    }

    /// How this gate aligns checkpoint barriers (aligned unless set).
    pub fn set_alignment(&mut self, mode: AlignmentMode) {
        self.aligner = Some(BarrierAligner::new(self.channels.len(), mode));
        self.draining = vec![false; self.channels.len()];
    }

    /// When the alignment in progress switches to unaligned (aligned with a timeout),
    /// by the caller's clock; [`poll_next_at`](Self::poll_next_at) acts on it.
    pub fn alignment_deadline(&self) -> Option<u64> {
        self.aligner.as_ref().and_then(BarrierAligner::deadline)
    }

    /// The channel state of an unaligned checkpoint once every channel's barrier came:
    /// its id and the frames recorded (as the channels framed them), to be stored with
    /// the task's snapshot and handed to [`restore_channel_state`](Self::restore_channel_state).
    pub fn take_channel_state(&mut self) -> Option<(u64, Vec<u8>)> {
        self.recorded.take()
    }

    /// Whether channel state is still being recorded for checkpoint `id`.
    pub fn is_recording(&self, id: u64) -> bool {
        self.recording.as_ref().is_some_and(|r| r.id == id)
    }

    /// Restores channel state taken by [`take_channel_state`](Self::take_channel_state):
    /// its records come out of [`poll_next`](Self::poll_next) before any channel's.
    pub fn restore_channel_state(&mut self, mut bytes: &[u8]) -> Result<(), ExchangeError> {
        while !bytes.is_empty() {
            if bytes.len() < 4 {
                return Err(ExchangeError::Malformed {
                    channel: 0,
                    reason: "channel state ends inside a length prefix".into(),
                });
            }
            let len = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
            if len > self.max_record_size || bytes.len() < 4 + len {
                return Err(ExchangeError::Malformed {
                    channel: 0,
                    reason: format!(
                        "channel state holds a record of {len} bytes that is cut off or too long"
                    ),
                });
            }
            match decode_frame::<T>(len as u32, &bytes[4..4 + len], 0)? {
                Frame::Record(value) => self.drained.push_back((0, Frame::Record(value))),
                _ => unreachable!("a length below the event tags is a record"),
            }
            bytes = &bytes[4 + len..];
        }
        Ok(())
    }

    /// Fraction of the buffers its channels can hold that wait for it (Flink's
    /// `inPoolUsage`; a buffer being read counts).
    pub fn in_pool_usage(&self) -> f64 {
        let (used, capacity) = self.channels.iter().fold((0, 0), |(u, c), state| {
            let (used, capacity) = state.input.usage();
            (u + used, c + capacity)
        });
        if capacity == 0 {
            0.0
        } else {
            used as f64 / capacity as f64
        }
    }

    /// Bytes in flight on its channels, in total and on the fullest one: what each
    /// channel's producer published (or what arrived, on a remote channel) that this
    /// gate has not read yet, the buffer it is reading included. Channels that cannot
    /// tell count only what the gate holds.
    pub fn in_flight_bytes(&self) -> (u64, u64) {
        self.channels.iter().fold((0, 0), |(total, max), state| {
            let held = state
                .buffer
                .as_ref()
                .map_or(0, |b| b.as_slice().len().saturating_sub(state.offset))
                as u64;
            let bytes = state.input.queued_bytes().unwrap_or(0) + held;
            (total + bytes, max.max(bytes))
        })
    }

    /// Its input channels.
    pub fn channels(&self) -> usize {
        self.channels.len()
    }

    /// The current combined watermark (`i64::MIN` before any).
    pub fn watermark(&self) -> i64 {
        self.watermark
    }

    /// Counters.
    pub fn metrics(&self) -> GateMetrics {
        self.metrics
    }

    /// Whether every channel ended and `End` was returned.
    pub fn is_finished(&self) -> bool {
        self.end_emitted
    }

    /// Turns buffer debloating on: from now on [`poll_next_at`](Self::poll_next_at)
    /// measures the gate's throughput and announces buffer sizes to the channels.
    pub fn set_debloat(&mut self, config: DebloatConfig) -> Result<(), DebloatError> {
        self.debloat = Some(Debloater::new(config)?);
        Ok(())
    }

    /// The debloater, when debloating is on.
    pub fn debloater(&self) -> Option<&Debloater> {
        self.debloat.as_ref()
    }

    /// Like [`poll_next`](Self::poll_next), also counting idle time by the caller's
    /// clock (from the first empty poll to the next one that yields something) and
    /// driving the debloater, when there is one.
    pub fn poll_next_at(&mut self, now_ns: u64) -> Result<Option<GateEvent<T>>, ExchangeError> {
        self.before_poll(now_ns, false)?;
        let mut next = self.poll_next()?;
        if next.is_none() && !self.draining.is_empty() && self.take_announcements()? {
            next = self.poll_next()?;
        }
        self.after_poll(now_ns, next.is_some());
        Ok(next)
    }

    /// The batch form of [`poll_next_at`](Self::poll_next_at): appends to `run` up to
    /// `max` records of one channel, decoded in one pass over the buffer they lie in
    /// (one length check, bounds check and decode per record, the rest once per run),
    /// or yields the next event. A run never crosses an event, nor a buffer's end, so
    /// records, watermarks, barriers and the end come in exactly the order and at the
    /// positions [`poll_next_at`](Self::poll_next_at) gives them, as the gate's
    /// equivalence tests check; channel fairness is the same (one buffer per turn).
    /// `None`: nothing now. `max` of 0 is taken as 1.
    pub fn poll_run_at(
        &mut self,
        now_ns: u64,
        run: &mut Vec<T>,
        max: usize,
    ) -> Result<Option<GateRun<T>>, ExchangeError> {
        self.before_poll(now_ns, true)?;
        let mut next = self.poll_run(run, max)?;
        if next.is_none() && !self.draining.is_empty() && self.take_announcements()? {
            next = self.poll_run(run, max)?;
        }
        self.after_poll(now_ns, next.is_some());
        Ok(next)
    }

    /// [`poll_run_at`](Self::poll_run_at) reading in place: each record of the run goes
    /// to `each` with its channel, as its bytes where they lie in the buffer
    /// ([`RecordRef::Bytes`]: no decode, no copy; a 1000-byte record is copied once on
    /// its way, into the segment) or, for a record that spanned buffers or was taken
    /// ahead of its turn, decoded ([`RecordRef::Value`]). Runs, events and their order
    /// are those of [`poll_run_at`](Self::poll_run_at); the count in
    /// [`GateRun::Records`] is the records handed to `each`.
    pub fn poll_run_in_place_at(
        &mut self,
        now_ns: u64,
        max: usize,
        mut each: impl FnMut(usize, RecordRef<'_, T>),
    ) -> Result<Option<GateRun<T>>, ExchangeError> {
        self.before_poll(now_ns, true)?;
        let mut next = self.poll_run_in_place(max, &mut each)?;
        if next.is_none() && !self.draining.is_empty() && self.take_announcements()? {
            next = self.poll_run_in_place(max, &mut each)?;
        }
        self.after_poll(now_ns, next.is_some());
        Ok(next)
    }

    /// [`poll_run_in_place_at`](Self::poll_run_in_place_at) without the clock's
    /// bookkeeping.
    pub fn poll_run_in_place(
        &mut self,
        max: usize,
        mut each: impl FnMut(usize, RecordRef<'_, T>),
    ) -> Result<Option<GateRun<T>>, ExchangeError> {
        if self.drained.is_empty() && self.events.is_empty() {
            let channel = self.cursor;
            let count = self.run_in_buffer(max.max(1), |bytes| {
                each(channel, RecordRef::Bytes(bytes));
                Ok(())
            })?;
            if count > 0 {
                return Ok(Some(GateRun::Records { channel, count }));
            }
        }
        Ok(match self.poll_next()? {
            None => None,
            Some(GateEvent::Record { value, channel }) => {
                each(channel, RecordRef::Value(value));
                Some(GateRun::Records { channel, count: 1 })
            }
            Some(event) => Some(GateRun::Event(event)),
        })
    }

    /// [`poll_run_at`](Self::poll_run_at) without the clock's bookkeeping (idle time,
    /// debloating, alignment timeouts), as [`poll_next`](Self::poll_next) is to
    /// [`poll_next_at`](Self::poll_next_at).
    pub fn poll_run(
        &mut self,
        run: &mut Vec<T>,
        max: usize,
    ) -> Result<Option<GateRun<T>>, ExchangeError> {
        if self.drained.is_empty() && self.events.is_empty() {
            let max = max.max(1);
            let channel = self.cursor;
            let count = self.run_in_buffer(max, |mut body| {
                let value = T::decode(&mut body)?;
                if !body.is_empty() {
                    return Err(crate::exchange::codec::DecodeError::Trailing(body.len()));
                }
                run.push(value);
                Ok(())
            })?;
            if count > 0 {
                return Ok(Some(GateRun::Records { channel, count }));
            }
        }
        Ok(match self.poll_next()? {
            None => None,
            Some(GateEvent::Record { value, channel }) => {
                run.push(value);
                Some(GateRun::Records { channel, count: 1 })
            }
            Some(event) => Some(GateRun::Event(event)),
        })
    }

    /// What every poll by the clock does first. Announcements of barriers ahead of the
    /// data are looked at every few polls (every poll for runs, which are few), at every
    /// poll while a channel is read ahead to its barrier, and whenever the gate is idle.
    #[inline]
    fn before_poll(&mut self, now_ns: u64, run: bool) -> Result<(), ExchangeError> {
        if self.debloat.as_ref().is_some_and(|d| d.is_due(now_ns)) {
            self.debloat_period(now_ns);
        }
        self.now_ns = now_ns;
        let mut switched = false;
        if self.blocking {
            if let Some(aligner) = self.aligner.as_mut() {
                let alignment = aligner.on_time(now_ns);
                // A timeout: the channels that announced the barrier are read ahead now.
                switched = matches!(alignment, Alignment::Snapshot { .. });
                self.on_alignment(alignment);
            }
        }
        if !self.draining.is_empty() {
            self.polls = self.polls.wrapping_add(1);
            if switched || run || self.polls % ANNOUNCEMENT_POLLS == 1 || self.any_draining {
                self.take_announcements()?;
            }
        }
        Ok(())
    }

    /// Idle time: from the first empty poll to the next one that yields something.
    #[inline]
    fn after_poll(&mut self, now_ns: u64, yielded: bool) {
        match (yielded, self.idle_since_ns) {
            (false, None) => self.idle_since_ns = Some(now_ns),
            (true, Some(since)) => {
                self.metrics.idle_ns += now_ns.saturating_sub(since);
                self.idle_since_ns = None;
            }
            _ => {}
        }
    }

    /// The records lying whole, one after another, in the current channel's current
    /// buffer from its read offset: each record's bytes (without its length prefix) go
    /// to `each`, up to `max` of them; stops at an event, a frame that continues in the
    /// next buffer, or the buffer's end (where the buffer is recycled and the next
    /// channel gets its turn). How many were taken. Recorded as channel state, when it
    /// is being recorded, in one copy.
    #[inline]
    fn run_in_buffer(
        &mut self,
        max: usize,
        mut each: impl FnMut(&[u8]) -> Result<(), crate::exchange::codec::DecodeError>,
    ) -> Result<usize, ExchangeError> {
        let channel = self.cursor;
        let channels = self.channels.len();
        if self.blocking && self.is_blocked(channel) {
            return Ok(0);
        }
        let max_record_size = self.max_record_size;
        let state = &mut self.channels[channel];
        let Some(buffer) = &state.buffer else {
            return Ok(0);
        };
        if state.partial.header_len != 0 {
            return Ok(0);
        }
        let bytes = buffer.as_slice();
        let start = state.offset;
        let mut offset = start;
        let mut count = 0;
        while count < max {
            let Some(prefix) = bytes.get(offset..offset + 4) else {
                break;
            };
            let len = u32::from_le_bytes(prefix.try_into().expect("4 bytes"));
            let end = offset + 4 + len as usize;
            if len >= EVENT_TAG_MIN || len as usize > max_record_size || end > bytes.len() {
                break;
            }
            if let Err(source) = each(&bytes[offset + 4..end]) {
                // What was decoded before stays taken; the failing record is not.
                state.offset = offset;
                self.metrics.records_in += count as u64;
                return Err(ExchangeError::Decode { channel, source });
            }
            offset = end;
            count += 1;
        }
        if count == 0 {
            return Ok(0);
        }
        if let Some(recording) = self.recording.as_mut() {
            if recording.channels[channel] {
                recording.bytes.extend_from_slice(&bytes[start..offset]);
            }
        }
        state.offset = offset;
        if offset == bytes.len() {
            // Consumed: recycle now, and give the next channel its turn.
            state.buffer = None;
            self.cursor = (channel + 1) % channels;
        }
        self.metrics.records_in += count as u64;
        Ok(count)
    }

    /// Ends a debloating period: a new size goes to every channel.
    #[cold]
    fn debloat_period(&mut self, now_ns: u64) {
        let idle_ns = self.metrics.idle_ns
            + self
                .idle_since_ns
                .map_or(0, |since| now_ns.saturating_sub(since));
        let channels = self.channels.len();
        // Bytes read: taken from the channels, less what waits in the views held.
        let unread: usize = self
            .channels
            .iter()
            .map(|c| c.buffer.as_ref().map_or(0, |b| b.len() - c.offset))
            .sum();
        let bytes = self.metrics.bytes_in - unread as u64;
        let Some(debloater) = self.debloat.as_mut() else {
            return;
        };
        if let Some(size) = debloater.on_period(now_ns, bytes, idle_ns, channels) {
            for state in &mut self.channels {
                state.input.announce_buffer_size(size);
            }
            self.metrics.announced_buffer_size = size as u64;
            self.metrics.announcements += 1;
        }
    }

    /// The next record or event, or `None` if no channel has anything now.
    pub fn poll_next(&mut self) -> Result<Option<GateEvent<T>>, ExchangeError> {
        if !self.drained.is_empty() || !self.events.is_empty() {
            if let Some(event) = self.events.pop_front() {
                return Ok(Some(event));
            }
            while let Some((channel, frame)) = self.drained.pop_front() {
                if let Some(event) = self.on_frame(channel, frame) {
                    return Ok(Some(event));
                }
            }
        }
        if let Some(record) = self.next_in_buffer()? {
            return Ok(Some(record));
        }
        if self.end_emitted {
            return Ok(None);
        }
        let count = self.channels.len();
        // Stop after a full round of channels without a frame; events that emit nothing
        // (a watermark that does not advance the minimum) start a new round.
        let mut idle = 0;
        while idle <= count {
            let channel = self.cursor;
            if self.blocking && self.is_blocked(channel) {
                idle += 1;
                self.cursor = (channel + 1) % count;
                continue;
            }
            let frame = self.next_frame(channel)?;
            if frame.is_some() && self.buffer_used_up(channel) {
                // One buffer per turn: the next poll starts at the next channel.
                self.cursor = (channel + 1) % count;
            }
            match frame {
                Some(Frame::Record(value)) => {
                    self.metrics.records_in += 1;
                    return Ok(Some(GateEvent::Record { value, channel }));
                }
                Some(Frame::TurnEnded) => {
                    // Not idle: the channel may hold more; it gets its next turn after
                    // the others have had theirs.
                    idle = 0;
                }
                Some(frame) => {
                    idle = 0;
                    if let Some(event) = self.on_frame(channel, frame) {
                        return Ok(Some(event));
                    }
                }
                None => {
                    // Nothing more in this channel's current buffer: next channel.
                    idle += 1;
                    self.cursor = (channel + 1) % count;
                }
            }
        }
        Ok(None)
    }

    /// The fast path: a whole record next in the current channel's current buffer.
    /// Anything else (events, a frame that spans buffers, no buffer) is left to the
    /// general path, which applies the same rules.
    #[inline]
    fn next_in_buffer(&mut self) -> Result<Option<GateEvent<T>>, ExchangeError> {
        let channel = self.cursor;
        let mut value = None;
        self.run_in_buffer(1, |mut body| {
            let decoded = T::decode(&mut body)?;
            if !body.is_empty() {
                return Err(crate::exchange::codec::DecodeError::Trailing(body.len()));
            }
            value = Some(decoded);
            Ok(())
        })?;
        Ok(value.map(|value| GateEvent::Record { value, channel }))
    }

    /// A frame of `channel` other than a partial one: what it yields, if anything.
    fn on_frame(&mut self, channel: usize, frame: Frame<T>) -> Option<GateEvent<T>> {
        match frame {
            Frame::Record(value) => {
                self.metrics.records_in += 1;
                Some(GateEvent::Record { value, channel })
            }
            Frame::Watermark(timestamp) => {
                let state = &mut self.channels[channel];
                if timestamp == IDLE_WATERMARK {
                    if state.idle {
                        return None;
                    }
                    state.idle = true;
                    if let Some(advanced) = self.advance_watermark() {
                        return Some(GateEvent::Watermark(advanced));
                    }
                    let all_idle = self.channels.iter().all(|c| c.ended || c.idle);
                    return (all_idle && !self.idle_emitted).then(|| {
                        self.idle_emitted = true;
                        GateEvent::Watermark(IDLE_WATERMARK)
                    });
                }
                state.idle = false;
                self.idle_emitted = false;
                if timestamp > state.watermark {
                    state.watermark = timestamp;
                }
                self.advance_watermark().map(GateEvent::Watermark)
            }
            Frame::Barrier(id) => {
                self.on_barrier(channel, id);
                self.events.pop_front()
            }
            Frame::End => {
                let count = self.channels.len();
                self.channels[channel].ended = true;
                self.ended_channels += 1;
                if let Some(draining) = self.draining.get_mut(channel) {
                    *draining = false;
                }
                if let Some(aligner) = self.aligner.as_mut() {
                    let alignment = aligner.on_end_of_channel(channel, self.now_ns);
                    self.on_alignment(alignment);
                    self.stop_recording(channel);
                }
                if self.ended_channels == count {
                    self.end_emitted = true;
                    self.events.push_back(GateEvent::End);
                } else if let Some(advanced) = self.advance_watermark() {
                    self.events.push_back(GateEvent::Watermark(advanced));
                }
                self.events.pop_front()
            }
            Frame::TurnEnded => None,
        }
    }

    /// Acts on unaligned barriers announced ahead of the data: the checkpoint is taken
    /// now, and every channel that announced it is read ahead to its barrier, what lay
    /// in front of the barrier recorded as channel state and kept to be yielded in
    /// order. Whether anything was read or is to be yielded.
    #[cold]
    fn take_announcements(&mut self) -> Result<bool, ExchangeError> {
        let mut acted = false;
        for channel in 0..self.channels.len() {
            if self.channels[channel].ended {
                continue;
            }
            let aligned = self.channels[channel].input.announced_aligned_barrier();
            if aligned > self.aligned_announced {
                self.aligned_announced = aligned;
                let now_ns = self.now_ns;
                if let Some(aligner) = self.aligner.as_mut() {
                    aligner.on_aligned_announcement(aligned, now_ns);
                    self.blocking = aligner.is_active();
                }
            }
            let id = self.channels[channel].input.announced_barrier();
            if id > self.announced {
                self.announced = id;
                let now_ns = self.now_ns;
                if let Some(aligner) = self.aligner.as_mut() {
                    for alignment in aligner.on_announcement(id, now_ns) {
                        self.on_alignment(alignment);
                    }
                }
                acted = true;
            }
            // Read ahead to a barrier announced ahead of the data, or to an aligned one
            // whose checkpoint timed out and is being recorded: both are in band behind
            // what the channel holds.
            if !self.draining[channel]
                && self.recording.as_ref().is_some_and(|r| {
                    r.channels[channel]
                        && ((id > 0 && r.id == id) || (aligned > 0 && r.id == aligned))
                })
            {
                self.draining[channel] = true;
            }
        }
        for channel in 0..self.channels.len() {
            if self.draining[channel] {
                acted |= self.read_ahead(channel)?;
            }
        }
        self.any_draining = self.draining.contains(&true);
        Ok(acted || !self.events.is_empty() || !self.drained.is_empty())
    }

    /// Reads `channel` ahead to the barrier it announced, as far as its buffers go now.
    fn read_ahead(&mut self, channel: usize) -> Result<bool, ExchangeError> {
        let mut read = false;
        while let Some(frame) = self.next_frame(channel)? {
            read = true;
            match frame {
                Frame::TurnEnded => {}
                Frame::Barrier(id) => {
                    self.draining[channel] = false;
                    self.on_barrier(channel, id);
                    break;
                }
                Frame::End => {
                    // Nothing comes after it: the channel's in-flight records are all
                    // recorded, and it is not read again (its producer is gone).
                    self.draining[channel] = false;
                    self.channels[channel].end_read = true;
                    self.stop_recording(channel);
                    self.drained.push_back((channel, Frame::End));
                    break;
                }
                frame => self.drained.push_back((channel, frame)),
            }
        }
        Ok(read)
    }

    fn is_blocked(&self, channel: usize) -> bool {
        self.aligner
            .as_ref()
            .is_some_and(|aligner| aligner.is_blocked(channel))
    }

    /// Barrier `id` came on `channel`.
    #[cold]
    fn on_barrier(&mut self, channel: usize, id: u64) {
        let channels = self.channels.len();
        let now_ns = self.now_ns;
        let aligner = self
            .aligner
            .get_or_insert_with(|| BarrierAligner::new(channels, AlignmentMode::Aligned));
        let alignments = aligner.on_barrier(channel, id, now_ns);
        if let Some(recording) = &self.recording {
            if recording.id < id {
                // A newer checkpoint overtook one whose channel state was still coming.
                let old = recording.id;
                self.recording = None;
                self.events.push_back(GateEvent::CheckpointAborted {
                    id: old,
                    reason: Box::new(format!(
                        "barrier {id} arrived before the channel state of checkpoint {old} was whole"
                    )),
                });
            }
        }
        for alignment in alignments {
            self.on_alignment(alignment);
        }
        if self.recording.as_ref().is_some_and(|r| r.id == id) {
            self.stop_recording(channel);
        }
        self.blocking = self.aligner.as_ref().is_some_and(BarrierAligner::is_active);
    }

    /// Acts on what the aligner asked for.
    fn on_alignment(&mut self, alignment: Alignment) {
        match alignment {
            Alignment::Wait => {}
            Alignment::Snapshot {
                id,
                alignment,
                unaligned,
            } => {
                if let Some(old) = self.recording.take() {
                    // A newer checkpoint overtook one whose channel state was still
                    // coming: the older cannot complete here.
                    self.events.push_back(GateEvent::CheckpointAborted {
                        id: old.id,
                        reason: Box::new(format!(
                            "checkpoint {id} was taken before the channel state of checkpoint \
                             {} was whole",
                            old.id
                        )),
                    });
                }
                // Records taken out of their channels and not yet yielded (read ahead,
                // or restored) are in flight at this snapshot, whatever its mode.
                let held = self.held_records();
                if unaligned {
                    if let Some(state) = self.aligner.as_ref().and_then(|a| a.channel_state()) {
                        self.recording = Some(Recording {
                            id,
                            channels: state.recording,
                            bytes: held,
                        });
                        self.finish_recording_if_whole();
                    } else {
                        self.recorded = Some((id, held));
                    }
                } else if !held.is_empty() {
                    self.recorded = Some((id, held));
                }
                self.events.push_back(GateEvent::Barrier {
                    id,
                    alignment,
                    unaligned,
                });
            }
            Alignment::Abort { id, reason } => {
                self.events.push_back(GateEvent::CheckpointAborted {
                    id,
                    reason: Box::new(reason),
                });
            }
        }
        self.blocking = self.aligner.as_ref().is_some_and(BarrierAligner::is_active);
    }

    /// The records waiting in `drained`, framed as channel state.
    fn held_records(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (_, frame) in &self.drained {
            if let Frame::Record(value) = frame {
                let start = out.len();
                out.extend_from_slice(&[0; 4]);
                value.encode(&mut out);
                let len = (out.len() - start - 4) as u32;
                out[start..start + 4].copy_from_slice(&len.to_le_bytes());
            }
        }
        out
    }

    /// `channel`'s barrier (or end) came: its in-flight records are all recorded.
    fn stop_recording(&mut self, channel: usize) {
        if let Some(recording) = self.recording.as_mut() {
            recording.channels[channel] = false;
            self.finish_recording_if_whole();
        }
    }

    fn finish_recording_if_whole(&mut self) {
        if self
            .recording
            .as_ref()
            .is_some_and(|r| r.channels.iter().all(|c| !c))
        {
            let recording = self.recording.take().expect("checked");
            self.recorded = Some((recording.id, recording.bytes));
        }
    }

    fn buffer_used_up(&self, channel: usize) -> bool {
        let state = &self.channels[channel];
        state
            .buffer
            .as_ref()
            .is_none_or(|b| state.offset >= b.len())
    }

    /// The minimum over live channels, if it moved past the last one emitted.
    fn advance_watermark(&mut self) -> Option<i64> {
        let minimum = self
            .channels
            .iter()
            .filter(|c| !c.ended && !c.idle)
            .map(|c| c.watermark)
            .min()?;
        if minimum > self.watermark {
            self.watermark = minimum;
            Some(minimum)
        } else {
            None
        }
    }

    /// Makes sure `channel` has a buffer with unread bytes; `false` if none arrived.
    fn fill(&mut self, channel: usize) -> Result<bool, ExchangeError> {
        let state = &mut self.channels[channel];
        loop {
            if let Some(buffer) = &state.buffer {
                if state.offset < buffer.len() {
                    return Ok(true);
                }
                // Consumed: recycle at once.
                state.buffer = None;
            }
            match state.input.poll_buffer() {
                Some(buffer) => {
                    self.metrics.buffers_in += 1;
                    self.metrics.bytes_in += buffer.len() as u64;
                    state.buffer = Some(buffer);
                    state.offset = 0;
                }
                None => {
                    if !state.ended && state.input.is_disconnected() {
                        // Re-check: the producer may have sent its last buffer before going.
                        if let Some(buffer) = state.input.poll_buffer() {
                            self.metrics.buffers_in += 1;
                            self.metrics.bytes_in += buffer.len() as u64;
                            state.buffer = Some(buffer);
                            state.offset = 0;
                            continue;
                        }
                        if let Some(source) = state.input.failure() {
                            return Err(ExchangeError::ChannelFailed { channel, source });
                        }
                        return Err(ExchangeError::ProducerGone { channel });
                    }
                    return Ok(false);
                }
            }
        }
    }

    /// The next frame of `channel`; [`Frame::TurnEnded`] when a buffer was used up in
    /// the middle of a frame; `None` when the channel has no buffer with unread bytes
    /// (either way the caller moves to the next channel).
    fn next_frame(&mut self, channel: usize) -> Result<Option<Frame<T>>, ExchangeError> {
        if self.channels[channel].ended || self.channels[channel].end_read {
            return Ok(None);
        }
        if !self.fill(channel)? {
            return Ok(None);
        }
        let max_record_size = self.max_record_size;
        let state = &mut self.channels[channel];
        let buffer = state.buffer.as_ref().expect("filled");
        let bytes = &buffer.as_slice()[state.offset..];
        let partial = &mut state.partial;
        if partial.header_len == 0 && partial.body_len == 0 && bytes.len() >= 4 {
            // Fast path: the whole frame may lie in this buffer.
            let tag = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
            let body_len = frame_body_len(tag, channel, max_record_size)?;
            if bytes.len() >= 4 + body_len {
                let body = &bytes[4..4 + body_len];
                let frame = decode_frame(tag, body, channel)?;
                if tag < EVENT_TAG_MIN {
                    if let Some(recording) = self.recording.as_mut() {
                        if recording.channels[channel] {
                            recording.bytes.extend_from_slice(&bytes[..4 + body_len]);
                        }
                    }
                }
                state.offset += 4 + body_len;
                if state.offset == buffer.len() {
                    // Consumed: recycle now rather than at the next poll.
                    state.buffer = None;
                }
                return Ok(Some(frame));
            }
        }
        // Slow path: copy what this buffer has of the frame into the partial.
        let mut taken = 0;
        if partial.header_len < 4 {
            let count = (4 - partial.header_len).min(bytes.len());
            partial.header[partial.header_len..partial.header_len + count]
                .copy_from_slice(&bytes[..count]);
            partial.header_len += count;
            taken += count;
            if partial.header_len == 4 {
                let tag = u32::from_le_bytes(partial.header);
                partial.body_len = frame_body_len(tag, channel, max_record_size)?;
                partial.body.clear();
                partial.body.reserve(partial.body_len);
            }
        }
        if partial.header_len == 4 {
            let missing = partial.body_len - partial.body.len();
            let count = missing.min(bytes.len() - taken);
            partial.body.extend_from_slice(&bytes[taken..taken + count]);
            taken += count;
            state.offset += taken;
            if partial.body.len() == partial.body_len {
                let tag = u32::from_le_bytes(partial.header);
                let frame = decode_frame(tag, &partial.body, channel)?;
                if tag < EVENT_TAG_MIN {
                    if let Some(recording) = self.recording.as_mut() {
                        if recording.channels[channel] {
                            recording.bytes.extend_from_slice(&partial.header);
                            recording.bytes.extend_from_slice(&partial.body);
                        }
                    }
                }
                partial.header_len = 0;
                partial.body_len = 0;
                partial.body.clear();
                if state.offset == buffer.len() {
                    // The record's last piece ended this buffer: recycle it with the
                    // record, so a writer waiting for it is not held up until the
                    // next poll.
                    state.buffer = None;
                }
                return Ok(Some(frame));
            }
        } else {
            state.offset += taken;
        }
        // This buffer is used up in the middle of a frame, which its partial keeps:
        // recycle the buffer now and end the channel's turn, so that a channel that
        // keeps writing large records does not keep the gate from the others.
        debug_assert_eq!(state.offset, buffer.len());
        state.buffer = None;
        Ok(Some(Frame::TurnEnded))
    }
}

fn frame_body_len(
    tag: u32,
    channel: usize,
    max_record_size: usize,
) -> Result<usize, ExchangeError> {
    match tag {
        END_TAG => Ok(0),
        WATERMARK_TAG | BARRIER_TAG => Ok(8),
        tag if tag >= EVENT_TAG_MIN => Err(ExchangeError::Malformed {
            channel,
            reason: format!("unknown event tag {tag:#x}"),
        }),
        len if len as usize > max_record_size => Err(ExchangeError::Malformed {
            channel,
            reason: format!("record length {len} exceeds the maximum of {max_record_size}"),
        }),
        len => Ok(len as usize),
    }
}

fn decode_frame<T: Codec>(
    tag: u32,
    mut body: &[u8],
    channel: usize,
) -> Result<Frame<T>, ExchangeError> {
    match tag {
        END_TAG => Ok(Frame::End),
        WATERMARK_TAG => {
            let timestamp = i64::from_le_bytes(body.try_into().expect("8 watermark bytes"));
            Ok(Frame::Watermark(timestamp))
        }
        BARRIER_TAG => Ok(Frame::Barrier(u64::from_le_bytes(
            body.try_into().expect("8 barrier bytes"),
        ))),
        _ => {
            let value =
                T::decode(&mut body).map_err(|source| ExchangeError::Decode { channel, source })?;
            let left = body.remaining();
            if left > 0 {
                return Err(ExchangeError::Decode {
                    channel,
                    source: crate::exchange::codec::DecodeError::Trailing(left),
                });
            }
            Ok(Frame::Record(value))
        }
    }
}

impl<T: Codec> core::fmt::Debug for InputGate<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("InputGate")
            .field("channels", &self.channels.len())
            .field("watermark", &self.watermark)
            .field("metrics", &self.metrics)
            .finish_non_exhaustive()
    }
}
