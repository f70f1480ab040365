//! Redis as an external system: a pipelined client on each worker's own driver.
//!
//! - [`client`]: the [`RedisClient`], its [`RedisFunction`] (an `AsyncFunction` for
//!   `GET`, `HGET` and `HMGET` lookups, with optional `MGET` batching) and [`RedisIo`]
//!   (its hook into the worker's driver);
//! - [`url`]: `redis://[user:password@]host:port/db` URLs;
//! - `resp`: RESP2/RESP3 framing (replies parsed in place by `redis-protocol`, after a
//!   check that they nest at most [`REPLY_DEPTH_MAX`] levels);
//! - [`blocking`]: a blocking connection for set-up work and the pipelined bulk loader;
//! - [`process`]: a `redis-server` child process for tests, benchmarks and examples.

pub mod blocking;
pub mod client;
pub mod error;
pub mod process;
mod resp;
pub mod streams;
pub mod url;

pub use blocking::{key_name, load_keys, load_keys_with, value_of, BlockingConnection, Loaded};
pub use client::{
    Args, Backoff, Fields, Lookup, RedisBatchFunction, RedisClient, RedisConfig, RedisFunction,
    RedisIo, RedisRequest, RedisStats, Reply, SharedStats, MAX_REPLY_BYTES_DEFAULT,
};
pub use error::{RedisError, UrlError};
pub use process::{RedisServer, ServerOptions};
pub use resp::{encode_command, REPLY_DEPTH_MAX};
pub use url::{Protocol, RedisUrl};

/// Reads the first reply in `bytes` as the client does (the nesting check, then the
/// protocol's decoder; `resp3` picks the grammar): how many bytes it takes, `None` if
/// it is not complete yet, or why the bytes are refused. For fuzzing and tools: the
/// client's own path goes on to match the reply to its command.
pub fn check_reply(bytes: &[u8], resp3: bool) -> Result<Option<usize>, String> {
    match resp::decode(bytes, resp3) {
        Ok(reply) => Ok(reply.map(|(_, used)| used)),
        Err(resp::Refused::Malformed(reason)) => Err(reason),
        Err(resp::Refused::TooDeep) => Err(format!(
            "a reply nested deeper than {REPLY_DEPTH_MAX} levels"
        )),
    }
}

/// The environment variable naming the Redis server the integration tests use
/// (`redis://127.0.0.1:PORT`); `scripts/redis.sh start` prints it.
pub const TEST_URL_VAR: &str = "WEIR_REDIS_URL";

/// The server of [`TEST_URL_VAR`] for an integration test, or `None` with a note that
/// `test` was skipped (`scripts/test.sh` starts one and sets the variable; CI requires it).
///
/// # Panics
/// If the variable is set but is not a `redis://` URL (a test setup error).
pub fn test_server_url(test: &str) -> Option<RedisUrl> {
    match std::env::var(TEST_URL_VAR) {
        Ok(url) => Some(url.parse().expect("WEIR_REDIS_URL is a redis:// URL")),
        Err(_) => {
            eprintln!(
                "note: {test} skipped: {TEST_URL_VAR} is unset (scripts/test.sh starts Redis \
                 with scripts/redis.sh)"
            );
            None
        }
    }
}
