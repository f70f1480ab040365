//! The consumer side of an exchange: an input gate over N channels.
//!
//! The gate reads each channel's buffers in place (a local channel hands over the
//! producer's own segments), decodes records that lie inside one buffer directly from
//! it, reassembles records and length prefixes that span buffers in a per-channel
//! scratch vector, and drops (recycles) each buffer as soon as its last byte is read.
//!
//! Watermarks combine as Flink's `StatusWatermarkValve` does without idleness: the
//! gate's watermark is the minimum over channels that have not ended, and it is
//! emitted only when it advances. A channel's end-of-partition removes it from the
//! minimum; when every channel has ended the gate emits [`GateEvent::End`] once.
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
//! Debloating (off unless [`InputGate::set_debloat`]): [`InputGate::poll_next_at`]
//! feeds the gate's [`Debloater`] its bytes and idle time once per period, and passes
//! each new buffer size to every channel ([`InputChannel::announce_buffer_size`]).

use std::marker::PhantomData;

use crate::error::{ConfigError, DebloatError, ExchangeError};
use crate::exchange::channel::InputChannel;
use crate::exchange::codec::{Codec, Decoder};
use crate::exchange::debloat::{DebloatConfig, Debloater};
use crate::exchange::pool::SharedBuffer;
use crate::exchange::writer::{END_TAG, WATERMARK_TAG};
use crate::limits::{EVENT_TAG_MIN, RECORD_SIZE_MAX_DEFAULT};

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
    ended: bool,
}

enum Frame<T> {
    Record(T),
    Watermark(i64),
    End,
    /// The channel's buffer is used up in the middle of a frame: its turn ends (the
    /// frame waits in its partial), though it may have more buffers already.
    TurnEnded,
}

/// An input gate decoding records of type `T`.
pub struct InputGate<T: Codec> {
    channels: Vec<ChannelState>,
    /// The channel being read (its current buffer is not finished) or to look at next.
    cursor: usize,
    watermark: i64,
    ended_channels: usize,
    end_emitted: bool,
    max_record_size: usize,
    metrics: GateMetrics,
    idle_since_ns: Option<u64>,
    debloat: Option<Debloater>,
    _records: PhantomData<fn() -> T>,
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
                ended: false,
            })
            .collect();
        Ok(InputGate {
            channels,
            cursor: 0,
            watermark: i64::MIN,
            ended_channels: 0,
            end_emitted: false,
            max_record_size,
            metrics: GateMetrics::default(),
            idle_since_ns: None,
            debloat: None,
            _records: PhantomData,
        })
    }

    /// Input channels.
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
        if self.debloat.as_ref().is_some_and(|d| d.is_due(now_ns)) {
            self.debloat_period(now_ns);
        }
        let next = self.poll_next()?;
        match (&next, self.idle_since_ns) {
            (None, None) => self.idle_since_ns = Some(now_ns),
            (Some(_), Some(since)) => {
                self.metrics.idle_ns += now_ns.saturating_sub(since);
                self.idle_since_ns = None;
            }
            _ => {}
        }
        Ok(next)
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
                Some(Frame::Watermark(timestamp)) => {
                    idle = 0;
                    let state = &mut self.channels[channel];
                    if timestamp > state.watermark {
                        state.watermark = timestamp;
                    }
                    if let Some(advanced) = self.advance_watermark() {
                        return Ok(Some(GateEvent::Watermark(advanced)));
                    }
                }
                Some(Frame::TurnEnded) => {
                    // Not idle: the channel may hold more; it gets its next turn after
                    // the others have had theirs.
                    idle = 0;
                }
                Some(Frame::End) => {
                    idle = 0;
                    self.channels[channel].ended = true;
                    self.ended_channels += 1;
                    if self.ended_channels == count {
                        self.end_emitted = true;
                        return Ok(Some(GateEvent::End));
                    }
                    if let Some(advanced) = self.advance_watermark() {
                        return Ok(Some(GateEvent::Watermark(advanced)));
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
        let count = self.channels.len();
        let state = &mut self.channels[channel];
        let Some(buffer) = &state.buffer else {
            return Ok(None);
        };
        if state.partial.header_len != 0 {
            return Ok(None);
        }
        let bytes = &buffer.as_slice()[state.offset..];
        let Some(prefix) = bytes.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_le_bytes(prefix.try_into().expect("4 bytes"));
        if len >= EVENT_TAG_MIN
            || len as usize > self.max_record_size
            || bytes.len() < 4 + len as usize
        {
            return Ok(None);
        }
        let mut body = &bytes[4..4 + len as usize];
        let value =
            T::decode(&mut body).map_err(|source| ExchangeError::Decode { channel, source })?;
        if !body.is_empty() {
            let source = crate::exchange::codec::DecodeError::Trailing(body.len());
            return Err(ExchangeError::Decode { channel, source });
        }
        state.offset += 4 + len as usize;
        if state.offset == buffer.len() {
            // Consumed: recycle now, and give the next channel its turn.
            state.buffer = None;
            self.cursor = (channel + 1) % count;
        }
        self.metrics.records_in += 1;
        Ok(Some(GateEvent::Record { value, channel }))
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
            .filter(|c| !c.ended)
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
        if self.channels[channel].ended {
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
        WATERMARK_TAG => Ok(8),
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
