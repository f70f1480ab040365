//! A segment read while it is written (Flink's `BufferBuilder` / `BufferConsumer`).
//!
//! The writer appends into a [`BufferBuilder`] and, when the bytes must become visible
//! (a flush, a full buffer, an event, the end), *publishes* its write position: one
//! Release store to the segment's position word. Each reader holds a
//! [`BufferConsumer`] of the segment (one per subpartition for a broadcast buffer) and
//! takes, with an Acquire load of that word, the bytes published since its last read,
//! as a read-only [`SharedBuffer`] view. Writing a record touches no atomic: the
//! position is stored once per publication, however many records it covers.
//!
//! The position word holds the published length in bits 0..31 and [`FINISHED`] in bit
//! 31: the builder is gone (its buffer was full or closed) and the length is final.
//!
//! Invariants:
//! 1. Only the builder writes the segment's bytes, and only at or above the position
//!    it last published; readers read only below a position they loaded. So a view's
//!    bytes never change while it lives, and no byte is read before it is published.
//! 2. Only the builder stores the position word: 0 when it starts, then growing
//!    lengths, the last one with [`FINISHED`] (when it drops).
//! 3. `shares[segment]` = 1 for the live builder + live consumers not yet spent + live
//!    views. Together they hold one pool reference (`pool` invariant 3), and whoever
//!    takes the count to zero recycles the segment: a segment is recycled only after
//!    its builder is gone (the writer is done) and every consumer has read all of it
//!    and dropped every view (the readers are done).
//!
//! Ordering: the builder's Release store of the position publishes the bytes below it
//! and pairs with the Acquire load in [`BufferConsumer::read`]. The start position (0)
//! is stored before a consumer is handed to a reader, through a channel that orders
//! the two (the ring's Release push, Acquire pop), so a reader never sees the position
//! of the segment's previous use. Share decrements are Release and the last is followed
//! by an Acquire fence before recycling, as for `Arc`.

use core::ptr::NonNull;

use crate::exchange::pool::{release_share, Buffer, Global, Shared, SharedBuffer};
use crate::sync::Ordering;

/// Position-word flag: the builder is gone and the published length is final.
pub const FINISHED: u32 = 1 << 31;
const _: () = assert!(crate::limits::SEGMENT_SIZE_MAX < FINISHED as usize);

/// The writer's side of a segment: appends bytes and publishes them.
pub struct BufferBuilder {
    shared: NonNull<Shared>,
    segment: u32,
    /// The segment's first byte.
    start: NonNull<u8>,
    /// Bytes written.
    len: u32,
    /// Bytes published (the writer's copy of the position word).
    published: u32,
    /// Bytes this buffer may hold: the segment size, or less when the consumer asked for
    /// smaller buffers (debloating).
    limit: u32,
}

// SAFETY: the builder is the only writer of its segment's unpublished bytes (invariant
// 1) and reaches the shared state only through atomics and `Sync` parts; it holds a
// counted share (invariant 3).
unsafe impl Send for BufferBuilder {}

impl BufferBuilder {
    /// Turns a freshly requested buffer into a builder holding at most `limit` bytes
    /// (capped at the segment size, at least 1). Bytes already in the buffer count as
    /// written and unpublished.
    pub fn new(buffer: Buffer, limit: usize) -> Self {
        let buffer = core::mem::ManuallyDrop::new(buffer);
        let global = buffer.global();
        let index = buffer.segment as usize;
        debug_assert_eq!(global.shares[index].load(Ordering::Relaxed), 0);
        // Relaxed: the builder is the only holder yet; it reaches readers only through
        // a consumer, which a synchronising channel carries.
        global.shares[index].store(1, Ordering::Relaxed);
        // Relaxed: the consumer reads it after the channel's Acquire pop (module docs).
        global.positions[index].store(0, Ordering::Relaxed);
        let limit = limit.clamp(1, global.segment_size) as u32;
        let len = buffer.len() as u32;
        assert!(len <= limit, "buffer holds more than the builder's limit");
        BufferBuilder {
            shared: buffer.shared,
            segment: buffer.segment,
            start: global.segment_start(buffer.segment),
            len,
            published: 0,
            limit,
        }
    }

    #[inline(always)]
    fn global(&self) -> &Global {
        // SAFETY: the builder holds a share, hence the pool reference (invariant 3).
        unsafe { &self.shared.as_ref().global }
    }

    /// Bytes this buffer may hold.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.limit as usize
    }

    /// Bytes written so far.
    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether nothing was written.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the buffer holds its capacity.
    #[inline]
    pub fn is_full(&self) -> bool {
        self.len == self.limit
    }

    /// Bytes published so far.
    #[inline]
    pub fn published_len(&self) -> usize {
        self.published as usize
    }

    /// Whether bytes were written since the last publication.
    #[inline]
    pub fn has_unpublished(&self) -> bool {
        self.len != self.published
    }

    /// The room left, for writing; [`commit`](Self::commit) what was written.
    #[inline]
    pub fn free_mut(&mut self) -> &mut [u8] {
        let free = (self.limit - self.len) as usize;
        // SAFETY: `len..limit` lies inside the segment (limit <= segment size), at or
        // above the published position, so no reader reads it (invariant 1); `&mut self`
        // makes this the only live view of it.
        unsafe { core::slice::from_raw_parts_mut(self.start.as_ptr().add(self.len as usize), free) }
    }

    /// Counts `count` bytes written at the start of [`free_mut`](Self::free_mut).
    ///
    /// # Panics
    /// If that exceeds the capacity.
    #[inline]
    pub fn commit(&mut self, count: usize) {
        assert!(
            count <= (self.limit - self.len) as usize,
            "commit past the buffer's capacity"
        );
        self.len += count as u32;
    }

    /// Copies as much of `bytes` as fits; returns how much.
    #[inline]
    pub fn append(&mut self, bytes: &[u8]) -> usize {
        let free = self.free_mut();
        let count = free.len().min(bytes.len());
        free[..count].copy_from_slice(&bytes[..count]);
        self.len += count as u32;
        count
    }

    /// Publishes what was written: one Release store, if anything is new. Returns
    /// whether it published.
    #[inline]
    pub fn publish(&mut self) -> bool {
        if self.len == self.published {
            return false;
        }
        debug_assert!(self.len > self.published);
        self.published = self.len;
        // Release: publishes the bytes below `len`; pairs with the Acquire load in
        // `BufferConsumer::read`.
        self.global().positions[self.segment as usize].store(self.len, Ordering::Release);
        true
    }

    /// A reader of this segment from its first byte.
    pub fn consumer(&self) -> BufferConsumer {
        // Relaxed: like `Arc::clone`, the builder holds a share, so the count cannot
        // reach zero meanwhile.
        self.global().shares[self.segment as usize].fetch_add(1, Ordering::Relaxed);
        BufferConsumer {
            shared: self.shared,
            segment: self.segment,
            read: 0,
            spent: false,
        }
    }

    /// The segment's index in the network pool.
    pub fn segment_index(&self) -> usize {
        self.segment as usize
    }
}

impl Drop for BufferBuilder {
    fn drop(&mut self) {
        self.published = self.len;
        // Release: publishes every written byte and the end; pairs with the Acquire load
        // in `BufferConsumer::read`.
        self.global().positions[self.segment as usize]
            .store(self.len | FINISHED, Ordering::Release);
        // SAFETY: the builder holds one share (invariant 3) and is gone after this.
        unsafe { release_share(self.shared, self.segment) };
    }
}

impl core::fmt::Debug for BufferBuilder {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BufferBuilder")
            .field("segment", &self.segment)
            .field("len", &self.len)
            .field("published", &self.published)
            .field("limit", &self.limit)
            .finish()
    }
}

/// What a [`BufferConsumer::read`] found.
#[derive(Debug)]
pub enum Read {
    /// The bytes published since the last read.
    Bytes(SharedBuffer),
    /// Nothing new yet; the builder may publish more.
    Nothing,
    /// The builder is gone and everything was read: the consumer is spent.
    Finished,
}

/// A reader's side of a segment: takes the bytes its builder published.
pub struct BufferConsumer {
    shared: NonNull<Shared>,
    segment: u32,
    /// Bytes read (handed out as views).
    read: u32,
    /// The consumer's share was given up (or moved into the last view).
    spent: bool,
}

// SAFETY: a consumer only reads published bytes (invariant 1) and holds a counted share
// (invariant 3); the shared state is reached through atomics and `Sync` parts.
unsafe impl Send for BufferConsumer {}

impl BufferConsumer {
    #[inline(always)]
    fn global(&self) -> &Global {
        debug_assert!(!self.spent);
        // SAFETY: an unspent consumer holds a share, hence the pool reference.
        unsafe { &self.shared.as_ref().global }
    }

    /// The bytes published since the last read, as a view that keeps the segment alive.
    /// Once the builder is gone and everything is read, the consumer gives up its share
    /// (moving it into the last view when there is one) and is spent.
    #[inline]
    pub fn read(&mut self) -> Read {
        if self.spent {
            return Read::Finished;
        }
        let global = self.global();
        let index = self.segment as usize;
        // Acquire: pairs with the builder's Release store, so the bytes below the
        // position are visible.
        let word = global.positions[index].load(Ordering::Acquire);
        let position = word & !FINISHED;
        let finished = word & FINISHED != 0;
        debug_assert!(position >= self.read, "the position went backwards");
        if position == self.read {
            if !finished {
                return Read::Nothing;
            }
            self.spent = true;
            // SAFETY: the consumer's share, given up once (`spent`).
            unsafe { release_share(self.shared, self.segment) };
            return Read::Finished;
        }
        if finished {
            // The last bytes: the view takes over the consumer's share.
            self.spent = true;
        } else {
            // Relaxed: like `Arc::clone`, the consumer holds a share.
            global.shares[index].fetch_add(1, Ordering::Relaxed);
        }
        let offset = self.read;
        self.read = position;
        Read::Bytes(SharedBuffer {
            shared: self.shared,
            segment: self.segment,
            offset,
            len: (position - offset) as usize,
        })
    }

    /// Whether the consumer read its segment to the end and holds nothing.
    #[inline]
    pub fn is_spent(&self) -> bool {
        self.spent
    }

    /// Bytes read so far.
    pub fn read_len(&self) -> usize {
        self.read as usize
    }

    /// The segment's index in the network pool.
    pub fn segment_index(&self) -> usize {
        self.segment as usize
    }
}

impl Drop for BufferConsumer {
    fn drop(&mut self) {
        if !self.spent {
            // SAFETY: an unspent consumer holds one share and is gone after this.
            unsafe { release_share(self.shared, self.segment) };
        }
    }
}

impl core::fmt::Debug for BufferConsumer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BufferConsumer")
            .field("segment", &self.segment)
            .field("read", &self.read)
            .field("spent", &self.spent)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::exchange::pool::{LocalBufferPool, LocalPoolConfig, NetworkBufferPool};

    /// A reader sees only published bytes, each once, and the segment comes back only
    /// when the builder and the reader (and its views) are all gone.
    #[test]
    fn reads_published_bytes_and_recycles_after_both_sides() {
        let network = NetworkBufferPool::new(2, 64).unwrap();
        let mut pool =
            LocalBufferPool::new(&network, LocalPoolConfig::new(1, 1).with_overdraft(0)).unwrap();
        let mut builder = BufferBuilder::new(pool.request(0).unwrap(), 64);
        let mut consumer = builder.consumer();
        assert_eq!(builder.append(b"abc"), 3);
        assert!(matches!(consumer.read(), Read::Nothing), "not published");
        assert!(builder.publish());
        assert!(!builder.publish(), "nothing new");
        let Read::Bytes(first) = consumer.read() else {
            panic!("published bytes")
        };
        assert_eq!(first.as_slice(), b"abc");
        assert_eq!(builder.append(b"de"), 2);
        builder.publish();
        let Read::Bytes(second) = consumer.read() else {
            panic!("published bytes")
        };
        assert_eq!((second.offset(), second.as_slice()), (3, &b"de"[..]));
        assert!(matches!(consumer.read(), Read::Nothing));
        builder.append(b"f");
        drop(builder);
        let Read::Bytes(last) = consumer.read() else {
            panic!("the builder's drop publishes")
        };
        assert!(consumer.is_spent());
        assert_eq!(last.as_slice(), b"f");
        assert!(matches!(consumer.read(), Read::Finished));
        drop(consumer);
        drop((first, second));
        assert!(pool.request(0).is_none(), "a view still holds the segment");
        drop(last);
        let again = pool.request(0).expect("recycled after every holder");
        drop(again);
        drop(pool);
        network.assert_whole();
    }

    /// The limit caps what a builder takes; a builder with nothing written, finished,
    /// leaves its consumer nothing to read.
    #[test]
    fn limit_caps_the_buffer() {
        let network = NetworkBufferPool::new(1, 64).unwrap();
        let mut pool = LocalBufferPool::new(&network, LocalPoolConfig::new(1, 1)).unwrap();
        let mut builder = BufferBuilder::new(pool.request(0).unwrap(), 10);
        assert_eq!(builder.capacity(), 10);
        assert_eq!(builder.append(&[1; 20]), 10);
        assert!(builder.is_full());
        drop(builder);
        let builder = BufferBuilder::new(pool.request(0).unwrap(), 1000);
        assert_eq!(builder.capacity(), 64);
        let mut consumer = builder.consumer();
        drop(builder);
        assert!(matches!(consumer.read(), Read::Finished));
        drop(consumer);
        drop(pool);
        network.assert_whole();
    }
}
