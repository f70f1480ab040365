//! Kafka as a log a job reads from and writes to: a source reading topics ([`source`],
//! Flink's `KafkaSource`) and a sink writing one ([`sink`], Flink's `KafkaSink`), at
//! least once or exactly once, through `rdkafka` (librdkafka, built from source by its
//! build script).
//!
//! **Where the client runs.** librdkafka does its network I/O on threads of its own
//! (one per broker, plus a main thread); a client's calls either take what those threads
//! queued (non-blocking) or wait for a broker's answer (blocking). A task never makes a
//! blocking call on its worker:
//! - the source's consumer is polled on the worker with a zero timeout (it takes the
//!   messages librdkafka already fetched, never waits), and librdkafka rings the
//!   subtask's doorbell ([`SubtaskInfo::unparker`](weir_engine::graph::SubtaskInfo))
//!   when its queue goes from empty to non-empty, so an idle source costs no wake-up.
//!   What needs a broker's answer (topic metadata for the partitions and their
//!   discovery, start offsets by timestamp or from a group) runs on a discovery thread
//!   of the subtask's own, which hands its results over and rings the doorbell;
//! - the sink at least once sends on the worker (`send` only queues) through a
//!   producer whose delivery reports are served on its own polling thread (rdkafka's
//!   `ThreadedProducer`); the reports are handed over and ring the doorbell;
//! - the sink exactly once commits on a committer thread of its own, since every
//!   transactional call (`init_transactions`, `commit_transaction`, …) waits for the
//!   transaction coordinator.
//!
//! The non-blocking forms were chosen over a thread per task feeding a mailbox where
//! they exist (polling and sending): librdkafka already runs the I/O off the worker,
//! and a second hand-off would add a copy and a wake-up per batch for nothing.
//!
//! **Partitions over subtasks** ([`owner_of`]): partition `p` of topic `t` is read by
//! subtask `(start(t) + p) mod parallelism`, where `start(t)` is
//! `(31 × hash(t) & 0x7fffffff) mod parallelism` with `hash` Java's `String.hashCode`,
//! as Flink's Kafka enumerator assigns them. The assignment is stable: a partition
//! discovered later goes to the same subtask whichever process computes it, and the
//! partitions of one topic spread round the subtasks from a topic-dependent start.
//!
//! **The broker the tests run against** is `tansu` 0.6.0 with in-memory storage (started
//! by `scripts/kafka.sh`). It serves what the connectors need: produce, fetch, metadata,
//! topic creation and deletion, transactions (`InitProducerId`, `AddPartitionsToTxn`,
//! `EndTxn` commit and abort, fencing by transactional id) and transactional offset
//! commits, which the exactly-once sink's marker relies on. What it does not serve
//! correctly, measured against it: `read_committed` fetches return aborted records
//! too; `ListOffsets` answers with the last record batch's base offset, so "latest",
//! "by timestamp" and lag figures from it are off by up to a batch, and its answer for
//! the earliest offset is at times a later batch's base offset (which would skip the
//! batches before it), so the earliest start asks for offset 0 instead. The tests check
//! exactly once by the checkpoint each record is tagged with instead of through
//! `read_committed` (see `sink`), and a source's bounded end is the end it reaches
//! (end-of-partition), not a `ListOffsets` answer.

use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

pub mod admin;
pub mod error;
pub mod produce;
pub mod record;
pub mod sink;
pub mod source;
pub mod url;

pub use admin::KafkaAdmin;
pub use error::KafkaError;
pub use record::{KafkaMessage, KafkaOut, KafkaRecord};
pub use sink::{KafkaPartitioner, KafkaSink, KafkaSinkConfig, KafkaSinkStats, SinkGuarantee};
pub use source::{
    DecodeErrorPolicy, KafkaSource, KafkaSourceConfig, KafkaSourceStats, StartOffsets,
};
pub use url::{KafkaUrl, KafkaUrlError};

/// Java's `String.hashCode` of `text` (over its UTF-16 code units, wrapping), which
/// Flink's enumerator hashes topic names with.
pub fn java_string_hash(text: &str) -> i32 {
    text.encode_utf16()
        .fold(0i32, |h, unit| h.wrapping_mul(31).wrapping_add(unit as i32))
}

/// The subtask (of `parallelism`) that reads partition `partition` of `topic`: Flink's
/// Kafka enumerator's assignment (see the module docs).
pub fn owner_of(topic: &str, partition: i32, parallelism: usize) -> usize {
    let readers = parallelism.max(1) as i64;
    let start = (java_string_hash(topic).wrapping_mul(31) & 0x7fff_ffff) as i64 % readers;
    ((start + partition as i64) % readers) as usize
}

/// Kafka's default partitioner's hash (Java client: murmur2 with seed `0x9747b28c`),
/// so that a key goes to the partition a Java producer would send it to:
/// `(murmur2(key) & 0x7fffffff) mod partitions`.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let length = data.len() as u32;
    let mut h: u32 = SEED ^ length;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= (rest[2] as u32) << 16;
    }
    if rest.len() >= 2 {
        h ^= (rest[1] as u32) << 8;
    }
    if !rest.is_empty() {
        h ^= rest[0] as u32;
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition Kafka's default partitioner gives `key` among `partitions`.
pub fn key_partition(key: &[u8], partitions: i32) -> i32 {
    (murmur2(key) & 0x7fff_ffff) % partitions.max(1)
}

/// Whether the brokers answer: librdkafka reports "all brokers down" through a client's
/// error callback and retries for ever; a connector fails once none was reachable for
/// its `broker_timeout` (a wrong address, a broker gone), so that the job's restart
/// strategy takes over with a message that names the address.
#[derive(Debug, Default)]
pub(crate) struct Health {
    state: Mutex<HealthState>,
}

#[derive(Debug, Default)]
struct HealthState {
    down_since: Option<Instant>,
    last_error: String,
}

impl Health {
    /// A client error: "all brokers down" (and failures to resolve or connect) start
    /// the clock, if it is not running.
    pub(crate) fn error(&self, all_down: bool, reason: &str) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.last_error = reason.to_string();
        if all_down && state.down_since.is_none() {
            state.down_since = Some(Instant::now());
        }
    }

    /// Something came back from a broker.
    pub(crate) fn up(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.down_since = None;
    }

    /// How long no broker has answered, and the last error, if one is down.
    pub(crate) fn down(&self) -> Option<(Duration, String)> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state
            .down_since
            .map(|since| (since.elapsed(), state.last_error.clone()))
    }
}

/// Whether an rdkafka error says the brokers cannot be reached.
pub(crate) fn is_unreachable(error: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as Code;
    matches!(
        error.rdkafka_error_code(),
        Some(
            Code::AllBrokersDown
                | Code::BrokerTransportFailure
                | Code::Resolve
                | Code::UnknownBroker
        )
    )
}

/// librdkafka's cached low and high watermarks of a partition, from the last fetch
/// response for it: no request, so a worker may ask.
pub(crate) fn cached_watermarks<C: rdkafka::ClientContext>(
    client: &rdkafka::client::Client<C>,
    topic: &str,
    partition: i32,
) -> Option<(i64, i64)> {
    let topic = std::ffi::CString::new(topic).ok()?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: `client.native_ptr()` is the live `rd_kafka_t` that `client` owns, valid
    // while it is borrowed; `topic` is NUL-terminated and outlives the call; `low` and
    // `high` are valid for writes. The call only reads the client's cached state.
    let error = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            client.native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (error == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR)
        .then_some((low, high))
}

/// Runs a future to its end on this thread (rdkafka's admin calls are futures; the
/// threads that make them are the connectors' own, never a worker).
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::park();
    }
}

/// A client configuration with the brokers, a client id and the user's properties
/// (which come last, so they override the connector's own choices).
pub(crate) fn client_config(
    brokers: &str,
    client_id: &str,
    own: &[(&str, String)],
    user: &[(String, String)],
) -> rdkafka::ClientConfig {
    let mut config = rdkafka::ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    config.set("client.id", client_id);
    // librdkafka logs to stderr by default; its errors reach the connectors through
    // their contexts, which act on them and count them.
    config.set("log_level", "3");
    for (key, value) in own {
        config.set(*key, value.as_str());
    }
    for (key, value) in user {
        config.set(key, value);
    }
    config
}

/// The environment variable naming the broker the Kafka integration tests use
/// (`host:port`); `scripts/kafka.sh start` prints it.
pub const TEST_BROKERS_VAR: &str = "WEIR_KAFKA_BROKERS";

/// The broker of [`TEST_BROKERS_VAR`] for an integration test, or `None` with a note that
/// `test` was skipped (`scripts/test.sh` starts one and sets the variable).
///
/// # Panics
/// If `WEIR_KAFKA_REQUIRED` is set (as CI sets it) and no broker is named: the Kafka
/// tests must run there, not skip.
pub fn test_brokers(test: &str) -> Option<String> {
    match std::env::var(TEST_BROKERS_VAR) {
        Ok(brokers) if !brokers.is_empty() => Some(brokers),
        _ if std::env::var_os("WEIR_KAFKA_REQUIRED").is_some() => {
            panic!("{test}: WEIR_KAFKA_REQUIRED is set but {TEST_BROKERS_VAR} is not")
        }
        _ => {
            eprintln!(
                "note: {test} skipped: {TEST_BROKERS_VAR} is unset (scripts/test.sh starts a \
                 broker with scripts/kafka.sh)"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_string_hash_matches_java() {
        // Values from Java's "…".hashCode().
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("a"), 97);
        assert_eq!(java_string_hash("hello"), 99_162_322);
        assert_eq!(java_string_hash("events"), -1_291_329_255);
    }

    #[test]
    fn partitions_spread_round_the_subtasks_from_a_topic_start() {
        let start = owner_of("events", 0, 4);
        for p in 0..8 {
            assert_eq!(owner_of("events", p, 4), (start + p as usize) % 4);
        }
        assert_eq!(owner_of("events", 3, 1), 0);
    }

    #[test]
    fn murmur2_matches_the_java_client() {
        // Kafka's Utils.murmur2 test vectors.
        assert_eq!(murmur2(b"21"), -973_932_308);
        assert_eq!(murmur2(b"foobar"), -790_332_482);
        assert_eq!(murmur2(b"a-little-bit-long-string"), -985_981_536);
        assert_eq!(murmur2(b"a-little-bit-longer-string"), -1_486_304_829);
        assert_eq!(
            murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"),
            -58_897_971
        );
        assert_eq!(murmur2(b"abc"), 479_470_107);
    }
}
