//! The job's records and their codecs: the lookup request a source makes, the
//! enriched record the sink checks, and the Redis store's request.

use super::*;

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;
use weir_engine::exchange::codec::{Codec, DecodeError, Decoder, Encoder};
use weir_net::lookup::LookupRequest;
use weir_net::redis::{
    Args, Lookup as RedisGet, RedisConfig, RedisRequest, RedisUrl, Reply, SharedStats,
};

/// Why `weir run` cannot run, or why its job stopped: each message says what to change.
/// A source record on its way to the lookup.
#[derive(Debug, Clone, Copy)]
pub struct Lookup(pub SourceRecord);

impl From<SourceRecord> for Lookup {
    fn from(record: SourceRecord) -> Self {
        Lookup(record)
    }
}

impl LookupRequest for Lookup {
    type Out = Enriched;
    fn key(&self) -> u64 {
        self.0.key
    }
    fn complete(self, value: &[u8]) -> Enriched {
        Enriched {
            id: self.0.id,
            key: self.0.key,
            created_ns: self.0.created_ns,
            value: LookupValue::from(value),
        }
    }
}

/// The job's keys in Redis: `weir:<key>`, as `weir load-redis` writes them.
pub const REDIS_KEY_PREFIX: &str = "weir:";

impl RedisRequest for Lookup {
    type Out = Enriched;
    fn lookup(&self, args: &mut Args) -> RedisGet {
        args.push_fmt(format_args!("{REDIS_KEY_PREFIX}{}", self.0.key));
        RedisGet::Get
    }
    /// A missing key is a value: the record goes on with an empty one (counted as a
    /// miss in [`RedisStore::stats`]).
    fn complete(self, reply: Reply<'_>) -> Enriched {
        Enriched {
            id: self.0.id,
            key: self.0.key,
            created_ns: self.0.created_ns,
            value: reply.value().map(LookupValue::from).unwrap_or_default(),
        }
    }
}

/// Redis as the store of the main job's lookups (`weir run --store`).
#[derive(Debug, Clone)]
pub struct RedisStore {
    /// The server.
    pub url: RedisUrl,
    /// Keys per `MGET` when the batched async operator cuts each turn's lookups into
    /// `MGET`s (`--mget N`); `None`: each `GET` on its own (plain pipelining).
    pub mget: Option<usize>,
    /// The clients' counters, summed over the workers.
    pub stats: Arc<SharedStats>,
}

impl RedisStore {
    /// The client settings for `settings`: its connections per subtask, room for its
    /// capacity, and (as for the lookup service) a request timeout short enough for
    /// the retries to run within the operator's timeout.
    pub fn client_config(&self, settings: &JobSettings) -> RedisConfig {
        let mut config = RedisConfig::new(self.url.clone());
        config.connections = settings.connections;
        config.capacity = settings.capacity * 4 + 64;
        config.request_timeout = settings.attempt_timeout().max(Duration::from_millis(1));
        config.connect_timeout = config.connect_timeout.min(config.request_timeout);
        config
    }
}

/// A record with its looked-up value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enriched {
    /// Source id.
    pub id: u64,
    /// Key.
    pub key: u64,
    /// Creation time at the source.
    pub created_ns: u64,
    /// The value from the lookup service.
    pub value: LookupValue,
}

/// A looked-up value: bytes kept inline up to [`VALUE_INLINE`] (the main job's default value size), on
/// the heap beyond: the main path makes no allocation per record for its values (a
/// `Vec` per record was a malloc at the lookup and a calloc at the sink, and their
/// frees, about a tenth of the job's CPU).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LookupValue(SmallVec<[u8; VALUE_INLINE]>);

/// Bytes a [`LookupValue`] holds without allocating.
pub const VALUE_INLINE: usize = 32;

impl From<&[u8]> for LookupValue {
    fn from(bytes: &[u8]) -> Self {
        LookupValue(SmallVec::from_slice(bytes))
    }
}

impl std::ops::Deref for LookupValue {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl PartialEq<Vec<u8>> for LookupValue {
    fn eq(&self, other: &Vec<u8>) -> bool {
        self.0.as_slice() == other.as_slice()
    }
}

impl Codec for LookupValue {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        (self.0.len() as u32).encode(out);
        out.write(&self.0);
    }
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        let len = u32::decode(input)? as usize;
        if len > input.remaining() {
            // Checked before sizing the value, so a corrupt length asks for nothing.
            return Err(DecodeError::Truncated {
                needed: len,
                remaining: input.remaining(),
            });
        }
        let mut bytes = SmallVec::from_elem(0, len);
        input.read(&mut bytes)?;
        Ok(LookupValue(bytes))
    }
}

/// A record held by the async operator at a checkpoint is stored as its source record.
impl Codec for Lookup {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        self.0.id.encode(out);
        self.0.key.encode(out);
        self.0.created_ns.encode(out);
    }
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        Ok(Lookup(SourceRecord {
            id: u64::decode(input)?,
            key: u64::decode(input)?,
            created_ns: u64::decode(input)?,
        }))
    }
}

impl Codec for Enriched {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        self.id.encode(out);
        self.key.encode(out);
        self.created_ns.encode(out);
        self.value.encode(out);
    }
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        Ok(Enriched {
            id: u64::decode(input)?,
            key: u64::decode(input)?,
            created_ns: u64::decode(input)?,
            value: LookupValue::decode(input)?,
        })
    }
}

/// A record as the source makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceRecord {
    /// Unique across the job: `0..records`.
    pub id: u64,
    /// The lookup key.
    pub key: u64,
    /// Creation time by the run's clock (the intended time in open-loop runs).
    pub created_ns: u64,
}
