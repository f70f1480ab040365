//! The lookup service: the embedded external system of the main job and benches.
//!
//! A TCP server on its own thread (an epoll event loop through `mio`) answering each
//! request after a latency drawn from a [`Latency`] distribution. Delays are not
//! sleeps: answers wait for their time in a deadline queue (`Answers`), so many thousands of requests
//! wait at once and answers leave out of order. Fault injection: error responses,
//! connection resets, stalls (a request is never answered) and malformed frames, each
//! at a rate.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use weir_engine::timer::TimerWheel;

use super::latency::{Latency, Rng};
use super::protocol::{
    batch_keys, batch_response_len, begin_batch_response, decode_request_frame, encode_response,
    finish_batch_response, push_batch_outcome, request_size, Malformed, RequestFrame,
    RESPONSE_LEN_MAX, STATUS_ERROR, STATUS_OK, VALUE_LEN_MAX,
};
use crate::error::NetError;

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const TIMER: Token = Token(2);
const FIRST_CONNECTION: usize = 3;

/// Faults the service injects, each a probability per request frame (a batch request is
/// reset, stalled or answered malformed whole; its error answers are drawn per key).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    /// Answer with an error status.
    pub error_rate: f64,
    /// Close the connection instead of answering (the client sees a reset).
    pub reset_rate: f64,
    /// Never answer.
    pub stall_rate: f64,
    /// Answer with bytes that are not a frame.
    pub malformed_rate: f64,
}

/// Settings of a lookup service.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where to listen (port 0: any free port).
    pub addr: SocketAddr,
    /// Delay before each answer.
    pub latency: Latency,
    /// Bytes of each value.
    pub value_size: usize,
    /// Injected faults.
    pub faults: Faults,
    /// Seed of latency and fault sampling.
    pub seed: u64,
    /// Core to pin the service thread to (benchmarks keep it off the workers' cores).
    pub core: Option<usize>,
    /// Answer on time: when the next answer is due within `spin`, the service polls its
    /// sockets without sleeping instead of waiting for its timer, so answers leave at
    /// their deadline rather than one wake-up later (an idle core takes tens of
    /// microseconds to wake, more on a virtual machine). It keeps the service's core
    /// busy for that long before each deadline: use it when the service has a core of
    /// its own (the benchmarks pin it to one). Zero (the default): always sleep.
    pub spin: Duration,
    /// Timer slack: the service's timer wakes it this long after the earliest answer's
    /// time, so that the answers due within the slack after it leave together at one
    /// expiry instead of one wake-up each; answers leave up to this much after their
    /// time (never before it). Requests still wake it as they arrive (their answers are
    /// sent at once if due). Zero (the default): a wake-up per answer's time.
    pub slack: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            latency: Latency::Fixed(Duration::ZERO),
            value_size: 32,
            faults: Faults::default(),
            seed: 1,
            core: None,
            spin: Duration::ZERO,
            slack: Duration::ZERO,
        }
    }
}

/// What the service did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Lookups read (a batch request's keys each count; so do the counts below).
    pub requests: u64,
    /// Lookups answered with a value.
    pub answered: u64,
    /// Lookups answered with an error.
    pub errors: u64,
    /// Lookups whose connection was reset on purpose instead of answering.
    pub resets: u64,
    /// Lookups never answered on purpose.
    pub stalls: u64,
    /// Lookups answered with a malformed frame on purpose.
    pub malformed: u64,
    /// CPU time of the service thread (user + system) as last published: when it
    /// stopped, or at the last [`LookupServer::cpu_ns`] call; 0 before either.
    pub cpu_ns: u64,
}

#[derive(Default)]
struct Counters {
    cpu_ns: AtomicU64,
    /// Publications of `cpu_ns` asked for (written by [`LookupServer::cpu_ns`]).
    cpu_asked: AtomicU64,
    /// The last `cpu_asked` the service answered by publishing `cpu_ns` (written by the
    /// service thread).
    cpu_answered: AtomicU64,
    requests: AtomicU64,
    answered: AtomicU64,
    errors: AtomicU64,
    resets: AtomicU64,
    stalls: AtomicU64,
    malformed: AtomicU64,
}

/// A running lookup service; stops when dropped. A graph reaches it through
/// [`lookup_function`](super::lookup_function) (the enrichment example of the guide's
/// getting-started chapter, `net/examples/enrichment.rs`, runs both).
///
/// ```
/// use std::time::Duration;
/// use weir_net::lookup::{Latency, LookupServer, ServerConfig};
///
/// // On a free loopback port, each answer 1 ms after its request, 64-byte values.
/// let server = LookupServer::start(ServerConfig {
///     latency: Latency::Fixed(Duration::from_millis(1)),
///     value_size: 64,
///     ..ServerConfig::default()
/// })?;
/// assert!(server.addr().ip().is_loopback());
/// let stats = server.stop();
/// assert_eq!(stats.requests, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct LookupServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    counters: Arc<Counters>,
    thread: Option<JoinHandle<()>>,
    core: Option<usize>,
}

impl LookupServer {
    /// Binds and starts the service thread.
    pub fn start(config: ServerConfig) -> Result<Self, NetError> {
        if config.value_size > VALUE_LEN_MAX {
            return Err(NetError::Config(format!(
                "value size {} exceeds the protocol's maximum of {VALUE_LEN_MAX}",
                config.value_size
            )));
        }
        for (name, rate) in [
            ("error", config.faults.error_rate),
            ("reset", config.faults.reset_rate),
            ("stall", config.faults.stall_rate),
            ("malformed", config.faults.malformed_rate),
        ] {
            if !(0.0..=1.0).contains(&rate) {
                return Err(NetError::Config(format!(
                    "{name} rate {rate} outside 0..=1"
                )));
            }
        }
        let listener = TcpListener::bind(config.addr)
            .map_err(|e| NetError::io("binding the lookup service", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| NetError::io("reading the bound address", e))?;
        let poll = Poll::new().map_err(|e| NetError::io("creating the service's poll", e))?;
        let waker = Arc::new(
            Waker::new(poll.registry(), WAKER).map_err(|e| NetError::io("creating a waker", e))?,
        );
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let timer = TimerFd::new().map_err(|e| NetError::io("creating a timerfd", e))?;
        poll.registry()
            .register(
                &mut mio::unix::SourceFd(&timer.raw()),
                TIMER,
                Interest::READABLE,
            )
            .map_err(|e| NetError::io("registering the timerfd", e))?;
        let mut event_loop = EventLoop {
            poll,
            timer,
            buffer: vec![0; 64 * 1024].into_boxed_slice(),
            listener,
            connections: slab::Slab::new(),
            next_generation: 0,
            answers: Answers::new(),
            epoch: Instant::now(),
            rng: Rng::new(config.seed),
            config,
            stop: Arc::clone(&stop),
            counters: Arc::clone(&counters),
            local: ServerStats::default(),
            armed_ns: None,
            scratch_tokens: Vec::new(),
            value: Vec::new(),
            value_key: None,
            cpu_answered: 0,
            batches: slab::Slab::new(),
        };
        event_loop
            .poll
            .registry()
            .register(&mut event_loop.listener, LISTENER, Interest::READABLE)
            .map_err(|e| NetError::io("registering the listener", e))?;
        let core = event_loop.config.core;
        let (pinned_tx, pinned_rx) = std::sync::mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("weir-lookup".into())
            .spawn(move || {
                let pinned = core.filter(|&id| {
                    let pinned = core_affinity::set_for_current(core_affinity::CoreId { id });
                    if !pinned {
                        eprintln!(
                            "weir lookup service: could not pin to core {id}; running unpinned"
                        );
                    }
                    pinned
                });
                let _ = pinned_tx.send(pinned);
                event_loop.run()
            })
            .map_err(|e| NetError::io("spawning the service thread", e))?;
        // The thread reports its placement before it serves anything.
        let core = pinned_rx.recv().unwrap_or(None);
        Ok(LookupServer {
            addr,
            stop,
            waker,
            counters,
            thread: Some(thread),
            core,
        })
    }

    /// The core the service thread is pinned to: the configured one if pinning took
    /// effect, else `None` (it runs wherever the scheduler puts it).
    pub fn core(&self) -> Option<usize> {
        self.core
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What it has done so far.
    pub fn stats(&self) -> ServerStats {
        let c = &self.counters;
        ServerStats {
            requests: c.requests.load(Ordering::Relaxed),
            answered: c.answered.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            resets: c.resets.load(Ordering::Relaxed),
            stalls: c.stalls.load(Ordering::Relaxed),
            malformed: c.malformed.load(Ordering::Relaxed),
            cpu_ns: c.cpu_ns.load(Ordering::Relaxed),
        }
    }

    /// CPU time the service thread has used so far (user + system), in ns: asks the
    /// thread to publish it and waits for the answer (it comes at the end of the loop
    /// turn under way, or at once if the thread is waiting for events). The thread
    /// reads its clock only when asked, so serving costs no system call for it. After
    /// the thread stopped, or if it does not answer within a second, the last published
    /// figure.
    pub fn cpu_ns(&self) -> u64 {
        let c = &self.counters;
        let asked = c.cpu_asked.fetch_add(1, Ordering::Relaxed) + 1;
        let _ = self.waker.wake();
        let deadline = Instant::now() + Duration::from_secs(1);
        // Acquire: pairs with the service's Release store of `cpu_answered`, after its
        // store of `cpu_ns`.
        while c.cpu_answered.load(Ordering::Acquire) < asked {
            if self.thread.as_ref().is_none_or(|t| t.is_finished()) || Instant::now() > deadline {
                break;
            }
            std::thread::yield_now();
        }
        c.cpu_ns.load(Ordering::Relaxed)
    }

    /// Stops the service and waits for its thread.
    pub fn stop(mut self) -> ServerStats {
        self.shutdown();
        self.stats()
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.waker.wake();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for LookupServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// CPU time the calling thread has used (user + system), in ns; 0 if the clock cannot
/// be read.
pub fn thread_cpu_ns() -> u64 {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `time` is a valid timespec for the call to fill; the result is checked.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time) } != 0 {
        return 0;
    }
    time.tv_sec as u64 * 1_000_000_000 + time.tv_nsec as u64
}

/// A timerfd: epoll's own timeout has millisecond resolution (mio rounds up), which
/// would add up to a millisecond to every answer; the timerfd wakes the loop at the
/// exact deadline.
struct TimerFd(std::os::fd::OwnedFd);

impl TimerFd {
    fn new() -> io::Result<Self> {
        // SAFETY: no memory is passed; the result is checked.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        Ok(TimerFd(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) }))
    }

    fn raw(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.0)
    }

    /// Fires once after `delay` (at least 1 ns: zero would disarm it).
    fn arm(&self, delay: Duration) {
        let delay = delay.max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: delay.as_secs() as libc::time_t,
                tv_nsec: delay.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: `spec` is a valid itimerspec; the old value is not requested.
        unsafe { libc::timerfd_settime(self.raw(), 0, &spec, std::ptr::null_mut()) };
    }

    fn drain(&self) {
        let mut expirations: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live u64; EAGAIN is fine.
        unsafe { libc::read(self.raw(), (&mut expirations as *mut u64).cast(), 8) };
    }
}

struct Connection {
    stream: TcpStream,
    generation: u64,
    inbox: Vec<u8>,
    outbox: Vec<u8>,
}

/// An answer waiting for its time.
#[derive(Debug, Clone, Copy)]
struct Waiting {
    token: usize,
    generation: u64,
    request_id: u64,
    /// The key; for a batch, its keys' index in `EventLoop::batches`.
    key: u64,
    batch: bool,
}

/// The answers waiting for their time, earliest first.
///
/// Answers due in the order they were scheduled (a fixed latency, the main job's and
/// most benches': every request's answer is due after the previous one's) queue in a
/// FIFO, pushed and popped in O(1); an answer due before the FIFO's last goes to a
/// hashed timing wheel, which sorts any order. The earliest of the two heads leaves
/// first. (A wheel for every answer cost a node linked, a bitmap search and an unlink
/// per request: about a quarter of the service thread's samples in the main job's
/// profile.)
struct Answers {
    in_order: VecDeque<(u64, Waiting)>,
    out_of_order: TimerWheel<Waiting>,
}

impl Answers {
    fn new() -> Self {
        Answers {
            in_order: VecDeque::new(),
            out_of_order: TimerWheel::new(65_536, 4096),
        }
    }

    fn schedule(&mut self, due_ns: u64, waiting: Waiting) {
        match self.in_order.back() {
            Some(&(last, _)) if due_ns < last => {
                self.out_of_order.schedule(due_ns, waiting);
            }
            _ => self.in_order.push_back((due_ns, waiting)),
        }
    }

    fn next_deadline(&self) -> Option<u64> {
        let first = self.in_order.front().map(|&(due, _)| due);
        first
            .into_iter()
            .chain(self.out_of_order.next_deadline())
            .min()
    }

    /// The earliest answer due at or before `now_ns`.
    fn pop_due(&mut self, now_ns: u64) -> Option<Waiting> {
        let first = self
            .in_order
            .front()
            .map(|&(due, _)| due)
            .filter(|&due| due <= now_ns);
        let sorted = self.out_of_order.peek_due(now_ns);
        match (first, sorted) {
            (Some(a), b) if b.is_none_or(|b| a <= b) => {
                self.in_order.pop_front().map(|(_, waiting)| waiting)
            }
            (_, Some(_)) => self
                .out_of_order
                .pop_due(now_ns)
                .map(|(_, waiting)| waiting),
            (_, None) => None,
        }
    }
}

struct EventLoop {
    poll: Poll,
    timer: TimerFd,
    /// Receive buffer, reused (zeroing 64 KiB per read showed up in profiles).
    buffer: Box<[u8]>,
    listener: TcpListener,
    /// Connections by mio token − `FIRST_CONNECTION` (a slab: no hashing per request;
    /// a reused slot gets a new generation, which stale timers are checked against).
    connections: slab::Slab<Connection>,
    next_generation: u64,
    answers: Answers,
    epoch: Instant,
    rng: Rng,
    config: ServerConfig,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    /// Counts of the current loop, published once per loop.
    local: ServerStats,
    /// The deadline the timerfd is armed for.
    armed_ns: Option<u64>,
    scratch_tokens: Vec<usize>,
    value: Vec<u8>,
    /// The key `value` was filled for.
    value_key: Option<u64>,
    /// The last `Counters::cpu_asked` answered (the service's copy of `cpu_answered`).
    cpu_answered: u64,
    /// The keys of the batch requests waiting for their answer.
    batches: slab::Slab<Vec<u64>>,
}

impl EventLoop {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        let slack_ns = self.config.slack.as_nanos() as u64;
        while !self.stop.load(Ordering::Relaxed) {
            let now = self.now_ns();
            let spin_ns = self.config.spin.as_nanos() as u64;
            let timeout = match self.answers.next_deadline() {
                Some(deadline) if deadline <= now.saturating_add(spin_ns) => Some(Duration::ZERO),
                Some(deadline) => {
                    // Wake `spin` early, then poll until the deadline; or, with a timer
                    // slack, `slack` late, so that the answers due within the slack
                    // after the earliest leave together at one expiry. One
                    // timerfd_settime per new earliest deadline, not per loop.
                    let wake = (deadline - spin_ns).saturating_add(slack_ns);
                    if self.armed_ns != Some(wake) {
                        self.timer.arm(Duration::from_nanos(wake - now));
                        self.armed_ns = Some(wake);
                    }
                    None
                }
                None => None,
            };
            if let Err(error) = self.poll.poll(&mut events, timeout) {
                if error.kind() != io::ErrorKind::Interrupted {
                    eprintln!("weir lookup service: poll failed: {error}");
                    return;
                }
            }
            for event in events.iter() {
                match event.token() {
                    LISTENER => self.accept(),
                    WAKER => {}
                    TIMER => {
                        self.timer.drain();
                        self.armed_ns = None;
                    }
                    Token(token) => {
                        if event.is_readable() || event.is_read_closed() || event.is_error() {
                            self.read(token);
                        }
                        if event.is_writable() {
                            self.flush(token);
                        }
                    }
                }
            }
            let now = self.now_ns();
            while let Some(waiting) = self.answers.pop_due(now) {
                self.answer(waiting);
            }
            let mut tokens = std::mem::take(&mut self.scratch_tokens);
            tokens.clear();
            tokens.extend(
                self.connections
                    .iter()
                    .filter(|(_, c)| !c.outbox.is_empty())
                    .map(|(slot, _)| slot + FIRST_CONNECTION),
            );
            for &token in &tokens {
                self.flush(token);
            }
            self.scratch_tokens = tokens;
            self.publish_counts();
            self.publish_cpu();
        }
        self.publish_counts();
        self.counters
            .cpu_ns
            .store(thread_cpu_ns(), Ordering::Relaxed);
    }

    /// Publishes the thread's CPU time if [`LookupServer::cpu_ns`] asked for it since the
    /// last publication: one shared load per loop, and a clock read only when asked.
    fn publish_cpu(&mut self) {
        let asked = self.counters.cpu_asked.load(Ordering::Relaxed);
        if asked == self.cpu_answered {
            return;
        }
        self.counters
            .cpu_ns
            .store(thread_cpu_ns(), Ordering::Relaxed);
        self.cpu_answered = asked;
        // Release: publishes the `cpu_ns` store; pairs with the Acquire load in
        // `LookupServer::cpu_ns`.
        self.counters.cpu_answered.store(asked, Ordering::Release);
    }

    /// Publishes the loop's counts to the shared counters: one atomic add per counter
    /// and loop, not per request.
    fn publish_counts(&mut self) {
        let local = std::mem::take(&mut self.local);
        let shared = &self.counters;
        for (count, counter) in [
            (local.requests, &shared.requests),
            (local.answered, &shared.answered),
            (local.errors, &shared.errors),
            (local.resets, &shared.resets),
            (local.stalls, &shared.stalls),
            (local.malformed, &shared.malformed),
        ] {
            if count > 0 {
                counter.fetch_add(count, Ordering::Relaxed);
            }
        }
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let token = self.connections.vacant_key() + FIRST_CONNECTION;
                    let generation = self.next_generation;
                    self.next_generation += 1;
                    if self
                        .poll
                        .registry()
                        .register(
                            &mut stream,
                            Token(token),
                            Interest::READABLE | Interest::WRITABLE,
                        )
                        .is_ok()
                    {
                        self.connections.insert(Connection {
                            stream,
                            generation,
                            inbox: Vec::new(),
                            outbox: Vec::new(),
                        });
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    eprintln!("weir lookup service: accept failed: {e}");
                    return;
                }
            }
        }
    }

    fn close(&mut self, token: usize) {
        if let Some(mut connection) = self
            .connections
            .try_remove(token.wrapping_sub(FIRST_CONNECTION))
        {
            let _ = self.poll.registry().deregister(&mut connection.stream);
        }
    }

    /// Reads what the connection has, serving each read's requests before the next
    /// read (so answers start leaving while later requests are still being read).
    fn read(&mut self, token: usize) {
        let mut buffer = std::mem::take(&mut self.buffer);
        while let Some(connection) = self
            .connections
            .get_mut(token.wrapping_sub(FIRST_CONNECTION))
        {
            match connection.stream.read(&mut buffer) {
                Ok(0) => {
                    self.close(token);
                    break;
                }
                Ok(n) => {
                    if !self.serve(token, &buffer[..n]) {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.close(token);
                    break;
                }
            }
        }
        self.buffer = buffer;
    }

    /// Serves the requests in `bytes`, read from connection `token`: decoded straight
    /// from `bytes`, except a request split across reads, whose head waits in the
    /// connection's inbox (which never holds a whole request). Returns whether the
    /// connection is still open.
    fn serve(&mut self, token: usize, bytes: &[u8]) -> bool {
        let now = self.now_ns();
        let Some(connection) = self
            .connections
            .get_mut(token.wrapping_sub(FIRST_CONNECTION))
        else {
            return false;
        };
        let generation = connection.generation;
        let mut rest = bytes;
        if !connection.inbox.is_empty() {
            // The length prefix first, then the rest of the frame it announces.
            let mut inbox = std::mem::take(&mut connection.inbox);
            let head = 4usize.saturating_sub(inbox.len()).min(rest.len());
            inbox.extend_from_slice(&rest[..head]);
            rest = &rest[head..];
            let size = match request_size(&inbox) {
                Ok(Some(size)) => size,
                Ok(None) => {
                    connection.inbox = inbox;
                    return true;
                }
                Err(malformed) => return self.malformed(token, malformed),
            };
            let body = (size - inbox.len()).min(rest.len());
            inbox.extend_from_slice(&rest[..body]);
            rest = &rest[body..];
            if inbox.len() < size {
                connection.inbox = inbox;
                return true;
            }
            match decode_request_frame(&inbox) {
                Ok(Some((frame, _))) => {
                    if !self.request(token, generation, now, frame) {
                        return false;
                    }
                }
                Ok(None) => unreachable!("the inbox holds a whole request"),
                Err(malformed) => return self.malformed(token, malformed),
            }
            inbox.clear();
            if let Some(connection) = self
                .connections
                .get_mut(token.wrapping_sub(FIRST_CONNECTION))
            {
                // Kept for its capacity.
                connection.inbox = inbox;
            }
        }
        let mut offset = 0;
        loop {
            match decode_request_frame(&rest[offset..]) {
                Ok(Some((frame, used))) => {
                    offset += used;
                    if !self.request(token, generation, now, frame) {
                        return false;
                    }
                }
                Ok(None) => break,
                Err(malformed) => return self.malformed(token, malformed),
            }
        }
        match self
            .connections
            .get_mut(token.wrapping_sub(FIRST_CONNECTION))
        {
            Some(connection) => {
                connection.inbox.extend_from_slice(&rest[offset..]);
                true
            }
            None => false,
        }
    }

    /// Takes one request frame read at `now`: answers it at once, schedules its answer,
    /// or injects a fault (a batch is answered, reset or stalled whole, after one
    /// latency, as a batch API answers; errors are drawn per key). Returns whether the
    /// connection is still open.
    fn request(
        &mut self,
        token: usize,
        generation: u64,
        now: u64,
        frame: RequestFrame<'_>,
    ) -> bool {
        let (request_id, key, batch) = match frame {
            RequestFrame::One(request) => {
                self.local.requests += 1;
                (request.request_id, request.key, false)
            }
            RequestFrame::Batch { request_id, keys } => {
                let keys: Vec<u64> = batch_keys(keys).collect();
                self.local.requests += keys.len() as u64;
                (request_id, self.batches.insert(keys) as u64, true)
            }
        };
        let faults = self.config.faults;
        let waiting = Waiting {
            token,
            generation,
            request_id,
            key,
            batch,
        };
        // Faults are drawn per frame (a batch is reset or stalled whole) and counted per
        // lookup, as the other counters are.
        let lookups = if batch {
            self.batches.get(key as usize).map_or(1, Vec::len) as u64
        } else {
            1
        };
        if self.rng.chance(faults.reset_rate) {
            self.local.resets += lookups;
            self.forget(waiting);
            self.close(token);
            return false;
        }
        if self.rng.chance(faults.stall_rate) {
            self.local.stalls += lookups;
            self.forget(waiting);
            return true;
        }
        let delay = self.config.latency.sample(&mut self.rng).as_nanos() as u64;
        if delay == 0 {
            self.answer(waiting);
        } else {
            self.answers.schedule(now + delay, waiting);
        }
        self.connections
            .contains(token.wrapping_sub(FIRST_CONNECTION))
    }

    /// Drops the keys of a batch that will not be answered.
    fn forget(&mut self, waiting: Waiting) {
        if waiting.batch {
            self.batches.try_remove(waiting.key as usize);
        }
    }

    /// Closes connection `token` for a malformed request; returns false (it is closed).
    fn malformed(&mut self, token: usize, malformed: Malformed) -> bool {
        eprintln!(
            "weir lookup service: malformed request ({}); closing the connection",
            malformed.0
        );
        self.close(token);
        false
    }

    /// Fills `self.value` for `key` (its bytes repeated), unless it holds it already.
    fn fill_value(&mut self, key: u64) {
        if self.value.len() != self.config.value_size {
            self.value = vec![0; self.config.value_size];
            self.value_key = None;
        }
        if self.value_key != Some(key) {
            let bytes = key.to_le_bytes();
            for (chunk, value) in self.value.chunks_mut(8).zip(std::iter::repeat(bytes)) {
                chunk.copy_from_slice(&value[..chunk.len()]);
            }
            self.value_key = Some(key);
        }
    }

    fn answer(&mut self, waiting: Waiting) {
        if waiting.batch {
            return self.answer_batch(waiting);
        }
        let Waiting {
            token,
            generation,
            request_id,
            key,
            ..
        } = waiting;
        let faults = self.config.faults;
        let error = self.rng.chance(faults.error_rate);
        let malformed = self.rng.chance(faults.malformed_rate);
        self.fill_value(key);
        let Some(connection) = self
            .connections
            .get_mut(token.wrapping_sub(FIRST_CONNECTION))
        else {
            return;
        };
        if connection.generation != generation {
            return;
        }
        if malformed {
            self.local.malformed += 1;
            connection.outbox.extend_from_slice(&3u32.to_le_bytes());
            connection.outbox.extend_from_slice(&[0xde, 0xad, 0xbe]);
        } else if error {
            self.local.errors += 1;
            encode_response(
                &mut connection.outbox,
                request_id,
                STATUS_ERROR,
                b"injected error",
            );
        } else {
            self.local.answered += 1;
            encode_response(&mut connection.outbox, request_id, STATUS_OK, &self.value);
        }
    }

    /// Answers a batch request: one batch response, an error injected per key.
    fn answer_batch(&mut self, waiting: Waiting) {
        let Some(keys) = self.batches.try_remove(waiting.key as usize) else {
            return;
        };
        let faults = self.config.faults;
        let malformed = self.rng.chance(faults.malformed_rate);
        let live = self
            .connections
            .get(waiting.token.wrapping_sub(FIRST_CONNECTION))
            .is_some_and(|c| c.generation == waiting.generation);
        if !live {
            return;
        }
        let mut outbox =
            std::mem::take(&mut self.connections[waiting.token - FIRST_CONNECTION].outbox);
        let len = batch_response_len(keys.len(), self.config.value_size.max(14));
        if malformed {
            self.local.malformed += keys.len() as u64;
            outbox.extend_from_slice(&3u32.to_le_bytes());
            outbox.extend_from_slice(&[0xde, 0xad, 0xbe]);
        } else if len > RESPONSE_LEN_MAX {
            // Its answer would not fit in a frame: the whole batch fails, and says why.
            self.local.errors += keys.len() as u64;
            let message = format!(
                "a batch of {} keys of {}-byte values needs a {len}-byte response, over the \
                 protocol's {RESPONSE_LEN_MAX}; send smaller batches",
                keys.len(),
                self.config.value_size
            );
            encode_response(
                &mut outbox,
                waiting.request_id,
                STATUS_ERROR,
                message.as_bytes(),
            );
        } else {
            let start = begin_batch_response(&mut outbox, waiting.request_id, keys.len());
            for &key in &keys {
                if self.rng.chance(faults.error_rate) {
                    self.local.errors += 1;
                    push_batch_outcome(&mut outbox, STATUS_ERROR, b"injected error");
                } else {
                    self.local.answered += 1;
                    self.fill_value(key);
                    push_batch_outcome(&mut outbox, STATUS_OK, &self.value);
                }
            }
            finish_batch_response(&mut outbox, start);
        }
        self.connections[waiting.token - FIRST_CONNECTION].outbox = outbox;
    }

    fn flush(&mut self, token: usize) {
        let Some(connection) = self
            .connections
            .get_mut(token.wrapping_sub(FIRST_CONNECTION))
        else {
            return;
        };
        if crate::driver::flush_outbox(&mut connection.stream, &mut connection.outbox).is_err() {
            self.close(token);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes the answer to `request_id` off `waiting` (due, id): its due time, and the
    /// earliest due time that was waiting.
    fn answered(waiting: &mut Vec<(u64, u64)>, request_id: u64) -> (u64, u64) {
        let earliest = waiting
            .iter()
            .map(|&(due, _)| due)
            .min()
            .expect("one waits");
        let position = waiting
            .iter()
            .position(|&(_, id)| id == request_id)
            .expect("answered once");
        (waiting.swap_remove(position).0, earliest)
    }

    fn waiting_for(request_id: u64) -> Waiting {
        Waiting {
            token: 0,
            generation: 0,
            request_id,
            key: 0,
            batch: false,
        }
    }

    proptest::proptest! {
        /// Answers scheduled with any deadlines (in order, as a fixed latency makes them,
        /// or not, as a distribution does) leave in deadline order, each once, none before
        /// its time; the next deadline is always the earliest waiting one.
        #[test]
        fn answers_leave_in_deadline_order(
            dues in proptest::collection::vec(0u64..50_000_000, 0..300),
            steps in proptest::collection::vec(0u64..5_000_000, 1..40),
        ) {
            let mut answers = Answers::new();
            for (id, &due) in dues.iter().enumerate() {
                answers.schedule(due, waiting_for(id as u64));
            }
            let mut expected: Vec<(u64, u64)> =
                dues.iter().enumerate().map(|(id, &due)| (due, id as u64)).collect();
            expected.sort_unstable();
            let mut left = expected.as_slice();
            let mut now = 0;
            for step in steps.iter().copied().chain([u64::MAX / 2]) {
                now += step;
                proptest::prop_assert_eq!(answers.next_deadline(), left.first().map(|&(d, _)| d));
                while let Some(answer) = answers.pop_due(now) {
                    let (due, _) = left[0];
                    proptest::prop_assert!(due <= now, "answered before its time");
                    let position = left
                        .iter()
                        .position(|&(d, id)| d == due && id == answer.request_id);
                    // Ties leave in either order; a later deadline never before an earlier.
                    let position = position.expect("an answer with the earliest deadline");
                    let mut rest = left.to_vec();
                    rest.remove(position);
                    expected = rest;
                    left = expected.as_slice();
                }
                if let Some(&(due, _)) = left.first() {
                    proptest::prop_assert!(due > now, "a due answer was left waiting");
                }
            }
            proptest::prop_assert!(left.is_empty());
        }

        /// As the service uses it: answers scheduled at `now + delay` between pops, with
        /// delays that are mostly one fixed latency (a long FIFO) and sometimes shorter
        /// (out of order, into the wheel, after it moved on), leave in deadline order,
        /// none early, none left behind.
        #[test]
        fn answers_scheduled_between_pops_leave_in_deadline_order(
            steps in proptest::collection::vec(
                (0u64..300_000, proptest::collection::vec(proptest::option::weighted(0.8, proptest::strategy::Just(1_000_000u64)), 0..20), 0u64..1_000_000),
                1..60,
            ),
        ) {
            let mut answers = Answers::new();
            let mut waiting: Vec<(u64, u64)> = Vec::new();
            let mut now = 0u64;
            let mut id = 0u64;
            for (advance, delays, short) in steps {
                now += advance;
                while let Some(answer) = answers.pop_due(now) {
                    let (due, earliest) = answered(&mut waiting, answer.request_id);
                    proptest::prop_assert!(due <= now, "answered before its time");
                    proptest::prop_assert_eq!(due, earliest, "a later answer left first");
                }
                proptest::prop_assert!(waiting.iter().all(|&(due, _)| due > now));
                for delay in delays {
                    let due = now + delay.unwrap_or(short);
                    answers.schedule(due, waiting_for(id));
                    waiting.push((due, id));
                    id += 1;
                }
                proptest::prop_assert_eq!(
                    answers.next_deadline(),
                    waiting.iter().map(|&(due, _)| due).min()
                );
            }
            while let Some(answer) = answers.pop_due(u64::MAX / 2) {
                let (due, earliest) = answered(&mut waiting, answer.request_id);
                proptest::prop_assert_eq!(due, earliest, "a later answer left first");
            }
            proptest::prop_assert!(waiting.is_empty());
        }
    }
}
