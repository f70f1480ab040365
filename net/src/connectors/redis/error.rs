//! Errors of the Redis client, its URLs and its helpers.

use std::io;
use std::time::Duration;

/// Why a `redis://` URL is not usable; each message says what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// The scheme is not `redis://`.
    #[error("{url:?} is not a Redis URL: write redis://[user:password@]host:port[/db]")]
    Scheme {
        /// The URL given.
        url: String,
    },
    /// No host after `redis://`.
    #[error("{url:?} names no host: write redis://host:port, e.g. redis://127.0.0.1:6379")]
    MissingHost {
        /// The URL given.
        url: String,
    },
    /// The port is not a number in 1..=65535.
    #[error("{url:?}: port {port:?} is not a number in 1..=65535")]
    Port {
        /// The URL given.
        url: String,
        /// The port text.
        port: String,
    },
    /// The database is not a number.
    #[error("{url:?}: database {db:?} is not a number; write /0, /1, ... after the port")]
    Database {
        /// The URL given.
        url: String,
        /// The database text.
        db: String,
    },
    /// A `%` escape in the user or password is not two hex digits, or not UTF-8.
    #[error("{url:?}: bad percent-escape in the credentials; escape '@', ':' and '%' as %40, %3A and %25")]
    Escape {
        /// The URL given.
        url: String,
    },
    /// An unknown query parameter or value.
    #[error("{url:?}: unknown option {option:?}; the only option is protocol=resp2|resp3|auto")]
    Option {
        /// The URL given.
        url: String,
        /// The option text.
        option: String,
    },
    /// The host name does not resolve.
    #[error("cannot resolve {host}:{port}: {reason}")]
    Resolve {
        /// The host.
        host: String,
        /// The port.
        port: u16,
        /// The resolver's message.
        reason: String,
    },
}

/// Why a Redis command, a connection or a setting failed.
///
/// Calls that fail complete their `ResultFuture` with
/// [`AsyncError::Call`](weir_engine::async_io::AsyncError::Call) holding this error, so
/// the operator's timeouts and retries apply (a retry predicate may downcast to it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisError {
    /// An invalid URL.
    #[error(transparent)]
    Url(#[from] UrlError),
    /// An invalid client setting.
    #[error("invalid Redis client setting: {0}")]
    Config(String),
    /// Connecting failed (refused, unreachable, reset during set-up).
    #[error("cannot connect to Redis at {addr}: {source}; is redis-server running there?")]
    Connect {
        /// The server.
        addr: String,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
    /// Connection set-up (connect, `HELLO`, `AUTH`, `SELECT`) took too long.
    #[error("connection to Redis at {addr} not set up within {timeout:?} (connect timeout)")]
    ConnectTimeout {
        /// The server.
        addr: String,
        /// The connect timeout.
        timeout: Duration,
    },
    /// `AUTH` (or `HELLO ... AUTH`) was refused.
    #[error("Redis at {addr} refused the credentials: {message}; check user and password in the redis:// URL")]
    Auth {
        /// The server.
        addr: String,
        /// The server's message.
        message: String,
    },
    /// `SELECT` was refused.
    #[error("Redis at {addr} refused SELECT {db}: {message}; use a database the server has (databases setting)")]
    Select {
        /// The server.
        addr: String,
        /// The database.
        db: u32,
        /// The server's message.
        message: String,
    },
    /// The server does not speak RESP3 and the URL asked for it.
    #[error("Redis at {addr} refused RESP3 ({message}); use protocol=resp2 or protocol=auto")]
    Protocol {
        /// The server.
        addr: String,
        /// The server's message.
        message: String,
    },
    /// The connection was closed or reset with commands unanswered.
    #[error("connection to Redis at {addr} closed with {pending} commands unanswered{}", .reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default())]
    Closed {
        /// The server.
        addr: String,
        /// Calls failed by it.
        pending: usize,
        /// The kernel's error, if it was not a clean close.
        reason: Option<String>,
    },
    /// The server sent bytes that are not RESP, or a reply that does not fit its
    /// command; the connection was closed.
    #[error("malformed reply from Redis at {addr}: {reason}; the connection was closed")]
    Malformed {
        /// The server.
        addr: String,
        /// What was wrong.
        reason: String,
    },
    /// A reply nested aggregates deeper than
    /// [`REPLY_DEPTH_MAX`](super::REPLY_DEPTH_MAX) levels; the connection was closed
    /// before decoding it.
    #[error("reply from Redis at {addr} nests arrays or maps deeper than {depth_max} levels (REPLY_DEPTH_MAX); the connection was closed: a lookup's reply nests one level, so check that a Redis server answers at that address")]
    TooDeep {
        /// The server.
        addr: String,
        /// The limit.
        depth_max: usize,
    },
    /// A connection with replies due received nothing for the request timeout; the
    /// connection was closed.
    #[error("Redis at {addr} did not answer within {timeout:?} (request timeout); the connection was closed")]
    Timeout {
        /// The server.
        addr: String,
        /// The request timeout.
        timeout: Duration,
    },
    /// The oldest command on a connection did not get its whole reply within the
    /// response timeout of being sent (a server stalled, or trickling its reply); the
    /// connection was closed.
    #[error("Redis at {addr} did not finish answering a command within {timeout:?} of it being sent (response timeout); the connection was closed: raise response_timeout if the server may be this slow")]
    ResponseTimeout {
        /// The server.
        addr: String,
        /// The response timeout.
        timeout: Duration,
    },
    /// The server answered the command with an error reply.
    #[error("Redis error for {command}: {message}")]
    Server {
        /// The command (GET, MGET, HGET, HMGET...).
        command: String,
        /// The server's message (e.g. `WRONGTYPE ...`).
        message: String,
    },
    /// The request did not describe a valid lookup.
    #[error("invalid lookup: {0}")]
    Request(String),
    /// Too many calls outstanding.
    #[error("Redis client overloaded: {outstanding} calls outstanding (capacity {capacity}); raise the client capacity or lower the operator's")]
    Overloaded {
        /// Calls outstanding.
        outstanding: usize,
        /// The client's capacity.
        capacity: usize,
    },
    /// A consumer group that a stream source reads through does not exist on a stream
    /// (`NOGROUP`).
    #[error("consumer group {group:?} does not exist on stream {stream:?} ({message}); create it with XGROUP CREATE {stream} {group} $ MKSTREAM, or set create_group")]
    NoGroup {
        /// The group.
        group: String,
        /// The stream.
        stream: String,
        /// The server's message.
        message: String,
    },
    /// A stream entry has no event time where the source was told to take it from.
    #[error("entry {id} of stream {stream:?} has no event time: {reason}; write the field as milliseconds in decimal, or take event time from the entry ID")]
    EventTime {
        /// The stream.
        stream: String,
        /// The entry's ID (`ms-seq`).
        id: String,
        /// What is wrong (the field is missing, or not an integer).
        reason: String,
    },
    /// A checkpointed position does not fit the source being restored.
    #[error("cannot restore a stream source from its checkpoint: {0}")]
    Position(String),
    /// A socket or process operation failed.
    #[error("{what} failed: {source}")]
    Io {
        /// What was attempted.
        what: String,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl RedisError {
    /// A connection to `peer` closed with `pending` commands unanswered (`error`: the
    /// kernel's, if it was not a clean close). Refused, or closed during set-up before
    /// the server answered anything, it is a failure to connect; otherwise a loss.
    pub(crate) fn connection_closed(
        peer: &str,
        pending: usize,
        setting_up: bool,
        heard: bool,
        error: Option<&io::Error>,
    ) -> Self {
        let refused = error.is_some_and(|e| e.kind() == io::ErrorKind::ConnectionRefused);
        if !heard && (refused || setting_up) {
            RedisError::Connect {
                addr: peer.to_string(),
                source: match error {
                    Some(e) => io::Error::new(e.kind(), e.to_string()),
                    None => io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "closed by the server during set-up",
                    ),
                },
            }
        } else {
            RedisError::Closed {
                addr: peer.to_string(),
                pending,
                reason: error.map(|e| e.to_string()),
            }
        }
    }

    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        RedisError::Io {
            what: what.into(),
            source,
        }
    }

    /// Whether retrying the same call later may succeed: connection loss, timeouts and
    /// overload are; wrong credentials, a wrong type or a bad request are not.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            RedisError::Connect { .. }
                | RedisError::ConnectTimeout { .. }
                | RedisError::Closed { .. }
                | RedisError::Malformed { .. }
                | RedisError::TooDeep { .. }
                | RedisError::Timeout { .. }
                | RedisError::ResponseTimeout { .. }
                | RedisError::Overloaded { .. }
                | RedisError::Io { .. }
        )
    }

    /// A copy, for each of the several calls one connection failure fails.
    pub(crate) fn duplicate(&self) -> RedisError {
        let io = |e: &io::Error| io::Error::new(e.kind(), e.to_string());
        match self {
            RedisError::Url(error) => RedisError::Url(error.clone()),
            RedisError::Config(message) => RedisError::Config(message.clone()),
            RedisError::Connect { addr, source } => RedisError::Connect {
                addr: addr.clone(),
                source: io(source),
            },
            RedisError::ConnectTimeout { addr, timeout } => RedisError::ConnectTimeout {
                addr: addr.clone(),
                timeout: *timeout,
            },
            RedisError::Auth { addr, message } => RedisError::Auth {
                addr: addr.clone(),
                message: message.clone(),
            },
            RedisError::Select { addr, db, message } => RedisError::Select {
                addr: addr.clone(),
                db: *db,
                message: message.clone(),
            },
            RedisError::Protocol { addr, message } => RedisError::Protocol {
                addr: addr.clone(),
                message: message.clone(),
            },
            RedisError::Closed {
                addr,
                pending,
                reason,
            } => RedisError::Closed {
                addr: addr.clone(),
                pending: *pending,
                reason: reason.clone(),
            },
            RedisError::Malformed { addr, reason } => RedisError::Malformed {
                addr: addr.clone(),
                reason: reason.clone(),
            },
            RedisError::TooDeep { addr, depth_max } => RedisError::TooDeep {
                addr: addr.clone(),
                depth_max: *depth_max,
            },
            RedisError::Timeout { addr, timeout } => RedisError::Timeout {
                addr: addr.clone(),
                timeout: *timeout,
            },
            RedisError::ResponseTimeout { addr, timeout } => RedisError::ResponseTimeout {
                addr: addr.clone(),
                timeout: *timeout,
            },
            RedisError::Server { command, message } => RedisError::Server {
                command: command.clone(),
                message: message.clone(),
            },
            RedisError::Request(message) => RedisError::Request(message.clone()),
            RedisError::Overloaded {
                outstanding,
                capacity,
            } => RedisError::Overloaded {
                outstanding: *outstanding,
                capacity: *capacity,
            },
            RedisError::NoGroup {
                group,
                stream,
                message,
            } => RedisError::NoGroup {
                group: group.clone(),
                stream: stream.clone(),
                message: message.clone(),
            },
            RedisError::EventTime { stream, id, reason } => RedisError::EventTime {
                stream: stream.clone(),
                id: id.clone(),
                reason: reason.clone(),
            },
            RedisError::Position(message) => RedisError::Position(message.clone()),
            RedisError::Io { what, source } => RedisError::Io {
                what: what.clone(),
                source: io(source),
            },
        }
    }
}
