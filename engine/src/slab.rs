//! Fixed-capacity generational slab: O(1) insert, remove and lookup by key, no
//! allocation after construction.
//!
//! Queue entries of the async operator (in-flight requests) live here. A key is an
//! index plus the generation its slot had when the value went in; removing a value
//! bumps the slot's generation, so a key kept after removal (a completion that arrives
//! after a timeout, a retry's stale attempt) no longer matches and is rejected instead
//! of reaching whatever reused the slot.
//!
//! Invariants:
//! 1. `len` equals the number of occupied slots; vacant slots form one singly linked
//!    free list from `free_head` through `Vacant::next`, ending in `NO_SLOT`.
//! 2. A slot's generation changes exactly when its value is removed. Generations wrap
//!    after 2^32 removals from one slot: a key would have to stay stale across four
//!    billion reuses of its slot to alias, which no bounded timeout allows.
//!
//! Single owner: the slab is `&mut`-only and never shared between threads.

use crate::error::ConfigError;
use core::num::NonZeroU64;

use crate::limits::SLAB_CAPACITY_MAX;

const NO_SLOT: u32 = u32::MAX;

/// Names one value in a [`Slab`]: its slot and that slot's generation at insertion.
///
/// Packed in one non-zero word (generation in the high half, index + 1 in the low
/// half): a key and an `Option<Key>` are both 8 bytes, copied with one load and one
/// store (two 4-byte halves written and then read as one word stall the CPU's store
/// forwarding on hot paths).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(NonZeroU64);

/// What [`Key::from_u64`] makes of 0: index `u32::MAX`, past every slab.
const NO_KEY: NonZeroU64 = match NonZeroU64::new(1 << 32) {
    Some(bits) => bits,
    None => unreachable!(),
};

impl Key {
    /// The key of slot `index` (below `u32::MAX`) at `generation`.
    #[inline]
    fn new(index: u32, generation: u32) -> Self {
        debug_assert!(index < NO_SLOT);
        let bits = (u64::from(generation) << 32) | u64::from(index.wrapping_add(1));
        Key(NonZeroU64::new(bits).unwrap_or(NO_KEY))
    }

    #[inline]
    fn slot(self) -> u32 {
        (self.0.get() as u32).wrapping_sub(1)
    }

    /// The slot index (stable for the value's lifetime, reused afterwards).
    #[inline]
    pub fn index(self) -> usize {
        self.slot() as usize
    }

    /// The slot's generation when the value was inserted.
    #[inline]
    pub fn generation(self) -> u32 {
        (self.0.get() >> 32) as u32
    }

    /// Packs the key into 64 bits, e.g. for an io_uring `user_data` or a wire request id.
    #[inline]
    pub fn to_u64(self) -> u64 {
        self.0.get()
    }

    /// Unpacks a key made by [`Key::to_u64`]. Any `u64` is accepted: a value that names
    /// no live entry is rejected by the slab's lookups, never aliased.
    #[inline]
    pub fn from_u64(raw: u64) -> Self {
        Key(NonZeroU64::new(raw).unwrap_or(NO_KEY))
    }
}

impl core::fmt::Debug for Key {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Key")
            .field("index", &self.slot())
            .field("generation", &self.generation())
            .finish()
    }
}

enum Slot<T> {
    Occupied(T),
    Vacant { next: u32 },
}

struct Entry<T> {
    generation: u32,
    slot: Slot<T>,
}

/// A fixed-capacity generational slab. See the module docs.
pub struct Slab<T> {
    entries: Box<[Entry<T>]>,
    free_head: u32,
    len: usize,
}

impl<T> Slab<T> {
    /// A slab holding at most `capacity` values, allocated now and never again.
    pub fn new(capacity: usize) -> Result<Self, ConfigError> {
        if capacity == 0 {
            return Err(ConfigError::ZeroCapacity {
                what: "slab capacity",
            });
        }
        if capacity > SLAB_CAPACITY_MAX {
            return Err(ConfigError::TooLarge {
                what: "slab capacity",
                requested: capacity,
                limit: SLAB_CAPACITY_MAX,
            });
        }
        let entries = (0..capacity)
            .map(|i| {
                let next = if i + 1 == capacity {
                    NO_SLOT
                } else {
                    (i + 1) as u32
                };
                Entry {
                    generation: 0,
                    slot: Slot::Vacant { next },
                }
            })
            .collect();
        Ok(Slab {
            entries,
            free_head: 0,
            len: 0,
        })
    }

    /// Stores `value` and returns its key, or hands the value back when full.
    #[inline]
    pub fn try_insert(&mut self, value: T) -> Result<Key, T> {
        self.insert_with(move || value).map_err(|make| make())
    }

    /// Stores the value `make` builds and returns its key, or hands `make` back, not
    /// called, when full. The value is built only once its slot is known, which can let
    /// the optimiser write a caller's parts straight into the slot rather than assemble
    /// the value on the stack and copy it there (as a value handed to
    /// [`try_insert`](Self::try_insert) may be). If `make` panics the slab is as before.
    #[inline(always)]
    pub fn insert_with<F: FnOnce() -> T>(&mut self, make: F) -> Result<Key, F> {
        if self.free_head == NO_SLOT {
            debug_assert_eq!(self.len, self.entries.len());
            return Err(make);
        }
        let index = self.free_head;
        let entry = &mut self.entries[index as usize];
        let Slot::Vacant { next } = entry.slot else {
            unreachable!("free list points at an occupied slot {index}");
        };
        entry.slot = Slot::Occupied(make());
        self.free_head = next;
        self.len += 1;
        Ok(Key::new(index, entry.generation))
    }

    /// The key the next [`try_insert`](Self::try_insert) or
    /// [`insert_with`](Self::insert_with) returns, or `None` when full: lets a caller
    /// hand out a value's key before the value exists.
    #[inline]
    pub fn next_key(&self) -> Option<Key> {
        let entry = self.entries.get(self.free_head as usize)?;
        Some(Key::new(self.free_head, entry.generation))
    }

    /// Removes and returns the value named by `key`, or `None` if the key is stale or
    /// names no value.
    #[inline]
    pub fn remove(&mut self, key: Key) -> Option<T> {
        let entry = self.entries.get_mut(key.index())?;
        if entry.generation != key.generation() || !matches!(entry.slot, Slot::Occupied(_)) {
            return None;
        }
        let Slot::Occupied(value) = core::mem::replace(
            &mut entry.slot,
            Slot::Vacant {
                next: self.free_head,
            },
        ) else {
            unreachable!("slot checked occupied above");
        };
        entry.generation = entry.generation.wrapping_add(1);
        self.free_head = key.slot();
        self.len -= 1;
        Some(value)
    }

    /// Removes the value named by `key` after letting `take` move out what it needs;
    /// the value is dropped in place (no move of the whole value), which matters for
    /// large entries on hot paths. `None` if the key is stale.
    #[inline]
    pub fn remove_with<R>(&mut self, key: Key, take: impl FnOnce(&mut T) -> R) -> Option<R> {
        let entry = self.entries.get_mut(key.index())?;
        if entry.generation != key.generation() {
            return None;
        }
        let Slot::Occupied(value) = &mut entry.slot else {
            return None;
        };
        let taken = take(value);
        // Assigning drops the old value in place.
        entry.slot = Slot::Vacant {
            next: self.free_head,
        };
        entry.generation = entry.generation.wrapping_add(1);
        self.free_head = key.slot();
        self.len -= 1;
        Some(taken)
    }

    /// The value named by `key`, unless the key is stale.
    #[inline]
    pub fn get(&self, key: Key) -> Option<&T> {
        match self.entries.get(key.index())? {
            Entry {
                generation,
                slot: Slot::Occupied(value),
            } if *generation == key.generation() => Some(value),
            _ => None,
        }
    }

    /// The value named by `key`, mutably, unless the key is stale.
    #[inline]
    pub fn get_mut(&mut self, key: Key) -> Option<&mut T> {
        match self.entries.get_mut(key.index())? {
            Entry {
                generation,
                slot: Slot::Occupied(value),
            } if *generation == key.generation() => Some(value),
            _ => None,
        }
    }

    /// Whether `key` names a live value.
    pub fn contains(&self, key: Key) -> bool {
        self.get(key).is_some()
    }

    /// Values stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no value is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether every slot is taken.
    pub fn is_full(&self) -> bool {
        self.free_head == NO_SLOT
    }

    /// The fixed capacity.
    pub fn capacity(&self) -> usize {
        self.entries.len()
    }

    /// Every live value with its key, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (Key, &T)> + '_ {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(index, entry)| match &entry.slot {
                Slot::Occupied(value) => Some((Key::new(index as u32, entry.generation), value)),
                Slot::Vacant { .. } => None,
            })
    }

    /// Removes every value (dropping it), keeping the capacity. Outstanding keys go stale.
    pub fn clear(&mut self) {
        for index in 0..self.entries.len() {
            let entry = &self.entries[index];
            if matches!(entry.slot, Slot::Occupied(_)) {
                self.remove(Key::new(index as u32, entry.generation));
            }
        }
    }
}

impl<T> core::fmt::Debug for Slab<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Slab")
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn generation_wraps_without_aliasing_the_live_key() {
        // One slot reused across the u32 wrap: the live key always matches, the previous
        // one never does.
        let mut slab = Slab::new(1).unwrap();
        slab.entries[0].generation = u32::MAX - 2;
        let mut previous = None;
        for round in 0..6u32 {
            let key = slab.try_insert(round).unwrap();
            if let Some(old) = previous {
                assert_ne!(old, key);
                assert_eq!(slab.get(old), None);
            }
            assert_eq!(slab.remove(key), Some(round));
            assert_eq!(slab.remove(key), None);
            previous = Some(key);
        }
        assert_eq!(slab.entries[0].generation, 3);
    }

    #[test]
    fn zero_capacity_is_a_config_error() {
        assert_eq!(
            Slab::<u8>::new(0).unwrap_err(),
            ConfigError::ZeroCapacity {
                what: "slab capacity"
            }
        );
    }

    #[test]
    fn free_list_is_lifo_and_full_hands_value_back() {
        let mut slab = Slab::new(2).unwrap();
        let a = slab.try_insert('a').unwrap();
        let _b = slab.try_insert('b').unwrap();
        assert!(slab.is_full());
        assert_eq!(slab.try_insert('c'), Err('c'));
        slab.remove(a);
        let c = slab.try_insert('c').unwrap();
        assert_eq!(c.index(), a.index());
        assert_ne!(c.generation(), a.generation());
    }

    #[test]
    fn insert_with_builds_only_when_there_is_room() {
        let mut slab = Slab::new(2).unwrap();
        let next = slab.next_key();
        let a = slab
            .insert_with(|| 'a')
            .unwrap_or_else(|_| panic!("no room"));
        assert_eq!(Some(a), next);
        let b = slab
            .insert_with(|| 'b')
            .unwrap_or_else(|_| panic!("no room"));
        assert!(slab.is_full());
        assert!(slab
            .insert_with(|| unreachable!("built with no room"))
            .is_err());
        let handed_back = slab.insert_with(|| 'x').expect_err("full");
        assert_eq!(handed_back(), 'x');
        assert_eq!(
            (slab.get(a), slab.get(b), slab.len()),
            (Some(&'a'), Some(&'b'), 2)
        );
        slab.remove(b);
        let c = slab
            .insert_with(|| 'c')
            .unwrap_or_else(|_| panic!("no room"));
        assert_eq!(c.index(), b.index());
        assert_eq!(slab.get(b), None);
        assert_eq!(slab.get(c), Some(&'c'));
    }

    #[test]
    fn a_panicking_insert_with_leaves_the_slab_as_it_was() {
        let mut slab = Slab::new(1).unwrap();
        let next = slab.next_key();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = slab.insert_with(|| -> char { panic!("make failed") });
        }));
        assert!(panicked.is_err());
        assert_eq!((slab.len(), slab.next_key()), (0, next));
        assert_eq!(slab.insert_with(|| 'a').ok(), next);
        assert!(slab.is_full());
    }

    #[test]
    fn key_round_trips_through_u64() {
        let key = Key::new(7, 0xdead_beef);
        assert_eq!(Key::from_u64(key.to_u64()), key);
    }
}
