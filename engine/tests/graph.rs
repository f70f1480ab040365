//! Job graphs end to end: partitioners' distributions, a three-stage graph with mixed
//! parallelism, async operators in a chain, validation errors.

use std::collections::{BTreeMap, HashSet};

use weir_engine::async_io::{AsyncConfig, AsyncFunction, OutputMode, ResultFuture};
use weir_engine::element::StreamElement;
use weir_engine::graph::keys::subtask_for_key;
use weir_engine::graph::partition::connected;
use weir_engine::graph::{
    Graph, GraphError, GraphRunError, Partitioning, Source, SourceEvent, SubtaskInfo,
};
use weir_engine::runtime::{Cores, Runtime, RuntimeError};

/// Runs `graph` to its end on `workers` workers and checks that the idle safety net
/// never rescued a task: no task found work after a 100 ms sweep that nothing had
/// announced, so no lost wake-up hid behind it. (The safety net itself may fire on a
/// loaded machine when a worker waits long for a slow peer; `rescued` counts only the
/// sweeps that found unannounced work.)
fn run(graph: Graph, workers: usize) -> weir_engine::graph::JobResult {
    let result = graph.execute(runtime(workers)).expect("runs");
    for (worker, wakeups) in result.run.wakeups.iter().enumerate() {
        assert_eq!(
            wakeups.rescued, 0,
            "worker {worker}: the idle safety net found work nothing had announced, a lost \
             wake-up ({wakeups:?})"
        );
    }
    result
}

fn runtime(workers: usize) -> Runtime {
    Runtime::builder()
        .cores(Cores::Count(workers))
        .pin(false)
        .build()
        .expect("runtime")
}

/// (upstream subtask, sequence number) pairs: `per` per subtask.
fn tagged(
    graph: &Graph,
    parallelism: usize,
    per: u64,
) -> weir_engine::graph::Stream<'_, (u64, u64)> {
    graph
        .from_iter(move |info: &SubtaskInfo| {
            let index = info.index as u64;
            (0..per).map(move |n| (index, n))
        })
        .parallelism(parallelism)
}

fn records_by_subtask<T: Clone>(elements: &[Vec<StreamElement<T>>]) -> Vec<Vec<T>> {
    elements
        .iter()
        .map(|s| {
            s.iter()
                .filter_map(|e| e.as_record().map(|r| r.value.clone()))
                .collect()
        })
        .collect()
}

#[test]
fn forward_keeps_each_subtask_to_its_peer() {
    let graph = Graph::new();
    let out = tagged(&graph, 3, 50).forward().parallelism(3).collect();
    run(graph, 2);
    let by = records_by_subtask(&out.by_subtask());
    for (j, records) in by.iter().enumerate() {
        assert_eq!(records.len(), 50);
        assert!(records.iter().all(|&(from, _)| from == j as u64));
        // One channel: in order.
        assert!(records.windows(2).all(|w| w[0].1 < w[1].1));
    }
}

#[test]
fn rebalance_spreads_round_robin() {
    let graph = Graph::new();
    let out = tagged(&graph, 2, 100).rebalance().parallelism(3).collect();
    run(graph, 2);
    let by = records_by_subtask(&out.by_subtask());
    for from in 0..2u64 {
        // Each upstream subtask sends 100 records round robin: 33 or 34 to each.
        let counts: Vec<usize> = by
            .iter()
            .map(|r| r.iter().filter(|(f, _)| *f == from).count())
            .collect();
        assert_eq!(counts.iter().sum::<usize>(), 100);
        assert!(counts.iter().all(|&c| c == 33 || c == 34), "{counts:?}");
        // Consecutive records of one upstream subtask go to consecutive channels.
        let target = |n: u64| by.iter().position(|r| r.contains(&(from, n))).unwrap();
        for n in 0..99 {
            assert_eq!(target(n + 1), (target(n) + 1) % 3);
        }
    }
}

#[test]
fn rescale_stays_within_the_pointwise_subset() {
    let graph = Graph::new();
    let out = tagged(&graph, 2, 60).rescale().parallelism(4).collect();
    run(graph, 2);
    let by = records_by_subtask(&out.by_subtask());
    for (j, records) in by.iter().enumerate() {
        assert_eq!(records.len(), 30, "subtask {j}");
        for &(from, _) in records {
            assert!(connected(Partitioning::Rescale, 2, 4, from as usize).contains(&j));
        }
    }
}

#[test]
fn key_groups_send_equal_keys_to_flinks_subtask() {
    for (max_parallelism, parallelism) in [(128, 3), (16, 5)] {
        let graph = Graph::new();
        let out = graph
            .from_iter(|info: &SubtaskInfo| {
                let index = info.index as u64;
                (0..500u64).map(move |n| (n * 7 + index) % 97)
            })
            .parallelism(2)
            .key_by(|key: &u64| *key)
            .parallelism(parallelism)
            .max_parallelism(max_parallelism)
            .collect();
        run(graph, 2);
        let by = records_by_subtask(&out.by_subtask());
        let mut owner = BTreeMap::new();
        for (j, keys) in by.iter().enumerate() {
            for &key in keys {
                assert_eq!(subtask_for_key(&key, max_parallelism, parallelism), j);
                assert_eq!(
                    *owner.entry(key).or_insert(j),
                    j,
                    "key {key} on two subtasks"
                );
            }
        }
        assert_eq!(by.iter().map(Vec::len).sum::<usize>(), 1000);
        assert_eq!(owner.len(), 97);
    }
}

#[test]
fn broadcast_and_global() {
    let graph = Graph::new();
    let everywhere = tagged(&graph, 2, 20).broadcast().parallelism(3).collect();
    run(graph, 2);
    for records in records_by_subtask(&everywhere.by_subtask()) {
        let set: HashSet<_> = records.into_iter().collect();
        assert_eq!(set.len(), 40);
    }
    let graph = Graph::new();
    let first = tagged(&graph, 2, 20).global().parallelism(3).collect();
    run(graph, 2);
    let by = records_by_subtask(&first.by_subtask());
    assert_eq!(by.iter().map(Vec::len).collect::<Vec<_>>(), vec![40, 0, 0]);
}

#[test]
fn a_custom_partitioner_routes_and_is_checked() {
    let graph = Graph::new();
    let out = tagged(&graph, 2, 30)
        .partition_custom(
            |key: &u64, n: usize| (*key as usize) % n,
            |r: &(u64, u64)| r.1,
        )
        .parallelism(3)
        .collect();
    run(graph, 2);
    for (j, records) in records_by_subtask(&out.by_subtask()).iter().enumerate() {
        assert_eq!(records.len(), 20);
        assert!(records.iter().all(|r| r.1 as usize % 3 == j));
    }
    let graph = Graph::new();
    let _ = tagged(&graph, 1, 5)
        .partition_custom(|_: &u64, n: usize| n, |r: &(u64, u64)| r.1)
        .parallelism(2)
        .count();
    match graph.execute(runtime(2)) {
        Err(GraphError::Runtime(RuntimeError::Task { error, .. })) => {
            let error = error
                .downcast::<GraphRunError>()
                .expect("the partitioner's error");
            assert!(matches!(
                *error,
                GraphRunError::PartitionOutOfRange {
                    partition: 2,
                    partitions: 2,
                    ..
                }
            ));
        }
        other => panic!("expected the partitioner's error, got {other:?}"),
    }
}

/// Event-time source: subtask `i` emits `n` records with timestamps rising by 1 from
/// `i`, and a watermark after every 10th.
struct Ticks {
    next: i64,
    end: i64,
    step: i64,
    pending_watermark: Option<i64>,
}

impl Source<(u64, i64)> for Ticks {
    fn poll_next(&mut self, _now_ns: u64) -> SourceEvent<(u64, i64)> {
        if let Some(w) = self.pending_watermark.take() {
            return SourceEvent::Watermark(w);
        }
        if self.next >= self.end {
            return SourceEvent::End;
        }
        let ts = self.next;
        self.next += self.step;
        if (ts / self.step) % 10 == 9 {
            self.pending_watermark = Some(ts);
        }
        SourceEvent::Record((ts as u64, ts), Some(ts))
    }
}

#[test]
fn three_stages_of_mixed_parallelism_deliver_exactly_once_with_ordered_watermarks() {
    const RECORDS: i64 = 3000;
    let graph = Graph::new();
    let out = graph
        .from_source(|info: &SubtaskInfo| Ticks {
            next: info.index as i64,
            end: RECORDS,
            step: info.parallelism as i64,
            pending_watermark: None,
        })
        .parallelism(3)
        .map(|(id, ts)| (id, ts * 2))
        .key_by(|r: &(u64, i64)| r.0)
        .parallelism(2)
        .flat_map(|(id, ts)| {
            if id % 2 == 0 {
                vec![(id, ts)]
            } else {
                vec![(id, ts), (id + RECORDS as u64, ts)]
            }
        })
        .filter(|r: &(u64, i64)| r.0 != 1)
        .rebalance()
        .parallelism(4)
        .collect();
    let plan = graph.plan(3).expect("plan");
    assert_eq!(
        plan.iter().map(|p| p.workers.clone()).collect::<Vec<_>>(),
        vec![vec![0, 1, 2], vec![0, 1], vec![2, 0, 1, 2]]
    );
    run(graph, 3);
    let mut ids = Vec::new();
    for elements in out.by_subtask() {
        let mut watermark = i64::MIN;
        for element in &elements {
            match element {
                StreamElement::Record(r) => {
                    let ts = r.timestamp.expect("timestamps cross exchanges");
                    assert!(ts > watermark, "record at {ts} after watermark {watermark}");
                    ids.push(r.value.0);
                }
                StreamElement::Watermark(w) => {
                    assert!(w.0 > watermark, "watermarks in order");
                    watermark = w.0;
                }
            }
        }
        assert_eq!(
            watermark,
            i64::MAX,
            "the final watermark reaches every sink"
        );
    }
    ids.sort_unstable();
    let mut expected: Vec<u64> = (0..RECORDS as u64).filter(|&id| id != 1).collect();
    expected.extend(
        (0..RECORDS as u64)
            .filter(|id| id % 2 == 1)
            .map(|id| id + RECORDS as u64),
    );
    expected.sort_unstable();
    assert_eq!(ids, expected);
}

/// Completes every call on another thread after a short while.
struct Remote;

impl AsyncFunction for Remote {
    type In = u64;
    type Out = u64;
    fn invoke(&mut self, input: &u64, result: ResultFuture<u64>) {
        let value = *input;
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_micros(value % 50));
            result.complete(vec![value * 10]);
        });
    }
}

#[test]
fn async_operators_chain_between_exchanges() {
    for mode in [OutputMode::Ordered, OutputMode::Unordered] {
        let graph = Graph::new().with_parallelism(2);
        let out = graph
            .from_generator(400, None, |n| n)
            .async_wait(|_| Remote, AsyncConfig::new(mode, 8))
            .key_by(|v: &u64| *v)
            .async_wait_futures(
                |_| {
                    let call = |v: &u64| {
                        let v = *v;
                        async move { Ok(vec![v + 1]) }
                    };
                    (call, None)
                },
                AsyncConfig::new(mode, 4),
            )
            .collect();
        let result = run(graph, 2);
        let mut values = out.records();
        values.sort_unstable();
        assert_eq!(values, (0..400).map(|n| n * 10 + 1).collect::<Vec<_>>());
        assert_eq!(result.async_metrics().completed, 800);
        assert_eq!(result.stages[0].records_in, 400);
    }
}

#[test]
fn graphs_that_cannot_run_are_refused_before_starting() {
    let graph = Graph::new();
    assert!(matches!(graph.plan(2), Err(GraphError::Empty)));

    let graph = Graph::new();
    let _ = tagged(&graph, 0, 1).count();
    assert!(matches!(
        graph.execute(runtime(1)),
        Err(GraphError::ZeroParallelism { .. })
    ));

    let graph = Graph::new();
    let _ = tagged(&graph, 2, 1).forward().parallelism(3).count();
    let error = graph.plan(2).expect_err("forward between 2 and 3");
    assert!(matches!(
        error,
        GraphError::ForwardParallelismMismatch {
            from_parallelism: 2,
            to_parallelism: 3,
            ..
        }
    ));
    assert!(error.to_string().contains("rebalance()"));

    let graph = Graph::new();
    let _ = tagged(&graph, 1, 1)
        .key_by(|r: &(u64, u64)| r.0)
        .parallelism(8)
        .max_parallelism(4)
        .count();
    assert!(matches!(
        graph.plan(2),
        Err(GraphError::MaxParallelismBelowParallelism {
            max_parallelism: 4,
            parallelism: 8,
            ..
        })
    ));

    let graph = Graph::new();
    let _ = tagged(&graph, 1, 1).max_parallelism(1 << 16).count();
    assert!(matches!(
        graph.plan(2),
        Err(GraphError::MaxParallelismTooLarge { .. })
    ));

    let graph = Graph::new();
    let _ = tagged(&graph, 2, 1).place(vec![0]).count();
    assert!(matches!(
        graph.plan(2),
        Err(GraphError::PlacementLength { listed: 1, .. })
    ));

    let graph = Graph::new();
    let _ = tagged(&graph, 2, 1).place(vec![0, 5]).count();
    assert!(matches!(
        graph.plan(2),
        Err(GraphError::NoSuchWorker {
            worker: 5,
            workers: 2,
            ..
        })
    ));

    let graph = Graph::new();
    let dangling = tagged(&graph, 1, 1).rebalance();
    drop(dangling);
    assert!(matches!(graph.plan(1), Err(GraphError::NoSink { .. })));
}

#[test]
fn explicit_placement_is_kept() {
    let graph = Graph::new();
    let counted = tagged(&graph, 2, 10)
        .place(vec![1, 1])
        .rebalance()
        .parallelism(1)
        .place(vec![0])
        .count();
    let plan = graph.plan(2).expect("plan");
    assert_eq!(plan[0].workers, vec![1, 1]);
    assert_eq!(plan[1].workers, vec![0]);
    run(graph, 2);
    assert_eq!(counted.records(), 20);
}

/// Buffer debloating on every gate of a graph: every record still arrives once; bad
/// debloating settings refuse the graph before any thread starts.
#[test]
fn debloating_gates_deliver_everything_and_bad_settings_are_refused() {
    use weir_engine::exchange::DebloatConfig;
    use weir_engine::graph::{ExchangeSpec, GraphError};
    let records = 50_000;
    let debloat = DebloatConfig {
        target: std::time::Duration::from_millis(10),
        period: std::time::Duration::from_millis(5),
        samples: 2,
        ..DebloatConfig::new(1)
    };
    let graph = Graph::new()
        .with_parallelism(2)
        .with_exchange(ExchangeSpec {
            debloat: Some(debloat),
            ..ExchangeSpec::default()
        });
    let counted = graph
        .from_generator(records, None, |n| n)
        .key_by(|n: &u64| *n)
        .count();
    run(graph, 2);
    assert_eq!(counted.records(), records);

    let graph = Graph::new().with_exchange(ExchangeSpec {
        debloat: Some(DebloatConfig {
            min_size: 0,
            ..debloat
        }),
        ..ExchangeSpec::default()
    });
    let _counted = graph.from_generator(10, None, |n| n).rebalance().count();
    let error = graph.execute(runtime(1)).unwrap_err();
    assert!(matches!(error, GraphError::Debloat(_)), "{error}");
}

/// A panicking user function fails the job like an error does: every worker stops (the
/// run ends instead of hanging on the panicked subtask's peers), and the error names
/// the subtask and carries the panic's message. The channel's wait is a watchdog
/// against a hang, not a time limit on the run.
#[test]
fn a_panicking_task_fails_the_job_with_its_name_and_message() {
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let graph = Graph::new();
        tagged(&graph, 2, 10_000)
            .map(|(from, n)| {
                if from == 1 && n == 5_000 {
                    panic!("record {n} of subtask {from} is cursed");
                }
                (from, n)
            })
            .rebalance()
            .parallelism(2)
            .count();
        let _ = done.send(graph.execute(runtime(2)).map(|_| ()));
    });
    let result = result
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the run ended (it hung after the panic)");
    let error = result.expect_err("a panicking task fails the job");
    let message = error.to_string();
    match error {
        GraphError::Runtime(RuntimeError::Panic { task, message, .. }) => {
            let task = task.expect("the panicking task is named");
            // The chain's name (source → map) and the subtask that panicked.
            assert!(task.contains("map"), "{task}");
            assert!(task.ends_with("(2/2)"), "{task}");
            assert_eq!(message, "record 5000 of subtask 1 is cursed");
        }
        other => panic!("expected a panic error, got {other:?}"),
    }
    assert!(message.contains("panicked: record 5000"), "{message}");
}

/// A source that cannot go on says so with [`SourceEvent::Failed`]: the job fails with
/// its stage's name and message, after the records it emitted before (none lost on the
/// way to the sink), and no worker is left waiting.
#[test]
fn a_failed_source_fails_the_job_with_its_message() {
    struct Failing(u64);
    impl Source<u64> for Failing {
        fn poll_next(&mut self, _now_ns: u64) -> SourceEvent<u64> {
            if self.0 == 1_000 {
                return SourceEvent::Failed("the log was deleted under me".into());
            }
            self.0 += 1;
            SourceEvent::Record(self.0, None)
        }
    }
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let graph = Graph::new();
        graph
            .from_source(|_: &SubtaskInfo| Failing(0))
            .parallelism(1)
            .rebalance()
            .parallelism(2)
            .count();
        let _ = done.send(graph.execute(runtime(2)).map(|_| ()));
    });
    let error = result
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the run ended (it hung after the failure)")
        .expect_err("a failed source fails the job");
    match &error {
        GraphError::Runtime(RuntimeError::Task { error, .. }) => {
            let failed = error
                .downcast_ref::<weir_engine::graph::SourceFailed>()
                .expect("the source's failure");
            assert!(failed.stage.starts_with("source"), "{}", failed.stage);
            assert_eq!(failed.message, "the log was deleted under me");
        }
        other => panic!("expected a task error, got {other:?}"),
    }
    assert!(
        error.to_string().contains("the log was deleted under me"),
        "{error}"
    );
}
