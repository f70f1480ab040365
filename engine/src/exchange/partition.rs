//! The producer side of an exchange: a result partition with one subpartition per
//! consumer, each filling buffers from the partition's local pool and sending them
//! down its channel.
//!
//! Buffers become readable when they are *finished*: full, flushed by the buffer
//! timeout, or closed by an event. The alternative, Flink's readable-while-written
//! `BufferConsumer`, needs the writer and the reader to share a segment and an atomic
//! write position per record; finishing keeps each segment with one owner until it is
//! sent (no atomics per record, one ring push per buffer). Its cost: a flushed,
//! partly filled buffer ships with unused space, so a buffer timeout of 0 uses a segment
//! per record (bounded by the pool, which back-pressures as usual).
//!
//! In broadcast mode the partition fills one buffer and sends a reference-counted
//! handle of it to every subpartition (Flink's `BroadcastRecordWriter`): serialized and
//! copied once.
//!
//! Invariants:
//! 1. An empty buffer is never sent: `send` keeps an empty builder for the next write
//!    (one is left when a record refused as too large was the first to try a fresh
//!    buffer).
//! 2. Bytes are written and buffers sent in the order the writer submits them, per
//!    subpartition, so events are never reordered with the records around them.

use crate::error::{ConfigError, ExchangeError};
use crate::exchange::channel::ChannelSender;
use crate::exchange::codec::{Codec, SliceEncoder};
use crate::exchange::pool::{Buffer, LocalBufferPool};

/// Where bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dest {
    /// One subpartition's own buffer.
    One(usize),
    /// The broadcast buffer, shared by every subpartition.
    Shared,
}

struct Subpartition {
    channel: ChannelSender,
    builder: Option<Buffer>,
}

/// Counters of a partition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PartitionMetrics {
    /// Bytes written (records and events, with their length prefixes).
    pub bytes_out: u64,
    /// Buffers sent (a broadcast buffer counts once per subpartition).
    pub buffers_out: u64,
}

/// A result partition over local (or, later, remote) channels.
pub struct ResultPartition {
    pool: LocalBufferPool,
    subpartitions: Vec<Subpartition>,
    shared: Option<Buffer>,
    /// When the oldest unsent byte was written (for the buffer timeout).
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
        // in one channel at once; a channel that cannot hold them could refuse a send.
        let needed = pool.size() + pool.overdraft_max();
        if let Some(short) = channels.iter().find(|c| c.capacity() < needed) {
            let _ = short;
            return Err(ConfigError::Inconsistent(
                "each channel must hold the partition pool's size plus overdraft in buffers; \
                 build channels with local_channel(pool size + overdraft, ...)",
            ));
        }
        let subpartitions = channels
            .into_iter()
            .map(|channel| Subpartition {
                channel,
                builder: None,
            })
            .collect();
        Ok(ResultPartition {
            pool,
            subpartitions,
            shared: None,
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

    /// When the oldest unsent byte was written.
    pub fn unflushed_since_ns(&self) -> Option<u64> {
        self.unflushed_since_ns
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
            let charge = match dest {
                Dest::One(sub) => sub,
                Dest::Shared => 0,
            };
            let slot = match dest {
                Dest::One(sub) => &mut self.subpartitions[sub].builder,
                Dest::Shared => &mut self.shared,
            };
            if slot.is_none() {
                let in_record = mid_record || offset > 0;
                let buffer = match self.pool.request(charge) {
                    Some(buffer) => Some(buffer),
                    None if in_record => self.pool.request_overdraft(charge),
                    None => None,
                };
                match buffer {
                    Some(buffer) => *slot = Some(buffer),
                    None => return Ok(offset),
                }
            }
            let builder = slot.as_mut().expect("filled above");
            let start = builder.len();
            let capacity = builder.capacity();
            let count = (capacity - start).min(bytes.len() - offset);
            builder.as_mut_slice()[start..start + count]
                .copy_from_slice(&bytes[offset..offset + count]);
            builder.set_len(start + count);
            offset += count;
            self.metrics.bytes_out += count as u64;
            if self.unflushed_since_ns.is_none() {
                self.unflushed_since_ns = Some(now_ns);
            }
            if start + count == capacity {
                self.send(dest)?;
            }
        }
        Ok(offset)
    }

    /// Encodes one record straight into `dest`'s current buffer, length prefix first,
    /// when it fits in the room left (the common case): no scratch copy. Takes a fresh
    /// buffer if there is none (never overdraft: this is a record's start). Returns
    /// `Ok(false)`, having written nothing, when there is no buffer or the record does
    /// not fit (or exceeds `max_size`); the caller then takes the spanning path.
    #[inline]
    pub(crate) fn try_encode<T: Codec>(
        &mut self,
        dest: Dest,
        record: &T,
        max_size: usize,
        now_ns: u64,
    ) -> Result<bool, ExchangeError> {
        let (slot, charge) = match dest {
            Dest::One(sub) => (&mut self.subpartitions[sub].builder, sub),
            Dest::Shared => (&mut self.shared, 0),
        };
        if slot.is_none() {
            match self.pool.request(charge) {
                Some(buffer) => *slot = Some(buffer),
                None => return Ok(false),
            }
        }
        let builder = slot.as_mut().expect("filled above");
        let start = builder.len();
        let capacity = builder.capacity();
        if capacity - start <= 4 {
            return Ok(false);
        }
        let free = &mut builder.as_mut_slice()[start..];
        let (prefix, body) = free.split_at_mut(4);
        let mut encoder = SliceEncoder::new(body);
        record.encode(&mut encoder);
        let Some(size) = encoder.finish() else {
            return Ok(false);
        };
        if size > max_size {
            return Ok(false);
        }
        prefix.copy_from_slice(&(size as u32).to_le_bytes());
        builder.set_len(start + 4 + size);
        self.metrics.bytes_out += 4 + size as u64;
        if self.unflushed_since_ns.is_none() {
            self.unflushed_since_ns = Some(now_ns);
        }
        if start + 4 + size == capacity {
            self.send(dest)?;
        }
        Ok(true)
    }

    /// Sends `dest`'s buffer if it holds anything.
    pub(crate) fn send(&mut self, dest: Dest) -> Result<(), ExchangeError> {
        match dest {
            Dest::One(sub) => {
                if self.subpartitions[sub]
                    .builder
                    .as_ref()
                    .is_none_or(|b| b.is_empty())
                {
                    return Ok(());
                }
                let Some(buffer) = self.subpartitions[sub].builder.take() else {
                    unreachable!("checked above");
                };
                let channel = &mut self.subpartitions[sub].channel;
                if channel.is_disconnected() {
                    return Err(ExchangeError::ConsumerGone { subpartition: sub });
                }
                if channel.send(buffer.into_shared()).is_err() {
                    unreachable!("channels hold every buffer the pool can lend (checked in new)");
                }
                self.metrics.buffers_out += 1;
            }
            Dest::Shared => {
                if self.shared.as_ref().is_none_or(|b| b.is_empty()) {
                    return Ok(());
                }
                let Some(buffer) = self.shared.take() else {
                    unreachable!("checked above");
                };
                let shared = buffer.into_shared();
                for (sub, subpartition) in self.subpartitions.iter_mut().enumerate() {
                    if subpartition.channel.is_disconnected() {
                        return Err(ExchangeError::ConsumerGone { subpartition: sub });
                    }
                    if subpartition.channel.send(shared.clone()).is_err() {
                        unreachable!(
                            "channels hold every buffer the pool can lend (checked in new)"
                        );
                    }
                    self.metrics.buffers_out += 1;
                }
            }
        }
        Ok(())
    }

    /// Sends every partly filled buffer (buffer timeout, events, end of input).
    pub fn flush_all(&mut self) -> Result<(), ExchangeError> {
        self.send(Dest::Shared)?;
        for sub in 0..self.subpartitions.len() {
            self.send(Dest::One(sub))?;
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
