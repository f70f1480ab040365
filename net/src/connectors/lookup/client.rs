//! The lookup client: an [`AsyncFunction`] whose calls are lookups on the worker's own
//! driver, pipelined over one or more connections.
//!
//! A call appends a request frame to a connection's outbox and keeps its
//! [`ResultFuture`] in a slab whose key is the request id; the task hands outboxes to
//! the driver once per loop turn (many requests per send), and feeds received bytes
//! back, which complete the futures on the same thread (the operator's fast path).
//!
//! Failure handling, so that nothing hangs: a malformed frame closes that connection
//! with a logged [`NetError::Malformed`] and fails its outstanding requests; a closed
//! or reset connection fails its outstanding requests; a request unanswered for
//! `request_timeout` is failed (the operator's timeout normally fires first, making
//! this completion stale). Expiry keeps no queue and no timer per request: each
//! outstanding request carries its deadline, and a sweep over the outstanding ones runs
//! every eighth of the timeout, so a request fails at most that much after its deadline
//! and the memory is the fixed slab of outstanding requests, however many were sent
//! within the timeout. (A timer per request cost a wheel node and its linking on the
//! hottest path, for a safety net behind the operator's own timeout.) Failures are
//! [`AsyncError::Call`] carrying a [`NetError`] where the failure has a variant of its
//! own, so the operator's retries apply. A connection that went away is re-established
//! on the next request.
//!
//! Connecting never blocks the worker: the flush that first has requests for a
//! connection starts a non-blocking connect and hands the socket to the driver, which
//! sends the requests once the connect completes (see `crate::connect`). A connect not
//! complete within `connect_timeout` is abandoned, failing the requests on it with
//! [`NetError::ConnectTimeout`]; the next request connects again. The timeout is
//! measured by the clock of [`expire`](LookupClient::expire), as request expiry is, and
//! [`next_deadline`](LookupClient::next_deadline) says when it next needs a flush.
//!
//! What waits for a service that does not read is bounded by `capacity`: every
//! request still queued for an open connection (in its outbox, or in the driver's or
//! the kernel's buffers) holds its slot, so at most `capacity` request frames wait for
//! the open connections in all. A slot is freed by an answer, by its connection's
//! failure (which closes the connection, dropping what is queued for it), or by
//! expiry. An expired request may still be queued, unread: it is known to have been
//! read only once a request sent after it on the same connection was answered (a
//! connection delivers in order, so the service read everything before that one).
//! Each connection numbers its requests to tell: `sent` counts the requests queued on
//! it, each pending request keeps its number, and `read_until` is one past the number
//! of the latest answered. An expired request numbered `read_until` or later closes
//! its connection, failing the requests on it with [`NetError::Unanswered`]. (Were
//! expiry to free such slots, each request timeout would admit `capacity` more frames
//! behind a stalled service, and its queue would grow without bound.)
//!
//! Dropping the client (its task ended) shuts its connections down, so the service
//! sees them end even while the worker's driver lives on (see `crate::connect`).

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use weir_engine::async_io::{AsyncError, AsyncFunction, ResultFuture};
use weir_engine::slab::{Key, Slab};

use super::protocol::{
    batch_outcomes, decode_response, encode_batch_request, encode_request, response_size,
    Malformed, Response, BATCH_KEYS_MAX, STATUS_BATCH, STATUS_OK, VALUE_LEN_MAX,
};
use crate::connect::{Connect, Link};
use crate::error::NetError;
use weir_engine::runtime::{Driver, DriverEvent};

/// A lookup as the client sees it: the key to send, and how to build the result from
/// the value.
pub trait LookupRequest: 'static {
    /// The result type.
    type Out: Send + 'static;
    /// The key to look up.
    fn key(&self) -> u64;
    /// The result for a value.
    fn complete(self, value: &[u8]) -> Self::Out;
}

/// A bare key: its result is the value's bytes.
impl LookupRequest for u64 {
    type Out = Vec<u8>;
    fn key(&self) -> u64 {
        *self
    }
    fn complete(self, value: &[u8]) -> Vec<u8> {
        value.to_vec()
    }
}

/// Settings of a client.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The service.
    pub addr: SocketAddr,
    /// Connections per client (requests go round robin).
    pub connections: usize,
    /// Request frames outstanding at most (beyond: the call fails with "overloaded"); also
    /// the most request frames that wait for a service that does not read. A batch
    /// request is one frame, however many keys it holds.
    pub capacity: usize,
    /// A request unanswered this long is failed.
    pub request_timeout: Duration,
    /// A connect not complete this long after it started fails the requests waiting
    /// on it with [`NetError::ConnectTimeout`]; see
    /// [`CONNECT_TIMEOUT_DEFAULT`](Self::CONNECT_TIMEOUT_DEFAULT).
    pub connect_timeout: Duration,
}

impl ClientConfig {
    /// A connect timeout for a service on the same network: 3 s, long enough for the
    /// kernel to send a lost SYN again once (after 1 s, the initial retransmission
    /// timeout of RFC 6298), short enough that lookups to a service that drops
    /// connection attempts fail in seconds rather than after the kernel's two minutes
    /// of retries.
    pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(3);
}

/// What a client did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Lookups sent (a batch request's keys each count).
    pub requests: u64,
    /// Batch requests sent.
    pub batches: u64,
    /// Values received.
    pub values: u64,
    /// Error answers, closed connections and expiries, per failed request.
    pub failed: u64,
    /// Connections (re)established.
    pub connects: u64,
    /// Connections closed because of a malformed frame.
    pub malformed: u64,
}

struct Connection {
    /// The connection, once made; dropped when it ends.
    link: Option<Link>,
    outbox: Vec<u8>,
    /// The head of a response frame split across receives; never a whole frame.
    inbox: Vec<u8>,
    close: bool,
    /// The number the next request queued here gets (64 bits: at a billion requests a
    /// second a connection would take five centuries to wrap them, so numbers compare
    /// plainly, however many were sent within a request timeout).
    sent: u64,
    /// The service read every request numbered below this: one past the latest
    /// answered, or `sent` when the connection last failed.
    read_until: u64,
    /// Batch requests outstanding on it: only while there are, a response may be longer
    /// than one value's (see `receive`).
    batches: u32,
}

/// Whether request number `a` comes before number `b` on a connection.
#[inline(always)]
fn is_before(a: u64, b: u64) -> bool {
    a < b
}

/// Where a lookup's outcome goes.
enum Sink<R: LookupRequest> {
    /// A callback call: complete its handle.
    Call {
        request: R,
        result: ResultFuture<R::Out>,
    },
    /// A future from [`LookupClient::get`] for `key`: fill its slot and wake it.
    Wait { key: u64, slot: Rc<Slot> },
    /// A batch request's calls, in key order ([`LookupClient::submit_batch`]).
    Batch(Vec<(R, ResultFuture<R::Out>)>),
}

/// An outstanding request (kept small: one is written and read per lookup). Its key is
/// the sink's: the request's own, or the one a future waits for.
struct Pending<R: LookupRequest> {
    /// The index of the connection it went out on.
    connection: u32,
    /// Its number on that connection (see [`Connection::sent`]).
    number: u64,
    sink: Sink<R>,
    /// When it expires.
    deadline_ns: u64,
}

/// The shared slot between a pending lookup and its [`Get`] future.
#[derive(Default)]
struct Slot {
    outcome: RefCell<Option<Result<Vec<u8>, AsyncError>>>,
    waker: RefCell<Option<std::task::Waker>>,
}

impl Slot {
    fn fill(&self, outcome: Result<Vec<u8>, AsyncError>) {
        *self.outcome.borrow_mut() = Some(outcome);
        if let Some(waker) = self.waker.borrow_mut().take() {
            waker.wake();
        }
    }
}

/// A lookup as a future (see [`LookupClient::get`]): resolves to the value, or to the
/// same errors a callback call gets.
pub struct Get(Rc<Slot>);

impl std::future::Future for Get {
    type Output = Result<Vec<u8>, AsyncError>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match self.0.outcome.borrow_mut().take() {
            Some(outcome) => std::task::Poll::Ready(outcome),
            None => {
                *self.0.waker.borrow_mut() = Some(cx.waker().clone());
                std::task::Poll::Pending
            }
        }
    }
}

impl<R: LookupRequest> Sink<R> {
    fn key(&self) -> u64 {
        match self {
            Sink::Call { request, .. } => request.key(),
            Sink::Wait { key, .. } => *key,
            Sink::Batch(calls) => calls.first().map_or(0, |(request, _)| request.key()),
        }
    }
}

/// Fails a lookup with `error`: the client was full, or its request failed (an error
/// answer, expiry, a closed connection or a malformed frame; all rare, hence cold).
#[cold]
fn sink_failed<R: LookupRequest>(sink: Sink<R>, error: AsyncError) {
    match sink {
        Sink::Call { result, .. } => result.complete_err(error),
        Sink::Wait { slot, .. } => slot.fill(Err(error)),
        Sink::Batch(calls) => {
            for (_, result) in calls {
                result.complete_err(duplicate(&error));
            }
        }
    }
}

/// The same failure again, for each call of a batch: a [`NetError`] keeps its variant
/// (so that retry predicates that look at it still apply), anything else its message.
fn duplicate(error: &AsyncError) -> AsyncError {
    match error {
        AsyncError::Timeout => AsyncError::Timeout,
        AsyncError::Dropped => AsyncError::Dropped,
        AsyncError::Call(inner) => match inner.downcast_ref::<NetError>() {
            Some(net) => AsyncError::call(net.duplicate()),
            None => AsyncError::call(inner.to_string()),
        },
        other => AsyncError::call(other.to_string()),
    }
}

impl<R: LookupRequest> Pending<R> {
    /// Completes a single lookup with `value` (a batch is answered by its outcomes: see
    /// `LookupClient::deliver`).
    fn succeed(self, value: &[u8]) {
        match self.sink {
            Sink::Call { request, result } => result.complete_one(request.complete(value)),
            Sink::Wait { slot, .. } => slot.fill(Ok(value.to_vec())),
            Sink::Batch(calls) => sink_failed::<R>(
                Sink::Batch(calls),
                AsyncError::call("the lookup service answered a batch request with a single value"),
            ),
        }
    }

    fn fail(self, error: AsyncError) {
        sink_failed(self.sink, error);
    }

    /// The lookups it stands for: a batch's keys, else one.
    fn lookups(&self) -> u64 {
        match &self.sink {
            Sink::Batch(calls) => calls.len() as u64,
            _ => 1,
        }
    }
}

/// See the module docs. Shared (through `Rc<RefCell<_>>`) between the
/// [`LookupFunction`] inside the operator and the task that drives the I/O.
pub struct LookupClient<R: LookupRequest> {
    config: ClientConfig,
    connections: Vec<Connection>,
    next: usize,
    pending: Slab<Pending<R>>,
    /// `config.request_timeout` in nanoseconds.
    timeout_ns: u64,
    /// `config.connect_timeout` in nanoseconds.
    connect_timeout_ns: u64,
    now_ns: u64,
    /// When expiry next sweeps the outstanding requests.
    sweep_at_ns: u64,
    /// Expired requests found by a sweep (kept for its capacity).
    expired: Vec<Key>,
    stats: ClientStats,
}

impl<R: LookupRequest> LookupClient<R> {
    /// A client; it connects on the first request.
    pub fn new(config: ClientConfig) -> Result<Self, NetError> {
        if config.connections == 0 || u32::try_from(config.connections).is_err() {
            return Err(NetError::Config(format!(
                "a lookup client needs between 1 and {} connections",
                u32::MAX
            )));
        }
        // The slab's keys are 32 bits, and no client needs 2^31 requests in flight.
        if i32::try_from(config.capacity).is_err() {
            return Err(NetError::Config(format!(
                "a lookup client's capacity must be at most {} requests, not {}",
                i32::MAX,
                config.capacity
            )));
        }
        if config.connect_timeout.is_zero() {
            return Err(NetError::Config(
                "a lookup client's connect_timeout must be positive".to_string(),
            ));
        }
        let pending = Slab::new(config.capacity).map_err(|e| NetError::Config(e.to_string()))?;
        let connections = (0..config.connections)
            .map(|_| Connection {
                link: None,
                outbox: Vec::new(),
                inbox: Vec::new(),
                close: false,
                sent: 0,
                read_until: 0,
                batches: 0,
            })
            .collect();
        Ok(LookupClient {
            timeout_ns: u64::try_from(config.request_timeout.as_nanos()).unwrap_or(u64::MAX),
            connect_timeout_ns: u64::try_from(config.connect_timeout.as_nanos())
                .unwrap_or(u64::MAX),
            config,
            connections,
            next: 0,
            pending,
            now_ns: 0,
            sweep_at_ns: 0,
            expired: Vec::new(),
            stats: ClientStats::default(),
        })
    }

    /// Counters.
    pub fn stats(&self) -> ClientStats {
        self.stats
    }

    /// Request frames waiting for an answer (a batch request counts once).
    pub fn outstanding(&self) -> usize {
        self.pending.len()
    }

    /// Sets the clock used for request expiry.
    pub fn set_now(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
    }

    /// Starts a lookup for `request`; its outcome completes `result`.
    #[inline(always)]
    pub fn submit(&mut self, request: R, result: ResultFuture<R::Out>) {
        let key = request.key();
        self.start(key, move || Sink::Call { request, result });
    }

    /// Starts the lookups of one batch the caller cut (e.g. [`LookupBatchFunction`]) as
    /// one batch request: one frame for all their keys, one response with their
    /// outcomes in order, each completing its call (a value, or an error of its own).
    /// A batch of one goes as a plain request; one of more than [`BATCH_KEYS_MAX`]
    /// keys as several batch requests. The batch holds one slot of the client's
    /// capacity (it is one frame waiting for the service).
    pub fn submit_batch(&mut self, calls: impl IntoIterator<Item = (R, ResultFuture<R::Out>)>) {
        let mut calls: Vec<(R, ResultFuture<R::Out>)> = calls.into_iter().collect();
        while calls.len() > BATCH_KEYS_MAX {
            let rest = calls.split_off(BATCH_KEYS_MAX);
            self.submit_batch(std::mem::replace(&mut calls, rest));
        }
        if calls.len() <= 1 {
            if let Some((request, result)) = calls.pop() {
                self.submit(request, result);
            }
            return;
        }
        let connection = self.next;
        let number = self.connections[connection].sent;
        let deadline_ns = self.now_ns.saturating_add(self.timeout_ns);
        let keys: Vec<u64> = calls.iter().map(|(request, _)| request.key()).collect();
        let mut calls = Some(calls);
        match self.pending.insert_with(|| Pending {
            connection: connection as u32,
            number,
            sink: Sink::Batch(calls.take().expect("made once")),
            deadline_ns,
        }) {
            Ok(slot) => {
                self.next = (connection + 1) % self.connections.len();
                let outbox = &mut self.connections[connection];
                encode_batch_request(&mut outbox.outbox, slot.to_u64(), &keys);
                outbox.sent += 1;
                outbox.batches += 1;
                self.stats.requests += keys.len() as u64;
                self.stats.batches += 1;
            }
            Err(_) => self.overloaded(Sink::Batch(
                calls.take().expect("not made: the client was full"),
            )),
        }
    }

    /// Starts a lookup of `key` whose value a future awaits: for functions written as
    /// `async` blocks (see `weir_engine::async_io::futures`). The value arrives through
    /// this worker's driver, on this thread.
    pub fn get(&mut self, key: u64) -> Get {
        let slot = Rc::new(Slot::default());
        let waiting = Rc::clone(&slot);
        self.start(key, move || Sink::Wait { key, slot: waiting });
        Get(slot)
    }

    /// Queues a request for `key` on the next connection, its outcome going to the
    /// sink `sink` makes: made in the pending entry's slot, or, when the client is
    /// full, to fail the lookup at once (the connection does not move on then). The
    /// sink goes down as a closure so that the entry can be built in its slot, which
    /// spares a copy of it through the stack (`perf annotate` showed that copy's loads
    /// stalled on store forwarding, once per lookup). The closure is borrowed from an
    /// `Option` rather than moved into the entry's: of the forms tried, this one left
    /// the compiler the fewest copies.
    #[inline(always)]
    fn start(&mut self, key: u64, sink: impl FnOnce() -> Sink<R>) {
        let connection = self.next;
        let number = self.connections[connection].sent;
        let deadline_ns = self.now_ns.saturating_add(self.timeout_ns);
        let mut sink = Some(sink);
        match self.pending.insert_with(|| Pending {
            connection: connection as u32,
            number,
            sink: (sink.take().expect("made once"))(),
            deadline_ns,
        }) {
            Ok(slot) => self.queue_request(connection, slot, key),
            Err(_) => self.overloaded((sink.take().expect("not made: the client was full"))()),
        }
    }

    /// Fails a lookup that could not be sent: the client is full.
    #[cold]
    #[inline(never)]
    fn overloaded(&mut self, sink: Sink<R>) {
        let message = format!(
            "lookup client overloaded: {} requests outstanding (batch requests count once)",
            self.pending.len()
        );
        sink_failed(sink, AsyncError::call(message));
    }

    /// Appends the request of the pending entry `slot` for `key` to `connection`'s
    /// outbox (sent by the next [`flush`](Self::flush)), and moves on to the next
    /// connection.
    #[inline(always)]
    fn queue_request(&mut self, connection: usize, slot: Key, key: u64) {
        self.next = if connection + 1 == self.connections.len() {
            0
        } else {
            connection + 1
        };
        let connection = &mut self.connections[connection];
        encode_request(&mut connection.outbox, slot.to_u64(), key);
        connection.sent += 1;
        self.stats.requests += 1;
    }

    /// Hands the outboxes to `driver`, connecting where needed (without waiting for the
    /// connect), closes connections marked for closing and abandons connects past
    /// `connect_timeout` (by the clock [`expire`](Self::expire) and
    /// [`set_now`](Self::set_now) set).
    pub fn flush(&mut self, driver: &mut dyn Driver) {
        for index in 0..self.connections.len() {
            let connection = &mut self.connections[index];
            if connection.close {
                connection.close = false;
                if let Some(link) = connection.link.take() {
                    link.close(driver);
                }
            }
            if let Some(link) = connection.link.as_mut() {
                if link.poll_connect(self.now_ns, self.connect_timeout_ns) == Connect::TimedOut {
                    if let Some(link) = connection.link.take() {
                        link.close(driver);
                    }
                    let error = NetError::ConnectTimeout {
                        addr: self.config.addr.to_string(),
                        timeout: self.config.connect_timeout,
                    };
                    self.fail_connection(index, &error);
                }
            }
            if self.connections[index].outbox.is_empty() {
                continue;
            }
            if self.connections[index].link.is_none() {
                match Link::open(self.config.addr, driver, self.now_ns) {
                    Ok(link) => {
                        self.connections[index].link = Some(link);
                        self.connections[index].inbox.clear();
                        self.stats.connects += 1;
                    }
                    Err(source) => {
                        let error = NetError::io("connecting to the lookup service", source);
                        self.fail_connection(index, &error);
                    }
                }
            }
            let connection = &mut self.connections[index];
            if let Some(link) = &connection.link {
                driver.send(link.id(), &mut connection.outbox);
            }
        }
    }

    /// When a connect in progress times out, by the clock of [`expire`](Self::expire):
    /// the client needs a [`flush`](Self::flush) then, even with no I/O.
    pub fn next_deadline(&self) -> Option<u64> {
        self.connections
            .iter()
            .filter_map(|c| {
                c.link
                    .as_ref()?
                    .connect_deadline_ns(self.connect_timeout_ns)
            })
            .min()
    }

    /// Takes a driver event for one of this client's connections; returns whether it was.
    pub fn on_event(&mut self, event: &DriverEvent<'_>) -> bool {
        let (conn, received) = match event {
            DriverEvent::Received { conn, bytes } => (*conn, Some(*bytes)),
            DriverEvent::Closed { conn, .. } => (*conn, None),
        };
        let Some(index) = self
            .connections
            .iter()
            .position(|c| c.link.as_ref().is_some_and(|link| link.id() == conn))
        else {
            return false;
        };
        match received {
            Some(bytes) => self.receive(index, bytes),
            None => {
                let connecting = self.connections[index]
                    .link
                    .as_ref()
                    .is_some_and(Link::is_connecting);
                let error = match event {
                    DriverEvent::Closed {
                        error: Some(error), ..
                    } => NetError::io(
                        if connecting {
                            "connecting to the lookup service"
                        } else {
                            "lookup connection"
                        },
                        std::io::Error::new(error.kind(), error.to_string()),
                    ),
                    _ => NetError::Closed {
                        peer: self.config.addr.to_string(),
                        pending: self.count_on(index),
                    },
                };
                self.connections[index].link = None;
                self.fail_connection(index, &error);
            }
        }
        true
    }

    /// Fails requests unanswered past `request_timeout` at `now_ns`.
    pub fn expire(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
        if now_ns < self.sweep_at_ns || self.pending.is_empty() {
            return;
        }
        let period_ns = (self.timeout_ns / 8).max(100_000);
        self.sweep_at_ns = now_ns.saturating_add(period_ns);
        let mut expired = std::mem::take(&mut self.expired);
        expired.clear();
        expired.extend(
            self.pending
                .iter()
                .filter(|(_, p)| p.deadline_ns <= now_ns)
                .map(|(slot, _)| slot),
        );
        for &slot in &expired {
            // Gone already when an earlier expiry closed its connection.
            let Some(pending) = self.take(slot) else {
                continue;
            };
            self.stats.failed += pending.lookups();
            let index = pending.connection as usize;
            debug_assert!(is_before(pending.number, self.connections[index].sent));
            let read = is_before(pending.number, self.connections[index].read_until);
            let message = format!(
                "no answer from the lookup service within {}",
                super::format_duration(self.config.request_timeout)
            );
            pending.fail(AsyncError::call(message));
            if !read {
                // It may still wait in a queue: free its slot only with the queue.
                self.connections[index].close = true;
                let error = NetError::Unanswered {
                    peer: self.config.addr.to_string(),
                    timeout: self.config.request_timeout,
                };
                self.fail_connection(index, &error);
            }
        }
        self.expired = expired;
    }

    /// Removes an outstanding request that is answered or failed.
    fn take(&mut self, slot: Key) -> Option<Pending<R>> {
        let pending = self.pending.remove(slot)?;
        if let Sink::Batch(_) = pending.sink {
            self.connections[pending.connection as usize].batches -= 1;
        }
        Some(pending)
    }

    fn count_on(&self, index: usize) -> usize {
        self.pending
            .iter()
            .filter(|(_, p)| p.connection as usize == index)
            .count()
    }

    /// Decodes the responses in `bytes`, received on connection `index`, straight from
    /// `bytes`: only a frame split across receives is copied, its head kept in the
    /// connection's inbox (which never holds a whole frame) and completed from the front
    /// of the next `bytes`.
    fn receive(&mut self, index: usize, bytes: &[u8]) {
        let mut inbox = std::mem::take(&mut self.connections[index].inbox);
        let mut rest = bytes;
        if !inbox.is_empty() {
            // The length prefix first, then the rest of the frame it announces.
            let head = 4usize.saturating_sub(inbox.len()).min(rest.len());
            inbox.extend_from_slice(&rest[..head]);
            rest = &rest[head..];
            let size = match response_size(&inbox) {
                Ok(Some(size)) => size,
                Ok(None) => {
                    self.connections[index].inbox = inbox;
                    return;
                }
                Err(malformed) => return self.malformed(index, malformed),
            };
            debug_assert!(inbox.len() < size, "the inbox holds no whole frame");
            // Beyond one value's frame only while a batch is outstanding here: so a
            // service can make a client that sends no batches buffer 1 MiB at most.
            if size > 13 + VALUE_LEN_MAX && self.connections[index].batches == 0 {
                let reason =
                    format!("a response of {size} bytes with no batch request outstanding");
                return self.malformed(index, Malformed(reason));
            }
            let body = (size - inbox.len()).min(rest.len());
            inbox.extend_from_slice(&rest[..body]);
            rest = &rest[body..];
            if inbox.len() < size {
                self.connections[index].inbox = inbox;
                return;
            }
            match decode_response(&inbox) {
                Ok(Some((response, used))) => {
                    debug_assert_eq!(used, inbox.len());
                    self.deliver(response);
                    if self.connections[index].close {
                        // The response was wrong for its request: nothing more is read.
                        return;
                    }
                }
                Ok(None) => unreachable!("the inbox holds the whole frame"),
                Err(malformed) => return self.malformed(index, malformed),
            }
            inbox.clear();
        }
        let mut offset = 0;
        loop {
            match decode_response(&rest[offset..]) {
                Ok(Some((response, used))) => {
                    offset += used;
                    self.deliver(response);
                    if self.connections[index].close {
                        return;
                    }
                }
                Ok(None) => break,
                Err(malformed) => return self.malformed(index, malformed),
            }
        }
        inbox.extend_from_slice(&rest[offset..]);
        self.connections[index].inbox = inbox;
    }

    /// Completes the request `response` answers, unless it expired meanwhile.
    #[inline]
    fn deliver(&mut self, response: Response<'_>) {
        let Some(pending) = self.take(Key::from_u64(response.request_id)) else {
            return;
        };
        // Answered, so read, with every request before it on its connection.
        let connection = &mut self.connections[pending.connection as usize];
        debug_assert!(is_before(pending.number, connection.sent));
        let next = pending.number + 1;
        if is_before(connection.read_until, next) {
            connection.read_until = next;
        }
        if let Sink::Batch(calls) = pending.sink {
            return self.deliver_batch(pending.connection as usize, calls, response);
        }
        if response.status == STATUS_OK {
            self.stats.values += 1;
            pending.succeed(response.value);
        } else if response.status == STATUS_BATCH {
            // A batch response to a single request: the service is broken.
            let index = pending.connection as usize;
            let reason = "a batch response to a single request".to_string();
            self.stats.failed += 1;
            pending.fail(AsyncError::call(NetError::Malformed {
                peer: self.config.addr.to_string(),
                reason: reason.clone(),
            }));
            self.malformed(index, Malformed(reason));
        } else {
            self.stats.failed += 1;
            let error = NetError::Service {
                key: pending.sink.key(),
                message: String::from_utf8_lossy(response.value).into_owned(),
            };
            pending.fail(AsyncError::call(error));
        }
    }

    /// Completes a batch request's calls from its response: each with its outcome, or
    /// all with the error that answered the whole batch. A batch response that does not
    /// hold one outcome per key is malformed: its calls fail and the connection closes.
    #[cold]
    fn deliver_batch(
        &mut self,
        index: usize,
        calls: Vec<(R, ResultFuture<R::Out>)>,
        response: Response<'_>,
    ) {
        match response.status {
            STATUS_BATCH => {
                let outcomes = match batch_outcomes(response.value) {
                    Ok(outcomes) if outcomes.len() == calls.len() => outcomes,
                    Ok(outcomes) => {
                        let reason = format!(
                            "a batch response of {} outcomes to a batch of {} keys",
                            outcomes.len(),
                            calls.len()
                        );
                        return self.fail_batch(index, calls, reason);
                    }
                    Err(malformed) => return self.fail_batch(index, calls, malformed.0),
                };
                for ((request, result), (status, value)) in calls.into_iter().zip(outcomes) {
                    if status == STATUS_OK {
                        self.stats.values += 1;
                        result.complete_one(request.complete(value));
                    } else {
                        self.stats.failed += 1;
                        result.complete_err(AsyncError::call(NetError::Service {
                            key: request.key(),
                            message: String::from_utf8_lossy(value).into_owned(),
                        }));
                    }
                }
            }
            STATUS_OK => {
                let reason = "a single value in answer to a batch request".to_string();
                self.fail_batch(index, calls, reason);
            }
            _ => {
                self.stats.failed += calls.len() as u64;
                let message = String::from_utf8_lossy(response.value).into_owned();
                for (request, result) in calls {
                    result.complete_err(AsyncError::call(NetError::Service {
                        key: request.key(),
                        message: message.clone(),
                    }));
                }
            }
        }
    }

    /// Fails a batch's calls for a malformed answer, and closes its connection.
    #[cold]
    fn fail_batch(&mut self, index: usize, calls: Vec<(R, ResultFuture<R::Out>)>, reason: String) {
        self.stats.failed += calls.len() as u64;
        let error = NetError::Malformed {
            peer: self.config.addr.to_string(),
            reason: reason.clone(),
        };
        sink_failed::<R>(Sink::Batch(calls), AsyncError::call(error));
        self.malformed(index, Malformed(reason));
    }

    /// Closes connection `index` for a malformed frame, failing its requests.
    fn malformed(&mut self, index: usize, malformed: Malformed) {
        let error = NetError::Malformed {
            peer: self.config.addr.to_string(),
            reason: malformed.0,
        };
        eprintln!("weir lookup client: {error}");
        self.stats.malformed += 1;
        self.connections[index].close = true;
        self.fail_connection(index, &error);
    }

    /// Fails every request outstanding on connection `index` with `error`, and drops
    /// what is queued for it here (the caller closes the connection, or it is closed:
    /// the driver drops its queue).
    fn fail_connection(&mut self, index: usize, error: &NetError) {
        let slots: Vec<Key> = self
            .pending
            .iter()
            .filter(|(_, p)| p.connection as usize == index)
            .map(|(k, _)| k)
            .collect();
        for slot in slots {
            if let Some(pending) = self.take(slot) {
                self.stats.failed += pending.lookups();
                pending.fail(AsyncError::call(error.duplicate()));
            }
        }
        let connection = &mut self.connections[index];
        connection.outbox.clear();
        connection.inbox.clear();
        connection.read_until = connection.sent;
    }
}

/// The [`AsyncFunction`] side of a [`LookupClient`].
pub struct LookupFunction<R: LookupRequest> {
    client: Rc<RefCell<LookupClient<R>>>,
}

impl<R: LookupRequest> LookupFunction<R> {
    /// A function submitting to `client`.
    pub fn new(client: Rc<RefCell<LookupClient<R>>>) -> Self {
        LookupFunction { client }
    }
}

impl<R: LookupRequest + Clone> AsyncFunction for LookupFunction<R> {
    type In = R;
    type Out = R::Out;

    // Inlined into the operator, so that the handle need not pass through memory to a
    // call made out of line (read back wider than it was written, it stalled store
    // forwarding once per call).
    #[inline(always)]
    fn invoke(&mut self, input: &R, result: ResultFuture<R::Out>) {
        self.client.borrow_mut().submit(input.clone(), result);
    }

    fn key(&self, input: &R) -> u64 {
        input.key()
    }
}

/// The [`AsyncBatchFunction`](weir_engine::async_io::AsyncBatchFunction) side of a
/// [`LookupClient`]: each batch the operator cuts goes as one batch request
/// ([`LookupClient::submit_batch`]), its outcomes mapped back to the batch's records
/// one by one (an error answers only its own record). With a batch timeout of 0 a
/// batch is the records a task took in one turn, up to `max_batch_size`.
pub struct LookupBatchFunction<R: LookupRequest> {
    client: Rc<RefCell<LookupClient<R>>>,
}

impl<R: LookupRequest> LookupBatchFunction<R> {
    /// A batch function submitting to `client`.
    pub fn new(client: Rc<RefCell<LookupClient<R>>>) -> Self {
        LookupBatchFunction { client }
    }
}

impl<R: LookupRequest + Clone> weir_engine::async_io::AsyncBatchFunction
    for LookupBatchFunction<R>
{
    type In = R;
    type Out = R::Out;

    fn invoke_batch(&mut self, inputs: &[R], result: weir_engine::async_io::BatchResult<R::Out>) {
        let handles = result.into_handles();
        self.client
            .borrow_mut()
            .submit_batch(inputs.iter().cloned().zip(handles));
    }
}

/// What [`lookup_function`] returns: subtask `i`'s lookup function and the I/O hook
/// of its client, for [`Stream::async_wait_io`](weir_engine::graph::Stream::async_wait_io).
pub type LookupFactory<R> = Box<
    dyn Fn(
            &weir_engine::graph::SubtaskInfo,
        ) -> (
            LookupFunction<R>,
            Option<Box<dyn weir_engine::graph::IoHandler>>,
        ) + Send
        + Sync,
>;

/// Each subtask's lookup function for a graph: its own client with `config`'s
/// connections, driven by its worker's driver. The settings are checked here, so
/// making a subtask's client cannot fail.
pub fn lookup_function<R: LookupRequest + Clone>(
    config: ClientConfig,
) -> Result<LookupFactory<R>, NetError> {
    LookupClient::<R>::new(config.clone())?;
    Ok(Box::new(move |_subtask| {
        let client = Rc::new(RefCell::new(
            LookupClient::<R>::new(config.clone()).expect("settings checked above"),
        ));
        let io: Box<dyn weir_engine::graph::IoHandler> = Box::new(ClientIo(Rc::clone(&client)));
        (LookupFunction::new(client), Some(io))
    }))
}

/// Connects a shared [`LookupClient`] to its task's worker driver.
pub struct ClientIo<R: LookupRequest>(pub Rc<RefCell<LookupClient<R>>>);

impl<R: LookupRequest> weir_engine::graph::IoHandler for ClientIo<R> {
    fn flush(&mut self, driver: &mut dyn Driver, now_ns: u64) {
        let mut client = self.0.borrow_mut();
        client.expire(now_ns);
        client.flush(driver);
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
    use crate::lookup::protocol::{decode_request, encode_response, STATUS_ERROR};

    #[derive(Clone)]
    struct Key64(u64);

    impl LookupRequest for Key64 {
        type Out = usize;
        fn key(&self) -> u64 {
            self.0
        }
        fn complete(self, value: &[u8]) -> usize {
            value.len()
        }
    }

    /// Each request's key and its expected outcome: its value, or an error.
    type Expected = Vec<(u64, Result<Vec<u8>, ()>)>;

    /// Answers ids of the requests in `outbox`, in reverse order, with values of the
    /// key's low bits' length; every fifth an error.
    fn answers(outbox: &[u8]) -> (Vec<u8>, Expected) {
        let mut requests = Vec::new();
        let mut offset = 0;
        while let Some((request, used)) = decode_request(&outbox[offset..]).expect("valid") {
            requests.push(request);
            offset += used;
        }
        let mut bytes = Vec::new();
        let mut expected = Vec::new();
        for request in requests.iter().rev() {
            if request.key % 5 == 4 {
                encode_response(&mut bytes, request.request_id, STATUS_ERROR, b"no");
                expected.push((request.key, Err(())));
            } else {
                let value = vec![request.key as u8; (request.key % 40) as usize];
                encode_response(&mut bytes, request.request_id, STATUS_OK, &value);
                expected.push((request.key, Ok(value)));
            }
        }
        (bytes, expected)
    }

    /// A client whose connection is never made: the tests feed it bytes by hand.
    fn unconnected_client() -> LookupClient<Key64> {
        client_of_capacity(64)
    }

    fn client_of_capacity(capacity: usize) -> LookupClient<Key64> {
        LookupClient::<Key64>::new(ClientConfig {
            addr: "127.0.0.1:9".parse().expect("address"),
            connections: 1,
            capacity,
            request_timeout: Duration::from_secs(60),
            connect_timeout: ClientConfig::CONNECT_TIMEOUT_DEFAULT,
        })
        .expect("client")
    }

    proptest::proptest! {
        /// A response stream cut at any points, and so handed over in pieces of any
        /// sizes (a frame split in its prefix, its header or its value, or across several
        /// pieces; many frames in one piece), completes every request once, with its
        /// own answer, and leaves no bytes behind.
        #[test]
        fn responses_split_anywhere_across_receives_complete_every_request(
            count in 1u64..40,
            cuts in proptest::collection::vec(0usize..4096, 0..40),
        ) {
            let mut client = unconnected_client();
            let gets: Vec<(u64, Get)> = (0..count).map(|key| (key, client.get(key))).collect();
            let outbox = std::mem::take(&mut client.connections[0].outbox);
            let (bytes, expected) = answers(&outbox);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (bytes.len() + 1)).collect();
            cuts.push(0);
            cuts.push(bytes.len());
            cuts.sort_unstable();
            for piece in cuts.windows(2) {
                client.receive(0, &bytes[piece[0]..piece[1]]);
                proptest::prop_assert!(client.connections[0].inbox.len() < bytes.len());
            }
            proptest::prop_assert_eq!(client.outstanding(), 0);
            proptest::prop_assert!(client.connections[0].inbox.is_empty());
            proptest::prop_assert_eq!(client.stats().malformed, 0);
            for (key, get) in gets {
                let outcome = get.0.outcome.borrow_mut().take().expect("answered");
                let (_, want) = expected.iter().find(|(k, _)| *k == key).expect("answered");
                match (outcome, want) {
                    (Ok(value), Ok(want)) => proptest::prop_assert_eq!(&value, want),
                    (Err(error), Err(())) => {
                        proptest::prop_assert!(error.to_string().contains("no"))
                    }
                    (outcome, want) => proptest::prop_assert!(false, "{outcome:?} for {want:?}"),
                }
            }
        }
    }

    /// Beyond its capacity the client fails a lookup at once, with a message that says
    /// so, for both ways of starting one; the lookups before it stay outstanding and
    /// are answered.
    #[test]
    fn a_full_client_fails_the_next_lookup_at_once() {
        use weir_engine::async_io::{AsyncConfig, AsyncWaitOperator, OutputMode};
        use weir_engine::element::StreamElement;
        use weir_engine::park::Parker;

        let client = Rc::new(RefCell::new(client_of_capacity(2)));
        let parker = Parker::current();
        let mut operator = AsyncWaitOperator::new(
            LookupFunction::new(Rc::clone(&client)),
            AsyncConfig::new(OutputMode::Unordered, 8),
            parker.unparker(),
        )
        .expect("valid config");
        let mut out: Vec<StreamElement<usize>> = Vec::new();
        for key in [1, 2] {
            operator
                .process_record(Key64(key), None, 0, &mut out)
                .expect("room for it");
        }
        assert_eq!(client.borrow().outstanding(), 2);
        let refused = client.borrow_mut().get(3);
        let message = refused.0.outcome.borrow_mut().take();
        assert!(
            matches!(&message, Some(Err(e))
                if e.to_string().contains("overloaded: 2 requests outstanding")),
            "{message:?}"
        );
        let error = operator
            .process_record(Key64(4), None, 0, &mut out)
            .expect_err("a call failed with no retry");
        assert!(error.to_string().contains("overloaded"), "{error}");
        assert_eq!(client.borrow().stats().requests, 2);
        let outbox = std::mem::take(&mut client.borrow_mut().connections[0].outbox);
        let (bytes, expected) = answers(&outbox);
        assert_eq!(expected.len(), 2);
        client.borrow_mut().receive(0, &bytes);
        assert_eq!(client.borrow().outstanding(), 0);
        assert_eq!(client.borrow().stats().values, 2);
    }

    /// A response longer than one value's frame, on a connection with no batch request
    /// outstanding, is malformed as soon as its length is read: the client does not
    /// buffer it.
    #[test]
    fn a_long_response_without_a_batch_outstanding_is_refused_at_its_length() {
        let mut client = unconnected_client();
        let _get = client.get(1);
        let _ = std::mem::take(&mut client.connections[0].outbox);
        let mut bytes = (2u32 << 20).to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0; 100]);
        client.receive(0, &bytes);
        assert_eq!(client.stats().malformed, 0, "not whole yet");
        client.receive(0, &[0; 100]);
        assert_eq!(client.stats().malformed, 1);
        assert_eq!(client.outstanding(), 0);
        assert!(client.connections[0].inbox.is_empty());
    }

    /// A batched operator over `client`: batches of up to `max` records, cut at the end
    /// of each turn (the harness's timer pass).
    fn batched(
        client: &Rc<RefCell<LookupClient<Key64>>>,
        max: usize,
        mode: weir_engine::async_io::OutputMode,
    ) -> weir_engine::async_io::AsyncHarness<
        weir_engine::async_io::Batched<LookupBatchFunction<Key64>>,
    > {
        use weir_engine::async_io::{AsyncConfig, AsyncHarness, BatchConfig, Batched};
        AsyncHarness::new(
            Batched::new(
                LookupBatchFunction::new(Rc::clone(client)),
                BatchConfig::new(max, Duration::ZERO),
            ),
            AsyncConfig::new(mode, 64),
        )
        .expect("harness")
    }

    /// The batch requests in `outbox`: each one's id and keys.
    fn batch_requests(outbox: &[u8]) -> Vec<(u64, Vec<u64>)> {
        use crate::lookup::protocol::{batch_keys, decode_request_frame, RequestFrame};
        let mut offset = 0;
        let mut batches = Vec::new();
        while let Some((frame, used)) = decode_request_frame(&outbox[offset..]).expect("valid") {
            offset += used;
            match frame {
                RequestFrame::Batch { request_id, keys } => {
                    batches.push((request_id, batch_keys(keys).collect()))
                }
                RequestFrame::One(request) => batches.push((request.request_id, vec![request.key])),
            }
        }
        assert_eq!(offset, outbox.len());
        batches
    }

    /// A batch response: key `k`'s value is `k % 40` bytes, or an error where `fail`.
    fn batch_response(out: &mut Vec<u8>, id: u64, keys: &[u64], fail: impl Fn(u64) -> bool) {
        use crate::lookup::protocol::{
            begin_batch_response, finish_batch_response, push_batch_outcome,
        };
        let start = begin_batch_response(out, id, keys.len());
        for &key in keys {
            if fail(key) {
                push_batch_outcome(out, STATUS_ERROR, b"bad key");
            } else {
                push_batch_outcome(out, STATUS_OK, &vec![key as u8; (key % 40) as usize]);
            }
        }
        finish_batch_response(out, start);
    }

    /// Each batch the operator cuts goes as one batch request (a batch of one as a plain
    /// request), and its response, answered out of order and cut at any size, completes
    /// each record with its own value, in the operator's order.
    #[test]
    fn batches_go_as_batch_requests_and_map_back_to_their_records() {
        use weir_engine::async_io::OutputMode;
        for split in [1, 3, 17, 100_000] {
            let client = Rc::new(RefCell::new(unconnected_client()));
            let mut harness = batched(&client, 4, OutputMode::Ordered);
            for key in 0..9 {
                harness.process_record(Key64(key), None).expect("room");
            }
            harness.advance_time(Duration::ZERO).expect("cut");
            let outbox = std::mem::take(&mut client.borrow_mut().connections[0].outbox);
            let batches = batch_requests(&outbox);
            let keys: Vec<Vec<u64>> = batches.iter().map(|(_, k)| k.clone()).collect();
            assert_eq!(keys, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8]]);
            let mut bytes = Vec::new();
            for (id, keys) in batches.iter().rev() {
                if keys.len() == 1 {
                    let value = vec![keys[0] as u8; (keys[0] % 40) as usize];
                    encode_response(&mut bytes, *id, STATUS_OK, &value);
                } else {
                    batch_response(&mut bytes, *id, keys, |_| false);
                }
            }
            for piece in bytes.chunks(split) {
                client.borrow_mut().receive(0, piece);
            }
            harness.run_mailbox().expect("no failure");
            let lengths: Vec<usize> = harness
                .take_output()
                .into_iter()
                .filter_map(|e| e.as_record().map(|r| r.value))
                .collect();
            assert_eq!(lengths, (0..9).collect::<Vec<usize>>(), "split {split}");
            let stats = client.borrow().stats();
            assert_eq!((stats.requests, stats.batches, stats.values), (9, 2, 9));
            assert_eq!(client.borrow().outstanding(), 0);
        }
    }

    /// An error outcome in a batch response fails its own record only, with the
    /// service's message and that record's key.
    #[test]
    fn an_error_outcome_fails_only_its_record() {
        use weir_engine::async_io::{AsyncError, OperatorError, OutputMode};
        let client = Rc::new(RefCell::new(unconnected_client()));
        let mut harness = batched(&client, 8, OutputMode::Unordered);
        for key in [10, 11, 12] {
            harness.process_record(Key64(key), None).expect("room");
        }
        harness.advance_time(Duration::ZERO).expect("cut");
        let outbox = std::mem::take(&mut client.borrow_mut().connections[0].outbox);
        let batches = batch_requests(&outbox);
        assert_eq!(batches.len(), 1);
        let mut bytes = Vec::new();
        batch_response(&mut bytes, batches[0].0, &batches[0].1, |k| k == 11);
        client.borrow_mut().receive(0, &bytes);
        let error = harness
            .run_mailbox()
            .expect_err("key 11 failed, no retries");
        match error {
            OperatorError::Async(AsyncError::Call(inner)) => match inner.downcast_ref::<NetError>()
            {
                Some(NetError::Service { key, message }) => {
                    assert_eq!((*key, message.as_str()), (11, "bad key"))
                }
                other => panic!("not a service error: {other:?}"),
            },
            other => panic!("not a call error: {other}"),
        }
        let stats = client.borrow().stats();
        assert_eq!((stats.values, stats.failed), (2, 1));
    }

    /// A batch response with the wrong number of outcomes, or a single value for a
    /// batch, is malformed: the batch's records fail and the connection closes.
    #[test]
    fn a_batch_answered_wrongly_fails_its_records_and_the_connection() {
        for wrong in ["count", "single"] {
            let client = Rc::new(RefCell::new(unconnected_client()));
            let mut harness = batched(&client, 8, weir_engine::async_io::OutputMode::Unordered);
            for key in [1, 2, 3] {
                harness.process_record(Key64(key), None).expect("room");
            }
            harness.advance_time(Duration::ZERO).expect("cut");
            let outbox = std::mem::take(&mut client.borrow_mut().connections[0].outbox);
            let (id, keys) = batch_requests(&outbox).remove(0);
            let mut bytes = Vec::new();
            match wrong {
                "count" => batch_response(&mut bytes, id, &keys[..2], |_| false),
                _ => encode_response(&mut bytes, id, STATUS_OK, b"v"),
            }
            client.borrow_mut().receive(0, &bytes);
            let error = harness.run_mailbox().expect_err("malformed");
            assert!(error.to_string().contains("malformed"), "{wrong}: {error}");
            let client = client.borrow();
            assert_eq!(client.stats().malformed, 1, "{wrong}");
            assert_eq!(client.outstanding(), 0, "{wrong}");
            assert!(client.connections[0].close, "{wrong}");
        }
    }

    /// A malformed length prefix split across receives closes the connection and fails
    /// its requests, after completing the whole frames before it.
    #[test]
    fn a_malformed_frame_split_across_receives_fails_the_rest() {
        let mut client = unconnected_client();
        let first = client.get(1);
        let second = client.get(2);
        let outbox = std::mem::take(&mut client.connections[0].outbox);
        let (id, _) = decode_request(&outbox).expect("valid").expect("whole");
        let mut bytes = Vec::new();
        encode_response(&mut bytes, id.request_id, STATUS_OK, b"one");
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        let split = bytes.len() - 2;
        client.receive(0, &bytes[..split]);
        assert_eq!(client.stats().values, 1);
        assert_eq!(client.stats().malformed, 0);
        client.receive(0, &bytes[split..]);
        assert_eq!(client.stats().malformed, 1);
        assert_eq!(client.outstanding(), 0);
        assert!(client.connections[0].close);
        assert!(matches!(
            first.0.outcome.borrow_mut().take(),
            Some(Ok(value)) if value == b"one"
        ));
        assert!(matches!(second.0.outcome.borrow_mut().take(), Some(Err(_))));
    }

    /// An expired request closes its connection only when no request sent after it on
    /// that connection was answered: one the service stalled on while answering a
    /// later one expires alone; one with nothing answered after it (it may be unread,
    /// still queued) closes the connection, failing the rest with
    /// `NetError::Unanswered`. Also past the first 2^32 request numbers.
    #[test]
    fn expiry_closes_a_connection_only_when_nothing_after_the_request_was_answered() {
        let timeout_ns = 1_000_000;
        for first in [0, u64::from(u32::MAX) - 1] {
            let mut client = LookupClient::<Key64>::new(ClientConfig {
                addr: "127.0.0.1:9".parse().expect("address"),
                connections: 1,
                capacity: 8,
                request_timeout: Duration::from_nanos(timeout_ns),
                connect_timeout: ClientConfig::CONNECT_TIMEOUT_DEFAULT,
            })
            .expect("client");
            client.connections[0].sent = first;
            client.connections[0].read_until = first;
            client.expire(0);
            let stalled = client.get(1);
            let _answered = client.get(2);
            let outbox = std::mem::take(&mut client.connections[0].outbox);
            let (_, used) = decode_request(&outbox).expect("valid").expect("whole");
            let (second, _) = decode_request(&outbox[used..])
                .expect("valid")
                .expect("whole");
            let mut bytes = Vec::new();
            encode_response(&mut bytes, second.request_id, STATUS_OK, b"v");
            client.receive(0, &bytes);
            client.expire(2 * timeout_ns);
            assert_eq!(client.outstanding(), 0, "first request {first}");
            assert!(!client.connections[0].close, "first request {first}");
            let timed_out = stalled.0.outcome.borrow_mut().take();
            assert!(
                matches!(&timed_out, Some(Err(e)) if e.to_string().contains("no answer")),
                "{timed_out:?}"
            );
            let _unread = client.get(3);
            client.expire(2 * timeout_ns + timeout_ns / 2);
            let behind = client.get(4);
            client.expire(3 * timeout_ns + timeout_ns / 4);
            assert!(client.connections[0].close, "first request {first}");
            assert_eq!(client.outstanding(), 0, "first request {first}");
            assert_eq!(client.connections[0].outbox.len(), 0);
            assert_eq!(
                client.connections[0].read_until, client.connections[0].sent,
                "nothing left unread"
            );
            match behind.0.outcome.borrow_mut().take() {
                Some(Err(AsyncError::Call(error))) => assert!(
                    matches!(
                        error.downcast_ref::<NetError>(),
                        Some(NetError::Unanswered { .. })
                    ),
                    "{error}"
                ),
                other => panic!("first request {first}: {other:?}"),
            }
            assert_eq!(client.stats().failed, 3);
        }
    }

    /// Expiry keeps nothing per answered request and fails an unanswered one within an
    /// eighth of the timeout after its deadline, once.
    #[test]
    fn unanswered_requests_expire_and_answered_ones_never_do() {
        let timeout_ns = 10_000_000_000;
        let mut client = LookupClient::<Key64>::new(ClientConfig {
            addr: "127.0.0.1:9".parse().expect("address"),
            connections: 1,
            capacity: 64,
            request_timeout: Duration::from_nanos(timeout_ns),
            connect_timeout: ClientConfig::CONNECT_TIMEOUT_DEFAULT,
        })
        .expect("client");
        let mut responses = Vec::new();
        for round in 0..1_000u64 {
            client.expire(round * 1_000);
            let gets: Vec<Get> = (0..8).map(|i| client.get(round * 8 + i)).collect();
            let outbox = std::mem::take(&mut client.connections[0].outbox);
            responses.clear();
            let mut offset = 0;
            while let Some((request, used)) = decode_request(&outbox[offset..]).expect("valid") {
                encode_response(&mut responses, request.request_id, STATUS_OK, b"v");
                offset += used;
            }
            client.receive(0, &responses);
            assert_eq!(client.outstanding(), 0);
            drop(gets);
        }
        assert_eq!(client.stats().values, 8_000);
        assert!(
            client.expired.capacity() <= 64,
            "nothing grows with requests sent"
        );
        // One left unanswered at 1 ms: not failed before its deadline, failed within an
        // eighth of the timeout after it, once.
        client.expire(1_000_000);
        let _get = client.get(1);
        client.expire(1_000_000 + timeout_ns - 1);
        assert_eq!(client.outstanding(), 1);
        for step in 0..=8 {
            client.expire(1_000_000 + timeout_ns + step * timeout_ns / 64);
        }
        assert_eq!(client.outstanding(), 0);
        assert_eq!(client.stats().failed, 1);
        client.expire(1_000_000 + 3 * timeout_ns);
        assert_eq!(client.stats().failed, 1);
    }
}
