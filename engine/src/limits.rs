//! Every default capacity and budget of the engine, with what it costs.
//!
//! Relationships between limits are checked at compile time. Under loom the
//! capacities shrink so that the models reach their full and empty states.

/// Slots per mail ring by default; one ring per sending thread and task, so memory is
/// slot size × slots × senders per task (1024 × 16 B × 64 cores = 1 MiB per task at most).
#[cfg(not(loom))]
pub const MAIL_RING_CAPACITY: usize = 1024;
/// Under loom a ring of 4 slots reaches full within the explored schedules.
#[cfg(loom)]
pub const MAIL_RING_CAPACITY: usize = 4;
const _: () = assert!(MAIL_RING_CAPACITY.is_power_of_two());

/// Largest ring capacity accepted: indices are `usize` and compared with
/// `wrapping_sub`, which needs the capacity to be at most half the index space.
pub const RING_CAPACITY_MAX: usize = 1 << 30;
const _: () = assert!(RING_CAPACITY_MAX.is_power_of_two());
const _: () = assert!(MAIL_RING_CAPACITY <= RING_CAPACITY_MAX);

/// Largest slab: keys store the index in 32 bits.
pub const SLAB_CAPACITY_MAX: usize = u32::MAX as usize;

/// Default segment size: 32 KiB, as Flink's `taskmanager.memory.segment-size`.
/// One segment per in-flight buffer: a 1→N partition holds up to N × max-per-subpartition.
pub const SEGMENT_SIZE_DEFAULT: usize = 32 * 1024;
/// Smallest segment: must hold a 4-byte length prefix plus at least one payload byte;
/// 64 keeps a segment on its own cache line.
pub const SEGMENT_SIZE_MIN: usize = 64;
/// Largest segment: 16 MiB. Larger segments only add latency (a buffer is shipped when full).
pub const SEGMENT_SIZE_MAX: usize = 16 * 1024 * 1024;
const _: () = assert!(SEGMENT_SIZE_MIN <= SEGMENT_SIZE_DEFAULT);
const _: () = assert!(SEGMENT_SIZE_DEFAULT <= SEGMENT_SIZE_MAX);
const _: () = assert!(SEGMENT_SIZE_DEFAULT.is_power_of_two());

/// Default number of segments in the network buffer pool: 2048 × 32 KiB = 64 MiB,
/// Flink's default network memory share on a small task manager.
pub const NETWORK_SEGMENTS_DEFAULT: usize = 2048;
/// Segment indices are 32-bit and `u32::MAX` marks an empty free list.
pub const NETWORK_SEGMENTS_MAX: usize = (u32::MAX - 1) as usize;
/// Total bytes a network buffer pool may allocate: 64 GiB.
pub const NETWORK_POOL_BYTES_MAX: usize = 64 << 30;
const _: () = assert!(NETWORK_SEGMENTS_DEFAULT * SEGMENT_SIZE_DEFAULT <= NETWORK_POOL_BYTES_MAX);

/// Default overdraft segments per local pool: lets a writer finish a record that spans
/// segments when the pool is exhausted, instead of blocking mid-record (Flink: 5).
pub const OVERDRAFT_SEGMENTS_DEFAULT: usize = 5;

/// Default buffers a single subpartition may hold before the pool reports unavailable
/// (Flink's `taskmanager.network.memory.max-buffers-per-channel`: 10).
pub const SUBPARTITION_BUFFERS_MAX_DEFAULT: usize = 10;

/// Largest number of subpartitions of one partition (per-subpartition counters are `u32`
/// and kept in one array; 64 Ki downstream tasks is far past any real fan-out).
pub const SUBPARTITIONS_MAX: usize = 1 << 16;

/// Largest async operator capacity: in-flight entries live in a slab of this many
/// entries (~100 B each plus the input), allocated at start-up: 1 Mi entries ≈ 100 MiB.
pub const ASYNC_CAPACITY_MAX: usize = 1 << 20;
const _: () = assert!(ASYNC_CAPACITY_MAX <= SLAB_CAPACITY_MAX);

/// Completion references the async operator takes from the shared count at a time, so
/// issuing a `ResultFuture` costs one atomic per this many records.
pub const COMPLETION_REF_CREDITS: usize = 64;

/// Timer wheel tick: 64 µs. A tick only sets how much of the wheel an advance scans;
/// each timer fires at its exact deadline.
pub const TIMER_TICK_NS: u64 = 65_536;
/// Timer wheel slots: 4096 × 64 µs ≈ 268 ms per revolution; longer timers wait in
/// their slot for later revolutions.
pub const TIMER_SLOTS: usize = 4096;
const _: () = assert!(TIMER_SLOTS.is_power_of_two());

/// The async operator records the invoke-to-emit latency of one record in this many
/// (by input sequence), keeping the histogram off the per-record path.
pub const LATENCY_SAMPLE_EVERY: u64 = 16;
const _: () = assert!(LATENCY_SAMPLE_EVERY.is_power_of_two());

/// Length prefixes at or above this value mark in-band events (watermark, end of
/// partition), so records are limited to fewer bytes.
pub const EVENT_TAG_MIN: u32 = 0xFFFF_FF00;
/// Default largest record a writer accepts: 16 MiB (Flink has no limit; a bound keeps a
/// corrupt length from making a reader allocate gigabytes).
pub const RECORD_SIZE_MAX_DEFAULT: usize = 16 << 20;
const _: () = assert!(RECORD_SIZE_MAX_DEFAULT < EVENT_TAG_MIN as usize);

/// Default buffer timeout: a partially filled buffer is shipped at most this long after
/// its first byte was written (Flink's `execution.buffer-timeout`: 100 ms).
pub const BUFFER_TIMEOUT_DEFAULT_NS: u64 = 100_000_000;

/// The most rows a lookup cache may hold (per subtask). The store's map is sized for all its rows when the
/// operator is built (so lookups never rehash, and inserts allocate only until it is
/// full): about 20 bytes a row for the map, plus each row's key and results once
/// stored, per subtask: 16 Mi rows is some 320 MiB of map alone.
pub const LOOKUP_CACHE_ROWS_MAX: usize = 1 << 24;
