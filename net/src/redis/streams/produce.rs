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
    mut make: impl FnMut(u64, &mut Fields),
) -> Result<ProduceReport, RedisError> {
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
    let mut connection = BlockingConnection::connect(url, Duration::from_secs(5))?;
    let maxlen = maxlen.map(|n| n.to_string());
    let mut fields = Fields::new();
    let mut chunk = Vec::new();
    let mut bytes = 0;
    let mut next = 0;
    while next < count {
        let end = (next + PRODUCE_CHUNK).min(count);
        chunk.clear();
        for n in next..end {
            fields.clear();
            make(n, &mut fields);
            if fields.is_empty() {
                return Err(RedisError::Config(format!(
                    "entry {n} for stream {stream:?} has no field: an entry needs at least one \
                     field and value"
                )));
            }
            bytes += fields.size() as u64;
            with_xadd_args(
                stream.as_bytes(),
                maxlen.as_deref().map(str::as_bytes),
                fields.args(),
                |args| resp::encode_command(&mut chunk, args),
            );
        }
        connection
            .pipeline((end - next) as usize, |out| std::mem::swap(out, &mut chunk))
            .map_err(|error| match error {
                RedisError::Server { message, .. } => RedisError::Server {
                    command: format!("XADD {stream}"),
                    message,
                },
                other => other,
            })?;
        next = end;
    }
    Ok(ProduceReport {
        entries: count,
        bytes,
    })
}
