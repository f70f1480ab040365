//! The async operator's run form (`process_run`) against its per-record form
//! (`process_record`): for random inputs (answered by `AsyncFunction::ready`, calls
//! completed inside `invoke` with zero, one or several results, or held and completed
//! later in a random order), random run
//! boundaries and random watermark positions, in every output mode, both forms emit
//! the same elements in the same order and count the same, step for step.

use std::cell::RefCell;
use std::rc::Rc;

use proptest::prelude::*;
use weir_engine::async_io::{
    AsyncConfig, AsyncError, AsyncFunction, AsyncWaitOperator, OperatorError, OutputMode,
    ResultFuture,
};
use weir_engine::element::{Record, StreamElement};

/// Input: (id, key, how its call completes: `Some(READY)` answered by `ready` (and by
/// `invoke` with the same one result where the operator calls it instead), `Some(n)`
/// inside `invoke` with n results, `None` later).
type In = (u32, u32, Option<u32>);
type Pending = Rc<RefCell<Vec<(u32, ResultFuture<u32>)>>>;

const READY: u32 = 99;

#[derive(Clone, Default)]
struct Scripted {
    pending: Pending,
    /// Whether `ready` answers (else it keeps the default, and `invoke` answers alone).
    answers_ready: bool,
}

impl AsyncFunction for Scripted {
    type In = In;
    type Out = u32;
    fn ready(&mut self, input: &In) -> Option<u32> {
        (self.answers_ready && input.2 == Some(READY)).then_some(input.0 * 10)
    }
    fn invoke(&mut self, input: &In, result: ResultFuture<u32>) {
        match input.2 {
            Some(READY) => result.complete_one(input.0 * 10),
            Some(count) => result.complete((0..count).map(|j| input.0 * 10 + j)),
            None => self.pending.borrow_mut().push((input.0, result)),
        }
    }
    fn key(&self, input: &In) -> u64 {
        u64::from(input.1)
    }
}

#[derive(Debug, Clone)]
enum Step {
    /// Records, cut into runs of these lengths (each cut to the free capacity).
    Records {
        records: Vec<(u32, Option<u32>)>,
        cuts: Vec<usize>,
    },
    Watermark,
    /// Complete the `pick`-th held call with `count` results.
    Complete {
        pick: usize,
        count: u32,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let record = (
        0u32..3,
        prop_oneof![3 => (0u32..3).prop_map(Some), 2 => Just(Some(READY)), 2 => Just(None)],
    );
    prop_oneof![
        4 => (prop::collection::vec(record, 1..40), prop::collection::vec(1usize..12, 1..6))
            .prop_map(|(records, cuts)| Step::Records { records, cuts }),
        1 => Just(Step::Watermark),
        4 => (any::<usize>(), 0u32..3).prop_map(|(pick, count)| Step::Complete { pick, count }),
    ]
}

fn mode() -> impl Strategy<Value = OutputMode> {
    prop_oneof![
        Just(OutputMode::Ordered),
        Just(OutputMode::Unordered),
        Just(OutputMode::KeyedOrdered)
    ]
}

/// One operator and what it emitted.
struct Side {
    function: Scripted,
    operator: AsyncWaitOperator<Scripted>,
    out: Vec<StreamElement<u32>>,
}

impl Side {
    fn new(mode: OutputMode, capacity: usize, answers_ready: bool) -> Side {
        let function = Scripted {
            answers_ready,
            ..Scripted::default()
        };
        let operator =
            AsyncWaitOperator::new(function.clone(), AsyncConfig::new(mode, capacity), || {})
                .expect("valid config");
        Side {
            function,
            operator,
            out: Vec::new(),
        }
    }

    fn complete(&mut self, pick: usize, count: u32) -> Result<(), OperatorError> {
        let taken = {
            let mut pending = self.function.pending.borrow_mut();
            if pending.is_empty() {
                None
            } else {
                let at = pick % pending.len();
                Some(pending.remove(at))
            }
        };
        if let Some((id, handle)) = taken {
            handle.complete((0..count).map(|j| id * 10 + j));
        }
        self.operator.drain(0, &mut self.out).map(|_| ())
    }

    /// Completes every held call, oldest first, until nothing is held.
    fn settle(&mut self) -> Result<(), OperatorError> {
        while !self.function.pending.borrow().is_empty() {
            self.complete(0, 1)?;
        }
        self.operator.drain(0, &mut self.out).map(|_| ())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    /// A third operator without `ready` (its answers then come from `invoke`, completed
    /// inside the call) checks `ready` itself: it must change nothing but the cost. In
    /// ordered mode the output must also follow the input order.
    fn runs_emit_what_single_records_emit(
        mode in mode(),
        capacity in 1usize..10,
        steps in prop::collection::vec(step(), 1..30),
    ) {
        let mut single = Side::new(mode, capacity, true);
        let mut runs = Side::new(mode, capacity, true);
        let mut plain = Side::new(mode, capacity, false);
        let mut next_id = 0u32;
        let mut watermark = 0i64;
        for step in steps {
            match step {
                Step::Records { records, cuts } => {
                    let mut records: Vec<Record<In>> = records
                        .into_iter()
                        .map(|(key, inline)| {
                            next_id += 1;
                            Record { value: (next_id, key, inline), timestamp: Some(i64::from(next_id)) }
                        })
                        .collect();
                    let mut cut = cuts.iter().cycle();
                    while !records.is_empty() {
                        // Both sides are full at the same points: free what is held, as a
                        // task would wait for completions.
                        if runs.operator.free_capacity() == 0 {
                            single.settle().unwrap();
                            runs.settle().unwrap();
                            plain.settle().unwrap();
                        }
                        prop_assert_eq!(single.operator.free_capacity(), runs.operator.free_capacity());
                        let length = (*cut.next().unwrap())
                            .min(records.len())
                            .min(runs.operator.free_capacity());
                        let run: Vec<Record<In>> = records.drain(..length).collect();
                        for record in run.iter().cloned() {
                            single.operator.process_record(record.value, record.timestamp, 0, &mut single.out).unwrap();
                            plain.operator.process_record(record.value, record.timestamp, 0, &mut plain.out).unwrap();
                        }
                        runs.operator.process_run(run, 0, &mut runs.out).unwrap();
                        prop_assert_eq!(&single.out, &runs.out);
                    }
                }
                Step::Watermark => {
                    if runs.operator.is_full() {
                        single.settle().unwrap();
                        runs.settle().unwrap();
                        plain.settle().unwrap();
                    }
                    watermark += 1;
                    single.operator.process_watermark(watermark, 0, &mut single.out).unwrap();
                    runs.operator.process_watermark(watermark, 0, &mut runs.out).unwrap();
                    plain.operator.process_watermark(watermark, 0, &mut plain.out).unwrap();
                }
                Step::Complete { pick, count } => {
                    single.complete(pick, count).unwrap();
                    runs.complete(pick, count).unwrap();
                    plain.complete(pick, count).unwrap();
                }
            }
            prop_assert_eq!(&single.out, &runs.out);
            prop_assert_eq!(&single.out, &plain.out);
            prop_assert_eq!(single.operator.in_flight(), runs.operator.in_flight());
        }
        single.settle().unwrap();
        runs.settle().unwrap();
        plain.settle().unwrap();
        prop_assert_eq!(&single.out, &runs.out);
        prop_assert_eq!(&single.out, &plain.out);
        if mode == OutputMode::Ordered {
            // Results carry their input's id (id * 10 + j): ids never go down.
            let ids: Vec<u32> = single
                .out
                .iter()
                .filter_map(|e| e.as_record().map(|r| r.value / 10))
                .collect();
            prop_assert!(ids.windows(2).all(|w| w[0] <= w[1]), "out of input order: {:?}", ids);
        }
        prop_assert_eq!(single.operator.in_flight(), 0);
        prop_assert_eq!(runs.operator.in_flight(), 0);
        let (a, b) = (single.operator.metrics(), runs.operator.metrics());
        prop_assert_eq!(a.completed, b.completed);
        prop_assert_eq!(a.emitted, b.emitted);
        prop_assert_eq!(a.ready, b.ready);
        prop_assert_eq!(plain.operator.metrics().ready, 0);
    }
}

/// Answers from `ready` are counted apart (and as completed and emitted); records that
/// may not leave at once (behind a held one, in ordered mode) are called instead.
#[test]
fn answers_from_ready_are_counted() {
    let mut side = Side::new(OutputMode::Ordered, 8, true);
    let record = |id: u32, inline: Option<u32>| Record {
        value: (id, 0, inline),
        timestamp: None,
    };
    let run = vec![record(1, Some(READY)), record(2, Some(READY))];
    side.operator.process_run(run, 0, &mut side.out).unwrap();
    assert_eq!(side.operator.metrics().ready, 2);
    // Held: the next answer known at once must wait behind it, so `invoke` answers it.
    side.operator
        .process_record((3, 0, None), None, 0, &mut side.out)
        .unwrap();
    side.operator
        .process_record((4, 0, Some(READY)), None, 0, &mut side.out)
        .unwrap();
    assert_eq!(side.operator.metrics().ready, 2);
    side.settle().unwrap();
    let m = side.operator.metrics();
    assert_eq!((m.ready, m.completed, m.emitted), (2, 4, 4));
}

/// A call failing inside `invoke` fails the operator at that record, as one record at
/// a time: the records before it left, the rest of the run is not called, and the next
/// run is refused.
#[test]
fn a_call_failing_inside_a_run_fails_the_operator() {
    struct FailsThird;
    impl AsyncFunction for FailsThird {
        type In = u32;
        type Out = u32;
        fn invoke(&mut self, input: &u32, result: ResultFuture<u32>) {
            if *input == 3 {
                result.complete_err(AsyncError::call("the third call fails"));
            } else {
                result.complete_one(*input);
            }
        }
    }
    let mut operator =
        AsyncWaitOperator::new(FailsThird, AsyncConfig::new(OutputMode::Ordered, 8), || {})
            .expect("valid config");
    let run = |ids: std::ops::Range<u32>| {
        ids.map(|value| Record {
            value,
            timestamp: None,
        })
        .collect::<Vec<_>>()
    };
    let mut out = Vec::new();
    let failed = operator.process_run(run(1..6), 0, &mut out);
    assert!(
        matches!(&failed, Err(e @ OperatorError::Async(_)) if e.to_string().contains("the third call fails")),
        "{failed:?}"
    );
    assert_eq!(
        out,
        [
            StreamElement::record(1, None),
            StreamElement::record(2, None)
        ]
    );
    assert_eq!(
        operator.metrics().completed,
        2,
        "no call after the failing one"
    );
    let again = operator.process_run(run(6..7), 0, &mut out);
    assert!(
        matches!(&again, Err(OperatorError::Failed { cause }) if cause.contains("the third call fails")),
        "{again:?}"
    );
}

/// A run longer than the free capacity is a caller bug, caught before any call is made.
#[test]
#[should_panic(expected = "hand it at most free_capacity() records")]
fn a_run_beyond_the_free_capacity_is_refused() {
    let mut operator = AsyncWaitOperator::new(
        Scripted::default(),
        AsyncConfig::new(OutputMode::Unordered, 2),
        || {},
    )
    .expect("valid config");
    let run: Vec<Record<In>> = (0..3)
        .map(|id| Record {
            value: (id, 0, None),
            timestamp: None,
        })
        .collect();
    let _ = operator.process_run(run, 0, &mut Vec::new());
}
