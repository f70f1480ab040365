//! A blocking RESP2 connection for set-up work outside the workers (loading keys,
//! administration in tests and tools), and the pipelined bulk loader behind
//! `weir load-redis`.
//!
//! Replies nested deeper than [`REPLY_DEPTH_MAX`] are refused before decoding, as on
//! the workers' connections (the decoder recurses per level).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::types::{OwnedFrame, Resp2Frame};

use super::error::RedisError;
use super::resp::{self, Refused, REPLY_DEPTH_MAX};
use super::url::RedisUrl;

/// Commands per write of the bulk loader.
const LOAD_CHUNK: u64 = 1024;

/// A blocking connection: one command (or one pipelined chunk) at a time.
pub struct BlockingConnection {
    stream: TcpStream,
    addr: String,
    inbox: Vec<u8>,
    out: Vec<u8>,
}

impl BlockingConnection {
    /// Connects within `timeout`, then authenticates and selects the database as the
    /// URL says. Replies are awaited up to 30 s each.
    pub fn connect(url: &RedisUrl, timeout: Duration) -> Result<Self, RedisError> {
        let addr = url.resolve()?;
        let stream =
            TcpStream::connect_timeout(&addr, timeout).map_err(|source| RedisError::Connect {
                addr: addr.to_string(),
                source,
            })?;
        let setup = |e| RedisError::io("setting up a Redis connection", e);
        stream.set_nodelay(true).map_err(setup)?;
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .map_err(setup)?;
        stream
            .set_write_timeout(Some(Duration::from_secs(30)))
            .map_err(setup)?;
        let mut connection = BlockingConnection {
            stream,
            addr: addr.to_string(),
            inbox: Vec::with_capacity(64 * 1024),
            out: Vec::with_capacity(64 * 1024),
        };
        if let Some(password) = &url.password {
            let mut args: Vec<&[u8]> = vec![b"AUTH"];
            if let Some(user) = &url.user {
                args.push(user.as_bytes());
            }
            args.push(password.as_bytes());
            connection.command(&args).map_err(|e| match e {
                RedisError::Server { message, .. } => RedisError::Auth {
                    addr: addr.to_string(),
                    message,
                },
                other => other,
            })?;
        }
        if url.db != 0 {
            let db = url.db.to_string();
            connection
                .command(&[b"SELECT", db.as_bytes()])
                .map_err(|e| match e {
                    RedisError::Server { message, .. } => RedisError::Select {
                        addr: addr.to_string(),
                        db: url.db,
                        message,
                    },
                    other => other,
                })?;
        }
        Ok(connection)
    }

    /// Sends one command and returns its reply; an error reply is
    /// [`RedisError::Server`].
    pub fn command(&mut self, args: &[&[u8]]) -> Result<OwnedFrame, RedisError> {
        self.out.clear();
        resp::encode_command(&mut self.out, args);
        self.write_out()?;
        let name = String::from_utf8_lossy(args.first().copied().unwrap_or_default()).into();
        self.read_reply(name)
    }

    /// Sends the commands `encode` appends (see [`resp::encode_command`]) in one write,
    /// then reads `count` replies; the first error reply is the error.
    pub fn pipeline(
        &mut self,
        count: usize,
        encode: impl FnOnce(&mut Vec<u8>),
    ) -> Result<(), RedisError> {
        self.out.clear();
        encode(&mut self.out);
        self.write_out()?;
        let mut first_error = None;
        for _ in 0..count {
            if let Err(error) = self.read_reply("pipeline".into()) {
                match error {
                    RedisError::Server { .. } => {
                        first_error.get_or_insert(error);
                    }
                    other => return Err(other),
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn write_out(&mut self) -> Result<(), RedisError> {
        self.stream
            .write_all(&self.out)
            .map_err(|e| RedisError::io(format!("writing to Redis at {}", self.addr), e))
    }

    fn read_reply(&mut self, command: String) -> Result<OwnedFrame, RedisError> {
        loop {
            // The decoder recurses per level of nesting: bound the levels first.
            match resp::check_depth(&self.inbox, false) {
                Ok(_) => {}
                Err(Refused::TooDeep) => {
                    return Err(RedisError::TooDeep {
                        addr: self.addr.clone(),
                        depth_max: REPLY_DEPTH_MAX,
                    })
                }
                Err(Refused::Malformed(reason)) => {
                    return Err(RedisError::Malformed {
                        addr: self.addr.clone(),
                        reason,
                    })
                }
            }
            match decode(&self.inbox) {
                Ok(Some((frame, used))) => {
                    self.inbox.drain(..used);
                    return match frame {
                        OwnedFrame::Error(message) => Err(RedisError::Server { command, message }),
                        frame => Ok(frame),
                    };
                }
                Ok(None) => {}
                Err(error) => {
                    return Err(RedisError::Malformed {
                        addr: self.addr.clone(),
                        reason: error.details().to_string(),
                    })
                }
            }
            let mut chunk = [0u8; 16 * 1024];
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    return Err(RedisError::Closed {
                        addr: self.addr.clone(),
                        pending: 1,
                        reason: None,
                    })
                }
                Ok(n) => self.inbox.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut =>
                {
                    return Err(RedisError::Timeout {
                        addr: self.addr.clone(),
                        timeout: Duration::from_secs(30),
                    })
                }
                Err(e) => {
                    return Err(RedisError::io(
                        format!("reading from Redis at {}", self.addr),
                        e,
                    ))
                }
            }
        }
    }
}

/// Whether `frame` is the simple string `text` (e.g. `PONG`, `OK`).
pub fn is_status(frame: &OwnedFrame, text: &str) -> bool {
    frame.as_str() == Some(text)
}

/// Appends key `n`'s name: `prefix` then `n` in decimal.
pub fn key_name(out: &mut Vec<u8>, prefix: &str, n: u64) {
    out.extend_from_slice(prefix.as_bytes());
    let _ = write!(out, "{n}");
}

/// Appends key `n`'s value of `size` bytes: `n` in decimal and a `.`, repeated and cut
/// at `size`, so a reader can tell a value belongs to its key.
pub fn value_of(out: &mut Vec<u8>, n: u64, size: usize) {
    let start = out.len();
    let mut unit = Vec::with_capacity(21);
    let _ = write!(unit, "{n}.");
    while out.len() - start < size {
        let take = unit.len().min(size - (out.len() - start));
        out.extend_from_slice(&unit[..take]);
    }
}

/// What [`load_keys`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loaded {
    /// Keys written.
    pub keys: u64,
    /// Bytes of values written.
    pub bytes: u64,
}

/// Writes keys `prefix0 .. prefix{keys-1}` with values of `value_size` bytes (see
/// [`value_of`]), pipelined `SET`s in chunks; `progress` is told the keys written so
/// far after each chunk.
pub fn load_keys(
    url: &RedisUrl,
    keys: u64,
    value_size: usize,
    prefix: &str,
    progress: impl FnMut(u64),
) -> Result<Loaded, RedisError> {
    load_keys_with(
        url,
        keys,
        value_size,
        |out, n| key_name(out, prefix, n),
        progress,
    )
}

/// [`load_keys`] with key `n`'s name written by `name`.
pub fn load_keys_with(
    url: &RedisUrl,
    keys: u64,
    value_size: usize,
    mut name: impl FnMut(&mut Vec<u8>, u64),
    mut progress: impl FnMut(u64),
) -> Result<Loaded, RedisError> {
    if value_size > 512 << 20 {
        return Err(RedisError::Config(format!(
            "value size {value_size} exceeds Redis's 512 MiB limit for a string"
        )));
    }
    let mut connection = BlockingConnection::connect(url, Duration::from_secs(5))?;
    let mut key = Vec::new();
    let mut value = Vec::with_capacity(value_size);
    let mut next = 0;
    while next < keys {
        let end = (next + LOAD_CHUNK).min(keys);
        connection.pipeline((end - next) as usize, |out| {
            for n in next..end {
                key.clear();
                name(&mut key, n);
                value.clear();
                value_of(&mut value, n, value_size);
                resp::encode_command(out, &[b"SET", &key, &value]);
            }
        })?;
        next = end;
        progress(next);
    }
    Ok(Loaded {
        keys,
        bytes: keys * value_size as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_say_their_key_and_have_their_size() {
        for size in [0, 1, 5, 100, 1000] {
            let mut out = Vec::new();
            value_of(&mut out, 42, size);
            assert_eq!(out.len(), size);
            assert!(out.starts_with(&b"42.42."[..size.min(6)]));
        }
        let mut key = Vec::new();
        key_name(&mut key, "weir:", 7);
        assert_eq!(key, b"weir:7");
    }
}
