//! The producer side of an exchange: a result partition with one subpartition per
//! consumer, each writing into a buffer from the partition's local pool that its
//! consumer reads while it is written (Flink's `BufferBuilder` / `BufferConsumer`, see
//! [`buffer`](crate::exchange::buffer)).
//!
//! A subpartition appends records into its current [`BufferBuilder`] with plain
//! stores: no atomic per record. The bytes become visible when the partition
//! *publishes* the builder (one Release store of its position, then a notification of
//! the consumer's task):
//! - on a flush: the buffer timeout ([`flush_all`](ResultPartition::flush_all), or
//!   after every record at timeout 0), an event, the end of the partition;
//! - when the buffer is full, which also finishes it: the builder drops, the next
//!   record starts a new buffer.
//!
//! A flush does not cut the buffer: the next records go on filling the same segment,
//! and the consumer reads them from it. So a timeout of 0 costs a store, a load of
//! the consumer's gone flag and a notification per record, not a segment per record,
//! and a subpartition whose consumer keeps up holds at most two segments: the one
//! being written and the one being read to its end
//! ([`PartitionMetrics::segments_per_channel_peak`]).
//!
//! The consumer of a buffer is pushed to the subpartition's channel when the buffer is
//! first published, so an empty buffer is never sent. Each publication checks that
//! the consumer is still there (one load of a flag its channel writes only when it is
//! dropped) and reports [`ExchangeError::ConsumerGone`] otherwise. A segment is recycled when its builder is gone and its consumer has read all
//! of it (the shares of `buffer`).
//!
//! In broadcast mode the partition fills one buffer and pushes a consumer of it to
//! every subpartition (Flink's `BroadcastRecordWriter`): serialized and copied once,
//! each consumer reading at its own pace.
//!
//! Buffer sizes: a buffer starts with the capacity its consumer last announced
//! ([`InputChannel::announce_buffer_size`](crate::exchange::InputChannel::announce_buffer_size),
//! debloating), capped at the segment size; a broadcast buffer takes the smallest
//! announcement. The partition reads the announcement only when it starts a buffer.
//!
//! No pool size can deadlock a partition: a buffer being written holds its segment
//! until it is full or ended, so with a buffer open on every subpartition and no
//! segment free, nothing would ever come back (the writer waits for a segment, the
//! readers for bytes). When the pool is dry and every segment it lent is such a buffer,
//! [`release_if_stuck`](ResultPartition::release_if_stuck) ends them all: the readers
//! read them to their end and recycle them. An exchange sizes its pool to one segment
//! more than its subpartitions (Flink's minimum), so there it never has to.
//!
//! Invariants:
//! 1. A consumer is pushed once per buffer and subpartition, before the buffer's first
//!    byte is published to it; nothing is published to a subpartition whose channel
//!    does not hold the buffer's consumer.
//! 2. Bytes are written and published in the order the writer submits them, per
//!    subpartition, so events are never reordered with the records around them.

use crate::error::{ConfigError, ExchangeError};
use crate::exchange::buffer::BufferBuilder;
use crate::exchange::channel::{BarrierAnnouncer, ChannelSender};
use crate::exchange::codec::{Codec, SliceEncoder};
use crate::exchange::pool::LocalBufferPool;

/// Where bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dest {
    /// One subpartition's own buffer.
    One(usize),
    /// The broadcast buffer, shared by every subpartition.
    Shared,
}

/// A buffer being written, and whether its consumer went out (invariant 1).
#[derive(Default)]
struct Slot {
    builder: Option<BufferBuilder>,
    enqueued: bool,
}

struct Subpartition {
    channel: ChannelSender,
    slot: Slot,
}

/// Counters and gauges of a partition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PartitionMetrics {
    /// Bytes written (records and events, with their length prefixes).
    pub bytes_out: u64,
    /// Buffers handed to channels (a broadcast buffer counts once per subpartition).
    pub buffers_out: u64,
    /// Publications that made new bytes visible (a broadcast one counts once).
    pub publishes: u64,
    /// The most segments one subpartition held at once (written, or not yet read to
    /// their end), as seen when it started a buffer (sampled, one buffer start in
    /// [`GAUGE_EVERY`]): 2 when its consumer keeps up.
    pub segments_per_channel_peak: u64,
    /// Buffers started.
    pub buffers_started: u64,
    /// Buffer starts at which the segments held were sampled.
    pub segments_held_samples: u64,
    /// Segments held at those samples, summed (÷ `segments_held_samples`: the mean
    /// pool usage per channel).
    pub segments_held_total: u64,
    /// Times the pool was dry with every lent segment a buffer still being written, so
    /// the partition ended those buffers to get segments back
    /// ([`ResultPartition::release_if_stuck`]). 0 when the pool holds at least one
    /// segment more than there are subpartitions, as an exchange sizes it.
    pub stuck_releases: u64,
}

/// One buffer start in this many samples the segments its subpartition holds.
pub const GAUGE_EVERY: u64 = 8;

/// A result partition over local (or, later, remote) channels.
pub struct ResultPartition {
    pool: LocalBufferPool,
    subpartitions: Vec<Subpartition>,
    shared: Slot,
    /// When the oldest unpublished byte was written (for the buffer timeout).
    unflushed_since_ns: Option<u64>,
    metrics: PartitionMetrics,
}

impl ResultPartition {
    /// A partition writing to `channels` (subpartition `i` sends on `channels[i]`),
    /// drawing buffers from `pool`.
    pub fn new(pool: LocalBufferPool, channels: Vec<ChannelSender>) -> Result<Self, ConfigError> {
        if channels.is_empty() {
            return Err(ConfigError::ZeroCapacity {
                what: "result partition subpartition count",
            });
        }
        // Every buffer the pool can lend (plus overdraft, bounded by the pool size) may be
        // in one channel at once; a channel that cannot hold them could refuse a push.
        let needed = pool.size() + pool.overdraft_max();
        if channels.iter().any(|c| c.capacity() < needed) {
            return Err(ConfigError::Inconsistent(
                "each channel must hold the partition pool's size plus overdraft in buffers; \
                 build channels with local_channel(pool size + overdraft, ...)",
            ));
        }
        let subpartitions = channels
            .into_iter()
            .map(|channel| Subpartition {
                channel,
                slot: Slot::default(),
            })
            .collect();
        Ok(ResultPartition {
            pool,
            subpartitions,
            shared: Slot::default(),
            unflushed_since_ns: None,
            metrics: PartitionMetrics::default(),
        })
    }

    /// Subpartitions (consumers).
    pub fn subpartitions(&self) -> usize {
        self.subpartitions.len()
    }

    /// The partition's pool.
    pub fn pool(&mut self) -> &mut LocalBufferPool {
        &mut self.pool
    }

    /// Counters.
    pub fn metrics(&self) -> PartitionMetrics {
        self.metrics
    }

    /// Segments `subpartition` holds now (the gauge behind
    /// [`PartitionMetrics::segments_per_channel_peak`]): buffers being written or not yet
    /// read to their end. In broadcast mode every buffer is charged to subpartition 0.
    pub fn segments_in_use(&mut self, subpartition: usize) -> usize {
        self.pool.reclaim();
        self.pool.held_by(subpartition)
    }

    /// The buffer size `subpartition`'s consumer announced (0: none), which the next
    /// buffer started for it takes.
    pub fn announced_buffer_size(&self, subpartition: usize) -> usize {
        self.subpartitions[subpartition]
            .channel
            .announced_buffer_size()
    }

    /// Announces unaligned checkpoint barrier `id` to every consumer ahead of the data
    /// (see [`ChannelSender::announce_barrier`]).
    pub fn announce_barrier(&self, id: u64) {
        for subpartition in &self.subpartitions {
            subpartition.channel.announce_barrier(id);
        }
    }

    /// Announces aligned barrier `id`, which may time out, to every consumer as it is
    /// written in band (see [`ChannelSender::announce_aligned_barrier`]).
    pub fn announce_aligned_barrier(&self, id: u64) {
        for subpartition in &self.subpartitions {
            subpartition.channel.announce_aligned_barrier(id);
        }
    }

    /// Handles that announce barriers to every consumer after this partition's writer is
    /// gone (see [`BarrierAnnouncer`]).
    pub fn barrier_announcers(&self) -> Vec<BarrierAnnouncer> {
        self.subpartitions
            .iter()
            .map(|subpartition| subpartition.channel.announcer())
            .collect()
    }

    /// [`barrier_announcers`](Self::barrier_announcers) for aligned barriers that may
    /// time out.
    pub fn aligned_barrier_announcers(&self) -> Vec<BarrierAnnouncer> {
        self.subpartitions
            .iter()
            .map(|subpartition| subpartition.channel.aligned_announcer())
            .collect()
    }

    /// When the oldest unpublished byte was written.
    pub fn unflushed_since_ns(&self) -> Option<u64> {
        self.unflushed_since_ns
    }

    /// Starts a buffer for `dest` (overdraft allowed when `in_record`); `false` when the
    /// pool has none (back-pressure).
    fn start(&mut self, dest: Dest, in_record: bool) -> bool {
        let charge = match dest {
            Dest::One(sub) => sub,
            Dest::Shared => 0,
        };
        let buffer = match self.pool.request(charge) {
            Some(buffer) => buffer,
            None if in_record => match self.pool.request_overdraft(charge) {
                Some(buffer) => buffer,
                None => return false,
            },
            None => return false,
        };
        // The gauge, sampled every `GAUGE_EVERY` buffers: the pool counts a segment back
        // only when it collects its returns (a swap on the line recyclers push to), so
        // collect before believing more than two.
        if self.metrics.buffers_started % GAUGE_EVERY == 0 {
            let mut held = self.pool.held_by(charge) as u64;
            if held > 2 {
                self.pool.reclaim();
                held = self.pool.held_by(charge) as u64;
            }
            let peak = &mut self.metrics.segments_per_channel_peak;
            *peak = (*peak).max(held);
            self.metrics.segments_held_samples += 1;
            self.metrics.segments_held_total += held;
        }
        self.metrics.buffers_started += 1;
        let segment_size = buffer.capacity();
        let announced = match dest {
            Dest::One(sub) => self.subpartitions[sub].channel.announced_buffer_size(),
            Dest::Shared => self
                .subpartitions
                .iter()
                .map(|s| s.channel.announced_buffer_size())
                .filter(|&size| size > 0)
                .min()
                .unwrap_or(0),
        };
        let limit = if announced == 0 {
            segment_size
        } else {
            announced.min(segment_size)
        };
        let slot = match dest {
            Dest::One(sub) => &mut self.subpartitions[sub].slot,
            Dest::Shared => &mut self.shared,
        };
        debug_assert!(slot.builder.is_none());
        slot.builder = Some(BufferBuilder::new(buffer, limit));
        slot.enqueued = false;
        true
    }

    /// Writes `bytes[offset..]` to `dest`, taking buffers from the pool (and overdraft
    /// when `mid_record`). Returns the new offset: `bytes.len()` when done, less when the
    /// pool ran dry (back-pressure; call again when it has buffers).
    pub(crate) fn write(
        &mut self,
        dest: Dest,
        bytes: &[u8],
        mut offset: usize,
        mid_record: bool,
        now_ns: u64,
    ) -> Result<usize, ExchangeError> {
        while offset < bytes.len() {
            let has_builder = match dest {
                Dest::One(sub) => self.subpartitions[sub].slot.builder.is_some(),
                Dest::Shared => self.shared.builder.is_some(),
            };
            if !has_builder && !self.start(dest, mid_record || offset > 0) {
                return Ok(offset);
            }
            let builder = match dest {
                Dest::One(sub) => self.subpartitions[sub].slot.builder.as_mut(),
                Dest::Shared => self.shared.builder.as_mut(),
            }
            .expect("started above");
            let count = builder.append(&bytes[offset..]);
            let full = builder.is_full();
            offset += count;
            self.metrics.bytes_out += count as u64;
            if self.unflushed_since_ns.is_none() {
                self.unflushed_since_ns = Some(now_ns);
            }
            if full {
                self.publish(dest, true)?;
            }
        }
        Ok(offset)
    }

    /// Encodes one record straight into `dest`'s current buffer, length prefix first,
    /// when it fits in the room left (the common case): no scratch copy. Starts a buffer
    /// if there is none (never overdraft: this is a record's start). Returns `Ok(false)`,
    /// having written nothing, when there is no buffer or the record does not fit (or
    /// exceeds `max_size`); the caller then takes the spanning path.
    #[inline]
    pub(crate) fn try_encode<T: Codec>(
        &mut self,
        dest: Dest,
        record: &T,
        max_size: usize,
        now_ns: u64,
    ) -> Result<bool, ExchangeError> {
        Ok(self.try_encode_run(dest, std::iter::once(record), max_size, now_ns)? == 1)
    }

    /// The batch form of [`try_encode`](Self::try_encode): encodes `records` one after
    /// another straight into `dest`'s current buffer while each fits in the room left,
    /// committing them and counting their bytes once for the run. Returns how many were
    /// written (0 as `try_encode`'s `false`: the first did not fit, or there is no
    /// buffer); the record after the last written one goes the spanning way. A buffer
    /// filled exactly is published and ended, as `try_encode` does.
    #[inline]
    pub(crate) fn try_encode_run<'a, T: Codec + 'a>(
        &mut self,
        dest: Dest,
        records: impl Iterator<Item = &'a T>,
        max_size: usize,
        now_ns: u64,
    ) -> Result<usize, ExchangeError> {
        let has_builder = match dest {
            Dest::One(sub) => self.subpartitions[sub].slot.builder.is_some(),
            Dest::Shared => self.shared.builder.is_some(),
        };
        if !has_builder && !self.start(dest, false) {
            return Ok(0);
        }
        let builder = match dest {
            Dest::One(sub) => self.subpartitions[sub].slot.builder.as_mut(),
            Dest::Shared => self.shared.builder.as_mut(),
        }
        .expect("started above");
        let free = builder.free_mut();
        let mut used = 0;
        let mut written = 0;
        for record in records {
            let room = &mut free[used..];
            if room.len() <= 4 {
                break;
            }
            let (prefix, body) = room.split_at_mut(4);
            let mut encoder = SliceEncoder::new(body);
            record.encode(&mut encoder);
            let Some(size) = encoder.finish() else {
                break;
            };
            if size > max_size {
                break;
            }
            prefix.copy_from_slice(&(size as u32).to_le_bytes());
            used += 4 + size;
            written += 1;
        }
        if written == 0 {
            return Ok(0);
        }
        builder.commit(used);
        let full = builder.is_full();
        self.metrics.bytes_out += used as u64;
        if self.unflushed_since_ns.is_none() {
            self.unflushed_since_ns = Some(now_ns);
        }
        if full {
            self.publish(dest, true)?;
        }
        Ok(written)
    }

    /// Makes `dest`'s written bytes visible to its consumers and wakes them; with
    /// `finish`, also ends the buffer (the next write starts a new one).
    pub(crate) fn publish(&mut self, dest: Dest, finish: bool) -> Result<(), ExchangeError> {
        match dest {
            Dest::One(sub) => {
                let subpartition = &mut self.subpartitions[sub];
                let Some(builder) = subpartition.slot.builder.as_mut() else {
                    return Ok(());
                };
                let fresh = builder.has_unpublished();
                let new_bytes = builder.len() - builder.published_len();
                if fresh && subpartition.channel.is_disconnected() {
                    return Err(ExchangeError::ConsumerGone { subpartition: sub });
                }
                if fresh && !subpartition.slot.enqueued {
                    let channel = &mut subpartition.channel;
                    if channel.push(builder.consumer()).is_err() {
                        unreachable!(
                            "channels hold every buffer the pool can lend (checked in new)"
                        );
                    }
                    subpartition.slot.enqueued = true;
                    self.metrics.buffers_out += 1;
                }
                let enqueued = subpartition.slot.enqueued;
                if finish {
                    // Dropping the builder publishes everything, finished.
                    subpartition.slot.builder = None;
                } else if fresh {
                    builder.publish();
                }
                if fresh {
                    self.metrics.publishes += 1;
                    subpartition.channel.count_published(new_bytes);
                }
                if fresh || (finish && enqueued) {
                    // Ending a buffer with nothing new still wakes its reader, which holds
                    // its consumer until it sees the end: only then is the segment free.
                    subpartition.channel.notify();
                }
            }
            Dest::Shared => {
                let Some(builder) = self.shared.builder.as_mut() else {
                    return Ok(());
                };
                let fresh = builder.has_unpublished();
                let new_bytes = builder.len() - builder.published_len();
                if fresh {
                    for (sub, subpartition) in self.subpartitions.iter().enumerate() {
                        if subpartition.channel.is_disconnected() {
                            return Err(ExchangeError::ConsumerGone { subpartition: sub });
                        }
                    }
                }
                if fresh && !self.shared.enqueued {
                    for subpartition in &mut self.subpartitions {
                        if subpartition.channel.push(builder.consumer()).is_err() {
                            unreachable!(
                                "channels hold every buffer the pool can lend (checked in new)"
                            );
                        }
                        self.metrics.buffers_out += 1;
                    }
                    self.shared.enqueued = true;
                }
                let enqueued = self.shared.enqueued;
                if finish {
                    self.shared.builder = None;
                } else if fresh {
                    builder.publish();
                }
                if fresh {
                    self.metrics.publishes += 1;
                    for subpartition in &mut self.subpartitions {
                        subpartition.channel.count_published(new_bytes);
                    }
                }
                if fresh || (finish && enqueued) {
                    for subpartition in &self.subpartitions {
                        subpartition.channel.notify();
                    }
                }
            }
        }
        Ok(())
    }

    /// Publishes `dest`'s written bytes (a flush of one destination).
    #[inline]
    pub(crate) fn flush(&mut self, dest: Dest) -> Result<(), ExchangeError> {
        self.publish(dest, false)
    }

    /// Publishes every buffer's written bytes (buffer timeout, events): the buffers stay
    /// open for more.
    pub fn flush_all(&mut self) -> Result<(), ExchangeError> {
        self.publish(Dest::Shared, false)?;
        for sub in 0..self.subpartitions.len() {
            self.publish(Dest::One(sub), false)?;
        }
        self.unflushed_since_ns = None;
        Ok(())
    }

    /// Buffers being written now (each holds a segment only the writer can release).
    pub fn open_buffers(&self) -> usize {
        let own = self
            .subpartitions
            .iter()
            .filter(|s| s.slot.builder.is_some())
            .count();
        own + usize::from(self.shared.builder.is_some())
    }

    /// When the pool cannot lend (no free segment, or a subpartition at its maximum) and
    /// every segment it lent is a buffer still being written, nothing would come back by
    /// itself: ends those buffers (publishing what they hold) so that their readers read
    /// them to the end and recycle them, and returns `true`. Otherwise (the pool can
    /// lend, or some ended buffer is still out and will come back once read) changes
    /// nothing and returns `false`.
    ///
    /// A writer calls this before it waits for a recycled buffer; see the module docs.
    pub fn release_if_stuck(&mut self) -> Result<bool, ExchangeError> {
        if self.pool.is_available() {
            return Ok(false);
        }
        // `is_available` collected every return so far, so `in_use` counts the segments
        // not yet back; a segment recycled from here on only makes us end buffers early.
        let in_use = self.pool.in_use();
        if in_use > self.subpartitions.len() + 1 {
            // More segments out than there can be open buffers: some will come back.
            return Ok(false);
        }
        let open = self.open_buffers();
        debug_assert!(open <= in_use, "an open buffer holds a lent segment");
        if open == 0 || open < in_use {
            return Ok(false);
        }
        self.metrics.stuck_releases += 1;
        self.finish_all()?;
        Ok(true)
    }

    /// Publishes and ends every buffer (end of the partition): each segment goes back
    /// to the pool once its consumers have read it.
    pub fn finish_all(&mut self) -> Result<(), ExchangeError> {
        self.publish(Dest::Shared, true)?;
        for sub in 0..self.subpartitions.len() {
            self.publish(Dest::One(sub), true)?;
        }
        self.unflushed_since_ns = None;
        Ok(())
    }
}

impl core::fmt::Debug for ResultPartition {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ResultPartition")
            .field("subpartitions", &self.subpartitions.len())
            .field("metrics", &self.metrics)
            .finish_non_exhaustive()
    }
}
