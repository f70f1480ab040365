//! The consumer side of a remote channel, as an input gate sees it.
//!
//! The network thread reads each buffer's payload straight into a segment of the
//! channel's receive pool and pushes the filled buffer on an SPSC ring; the gate pops it
//! here, exactly as it pops a local channel's buffers. Dropping the buffer recycles the
//! segment to the receive pool, which wakes the network thread to grant the sender new
//! credit.
//!
//! Unaligned barriers announced by the producer ahead of its queued buffers arrive as
//! priority barrier frames, ahead of those buffers; the network thread raises the
//! channel's barrier word and wakes the gate, which takes the checkpoint and reads the
//! channel ahead to the barrier in band, as it does a local channel's. Aligned barriers
//! that may time out are announced the same way (aligned barrier frames, another word):
//! the gate counts their timeout from the announcement.
//!
//! Who writes what: the network thread owns the ring's producer and writes `failure`
//! once, before it drops the producer; the gate owns this consumer. A gate that sees the
//! channel disconnected (the producer dropped, Acquire) then reads `failure` under its
//! lock: set if the connection failed, empty after a clean end of partition.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use weir_engine::exchange::{InputChannel, SharedBuffer};
use weir_engine::ring::Consumer;

use super::error::TransportError;

/// Where the network thread leaves a channel's failure for its consumer.
pub(crate) type FailureSlot = Arc<Mutex<Option<Arc<TransportError>>>>;

/// The buffer size the consuming gate announces (debloating), for the network thread to
/// send to the producer when it changes.
pub(crate) type BufferSizeSlot = Arc<AtomicU32>;

/// The words the network thread writes for a channel's consumer: the newest unaligned
/// and aligned barrier announcements, and the bytes that arrived so far.
#[derive(Clone, Default)]
pub(crate) struct ChannelWords {
    pub(crate) barrier: Arc<AtomicU64>,
    pub(crate) aligned: Arc<AtomicU64>,
    pub(crate) received: Arc<AtomicU64>,
}

/// A channel fed by a remote producer over the transport (Flink's
/// `RemoteInputChannel`). Give it to an [`InputGate`](weir_engine::exchange::InputGate)
/// beside local channels. Dropping it cancels the channel at the producer.
pub struct RemoteInputChannel {
    channel: u32,
    peer: String,
    ring: Consumer<SharedBuffer>,
    failure: FailureSlot,
    buffer_size: BufferSizeSlot,
    /// The newest unaligned barrier its producer announced ahead of the data (a priority
    /// barrier frame), written by the network thread.
    barrier: Arc<AtomicU64>,
    /// The newest aligned barrier its producer announced as it wrote it (an aligned
    /// barrier frame), written by the network thread.
    aligned: Arc<AtomicU64>,
    /// Bytes that arrived so far (the network thread's running total), and those taken.
    received: Arc<AtomicU64>,
    taken: u64,
}

impl RemoteInputChannel {
    pub(crate) fn new(
        channel: u32,
        peer: String,
        ring: Consumer<SharedBuffer>,
        failure: FailureSlot,
        buffer_size: BufferSizeSlot,
        words: ChannelWords,
    ) -> Self {
        RemoteInputChannel {
            channel,
            peer,
            ring,
            failure,
            buffer_size,
            barrier: words.barrier,
            aligned: words.aligned,
            received: words.received,
            taken: 0,
        }
    }

    /// The channel id, as the producer serves it.
    pub fn channel(&self) -> u32 {
        self.channel
    }

    /// The producing peer.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Buffers arrived and not yet taken by the gate.
    pub fn buffered(&self) -> usize {
        self.ring.len()
    }

    /// Why the channel failed, if it did.
    pub fn error(&self) -> Option<Arc<TransportError>> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl InputChannel for RemoteInputChannel {
    #[inline]
    fn poll_buffer(&mut self) -> Option<SharedBuffer> {
        let buffer = self.ring.try_pop()?;
        self.taken += buffer.as_slice().len() as u64;
        Some(buffer)
    }

    fn is_disconnected(&self) -> bool {
        self.ring.is_abandoned()
    }

    fn usage(&self) -> (usize, usize) {
        (self.ring.len(), self.ring.capacity())
    }

    fn announce_buffer_size(&mut self, size: usize) {
        // Relaxed: advice; the network thread sends it in a buffer-size frame at its next
        // turn for this channel's connection.
        self.buffer_size
            .store(size.min(u32::MAX as usize) as u32, Ordering::Relaxed);
    }

    fn announced_barrier(&self) -> u64 {
        // Acquire: pairs with the network thread's Release when the frame came.
        self.barrier.load(Ordering::Acquire)
    }

    fn announced_aligned_barrier(&self) -> u64 {
        // Acquire: pairs with the network thread's Release when the frame came.
        self.aligned.load(Ordering::Acquire)
    }

    fn queued_bytes(&self) -> Option<u64> {
        // What arrived and waits here; what waits at the sender for credit is not seen.
        Some(
            self.received
                .load(Ordering::Relaxed)
                .saturating_sub(self.taken),
        )
    }

    fn failure(&self) -> Option<Box<dyn std::error::Error + Send + Sync>> {
        self.error()
            .map(|error| Box::new(error) as Box<dyn std::error::Error + Send + Sync>)
    }
}

impl core::fmt::Debug for RemoteInputChannel {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RemoteInputChannel")
            .field("channel", &self.channel)
            .field("peer", &self.peer)
            .field("buffered", &self.ring.len())
            .finish()
    }
}
