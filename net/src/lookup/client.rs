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
//! hottest path, for a safety net behind the operator's own timeout.) Failures are [`AsyncError::Call`], so the operator's retries
//! apply. A connection that went away is re-established on the next request.

use std::cell::RefCell;
use std::net::{SocketAddr, TcpStream};
use std::rc::Rc;
use std::time::Duration;

use weir_engine::async_io::{AsyncError, AsyncFunction, ResultFuture};
use weir_engine::slab::{Key, Slab};

use super::protocol::{
    decode_response, encode_request, response_size, Malformed, Response, STATUS_OK,
};
use crate::error::NetError;
use weir_engine::runtime::{ConnId, Driver, DriverEvent};

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
    /// Requests outstanding at most (beyond: the call fails with "overloaded").
    pub capacity: usize,
    /// A request unanswered this long is failed.
    pub request_timeout: Duration,
}

/// What a client did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Requests sent.
    pub requests: u64,
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
    id: Option<ConnId>,
    outbox: Vec<u8>,
    /// The head of a response frame split across receives; never a whole frame.
    inbox: Vec<u8>,
    close: bool,
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
}

/// An outstanding request (kept small: one is written and read per lookup). Its key is
/// the sink's: the request's own, or the one a future waits for.
struct Pending<R: LookupRequest> {
    /// The index of the connection it went out on.
    connection: u32,
    sink: Sink<R>,
    /// When it expires.
    deadline_ns: u64,
}

/// The shared slot between a pending lookup and its [`Get`] future.
#[derive(Default)]
struct Slot {
    outcome: RefCell<Option<Result<Vec<u8>, String>>>,
    waker: RefCell<Option<std::task::Waker>>,
}

impl Slot {
    fn fill(&self, outcome: Result<Vec<u8>, String>) {
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
            Some(outcome) => std::task::Poll::Ready(outcome.map_err(AsyncError::call)),
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
        }
    }
}

/// Fails a lookup with `message`: the client was full, or its request failed (an error
/// answer, expiry, a closed connection or a malformed frame; all rare, hence cold).
#[cold]
fn sink_failed<R: LookupRequest>(sink: Sink<R>, message: String) {
    match sink {
        Sink::Call { result, .. } => result.complete_err(AsyncError::call(message)),
        Sink::Wait { slot, .. } => slot.fill(Err(message)),
    }
}

impl<R: LookupRequest> Pending<R> {
    fn succeed(self, value: &[u8]) {
        match self.sink {
            Sink::Call { request, result } => result.complete_one(request.complete(value)),
            Sink::Wait { slot, .. } => slot.fill(Ok(value.to_vec())),
        }
    }

    fn fail(self, message: String) {
        sink_failed(self.sink, message);
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
        let pending = Slab::new(config.capacity).map_err(|e| NetError::Config(e.to_string()))?;
        let connections = (0..config.connections)
            .map(|_| Connection {
                id: None,
                outbox: Vec::new(),
                inbox: Vec::new(),
                close: false,
            })
            .collect();
        Ok(LookupClient {
            timeout_ns: u64::try_from(config.request_timeout.as_nanos()).unwrap_or(u64::MAX),
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

    /// Requests waiting for an answer.
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
        let deadline_ns = self.now_ns.saturating_add(self.timeout_ns);
        let mut sink = Some(sink);
        match self.pending.insert_with(|| Pending {
            connection: connection as u32,
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
            "lookup client overloaded: {} requests outstanding",
            self.pending.len()
        );
        sink_failed(sink, message);
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
        encode_request(&mut self.connections[connection].outbox, slot.to_u64(), key);
        self.stats.requests += 1;
    }

    /// Hands the outboxes to `driver`, connecting where needed, and closes connections
    /// marked for closing.
    pub fn flush(&mut self, driver: &mut dyn Driver) {
        for index in 0..self.connections.len() {
            if self.connections[index].close {
                self.connections[index].close = false;
                if let Some(id) = self.connections[index].id.take() {
                    driver.close(id);
                }
            }
            if self.connections[index].outbox.is_empty() {
                continue;
            }
            if self.connections[index].id.is_none() {
                match TcpStream::connect(self.config.addr)
                    .map_err(|e| NetError::io("connecting to the lookup service", e))
                {
                    Ok(stream) => match driver
                        .register(stream.into())
                        .map_err(|e| NetError::io("registering a connection", e))
                    {
                        Ok(id) => {
                            self.connections[index].id = Some(id);
                            self.connections[index].inbox.clear();
                            self.stats.connects += 1;
                        }
                        Err(error) => self.fail_connection(index, &error),
                    },
                    Err(error) => self.fail_connection(index, &error),
                }
            }
            let connection = &mut self.connections[index];
            if let Some(id) = connection.id {
                driver.send(id, &mut connection.outbox);
            }
        }
    }

    /// Takes a driver event for one of this client's connections; returns whether it was.
    pub fn on_event(&mut self, event: &DriverEvent<'_>) -> bool {
        let (conn, received) = match event {
            DriverEvent::Received { conn, bytes } => (*conn, Some(*bytes)),
            DriverEvent::Closed { conn, .. } => (*conn, None),
        };
        let Some(index) = self.connections.iter().position(|c| c.id == Some(conn)) else {
            return false;
        };
        match received {
            Some(bytes) => self.receive(index, bytes),
            None => {
                let error = match event {
                    DriverEvent::Closed {
                        error: Some(error), ..
                    } => NetError::io(
                        "lookup connection",
                        std::io::Error::new(error.kind(), error.to_string()),
                    ),
                    _ => NetError::Closed {
                        peer: self.config.addr.to_string(),
                        pending: self.count_on(index),
                    },
                };
                self.connections[index].id = None;
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
            if let Some(pending) = self.pending.remove(slot) {
                self.stats.failed += 1;
                let message = format!(
                    "no answer from the lookup service within {}",
                    super::format_duration(self.config.request_timeout)
                );
                pending.fail(message);
            }
        }
        self.expired = expired;
    }

    /// Removes an outstanding request that is answered or failed.
    fn take(&mut self, slot: Key) -> Option<Pending<R>> {
        self.pending.remove(slot)
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
        if response.status == STATUS_OK {
            self.stats.values += 1;
            pending.succeed(response.value);
        } else {
            self.stats.failed += 1;
            let error = NetError::Service {
                key: pending.sink.key(),
                message: String::from_utf8_lossy(response.value).into_owned(),
            };
            pending.fail(error.to_string());
        }
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

    /// Fails every request outstanding on connection `index` with `error`.
    fn fail_connection(&mut self, index: usize, error: &NetError) {
        let slots: Vec<Key> = self
            .pending
            .iter()
            .filter(|(_, p)| p.connection as usize == index)
            .map(|(k, _)| k)
            .collect();
        for slot in slots {
            if let Some(pending) = self.take(slot) {
                self.stats.failed += 1;
                pending.fail(error.to_string());
            }
        }
        let connection = &mut self.connections[index];
        connection.outbox.clear();
        connection.inbox.clear();
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
                    (Err(message), Err(())) => proptest::prop_assert!(message.contains("no")),
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
            matches!(&message, Some(Err(m)) if m.contains("overloaded: 2 requests outstanding")),
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
        assert_eq!(
            first.0.outcome.borrow_mut().take(),
            Some(Ok(b"one".to_vec()))
        );
        assert!(matches!(second.0.outcome.borrow_mut().take(), Some(Err(_))));
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
