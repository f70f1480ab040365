//! A job graph over two processes on loopback (two runtimes and two transports in this
//! test process): the keyed exchange crosses the transport, every record arrives once on
//! the subtask its key group names, a producer's drain waits for its consumers, and the
//! two processes share one connection. Checkpoints over the two: one coordinator's
//! messages ride that connection, both processes complete the same checkpoints and
//! commit every record once, and a process whose peer went away hears of it.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use weir_engine::checkpoint::transactional::TransactionalFiles;
use weir_engine::checkpoint::{AlignmentMode, CheckpointLink, LinkEvent};
use weir_engine::graph::keys::subtask_for_key;
use weir_engine::graph::{Checkpointing, Graph, SubtaskInfo};
use weir_engine::runtime::{Cores, Runtime};
use weir_net::cluster::TransportChannels;

fn free_addrs(n: usize) -> Vec<SocketAddr> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    listeners.iter().map(|l| l.local_addr().unwrap()).collect()
}

fn run_process(process: usize, peers: Vec<SocketAddr>, per: u64) -> Vec<Vec<u64>> {
    let channels = Arc::new(TransportChannels::start(process, &peers).expect("transport"));
    channels
        .wait_for_peers(Duration::from_secs(20))
        .expect("peers listen");
    let graph = Graph::new()
        .with_parallelism(4)
        .with_cluster(channels.cluster());
    let out = graph
        .from_iter(move |info: &SubtaskInfo| {
            let base = info.index as u64 * per;
            base..base + per
        })
        .map(|v| v * 3)
        .key_by(|v: &u64| *v)
        .collect();
    let runtime = Runtime::builder()
        .cores(Cores::Count(2))
        .pin(false)
        .build()
        .expect("runtime");
    let (_, failure) = graph.execute_to_end(runtime).expect("starts");
    assert!(failure.is_none(), "process {process}: {failure:?}");
    channels
        .drain(Duration::from_secs(20))
        .expect("consumers took everything");
    // Both ways, every channel between the two processes on one connection.
    assert_eq!(channels.connections_opened(), 1, "process {process}");
    out.by_subtask()
        .into_iter()
        .map(|s| {
            s.iter()
                .filter_map(|e| e.as_record().map(|r| r.value))
                .collect()
        })
        .collect()
}

#[test]
fn a_keyed_job_over_two_processes_delivers_each_record_once() {
    const PER: u64 = 20_000;
    let peers = free_addrs(2);
    let runs: Vec<_> = (0..2)
        .map(|process| {
            let peers = peers.clone();
            std::thread::spawn(move || run_process(process, peers, PER))
        })
        .collect();
    let mut all = Vec::new();
    for run in runs {
        for (subtask, records) in run.join().expect("process ran").into_iter().enumerate() {
            for v in &records {
                assert_eq!(subtask_for_key(v, 128, 4), subtask);
            }
            all.extend(records);
        }
    }
    all.sort_unstable();
    assert_eq!(all, (0..4 * PER).map(|v| v * 3).collect::<Vec<_>>());
}

#[test]
fn a_peer_that_never_starts_is_named_after_the_wait() {
    let peers = free_addrs(2);
    let channels = TransportChannels::start(0, &peers).expect("transport");
    let error = channels
        .wait_for_peers(Duration::from_millis(300))
        .expect_err("process 1 never listens");
    let text = error.to_string();
    assert!(text.contains("process 1"), "{text}");
}

/// A fresh directory under the system's temporary directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "weir-cluster-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Scratch(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One process of a checkpointed job: numbers at a rate, keyed, into part files that
/// commit with the checkpoints. Returns the checkpoints this process heard completed,
/// in order, and how many its service counted.
fn run_checkpointed(
    process: usize,
    peers: Vec<SocketAddr>,
    dir: PathBuf,
    records: u64,
) -> (Vec<u64>, u64) {
    let channels = Arc::new(TransportChannels::start(process, &peers).expect("transport"));
    channels
        .wait_for_peers(Duration::from_secs(20))
        .expect("peers listen");
    let heard = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&heard);
    let settings = Checkpointing::new(dir.join("chk"), Duration::from_millis(30))
        .with_listener(move |metadata, _| seen.lock().unwrap().push(metadata.id));
    let graph = Graph::new()
        .with_parallelism(4)
        .with_cluster(channels.cluster())
        .with_checkpointing(settings);
    graph
        .from_generator(records, Some(40_000.0), |n| n)
        .map(|n| n * 3)
        .key_by(|n: &u64| *n)
        .sink_to_files(dir.join("out"), |n: &u64, line: &mut Vec<u8>| {
            line.extend_from_slice(format!("{n}\n").as_bytes());
        });
    let runtime = Runtime::builder()
        .cores(Cores::Count(2))
        .pin(false)
        .build()
        .expect("runtime");
    let (result, failure) = graph.execute_to_end(runtime).expect("starts");
    assert!(failure.is_none(), "process {process}: {failure:?}");
    channels
        .drain(Duration::from_secs(20))
        .expect("consumers took everything");
    let completed = result.checkpoints.expect("checkpointed").stats.completed;
    let heard = heard.lock().unwrap().clone();
    (heard, completed)
}

/// Every committed line of the part files of `subtasks` subtasks under `dir`.
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

#[test]
fn one_coordinator_completes_the_same_checkpoints_in_both_processes() {
    const RECORDS: u64 = 12_000;
    let scratch = Scratch::new();
    let peers = free_addrs(2);
    let runs: Vec<_> = (0..2)
        .map(|process| {
            let peers = peers.clone();
            let dir = scratch.0.clone();
            std::thread::spawn(move || run_checkpointed(process, peers, dir, RECORDS))
        })
        .collect();
    let results: Vec<(Vec<u64>, u64)> = runs
        .into_iter()
        .map(|r| r.join().expect("process ran"))
        .collect();
    let (first, first_count) = &results[0];
    let (second, second_count) = &results[1];
    // 300 ms of input at 30 ms intervals: several checkpoints, each completed once and
    // heard in both processes, in the same order.
    assert!(first.len() >= 2, "completed {first:?}");
    assert_eq!(
        first, second,
        "both processes complete the same checkpoints"
    );
    assert!(first.windows(2).all(|w| w[0] < w[1]), "{first:?}");
    assert_eq!(*first_count, first.len() as u64);
    assert_eq!(*second_count, second.len() as u64);
    // The newest is on disk, as every process heard it.
    let newest = first.last().unwrap();
    let metadata = scratch
        .0
        .join("chk")
        .join(format!("chk-{newest}"))
        .join("_metadata");
    assert!(metadata.exists(), "{} missing", metadata.display());
    assert_eq!(
        committed(&scratch.0.join("out"), 4),
        (0..RECORDS).map(|n| n * 3).collect::<Vec<_>>()
    );
}

#[test]
fn checkpoint_messages_wait_for_the_inbox_and_a_lost_peer_is_named() {
    let peers = free_addrs(2);
    let zero = TransportChannels::start(0, &peers).expect("transport 0");
    let one = TransportChannels::start(1, &peers).expect("transport 1");
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| zero.wait_for_peers(Duration::from_secs(20)));
        let b = s.spawn(|| one.wait_for_peers(Duration::from_secs(20)));
        (a.join().unwrap(), b.join().unwrap())
    });
    a.expect("process 0 connects");
    b.expect("process 1 connects");
    // Sent before process 0 listens for them: held, then handed over in order.
    one.send(0, b"first".to_vec());
    one.send(0, b"second".to_vec());
    std::thread::sleep(Duration::from_millis(50));
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    zero.open(Box::new(move |event| {
        let _ = tx.lock().unwrap().send(event);
    }));
    let wait = Duration::from_secs(10);
    for expected in [&b"first"[..], &b"second"[..]] {
        match rx.recv_timeout(wait).expect("a message") {
            LinkEvent::Message { from, bytes } => {
                assert_eq!(from, 1);
                assert_eq!(bytes, expected);
            }
            other => panic!("expected a message, got {other:?}"),
        }
    }
    // And the other way, after opening.
    let (tx1, rx1) = mpsc::channel();
    let tx1 = Mutex::new(tx1);
    one.open(Box::new(move |event| {
        let _ = tx1.lock().unwrap().send(event);
    }));
    zero.send(1, vec![7; 16 * 1024]);
    match rx1.recv_timeout(wait).expect("a message") {
        LinkEvent::Message { from, bytes } => {
            assert_eq!(from, 0);
            assert_eq!(bytes, vec![7; 16 * 1024]);
        }
        other => panic!("expected a message, got {other:?}"),
    }
    // Process 1 goes away: process 0 hears it by name.
    drop(one);
    match rx.recv_timeout(wait).expect("the loss is told") {
        LinkEvent::Lost { process, reason } => {
            assert_eq!(process, 1, "{reason}");
            assert!(!reason.is_empty());
        }
        other => panic!("expected the loss of process 1, got {other:?}"),
    }
}

/// One process of an unaligned job whose sources are through at once, their output
/// queued in front of slow consumers, half of it on channels across the transport: the
/// checkpoints overtake that output there too (a priority barrier frame per remote
/// channel), so one completes before this process's consumers are a quarter of the way
/// through. Returns the consumer's progress at each completed
/// checkpoint and at the end.
fn run_unaligned_backlog(
    process: usize,
    peers: Vec<SocketAddr>,
    dir: PathBuf,
    records: u64,
    mode: AlignmentMode,
) -> (Vec<(u64, u64)>, u64) {
    let channels = Arc::new(TransportChannels::start(process, &peers).expect("transport"));
    channels
        .wait_for_peers(Duration::from_secs(20))
        .expect("peers listen");
    let processed = Arc::new(AtomicU64::new(0));
    let seen: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let settings = {
        let (seen, processed) = (Arc::clone(&seen), Arc::clone(&processed));
        Checkpointing::new(dir.join("chk"), Duration::from_millis(20))
            .with_alignment(mode)
            .with_listener(move |metadata, _| {
                seen.lock()
                    .unwrap()
                    .push((metadata.id, processed.load(Ordering::Relaxed)));
            })
    };
    let graph = Graph::new()
        .with_parallelism(4)
        .with_cluster(channels.cluster())
        .with_checkpointing(settings);
    {
        let processed = Arc::clone(&processed);
        graph
            .from_generator(records, None, |n| n)
            .key_by(|n: &u64| *n)
            .map(move |n| {
                // 100 µs a record: each consumer's quarter of the backlog takes some
                // 0.6 s, where the sources are through within milliseconds (a task
                // looks at its gate between runs of up to 256 records: 26 ms here).
                std::thread::sleep(Duration::from_micros(100));
                processed.fetch_add(1, Ordering::Relaxed);
                n
            })
            .sink_to_files(dir.join("out"), |n: &u64, line: &mut Vec<u8>| {
                line.extend_from_slice(format!("{n}\n").as_bytes());
            });
    }
    let runtime = Runtime::builder()
        .cores(Cores::Count(2))
        .pin(false)
        .build()
        .expect("runtime");
    let (_, failure) = graph.execute_to_end(runtime).expect("starts");
    assert!(failure.is_none(), "process {process}: {failure:?}");
    channels
        .drain(Duration::from_secs(20))
        .expect("consumers took everything");
    let seen = seen.lock().unwrap().clone();
    (seen, processed.load(Ordering::Relaxed))
}

#[test]
fn unaligned_barriers_overtake_the_backlog_on_remote_channels() {
    barriers_overtake_the_backlog_on_remote_channels(AlignmentMode::Unaligned);
}

/// Aligned with a timeout, the barriers are announced as they are written (aligned
/// barrier frames on the remote channels): the checkpoints time out at the consumers and
/// read the backlog ahead as unaligned ones do, local and remote.
#[test]
fn aligned_barriers_with_a_timeout_overtake_the_backlog_on_remote_channels() {
    barriers_overtake_the_backlog_on_remote_channels(AlignmentMode::AlignedWithTimeout(
        Duration::from_millis(10),
    ));
}

fn barriers_overtake_the_backlog_on_remote_channels(mode: AlignmentMode) {
    const RECORDS: u64 = 24_000;
    let scratch = Scratch::new();
    let peers = free_addrs(2);
    let runs: Vec<_> = (0..2)
        .map(|process| {
            let peers = peers.clone();
            let dir = scratch.0.clone();
            std::thread::spawn(move || run_unaligned_backlog(process, peers, dir, RECORDS, mode))
        })
        .collect();
    let results: Vec<_> = runs
        .into_iter()
        .map(|r| r.join().expect("process ran"))
        .collect();
    for (process, (seen, total)) in results.iter().enumerate() {
        assert!(*total > RECORDS / 4, "process {process} consumed {total}");
        assert!(
            seen.iter().any(|(_, at)| *at < total / 4),
            "process {process}: no checkpoint completed before its consumers were a \
             quarter through their {total} records (completed at: {seen:?})"
        );
    }
    assert_eq!(
        committed(&scratch.0.join("out"), 4),
        (0..RECORDS).collect::<Vec<_>>()
    );
}
