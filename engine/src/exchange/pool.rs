//! Buffer segments: one global [`NetworkBufferPool`] and per-partition
//! [`LocalBufferPool`]s, recycled lock-free from any thread.
//!
//! The network pool allocates `segment_count × segment_size` bytes once, at start-up.
//! A local pool reserves `size` of those segments when it is built and hands them out
//! as [`Buffer`]s. Overdraft buffers come from the network pool on demand and go back
//! there when the requester next collects its returns (its next request or
//! availability check, or its drop).
//!
//! Recycling is built so that the requester and the recycling threads rarely touch the
//! same cache line: moving one line between cores costs ~100 ns on a VM, so a shared
//! counter or an `Arc` clone per buffer would cost more than everything else together:
//! - the requester keeps its free segments in a private stack and its accounting
//!   (buffers per subpartition, overdraft) in private fields: no atomics on request;
//! - dropping a `Buffer`, on any thread, pushes its segment on the pool's shared
//!   *return list* (a lock-free stack, see `free_list`) with one compare-exchange on a
//!   line the requester touches only when its private stack runs dry, when it takes
//!   the whole return list with one swap (and settles its accounting);
//! - a `Buffer` keeps the shared state alive with a reference count that the requester
//!   raises in batches of [`REF_CREDITS`], so each buffer costs the requester no atomic
//!   and the recycler one decrement on a line it already owns.
//!
//! Availability (Flink's `LocalBufferPool#isAvailable`): a free segment exists and no
//! subpartition holds its maximum number of buffers. A subpartition at its maximum
//! makes the whole pool unavailable, so a slow consumer back-pressures its producer
//! instead of draining the pool; a request in the middle of a record still succeeds
//! while a segment is free, and may take an overdraft segment when none is.
//!
//! Invariants:
//! 1. A segment index is in exactly one place: the network pool's free list, a local
//!    pool's private stack, its return list, or one `Buffer` (or the handles sharing it,
//!    counted in `shares`: `SharedBuffer` views, a `BufferBuilder` and its
//!    `BufferConsumer`s, see `buffer`). Lists hand each index out once.
//! 2. `meta[i]` (subpartition and overdraft flag) is written by the requester when it
//!    lends segment `i` and read by it when `i` comes back; the segment's trip through
//!    the return list (Release push, Acquire swap) orders the two.
//! 3. `refs` = live buffers + the requester's unspent credits + 1 for the requester
//!    itself; whoever brings it to zero frees the shared state, after which every
//!    segment is back in the network pool.
//! 4. The network pool outlives every local pool (each holds an `Arc` to it).
//!
//! Single requester: `request*` take `&mut self`; `LocalBufferPool` is not `Clone`.
//!
//! In debug builds (and under loom) every segment carries an ownership flag that
//! catches a segment handed out twice or recycled twice, and dropping the network pool
//! asserts that every segment came home.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use crossbeam_utils::CachePadded;

use crate::error::ConfigError;
use crate::exchange::free_list::{FreeList, NIL};
use crate::limits::{
    NETWORK_POOL_BYTES_MAX, NETWORK_SEGMENTS_MAX, OVERDRAFT_SEGMENTS_DEFAULT, SEGMENT_SIZE_MAX,
    SEGMENT_SIZE_MIN, SUBPARTITIONS_MAX, SUBPARTITION_BUFFERS_MAX_DEFAULT,
};
use crate::park::Notify;
use crate::sync::{fence, Arc, AtomicU32, AtomicUsize, Ordering};

/// Alignment of the segment region: a page, so segments of page-multiple size never
/// share a page or a cache line.
const REGION_ALIGN: usize = 4096;

/// References the requester takes from the shared count at a time (invariant 3).
pub const REF_CREDITS: usize = 64;

/// `meta` flag: the segment is an overdraft from the network pool.
const META_OVERDRAFT: u32 = 1 << 31;

/// The global pool of segments, allocated once. Cheap to clone (shared).
#[derive(Clone)]
pub struct NetworkBufferPool {
    inner: Arc<Global>,
}

pub(crate) struct Global {
    pub(crate) memory: NonNull<u8>,
    layout: Layout,
    pub(crate) segment_size: usize,
    segment_count: usize,
    /// Free-list links for every list over these segments (see `free_list`).
    links: Box<[AtomicU32]>,
    /// Per segment: the subpartition it is charged to, and `META_OVERDRAFT`.
    meta: Box<[AtomicU32]>,
    /// Per segment: the number of handles to it (`SharedBuffer`s, and a segment's
    /// builder and consumers, see `buffer`); 0 while a plain `Buffer` owns it.
    pub(crate) shares: Box<[AtomicU32]>,
    /// Per segment: the position its builder published (see `buffer`), on a line of its
    /// own, since the writer stores to it while the reader polls it.
    pub(crate) positions: Box<[CachePadded<AtomicU32>]>,
    free: FreeList,
    /// Segments on `free`; kept beside the list for reports and error messages.
    free_count: AtomicUsize,
    #[cfg(any(debug_assertions, loom))]
    owned: Box<[crate::sync::AtomicBool]>,
}

// SAFETY: the region behind `memory` is only touched through a `Buffer`, which owns its
// segment exclusively (invariant 1); everything else in `Global` is atomics.
unsafe impl Send for Global {}
// SAFETY: as above.
unsafe impl Sync for Global {}

impl Global {
    fn take(&self) -> Option<u32> {
        let index = self.free.pop(&self.links)?;
        self.free_count.fetch_sub(1, Ordering::Relaxed);
        Some(index)
    }

    fn give_back(&self, index: u32) {
        self.free_count.fetch_add(1, Ordering::Relaxed);
        self.free.push(index, &self.links);
    }

    /// Bytes `offset..offset + len` of segment `index`.
    ///
    /// # Safety
    /// No one may write those bytes while the slice lives, and `offset + len` must not
    /// exceed the segment size.
    #[inline(always)]
    pub(crate) unsafe fn written(&self, index: u32, offset: usize, len: usize) -> &[u8] {
        let start = index as usize * self.segment_size + offset;
        debug_assert!(offset + len <= self.segment_size);
        debug_assert!(start + len <= self.layout.size());
        // SAFETY: inside the region (index < count, offset + len <= segment size); the
        // caller guarantees no concurrent writes.
        unsafe { core::slice::from_raw_parts(self.memory.as_ptr().add(start), len) }
    }

    /// The first byte of segment `index`.
    #[inline(always)]
    pub(crate) fn segment_start(&self, index: u32) -> NonNull<u8> {
        let start = index as usize * self.segment_size;
        assert!(start + self.segment_size <= self.layout.size());
        // SAFETY: `start` lies inside the region (checked above), so the pointer is in
        // bounds of the allocation and not null.
        unsafe { NonNull::new_unchecked(self.memory.as_ptr().add(start)) }
    }

    #[inline(always)]
    fn mark_owned(&self, _index: u32) {
        #[cfg(any(debug_assertions, loom))]
        assert!(
            !self.owned[_index as usize].swap(true, Ordering::Relaxed),
            "segment {_index} handed out while another buffer holds it"
        );
    }

    #[inline(always)]
    fn mark_released(&self, _index: u32) {
        #[cfg(any(debug_assertions, loom))]
        assert!(
            self.owned[_index as usize].swap(false, Ordering::Relaxed),
            "segment {_index} recycled twice"
        );
    }
}

impl Drop for Global {
    fn drop(&mut self) {
        // Every local pool and buffer is gone (invariant 4), so every segment must be
        // home; one missing means a Buffer was leaked (mem::forget) or invariant 1 broke.
        #[cfg(any(debug_assertions, loom))]
        if !std::thread::panicking() {
            let home = self.free.count_quiescent(&self.links);
            assert_eq!(
                home, self.segment_count,
                "network buffer pool dropped with segments missing"
            );
        }
        // SAFETY: `memory` was allocated in `NetworkBufferPool::new` with `layout` and is
        // freed only here, once, after the last reference is gone.
        unsafe { dealloc(self.memory.as_ptr(), self.layout) };
    }
}
impl NetworkBufferPool {
    /// Allocates `segment_count` segments of `segment_size` bytes, zeroed.
    pub fn new(segment_count: usize, segment_size: usize) -> Result<Self, ConfigError> {
        if !(SEGMENT_SIZE_MIN..=SEGMENT_SIZE_MAX).contains(&segment_size) {
            return Err(ConfigError::SegmentSize {
                size: segment_size,
                min: SEGMENT_SIZE_MIN,
                max: SEGMENT_SIZE_MAX,
            });
        }
        if segment_count == 0 {
            return Err(ConfigError::ZeroCapacity {
                what: "network buffer pool segment count",
            });
        }
        if segment_count > NETWORK_SEGMENTS_MAX {
            return Err(ConfigError::TooLarge {
                what: "network buffer pool segment count",
                requested: segment_count,
                limit: NETWORK_SEGMENTS_MAX,
            });
        }
        let bytes = segment_count.saturating_mul(segment_size);
        if bytes > NETWORK_POOL_BYTES_MAX {
            return Err(ConfigError::TooLarge {
                what: "network buffer pool size in bytes",
                requested: bytes,
                limit: NETWORK_POOL_BYTES_MAX,
            });
        }
        let layout = Layout::from_size_align(bytes, REGION_ALIGN)
            .map_err(|_| ConfigError::Inconsistent("segment region layout overflows"))?;
        // SAFETY: `layout` has a non-zero size (count ≥ 1, size ≥ SEGMENT_SIZE_MIN).
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(memory) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout);
        };
        // Touch every page now, at start-up: zeroed allocations are mapped lazily, and a
        // page fault in the data path costs microseconds of latency on first use.
        for page in (0..bytes).step_by(REGION_ALIGN) {
            // SAFETY: `page < bytes`, inside the allocation we own exclusively here.
            unsafe { memory.as_ptr().add(page).write_volatile(0) };
        }
        let links: Box<[AtomicU32]> = (0..segment_count).map(|_| AtomicU32::new(NIL)).collect();
        let meta: Box<[AtomicU32]> = (0..segment_count).map(|_| AtomicU32::new(0)).collect();
        let shares: Box<[AtomicU32]> = (0..segment_count).map(|_| AtomicU32::new(0)).collect();
        let positions: Box<[CachePadded<AtomicU32>]> = (0..segment_count)
            .map(|_| CachePadded::new(AtomicU32::new(0)))
            .collect();
        let free = FreeList::new();
        // Push in reverse so segment 0 is handed out first (keeps early segments warm).
        for index in (0..segment_count as u32).rev() {
            free.push(index, &links);
        }
        let inner = Global {
            memory,
            layout,
            segment_size,
            segment_count,
            links,
            meta,
            shares,
            positions,
            free,
            free_count: AtomicUsize::new(segment_count),
            #[cfg(any(debug_assertions, loom))]
            owned: (0..segment_count)
                .map(|_| crate::sync::AtomicBool::new(false))
                .collect(),
        };
        Ok(NetworkBufferPool {
            inner: Arc::new(inner),
        })
    }

    /// Bytes per segment.
    pub fn segment_size(&self) -> usize {
        self.inner.segment_size
    }

    /// Segments allocated.
    pub fn segment_count(&self) -> usize {
        self.inner.segment_count
    }

    /// Segments not reserved by any local pool nor lent as overdraft, right now.
    pub fn free_segments(&self) -> usize {
        self.inner.free_count.load(Ordering::Relaxed)
    }

    /// Panics unless every segment is back in this pool: for tests, after every local
    /// pool and buffer has been dropped.
    pub fn assert_whole(&self) {
        assert_eq!(
            self.inner.free.count_quiescent(&self.inner.links),
            self.inner.segment_count,
            "network buffer pool is missing segments"
        );
        assert_eq!(self.free_segments(), self.inner.segment_count);
    }
}

impl core::fmt::Debug for NetworkBufferPool {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("NetworkBufferPool")
            .field("segment_size", &self.segment_size())
            .field("segment_count", &self.segment_count())
            .field("free_segments", &self.free_segments())
            .finish()
    }
}

/// Sizes of a [`LocalBufferPool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalPoolConfig {
    /// Segments reserved from the network pool.
    pub size: usize,
    /// Subpartitions (for an output) or channels (for an input) buffers are charged to.
    pub subpartitions: usize,
    /// Buffers one subpartition may hold before the pool reports unavailable.
    pub max_per_subpartition: usize,
    /// Extra segments a writer may borrow from the network pool mid-record.
    pub overdraft: usize,
}

impl LocalPoolConfig {
    /// `size` segments over `subpartitions`, with Flink's defaults for the rest.
    pub fn new(size: usize, subpartitions: usize) -> Self {
        LocalPoolConfig {
            size,
            subpartitions,
            max_per_subpartition: SUBPARTITION_BUFFERS_MAX_DEFAULT,
            overdraft: OVERDRAFT_SEGMENTS_DEFAULT,
        }
    }

    /// Sets the per-subpartition maximum.
    pub fn with_max_per_subpartition(mut self, max: usize) -> Self {
        self.max_per_subpartition = max;
        self
    }

    /// Sets the overdraft allowance.
    pub fn with_overdraft(mut self, overdraft: usize) -> Self {
        self.overdraft = overdraft;
        self
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.size == 0 {
            return Err(ConfigError::ZeroCapacity {
                what: "local buffer pool size",
            });
        }
        if self.subpartitions == 0 {
            return Err(ConfigError::ZeroCapacity {
                what: "local buffer pool subpartition count",
            });
        }
        if self.subpartitions > SUBPARTITIONS_MAX {
            return Err(ConfigError::TooLarge {
                what: "subpartition count",
                requested: self.subpartitions,
                limit: SUBPARTITIONS_MAX,
            });
        }
        if self.max_per_subpartition == 0 {
            return Err(ConfigError::ZeroCapacity {
                what: "buffers per subpartition",
            });
        }
        if self.size < self.subpartitions {
            return Err(ConfigError::FewerSegmentsThanSubpartitions {
                size: self.size,
                subpartitions: self.subpartitions,
            });
        }
        if self.overdraft > u32::MAX as usize || self.max_per_subpartition > u32::MAX as usize {
            return Err(ConfigError::Inconsistent(
                "overdraft and buffers per subpartition must fit in 32 bits",
            ));
        }
        Ok(())
    }
}

/// What recyclers and the requester share; freed by whoever drops `refs` to zero.
pub(crate) struct Shared {
    /// Read-mostly fields, read by the requester on every request.
    pub(crate) global: Arc<Global>,
    notify: Option<Box<dyn Notify>>,
    /// Written by recyclers on every drop: on lines of their own.
    recycled: CachePadded<Recycled>,
}

struct Recycled {
    /// Segments recycled since the requester last looked.
    returned: FreeList,
    /// Invariant 3.
    refs: AtomicUsize,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The requester is gone and gave back its private stack; every buffer is gone
        // (refs reached zero), so what is left is on the return list.
        let mut index = self.recycled.returned.take_all();
        while index != NIL {
            let next = self.global.links[index as usize].load(Ordering::Relaxed);
            self.global.give_back(index);
            index = next;
        }
    }
}

/// Drops one reference to `shared`, freeing it if it was the last (invariant 3).
///
/// # Safety
/// `shared` came from `Box::into_raw` in `LocalBufferPool::build`, and the caller owns
/// one of the references counted in `refs`, which it gives up here.
unsafe fn release_refs(shared: NonNull<Shared>, count: usize) {
    // SAFETY: the caller owns `count` references, so the allocation is live.
    let refs = unsafe { &shared.as_ref().recycled.refs };
    // Release: our uses of the shared state happen before whoever frees it.
    if refs.fetch_sub(count, Ordering::Release) == count {
        // Acquire: pairs with every other holder's Release decrement above.
        fence(Ordering::Acquire);
        // SAFETY: the count reached zero, so no one else holds a reference; the pointer
        // came from `Box::into_raw` (caller's guarantee) and is freed exactly once.
        drop(unsafe { Box::from_raw(shared.as_ptr()) });
    }
}

/// A partition's or gate's share of segments. One requester; recycling from anywhere.
pub struct LocalBufferPool {
    shared: NonNull<Shared>,
    /// Free segments, private to the requester (top = next to lend).
    free: Vec<u32>,
    size: usize,
    /// Buffers lent per subpartition and not yet seen back.
    held: Box<[u32]>,
    max_per_subpartition: u32,
    /// Subpartitions with `held >= max_per_subpartition`.
    at_max: u32,
    overdraft_max: u32,
    overdraft_out: u32,
    /// Buffers lent and not yet seen back.
    out: usize,
    /// References taken from `refs` and not yet given to a buffer (invariant 3).
    credits: usize,
}

// SAFETY: the requester's fields are plain data moved with it; `Shared` is only reached
// through atomics and `Sync` parts (`Notify: Sync`, `Global: Sync`).
unsafe impl Send for LocalBufferPool {}

impl LocalBufferPool {
    /// Reserves `config.size` segments from `network`.
    pub fn new(network: &NetworkBufferPool, config: LocalPoolConfig) -> Result<Self, ConfigError> {
        Self::build(network, config, None)
    }

    /// Like [`LocalBufferPool::new`], with `notify` called (from the recycling thread)
    /// when a segment comes back while the requester waits (see
    /// [`LocalBufferPool::available_or_notify`]).
    pub fn with_notify(
        network: &NetworkBufferPool,
        config: LocalPoolConfig,
        notify: impl Notify,
    ) -> Result<Self, ConfigError> {
        Self::build(network, config, Some(Box::new(notify)))
    }

    fn build(
        network: &NetworkBufferPool,
        config: LocalPoolConfig,
        notify: Option<Box<dyn Notify>>,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        let global = Arc::clone(&network.inner);
        let mut free = Vec::with_capacity(config.size);
        while free.len() < config.size {
            match global.take() {
                Some(index) => free.push(index),
                None => {
                    let available = free.len() + global.free_count.load(Ordering::Relaxed);
                    for index in free {
                        global.give_back(index);
                    }
                    return Err(ConfigError::NotEnoughSegments {
                        requested: config.size,
                        available,
                    });
                }
            }
        }
        // Lend the lowest indices first.
        free.reverse();
        let shared = Box::new(Shared {
            global,
            notify,
            recycled: CachePadded::new(Recycled {
                returned: FreeList::new(),
                refs: AtomicUsize::new(1),
            }),
        });
        Ok(LocalBufferPool {
            shared: NonNull::from(Box::leak(shared)),
            free,
            size: config.size,
            held: vec![0; config.subpartitions].into_boxed_slice(),
            max_per_subpartition: config.max_per_subpartition as u32,
            at_max: 0,
            overdraft_max: config.overdraft as u32,
            overdraft_out: 0,
            out: 0,
            credits: 0,
        })
    }

    #[inline(always)]
    fn shared(&self) -> &Shared {
        // SAFETY: we hold the requester's own reference (invariant 3), so it is live.
        unsafe { self.shared.as_ref() }
    }

    /// Takes back everything recycled since the last look and settles the accounting.
    fn collect(&mut self) {
        // SAFETY: as in `shared`; a raw borrow so that `self`'s fields stay mutable.
        let shared = unsafe { self.shared.as_ref() };
        let global = &*shared.global;
        let mut index = shared.recycled.returned.take_all();
        while index != NIL {
            let next = global.links[index as usize].load(Ordering::Relaxed);
            // Invariant 2: we wrote this when lending; the list's Release/Acquire orders it.
            let meta = global.meta[index as usize].load(Ordering::Relaxed);
            let subpartition = (meta & !META_OVERDRAFT) as usize;
            debug_assert!(self.held[subpartition] > 0);
            self.held[subpartition] -= 1;
            if self.held[subpartition] + 1 == self.max_per_subpartition {
                self.at_max -= 1;
            }
            if meta & META_OVERDRAFT != 0 {
                self.overdraft_out -= 1;
                global.give_back(index);
            } else {
                self.free.push(index);
            }
            self.out -= 1;
            index = next;
        }
    }

    /// A buffer charged to `subpartition`, or `None` when no reserved segment is free.
    /// Succeeds past the per-subpartition maximum (that only makes the pool unavailable),
    /// so a writer can finish the record it is in.
    ///
    /// # Panics
    /// If `subpartition` is not below the configured count (a wiring bug).
    #[inline]
    pub fn request(&mut self, subpartition: usize) -> Option<Buffer> {
        assert!(
            subpartition < self.held.len(),
            "subpartition {subpartition} out of range"
        );
        if self.free.is_empty() {
            self.collect();
        }
        let segment = self.free.pop()?;
        Some(self.lend(segment, subpartition, 0))
    }

    /// An overdraft buffer from the network pool, while fewer than the configured
    /// overdraft are out and the network pool has a segment. For a writer in the middle
    /// of a record when [`request`](Self::request) fails.
    pub fn request_overdraft(&mut self, subpartition: usize) -> Option<Buffer> {
        assert!(
            subpartition < self.held.len(),
            "subpartition {subpartition} out of range"
        );
        if self.overdraft_out >= self.overdraft_max {
            self.collect();
            if self.overdraft_out >= self.overdraft_max {
                return None;
            }
        }
        let segment = self.shared().global.take()?;
        self.overdraft_out += 1;
        Some(self.lend(segment, subpartition, META_OVERDRAFT))
    }

    #[inline]
    fn lend(&mut self, segment: u32, subpartition: usize, flags: u32) -> Buffer {
        if self.credits == 0 {
            // Relaxed: like `Arc::clone`, we already hold a reference, so the count
            // cannot reach zero meanwhile.
            self.shared()
                .recycled
                .refs
                .fetch_add(REF_CREDITS, Ordering::Relaxed);
            self.credits = REF_CREDITS;
        }
        self.credits -= 1;
        let global = &*self.shared().global;
        global.mark_owned(segment);
        global.meta[segment as usize].store(subpartition as u32 | flags, Ordering::Relaxed);
        self.held[subpartition] += 1;
        if self.held[subpartition] == self.max_per_subpartition {
            self.at_max += 1;
        }
        self.out += 1;
        Buffer {
            shared: self.shared,
            segment,
            len: 0,
        }
    }

    /// Whether a request would succeed and no subpartition is at its maximum: the check a
    /// task makes before taking the next record. Looks at the return list only when the
    /// private state says no.
    #[inline]
    pub fn is_available(&mut self) -> bool {
        if self.free.is_empty() || self.at_max > 0 {
            self.collect();
        }
        !self.free.is_empty() && self.at_max == 0
    }

    /// Returns `true` if the pool is available; otherwise registers the requester so the
    /// next recycle calls the pool's [`Notify`], and returns `false`. Race-free: a segment
    /// recycled at any moment is either seen here or notified (see `free_list`).
    pub fn available_or_notify(&mut self) -> bool {
        loop {
            if self.is_available() {
                return true;
            }
            // Nothing came back since `collect`: register, unless something just did.
            if !self.shared().recycled.returned.set_waiting() {
                return false;
            }
            self.shared().recycled.returned.take_waiting();
        }
    }

    /// Takes back every buffer recycled so far, so that [`in_use`](Self::in_use) and
    /// [`usage`](Self::usage) are current (e.g. before reporting metrics). Requests do
    /// this by themselves when the private free list runs dry.
    pub fn reclaim(&mut self) {
        self.collect();
    }

    /// Buffers lent and not yet seen back (seen when the pool next runs short).
    pub fn in_use(&self) -> usize {
        self.out
    }

    /// Buffers lent to `subpartition` and not yet seen back.
    pub fn held_by(&self, subpartition: usize) -> usize {
        self.held[subpartition] as usize
    }

    /// Fraction of the reserved segments out (Flink's `outPoolUsage`/`inPoolUsage`).
    pub fn usage(&self) -> f64 {
        (self.out - self.overdraft_out as usize) as f64 / self.size as f64
    }

    /// Segments reserved.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Overdraft buffers allowed at once.
    pub fn overdraft_max(&self) -> usize {
        self.overdraft_max as usize
    }

    /// Bytes per segment.
    pub fn segment_size(&self) -> usize {
        self.shared().global.segment_size
    }
}

impl Drop for LocalBufferPool {
    fn drop(&mut self) {
        self.collect();
        // SAFETY: we hold the requester's reference until `release_refs` below; a raw
        // borrow so that `self.free` stays mutable.
        let global = unsafe { &*self.shared.as_ref().global };
        for index in self.free.drain(..) {
            global.give_back(index);
        }
        // SAFETY: we own our reference plus `credits` unspent ones (invariant 3).
        unsafe { release_refs(self.shared, self.credits + 1) };
    }
}

impl core::fmt::Debug for LocalBufferPool {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("LocalBufferPool")
            .field("size", &self.size)
            .field("in_use", &self.out)
            .finish_non_exhaustive()
    }
}

/// One segment, owned. Dropping it recycles the segment to its pool, from any thread.
pub struct Buffer {
    pub(crate) shared: NonNull<Shared>,
    pub(crate) segment: u32,
    len: usize,
}

// SAFETY: a buffer owns its segment exclusively (invariant 1) and reaches the shared
// state only through atomics and `Sync` parts; it holds a counted reference (invariant 3).
unsafe impl Send for Buffer {}
// SAFETY: `&Buffer` only reads the segment, which no one else may write.
unsafe impl Sync for Buffer {}

impl Buffer {
    #[inline(always)]
    pub(crate) fn global(&self) -> &Global {
        // SAFETY: this buffer holds a reference to the shared state (invariant 3).
        unsafe { &self.shared.as_ref().global }
    }

    /// Bytes of the segment.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.global().segment_size
    }

    /// Bytes written so far (what a reader may read).
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing has been written.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sets the written length.
    ///
    /// # Panics
    /// If `len` exceeds the capacity.
    #[inline]
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.capacity(),
            "buffer length {len} exceeds its segment"
        );
        self.len = len;
    }

    /// The written bytes.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: this buffer owns its segment exclusively (invariant 1), so no one
        // writes it while the slice lives; `len <= capacity` (checked in `set_len`).
        unsafe { self.global().written(self.segment, 0, self.len) }
    }

    /// The whole segment, for writing.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let global = self.global();
        let size = global.segment_size;
        let start = self.segment as usize * size;
        debug_assert!(start + size <= global.layout.size());
        let base = global.memory.as_ptr();
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only live view.
        unsafe { core::slice::from_raw_parts_mut(base.add(start), size) }
    }

    /// The subpartition (or channel) this buffer is charged to.
    pub fn subpartition(&self) -> usize {
        (self.global().meta[self.segment as usize].load(Ordering::Relaxed) & !META_OVERDRAFT)
            as usize
    }

    /// Whether this is an overdraft buffer.
    pub fn is_overdraft(&self) -> bool {
        self.global().meta[self.segment as usize].load(Ordering::Relaxed) & META_OVERDRAFT != 0
    }

    /// The segment's index in the network pool (stable while this buffer lives).
    pub fn segment_index(&self) -> usize {
        self.segment as usize
    }
}

impl Buffer {
    /// Turns this buffer into a read-only handle that can be cloned (one reference count
    /// per segment, no allocation); the segment is recycled when the last clone drops.
    /// For sending one serialized buffer to several consumers (broadcast).
    pub fn into_shared(self) -> SharedBuffer {
        let this = core::mem::ManuallyDrop::new(self);
        let global = this.global();
        debug_assert_eq!(
            global.shares[this.segment as usize].load(Ordering::Relaxed),
            0
        );
        // Relaxed: the handle reaches other threads only through a synchronising channel.
        global.shares[this.segment as usize].store(1, Ordering::Relaxed);
        SharedBuffer {
            shared: this.shared,
            segment: this.segment,
            offset: 0,
            len: this.len,
        }
    }
}

/// Returns `segment` to its local pool and gives up one pool reference.
///
/// # Safety
/// The caller owns the segment (invariant 1) and one reference to `shared`
/// (invariant 3), and uses neither afterwards.
#[inline]
pub(crate) unsafe fn recycle(shared: NonNull<Shared>, segment: u32) {
    // SAFETY: the caller's reference keeps the shared state alive until `release_refs`.
    let state = unsafe { shared.as_ref() };
    state.global.mark_released(segment);
    if state.recycled.returned.push(segment, &state.global.links) {
        if let Some(notify) = &state.notify {
            notify.notify();
        }
    }
    // SAFETY: the caller gives up its reference; we touch the shared state no more.
    unsafe { release_refs(shared, 1) };
}

impl Drop for Buffer {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: this buffer owns its segment and a reference, and is gone after this.
        unsafe { recycle(self.shared, self.segment) };
    }
}

/// A read-only, cloneable view of bytes of a segment: a whole filled segment (see
/// [`Buffer::into_shared`]), or the bytes a writer published since the reader's last
/// read (see [`BufferConsumer`](crate::exchange::buffer::BufferConsumer)). The segment
/// is recycled when its last handle (view, builder or consumer) drops, on whatever
/// thread.
pub struct SharedBuffer {
    pub(crate) shared: NonNull<Shared>,
    pub(crate) segment: u32,
    /// Where the view starts in the segment.
    pub(crate) offset: u32,
    pub(crate) len: usize,
}

// SAFETY: handles only read their bytes, which no one writes while any handle exists (a
// view covers published bytes, which the writer never writes again); the count and the
// pool are reached through atomics (as for `Buffer`).
unsafe impl Send for SharedBuffer {}
// SAFETY: as above.
unsafe impl Sync for SharedBuffer {}

impl SharedBuffer {
    #[inline(always)]
    fn global(&self) -> &Global {
        // SAFETY: the handles together hold one pool reference (invariant 3).
        unsafe { &self.shared.as_ref().global }
    }

    /// The bytes of this view.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the view's bytes are immutable while it lives: either no `Buffer` holds
        // the segment (a filled buffer made shared), or they lie below the position its
        // builder published, which the builder never writes again (see `buffer`,
        // invariant 1); `offset + len` is within the segment (set where the view is made).
        unsafe {
            self.global()
                .written(self.segment, self.offset as usize, self.len)
        }
    }

    /// Where this view starts in its segment (0 for a whole buffer).
    #[inline]
    pub fn offset(&self) -> usize {
        self.offset as usize
    }

    /// Bytes in this view.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was written.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The segment's index in the network pool.
    pub fn segment_index(&self) -> usize {
        self.segment as usize
    }
}

impl Clone for SharedBuffer {
    #[inline]
    fn clone(&self) -> Self {
        // Relaxed: like `Arc::clone`, we hold a handle, so the count cannot reach zero.
        self.global().shares[self.segment as usize].fetch_add(1, Ordering::Relaxed);
        SharedBuffer {
            shared: self.shared,
            segment: self.segment,
            offset: self.offset,
            len: self.len,
        }
    }
}

impl Drop for SharedBuffer {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: this view holds one share of its segment and gives it up here.
        unsafe { release_share(self.shared, self.segment) };
    }
}

/// Gives up one share of `segment` (a view's, a builder's or a consumer's); the last
/// share recycles it.
///
/// # Safety
/// The caller owns one share of `segment` (counted in `shares`), which keeps `shared`
/// alive, and uses neither afterwards.
#[inline]
pub(crate) unsafe fn release_share(shared: NonNull<Shared>, segment: u32) {
    // SAFETY: the caller's share keeps the pool reference, hence the shared state, alive.
    let state = unsafe { shared.as_ref() };
    let shares = &state.global.shares[segment as usize];
    // Release: our reads (and a builder's writes) of the segment happen before whoever
    // recycles it.
    if shares.fetch_sub(1, Ordering::Release) == 1 {
        // Acquire: pairs with the other holders' Release decrements.
        fence(Ordering::Acquire);
        // SAFETY: we held the last share, so we own the segment and the one pool
        // reference the shares hold together.
        unsafe { recycle(shared, segment) };
    }
}

impl core::fmt::Debug for SharedBuffer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SharedBuffer")
            .field("segment", &self.segment)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl core::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Buffer")
            .field("segment", &self.segment)
            .field("subpartition", &self.subpartition())
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn bad_sizes_are_config_errors() {
        assert!(matches!(
            NetworkBufferPool::new(4, 0),
            Err(ConfigError::SegmentSize { .. })
        ));
        assert!(matches!(
            NetworkBufferPool::new(4, SEGMENT_SIZE_MAX + 1),
            Err(ConfigError::SegmentSize { .. })
        ));
        assert!(matches!(
            NetworkBufferPool::new(0, 1024),
            Err(ConfigError::ZeroCapacity { .. })
        ));
        assert!(matches!(
            NetworkBufferPool::new(usize::MAX / 2, 1 << 20),
            Err(ConfigError::TooLarge { .. })
        ));
        let network = NetworkBufferPool::new(4, 1024).unwrap();
        let too_many = LocalBufferPool::new(&network, LocalPoolConfig::new(5, 1));
        assert!(matches!(
            too_many,
            Err(ConfigError::NotEnoughSegments {
                requested: 5,
                available: 4
            })
        ));
        network.assert_whole();
        let spread = LocalBufferPool::new(&network, LocalPoolConfig::new(2, 3));
        assert!(matches!(
            spread,
            Err(ConfigError::FewerSegmentsThanSubpartitions { .. })
        ));
        let message = spread.unwrap_err().to_string();
        assert!(
            message.contains("at least one segment per subpartition"),
            "{message}"
        );
    }

    #[test]
    fn subpartition_at_max_makes_pool_unavailable() {
        let network = NetworkBufferPool::new(8, 64).unwrap();
        let mut pool = LocalBufferPool::new(
            &network,
            LocalPoolConfig::new(6, 2).with_max_per_subpartition(2),
        )
        .unwrap();
        let a = pool.request(0).unwrap();
        assert!(pool.is_available());
        let b = pool.request(0).unwrap();
        assert!(!pool.is_available(), "subpartition 0 holds its maximum");
        // A writer mid-record may still take more.
        let c = pool.request(0).unwrap();
        drop(c);
        assert!(!pool.is_available());
        drop(a);
        assert!(pool.is_available());
        drop(b);
        drop(pool);
        network.assert_whole();
    }

    #[test]
    fn overdraft_is_bounded_and_goes_home() {
        let network = NetworkBufferPool::new(4, 64).unwrap();
        let mut pool =
            LocalBufferPool::new(&network, LocalPoolConfig::new(1, 1).with_overdraft(2)).unwrap();
        let regular = pool.request(0).unwrap();
        assert!(pool.request(0).is_none());
        let o1 = pool.request_overdraft(0).unwrap();
        let o2 = pool.request_overdraft(0).unwrap();
        assert!(o1.is_overdraft() && o2.is_overdraft());
        assert!(
            pool.request_overdraft(0).is_none(),
            "overdraft limit reached"
        );
        assert_eq!(network.free_segments(), 1);
        drop((o1, o2));
        // Overdraft goes home when the requester next looks at its returns.
        assert!(!pool.is_available());
        assert_eq!(network.free_segments(), 3);
        drop(regular);
        drop(pool);
        network.assert_whole();
    }
}
