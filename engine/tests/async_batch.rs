//! The batched async operator (`Batched` over an `AsyncBatchFunction`) through the
//! operator's harness: batches cut by size, by time, at watermarks, at a full operator
//! and at end of input; order and watermark fencing; capacity counted in records; the
//! timeout of one batch; partial results with retries; a wrong result count; snapshots;
//! and a property test over batch sizes and completion orders (every input exactly
//! once). Then the graph API with completions from another thread.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use proptest::prelude::*;
use weir_engine::async_io::{
    AsyncBatchFunction, AsyncConfig, AsyncError, AsyncHarness, BatchConfig, BatchResult, Batched,
    OutputMode, ResultFuture, RetryStrategy,
};
use weir_engine::element::StreamElement;
use weir_engine::ConfigError;

const MS: Duration = Duration::from_millis(1);

/// The batches called, each with its inputs, waiting for the test to complete them.
type Calls = Rc<RefCell<Vec<(Vec<u32>, Option<BatchResult<u32>>)>>>;

#[derive(Clone, Default)]
struct Stash {
    calls: Calls,
    /// What the timeout hook does: `None` = fail, `Some(v)` = complete with `v`.
    timeout_value: Option<u32>,
}

impl Stash {
    fn sizes(&self) -> Vec<usize> {
        self.calls.borrow().iter().map(|(i, _)| i.len()).collect()
    }

    fn inputs(&self, batch: usize) -> Vec<u32> {
        self.calls.borrow()[batch].0.clone()
    }

    /// Completes batch `batch` with `input * 10` for each input.
    fn complete(&self, batch: usize) {
        let (inputs, result) = {
            let mut calls = self.calls.borrow_mut();
            let (inputs, result) = &mut calls[batch];
            (inputs.clone(), result.take().expect("not completed yet"))
        };
        result.complete(inputs.iter().map(|i| vec![i * 10]).collect());
    }

    fn take(&self, batch: usize) -> BatchResult<u32> {
        self.calls.borrow_mut()[batch]
            .1
            .take()
            .expect("not completed yet")
    }
}

impl AsyncBatchFunction for Stash {
    type In = u32;
    type Out = u32;
    fn invoke_batch(&mut self, inputs: &[u32], result: BatchResult<u32>) {
        self.calls
            .borrow_mut()
            .push((inputs.to_vec(), Some(result)));
    }
    fn timeout(&mut self, _input: &u32, result: ResultFuture<u32>) {
        match self.timeout_value {
            Some(v) => result.complete([v]),
            None => result.complete_err(AsyncError::Timeout),
        }
    }
}

fn harness(
    stash: &Stash,
    mode: OutputMode,
    capacity: usize,
    batch: BatchConfig,
) -> AsyncHarness<Batched<Stash>> {
    AsyncHarness::new(
        Batched::new(stash.clone(), batch),
        AsyncConfig::new(mode, capacity),
    )
    .expect("valid settings")
}

fn records(out: &[StreamElement<u32>]) -> Vec<u32> {
    out.iter()
        .filter_map(|e| match e {
            StreamElement::Record(r) => Some(r.value),
            StreamElement::Watermark(_) => None,
        })
        .collect()
}

#[test]
fn batches_are_cut_at_their_size_and_after_their_timeout() {
    let stash = Stash::default();
    let mut h = harness(
        &stash,
        OutputMode::Ordered,
        100,
        BatchConfig::new(4, 10 * MS),
    );
    for i in 0..10 {
        h.process_record(i, None).unwrap();
    }
    assert_eq!(stash.sizes(), [4, 4], "two full batches, two records held");
    assert_eq!(h.in_flight(), 10, "capacity counts records, held ones too");
    h.advance_time(9 * MS).unwrap();
    assert_eq!(stash.sizes(), [4, 4]);
    h.advance_time(MS).unwrap();
    assert_eq!(stash.sizes(), [4, 4, 2], "cut 10 ms after its first record");
    assert_eq!(stash.inputs(2), [8, 9]);
    let metrics = h.operator().function().metrics().clone();
    assert_eq!(metrics.cut_full.load(Ordering::Relaxed), 2);
    assert_eq!(metrics.cut_timeout.load(Ordering::Relaxed), 1);
    assert_eq!(metrics.in_flight(), 3);
    // Ordered: the last batch first, then the middle one: nothing leaves before batch 0.
    stash.complete(2);
    stash.complete(1);
    h.run_mailbox().unwrap();
    assert!(h.take_output().is_empty());
    stash.complete(0);
    h.run_mailbox().unwrap();
    assert_eq!(
        records(&h.take_output()),
        (0..10).map(|i| i * 10).collect::<Vec<_>>()
    );
    assert_eq!(metrics.in_flight(), 0);
    assert!((metrics.mean_size() - 10.0 / 3.0).abs() < 1e-9);
}

#[test]
fn a_zero_timeout_cuts_at_the_next_timer_pass() {
    let stash = Stash::default();
    let mut h = harness(
        &stash,
        OutputMode::Unordered,
        100,
        BatchConfig::new(64, Duration::ZERO),
    );
    for i in 0..3 {
        h.process_record(i, None).unwrap();
    }
    assert!(stash.sizes().is_empty(), "held until the timers run");
    h.advance_time(Duration::ZERO).unwrap();
    assert_eq!(stash.sizes(), [3], "no time passed: cut at the timer pass");
    assert_eq!(h.now_ns(), 0);
}

#[test]
fn a_watermark_sends_the_records_before_it_and_fences_the_ones_after() {
    let stash = Stash::default();
    let mut h = harness(
        &stash,
        OutputMode::Unordered,
        100,
        BatchConfig::new(10, 100 * MS),
    );
    for i in 0..3 {
        h.process_record(i, Some(i64::from(i))).unwrap();
    }
    h.process_watermark(2).unwrap();
    assert_eq!(stash.sizes(), [3], "the watermark cut the batch");
    for i in 3..6 {
        h.process_record(i, Some(i64::from(i))).unwrap();
    }
    h.advance_time(Duration::from_secs(1)).unwrap();
    assert_eq!(stash.sizes(), [3, 3]);
    // The batch after the watermark completes first: it waits behind the watermark.
    stash.complete(1);
    h.run_mailbox().unwrap();
    assert!(h.take_output().is_empty(), "nothing crosses the watermark");
    stash.complete(0);
    h.run_mailbox().unwrap();
    let out = h.take_output();
    let wm = out
        .iter()
        .position(|e| matches!(e, StreamElement::Watermark(_)))
        .expect("the watermark");
    let mut before = records(&out[..wm]);
    before.sort_unstable();
    let mut after = records(&out[wm..]);
    after.sort_unstable();
    assert_eq!(before, [0, 10, 20]);
    assert_eq!(after, [30, 40, 50]);
}

#[test]
fn a_full_operator_sends_its_batch_at_once() {
    let stash = Stash::default();
    let mut h = harness(
        &stash,
        OutputMode::Ordered,
        3,
        BatchConfig::new(10, Duration::from_secs(60)),
    );
    for i in 0..3 {
        h.process_record(i, None).unwrap();
    }
    assert_eq!(
        stash.sizes(),
        [3],
        "full at 3 records: cut without waiting a minute"
    );
    assert_eq!(h.now_ns(), 0);
    stash.complete(0);
    h.process_record(3, None).unwrap();
    assert_eq!(records(&h.take_output()), [0, 10, 20]);
    assert_eq!(stash.sizes(), [3], "record 3 is held");
    // A watermark cuts what is held (and waits for it).
    h.process_watermark(7).unwrap();
    assert_eq!(stash.sizes(), [3, 1]);
    stash.complete(1);
    h.finish().unwrap();
    let out = h.take_output();
    assert_eq!(records(&out), [30]);
    assert!(matches!(out.last(), Some(StreamElement::Watermark(_))));
}

/// Completes every batch inside its call.
struct Inline;

impl AsyncBatchFunction for Inline {
    type In = u32;
    type Out = u32;
    fn invoke_batch(&mut self, inputs: &[u32], result: BatchResult<u32>) {
        result.complete(inputs.iter().map(|i| vec![i * 10]).collect());
    }
}

/// A batch function that knows the answer of even inputs without a call.
#[derive(Clone, Default)]
struct EvenReady(Stash);

impl AsyncBatchFunction for EvenReady {
    type In = u32;
    type Out = u32;
    fn ready(&mut self, input: &u32) -> Option<u32> {
        (input % 2 == 0).then_some(input * 10)
    }
    fn invoke_batch(&mut self, inputs: &[u32], result: BatchResult<u32>) {
        self.0.invoke_batch(inputs, result);
    }
}

/// `Batched` forwards `ready`: an input answered at once joins no batch and leaves at
/// once; one that may not leave yet (behind a held record, ordered) joins a batch.
#[test]
fn answers_known_without_a_call_join_no_batch() {
    let function = EvenReady::default();
    let mut h = AsyncHarness::new(
        Batched::new(function.clone(), BatchConfig::new(2, 5 * MS)),
        AsyncConfig::new(OutputMode::Ordered, 10),
    )
    .unwrap();
    h.process_record(0, None).unwrap();
    h.process_record(2, None).unwrap();
    assert_eq!(records(&h.take_output()), [0, 20]);
    assert_eq!(h.operator().function().buffered(), 0, "no batch for them");
    h.process_record(1, None).unwrap();
    // Behind the held 1: batched with it (the batch of two is cut and called).
    h.process_record(4, None).unwrap();
    assert_eq!(function.0.sizes(), [2]);
    assert_eq!(function.0.inputs(0), [1, 4]);
    function.0.complete(0);
    h.run_mailbox().unwrap();
    assert_eq!(records(&h.take_output()), [10, 40]);
    assert_eq!(h.operator().metrics().ready, 2);
}

#[test]
fn end_of_input_sends_what_is_held() {
    let mut h = AsyncHarness::new(
        Batched::new(Inline, BatchConfig::new(10, Duration::from_secs(60))),
        AsyncConfig::new(OutputMode::Ordered, 100),
    )
    .unwrap();
    for i in 0..3 {
        h.process_record(i, None).unwrap();
    }
    assert!(h.take_output().is_empty(), "held, not called");
    let metrics = h.operator().function().metrics().clone();
    h.finish().unwrap();
    assert_eq!(records(&h.take_output()), [0, 10, 20]);
    assert_eq!(metrics.cut_forced.load(Ordering::Relaxed), 1);
    assert_eq!(metrics.batches.load(Ordering::Relaxed), 1);
}

#[test]
fn the_timeout_of_one_batch_times_its_records_out_and_ignores_its_late_answer() {
    let stash = Stash {
        timeout_value: Some(999),
        ..Stash::default()
    };
    let mut h = AsyncHarness::new(
        Batched::new(stash.clone(), BatchConfig::new(2, 5 * MS)),
        AsyncConfig::new(OutputMode::Ordered, 100).with_timeout(50 * MS),
    )
    .unwrap();
    for i in 0..4 {
        h.process_record(i, None).unwrap();
    }
    assert_eq!(stash.sizes(), [2, 2]);
    stash.complete(1);
    h.advance_time(50 * MS).unwrap();
    // Batch 0 never answered: its records took the timeout hook's value.
    assert_eq!(records(&h.take_output()), [999, 999, 20, 30]);
    stash.complete(0);
    h.run_mailbox().unwrap();
    assert!(
        h.take_output().is_empty(),
        "an answer after the timeout is ignored"
    );
    h.finish().unwrap();
}

#[test]
fn partial_results_retry_only_the_failed_records_in_a_later_batch() {
    let stash = Stash::default();
    let retry = RetryStrategy::fixed_delay(3, MS).retry_on_any_error();
    let mut h = AsyncHarness::new(
        Batched::new(stash.clone(), BatchConfig::new(4, 10 * MS)),
        AsyncConfig::new(OutputMode::Unordered, 100).with_retry(retry),
    )
    .unwrap();
    for i in 0..4 {
        h.process_record(i, None).unwrap();
    }
    let handles = stash.take(0).into_handles();
    for (i, handle) in handles.into_iter().enumerate() {
        if i % 2 == 0 {
            handle.complete([i as u32 * 10]);
        } else {
            handle.complete_err(AsyncError::call("this row is busy"));
        }
    }
    h.run_mailbox().unwrap();
    let mut out = records(&h.take_output());
    out.sort_unstable();
    assert_eq!(out, [0, 20]);
    // The retries (after 1 ms) join a new batch, cut 10 ms after its first.
    h.advance_time(11 * MS).unwrap();
    assert_eq!(stash.sizes(), [4, 2]);
    assert_eq!(stash.inputs(1), [1, 3]);
    stash.complete(1);
    h.finish().unwrap();
    let mut out = records(&h.take_output());
    out.sort_unstable();
    assert_eq!(out, [10, 30]);
}

#[test]
fn a_wrong_number_of_result_lists_fails_the_operator_saying_so() {
    let stash = Stash::default();
    let mut h = harness(&stash, OutputMode::Ordered, 100, BatchConfig::new(3, MS));
    for i in 0..3 {
        h.process_record(i, None).unwrap();
    }
    stash.take(0).complete(vec![vec![1], vec![2]]);
    let error = h.run_mailbox().unwrap_err();
    assert!(
        error.to_string().contains("2 result lists for 3 inputs"),
        "{error}"
    );
}

#[test]
fn a_snapshot_holds_held_and_in_flight_records_in_input_order() {
    let stash = Stash::default();
    let mut h = harness(
        &stash,
        OutputMode::Unordered,
        100,
        BatchConfig::new(3, MS * 100),
    );
    for i in 0..5 {
        h.process_record(i, Some(i64::from(i))).unwrap();
    }
    assert_eq!(stash.sizes(), [3], "3 called, 2 held");
    let snapshot = h.snapshot();
    let held: Vec<u32> = snapshot
        .iter()
        .filter_map(|e| match e {
            StreamElement::Record(r) => Some(r.value),
            StreamElement::Watermark(_) => None,
        })
        .collect();
    assert_eq!(held, [0, 1, 2, 3, 4]);
}

#[test]
fn invalid_batch_settings_are_refused_with_what_to_fix() {
    let Err(error) = AsyncHarness::new(
        Batched::new(Stash::default(), BatchConfig::new(0, MS)),
        AsyncConfig::new(OutputMode::Ordered, 10),
    ) else {
        panic!("a batch of 0 records was accepted");
    };
    assert!(matches!(error, ConfigError::Inconsistent(_)));
    assert!(error.to_string().contains("max_batch_size is 0"), "{error}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Any batch size, capacity and completion order: every input comes out exactly
    /// once, in input order when ordered.
    #[test]
    fn every_input_exactly_once_whatever_the_batches_and_completion_order(
        count in 1u32..80,
        max_batch in 1usize..9,
        capacity in 1usize..20,
        ordered in any::<bool>(),
        picks in proptest::collection::vec(any::<u16>(), 0..200),
        timeout_ms in 1u32..5,
    ) {
        let stash = Stash::default();
        let mode = if ordered { OutputMode::Ordered } else { OutputMode::Unordered };
        let mut h = harness(&stash, mode, capacity, BatchConfig::new(max_batch, timeout_ms * MS));
        let mut picks = picks.into_iter();
        let mut completed = 0usize;
        let mut complete_some = |h: &mut AsyncHarness<Batched<Stash>>, picks: &mut dyn Iterator<Item = u16>, all: bool| {
            loop {
                let open: Vec<usize> = stash
                    .calls
                    .borrow()
                    .iter()
                    .enumerate()
                    .filter(|(_, (_, r))| r.is_some())
                    .map(|(i, _)| i)
                    .collect();
                if open.is_empty() {
                    break;
                }
                let pick = match picks.next() {
                    Some(p) => p as usize,
                    None if all => 0,
                    None => break,
                };
                if !all && pick % 3 == 0 {
                    break;
                }
                stash.complete(open[pick % open.len()]);
                completed += 1;
            }
            h.run_mailbox().unwrap();
        };
        for i in 0..count {
            // Make room: complete some batches (or let time cut the held one).
            while h.in_flight() >= capacity {
                complete_some(&mut h, &mut picks, true);
                h.advance_time(MS).unwrap();
            }
            h.process_record(i, None).unwrap();
            complete_some(&mut h, &mut picks, false);
        }
        // End of input: cut, complete everything, finish.
        h.advance_time(timeout_ms * MS).unwrap();
        complete_some(&mut h, &mut picks, true);
        h.finish().unwrap();
        let out = records(&h.take_output());
        let mut sorted = out.clone();
        sorted.sort_unstable();
        prop_assert_eq!(sorted, (0..count).map(|i| i * 10).collect::<Vec<_>>());
        if ordered {
            prop_assert_eq!(out, (0..count).map(|i| i * 10).collect::<Vec<_>>());
        }
        prop_assert!(stash.sizes().iter().all(|s| *s >= 1 && *s <= max_batch));
        let _ = completed;
    }
}

/// Answers each batch from another thread.
struct Remote(std::sync::mpsc::Sender<(Vec<u64>, BatchResult<u64>)>);

impl AsyncBatchFunction for Remote {
    type In = u64;
    type Out = u64;
    fn invoke_batch(&mut self, inputs: &[u64], result: BatchResult<u64>) {
        let _ = self.0.send((inputs.to_vec(), result));
    }
}

/// The graph API: batches answered on another thread; every record comes out once.
#[test]
fn a_graph_stage_of_batched_calls_answered_elsewhere_delivers_every_record_once() {
    use weir_engine::graph::Graph;
    use weir_engine::runtime::{Cores, Runtime};
    let (send, receive) = std::sync::mpsc::channel::<(Vec<u64>, BatchResult<u64>)>();
    let answerer = std::thread::spawn(move || {
        let mut batches = 0u64;
        while let Ok((inputs, result)) = receive.recv() {
            batches += 1;
            result.complete(inputs.iter().map(|n| vec![n + 1_000_000]).collect());
        }
        batches
    });
    let graph = Graph::new().with_parallelism(2);
    let send = std::sync::Mutex::new(send);
    let collected = graph
        .from_generator(20_000, None, |n| n)
        .async_wait_batch(
            move |_| (Remote(send.lock().unwrap().clone()), None),
            AsyncConfig::new(OutputMode::Unordered, 256),
            BatchConfig::new(32, MS),
        )
        .key_by(|n: &u64| *n)
        .collect();
    let runtime = Runtime::builder()
        .cores(Cores::Count(2))
        .pin(false)
        .build()
        .unwrap();
    let result = graph.execute(runtime).expect("the job runs");
    assert_no_lost_wakeup(&result);
    let mut out = collected.records();
    out.sort_unstable();
    assert_eq!(out, (1_000_000..1_020_000).collect::<Vec<u64>>());
    // The graph, and the senders its stages held, are gone: the answerer ends.
    let batches = answerer.join().unwrap();
    assert!(batches >= 20_000 / 32, "{batches} batches");
    assert!(batches < 20_000, "records were batched: {batches} batches");
}

/// The futures adapter: each batch an `async` block; a failed batch is retried.
#[test]
fn batches_written_as_async_blocks_deliver_every_record_once() {
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;
    use weir_engine::graph::Graph;
    use weir_engine::runtime::{Cores, Runtime};
    let calls = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&calls);
    let graph = Graph::new().with_parallelism(2);
    let collected = graph
        .from_generator(5_000, None, |n| n)
        .async_wait_batch_futures(
            move |_| {
                let calls = Arc::clone(&counted);
                let call = move |inputs: &[u64]| {
                    let inputs = inputs.to_vec();
                    let call = calls.fetch_add(1, Ordering::Relaxed);
                    async move {
                        if call == 3 {
                            return Err(AsyncError::call("the batch API is busy"));
                        }
                        Ok(inputs.iter().map(|n| vec![n * 2]).collect())
                    }
                };
                (call, None)
            },
            AsyncConfig::new(OutputMode::Ordered, 128)
                .with_retry(RetryStrategy::fixed_delay(3, MS).retry_on_any_error()),
            BatchConfig::new(16, MS),
        )
        .collect();
    let runtime = Runtime::builder()
        .cores(Cores::Count(2))
        .pin(false)
        .build()
        .unwrap();
    let result = graph.execute(runtime).expect("the job runs");
    assert_no_lost_wakeup(&result);
    let mut out = collected.records();
    out.sort_unstable();
    assert_eq!(out, (0..5_000).map(|n| n * 2).collect::<Vec<u64>>());
    assert!(calls.load(Ordering::Relaxed) < 5_000);
}

/// The idle safety net never found work nothing had announced: completions from
/// another thread and the batches' timers woke their tasks themselves.
fn assert_no_lost_wakeup(result: &weir_engine::graph::JobResult) {
    for (worker, wakeups) in result.run.wakeups.iter().enumerate() {
        assert_eq!(
            wakeups.rescued, 0,
            "worker {worker}: a lost wake-up was rescued by the safety net ({wakeups:?})"
        );
    }
}
