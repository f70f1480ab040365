//! The order in which finished elements may leave the operator, for all three modes.
//!
//! Input is cut into *segments* by watermarks: segment `e` (its *epoch*) holds the
//! records between the e-th and (e+1)-th watermark. Only records of the head segment
//! may be emitted; the watermark closing it is emitted once the segment is empty, and
//! the next segment becomes the head. This is Flink's unordered queue; Weir keeps it as
//! counters and intrusive lists through the slab entries instead of sets.
//!
//! Within the segments, records of one *chain* leave in input order: everything is one
//! chain in ordered mode, each key is a chain in keyed-ordered mode, and every record
//! is a chain of its own in unordered mode. A record may be emitted when it is done,
//! first in its chain, and in the head segment. A done chain head of a later segment is
//! *parked* on its segment's list (in the order it became ready) until that segment
//! becomes the head.
//!
//! Invariants:
//! 1. `segments[0]` is epoch `head_epoch`; every segment but the last ends in a watermark.
//! 2. `remaining` of a segment counts its records not yet emitted.
//! 3. An entry is on a parked list iff it is done, first in its chain, and its segment
//!    is not the head.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use super::OutputMode;
use crate::slab::Key;

/// A segment of the input between two watermarks.
#[derive(Debug, Default)]
pub(crate) struct Segment {
    pub(crate) remaining: usize,
    pub(crate) parked_head: Option<Key>,
    pub(crate) parked_tail: Option<Key>,
    /// The watermark closing this segment, with its input sequence number.
    pub(crate) watermark: Option<(i64, u64)>,
}

/// Multiplicative hashing for `u64` keys: one multiply, good high bits.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// First and last entry of one chain.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ends {
    pub(crate) head: Key,
    pub(crate) tail: Key,
}

/// The chains of one operator.
pub(crate) enum Chains {
    /// One chain: input order.
    Ordered(Option<Ends>),
    /// No chains: every record leaves when done.
    Unordered,
    /// A chain per key; the map never holds more than `capacity` keys and is sized for
    /// that up front, so it does not allocate in steady state.
    Keyed(HashMap<u64, Ends, BuildHasherDefault<KeyHasher>>),
}

impl Chains {
    pub(crate) fn new(mode: OutputMode, capacity: usize) -> Self {
        match mode {
            OutputMode::Ordered => Chains::Ordered(None),
            OutputMode::Unordered => Chains::Unordered,
            OutputMode::KeyedOrdered => Chains::Keyed(HashMap::with_capacity_and_hasher(
                capacity,
                Default::default(),
            )),
        }
    }

    /// Appends `entry` to the chain of `key`. Returns the previous tail (whose `next`
    /// must now point at `entry`), or `None` if `entry` heads its chain.
    #[inline]
    pub(crate) fn append(&mut self, key: u64, entry: Key) -> Option<Key> {
        match self {
            Chains::Unordered => None,
            Chains::Ordered(ends) => append_to(ends, entry),
            Chains::Keyed(map) => match map.get_mut(&key) {
                Some(ends) => {
                    let previous = ends.tail;
                    ends.tail = entry;
                    Some(previous)
                }
                None => {
                    map.insert(
                        key,
                        Ends {
                            head: entry,
                            tail: entry,
                        },
                    );
                    None
                }
            },
        }
    }

    /// Whether a record of `key`'s chain is held (always false in unordered mode).
    #[inline]
    pub(crate) fn has_chain(&self, key: u64) -> bool {
        match self {
            Chains::Unordered => false,
            Chains::Ordered(ends) => ends.is_some(),
            Chains::Keyed(map) => map.contains_key(&key),
        }
    }

    /// Whether `entry` heads the chain of `key`.
    #[inline]
    pub(crate) fn is_head(&self, key: u64, entry: Key) -> bool {
        match self {
            Chains::Unordered => true,
            Chains::Ordered(ends) => ends.is_some_and(|e| e.head == entry),
            Chains::Keyed(map) => map.get(&key).is_some_and(|e| e.head == entry),
        }
    }

    /// Removes the head `entry` of `key`'s chain; `next` is the entry after it.
    #[inline]
    pub(crate) fn pop_head(&mut self, key: u64, entry: Key, next: Option<Key>) {
        match self {
            Chains::Unordered => {}
            Chains::Ordered(ends) => pop_from(ends, entry, next),
            Chains::Keyed(map) => {
                let ends = map
                    .get_mut(&key)
                    .expect("an emitted keyed entry has a chain");
                debug_assert_eq!(ends.head, entry);
                match next {
                    Some(next) => ends.head = next,
                    None => {
                        debug_assert_eq!(ends.tail, entry);
                        map.remove(&key);
                    }
                }
            }
        }
    }
}

fn append_to(ends: &mut Option<Ends>, entry: Key) -> Option<Key> {
    match ends {
        Some(e) => {
            let previous = e.tail;
            e.tail = entry;
            Some(previous)
        }
        None => {
            *ends = Some(Ends {
                head: entry,
                tail: entry,
            });
            None
        }
    }
}

fn pop_from(ends: &mut Option<Ends>, entry: Key, next: Option<Key>) {
    let e = ends.as_mut().expect("an emitted ordered entry has a chain");
    debug_assert_eq!(e.head, entry);
    match next {
        Some(next) => e.head = next,
        None => *ends = None,
    }
}

/// The segments, head first (invariant 1), pre-sized: at most one per watermark in flight.
pub(crate) struct Segments {
    pub(crate) list: VecDeque<Segment>,
    pub(crate) head_epoch: u64,
}

impl Segments {
    pub(crate) fn new(capacity: usize) -> Self {
        let mut list = VecDeque::with_capacity(capacity + 1);
        list.push_back(Segment::default());
        Segments {
            list,
            head_epoch: 0,
        }
    }

    /// Epoch new records join.
    pub(crate) fn tail_epoch(&self) -> u64 {
        self.head_epoch + self.list.len() as u64 - 1
    }

    /// The segment new records join.
    #[inline]
    pub(crate) fn tail_mut(&mut self) -> &mut Segment {
        self.list
            .back_mut()
            .expect("there is always a tail segment")
    }

    /// The head segment, whose records may leave.
    #[inline]
    pub(crate) fn head_mut(&mut self) -> &mut Segment {
        self.list
            .front_mut()
            .expect("there is always a head segment")
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, epoch: u64) -> &mut Segment {
        debug_assert!(epoch >= self.head_epoch);
        let index = (epoch - self.head_epoch) as usize;
        &mut self.list[index]
    }

    /// Watermarks waiting to be emitted.
    pub(crate) fn pending_watermarks(&self) -> usize {
        self.list.len() - 1
    }
}
