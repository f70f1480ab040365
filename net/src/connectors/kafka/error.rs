//! Why a Kafka source or sink cannot go on: each message says what to fix.

/// A Kafka connector's error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaError {
    /// A setting that cannot work.
    #[error("kafka: {0}")]
    Config(String),
    /// librdkafka refused its configuration (an unknown property, a bad value).
    #[error("kafka: the client refused its configuration: {0} (check the properties given)")]
    Client(String),
    /// No broker answered for the connector's `broker_timeout`.
    #[error(
        "kafka: no broker at {brokers} answered for {waited_s:.0} s ({reason}); check the \
         address and that the broker runs, or raise broker_timeout"
    )]
    Unreachable {
        /// The bootstrap servers.
        brokers: String,
        /// How long it waited.
        waited_s: f64,
        /// librdkafka's last error.
        reason: String,
    },
    /// A topic the source reads or the sink writes does not exist (or was deleted).
    #[error(
        "kafka: topic {topic:?} does not exist at {brokers} (create it, e.g. `weir produce-kafka` \
         or the broker's tools, or fix the URL)"
    )]
    UnknownTopic {
        /// The topic.
        topic: String,
        /// The bootstrap servers.
        brokers: String,
    },
    /// A record the source's deserializer refused, under [`DecodeErrorPolicy::Fail`](super::DecodeErrorPolicy).
    #[error(
        "kafka: the record at topic {topic:?} partition {partition} offset {offset} cannot be \
         decoded: {reason} (fix the producer, or skip such records with the Skip policy)"
    )]
    Decode {
        /// Its topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// Its offset.
        offset: i64,
        /// What the deserializer said.
        reason: String,
    },
    /// The broker or client failed a call (fetch, delivery, a transaction step).
    #[error("kafka: {what} failed: {reason}")]
    Call {
        /// What was asked.
        what: String,
        /// Why it failed.
        reason: String,
    },
    /// A checkpointed state the connector cannot read.
    #[error("kafka: a checkpointed {what} state cannot be read: {reason} (was it written by this connector at this parallelism?)")]
    State {
        /// Whose state (source, sink).
        what: &'static str,
        /// Why.
        reason: String,
    },
}

impl KafkaError {
    /// A failed call.
    pub(crate) fn call(what: impl Into<String>, reason: impl ToString) -> Self {
        KafkaError::Call {
            what: what.into(),
            reason: reason.to_string(),
        }
    }
}
