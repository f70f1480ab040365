//! A driver's open connections, indexed by [`ConnId`]: a vector of slots with a free
//! list, so finding a connection is an index and a compare, not a hash.
//!
//! A `ConnId` is a slot index (low 32 bits) and that slot's generation when the
//! connection went in (the 30 bits above). Removing a connection bumps its slot's
//! generation, so an id kept after its `Closed` event (a late `send` or `close`, a
//! stale io_uring completion) names nothing instead of the slot's next connection.
//! Ids use at most 62 bits: io_uring user data keeps two bits beside them.
//!
//! Invariants:
//! 1. Vacant slots form one free list from `free_head` through `Slot::next`, ending in
//!    `NO_SLOT`; occupied slots are on no list.
//! 2. A slot's generation changes exactly when its connection is removed (wrapping
//!    after 2^30 removals: an id would have to stay stale across a billion reuses of
//!    its slot to alias).
//!
//! The table grows to the most connections open at once and keeps that size.

use weir_engine::runtime::ConnId;

const NO_SLOT: u32 = u32::MAX;
const INDEX_BITS: u32 = 32;
const GENERATION_MASK: u32 = (1 << 30) - 1;

struct Slot<T> {
    generation: u32,
    value: Option<T>,
    /// The next vacant slot, while this one is vacant.
    next: u32,
}

/// See the module docs.
pub(crate) struct Conns<T> {
    slots: Vec<Slot<T>>,
    free_head: u32,
}

fn id(index: u32, generation: u32) -> ConnId {
    ((generation as usize) << INDEX_BITS) | index as usize
}

fn split(id: ConnId) -> (usize, u32) {
    ((id as u32) as usize, (id >> INDEX_BITS) as u32)
}

impl<T> Conns<T> {
    pub(crate) fn new() -> Self {
        Conns {
            slots: Vec::new(),
            free_head: NO_SLOT,
        }
    }

    /// Stores `value`; returns its id.
    pub(crate) fn insert(&mut self, value: T) -> ConnId {
        if self.free_head == NO_SLOT {
            let index = u32::try_from(self.slots.len()).expect("fewer than 2^32 connections");
            self.slots.push(Slot {
                generation: 0,
                value: Some(value),
                next: NO_SLOT,
            });
            return id(index, 0);
        }
        let index = self.free_head;
        let slot = &mut self.slots[index as usize];
        debug_assert!(slot.value.is_none(), "the free list holds vacant slots");
        self.free_head = slot.next;
        slot.value = Some(value);
        id(index, slot.generation)
    }

    /// The connection `id` names, unless it was removed.
    #[inline]
    pub(crate) fn get_mut(&mut self, id: ConnId) -> Option<&mut T> {
        let (index, generation) = split(id);
        match self.slots.get_mut(index)? {
            Slot {
                generation: g,
                value: Some(value),
                ..
            } if *g == generation => Some(value),
            _ => None,
        }
    }

    /// Removes and returns the connection `id` names, unless it was removed already.
    pub(crate) fn remove(&mut self, id: ConnId) -> Option<T> {
        let (index, generation) = split(id);
        let slot = self.slots.get_mut(index)?;
        if slot.generation != generation {
            return None;
        }
        let value = slot.value.take()?;
        slot.generation = slot.generation.wrapping_add(1) & GENERATION_MASK;
        slot.next = self.free_head;
        self.free_head = index as u32;
        Some(value)
    }

    /// The connections with their ids, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (ConnId, &T)> {
        self.slots.iter().enumerate().filter_map(|(index, slot)| {
            slot.value
                .as_ref()
                .map(|value| (id(index as u32, slot.generation), value))
        })
    }

    /// The connections, in slot order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().filter_map(|slot| slot.value.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids are found until removed; a removed id names nothing even once its slot is
    /// reused; ids fit in 62 bits.
    #[test]
    fn removed_ids_name_nothing_after_their_slot_is_reused() {
        let mut conns = Conns::new();
        let a = conns.insert("a");
        let b = conns.insert("b");
        assert_eq!(conns.get_mut(a).copied(), Some("a"));
        assert_eq!(conns.remove(a), Some("a"));
        assert_eq!(conns.remove(a), None);
        let c = conns.insert("c");
        assert_ne!(a, c);
        assert_eq!(conns.get_mut(a), None);
        assert_eq!(conns.get_mut(c).copied(), Some("c"));
        let listed: Vec<_> = conns.iter().map(|(id, v)| (id, *v)).collect();
        assert_eq!(listed, vec![(c, "c"), (b, "b")]);
        // The generation wraps within 30 bits.
        conns.remove(c);
        conns.slots[0].generation = GENERATION_MASK;
        let last = conns.insert("e");
        assert!(last >> 62 == 0);
        conns.remove(last);
        assert_eq!(conns.slots[0].generation, 0);
        conns.insert("f");
        assert_eq!(conns.values().count(), 2);
    }
}
