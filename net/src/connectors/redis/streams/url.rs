//! `redis-stream://[user:password@]host:port/stream[,stream…][?db=N&protocol=…]`: a
//! server and the streams on it, in one argument (what `weir run --source` and `--sink`
//! take).
//!
//! Everything before the first `/` after the scheme is a Redis URL's authority (the
//! credentials percent-escaped as there); everything after it, up to `?`, is the
//! comma-separated list of stream keys, taken as written (a key may hold `:` and `/`,
//! not `,` or `?`). The database, which a Redis URL gives as its path, is the `db`
//! option here.

use std::fmt;
use std::str::FromStr;

use super::super::error::UrlError;
use super::super::url::RedisUrl;

/// A parsed `redis-stream://` URL.
#[derive(Clone, PartialEq, Eq)]
pub struct StreamUrl {
    /// The server, credentials and database.
    pub redis: RedisUrl,
    /// The streams' keys, in the order written, at least one, none empty.
    pub streams: Vec<String>,
}

/// Why a `redis-stream://` URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamUrlError {
    /// The scheme is not `redis-stream://`.
    #[error(
        "{0:?} is not a stream URL: write redis-stream://[user:password@]host:port/stream[,stream…], \
         e.g. redis-stream://127.0.0.1:6379/events"
    )]
    Scheme(String),
    /// No stream after the host and port.
    #[error("the stream URL names no stream: add /<stream>[,<stream>…] after host:port")]
    NoStream,
    /// An empty key in the list (`a,,b` or a trailing comma).
    #[error(
        "the stream URL's list {0:?} has an empty stream name: separate keys with single commas"
    )]
    EmptyStream(String),
    /// The same stream twice.
    #[error("the stream URL names stream {0:?} twice")]
    Duplicate(String),
    /// The database option is not a number.
    #[error("the stream URL's db={0:?} is not a number: write ?db=0, ?db=1, …")]
    Database(String),
    /// An option the URL does not take.
    #[error("the stream URL's option {0:?} is not taken: the options are db=N and protocol=resp2")]
    Option(String),
    /// The server part is not a Redis URL's.
    #[error(transparent)]
    Server(#[from] UrlError),
}

impl FromStr for StreamUrl {
    type Err = StreamUrlError;

    fn from_str(url: &str) -> Result<Self, StreamUrlError> {
        let rest = url
            .strip_prefix("redis-stream://")
            .ok_or_else(|| StreamUrlError::Scheme(url.into()))?;
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, query),
            None => (rest, ""),
        };
        let (authority, list) = rest.split_once('/').ok_or(StreamUrlError::NoStream)?;
        if list.is_empty() {
            return Err(StreamUrlError::NoStream);
        }
        let mut db = None;
        let mut options = Vec::new();
        for option in query.split('&').filter(|o| !o.is_empty()) {
            match option.split_once('=') {
                Some(("db", n)) => {
                    db = Some(
                        n.parse::<u32>()
                            .map_err(|_| StreamUrlError::Database(n.into()))?,
                    )
                }
                Some(("protocol", "resp2")) => options.push(option),
                Some(("protocol", _)) => {
                    return Err(StreamUrlError::Option(format!(
                        "{option} (the stream source and sink speak RESP2: protocol=resp2 or \
                         nothing)"
                    )))
                }
                _ => return Err(StreamUrlError::Option(option.into())),
            }
        }
        let mut server = format!("redis://{authority}");
        if let Some(db) = db {
            server.push_str(&format!("/{db}"));
        }
        if !options.is_empty() {
            server.push('?');
            server.push_str(&options.join("&"));
        }
        let redis: RedisUrl = server.parse()?;
        let mut streams: Vec<String> = Vec::new();
        for key in list.split(',') {
            if key.is_empty() {
                return Err(StreamUrlError::EmptyStream(list.into()));
            }
            if streams.iter().any(|s| s == key) {
                return Err(StreamUrlError::Duplicate(key.into()));
            }
            streams.push(key.into());
        }
        Ok(StreamUrl { redis, streams })
    }
}

impl fmt::Display for StreamUrl {
    /// The URL without its password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let server = self.redis.to_string();
        let server = server.strip_prefix("redis://").unwrap_or(&server);
        // `host:port/db`: the database becomes the option.
        let (authority, db) = server.rsplit_once('/').unwrap_or((server, "0"));
        write!(f, "redis-stream://{authority}/{}", self.streams.join(","))?;
        if db != "0" {
            write!(f, "?db={db}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for StreamUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_servers_streams_and_options() {
        let url: StreamUrl = "redis-stream://127.0.0.1:6399/a,b:c/d".parse().unwrap();
        assert_eq!(url.redis, RedisUrl::new("127.0.0.1", 6399));
        assert_eq!(url.streams, ["a", "b:c/d"]);
        assert_eq!(url.to_string(), "redis-stream://127.0.0.1:6399/a,b:c/d");

        let url: StreamUrl = "redis-stream://app:s%40cret@redis.local/in?db=3&protocol=resp2"
            .parse()
            .unwrap();
        assert_eq!(url.redis.user.as_deref(), Some("app"));
        assert_eq!(url.redis.password.as_deref(), Some("s@cret"));
        assert_eq!(url.redis.port, 6379);
        assert_eq!(url.redis.db, 3);
        assert_eq!(url.streams, ["in"]);
        assert_eq!(
            url.to_string(),
            "redis-stream://app:***@redis.local:6379/in?db=3"
        );
    }

    #[test]
    fn refuses_what_it_cannot_read_saying_what_to_write() {
        let refused = |text: &str| text.parse::<StreamUrl>().unwrap_err();
        assert!(matches!(
            refused("redis://h:1/s"),
            StreamUrlError::Scheme(_)
        ));
        assert_eq!(refused("redis-stream://h:1"), StreamUrlError::NoStream);
        assert_eq!(refused("redis-stream://h:1/"), StreamUrlError::NoStream);
        assert!(matches!(
            refused("redis-stream://h:1/a,,b"),
            StreamUrlError::EmptyStream(_)
        ));
        assert!(matches!(
            refused("redis-stream://h:1/a,"),
            StreamUrlError::EmptyStream(_)
        ));
        assert!(matches!(
            refused("redis-stream://h:1/a,a"),
            StreamUrlError::Duplicate(_)
        ));
        assert!(matches!(
            refused("redis-stream://h:1/a?db=x"),
            StreamUrlError::Database(_)
        ));
        assert!(matches!(
            refused("redis-stream://h:1/a?x=1"),
            StreamUrlError::Option(_)
        ));
        assert!(matches!(
            refused("redis-stream://h:99999/a"),
            StreamUrlError::Server(UrlError::Port { .. })
        ));
        assert!(refused("redis-stream://h:1")
            .to_string()
            .contains("add /<stream>"));
    }
}
