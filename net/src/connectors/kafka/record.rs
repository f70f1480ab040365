//! What the connectors hand user code: a fetched message to decode ([`KafkaMessage`],
//! borrowed from librdkafka's buffer), an owned record ([`KafkaRecord`], the default
//! record type of a source, which the exchange can carry), and what a sink's serializer
//! fills for each record ([`KafkaOut`]).

use rdkafka::message::{BorrowedMessage, Headers, Message};
use weir_engine::exchange::codec::{Codec, DecodeError, Decoder, Encoder};

/// A message as fetched, borrowed for the time a deserializer looks at it.
pub struct KafkaMessage<'a> {
    pub(crate) message: &'a BorrowedMessage<'a>,
}

impl<'a> KafkaMessage<'a> {
    /// Its topic.
    pub fn topic(&self) -> &str {
        self.message.topic()
    }
    /// Its partition.
    pub fn partition(&self) -> i32 {
        self.message.partition()
    }
    /// Its offset.
    pub fn offset(&self) -> i64 {
        self.message.offset()
    }
    /// Its timestamp (create or log-append time, milliseconds), if it has one.
    pub fn timestamp(&self) -> Option<i64> {
        self.message.timestamp().to_millis()
    }
    /// Its key, if it has one.
    pub fn key(&self) -> Option<&[u8]> {
        self.message.key()
    }
    /// Its value (`None` for a tombstone).
    pub fn payload(&self) -> Option<&[u8]> {
        self.message.payload()
    }
    /// The first header called `name`, if any (`Some(None)`: present with a null value).
    pub fn header(&self, name: &str) -> Option<Option<&[u8]>> {
        let headers = self.message.headers()?;
        headers.iter().find(|h| h.key == name).map(|h| h.value)
    }
    /// Every header, in order.
    pub fn headers(&self) -> Vec<(String, Option<Vec<u8>>)> {
        match self.message.headers() {
            Some(headers) => headers
                .iter()
                .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                .collect(),
            None => Vec::new(),
        }
    }
    /// The value decoded with the project's [`Codec`] (the whole value, nothing left
    /// over), e.g. for values a Weir sink wrote.
    pub fn decode_payload<T: Codec>(&self) -> Result<T, String> {
        let mut bytes = self.payload().ok_or("the value is null (a tombstone)")?;
        let value = T::decode(&mut bytes).map_err(|e| e.to_string())?;
        if !bytes.is_empty() {
            return Err(DecodeError::Trailing(bytes.len()).to_string());
        }
        Ok(value)
    }
    /// An owned copy.
    pub fn to_record(&self) -> KafkaRecord {
        KafkaRecord {
            topic: self.topic().to_string(),
            partition: self.partition(),
            offset: self.offset(),
            timestamp: self.timestamp(),
            key: self.key().map(<[u8]>::to_vec),
            payload: self.payload().map(<[u8]>::to_vec),
            headers: self.headers(),
        }
    }
}

/// A message, owned: what [`KafkaSource::records`](super::KafkaSource::records) emits.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KafkaRecord {
    /// Its topic.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its timestamp, milliseconds.
    pub timestamp: Option<i64>,
    /// Its key.
    pub key: Option<Vec<u8>>,
    /// Its value.
    pub payload: Option<Vec<u8>>,
    /// Its headers, in order.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Codec for KafkaRecord {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        self.topic.encode(out);
        self.partition.encode(out);
        self.offset.encode(out);
        self.timestamp.encode(out);
        self.key.encode(out);
        self.payload.encode(out);
        (self.headers.len() as u32).encode(out);
        for (name, value) in &self.headers {
            name.encode(out);
            value.encode(out);
        }
    }

    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        let topic = String::decode(input)?;
        let partition = i32::decode(input)?;
        let offset = i64::decode(input)?;
        let timestamp = Option::<i64>::decode(input)?;
        let key = Option::<Vec<u8>>::decode(input)?;
        let payload = Option::<Vec<u8>>::decode(input)?;
        let count = u32::decode(input)? as usize;
        // Each header takes at least 5 bytes: a count cannot promise more than is left.
        let mut headers = Vec::with_capacity(count.min(input.remaining() / 5));
        for _ in 0..count {
            headers.push((String::decode(input)?, Option::<Vec<u8>>::decode(input)?));
        }
        Ok(KafkaRecord {
            topic,
            partition,
            offset,
            timestamp,
            key,
            payload,
            headers,
        })
    }
}

/// What a sink's serializer writes for one record: the value, and optionally a key,
/// headers and a timestamp. Cleared before each record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KafkaOut {
    /// The key (partitions by its hash under the key-hash partitioner).
    pub key: Option<Vec<u8>>,
    /// The value.
    pub payload: Vec<u8>,
    /// Headers, in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The record's timestamp, milliseconds (`None`: the producer's clock at send).
    pub timestamp: Option<i64>,
}

impl KafkaOut {
    pub(crate) fn clear(&mut self) {
        self.key = None;
        self.payload.clear();
        self.headers.clear();
        self.timestamp = None;
    }
}

impl Codec for KafkaOut {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        self.key.encode(out);
        self.payload.encode(out);
        (self.headers.len() as u32).encode(out);
        for (name, value) in &self.headers {
            name.encode(out);
            value.encode(out);
        }
        self.timestamp.encode(out);
    }

    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        let key = Option::<Vec<u8>>::decode(input)?;
        let payload = Vec::<u8>::decode(input)?;
        let count = u32::decode(input)? as usize;
        let mut headers = Vec::with_capacity(count.min(input.remaining() / 8));
        for _ in 0..count {
            headers.push((String::decode(input)?, Vec::<u8>::decode(input)?));
        }
        let timestamp = Option::<i64>::decode(input)?;
        Ok(KafkaOut {
            key,
            payload,
            headers,
            timestamp,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_outs_round_trip_through_the_codec() {
        let record = KafkaRecord {
            topic: "t".into(),
            partition: 3,
            offset: 42,
            timestamp: Some(7),
            key: Some(b"k".to_vec()),
            payload: None,
            headers: vec![("h".into(), Some(b"v".to_vec())), ("n".into(), None)],
        };
        let mut bytes = Vec::new();
        record.encode(&mut bytes);
        assert_eq!(KafkaRecord::decode(&mut bytes.as_slice()).unwrap(), record);
        let out = KafkaOut {
            key: None,
            payload: b"value".to_vec(),
            headers: vec![("a".into(), b"b".to_vec())],
            timestamp: Some(-1),
        };
        let mut bytes = Vec::new();
        out.encode(&mut bytes);
        assert_eq!(KafkaOut::decode(&mut bytes.as_slice()).unwrap(), out);
        // A count larger than what follows is an error, not an allocation.
        let mut bad = Vec::new();
        None::<Vec<u8>>.encode(&mut bad);
        Vec::<u8>::new().encode(&mut bad);
        u32::MAX.encode(&mut bad);
        assert!(KafkaOut::decode(&mut bad.as_slice()).is_err());
    }
}
