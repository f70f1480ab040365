//! The async operator through its harness: the scenarios of Flink's
//! `AsyncWaitOperatorTest`, `OrderedStreamElementQueueTest`,
//! `UnorderedStreamElementQueueTest` and the retry tests, written for Weir's API.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use weir_engine::async_io::{
    AsyncConfig, AsyncError, AsyncFunction, AsyncHarness, OperatorError, OutputMode, ResultFuture,
    RetryStrategy,
};
use weir_engine::element::StreamElement;
use weir_engine::ConfigError;

const MS: Duration = Duration::from_millis(1);

fn rec<T>(value: T, ts: i64) -> StreamElement<T> {
    StreamElement::record(value, Some(ts))
}

fn wm<T>(ts: i64) -> StreamElement<T> {
    StreamElement::watermark(ts)
}

/// Calls waiting for the test to complete them, with their input.
type Pending = Rc<RefCell<VecDeque<(u32, ResultFuture<u32>)>>>;
/// The input of every attempt made, in order.
type Attempts = Rc<RefCell<Vec<u32>>>;

/// Keeps every handle so the test completes them in the order it chooses.
#[derive(Clone, Default)]
struct Stash {
    pending: Pending,
    timeouts: Rc<RefCell<Vec<u32>>>,
    /// What the timeout hook does: `None` = default (fail), `Some(v)` = complete with v.
    timeout_value: Option<u32>,
}

impl Stash {
    /// Completes the handle for `input` (the oldest one for it) with `input * 10`.
    fn complete(&self, input: u32) {
        let handle = self.take(input);
        handle.complete([input * 10]);
    }

    fn take(&self, input: u32) -> ResultFuture<u32> {
        let mut pending = self.pending.borrow_mut();
        let at = pending
            .iter()
            .position(|(i, _)| *i == input)
            .expect("no handle for input");
        pending.remove(at).expect("position is valid").1
    }

    fn len(&self) -> usize {
        self.pending.borrow().len()
    }
}

impl AsyncFunction for Stash {
    type In = u32;
    type Out = u32;
    fn invoke(&mut self, input: &u32, result: ResultFuture<u32>) {
        self.pending.borrow_mut().push_back((*input, result));
    }
    fn timeout(&mut self, input: &u32, result: ResultFuture<u32>) {
        self.timeouts.borrow_mut().push(*input);
        match self.timeout_value {
            Some(value) => result.complete([value]),
            None => result.complete_err(AsyncError::Timeout),
        }
    }
    fn key(&self, input: &u32) -> u64 {
        u64::from(*input / 100)
    }
}

fn harness(mode: OutputMode, capacity: usize) -> (AsyncHarness<Stash>, Stash) {
    let stash = Stash::default();
    let h = AsyncHarness::new(stash.clone(), AsyncConfig::new(mode, capacity)).unwrap();
    (h, stash)
}

/// Ordered mode emits strictly in input order, whatever the completion order, and a
/// watermark waits for the records before it (Flink: testEventTimeOrdered).
#[test]
fn ordered_mode_emits_in_input_order() {
    let (mut h, stash) = harness(OutputMode::Ordered, 10);
    h.process_record(1, Some(1)).unwrap();
    h.process_record(2, Some(2)).unwrap();
    h.process_watermark(2).unwrap();
    h.process_record(3, Some(3)).unwrap();
    assert_eq!(h.in_flight(), 4);
    stash.complete(3);
    stash.complete(2);
    h.run_mailbox().unwrap();
    assert!(h.take_output().is_empty(), "1 is still pending");
    stash.complete(1);
    h.run_mailbox().unwrap();
    assert_eq!(
        h.take_output(),
        vec![rec(10, 1), rec(20, 2), wm(2), rec(30, 3)]
    );
    assert_eq!(h.in_flight(), 0);
}

/// Unordered mode emits in completion order, but records never cross a watermark
/// (Flink: testEventTimeUnordered, UnorderedStreamElementQueueTest#testCompletionOrder).
#[test]
fn unordered_mode_is_fenced_by_watermarks() {
    let (mut h, stash) = harness(OutputMode::Unordered, 10);
    for (i, ts) in [(1, 1), (2, 2)] {
        h.process_record(i, Some(ts)).unwrap();
    }
    h.process_watermark(5).unwrap();
    for (i, ts) in [(3, 6), (4, 7)] {
        h.process_record(i, Some(ts)).unwrap();
    }
    h.process_watermark(9).unwrap();
    h.process_record(5, Some(10)).unwrap();
    stash.complete(4);
    stash.complete(5);
    h.run_mailbox().unwrap();
    assert!(
        h.take_output().is_empty(),
        "later segments wait for the first"
    );
    stash.complete(2);
    h.run_mailbox().unwrap();
    assert_eq!(h.take_output(), vec![rec(20, 2)]);
    stash.complete(3);
    h.run_mailbox().unwrap();
    assert!(h.take_output().is_empty());
    stash.complete(1);
    h.run_mailbox().unwrap();
    assert_eq!(
        h.take_output(),
        vec![
            rec(10, 1),
            wm(5),
            rec(40, 7),
            rec(30, 6),
            wm(9),
            rec(50, 10)
        ]
    );
}

/// Processing-time unordered mode (no watermarks) is pure completion order.
#[test]
fn unordered_without_watermarks_is_completion_order() {
    let (mut h, stash) = harness(OutputMode::Unordered, 10);
    for i in 1..=4 {
        h.process_record(i, None).unwrap();
    }
    for i in [3, 1, 4, 2] {
        stash.complete(i);
        h.run_mailbox().unwrap();
    }
    let values: Vec<u32> = h
        .take_output()
        .into_iter()
        .map(|e| e.as_record().unwrap().value)
        .collect();
    assert_eq!(values, vec![30, 10, 40, 20]);
}

/// Keyed-ordered mode keeps order per key only: a slow key holds back nothing else, and
/// watermarks fence every key.
#[test]
fn keyed_ordered_keeps_order_per_key_only() {
    let (mut h, stash) = harness(OutputMode::KeyedOrdered, 10);
    // Keys are input / 100: 101, 102 -> key 1; 201, 202 -> key 2.
    for i in [101, 201, 102, 202] {
        h.process_record(i, None).unwrap();
    }
    h.process_watermark(7).unwrap();
    h.process_record(203, None).unwrap();
    stash.complete(202);
    stash.complete(203);
    h.run_mailbox().unwrap();
    assert!(h.take_output().is_empty(), "202 waits for 201");
    stash.complete(201);
    h.run_mailbox().unwrap();
    assert_eq!(
        h.take_output(),
        vec![
            StreamElement::record(2010, None),
            StreamElement::record(2020, None)
        ]
    );
    stash.complete(102);
    h.run_mailbox().unwrap();
    assert!(h.take_output().is_empty(), "102 waits for 101");
    stash.complete(101);
    h.run_mailbox().unwrap();
    assert_eq!(
        h.take_output(),
        vec![
            StreamElement::record(1010, None),
            StreamElement::record(1020, None),
            wm(7),
            StreamElement::record(2030, None)
        ]
    );
}

/// A watermark with nothing before it passes at once; one behind a pending record takes
/// a slot of capacity (Flink counts watermarks in the queue).
#[test]
fn watermarks_take_capacity() {
    let (mut h, stash) = harness(OutputMode::Unordered, 2);
    h.process_watermark(1).unwrap();
    assert_eq!(h.take_output(), vec![wm(1)]);
    assert_eq!(h.in_flight(), 0);
    h.process_record(1, Some(2)).unwrap();
    h.process_watermark(3).unwrap();
    assert_eq!(h.in_flight(), 2);
    stash.complete(1);
    h.run_mailbox().unwrap();
    assert_eq!(h.take_output(), vec![rec(10, 2), wm(3)]);
    assert_eq!(h.in_flight(), 0);
}

/// Completions made inside `invoke` are processed before `process_record` returns;
/// outputs carry the input's timestamp; several results and no result are both fine.
#[test]
fn immediate_completion_and_result_counts() {
    struct Fanout;
    impl AsyncFunction for Fanout {
        type In = u32;
        type Out = u32;
        fn invoke(&mut self, input: &u32, result: ResultFuture<u32>) {
            result.complete(0..*input);
        }
    }
    let mut h = AsyncHarness::new(Fanout, AsyncConfig::new(OutputMode::Ordered, 1)).unwrap();
    h.process_record(3, Some(42)).unwrap();
    assert_eq!(h.take_output(), vec![rec(0, 42), rec(1, 42), rec(2, 42)]);
    h.process_record(0, Some(43)).unwrap();
    assert!(h.take_output().is_empty(), "an empty result emits nothing");
    h.process_record(1, None).unwrap();
    assert_eq!(h.take_output(), vec![StreamElement::record(0, None)]);
    h.finish().unwrap();
}

/// With the default timeout hook, a call that does not complete in time fails the
/// operator, and every later call reports the failure (Flink: testAsyncTimeoutFailure).
#[test]
fn timeout_fails_the_operator_by_default() {
    let stash = Stash::default();
    let config = AsyncConfig::new(OutputMode::Ordered, 4).with_timeout(10 * MS);
    let mut h = AsyncHarness::new(stash.clone(), config).unwrap();
    h.process_record(1, None).unwrap();
    assert_eq!(h.pending_timers(), 1);
    h.advance_time(9 * MS).unwrap();
    let error = h.advance_time(MS).unwrap_err();
    assert!(
        matches!(error, OperatorError::Async(AsyncError::Timeout)),
        "{error}"
    );
    assert!(error.to_string().contains("timed out"), "{error}");
    let again = h.process_record(2, None).unwrap_err();
    assert!(matches!(again, OperatorError::Failed { .. }), "{again}");
    assert!(again.to_string().contains("timed out"), "{again}");
}

/// A timeout hook that completes with a fallback decides the element; the real result
/// arriving later is ignored; the timer is gone (Flink: testAsyncTimeoutIgnore,
/// testTimeoutAfterComplete).
#[test]
fn timeout_hook_wins_and_late_results_are_ignored() {
    let stash = Stash {
        timeout_value: Some(999),
        ..Stash::default()
    };
    let config = AsyncConfig::new(OutputMode::Ordered, 4).with_timeout(10 * MS);
    let mut h = AsyncHarness::new(stash.clone(), config).unwrap();
    h.process_record(1, Some(1)).unwrap();
    h.process_record(2, Some(2)).unwrap();
    stash.complete(2);
    h.advance_time(10 * MS).unwrap();
    assert_eq!(
        *stash.timeouts.borrow(),
        vec![1],
        "2 completed before its timeout"
    );
    assert_eq!(h.take_output(), vec![rec(999, 1), rec(20, 2)]);
    stash.complete(1);
    h.run_mailbox().unwrap();
    assert!(h.take_output().is_empty(), "the late result is ignored");
    assert_eq!(h.pending_timers(), 0);
    assert_eq!(h.operator().metrics().timed_out, 1);
}

/// Completing an element cancels its timeout timer (Flink: testTimeoutCleanup).
#[test]
fn completion_cancels_the_timer() {
    let stash = Stash::default();
    let config = AsyncConfig::new(OutputMode::Unordered, 4).with_timeout(10 * MS);
    let mut h = AsyncHarness::new(stash.clone(), config).unwrap();
    h.process_record(1, None).unwrap();
    h.process_record(2, None).unwrap();
    assert_eq!(h.pending_timers(), 2);
    stash.complete(1);
    h.run_mailbox().unwrap();
    assert_eq!(h.pending_timers(), 1);
    stash.complete(2);
    h.run_mailbox().unwrap();
    assert_eq!(h.pending_timers(), 0);
    h.advance_time(100 * MS).unwrap();
    assert!(stash.timeouts.borrow().is_empty());
}

/// A user error fails the operator as soon as it is processed, even when its element
/// is behind a pending one in ordered mode (Flink: testOrderedWaitUserExceptionHandling).
#[test]
fn errors_fail_at_once_wherever_the_element_is() {
    for mode in [
        OutputMode::Ordered,
        OutputMode::Unordered,
        OutputMode::KeyedOrdered,
    ] {
        let (mut h, stash) = harness(mode, 4);
        h.process_record(1, None).unwrap();
        h.process_record(2, None).unwrap();
        stash
            .take(2)
            .complete_err(AsyncError::call("backend said no"));
        let error = h.run_mailbox().unwrap_err();
        assert!(
            error.to_string().contains("backend said no"),
            "{mode:?}: {error}"
        );
        assert!(h.finish().is_err());
    }
}

/// Dropping a handle without completing it is an error, not a silent hang.
#[test]
fn dropping_a_handle_fails_with_dropped() {
    struct Forgetful;
    impl AsyncFunction for Forgetful {
        type In = u32;
        type Out = u32;
        fn invoke(&mut self, _input: &u32, result: ResultFuture<u32>) {
            drop(result);
        }
    }
    let mut h = AsyncHarness::new(Forgetful, AsyncConfig::new(OutputMode::Ordered, 2)).unwrap();
    let error = h.process_record(1, None).unwrap_err();
    assert!(
        matches!(error, OperatorError::Async(AsyncError::Dropped)),
        "{error}"
    );
}

/// Fails the first `failures` attempts of each input, then succeeds; counts attempts.
struct Flaky {
    failures: u32,
    attempts: Attempts,
    empty_first: bool,
}

impl AsyncFunction for Flaky {
    type In = u32;
    type Out = u32;
    fn invoke(&mut self, input: &u32, result: ResultFuture<u32>) {
        let mut attempts = self.attempts.borrow_mut();
        let made = attempts.iter().filter(|i| *i == input).count() as u32;
        attempts.push(*input);
        if made < self.failures {
            if self.empty_first {
                result.complete([]);
            } else {
                result.complete_err(AsyncError::call(format!("attempt {made} failed")));
            }
        } else {
            result.complete([*input]);
        }
    }
}

fn flaky(failures: u32, empty_first: bool) -> (Flaky, Attempts) {
    let attempts = Rc::new(RefCell::new(Vec::new()));
    (
        Flaky {
            failures,
            attempts: Rc::clone(&attempts),
            empty_first,
        },
        attempts,
    )
}

/// A fixed-delay retry calls again after each delay and emits the eventual success;
/// `max_attempts` counts the first call.
#[test]
fn fixed_delay_retry_succeeds_within_attempts() {
    let (function, attempts) = flaky(2, false);
    let config = AsyncConfig::new(OutputMode::Ordered, 4)
        .with_retry(RetryStrategy::fixed_delay(3, 10 * MS).retry_on_any_error());
    let mut h = AsyncHarness::new(function, config).unwrap();
    h.process_record(7, Some(1)).unwrap();
    assert_eq!(attempts.borrow().len(), 1);
    assert_eq!(h.pending_timers(), 1, "the retry timer");
    h.advance_time(9 * MS).unwrap();
    assert_eq!(attempts.borrow().len(), 1, "not before the delay");
    h.advance_time(MS).unwrap();
    assert_eq!(attempts.borrow().len(), 2);
    h.advance_time(10 * MS).unwrap();
    assert_eq!(attempts.borrow().len(), 3);
    assert_eq!(h.take_output(), vec![rec(7, 1)]);
    assert_eq!(h.pending_timers(), 0);
    assert_eq!(h.operator().metrics().retried, 2);
}

/// When attempts run out, the last error stands and fails the operator.
#[test]
fn retries_exhausted_the_last_error_stands() {
    let (function, attempts) = flaky(5, false);
    let config = AsyncConfig::new(OutputMode::Ordered, 4)
        .with_retry(RetryStrategy::fixed_delay(3, MS).retry_on_any_error());
    let mut h = AsyncHarness::new(function, config).unwrap();
    h.process_record(1, None).unwrap();
    let error = h.advance_time(10 * MS).unwrap_err();
    assert_eq!(attempts.borrow().len(), 3);
    assert!(error.to_string().contains("attempt 2 failed"), "{error}");
}

/// A result predicate retries unwanted results; when attempts run out, the last result
/// stands (here: empty, so nothing is emitted, and the element is done).
#[test]
fn result_predicate_retries_and_last_result_stands() {
    let (function, attempts) = flaky(5, true);
    let strategy = RetryStrategy::fixed_delay(3, MS).retry_on_result(|r: &[u32]| r.is_empty());
    let config = AsyncConfig::new(OutputMode::Ordered, 4).with_retry(strategy);
    let mut h = AsyncHarness::new(function, config).unwrap();
    h.process_record(1, None).unwrap();
    h.advance_time(10 * MS).unwrap();
    assert_eq!(attempts.borrow().len(), 3);
    assert!(h.take_output().is_empty());
    assert_eq!(h.in_flight(), 0);
}

/// Flink's rule: without an error predicate, an error is not retried (only results
/// a result predicate names are); `retry_on_any_error` is the explicit retry-all.
#[test]
fn without_an_error_predicate_errors_are_not_retried() {
    let (function, attempts) = flaky(5, false);
    let config =
        AsyncConfig::new(OutputMode::Ordered, 4).with_retry(RetryStrategy::fixed_delay(3, MS));
    let mut h = AsyncHarness::new(function, config).unwrap();
    assert!(h.process_record(1, None).is_err());
    assert_eq!(attempts.borrow().len(), 1);
    assert_eq!(h.operator().metrics().retried, 0);
}

/// An error predicate that refuses fails at once, without retry.
#[test]
fn error_predicate_can_refuse() {
    let (function, attempts) = flaky(5, false);
    let strategy = RetryStrategy::fixed_delay(3, MS).retry_on_error(|_| false);
    let config = AsyncConfig::new(OutputMode::Ordered, 4).with_retry(strategy);
    let mut h = AsyncHarness::new(function, config).unwrap();
    assert!(h.process_record(1, None).is_err());
    assert_eq!(attempts.borrow().len(), 1);
}

/// Exponential backoff: the n-th retry waits min(initial × multiplier^(n-1), max).
#[test]
fn exponential_backoff_spaces_attempts() {
    let (function, attempts) = flaky(10, false);
    let strategy =
        RetryStrategy::exponential_backoff(5, 10 * MS, 25 * MS, 2.0).retry_on_any_error();
    let config = AsyncConfig::new(OutputMode::Ordered, 4).with_retry(strategy);
    let mut h = AsyncHarness::new(function, config).unwrap();
    h.process_record(1, None).unwrap();
    let mut seen = Vec::new();
    for _ in 0..80 {
        let before = attempts.borrow().len();
        let result = h.advance_time(MS);
        if attempts.borrow().len() > before {
            seen.push(h.now_ns() / 1_000_000);
        }
        if result.is_err() {
            break;
        }
    }
    // Retries at 10, 10+20=30, 30+25=55, 55+25=80 ms.
    assert_eq!(seen, vec![10, 30, 55, 80]);
}

/// The timeout covers all attempts: it fires while a retry waits, the retry never
/// runs, and the timeout hook's outcome stands.
#[test]
fn timeout_covers_retries() {
    let attempts = Rc::new(RefCell::new(Vec::new()));
    let function = Flaky {
        failures: 10,
        attempts: Rc::clone(&attempts),
        empty_first: false,
    };
    let config = AsyncConfig::new(OutputMode::Ordered, 4)
        .with_timeout(50 * MS)
        .with_retry(RetryStrategy::fixed_delay(10, 30 * MS).retry_on_any_error());
    let mut h = AsyncHarness::new(function, config).unwrap();
    h.process_record(1, None).unwrap();
    let error = h.advance_time(100 * MS).unwrap_err();
    assert!(
        matches!(error, OperatorError::Async(AsyncError::Timeout)),
        "{error}"
    );
    assert_eq!(
        attempts.borrow().len(),
        2,
        "attempts at 0 and 30 ms; the one at 60 never ran"
    );
    assert_eq!(h.pending_timers(), 0);
}

/// End of input attempts waiting retries at once and does not retry their results.
#[test]
fn finish_attempts_waiting_retries_once() {
    let (function, attempts) = flaky(1, false);
    let config = AsyncConfig::new(OutputMode::Ordered, 4)
        .with_retry(RetryStrategy::fixed_delay(5, 1000 * MS).retry_on_any_error());
    let mut h = AsyncHarness::new(function, config).unwrap();
    h.process_record(1, None).unwrap();
    h.process_record(2, None).unwrap();
    assert_eq!(attempts.borrow().len(), 2);
    h.finish().unwrap();
    assert_eq!(attempts.borrow().len(), 4);
    assert_eq!(
        h.take_output(),
        vec![
            StreamElement::record(1, None),
            StreamElement::record(2, None)
        ]
    );
    assert_eq!(h.now_ns(), 0, "no time had to pass");
    assert_eq!(h.pending_timers(), 0);

    let (function, attempts) = flaky(5, false);
    let config = AsyncConfig::new(OutputMode::Ordered, 4)
        .with_retry(RetryStrategy::fixed_delay(5, 1000 * MS).retry_on_any_error());
    let mut h = AsyncHarness::new(function, config).unwrap();
    h.process_record(1, None).unwrap();
    assert!(
        h.finish().is_err(),
        "the finishing attempt fails and is not retried"
    );
    assert_eq!(attempts.borrow().len(), 2);
}

/// Completes each call on another thread after a short delay.
struct Threaded {
    threads: Arc<AtomicUsize>,
}

impl AsyncFunction for Threaded {
    type In = u32;
    type Out = u32;
    fn invoke(&mut self, input: &u32, result: ResultFuture<u32>) {
        let input = *input;
        let threads = Arc::clone(&self.threads);
        threads.fetch_add(1, Ordering::Relaxed);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_micros(u64::from(input % 7) * 100));
            result.complete([input]);
            threads.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Back-pressure: at capacity the harness waits for completions from other threads;
/// every record comes out once, in order, and finish drains the rest.
#[test]
fn capacity_back_pressure_with_completions_from_other_threads() {
    let threads = Arc::new(AtomicUsize::new(0));
    let function = Threaded {
        threads: Arc::clone(&threads),
    };
    let mut h = AsyncHarness::new(function, AsyncConfig::new(OutputMode::Ordered, 3)).unwrap();
    for i in 0..60 {
        h.process_record(i, None).unwrap();
        assert!(h.in_flight() <= 3);
    }
    h.finish().unwrap();
    let values: Vec<u32> = h
        .take_output()
        .into_iter()
        .map(|e| e.as_record().unwrap().value)
        .collect();
    assert_eq!(values, (0..60).collect::<Vec<_>>());
    assert!(h.operator().metrics().backpressured_ns > 0);
}

/// A handle completed after its operator is gone does nothing (no panic, no leak).
#[test]
fn completing_after_the_operator_is_gone_is_harmless() {
    let (mut h, stash) = harness(OutputMode::Ordered, 4);
    h.process_record(1, None).unwrap();
    h.process_record(2, None).unwrap();
    let remote = stash.take(2);
    drop(h);
    stash.complete(1);
    std::thread::spawn(move || remote.complete([5]))
        .join()
        .unwrap();
}

/// Snapshot holds the in-flight records and watermarks in input order; restore
/// re-invokes them in that order before new input (Flink: testStateSnapshotAndRestore).
#[test]
fn snapshot_and_restore() {
    let (mut h, stash) = harness(OutputMode::Ordered, 10);
    h.process_record(1, Some(1)).unwrap();
    h.process_record(2, Some(2)).unwrap();
    h.process_watermark(3).unwrap();
    h.process_record(4, Some(4)).unwrap();
    stash.complete(2);
    h.run_mailbox().unwrap();
    let snapshot = h.snapshot();
    assert_eq!(snapshot, vec![rec(1, 1), rec(2, 2), wm(3), rec(4, 4)]);
    drop(h);

    let restored_stash = Stash::default();
    let mut restored = AsyncHarness::restore(
        restored_stash.clone(),
        AsyncConfig::new(OutputMode::Ordered, 10),
        snapshot,
    )
    .unwrap();
    assert_eq!(
        restored_stash.len(),
        3,
        "the three records are invoked again"
    );
    restored.process_record(5, Some(5)).unwrap();
    for i in [5, 4, 2, 1] {
        restored_stash.complete(i);
    }
    restored.finish().unwrap();
    assert_eq!(
        restored.take_output(),
        vec![rec(10, 1), rec(20, 2), wm(3), rec(40, 4), rec(50, 5)]
    );
}

/// Restoring from an empty snapshot is a fresh operator (Flink: testRestoreWithNoElements).
#[test]
fn restore_with_no_elements() {
    let mut h = AsyncHarness::restore(
        Stash::default(),
        AsyncConfig::new(OutputMode::Unordered, 1),
        vec![],
    )
    .unwrap();
    assert_eq!(h.in_flight(), 0);
    h.finish().unwrap();
}

/// Invalid configuration is a clear error, never a panic.
#[test]
fn invalid_configuration_is_rejected() {
    let error =
        AsyncHarness::new(Stash::default(), AsyncConfig::new(OutputMode::Ordered, 0)).unwrap_err();
    assert_eq!(
        error,
        ConfigError::ZeroCapacity {
            what: "async operator capacity"
        }
    );
    assert!(error.to_string().contains("at least 1"));
    let zero_timeout = AsyncConfig::new(OutputMode::Ordered, 1).with_timeout(Duration::ZERO);
    assert!(AsyncHarness::new(Stash::default(), zero_timeout).is_err());
    let no_attempts =
        AsyncConfig::new(OutputMode::Ordered, 1).with_retry(RetryStrategy::fixed_delay(0, MS));
    assert!(AsyncHarness::new(Stash::default(), no_attempts).is_err());
}

/// At capacity with only timers able to free a slot, waiting lets the manual clock run
/// to the next timer (the task would wait that long in real time).
#[test]
fn waiting_at_capacity_lets_time_run_to_the_next_timer() {
    let stash = Stash {
        timeout_value: Some(0),
        ..Stash::default()
    };
    let config = AsyncConfig::new(OutputMode::Ordered, 1).with_timeout(10 * MS);
    let mut h = AsyncHarness::new(stash.clone(), config).unwrap();
    h.process_record(1, None).unwrap();
    // Full; the stashed handle is outstanding but held by this thread, so only the
    // timeout can free the slot.
    h.process_record(2, None).unwrap();
    assert_eq!(h.now_ns(), 10_000_000);
    assert_eq!(h.take_output(), vec![StreamElement::record(0, None)]);
}

/// Handles completed on the operator's thread give their reference back as credit; many
/// of them in a row (more than one batch of credits) must not upset later calls.
#[test]
fn credits_returned_by_many_same_thread_completions() {
    let (mut h, stash) = harness(OutputMode::Unordered, 300);
    for round in 0..3u32 {
        for i in 0..200 {
            h.process_record(round * 1000 + i, None).unwrap();
        }
        for i in 0..200 {
            stash.complete(round * 1000 + i);
        }
        h.run_mailbox().unwrap();
        assert_eq!(h.take_output().len(), 200);
    }
    h.finish().unwrap();
}

/// A completed record's timeout timer is cancelled at once: the wheel holds only the
/// timers of records still in flight, its next deadline is a live record's, and its
/// peak stays within the capacity however many records passed.
#[test]
fn completed_records_cancel_their_timeouts() {
    let function = Stash::default();
    let config = AsyncConfig::new(OutputMode::Unordered, 4).with_timeout(10_000 * MS);
    let mut h = AsyncHarness::new(function.clone(), config).unwrap();
    for input in 0..10_000 {
        h.process_record(input, None).unwrap();
        function.complete(input);
        h.run_mailbox().unwrap();
        h.advance_time(MS).unwrap();
    }
    assert_eq!(h.pending_timers(), 0);
    assert_eq!(h.operator().next_timer_deadline(), None);
    // One record in flight, started at 10 s: its deadline (20 s) is the next one, not a
    // completed record's (10 s and after).
    h.process_record(77, None).unwrap();
    assert_eq!(h.pending_timers(), 1);
    assert_eq!(
        h.operator().next_timer_deadline(),
        Some(h.now_ns() + 10_000_000_000)
    );
    assert_eq!(h.operator().metrics().timers_peak, 1);
    function.complete(77);
    h.finish().unwrap();
    assert_eq!(h.operator().metrics().timed_out, 0);
}

/// Timeouts run from each record's first invocation in deadline order, also when the
/// caller's clock goes back between records (a record with an earlier deadline is
/// placed before later ones); a completed record's timeout stops wherever it stands,
/// and the next deadline is always a live record's.
#[test]
fn timeouts_fire_in_deadline_order_whatever_the_order_of_the_clock() {
    use weir_engine::async_io::AsyncWaitOperator;
    use weir_engine::park::Parker;
    let stash = Stash {
        timeout_value: Some(0),
        ..Stash::default()
    };
    let timeout_ns = 10 * MS.as_nanos() as u64;
    let config = AsyncConfig::new(OutputMode::Unordered, 8).with_timeout(10 * MS);
    let parker = Parker::current();
    let mut operator = AsyncWaitOperator::new(stash.clone(), config, parker.unparker()).unwrap();
    let mut out: Vec<StreamElement<u32>> = Vec::new();
    // Invoked at 5, 3, 7, 1, 4 ms (the clock jumps back twice).
    for (input, at_ms) in [(5u32, 5u64), (3, 3), (7, 7), (1, 1), (4, 4)] {
        let now = at_ms * 1_000_000;
        operator.process_record(input, None, now, &mut out).unwrap();
    }
    assert_eq!(operator.pending_timers(), 5);
    assert_eq!(operator.next_timer_deadline(), Some(1_000_000 + timeout_ns));
    // Completing records in the middle and at the head of the list stops their timeouts.
    stash.complete(3);
    stash.complete(1);
    operator.drain(8_000_000, &mut out).unwrap();
    assert_eq!(operator.pending_timers(), 3);
    assert_eq!(operator.next_timer_deadline(), Some(4_000_000 + timeout_ns));
    // The rest time out in deadline order, each at its own deadline.
    let mut fired = Vec::new();
    while let Some(deadline) = operator.fire_due_timer(u64::MAX, &mut out).unwrap() {
        fired.push(deadline);
    }
    assert_eq!(
        fired,
        vec![
            4_000_000 + timeout_ns,
            5_000_000 + timeout_ns,
            7_000_000 + timeout_ns
        ]
    );
    assert_eq!(*stash.timeouts.borrow(), vec![4, 5, 7]);
    assert_eq!(operator.pending_timers(), 0);
    assert_eq!(operator.next_timer_deadline(), None);
    assert_eq!(operator.in_flight(), 0);
    assert_eq!(operator.metrics().timed_out, 3);
}
