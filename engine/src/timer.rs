//! Hashed timing wheel with O(1) cancellation, on its owner's thread: the async
//! operators' retry delays (their timeouts, all of one length, need no wheel: see
//! `async_io::operator`) and the lookup service's answers that are due out of order.
//!
//! Timers live in a slab of nodes (`nodes`, reused through a free list, so the wheel's
//! memory is bounded by the most timers ever pending at once, not by how many were
//! scheduled). Each node sits in exactly one doubly linked list, kept sorted by
//! `(deadline, schedule order)`:
//! - one list per slot for the *window* of ticks `[base_tick, base_tick + slots)`: a
//!   timer whose tick lies in the window is in slot `tick % slots`, and each slot then
//!   holds one tick's timers only (a deadline before `base_tick` is clamped into the
//!   base slot, where sorting still puts it first);
//! - one overflow list for timers past the window, moved into their slot as the window
//!   slides over them.
//!
//! A bitmap of non-empty slots finds the earliest slot in `slots / 64` word reads, and
//! the head of that slot is the earliest timer: [`TimerWheel::next_deadline`] is exact
//! and cheap, with no scan of the timers themselves. Scheduling appends at a list's
//! tail and walks back only past later deadlines (none when timers are scheduled in the
//! order they come due). [`TimerWheel::cancel`] unlinks a node in O(1); a
//! [`TimerKey`] carries the node's generation, so cancelling a timer that already fired
//! (or was cancelled) is a no-op, never another timer's removal.
//!
//! Invariants:
//! 1. Every pending timer is in exactly one list; `len` counts them.
//! 2. Slot lists hold timers whose tick is `< base_tick + slots`; the overflow list the
//!    others. `base_tick` never passes the tick of a pending timer's slot, so a slot
//!    index names one tick of the window.
//! 3. Each list is sorted by `(deadline, sequence)`.
//!
//! Single owner, `&mut` only. [`WorkerTimers`] puts one wheel under every operator of a
//! runtime worker, each a [`TimerOwner`] with a queue of its timers that came due.

/// Identifies a scheduled timer for [`TimerWheel::cancel`]; stale once it fired or
/// was cancelled.
///
/// One non-zero word (generation high, node index + 1 low), so `Option<TimerKey>` is 8
/// bytes, copied whole (as [`Key`](crate::slab::Key) is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerKey(core::num::NonZeroU64);

impl TimerKey {
    #[inline]
    fn new(index: u32, generation: u32) -> Self {
        debug_assert!(index < NIL);
        let bits = (u64::from(generation) << 32) | u64::from(index.wrapping_add(1));
        // Never zero: the index is below `NIL`, so the low half is at least 1.
        TimerKey(core::num::NonZeroU64::new(bits).unwrap_or(core::num::NonZeroU64::MAX))
    }

    #[inline]
    fn index(self) -> u32 {
        (self.0.get() as u32).wrapping_sub(1)
    }

    #[inline]
    fn generation(self) -> u32 {
        (self.0.get() >> 32) as u32
    }
}

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
}

impl List {
    const EMPTY: List = List {
        head: NIL,
        tail: NIL,
    };
}

/// Which list a node is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Slot(u32),
    Overflow,
    Free,
}

struct Node<E> {
    deadline_ns: u64,
    sequence: u64,
    generation: u32,
    place: Place,
    prev: u32,
    /// The next node of its list, or of the free list.
    next: u32,
    event: Option<E>,
}

/// A timer wheel of events `E`, times in nanoseconds of the owner's clock.
pub struct TimerWheel<E> {
    /// log2 of the tick (a power of two, so a tick is a shift, not a division).
    tick_shift: u32,
    mask: u64,
    slots: Box<[List]>,
    occupied: Box<[u64]>,
    overflow: List,
    base_tick: u64,
    nodes: Vec<Node<E>>,
    free: u32,
    len: usize,
    len_peak: usize,
    sequence: u64,
}

impl<E> TimerWheel<E> {
    /// A wheel of `slots` slots (rounded up to a power of two, at least 64) of `tick_ns`
    /// each (rounded up to a power of two: finding a timer's tick is then a shift).
    ///
    /// # Panics
    /// If `tick_ns` or `slots` is zero (fixed by the engine's limits, not user input).
    pub fn new(tick_ns: u64, slots: usize) -> Self {
        assert!(tick_ns > 0, "timer tick must be positive");
        assert!(slots > 0, "timer wheel needs a slot");
        let slots = slots.next_power_of_two().max(64);
        TimerWheel {
            tick_shift: tick_ns.next_power_of_two().trailing_zeros(),
            mask: slots as u64 - 1,
            slots: vec![List::EMPTY; slots].into_boxed_slice(),
            occupied: vec![0; slots / 64].into_boxed_slice(),
            overflow: List::EMPTY,
            base_tick: 0,
            nodes: Vec::new(),
            free: NIL,
            len: 0,
            len_peak: 0,
            sequence: 0,
        }
    }

    /// Schedules `event` at `deadline_ns`; returns the key that cancels it.
    pub fn schedule(&mut self, deadline_ns: u64, event: E) -> TimerKey {
        let sequence = self.sequence;
        self.sequence += 1;
        let index = match self.free {
            NIL => {
                let index = self.nodes.len();
                assert!(index < NIL as usize, "timer wheel holds 2^32 - 1 timers");
                self.nodes.push(Node {
                    deadline_ns,
                    sequence,
                    generation: 0,
                    place: Place::Free,
                    prev: NIL,
                    next: NIL,
                    event: Some(event),
                });
                index as u32
            }
            index => {
                let node = &mut self.nodes[index as usize];
                self.free = node.next;
                node.deadline_ns = deadline_ns;
                node.sequence = sequence;
                node.event = Some(event);
                index
            }
        };
        self.len += 1;
        self.len_peak = self.len_peak.max(self.len);
        let place = self.place_of(deadline_ns);
        self.link_sorted(index, place);
        TimerKey::new(index, self.nodes[index as usize].generation)
    }

    /// Cancels the timer `key` and returns its event; `None` if it already fired or was
    /// cancelled. O(1).
    pub fn cancel(&mut self, key: TimerKey) -> Option<E> {
        let node = self.nodes.get(key.index() as usize)?;
        if node.generation != key.generation() || node.place == Place::Free {
            return None;
        }
        Some(self.take(key.index()).1)
    }

    /// The deadline of the earliest timer due at or before `now_ns`, without taking it.
    pub fn peek_due(&mut self, now_ns: u64) -> Option<u64> {
        self.advance(now_ns);
        let first = self.first()?;
        let deadline = self.nodes[first as usize].deadline_ns;
        (deadline <= now_ns).then_some(deadline)
    }

    /// The earliest timer due at or before `now_ns`, with its deadline.
    pub fn pop_due(&mut self, now_ns: u64) -> Option<(u64, E)> {
        self.peek_due(now_ns)?;
        let first = self.first().expect("peeked above");
        Some(self.take(first))
    }

    /// The earliest deadline of any pending timer: the head of the first non-empty slot
    /// (a bitmap search), else of the overflow list.
    pub fn next_deadline(&self) -> Option<u64> {
        self.first()
            .map(|index| self.nodes[index as usize].deadline_ns)
    }

    /// Timers pending (cancelled and fired ones are gone).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most timers pending at once since the wheel was made.
    pub fn len_peak(&self) -> usize {
        self.len_peak
    }

    /// Nodes allocated (pending plus free for reuse): the wheel's memory, in timers.
    pub fn node_capacity(&self) -> usize {
        self.nodes.len()
    }

    fn slot_count(&self) -> u64 {
        self.mask + 1
    }

    fn place_of(&self, deadline_ns: u64) -> Place {
        let tick = (deadline_ns >> self.tick_shift).max(self.base_tick);
        if tick - self.base_tick < self.slot_count() {
            Place::Slot((tick & self.mask) as u32)
        } else {
            Place::Overflow
        }
    }

    fn list_mut(&mut self, place: Place) -> &mut List {
        match place {
            Place::Slot(slot) => &mut self.slots[slot as usize],
            Place::Overflow => &mut self.overflow,
            Place::Free => unreachable!("the free list is singly linked"),
        }
    }

    /// Links node `index` into `place`'s list at its sorted position, walking back from
    /// the tail past later timers.
    fn link_sorted(&mut self, index: u32, place: Place) {
        let order = {
            let node = &self.nodes[index as usize];
            (node.deadline_ns, node.sequence)
        };
        let mut after = self.list_mut(place).tail;
        while after != NIL {
            let node = &self.nodes[after as usize];
            if (node.deadline_ns, node.sequence) <= order {
                break;
            }
            after = node.prev;
        }
        let before = if after == NIL {
            self.list_mut(place).head
        } else {
            self.nodes[after as usize].next
        };
        {
            let node = &mut self.nodes[index as usize];
            node.place = place;
            node.prev = after;
            node.next = before;
        }
        if after == NIL {
            self.list_mut(place).head = index;
        } else {
            self.nodes[after as usize].next = index;
        }
        if before == NIL {
            self.list_mut(place).tail = index;
        } else {
            self.nodes[before as usize].prev = index;
        }
        if let Place::Slot(slot) = place {
            self.occupied[slot as usize / 64] |= 1 << (slot % 64);
        }
    }

    /// Unlinks node `index` from its list (it stays allocated).
    fn unlink(&mut self, index: u32) {
        let (place, prev, next) = {
            let node = &self.nodes[index as usize];
            (node.place, node.prev, node.next)
        };
        if prev == NIL {
            self.list_mut(place).head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.list_mut(place).tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
        if let Place::Slot(slot) = place {
            if self.slots[slot as usize].head == NIL {
                self.occupied[slot as usize / 64] &= !(1 << (slot % 64));
            }
        }
    }

    /// Unlinks and frees node `index`, returning its deadline and event.
    fn take(&mut self, index: u32) -> (u64, E) {
        self.unlink(index);
        self.len -= 1;
        let free = self.free;
        let node = &mut self.nodes[index as usize];
        node.place = Place::Free;
        node.generation = node.generation.wrapping_add(1);
        node.next = free;
        node.prev = NIL;
        self.free = index;
        let event = node.event.take().expect("a pending timer has its event");
        (node.deadline_ns, event)
    }

    /// The first non-empty slot at or after the base tick, as an offset from it.
    fn first_occupied_offset(&self) -> Option<u64> {
        let slots = self.slot_count();
        let start = self.base_tick & self.mask;
        let words = self.occupied.len() as u64;
        // Word by word from the base slot's word, wrapping once; the first word's bits
        // below the base slot are later ticks, handled on the wrap.
        for step in 0..=words {
            let word_index = ((start / 64) + step) % words;
            let mut bits = self.occupied[word_index as usize];
            if step == 0 {
                bits &= !0u64 << (start % 64);
            } else if step == words {
                bits &= !(!0u64 << (start % 64));
            }
            if bits != 0 {
                let slot = word_index * 64 + u64::from(bits.trailing_zeros());
                return Some((slot + slots - start) & self.mask);
            }
        }
        None
    }

    fn first(&self) -> Option<u32> {
        if self.len == 0 {
            // Nothing to find: skip the bitmap search (a wheel that is mostly empty is
            // asked on every worker turn).
            return None;
        }
        match self.first_occupied_offset() {
            Some(offset) => {
                let slot = (self.base_tick + offset) & self.mask;
                Some(self.slots[slot as usize].head)
            }
            None => (self.overflow.head != NIL).then_some(self.overflow.head),
        }
    }

    /// Slides the window towards `now_ns` (never past a non-empty slot) and moves the
    /// overflow timers it now covers into their slots.
    fn advance(&mut self, now_ns: u64) {
        let now_tick = now_ns >> self.tick_shift;
        if now_tick <= self.base_tick {
            return;
        }
        if self.len == 0 {
            // Empty: the window jumps to now (no slot or overflow timer to move).
            self.base_tick = now_tick;
            return;
        }
        let target = match self.first_occupied_offset() {
            Some(offset) => now_tick.min(self.base_tick + offset),
            None => now_tick,
        };
        if target == self.base_tick {
            return;
        }
        self.base_tick = target;
        let end = self.base_tick.saturating_add(self.slot_count());
        while self.overflow.head != NIL {
            let head = self.overflow.head;
            if self.nodes[head as usize].deadline_ns >> self.tick_shift >= end {
                break;
            }
            self.unlink(head);
            let place = self.place_of(self.nodes[head as usize].deadline_ns);
            self.link_sorted(head, place);
        }
    }
}

/// What a timer of a [`WorkerTimers`] carries: two words its owner interprets (an
/// operator's entry key and attempt, say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerPayload(pub u64, pub u32);

/// One timer wheel per worker, shared by the timers of every operator of every task on
/// that worker.
///
/// The worker finds the next deadline of every operator's retry delays in one O(1) look
/// ([`next_deadline`]), and all of them share one slab of nodes (an operator reports its
/// timeouts, which are not timers, through its task). Each owner
/// ([`TimerOwner`], one per operator) keeps a small queue of its timers that came due:
/// [`advance`] (called by the worker each turn, and by an owner before it looks) moves
/// every due timer, in deadline order, to its owner's queue; the owner pops them there
/// in order. A timer cancelled after it came due is still in its owner's queue; owners
/// check an event against their state before acting on it (the async operator checks
/// the entry's generation, attempt and state), as they would a late completion.
///
/// Single thread: the runtime makes one per worker and installs it as the thread's
/// [`current`](WorkerTimers::current) service while the worker runs, so operators built
/// on that thread find it.
///
/// [`next_deadline`]: WorkerTimers::next_deadline
/// [`advance`]: WorkerTimers::advance
pub struct WorkerTimers {
    inner: core::cell::RefCell<Shared>,
}

struct Shared {
    wheel: TimerWheel<(u32, TimerPayload)>,
    owners: Vec<OwnerState>,
}

#[derive(Default)]
struct OwnerState {
    due: std::collections::VecDeque<(u64, TimerPayload)>,
    /// Scheduled and not yet popped (or cancelled) by the owner.
    pending: usize,
    alive: bool,
}

std::thread_local! {
    static CURRENT: core::cell::RefCell<Option<std::rc::Rc<WorkerTimers>>> =
        const { core::cell::RefCell::new(None) };
}

/// Uninstalls the thread's current service when dropped.
pub(crate) struct CurrentGuard(());

impl Drop for CurrentGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| c.borrow_mut().take());
    }
}

impl WorkerTimers {
    /// A service with a wheel of `slots` slots of `tick_ns` (see [`TimerWheel::new`]).
    pub fn new(tick_ns: u64, slots: usize) -> std::rc::Rc<Self> {
        std::rc::Rc::new(WorkerTimers {
            inner: core::cell::RefCell::new(Shared {
                wheel: TimerWheel::new(tick_ns, slots),
                owners: Vec::new(),
            }),
        })
    }

    /// The service of the worker running on this thread, if any.
    pub fn current() -> Option<std::rc::Rc<WorkerTimers>> {
        CURRENT.with(|c| c.borrow().clone())
    }

    /// Makes `self` this thread's current service until the guard drops.
    pub(crate) fn install(self: &std::rc::Rc<Self>) -> CurrentGuard {
        CURRENT.with(|c| *c.borrow_mut() = Some(std::rc::Rc::clone(self)));
        CurrentGuard(())
    }

    /// A new owner of timers on this wheel.
    pub fn register(self: &std::rc::Rc<Self>) -> TimerOwner {
        let mut inner = self.inner.borrow_mut();
        let id = inner.owners.len();
        assert!(
            id < u32::MAX as usize,
            "2^32 - 1 timer owners on one worker"
        );
        inner.owners.push(OwnerState {
            alive: true,
            ..OwnerState::default()
        });
        TimerOwner {
            timers: std::rc::Rc::clone(self),
            id: id as u32,
        }
    }

    /// Moves every timer due at or before `now_ns` to its owner's queue; returns how
    /// many. Timers of owners that are gone are dropped.
    pub fn advance(&self, now_ns: u64) -> usize {
        let mut inner = self.inner.borrow_mut();
        let Shared { wheel, owners } = &mut *inner;
        let mut moved = 0;
        while let Some((deadline, (owner, payload))) = wheel.pop_due(now_ns) {
            let state = &mut owners[owner as usize];
            if state.alive {
                state.due.push_back((deadline, payload));
                moved += 1;
            }
        }
        moved
    }

    /// The earliest deadline of any timer still in the wheel (not of those already
    /// moved to their owners' queues: owners report those themselves).
    pub fn next_deadline(&self) -> Option<u64> {
        self.inner.borrow().wheel.next_deadline()
    }

    /// Timers in the wheel, of every owner.
    pub fn len(&self) -> usize {
        self.inner.borrow().wheel.len()
    }

    /// Whether no timer is in the wheel.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl core::fmt::Debug for WorkerTimers {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let inner = self.inner.borrow();
        f.debug_struct("WorkerTimers")
            .field("pending", &inner.wheel.len())
            .field("owners", &inner.owners.len())
            .finish()
    }
}

/// One owner's timers on its worker's [`WorkerTimers`] (one per operator).
pub struct TimerOwner {
    timers: std::rc::Rc<WorkerTimers>,
    id: u32,
}

impl TimerOwner {
    /// Schedules `payload` at `deadline_ns`.
    pub fn schedule(&self, deadline_ns: u64, payload: TimerPayload) -> TimerKey {
        let mut inner = self.timers.inner.borrow_mut();
        inner.owners[self.id as usize].pending += 1;
        inner.wheel.schedule(deadline_ns, (self.id, payload))
    }

    /// Cancels timer `key` if it is still in the wheel (O(1)); one already moved to this
    /// owner's queue stays there (see [`WorkerTimers`]).
    pub fn cancel(&self, key: TimerKey) -> bool {
        let mut inner = self.timers.inner.borrow_mut();
        let cancelled = inner.wheel.cancel(key).is_some();
        if cancelled {
            inner.owners[self.id as usize].pending -= 1;
        }
        cancelled
    }

    /// The deadline of this owner's earliest timer due at or before `limit_ns`.
    pub fn peek_due(&self, limit_ns: u64) -> Option<u64> {
        self.timers.advance(limit_ns);
        let inner = self.timers.inner.borrow();
        let (deadline, _) = *inner.owners[self.id as usize].due.front()?;
        (deadline <= limit_ns).then_some(deadline)
    }

    /// This owner's earliest timer due at or before `limit_ns`, with its deadline.
    pub fn pop_due(&self, limit_ns: u64) -> Option<(u64, TimerPayload)> {
        self.peek_due(limit_ns)?;
        let mut inner = self.timers.inner.borrow_mut();
        let state = &mut inner.owners[self.id as usize];
        state.pending -= 1;
        state.due.pop_front()
    }

    /// The deadline of this owner's earliest timer that came due and is waiting in its
    /// queue (the worker watches the wheel for the rest).
    pub fn next_due(&self) -> Option<u64> {
        let inner = self.timers.inner.borrow();
        inner.owners[self.id as usize].due.front().map(|&(d, _)| d)
    }

    /// This owner's timers scheduled and not yet popped or cancelled.
    pub fn len(&self) -> usize {
        self.timers.inner.borrow().owners[self.id as usize].pending
    }

    /// Whether this owner has no timer pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for TimerOwner {
    fn drop(&mut self) {
        if let Ok(mut inner) = self.timers.inner.try_borrow_mut() {
            // Its timers still in the wheel are dropped when they come due.
            let state = &mut inner.owners[self.id as usize];
            state.alive = false;
            state.due = std::collections::VecDeque::new();
        }
    }
}

impl core::fmt::Debug for TimerOwner {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("TimerOwner")
            .field("id", &self.id)
            .field("pending", &self.len())
            .finish()
    }
}

impl<E> core::fmt::Debug for TimerWheel<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("TimerWheel")
            .field("tick_ns", &(1u64 << self.tick_shift))
            .field("len", &self.len)
            .field("len_peak", &self.len_peak)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{TimerPayload, WorkerTimers};

    #[test]
    fn a_worker_wheel_hands_each_owner_its_own_timers_in_order() {
        let worker = WorkerTimers::new(1024, 64);
        let a = worker.register();
        let b = worker.register();
        a.schedule(5_000, TimerPayload(1, 0));
        let cancelled = b.schedule(3_000, TimerPayload(2, 0));
        b.schedule(4_000, TimerPayload(3, 0));
        a.schedule(2_000, TimerPayload(4, 0));
        assert_eq!(worker.next_deadline(), Some(2_000));
        assert!(b.cancel(cancelled));
        assert_eq!((a.len(), b.len()), (2, 1));
        // The worker moves what is due; owners see only theirs, in deadline order.
        assert_eq!(worker.advance(4_500), 2);
        assert_eq!(a.next_due(), Some(2_000));
        assert_eq!(b.pop_due(4_500), Some((4_000, TimerPayload(3, 0))));
        assert_eq!(b.pop_due(10_000), None);
        assert_eq!(a.pop_due(4_500), Some((2_000, TimerPayload(4, 0))));
        assert_eq!(a.pop_due(4_500), None, "5 000 is not due at 4 500");
        assert_eq!(a.pop_due(6_000), Some((5_000, TimerPayload(1, 0))));
        assert!(a.is_empty() && b.is_empty() && worker.is_empty());
    }

    #[test]
    fn a_dropped_owner_s_timers_are_discarded_when_due() {
        let worker = WorkerTimers::new(1024, 64);
        let a = worker.register();
        let b = worker.register();
        a.schedule(1_000, TimerPayload(1, 0));
        b.schedule(2_000, TimerPayload(2, 0));
        drop(a);
        assert_eq!(
            worker.advance(3_000),
            1,
            "only the live owner's timer moves"
        );
        assert_eq!(b.pop_due(3_000), Some((2_000, TimerPayload(2, 0))));
    }

    use super::*;

    #[test]
    fn fires_in_deadline_then_schedule_order_across_revolutions() {
        // 64 slots of 10 ns: deadlines 5 and 645 share a slot one revolution apart.
        let mut wheel = TimerWheel::new(10, 4);
        wheel.schedule(645, "late");
        wheel.schedule(5, "early");
        wheel.schedule(12, "b");
        wheel.schedule(12, "c");
        assert_eq!(wheel.pop_due(4), None);
        assert_eq!(wheel.pop_due(20), Some((5, "early")));
        // A timer scheduled in the past while others are due goes in order.
        wheel.schedule(3, "past");
        assert_eq!(wheel.pop_due(20), Some((3, "past")));
        assert_eq!(wheel.pop_due(20), Some((12, "b")));
        assert_eq!(wheel.pop_due(20), Some((12, "c")));
        assert_eq!(wheel.pop_due(20), None);
        assert_eq!(wheel.next_deadline(), Some(645));
        assert_eq!(wheel.pop_due(1_000), Some((645, "late")));
        assert!(wheel.is_empty());
    }

    #[test]
    fn next_deadline_and_firing_match_a_model_with_cancels() {
        // Deadlines across several revolutions and the overflow, scheduled in random
        // order, cancelled at random, popped in random steps: the wheel always agrees
        // with a plain list of live timers.
        let mut wheel = TimerWheel::new(10, 64);
        let mut live: Vec<(u64, u64, TimerKey)> = Vec::new();
        let mut dead: Vec<TimerKey> = Vec::new();
        let mut x = 12345u64;
        let mut now = 0;
        for id in 0..5_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match x % 5 {
                0 => {
                    now += x % 400;
                    while let Some((deadline, fired)) = wheel.pop_due(now) {
                        let expected = live
                            .iter()
                            .enumerate()
                            .min_by_key(|(_, (d, i, _))| (*d, *i))
                            .map(|(at, _)| at)
                            .expect("a live timer fired");
                        let (d, i, key) = live.remove(expected);
                        assert_eq!((deadline, fired), (d, i));
                        assert!(deadline <= now);
                        dead.push(key);
                    }
                    assert!(live.iter().all(|(d, _, _)| *d > now));
                }
                1 if !live.is_empty() => {
                    let (d, i, key) = live.swap_remove((x >> 8) as usize % live.len());
                    assert_eq!(wheel.cancel(key), Some(i), "deadline {d}");
                    dead.push(key);
                }
                2 if !dead.is_empty() => {
                    let key = dead[(x >> 8) as usize % dead.len()];
                    assert_eq!(wheel.cancel(key), None, "a stale key cancels nothing");
                }
                _ => {
                    let deadline = (now + x % 3_000).saturating_sub(x % 50);
                    let key = wheel.schedule(deadline, id);
                    live.push((deadline, id, key));
                }
            }
            assert_eq!(wheel.len(), live.len());
            assert_eq!(wheel.next_deadline(), live.iter().map(|(d, _, _)| *d).min());
        }
    }

    #[test]
    fn a_long_jump_fires_everything_due_once() {
        let mut wheel = TimerWheel::new(1, 8);
        for deadline in [100, 3, 77, 1_000_000] {
            wheel.schedule(deadline, deadline);
        }
        let fired: Vec<u64> = std::iter::from_fn(|| wheel.pop_due(500).map(|(d, _)| d)).collect();
        assert_eq!(fired, vec![3, 77, 100]);
        assert_eq!(wheel.len(), 1);
        assert_eq!(wheel.next_deadline(), Some(1_000_000));
    }

    #[test]
    fn cancelled_timers_free_their_memory() {
        // A steady stream of fixed timeouts, each cancelled soon after (a call that
        // completed): the wheel holds only the live ones and reuses their nodes.
        let mut wheel = TimerWheel::new(65_536, 4096);
        let timeout = 5_000_000_000;
        let mut keys = std::collections::VecDeque::new();
        for i in 0..1_000_000u64 {
            let now = i * 1_000;
            keys.push_back(wheel.schedule(now + timeout, i));
            if keys.len() > 100 {
                let key = keys.pop_front().expect("non-empty");
                assert!(wheel.cancel(key).is_some());
            }
            assert_eq!(wheel.pop_due(now), None);
        }
        assert_eq!(wheel.len(), 100);
        assert_eq!(wheel.len_peak(), 101);
        assert!(wheel.node_capacity() <= 101);
        assert_eq!(wheel.next_deadline(), Some(999_900 * 1_000 + timeout));
    }
}
