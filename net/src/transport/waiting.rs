//! Partition requests for channels this process does not serve yet.
//!
//! A consumer may ask for a channel before its producer task has started here; the
//! request waits until the channel is served or `request_timeout` passes. Everything a
//! peer can grow here is bounded, and every operation a peer's frame triggers is O(1)
//! (amortized), so a flood of requests costs linear, not quadratic, CPU:
//! - one waiting request per channel (a channel has one consumer; a second request for
//!   it is refused);
//! - at most [`REQUESTS_WAITING_PER_CONNECTION_MAX`] per connection;
//! - requests by channel id in a hash map (credit, cancel and serve look up one entry);
//! - expiry in arrival order: a queue of (time, channel, serial) whose front is the
//!   next to expire; entries of requests that were served or cancelled meanwhile are
//!   skipped when they reach the front, and the queue is compacted when such entries
//!   outnumber the live ones.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Partition requests one connection may have waiting at once: far above the channels
/// one consumer process asks of one producer process in any job this engine runs
/// (a 256 × 256 all-to-all exchange over two processes asks for 32 768).
pub(crate) const REQUESTS_WAITING_PER_CONNECTION_MAX: usize = 1 << 16;

/// Stale queue entries tolerated beyond the live ones before a compaction.
const STALE_SLACK: usize = 1024;

#[derive(Debug, Clone, Copy)]
struct Request {
    slot: usize,
    credit: u32,
    serial: u64,
}

/// Why a request cannot wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The channel is requested already, by this connection or another.
    Duplicate {
        /// The connection whose request waits.
        slot: usize,
    },
    /// The connection has the most requests waiting that it may have.
    Full,
}

/// The waiting requests (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Waiting {
    by_channel: HashMap<u32, Request>,
    per_connection: HashMap<usize, usize>,
    order: VecDeque<(Instant, u32, u64)>,
    serial: u64,
}

impl Waiting {
    /// Whether no request waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.by_channel.is_empty()
    }

    /// Requests waiting.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_channel.len()
    }

    /// Makes connection `slot`'s request for `channel`, with `credit`, wait from `now`.
    pub(crate) fn push(
        &mut self,
        slot: usize,
        channel: u32,
        credit: u32,
        now: Instant,
    ) -> Result<(), Refusal> {
        if let Some(request) = self.by_channel.get(&channel) {
            return Err(Refusal::Duplicate { slot: request.slot });
        }
        let count = self.per_connection.entry(slot).or_default();
        if *count >= REQUESTS_WAITING_PER_CONNECTION_MAX {
            return Err(Refusal::Full);
        }
        *count += 1;
        self.serial += 1;
        let serial = self.serial;
        self.by_channel.insert(
            channel,
            Request {
                slot,
                credit,
                serial,
            },
        );
        self.order.push_back((now, channel, serial));
        Ok(())
    }

    /// Adds `delta` to the credit of `slot`'s waiting request for `channel`; `false` if
    /// there is none.
    pub(crate) fn add_credit(&mut self, slot: usize, channel: u32, delta: u32) -> bool {
        match self.by_channel.get_mut(&channel) {
            Some(request) if request.slot == slot => {
                request.credit = request.credit.saturating_add(delta);
                true
            }
            _ => false,
        }
    }

    /// Takes the request for `channel` (it is being served): its connection and credit.
    pub(crate) fn take(&mut self, channel: u32) -> Option<(usize, u32)> {
        let request = self.remove_entry(channel)?;
        Some((request.slot, request.credit))
    }

    /// Drops `slot`'s request for `channel` (the consumer cancelled it).
    pub(crate) fn cancel(&mut self, slot: usize, channel: u32) {
        if self
            .by_channel
            .get(&channel)
            .is_some_and(|request| request.slot == slot)
        {
            self.remove_entry(channel);
        }
    }

    /// Drops every request of connection `slot` (it ended).
    pub(crate) fn forget_connection(&mut self, slot: usize) {
        if self.per_connection.remove(&slot).is_none() {
            return;
        }
        self.by_channel.retain(|_, request| request.slot != slot);
        self.compact_if_stale();
    }

    /// When the oldest request expires, at `timeout` (possibly a request served since:
    /// an early wake-up finds nothing to expire).
    pub(crate) fn next_deadline(&self, timeout: Duration) -> Option<Instant> {
        self.order.front().map(|&(since, _, _)| since + timeout)
    }

    /// Removes and returns the requests that have waited `timeout` at `now`, as
    /// (connection, channel), oldest first.
    pub(crate) fn expire(&mut self, now: Instant, timeout: Duration) -> Vec<(usize, u32)> {
        let mut expired = Vec::new();
        while let Some(&(since, channel, serial)) = self.order.front() {
            if now.saturating_duration_since(since) < timeout {
                break;
            }
            self.order.pop_front();
            let live = self
                .by_channel
                .get(&channel)
                .is_some_and(|request| request.serial == serial);
            if live {
                let request = self.remove_entry(channel).expect("live above");
                expired.push((request.slot, channel));
            }
        }
        expired
    }

    fn remove_entry(&mut self, channel: u32) -> Option<Request> {
        let request = self.by_channel.remove(&channel)?;
        if let Some(count) = self.per_connection.get_mut(&request.slot) {
            *count -= 1;
            if *count == 0 {
                self.per_connection.remove(&request.slot);
            }
        }
        self.compact_if_stale();
        Some(request)
    }

    /// Drops queue entries of requests that are gone once they outnumber the live ones
    /// (plus a slack), so a request-and-cancel loop cannot grow the queue: amortized O(1).
    fn compact_if_stale(&mut self) {
        if self.order.len() <= 2 * self.by_channel.len() + STALE_SLACK {
            return;
        }
        let by_channel = &self.by_channel;
        self.order.retain(|&(_, channel, serial)| {
            by_channel
                .get(&channel)
                .is_some_and(|request| request.serial == serial)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One request per channel, bounded per connection; credit, cancel and serve find
    /// theirs; expiry goes oldest first and skips what was served or cancelled.
    #[test]
    fn requests_are_bounded_found_and_expired_in_order() {
        let start = Instant::now();
        let timeout = Duration::from_secs(60);
        let mut waiting = Waiting::default();
        waiting.push(1, 10, 2, start).expect("first");
        assert_eq!(
            waiting.push(2, 10, 2, start),
            Err(Refusal::Duplicate { slot: 1 })
        );
        waiting
            .push(1, 11, 2, start + Duration::from_secs(1))
            .expect("second");
        waiting
            .push(2, 12, 2, start + Duration::from_secs(2))
            .expect("third");
        assert!(waiting.add_credit(1, 10, 3));
        assert!(!waiting.add_credit(2, 10, 3), "not connection 2's request");
        assert_eq!(waiting.take(10), Some((1, 5)));
        waiting.cancel(2, 11);
        assert_eq!(
            waiting.len(),
            2,
            "a cancel by another connection is ignored"
        );
        waiting.cancel(1, 11);
        assert_eq!(waiting.next_deadline(timeout), Some(start + timeout));
        assert!(waiting.expire(start + timeout, timeout).is_empty());
        assert_eq!(
            waiting.expire(start + timeout + Duration::from_secs(2), timeout),
            vec![(2, 12)]
        );
        assert!(waiting.is_empty());
    }

    /// A connection may have at most the bound waiting; a flood of request-and-cancel
    /// pairs keeps the expiry queue near the live requests.
    #[test]
    fn a_flood_is_bounded() {
        let now = Instant::now();
        let mut waiting = Waiting::default();
        for channel in 0..REQUESTS_WAITING_PER_CONNECTION_MAX as u32 {
            waiting.push(1, channel, 0, now).expect("below the bound");
        }
        assert_eq!(waiting.push(1, u32::MAX, 0, now), Err(Refusal::Full));
        waiting
            .push(2, u32::MAX, 0, now)
            .expect("another connection");
        waiting.forget_connection(1);
        assert_eq!(waiting.len(), 1);
        for round in 0..100_000u32 {
            waiting.push(3, round, 0, now).expect("room");
            waiting.cancel(3, round);
        }
        assert!(waiting.order.len() <= 2 * waiting.len() + STALE_SLACK + 1);
    }
}
