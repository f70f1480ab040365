//! Cross-thread queue workloads: streaming throughput and ping-pong round trips, for
//! Weir's SPSC ring and its peers (rtrb, `crossbeam_queue::ArrayQueue`,
//! `std::sync::mpsc::sync_channel`).
//!
//! Both threads are spawned for each measurement and pinned to two cores (see
//! [`crate::affinity`]); timing starts after a barrier, so spawning is not measured.
//! The consumer checks that it receives `0..n` in order.

use std::ops::Range;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use crate::affinity::{run_pair, Backoff};

/// Capacity used by the streaming workloads (the 1024 × u64).
pub const STREAM_CAPACITY: usize = 1024;
/// Batch size of the batched streaming workload.
pub const BATCH_LEN: usize = 64;

/// A bounded single-producer single-consumer queue of `u64`.
pub trait Queue: 'static {
    /// Name in reports.
    const NAME: &'static str;
    /// Sending half.
    type Tx: Send + 'static;
    /// Receiving half.
    type Rx: Send + 'static;
    /// A queue of at least `capacity` slots.
    fn make(capacity: usize) -> (Self::Tx, Self::Rx);
    /// Pushes or hands the value back when full.
    fn push(tx: &mut Self::Tx, value: u64) -> Result<(), u64>;
    /// Pops the oldest value.
    fn pop(rx: &mut Self::Rx) -> Option<u64>;
}

/// A queue with native batch operations (one index publication per batch).
pub trait BatchQueue: Queue {
    /// Pushes from `values` while there is room; returns how many.
    fn push_batch(tx: &mut Self::Tx, values: &mut Range<u64>, max: usize) -> usize;
    /// Pops up to `max` values into `out`; returns how many.
    fn pop_batch(rx: &mut Self::Rx, out: &mut Vec<u64>, max: usize) -> usize;
}

/// Weir's `ring`.
pub struct Weir;
impl Queue for Weir {
    const NAME: &'static str = "weir ring";
    type Tx = weir_engine::ring::Producer<u64>;
    type Rx = weir_engine::ring::Consumer<u64>;
    fn make(capacity: usize) -> (Self::Tx, Self::Rx) {
        weir_engine::ring::channel(capacity)
    }
    #[inline]
    fn push(tx: &mut Self::Tx, value: u64) -> Result<(), u64> {
        tx.try_push(value)
    }
    #[inline]
    fn pop(rx: &mut Self::Rx) -> Option<u64> {
        rx.try_pop()
    }
}
impl BatchQueue for Weir {
    #[inline]
    fn push_batch(tx: &mut Self::Tx, values: &mut Range<u64>, max: usize) -> usize {
        tx.push_iter(&mut values.by_ref().take(max))
    }
    #[inline]
    fn pop_batch(rx: &mut Self::Rx, out: &mut Vec<u64>, max: usize) -> usize {
        rx.pop_into(out, max)
    }
}

/// The `rtrb` crate, the usual Rust SPSC ring.
pub struct Rtrb;
impl Queue for Rtrb {
    const NAME: &'static str = "rtrb";
    type Tx = rtrb::Producer<u64>;
    type Rx = rtrb::Consumer<u64>;
    fn make(capacity: usize) -> (Self::Tx, Self::Rx) {
        rtrb::RingBuffer::new(capacity)
    }
    #[inline]
    fn push(tx: &mut Self::Tx, value: u64) -> Result<(), u64> {
        tx.push(value).map_err(|rtrb::PushError::Full(v)| v)
    }
    #[inline]
    fn pop(rx: &mut Self::Rx) -> Option<u64> {
        rx.pop().ok()
    }
}
impl BatchQueue for Rtrb {
    #[inline]
    fn push_batch(tx: &mut Self::Tx, values: &mut Range<u64>, max: usize) -> usize {
        let count = tx
            .slots()
            .min(max)
            .min(values.end.saturating_sub(values.start) as usize);
        if count == 0 {
            return 0;
        }
        match tx.write_chunk_uninit(count) {
            Ok(chunk) => chunk.fill_from_iter(values.by_ref()),
            Err(_) => 0,
        }
    }
    #[inline]
    fn pop_batch(rx: &mut Self::Rx, out: &mut Vec<u64>, max: usize) -> usize {
        let count = rx.slots().min(max);
        if count == 0 {
            return 0;
        }
        match rx.read_chunk(count) {
            Ok(chunk) => {
                out.extend(chunk);
                count
            }
            Err(_) => 0,
        }
    }
}

/// `crossbeam_queue::ArrayQueue` (an MPMC queue) used as SPSC.
pub struct ArrayQueue;
impl Queue for ArrayQueue {
    const NAME: &'static str = "crossbeam ArrayQueue";
    type Tx = Arc<crossbeam_queue::ArrayQueue<u64>>;
    type Rx = Arc<crossbeam_queue::ArrayQueue<u64>>;
    fn make(capacity: usize) -> (Self::Tx, Self::Rx) {
        let queue = Arc::new(crossbeam_queue::ArrayQueue::new(capacity));
        (Arc::clone(&queue), queue)
    }
    #[inline]
    fn push(tx: &mut Self::Tx, value: u64) -> Result<(), u64> {
        tx.push(value)
    }
    #[inline]
    fn pop(rx: &mut Self::Rx) -> Option<u64> {
        rx.pop()
    }
}

/// `std::sync::mpsc::sync_channel`.
pub struct StdSync;
impl Queue for StdSync {
    const NAME: &'static str = "std sync_channel";
    type Tx = mpsc::SyncSender<u64>;
    type Rx = mpsc::Receiver<u64>;
    fn make(capacity: usize) -> (Self::Tx, Self::Rx) {
        mpsc::sync_channel(capacity)
    }
    #[inline]
    fn push(tx: &mut Self::Tx, value: u64) -> Result<(), u64> {
        tx.try_send(value).map_err(|e| match e {
            mpsc::TrySendError::Full(v) | mpsc::TrySendError::Disconnected(v) => v,
        })
    }
    #[inline]
    fn pop(rx: &mut Self::Rx) -> Option<u64> {
        rx.try_recv().ok()
    }
}

/// Streams `0..n` one value at a time from one core to the other, capacity 1024.
pub fn stream<Q: Queue>(n: u64) -> Duration {
    stream_with::<Q>(n, STREAM_CAPACITY)
}

/// Streams `0..n` one value at a time through a queue of `capacity` slots.
pub fn stream_with<Q: Queue>(n: u64, capacity: usize) -> Duration {
    let (mut tx, mut rx) = Q::make(capacity);
    run_pair(
        move || {
            let mut backoff = Backoff::default();
            for value in 0..n {
                let mut pending = value;
                while let Err(back) = Q::push(&mut tx, pending) {
                    pending = back;
                    backoff.snooze();
                }
                backoff.reset();
            }
        },
        move || {
            let mut backoff = Backoff::default();
            let mut expected = 0;
            while expected < n {
                match Q::pop(&mut rx) {
                    Some(value) => {
                        assert_eq!(value, expected, "{} delivered out of order", Q::NAME);
                        expected += 1;
                        backoff.reset();
                    }
                    None => backoff.snooze(),
                }
            }
        },
    )
}

/// Streams `0..n` in batches of [`BATCH_LEN`] from one core to the other.
pub fn stream_batched<Q: BatchQueue>(n: u64) -> Duration {
    let (mut tx, mut rx) = Q::make(STREAM_CAPACITY);
    run_pair(
        move || {
            let mut backoff = Backoff::default();
            let mut values = 0..n;
            while values.start < n {
                if Q::push_batch(&mut tx, &mut values, BATCH_LEN) == 0 {
                    backoff.snooze();
                } else {
                    backoff.reset();
                }
            }
        },
        move || {
            let mut backoff = Backoff::default();
            let mut out = Vec::with_capacity(BATCH_LEN);
            let mut expected = 0;
            while expected < n {
                out.clear();
                if Q::pop_batch(&mut rx, &mut out, BATCH_LEN) == 0 {
                    backoff.snooze();
                    continue;
                }
                backoff.reset();
                for &value in &out {
                    assert_eq!(value, expected, "{} delivered out of order", Q::NAME);
                    expected += 1;
                }
            }
        },
    )
}

/// `n` ping-pong round trips: one value to the other core and back through two queues.
pub fn round_trip<Q: Queue>(n: u64) -> Duration {
    let (mut ping_tx, mut ping_rx) = Q::make(64);
    let (mut pong_tx, mut pong_rx) = Q::make(64);
    run_pair(
        move || {
            for i in 0..n {
                let mut pending = i;
                while let Err(back) = Q::push(&mut ping_tx, pending) {
                    pending = back;
                    std::hint::spin_loop();
                }
                let mut backoff = Backoff::default();
                let echoed = loop {
                    if let Some(v) = Q::pop(&mut pong_rx) {
                        break v;
                    }
                    backoff.snooze();
                };
                assert_eq!(echoed, i, "{} echoed the wrong value", Q::NAME);
            }
        },
        move || {
            for _ in 0..n {
                let mut backoff = Backoff::default();
                let value = loop {
                    if let Some(v) = Q::pop(&mut ping_rx) {
                        break v;
                    }
                    backoff.snooze();
                };
                let mut pending = value;
                while let Err(back) = Q::push(&mut pong_tx, pending) {
                    pending = back;
                    std::hint::spin_loop();
                }
            }
        },
    )
}
