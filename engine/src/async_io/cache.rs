//! A per-subtask cache of lookup results in front of the async operator: Flink's
//! lookup-join `PARTIAL` cache (`LookupOptions`: `lookup.partial-cache.max-rows`,
//! `expire-after-write`, `expire-after-access`, `cache-missing-key`).
//!
//! [`LookupCache`] holds the settings and the key function; it travels in the
//! [`AsyncConfig`](super::AsyncConfig) (so it is `Clone + Send + Sync`), and each operator
//! builds its own store from it on its task's thread when it is constructed. The store
//! is never shared: one subtask, one thread, one store, so it takes no lock and no
//! atomic (see the dependency's comment in the workspace `Cargo.toml`).
//!
//! How the operator uses it (see `operator.rs`):
//! - Before a call, the record's key is looked up. A hit completes the record at once
//!   with the cached results, through the path of a call that completes inside
//!   `invoke`: the function is not called, and where such a call would leave without an
//!   operator entry (unordered mode, ordered mode with nothing ahead, no watermark
//!   pending) so does the hit. Otherwise the hit is queued behind what comes before it,
//!   like any early completion: a hit behind a slow call in ordered mode waits for it.
//! - A miss calls the function. When that call's results stand (first attempt or a
//!   retry), they are stored under the key. An error, a timed-out call (whatever its
//!   timeout hook completes it with) and results the retry strategy rejects are not
//!   stored.
//! - A second miss for a key whose load is still in flight makes a second call (no
//!   request coalescing, as in Flink's cache); the later of the two results replaces the
//!   earlier one.
//!
//! Invariants:
//! 1. At most `rows_max` rows; inserting into a full store evicts the least recently
//!    used row (a hit counts as a use, a miss on an expired row removes it).
//! 2. A row is served only while it is younger than `expire_after_write` (since it was
//!    stored) and fresher than `expire_after_access` (since it was stored or last hit),
//!    both by the operator's clock (`now_ns`). Expiry is checked lazily, on lookup:
//!    there is no timer and no background thread, so an expired row holds its place (and
//!    counts in the entries metric) until it is looked up or evicted.
//! 3. The key function runs on the operator's thread, once per lookup and again when a
//!    load is stored: keep it cheap (a field read) and deterministic.
//!
//! The cache is not state: it is not in snapshots or checkpoints (Flink does not
//! checkpoint its lookup cache either), and a restored operator starts cold.

use std::any::Any;
use std::hash::Hash;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use lru::LruCache;

use super::future::Results;
use crate::error::ConfigError;

pub use crate::limits::LOOKUP_CACHE_ROWS_MAX;

/// The key function.
type KeyFn<In, K> = Arc<dyn Fn(&In) -> K + Send + Sync>;
/// Builds a hit's result from the input and a cached result.
type JoinFn<In, Out> = Arc<dyn Fn(&In, &Out) -> Out + Send + Sync>;

/// Settings of a per-subtask lookup cache (Flink's `PARTIAL` lookup cache), for
/// [`AsyncConfig::with_cache`](super::AsyncConfig::with_cache). See the module docs for
/// what is cached and when.
///
/// `In` is the async function's input, `K` the cache key made from it, `Out` its
/// results, which must be `Clone`: a load's results are emitted and stored.
pub struct LookupCache<In, K, Out> {
    rows_max: usize,
    expire_after_write: Option<Duration>,
    expire_after_access: Option<Duration>,
    cache_missing_key: bool,
    key: KeyFn<In, K>,
    join: JoinFn<In, Out>,
}

impl<In, K, Out> LookupCache<In, K, Out>
where
    In: 'static,
    K: Hash + Eq + Clone + 'static,
    Out: Clone + Send + 'static,
{
    /// A cache of at most `rows_max` rows (least recently used evicted first; Flink's
    /// `lookup.partial-cache.max-rows`), keyed by `key(input)`, without expiry, caching
    /// missing keys. `rows_max` must be in `1..=`[`LOOKUP_CACHE_ROWS_MAX`]: the operator
    /// refuses to be built otherwise ([`ConfigError`]).
    pub fn new(rows_max: usize, key: impl Fn(&In) -> K + Send + Sync + 'static) -> Self {
        LookupCache {
            rows_max,
            expire_after_write: None,
            expire_after_access: None,
            cache_missing_key: true,
            key: Arc::new(key),
            join: Arc::new(|_, cached: &Out| cached.clone()),
        }
    }

    /// Rows expire this long after they were stored (Flink's
    /// `lookup.partial-cache.expire-after-write`), by the operator's clock.
    pub fn with_expire_after_write(mut self, after: Duration) -> Self {
        self.expire_after_write = Some(after);
        self
    }

    /// Rows expire this long after they were stored or last hit (Flink's
    /// `lookup.partial-cache.expire-after-access`), by the operator's clock.
    pub fn with_expire_after_access(mut self, after: Duration) -> Self {
        self.expire_after_access = Some(after);
        self
    }

    /// Whether a call that completed with no results is cached (as an empty row, whose
    /// hits emit nothing), as Flink's `lookup.partial-cache.cache-missing-key`; on by
    /// default, as there.
    pub fn with_cache_missing_key(mut self, cache: bool) -> Self {
        self.cache_missing_key = cache;
        self
    }

    /// Builds each of a hit's results from the input and the cached result (default:
    /// a clone of the cached one). For results that carry something of their input: a
    /// lookup join's output is the input's fields with the looked-up value, so a hit
    /// must take the fields from its own input, not from the one that loaded the row.
    pub fn with_join(mut self, join: impl Fn(&In, &Out) -> Out + Send + Sync + 'static) -> Self {
        self.join = Arc::new(join);
        self
    }

    /// The most rows held.
    pub fn rows_max(&self) -> usize {
        self.rows_max
    }

    /// How long after it was stored a row expires, if it does.
    pub fn expire_after_write(&self) -> Option<Duration> {
        self.expire_after_write
    }

    /// How long after it was stored or last hit a row expires, if it does.
    pub fn expire_after_access(&self) -> Option<Duration> {
        self.expire_after_access
    }

    /// Whether calls that completed with no results are cached.
    pub fn cache_missing_key(&self) -> bool {
        self.cache_missing_key
    }
}

impl<In, K, Out> Clone for LookupCache<In, K, Out> {
    fn clone(&self) -> Self {
        LookupCache {
            rows_max: self.rows_max,
            expire_after_write: self.expire_after_write,
            expire_after_access: self.expire_after_access,
            cache_missing_key: self.cache_missing_key,
            key: Arc::clone(&self.key),
            join: Arc::clone(&self.join),
        }
    }
}

impl<In, K, Out> core::fmt::Debug for LookupCache<In, K, Out> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("LookupCache")
            .field("rows_max", &self.rows_max)
            .field("expire_after_write", &self.expire_after_write)
            .field("expire_after_access", &self.expire_after_access)
            .field("cache_missing_key", &self.cache_missing_key)
            .finish_non_exhaustive()
    }
}

/// A [`LookupCache`] with its key type erased, as the configuration holds it (the
/// configuration is generic over the results only).
pub(crate) trait CacheSpec<Out>: Send + Sync + core::fmt::Debug {
    /// Checks the settings.
    fn validate(&self) -> Result<(), ConfigError>;

    /// A new, empty store: a `Box<dyn LookupStore<In, Out>>` for the `In` the cache was
    /// made for, boxed again as `Any` (the caller downcasts it for its function's input).
    fn build(&self) -> Box<dyn Any>;
}

impl<In, K, Out> CacheSpec<Out> for LookupCache<In, K, Out>
where
    In: 'static,
    K: Hash + Eq + Clone + 'static,
    Out: Clone + Send + 'static,
{
    fn validate(&self) -> Result<(), ConfigError> {
        if self.rows_max == 0 {
            return Err(ConfigError::ZeroCapacity {
                what: "lookup cache rows_max",
            });
        }
        if self.rows_max > LOOKUP_CACHE_ROWS_MAX {
            return Err(ConfigError::TooLarge {
                what: "lookup cache rows_max",
                requested: self.rows_max,
                limit: LOOKUP_CACHE_ROWS_MAX,
            });
        }
        if self.expire_after_write == Some(Duration::ZERO)
            || self.expire_after_access == Some(Duration::ZERO)
        {
            return Err(ConfigError::Inconsistent(
                "lookup cache expiry must be positive; leave it unset for rows that do not expire",
            ));
        }
        Ok(())
    }

    fn build(&self) -> Box<dyn Any> {
        let store: Box<dyn LookupStore<In, Out>> = Box::new(Store::new(self));
        Box::new(store)
    }
}

/// A store as the operator uses it (on its own thread).
pub(crate) trait LookupStore<In, Out> {
    /// The results cached for `input`'s key, made for `input` (see
    /// [`LookupCache::with_join`]), if a live row holds them: the row becomes the most
    /// recently used and, for expiry after access, is touched. An expired row is removed.
    fn lookup(&mut self, input: &In, now_ns: u64) -> Option<Results<Out>>;

    /// Stores a load's `results` under `input`'s key, evicting the least recently used
    /// row if full. Returns whether they were stored (not when empty and missing keys
    /// are not cached).
    fn insert(&mut self, input: &In, results: &Results<Out>, now_ns: u64) -> bool;

    /// Rows held, expired ones not yet removed included.
    fn len(&self) -> usize;
}

/// One cached key: its results and when they were stored and last served.
struct Row<Out> {
    results: Results<Out>,
    written_ns: u64,
    accessed_ns: u64,
}

/// The store: an unsynchronised LRU map (see the module docs).
struct Store<In, K, Out> {
    rows: LruCache<K, Row<Out>>,
    key: KeyFn<In, K>,
    join: JoinFn<In, Out>,
    /// `u64::MAX` when rows do not expire that way.
    expire_after_write_ns: u64,
    expire_after_access_ns: u64,
    cache_missing_key: bool,
}

fn duration_ns(duration: Option<Duration>) -> u64 {
    duration.map_or(u64::MAX, |d| d.as_nanos().min(u128::from(u64::MAX)) as u64)
}

impl<In, K: Hash + Eq + Clone, Out: Clone> Store<In, K, Out> {
    fn new(spec: &LookupCache<In, K, Out>) -> Self {
        let rows_max = NonZeroUsize::new(spec.rows_max).expect("validated: rows_max > 0");
        Store {
            rows: LruCache::new(rows_max),
            key: Arc::clone(&spec.key),
            join: Arc::clone(&spec.join),
            expire_after_write_ns: duration_ns(spec.expire_after_write),
            expire_after_access_ns: duration_ns(spec.expire_after_access),
            cache_missing_key: spec.cache_missing_key,
        }
    }

    /// Whether `row` has expired at `now_ns` (a clock that went back expires nothing).
    #[inline]
    fn expired(&self, row: &Row<Out>, now_ns: u64) -> bool {
        now_ns.saturating_sub(row.written_ns) >= self.expire_after_write_ns
            || now_ns.saturating_sub(row.accessed_ns) >= self.expire_after_access_ns
    }
}

impl<In, K: Hash + Eq + Clone, Out: Clone> LookupStore<In, Out> for Store<In, K, Out> {
    fn lookup(&mut self, input: &In, now_ns: u64) -> Option<Results<Out>> {
        let key = (self.key)(input);
        // `peek` first: an expired row must not be promoted before it is removed.
        let expired = self.expired(self.rows.peek(&key)?, now_ns);
        if expired {
            self.rows.pop(&key);
            return None;
        }
        let row = self.rows.get_mut(&key).expect("peeked above");
        row.accessed_ns = now_ns;
        let join = &*self.join;
        Some(match &row.results {
            Results::Empty => Results::Empty,
            Results::One(cached) => Results::One(join(input, cached)),
            Results::Many(cached) => Results::Many(cached.iter().map(|c| join(input, c)).collect()),
        })
    }

    fn insert(&mut self, input: &In, results: &Results<Out>, now_ns: u64) -> bool {
        let results = match results {
            Results::Empty if !self.cache_missing_key => return false,
            Results::Empty => Results::Empty,
            Results::One(one) => Results::One(one.clone()),
            Results::Many(all) => Results::Many(all.clone()),
        };
        let row = Row {
            results,
            written_ns: now_ns,
            accessed_ns: now_ns,
        };
        // `push` reuses the evicted row's node when full: no allocation once full.
        self.rows.push((self.key)(input), row);
        true
    }

    fn len(&self) -> usize {
        self.rows.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn store(cache: LookupCache<u32, u32, u32>) -> Box<dyn LookupStore<u32, u32>> {
        cache.validate().unwrap();
        *cache
            .build()
            .downcast::<Box<dyn LookupStore<u32, u32>>>()
            .unwrap()
    }

    fn one(results: Option<Results<u32>>) -> Option<u32> {
        match results? {
            Results::One(value) => Some(value),
            _ => panic!("expected one result"),
        }
    }

    /// Rows are found by key, the least recently used is evicted when full, and a hit
    /// counts as a use.
    #[test]
    fn evicts_the_least_recently_used() {
        let mut s = store(LookupCache::new(2, |i: &u32| i % 100));
        assert!(s.insert(&1, &Results::One(10), 0));
        assert!(s.insert(&2, &Results::One(20), 0));
        // 101 has key 1: a hit, which makes key 1 the most recently used.
        assert_eq!(one(s.lookup(&101, 0)), Some(10));
        assert!(s.insert(&3, &Results::One(30), 0));
        assert_eq!(s.len(), 2);
        assert_eq!(one(s.lookup(&2, 0)), None, "key 2 was least recently used");
        assert_eq!(one(s.lookup(&1, 0)), Some(10));
        assert_eq!(one(s.lookup(&3, 0)), Some(30));
    }

    /// Write expiry counts from the insert and is not reset by hits; access expiry is.
    #[test]
    fn expiry_by_write_and_by_access() {
        let mut s = store(
            LookupCache::new(4, |i: &u32| *i).with_expire_after_write(Duration::from_millis(10)),
        );
        s.insert(&1, &Results::One(10), 0);
        assert_eq!(one(s.lookup(&1, 9 * MS)), Some(10));
        assert_eq!(one(s.lookup(&1, 10 * MS)), None);
        assert_eq!(s.len(), 0, "an expired row is removed when looked up");

        let mut s = store(
            LookupCache::new(4, |i: &u32| *i).with_expire_after_access(Duration::from_millis(10)),
        );
        s.insert(&1, &Results::One(10), 0);
        assert_eq!(one(s.lookup(&1, 9 * MS)), Some(10));
        assert_eq!(
            one(s.lookup(&1, 18 * MS)),
            Some(10),
            "the hit at 9 ms renewed it"
        );
        assert_eq!(one(s.lookup(&1, 28 * MS)), None);
        // A clock that went back expires nothing.
        s.insert(&2, &Results::One(20), 50 * MS);
        assert_eq!(one(s.lookup(&2, 40 * MS)), Some(20));
    }

    /// Empty results are stored or refused per `cache_missing_key`; several results and
    /// the join come back per input.
    #[test]
    fn missing_keys_and_join() {
        let mut s = store(LookupCache::new(4, |i: &u32| *i));
        assert!(s.insert(&1, &Results::Empty, 0));
        assert!(matches!(s.lookup(&1, 0), Some(Results::Empty)));
        let mut s = store(LookupCache::new(4, |i: &u32| *i).with_cache_missing_key(false));
        assert!(!s.insert(&1, &Results::Empty, 0));
        assert!(s.lookup(&1, 0).is_none());
        let mut s = store(
            LookupCache::new(4, |i: &u32| i % 10)
                .with_join(|input: &u32, cached: &u32| input + cached),
        );
        s.insert(&1, &Results::Many(vec![100, 200]), 0);
        match s.lookup(&11, 0) {
            Some(Results::Many(all)) => assert_eq!(all, vec![111, 211]),
            _ => panic!("expected two results"),
        }
    }

    /// Bad settings are refused with what to change.
    #[test]
    fn bad_settings() {
        let zero = LookupCache::<u32, u32, u32>::new(0, |i| *i).validate();
        assert_eq!(
            zero,
            Err(ConfigError::ZeroCapacity {
                what: "lookup cache rows_max"
            })
        );
        let large = LookupCache::<u32, u32, u32>::new(LOOKUP_CACHE_ROWS_MAX + 1, |i| *i);
        assert!(matches!(
            large.validate(),
            Err(ConfigError::TooLarge { .. })
        ));
        let instant = LookupCache::<u32, u32, u32>::new(1, |i| *i)
            .with_expire_after_access(Duration::ZERO)
            .validate();
        assert!(matches!(instant, Err(ConfigError::Inconsistent(_))));
    }
}
