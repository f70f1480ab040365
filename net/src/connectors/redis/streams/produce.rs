//! Appending entries to a stream from outside the workers, over the blocking
//! connection: `weir produce-stream` (a stream for a source to read) and tests.
//!
//! Entries go as `XADD`s pipelined in chunks ([`BlockingConnection::pipeline`], as the
//! bulk loader sends its `SET`s): one write and one read of the replies per chunk. The
//! ids are the server's (`*`), so entries appear in the order `make` is called.

use std::time::Duration;

use super::super::blocking::BlockingConnection;
use super::super::error::RedisError;
use super::super::resp;
use super::super::url::RedisUrl;
use super::sink::{with_xadd_args, Fields};

/// `XADD`s per pipelined write.
const PRODUCE_CHUNK: u64 = 1024;

/// What [`produce`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProduceReport {
    /// Entries appended.
    pub entries: u64,
    /// Bytes of fields and values appended.
    pub bytes: u64,
}

/// Appends `count` entries to `stream`: entry `n` (from 0) has the fields `make(n, ..)`
/// writes. `maxlen` trims the stream to about that many entries (`MAXLEN ~`).
///
/// The first error reply (e.g. `WRONGTYPE`, the key holds something else) is the
/// error, after the rest of its chunk was written; an entry without fields is refused
/// before its chunk is sent.
pub fn produce(
    url: &RedisUrl,
    stream: &str,
    count: u64,
    maxlen: Option<u64>,
    make: impl FnMut(u64, &mut Fields),
) -> Result<ProduceReport, RedisError> {
    Producer::connect(url, stream, maxlen)?.append(count, make)
}

/// One connection appending to one stream, for a caller that appends in turns (e.g.
/// at a rate: `weir produce-stream --rate`). [`produce`] is one turn of it.
pub struct Producer {
    connection: BlockingConnection,
    stream: String,
    maxlen: Option<String>,
    fields: Fields,
    chunk: Vec<u8>,
    /// Entries appended so far (the next one's `n`).
    next: u64,
}

impl Producer {
    /// Connects to `url` to append to `stream`, trimmed to about `maxlen` entries.
    pub fn connect(url: &RedisUrl, stream: &str, maxlen: Option<u64>) -> Result<Self, RedisError> {
        if stream.is_empty() {
            return Err(RedisError::Config(
                "the stream name is empty: name the stream's key".into(),
            ));
        }
        if maxlen == Some(0) {
            return Err(RedisError::Config(
                "maxlen 0 would trim every entry: use None for no trimming".into(),
            ));
        }
        Ok(Producer {
            connection: BlockingConnection::connect(url, Duration::from_secs(5))?,
            stream: stream.into(),
            maxlen: maxlen.map(|n| n.to_string()),
            fields: Fields::new(),
            chunk: Vec::new(),
            next: 0,
        })
    }

    /// The connection, for other commands between turns.
    pub fn connection(&mut self) -> &mut BlockingConnection {
        &mut self.connection
    }

    /// Appends `count` entries, pipelined in chunks; entry `n` (counted over every
    /// turn of this producer) has the fields `make(n, ..)` writes. Errors as
    /// [`produce`]'s.
    pub fn append(
        &mut self,
        count: u64,
        mut make: impl FnMut(u64, &mut Fields),
    ) -> Result<ProduceReport, RedisError> {
        let stream = self.stream.as_str();
        let mut bytes = 0;
        let mut done = 0;
        while done < count {
            let chunk = (count - done).min(PRODUCE_CHUNK);
            self.chunk.clear();
            for n in self.next..self.next + chunk {
                self.fields.clear();
                make(n, &mut self.fields);
                if self.fields.is_empty() {
                    return Err(RedisError::Config(format!(
                        "entry {n} for stream {stream:?} has no field: an entry needs at least \
                         one field and value"
                    )));
                }
                bytes += self.fields.size() as u64;
                let chunk_out = &mut self.chunk;
                with_xadd_args(
                    stream.as_bytes(),
                    self.maxlen.as_deref().map(str::as_bytes),
                    self.fields.args(),
                    |args| resp::encode_command(chunk_out, args),
                );
            }
            let out = &mut self.chunk;
            self.connection
                .pipeline(chunk as usize, |buffer| std::mem::swap(buffer, out))
                .map_err(|error| match error {
                    RedisError::Server { message, .. } => RedisError::Server {
                        command: format!("XADD {stream}"),
                        message,
                    },
                    other => other,
                })?;
            // The connection's buffer came back in the swap: keep it for the next chunk.
            self.next += chunk;
            done += chunk;
        }
        Ok(ProduceReport {
            entries: count,
            bytes,
        })
    }
}
