//! Checkpoints end to end: barriers through chains, exchanges and sinks; restore after
//! a run is stopped mid-way (as a crash would stop it); exactly-once files; keyed state
//! restored at another parallelism.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use weir_engine::async_io::{AsyncConfig, AsyncFunction, OutputMode, ResultFuture};
use weir_engine::checkpoint::transactional::TransactionalFiles;
use weir_engine::checkpoint::AlignmentMode;
use weir_engine::graph::{Checkpointing, Graph, JobResult};
use weir_engine::runtime::{Cores, Runtime, RuntimeError};

/// Completes each call on a thread of its own, so that calls are in flight at barriers.
struct Hop(std::sync::mpsc::Sender<(u64, ResultFuture<u64>)>);

impl Hop {
    fn new() -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<(u64, ResultFuture<u64>)>();
        std::thread::spawn(move || {
            for (value, result) in rx {
                result.complete(vec![value / 3]);
            }
        });
        Hop(tx)
    }
}

impl AsyncFunction for Hop {
    type In = u64;
    type Out = u64;
    fn invoke(&mut self, input: &u64, result: ResultFuture<u64>) {
        let _ = self.0.send((*input, result));
    }
}

/// A fresh directory under the system's temporary directory.
fn scratch() -> Scratch {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        "weir-checkpoints-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).unwrap();
    Scratch(path)
}

struct Scratch(std::path::PathBuf);

impl Scratch {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn runtime() -> Runtime {
    Runtime::builder()
        .cores(Cores::Count(2))
        .pin(false)
        .build()
        .expect("runtime")
}

/// Every committed line of the part files under `dir`, as numbers.
fn committed(dir: &Path, subtasks: usize) -> Vec<u64> {
    let mut all = Vec::new();
    for subtask in 0..subtasks {
        for file in TransactionalFiles::committed(dir, subtask).expect("list") {
            let text = std::fs::read_to_string(&file).expect("read");
            all.extend(text.lines().map(|l| l.parse::<u64>().expect("a number")));
        }
    }
    all.sort_unstable();
    all
}

fn checkpointing(dir: &Path, alignment: AlignmentMode) -> (Checkpointing, Arc<AtomicU64>) {
    let completed = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&completed);
    let settings = Checkpointing::new(dir.join("chk"), Duration::from_millis(20))
        .with_alignment(alignment)
        .with_listener(move |metadata, _| {
            seen.fetch_max(metadata.id, Ordering::Relaxed);
        });
    (settings, completed)
}

/// `records` numbers at `rate` per second through a rebalance and a key_by (two gates
/// of two channels each), a map, and an async operator, into part files.
fn numbers_job(settings: Checkpointing, out: &Path, records: u64, rate: Option<f64>) -> Graph {
    numbers_job_in(settings, out, records, rate, OutputMode::Ordered)
}

/// [`numbers_job`] with the async operator in `mode`.
fn numbers_job_in(
    settings: Checkpointing,
    out: &Path,
    records: u64,
    rate: Option<f64>,
    mode: OutputMode,
) -> Graph {
    let graph = Graph::new()
        .with_parallelism(2)
        .with_checkpointing(settings);
    graph
        .from_generator(records, rate, |n| n)
        .rebalance()
        .map(|n| n * 3)
        .async_wait(|_| Hop::new(), AsyncConfig::new(mode, 8))
        .key_by(|n: &u64| *n)
        .sink_to_files(out.to_path_buf(), |n: &u64, line: &mut Vec<u8>| {
            line.extend_from_slice(format!("{n}\n").as_bytes());
        });
    graph
}

fn wait_for(what: &AtomicU64, at_least: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while what.load(Ordering::Relaxed) < at_least {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint completed in 30 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_bounded_job_commits_every_record_once() {
    let dir = scratch();
    let out = dir.path().join("out");
    let (settings, _) = checkpointing(dir.path(), AlignmentMode::Aligned);
    let graph = numbers_job(settings, &out, 20_000, None);
    let result: JobResult = graph.execute(runtime()).expect("runs");
    let report = result.checkpoints.expect("checkpointed");
    assert!(report.stats.completed >= 1, "{:?}", report.stats);
    assert_eq!(committed(&out, 2), (0..20_000).collect::<Vec<_>>());
}

fn stop_and_restore(alignment: AlignmentMode) {
    stop_and_restore_in(alignment, OutputMode::Ordered);
}

fn stop_and_restore_in(alignment: AlignmentMode, mode: OutputMode) {
    let dir = scratch();
    let out = dir.path().join("out");
    let records = 6_000;
    // First run: stopped at once after its second checkpoint, as a crash stops it.
    let (settings, completed) = checkpointing(dir.path(), alignment);
    let graph = numbers_job_in(settings, &out, records, Some(20_000.0), mode);
    let job = graph.start(runtime()).expect("starts");
    wait_for(&completed, 2);
    job.controller().cancel();
    let (first, failure) = job.join();
    assert!(
        matches!(failure, Some(RuntimeError::Cancelled { .. })),
        "{failure:?}"
    );
    let before = committed(&out, 2).len();
    assert!(
        before < records as usize,
        "the first run was meant to stop mid-way"
    );
    assert!(first.checkpoints.unwrap().stats.completed >= 2);
    // Second run: from the newest checkpoint, to the end.
    let (settings, _) = checkpointing(dir.path(), alignment);
    let settings = settings.restore_from(dir.path().join("chk"));
    let graph = numbers_job_in(settings, &out, records, None, mode);
    let second = graph.execute(runtime()).expect("runs");
    let restored = second
        .checkpoints
        .and_then(|c| c.restored)
        .expect("restored");
    assert!(restored.id >= 2, "{restored:?}");
    assert_eq!(committed(&out, 2), (0..records).collect::<Vec<_>>());
}

#[test]
fn a_stopped_aligned_job_restores_and_commits_every_record_once() {
    stop_and_restore(AlignmentMode::Aligned);
}

#[test]
fn a_stopped_unaligned_job_restores_and_commits_every_record_once() {
    stop_and_restore(AlignmentMode::Unaligned);
}

#[test]
fn the_async_operator_restores_its_held_elements_in_every_mode() {
    for mode in [OutputMode::Unordered, OutputMode::KeyedOrdered] {
        stop_and_restore_in(AlignmentMode::Aligned, mode);
    }
}

#[test]
fn a_stopped_job_with_an_alignment_timeout_restores_exactly_once() {
    stop_and_restore(AlignmentMode::AlignedWithTimeout(Duration::ZERO));
}

/// Counts per key (keys `n % 50`) in keyed state; returns the last count seen per key.
fn keyed_counts(
    settings: Checkpointing,
    records: u64,
    rate: Option<f64>,
    parallelism: usize,
) -> (Graph, weir_engine::graph::Collected<(u64, u64)>) {
    let graph = Graph::new().with_checkpointing(settings);
    let out = graph
        .from_generator(records, rate, |n| n % 50)
        .parallelism(1)
        .key_by(|k: &u64| *k)
        .map_with_state(
            |k: &u64| *k,
            |k, count: &mut Option<u64>| {
                let c = count.unwrap_or(0) + 1;
                *count = Some(c);
                (k, c)
            },
        )
        .parallelism(parallelism)
        .collect();
    (graph, out)
}

fn rescale(from: usize, to: usize) {
    let dir = scratch();
    let records = 5_000;
    let (settings, completed) = checkpointing(dir.path(), AlignmentMode::Aligned);
    let (graph, _) = keyed_counts(settings, records, Some(10_000.0), from);
    let job = graph.start(runtime()).expect("starts");
    wait_for(&completed, 2);
    job.controller().cancel();
    let _ = job.join();
    let (settings, _) = checkpointing(dir.path(), AlignmentMode::Aligned);
    let settings = settings.restore_from(dir.path().join("chk"));
    let (graph, out) = keyed_counts(settings, records, None, to);
    graph.execute(runtime()).expect("runs");
    let mut last: BTreeMap<u64, u64> = BTreeMap::new();
    for (key, count) in out.records() {
        let entry = last.entry(key).or_default();
        *entry = (*entry).max(count);
    }
    // Every key's count carried over from the checkpoint, wherever the key went.
    assert_eq!(last.len(), 50);
    for (key, count) in last {
        assert_eq!(count, records / 50, "key {key}");
    }
}

#[test]
fn keyed_state_restores_from_parallelism_2_to_3() {
    rescale(2, 3);
}

#[test]
fn keyed_state_restores_from_parallelism_3_to_2() {
    rescale(3, 2);
}

#[test]
fn restoring_other_state_at_another_parallelism_is_refused() {
    let dir = scratch();
    let out = dir.path().join("out");
    let (settings, completed) = checkpointing(dir.path(), AlignmentMode::Aligned);
    let job = numbers_job(settings, &out, 1_000_000, Some(20_000.0))
        .start(runtime())
        .expect("starts");
    wait_for(&completed, 1);
    job.controller().cancel();
    let _ = job.join();
    let (settings, _) = checkpointing(dir.path(), AlignmentMode::Aligned);
    let graph = Graph::new()
        .with_parallelism(3)
        .with_checkpointing(settings.restore_from(dir.path().join("chk")));
    graph
        .from_generator(1_000_000, None, |n| n)
        .rebalance()
        .map(|n| n * 3)
        .async_wait(|_| Hop::new(), AsyncConfig::new(OutputMode::Ordered, 8))
        .key_by(|n: &u64| *n)
        .sink_to_files(out, |n: &u64, line: &mut Vec<u8>| {
            line.extend_from_slice(format!("{n}\n").as_bytes());
        });
    let error = graph.execute(runtime()).expect_err("refused");
    let message = error.to_string();
    assert!(message.contains("parallelism 2"), "{message}");
}

#[test]
fn a_checkpoint_of_another_job_is_refused() {
    let dir = scratch();
    let (settings, _) = checkpointing(dir.path(), AlignmentMode::Aligned);
    let (graph, _) = keyed_counts(settings, 5_000, Some(50_000.0), 2);
    graph.execute(runtime()).expect("runs");
    let (settings, _) = checkpointing(dir.path(), AlignmentMode::Aligned);
    let graph = numbers_job(
        settings.restore_from(dir.path().join("chk")),
        &dir.path().join("out"),
        10,
        None,
    );
    let error = graph.execute(runtime()).expect_err("refused");
    assert!(error.to_string().contains("another job"), "{error}");
}

#[test]
fn a_source_that_cannot_be_replayed_fails_its_checkpoints_and_says_why() {
    use weir_engine::graph::{Source, SourceEvent};
    struct Forever;
    impl Source<u64> for Forever {
        fn poll_next(&mut self, now_ns: u64) -> SourceEvent<u64> {
            SourceEvent::Idle {
                until_ns: Some(now_ns + 1_000_000),
            }
        }
    }
    let dir = scratch();
    let (settings, _) = checkpointing(dir.path(), AlignmentMode::Aligned);
    let graph = Graph::new().with_checkpointing(settings);
    graph.from_source(|_| Forever).rebalance().count();
    let (_, failure) = graph.execute_to_end(runtime()).expect("starts");
    let message = failure.expect("fails").to_string();
    assert!(message.contains("cannot be replayed"), "{message}");
}

/// `records` numbers at 40 k/s, keyed over 2 subtasks, through a map that panics once
/// (the first time it sees 4000, `failed` says whether it did), into part files under
/// `out`, checkpointing into `dir`.
fn fails_once_at_4000(
    dir: &std::path::Path,
    out: &std::path::Path,
    records: u64,
    failed: &Arc<std::sync::atomic::AtomicBool>,
) -> Graph {
    let (settings, _) = checkpointing(dir, AlignmentMode::Aligned);
    let graph = Graph::new()
        .with_parallelism(2)
        .with_checkpointing(settings);
    let failed = Arc::clone(failed);
    graph
        .from_generator(records, Some(40_000.0), |n| n)
        .key_by(|n: &u64| *n)
        .map(move |n| {
            if n == 4_000 && !failed.swap(true, Ordering::Relaxed) {
                panic!("injected failure at record 4000");
            }
            n
        })
        .sink_to_files(out.to_path_buf(), |n: &u64, line: &mut Vec<u8>| {
            line.extend_from_slice(format!("{n}\n").as_bytes());
        });
    graph
}

#[test]
fn a_failed_task_restarts_the_job_from_its_latest_checkpoint() {
    use weir_engine::checkpoint::RestartStrategy;
    use weir_engine::graph::execute_with_restarts;
    let dir = scratch();
    let out = dir.path().join("out");
    let records = 6_000u64;
    // The map fails once, at record 4000, after checkpoints have completed.
    let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut restarts_seen = Vec::new();
    let (result, failure, restarts) = execute_with_restarts(
        "fixed-delay:3:10ms".parse::<RestartStrategy>().unwrap(),
        || {
            Ok((
                fails_once_at_4000(dir.path(), &out, records, &failed),
                runtime(),
            ))
        },
        |n, _, error| restarts_seen.push((n, error.to_string())),
    )
    .expect("starts");
    assert!(failure.is_none(), "{failure:?}");
    assert_eq!(restarts, 1);
    assert!(
        restarts_seen[0].1.contains("injected failure"),
        "{restarts_seen:?}"
    );
    let restored = result
        .checkpoints
        .and_then(|c| c.restored)
        .expect("restored");
    assert!(restored.id >= 1);
    assert_eq!(committed(&out, 2), (0..records).collect::<Vec<_>>());
}

/// A job fails after checkpoints completed, and the newest completed checkpoint is
/// damaged before the restart: the restart is refused by the file's name, and nothing is
/// committed twice (a fresh start or an older checkpoint would replay committed output).
#[test]
fn a_restart_over_a_damaged_newest_checkpoint_fails_by_name_and_never_starts_fresh() {
    use weir_engine::checkpoint::RestartStrategy;
    use weir_engine::graph::execute_with_restarts;
    let dir = scratch();
    let out = dir.path().join("out");
    let chk = dir.path().join("chk");
    let records = 6_000u64;
    let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut restarts_seen = 0;
    let built = std::cell::Cell::new(0);
    let outcome = execute_with_restarts(
        "fixed-delay:3:10ms".parse::<RestartStrategy>().unwrap(),
        || {
            built.set(built.get() + 1);
            if built.get() == 2 {
                // The failed attempt is over (no checkpoint of it completes any more):
                // damage the newest completed checkpoint's first state file, which the
                // restart must find damaged.
                let newest = weir_engine::checkpoint::storage::newest_completed(&chk)
                    .unwrap()
                    .expect("a checkpoint completed before record 4000");
                let state = std::fs::read_dir(chk.join(format!("chk-{newest}")))
                    .unwrap()
                    .map(|e| e.unwrap().path())
                    .find(|p| p.extension().is_some_and(|e| e == "state"))
                    .expect("a state file");
                let mut bytes = std::fs::read(&state).unwrap();
                let middle = bytes.len() / 2;
                bytes[middle] ^= 0x10;
                std::fs::write(&state, bytes).unwrap();
            }
            Ok((
                fails_once_at_4000(dir.path(), &out, records, &failed),
                runtime(),
            ))
        },
        |_, _, _| restarts_seen += 1,
    );
    let error = match outcome {
        Err(error) => error.to_string(),
        Ok((_, failure, _)) => panic!("the job ran on after the damage: {failure:?}"),
    };
    assert!(error.contains("cannot be restored"), "{error}");
    assert!(error.contains(".state"), "{error}");
    assert_eq!(
        restarts_seen, 1,
        "one restart was tried, and it was refused"
    );
    assert_eq!(built.get(), 2);
    // What was committed before the failure is there once, and nothing more was.
    let lines = committed(&out, 2);
    let mut unique = lines.clone();
    unique.dedup();
    assert_eq!(lines.len(), unique.len(), "a line committed twice");
    assert!(lines.len() < records as usize);
}

#[test]
fn a_fresh_start_over_an_earlier_run_s_checkpoints_is_refused() {
    let dir = scratch();
    let (settings, _) = checkpointing(dir.path(), AlignmentMode::Aligned);
    let graph = numbers_job(settings, &dir.path().join("out"), 5_000, None);
    graph.execute(runtime()).expect("runs");
    let (settings, _) = checkpointing(dir.path(), AlignmentMode::Aligned);
    let graph = numbers_job(settings, &dir.path().join("out"), 5_000, None);
    let error = graph.execute(runtime()).expect_err("refused");
    assert!(error.to_string().contains("restore from it"), "{error}");
}

#[test]
fn map_state_restores_at_another_parallelism() {
    use std::collections::BTreeMap;
    // Per key (n % 20): how many records of each residue n % 7 it saw.
    type Residues = weir_engine::graph::Collected<(u64, BTreeMap<u64, u64>)>;
    fn job(
        settings: Checkpointing,
        records: u64,
        rate: Option<f64>,
        parallelism: usize,
    ) -> (Graph, Residues) {
        let graph = Graph::new().with_checkpointing(settings);
        let out = graph
            .from_generator(records, rate, |n| n)
            .parallelism(1)
            .key_by(|n: &u64| *n % 20)
            .map_with_state(
                |n: &u64| *n % 20,
                |n, state: &mut Option<BTreeMap<u64, u64>>| {
                    let map = state.get_or_insert_with(BTreeMap::new);
                    *map.entry(n % 7).or_default() += 1;
                    (n % 20, map.clone())
                },
            )
            .parallelism(parallelism)
            .collect();
        (graph, out)
    }
    let dir = scratch();
    let records = 4_200;
    let (settings, completed) = checkpointing(dir.path(), AlignmentMode::Aligned);
    let (graph, _) = job(settings, records, Some(10_000.0), 2);
    let running = graph.start(runtime()).expect("starts");
    wait_for(&completed, 2);
    running.controller().cancel();
    let _ = running.join();
    let (settings, _) = checkpointing(dir.path(), AlignmentMode::Aligned);
    let (graph, out) = job(
        settings.restore_from(dir.path().join("chk")),
        records,
        None,
        3,
    );
    graph.execute(runtime()).expect("runs");
    let mut last: BTreeMap<u64, BTreeMap<u64, u64>> = BTreeMap::new();
    for (key, map) in out.records() {
        let total: u64 = map.values().sum();
        let entry = last.entry(key).or_default();
        if total > entry.values().sum::<u64>() {
            *entry = map;
        }
    }
    for key in 0..20u64 {
        let mut expected: BTreeMap<u64, u64> = BTreeMap::new();
        for n in (key..records).step_by(20) {
            *expected.entry(n % 7).or_default() += 1;
        }
        assert_eq!(last[&key], expected, "key {key}");
    }
}

/// Answers each batch on a thread of its own, so that batches are both held and in
/// flight at barriers.
struct BatchHop(std::sync::mpsc::Sender<(Vec<u64>, weir_engine::async_io::BatchResult<u64>)>);

impl BatchHop {
    fn new() -> Self {
        let (tx, rx) =
            std::sync::mpsc::channel::<(Vec<u64>, weir_engine::async_io::BatchResult<u64>)>();
        std::thread::spawn(move || {
            for (inputs, result) in rx {
                result.complete(inputs.iter().map(|v| vec![v / 3]).collect());
            }
        });
        BatchHop(tx)
    }
}

impl weir_engine::async_io::AsyncBatchFunction for BatchHop {
    type In = u64;
    type Out = u64;
    fn invoke_batch(&mut self, inputs: &[u64], result: weir_engine::async_io::BatchResult<u64>) {
        let _ = self.0.send((inputs.to_vec(), result));
    }
}

/// Batched async calls join checkpoints: a job stopped at once after its second
/// checkpoint (records held in partial batches and batches in flight) and restored
/// commits every record exactly once.
#[test]
fn batched_async_calls_restore_their_held_and_in_flight_records() {
    let batched_job = |settings: Checkpointing, out: &Path, records: u64, rate: Option<f64>| {
        let graph = Graph::new()
            .with_parallelism(2)
            .with_checkpointing(settings);
        graph
            .from_generator(records, rate, |n| n)
            .rebalance()
            .map(|n| n * 3)
            .async_wait_batch(
                |_| (BatchHop::new(), None),
                AsyncConfig::new(OutputMode::Unordered, 64),
                weir_engine::async_io::BatchConfig::new(16, Duration::from_millis(5)),
            )
            .key_by(|n: &u64| *n)
            .sink_to_files(out.to_path_buf(), |n: &u64, line: &mut Vec<u8>| {
                line.extend_from_slice(format!("{n}\n").as_bytes());
            });
        graph
    };
    let dir = scratch();
    let out = dir.path().join("out");
    let records = 6_000;
    let (settings, completed) = checkpointing(dir.path(), AlignmentMode::Aligned);
    let job = batched_job(settings, &out, records, Some(20_000.0))
        .start(runtime())
        .expect("starts");
    wait_for(&completed, 2);
    job.controller().cancel();
    let (_, failure) = job.join();
    assert!(
        matches!(failure, Some(RuntimeError::Cancelled { .. })),
        "{failure:?}"
    );
    assert!(
        committed(&out, 2).len() < records as usize,
        "stopped mid-way"
    );
    let (settings, _) = checkpointing(dir.path(), AlignmentMode::Aligned);
    let settings = settings.restore_from(dir.path().join("chk"));
    let second = batched_job(settings, &out, records, None)
        .execute(runtime())
        .expect("runs");
    for wakeups in &second.run.wakeups {
        assert_eq!(
            wakeups.rescued, 0,
            "a lost wake-up was rescued: {wakeups:?}"
        );
    }
    assert!(second.checkpoints.and_then(|c| c.restored).is_some());
    assert_eq!(committed(&out, 2), (0..records).collect::<Vec<_>>());
}

/// A bounded source whose output all sits queued in front of a slow consumer when its
/// input ends: the unaligned checkpoints triggered after it left overtake that output
/// (announced on its channel, which the consumer reads ahead to its end and stores as
/// channel state) instead of waiting for the consumer to work through it, and a run
/// restored from one of them commits every record once.
#[test]
fn unaligned_checkpoints_after_a_source_ended_overtake_its_queued_output() {
    const RECORDS: u64 = 3_000;
    let dir = scratch();
    let out = dir.path().join("out");
    let processed = Arc::new(AtomicU64::new(0));
    // The consumer's progress when each checkpoint completed.
    let seen: Arc<std::sync::Mutex<Vec<(u64, u64)>>> = Arc::default();
    let job = |settings: Checkpointing, slow: bool, processed: Arc<AtomicU64>| {
        let graph = Graph::new()
            .with_parallelism(1)
            .with_checkpointing(settings);
        graph
            .from_generator(RECORDS, None, |n| n)
            .rebalance()
            .map(move |n| {
                if slow {
                    // 3,000 records of 0.5 ms: the backlog takes 1.5 s to consume,
                    // where the source ends within its first milliseconds.
                    std::thread::sleep(Duration::from_micros(500));
                }
                processed.fetch_add(1, Ordering::Relaxed);
                n
            })
            .sink_to_files(out.clone(), |n: &u64, line: &mut Vec<u8>| {
                line.extend_from_slice(format!("{n}\n").as_bytes());
            });
        graph
    };
    let settings = {
        let (seen, processed) = (Arc::clone(&seen), Arc::clone(&processed));
        Checkpointing::new(dir.path().join("chk"), Duration::from_millis(20))
            .with_alignment(AlignmentMode::Unaligned)
            .with_listener(move |metadata, _| {
                seen.lock()
                    .unwrap()
                    .push((metadata.id, processed.load(Ordering::Relaxed)));
            })
    };
    let running = job(settings, true, Arc::clone(&processed))
        .start(runtime())
        .expect("starts");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let early = loop {
        let early = seen
            .lock()
            .unwrap()
            .iter()
            .find(|(_, at)| *at < RECORDS / 2)
            .copied();
        if let Some(early) = early {
            break early;
        }
        assert!(
            processed.load(Ordering::Relaxed) < RECORDS / 2,
            "no checkpoint completed before the consumer was halfway through the \
             backlog: the barriers waited behind it (completed: {:?})",
            seen.lock().unwrap()
        );
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint in 30 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    // Stopped as a crash stops it, with the backlog still unconsumed.
    running.controller().cancel();
    let _ = running.join();
    let before = committed(&out, 1).len();
    assert!(before < RECORDS as usize, "stopped at {before}: {early:?}");
    // Restored: the source is at its end; the rest comes from the channel state.
    let (settings, _) = checkpointing(dir.path(), AlignmentMode::Unaligned);
    let second = job(
        settings.restore_from(dir.path().join("chk")),
        false,
        Arc::default(),
    )
    .execute(runtime())
    .expect("runs");
    let restored = second
        .checkpoints
        .and_then(|c| c.restored)
        .expect("restored");
    assert!(restored.id >= early.0, "{restored:?} {early:?}");
    assert_eq!(committed(&out, 1), (0..RECORDS).collect::<Vec<_>>());
}

/// Aligned with a timeout, as Flink's `aligned-checkpoint-timeout` counts it: from the
/// barrier's start, not from its arrival at the consumer. Behind a back-pressured queue
/// of some 20,000 records that take 0.1 ms each, the barrier would arrive after seconds;
/// announced as it is written, its checkpoint times out at the consumer after 10 ms,
/// switches to unaligned and stores the queue as channel state, and a restore from it
/// commits every record once.
#[test]
fn an_aligned_checkpoint_stuck_behind_a_backlog_times_out_into_unaligned() {
    const RECORDS: u64 = 100_000;
    let mode = AlignmentMode::AlignedWithTimeout(Duration::from_millis(10));
    let dir = scratch();
    let out = dir.path().join("out");
    let processed = Arc::new(AtomicU64::new(0));
    // The consumer's progress and the state's size when each checkpoint completed.
    let seen: Arc<std::sync::Mutex<Vec<(u64, u64, u64)>>> = Arc::default();
    let job = |settings: Checkpointing, slow: bool, processed: Arc<AtomicU64>| {
        let graph = Graph::new()
            .with_parallelism(1)
            .with_checkpointing(settings);
        graph
            .from_generator(RECORDS, None, |n| n)
            .rebalance()
            .map(move |n| {
                if slow {
                    std::thread::sleep(Duration::from_micros(100));
                }
                processed.fetch_add(1, Ordering::Relaxed);
                n
            })
            .sink_to_files(out.clone(), |n: &u64, line: &mut Vec<u8>| {
                line.extend_from_slice(format!("{n}\n").as_bytes());
            });
        graph
    };
    let settings = {
        let (seen, processed) = (Arc::clone(&seen), Arc::clone(&processed));
        Checkpointing::new(dir.path().join("chk"), Duration::from_millis(20))
            .with_alignment(mode)
            .with_listener(move |metadata, _| {
                seen.lock().unwrap().push((
                    metadata.id,
                    processed.load(Ordering::Relaxed),
                    metadata.state_bytes(),
                ));
            })
    };
    let running = job(settings, true, Arc::clone(&processed))
        .start(runtime())
        .expect("starts");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let first = loop {
        let first = seen.lock().unwrap().first().copied();
        if let Some(first) = first {
            break first;
        }
        assert!(
            processed.load(Ordering::Relaxed) < 5_000,
            "no checkpoint completed before the consumer had taken 5,000 records: the \
             barrier waited behind the queue, its timeout counted from its arrival"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint in 30 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    // Switched to unaligned: the queue in front of the barrier is in the checkpoint.
    assert!(
        first.2 > 10_000,
        "a checkpoint without channel state: {first:?}"
    );
    running.controller().cancel();
    let (result, _) = running.join();
    // The figures count it as channel state (data in flight persisted).
    let stats = result.checkpoints.expect("checkpoints").stats;
    assert!(
        stats.channel_state.first().is_some_and(|b| *b > 10_000),
        "{:?}",
        stats.channel_state
    );
    let before = committed(&out, 1).len();
    assert!(before < RECORDS as usize, "stopped at {before}: {first:?}");
    let (settings, _) = checkpointing(dir.path(), mode);
    let second = job(
        settings.restore_from(dir.path().join("chk")),
        false,
        Arc::default(),
    )
    .execute(runtime())
    .expect("runs");
    assert!(second.checkpoints.and_then(|c| c.restored).is_some());
    assert_eq!(committed(&out, 1), (0..RECORDS).collect::<Vec<_>>());
}

/// A task whose chain is slow per record looks at its gate between short runs, so an
/// unaligned barrier announced ahead of the data is taken within a record or two, not
/// after the run of up to 256 records the task took last (half a second at 2 ms a record).
/// Counted in records the operator processed between a checkpoint's trigger and its
/// completion, not in time; the first checkpoint of three jobs (later ones find the
/// channel state of the first being replayed record by record, which hides the runs).
#[test]
fn a_slow_chain_takes_announced_barriers_between_records() {
    let during: Vec<usize> = (0..3)
        .map(|_| records_while_the_first_checkpoint_pends())
        .collect();
    // The trigger time has a millisecond's resolution and the service writes the state
    // after the snapshot: a few records either way, never a run's worth.
    assert!(
        during.iter().all(|&n| n < 20),
        "records processed while each job's first checkpoint was pending: {during:?} (the \
         barrier waited for the run the task had taken)"
    );
}

fn records_while_the_first_checkpoint_pends() -> usize {
    let dir = scratch();
    let out = dir.path().join("out");
    // When each record was processed, µs since the Unix epoch.
    let processed_at: Arc<std::sync::Mutex<Vec<u128>>> = Arc::default();
    // Records processed while each completed checkpoint was pending.
    let during: Arc<std::sync::Mutex<Vec<usize>>> = Arc::default();
    let unix_us = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros()
    };
    let settings = {
        let (processed_at, during) = (Arc::clone(&processed_at), Arc::clone(&during));
        Checkpointing::new(dir.path().join("chk"), Duration::from_millis(50))
            .with_alignment(AlignmentMode::Unaligned)
            .with_listener(move |metadata, _| {
                let triggered = u128::from(metadata.triggered_unix_ms) * 1000;
                let after = processed_at
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|&&at| at >= triggered)
                    .count();
                during.lock().unwrap().push(after);
            })
    };
    let graph = Graph::new()
        .with_parallelism(1)
        .with_checkpointing(settings);
    {
        let processed_at = Arc::clone(&processed_at);
        graph
            .from_generator(100_000, None, |n| n)
            .rebalance()
            .map(move |n| {
                std::thread::sleep(Duration::from_millis(2));
                processed_at.lock().unwrap().push(unix_us());
                n
            })
            .sink_to_files(out, |n: &u64, line: &mut Vec<u8>| {
                line.extend_from_slice(format!("{n}\n").as_bytes());
            });
    }
    let running = graph.start(runtime()).expect("starts");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while during.lock().unwrap().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint in 60 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    running.controller().cancel();
    let _ = running.join();
    let first = during.lock().unwrap()[0];
    first
}
