//! Channels between a result partition's subpartition and an input gate.
//!
//! A channel carries filled buffers ([`SharedBuffer`]s) in order. A local channel is an
//! SPSC [`ring`](crate::ring) between the producer's and the consumer's threads: the
//! gate reads the producer's segments directly, no copy. A remote channel (TCP, with
//! credits) implements the same [`InputChannel`] trait on the consumer side, filling
//! buffers from the gate's own pool.

use std::sync::Arc;

use crate::exchange::pool::SharedBuffer;
use crate::park::Notify;
use crate::ring::{self, Consumer, Producer};

/// The consumer side of a channel, as an input gate sees it.
pub trait InputChannel: Send {
    /// The next buffer, if one has arrived.
    fn poll_buffer(&mut self) -> Option<SharedBuffer>;
    /// Whether the producer is gone; buffers it sent before may still be waiting.
    fn is_disconnected(&self) -> bool;
    /// Why the channel broke, if it did (a remote channel whose connection was lost):
    /// the gate reports this instead of a bare disconnection. A local channel never
    /// breaks this way.
    fn failure(&self) -> Option<Box<dyn std::error::Error + Send + Sync>> {
        None
    }
}

/// The producer side of a local channel.
pub struct ChannelSender {
    ring: Producer<SharedBuffer>,
    notify: Option<Arc<dyn Notify>>,
}

/// The consumer side of a local channel.
pub struct LocalInputChannel {
    ring: Consumer<SharedBuffer>,
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
    (
        ChannelSender {
            ring: producer,
            notify,
        },
        LocalInputChannel { ring: consumer },
    )
}

impl ChannelSender {
    /// Sends a buffer; hands it back if the channel is full.
    pub(crate) fn send(&mut self, buffer: SharedBuffer) -> Result<(), SharedBuffer> {
        self.ring.try_push(buffer)?;
        if let Some(notify) = &self.notify {
            notify.notify();
        }
        Ok(())
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
    #[inline]
    fn poll_buffer(&mut self) -> Option<SharedBuffer> {
        self.ring.try_pop()
    }

    fn is_disconnected(&self) -> bool {
        self.ring.is_abandoned()
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
            .field("buffered", &self.ring.len())
            .finish()
    }
}
