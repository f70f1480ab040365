//! The Redis Streams sink against a real server: at least once in order, trimming,
//! back-pressure, exactly once across a stop and restore and across a failure and
//! restart, a restore of transactions already committed, an error reply failing the
//! job, and a server restarted mid-run.
//!
//! The tests find Redis through `WEIR_REDIS_URL` (`scripts/test.sh` and CI set it after
//! `scripts/redis.sh start`); without it they print a note and pass. The restart test
//! starts a server of its own with the `redis-server` binary next to it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis_protocol::resp2::types::OwnedFrame;
use weir_engine::checkpoint::AlignmentMode;
use weir_engine::graph::{Checkpointing, Graph, Sink, SubtaskInfo};
use weir_engine::runtime::{Cores, Runtime, RuntimeError, TaskError};
use weir_net::redis::streams::{
    produce, stream_sink, Fields, Guarantee, StreamSink, StreamSinkConfig,
};
use weir_net::redis::{BlockingConnection, RedisServer, RedisUrl, ServerOptions};
use weir_net::DriverKind;

fn redis(test: &str) -> Option<RedisUrl> {
    weir_net::redis::test_server_url(test)
}

/// A stream name no other test (or run) uses.
fn unique(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "weir:test:sink:{name}:{}:{nanos}:{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn connect(url: &RedisUrl) -> BlockingConnection {
    BlockingConnection::connect(url, Duration::from_secs(5)).expect("connects")
}

/// Removes a test's keys when it ends, passed or not.
struct Keys(RedisUrl, Vec<String>);

impl Drop for Keys {
    fn drop(&mut self) {
        if let Ok(mut connection) = BlockingConnection::connect(&self.0, Duration::from_secs(1)) {
            for key in &self.1 {
                let _ = connection.command(&[b"DEL", key.as_bytes()]);
            }
        }
    }
}

/// The marker keys of `config`'s subtasks `0..subtasks`, with its stream.
fn keys(config: &StreamSinkConfig, subtasks: usize) -> Keys {
    let mut keys = vec![config.stream.clone()];
    keys.extend((0..subtasks).map(|i| format!("{}:{i}", config.transaction_prefix)));
    Keys(config.url.clone(), keys)
}

fn text(frame: &OwnedFrame) -> String {
    match frame {
        OwnedFrame::BulkString(bytes) | OwnedFrame::SimpleString(bytes) => {
            String::from_utf8_lossy(bytes).into_owned()
        }
        other => panic!("not a string: {other:?}"),
    }
}

/// The stream's entries in order (`XRANGE`, a page of 1000 at a time: the blocking
/// connection decodes a reply again with each read, so a big one is slow to read),
/// each entry's field/value pairs.
fn entries(url: &RedisUrl, stream: &str) -> Vec<Vec<(String, String)>> {
    let mut connection = connect(url);
    let mut all = Vec::new();
    let mut from = "-".to_string();
    loop {
        let reply = connection
            .command(&[
                b"XRANGE",
                stream.as_bytes(),
                from.as_bytes(),
                b"+",
                b"COUNT",
                b"1000",
            ])
            .expect("XRANGE");
        let OwnedFrame::Array(page) = reply else {
            panic!("XRANGE answered {reply:?}");
        };
        if page.is_empty() {
            return all;
        }
        for entry in &page {
            let OwnedFrame::Array(parts) = entry else {
                panic!("an entry {entry:?}");
            };
            let OwnedFrame::Array(fields) = &parts[1] else {
                panic!("fields {:?}", parts[1]);
            };
            all.push(
                fields
                    .chunks(2)
                    .map(|pair| (text(&pair[0]), text(&pair[1])))
                    .collect(),
            );
            // The next page starts after this id (exclusive range).
            from = format!("({}", text(&parts[0]));
        }
    }
}

/// The `n` field of each entry, in stream order.
fn numbers(url: &RedisUrl, stream: &str) -> Vec<u64> {
    entries(url, stream)
        .iter()
        .map(|fields| {
            let (_, n) = fields.iter().find(|(f, _)| f == "n").expect("an n field");
            n.parse().expect("a number")
        })
        .collect()
}

fn stream_len(url: &RedisUrl, stream: &str) -> u64 {
    match connect(url).command(&[b"XLEN", stream.as_bytes()]) {
        Ok(OwnedFrame::Integer(n)) => n as u64,
        other => panic!("XLEN answered {other:?}"),
    }
}

fn runtime() -> Runtime {
    runtime_on(DriverKind::Epoll)
}

fn runtime_on(driver: DriverKind) -> Runtime {
    Runtime::builder()
        .cores(Cores::Count(2))
        .pin(false)
        .driver(weir_net::driver_factory(driver))
        .build()
        .expect("runtime")
}

/// Epoll, and io_uring where the kernel allows it.
fn drivers() -> Vec<DriverKind> {
    let mut kinds = vec![DriverKind::Epoll];
    if weir_net::build_driver(DriverKind::Uring).is_ok() {
        kinds.push(DriverKind::Uring);
    } else {
        eprintln!("note: io_uring unavailable here; the epoll driver only");
    }
    kinds
}

/// Each record `n` as an entry `n=<n>`, `kind=number`.
fn format(n: &u64, fields: &mut Fields) {
    fields
        .push_fmt("n", format_args!("{n}"))
        .push("kind", "number");
}

/// `0..records` from an iterator into `config`'s sink, one subtask.
fn write_numbers(config: &StreamSinkConfig, records: u64) -> weir_engine::graph::JobResult {
    write_numbers_on(DriverKind::Epoll, config, records)
}

fn write_numbers_on(
    driver: DriverKind,
    config: &StreamSinkConfig,
    records: u64,
) -> weir_engine::graph::JobResult {
    let graph = Graph::new().with_parallelism(1);
    let config = config.clone();
    graph
        .from_iter(move |_| 0..records)
        .sink_io(move |info| stream_sink(&config, info, format));
    graph.execute(runtime_on(driver)).expect("runs")
}

/// At least once, and exactly once in a job without checkpoints (which writes at
/// once), on each driver: every record is one entry, in order, with the fields the
/// format wrote.
#[test]
fn every_record_is_written_in_order() {
    let Some(url) = redis("every_record_is_written_in_order") else {
        return;
    };
    let runs = drivers().into_iter().flat_map(|driver| {
        [Guarantee::AtLeastOnce, Guarantee::ExactlyOnce].map(|guarantee| (driver, guarantee))
    });
    for (driver, guarantee) in runs {
        let mut config = StreamSinkConfig::new(url.clone(), unique("order"));
        config.guarantee = guarantee;
        let _keys = keys(&config, 1);
        let records = 20_000;
        write_numbers_on(driver, &config, records);
        assert_eq!(
            numbers(&url, &config.stream),
            (0..records).collect::<Vec<_>>(),
            "{driver:?} {guarantee:?}"
        );
        assert_eq!(
            entries(&url, &config.stream)[7],
            vec![("n".into(), "7".into()), ("kind".into(), "number".into())]
        );
        let stats = config.stats.snapshot();
        assert_eq!(stats.entries, records, "{stats:?}");
        assert_eq!(stats.commands, records, "{stats:?}");
        assert_eq!(
            (stats.reconnects, stats.errors, stats.transactions),
            (0, 0, 0)
        );
    }
}

/// `MAXLEN ~ 100` keeps the stream near 100 entries (never below, at most a node of
/// entries above), and what it keeps is the newest, in order.
#[test]
fn maxlen_keeps_the_stream_near_its_bound() {
    let Some(url) = redis("maxlen_keeps_the_stream_near_its_bound") else {
        return;
    };
    let mut config = StreamSinkConfig::new(url.clone(), unique("maxlen"));
    config.maxlen = Some(100);
    let _keys = keys(&config, 1);
    let records = 5_000;
    write_numbers(&config, records);
    let kept = numbers(&url, &config.stream);
    // Redis trims whole nodes of `stream-node-max-entries` (100 by default).
    assert!(
        (100..=300).contains(&kept.len()),
        "{} entries kept",
        kept.len()
    );
    let first = records - kept.len() as u64;
    assert_eq!(kept, (first..records).collect::<Vec<_>>());
}

/// Two entries in flight at most: the sink holds its input back (the stage reports
/// back-pressured time) and still writes every record, in order.
#[test]
fn a_small_in_flight_limit_holds_input_back_and_writes_everything() {
    let Some(url) = redis("a_small_in_flight_limit_holds_input_back_and_writes_everything") else {
        return;
    };
    let mut config = StreamSinkConfig::new(url.clone(), unique("inflight"));
    config.max_in_flight = 2;
    let _keys = keys(&config, 1);
    let records = 3_000;
    let result = write_numbers(&config, records);
    assert_eq!(
        numbers(&url, &config.stream),
        (0..records).collect::<Vec<_>>()
    );
    assert!(
        result.stages[0].backpressured_ns > 0,
        "{:?}",
        result.stages[0]
    );
}

/// A fresh directory under the system's temporary directory.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "weir-stream-sink-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("scratch directory");
        Scratch(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Checkpoints every 20 ms into `dir/chk`, and the newest completed.
fn checkpointing(dir: &Path) -> (Checkpointing, Arc<AtomicU64>) {
    let completed = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&completed);
    let settings = Checkpointing::new(dir.join("chk"), Duration::from_millis(20))
        .with_alignment(AlignmentMode::Aligned)
        .with_listener(move |metadata, _| {
            seen.fetch_max(metadata.id, Ordering::Relaxed);
        });
    (settings, completed)
}

fn wait_for(what: &AtomicU64, at_least: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while what.load(Ordering::Relaxed) < at_least {
        assert!(Instant::now() < deadline, "no checkpoint completed in 30 s");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// `records` numbers at `rate` per second from two subtasks through a rebalance into
/// two exactly-once sinks.
fn exactly_once_job(
    settings: Checkpointing,
    config: &StreamSinkConfig,
    records: u64,
    rate: Option<f64>,
) -> Graph {
    let graph = Graph::new()
        .with_parallelism(2)
        .with_checkpointing(settings);
    let config = config.clone();
    graph
        .from_generator(records, rate, |n| n)
        .rebalance()
        .sink_io(move |info| stream_sink(&config, info, format));
    graph
}

fn sorted(mut numbers: Vec<u64>) -> Vec<u64> {
    numbers.sort_unstable();
    numbers
}

/// A job stopped at once after its second checkpoint (as a crash stops it) has
/// written only committed transactions, each record once; restored from its newest
/// checkpoint and run to the end, every record is in the stream exactly once.
#[test]
fn exactly_once_across_a_stop_and_restore() {
    let Some(url) = redis("exactly_once_across_a_stop_and_restore") else {
        return;
    };
    let dir = Scratch::new();
    let mut config = StreamSinkConfig::new(url.clone(), unique("eos-stop"));
    config.guarantee = Guarantee::ExactlyOnce;
    let _keys = keys(&config, 2);
    let records = 6_000;
    let (settings, completed) = checkpointing(dir.path());
    let job = exactly_once_job(settings, &config, records, Some(20_000.0))
        .start(runtime())
        .expect("starts");
    wait_for(&completed, 2);
    job.controller().cancel();
    let (first, failure) = job.join();
    assert!(
        matches!(failure, Some(RuntimeError::Cancelled { .. })),
        "{failure:?}"
    );
    assert!(first.checkpoints.expect("checkpointed").stats.completed >= 2);
    let before = numbers(&url, &config.stream);
    assert!(before.len() < records as usize, "meant to stop mid-way");
    let mut distinct = sorted(before.clone());
    distinct.dedup();
    assert_eq!(distinct.len(), before.len(), "a record written twice");

    let (settings, _) = checkpointing(dir.path());
    let settings = settings.restore_from(dir.path().join("chk"));
    let second = exactly_once_job(settings, &config, records, None)
        .execute(runtime())
        .expect("runs");
    let restored = second
        .checkpoints
        .and_then(|c| c.restored)
        .expect("restored");
    assert!(restored.id >= 2, "{restored:?}");
    assert_eq!(
        sorted(numbers(&url, &config.stream)),
        (0..records).collect::<Vec<_>>()
    );
    assert!(config.stats.snapshot().transactions >= 2);
}

/// A task that fails mid-run restarts the job from its newest checkpoint: every
/// record is in the stream exactly once.
#[test]
fn exactly_once_across_a_failure_and_restart() {
    use weir_engine::checkpoint::RestartStrategy;
    use weir_engine::graph::execute_with_restarts;
    let Some(url) = redis("exactly_once_across_a_failure_and_restart") else {
        return;
    };
    let dir = Scratch::new();
    let mut config = StreamSinkConfig::new(url.clone(), unique("eos-fail"));
    config.guarantee = Guarantee::ExactlyOnce;
    let _keys = keys(&config, 2);
    let records = 6_000u64;
    let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (result, failure, restarts) = execute_with_restarts(
        "fixed-delay:3:10ms"
            .parse::<RestartStrategy>()
            .expect("strategy"),
        || {
            let (settings, _) = checkpointing(dir.path());
            let graph = Graph::new()
                .with_parallelism(2)
                .with_checkpointing(settings);
            let failed = Arc::clone(&failed);
            let config = config.clone();
            graph
                .from_generator(records, Some(40_000.0), |n| n)
                .rebalance()
                .map(move |n| {
                    if n == 4_000 && !failed.swap(true, Ordering::Relaxed) {
                        panic!("injected failure at record 4000");
                    }
                    n
                })
                .sink_io(move |info| stream_sink(&config, info, format));
            Ok((graph, runtime()))
        },
        |_, _, _| {},
    )
    .expect("starts");
    assert!(failure.is_none(), "{failure:?}");
    assert_eq!(restarts, 1);
    assert!(result.checkpoints.and_then(|c| c.restored).is_some());
    assert_eq!(
        sorted(numbers(&url, &config.stream)),
        (0..records).collect::<Vec<_>>()
    );
}

/// The stream sink with every state it pre-committed recorded, and each completed
/// checkpoint notified twice.
struct Recording {
    inner: StreamSink<u64, fn(&u64, &mut Fields)>,
    states: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Sink<u64> for Recording {
    fn invoke(&mut self, value: u64, timestamp: Option<i64>, now_ns: u64) -> Result<(), TaskError> {
        self.inner.invoke(value, timestamp, now_ns)
    }
    fn accepts(&mut self) -> bool {
        self.inner.accepts()
    }
    fn room(&mut self) -> usize {
        self.inner.room()
    }
    fn poll(&mut self, now_ns: u64) -> Result<bool, TaskError> {
        self.inner.poll(now_ns)
    }
    fn flushed(&mut self) -> bool {
        self.inner.flushed()
    }
    fn snapshot_state(&mut self, checkpoint: u64) -> Result<Option<Vec<u8>>, TaskError> {
        let state = self.inner.snapshot_state(checkpoint)?;
        if let Some(state) = &state {
            self.states.lock().expect("states").push(state.clone());
        }
        Ok(state)
    }
    fn notify_checkpoint_complete(&mut self, checkpoint: u64) -> Result<(), TaskError> {
        self.inner.notify_checkpoint_complete(checkpoint)?;
        self.inner.notify_checkpoint_complete(checkpoint)
    }
    fn restore_state(&mut self, state: &[u8]) -> Result<(), TaskError> {
        self.inner.restore_state(state)
    }
}

/// A sink restored from `state` in a job with no input: it commits what the state
/// holds (unless the marker says it is committed) and ends.
fn restore_into(config: &StreamSinkConfig, state: Vec<u8>) {
    let graph = Graph::new().with_parallelism(1);
    let config = config.clone();
    graph
        .from_iter(|_| std::iter::empty::<u64>())
        .sink_io(move |info: &SubtaskInfo| {
            let (mut sink, io) = stream_sink(&config, info, format as fn(&u64, &mut Fields));
            sink.restore_state(&state).expect("restores");
            (sink, io)
        });
    graph.execute(runtime()).expect("runs");
}

/// Committing twice (each checkpoint notified twice) and restoring a state whose
/// transactions were committed already write nothing twice; the same restore with the
/// marker gone commits the transaction again, so it is the marker that prevents it.
#[test]
fn a_transaction_committed_again_writes_nothing_twice() {
    let Some(url) = redis("a_transaction_committed_again_writes_nothing_twice") else {
        return;
    };
    let dir = Scratch::new();
    let mut config = StreamSinkConfig::new(url.clone(), unique("recommit"));
    config.guarantee = Guarantee::ExactlyOnce;
    let _keys = keys(&config, 1);
    let records = 3_000;
    let states = Arc::new(Mutex::new(Vec::new()));
    let (settings, _) = checkpointing(dir.path());
    let graph = Graph::new()
        .with_parallelism(1)
        .with_checkpointing(settings);
    let (sink_config, sink_states) = (config.clone(), Arc::clone(&states));
    graph
        .from_generator(records, Some(30_000.0), |n| n)
        .sink_io(move |info| {
            let (inner, io) = stream_sink(&sink_config, info, format as fn(&u64, &mut Fields));
            let states = Arc::clone(&sink_states);
            (Recording { inner, states }, io)
        });
    graph.execute(runtime()).expect("runs");
    let all: Vec<u64> = (0..records).collect();
    assert_eq!(numbers(&url, &config.stream), all);

    // The final pre-commit (after the end of input) holds the last transaction.
    let state = states
        .lock()
        .expect("states")
        .last()
        .cloned()
        .expect("a state");
    let committed_before = config.stats.snapshot().transactions;
    restore_into(&config, state.clone());
    assert_eq!(numbers(&url, &config.stream), all, "committed twice");
    assert!(config.stats.snapshot().transactions > committed_before);

    // Without the marker the restore cannot know: it commits the transaction again.
    let marker = format!("{}:0", config.transaction_prefix);
    connect(&url)
        .command(&[b"DEL", marker.as_bytes()])
        .expect("DEL");
    restore_into(&config, state);
    let after = numbers(&url, &config.stream);
    assert!(after.len() > all.len(), "the restore committed nothing");
    assert_eq!(&after[..all.len()], &all[..]);
    // Its transactions again: a run of consecutive records, in order.
    let again = &after[all.len()..];
    assert_eq!(
        again,
        (again[0]..again[0] + again.len() as u64).collect::<Vec<_>>()
    );
}

/// An `XADD` to a key holding a string fails the job with the server's `WRONGTYPE`
/// and the stream's name, at least once and exactly once (inside `EXEC`).
#[test]
fn an_error_reply_fails_the_job_naming_the_stream() {
    let Some(url) = redis("an_error_reply_fails_the_job_naming_the_stream") else {
        return;
    };
    for guarantee in [Guarantee::AtLeastOnce, Guarantee::ExactlyOnce] {
        let dir = Scratch::new();
        let mut config = StreamSinkConfig::new(url.clone(), unique("wrongtype"));
        config.guarantee = guarantee;
        let _keys = keys(&config, 1);
        connect(&url)
            .command(&[b"SET", config.stream.as_bytes(), b"not a stream"])
            .expect("SET");
        let mut graph = Graph::new().with_parallelism(1);
        if guarantee == Guarantee::ExactlyOnce {
            graph = graph.with_checkpointing(checkpointing(dir.path()).0);
        }
        let sink_config = config.clone();
        graph
            .from_iter(|_| 0..100u64)
            .sink_io(move |info| stream_sink(&sink_config, info, format));
        let (_, failure) = graph.execute_to_end(runtime()).expect("starts");
        let message = failure.expect("the job fails").to_string();
        assert!(message.contains("WRONGTYPE"), "{guarantee:?}: {message}");
        assert!(
            message.contains(&format!("XADD {}", config.stream)),
            "{guarantee:?}: {message}"
        );
        assert!(config.stats.snapshot().errors >= 1);
    }
}

/// Starts a server of its own (with an fsync'd append-only file, so that what it
/// acknowledged survives a kill), runs a job writing `0..records` into a `guarantee`
/// sink (exactly once: with checkpoints), kills and restarts the server once the
/// stream has 500 entries, and returns what the stream holds at the end, in order.
fn restart_mid_run(guarantee: Guarantee, records: u64) -> (Vec<u64>, StreamSinkConfig) {
    let options = ServerOptions {
        args: ["--appendonly", "yes", "--appendfsync", "always"]
            .iter()
            .map(|a| a.to_string())
            .collect(),
        ..ServerOptions::default()
    };
    let mut server = RedisServer::start(options).expect("redis-server starts");
    let url = server.url();
    let mut config = StreamSinkConfig::new(url.clone(), unique("restart"));
    config.guarantee = guarantee;
    let dir = Scratch::new();
    let mut graph = Graph::new().with_parallelism(1);
    if guarantee == Guarantee::ExactlyOnce {
        graph = graph.with_checkpointing(checkpointing(dir.path()).0);
    }
    let sink_config = config.clone();
    graph
        .from_generator(records, Some(2_000.0), |n| n)
        .sink_io(move |info| stream_sink(&sink_config, info, format));
    let job = graph.start(runtime()).expect("starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut at_restart = 0;
    while at_restart < 500 {
        assert!(Instant::now() < deadline, "nothing written in 30 s");
        std::thread::sleep(Duration::from_millis(10));
        at_restart = stream_len(&url, &config.stream);
    }
    server.restart().expect("restarts");
    let (_, failure) = job.join();
    assert!(failure.is_none(), "{guarantee:?}: {failure:?}");
    assert!(at_restart < records, "the restart came after the end");
    let stats = config.stats.snapshot();
    assert!(stats.reconnects >= 1, "{stats:?}");
    (numbers(&url, &config.stream), config)
}

/// The server restarted while an at-least-once job writes: the sink reconnects, sends
/// again what was unanswered (and what the loading server refused), and every record
/// is in the stream, some perhaps twice.
#[test]
fn a_server_restarted_mid_run_loses_nothing_at_least_once() {
    if redis("a_server_restarted_mid_run_loses_nothing_at_least_once").is_none() {
        return;
    }
    let records = 4_000;
    let (written, config) = restart_mid_run(Guarantee::AtLeastOnce, records);
    assert!(written.len() as u64 >= records);
    let mut distinct = sorted(written);
    distinct.dedup();
    assert_eq!(distinct, (0..records).collect::<Vec<_>>());
    assert!(config.stats.snapshot().entries >= records);
}

/// The same restart under an exactly-once job: a transaction whose `EXEC` reply was
/// lost is resolved by the marker, one the loading server refused is committed again,
/// and every record is in the stream exactly once.
#[test]
fn a_server_restarted_mid_run_writes_each_record_once_exactly_once() {
    if redis("a_server_restarted_mid_run_writes_each_record_once_exactly_once").is_none() {
        return;
    }
    let records = 4_000;
    let (written, config) = restart_mid_run(Guarantee::ExactlyOnce, records);
    assert_eq!(sorted(written), (0..records).collect::<Vec<_>>());
    assert!(config.stats.snapshot().transactions >= 2);
}

/// `produce` appends its entries in order, trims with `maxlen`, and refuses an entry
/// without fields before sending its chunk.
#[test]
fn produce_appends_entries_in_order() {
    let Some(url) = redis("produce_appends_entries_in_order") else {
        return;
    };
    let config = StreamSinkConfig::new(url.clone(), unique("produce"));
    let _keys = keys(&config, 0);
    let report = produce(&url, &config.stream, 2_500, None, |n, fields| {
        format(&n, fields);
    })
    .expect("produces");
    assert_eq!(report.entries, 2_500);
    assert_eq!(
        numbers(&url, &config.stream),
        (0..2_500).collect::<Vec<_>>()
    );
    produce(&url, &config.stream, 1_000, Some(100), |n, fields| {
        format(&(n + 2_500), fields);
    })
    .expect("produces");
    let kept = numbers(&url, &config.stream);
    assert!((100..=300).contains(&kept.len()), "{}", kept.len());
    assert_eq!(*kept.last().expect("kept"), 3_499);
    let error = produce(&url, &config.stream, 10, None, |n, fields| {
        if n != 5 {
            format(&n, fields);
        }
    })
    .expect_err("entry 5 has no field");
    assert!(error.to_string().contains("entry 5"), "{error}");
    assert_eq!(stream_len(&url, &config.stream), kept.len() as u64);
}

/// A stand-in for Redis on a loopback port that refuses the first `refusals` `XADD`s
/// with `LOADING` (as a restarted server does while it reads its data) and otherwise
/// applies `XADD`, `MULTI`/`EXEC` (a transaction with a refused command is discarded,
/// `EXECABORT`), and `GET`/`SET`/`DEL`. What it applied: each entry's `n`.
struct Loading {
    port: u16,
    applied: Arc<Mutex<Vec<u64>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Loading {
    fn start(refusals: usize) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
        listener.set_nonblocking(true).expect("non-blocking");
        let port = listener.local_addr().expect("address").port();
        let applied = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (log, done) = (Arc::clone(&applied), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut state = LoadingState {
                refusals,
                keys: Default::default(),
                multi: None,
                applied: log,
            };
            while !done.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => state.serve(stream, &done),
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        Loading {
            port,
            applied,
            stop,
        }
    }

    fn url(&self) -> RedisUrl {
        RedisUrl::new("127.0.0.1", self.port)
    }

    fn applied(&self) -> Vec<u64> {
        self.applied.lock().expect("applied").clone()
    }
}

impl Drop for Loading {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

struct LoadingState {
    refusals: usize,
    keys: std::collections::HashMap<Vec<u8>, Vec<u8>>,
    /// The commands queued since `MULTI`, and whether one was refused.
    multi: Option<(Vec<Vec<Vec<u8>>>, bool)>,
    applied: Arc<Mutex<Vec<u64>>>,
}

impl LoadingState {
    fn serve(&mut self, mut stream: std::net::TcpStream, done: &std::sync::atomic::AtomicBool) {
        use std::io::{Read, Write};
        stream.set_nonblocking(false).expect("blocking");
        stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .expect("timeout");
        let mut inbox = Vec::new();
        let mut chunk = [0u8; 16 * 1024];
        while !done.load(Ordering::Relaxed) {
            match stream.read(&mut chunk) {
                Ok(0) => return,
                Ok(n) => inbox.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(_) => return,
            }
            let mut out = Vec::new();
            while let Some((command, used)) = parse_command(&inbox) {
                inbox.drain(..used);
                self.answer(command, &mut out);
            }
            if stream.write_all(&out).is_err() {
                return;
            }
        }
    }

    fn answer(&mut self, command: Vec<Vec<u8>>, out: &mut Vec<u8>) {
        let name = command[0].to_ascii_uppercase();
        if let Some((queued, refused)) = self.multi.as_mut() {
            if name != b"EXEC" {
                if name == b"XADD" && self.refusals > 0 {
                    self.refusals -= 1;
                    *refused = true;
                    out.extend_from_slice(b"-LOADING Redis is loading the dataset in memory\r\n");
                } else {
                    queued.push(command);
                    out.extend_from_slice(b"+QUEUED\r\n");
                }
                return;
            }
        }
        match name.as_slice() {
            b"MULTI" => {
                self.multi = Some((Vec::new(), false));
                out.extend_from_slice(b"+OK\r\n");
            }
            b"EXEC" => match self.multi.take() {
                Some((_, true)) => out.extend_from_slice(
                    b"-EXECABORT Transaction discarded because of previous errors.\r\n",
                ),
                Some((queued, false)) => {
                    out.extend_from_slice(format!("*{}\r\n", queued.len()).as_bytes());
                    for command in queued {
                        self.apply(command, out);
                    }
                }
                None => out.extend_from_slice(b"-ERR EXEC without MULTI\r\n"),
            },
            b"XADD" if self.refusals > 0 => {
                self.refusals -= 1;
                out.extend_from_slice(b"-LOADING Redis is loading the dataset in memory\r\n");
            }
            _ => self.apply(command, out),
        }
    }

    fn apply(&mut self, command: Vec<Vec<u8>>, out: &mut Vec<u8>) {
        match command[0].to_ascii_uppercase().as_slice() {
            b"XADD" => {
                let n = command
                    .windows(2)
                    .find(|pair| pair[0] == b"n")
                    .map(|pair| String::from_utf8_lossy(&pair[1]).parse().expect("n"))
                    .expect("an n field");
                let mut applied = self.applied.lock().expect("applied");
                applied.push(n);
                let id = format!("{}-0", applied.len());
                out.extend_from_slice(format!("${}\r\n{id}\r\n", id.len()).as_bytes());
            }
            b"SET" => {
                self.keys.insert(command[1].clone(), command[2].clone());
                out.extend_from_slice(b"+OK\r\n");
            }
            b"GET" => match self.keys.get(&command[1]) {
                Some(value) => {
                    out.extend_from_slice(format!("${}\r\n", value.len()).as_bytes());
                    out.extend_from_slice(value);
                    out.extend_from_slice(b"\r\n");
                }
                None => out.extend_from_slice(b"$-1\r\n"),
            },
            b"DEL" => {
                let removed = self.keys.remove(&command[1]).is_some();
                out.extend_from_slice(format!(":{}\r\n", u8::from(removed)).as_bytes());
            }
            _ => out.extend_from_slice(b"-ERR unknown command\r\n"),
        }
    }
}

/// The first whole command (an array of bulk strings) in `bytes`, and its length.
fn parse_command(bytes: &[u8]) -> Option<(Vec<Vec<u8>>, usize)> {
    fn line(bytes: &[u8], at: usize) -> Option<(usize, usize)> {
        let end = at + bytes.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
        let n = std::str::from_utf8(&bytes[at + 1..end])
            .ok()?
            .parse()
            .ok()?;
        Some((n, end + 2))
    }
    let (count, mut at) = line(bytes, 0)?;
    let mut args = Vec::with_capacity(count);
    for _ in 0..count {
        let (size, start) = line(bytes, at)?;
        let arg = bytes.get(start..start + size)?;
        args.push(arg.to_vec());
        at = start + size + 2;
        if bytes.len() < at {
            return None;
        }
    }
    Some((args, at))
}

/// `XADD`s refused with `LOADING` are sent again after a back-off: at least once,
/// every record arrives (once: the refused ones were not applied); exactly once, the
/// transaction with refused commands is discarded whole and committed again, and every
/// record is written once, in order.
#[test]
fn entries_refused_while_the_server_loads_are_written_later() {
    for guarantee in [Guarantee::AtLeastOnce, Guarantee::ExactlyOnce] {
        let server = Loading::start(3);
        let dir = Scratch::new();
        let mut config = StreamSinkConfig::new(server.url(), "loading");
        config.guarantee = guarantee;
        let records = 500;
        let mut graph = Graph::new().with_parallelism(1);
        if guarantee == Guarantee::ExactlyOnce {
            graph = graph.with_checkpointing(checkpointing(dir.path()).0);
        }
        let sink_config = config.clone();
        graph
            .from_iter(move |_| 0..records)
            .sink_io(move |info| stream_sink(&sink_config, info, format));
        graph.execute(runtime()).expect("runs");
        let applied = server.applied();
        let all: Vec<u64> = (0..records).collect();
        match guarantee {
            Guarantee::AtLeastOnce => assert_eq!(sorted(applied), all),
            Guarantee::ExactlyOnce => assert_eq!(applied, all),
        }
        let stats = config.stats.snapshot();
        assert!(stats.errors >= 3, "{guarantee:?}: {stats:?}");
        assert_eq!(stats.entries, records, "{guarantee:?}: {stats:?}");
    }
}
