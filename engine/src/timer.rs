//! Hashed timing wheel: O(1) scheduling of timers on the task's thread.
//!
//! A timer goes into slot `(deadline / tick) % slots` with its exact deadline; a slot
//! holds timers of every revolution, and each is checked against its own deadline when
//! its slot is scanned, so the tick only sets how much a scan touches, never when a timer
//! fires. Due timers are handed out in `(deadline, schedule order)` order.
//!
//! There is no cancellation by removal (DESIGN.md, performance notes): the owner keeps a
//! generation per timer target and ignores a stale expiry. Memory: slot vectors keep
//! their capacity, so steady state does not allocate.
//!
//! Single owner, `&mut` only.

/// A timer wheel of events `E`, times in nanoseconds of the owner's clock.
pub struct TimerWheel<E> {
    tick_ns: u64,
    slots: Box<[Vec<Timer<E>>]>,
    mask: u64,
    /// First tick not yet scanned past (the current tick is always rescanned).
    scanned_tick: u64,
    /// Time of the last scan: timers scheduled at or before it go straight to `due`.
    scanned_ns: u64,
    /// Whether any scan happened yet (before one, every timer goes to its slot).
    scanned: bool,
    /// Due timers, sorted descending so the earliest pops from the end.
    due: Vec<Timer<E>>,
    len: usize,
    sequence: u64,
}

struct Timer<E> {
    deadline_ns: u64,
    sequence: u64,
    event: E,
}

impl<E> Timer<E> {
    fn order(&self) -> (u64, u64) {
        (self.deadline_ns, self.sequence)
    }
}

impl<E> TimerWheel<E> {
    /// A wheel of `slots` slots (rounded up to a power of two) of `tick_ns` each.
    ///
    /// # Panics
    /// If `tick_ns` or `slots` is zero (fixed by the engine's limits, not user input).
    pub fn new(tick_ns: u64, slots: usize) -> Self {
        assert!(tick_ns > 0, "timer tick must be positive");
        assert!(slots > 0, "timer wheel needs a slot");
        let slots = slots.next_power_of_two();
        TimerWheel {
            tick_ns,
            slots: (0..slots).map(|_| Vec::new()).collect(),
            mask: slots as u64 - 1,
            scanned_tick: 0,
            scanned_ns: 0,
            scanned: false,
            due: Vec::new(),
            len: 0,
            sequence: 0,
        }
    }

    /// Schedules `event` at `deadline_ns`. O(1), except for a deadline already passed
    /// by the last scan, which is inserted in order among the due timers.
    pub fn schedule(&mut self, deadline_ns: u64, event: E) {
        let timer = Timer {
            deadline_ns,
            sequence: self.sequence,
            event,
        };
        self.sequence += 1;
        self.len += 1;
        if self.scanned && deadline_ns <= self.scanned_ns {
            let order = timer.order();
            let at = self.due.partition_point(|t| t.order() > order);
            self.due.insert(at, timer);
        } else {
            let slot = ((deadline_ns / self.tick_ns) & self.mask) as usize;
            self.slots[slot].push(timer);
        }
    }

    /// The deadline of the earliest timer due at or before `now_ns`, without taking it.
    pub fn peek_due(&mut self, now_ns: u64) -> Option<u64> {
        if !self.scanned || now_ns > self.scanned_ns {
            self.scan(now_ns);
        }
        self.due
            .last()
            .filter(|t| t.deadline_ns <= now_ns)
            .map(|t| t.deadline_ns)
    }

    /// The earliest timer due at or before `now_ns`, with its deadline.
    pub fn pop_due(&mut self, now_ns: u64) -> Option<(u64, E)> {
        self.peek_due(now_ns)?;
        let timer = self.due.pop()?;
        self.len -= 1;
        Some((timer.deadline_ns, timer.event))
    }

    fn scan(&mut self, now_ns: u64) {
        let now_tick = now_ns / self.tick_ns;
        let first = self.scanned_tick.min(now_tick);
        let ticks = now_tick - first + 1;
        let slot_count = self.slots.len() as u64;
        let before = self.due.len();
        for offset in 0..ticks.min(slot_count) {
            let slot = &mut self.slots[((first + offset) & self.mask) as usize];
            let mut index = 0;
            while index < slot.len() {
                if slot[index].deadline_ns <= now_ns {
                    self.due.push(slot.swap_remove(index));
                } else {
                    index += 1;
                }
            }
        }
        if self.due.len() != before {
            self.due
                .sort_unstable_by_key(|t| core::cmp::Reverse(t.order()));
        }
        self.scanned_tick = now_tick.max(self.scanned_tick);
        self.scanned_ns = now_ns.max(self.scanned_ns);
        self.scanned = true;
    }

    /// The earliest deadline of any scheduled timer. Walks the slots forward from the
    /// last scan and stops as soon as the best deadline found precedes the next slot's
    /// start (every timer in a slot is due no earlier than that slot's start), so a busy
    /// wheel answers after a slot or two.
    pub fn next_deadline(&self) -> Option<u64> {
        let mut best = self.due.last().map(|t| t.deadline_ns);
        if self.len == self.due.len() {
            return best;
        }
        let first = if self.scanned { self.scanned_tick } else { 0 };
        for offset in 0..self.slots.len() as u64 {
            let tick = first + offset;
            let start_ns = tick.saturating_mul(self.tick_ns);
            if best.is_some_and(|b| b <= start_ns) {
                break;
            }
            for timer in &self.slots[(tick & self.mask) as usize] {
                best = Some(best.map_or(timer.deadline_ns, |b| b.min(timer.deadline_ns)));
            }
        }
        best
    }

    /// Timers scheduled and not yet popped (stale ones included).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no timer is scheduled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<E> core::fmt::Debug for TimerWheel<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("TimerWheel")
            .field("tick_ns", &self.tick_ns)
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn fires_in_deadline_then_schedule_order_across_revolutions() {
        // 4 slots of 10 ns: deadlines 5 and 45 share a slot one revolution apart.
        let mut wheel = TimerWheel::new(10, 4);
        wheel.schedule(45, "late");
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
        assert_eq!(wheel.next_deadline(), Some(45));
        assert_eq!(wheel.pop_due(1_000), Some((45, "late")));
        assert!(wheel.is_empty());
    }

    #[test]
    fn next_deadline_matches_a_full_scan() {
        // Deadlines across several revolutions, scheduled in random order, popped in
        // random steps: the walk always agrees with the minimum over all timers.
        let mut wheel = TimerWheel::new(10, 8);
        let mut live: Vec<u64> = Vec::new();
        let mut x = 12345u64;
        let mut now = 0;
        for _ in 0..500 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x % 3 == 0 {
                now += x % 40;
                while let Some((deadline, ())) = wheel.pop_due(now) {
                    let at = live.iter().position(|d| *d == deadline).unwrap();
                    live.swap_remove(at);
                }
            } else {
                let deadline = now + x % 300;
                wheel.schedule(deadline, ());
                live.push(deadline);
            }
            assert_eq!(wheel.next_deadline(), live.iter().copied().min());
        }
    }

    #[test]
    fn a_long_jump_scans_every_slot_once() {
        let mut wheel = TimerWheel::new(1, 8);
        for deadline in [100, 3, 77, 1_000_000] {
            wheel.schedule(deadline, deadline);
        }
        let fired: Vec<u64> = std::iter::from_fn(|| wheel.pop_due(500).map(|(d, _)| d)).collect();
        assert_eq!(fired, vec![3, 77, 100]);
        assert_eq!(wheel.len(), 1);
    }
}
