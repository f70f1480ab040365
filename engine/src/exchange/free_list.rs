//! Lock-free LIFO free list of segment indices (a Treiber stack) with a waiter bit.
//!
//! The stack's nodes are segment indices; the links live in an array of `AtomicU32`
//! owned by the network buffer pool (`links[i]` is the index below segment `i`), so
//! pushing and popping never allocate. Several free lists (the global one and one per
//! local pool) share that array: a segment is on at most one list at a time.
//!
//! The head word packs three fields: `index` (low 32 bits, `NIL` when empty), a
//! `waiting` bit (bit 32), and a 31-bit `tag` bumped by every successful exchange so a
//! head that was popped and pushed back between a reader's load and its
//! compare-exchange is not mistaken for the one it read (ABA). The tag wraps after
//! 2^31 operations, which a thread would have to sleep through between one load and
//! the following compare-exchange.
//!
//! The waiting bit is how a requester that found the list empty gets woken: it sets
//! the bit with a read-modify-write, and every push clears it in the same
//! compare-exchange that links the segment in, returning whether it was set. Both are
//! RMWs on one word, so one of them reads the other: either the requester sees the
//! pushed segment, or the pusher sees the bit and notifies. Never neither.
//!
//! Ordering: a push is Release (publishes the segment's contents and its link);
//! a pop is Acquire on the head it consumes.

use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// The empty-list marker in the index field.
pub(crate) const NIL: u32 = u32::MAX;
const INDEX_MASK: u64 = 0xFFFF_FFFF;
const WAITING: u64 = 1 << 32;
const TAG_ONE: u64 = 1 << 33;

#[inline(always)]
fn index_of(word: u64) -> u32 {
    (word & INDEX_MASK) as u32
}

#[inline(always)]
fn bump(word: u64, index: u32, waiting: bool) -> u64 {
    let tag = (word & !(INDEX_MASK | WAITING)).wrapping_add(TAG_ONE);
    tag | if waiting { WAITING } else { 0 } | u64::from(index)
}

pub(crate) struct FreeList {
    head: AtomicU64,
}

impl FreeList {
    pub(crate) fn new() -> Self {
        FreeList {
            head: AtomicU64::new(u64::from(NIL)),
        }
    }

    /// Links `index` in; returns whether a requester was waiting (the bit is cleared).
    #[inline]
    pub(crate) fn push(&self, index: u32, links: &[AtomicU32]) -> bool {
        debug_assert!(index != NIL);
        let link = &links[index as usize];
        let mut current = self.head.load(Ordering::Relaxed);
        loop {
            link.store(index_of(current), Ordering::Relaxed);
            let new = bump(current, index, false);
            // Release: publishes the link store above and the segment's contents to the
            // Acquire of whoever pops it. Acquire (on success): a waiter's bit-setting RMW
            // published nothing we need, but AcqRel keeps the waiter protocol symmetric.
            match self
                .head
                .compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(previous) => return previous & WAITING != 0,
                Err(actual) => current = actual,
            }
        }
    }

    /// Unlinks the top segment, or `None` when empty. Leaves the waiting bit as it was.
    #[inline]
    pub(crate) fn pop(&self, links: &[AtomicU32]) -> Option<u32> {
        // Acquire: pairs with the Release of the push that linked the head in, so its
        // link is visible below.
        let mut current = self.head.load(Ordering::Acquire);
        loop {
            let index = index_of(current);
            if index == NIL {
                return None;
            }
            // May be stale if `index` was popped and pushed meanwhile; then the tag has
            // moved and the exchange below fails.
            let below = links[index as usize].load(Ordering::Relaxed);
            let new = bump(current, below, current & WAITING != 0);
            match self.head.compare_exchange_weak(
                current,
                new,
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(index),
                Err(actual) => current = actual,
            }
        }
    }

    /// Unlinks the whole list at once and returns the index of its top (`NIL` when
    /// empty); follow `links` from there. Clears the waiting bit.
    ///
    /// With only `push` and `take_all` on a list there is no ABA hazard: a push links
    /// its segment above exactly the head its exchange replaces.
    #[inline]
    pub(crate) fn take_all(&self) -> u32 {
        if self.is_empty() {
            return NIL;
        }
        // AcqRel: Acquire pairs with every push's Release (RMWs continue the release
        // sequence), so every link in the chain is visible.
        index_of(self.head.swap(u64::from(NIL), Ordering::AcqRel))
    }

    /// Whether the list is empty now.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        // Acquire: a requester that sees a segment and pops it needs the push's contents;
        // the pop re-reads with Acquire anyway, so this is only a hint.
        index_of(self.head.load(Ordering::Acquire)) == NIL
    }

    /// Sets the waiting bit; returns whether the list was non-empty at that instant
    /// (then no push may come to clear it, so the caller should clear it itself).
    #[inline]
    pub(crate) fn set_waiting(&self) -> bool {
        // AcqRel: Acquire makes the segments of every earlier push visible to the caller's
        // re-check; see the module docs for why an RMW is required.
        index_of(self.head.fetch_or(WAITING, Ordering::AcqRel)) != NIL
    }

    /// Clears the waiting bit; returns whether it was set.
    #[inline]
    pub(crate) fn take_waiting(&self) -> bool {
        // AcqRel: reads the latest head, so a bit set by a requester before this clear is
        // seen, and the requester's later RMW sees our clear.
        self.head.fetch_and(!WAITING, Ordering::AcqRel) & WAITING != 0
    }

    /// Counts the list's segments. Only meaningful while no one pushes or pops.
    pub(crate) fn count_quiescent(&self, links: &[AtomicU32]) -> usize {
        let mut count = 0;
        let mut index = index_of(self.head.load(Ordering::Acquire));
        while index != NIL {
            count += 1;
            assert!(count <= links.len(), "free list has a cycle");
            index = links[index as usize].load(Ordering::Relaxed);
        }
        count
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn tag_wraps_without_touching_index_or_bit() {
        let word = !WAITING; // tag all ones, index all ones
        let next = bump(word, 5, true);
        assert_eq!(index_of(next), 5);
        assert_ne!(next & WAITING, 0);
        assert_eq!(next >> 33, 0, "tag wrapped to zero");
    }

    #[test]
    fn lifo_and_waiting_bit() {
        let links: Vec<AtomicU32> = (0..4).map(|_| AtomicU32::new(NIL)).collect();
        let list = FreeList::new();
        assert!(list.is_empty());
        assert!(!list.set_waiting());
        assert!(list.push(2, &links), "push reports and clears the waiter");
        assert!(!list.push(3, &links));
        assert_eq!(list.count_quiescent(&links), 2);
        assert_eq!(list.pop(&links), Some(3));
        assert_eq!(list.pop(&links), Some(2));
        assert_eq!(list.pop(&links), None);
    }
}
