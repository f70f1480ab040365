//! The record writer: serializes records (length-prefixed), picks their
//! subpartition with a [`ChannelSelector`], writes them into the result partition,
//! and puts watermarks and end-of-partition in band.
//!
//! Framing on a channel, little-endian:
//! - record: `len: u32` (below [`EVENT_TAG_MIN`]) then `len` bytes;
//! - watermark: `WATERMARK_TAG: u32` then the timestamp as `i64`;
//! - checkpoint barrier: `BARRIER_TAG: u32` then the checkpoint id as `u64`;
//! - end of partition: `END_TAG: u32`.
//!
//! Records and length prefixes may span buffers; the input gate reassembles them.
//!
//! A run of records ([`RecordWriter::emit_run`]) writes exactly the bytes that
//! emitting each record would, with the per-record work of a batch: each stretch of
//! records bound for one channel is encoded straight into that channel's buffer, with
//! the buffer's bookkeeping once per stretch and, at timeout 0, one publication per
//! run; the selector is asked once per record, as the encoder reaches it.
//!
//! Back-pressure: a task checks [`RecordWriter::is_available`] before taking its next
//! input (Flink's output availability). A record is serialized whole into the writer's
//! scratch buffer first, so if the pool runs dry in the middle of it, the remainder
//! stays there (after trying the pool's bounded overdraft) and the writer reports
//! pending: the task yields to its mailbox until the pool notifies it, then calls
//! [`RecordWriter::resume`]. The thread never blocks and no byte is lost.
//!
//! Buffer timeout (Flink's output flusher): written bytes are published (made visible
//! to the consumer, which reads them from the buffer while it is still being written)
//! at most `timeout` after the first of them: `Some(0)` publishes after every record,
//! `None` only when a buffer is full or on an event (`Some(0)` publishes a run once, after
//! its last record). A flush does not end the buffer.
//! The task's timer wheel drives it through [`RecordWriter::next_flush_deadline`] and
//! [`RecordWriter::on_timer`]; no thread per writer.

use std::marker::PhantomData;
use std::time::Duration;

use crate::error::{ConfigError, ExchangeError};
use crate::exchange::channel::BarrierAnnouncer;
use crate::exchange::codec::Codec;
use crate::exchange::partition::{Dest, PartitionMetrics, ResultPartition};
use crate::limits::{BUFFER_TIMEOUT_DEFAULT_NS, EVENT_TAG_MIN, RECORD_SIZE_MAX_DEFAULT};

/// Length-prefix value announcing a watermark.
pub const WATERMARK_TAG: u32 = u32::MAX - 1;
/// Length-prefix value announcing the end of the partition.
pub const END_TAG: u32 = u32::MAX;
/// Length-prefix value announcing a checkpoint barrier.
pub const BARRIER_TAG: u32 = u32::MAX - 2;

/// Where a record goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// One subpartition.
    One(usize),
    /// Every subpartition.
    All,
}

/// Picks the subpartition of each record.
pub trait ChannelSelector<T> {
    /// The target of `record` among `subpartitions`.
    fn select(&mut self, record: &T, subpartitions: usize) -> Target;
    /// Whether every record goes everywhere (serialize once, share the buffer).
    fn is_broadcast(&self) -> bool {
        false
    }
}

/// Everything to subpartition 0 (one-to-one forwarding between equal parallelisms).
#[derive(Debug, Clone, Copy, Default)]
pub struct Forward;

impl<T> ChannelSelector<T> for Forward {
    #[inline]
    fn select(&mut self, _record: &T, _subpartitions: usize) -> Target {
        Target::One(0)
    }
}

/// Round-robin over subpartitions (Flink's rebalance).
#[derive(Debug, Clone, Copy, Default)]
pub struct RoundRobin {
    next: usize,
}

impl<T> ChannelSelector<T> for RoundRobin {
    #[inline]
    fn select(&mut self, _record: &T, subpartitions: usize) -> Target {
        let target = self.next;
        self.next = if target + 1 >= subpartitions {
            0
        } else {
            target + 1
        };
        Target::One(target.min(subpartitions - 1))
    }
}

/// By a 64-bit hash of a key modulo the subpartitions, for exchanges wired by hand: the
/// same key always reaches the same subpartition, in every run and process (a fixed
/// mixing function, no random seed). This is not how a job graph routes keys: a
/// stream's `key_by` uses Flink's key groups (`graph::keys`), so that state can be
/// redistributed by key group; the same key generally lands on another subtask here.
#[derive(Debug, Clone, Copy)]
pub struct HashModulo<F> {
    key: F,
}

impl<F> HashModulo<F> {
    /// Routes by `key(record)`.
    pub fn new(key: F) -> Self {
        HashModulo { key }
    }
}

/// The splitmix64 finalizer: spreads any key (even sequential ones) over subpartitions.
#[inline]
pub fn mix(mut key: u64) -> u64 {
    key = (key ^ (key >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    key = (key ^ (key >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    key ^ (key >> 31)
}

impl<T, F: FnMut(&T) -> u64> ChannelSelector<T> for HashModulo<F> {
    #[inline]
    fn select(&mut self, record: &T, subpartitions: usize) -> Target {
        Target::One((mix((self.key)(record)) % subpartitions as u64) as usize)
    }
}

/// Every record to every subpartition, serialized once (Flink's `BroadcastRecordWriter`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Broadcast;

impl<T> ChannelSelector<T> for Broadcast {
    #[inline]
    fn select(&mut self, _record: &T, _subpartitions: usize) -> Target {
        Target::All
    }
    fn is_broadcast(&self) -> bool {
        true
    }
}

/// Writer settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterConfig {
    /// Largest serialized record accepted.
    pub max_record_size: usize,
    /// Buffer timeout: `Some(0)` flushes after every record, `None` never by time.
    pub buffer_timeout: Option<Duration>,
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            max_record_size: RECORD_SIZE_MAX_DEFAULT,
            buffer_timeout: Some(Duration::from_nanos(BUFFER_TIMEOUT_DEFAULT_NS)),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    target: Target,
    /// For `Target::All` in unicast mode: the subpartition being written.
    sub: usize,
    offset: usize,
    event: bool,
}

/// Counters of a writer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterMetrics {
    /// Records accepted.
    pub records_out: u64,
    /// Times the writer went pending (pool exhausted mid-record).
    pub backpressure_events: u64,
    /// Nanoseconds spent pending, by the task's clock.
    pub backpressured_ns: u64,
    /// The partition's counters.
    pub partition: PartitionMetrics,
}

/// Serializes records of type `T` into a [`ResultPartition`].
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
/// let mut read = Vec::new();
/// loop {
///     match gate.poll_run(&mut read, 256)? {
///         Some(GateRun::Event(GateEvent::End)) => break,
///         Some(_) => {}
///         None => unreachable!("everything was written before reading"),
///     }
/// }
/// assert_eq!(read, records);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RecordWriter<T: Codec, S: ChannelSelector<T>> {
    partition: ResultPartition,
    selector: S,
    broadcast: bool,
    scratch: Vec<u8>,
    pending: Option<Pending>,
    pending_since_ns: u64,
    max_record_size: usize,
    timeout_ns: Option<u64>,
    finished: bool,
    metrics: WriterMetrics,
    _records: PhantomData<fn(&T)>,
}

impl<T: Codec, S: ChannelSelector<T>> RecordWriter<T, S> {
    /// A writer routing with `selector` into `partition`.
    pub fn new(
        partition: ResultPartition,
        selector: S,
        config: WriterConfig,
    ) -> Result<Self, ConfigError> {
        if config.max_record_size == 0 {
            return Err(ConfigError::ZeroCapacity {
                what: "max_record_size",
            });
        }
        if config.max_record_size >= EVENT_TAG_MIN as usize {
            return Err(ConfigError::TooLarge {
                what: "max_record_size",
                requested: config.max_record_size,
                limit: EVENT_TAG_MIN as usize - 1,
            });
        }
        let broadcast = selector.is_broadcast();
        Ok(RecordWriter {
            partition,
            selector,
            broadcast,
            scratch: Vec::with_capacity(256),
            pending: None,
            pending_since_ns: 0,
            max_record_size: config.max_record_size,
            timeout_ns: config
                .buffer_timeout
                .map(|t| t.as_nanos().min(u128::from(u64::MAX / 2)) as u64),
            finished: false,
            metrics: WriterMetrics::default(),
            _records: PhantomData,
        })
    }

    /// Whether the task may emit: nothing pending and the pool available.
    #[inline]
    pub fn is_available(&mut self) -> bool {
        self.pending.is_none() && self.partition.pool().is_available()
    }

    /// Like [`is_available`](Self::is_available), but when it is not, registers with
    /// the pool so its notify fires when a buffer comes back. When the pool is dry
    /// because every segment is a buffer still being written, ends those buffers first
    /// ([`ResultPartition::release_if_stuck`]), so that a buffer does come back.
    pub fn available_or_notify(&mut self) -> Result<bool, ExchangeError> {
        loop {
            if self.partition.pool().available_or_notify() {
                return Ok(self.pending.is_none());
            }
            if !self.partition.release_if_stuck()? {
                return Ok(false);
            }
        }
    }

    /// Whether the task can make progress with this writer now: nothing pending (after
    /// resuming what was, on whatever buffers came back) and the pool available. When
    /// not, the pool's notification is armed before returning `false`, so the next
    /// recycled buffer wakes the task: a task that parks on `false` loses no wake-up.
    /// A pool that is dry because every segment it lent is a buffer still being written
    /// would never recycle one: those buffers are ended first
    /// ([`ResultPartition::release_if_stuck`]), so `false` always has a buffer on its
    /// way back, whatever the pool's size and the partition's fan-out.
    pub fn poll_ready(&mut self, now_ns: u64) -> Result<bool, ExchangeError> {
        loop {
            if self.pending.is_some() {
                self.resume(now_ns)?;
            }
            if !self.partition.pool().available_or_notify() {
                if self.partition.release_if_stuck()? {
                    // Buffers were ended: check again (and re-arm) before waiting.
                    continue;
                }
                // Armed: any buffer recycled from here on notifies, and one will be.
                return Ok(false);
            }
            if self.pending.is_none() {
                return Ok(true);
            }
            // Buffers came back while a write is pending: continue it.
        }
    }

    /// Continues a pending record or event as far as the pool allows; returns `true`
    /// when nothing is pending. When something still is, the pool's notification is
    /// armed (and buffers being written ended if nothing else could come back, as in
    /// [`poll_ready`](Self::poll_ready)) before returning `false`: a task that waits on
    /// `false`, e.g. after [`finish`](Self::finish), loses no wake-up. Unlike
    /// `poll_ready`, a dry pool with nothing pending is `true`.
    pub fn poll_pending(&mut self, now_ns: u64) -> Result<bool, ExchangeError> {
        loop {
            if self.resume(now_ns)? {
                return Ok(true);
            }
            if !self.partition.pool().available_or_notify() && !self.partition.release_if_stuck()? {
                // Armed, and a buffer is on its way back.
                return Ok(false);
            }
            // Buffers came back (or were freed) since the resume: continue it.
        }
    }

    /// The channel selector.
    pub fn selector(&self) -> &S {
        &self.selector
    }

    /// Whether part of a record or event still waits for buffers.
    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Serializes and writes `record`. If the pool runs dry mid-record, the rest is kept
    /// and the writer is pending: call [`resume`](Self::resume) once buffers return.
    pub fn emit(&mut self, record: &T, now_ns: u64) -> Result<(), ExchangeError> {
        self.ready_to_write()?;
        let subpartitions = self.partition.subpartitions();
        let target = self.selector.select(record, subpartitions);
        let dest = self.dest_of(target, subpartitions);
        // Fast path: the record fits in the current buffer; encode it there directly.
        if let Some(dest) = dest {
            if self
                .partition
                .try_encode(dest, record, self.max_record_size, now_ns)?
            {
                self.metrics.records_out += 1;
                if self.timeout_ns == Some(0) {
                    // Timeout 0: publish this record now (one store and a notification).
                    self.partition.flush(dest)?;
                }
                return Ok(());
            }
        }
        self.emit_spanning(record, target, now_ns)
    }

    /// The batch form of [`emit`](Self::emit): serializes and writes `records` in
    /// order, as many as the pool allows, and returns how many it took. Each stretch
    /// of records bound for the same subpartition is encoded into its buffer in one
    /// pass, with the buffer's bookkeeping once per stretch, and with timeout 0 what
    /// the run wrote is published once, at its end, not per record. The selector is
    /// asked once per record, in order, as the encoder reaches the record, and never
    /// for a record the call does not take: byte for byte the output of emitting each
    /// record, whatever the selector keeps (a round robin's position).
    ///
    /// If the pool runs dry in the middle of record `k`, that record's rest is pending
    /// (as for [`emit`](Self::emit)) and `k + 1` is returned: the caller keeps
    /// `records[k + 1..]` for after [`resume`](Self::resume).
    pub fn emit_run(&mut self, records: &[T], now_ns: u64) -> Result<usize, ExchangeError> {
        self.ready_to_write()?;
        let subpartitions = self.partition.subpartitions();
        let mut at = 0;
        // The target of `records[at]` when it was selected already: it ended the
        // stretch before it by going elsewhere.
        let mut selected: Option<Target> = None;
        while at < records.len() {
            let target = match selected.take() {
                Some(target) => target,
                None => self.selector.select(&records[at], subpartitions),
            };
            if let Some(dest) = self.dest_of(target, subpartitions) {
                // This record and those after it bound for the same buffer, each selected
                // when the encoder asks for it.
                let selector = &mut self.selector;
                let mut first = true;
                let mut elsewhere = None;
                let stretch = records[at..].iter().take_while(|record| {
                    if std::mem::take(&mut first) {
                        return true;
                    }
                    let to = selector.select(record, subpartitions);
                    if to != target {
                        elsewhere = Some(to);
                    }
                    to == target
                });
                let written =
                    self.partition
                        .try_encode_run(dest, stretch, self.max_record_size, now_ns)?;
                self.metrics.records_out += written as u64;
                at += written;
                if at == records.len() {
                    break;
                }
                if let Some(to) = elsewhere {
                    selected = Some(to);
                    continue;
                }
                // Otherwise `records[at]` was selected for `target` and did not fit.
            }
            // The record does not fit in what is left of its buffer (or goes to every
            // subpartition one by one): the spanning path, which may leave it pending.
            self.emit_spanning(&records[at], target, now_ns)?;
            at += 1;
            if self.pending.is_some() {
                break;
            }
        }
        if self.timeout_ns == Some(0) {
            // Also when a record is pending: the records before it are written whole
            // and must not wait for it (its own bytes may show; the reader waits for
            // the rest of it, as for any record that spans buffers).
            self.partition.flush_all()?;
        }
        Ok(at)
    }

    /// The buffer a record for `target` is encoded into directly; `None` for a record
    /// that goes to every subpartition one by one (not a broadcast selector's).
    #[inline]
    fn dest_of(&self, target: Target, subpartitions: usize) -> Option<Dest> {
        match target {
            Target::One(sub) => {
                assert!(
                    sub < subpartitions,
                    "selector chose subpartition {sub} of {subpartitions}"
                );
                Some(Dest::One(sub))
            }
            Target::All if self.broadcast => Some(Dest::Shared),
            Target::All => None,
        }
    }

    /// Serializes `record` into the scratch buffer and writes it across buffers.
    fn emit_spanning(
        &mut self,
        record: &T,
        target: Target,
        now_ns: u64,
    ) -> Result<(), ExchangeError> {
        self.scratch.clear();
        self.scratch.extend_from_slice(&[0; 4]);
        record.encode(&mut self.scratch);
        let size = self.scratch.len() - 4;
        if size > self.max_record_size {
            self.scratch.clear();
            return Err(ExchangeError::RecordTooLarge {
                size,
                max: self.max_record_size,
            });
        }
        self.scratch[..4].copy_from_slice(&(size as u32).to_le_bytes());
        self.metrics.records_out += 1;
        self.write(
            Pending {
                target,
                sub: 0,
                offset: 0,
                event: false,
            },
            now_ns,
        )?;
        if self.timeout_ns == Some(0) && self.pending.is_none() {
            self.partition.flush_all()?;
        }
        Ok(())
    }

    /// Broadcasts a watermark in band and publishes it with everything before it.
    pub fn emit_watermark(&mut self, timestamp: i64, now_ns: u64) -> Result<(), ExchangeError> {
        self.broadcast_event(WATERMARK_TAG, timestamp.to_le_bytes(), now_ns)
    }

    /// Broadcasts checkpoint `id`'s barrier in band, behind every record written
    /// before it (it never overtakes them), and publishes it with them.
    pub fn emit_barrier(&mut self, id: u64, now_ns: u64) -> Result<(), ExchangeError> {
        self.broadcast_event(BARRIER_TAG, id.to_le_bytes(), now_ns)
    }

    /// Broadcasts an event of 8 bytes in band and publishes it with everything before it.
    fn broadcast_event(
        &mut self,
        tag: u32,
        body: [u8; 8],
        now_ns: u64,
    ) -> Result<(), ExchangeError> {
        self.ready_to_write()?;
        self.scratch.clear();
        self.scratch.extend_from_slice(&tag.to_le_bytes());
        self.scratch.extend_from_slice(&body);
        self.write(
            Pending {
                target: Target::All,
                sub: 0,
                offset: 0,
                event: true,
            },
            now_ns,
        )
    }

    /// Announces unaligned checkpoint barrier `id` to every consumer ahead of the data
    /// written before it (which they then store as channel state); the barrier itself
    /// still follows in band ([`emit_barrier`](Self::emit_barrier)).
    pub fn announce_barrier(&self, id: u64) {
        self.partition.announce_barrier(id);
    }

    /// Announces aligned barrier `id`, which may time out (Flink's
    /// `aligned-checkpoint-timeout`), to every consumer: they count the timeout from now,
    /// and on a timeout read ahead to the barrier, which still follows in band
    /// ([`emit_barrier`](Self::emit_barrier)).
    pub fn announce_aligned_barrier(&self, id: u64) {
        self.partition.announce_aligned_barrier(id);
    }

    /// Handles that announce later barriers to every consumer once this writer is gone
    /// (its output finished but still queued; see [`BarrierAnnouncer`]).
    pub fn barrier_announcers(&self) -> Vec<BarrierAnnouncer> {
        self.partition.barrier_announcers()
    }

    /// [`barrier_announcers`](Self::barrier_announcers) for aligned barriers that may
    /// time out.
    pub fn aligned_barrier_announcers(&self) -> Vec<BarrierAnnouncer> {
        self.partition.aligned_barrier_announcers()
    }

    /// Broadcasts end-of-partition, publishes everything and ends every buffer. Nothing
    /// may be written after.
    /// If it ends pending, [`resume`](Self::resume) completes it.
    pub fn finish(&mut self, now_ns: u64) -> Result<(), ExchangeError> {
        self.ready_to_write()?;
        self.scratch.clear();
        self.scratch.extend_from_slice(&END_TAG.to_le_bytes());
        self.finished = true;
        self.write(
            Pending {
                target: Target::All,
                sub: 0,
                offset: 0,
                event: true,
            },
            now_ns,
        )
    }

    /// Continues a pending record or event; returns `true` when nothing is pending.
    pub fn resume(&mut self, now_ns: u64) -> Result<bool, ExchangeError> {
        if let Some(pending) = self.pending {
            self.write(pending, now_ns)?;
            if self.pending.is_none() {
                self.metrics.backpressured_ns += now_ns.saturating_sub(self.pending_since_ns);
                if !pending.event && self.timeout_ns == Some(0) {
                    // Timeout 0: a record is visible once written, however it was written
                    // (events flush themselves in `write`).
                    self.partition.flush_all()?;
                }
            }
        }
        Ok(self.pending.is_none())
    }

    /// When the buffer timeout next requires a flush, if it does.
    pub fn next_flush_deadline(&self) -> Option<u64> {
        match (self.timeout_ns, self.partition.unflushed_since_ns()) {
            (Some(timeout), Some(since)) if timeout > 0 => Some(since.saturating_add(timeout)),
            _ => None,
        }
    }

    /// Publishes written bytes whose timeout has passed at `now_ns`.
    pub fn on_timer(&mut self, now_ns: u64) -> Result<(), ExchangeError> {
        if self
            .next_flush_deadline()
            .is_some_and(|deadline| deadline <= now_ns)
        {
            self.partition.flush_all()?;
        }
        Ok(())
    }

    /// Publishes every written byte now (the buffers stay open).
    pub fn flush(&mut self) -> Result<(), ExchangeError> {
        self.partition.flush_all()
    }

    /// Counters.
    pub fn metrics(&self) -> WriterMetrics {
        WriterMetrics {
            partition: self.partition.metrics(),
            ..self.metrics
        }
    }

    /// The partition (for its pool's usage).
    pub fn partition(&mut self) -> &mut ResultPartition {
        &mut self.partition
    }

    fn ready_to_write(&self) -> Result<(), ExchangeError> {
        if self.pending.is_some() {
            return Err(ExchangeError::Pending);
        }
        if self.finished {
            return Err(ExchangeError::Finished);
        }
        Ok(())
    }

    /// Writes the scratch bytes for `pending`; leaves `self.pending` set if the pool ran
    /// dry. Events send the buffers they were written into.
    fn write(&mut self, mut pending: Pending, now_ns: u64) -> Result<(), ExchangeError> {
        let bytes = &self.scratch;
        let mid_record = !pending.event;
        match pending.target {
            Target::One(sub) => {
                pending.offset = self.partition.write(
                    Dest::One(sub),
                    bytes,
                    pending.offset,
                    mid_record,
                    now_ns,
                )?;
            }
            Target::All if self.broadcast => {
                pending.offset = self.partition.write(
                    Dest::Shared,
                    bytes,
                    pending.offset,
                    mid_record,
                    now_ns,
                )?;
            }
            Target::All => {
                while pending.sub < self.partition.subpartitions() {
                    let offset = self.partition.write(
                        Dest::One(pending.sub),
                        bytes,
                        pending.offset,
                        mid_record,
                        now_ns,
                    )?;
                    if offset < bytes.len() {
                        pending.offset = offset;
                        break;
                    }
                    pending.sub += 1;
                    pending.offset = 0;
                }
                if pending.sub == self.partition.subpartitions() {
                    pending.offset = bytes.len();
                }
            }
        }
        if pending.offset < self.scratch.len() {
            if self.pending.is_none() {
                self.metrics.backpressure_events += 1;
                self.pending_since_ns = now_ns;
            }
            self.pending = Some(pending);
            return Ok(());
        }
        self.pending = None;
        if self.finished {
            // The end-of-partition event is written: end every buffer.
            self.partition.finish_all()?;
        } else if pending.event {
            self.partition.flush_all()?;
        }
        Ok(())
    }
}

impl<T: Codec, S: ChannelSelector<T>> core::fmt::Debug for RecordWriter<T, S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RecordWriter")
            .field("partition", &self.partition)
            .field("pending", &self.pending)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}
