//! The Kafka source and sink against a broker: every partition read once and in order,
//! a restore at exactly the checkpointed offsets, the decode policies, an unknown topic
//! and a wrong address as clear errors, keys partitioned as Kafka's default
//! partitioner does, exactly once across a stop and restore, and a restored sink that
//! commits what was pre-committed and skips what the marker says is in.
//!
//! The tests find the broker through `WEIR_KAFKA_BROKERS` (`scripts/test.sh` and CI set
//! it after `scripts/kafka.sh start`); without it they print a note and pass, unless
//! `WEIR_KAFKA_REQUIRED` is set.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_engine::checkpoint::AlignmentMode;
use weir_engine::element::StreamElement;
use weir_engine::exchange::codec::Codec;
use weir_engine::graph::{Checkpointing, Graph, Sink, Source, SourceEvent, SubtaskInfo};
use weir_engine::park::Parker;
use weir_engine::runtime::{Cores, Runtime, RuntimeError};
use weir_net::kafka::{
    key_partition, produce::produce, test_brokers, DecodeErrorPolicy, KafkaAdmin, KafkaOut,
    KafkaSink, KafkaSinkConfig, KafkaSource, KafkaSourceConfig, SinkGuarantee,
};

/// A topic name no other test (or run) uses.
fn unique(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "weir-test-{name}-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn admin(brokers: &str) -> KafkaAdmin {
    KafkaAdmin::new(brokers, Duration::from_secs(30)).expect("admin client")
}

/// Creates `topic` with `partitions` and writes `0..count` (value: the number with the
/// codec, key: the number as decimal text).
fn fill(brokers: &str, topic: &str, partitions: i32, count: u64) {
    assert!(admin(brokers)
        .create_topic(topic, partitions)
        .expect("creates"));
    let report = produce(brokers, topic, count, Duration::from_secs(30), |n, out| {
        out.key = Some(n.to_string().into_bytes());
        n.encode(&mut out.payload);
    })
    .expect("produces");
    assert_eq!(report.delivered, count);
}

fn runtime() -> Runtime {
    Runtime::builder()
        .cores(Cores::Count(2))
        .pin(false)
        .build()
        .expect("runtime")
}

struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "weir-kafka-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
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

fn info(index: usize, parallelism: usize, parker: &Parker, checkpointing: bool) -> SubtaskInfo {
    SubtaskInfo {
        stage: "test".into(),
        index,
        parallelism,
        worker: 0,
        unparker: parker.unparker(),
        checkpointing,
    }
}

/// A bounded source at parallelism 2 reads each record of a 4-partition topic once,
/// each partition in offset order, with event time from Kafka's timestamps and a
/// watermark; each subtask reads the partitions Flink's rule gives it.
#[test]
fn a_bounded_source_reads_every_partition_once_in_order() {
    let Some(brokers) = test_brokers("a_bounded_source_reads_every_partition_once_in_order") else {
        return;
    };
    let topic = unique("bounded");
    fill(&brokers, &topic, 4, 2_000);
    let mut config = KafkaSourceConfig::new(brokers.clone(), vec![topic.clone()]);
    config.bounded = true;
    let graph = Graph::new().with_parallelism(2);
    let out = graph
        .from_source(move |info: &SubtaskInfo| KafkaSource::records(&config, info))
        .collect();
    graph.execute(runtime()).expect("runs");
    let mut seen = Vec::new();
    let mut watermarks = 0;
    for (subtask, elements) in out.by_subtask().into_iter().enumerate() {
        let mut last: BTreeMap<i32, i64> = BTreeMap::new();
        for element in elements {
            match element {
                StreamElement::Record(record) => {
                    let message = record.value;
                    assert_eq!(
                        weir_net::kafka::owner_of(&topic, message.partition, 2),
                        subtask,
                        "partition {} read by the wrong subtask",
                        message.partition
                    );
                    let previous = last.insert(message.partition, message.offset);
                    assert!(previous.is_none_or(|p| p < message.offset), "out of order");
                    assert_eq!(record.timestamp, message.timestamp);
                    assert!(record.timestamp.is_some(), "no event time");
                    let n = u64::decode(&mut message.payload.as_deref().expect("value"))
                        .expect("a number");
                    assert_eq!(message.key.as_deref(), Some(n.to_string().as_bytes()));
                    seen.push(n);
                }
                StreamElement::Watermark(_) => watermarks += 1,
            }
        }
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..2_000).collect::<Vec<_>>());
    assert!(watermarks > 0, "no watermark");
}

/// Polls `source` until it handed out `count` records (or fails the test after 30 s).
fn take<T: 'static>(source: &mut impl Source<T>, parker: &Parker, count: usize) -> Vec<T> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let start = Instant::now();
    while got.len() < count {
        assert!(
            Instant::now() < deadline,
            "only {} of {count} in 30 s",
            got.len()
        );
        let now = start.elapsed().as_nanos() as u64;
        match source.poll_next(now) {
            SourceEvent::Record(value, _) => got.push(value),
            SourceEvent::Idle { .. } => {
                parker.park(Some(Duration::from_millis(50)), || false);
            }
            SourceEvent::Failed(message) => panic!("the source failed: {message}"),
            SourceEvent::End => panic!("ended after {}", got.len()),
            SourceEvent::Watermark(_) => {}
        }
    }
    got
}

/// A source restored from a snapshot reads on exactly after the records it had handed
/// out at the snapshot: the records fetched but not handed out then come again.
#[test]
fn a_restored_source_reads_on_at_its_checkpointed_offsets() {
    let Some(brokers) = test_brokers("a_restored_source_reads_on_at_its_checkpointed_offsets")
    else {
        return;
    };
    let topic = unique("restore");
    fill(&brokers, &topic, 3, 3_000);
    let config = KafkaSourceConfig::new(brokers.clone(), vec![topic.clone()]);
    let parker = Parker::current();
    let mut first = KafkaSource::<u64>::codec(&config, &info(0, 1, &parker, true));
    let before = take(&mut first, &parker, 1_000);
    let state = first.snapshot_state().expect("a position");
    let after_in_first = take(&mut first, &parker, 2_000);
    drop(first);
    let mut second = KafkaSource::<u64>::codec(&config, &info(0, 1, &parker, true));
    second.restore_state(&state).expect("restores");
    let after = take(&mut second, &parker, 2_000);
    let mut all: Vec<u64> = before.iter().chain(&after).copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..3_000).collect::<Vec<_>>(), "lost or repeated");
    let mut a = after.clone();
    let mut b = after_in_first.clone();
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(
        a, b,
        "the restored source read something else than the first would have"
    );
    // A state for another parallelism is refused by name.
    let mut other = KafkaSource::<u64>::codec(&config, &info(1, 7, &parker, true));
    let refused = other.restore_state(&state);
    if weir_net::kafka::owner_of(&topic, 0, 7) != 1 {
        assert!(refused.unwrap_err().to_string().contains("another subtask"));
    }
}

/// A value the deserializer refuses fails the job naming topic, partition and offset;
/// under the skip policy it is passed and counted, the rest read.
#[test]
fn a_message_that_cannot_be_decoded_fails_naming_it_or_is_skipped() {
    let Some(brokers) =
        test_brokers("a_message_that_cannot_be_decoded_fails_naming_it_or_is_skipped")
    else {
        return;
    };
    let topic = unique("decode");
    assert!(admin(&brokers).create_topic(&topic, 1).expect("creates"));
    produce(&brokers, &topic, 10, Duration::from_secs(30), |n, out| {
        if n == 6 {
            out.payload = b"bad".to_vec();
        } else {
            n.encode(&mut out.payload);
        }
    })
    .expect("produces");
    let mut config = KafkaSourceConfig::new(brokers.clone(), vec![topic.clone()]);
    config.bounded = true;
    let fail = config.clone();
    let graph = Graph::new().with_parallelism(1);
    graph
        .from_source(move |info: &SubtaskInfo| KafkaSource::<u64>::codec(&fail, info))
        .collect();
    let (_, failure) = graph.execute_to_end(runtime()).expect("starts");
    let message = failure.expect("the job fails").to_string();
    assert!(
        message.contains(&format!("topic {topic:?} partition 0 offset 6")),
        "{message}"
    );

    config.on_decode_error = DecodeErrorPolicy::Skip;
    let stats = Arc::new(weir_net::kafka::KafkaSourceStats::default());
    let shared = Arc::clone(&stats);
    let graph = Graph::new().with_parallelism(1);
    let out = graph
        .from_source(move |info: &SubtaskInfo| {
            KafkaSource::<u64>::codec(&config, info).with_stats(Arc::clone(&shared))
        })
        .collect();
    graph.execute(runtime()).expect("runs");
    assert_eq!(out.records(), [0, 1, 2, 3, 4, 5, 7, 8, 9]);
    assert_eq!(stats.skipped.load(Ordering::Relaxed), 1);
}

/// A topic that does not exist and an address where no broker listens each fail the
/// job with a message that says what to fix.
#[test]
fn an_unknown_topic_and_a_wrong_address_are_clear_errors() {
    let Some(brokers) = test_brokers("an_unknown_topic_and_a_wrong_address_are_clear_errors")
    else {
        return;
    };
    let missing = unique("missing");
    let cases = [
        (brokers.clone(), format!("topic {missing:?} does not exist")),
        (
            "127.0.0.1:1".to_string(),
            "no broker at 127.0.0.1:1 answered".to_string(),
        ),
    ];
    for (at, expected) in cases {
        let mut config = KafkaSourceConfig::new(at, vec![missing.clone()]);
        config.broker_timeout = Duration::from_secs(2);
        let graph = Graph::new().with_parallelism(1);
        graph
            .from_source(move |info: &SubtaskInfo| KafkaSource::records(&config, info))
            .collect();
        let started = Instant::now();
        let (_, failure) = graph.execute_to_end(runtime()).expect("starts");
        let message = failure.expect("the job fails").to_string();
        assert!(message.contains(&expected), "{message}");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "took {:?}",
            started.elapsed()
        );
    }
    // Invalid settings are refused up front.
    let mut config = KafkaSourceConfig::new(brokers, vec!["t".into()]);
    config.max_prefetch_bytes = 0;
    assert!(config
        .validate()
        .unwrap_err()
        .to_string()
        .contains("max_prefetch_bytes"));
}

/// At least once, every record arrives, and each keyed record is in the partition
/// Kafka's default partitioner gives its key.
#[test]
fn the_sink_writes_at_least_once_with_keys_partitioned_as_kafka_does() {
    let Some(brokers) =
        test_brokers("the_sink_writes_at_least_once_with_keys_partitioned_as_kafka_does")
    else {
        return;
    };
    let topic = unique("alo");
    assert!(admin(&brokers).create_topic(&topic, 3).expect("creates"));
    let config = KafkaSinkConfig::new(brokers.clone(), topic.clone());
    let graph = Graph::new().with_parallelism(2);
    graph
        .from_generator(5_000, None, |n| n)
        .rebalance()
        .sink(move |info: &SubtaskInfo| {
            KafkaSink::new(&config, info, |n: &u64, _, out: &mut KafkaOut| {
                out.key = Some(format!("key-{}", n % 97).into_bytes());
                n.encode(&mut out.payload);
                out.headers.push(("h".into(), b"v".to_vec()));
            })
        });
    graph.execute(runtime()).expect("runs");
    let messages = admin(&brokers).read_all(&topic).expect("reads");
    let mut numbers: Vec<u64> = messages
        .iter()
        .map(|m| {
            let key = m.key.as_deref().expect("a key");
            assert_eq!(m.partition, key_partition(key, 3), "key {key:?}");
            assert_eq!(m.headers, [("h".to_string(), Some(b"v".to_vec()))]);
            u64::decode(&mut m.payload.as_deref().expect("value")).expect("a number")
        })
        .collect();
    numbers.sort_unstable();
    numbers.dedup();
    assert_eq!(numbers, (0..5_000).collect::<Vec<_>>());
}

/// Checkpoints every 20 ms into `dir/chk`; the newest completed.
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

fn exactly_once_job(
    settings: Checkpointing,
    config: &KafkaSinkConfig,
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
        .sink(move |info: &SubtaskInfo| KafkaSink::<u64>::codec(&config, info));
    graph
}

/// The numbers in `topic`, each message's checkpoint tag checked.
fn numbers_in(brokers: &str, topic: &str) -> Vec<u64> {
    admin(brokers)
        .read_all(topic)
        .expect("reads")
        .iter()
        .map(|m| {
            let tag = m
                .headers
                .iter()
                .find(|(name, _)| name == "weir-txn")
                .and_then(|(_, v)| v.clone())
                .expect("a checkpoint tag");
            assert_eq!(String::from_utf8(tag).expect("text").split(':').count(), 3);
            u64::decode(&mut m.payload.as_deref().expect("value")).expect("a number")
        })
        .collect()
}

/// Exactly once: a job stopped after its second checkpoint has written only the
/// transactions of completed checkpoints, each record once; restored and run to the
/// end, every record is in the topic exactly once.
#[test]
fn the_sink_writes_exactly_once_across_a_stop_and_restore() {
    let Some(brokers) = test_brokers("the_sink_writes_exactly_once_across_a_stop_and_restore")
    else {
        return;
    };
    let topic = unique("eos");
    assert!(admin(&brokers).create_topic(&topic, 2).expect("creates"));
    let dir = Scratch::new();
    let mut config = KafkaSinkConfig::new(brokers.clone(), topic.clone());
    config.guarantee = SinkGuarantee::ExactlyOnce;
    config.transactional_id_prefix = unique("tx");
    config.checkpoint_header = Some("weir-txn".into());
    let records = 6_000;
    let (settings, completed) = checkpointing(dir.path());
    let job = exactly_once_job(settings, &config, records, Some(10_000.0))
        .start(runtime())
        .expect("starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while completed.load(Ordering::Relaxed) < 3 {
        assert!(Instant::now() < deadline, "no checkpoint in 30 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    job.controller().cancel();
    let (_, failure) = job.join();
    assert!(
        matches!(failure, Some(RuntimeError::Cancelled { .. })),
        "{failure:?}"
    );
    let before = numbers_in(&brokers, &topic);
    assert!(before.len() < records as usize, "meant to stop mid-way");
    let mut distinct = before.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), before.len(), "a record written twice");

    let (settings, _) = checkpointing(dir.path());
    let settings = settings.restore_from(dir.path().join("chk"));
    exactly_once_job(settings, &config, records, None)
        .execute(runtime())
        .expect("runs");
    let mut all = numbers_in(&brokers, &topic);
    all.sort_unstable();
    assert_eq!(all, (0..records).collect::<Vec<_>>());
}

/// Polls `sink` until it is flushed (everything committed), or fails after 30 s.
fn drain<T: 'static>(sink: &mut KafkaSink<T>, parker: &Parker) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        sink.poll(0).expect("no failure");
        if sink.flushed() {
            return;
        }
        assert!(Instant::now() < deadline, "not flushed in 30 s");
        parker.park(Some(Duration::from_millis(20)), || false);
    }
}

/// The two-phase commit's restore: a sink that pre-committed checkpoint 2 and died
/// before committing it is restored from checkpoint 2 and commits it (nothing lost);
/// restored from checkpoint 2 again, it finds through the marker that both
/// transactions are in and writes nothing (nothing twice).
#[test]
fn a_restored_sink_commits_what_was_pre_committed_and_skips_what_is_in() {
    let Some(brokers) =
        test_brokers("a_restored_sink_commits_what_was_pre_committed_and_skips_what_is_in")
    else {
        return;
    };
    let topic = unique("marker");
    assert!(admin(&brokers).create_topic(&topic, 1).expect("creates"));
    let mut config = KafkaSinkConfig::new(brokers.clone(), topic.clone());
    config.guarantee = SinkGuarantee::ExactlyOnce;
    config.transactional_id_prefix = unique("tx");
    let parker = Parker::current();
    let mut first = KafkaSink::<u64>::codec(&config, &info(0, 1, &parker, true));
    for n in 0..10 {
        first.invoke(n, None, 0).expect("takes");
    }
    let _one = first
        .snapshot_state(1)
        .expect("pre-commits")
        .expect("state");
    first.notify_checkpoint_complete(1).expect("commits");
    drain(&mut first, &parker);
    for n in 10..20 {
        first.invoke(n, None, 0).expect("takes");
    }
    let two = first
        .snapshot_state(2)
        .expect("pre-commits")
        .expect("state");
    drop(first); // dies before checkpoint 2's commit
    let committed: Vec<u64> = admin(&brokers)
        .read_all(&topic)
        .expect("reads")
        .iter()
        .map(|m| u64::decode(&mut m.payload.as_deref().expect("v")).expect("n"))
        .collect();
    assert_eq!(committed, (0..10).collect::<Vec<_>>());

    for attempt in 0..2 {
        let mut restored = KafkaSink::<u64>::codec(&config, &info(0, 1, &parker, true));
        restored.restore_state(&two).expect("restores");
        drain(&mut restored, &parker);
        let stats = restored.stats();
        if attempt == 0 {
            assert_eq!(stats.transactions_committed.load(Ordering::Relaxed), 1);
        } else {
            assert_eq!(stats.transactions_committed.load(Ordering::Relaxed), 0);
            assert_eq!(
                stats.transactions_found_committed.load(Ordering::Relaxed),
                1
            );
        }
    }
    let all: Vec<u64> = admin(&brokers)
        .read_all(&topic)
        .expect("reads")
        .iter()
        .map(|m| u64::decode(&mut m.payload.as_deref().expect("v")).expect("n"))
        .collect();
    assert_eq!(all, (0..20).collect::<Vec<_>>());
}
