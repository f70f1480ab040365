//! The async operator with a lookup cache (Flink's lookup-join `PARTIAL` cache), through
//! its harness: hits make no call and keep each mode's order and watermark fencing,
//! rows expire by the operator's clock after write and after access, the least
//! recently used row is evicted, missing keys are cached or not per the flag, errors,
//! timeouts and rejected results are not cached, bad settings are refused, the metrics
//! count right, and (property test) a cached run emits what an uncached run emits.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::Rc;
use std::time::Duration;

use proptest::prelude::*;
use weir_engine::async_io::{
    AsyncConfig, AsyncError, AsyncFunction, AsyncHarness, LookupCache, OperatorError, OutputMode,
    ResultFuture, RetryStrategy, LOOKUP_CACHE_ROWS_MAX,
};
use weir_engine::element::StreamElement;
use weir_engine::ConfigError;

const MS: Duration = Duration::from_millis(1);

/// Input: (id, key). The id is also the record's timestamp.
type In = (u32, u32);
/// Output: (id of the input it was emitted for, looked-up value).
type Out = (u32, u32);

/// Calls waiting for the test to answer them, with their input.
type Pending = Rc<RefCell<VecDeque<(In, ResultFuture<Out>)>>>;

/// Keys from this one up have no value: their lookups complete with no results.
const MISSING_FROM: u32 = 100;

/// The value stored under `key`.
fn value_of(key: u32) -> u32 {
    key * 10 + 7
}

/// A lookup of `key`'s value, answered inside `invoke` or kept for the test to answer.
#[derive(Clone, Default)]
struct Lookup {
    /// Every input the function was called with, retries included, in order.
    calls: Rc<RefCell<Vec<In>>>,
    /// Calls waiting for the test to answer them.
    pending: Pending,
    /// Answer inside `invoke` (latency 0) instead of keeping the handle.
    inline: Rc<Cell<bool>>,
    /// Fail this many of the next calls (inside `invoke`).
    fail_next: Rc<Cell<u32>>,
}

impl Lookup {
    fn answer(input: &In, result: ResultFuture<Out>) {
        if input.1 >= MISSING_FROM {
            result.complete(None);
        } else {
            result.complete_one((input.0, value_of(input.1)));
        }
    }

    /// Answers the oldest pending call for input `id`.
    fn complete(&self, id: u32) {
        let (input, handle) = {
            let mut pending = self.pending.borrow_mut();
            let at = pending
                .iter()
                .position(|(input, _)| input.0 == id)
                .expect("a pending call for this id");
            pending.remove(at).expect("position is valid")
        };
        Self::answer(&input, handle);
    }

    /// The ids of the calls made, in order.
    fn call_ids(&self) -> Vec<u32> {
        self.calls.borrow().iter().map(|input| input.0).collect()
    }
}

impl AsyncFunction for Lookup {
    type In = In;
    type Out = Out;
    fn invoke(&mut self, input: &In, result: ResultFuture<Out>) {
        self.calls.borrow_mut().push(*input);
        if self.fail_next.get() > 0 {
            self.fail_next.set(self.fail_next.get() - 1);
            result.complete_err(AsyncError::call("injected"));
        } else if self.inline.get() {
            Self::answer(input, result);
        } else {
            self.pending.borrow_mut().push_back((*input, result));
        }
    }
    fn timeout(&mut self, input: &In, result: ResultFuture<Out>) {
        // A fallback value no lookup returns.
        result.complete_one((input.0, u32::MAX));
    }
    fn key(&self, input: &In) -> u64 {
        u64::from(input.1)
    }
}

/// The cache of these tests: keyed by the input's key, a hit's result made for its own
/// input (the id from the input, the value from the cached row).
fn cache(rows_max: usize) -> LookupCache<In, u32, Out> {
    LookupCache::new(rows_max, |input: &In| input.1)
        .with_join(|input: &In, cached: &Out| (input.0, cached.1))
}

fn harness(
    mode: OutputMode,
    cache: LookupCache<In, u32, Out>,
    inline: bool,
) -> (AsyncHarness<Lookup>, Lookup) {
    let function = Lookup::default();
    function.inline.set(inline);
    let config = AsyncConfig::new(mode, 8).with_cache(cache);
    let h = AsyncHarness::new(function.clone(), config).unwrap();
    (h, function)
}

fn record(h: &mut AsyncHarness<Lookup>, id: u32, key: u32) {
    h.process_record((id, key), Some(i64::from(id))).unwrap();
}

/// What came out: records as `R(id, value)`, watermarks as `W(ts)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    R(u32, u32),
    W(i64),
}

fn seen(h: &mut AsyncHarness<Lookup>) -> Vec<Seen> {
    h.take_output()
        .into_iter()
        .map(|element| match element {
            StreamElement::Record(r) => {
                assert_eq!(
                    r.timestamp,
                    Some(i64::from(r.value.0)),
                    "a result carries its own input's timestamp"
                );
                Seen::R(r.value.0, r.value.1)
            }
            StreamElement::Watermark(w) => Seen::W(w.0),
        })
        .collect()
}

use Seen::{R, W};

/// A hit makes no call: of four records on two keys, only the first of each key calls,
/// and each record gets its own id with its key's value.
#[test]
fn hits_skip_the_call() {
    let (mut h, f) = harness(OutputMode::Unordered, cache(16), true);
    record(&mut h, 0, 1);
    record(&mut h, 1, 1);
    record(&mut h, 2, 2);
    record(&mut h, 3, 1);
    assert_eq!(f.call_ids(), vec![0, 2]);
    assert_eq!(
        seen(&mut h),
        vec![
            R(0, value_of(1)),
            R(1, value_of(1)),
            R(2, value_of(2)),
            R(3, value_of(1))
        ]
    );
    // Inline hits leave at once, without an entry.
    assert_eq!(h.in_flight(), 0);
    let m = h.operator().metrics();
    assert_eq!((m.cache_hits, m.cache_misses), (2, 2));
    assert_eq!((m.cache_loads, m.cache_load_ns, m.cache_entries), (2, 0, 2));
    assert_eq!((m.completed, m.emitted), (4, 4));
    assert_eq!(m.cache_hit_rate(), Some(0.5));
}

/// A load answered later is stored when it completes, with its load time by the
/// operator's clock; a second miss for a key still loading makes a second call.
#[test]
fn loads_complete_later_and_concurrent_misses_both_call() {
    let (mut h, f) = harness(OutputMode::Unordered, cache(16), false);
    record(&mut h, 0, 1);
    record(&mut h, 1, 1);
    assert_eq!(f.call_ids(), vec![0, 1], "no coalescing of in-flight loads");
    h.advance_time(5 * MS).unwrap();
    f.complete(0);
    h.run_mailbox().unwrap();
    h.advance_time(2 * MS).unwrap();
    f.complete(1);
    h.run_mailbox().unwrap();
    record(&mut h, 2, 1);
    assert_eq!(f.call_ids(), vec![0, 1], "the third record hit");
    assert_eq!(
        seen(&mut h),
        vec![R(0, value_of(1)), R(1, value_of(1)), R(2, value_of(1))]
    );
    let m = h.operator().metrics();
    assert_eq!((m.cache_hits, m.cache_misses, m.cache_loads), (1, 2, 2));
    assert_eq!(m.cache_load_ns, (5 * MS + 7 * MS).as_nanos() as u64);
    assert_eq!(m.cache_entries, 1, "the second load replaced the first");
}

/// Ordered mode: a hit behind a slow call waits for it, and leaves right after it.
#[test]
fn ordered_hit_waits_behind_a_slow_call() {
    let (mut h, f) = harness(OutputMode::Ordered, cache(16), true);
    record(&mut h, 0, 1); // loads key 1 inline
    f.inline.set(false);
    record(&mut h, 1, 2); // slow
    record(&mut h, 2, 1); // hit, behind 1
    assert_eq!(f.call_ids(), vec![0, 1]);
    assert_eq!(seen(&mut h), vec![R(0, value_of(1))]);
    assert_eq!(
        h.in_flight(),
        2,
        "the hit waits as an entry behind the slow call"
    );
    f.complete(1);
    h.run_mailbox().unwrap();
    assert_eq!(seen(&mut h), vec![R(1, value_of(2)), R(2, value_of(1))]);
    assert_eq!(h.in_flight(), 0);
}

/// Unordered mode: a hit leaves at once past a slow call, but never crosses a
/// watermark: one after a pending watermark waits for it.
#[test]
fn unordered_hits_pass_slow_calls_but_not_watermarks() {
    let (mut h, f) = harness(OutputMode::Unordered, cache(16), true);
    record(&mut h, 0, 1);
    f.inline.set(false);
    record(&mut h, 1, 2); // slow
    record(&mut h, 2, 1); // hit: passes the slow call
    assert_eq!(seen(&mut h), vec![R(0, value_of(1)), R(2, value_of(1))]);
    h.process_watermark(10).unwrap();
    record(&mut h, 3, 1); // hit after the pending watermark: held
    assert_eq!(seen(&mut h), vec![]);
    f.complete(1);
    h.run_mailbox().unwrap();
    assert_eq!(
        seen(&mut h),
        vec![R(1, value_of(2)), W(10), R(3, value_of(1))]
    );
    assert_eq!(f.call_ids(), vec![0, 1]);
}

/// Keyed-ordered mode: a hit waits behind a slow call of its own key only.
#[test]
fn keyed_hit_waits_only_for_its_key() {
    let (mut h, f) = harness(OutputMode::KeyedOrdered, cache(16), true);
    record(&mut h, 0, 1);
    record(&mut h, 1, 2);
    f.inline.set(false);
    record(&mut h, 2, 3); // slow, key 3
    record(&mut h, 3, 4); // slow, key 4
    record(&mut h, 4, 1); // hit, key 1: nothing of its key ahead
    record(&mut h, 5, 3); // miss, key 3 still loading: a call, behind record 2
    assert_eq!(f.call_ids(), vec![0, 1, 2, 3, 5]);
    assert_eq!(
        seen(&mut h),
        vec![R(0, value_of(1)), R(1, value_of(2)), R(4, value_of(1))]
    );
    f.complete(5);
    h.run_mailbox().unwrap();
    assert_eq!(
        seen(&mut h),
        vec![],
        "record 5 waits for record 2 of its key"
    );
    f.complete(2);
    h.run_mailbox().unwrap();
    assert_eq!(seen(&mut h), vec![R(2, value_of(3)), R(5, value_of(3))]);
    f.complete(3);
    h.finish().unwrap();
    assert_eq!(seen(&mut h), vec![R(3, value_of(4))]);
}

/// Expire-after-write: a row is served until its age reaches the setting, hits do not
/// renew it, and an expired row makes the next record call again.
#[test]
fn rows_expire_after_write() {
    let (mut h, f) = harness(
        OutputMode::Unordered,
        cache(16).with_expire_after_write(10 * MS),
        true,
    );
    record(&mut h, 0, 1);
    h.advance_time(6 * MS).unwrap();
    record(&mut h, 1, 1); // hit at 6 ms
    h.advance_time(3 * MS).unwrap();
    record(&mut h, 2, 1); // hit at 9 ms
    h.advance_time(MS).unwrap();
    record(&mut h, 3, 1); // 10 ms: expired, loads again
    h.advance_time(9 * MS).unwrap();
    record(&mut h, 4, 1); // 19 ms: hit of the row stored at 10 ms
    assert_eq!(f.call_ids(), vec![0, 3]);
    let m = h.operator().metrics();
    assert_eq!((m.cache_hits, m.cache_misses, m.cache_loads), (3, 2, 2));
    assert_eq!(seen(&mut h).len(), 5);
}

/// Expire-after-access: every hit renews the row; a row left alone that long expires.
#[test]
fn rows_expire_after_access() {
    let (mut h, f) = harness(
        OutputMode::Unordered,
        cache(16).with_expire_after_access(10 * MS),
        true,
    );
    record(&mut h, 0, 1);
    for id in 1..=4 {
        h.advance_time(8 * MS).unwrap();
        record(&mut h, id, 1); // hits at 8, 16, 24, 32 ms: each within 10 ms of the last
    }
    h.advance_time(10 * MS).unwrap();
    record(&mut h, 5, 1); // 42 ms, 10 ms after the last hit: expired
    assert_eq!(f.call_ids(), vec![0, 5]);
    let m = h.operator().metrics();
    assert_eq!((m.cache_hits, m.cache_misses), (4, 2));
}

/// At `rows_max` rows, storing another evicts the least recently used (hits count as
/// use): the evicted key calls again, the others hit.
#[test]
fn the_least_recently_used_row_is_evicted() {
    let (mut h, f) = harness(OutputMode::Unordered, cache(2), true);
    record(&mut h, 0, 1);
    record(&mut h, 1, 2);
    record(&mut h, 2, 1); // hit: key 2 is now the least recently used
    record(&mut h, 3, 3); // evicts key 2
    assert_eq!(h.operator().metrics().cache_entries, 2);
    record(&mut h, 4, 1); // hit
    record(&mut h, 5, 3); // hit
    record(&mut h, 6, 2); // evicted: calls (and evicts key 1)
    assert_eq!(f.call_ids(), vec![0, 1, 3, 6]);
    let m = h.operator().metrics();
    assert_eq!((m.cache_hits, m.cache_misses, m.cache_entries), (3, 4, 2));
}

/// A call completed with no results is cached by default (its hits emit nothing, like
/// the call), and not with `cache_missing_key` off.
#[test]
fn missing_keys_cached_per_the_flag() {
    let key = MISSING_FROM;
    let (mut h, f) = harness(OutputMode::Ordered, cache(16), true);
    record(&mut h, 0, key);
    record(&mut h, 1, key);
    record(&mut h, 2, 1);
    assert_eq!(f.call_ids(), vec![0, 2]);
    assert_eq!(seen(&mut h), vec![R(2, value_of(1))]);
    let m = h.operator().metrics();
    assert_eq!((m.cache_hits, m.cache_loads, m.cache_entries), (1, 2, 2));
    assert_eq!((m.completed, m.emitted), (3, 3));

    let (mut h, f) = harness(
        OutputMode::Ordered,
        cache(16).with_cache_missing_key(false),
        true,
    );
    record(&mut h, 0, key);
    record(&mut h, 1, key);
    assert_eq!(f.call_ids(), vec![0, 1]);
    assert_eq!(seen(&mut h), vec![]);
    let m = h.operator().metrics();
    assert_eq!((m.cache_hits, m.cache_loads, m.cache_entries), (0, 0, 0));
}

/// An error is not cached: the retry that succeeds is, with its load time counted from
/// the first invocation; without a retry the error fails the operator and nothing is
/// stored.
#[test]
fn errors_are_not_cached() {
    let function = Lookup::default();
    function.inline.set(true);
    function.fail_next.set(1);
    let config = AsyncConfig::new(OutputMode::Unordered, 8)
        .with_retry(RetryStrategy::fixed_delay(2, 3 * MS).retry_on_any_error())
        .with_cache(cache(16));
    let mut h = AsyncHarness::new(function.clone(), config).unwrap();
    record(&mut h, 0, 1); // fails, retried after 3 ms
    assert_eq!(h.operator().metrics().cache_entries, 0);
    h.advance_time(3 * MS).unwrap();
    assert_eq!(seen(&mut h), vec![R(0, value_of(1))]);
    record(&mut h, 1, 1);
    assert_eq!(
        function.call_ids(),
        vec![0, 0],
        "a call and its retry; then a hit"
    );
    let m = h.operator().metrics();
    assert_eq!((m.cache_hits, m.cache_misses, m.cache_loads), (1, 1, 1));
    assert_eq!(m.cache_load_ns, (3 * MS).as_nanos() as u64);

    let (mut h, f) = harness(OutputMode::Unordered, cache(16), true);
    f.fail_next.set(1);
    let failed = h.process_record((0, 1), Some(0));
    assert!(matches!(
        failed,
        Err(OperatorError::Async(AsyncError::Call(_)))
    ));
    let m = h.operator().metrics();
    assert_eq!((m.cache_loads, m.cache_entries), (0, 0));
}

/// A timed-out call's fallback (its timeout hook's result) is not cached; a result the
/// retry strategy rejects is not cached either, even when it stands for lack of
/// attempts.
#[test]
fn timeouts_and_rejected_results_are_not_cached() {
    let function = Lookup::default();
    let config = AsyncConfig::new(OutputMode::Unordered, 8)
        .with_timeout(5 * MS)
        .with_cache(cache(16));
    let mut h = AsyncHarness::new(function.clone(), config).unwrap();
    record(&mut h, 0, 1);
    h.advance_time(5 * MS).unwrap();
    assert_eq!(
        seen(&mut h),
        vec![R(0, u32::MAX)],
        "the timeout hook's fallback"
    );
    function.inline.set(true);
    record(&mut h, 1, 1);
    assert_eq!(
        function.call_ids(),
        vec![0, 1],
        "the fallback was not cached"
    );
    assert_eq!(seen(&mut h), vec![R(1, value_of(1))]);
    assert_eq!(h.operator().metrics().cache_loads, 1);

    let function = Lookup::default();
    function.inline.set(true);
    let config = AsyncConfig::new(OutputMode::Unordered, 8)
        .with_retry(RetryStrategy::fixed_delay(2, MS).retry_on_result(|r: &[Out]| r.is_empty()))
        .with_cache(cache(16));
    let mut h = AsyncHarness::new(function.clone(), config).unwrap();
    record(&mut h, 0, MISSING_FROM); // empty, retried once, stands empty
    h.advance_time(MS).unwrap();
    record(&mut h, 1, MISSING_FROM);
    assert_eq!(function.call_ids(), vec![0, 0, 1]);
    assert_eq!(h.operator().metrics().cache_entries, 0);
}

/// Bad settings are refused when the operator is built, saying what to fix.
#[test]
fn bad_cache_settings_are_config_errors() {
    let build = |cache: LookupCache<In, u32, Out>| {
        AsyncHarness::new(
            Lookup::default(),
            AsyncConfig::new(OutputMode::Ordered, 4).with_cache(cache),
        )
        .map(|_| ())
    };
    let zero = build(cache(0)).unwrap_err();
    assert_eq!(
        zero,
        ConfigError::ZeroCapacity {
            what: "lookup cache rows_max"
        }
    );
    assert_eq!(
        zero.to_string(),
        "lookup cache rows_max must be at least 1, got 0"
    );
    assert!(matches!(
        build(cache(LOOKUP_CACHE_ROWS_MAX + 1)),
        Err(ConfigError::TooLarge { .. })
    ));
    assert!(matches!(
        build(cache(4).with_expire_after_write(Duration::ZERO)),
        Err(ConfigError::Inconsistent(_))
    ));
    // A cache made for another input type than the function's.
    let other = LookupCache::new(4, |input: &u64| *input);
    let wrong = AsyncHarness::new(
        Lookup::default(),
        AsyncConfig::new(OutputMode::Ordered, 4).with_cache(other),
    )
    .unwrap_err();
    assert!(wrong.to_string().contains("another input type"), "{wrong}");
}

/// The cache is not state: a snapshot holds the records in flight only, and an operator
/// restored from it starts with an empty cache.
#[test]
fn a_restored_operator_starts_cold() {
    let (mut h, f) = harness(OutputMode::Ordered, cache(16), true);
    record(&mut h, 0, 1);
    f.inline.set(false);
    record(&mut h, 1, 2);
    let snapshot = h.snapshot();
    assert_eq!(snapshot.len(), 1);
    drop(h);
    let function = Lookup::default();
    function.inline.set(true);
    let config = AsyncConfig::new(OutputMode::Ordered, 8).with_cache(cache(16));
    let mut h = AsyncHarness::restore(function.clone(), config, snapshot).unwrap();
    record(&mut h, 2, 1);
    assert_eq!(function.call_ids(), vec![1, 2], "key 1 is loaded again");
    assert_eq!(seen(&mut h), vec![R(1, value_of(2)), R(2, value_of(1))]);
}

// ---------------------------------------------------------------------------------------
// Property test: a cached run against an uncached one.

#[derive(Debug, Clone)]
enum Action {
    /// A record of `key`; its call (if made) completes inside `invoke` when `inline`.
    Record {
        key: u32,
        inline: bool,
    },
    Watermark,
    /// Answer the `pick`-th pending call.
    Complete {
        pick: usize,
    },
    Advance {
        ms: u64,
    },
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => (prop_oneof![0u32..4, Just(MISSING_FROM)], any::<bool>())
            .prop_map(|(key, inline)| Action::Record { key, inline }),
        1 => Just(Action::Watermark),
        5 => any::<usize>().prop_map(|pick| Action::Complete { pick }),
        1 => (1u64..8).prop_map(|ms| Action::Advance { ms }),
    ]
}

fn mode() -> impl Strategy<Value = OutputMode> {
    prop_oneof![
        Just(OutputMode::Ordered),
        Just(OutputMode::Unordered),
        Just(OutputMode::KeyedOrdered)
    ]
}

/// What a run emitted, and the calls it made.
struct Run {
    output: Vec<Seen>,
    calls: usize,
    records: u32,
    hits: u64,
    misses: u64,
    loads: u64,
}

/// Runs `actions` (records and watermarks wait while the operator is full, answering
/// the oldest call), then answers every call left and finishes.
fn run(
    mode: OutputMode,
    capacity: usize,
    cache: Option<LookupCache<In, u32, Out>>,
    actions: &[Action],
) -> Run {
    let function = Lookup::default();
    let mut config = AsyncConfig::new(mode, capacity);
    if let Some(cache) = cache {
        config = config.with_cache(cache);
    }
    let mut h = AsyncHarness::new(function.clone(), config).unwrap();
    let mut next_id = 0;
    let mut watermarks = 0;
    for action in actions {
        if matches!(action, Action::Record { .. } | Action::Watermark) {
            while h.in_flight() >= capacity {
                let oldest = function.pending.borrow()[0].0 .0;
                function.complete(oldest);
                h.run_mailbox().unwrap();
            }
        }
        match *action {
            Action::Record { key, inline } => {
                function.inline.set(inline);
                record(&mut h, next_id, key);
                next_id += 1;
            }
            Action::Watermark => {
                watermarks += 1;
                h.process_watermark(watermarks).unwrap();
            }
            Action::Complete { pick } => {
                let id = {
                    let pending = function.pending.borrow();
                    (!pending.is_empty()).then(|| pending[pick % pending.len()].0 .0)
                };
                if let Some(id) = id {
                    function.complete(id);
                    h.run_mailbox().unwrap();
                }
            }
            Action::Advance { ms } => h.advance_time(MS * ms as u32).unwrap(),
        }
    }
    function.inline.set(true);
    let pending: Vec<u32> = function.pending.borrow().iter().map(|p| p.0 .0).collect();
    for id in pending.into_iter().rev() {
        function.complete(id);
    }
    h.finish().unwrap();
    assert_eq!(h.in_flight(), 0);
    let m = h.operator().metrics().clone();
    let calls = function.calls.borrow().len();
    Run {
        output: seen(&mut h),
        calls,
        records: next_id,
        hits: m.cache_hits,
        misses: m.cache_misses,
        loads: m.cache_loads,
    }
}

/// Per input id: its results and the number of watermarks emitted before them.
fn by_input(output: &[Seen]) -> BTreeMap<u32, (Vec<u32>, usize)> {
    let mut per_id: BTreeMap<u32, (Vec<u32>, usize)> = BTreeMap::new();
    let mut watermarks = 0;
    for seen in output {
        match *seen {
            W(_) => watermarks += 1,
            R(id, value) => {
                let entry = per_id.entry(id).or_insert((Vec::new(), watermarks));
                entry.0.push(value);
            }
        }
    }
    per_id
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// With random keys (missing ones included), completion orders, watermarks, time
    /// and cache sizes and expiry, a cached run emits for every input exactly what an
    /// uncached run does (once, between the same watermarks), in the same order where
    /// the mode fixes it; every record is a hit or a miss, and only misses call.
    #[test]
    fn cached_output_equals_uncached(
        mode in mode(),
        capacity in 1usize..6,
        rows_max in 1usize..5,
        expire_ms in prop::option::of(1u64..20),
        cache_missing in any::<bool>(),
        actions in prop::collection::vec(action(), 0..80),
    ) {
        let mut cached = cache(rows_max).with_cache_missing_key(cache_missing);
        if let Some(ms) = expire_ms {
            cached = cached.with_expire_after_write(MS * ms as u32);
        }
        let plain = run(mode, capacity, None, &actions);
        let with = run(mode, capacity, Some(cached), &actions);

        prop_assert_eq!(with.records, plain.records);
        let (a, b) = (by_input(&plain.output), by_input(&with.output));
        prop_assert_eq!(&a, &b);
        // Every input with a value was emitted once, with its key's value.
        let emitted: usize = b.values().map(|(values, _)| values.len()).sum();
        prop_assert!(b.values().all(|(values, _)| values.len() == 1));
        prop_assert_eq!(
            emitted,
            plain.output.iter().filter(|s| matches!(s, R(..))).count()
        );
        match mode {
            // Input order: the same sequence, watermarks included.
            OutputMode::Ordered => prop_assert_eq!(&with.output, &plain.output),
            OutputMode::KeyedOrdered | OutputMode::Unordered => {
                let watermarks = |o: &[Seen]| o.iter().filter(|s| matches!(s, W(_))).count();
                prop_assert_eq!(watermarks(&with.output), watermarks(&plain.output));
            }
        }
        if mode == OutputMode::KeyedOrdered {
            let order = |o: &[Seen]| {
                let mut per_key: HashMap<u32, Vec<u32>> = HashMap::new();
                for s in o {
                    if let R(id, value) = *s {
                        per_key.entry(value).or_default().push(id);
                    }
                }
                per_key
            };
            prop_assert_eq!(order(&with.output), order(&plain.output));
        }
        prop_assert_eq!(plain.calls, plain.records as usize);
        prop_assert_eq!(with.hits + with.misses, u64::from(with.records));
        prop_assert_eq!(with.calls as u64, with.misses);
        prop_assert!(with.loads <= with.misses);
    }
}
