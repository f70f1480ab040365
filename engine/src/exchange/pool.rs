//! Buffer segments: one global [`NetworkBufferPool`] and per-partition
//! [`LocalBufferPool`]s, recycled lock-free from any thread.
//!
//! The network pool allocates `segment_count × segment_size` bytes once, at start-up.
//! A local pool reserves `size` of those segments when it is built and hands them out
//! as [`Buffer`]s; dropping a `Buffer`, on whatever thread, pushes its segment back on
//! the local pool's lock-free free list (see `free_list`) and wakes the requester if
//! it was waiting. Overdraft buffers come from the network pool on demand and go back
//! there.
//!
//! Availability (Flink's `LocalBufferPool#isAvailable`): a free segment exists and no
//! subpartition holds its maximum number of buffers. A subpartition at its maximum
//! makes the whole pool unavailable, so a slow consumer back-pressures its producer
//! instead of draining the pool; a request in the middle of a record still succeeds
//! while a segment is free, and may take an overdraft segment when none is.
//!
//! Invariants:
//! 1. A segment index is in exactly one place: the network pool's free list, a local
//!    pool's free list, or one `Buffer`. Free lists hand each index to one popper.
//! 2. `held[c]` counts the live buffers charged to subpartition `c`; `at_max` counts the
//!    subpartitions with `held[c] >= max_per_subpartition` (transiently off by the
//!    order of two RMWs from different threads, never at rest).
//! 3. A `Buffer` keeps its local pool (and so the network pool) alive; a local pool
//!    returns its free segments to the network pool when its last buffer is gone.
//!
//! Single requester: `request*` take `&mut self`; `LocalBufferPool` is not `Clone`.
//! Recycling and availability checks are safe from any thread.
//!
//! In debug builds (and under loom) every segment carries an ownership flag that
//! catches a segment handed out twice or recycled twice, and dropping the network pool
//! asserts that every segment came home.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use crate::error::ConfigError;
use crate::exchange::free_list::{FreeList, NIL};
use crate::limits::{
    NETWORK_POOL_BYTES_MAX, NETWORK_SEGMENTS_MAX, OVERDRAFT_SEGMENTS_DEFAULT, SEGMENT_SIZE_MAX,
    SEGMENT_SIZE_MIN, SUBPARTITIONS_MAX, SUBPARTITION_BUFFERS_MAX_DEFAULT,
};
use crate::park::Notify;
use crate::sync::{Arc, AtomicU32, AtomicUsize, Ordering};

/// Alignment of the segment region: a page, so segments of page-multiple size never
/// share a page or a cache line.
const REGION_ALIGN: usize = 4096;

/// The global pool of segments, allocated once. Cheap to clone (shared).
#[derive(Clone)]
pub struct NetworkBufferPool {
    inner: Arc<Global>,
}

struct Global {
    memory: NonNull<u8>,
    layout: Layout,
    segment_size: usize,
    segment_count: usize,
    /// Free-list links for every free list over these segments (see `free_list`).
    links: Box<[AtomicU32]>,
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
        // Every local pool and buffer is gone (they hold this Arc), so every segment must
        // be home; one missing means a Buffer was leaked (mem::forget) or invariant 1 broke.
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
        let bytes = segment_count
            .checked_mul(segment_size)
            .unwrap_or(usize::MAX);
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
        let links: Box<[AtomicU32]> = (0..segment_count).map(|_| AtomicU32::new(NIL)).collect();
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

struct Local {
    global: Arc<Global>,
    free: FreeList,
    size: usize,
    held: Box<[AtomicU32]>,
    max_per_subpartition: u32,
    at_max: AtomicU32,
    overdraft_max: u32,
    overdraft_in_use: AtomicU32,
    notify: Option<Box<dyn Notify>>,
}

impl Local {
    #[inline]
    fn charge(&self, channel: usize) {
        let held = self.held[channel].fetch_add(1, Ordering::Relaxed) + 1;
        if held == self.max_per_subpartition {
            self.at_max.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[inline]
    fn recycle(&self, segment: u32, channel: u32, overdraft: bool) {
        self.global.mark_released(segment);
        let held = self.held[channel as usize].fetch_sub(1, Ordering::Relaxed);
        debug_assert!(
            held > 0,
            "subpartition {channel} recycled more buffers than it held"
        );
        if held == self.max_per_subpartition {
            // Made visible to a waiting requester by the Release of the push below.
            self.at_max.fetch_sub(1, Ordering::Relaxed);
        }
        let was_waiting = if overdraft {
            self.global.give_back(segment);
            self.overdraft_in_use.fetch_sub(1, Ordering::Relaxed);
            // The local list did not change, but a subpartition may have dropped below its
            // maximum: clear the bit with an RMW so the waiter protocol still holds.
            self.free.take_waiting()
        } else {
            self.free.push(segment, &self.global.links)
        };
        if was_waiting {
            if let Some(notify) = &self.notify {
                notify.notify();
            }
        }
    }

    #[inline]
    fn is_available(&self) -> bool {
        // Relaxed on `at_max`: a stale value only delays availability until the next
        // recycle, whose push (Release) the requester's waiter protocol synchronises with.
        !self.free.is_empty() && self.at_max.load(Ordering::Relaxed) == 0
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        // Invariant 3: no buffer is out (each holds this Arc); give every segment back.
        let mut returned = 0;
        while let Some(index) = self.free.pop(&self.global.links) {
            self.global.give_back(index);
            returned += 1;
        }
        debug_assert!(std::thread::panicking() || returned == self.size);
    }
}

/// A partition's or gate's share of segments. One requester; recycling from anywhere.
pub struct LocalBufferPool {
    local: Arc<Local>,
}

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
        let free = FreeList::new();
        let mut taken = 0;
        while taken < config.size {
            match global.take() {
                Some(index) => {
                    free.push(index, &global.links);
                    taken += 1;
                }
                None => {
                    let available = taken + global.free_count.load(Ordering::Relaxed);
                    while let Some(index) = free.pop(&global.links) {
                        global.give_back(index);
                    }
                    return Err(ConfigError::NotEnoughSegments {
                        requested: config.size,
                        available,
                    });
                }
            }
        }
        let local = Local {
            global,
            free,
            size: config.size,
            held: (0..config.subpartitions)
                .map(|_| AtomicU32::new(0))
                .collect(),
            max_per_subpartition: config.max_per_subpartition as u32,
            at_max: AtomicU32::new(0),
            overdraft_max: config.overdraft as u32,
            overdraft_in_use: AtomicU32::new(0),
            notify,
        };
        Ok(LocalBufferPool {
            local: Arc::new(local),
        })
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
            subpartition < self.local.held.len(),
            "subpartition {subpartition} out of range"
        );
        let segment = self.local.free.pop(&self.local.global.links)?;
        Some(self.lend(segment, subpartition, false))
    }

    /// An overdraft buffer from the network pool, while fewer than the configured
    /// overdraft are out and the network pool has a segment. For a writer in the middle
    /// of a record when [`request`](Self::request) fails.
    pub fn request_overdraft(&mut self, subpartition: usize) -> Option<Buffer> {
        assert!(
            subpartition < self.local.held.len(),
            "subpartition {subpartition} out of range"
        );
        // Only this requester increments, so the check cannot be overtaken.
        if self.local.overdraft_in_use.load(Ordering::Relaxed) >= self.local.overdraft_max {
            return None;
        }
        let segment = self.local.global.take()?;
        self.local.overdraft_in_use.fetch_add(1, Ordering::Relaxed);
        Some(self.lend(segment, subpartition, true))
    }

    #[inline]
    fn lend(&self, segment: u32, subpartition: usize, overdraft: bool) -> Buffer {
        self.local.global.mark_owned(segment);
        self.local.charge(subpartition);
        Buffer {
            local: Arc::clone(&self.local),
            segment,
            channel: subpartition as u32,
            overdraft,
            len: 0,
        }
    }

    /// Whether a request would succeed and no subpartition is at its maximum: the check a
    /// task makes before taking the next record. One or two loads.
    #[inline]
    pub fn is_available(&self) -> bool {
        self.local.is_available()
    }

    /// Returns `true` if the pool is available; otherwise registers the requester so the
    /// next recycle calls the pool's [`Notify`], and returns `false`. Race-free: a segment
    /// recycled at any moment is either seen here or notified.
    pub fn available_or_notify(&mut self) -> bool {
        let local = &self.local;
        if local.is_available() {
            return true;
        }
        let non_empty = local.free.set_waiting();
        // The set_waiting RMW synchronised with every earlier push, and with it every
        // earlier `at_max` decrement; re-read it now.
        if non_empty && local.at_max.load(Ordering::Relaxed) == 0 {
            local.free.take_waiting();
            return true;
        }
        false
    }

    /// Buffers out now (regular and overdraft).
    pub fn in_use(&self) -> usize {
        self.local
            .held
            .iter()
            .map(|h| h.load(Ordering::Relaxed) as usize)
            .sum()
    }

    /// Buffers out now charged to `subpartition`.
    pub fn held_by(&self, subpartition: usize) -> usize {
        self.local.held[subpartition].load(Ordering::Relaxed) as usize
    }

    /// Fraction of the reserved segments out now (Flink's `outPoolUsage`/`inPoolUsage`).
    pub fn usage(&self) -> f64 {
        self.in_use() as f64 / self.local.size as f64
    }

    /// Segments reserved.
    pub fn size(&self) -> usize {
        self.local.size
    }

    /// Bytes per segment.
    pub fn segment_size(&self) -> usize {
        self.local.global.segment_size
    }
}

impl core::fmt::Debug for LocalBufferPool {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("LocalBufferPool")
            .field("size", &self.size())
            .field("in_use", &self.in_use())
            .finish_non_exhaustive()
    }
}

/// One segment, owned. Dropping it recycles the segment to its pool, from any thread.
pub struct Buffer {
    local: Arc<Local>,
    segment: u32,
    channel: u32,
    overdraft: bool,
    len: usize,
}

impl Buffer {
    /// Bytes of the segment.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.local.global.segment_size
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
        let start = self.segment as usize * self.capacity();
        debug_assert!(start + self.len <= self.local.global.layout.size());
        // SAFETY: the segment lies inside the region (index < count) and this buffer owns
        // it exclusively (invariant 1); `len <= capacity` (checked in `set_len`).
        unsafe {
            core::slice::from_raw_parts(self.local.global.memory.as_ptr().add(start), self.len)
        }
    }

    /// The whole segment, for writing.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let size = self.capacity();
        let start = self.segment as usize * size;
        debug_assert!(start + size <= self.local.global.layout.size());
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only live view.
        unsafe {
            core::slice::from_raw_parts_mut(self.local.global.memory.as_ptr().add(start), size)
        }
    }

    /// The subpartition (or channel) this buffer is charged to.
    pub fn subpartition(&self) -> usize {
        self.channel as usize
    }

    /// Whether this is an overdraft buffer.
    pub fn is_overdraft(&self) -> bool {
        self.overdraft
    }

    /// The segment's index in the network pool (stable while this buffer lives).
    pub fn segment_index(&self) -> usize {
        self.segment as usize
    }
}

impl Drop for Buffer {
    #[inline]
    fn drop(&mut self) {
        self.local
            .recycle(self.segment, self.channel, self.overdraft);
    }
}

impl core::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Buffer")
            .field("segment", &self.segment)
            .field("subpartition", &self.channel)
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
        assert_eq!(network.free_segments(), 3);
        drop(regular);
        drop(pool);
        network.assert_whole();
    }
}
