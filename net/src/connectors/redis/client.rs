//! The Redis client: an [`AsyncFunction`] whose lookups are commands pipelined on the
//! worker's own driver, over one or more connections.
//!
//! A call encodes its command into a connection's outbox and queues its
//! [`ResultFuture`] behind the replies it waits for; the task hands the outboxes to the
//! driver once per loop turn (many commands per send) and feeds received bytes back,
//! which are parsed in bulk and matched to the calls in order (Redis answers each
//! connection's commands in the order sent), completing them on the same thread.
//!
//! Batches are the batched async operator's: [`RedisBatchFunction`] hands each batch
//! the operator cuts to [`RedisClient::submit_batch`], whose `GET`s go as one `MGET`
//! (one command for the server to parse and dispatch instead of many); a lookup of
//! another kind in the batch goes as its own command between them, so replies keep the
//! order of the calls. There is no batching of the client's own.
//!
//! Connection set-up: a non-blocking connect registered with the driver at once (a
//! `crate::connect::Link`, as the lookup client's connections are), then `HELLO 3`
//! (with `AUTH` when the URL has credentials; RESP2 with `AUTH` where the server
//! refuses `HELLO` or the URL says `protocol=resp2`) and `SELECT`, all within
//! `connect_timeout` of the connect's start. Commands queued meanwhile wait and go once
//! the set-up succeeds.
//!
//! Failures, so that nothing hangs and the operator's timeouts and retries apply:
//! every call on a connection that is reset or closed, whose set-up fails or times
//! out, whose reply is malformed (not RESP, not what its command expects, longer than
//! `max_reply_bytes`, or nested deeper than [`REPLY_DEPTH_MAX`](crate::redis::REPLY_DEPTH_MAX)), whose server stays
//! silent for `request_timeout` while replies are due, or whose oldest command is not
//! answered whole within `response_timeout` of being sent, fails with a [`RedisError`]
//! and the connection is closed. The
//! connection is made again when calls wait for it: at once after a connection that
//! worked, then after a back-off that doubles from `backoff.initial` to `backoff.max`
//! while attempts keep failing. An error reply (`WRONGTYPE`...) fails only its call
//! (all of an `MGET`'s). A missing key or field is a value, `None`, not an error.
//!
//! Dropping the client (its task ended) shuts its connections down, so the server sees
//! them end even while the worker's driver lives on (see `crate::connect`).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use weir_engine::async_io::{AsyncError, AsyncFunction, ResultFuture};
use weir_engine::runtime::{ConnId, Driver, DriverEvent};

use super::error::RedisError;
use super::resp::{self, Parsed, Span};
use super::url::{Protocol, RedisUrl};
use crate::connect::Link;

/// Which lookup a request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// `GET key`: arguments are the key.
    Get,
    /// `HGET key field`: arguments are the key and the field.
    HGet,
    /// `HMGET key field...`: arguments are the key and one or more fields.
    HMGet,
}

impl Lookup {
    fn name(self) -> &'static str {
        match self {
            Lookup::Get => "GET",
            Lookup::HGet => "HGET",
            Lookup::HMGet => "HMGET",
        }
    }
}

/// The arguments a request writes: the key, then the fields.
#[derive(Debug, Default)]
pub struct Args {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Args {
    /// Appends an argument.
    pub fn push(&mut self, arg: &[u8]) {
        self.bytes.extend_from_slice(arg);
        self.ends.push(self.bytes.len());
    }

    /// Appends an argument written by `format_args!` (e.g. `"user:{id}"`), without an
    /// intermediate `String`.
    pub fn push_fmt(&mut self, args: std::fmt::Arguments<'_>) {
        use std::io::Write as _;
        // Writing into a Vec cannot fail.
        let _ = self.bytes.write_fmt(args);
        self.ends.push(self.bytes.len());
    }

    /// Arguments written.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether none was written.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Argument `i`.
    pub fn get(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start..self.ends[i]]
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }
}

/// The values of an `HMGET`, one per requested field, in order; `None` for a missing
/// field (or key).
#[derive(Debug, Clone, Copy)]
pub struct Fields<'a> {
    buffer: &'a [u8],
    spans: &'a [Option<Span>],
}

impl<'a> Fields<'a> {
    /// Fields answered.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Field `i`'s value.
    pub fn get(&self, i: usize) -> Option<&'a [u8]> {
        let buffer = self.buffer;
        self.spans
            .get(i)
            .copied()
            .flatten()
            .map(|(s, e)| &buffer[s..e])
    }

    /// The values in order.
    pub fn iter(&self) -> impl Iterator<Item = Option<&'a [u8]>> + '_ {
        (0..self.spans.len()).map(|i| self.get(i))
    }
}

/// What a lookup got back, borrowed from the receive buffer.
#[derive(Debug, Clone, Copy)]
pub enum Reply<'a> {
    /// `GET`, `HGET`: the value, `None` where the key (or field) is missing.
    Value(Option<&'a [u8]>),
    /// `HMGET`: the fields' values.
    Fields(Fields<'a>),
}

impl<'a> Reply<'a> {
    /// The value of a `GET` or `HGET`; the first field of an `HMGET`.
    pub fn value(&self) -> Option<&'a [u8]> {
        match self {
            Reply::Value(value) => *value,
            Reply::Fields(fields) => fields.get(0),
        }
    }
}

/// A lookup as the client sees it: the command's arguments, and how to build the
/// result from the reply.
pub trait RedisRequest: 'static {
    /// The result type.
    type Out: Send + 'static;
    /// Writes the arguments (the key, then any fields) into `args` and says which
    /// lookup this is. Wrong argument counts fail the call with
    /// [`RedisError::Request`].
    fn lookup(&self, args: &mut Args) -> Lookup;
    /// The result for a reply.
    fn complete(self, reply: Reply<'_>) -> Self::Out;
}

/// How long to wait before making a failed connection again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The wait after the first failed attempt; it doubles with each further one.
    pub initial: Duration,
    /// The longest wait.
    pub max: Duration,
}

/// Settings of a client.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// The server, credentials, database and protocol.
    pub url: RedisUrl,
    /// Connections per client (commands go round robin over those that are up).
    pub connections: usize,
    /// Calls outstanding at most (beyond: the call fails with
    /// [`RedisError::Overloaded`]).
    pub capacity: usize,
    /// Connect plus `HELLO`/`AUTH`/`SELECT` within this, or the attempt fails. (A
    /// connection with no set-up command, RESP2 without credentials on database 0, is
    /// used at once: the request timeout covers its connect.)
    pub connect_timeout: Duration,
    /// A connection with replies due that receives nothing this long is closed.
    pub request_timeout: Duration,
    /// Each command's reply must have arrived whole this long after the command was
    /// sent (handed to the driver), or the connection is closed and its calls fail with
    /// [`RedisError::ResponseTimeout`]: a bound on a command's round trip, as
    /// redis-rs's response timeout is, but one that also recycles the connection,
    /// because the replies of later commands queue behind the late one. It is what
    /// catches a server that keeps sending without finishing (a reply trickled a byte at
    /// a time resets the request timeout with every byte). Only the oldest command
    /// unanswered is checked: Redis answers in order. Commands that wait for the
    /// connection's set-up are sent, and timed, once it is ready.
    pub response_timeout: Duration,
    /// Reconnection back-off.
    pub backoff: Backoff,
    /// Largest reply buffered (a longer one is malformed: the connection closes).
    pub max_reply_bytes: usize,
}

/// The default [`RedisConfig::max_reply_bytes`]: 64 MiB.
///
/// A lookup's value is small (bytes to kilobytes), and a batch of lookups is a few
/// thousand of them; a reply is buffered whole before it is parsed, so this is also the
/// memory one connection to a broken or hostile server can hold. 64 MiB leaves room for
/// an `MGET` of 1024 values of 64 KiB; raise it for larger values (Redis's own limit
/// for one string is 512 MiB).
pub const MAX_REPLY_BYTES_DEFAULT: usize = 64 << 20;

impl RedisConfig {
    /// Defaults for `url`: one connection, 4096 calls outstanding, no batching, 1 s
    /// connect timeout, 5 s request timeout, 10 s response timeout (longer: the request
    /// timeout is the one that catches a silent server), back-off 10 ms doubling to 1 s,
    /// replies up to [`MAX_REPLY_BYTES_DEFAULT`] (64 MiB).
    pub fn new(url: RedisUrl) -> Self {
        RedisConfig {
            url,
            connections: 1,
            capacity: 4096,
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(10),
            backoff: Backoff {
                initial: Duration::from_millis(10),
                max: Duration::from_secs(1),
            },
            max_reply_bytes: MAX_REPLY_BYTES_DEFAULT,
        }
    }

    /// Checks the settings and resolves the server's address (blocking, once).
    pub fn check(&self) -> Result<SocketAddr, RedisError> {
        self.validate()?;
        Ok(self.url.resolve()?)
    }

    fn validate(&self) -> Result<(), RedisError> {
        let problem = if self.connections == 0 {
            Some("connections must be at least 1")
        } else if self.capacity == 0 {
            Some("capacity must be at least 1")
        } else if self.connect_timeout.is_zero()
            || self.request_timeout.is_zero()
            || self.response_timeout.is_zero()
        {
            Some("connect, request and response timeouts must be positive")
        } else if self.backoff.initial > self.backoff.max {
            Some("the initial back-off must not exceed the maximum")
        } else {
            None
        };
        match problem {
            Some(problem) => Err(RedisError::Config(problem.into())),
            None => Ok(()),
        }
    }
}

/// What a client did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RedisStats {
    /// Calls submitted.
    pub calls: u64,
    /// Commands sent (an `MGET` counts once).
    pub commands: u64,
    /// `MGET`s sent.
    pub batches: u64,
    /// Calls answered with a value.
    pub hits: u64,
    /// Calls answered with `None` (missing key).
    pub misses: u64,
    /// Calls answered with an error reply.
    pub errors: u64,
    /// Calls failed otherwise: connection loss, set-up failure, timeout, overload, bad
    /// request.
    pub failed: u64,
    /// Connections made (set-up started).
    pub connects: u64,
    /// Connections closed because of a malformed reply (one nested too deep or longer
    /// than `max_reply_bytes` included).
    pub malformed: u64,
}

/// Counters several clients (one per worker) add to, for a report during or after a
/// run; each client adds what changed once per flush.
#[derive(Debug, Default)]
pub struct SharedStats {
    /// See [`RedisStats`].
    pub calls: AtomicU64,
    /// See [`RedisStats`].
    pub commands: AtomicU64,
    /// See [`RedisStats`].
    pub batches: AtomicU64,
    /// See [`RedisStats`].
    pub hits: AtomicU64,
    /// See [`RedisStats`].
    pub misses: AtomicU64,
    /// See [`RedisStats`].
    pub errors: AtomicU64,
    /// See [`RedisStats`].
    pub failed: AtomicU64,
    /// See [`RedisStats`].
    pub connects: AtomicU64,
    /// See [`RedisStats`].
    pub malformed: AtomicU64,
}

impl SharedStats {
    /// The sums so far.
    pub fn snapshot(&self) -> RedisStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RedisStats {
            calls: get(&self.calls),
            commands: get(&self.commands),
            batches: get(&self.batches),
            hits: get(&self.hits),
            misses: get(&self.misses),
            errors: get(&self.errors),
            failed: get(&self.failed),
            connects: get(&self.connects),
            malformed: get(&self.malformed),
        }
    }

    fn add(&self, now: &RedisStats, before: &RedisStats) {
        let add = |a: &AtomicU64, n: u64, b: u64| {
            if n != b {
                a.fetch_add(n - b, Ordering::Relaxed);
            }
        };
        add(&self.calls, now.calls, before.calls);
        add(&self.commands, now.commands, before.commands);
        add(&self.batches, now.batches, before.batches);
        add(&self.hits, now.hits, before.hits);
        add(&self.misses, now.misses, before.misses);
        add(&self.errors, now.errors, before.errors);
        add(&self.failed, now.failed, before.failed);
        add(&self.connects, now.connects, before.connects);
        add(&self.malformed, now.malformed, before.malformed);
    }
}

/// A call waiting for its reply.
struct Call<R: RedisRequest> {
    request: R,
    result: ResultFuture<R::Out>,
}

/// The reply a connection waits for next, and how many calls it answers.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// `GET` or `HGET`: one value for one call.
    Value(Lookup),
    /// `HMGET` of `fields` fields for one call.
    Fields(u32),
    /// `MGET` of `keys` keys, one per call.
    Mget(u32),
}

impl Expect {
    fn calls(self) -> usize {
        match self {
            Expect::Value(_) | Expect::Fields(_) => 1,
            Expect::Mget(keys) => keys as usize,
        }
    }
}

/// A reply due on a connection.
#[derive(Debug, Clone, Copy)]
struct Due {
    expect: Expect,
    /// When its command was handed to the driver; [`UNSENT`] while it waits in the
    /// outbox.
    sent_ns: u64,
}

/// [`Due::sent_ns`] of a command not sent yet.
const UNSENT: u64 = u64::MAX;

/// A set-up command awaiting its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Hello,
    Auth,
    Select,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No connection; one is made once calls wait and `retry_at_ns` has come.
    Down,
    /// Registered with the driver, set-up under way since `since_ns`.
    SettingUp { id: ConnId, since_ns: u64 },
    /// Set up: commands flow.
    Ready { id: ConnId },
}

struct Connection<R: RedisRequest> {
    state: State,
    /// The socket of the state's connection (`link.id()` is its id), from `connect`
    /// until the connection fails: dropped then, which shuts the socket down (see
    /// `crate::connect`), and with the client. `None` while the state is `Down`, and
    /// where the state was set without a socket (unit tests).
    link: Option<Link>,
    /// Commands for when the connection is ready.
    outbox: Vec<u8>,
    /// Replies due, in order (commands sent, then those still in `outbox`: a suffix
    /// with `sent_ns == UNSENT`).
    expected: VecDeque<Due>,
    /// Calls in the order of the replies that answer them.
    calls: VecDeque<Call<R>>,
    /// Set-up replies due, before any in `expected`.
    setup: VecDeque<Step>,
    /// Set-up commands to send at the next flush.
    setup_out: Vec<u8>,
    /// The tail of a reply not yet whole.
    inbox: Vec<u8>,
    /// RESP3 grammar (after `HELLO 3`, and while its reply is due).
    resp3: bool,
    /// Whether anything arrived on this connection.
    heard: bool,
    /// Since when replies are due with nothing received.
    waiting_since_ns: u64,
    /// Failed attempts in a row.
    failures: u32,
    retry_at_ns: u64,
}

impl<R: RedisRequest> Connection<R> {
    fn new() -> Self {
        Connection {
            state: State::Down,
            link: None,
            outbox: Vec::new(),
            expected: VecDeque::new(),
            calls: VecDeque::new(),
            setup: VecDeque::new(),
            setup_out: Vec::new(),
            inbox: Vec::new(),
            resp3: false,
            heard: false,
            waiting_since_ns: 0,
            failures: 0,
            retry_at_ns: 0,
        }
    }

    fn id(&self) -> Option<ConnId> {
        match self.state {
            State::Down => None,
            State::SettingUp { id, .. } | State::Ready { id } => Some(id),
        }
    }
}

/// The `GET`s of the current turn, for one `MGET`.
struct Batch<R: RedisRequest> {
    /// The keys as RESP bulk strings.
    keys: Vec<u8>,
    calls: Vec<Call<R>>,
}

/// See the module docs. Shared (through `Rc<RefCell<_>>`) between the
/// [`RedisFunction`] inside the operator and the task that drives the I/O.
pub struct RedisClient<R: RedisRequest> {
    config: RedisConfig,
    addr: SocketAddr,
    peer: String,
    connections: Vec<Connection<R>>,
    next: usize,
    batch: Batch<R>,
    args: Args,
    outstanding: usize,
    now_ns: u64,
    to_close: Vec<ConnId>,
    /// The links of the connections in `to_close`, kept open until the driver closes
    /// their ids: shut down earlier, the driver could see them end, free their ids and
    /// hand them to another connection before the flush closes "them".
    closing_links: Vec<Link>,
    stats: RedisStats,
    shared: Option<(Arc<SharedStats>, RedisStats)>,
}

impl<R: RedisRequest> RedisClient<R> {
    /// A client; it resolves the host now and connects when the first call waits.
    pub fn new(config: RedisConfig) -> Result<Self, RedisError> {
        let addr = config.check()?;
        Self::with_addr(config, addr)
    }

    /// A client of the server at `addr` (the URL's host resolved already, e.g. by
    /// [`RedisConfig::check`], so that clients made on workers do not resolve again).
    pub fn with_addr(config: RedisConfig, addr: SocketAddr) -> Result<Self, RedisError> {
        config.validate()?;
        Ok(RedisClient {
            peer: addr.to_string(),
            addr,
            connections: (0..config.connections).map(|_| Connection::new()).collect(),
            next: 0,
            batch: Batch {
                keys: Vec::new(),
                calls: Vec::new(),
            },
            args: Args::default(),
            outstanding: 0,
            now_ns: 0,
            to_close: Vec::new(),
            closing_links: Vec::new(),
            stats: RedisStats::default(),
            shared: None,
            config,
        })
    }

    /// Also adds this client's counters to `shared` (at each flush).
    pub fn with_shared_stats(mut self, shared: Arc<SharedStats>) -> Self {
        self.shared = Some((shared, RedisStats::default()));
        self
    }

    /// Counters.
    pub fn stats(&self) -> RedisStats {
        self.stats
    }

    /// Calls waiting for their reply (or for their `MGET` to be sent).
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Starts the lookup `request`; its outcome completes `result`.
    pub fn submit(&mut self, request: R, result: ResultFuture<R::Out>) {
        let Some((call, lookup)) = self.admit(request, result) else {
            return;
        };
        self.send_one(call, lookup);
    }

    /// Starts the lookups of one batch the caller cut (e.g. [`RedisBatchFunction`]):
    /// their `GET`s go as one `MGET` (a `GET` if there is one); other lookups go as
    /// their own commands, in order between them. Each outcome completes its request's
    /// handle.
    pub fn submit_batch(&mut self, calls: impl IntoIterator<Item = (R, ResultFuture<R::Out>)>) {
        for (request, result) in calls {
            let Some((call, lookup)) = self.admit(request, result) else {
                continue;
            };
            if lookup == Lookup::Get {
                resp::push_bulk(&mut self.batch.keys, self.args.get(0));
                self.batch.calls.push(call);
            } else {
                self.send_one(call, lookup);
            }
        }
        self.seal_batch();
    }

    /// Checks `request` (capacity, arity), writing its arguments into `self.args`;
    /// `None` when it was refused (its handle failed with the reason).
    fn admit(&mut self, request: R, result: ResultFuture<R::Out>) -> Option<(Call<R>, Lookup)> {
        if self.outstanding >= self.config.capacity {
            self.stats.failed += 1;
            result.complete_err(AsyncError::call(RedisError::Overloaded {
                outstanding: self.outstanding,
                capacity: self.config.capacity,
            }));
            return None;
        }
        self.args.clear();
        let lookup = request.lookup(&mut self.args);
        let arity_ok = match lookup {
            Lookup::Get => self.args.len() == 1,
            Lookup::HGet => self.args.len() == 2,
            Lookup::HMGet => self.args.len() >= 2,
        };
        if !arity_ok {
            self.stats.failed += 1;
            let wanted = match lookup {
                Lookup::Get => "a key",
                Lookup::HGet => "a key and a field",
                Lookup::HMGet => "a key and at least one field",
            };
            result.complete_err(AsyncError::call(RedisError::Request(format!(
                "{} takes {wanted}, the request wrote {} arguments",
                lookup.name(),
                self.args.len()
            ))));
            return None;
        }
        self.stats.calls += 1;
        self.outstanding += 1;
        Some((Call { request, result }, lookup))
    }

    /// Sends one call's command (its arguments in `self.args`), after the open batch
    /// (within [`submit_batch`](Self::submit_batch)).
    fn send_one(&mut self, call: Call<R>, lookup: Lookup) {
        // Commands keep the order of the calls: an open batch goes first.
        self.seal_batch();
        let index = self.pick();
        let connection = &mut self.connections[index];
        let args = &self.args;
        resp::push_header(&mut connection.outbox, b'*', args.len() + 1);
        resp::push_bulk(&mut connection.outbox, lookup.name().as_bytes());
        for i in 0..args.len() {
            resp::push_bulk(&mut connection.outbox, args.get(i));
        }
        let expect = match lookup {
            Lookup::Get | Lookup::HGet => Expect::Value(lookup),
            Lookup::HMGet => Expect::Fields((args.len() - 1) as u32),
        };
        Self::expect(connection, expect, call, self.now_ns);
        self.stats.commands += 1;
    }

    fn expect(connection: &mut Connection<R>, expect: Expect, call: Call<R>, now_ns: u64) {
        if connection.expected.is_empty() {
            connection.waiting_since_ns = now_ns;
        }
        connection.expected.push_back(Due {
            expect,
            sent_ns: UNSENT,
        });
        connection.calls.push_back(call);
    }

    /// The next connection round robin, preferring one that is ready.
    fn pick(&mut self) -> usize {
        let count = self.connections.len();
        let ready = (0..count)
            .map(|k| (self.next + k) % count)
            .find(|&i| matches!(self.connections[i].state, State::Ready { .. }));
        let index = ready.unwrap_or(self.next);
        self.next = (index + 1) % count;
        index
    }

    /// Encodes the open batch as one `MGET` (a `GET` if it has one key).
    fn seal_batch(&mut self) {
        let keys = self.batch.calls.len();
        if keys == 0 {
            return;
        }
        let index = self.pick();
        let connection = &mut self.connections[index];
        resp::push_header(&mut connection.outbox, b'*', keys + 1);
        if keys == 1 {
            resp::push_bulk(&mut connection.outbox, b"GET");
        } else {
            resp::push_bulk(&mut connection.outbox, b"MGET");
            self.stats.batches += 1;
        }
        connection.outbox.extend_from_slice(&self.batch.keys);
        self.batch.keys.clear();
        if connection.expected.is_empty() {
            connection.waiting_since_ns = self.now_ns;
        }
        connection.expected.push_back(Due {
            expect: if keys == 1 {
                Expect::Value(Lookup::Get)
            } else {
                Expect::Mget(keys as u32)
            },
            sent_ns: UNSENT,
        });
        connection.calls.extend(self.batch.calls.drain(..));
        self.stats.commands += 1;
    }

    /// Hands queued commands to `driver`: closes what was marked for closing, makes
    /// connections that calls wait for, sends set-up commands and, on ready
    /// connections, the outboxes; fails connections past their timeouts.
    pub fn flush(&mut self, driver: &mut dyn Driver, now_ns: u64) {
        self.now_ns = now_ns;
        for id in self.to_close.drain(..) {
            driver.close(id);
        }
        // Closed through the driver: now their sockets may be shut down.
        self.closing_links.clear();
        for index in 0..self.connections.len() {
            let connection = &mut self.connections[index];
            match connection.state {
                State::Down => {
                    if !connection.calls.is_empty() && now_ns >= connection.retry_at_ns {
                        self.connect(index, driver);
                    }
                }
                State::SettingUp { since_ns, .. } => {
                    if now_ns.saturating_sub(since_ns)
                        > self.config.connect_timeout.as_nanos() as u64
                    {
                        let error = RedisError::ConnectTimeout {
                            addr: self.peer.clone(),
                            timeout: self.config.connect_timeout,
                        };
                        self.fail_connection(index, &error, true);
                    }
                }
                State::Ready { .. } => {
                    let oldest_sent_ns = connection.expected.front().map(|due| due.sent_ns);
                    if !connection.expected.is_empty()
                        && now_ns.saturating_sub(connection.waiting_since_ns)
                            > self.config.request_timeout.as_nanos() as u64
                    {
                        let error = RedisError::Timeout {
                            addr: self.peer.clone(),
                            timeout: self.config.request_timeout,
                        };
                        self.fail_connection(index, &error, true);
                    } else if oldest_sent_ns.is_some_and(|sent_ns| {
                        sent_ns != UNSENT
                            && now_ns.saturating_sub(sent_ns)
                                > self.config.response_timeout.as_nanos() as u64
                    }) {
                        let error = RedisError::ResponseTimeout {
                            addr: self.peer.clone(),
                            timeout: self.config.response_timeout,
                        };
                        self.fail_connection(index, &error, true);
                    }
                }
            }
            let connection = &mut self.connections[index];
            match connection.state {
                State::SettingUp { id, .. } if !connection.setup_out.is_empty() => {
                    driver.send(id, &mut connection.setup_out);
                }
                State::Ready { id } => {
                    if !connection.outbox.is_empty() {
                        driver.send(id, &mut connection.outbox);
                    }
                    // The unsent replies are a suffix; their commands went just now.
                    for due in connection.expected.iter_mut().rev() {
                        if due.sent_ns != UNSENT {
                            break;
                        }
                        due.sent_ns = now_ns;
                    }
                }
                _ => {}
            }
        }
        for id in self.to_close.drain(..) {
            driver.close(id);
        }
        // Closed through the driver: now their sockets may be shut down.
        self.closing_links.clear();
        if let Some((shared, published)) = self.shared.as_mut() {
            if *published != self.stats {
                shared.add(&self.stats, published);
                *published = self.stats;
            }
        }
    }

    /// When the client next needs a flush without any I/O: a reconnection attempt, a
    /// connect timeout, a request or a response timeout (by the flush clock).
    pub fn next_deadline(&self) -> Option<u64> {
        let nanos = |d: Duration| d.as_nanos() as u64;
        self.connections
            .iter()
            .filter_map(|c| match c.state {
                State::Down => (!c.calls.is_empty()).then_some(c.retry_at_ns),
                State::SettingUp { since_ns, .. } => {
                    Some(since_ns + nanos(self.config.connect_timeout) + 1)
                }
                State::Ready { .. } => {
                    let oldest = c.expected.front()?;
                    let silence = c.waiting_since_ns + nanos(self.config.request_timeout) + 1;
                    let response = match oldest.sent_ns {
                        // Sent at the next flush, which comes without a deadline.
                        UNSENT => u64::MAX,
                        sent_ns => sent_ns.saturating_add(nanos(self.config.response_timeout) + 1),
                    };
                    Some(silence.min(response))
                }
            })
            .min()
    }

    /// Starts connection `index`: a non-blocking connect handed to the driver, the
    /// set-up commands queued behind it (the driver sends them once connected). The
    /// set-up is timed from now (`connect_timeout`), the connect included.
    fn connect(&mut self, index: usize, driver: &mut dyn Driver) {
        assert_eq!(self.connections[index].state, State::Down);
        assert!(
            self.connections[index].link.is_none(),
            "a failed connection drops its link"
        );
        let id = match Link::open(self.addr, driver, self.now_ns) {
            Ok(link) => {
                let id = link.id();
                self.connections[index].link = Some(link);
                id
            }
            Err(source) => {
                let error = RedisError::Connect {
                    addr: self.peer.clone(),
                    source,
                };
                self.fail_connection(index, &error, false);
                return;
            }
        };
        self.stats.connects += 1;
        let url = &self.config.url;
        let connection = &mut self.connections[index];
        connection.inbox.clear();
        connection.heard = false;
        connection.setup.clear();
        connection.setup_out.clear();
        if url.protocol == Protocol::Resp2 {
            connection.resp3 = false;
            queue_auth(connection, url);
            queue_select(connection, url);
        } else {
            connection.resp3 = true;
            let mut args: Vec<&[u8]> = vec![b"HELLO", b"3"];
            if let Some(password) = &url.password {
                args.push(b"AUTH");
                args.push(url.user.as_deref().unwrap_or("default").as_bytes());
                args.push(password.as_bytes());
            }
            resp::encode_command(&mut connection.setup_out, &args);
            connection.setup.push_back(Step::Hello);
        }
        connection.state = if connection.setup.is_empty() {
            connection.failures = 0;
            connection.waiting_since_ns = self.now_ns;
            State::Ready { id }
        } else {
            State::SettingUp {
                id,
                since_ns: self.now_ns,
            }
        };
    }

    /// Takes a driver event for one of this client's connections; returns whether it was.
    pub fn on_event(&mut self, event: &DriverEvent<'_>) -> bool {
        let (conn, received) = match event {
            DriverEvent::Received { conn, bytes } => (*conn, Some(*bytes)),
            DriverEvent::Closed { conn, .. } => (*conn, None),
        };
        let Some(index) = self.connections.iter().position(|c| c.id() == Some(conn)) else {
            return false;
        };
        match received {
            Some(bytes) => self.receive(index, bytes),
            None => {
                let connection = &self.connections[index];
                let reason = match event {
                    DriverEvent::Closed {
                        error: Some(error), ..
                    } => Some(error),
                    _ => None,
                };
                let error = RedisError::connection_closed(
                    &self.peer,
                    connection.calls.len(),
                    matches!(connection.state, State::SettingUp { .. }),
                    connection.heard,
                    reason,
                );
                self.fail_connection(index, &error, false);
            }
        }
        true
    }

    /// Parses every whole reply in `bytes` (after any tail kept from before) and
    /// completes the calls they answer.
    fn receive(&mut self, index: usize, bytes: &[u8]) {
        self.connections[index].heard = true;
        self.connections[index].waiting_since_ns = self.now_ns;
        let mut inbox = std::mem::take(&mut self.connections[index].inbox);
        let buffered = !inbox.is_empty();
        if buffered {
            inbox.extend_from_slice(bytes);
        }
        let data: &[u8] = if buffered { &inbox } else { bytes };
        let mut offset = 0;
        let mut failure = None;
        while offset < data.len() {
            let resp3 = self.connections[index].resp3;
            match resp::decode(&data[offset..], resp3) {
                Ok(Some((reply, used))) => {
                    let frame = &data[offset..offset + used];
                    offset += used;
                    if let Err(error) = self.on_reply(index, reply, frame) {
                        failure = Some(error);
                        break;
                    }
                }
                Ok(None) => break,
                Err(refused) => {
                    failure = Some(refused.into_error(&self.peer));
                    break;
                }
            }
        }
        if failure.is_none() && data.len() - offset > self.config.max_reply_bytes {
            failure = Some(resp::reply_too_long(
                &self.peer,
                self.config.max_reply_bytes,
            ));
        }
        if let Some(error) = failure {
            if matches!(
                error,
                RedisError::Malformed { .. } | RedisError::TooDeep { .. }
            ) {
                self.stats.malformed += 1;
                eprintln!("weir redis client: {error}");
            }
            self.fail_connection(index, &error, true);
            return;
        }
        if buffered {
            inbox.drain(..offset);
        } else {
            inbox.extend_from_slice(&bytes[offset..]);
        }
        self.connections[index].inbox = inbox;
    }

    /// Applies one reply; an `Err` closes the connection with that error.
    fn on_reply(&mut self, index: usize, reply: Parsed, frame: &[u8]) -> Result<(), RedisError> {
        if reply == Parsed::Push {
            return Ok(());
        }
        if let Some(step) = self.connections[index].setup.pop_front() {
            return self.on_setup_reply(index, step, reply, frame);
        }
        let malformed = |reason: String| RedisError::Malformed {
            addr: self.peer.clone(),
            reason,
        };
        let connection = &mut self.connections[index];
        let Some(Due { expect, .. }) = connection.expected.pop_front() else {
            return Err(malformed("a reply to no command".into()));
        };
        if connection.calls.len() < expect.calls() {
            return Err(malformed("more replies than calls".into()));
        }
        match (expect, reply) {
            (Expect::Value(_), Parsed::Bytes((s, e))) => {
                self.stats.hits += 1;
                self.answer(index, Reply::Value(Some(&frame[s..e])));
            }
            (Expect::Value(_), Parsed::Nil) => {
                self.stats.misses += 1;
                self.answer(index, Reply::Value(None));
            }
            (Expect::Fields(fields), Parsed::Array(spans)) if spans.len() == fields as usize => {
                self.stats.hits += 1;
                self.answer(
                    index,
                    Reply::Fields(Fields {
                        buffer: frame,
                        spans: &spans,
                    }),
                );
            }
            (Expect::Fields(_), Parsed::Nil) => {
                // RESP3 servers may answer an HMGET of a missing key with nil.
                self.stats.misses += 1;
                self.answer(index, Reply::Value(None));
            }
            (Expect::Mget(keys), Parsed::Array(spans)) if spans.len() == keys as usize => {
                for span in spans {
                    let value = span.map(|(s, e)| &frame[s..e]);
                    if value.is_some() {
                        self.stats.hits += 1;
                    } else {
                        self.stats.misses += 1;
                    }
                    self.answer(index, Reply::Value(value));
                }
            }
            (expect, Parsed::Error(span)) => {
                let command = match expect {
                    Expect::Value(lookup) => lookup.name(),
                    Expect::Fields(_) => "HMGET",
                    Expect::Mget(_) => "MGET",
                };
                let message = resp::text(frame, span);
                for _ in 0..expect.calls() {
                    self.stats.errors += 1;
                    self.fail_call(
                        index,
                        RedisError::Server {
                            command: command.into(),
                            message: message.clone(),
                        },
                    );
                }
            }
            (expect, reply) => {
                let wanted = match expect {
                    Expect::Value(lookup) => format!("{} expects a string or nil", lookup.name()),
                    Expect::Fields(n) => format!("HMGET of {n} fields expects {n} values"),
                    Expect::Mget(n) => format!("MGET of {n} keys expects {n} values"),
                };
                let got = match reply {
                    Parsed::Array(items) => format!("an array of {}", items.len()),
                    Parsed::Bytes(_) => "a string".into(),
                    Parsed::Nil => "nil".into(),
                    Parsed::Map => "a map".into(),
                    Parsed::Other(what) => what.into(),
                    Parsed::Error(_) | Parsed::Push => "an unexpected frame".into(),
                };
                return Err(malformed(format!("{wanted}, got {got}")));
            }
        }
        Ok(())
    }

    fn answer(&mut self, index: usize, reply: Reply<'_>) {
        if let Some(call) = self.connections[index].calls.pop_front() {
            self.outstanding -= 1;
            call.result.complete_one(call.request.complete(reply));
        }
    }

    fn fail_call(&mut self, index: usize, error: RedisError) {
        if let Some(call) = self.connections[index].calls.pop_front() {
            self.outstanding -= 1;
            call.result.complete_err(AsyncError::call(error));
        }
    }

    fn on_setup_reply(
        &mut self,
        index: usize,
        step: Step,
        reply: Parsed,
        frame: &[u8],
    ) -> Result<(), RedisError> {
        let url = &self.config.url;
        let addr = self.peer.clone();
        let connection = &mut self.connections[index];
        match (step, reply) {
            (Step::Hello, Parsed::Map) | (Step::Hello, Parsed::Array(_)) => {
                connection.resp3 = true;
                queue_select(connection, url);
            }
            (Step::Hello, Parsed::Error(span)) => {
                let message = resp::text(frame, span);
                let unknown = message.starts_with("NOPROTO")
                    || message.to_ascii_lowercase().contains("unknown command");
                if !unknown {
                    return Err(RedisError::Auth { addr, message });
                }
                if url.protocol == Protocol::Resp3 {
                    return Err(RedisError::Protocol { addr, message });
                }
                // A server without RESP3: RESP2, credentials through AUTH.
                connection.resp3 = false;
                queue_auth(connection, url);
                queue_select(connection, url);
            }
            (Step::Auth, Parsed::Bytes(_)) | (Step::Select, Parsed::Bytes(_)) => {}
            (Step::Auth, Parsed::Error(span)) => {
                let message = resp::text(frame, span);
                return Err(RedisError::Auth { addr, message });
            }
            (Step::Select, Parsed::Error(span)) => {
                let message = resp::text(frame, span);
                return Err(RedisError::Select {
                    addr,
                    db: url.db,
                    message,
                });
            }
            (step, _) => {
                return Err(RedisError::Malformed {
                    addr,
                    reason: format!("unexpected reply to the set-up's {step:?}"),
                })
            }
        }
        if connection.setup.is_empty() {
            if let State::SettingUp { id, .. } = connection.state {
                connection.state = State::Ready { id };
                connection.failures = 0;
                connection.waiting_since_ns = self.now_ns;
            }
        }
        Ok(())
    }

    /// Fails every call waiting on connection `index` with `error`, forgets its
    /// commands, and schedules the next attempt. `close`: the client closes the
    /// connection (the driver did not).
    fn fail_connection(&mut self, index: usize, error: &RedisError, close: bool) {
        let connection = &mut self.connections[index];
        if close {
            if let Some(id) = connection.id() {
                self.to_close.push(id);
            }
            // To be closed at the next flush, through the driver: its link (and so the
            // socket) stays until then, so the driver cannot see it end and reuse its
            // id first.
            if let Some(link) = connection.link.take() {
                self.closing_links.push(link);
            }
        }
        // The connection ended (the driver closed it): the link goes now, shutting the
        // socket down, so its second descriptor does not outlive the driver's.
        connection.link = None;
        let backoff = self.config.backoff;
        let delay = match connection.failures {
            0 => Duration::ZERO,
            n => backoff
                .initial
                .saturating_mul(1u32 << (n - 1).min(20))
                .min(backoff.max),
        };
        connection.failures = connection.failures.saturating_add(1);
        connection.retry_at_ns = self.now_ns + delay.as_nanos() as u64;
        connection.state = State::Down;
        connection.outbox.clear();
        connection.expected.clear();
        connection.setup.clear();
        connection.setup_out.clear();
        connection.inbox.clear();
        let calls = std::mem::take(&mut connection.calls);
        self.outstanding -= calls.len();
        self.stats.failed += calls.len() as u64;
        for call in calls {
            call.result
                .complete_err(AsyncError::call(error.duplicate()));
        }
    }
}

fn queue_auth(connection: &mut Connection<impl RedisRequest>, url: &RedisUrl) {
    if let Some(password) = &url.password {
        match &url.user {
            Some(user) => resp::encode_command(
                &mut connection.setup_out,
                &[b"AUTH", user.as_bytes(), password.as_bytes()],
            ),
            None => {
                resp::encode_command(&mut connection.setup_out, &[b"AUTH", password.as_bytes()])
            }
        }
        connection.setup.push_back(Step::Auth);
    }
}

fn queue_select(connection: &mut Connection<impl RedisRequest>, url: &RedisUrl) {
    if url.db != 0 {
        let db = url.db.to_string();
        resp::encode_command(&mut connection.setup_out, &[b"SELECT", db.as_bytes()]);
        connection.setup.push_back(Step::Select);
    }
}

/// The [`AsyncFunction`] side of a [`RedisClient`].
pub struct RedisFunction<R: RedisRequest> {
    client: std::rc::Rc<std::cell::RefCell<RedisClient<R>>>,
}

impl<R: RedisRequest> RedisFunction<R> {
    /// A function submitting to `client`.
    pub fn new(client: std::rc::Rc<std::cell::RefCell<RedisClient<R>>>) -> Self {
        RedisFunction { client }
    }
}

impl<R: RedisRequest + Clone> AsyncFunction for RedisFunction<R> {
    type In = R;
    type Out = R::Out;

    fn invoke(&mut self, input: &R, result: ResultFuture<R::Out>) {
        self.client.borrow_mut().submit(input.clone(), result);
    }
}

/// The [`AsyncBatchFunction`](weir_engine::async_io::AsyncBatchFunction) side of a
/// [`RedisClient`]: each batch the operator cuts goes as one `MGET` of its `GET`s
/// ([`RedisClient::submit_batch`]). With a batch timeout of 0 a batch is the records a
/// task took in one turn, up to `max_batch_size`.
///
/// Which wins where (`weir compare redis`: one worker, one connection, `GET`s of
/// 100-byte values from 100,000 keys, server on the other core of a 2-core VM): with 1
/// lookup in flight the two are the same (a batch of one key goes as a `GET`); with 16
/// in flight `MGET` is 1.0–1.1× plain pipelining; with 256, 1.4–1.5×; with 1024,
/// 1.5–1.6×. The server's work per key is what `MGET` saves: one command to parse and
/// dispatch instead of many.
///
/// Keep it off against a Redis Cluster (an `MGET`'s keys must share a hash slot) and
/// where a key may hold something else than a string: `GET` of a hash fails with
/// `WRONGTYPE`, while `MGET` answers nil for it, a miss.
pub struct RedisBatchFunction<R: RedisRequest> {
    client: std::rc::Rc<std::cell::RefCell<RedisClient<R>>>,
}

impl<R: RedisRequest> RedisBatchFunction<R> {
    /// A batch function submitting to `client`.
    pub fn new(client: std::rc::Rc<std::cell::RefCell<RedisClient<R>>>) -> Self {
        RedisBatchFunction { client }
    }
}

impl<R: RedisRequest + Clone> weir_engine::async_io::AsyncBatchFunction for RedisBatchFunction<R> {
    type In = R;
    type Out = R::Out;

    fn invoke_batch(&mut self, inputs: &[R], result: weir_engine::async_io::BatchResult<R::Out>) {
        let handles = result.into_handles();
        self.client
            .borrow_mut()
            .submit_batch(inputs.iter().cloned().zip(handles));
    }
}

/// Connects a shared [`RedisClient`] to its task's worker driver.
pub struct RedisIo<R: RedisRequest>(pub std::rc::Rc<std::cell::RefCell<RedisClient<R>>>);

impl<R: RedisRequest> weir_engine::graph::IoHandler for RedisIo<R> {
    fn flush(&mut self, driver: &mut dyn Driver, now_ns: u64) {
        self.0.borrow_mut().flush(driver, now_ns);
    }

    fn on_event(&mut self, event: &DriverEvent<'_>) -> bool {
        self.0.borrow_mut().on_event(event)
    }

    fn next_deadline(&self) -> Option<u64> {
        self.0.borrow().next_deadline()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;
    use weir_engine::async_io::{AsyncConfig, AsyncHarness, OperatorError, OutputMode};

    /// A test lookup: GET of `k{n}`, HGET/HMGET of fields of `h{n}`, or a request with
    /// the wrong argument count.
    #[derive(Debug, Clone)]
    enum Req {
        Get(u64),
        HGet(u64, &'static str),
        HMGet(u64, Vec<&'static str>),
        NoKey,
    }

    impl RedisRequest for Req {
        type Out = (String, Vec<Option<Vec<u8>>>);
        fn lookup(&self, args: &mut Args) -> Lookup {
            match self {
                Req::Get(n) => {
                    args.push_fmt(format_args!("k{n}"));
                    Lookup::Get
                }
                Req::HGet(n, field) => {
                    args.push_fmt(format_args!("h{n}"));
                    args.push(field.as_bytes());
                    Lookup::HGet
                }
                Req::HMGet(n, fields) => {
                    args.push_fmt(format_args!("h{n}"));
                    for field in fields {
                        args.push(field.as_bytes());
                    }
                    Lookup::HMGet
                }
                Req::NoKey => Lookup::Get,
            }
        }
        fn complete(self, reply: Reply<'_>) -> Self::Out {
            let values = match reply {
                Reply::Value(value) => vec![value.map(<[u8]>::to_vec)],
                Reply::Fields(fields) => fields.iter().map(|v| v.map(<[u8]>::to_vec)).collect(),
            };
            (format!("{self:?}"), values)
        }
    }

    type Shared = Rc<RefCell<RedisClient<Req>>>;

    fn config() -> RedisConfig {
        let mut config = RedisConfig::new("redis://127.0.0.1:9".parse().expect("url"));
        config.capacity = 64;
        config
    }

    /// A client whose connection 0 is set up (id 7), and an ordered operator on it.
    fn ready() -> (Shared, AsyncHarness<RedisFunction<Req>>) {
        let client = Rc::new(RefCell::new(RedisClient::new(config()).expect("client")));
        client.borrow_mut().connections[0].state = State::Ready { id: 7 };
        let harness = AsyncHarness::new(
            RedisFunction::new(Rc::clone(&client)),
            AsyncConfig::new(OutputMode::Ordered, 32),
        )
        .expect("harness");
        (client, harness)
    }

    /// What the client would send now.
    fn sent(client: &Shared) -> Vec<u8> {
        let mut client = client.borrow_mut();
        std::mem::take(&mut client.connections[0].outbox)
    }

    fn outputs(
        harness: &mut AsyncHarness<RedisFunction<Req>>,
    ) -> Vec<(String, Vec<Option<Vec<u8>>>)> {
        harness.run_mailbox().expect("no failure");
        harness
            .take_output()
            .into_iter()
            .filter_map(|e| e.as_record().map(|r| r.value.clone()))
            .collect()
    }

    fn redis_error(error: OperatorError) -> RedisError {
        match error {
            OperatorError::Async(AsyncError::Call(inner)) => match inner.downcast::<RedisError>() {
                Ok(redis) => *redis,
                Err(other) => panic!("not a RedisError: {other}"),
            },
            other => panic!("not a call error: {other}"),
        }
    }

    /// What the tests' five replies hold: a value, a miss, a value, an empty value, a
    /// value.
    fn five_values() -> Vec<Option<Vec<u8>>> {
        vec![
            Some(b"v0".to_vec()),
            None,
            Some(b"v2".to_vec()),
            Some(Vec::new()),
            Some(b"v4".to_vec()),
        ]
    }

    #[test]
    fn gets_are_pipelined_and_matched_in_order_at_any_split() {
        for split in [1, 2, 5, 13, 1000] {
            let (client, mut harness) = ready();
            for n in 0..5 {
                harness.process_record(Req::Get(n), None).expect("submit");
            }
            let wire = sent(&client);
            assert_eq!(
                String::from_utf8_lossy(&wire),
                "*2\r\n$3\r\nGET\r\n$2\r\nk0\r\n*2\r\n$3\r\nGET\r\n$2\r\nk1\r\n*2\r\n$3\r\nGET\r\n$2\r\nk2\r\n*2\r\n$3\r\nGET\r\n$2\r\nk3\r\n*2\r\n$3\r\nGET\r\n$2\r\nk4\r\n"
            );
            let replies: &[u8] = b"$2\r\nv0\r\n$-1\r\n$2\r\nv2\r\n$0\r\n\r\n$2\r\nv4\r\n";
            for chunk in replies.chunks(split) {
                client.borrow_mut().receive(0, chunk);
            }
            let values: Vec<Option<Vec<u8>>> = outputs(&mut harness)
                .into_iter()
                .map(|(_, v)| v[0].clone())
                .collect();
            assert_eq!(values, five_values(), "split {split}");
            let stats = client.borrow().stats();
            assert_eq!((stats.hits, stats.misses, stats.calls), (4, 1, 5));
            assert_eq!(client.borrow().outstanding(), 0);
        }
    }

    /// A batched operator over the client: batches of up to `max_batch_size` records,
    /// cut at the end of each turn (the harness's timer pass).
    fn batched(
        max_batch_size: usize,
    ) -> (
        Shared,
        AsyncHarness<weir_engine::async_io::Batched<RedisBatchFunction<Req>>>,
    ) {
        use weir_engine::async_io::{BatchConfig, Batched};
        let client = Rc::new(RefCell::new(RedisClient::new(config()).expect("client")));
        client.borrow_mut().connections[0].state = State::Ready { id: 7 };
        let harness = AsyncHarness::new(
            Batched::new(
                RedisBatchFunction::new(Rc::clone(&client)),
                BatchConfig::new(max_batch_size, std::time::Duration::ZERO),
            ),
            AsyncConfig::new(OutputMode::Ordered, 32),
        )
        .expect("harness");
        (client, harness)
    }

    #[test]
    fn a_batch_s_gets_go_as_mgets_matched_in_order_at_any_split() {
        for split in [1, 2, 5, 13, 1000] {
            let (client, mut harness) = batched(3);
            for n in 0..5 {
                harness.process_record(Req::Get(n), None).expect("submit");
            }
            harness
                .advance_time(std::time::Duration::ZERO)
                .expect("cut");
            let wire = sent(&client);
            assert_eq!(
                String::from_utf8_lossy(&wire),
                "*4\r\n$4\r\nMGET\r\n$2\r\nk0\r\n$2\r\nk1\r\n$2\r\nk2\r\n*3\r\n$4\r\nMGET\r\n$2\r\nk3\r\n$2\r\nk4\r\n"
            );
            let replies: &[u8] =
                b"*3\r\n$2\r\nv0\r\n$-1\r\n$2\r\nv2\r\n*2\r\n$0\r\n\r\n$2\r\nv4\r\n";
            for chunk in replies.chunks(split) {
                client.borrow_mut().receive(0, chunk);
            }
            let values: Vec<Option<Vec<u8>>> = outputs_of(&mut harness)
                .into_iter()
                .map(|(_, v)| v[0].clone())
                .collect();
            assert_eq!(values, five_values(), "split {split}");
            let stats = client.borrow().stats();
            assert_eq!(
                (stats.hits, stats.misses, stats.calls, stats.batches),
                (4, 1, 5, 2)
            );
            assert_eq!(client.borrow().outstanding(), 0);
        }
    }

    #[test]
    fn other_lookups_in_a_batch_go_between_its_mgets_so_replies_keep_their_order() {
        let (client, mut harness) = batched(100);
        harness.process_record(Req::Get(1), None).expect("submit");
        harness.process_record(Req::Get(2), None).expect("submit");
        harness
            .process_record(Req::HGet(3, "f"), None)
            .expect("submit");
        harness.process_record(Req::Get(4), None).expect("submit");
        harness
            .process_record(Req::HMGet(5, vec!["a", "b", "c"]), None)
            .expect("submit");
        harness
            .advance_time(std::time::Duration::ZERO)
            .expect("cut");
        let wire = sent(&client);
        assert_eq!(
            String::from_utf8_lossy(&wire),
            "*3\r\n$4\r\nMGET\r\n$2\r\nk1\r\n$2\r\nk2\r\n*3\r\n$4\r\nHGET\r\n$2\r\nh3\r\n$1\r\nf\r\n*2\r\n$3\r\nGET\r\n$2\r\nk4\r\n*5\r\n$5\r\nHMGET\r\n$2\r\nh5\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n"
        );
        client.borrow_mut().receive(
            0,
            b"*2\r\n$1\r\na\r\n$1\r\nb\r\n$-1\r\n$1\r\nd\r\n*3\r\n$1\r\nx\r\n$-1\r\n$1\r\nz\r\n",
        );
        let out = outputs_of(&mut harness);
        let values: Vec<Vec<Option<Vec<u8>>>> = out.into_iter().map(|(_, v)| v).collect();
        assert_eq!(
            values,
            vec![
                vec![Some(b"a".to_vec())],
                vec![Some(b"b".to_vec())],
                vec![None],
                vec![Some(b"d".to_vec())],
                vec![Some(b"x".to_vec()), None, Some(b"z".to_vec())],
            ]
        );
    }

    /// The batched operator's batches: each batch's GETs as one MGET, other lookups
    /// between them in order, the values mapped back to their records.
    #[test]
    fn the_batched_operator_s_batches_go_as_mgets_in_order() {
        let (client, mut harness) = batched(3);
        for request in [
            Req::Get(1),
            Req::HGet(2, "f"),
            Req::Get(3),
            Req::Get(4),
            Req::Get(5),
        ] {
            harness.process_record(request, None).expect("submit");
        }
        // Records 1, 2 and 3 filled a batch; 4 and 5 go at the timer pass.
        harness
            .advance_time(std::time::Duration::ZERO)
            .expect("cut");
        let wire = sent(&client);
        assert_eq!(
            String::from_utf8_lossy(&wire),
            "*2\r\n$3\r\nGET\r\n$2\r\nk1\r\n*3\r\n$4\r\nHGET\r\n$2\r\nh2\r\n$1\r\nf\r\n\
             *2\r\n$3\r\nGET\r\n$2\r\nk3\r\n*3\r\n$4\r\nMGET\r\n$2\r\nk4\r\n$2\r\nk5\r\n"
        );
        client.borrow_mut().receive(
            0,
            b"$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n*2\r\n$1\r\nd\r\n$-1\r\n",
        );
        let values: Vec<Vec<Option<Vec<u8>>>> = outputs_of(&mut harness)
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        assert_eq!(
            values,
            vec![
                vec![Some(b"a".to_vec())],
                vec![Some(b"b".to_vec())],
                vec![Some(b"c".to_vec())],
                vec![Some(b"d".to_vec())],
                vec![None],
            ]
        );
        assert_eq!(client.borrow().stats().batches, 1);
    }

    fn outputs_of<F: AsyncFunction<Out = (String, Vec<Option<Vec<u8>>>)>>(
        harness: &mut AsyncHarness<F>,
    ) -> Vec<(String, Vec<Option<Vec<u8>>>)> {
        harness.run_mailbox().expect("no failure");
        harness
            .take_output()
            .into_iter()
            .filter_map(|e| e.as_record().map(|r| r.value.clone()))
            .collect()
    }

    #[test]
    fn an_error_reply_fails_its_call_only() {
        let (client, mut harness) = ready();
        harness.process_record(Req::Get(1), None).expect("submit");
        harness
            .process_record(Req::HGet(2, "f"), None)
            .expect("submit");
        let _ = sent(&client);
        client.borrow_mut().receive(
            0,
            b"$1\r\na\r\n-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
        );
        let error = redis_error(harness.run_mailbox().expect_err("the HGET failed"));
        let RedisError::Server { command, message } = &error else {
            panic!("{error}");
        };
        assert_eq!(command, "HGET");
        assert!(message.starts_with("WRONGTYPE"), "{message}");
        assert!(!error.is_transient());
        let client = client.borrow();
        assert_eq!((client.stats().hits, client.stats().errors), (1, 1));
        assert!(matches!(client.connections[0].state, State::Ready { .. }));
    }

    #[test]
    fn a_malformed_reply_closes_the_connection_and_fails_its_calls() {
        let replies: [&[u8]; 4] = [
            b"!garbage\r\n",
            b"*2\r\n$1\r\na\r\n$1\r\nb\r\n",
            b":1\r\n",
            b"$1\r\na\r\n*1\r\n*0\r\n",
        ];
        for reply in replies {
            let (client, mut harness) = ready();
            harness.process_record(Req::Get(1), None).expect("submit");
            harness.process_record(Req::Get(2), None).expect("submit");
            let _ = sent(&client);
            client.borrow_mut().receive(0, reply);
            let error = harness.run_mailbox().expect_err("malformed");
            let error = redis_error(error);
            assert!(matches!(error, RedisError::Malformed { .. }), "{error}");
            assert!(error.is_transient());
            let client = client.borrow();
            assert_eq!(client.outstanding(), 0);
            assert_eq!(client.stats().malformed, 1);
            assert_eq!(client.to_close, vec![7]);
            assert_eq!(client.connections[0].state, State::Down);
        }
        // A reply to no command closes the connection too.
        let (client, mut harness) = ready();
        harness.process_record(Req::Get(1), None).expect("submit");
        let _ = sent(&client);
        client.borrow_mut().receive(0, b"$1\r\na\r\n$1\r\nb\r\n");
        assert_eq!(outputs(&mut harness).len(), 1);
        assert_eq!(client.borrow().stats().malformed, 1);
        assert_eq!(client.borrow().to_close, vec![7]);
    }

    #[test]
    fn bad_requests_and_overload_fail_with_typed_errors() {
        let (_client, mut harness) = ready();
        let error = redis_error(
            harness
                .process_record(Req::NoKey, None)
                .expect_err("no key"),
        );
        assert!(error.to_string().contains("GET takes a key"), "{error}");

        let (client, mut harness) = ready();
        client.borrow_mut().config.capacity = 2;
        harness.process_record(Req::Get(0), None).expect("submit");
        harness.process_record(Req::Get(1), None).expect("submit");
        let error = redis_error(
            harness
                .process_record(Req::Get(2), None)
                .expect_err("overloaded"),
        );
        assert!(
            matches!(error, RedisError::Overloaded { capacity: 2, .. }),
            "{error}"
        );

        for (change, hint) in [
            (
                (|c: &mut RedisConfig| c.connections = 0) as fn(&mut RedisConfig),
                "connections",
            ),
            (|c| c.capacity = 0, "capacity"),
            (|c| c.request_timeout = Duration::ZERO, "timeouts"),
            (|c| c.response_timeout = Duration::ZERO, "response timeouts"),
        ] {
            let mut config = config();
            change(&mut config);
            let error = RedisClient::<Req>::new(config).err().expect("invalid");
            assert!(error.to_string().contains(hint), "{error}");
        }
    }

    /// A connection in set-up, id 7, as `connect` leaves it.
    fn setting_up(url: &str) -> (Shared, AsyncHarness<RedisFunction<Req>>) {
        let mut config = config();
        config.url = url.parse().expect("url");
        let client = Rc::new(RefCell::new(RedisClient::new(config).expect("client")));
        {
            let mut c = client.borrow_mut();
            let url = c.config.url.clone();
            let connection = &mut c.connections[0];
            connection.state = State::SettingUp { id: 7, since_ns: 0 };
            if url.protocol == Protocol::Resp2 {
                queue_auth(connection, &url);
                queue_select(connection, &url);
            } else {
                connection.resp3 = true;
                connection.setup.push_back(Step::Hello);
            }
        }
        let harness = AsyncHarness::new(
            RedisFunction::new(Rc::clone(&client)),
            AsyncConfig::new(OutputMode::Ordered, 32),
        )
        .expect("harness");
        (client, harness)
    }

    #[test]
    fn set_up_negotiates_resp3_or_falls_back_to_resp2_then_selects() {
        // RESP3: a map, then SELECT; calls wait until then.
        let (client, mut harness) = setting_up("redis://u:p@127.0.0.1:9/2");
        client.borrow_mut().connections[0].failures = 3;
        harness.process_record(Req::Get(1), None).expect("submit");
        client.borrow_mut().receive(0, b"%1\r\n+proto\r\n:3\r\n");
        {
            let c = client.borrow();
            assert!(c.connections[0].resp3);
            assert_eq!(c.connections[0].setup.front(), Some(&Step::Select));
            assert!(String::from_utf8_lossy(&c.connections[0].setup_out).contains("SELECT"));
            assert!(matches!(c.connections[0].state, State::SettingUp { .. }));
        }
        client.borrow_mut().connections[0].setup_out.clear();
        client.borrow_mut().receive(0, b"+OK\r\n");
        assert!(matches!(
            client.borrow().connections[0].state,
            State::Ready { id: 7 }
        ));
        // A working connection starts the back-off over.
        assert_eq!(client.borrow().connections[0].failures, 0);
        let _ = sent(&client);
        client.borrow_mut().receive(0, b"_\r\n");
        assert_eq!(outputs(&mut harness)[0].1, vec![None]);

        // A server without HELLO: RESP2 with AUTH user password.
        let (client, _harness) = setting_up("redis://u:p@127.0.0.1:9");
        client
            .borrow_mut()
            .receive(0, b"-ERR unknown command 'HELLO'\r\n");
        {
            let c = client.borrow();
            assert!(!c.connections[0].resp3);
            assert_eq!(
                String::from_utf8_lossy(&c.connections[0].setup_out),
                "*3\r\n$4\r\nAUTH\r\n$1\r\nu\r\n$1\r\np\r\n"
            );
        }
        client.borrow_mut().receive(0, b"+OK\r\n");
        assert!(matches!(
            client.borrow().connections[0].state,
            State::Ready { .. }
        ));

        // protocol=resp3 insists.
        let (client, mut harness) = setting_up("redis://127.0.0.1:9?protocol=resp3");
        harness.process_record(Req::Get(1), None).expect("submit");
        client
            .borrow_mut()
            .receive(0, b"-NOPROTO unsupported protocol version\r\n");
        let error = redis_error(harness.run_mailbox().expect_err("no RESP3"));
        assert!(matches!(error, RedisError::Protocol { .. }), "{error}");
    }

    #[test]
    fn refused_credentials_and_databases_are_typed_errors() {
        let (client, mut harness) = setting_up("redis://u:wrong@127.0.0.1:9");
        harness.process_record(Req::Get(1), None).expect("submit");
        client.borrow_mut().receive(
            0,
            b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
        );
        let error = redis_error(harness.run_mailbox().expect_err("auth"));
        assert!(matches!(error, RedisError::Auth { .. }), "{error}");
        assert!(
            error.to_string().contains("check user and password"),
            "{error}"
        );
        assert_eq!(client.borrow().to_close, vec![7]);

        let (client, mut harness) = setting_up("redis://127.0.0.1:9/99?protocol=resp2");
        harness.process_record(Req::Get(1), None).expect("submit");
        client
            .borrow_mut()
            .receive(0, b"-ERR DB index is out of range\r\n");
        let error = redis_error(harness.run_mailbox().expect_err("select"));
        assert!(
            matches!(error, RedisError::Select { db: 99, .. }),
            "{error}"
        );
    }

    /// A set-up that takes longer than the connect timeout, and a server silent for
    /// the request timeout with replies due: the calls fail with typed errors and the
    /// connection is closed.
    #[test]
    fn set_up_and_replies_are_timed() {
        let mut driver = weir_engine::runtime::NoIo::new();
        let second = 1_000_000_000;
        let (client, mut harness) = setting_up("redis://127.0.0.1:9");
        harness.process_record(Req::Get(1), None).expect("submit");
        client.borrow_mut().flush(&mut driver, second / 2);
        assert!(harness.run_mailbox().is_ok(), "within the connect timeout");
        assert_eq!(client.borrow().next_deadline(), Some(second + 1));
        client.borrow_mut().flush(&mut driver, second + 2);
        let error = redis_error(harness.run_mailbox().expect_err("connect timeout"));
        assert!(
            matches!(error, RedisError::ConnectTimeout { .. }),
            "{error}"
        );
        assert_eq!(client.borrow().connections[0].state, State::Down);

        let (client, mut harness) = ready();
        harness.process_record(Req::Get(1), None).expect("submit");
        client.borrow_mut().flush(&mut driver, 4 * second);
        assert!(harness.run_mailbox().is_ok(), "within the request timeout");
        client.borrow_mut().flush(&mut driver, 5 * second + 1);
        let error = redis_error(harness.run_mailbox().expect_err("request timeout"));
        assert!(matches!(error, RedisError::Timeout { .. }), "{error}");
        assert!(error.to_string().contains("request timeout"), "{error}");
    }

    /// The response timeout runs from when a command is handed to the driver, for the
    /// oldest command unanswered: bytes trickling in (each resetting the request
    /// timeout) do not extend it, the next command's deadline starts from its own
    /// send, and a command still in the outbox has none.
    #[test]
    fn the_oldest_command_must_be_answered_whole_within_the_response_timeout() {
        let mut driver = weir_engine::runtime::NoIo::new();
        let second = 1_000_000_000;
        let (client, mut harness) = ready();
        client.borrow_mut().config.response_timeout = Duration::from_secs(3);
        harness.process_record(Req::Get(1), None).expect("submit");
        // Unsent: only the request timeout (5 s from the submit at 0) applies.
        assert_eq!(client.borrow().next_deadline(), Some(5 * second + 1));
        client.borrow_mut().flush(&mut driver, second);
        assert_eq!(client.borrow().next_deadline(), Some(4 * second + 1));
        harness.process_record(Req::Get(2), None).expect("submit");
        client.borrow_mut().flush(&mut driver, 2 * second);
        // The first reply trickles in a byte every quarter second, from 2.25 s to 3.75 s.
        let reply = b"$2\r\nv1\r\n";
        for (n, byte) in reply[..reply.len() - 1].iter().enumerate() {
            let now = 2 * second + (n as u64 + 1) * second / 4;
            client.borrow_mut().flush(&mut driver, now);
            client.borrow_mut().receive(0, std::slice::from_ref(byte));
        }
        assert!(harness.run_mailbox().is_ok(), "within the response timeout");
        assert_eq!(client.borrow().next_deadline(), Some(4 * second + 1));
        client.borrow_mut().flush(&mut driver, 4 * second);
        assert!(harness.run_mailbox().is_ok(), "at the response timeout");
        client.borrow_mut().receive(0, &reply[reply.len() - 1..]);
        assert_eq!(outputs(&mut harness).len(), 1, "the first reply came whole");
        // The second command was sent at 2 s.
        assert_eq!(client.borrow().next_deadline(), Some(5 * second + 1));
        client.borrow_mut().receive(0, b"$2\r\nv");
        client.borrow_mut().flush(&mut driver, 5 * second + 1);
        let error = redis_error(harness.run_mailbox().expect_err("response timeout"));
        let RedisError::ResponseTimeout { timeout, .. } = error else {
            panic!("{error}")
        };
        assert_eq!(timeout, Duration::from_secs(3));
        assert!(error.to_string().contains("3s"), "{error}");
        let c = client.borrow();
        assert_eq!((c.outstanding(), c.stats().failed), (0, 1));
        assert_eq!(c.connections[0].state, State::Down);
    }

    /// A reply nested deeper than `REPLY_DEPTH_MAX` (here 100,000 levels, which would
    /// overflow the decoder's stack) closes the connection and fails every call on it
    /// with the typed error, counted as malformed.
    #[test]
    fn a_reply_nested_too_deep_fails_the_connection_and_its_calls() {
        for resp3 in [false, true] {
            let (client, mut harness) = ready();
            client.borrow_mut().connections[0].resp3 = resp3;
            harness.process_record(Req::Get(1), None).expect("submit");
            harness.process_record(Req::Get(2), None).expect("submit");
            let _ = sent(&client);
            let mut reply = b"*1\r\n".repeat(100_000);
            reply.extend_from_slice(b"$1\r\nx\r\n");
            // In two parts: refused before it is whole.
            client.borrow_mut().receive(0, &reply[..1000]);
            let error = redis_error(harness.run_mailbox().expect_err("too deep"));
            let RedisError::TooDeep { depth_max, .. } = error else {
                panic!("{error}")
            };
            assert_eq!(depth_max, crate::redis::REPLY_DEPTH_MAX);
            let c = client.borrow();
            assert_eq!((c.outstanding(), c.stats().failed), (0, 2));
            assert_eq!(c.stats().malformed, 1);
            assert_eq!(c.to_close, vec![7]);
        }
    }

    /// By default a reply may be 64 MiB, a bound on what one connection buffers; one
    /// byte more closes the connection with a malformed-reply error naming the setting.
    #[test]
    fn replies_are_capped_at_64_mib_by_default() {
        let (client, mut harness) = ready();
        assert_eq!(client.borrow().config.max_reply_bytes, 64 << 20);
        harness.process_record(Req::Get(1), None).expect("submit");
        let _ = sent(&client);
        // A 100 MiB string: its header, then 64 MiB of it in 1 MiB reads.
        let header = b"$104857600\r\n";
        client.borrow_mut().receive(0, header);
        let chunk = vec![b'v'; 1 << 20];
        for _ in 0..63 {
            client.borrow_mut().receive(0, &chunk);
        }
        let last = (1 << 20) - header.len();
        client.borrow_mut().receive(0, &chunk[..last]);
        assert_eq!(client.borrow().outstanding(), 1, "64 MiB are buffered");
        client.borrow_mut().receive(0, b"v");
        let error = redis_error(harness.run_mailbox().expect_err("too long"));
        assert!(matches!(error, RedisError::Malformed { .. }), "{error}");
        assert!(error.to_string().contains("max_reply_bytes"), "{error}");
        // The buffer went with the connection.
        assert_eq!(client.borrow().connections[0].inbox.capacity(), 0);
    }

    #[test]
    fn failed_attempts_back_off_doubling_to_the_maximum() {
        let (client, _harness) = ready();
        let mut c = client.borrow_mut();
        let error = RedisError::Closed {
            addr: "x".into(),
            pending: 0,
            reason: None,
        };
        let mut delays = Vec::new();
        for _ in 0..10 {
            c.fail_connection(0, &error, false);
            delays.push(c.connections[0].retry_at_ns - c.now_ns);
        }
        let ms = 1_000_000;
        assert_eq!(
            delays,
            [
                0,
                10 * ms,
                20 * ms,
                40 * ms,
                80 * ms,
                160 * ms,
                320 * ms,
                640 * ms,
                1000 * ms,
                1000 * ms
            ]
        );
    }
}
