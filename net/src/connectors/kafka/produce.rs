//! Writing messages from outside the workers (`weir produce-kafka`, tests): a producer
//! that sends as fast as librdkafka takes them, waits for every delivery, and says how
//! it went.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::error::KafkaError as RdError;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;

use super::client_config;
use super::error::KafkaError;
use super::record::KafkaOut;

/// What [`produce`] did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProduceReport {
    /// Messages the broker acknowledged.
    pub delivered: u64,
    /// How long it took, the final flush included.
    pub elapsed: Duration,
}

#[derive(Default)]
struct Counts {
    delivered: AtomicU64,
    failed: AtomicU64,
    first_error: std::sync::Mutex<Option<String>>,
}

struct Context(Arc<Counts>);

impl ClientContext for Context {
    fn log(&self, _level: rdkafka::config::RDKafkaLogLevel, _fac: &str, _log_message: &str) {}
}

impl ProducerContext for Context {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => {
                self.0.delivered.fetch_add(1, Ordering::Relaxed);
            }
            Err((e, _)) => {
                self.0.failed.fetch_add(1, Ordering::Relaxed);
                let mut first = self.0.first_error.lock().unwrap_or_else(|e| e.into_inner());
                first.get_or_insert_with(|| e.to_string());
            }
        }
    }
}

/// Sends `count` messages to `topic` at `brokers`, message `n` made by `make(n, out)`
/// (partitioned by librdkafka's murmur2 of the key, as Kafka's Java client), then waits
/// up to `timeout` for the last deliveries. Any failed delivery is an error.
pub fn produce(
    brokers: &str,
    topic: &str,
    count: u64,
    timeout: Duration,
    mut make: impl FnMut(u64, &mut KafkaOut),
) -> Result<ProduceReport, KafkaError> {
    let counts = Arc::new(Counts::default());
    let own = [
        ("linger.ms", "5".to_string()),
        ("partitioner", "murmur2_random".to_string()),
        ("message.timeout.ms", timeout.as_millis().to_string()),
        ("enable.idempotence", "true".to_string()),
    ];
    let producer: BaseProducer<Context> = client_config(brokers, "weir-produce", &own, &[])
        .create_with_context(Context(Arc::clone(&counts)))
        .map_err(|e| KafkaError::Client(e.to_string()))?;
    let start = Instant::now();
    let mut out = KafkaOut::default();
    for n in 0..count {
        out.clear();
        make(n, &mut out);
        loop {
            let mut record: BaseRecord<'_, [u8], [u8], ()> =
                BaseRecord::to(topic).payload(out.payload.as_slice());
            if let Some(key) = &out.key {
                record = record.key(key.as_slice());
            }
            if let Some(timestamp) = out.timestamp {
                record = record.timestamp(timestamp);
            }
            match producer.send(record) {
                Ok(()) => break,
                Err((RdError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    producer.poll(Duration::from_millis(5));
                }
                Err((e, _)) => {
                    return Err(KafkaError::call(
                        format!("sending to topic {topic:?} at {brokers}"),
                        e,
                    ))
                }
            }
            if counts.failed.load(Ordering::Relaxed) > 0 {
                break;
            }
        }
        if counts.failed.load(Ordering::Relaxed) > 0 {
            break;
        }
        if n % 1024 == 0 {
            producer.poll(Duration::ZERO);
        }
    }
    producer
        .flush(timeout)
        .map_err(|e| KafkaError::call(format!("flushing to topic {topic:?} at {brokers}"), e))?;
    if counts.failed.load(Ordering::Relaxed) > 0 {
        let reason = counts
            .first_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_default();
        return Err(KafkaError::call(
            format!("delivering to topic {topic:?} at {brokers}"),
            format!(
                "{} messages failed, the first with: {reason}",
                counts.failed.load(Ordering::Relaxed)
            ),
        ));
    }
    Ok(ProduceReport {
        delivered: counts.delivered.load(Ordering::Relaxed),
        elapsed: start.elapsed(),
    })
}
