//! The Kafka source (Flink's `KafkaSource`): each subtask reads the partitions the
//! enumerator's rule gives it (see the module docs of `super`), with positions kept in
//! checkpoints.
//!
//! **Partitions and their discovery.** A discovery thread of the subtask's own asks the
//! brokers for the topics' partitions (a metadata request) at the start and then every
//! `discovery_interval` (Flink's `partition.discovery.interval.ms`, default 5 minutes;
//! `None`: only at the start), keeps the partitions [`owner_of`] gives this subtask,
//! resolves where each new one starts, and hands them to the subtask, which assigns
//! them to its consumer (`incremental_assign`: no consumer-group protocol, no
//! rebalances; each partition has exactly one reader). Partitions found at the first
//! discovery start at [`StartOffsets`]; partitions found later start at their earliest
//! offset, as Flink's do, so that nothing written to a new partition before it was seen
//! is missed. A topic that does not exist (or was deleted) fails the source with
//! [`KafkaError::UnknownTopic`].
//!
//! **Positions live in checkpoints, not in the broker.** The snapshot at a barrier holds,
//! per partition, the offset after the last record handed out (or, for a partition that
//! handed out nothing yet, where it was to start). A restore assigns each checkpointed
//! partition at exactly that offset; messages fetched but not handed out at the barrier
//! are after it, so they are read again: nothing is lost or emitted twice. Committing
//! offsets to the consumer group (`group_id`) when a checkpoint completes is for
//! monitoring only (lag in the group's tools); a restore never reads them. A snapshot is
//! not told its checkpoint's id, so on completion the source commits the positions of
//! the newest snapshot but one (the newest may belong to a checkpoint still pending):
//! the group's offsets trail by one checkpoint, never run ahead of a completed one.
//! A checkpointed offset the broker no longer holds (retention deleted it) restarts
//! that partition at its earliest offset (`auto.offset.reset=earliest`).
//!
//! **Event time and watermarks.** A record's timestamp is Kafka's (create time, or
//! log-append time for topics so set), in milliseconds. Watermarks are per partition,
//! as Flink's Kafka source keeps them: the subtask's watermark is the minimum over its
//! active partitions of the largest timestamp each handed out, less `out_of_orderness`,
//! less 1 ms, emitted after a batch when it advanced. A partition that has handed out
//! nothing holds the watermark back until it is idle: with `idle_timeout`, a partition
//! without a record for that long leaves the minimum, and a subtask whose partitions
//! are all idle (or that has none) emits [`IDLE_WATERMARK`], Flink's idle status, so
//! that operators downstream take their watermark from the other subtasks.
//!
//! **Decoding** goes through the deserializer given (a function of a
//! [`KafkaMessage`]; [`KafkaSource::records`] keeps each message whole, as a
//! [`KafkaRecord`]). A message it refuses fails the source naming its topic, partition
//! and offset ([`DecodeErrorPolicy::Fail`], the default), or is skipped and counted
//! ([`DecodeErrorPolicy::Skip`]; its offset is passed, so a restore skips it too).
//!
//! **Back-pressure.** The task polls the source only while the chain after it has room,
//! and librdkafka stops fetching a partition while the messages it prefetched and the
//! source has not taken fill `max_prefetch_bytes` (`queued.max.messages.kbytes`): a
//! back-pressured source holds at most that much, and fetching resumes as the task
//! takes messages. Nothing is buffered without bound.
//!
//! **Bounded** (`bounded`): each partition is read up to the end it first reaches
//! (librdkafka's end-of-partition, from the fetch responses' high watermark), then the
//! source ends once every partition found at the start did; no later discovery. (Not
//! the end offsets at the start, as Flink's bounded mode: the broker the tests use
//! answers `ListOffsets` inexactly.)
//!
//! **Failures.** A broker that goes away is retried by librdkafka; if none answers for
//! `broker_timeout`, the source fails with [`KafkaError::Unreachable`] and the job's
//! restart strategy takes over (a restart re-reads from the last completed checkpoint).
//! A fatal consumer error, an unknown topic and a refused configuration fail it at
//! once. Failing is [`SourceEvent::Failed`]: the subtask fails with the message, and
//! with it the job.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaError as RdError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};
use weir_engine::element::{Record, IDLE_WATERMARK};
use weir_engine::exchange::codec::{Codec, DecodeError};
use weir_engine::graph::{Source, SourceEvent, SubtaskInfo};
use weir_engine::park::Unparker;
use weir_engine::runtime::TaskError;

use super::admin::partitions_of;
use super::error::KafkaError;
use super::record::{KafkaMessage, KafkaRecord};
use super::{cached_watermarks, client_config, is_unreachable, owner_of, Health};

/// Where partitions found at the start begin (a restore begins at its checkpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartOffsets {
    /// Each partition's earliest offset (the default).
    #[default]
    Earliest,
    /// After the records each partition holds when the source starts.
    Latest,
    /// The first record at or after this timestamp (milliseconds); a partition with none
    /// starts at its end.
    Timestamp(i64),
    /// The consumer group's committed offsets (`group_id`); a partition without one
    /// starts at its earliest offset.
    CommittedOrEarliest,
    /// The consumer group's committed offsets; a partition without one starts at its
    /// end.
    CommittedOrLatest,
}

/// What the source does with a message its deserializer refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecodeErrorPolicy {
    /// Fail the job, naming topic, partition and offset (the default).
    #[default]
    Fail,
    /// Skip it and count it ([`KafkaSourceStats::skipped`]).
    Skip,
}

/// Settings of a [`KafkaSource`].
#[derive(Debug, Clone)]
pub struct KafkaSourceConfig {
    /// The bootstrap servers, `host:port[,host:port…]`.
    pub brokers: String,
    /// The topics read, at least one.
    pub topics: Vec<String>,
    /// Where partitions found at the start begin.
    pub start: StartOffsets,
    /// The consumer group: its committed offsets are a start position
    /// ([`StartOffsets::CommittedOrEarliest`]), and completed checkpoints commit the
    /// positions to it, for monitoring. `None`: no group is read or written.
    pub group_id: Option<String>,
    /// Read each partition to the end it reaches, then end.
    pub bounded: bool,
    /// How often new partitions are looked for (`None`: only at the start).
    pub discovery_interval: Option<Duration>,
    /// A partition without records for this long stops holding back the watermark
    /// (`None`: never idle).
    pub idle_timeout: Option<Duration>,
    /// How far out of order timestamps may come: the watermark trails the largest
    /// timestamp by this much (and 1 ms).
    pub out_of_orderness: Duration,
    /// What a message the deserializer refuses does.
    pub on_decode_error: DecodeErrorPolicy,
    /// The most prefetched bytes librdkafka holds for the subtask (at least 1 KiB).
    pub max_prefetch_bytes: usize,
    /// How long no broker may answer before the source fails.
    pub broker_timeout: Duration,
    /// librdkafka properties, set last (they override the source's own), e.g.
    /// `security.protocol`.
    pub properties: Vec<(String, String)>,
}

impl KafkaSourceConfig {
    /// Reads `topics` at `brokers` from their earliest offsets, unbounded, with the
    /// defaults.
    pub fn new(brokers: impl Into<String>, topics: Vec<String>) -> Self {
        KafkaSourceConfig {
            brokers: brokers.into(),
            topics,
            start: StartOffsets::Earliest,
            group_id: None,
            bounded: false,
            discovery_interval: Some(Duration::from_secs(300)),
            idle_timeout: None,
            out_of_orderness: Duration::ZERO,
            on_decode_error: DecodeErrorPolicy::Fail,
            max_prefetch_bytes: 8 << 20,
            broker_timeout: Duration::from_secs(30),
            properties: Vec::new(),
        }
    }

    /// Refuses settings that cannot work, saying which.
    pub fn validate(&self) -> Result<(), KafkaError> {
        let bad = |m: String| Err(KafkaError::Config(m));
        if self.brokers.trim().is_empty() {
            return bad("the source names no broker: give host:port".into());
        }
        if self.topics.is_empty() {
            return bad("the source names no topic".into());
        }
        for topic in &self.topics {
            if !super::url::legal_topic(topic) {
                return bad(format!("{topic:?} is not a legal topic name"));
            }
        }
        if matches!(
            self.start,
            StartOffsets::CommittedOrEarliest | StartOffsets::CommittedOrLatest
        ) && self.group_id.is_none()
        {
            return bad("starting from committed offsets needs a group_id".into());
        }
        if self.max_prefetch_bytes < 1024 {
            return bad(format!(
                "max_prefetch_bytes {} is below 1 KiB; give at least 1024",
                self.max_prefetch_bytes
            ));
        }
        if self.discovery_interval == Some(Duration::ZERO) {
            return bad("discovery_interval 0: give a positive interval, or None".into());
        }
        if self.idle_timeout == Some(Duration::ZERO) {
            return bad("idle_timeout 0: give a positive timeout, or None".into());
        }
        if self.broker_timeout.is_zero() {
            return bad("broker_timeout 0: give a positive timeout".into());
        }
        Ok(())
    }
}

/// Live counters of a source (all subtasks together), for metrics.
#[derive(Debug, Default)]
pub struct KafkaSourceStats {
    /// Records handed out.
    pub records: AtomicU64,
    /// Bytes of keys and values handed out.
    pub bytes: AtomicU64,
    /// Messages the deserializer refused and the source skipped.
    pub skipped: AtomicU64,
    /// Errors librdkafka reported and retried (a broker lost, a fetch failed).
    pub errors: AtomicU64,
    /// Partitions assigned.
    pub partitions: AtomicU64,
    /// Offset commits to the group made at completed checkpoints.
    pub commits: AtomicU64,
    /// Consumer lag per partition: the partition's high watermark as last fetched
    /// less the source's position.
    pub lag: Mutex<BTreeMap<(String, i32), i64>>,
}

impl KafkaSourceStats {
    /// Registers these counters in a scrape's registry under `weir_kafka_source_*`,
    /// labelled `source="name"` (and `topic`, `partition` for the lag).
    pub fn register(&self, name: &str, registry: &mut prometheus_client::registry::Registry) {
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let sub = registry.sub_registry_with_label((
            std::borrow::Cow::Borrowed("source"),
            std::borrow::Cow::Owned(name.to_string()),
        ));
        let counter = |v: &AtomicU64| ConstCounter::new(v.load(Ordering::Relaxed));
        sub.register(
            "kafka_source_records",
            "Records read",
            counter(&self.records),
        );
        sub.register(
            "kafka_source_bytes",
            "Bytes of keys and values read",
            counter(&self.bytes),
        );
        sub.register(
            "kafka_source_skipped",
            "Messages refused by the deserializer and skipped",
            counter(&self.skipped),
        );
        sub.register(
            "kafka_source_errors",
            "Client errors retried",
            counter(&self.errors),
        );
        sub.register(
            "kafka_source_commits",
            "Offset commits at completed checkpoints",
            counter(&self.commits),
        );
        let lag = self.lag.lock().unwrap_or_else(|e| e.into_inner());
        for ((topic, partition), value) in lag.iter() {
            let part = sub.sub_registry_with_label((
                std::borrow::Cow::Borrowed("topic"),
                std::borrow::Cow::Owned(topic.clone()),
            ));
            let part = part.sub_registry_with_label((
                std::borrow::Cow::Borrowed("partition"),
                std::borrow::Cow::Owned(partition.to_string()),
            ));
            part.register(
                "kafka_source_lag",
                "Records behind the partition's high watermark",
                ConstGauge::new(*value),
            );
        }
    }
}

/// Where a partition is: the offset of the next record to hand out, or where it is to
/// start while it has handed out nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Position {
    At(i64),
    Beginning,
    End,
}

impl Position {
    fn offset(self) -> Offset {
        match self {
            Position::At(offset) => Offset::Offset(offset),
            // Offset 0, not librdkafka's `Beginning`: the same on a broker (0 is either
            // the log's start or out of range, which `auto.offset.reset=earliest` takes
            // to the start), without asking `ListOffsets` for the earliest offset, which
            // the test broker sometimes answers with a later batch's base offset.
            Position::Beginning => Offset::Offset(0),
            Position::End => Offset::End,
        }
    }
}

struct PartitionState {
    position: Position,
    /// The largest timestamp handed out.
    max_timestamp: Option<i64>,
    /// When it last handed out a record (or was assigned), by the run's clock.
    active_ns: Option<u64>,
    /// Reached its end (bounded).
    ended: bool,
}

/// What the discovery thread hands over.
#[derive(Default)]
struct Found {
    /// New partitions and where they start.
    new: Vec<(String, i32, Position)>,
    /// The first discovery is done.
    initial_done: bool,
    failure: Option<KafkaError>,
}

struct Shared {
    found: Mutex<Found>,
    stop: Mutex<bool>,
    wake: Condvar,
}

struct SourceContext {
    health: Arc<Health>,
    stats: Arc<KafkaSourceStats>,
}

impl ClientContext for SourceContext {
    fn error(&self, error: RdError, reason: &str) {
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        self.health.error(is_unreachable(&error), reason);
    }
    fn log(&self, _level: rdkafka::config::RDKafkaLogLevel, _fac: &str, _log_message: &str) {}
}

impl ConsumerContext for SourceContext {}

type Deserializer<T> = Box<dyn FnMut(&KafkaMessage<'_>) -> Result<T, String>>;

/// A Kafka source's subtask: see the module docs.
pub struct KafkaSource<T> {
    config: Arc<KafkaSourceConfig>,
    index: usize,
    parallelism: usize,
    unparker: Unparker,
    deserialize: Deserializer<T>,
    consumer: Option<BaseConsumer<SourceContext>>,
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
    health: Arc<Health>,
    stats: Arc<KafkaSourceStats>,
    partitions: BTreeMap<(String, i32), PartitionState>,
    /// Checkpointed positions not assigned yet (a restore).
    restored: Option<BTreeMap<(String, i32), Position>>,
    initial_done: bool,
    /// Snapshots taken, oldest first, for committing to the group.
    snapshots: VecDeque<TopicPartitionList>,
    watermark: Option<i64>,
    idle: bool,
    failure: Option<String>,
    lag_at_ns: u64,
}

impl KafkaSource<KafkaRecord> {
    /// A subtask reading whole messages.
    pub fn records(config: &KafkaSourceConfig, info: &SubtaskInfo) -> Self {
        KafkaSource::new(config, info, |m: &KafkaMessage<'_>| Ok(m.to_record()))
    }
}

impl<T> KafkaSource<T> {
    /// Subtask `info` of a source reading per `config`, decoding each message with
    /// `deserialize`. Invalid settings fail it at its first poll (check them first with
    /// [`KafkaSourceConfig::validate`]).
    pub fn new(
        config: &KafkaSourceConfig,
        info: &SubtaskInfo,
        deserialize: impl FnMut(&KafkaMessage<'_>) -> Result<T, String> + 'static,
    ) -> Self {
        KafkaSource {
            config: Arc::new(config.clone()),
            index: info.index,
            parallelism: info.parallelism,
            unparker: info.unparker.clone(),
            deserialize: Box::new(deserialize),
            consumer: None,
            shared: Arc::new(Shared {
                found: Mutex::new(Found::default()),
                stop: Mutex::new(false),
                wake: Condvar::new(),
            }),
            thread: None,
            health: Arc::new(Health::default()),
            stats: Arc::new(KafkaSourceStats::default()),
            partitions: BTreeMap::new(),
            restored: None,
            initial_done: false,
            snapshots: VecDeque::new(),
            watermark: None,
            idle: false,
            failure: config.validate().err().map(|e| e.to_string()),
            lag_at_ns: 0,
        }
    }

    /// A subtask decoding each message's value with the project's [`Codec`].
    pub fn codec(config: &KafkaSourceConfig, info: &SubtaskInfo) -> Self
    where
        T: Codec,
    {
        KafkaSource::new(config, info, |m: &KafkaMessage<'_>| m.decode_payload::<T>())
    }

    /// Shares its counters with others' (e.g. one set for all subtasks of a source).
    pub fn with_stats(mut self, stats: Arc<KafkaSourceStats>) -> Self {
        self.stats = stats;
        self
    }

    /// Its counters.
    pub fn stats(&self) -> &Arc<KafkaSourceStats> {
        &self.stats
    }

    /// Creates the consumer and starts the discovery thread (at the first poll, after a
    /// restore).
    fn start(&mut self) -> Result<(), KafkaError> {
        let config = &self.config;
        let group = config
            .group_id
            .clone()
            .unwrap_or_else(|| format!("weir-source-{}", std::process::id()));
        let own = [
            ("group.id", group),
            ("enable.auto.commit", "false".to_string()),
            ("enable.auto.offset.store", "false".to_string()),
            ("auto.offset.reset", "earliest".to_string()),
            ("enable.partition.eof", config.bounded.to_string()),
            (
                "queued.max.messages.kbytes",
                (config.max_prefetch_bytes / 1024).max(1).to_string(),
            ),
            ("queued.min.messages", "10000".to_string()),
        ];
        let client_id = format!("weir-source-{}", self.index);
        let context = SourceContext {
            health: Arc::clone(&self.health),
            stats: Arc::clone(&self.stats),
        };
        let mut consumer: BaseConsumer<SourceContext> =
            client_config(&config.brokers, &client_id, &own, &config.properties)
                .create_with_context(context)
                .map_err(|e| KafkaError::Client(e.to_string()))?;
        // librdkafka calls this when the consumer's queue goes from empty to non-empty:
        // the source polls until the queue is empty before it idles, so every message
        // fetched after that rings the doorbell.
        let unparker = self.unparker.clone();
        consumer.set_nonempty_callback(move || unparker.unpark());
        self.consumer = Some(consumer);

        let discovery = Discovery {
            config: Arc::clone(&self.config),
            index: self.index,
            parallelism: self.parallelism,
            shared: Arc::clone(&self.shared),
            health: Arc::clone(&self.health),
            unparker: self.unparker.clone(),
            initial_done: self.initial_done,
        };
        self.thread = Some(
            std::thread::Builder::new()
                .name(format!("kafka-discovery-{}", self.index))
                .spawn(move || discovery.run())
                .map_err(|e| KafkaError::call("starting the discovery thread", e))?,
        );
        Ok(())
    }

    /// Assigns what the discovery thread found.
    fn take_found(&mut self, now_ns: u64) -> Result<(), KafkaError> {
        let (new, initial_done, failure) = {
            let mut found = self.shared.found.lock().unwrap_or_else(|e| e.into_inner());
            (
                std::mem::take(&mut found.new),
                found.initial_done,
                found.failure.take(),
            )
        };
        if let Some(failure) = failure {
            return Err(failure);
        }
        let mut list = TopicPartitionList::new();
        for (topic, partition, start) in new {
            let key = (topic, partition);
            if self.partitions.contains_key(&key) {
                continue;
            }
            let position = match self.restored.as_mut().and_then(|r| r.remove(&key)) {
                Some(position) => position,
                None => start,
            };
            list.add_partition_offset(&key.0, key.1, position.offset())
                .map_err(|e| KafkaError::call("assigning a partition", e))?;
            self.partitions.insert(
                key,
                PartitionState {
                    position,
                    max_timestamp: None,
                    active_ns: Some(now_ns),
                    ended: false,
                },
            );
        }
        if list.count() > 0 {
            let consumer = self.consumer.as_ref().expect("started");
            consumer
                .incremental_assign(&list)
                .map_err(|e| KafkaError::call("assigning partitions", e))?;
            self.stats
                .partitions
                .fetch_add(list.count() as u64, Ordering::Relaxed);
        }
        self.initial_done |= initial_done;
        Ok(())
    }

    /// The subtask's watermark over its active partitions, if it has one.
    fn current_watermark(&self, now_ns: u64) -> Option<i64> {
        let lateness = self.config.out_of_orderness.as_millis() as i64 + 1;
        let mut min: Option<i64> = None;
        for state in self.partitions.values() {
            if self.is_idle(state, now_ns) {
                continue;
            }
            let max = state.max_timestamp?;
            let mark = max.saturating_sub(lateness);
            min = Some(min.map_or(mark, |m| m.min(mark)));
        }
        min
    }

    fn is_idle(&self, state: &PartitionState, now_ns: u64) -> bool {
        match (self.config.idle_timeout, state.active_ns) {
            (Some(timeout), Some(at)) => now_ns.saturating_sub(at) >= timeout.as_nanos() as u64,
            _ => false,
        }
    }

    /// When the next partition goes idle, if one can.
    fn next_idle_ns(&self) -> Option<u64> {
        let timeout = self.config.idle_timeout?.as_nanos() as u64;
        self.partitions
            .values()
            .filter_map(|s| s.active_ns.map(|at| at + timeout))
            .min()
    }

    fn update_lag(&mut self, now_ns: u64) {
        if now_ns < self.lag_at_ns {
            return;
        }
        self.lag_at_ns = now_ns + 100_000_000;
        let Some(consumer) = self.consumer.as_ref() else {
            return;
        };
        let mut lag = self.stats.lag.lock().unwrap_or_else(|e| e.into_inner());
        for ((topic, partition), state) in &self.partitions {
            let Position::At(next) = state.position else {
                continue;
            };
            // The cached high watermark of the last fetch: no request.
            if let Some((_, high)) = cached_watermarks(consumer.client(), topic, *partition) {
                if high >= 0 {
                    lag.insert((topic.clone(), *partition), (high - next).max(0));
                }
            }
        }
    }

    fn fail(&mut self, error: KafkaError) -> SourceEvent<T> {
        let message = error.to_string();
        self.failure = Some(message.clone());
        SourceEvent::Failed(message)
    }
}

/// A message's bytes, for the counters.
fn message_bytes(message: &rdkafka::message::BorrowedMessage<'_>) -> u64 {
    (message.key().map_or(0, <[u8]>::len) + message.payload().map_or(0, <[u8]>::len)) as u64
}

impl<T: 'static> Source<T> for KafkaSource<T> {
    fn poll_next(&mut self, now_ns: u64) -> SourceEvent<T> {
        let mut run = Vec::with_capacity(1);
        match self.poll_batch(now_ns, &mut run, 1) {
            Some(event) if run.is_empty() => event,
            // An event after the record: the record now, the event at the next poll
            // (it is found again: a watermark still advanced, a failure still holds).
            _ => match run.pop() {
                Some(record) => SourceEvent::Record(record.value, record.timestamp),
                None => SourceEvent::Idle { until_ns: None },
            },
        }
    }

    fn poll_batch(
        &mut self,
        now_ns: u64,
        run: &mut Vec<Record<T>>,
        max: usize,
    ) -> Option<SourceEvent<T>> {
        if let Some(message) = &self.failure {
            return Some(SourceEvent::Failed(message.clone()));
        }
        if self.consumer.is_none() {
            if let Err(e) = self.start() {
                return Some(self.fail(e));
            }
        }
        if let Err(e) = self.take_found(now_ns) {
            return Some(self.fail(e));
        }
        if let Some((waited, reason)) = self.health.down() {
            if waited >= self.config.broker_timeout {
                return Some(self.fail(KafkaError::Unreachable {
                    brokers: self.config.brokers.clone(),
                    waited_s: waited.as_secs_f64(),
                    reason,
                }));
            }
        }
        let before = run.len();
        let mut outcome: Option<KafkaError> = None;
        {
            let consumer = self.consumer.as_ref().expect("started");
            while run.len() - before < max {
                let message = match consumer.poll(Duration::ZERO) {
                    None => break,
                    Some(Ok(message)) => message,
                    Some(Err(RdError::PartitionEOF(partition))) => {
                        // The event names the partition, not its topic: a partition of
                        // that number whose position reached the fetched high watermark
                        // has ended.
                        for ((topic, p), state) in self.partitions.iter_mut() {
                            if *p != partition || state.ended {
                                continue;
                            }
                            let at_end = match cached_watermarks(consumer.client(), topic, *p) {
                                Some((low, high)) => match state.position {
                                    Position::At(next) => next >= high,
                                    Position::Beginning => high <= low,
                                    Position::End => true,
                                },
                                None => false,
                            };
                            state.ended = at_end;
                        }
                        continue;
                    }
                    Some(Err(error)) => {
                        if is_unreachable(&error) {
                            self.health.error(true, &error.to_string());
                            self.stats.errors.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        let code = error.rdkafka_error_code();
                        if matches!(
                            code,
                            Some(RDKafkaErrorCode::UnknownTopicOrPartition)
                                | Some(RDKafkaErrorCode::UnknownTopic)
                                | Some(RDKafkaErrorCode::UnknownPartition)
                        ) {
                            outcome = Some(KafkaError::UnknownTopic {
                                topic: self.config.topics.join(","),
                                brokers: self.config.brokers.clone(),
                            });
                            break;
                        }
                        if matches!(error, RdError::MessageConsumptionFatal(_)) {
                            outcome = Some(KafkaError::call("consuming", error));
                            break;
                        }
                        // Anything else librdkafka retries itself.
                        self.stats.errors.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                };
                self.health.up();
                let key = (message.topic().to_string(), message.partition());
                let offset = message.offset();
                let timestamp = message.timestamp().to_millis();
                let bytes = message_bytes(&message);
                let view = KafkaMessage { message: &message };
                let decoded = (self.deserialize)(&view);
                drop(message);
                let Some(state) = self.partitions.get_mut(&key) else {
                    // A message of a partition this subtask no longer reads: none are
                    // ever unassigned, so this cannot come; drop it rather than emit
                    // what no checkpoint would cover.
                    continue;
                };
                match decoded {
                    Ok(value) => {
                        run.push(Record { value, timestamp });
                        self.stats.records.fetch_add(1, Ordering::Relaxed);
                        self.stats.bytes.fetch_add(bytes, Ordering::Relaxed);
                        if let Some(t) = timestamp {
                            state.max_timestamp = Some(state.max_timestamp.map_or(t, |m| m.max(t)));
                        }
                    }
                    Err(reason) => match self.config.on_decode_error {
                        DecodeErrorPolicy::Skip => {
                            self.stats.skipped.fetch_add(1, Ordering::Relaxed);
                        }
                        DecodeErrorPolicy::Fail => {
                            outcome = Some(KafkaError::Decode {
                                topic: key.0,
                                partition: key.1,
                                offset,
                                reason,
                            });
                            break;
                        }
                    },
                }
                state.position = Position::At(offset + 1);
                state.active_ns = Some(now_ns);
                state.ended = false;
            }
        }
        self.update_lag(now_ns);
        if let Some(error) = outcome {
            return Some(self.fail(error));
        }
        let read = run.len() - before;
        if read > 0 {
            self.idle = false;
        }
        // The watermark, when it advanced (or the subtask comes back from idle).
        let was_idle = self.idle;
        match self.current_watermark(now_ns) {
            Some(mark) if self.watermark.is_none_or(|w| mark > w) || (read > 0 && was_idle) => {
                self.watermark = Some(mark.max(self.watermark.unwrap_or(i64::MIN)));
                return Some(SourceEvent::Watermark(self.watermark.expect("set")));
            }
            _ => {}
        }
        if read == max {
            return None;
        }
        if read > 0 {
            // The queue is empty (or the batch was cut by an event): poll again.
            return Some(SourceEvent::Idle {
                until_ns: Some(now_ns),
            });
        }
        if self.config.bounded
            && self.initial_done
            && self.partitions.values().all(|s| s.ended)
            && self.restored.as_ref().is_none_or(BTreeMap::is_empty)
        {
            return Some(SourceEvent::End);
        }
        let all_idle = self.initial_done
            && (self.partitions.is_empty()
                || (self.config.idle_timeout.is_some()
                    && self.partitions.values().all(|s| self.is_idle(s, now_ns))));
        if all_idle && !self.idle {
            self.idle = true;
            return Some(SourceEvent::Watermark(IDLE_WATERMARK));
        }
        let mut until = self.next_idle_ns().filter(|at| *at > now_ns && !self.idle);
        if let Some((waited, _)) = self.health.down() {
            let left = self.config.broker_timeout.saturating_sub(waited);
            let at = now_ns + left.as_nanos() as u64 + 1_000_000;
            until = Some(until.map_or(at, |u| u.min(at)));
        }
        Some(SourceEvent::Idle { until_ns: until })
    }

    fn snapshot_state(&mut self) -> Option<Vec<u8>> {
        let mut positions: BTreeMap<(String, i32), Position> = self
            .partitions
            .iter()
            .map(|(key, state)| (key.clone(), state.position))
            .collect();
        // Checkpointed partitions not assigned again yet keep their positions.
        if let Some(restored) = &self.restored {
            for (key, position) in restored {
                positions.entry(key.clone()).or_insert(*position);
            }
        }
        let mut out = Vec::new();
        1u8.encode(&mut out);
        (self.initial_done || self.restored.is_some()).encode(&mut out);
        (positions.len() as u32).encode(&mut out);
        let mut committable = TopicPartitionList::new();
        for ((topic, partition), position) in &positions {
            topic.encode(&mut out);
            partition.encode(&mut out);
            let (kind, offset) = match position {
                Position::At(offset) => (0u8, *offset),
                Position::Beginning => (1, 0),
                Position::End => (2, 0),
            };
            kind.encode(&mut out);
            offset.encode(&mut out);
            if let Position::At(offset) = position {
                let _ =
                    committable.add_partition_offset(topic, *partition, Offset::Offset(*offset));
            }
        }
        if self.config.group_id.is_some() {
            self.snapshots.push_back(committable);
            while self.snapshots.len() > 16 {
                self.snapshots.pop_front();
            }
        }
        Some(out)
    }

    fn notify_checkpoint_complete(&mut self, _checkpoint: u64) -> Result<(), TaskError> {
        // Every snapshot but the newest is of a completed checkpoint (see the module
        // docs); commit the newest of those, drop the rest.
        if self.snapshots.len() < 2 {
            return Ok(());
        }
        let newest = self.snapshots.pop_back().expect("two");
        let commit = self.snapshots.pop_back().expect("two");
        self.snapshots.clear();
        self.snapshots.push_back(newest);
        if let Some(consumer) = &self.consumer {
            if commit.count() > 0 {
                // Asynchronous: librdkafka sends it; the answer is only counted.
                if consumer.commit(&commit, CommitMode::Async).is_ok() {
                    self.stats.commits.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        Ok(())
    }

    fn restore_state(&mut self, state: &[u8]) -> Result<(), TaskError> {
        let bad = |reason: String| KafkaError::State {
            what: "source",
            reason,
        };
        let decode = |e: DecodeError| bad(e.to_string());
        let mut input = state;
        let version = u8::decode(&mut input).map_err(decode)?;
        if version != 1 {
            return Err(bad(format!("version {version}; this source writes version 1")).into());
        }
        let initial_done = bool::decode(&mut input).map_err(decode)?;
        let count = u32::decode(&mut input).map_err(decode)?;
        let mut restored = BTreeMap::new();
        for _ in 0..count {
            let topic = String::decode(&mut input).map_err(decode)?;
            let partition = i32::decode(&mut input).map_err(decode)?;
            let kind = u8::decode(&mut input).map_err(decode)?;
            let offset = i64::decode(&mut input).map_err(decode)?;
            let position = match kind {
                0 if offset >= 0 => Position::At(offset),
                1 => Position::Beginning,
                2 => Position::End,
                _ => return Err(bad(format!("position kind {kind} offset {offset}")).into()),
            };
            if owner_of(&topic, partition, self.parallelism) != self.index {
                return Err(bad(format!(
                    "topic {topic:?} partition {partition} belongs to another subtask \
                     (restore at the parallelism the checkpoint was taken at)"
                ))
                .into());
            }
            restored.insert((topic, partition), position);
        }
        if !input.is_empty() {
            return Err(bad(format!("{} bytes left over", input.len())).into());
        }
        self.initial_done = initial_done;
        self.restored = Some(restored);
        Ok(())
    }
}

impl<T> Drop for KafkaSource<T> {
    fn drop(&mut self) {
        *self.shared.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The discovery thread: the blocking half of a source subtask.
struct Discovery {
    config: Arc<KafkaSourceConfig>,
    index: usize,
    parallelism: usize,
    shared: Arc<Shared>,
    health: Arc<Health>,
    unparker: Unparker,
    initial_done: bool,
}

impl Discovery {
    fn run(mut self) {
        let group = self
            .config
            .group_id
            .clone()
            .unwrap_or_else(|| format!("weir-source-{}", std::process::id()));
        let client: Result<BaseConsumer, _> = client_config(
            &self.config.brokers,
            &format!("weir-discovery-{}", self.index),
            &[("group.id", group)],
            &self.config.properties,
        )
        .create();
        let client = match client {
            Ok(client) => client,
            Err(e) => return self.report_failure(KafkaError::Client(e.to_string())),
        };
        let mut known: std::collections::BTreeSet<(String, i32)> = Default::default();
        let step = Duration::from_millis(500);
        let mut next_discovery = std::time::Instant::now();
        loop {
            if *self.shared.stop.lock().unwrap_or_else(|e| e.into_inner()) {
                return;
            }
            let due = std::time::Instant::now() >= next_discovery;
            // While the brokers are down, a metadata request every step tells when they
            // are back (an idle consumer has nothing else that would).
            if due || self.health.down().is_some() {
                match self.discover(&client, &mut known) {
                    Ok(new) => {
                        self.health.up();
                        let first = !self.initial_done;
                        self.initial_done = true;
                        if due {
                            next_discovery = match self.config.discovery_interval {
                                Some(interval) if !self.config.bounded => {
                                    std::time::Instant::now() + interval
                                }
                                _ => std::time::Instant::now() + Duration::from_secs(1 << 30),
                            };
                        }
                        if !new.is_empty() || first {
                            let mut found =
                                self.shared.found.lock().unwrap_or_else(|e| e.into_inner());
                            found.new.extend(new);
                            found.initial_done = true;
                            drop(found);
                            self.unparker.unpark();
                        }
                    }
                    Err(KafkaError::Call { reason, .. }) if !self.initial_done || !due => {
                        // Not reachable yet: the source's broker timeout decides.
                        self.health.error(true, &reason);
                        self.unparker.unpark();
                    }
                    Err(KafkaError::Call { reason, .. }) => {
                        self.health.error(true, &reason);
                        self.unparker.unpark();
                    }
                    Err(e) => return self.report_failure(e),
                }
            }
            let stop = self.shared.stop.lock().unwrap_or_else(|e| e.into_inner());
            if *stop {
                return;
            }
            let _ = self.shared.wake.wait_timeout(stop, step);
        }
    }

    fn report_failure(&self, error: KafkaError) {
        self.shared
            .found
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .failure = Some(error);
        self.unparker.unpark();
    }

    /// The partitions this subtask owns that it did not know, with where each starts.
    fn discover(
        &self,
        client: &BaseConsumer,
        known: &mut std::collections::BTreeSet<(String, i32)>,
    ) -> Result<Vec<(String, i32, Position)>, KafkaError> {
        let timeout = self.config.broker_timeout.min(Duration::from_secs(10));
        let mut new = Vec::new();
        for topic in &self.config.topics {
            let count = partitions_of(client.client(), &self.config.brokers, topic, timeout)?
                .ok_or_else(|| KafkaError::UnknownTopic {
                    topic: topic.clone(),
                    brokers: self.config.brokers.clone(),
                })?;
            for partition in 0..count {
                if owner_of(topic, partition, self.parallelism) != self.index {
                    continue;
                }
                if known.insert((topic.clone(), partition)) {
                    new.push((topic.clone(), partition));
                }
            }
        }
        if new.is_empty() {
            return Ok(Vec::new());
        }
        if self.initial_done {
            // Found later: from the earliest offset.
            return Ok(new
                .into_iter()
                .map(|(t, p)| (t, p, Position::Beginning))
                .collect());
        }
        let resolved = match self.config.start {
            StartOffsets::Earliest => new
                .into_iter()
                .map(|(t, p)| (t, p, Position::Beginning))
                .collect(),
            StartOffsets::Latest => new
                .into_iter()
                .map(|(t, p)| (t, p, Position::End))
                .collect(),
            StartOffsets::Timestamp(ms) => {
                let mut list = TopicPartitionList::new();
                for (t, p) in &new {
                    list.add_partition_offset(t, *p, Offset::Offset(ms))
                        .map_err(|e| KafkaError::call("offsets by timestamp", e))?;
                }
                let answer = client
                    .offsets_for_times(list, timeout)
                    .map_err(|e| KafkaError::call("offsets by timestamp", e))?;
                answer
                    .elements()
                    .iter()
                    .map(|e| {
                        let position = match e.offset() {
                            Offset::Offset(o) if o >= 0 => Position::At(o),
                            _ => Position::End,
                        };
                        (e.topic().to_string(), e.partition(), position)
                    })
                    .collect()
            }
            StartOffsets::CommittedOrEarliest | StartOffsets::CommittedOrLatest => {
                let otherwise = if self.config.start == StartOffsets::CommittedOrEarliest {
                    Position::Beginning
                } else {
                    Position::End
                };
                let mut list = TopicPartitionList::new();
                for (t, p) in &new {
                    list.add_partition(t, *p);
                }
                let answer = client
                    .committed_offsets(list, timeout)
                    .map_err(|e| KafkaError::call("the group's committed offsets", e))?;
                answer
                    .elements()
                    .iter()
                    .map(|e| {
                        let position = match e.offset() {
                            Offset::Offset(o) if o >= 0 => Position::At(o),
                            _ => otherwise,
                        };
                        (e.topic().to_string(), e.partition(), position)
                    })
                    .collect()
            }
        };
        Ok(resolved)
    }
}
