//! Single-producer single-consumer mail ring between two threads.
//!
//! The only way data crosses cores in Weir. A ring is a power-of-two array of slots
//! with two free-running indices, `head` (next slot to read) and `tail` (next slot to
//! write), each on its own cache line.
//!
//! Invariants:
//! 1. `tail - head <= capacity` (both wrap; compared with `wrapping_sub`).
//! 2. Only the producer writes `tail` and the slots outside `[head, tail)`.
//! 3. Only the consumer writes `head` and reads (moves out of) the slots in `[head, tail)`.
//! 4. Every slot in `[head, tail)` holds an initialised value; every other slot is
//!    uninitialised. Whoever holds the last reference drops exactly the values in
//!    `[head, tail)`, so an undelivered value is dropped once and a delivered one never.
//!
//! Ordering: the producer's Release store of `tail` publishes its slot writes and
//! pairs with the consumer's Acquire load of `tail`; the consumer's Release store of
//! `head` publishes that it has finished moving values out and pairs with the
//! producer's Acquire load of `head` before it reuses those slots.
//!
//! Each side caches the other's index (`head_cache`, `tail_cache`) and reloads it only
//! when the cached value says full or empty, so a streaming ring touches the shared
//! line about once per lap instead of once per value. Batch operations publish their
//! index once per batch.
//!
//! Disconnection: each side sets its `*_gone` flag (Release) after its last index
//! store when it is dropped; the other side reads it with Acquire, so a consumer that
//! sees the producer gone and then drains sees every value ever pushed.

use core::mem::MaybeUninit;

use crossbeam_utils::CachePadded;

use crate::error::ConfigError;
use crate::limits::RING_CAPACITY_MAX;
use crate::sync::{Arc, AtomicBool, AtomicUsize, Ordering, UnsafeCell};

/// Creates a ring with room for at least `capacity` values (rounded up to a power of
/// two; 0 becomes 1).
///
/// # Panics
/// If `capacity` exceeds [`RING_CAPACITY_MAX`]; use [`try_channel`] to get an error.
pub fn channel<T>(capacity: usize) -> (Producer<T>, Consumer<T>) {
    match try_channel(capacity) {
        Ok(pair) => pair,
        Err(error) => panic!("ring::channel: {error}"),
    }
}

/// Creates a ring like [`channel`], or says why the capacity is refused.
pub fn try_channel<T>(capacity: usize) -> Result<(Producer<T>, Consumer<T>), ConfigError> {
    if capacity > RING_CAPACITY_MAX {
        return Err(ConfigError::TooLarge {
            what: "ring capacity",
            requested: capacity,
            limit: RING_CAPACITY_MAX,
        });
    }
    let capacity = capacity.max(1).next_power_of_two();
    let slots = (0..capacity)
        .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
        .collect();
    let shared = Arc::new(Shared {
        head: CachePadded::new(AtomicUsize::new(0)),
        tail: CachePadded::new(AtomicUsize::new(0)),
        producer_gone: AtomicBool::new(false),
        consumer_gone: AtomicBool::new(false),
        slots,
        mask: capacity - 1,
    });
    let producer = Producer {
        shared: Arc::clone(&shared),
        tail: 0,
        head_cache: 0,
    };
    let consumer = Consumer {
        shared,
        head: 0,
        tail_cache: 0,
    };
    Ok((producer, consumer))
}

struct Shared<T> {
    /// Written by the consumer only (invariant 3).
    head: CachePadded<AtomicUsize>,
    /// Written by the producer only (invariant 2).
    tail: CachePadded<AtomicUsize>,
    producer_gone: AtomicBool,
    consumer_gone: AtomicBool,
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
    mask: usize,
}

// SAFETY: values of `T` move from the producer's thread to the consumer's, so `T: Send`
// suffices; no `&T` is ever shared between the two sides (invariants 2 and 3).
unsafe impl<T: Send> Send for Shared<T> {}
// SAFETY: as above; the slots are only accessed under the index protocol.
unsafe impl<T: Send> Sync for Shared<T> {}

impl<T> Shared<T> {
    #[inline(always)]
    fn capacity(&self) -> usize {
        self.mask + 1
    }

    #[inline(always)]
    fn slot(&self, index: usize) -> &UnsafeCell<MaybeUninit<T>> {
        let position = index & self.mask;
        debug_assert!(position < self.slots.len());
        // SAFETY: `position` is masked by `capacity - 1` and `slots.len() == capacity`.
        unsafe { self.slots.get_unchecked(position) }
    }
}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        // Both sides are gone (we hold the last reference), so the indices are final and
        // the Arc's drop synchronised with both sides' last writes.
        let mut head = self.head.load(Ordering::Relaxed);
        let tail = self.tail.load(Ordering::Relaxed);
        debug_assert!(tail.wrapping_sub(head) <= self.capacity());
        while head != tail {
            // SAFETY: invariant 4: the slots in [head, tail) hold initialised values that
            // no one has moved out; we drop each exactly once.
            self.slot(head)
                .with_mut(|p| unsafe { (*p).assume_init_drop() });
            head = head.wrapping_add(1);
        }
    }
}

/// The writing end of a ring. One thread owns it; it is `Send` but not `Clone`.
pub struct Producer<T> {
    shared: Arc<Shared<T>>,
    /// Our own index; the shared copy is a publication of it.
    tail: usize,
    /// Last `head` seen; the consumer may be ahead of it, never behind.
    head_cache: usize,
}

impl<T> Producer<T> {
    /// Pushes `value`, or hands it back when the ring is full.
    #[inline]
    pub fn try_push(&mut self, value: T) -> Result<(), T> {
        let capacity = self.shared.capacity();
        if self.tail.wrapping_sub(self.head_cache) == capacity {
            // Acquire: pairs with the consumer's Release store of `head`, so its moves out
            // of the slots we are about to overwrite are complete.
            self.head_cache = self.shared.head.load(Ordering::Acquire);
            if self.tail.wrapping_sub(self.head_cache) == capacity {
                return Err(value);
            }
        }
        let tail = self.tail;
        // SAFETY: not full (checked above), so slot `tail` lies outside [head, tail): the
        // consumer is not reading it (invariant 3) and we are the only producer (invariant 2).
        self.shared
            .slot(tail)
            .with_mut(|p| unsafe { (*p).write(value) });
        self.tail = tail.wrapping_add(1);
        // Release: publishes the slot write; pairs with the Acquire in `Consumer::try_pop`.
        self.shared.tail.store(self.tail, Ordering::Release);
        Ok(())
    }

    /// Pushes values from `values` while there is room, publishing them with a single
    /// index store. Takes no more from the iterator than fits, so whatever is left stays
    /// in `values`. Returns how many were pushed. (If `next` panics, the values it gave
    /// before are leaked, never dropped twice.)
    pub fn push_iter<I: Iterator<Item = T>>(&mut self, values: &mut I) -> usize {
        let shared = &*self.shared;
        let capacity = shared.capacity();
        let start = self.tail;
        let mut written = 0usize;
        // First the room the cached head promises; only if the iterator still has values
        // then, one Acquire reload of `head` (as in `try_push`) and the newly freed room.
        // Each pass writes the free slots as (at most) two contiguous stretches, up to the
        // end of the slots and from their start: no index masked per value.
        'passes: for reload in [false, true] {
            if reload {
                self.head_cache = shared.head.load(Ordering::Acquire);
            }
            let tail = start.wrapping_add(written);
            let free = capacity - tail.wrapping_sub(self.head_cache);
            let at = tail & shared.mask;
            let first = free.min(capacity - at);
            // Within the slots: `at` < capacity, `first` <= capacity - at, and
            // `free - first` <= `at` (free <= capacity).
            let (wrapped, from_at) = shared.slots.split_at(at);
            for stretch in [&from_at[..first], &wrapped[..free - first]] {
                for slot in stretch {
                    let Some(value) = values.next() else {
                        break 'passes;
                    };
                    // SAFETY: fewer than `free` values written in this pass, so the slot
                    // lies outside [head, tail) (invariants 1 and 2); it becomes visible
                    // to the consumer only with the store below.
                    slot.with_mut(|p| unsafe { (*p).write(value) });
                    written += 1;
                }
            }
        }
        if written > 0 {
            let tail = start.wrapping_add(written);
            self.tail = tail;
            // Release: publishes every slot written above; pairs with the consumer's
            // Acquire load of `tail`.
            self.shared.tail.store(tail, Ordering::Release);
        }
        written
    }

    /// Values in the ring now (the consumer may be taking some as we look).
    pub fn len(&self) -> usize {
        // Acquire: pairs with the consumer's Release store of `head`.
        let head = self.shared.head.load(Ordering::Acquire);
        self.tail.wrapping_sub(head)
    }

    /// Whether the ring is empty now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Room for more values now (at least this much: the consumer only frees slots).
    pub fn free_len(&self) -> usize {
        self.shared.capacity() - self.len()
    }

    /// The ring's capacity (a power of two).
    pub fn capacity(&self) -> usize {
        self.shared.capacity()
    }

    /// Whether the consumer has been dropped: values pushed from now on are never read
    /// (they are dropped when this producer is).
    pub fn is_abandoned(&self) -> bool {
        // Acquire: pairs with the Release in `Consumer::drop`.
        self.shared.consumer_gone.load(Ordering::Acquire)
    }
}

impl<T> Drop for Producer<T> {
    fn drop(&mut self) {
        // Release: our last `tail` store happens before the consumer sees us gone.
        self.shared.producer_gone.store(true, Ordering::Release);
    }
}

impl<T> core::fmt::Debug for Producer<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Producer")
            .field("capacity", &self.capacity())
            .field("len", &self.len())
            .finish()
    }
}

/// The reading end of a ring. One thread owns it; it is `Send` but not `Clone`.
pub struct Consumer<T> {
    shared: Arc<Shared<T>>,
    /// Our own index; the shared copy is a publication of it.
    head: usize,
    /// Last `tail` seen; the producer may be ahead of it, never behind.
    tail_cache: usize,
}

impl<T> Consumer<T> {
    /// Takes the oldest value, or `None` when the ring is empty.
    #[inline]
    pub fn try_pop(&mut self) -> Option<T> {
        if self.head == self.tail_cache {
            // Acquire: pairs with the producer's Release store of `tail`.
            self.tail_cache = self.shared.tail.load(Ordering::Acquire);
            if self.head == self.tail_cache {
                return None;
            }
        }
        let head = self.head;
        // SAFETY: head != tail, so slot `head` lies in [head, tail) and holds an initialised
        // value (invariant 4) that only we may move out (invariant 3).
        let value = self
            .shared
            .slot(head)
            .with(|p| unsafe { (*p).assume_init_read() });
        self.head = head.wrapping_add(1);
        // Release: our read of the slot is complete before the producer reuses it; pairs
        // with the Acquire in `Producer::try_push`.
        self.shared.head.store(self.head, Ordering::Release);
        Some(value)
    }

    /// Moves up to `max` values into `out` in order, publishing the freed slots with a
    /// single index store. Returns how many were moved.
    pub fn pop_into<E: Extend<T>>(&mut self, out: &mut E, max: usize) -> usize {
        let mut available = self.tail_cache.wrapping_sub(self.head);
        if available < max {
            // Acquire: pairs with the producer's Release store of `tail`.
            self.tail_cache = self.shared.tail.load(Ordering::Acquire);
            available = self.tail_cache.wrapping_sub(self.head);
        }
        let count = available.min(max);
        if count == 0 {
            return 0;
        }
        let start = self.head;
        let shared = &*self.shared;
        // Counts the values moved out, and publishes them once, on drop: after `out`
        // took them, or as `out` unwinds (values `out` did not take stay in the ring).
        let moved = Published {
            consumer_head: &mut self.head,
            shared,
            start,
            moved: core::cell::Cell::new(0),
        };
        // A mapped range: `Vec` (and other collections) extend from it with one
        // reservation and no per-value capacity check, as from a slice.
        out.extend((0..count).map(|i| {
            let position = start.wrapping_add(i) & shared.mask;
            debug_assert!(position < shared.slots.len());
            // SAFETY: `position` is masked by `capacity - 1` < slots.len(); slot
            // `start + i` lies in [head, tail_cache), whose slots hold initialised values
            // (invariant 4) that only we may move out (invariant 3); each is read once
            // (the range yields each `i` once) and counted at once, so a panic after it
            // publishes it as moved.
            let value = unsafe { shared.slots.get_unchecked(position) }
                .with(|p| unsafe { (*p).assume_init_read() });
            moved.moved.set(i + 1);
            value
        }));
        moved.moved.get()
    }

    /// Values in the ring now (the producer may be adding some as we look).
    pub fn len(&self) -> usize {
        // Acquire: pairs with the producer's Release store of `tail`.
        let tail = self.shared.tail.load(Ordering::Acquire);
        tail.wrapping_sub(self.head)
    }

    /// Whether the ring is empty now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ring's capacity (a power of two).
    pub fn capacity(&self) -> usize {
        self.shared.capacity()
    }

    /// Whether the producer has been dropped. Values it pushed before are still here:
    /// drain until `try_pop` returns `None` after seeing this return `true`.
    pub fn is_abandoned(&self) -> bool {
        // Acquire: pairs with the Release in `Producer::drop`.
        self.shared.producer_gone.load(Ordering::Acquire)
    }
}

impl<T> Drop for Consumer<T> {
    fn drop(&mut self) {
        // Release: pairs with the Acquire in `Producer::is_abandoned`.
        self.shared.consumer_gone.store(true, Ordering::Release);
    }
}

impl<T> core::fmt::Debug for Consumer<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Consumer")
            .field("capacity", &self.capacity())
            .field("len", &self.len())
            .finish()
    }
}

/// The values `pop_into` moved out so far; publishes them once, on drop, also when the
/// caller's `Extend` unwinds.
struct Published<'a, T> {
    consumer_head: &'a mut usize,
    shared: &'a Shared<T>,
    start: usize,
    moved: core::cell::Cell<usize>,
}

impl<T> Drop for Published<'_, T> {
    fn drop(&mut self) {
        let head = self.start.wrapping_add(self.moved.get());
        *self.consumer_head = head;
        // Release: the moves out of every consumed slot are complete; pairs with the
        // producer's Acquire load of `head`.
        self.shared.head.store(head, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn capacity_rounds_up_to_a_power_of_two() {
        assert_eq!(channel::<u8>(0).0.capacity(), 1);
        assert_eq!(channel::<u8>(1).0.capacity(), 1);
        assert_eq!(channel::<u8>(3).0.capacity(), 4);
        assert_eq!(channel::<u8>(1024).0.capacity(), 1024);
        assert!(try_channel::<u8>(RING_CAPACITY_MAX + 1).is_err());
    }

    #[test]
    fn indices_wrap_around_usize() {
        // Start both sides just below the wrap point: the arithmetic must not care.
        let (mut p, mut c) = channel::<u32>(4);
        let start = usize::MAX - 5;
        p.tail = start;
        p.head_cache = start;
        c.head = start;
        c.tail_cache = start;
        p.shared.head.store(start, Ordering::Relaxed);
        p.shared.tail.store(start, Ordering::Relaxed);
        for round in 0..10u32 {
            for i in 0..4 {
                p.try_push(round * 4 + i).unwrap();
            }
            assert_eq!(p.try_push(99), Err(99));
            for i in 0..4 {
                assert_eq!(c.try_pop(), Some(round * 4 + i));
            }
            assert_eq!(c.try_pop(), None);
        }
    }
}
