//! The Redis Streams source against a real server: bounded reads over several streams
//! and subtasks, event time and watermarks, idleness downstream, restore from a
//! checkpoint, a server restarted mid-run, a hostile server, and consumer groups.
//!
//! The tests that need Redis find it through `WEIR_REDIS_URL`; without it they print a
//! note and pass. The restart test starts a server of its own with the `redis-server`
//! binary next to it.
//!
//! Some tests run the source in a graph; the others drive one source by hand on an
//! epoll driver ([`Harness`]), to see every event it emits in order.

use std::collections::{BTreeMap, HashSet};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis_protocol::resp2::types::OwnedFrame;
use weir_engine::checkpoint::transactional::TransactionalFiles;
use weir_engine::element::{StreamElement, IDLE_WATERMARK};
use weir_engine::graph::{Checkpointing, Graph, IoHandler, Source, SourceEvent};
use weir_engine::runtime::{Cores, Driver, Runtime, RuntimeError};
use weir_net::redis::streams::{
    stream_source, ConsumerGroup, EntryId, EventTime, StartFrom, StreamEntry, StreamSource,
    StreamSourceConfig,
};
use weir_net::redis::{encode_command, BlockingConnection, RedisServer, RedisUrl, ServerOptions};
use weir_net::DriverKind;

fn redis(test: &str) -> Option<RedisUrl> {
    weir_net::redis::test_server_url(test)
}

/// A stream name no other test (or run) uses.
fn unique(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "weir:test:source:{name}:{}:{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn admin(url: &RedisUrl) -> BlockingConnection {
    BlockingConnection::connect(url, Duration::from_secs(2)).expect("admin connection")
}

/// Appends `count` entries `n = first..first+count` to `stream` (field `n`, and
/// `ts` = `ts(n)` when given), with IDs the server makes, or `ms-0` with `ms = id(n)`.
fn add(
    conn: &mut BlockingConnection,
    stream: &str,
    range: std::ops::Range<u64>,
    id: impl Fn(u64) -> Option<u64>,
    ts: impl Fn(u64) -> Option<i64>,
) {
    let count = range.end - range.start;
    conn.pipeline(count as usize, |out| {
        for n in range {
            let id = id(n).map_or("*".to_string(), |ms| format!("{ms}-0"));
            let n_text = n.to_string();
            let ts_text = ts(n).map(|t| t.to_string());
            let mut args: Vec<&[u8]> = vec![b"XADD", stream.as_bytes(), id.as_bytes()];
            args.extend([b"n".as_slice(), n_text.as_bytes()]);
            if let Some(ts) = &ts_text {
                args.extend([b"ts".as_slice(), ts.as_bytes()]);
            }
            encode_command(out, &args);
        }
    })
    .expect("XADD");
}

fn fill(conn: &mut BlockingConnection, stream: &str, count: u64) {
    add(conn, stream, 0..count, |_| None, |_| None);
}

/// Every ID of `stream`, in order.
fn ids(conn: &mut BlockingConnection, stream: &str) -> Vec<EntryId> {
    let reply = conn
        .command(&[b"XRANGE", stream.as_bytes(), b"-", b"+"])
        .expect("XRANGE");
    let OwnedFrame::Array(entries) = reply else {
        panic!("XRANGE: {reply:?}")
    };
    entries
        .into_iter()
        .map(|entry| match entry {
            OwnedFrame::Array(pair) => match &pair[0] {
                OwnedFrame::BulkString(id) => EntryId::parse(id).expect("an ID"),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        })
        .collect()
}

fn delete(conn: &mut BlockingConnection, streams: &[String]) {
    for stream in streams {
        conn.command(&[b"DEL", stream.as_bytes()]).expect("DEL");
    }
}

fn runtime() -> Runtime {
    Runtime::builder()
        .cores(Cores::Count(2))
        .pin(false)
        .driver(weir_net::driver_factory(DriverKind::Epoll))
        .build()
        .expect("runtime")
}

/// One source driven by hand on an epoll driver, as its task would drive it.
struct Harness {
    source: StreamSource,
    io: Box<dyn IoHandler>,
    driver: Box<dyn Driver>,
    start: Instant,
}

impl Harness {
    fn new(
        config: &StreamSourceConfig,
        index: usize,
        parallelism: usize,
        checkpoints: bool,
    ) -> Self {
        let source = StreamSource::new(config, index, parallelism, checkpoints);
        let io = source.io();
        Harness {
            source,
            io,
            driver: weir_net::build_driver(DriverKind::Epoll).expect("driver"),
            start: Instant::now(),
        }
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Polls until `stop` says so (given the events so far) or the source ends;
    /// returns the events (not the `Idle`s). Fails the test after 30 s.
    fn run_until(
        &mut self,
        mut stop: impl FnMut(&[SourceEvent<StreamEntry>]) -> bool,
    ) -> Vec<SourceEvent<StreamEntry>> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut events = Vec::new();
        while !stop(&events) {
            assert!(Instant::now() < deadline, "no end in 30 s: {events:?}");
            let now = self.now();
            self.io.flush(&mut *self.driver, now);
            match self.source.poll_next(now) {
                SourceEvent::Idle { until_ns } => {
                    self.io.flush(&mut *self.driver, now);
                    let wake = [until_ns, self.io.next_deadline()]
                        .into_iter()
                        .flatten()
                        .min()
                        .unwrap_or(u64::MAX);
                    let timeout = Duration::from_nanos(wake.saturating_sub(now))
                        .min(Duration::from_millis(10));
                    let io = &mut self.io;
                    self.driver
                        .turn(Some(timeout), &mut |event| {
                            io.on_event(&event);
                        })
                        .expect("turn");
                }
                SourceEvent::End => {
                    events.push(SourceEvent::End);
                    break;
                }
                event => events.push(event),
            }
        }
        events
    }

    fn run_to_end(&mut self) -> Vec<SourceEvent<StreamEntry>> {
        let events = self.run_until(|_| false);
        assert_eq!(events.last(), Some(&SourceEvent::End));
        events
    }

    /// Polls for `duration`, returning the events.
    fn run_for(&mut self, duration: Duration) -> Vec<SourceEvent<StreamEntry>> {
        let until = Instant::now() + duration;
        self.run_until(|_| Instant::now() >= until)
    }

    /// Polls until the source fails; its message.
    fn failure(&mut self) -> String {
        let events = self.run_until(|events| {
            matches!(
                events.last(),
                Some(SourceEvent::Failed(_) | SourceEvent::End)
            )
        });
        match events.last() {
            Some(SourceEvent::Failed(message)) => {
                // It stays failed.
                let now = self.now();
                assert!(matches!(self.source.poll_next(now), SourceEvent::Failed(_)));
                message.clone()
            }
            _ => panic!("the source did not fail: {events:?}"),
        }
    }
}

fn records(events: &[SourceEvent<StreamEntry>]) -> Vec<&StreamEntry> {
    events
        .iter()
        .filter_map(|e| match e {
            SourceEvent::Record(entry, _) => Some(entry),
            _ => None,
        })
        .collect()
}

/// The IDs read of each stream, in the order read.
fn by_stream<'a>(
    entries: impl IntoIterator<Item = &'a StreamEntry>,
) -> BTreeMap<String, Vec<EntryId>> {
    let mut out: BTreeMap<String, Vec<EntryId>> = BTreeMap::new();
    for entry in entries {
        out.entry(entry.stream.clone()).or_default().push(entry.id);
    }
    out
}

/// A bounded job of 2 subtasks over 3 streams and a missing one reads each entry present
/// at open exactly once, in each stream's order; entries added once a subtask had
/// opened (by a map on the first entry of each stream) are not read.
#[test]
fn bounded_reads_exactly_what_was_there_at_start_over_streams_and_subtasks() {
    let Some(url) = redis("bounded_reads") else {
        return;
    };
    let streams: Vec<String> = ["a", "b", "c", "missing"].map(unique).to_vec();
    let mut conn = admin(&url);
    fill(&mut conn, &streams[0], 1234);
    fill(&mut conn, &streams[1], 250);
    fill(&mut conn, &streams[2], 7);
    let mut expected = BTreeMap::new();
    for stream in &streams[..3] {
        expected.insert(stream.clone(), ids(&mut conn, stream));
    }
    let mut config = StreamSourceConfig::new(url.clone(), streams.clone());
    config.bounded = true;
    config.count = 100;
    config.addr = Some(config.check().expect("valid"));
    let graph = Graph::new().with_parallelism(2);
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let late_url = url.clone();
    let collected = graph
        .from_source_io(move |info| stream_source(&config, info))
        .map(move |entry: StreamEntry| {
            if seen.lock().unwrap().insert(entry.stream.clone()) {
                let mut conn = admin(&late_url);
                add(&mut conn, &entry.stream, 0..5, |_| None, |_| None);
            }
            entry
        })
        .collect();
    graph.execute(runtime()).expect("the job runs");
    let read = collected.records();
    assert_eq!(read.len(), 1234 + 250 + 7);
    assert_eq!(by_stream(&read), expected);
    assert!(
        ids(&mut conn, &streams[0]).len() > 1234,
        "entries were added late"
    );
    delete(&mut conn, &streams);
}

/// Event time from IDs: each record's timestamp is its ID's milliseconds; watermarks
/// advance, and every record after a watermark is above it (per-stream watermarks, two
/// streams interleaved). From a field: the field's value, with the out-of-orderness
/// bound below every later record; an entry without the field fails the source, naming
/// it.
#[test]
fn event_time_from_ids_and_fields_and_watermarks_below_later_records() {
    let Some(url) = redis("event_time") else {
        return;
    };
    let streams: Vec<String> = ["a", "b"].map(unique).to_vec();
    let mut conn = admin(&url);
    add(
        &mut conn,
        &streams[0],
        0..40,
        |n| Some(1000 + 10 * n),
        |_| None,
    );
    add(
        &mut conn,
        &streams[1],
        0..40,
        |n| Some(1005 + 10 * n),
        |_| None,
    );
    let mut config = StreamSourceConfig::new(url.clone(), streams.clone());
    config.bounded = true;
    config.count = 7;
    let mut harness = Harness::new(&config, 0, 1, false);
    let events = harness.run_to_end();
    check_watermarks(&events);
    for event in &events {
        if let SourceEvent::Record(entry, ts) = event {
            assert_eq!(*ts, Some(entry.id.ms as i64));
        }
    }
    assert_eq!(records(&events).len(), 80);

    // From a field, out of order by up to 40 ms, with a bound of 50 ms.
    let stream = unique("field");
    let ts = |n: u64| Some(10_000 + 10 * n as i64 - if n % 3 == 0 { 40 } else { 0 });
    add(&mut conn, &stream, 0..60, |_| None, ts);
    let mut config = StreamSourceConfig::new(url.clone(), vec![stream.clone()]);
    config.bounded = true;
    config.count = 9;
    config.event_time = EventTime::Field("ts".into());
    config.out_of_orderness = Duration::from_millis(50);
    let events = Harness::new(&config, 0, 1, false).run_to_end();
    check_watermarks(&events);
    for event in &events {
        if let SourceEvent::Record(entry, Some(time)) = event {
            let n: u64 = std::str::from_utf8(entry.field(b"n").unwrap())
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(Some(*time), ts(n));
        }
    }
    assert_eq!(records(&events).len(), 60);

    // An entry without the field.
    add(&mut conn, &stream, 60..61, |_| None, |_| None);
    let failure = Harness::new(&config, 0, 1, false).failure();
    assert!(failure.contains("has no event time"), "{failure}");
    assert!(
        failure.contains(&stream) && failure.contains("\"ts\""),
        "{failure}"
    );
    delete(&mut conn, &streams);
    delete(&mut conn, &[stream]);
}

/// Watermarks strictly advance (at least three of them), and each is below every record
/// after it.
fn check_watermarks(events: &[SourceEvent<StreamEntry>]) {
    let mut watermarks = Vec::new();
    for (at, event) in events.iter().enumerate() {
        if let SourceEvent::Watermark(w) = event {
            if let Some(last) = watermarks.last() {
                assert!(w > last, "watermarks advance: {watermarks:?} then {w}");
            }
            watermarks.push(*w);
            for later in &events[at..] {
                if let SourceEvent::Record(entry, Some(ts)) = later {
                    assert!(ts > w, "{entry:?} at {ts} after watermark {w}");
                }
            }
        }
    }
    assert!(watermarks.len() >= 3, "{watermarks:?}");
}

/// A subtask whose stream is quiet marks itself idle, so that the watermark downstream
/// (after a key_by, at both sink subtasks) advances with the other subtask's stream
/// alone; driven by hand, the idle mark comes after the timeout and a new entry makes
/// the source active again; a subtask with no stream is idle at once.
#[test]
fn an_idle_subtask_lets_the_watermark_advance_downstream() {
    let Some(url) = redis("idleness") else { return };
    let streams: Vec<String> = ["active", "quiet"].map(unique).to_vec();
    let mut conn = admin(&url);
    fill(&mut conn, &streams[1], 1);
    let mut config = StreamSourceConfig::new(url.clone(), streams.clone());
    config.idle_timeout = Some(Duration::from_millis(100));
    let stats = Arc::new(weir_net::redis::streams::StreamSourceStats::default());
    config.stats = Some(Arc::clone(&stats));
    let source_config = config.clone();
    let graph = Graph::new().with_parallelism(2);
    let collected = graph
        .from_source_io(move |info| stream_source(&source_config, info))
        .key_by(|entry: &StreamEntry| entry.id.seq)
        .collect();
    let job = graph.start(runtime()).expect("the job starts");
    // Entries every 10 ms for 1.5 s, on the active stream only.
    let first_ms = now_ms();
    for n in 0..150 {
        add(&mut conn, &streams[0], n..n + 1, |_| None, |_| None);
        std::thread::sleep(Duration::from_millis(10));
    }
    // Stopped once every entry was read (and so handed on in the same poll).
    let deadline = Instant::now() + Duration::from_secs(30);
    while stats.snapshot().entries < 151 {
        assert!(Instant::now() < deadline, "not every entry read in 30 s");
        std::thread::sleep(Duration::from_millis(2));
    }
    job.controller().end_input();
    let (_, failure) = job.join();
    assert!(failure.is_none(), "{failure:?}");
    let read = collected.records();
    let read: Vec<EntryId> = by_stream(&read).remove(&streams[0]).unwrap_or_default();
    assert_eq!(
        read,
        ids(&mut conn, &streams[0]),
        "every entry of the active stream"
    );
    for (subtask, elements) in collected.by_subtask().iter().enumerate() {
        let advanced = elements.iter().any(|e| match e {
            StreamElement::Watermark(w) => w.0 >= first_ms && w.0 < i64::MAX,
            _ => false,
        });
        assert!(
            advanced,
            "sink subtask {subtask} saw event time advance before the end"
        );
    }

    // By hand: the quiet stream alone.
    let mut config = config.clone();
    config.streams = vec![streams[1].clone()];
    config.start = StartFrom::Latest;
    config.idle_timeout = Some(Duration::from_millis(50));
    let mut harness = Harness::new(&config, 0, 1, false);
    let started = Instant::now();
    let events = harness.run_until(|events| !events.is_empty());
    assert_eq!(events, [SourceEvent::Watermark(IDLE_WATERMARK)]);
    assert!(started.elapsed() >= Duration::from_millis(50));
    add(&mut conn, &streams[1], 1..2, |_| None, |_| None);
    let events = harness.run_until(|events| events.len() >= 2);
    assert!(matches!(&events[0], SourceEvent::Record(entry, _) if entry.field(b"n") == Some(b"1")));
    assert!(matches!(events[1], SourceEvent::Watermark(w) if w > IDLE_WATERMARK));

    // A subtask without a stream.
    let mut unbounded = Harness::new(&config, 1, 2, false);
    assert_eq!(
        unbounded.run_until(|events| !events.is_empty()),
        [SourceEvent::Watermark(IDLE_WATERMARK)]
    );
    config.bounded = true;
    assert_eq!(
        Harness::new(&config, 1, 2, false).run_to_end(),
        [SourceEvent::End]
    );
    delete(&mut conn, &streams);
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64
}

/// A fresh directory under the system's temporary directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(unique(name).replace(':', "-"));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("scratch directory");
        Scratch(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Every committed line of the part files under `dir`.
fn committed(dir: &Path, subtasks: usize) -> Vec<String> {
    let mut all = Vec::new();
    for subtask in 0..subtasks {
        for file in TransactionalFiles::committed(dir, subtask).expect("list") {
            let text = std::fs::read_to_string(&file).expect("read");
            all.extend(text.lines().map(str::to_string));
        }
    }
    all.sort_unstable();
    all
}

/// A checkpointed bounded job stopped mid-way (as a crash stops it) and restored from
/// its newest checkpoint writes every entry exactly once into exactly-once part files;
/// entries added between the runs are after the checkpointed ends, so not read.
#[test]
fn a_restored_job_continues_exactly_after_the_checkpointed_positions() {
    let Some(url) = redis("restore") else { return };
    let streams: Vec<String> = ["a", "b", "c"].map(unique).to_vec();
    let mut conn = admin(&url);
    let mut expected = Vec::new();
    for stream in &streams {
        fill(&mut conn, stream, 1500);
        expected.extend(
            ids(&mut conn, stream)
                .iter()
                .map(|id| format!("{stream} {id}")),
        );
    }
    expected.sort_unstable();
    let dir = Scratch::new("restore");
    let out = dir.0.join("out");
    let mut config = StreamSourceConfig::new(url.clone(), streams.clone());
    config.bounded = true;
    config.count = 50;
    let job = |restore: bool, pace: Duration| {
        let completed = Arc::new(AtomicU64::new(0));
        let seen = Arc::clone(&completed);
        let mut settings = Checkpointing::new(dir.0.join("chk"), Duration::from_millis(20))
            .with_listener(move |metadata, _| {
                seen.fetch_max(metadata.id, Ordering::Relaxed);
            });
        if restore {
            settings = settings.restore_from(dir.0.join("chk"));
        }
        let graph = Graph::new()
            .with_parallelism(2)
            .with_checkpointing(settings);
        let config = config.clone();
        graph
            .from_source_io(move |info| stream_source(&config, info))
            .map(move |entry: StreamEntry| {
                std::thread::sleep(pace);
                entry
            })
            .sink_to_files(out.clone(), |entry: &StreamEntry, line: &mut Vec<u8>| {
                line.extend_from_slice(format!("{} {}\n", entry.stream, entry.id).as_bytes());
            });
        (graph, completed)
    };
    let (graph, completed) = job(false, Duration::from_micros(300));
    let run = graph.start(runtime()).expect("starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while completed.load(Ordering::Relaxed) < 2 {
        assert!(Instant::now() < deadline, "no two checkpoints in 30 s");
        std::thread::sleep(Duration::from_millis(2));
    }
    run.controller().cancel();
    let (_, failure) = run.join();
    assert!(
        matches!(failure, Some(RuntimeError::Cancelled { .. })),
        "{failure:?}"
    );
    let before = committed(&out, 2).len();
    assert!(
        before < expected.len(),
        "the first run was meant to stop mid-way"
    );
    for stream in &streams {
        add(&mut conn, stream, 0..10, |_| None, |_| None);
    }
    let (graph, _) = job(true, Duration::ZERO);
    let result = graph.execute(runtime()).expect("the restored job runs");
    let restored = result
        .checkpoints
        .and_then(|c| c.restored)
        .expect("restored");
    assert!(restored.id >= 2, "{restored:?}");
    assert_eq!(committed(&out, 2), expected);
    delete(&mut conn, &streams);
}

/// A server killed mid-read and restarted (from the `dump.rdb` a `SAVE` left): the
/// source reconnects (refused meanwhile, with back-off) and reads on from where it was,
/// every entry once and in order.
#[test]
fn a_server_restart_mid_run_loses_and_duplicates_nothing() {
    let Some(_) = redis("restart") else { return };
    let dir = Scratch::new("restart-server");
    let mut server = RedisServer::start(ServerOptions {
        dir: Some(dir.0.clone()),
        ..ServerOptions::default()
    })
    .expect("redis-server starts");
    let stream = unique("restart");
    let mut conn = admin(&server.url());
    fill(&mut conn, &stream, 3000);
    let expected = ids(&mut conn, &stream);
    conn.command(&[b"SAVE"]).expect("SAVE");
    drop(conn);
    let mut config = StreamSourceConfig::new(server.url(), vec![stream.clone()]);
    config.bounded = true;
    config.count = 100;
    let mut harness = Harness::new(&config, 0, 1, false);
    let mut events = harness.run_until(|events| records(events).len() >= 1000);
    server.kill();
    events.extend(harness.run_for(Duration::from_millis(200)));
    server.restart().expect("restarts");
    events.extend(harness.run_to_end());
    let read: Vec<EntryId> = records(&events).iter().map(|e| e.id).collect();
    assert_eq!(read, expected);
    let stats = harness.source.stats().snapshot();
    assert!(stats.reconnects >= 1, "{stats:?}");
    assert!(stats.errors >= 1, "{stats:?}");
}

/// A listener on loopback that answers the first bytes of each connection with
/// `reply`, then holds the connection until the client closes it.
fn fake_server(reply: Vec<u8>) -> (RedisUrl, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let handle = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        let mut buffer = [0u8; 4096];
        if matches!(stream.read(&mut buffer), Ok(n) if n > 0) {
            let _ = stream.write_all(&reply);
            while matches!(stream.read(&mut buffer), Ok(n) if n > 0) {}
        }
    });
    (RedisUrl::new("127.0.0.1", port), handle)
}

/// Replies that are not what `XREAD` answers fail the source with an error saying
/// what was wrong, not a crash in the decoding: a bad ID, the wrong shape, a reply
/// nested too deep, bytes that are not RESP, and entries before the read's position.
#[test]
fn a_hostile_server_fails_the_source_with_a_clear_error() {
    let entry = |id: &str| {
        format!(
            "*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n${}\r\n{id}\r\n*0\r\n",
            id.len()
        )
        .into_bytes()
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (entry("12-x"), "not an entry ID"),
        (b":5\r\n".to_vec(), "expects an array of streams"),
        (b"*1\r\n*2\r\n$1\r\nt\r\n*0\r\n".to_vec(), "did not read"),
        (b"*1\r\n".repeat(200), "nests"),
        (b"?what\r\n".to_vec(), "malformed reply"),
        (entry("3-0"), "is not after 5-0"),
        (b"-ERR unknown command\r\n".to_vec(), "unknown command"),
    ];
    for (reply, hint) in cases {
        let (url, server) = fake_server(reply);
        let mut config = StreamSourceConfig::new(url, vec!["s".into()]);
        config.start = StartFrom::Id(EntryId::new(5, 0));
        let mut harness = Harness::new(&config, 0, 1, false);
        let failure = harness.failure();
        assert!(failure.contains("redis stream source"), "{failure}");
        assert!(failure.contains(hint), "{hint}: {failure}");
        drop(harness);
        server.join().expect("the fake server ends");
    }
}

fn pending_count(conn: &mut BlockingConnection, stream: &str, group: &str) -> i64 {
    match conn
        .command(&[b"XPENDING", stream.as_bytes(), group.as_bytes()])
        .expect("XPENDING")
    {
        OwnedFrame::Array(items) => match items[0] {
            OwnedFrame::Integer(n) => n,
            ref other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

/// Group mode: the group is made at open and every entry read once and acknowledged
/// (without checkpoints, as handed out); with checkpoints, a restored source skips and
/// acknowledges the pending entries up to its position, emits the rest of them, then
/// new ones, and acknowledges at completed checkpoints; a missing group is an error
/// naming the group and the stream.
#[test]
fn group_mode_reads_and_acknowledges() {
    let Some(url) = redis("group") else { return };
    let stream = unique("group");
    let mut conn = admin(&url);
    fill(&mut conn, &stream, 300);
    let expected = ids(&mut conn, &stream);
    let group = |name: &str, create_group: bool| ConsumerGroup {
        group: name.into(),
        consumer: "weir".into(),
        create_group,
    };
    let mut config = StreamSourceConfig::new(url.clone(), vec![stream.clone()]);
    config.bounded = true;
    config.count = 40;
    config.group = Some(group("g1", true));
    let events = Harness::new(&config, 0, 1, false).run_to_end();
    let read: Vec<EntryId> = records(&events).iter().map(|e| e.id).collect();
    assert_eq!(read, expected);
    assert_eq!(
        pending_count(&mut conn, &stream, "g1"),
        0,
        "all acknowledged"
    );

    // With checkpoints: a first source hands out 30 entries (its reads delivered 40),
    // snapshots, and stops before any checkpoint completes.
    config.group = Some(group("g2", true));
    config.bounded = false;
    let mut first = Harness::new(&config, 0, 1, true);
    first.run_until(|events| records(events).len() >= 30);
    let state = first.source.snapshot_state().expect("a position");
    drop(first);
    assert_eq!(
        pending_count(&mut conn, &stream, "g2"),
        40,
        "delivered, none acknowledged"
    );
    let mut second = Harness::new(&config, 0, 1, true);
    second.source.restore_state(&state).expect("restores");
    let events = second.run_until(|events| records(events).len() >= 270);
    let read: Vec<EntryId> = records(&events).iter().map(|e| e.id).collect();
    assert_eq!(read, expected[30..]);
    // The 30 skipped were acknowledged; the rest waits for checkpoints.
    assert_eq!(pending_count(&mut conn, &stream, "g2"), 270);
    let _ = second.source.snapshot_state();
    let _ = second.source.snapshot_state();
    second
        .source
        .notify_checkpoint_complete(2)
        .expect("acknowledges");
    // The XACK queues behind the blocked read on the source's one connection. The
    // server empties the pending list before the source reads the reply and counts
    // it, so wait for both.
    let deadline = Instant::now() + Duration::from_secs(30);
    while pending_count(&mut conn, &stream, "g2") > 0
        || second.source.stats().snapshot().acknowledged < 300
    {
        assert!(Instant::now() < deadline, "not acknowledged in 30 s");
        second.run_for(Duration::from_millis(20));
    }
    assert_eq!(second.source.stats().snapshot().acknowledged, 300);

    // No such group.
    config.group = Some(group("nope", false));
    let failure = Harness::new(&config, 0, 1, false).failure();
    assert!(
        failure.contains("\"nope\"") && failure.contains(&stream),
        "{failure}"
    );
    assert!(failure.contains("XGROUP CREATE"), "{failure}");
    delete(&mut conn, &[stream]);
}

/// What Redis does under the reader is the documented skip, never a failure: entries
/// trimmed before they were read are skipped (the source reads on from the next entry
/// still there), and a stream deleted and made again reads on after the position.
#[test]
fn a_stream_trimmed_or_deleted_under_the_reader_is_skipped_not_failed() {
    let Some(url) = redis("trimmed_under_the_reader") else {
        return;
    };
    let stream = unique("trimmed");
    let mut conn = admin(&url);
    add(&mut conn, &stream, 1..101, Some, |_| None);
    let mut config = StreamSourceConfig::new(url.clone(), vec![stream.clone()]);
    config.count = 10;
    config.addr = Some(config.check().expect("valid"));
    let mut harness = Harness::new(&config, 0, 1, false);
    let ms = |events: &[SourceEvent<StreamEntry>]| -> Vec<u64> {
        records(events).iter().map(|e| e.id.ms).collect()
    };
    let first = harness.run_until(|events| records(events).len() >= 10);
    assert_eq!(ms(&first), (1..=10).collect::<Vec<_>>());
    // Entries 1..=60 go while the reader is at 10 (it may have 11.. queued already).
    conn.command(&[b"XTRIM", stream.as_bytes(), b"MAXLEN", b"40"])
        .expect("XTRIM");
    let second = harness.run_until(|events| ms(events).last() == Some(&100));
    let read = ms(&second);
    assert!(!second.iter().any(|e| matches!(e, SourceEvent::Failed(_))));
    let (before_cut, after_cut): (Vec<u64>, Vec<u64>) = read.iter().partition(|&&n| n <= 60);
    assert_eq!(after_cut, (61..=100).collect::<Vec<_>>(), "{read:?}");
    // What it had queued before the trim is handed out; then it skips to 61.
    assert_eq!(
        before_cut,
        (11..11 + before_cut.len() as u64).collect::<Vec<_>>(),
        "{read:?}"
    );
    assert!(
        before_cut.len() < 60 - 10,
        "the trim skipped entries: {read:?}"
    );
    // The stream deleted, then made again with later IDs: read on after 100.
    delete(&mut conn, std::slice::from_ref(&stream));
    add(&mut conn, &stream, 200..205, Some, |_| None);
    let third = harness.run_until(|events| ms(events).last() == Some(&204));
    assert_eq!(ms(&third), (200..205).collect::<Vec<_>>());
    assert!(!third.iter().any(|e| matches!(e, SourceEvent::Failed(_))));
    delete(&mut conn, &[stream]);
}
