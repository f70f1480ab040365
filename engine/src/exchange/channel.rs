//! Channels between a result partition's subpartition and an input gate.
//!
//! A channel yields, in order, the bytes its producer published, as read-only
//! [`SharedBuffer`] views. A local channel is an SPSC [`ring`] of
//! [`BufferConsumer`]s between the producer's and the consumer's threads: the
//! subpartition pushes a consumer of each buffer it starts (when it first publishes
//! into it), and [`InputChannel::poll_buffer`] returns the bytes published into the
//! oldest unfinished buffer since the last poll, while the producer may still be writing
//! it (see [`buffer`](crate::exchange::buffer)). The gate reads the producer's segments
//! in place, no copy; a view holds its segment until it drops. A remote channel (TCP,
//! with credits) implements the same [`InputChannel`] trait on the consumer side,
//! filling buffers from the gate's own pool.
//!
//! Views split the stream of bytes wherever the producer published, so a record may
//! span views as it may span buffers; the gate reassembles it.
//!
//! Buffer size announcements (debloating) travel the other way: the gate calls
//! [`InputChannel::announce_buffer_size`], a local channel stores it in a word its
//! producer reads when it starts a buffer (Relaxed both sides: a size is advice, and a
//! late one only delays the change by a buffer). A remote channel would carry it in a
//! frame to the sending process, whose sender reads the subpartition through a local
//! channel and passes the size on with that channel's `announce_buffer_size`.
//!
//! Unaligned checkpoint barriers are announced ahead of the data (Flink's priority
//! events): the producer's [`ChannelSender::announce_barrier`] raises a word the consumer
//! reads with [`InputChannel::announced_barrier`] and rings its doorbell, so that the gate
//! takes the checkpoint before it reads the buffers queued in front of the barrier, and
//! stores them as channel state (Release/Acquire: the gate that sees the id may act on
//! it; the buffers themselves still come through the ring in order).
//!
//! Aligned barriers that may time out (Flink's `aligned-checkpoint-timeout`) are
//! announced the same way, in a word of their own
//! ([`ChannelSender::announce_aligned_barrier`], read with
//! [`InputChannel::announced_aligned_barrier`]): the barrier still travels in band and
//! is aligned there, but the gate starts the timeout when the barrier is put on the
//! channel, not when it reaches the front of the queue, and on a timeout reads the
//! channel ahead to the barrier as it does for an unaligned one.
//!
//! Invariant: the ring holds every consumer the producer can have in flight (its pool's
//! size plus overdraft), so a push never finds it full (`ResultPartition::new` checks).

use std::sync::Arc;

use crate::exchange::buffer::{BufferConsumer, Read};
use crate::exchange::pool::SharedBuffer;
use crate::park::Notify;
use crate::ring::{self, Consumer, Producer};
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// The consumer side of a channel, as an input gate sees it.
pub trait InputChannel: Send {
    /// The bytes that arrived since the last poll, if any. A view may end inside a
    /// record; the next one continues it.
    fn poll_buffer(&mut self) -> Option<SharedBuffer>;
    /// Whether the producer is gone; what it published before may still be waiting.
    fn is_disconnected(&self) -> bool;
    /// Why the channel broke, if it did (a remote channel whose connection was lost):
    /// the gate reports this instead of a bare disconnection. A local channel never
    /// breaks this way.
    fn failure(&self) -> Option<Box<dyn std::error::Error + Send + Sync>> {
        None
    }
    /// Asks the producer to start buffers of at most `size` bytes (0: no limit), as the
    /// gate's debloater computes it. The default ignores it.
    fn announce_buffer_size(&mut self, size: usize) {
        let _ = size;
    }
    /// The newest unaligned checkpoint barrier its producer announced ahead of the data
    /// (0: none); a channel that cannot carry announcements returns 0 and its barriers
    /// come in band only.
    fn announced_barrier(&self) -> u64 {
        0
    }
    /// The newest aligned barrier that may time out its producer announced (0: none):
    /// it is in band behind what the channel holds, and the gate counts its alignment
    /// timeout from this announcement. A channel that cannot carry such announcements
    /// returns 0, and the timeout counts from the barrier's arrival in band.
    fn announced_aligned_barrier(&self) -> u64 {
        0
    }
    /// Buffers waiting in the channel for the gate, and the most it holds: the input
    /// side's share of Flink's `inPoolUsage`. `(0, 0)` (the default): not known.
    fn usage(&self) -> (usize, usize) {
        (0, 0)
    }
    /// Bytes its producer published (or that arrived) that the gate has not taken yet:
    /// this channel's data in flight. `None` (the default): not known.
    fn queued_bytes(&self) -> Option<u64> {
        None
    }
}

/// The producer side of a local channel.
pub struct ChannelSender {
    ring: Producer<BufferConsumer>,
    notify: Option<Arc<dyn Notify>>,
    buffer_size: Arc<AtomicU32>,
    barrier: Arc<AtomicU64>,
    aligned: Arc<AtomicU64>,
    /// Bytes published on the channel so far (the producer's running total, stored for
    /// the consumer's in-flight figure; Relaxed: a gauge).
    published: Arc<AtomicU64>,
    published_total: u64,
}

fn announce(barrier: &AtomicU64, notify: Option<&Arc<dyn Notify>>, id: u64) {
    // Release: pairs with the gate's Acquire load (module docs).
    barrier.fetch_max(id, Ordering::Release);
    if let Some(notify) = notify {
        notify.notify();
    }
}

/// Announces unaligned checkpoint barriers to one channel's consumer, as
/// [`ChannelSender::announce_barrier`] does, but outliving the sender: a task whose input
/// ended leaves, while the output it queued is still to be read. Flink keeps such a task
/// running until its final checkpoint so that a barrier still overtakes that output;
/// here the checkpoint service announces each later barrier through this handle, and the
/// consumer reads the channel ahead to its end (which counts as every later barrier),
/// storing what it read as channel state, instead of waiting for the backlog. One made by
/// [`ChannelSender::aligned_announcer`] announces aligned barriers that may time out
/// instead (the consumer reads ahead once the timeout passed).
#[derive(Clone)]
pub struct BarrierAnnouncer {
    barrier: Arc<AtomicU64>,
    notify: Option<Arc<dyn Notify>>,
}

impl BarrierAnnouncer {
    /// Announces barrier `id` ahead of what the channel still holds (unaligned, or
    /// aligned with a timeout: as the announcer was made), and wakes its consumer.
    pub fn announce(&self, id: u64) {
        announce(&self.barrier, self.notify.as_ref(), id);
    }
}

impl core::fmt::Debug for BarrierAnnouncer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BarrierAnnouncer")
            .field("announced", &self.barrier.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// The consumer side of a local channel.
pub struct LocalInputChannel {
    ring: Consumer<BufferConsumer>,
    /// The buffer being read.
    current: Option<BufferConsumer>,
    buffer_size: Arc<AtomicU32>,
    barrier: Arc<AtomicU64>,
    aligned: Arc<AtomicU64>,
    published: Arc<AtomicU64>,
    /// Bytes handed to the gate so far.
    taken: u64,
    /// The buffers asked for (the ring may have more slots): the usage's whole.
    capacity: usize,
}

/// A local channel holding up to `capacity` buffers (rounded up to a power of two).
/// `notify` wakes the consumer's task when a buffer arrives.
///
/// A channel must hold every buffer its producer can have in flight (its local pool's
/// size plus overdraft), so that sending never finds it full; `ResultPartition::new`
/// checks this.
pub fn local_channel(
    capacity: usize,
    notify: Option<Arc<dyn Notify>>,
) -> (ChannelSender, LocalInputChannel) {
    let (producer, consumer) = ring::channel(capacity);
    let buffer_size = Arc::new(AtomicU32::new(0));
    let barrier = Arc::new(AtomicU64::new(0));
    let aligned = Arc::new(AtomicU64::new(0));
    let published = Arc::new(AtomicU64::new(0));
    (
        ChannelSender {
            ring: producer,
            notify,
            buffer_size: Arc::clone(&buffer_size),
            barrier: Arc::clone(&barrier),
            aligned: Arc::clone(&aligned),
            published: Arc::clone(&published),
            published_total: 0,
        },
        LocalInputChannel {
            ring: consumer,
            current: None,
            buffer_size,
            barrier,
            aligned,
            published,
            taken: 0,
            capacity: capacity.max(1),
        },
    )
}

impl ChannelSender {
    /// Hands the consumer of a buffer to the reader; gives it back if the channel is
    /// full. Does not wake the reader: [`notify`](Self::notify) does, once bytes are
    /// published.
    pub(crate) fn push(&mut self, consumer: BufferConsumer) -> Result<(), BufferConsumer> {
        self.ring.try_push(consumer)
    }

    /// Announces unaligned checkpoint barrier `id` to the consumer ahead of the data,
    /// and wakes it.
    pub fn announce_barrier(&self, id: u64) {
        announce(&self.barrier, self.notify.as_ref(), id);
    }

    /// Announces aligned barrier `id`, which may time out, to the consumer as it is
    /// written in band (module docs), and wakes it.
    pub fn announce_aligned_barrier(&self, id: u64) {
        announce(&self.aligned, self.notify.as_ref(), id);
    }

    /// A handle that announces unaligned barriers on this channel after its producer is
    /// gone (a finished task's queued output still to be read: see
    /// [`BarrierAnnouncer`]).
    pub fn announcer(&self) -> BarrierAnnouncer {
        BarrierAnnouncer {
            barrier: Arc::clone(&self.barrier),
            notify: self.notify.clone(),
        }
    }

    /// [`announcer`](Self::announcer) for aligned barriers that may time out.
    pub fn aligned_announcer(&self) -> BarrierAnnouncer {
        BarrierAnnouncer {
            barrier: Arc::clone(&self.aligned),
            notify: self.notify.clone(),
        }
    }

    /// `bytes` more were published on the channel (for its in-flight figure: a plain
    /// store of the running total, the producer being its only writer).
    #[inline]
    pub(crate) fn count_published(&mut self, bytes: usize) {
        self.published_total += bytes as u64;
        self.published
            .store(self.published_total, Ordering::Relaxed);
    }

    /// Wakes the reader's task (bytes were published).
    #[inline]
    pub(crate) fn notify(&self) {
        if let Some(notify) = &self.notify {
            notify.notify();
        }
    }

    /// The buffer size the reader last announced (0: none).
    #[inline]
    pub fn announced_buffer_size(&self) -> usize {
        // Relaxed: advice only (module docs).
        self.buffer_size.load(Ordering::Relaxed) as usize
    }

    /// Buffers the channel can hold.
    pub fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// Whether the consumer is gone.
    pub fn is_disconnected(&self) -> bool {
        self.ring.is_abandoned()
    }
}

impl InputChannel for LocalInputChannel {
    fn usage(&self) -> (usize, usize) {
        // The buffer being read holds its segment too.
        let reading = usize::from(self.current.is_some());
        (self.ring.len() + reading, self.capacity + 1)
    }

    #[inline]
    fn poll_buffer(&mut self) -> Option<SharedBuffer> {
        loop {
            let current = match &mut self.current {
                Some(current) => current,
                None => self.current.insert(self.ring.try_pop()?),
            };
            match current.read() {
                Read::Bytes(view) => {
                    self.taken += view.as_slice().len() as u64;
                    if current.is_spent() {
                        // The buffer's last bytes: the next poll starts the next buffer.
                        self.current = None;
                    }
                    return Some(view);
                }
                Read::Nothing => return None,
                Read::Finished => self.current = None,
            }
        }
    }

    fn is_disconnected(&self) -> bool {
        self.ring.is_abandoned()
    }

    fn announce_buffer_size(&mut self, size: usize) {
        // Relaxed: advice only (module docs).
        self.buffer_size
            .store(size.min(u32::MAX as usize) as u32, Ordering::Relaxed);
    }

    fn announced_barrier(&self) -> u64 {
        self.barrier.load(Ordering::Acquire)
    }

    fn announced_aligned_barrier(&self) -> u64 {
        self.aligned.load(Ordering::Acquire)
    }

    fn queued_bytes(&self) -> Option<u64> {
        // The producer counts after it publishes: a view taken in between reads as 0.
        Some(
            self.published
                .load(Ordering::Relaxed)
                .saturating_sub(self.taken),
        )
    }
}

impl core::fmt::Debug for ChannelSender {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ChannelSender")
            .field("capacity", &self.capacity())
            .finish_non_exhaustive()
    }
}

impl core::fmt::Debug for LocalInputChannel {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("LocalInputChannel")
            .field("queued", &self.ring.len())
            .field("current", &self.current)
            .finish()
    }
}
