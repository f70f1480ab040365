//! Segment pool workloads: acquire + recycle on one thread, and across threads (one
//! thread acquires and hands the buffer through a Weir ring, the other drops it, which
//! recycles it), for Weir's `LocalBufferPool` and two peers: a `Mutex<VecDeque>` pool
//! (what Flink's `LocalBufferPool` does, a lock around a deque) and a
//! `crossbeam_queue::ArrayQueue` pool. Every buffer is a handle that returns its segment
//! on drop, so each side pays for the same handle mechanics.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weir_engine::exchange::{Buffer, LocalBufferPool, LocalPoolConfig, NetworkBufferPool};
use weir_engine::limits::SEGMENT_SIZE_DEFAULT;

use crate::affinity::Backoff;

/// Segments in each pool: more than the hand-off ring holds, so the cross-thread
/// workload measures recycling, not an empty pool.
pub const POOL_SEGMENTS: usize = 64;
/// Slots of the ring between the acquiring and the recycling thread.
pub const HANDOFF_CAPACITY: usize = 32;

/// A pool of fixed-size segments whose handles recycle on drop.
pub trait Pool: Sized + Send + 'static {
    /// Name in reports.
    const NAME: &'static str;
    /// A held segment; dropping it recycles the segment.
    type Buf: Send + 'static;
    /// A pool of `segments` segments of `size` bytes.
    fn make(segments: usize, size: usize) -> Self;
    /// Takes a segment, or `None` when none is free.
    fn acquire(&mut self) -> Option<Self::Buf>;
    /// Writes a byte into the segment (so the workload touches the memory).
    fn touch(buf: &mut Self::Buf, byte: u8);
}

/// Weir's network + local buffer pool.
pub struct Weir {
    pool: LocalBufferPool,
    _network: NetworkBufferPool,
}
impl Pool for Weir {
    const NAME: &'static str = "weir LocalBufferPool";
    type Buf = Buffer;
    fn make(segments: usize, size: usize) -> Self {
        let network = NetworkBufferPool::new(segments, size).expect("valid pool size");
        let config = LocalPoolConfig::new(segments, 1).with_max_per_subpartition(segments);
        let pool = LocalBufferPool::new(&network, config).expect("network pool holds the segments");
        Weir {
            pool,
            _network: network,
        }
    }
    #[inline]
    fn acquire(&mut self) -> Option<Buffer> {
        self.pool.request(0)
    }
    #[inline]
    fn touch(buf: &mut Buffer, byte: u8) {
        buf.as_mut_slice()[0] = byte;
    }
}

/// A lock around a deque of boxed segments.
pub struct MutexPool(Arc<Mutex<VecDeque<Box<[u8]>>>>);
/// A segment of [`MutexPool`]; pushes itself back under the lock on drop.
pub struct MutexBuf(Option<Box<[u8]>>, Arc<Mutex<VecDeque<Box<[u8]>>>>);
impl Drop for MutexBuf {
    fn drop(&mut self) {
        if let Some(segment) = self.0.take() {
            self.1.lock().expect("pool lock").push_back(segment);
        }
    }
}
impl Pool for MutexPool {
    const NAME: &'static str = "Mutex<VecDeque>";
    type Buf = MutexBuf;
    fn make(segments: usize, size: usize) -> Self {
        MutexPool(Arc::new(Mutex::new(
            (0..segments).map(|_| vec![0u8; size].into()).collect(),
        )))
    }
    #[inline]
    fn acquire(&mut self) -> Option<MutexBuf> {
        let segment = self.0.lock().expect("pool lock").pop_front()?;
        Some(MutexBuf(Some(segment), Arc::clone(&self.0)))
    }
    #[inline]
    fn touch(buf: &mut MutexBuf, byte: u8) {
        if let Some(segment) = buf.0.as_mut() {
            segment[0] = byte;
        }
    }
}

/// A lock-free bounded MPMC queue of boxed segments.
pub struct ArrayQueuePool(Arc<crossbeam_queue::ArrayQueue<Box<[u8]>>>);
/// A segment of [`ArrayQueuePool`]; pushes itself back on drop.
pub struct ArrayQueueBuf(
    Option<Box<[u8]>>,
    Arc<crossbeam_queue::ArrayQueue<Box<[u8]>>>,
);
impl Drop for ArrayQueueBuf {
    fn drop(&mut self) {
        if let Some(segment) = self.0.take() {
            let pushed = self.1.push(segment);
            debug_assert!(pushed.is_ok(), "pool queue holds every segment");
        }
    }
}
impl Pool for ArrayQueuePool {
    const NAME: &'static str = "crossbeam ArrayQueue";
    type Buf = ArrayQueueBuf;
    fn make(segments: usize, size: usize) -> Self {
        let queue = crossbeam_queue::ArrayQueue::new(segments);
        for _ in 0..segments {
            let _ = queue.push(vec![0u8; size].into_boxed_slice());
        }
        ArrayQueuePool(Arc::new(queue))
    }
    #[inline]
    fn acquire(&mut self) -> Option<ArrayQueueBuf> {
        let segment = self.0.pop()?;
        Some(ArrayQueueBuf(Some(segment), Arc::clone(&self.0)))
    }
    #[inline]
    fn touch(buf: &mut ArrayQueueBuf, byte: u8) {
        if let Some(segment) = buf.0.as_mut() {
            segment[0] = byte;
        }
    }
}

/// `n` acquire + touch + recycle on one thread.
pub fn single_thread<P: Pool>(n: u64) -> Duration {
    let mut pool = P::make(POOL_SEGMENTS, SEGMENT_SIZE_DEFAULT);
    let start = Instant::now();
    for i in 0..n {
        let mut buf = pool
            .acquire()
            .expect("a segment is free: each one is recycled at once");
        P::touch(&mut buf, i as u8);
        drop(std::hint::black_box(buf));
    }
    start.elapsed()
}

/// `n` buffers acquired on one core, handed through a Weir ring, dropped (recycled) on
/// the other core.
pub fn cross_thread<P: Pool>(n: u64) -> Duration {
    let mut pool = P::make(POOL_SEGMENTS, SEGMENT_SIZE_DEFAULT);
    let (mut tx, mut rx) = weir_engine::ring::channel::<P::Buf>(HANDOFF_CAPACITY);
    crate::affinity::run_pair(
        move || {
            let mut backoff = Backoff::default();
            for i in 0..n {
                let mut buf = loop {
                    if let Some(buf) = pool.acquire() {
                        break buf;
                    }
                    backoff.snooze();
                };
                P::touch(&mut buf, i as u8);
                let mut pending = buf;
                while let Err(back) = tx.try_push(pending) {
                    pending = back;
                    backoff.snooze();
                }
                backoff.reset();
            }
        },
        move || {
            let mut backoff = Backoff::default();
            let mut dropped = 0;
            while dropped < n {
                match rx.try_pop() {
                    Some(buf) => {
                        drop(buf);
                        dropped += 1;
                        backoff.reset();
                    }
                    None => backoff.snooze(),
                }
            }
        },
    )
}
