//! `kafka://host:port[,host:port…]/topic[,topic…]`: the bootstrap brokers and the
//! topics, in one argument (what `weir run --source` and `--sink` take, beside
//! `redis-stream://`).

use std::fmt;
use std::str::FromStr;

/// A parsed `kafka://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaUrl {
    /// The bootstrap servers, `host:port` each, in the order written.
    pub brokers: Vec<String>,
    /// The topics, at least one, each a legal Kafka topic name.
    pub topics: Vec<String>,
}

impl KafkaUrl {
    /// The brokers as librdkafka's `bootstrap.servers` takes them.
    pub fn bootstrap(&self) -> String {
        self.brokers.join(",")
    }
}

/// Why a `kafka://` URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KafkaUrlError {
    /// The scheme is not `kafka://`.
    #[error("{0:?} is not a Kafka URL: write kafka://host:port[,host:port…]/topic[,topic…], e.g. kafka://127.0.0.1:9092/events")]
    Scheme(String),
    /// A broker that is not `host:port`.
    #[error("the Kafka URL's broker {0:?} is not host:port (e.g. 127.0.0.1:9092)")]
    Broker(String),
    /// No topic after the brokers.
    #[error("the Kafka URL names no topic: add /<topic>[,<topic>…] after the brokers")]
    NoTopic,
    /// A topic name Kafka does not allow.
    #[error("the Kafka URL's topic {0:?} is not a legal topic name: 1 to 249 of a-z A-Z 0-9 . _ -, not . or ..")]
    Topic(String),
    /// The same topic twice.
    #[error("the Kafka URL names topic {0:?} twice")]
    Duplicate(String),
}

/// Whether `name` is a legal Kafka topic name.
pub fn legal_topic(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 249
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

impl FromStr for KafkaUrl {
    type Err = KafkaUrlError;

    fn from_str(url: &str) -> Result<Self, KafkaUrlError> {
        let rest = url
            .strip_prefix("kafka://")
            .ok_or_else(|| KafkaUrlError::Scheme(url.to_string()))?;
        let (brokers, topics) = rest.split_once('/').ok_or(KafkaUrlError::NoTopic)?;
        let brokers: Vec<String> = brokers.split(',').map(str::to_string).collect();
        for broker in &brokers {
            let ok = broker.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
            });
            if !ok {
                return Err(KafkaUrlError::Broker(broker.clone()));
            }
        }
        if topics.is_empty() {
            return Err(KafkaUrlError::NoTopic);
        }
        let mut names: Vec<String> = Vec::new();
        for topic in topics.split(',') {
            if !legal_topic(topic) {
                return Err(KafkaUrlError::Topic(topic.to_string()));
            }
            if names.iter().any(|t| t == topic) {
                return Err(KafkaUrlError::Duplicate(topic.to_string()));
            }
            names.push(topic.to_string());
        }
        Ok(KafkaUrl {
            brokers,
            topics: names,
        })
    }
}

impl fmt::Display for KafkaUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kafka://{}/{}",
            self.brokers.join(","),
            self.topics.join(",")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_gives_brokers_and_topics() {
        let url: KafkaUrl = "kafka://127.0.0.1:9092,b:9093/in,out.2".parse().unwrap();
        assert_eq!(url.brokers, ["127.0.0.1:9092", "b:9093"]);
        assert_eq!(url.topics, ["in", "out.2"]);
        assert_eq!(url.bootstrap(), "127.0.0.1:9092,b:9093");
        assert_eq!(url.to_string(), "kafka://127.0.0.1:9092,b:9093/in,out.2");
    }

    #[test]
    fn bad_urls_are_refused_by_what_is_wrong() {
        let err = |s: &str| s.parse::<KafkaUrl>().unwrap_err();
        assert!(matches!(err("redis://x:1/t"), KafkaUrlError::Scheme(_)));
        assert_eq!(err("kafka://x:1"), KafkaUrlError::NoTopic);
        assert_eq!(err("kafka://x:1/"), KafkaUrlError::NoTopic);
        assert_eq!(err("kafka://x/t"), KafkaUrlError::Broker("x".into()));
        assert_eq!(err("kafka://x:0/t"), KafkaUrlError::Broker("x:0".into()));
        assert_eq!(err("kafka://x:1/a b"), KafkaUrlError::Topic("a b".into()));
        assert_eq!(err("kafka://x:1/a,,b"), KafkaUrlError::Topic("".into()));
        assert_eq!(err("kafka://x:1/a,a"), KafkaUrlError::Duplicate("a".into()));
        assert!(err("kafka://x:1/..")
            .to_string()
            .contains("legal topic name"));
    }
}
