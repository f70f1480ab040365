//! Property tests of the async operator: random completion orders, watermark
//! placements, results per call, failures with retries, timeouts and capacities. For
//! every mode: each input is emitted exactly once (or the operator failed), ordered
//! output keeps input order, keyed output keeps per-key order, no record crosses a
//! watermark, and nothing is left behind after `finish`.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;

use proptest::prelude::*;
use weir_engine::async_io::{
    AsyncConfig, AsyncError, AsyncFunction, AsyncHarness, OutputMode, ResultFuture, RetryStrategy,
};
use weir_engine::element::StreamElement;

/// Input: (id, key).
type In = (u32, u32);
/// Calls waiting for the test to complete them.
type Pending = Rc<RefCell<Vec<(In, ResultFuture<u32>)>>>;
/// Per input id, the result counts of every successful completion handed to one of its
/// calls (stale ones included): the count that stood must be one of them.
type Delivered = Rc<RefCell<HashMap<u32, Vec<u32>>>>;

#[derive(Clone, Default)]
struct Driven {
    pending: Pending,
    /// At end of input, complete every call at once with one result.
    finishing: Rc<Cell<bool>>,
    /// Complete the next call inside `invoke`: with this many results, or (`true`) an error.
    inline: Rc<Cell<Option<(u32, bool)>>>,
    delivered: Delivered,
}

impl Driven {
    fn deliver(&self, id: u32, count: u32) {
        self.delivered
            .borrow_mut()
            .entry(id)
            .or_default()
            .push(count);
    }
}

impl AsyncFunction for Driven {
    type In = In;
    type Out = u32;
    fn invoke(&mut self, input: &In, result: ResultFuture<u32>) {
        if self.finishing.get() {
            self.deliver(input.0, 1);
            result.complete([input.0 * 10]);
        } else if let Some((count, fail)) = self.inline.take() {
            if fail {
                result.complete_err(AsyncError::call("injected inline"));
            } else {
                self.deliver(input.0, count);
                result.complete((0..count).map(|j| input.0 * 10 + j));
            }
        } else {
            self.pending.borrow_mut().push((*input, result));
        }
    }
    fn timeout(&mut self, input: &In, result: ResultFuture<u32>) {
        // A fallback result marks the timed-out input.
        self.deliver(input.0, 1);
        result.complete([input.0 * 10 + 9]);
    }
    fn key(&self, input: &In) -> u64 {
        u64::from(input.1)
    }
}

#[derive(Debug, Clone)]
enum Action {
    Record {
        key: u32,
    },
    /// A record whose call completes inside `invoke` (a cache hit): `count` results, or
    /// an error.
    InlineRecord {
        key: u32,
        count: u32,
        fail: bool,
    },
    Watermark,
    /// Complete the `pick`-th pending call with `count` results, or fail it.
    Complete {
        pick: usize,
        count: u32,
        fail: bool,
    },
    Advance {
        ms: u64,
    },
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => (0u32..3).prop_map(|key| Action::Record { key }),
        2 => (0u32..3, 0u32..3, prop::bool::weighted(0.1))
            .prop_map(|(key, count, fail)| Action::InlineRecord { key, count, fail }),
        1 => Just(Action::Watermark),
        5 => (any::<usize>(), 0u32..3, prop::bool::weighted(0.15))
            .prop_map(|(pick, count, fail)| Action::Complete { pick, count, fail }),
        1 => (1u64..30).prop_map(|ms| Action::Advance { ms }),
    ]
}

fn mode() -> impl Strategy<Value = OutputMode> {
    prop_oneof![
        Just(OutputMode::Ordered),
        Just(OutputMode::Unordered),
        Just(OutputMode::KeyedOrdered)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn emission_rules_hold(
        mode in mode(),
        capacity in 1usize..6,
        timeout_ms in prop::option::of(5u64..60),
        retry_attempts in prop::option::of(2u32..4),
        actions in prop::collection::vec(action(), 0..80),
    ) {
        let function = Driven::default();
        let mut config = AsyncConfig::new(mode, capacity);
        if let Some(ms) = timeout_ms {
            config = config.with_timeout(Duration::from_millis(ms));
        }
        if let Some(attempts) = retry_attempts {
            config = config.with_retry(
                RetryStrategy::fixed_delay(attempts, Duration::from_millis(3)).retry_on_any_error(),
            );
        }
        let mut h = AsyncHarness::new(function.clone(), config).unwrap();
        let mut next_id = 0u32;
        let mut keys: HashMap<u32, u32> = HashMap::new();
        // For each record id, the number of watermarks that came before it in the input.
        let mut watermarks_before: HashMap<u32, usize> = HashMap::new();
        let mut watermarks_in = 0usize;
        let mut failed = false;
        for action in actions {
            let result = match action {
                Action::Record { key } if h.in_flight() < capacity => {
                    let id = next_id;
                    next_id += 1;
                    keys.insert(id, key);
                    watermarks_before.insert(id, watermarks_in);
                    h.process_record((id, key), Some(i64::from(id)))
                }
                Action::InlineRecord { key, count, fail } if h.in_flight() < capacity => {
                    let id = next_id;
                    next_id += 1;
                    keys.insert(id, key);
                    watermarks_before.insert(id, watermarks_in);
                    function.inline.set(Some((count, fail)));
                    h.process_record((id, key), Some(i64::from(id)))
                }
                Action::Watermark if h.in_flight() < capacity => {
                    watermarks_in += 1;
                    h.process_watermark(watermarks_in as i64)
                }
                Action::Complete { pick, count, fail } => {
                    let taken = {
                        let mut pending = function.pending.borrow_mut();
                        if pending.is_empty() { None } else { let i = pick % pending.len(); Some(pending.swap_remove(i)) }
                    };
                    match taken {
                        Some(((id, _), handle)) => {
                            if fail {
                                handle.complete_err(AsyncError::call("injected"));
                            } else {
                                function.deliver(id, count);
                                handle.complete((0..count).map(|j| id * 10 + j));
                            }
                            h.run_mailbox()
                        }
                        None => Ok(()),
                    }
                }
                Action::Advance { ms } => h.advance_time(Duration::from_millis(ms)),
                _ => Ok(()),
            };
            if result.is_err() {
                failed = true;
                break;
            }
            prop_assert!(h.in_flight() <= capacity);
            // Timer bookkeeping: at most a timeout and a retry delay per element held, and
            // nothing left overdue (every timer due by now has fired).
            prop_assert!(h.pending_timers() <= 2 * capacity);
            if let Some(deadline) = h.operator().next_timer_deadline() {
                prop_assert!(deadline > h.now_ns(), "a timer due at {} left at {}", deadline, h.now_ns());
            }
        }
        if !failed {
            // End of input: outstanding calls complete with one result each.
            function.finishing.set(true);
            let pending: Vec<_> = function.pending.borrow_mut().drain(..).collect();
            for ((id, _), handle) in pending {
                function.deliver(id, 1);
                handle.complete([id * 10]);
            }
            failed = h.finish().is_err();
            if !failed {
                prop_assert_eq!(h.pending_timers(), 0);
                prop_assert_eq!(h.operator().next_timer_deadline(), None);
            }
        }
        let output = h.take_output();
        drop(h);

        // Group the output records by input id (timestamp = id); check the rules.
        let mut emitted_ids: Vec<u32> = Vec::new();
        let mut per_id: BTreeMap<u32, usize> = BTreeMap::new();
        let mut watermarks_out = 0usize;
        let mut last_watermark = 0i64;
        for element in &output {
            match element {
                StreamElement::Watermark(w) => {
                    watermarks_out += 1;
                    prop_assert!(w.0 > last_watermark, "watermarks out of order");
                    last_watermark = w.0;
                }
                StreamElement::Record(r) => {
                    let id = r.timestamp.expect("records carry the input timestamp") as u32;
                    prop_assert_eq!(r.value / 10, id, "a result carries its input's timestamp");
                    prop_assert_eq!(watermarks_before[&id], watermarks_out, "record {} crossed a watermark", id);
                    if emitted_ids.last() != Some(&id) {
                        prop_assert!(!per_id.contains_key(&id), "input {} emitted twice", id);
                        emitted_ids.push(id);
                    }
                    *per_id.entry(id).or_default() += 1;
                }
            }
        }
        match mode {
            OutputMode::Ordered => {
                prop_assert!(emitted_ids.windows(2).all(|w| w[0] < w[1]), "ordered: {:?}", emitted_ids);
            }
            OutputMode::KeyedOrdered => {
                let mut last: HashMap<u32, u32> = HashMap::new();
                for id in &emitted_ids {
                    let key = keys[id];
                    if let Some(previous) = last.insert(key, *id) {
                        prop_assert!(previous < *id, "keyed: key {} emitted {} after {}", key, id, previous);
                    }
                }
            }
            OutputMode::Unordered => {}
        }
        if !failed {
            // Exactly once: every input's records form one group whose size is the count
            // of a completion it was given (the one that stood: first call, retry,
            // timeout fallback or the end-of-input call). An input emits nothing only if
            // a zero-result completion was among them; one that was only ever given
            // results is emitted. Every watermark passed.
            prop_assert_eq!(watermarks_out, watermarks_in);
            let delivered = function.delivered.borrow();
            for id in 0..next_id {
                let counts = delivered.get(&id).map(Vec::as_slice).unwrap_or(&[]);
                let emitted = per_id.get(&id).copied().unwrap_or(0) as u32;
                prop_assert!(
                    counts.contains(&emitted),
                    "input {} emitted {} records; its completions had {:?}", id, emitted, counts
                );
            }
            prop_assert!(per_id.keys().all(|id| *id < next_id));
        }
    }
}

/// Without zero-result completions, retries or timeouts, every input is emitted exactly
/// once: a direct count, complementing the rules above.
#[test]
fn every_input_emitted_exactly_once_under_random_completion() {
    use proptest::test_runner::{Config, TestRunner};
    let mut runner = TestRunner::new(Config {
        cases: 128,
        ..Config::default()
    });
    runner
        .run(
            &(
                mode(),
                1usize..8,
                prop::collection::vec(any::<usize>(), 1..60),
            ),
            |(mode, capacity, picks)| {
                let function = Driven::default();
                let mut h =
                    AsyncHarness::new(function.clone(), AsyncConfig::new(mode, capacity)).unwrap();
                let total = picks.len() as u32;
                let mut picks = picks.into_iter();
                for id in 0..total {
                    while h.in_flight() >= capacity {
                        let pick = picks.next().unwrap_or(0);
                        let ((done, _), handle) = {
                            let mut pending = function.pending.borrow_mut();
                            let i = pick % pending.len();
                            pending.swap_remove(i)
                        };
                        handle.complete([done * 10]);
                        h.run_mailbox().unwrap();
                    }
                    h.process_record((id, id % 3), Some(i64::from(id))).unwrap();
                }
                function.finishing.set(true);
                let pending: Vec<_> = function.pending.borrow_mut().drain(..).collect();
                for ((id, _), handle) in pending.into_iter().rev() {
                    handle.complete([id * 10]);
                }
                h.finish().unwrap();
                prop_assert_eq!(h.in_flight(), 0);
                prop_assert_eq!(h.pending_timers(), 0);
                let mut ids: Vec<u32> = h
                    .take_output()
                    .iter()
                    .map(|e| e.as_record().unwrap().value / 10)
                    .collect();
                ids.sort_unstable();
                prop_assert_eq!(ids, (0..total).collect::<Vec<_>>());
                Ok(())
            },
        )
        .unwrap();
}
