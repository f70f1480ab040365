//! A pipeline from a Redis stream to a Redis stream: orders are read, enriched with
//! their user's profile from Redis through a lookup cache, keyed by user for a running
//! total per user (checkpointable keyed state), and appended to another stream.
//!
//! ```text
//! redis stream source ─▶ parse ─▶ async HMGET user:<id> (cache) ─▶ key_by(user)
//!     ─▶ running total per user ─▶ redis stream sink
//! ```
//!
//! Run it against your own Redis (6 or later; `scripts/redis.sh start` starts one on
//! 127.0.0.1:6399):
//!
//! ```text
//! cargo run --release -p weir-net --example stream_enrich -- redis://127.0.0.1:6399
//! redis-cli -p 6399 XREVRANGE weir:example:enriched + - COUNT 3
//! ```
//!
//! It seeds the user profiles (`HSET user:<id> name … country …`), appends `--orders N`
//! orders (default 20000; 0 for none: read what is there) to `--in STREAM` (default
//! `weir:example:orders`) with fields `order`, `user` and `cents`, and then reads that
//! stream to its entries at start and ends (bounded), or with `--follow SECONDS` reads
//! on for that long (append to it meanwhile with `redis-cli XADD weir:example:orders *
//! order 1 user 7 cents 250`) and then stops with drain. Each output entry of `--out
//! STREAM` (default `weir:example:enriched`) has `order`, `user`, `cents`, `name`,
//! `country` (empty for a user without a profile: a missing key is a value, cached as
//! one) and `user_total`, the user's cents so far. An input entry without those fields
//! as decimal numbers is skipped and counted.
//!
//! Guarantees as written (no checkpoints): the sink is at least once, and the source
//! starts from the stream's beginning each run. With `Graph::with_checkpointing`, the
//! source's positions, the running totals and the sink's unanswered entries are in each
//! checkpoint, and `Guarantee::ExactlyOnce` on the sink writes each checkpoint's output
//! in one `MULTI`/`EXEC` (see the guide's "Redis" chapter, `guide/src/redis.md`).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_engine::async_io::{AsyncConfig, AsyncError, LookupCache, OutputMode, RetryStrategy};
use weir_engine::exchange::codec::{Codec, DecodeError, Decoder, Encoder};
use weir_engine::graph::{Graph, IoHandler};
use weir_engine::runtime::{Cores, Runtime};
use weir_net::redis::streams::{
    produce, stream_sink, stream_source, StreamEntry, StreamSinkConfig, StreamSourceConfig,
};
use weir_net::redis::{
    encode_command, Args, BlockingConnection, Lookup, RedisClient, RedisConfig, RedisError,
    RedisFunction, RedisIo, RedisRequest, RedisUrl, Reply,
};
use weir_net::DriverKind;

/// Users with a profile; orders also name users beyond them (no profile).
const USERS: u64 = 1_000;

/// An order as read from the input stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Order {
    order: u64,
    user: u64,
    cents: u64,
}

impl Order {
    /// The order in an entry, or `None` when a field is missing or not a number.
    fn from_entry(entry: &StreamEntry) -> Option<Order> {
        let number = |name: &[u8]| {
            std::str::from_utf8(entry.field(name)?)
                .ok()?
                .parse::<u64>()
                .ok()
        };
        Some(Order {
            order: number(b"order")?,
            user: number(b"user")?,
            cents: number(b"cents")?,
        })
    }
}

// Records cross the key-by exchange (and sit in checkpoints) encoded.
impl Codec for Order {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        (self.order, self.user, self.cents).encode(out);
    }
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        let (order, user, cents) = <(u64, u64, u64)>::decode(input)?;
        Ok(Order { order, user, cents })
    }
}

/// An order with its user's profile (empty when the user has none).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Enriched {
    order: Order,
    name: String,
    country: String,
}

impl Codec for Enriched {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        self.order.encode(out);
        self.name.encode(out);
        self.country.encode(out);
    }
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        Ok(Enriched {
            order: Order::decode(input)?,
            name: String::decode(input)?,
            country: String::decode(input)?,
        })
    }
}

impl RedisRequest for Order {
    type Out = Enriched;

    fn lookup(&self, args: &mut Args) -> Lookup {
        args.push_fmt(format_args!("user:{}", self.user));
        args.push(b"name");
        args.push(b"country");
        Lookup::HMGet
    }

    fn complete(self, reply: Reply<'_>) -> Enriched {
        let text = |value: Option<&[u8]>| {
            value.map_or_else(String::new, |v| String::from_utf8_lossy(v).into_owned())
        };
        let (name, country) = match reply {
            Reply::Fields(fields) => (text(fields.get(0)), text(fields.get(1))),
            Reply::Value(value) => (text(value), String::new()),
        };
        Enriched {
            order: self,
            name,
            country,
        }
    }
}

/// What to run.
struct Options {
    url: RedisUrl,
    input: String,
    output: String,
    orders: u64,
    follow: Option<Duration>,
}

/// What a run did.
struct Summary {
    read: u64,
    skipped: u64,
    written: u64,
    cache_hits: u64,
    cache_misses: u64,
    elapsed: Duration,
}

/// Writes the user profiles, pipelined in one round trip.
fn seed(url: &RedisUrl) -> Result<(), RedisError> {
    let mut connection = BlockingConnection::connect(url, Duration::from_secs(2))?;
    let countries = ["NL", "FR", "JP", "BR", "KE"];
    connection.pipeline(USERS as usize, |out| {
        for user in 0..USERS {
            let key = format!("user:{user}");
            let name = format!("user-{user}");
            let country = countries[(user % 5) as usize];
            encode_command(
                out,
                &[
                    b"HSET",
                    key.as_bytes(),
                    b"name",
                    name.as_bytes(),
                    b"country",
                    country.as_bytes(),
                ],
            );
        }
    })
}

/// Seeds, fills the input stream, runs the job; errors say what failed.
fn run(options: &Options) -> Result<Summary, Box<dyn std::error::Error>> {
    seed(&options.url)?;
    if options.orders > 0 {
        produce(
            &options.url,
            &options.input,
            options.orders,
            None,
            |n, fields| {
                fields
                    .push_fmt("order", format_args!("{n}"))
                    // A tenth of the orders name users without a profile.
                    .push_fmt(
                        "user",
                        format_args!("{}", (n * 7919) % (USERS + USERS / 10)),
                    )
                    .push_fmt("cents", format_args!("{}", 100 + n % 9_900));
            },
        )?;
    }

    let mut source = StreamSourceConfig::new(options.url.clone(), vec![options.input.clone()]);
    source.bounded = options.follow.is_none();
    source.addr = Some(source.check()?);
    let sink = StreamSinkConfig::new(options.url.clone(), options.output.clone());
    sink.check()?;
    // Every subtask's sink adds to the configuration's counters.
    let written = Arc::clone(&sink.stats);
    let mut lookups = RedisConfig::new(options.url.clone());
    lookups.capacity = 1024;
    let lookups_addr = lookups.check()?;

    // Retry lookups whose connection failed; a wrong type or refused credentials fail
    // the job.
    let retry = RetryStrategy::fixed_delay(5, Duration::from_millis(20)).retry_on_error(
        |error: &AsyncError| match error {
            AsyncError::Call(inner) => inner
                .downcast_ref::<RedisError>()
                .is_some_and(RedisError::is_transient),
            _ => false,
        },
    );
    // Flink's PARTIAL lookup cache: a profile is reused for a minute, users without
    // one are cached too (as empty), 10,000 rows per subtask.
    let cache = LookupCache::new(10_000, |order: &Order| order.user)
        .with_expire_after_write(Duration::from_secs(60))
        .with_cache_missing_key(true)
        // A cached profile answers another order of the same user.
        .with_join(|order: &Order, cached: &Enriched| Enriched {
            order: *order,
            ..cached.clone()
        });
    let async_config = AsyncConfig::new(OutputMode::Ordered, 256)
        .with_timeout(Duration::from_secs(2))
        .with_retry(retry)
        .with_cache(cache);

    let skipped = Arc::new(AtomicU64::new(0));
    let skips = Arc::clone(&skipped);
    let graph = Graph::new().with_parallelism(2);
    graph
        .from_source_io(move |info| stream_source(&source, info))
        .name("orders")
        .flat_map(move |entry: StreamEntry| {
            let order = Order::from_entry(&entry);
            if order.is_none() {
                skips.fetch_add(1, Ordering::Relaxed);
            }
            order
        })
        .async_wait_io(
            move |_| {
                let client = RedisClient::with_addr(lookups.clone(), lookups_addr)
                    .expect("settings checked before the job");
                let client = Rc::new(RefCell::new(client));
                let io: Box<dyn IoHandler> = Box::new(RedisIo(Rc::clone(&client)));
                (RedisFunction::new(client), Some(io))
            },
            async_config,
        )
        .key_by(|e: &Enriched| e.order.user)
        .map_with_state(
            |e: &Enriched| e.order.user,
            |e: Enriched, total: &mut Option<u64>| {
                let sum = total.unwrap_or(0) + e.order.cents;
                *total = Some(sum);
                (e, sum)
            },
        )
        .sink_io(move |info| {
            stream_sink(&sink, info, |(e, total): &(Enriched, u64), fields| {
                fields
                    .push_fmt("order", format_args!("{}", e.order.order))
                    .push_fmt("user", format_args!("{}", e.order.user))
                    .push_fmt("cents", format_args!("{}", e.order.cents))
                    .push("name", &e.name)
                    .push("country", &e.country)
                    .push_fmt("user_total", format_args!("{total}"));
            })
        });
    let runtime = Runtime::builder()
        .cores(Cores::Count(2))
        .pin(false)
        .driver(Arc::new(|| {
            weir_net::build_driver(DriverKind::Auto)
                .map_err(|e| std::io::Error::other(e.to_string()))
        }))
        .build()?;
    let started = Instant::now();
    let job = graph.start(runtime)?;
    if let Some(follow) = options.follow {
        let controller = job.controller();
        std::thread::spawn(move || {
            std::thread::sleep(follow);
            // Stop with drain: the sources end, what they read is written.
            controller.end_input();
        });
    }
    let (result, failure) = job.join();
    if let Some(error) = failure {
        return Err(error.into());
    }
    let metrics = result.async_metrics();
    Ok(Summary {
        read: result.stages.first().map_or(0, |s| s.records_in),
        skipped: skipped.load(Ordering::Relaxed),
        written: written.snapshot().entries,
        cache_hits: metrics.cache_hits,
        cache_misses: metrics.cache_misses,
        elapsed: started.elapsed(),
    })
}

fn parse_options() -> Result<Options, String> {
    let mut args = std::env::args().skip(1);
    let mut url = std::env::var(weir_net::redis::TEST_URL_VAR)
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let mut options = Options {
        url: RedisUrl::new("127.0.0.1", 6379),
        input: "weir:example:orders".into(),
        output: "weir:example:enriched".into(),
        orders: 20_000,
        follow: None,
    };
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--in" => options.input = value("--in")?,
            "--out" => options.output = value("--out")?,
            "--orders" => {
                options.orders = value("--orders")?
                    .parse()
                    .map_err(|_| "--orders takes a number".to_string())?
            }
            "--follow" => {
                let seconds: f64 = value("--follow")?
                    .parse()
                    .map_err(|_| "--follow takes seconds, e.g. 30".to_string())?;
                if !(seconds.is_finite() && seconds > 0.0) {
                    return Err("--follow takes a positive number of seconds".into());
                }
                options.follow = Some(Duration::from_secs_f64(seconds));
            }
            other if other.starts_with("redis://") => url = other.into(),
            other => {
                return Err(format!(
                    "unknown argument {other:?}: [redis://host:port] [--orders N] [--in STREAM] \
                     [--out STREAM] [--follow SECONDS]"
                ))
            }
        }
    }
    options.url = url
        .parse()
        .map_err(|e: weir_net::redis::UrlError| e.to_string())?;
    Ok(options)
}

fn main() {
    let options = match parse_options() {
        Ok(options) => options,
        Err(error) => {
            eprintln!("error: {error}");
            std::process::exit(2);
        }
    };
    eprintln!(
        "stream_enrich: {} → profiles from {} → {}{}",
        options.input,
        options.url,
        options.output,
        match options.follow {
            Some(d) => format!(", following for {} s", d.as_secs_f64()),
            None => ", up to the input's entries at start".into(),
        }
    );
    match run(&options) {
        Ok(summary) => {
            println!(
                "read {} orders ({} skipped), wrote {} enriched entries to {} in {:.2} s; \
                 lookup cache {} hits, {} misses",
                summary.read,
                summary.skipped,
                summary.written,
                options.output,
                summary.elapsed.as_secs_f64(),
                summary.cache_hits,
                summary.cache_misses
            );
            println!(
                "the newest: redis-cli XREVRANGE {} + - COUNT 3",
                options.output
            );
        }
        Err(error) => {
            eprintln!("error: {error}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use redis_protocol::resp2::types::OwnedFrame;

    use super::*;

    /// Every entry of `stream` as field → value maps, in order.
    fn entries(url: &RedisUrl, stream: &str) -> Vec<HashMap<String, String>> {
        let mut connection = BlockingConnection::connect(url, Duration::from_secs(2)).unwrap();
        let OwnedFrame::Array(entries) = connection
            .command(&[b"XRANGE", stream.as_bytes(), b"-", b"+"])
            .unwrap()
        else {
            panic!("XRANGE answers an array")
        };
        let text = |frame: &OwnedFrame| match frame {
            OwnedFrame::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            other => panic!("{other:?}"),
        };
        entries
            .iter()
            .map(|entry| match entry {
                OwnedFrame::Array(pair) => match &pair[1] {
                    OwnedFrame::Array(fields) => fields
                        .chunks(2)
                        .map(|kv| (text(&kv[0]), text(&kv[1])))
                        .collect(),
                    other => panic!("{other:?}"),
                },
                other => panic!("{other:?}"),
            })
            .collect()
    }

    /// Against `WEIR_REDIS_URL`: every order comes out once, with its user's profile
    /// (empty for users without one), and each user's total runs over their orders in
    /// order; an entry that is not an order is skipped and counted.
    #[test]
    fn every_order_comes_out_enriched_once_with_running_totals() {
        let Ok(url) = std::env::var(weir_net::redis::TEST_URL_VAR) else {
            eprintln!("note: skipped: WEIR_REDIS_URL is unset (scripts/test.sh sets it)");
            return;
        };
        let url: RedisUrl = url.parse().unwrap();
        let tag = format!("weir:test:stream_enrich:{}", std::process::id());
        let options = Options {
            url: url.clone(),
            input: format!("{tag}:in"),
            output: format!("{tag}:out"),
            orders: 3_000,
            follow: None,
        };
        let mut connection = BlockingConnection::connect(&url, Duration::from_secs(2)).unwrap();
        for stream in [&options.input, &options.output] {
            connection.command(&[b"DEL", stream.as_bytes()]).unwrap();
        }
        connection
            .command(&[
                b"XADD",
                options.input.as_bytes(),
                b"*",
                b"note",
                b"not an order",
            ])
            .unwrap();
        let summary = run(&options).expect("the job runs");
        assert_eq!(summary.read, 3_001);
        assert_eq!(summary.skipped, 1);
        assert_eq!(summary.written, 3_000);
        assert_eq!(summary.cache_hits + summary.cache_misses, 3_000);
        assert!(summary.cache_hits > 0);

        let out = entries(&url, &options.output);
        assert_eq!(out.len(), 3_000);
        let number = |e: &HashMap<String, String>, f: &str| e[f].parse::<u64>().unwrap();
        let mut seen = vec![false; 3_000];
        let mut totals: HashMap<u64, u64> = HashMap::new();
        for entry in &out {
            let order = number(entry, "order") as usize;
            assert!(
                !std::mem::replace(&mut seen[order], true),
                "order {order} twice"
            );
            let user = number(entry, "user");
            assert_eq!(user, (order as u64 * 7919) % (USERS + USERS / 10));
            if user < USERS {
                assert_eq!(entry["name"], format!("user-{user}"));
                assert!(!entry["country"].is_empty());
            } else {
                assert_eq!(entry["name"], "");
            }
            let total = totals.entry(user).or_default();
            *total += number(entry, "cents");
            assert_eq!(number(entry, "user_total"), *total, "user {user}");
        }
        for stream in [&options.input, &options.output] {
            connection.command(&[b"DEL", stream.as_bytes()]).unwrap();
        }
    }
}
