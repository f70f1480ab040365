//! Topic administration for tools and tests (`weir produce-kafka`, the integration
//! tests): blocking calls, made off the workers.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;

use super::error::KafkaError;
use super::{block_on, client_config};

/// An admin client of a cluster.
pub struct KafkaAdmin {
    brokers: String,
    client: AdminClient<DefaultClientContext>,
    /// Asks for topic metadata: a consumer's metadata requests never create the topic
    /// (an admin client's, like a producer's, let a broker that auto-creates topics
    /// create the one asked about).
    lookup: rdkafka::consumer::BaseConsumer,
    timeout: Duration,
}

impl KafkaAdmin {
    /// A client of the cluster at `brokers` (`host:port[,…]`); each call waits at most
    /// `timeout` for its answer.
    pub fn new(brokers: &str, timeout: Duration) -> Result<Self, KafkaError> {
        let client = client_config(brokers, "weir-admin", &[], &[])
            .create()
            .map_err(|e| KafkaError::Client(e.to_string()))?;
        let lookup = client_config(
            brokers,
            "weir-admin-lookup",
            &[("allow.auto.create.topics", "false".to_string())],
            &[],
        )
        .create()
        .map_err(|e| KafkaError::Client(e.to_string()))?;
        Ok(KafkaAdmin {
            brokers: brokers.to_string(),
            client,
            lookup,
            timeout,
        })
    }

    fn options(&self) -> AdminOptions {
        AdminOptions::new().operation_timeout(Some(self.timeout))
    }

    /// Creates `topic` with `partitions` partitions (replication factor 1), or keeps it
    /// as it is if it exists; returns whether it was created.
    pub fn create_topic(&self, topic: &str, partitions: i32) -> Result<bool, KafkaError> {
        if partitions < 1 {
            return Err(KafkaError::Config(format!(
                "topic {topic:?}: {partitions} partitions; a topic needs at least 1"
            )));
        }
        let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        let results = block_on(self.client.create_topics([&new], &self.options()))
            .map_err(|e| self.failed(format!("creating topic {topic:?}"), e.to_string()))?;
        match results.into_iter().next() {
            Some(Ok(_)) => Ok(true),
            Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => Ok(false),
            Some(Err((_, code))) => Err(self.failed(format!("creating topic {topic:?}"), code)),
            None => Err(self.failed(format!("creating topic {topic:?}"), "no answer")),
        }
    }

    /// Deletes `topic`; returns whether it existed.
    pub fn delete_topic(&self, topic: &str) -> Result<bool, KafkaError> {
        let results = block_on(self.client.delete_topics(&[topic], &self.options()))
            .map_err(|e| self.failed(format!("deleting topic {topic:?}"), e.to_string()))?;
        match results.into_iter().next() {
            Some(Ok(_)) => Ok(true),
            Some(Err((_, RDKafkaErrorCode::UnknownTopicOrPartition))) => Ok(false),
            Some(Err((_, code))) => Err(self.failed(format!("deleting topic {topic:?}"), code)),
            None => Err(self.failed(format!("deleting topic {topic:?}"), "no answer")),
        }
    }

    /// How many partitions `topic` has (`None`: it does not exist).
    pub fn partitions(&self, topic: &str) -> Result<Option<i32>, KafkaError> {
        use rdkafka::consumer::Consumer;
        partitions_of(self.lookup.client(), &self.brokers, topic, self.timeout)
    }

    /// Every message of `topic`, partition by partition, each in offset order, read up
    /// to the end each partition has when it is reached (`read_uncommitted`: aborted
    /// transactions' messages included, which a checker must sort out itself).
    pub fn read_all(&self, topic: &str) -> Result<Vec<super::KafkaRecord>, KafkaError> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        use rdkafka::{Offset, TopicPartitionList};
        let partitions = self
            .partitions(topic)?
            .ok_or_else(|| KafkaError::UnknownTopic {
                topic: topic.to_string(),
                brokers: self.brokers.clone(),
            })?;
        let own = [
            ("group.id", "weir-read-all".to_string()),
            ("enable.auto.commit", "false".to_string()),
            ("enable.partition.eof", "true".to_string()),
            ("isolation.level", "read_uncommitted".to_string()),
            ("auto.offset.reset", "earliest".to_string()),
        ];
        let consumer: BaseConsumer = client_config(&self.brokers, "weir-read-all", &own, &[])
            .create()
            .map_err(|e| KafkaError::Client(e.to_string()))?;
        let mut list = TopicPartitionList::new();
        for p in 0..partitions {
            // From offset 0 (out of range: the log's start), not `Beginning`: see the
            // source's start positions.
            list.add_partition_offset(topic, p, Offset::Offset(0))
                .map_err(|e| KafkaError::call("assigning", e))?;
        }
        consumer
            .assign(&list)
            .map_err(|e| KafkaError::call("assigning", e))?;
        let mut ended = vec![false; partitions as usize];
        let mut all = Vec::new();
        let deadline = std::time::Instant::now() + self.timeout;
        while !ended.iter().all(|e| *e) {
            if std::time::Instant::now() > deadline {
                return Err(KafkaError::call(
                    format!("reading topic {topic:?}"),
                    format!(
                        "not at the end of every partition within {:?}",
                        self.timeout
                    ),
                ));
            }
            match consumer.poll(Duration::from_millis(100)) {
                None => {}
                Some(Ok(message)) => {
                    all.push(super::KafkaMessage { message: &message }.to_record());
                }
                Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                    if let Some(e) = ended.get_mut(p as usize) {
                        *e = true;
                    }
                }
                Some(Err(e)) if super::is_unreachable(&e) => {}
                Some(Err(e)) => {
                    return Err(KafkaError::call(format!("reading topic {topic:?}"), e))
                }
            }
        }
        Ok(all)
    }

    fn failed(&self, what: String, reason: impl ToString) -> KafkaError {
        KafkaError::call(format!("{what} at {}", self.brokers), reason)
    }
}

/// How many partitions `topic` has, from a metadata request (`None`: unknown topic).
pub(crate) fn partitions_of<C: rdkafka::ClientContext>(
    client: &rdkafka::client::Client<C>,
    brokers: &str,
    topic: &str,
    timeout: Duration,
) -> Result<Option<i32>, KafkaError> {
    let metadata = client
        .fetch_metadata(Some(topic), timeout)
        .map_err(|e| KafkaError::call(format!("metadata of topic {topic:?} at {brokers}"), e))?;
    let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
        return Ok(None);
    };
    if let Some(error) = found.error() {
        if RDKafkaErrorCode::from(error) == RDKafkaErrorCode::UnknownTopicOrPartition {
            return Ok(None);
        }
        return Err(KafkaError::call(
            format!("metadata of topic {topic:?} at {brokers}"),
            RDKafkaErrorCode::from(error),
        ));
    }
    if found.partitions().is_empty() {
        return Ok(None);
    }
    Ok(Some(found.partitions().len() as i32))
}
