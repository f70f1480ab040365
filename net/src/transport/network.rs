//! The network thread: its loop (turns, waits on io_uring or epoll, deadlines), accepting
//! and dialing connections, reading and writing them, the send side's queues, serving
//! and consuming channels, and ending connections and the thread (see the module docs
//! of `transport`). Its other parts live beside it: a connection (`conn`), the receive
//! side and its credit (`recv`), incoming frames (`incoming`), the handshake's checks
//! (`handshake`), waiting partition requests (`waiting`).
//!
//! Ownership: everything here belongs to the network thread. Other threads reach it only
//! through `Control` (commands under a mutex, the stop flag), the rings of the channels
//! (the thread owns the receive rings' producers and the served channels' consumers),
//! and the receive pools' recycling (lock-free, from the gates' threads).

use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSliceMut, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{opcode, types};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

use weir_engine::checkpoint::LinkEvent;
use weir_engine::exchange::InputChannel;
use weir_engine::park::Parker;

use super::conn::{
    io_ending, os_error, queue_error, set_user_timeout, Conn, Ending, Out, Payload, Reading,
    SendChannel, DISCARD_SIZE, FRAMES_PER_WRITE_MAX,
};
use super::error::TransportError;
use super::frame::{FrameKind, Header, CONNECTION_CHANNEL, HEADER_SIZE};
use super::handshake::ALREADY_CONNECTED;
use super::recv::{gate_at, ChannelAt, Gate};
use super::uring::{self, Uring, OP_LISTEN, OP_POLL, OP_RECV, OP_SEND, OP_WAKE};
use super::waiting::Waiting;
use super::{Commands, Peer, TransportConfig};
use crate::driver::{DriverKind, Wake};

const WAKE: Token = Token(usize::MAX);
const LISTENER: Token = Token(usize::MAX - 1);
/// Reads per connection per turn, so that one busy peer cannot hold the loop.
const READS_PER_TURN_MAX: usize = 64;
/// The longest park without a deadline: a safety net, every source of work wakes us.
const IDLE_PARK_MAX: Duration = Duration::from_millis(100);
/// Largest buffer header accepted before the channel's pool is known: the engine's
/// largest segment. The channel's own segment size is checked when it is known.
pub(super) const BUFFER_PAYLOAD_MAX: usize = weir_engine::limits::SEGMENT_SIZE_MAX;

/// Why process `asking` may not have `channel`, served for `consumer` alone, if it may
/// not: the plan names one consumer per channel, and no other member of the job may
/// read its records.
pub(super) fn refusal_for(
    consumer: Option<u32>,
    asking: Option<u32>,
    channel: u32,
) -> Option<String> {
    match consumer {
        Some(consumer) if asking != Some(consumer) => Some(format!(
            "channel {channel} is consumed by process {consumer}, not by this one: do all \
             processes run the same job with the same peer list?"
        )),
        _ => None,
    }
}

/// How long a stopping transport waits for its peers to close their ends (see
/// `Net::linger`).
const LINGER: Duration = Duration::from_millis(500);

/// Handshake refusals kept for [`Control::refused`].
pub(super) const REFUSALS_KEPT: usize = 64;

/// Connections accepted and not yet authenticated at once: past this, a new connection
/// is closed as soon as it is accepted (the backlog still drains), so a port scan or a
/// flood of half-open connections cannot take every descriptor.
const HANDSHAKES_PENDING_MAX: usize = 64;
/// How soon to try accepting again after the kernel refused (out of descriptors): the
/// listener's readiness is edge-triggered on epoll, so no new event would come while
/// the backlog holds connections.
const ACCEPT_RETRY: Duration = Duration::from_millis(10);

/// The smallest buffer size a peer's announcement can ask for: the debloater's default
/// minimum (Flink's `taskmanager.network.memory.min-segment-size`, 256 bytes).
pub(super) const ANNOUNCED_BUFFER_SIZE_MIN: usize = 256;

/// What API calls ask of the network thread.
pub(super) enum Command {
    /// Offer a subpartition's channel under an id.
    Serve {
        channel: u32,
        input: Box<dyn InputChannel>,
        /// The only process that may consume it, if the caller knows it.
        consumer: Option<u32>,
    },
    /// Request channels from a peer into a gate's receive pool.
    Consume(Gate),
    /// Dial a peer unless a connection to it exists already.
    Connect(Peer),
    /// Send a checkpoint service's message to a process.
    Checkpoint { process: u32, bytes: Vec<u8> },
}

/// Where checkpoint messages and process losses go: the checkpoint service's inbox once
/// it is open, held until then.
#[derive(Default)]
pub(super) struct CheckpointInbox {
    inbox: Option<Box<dyn Fn(LinkEvent) + Send + Sync>>,
    waiting: Vec<LinkEvent>,
}

impl CheckpointInbox {
    pub(super) fn open(&mut self, inbox: Box<dyn Fn(LinkEvent) + Send + Sync>) {
        for event in self.waiting.drain(..) {
            inbox(event);
        }
        self.inbox = Some(inbox);
    }

    pub(super) fn deliver(&mut self, event: LinkEvent) {
        match &self.inbox {
            Some(inbox) => inbox(event),
            None => self.waiting.push(event),
        }
    }
}

/// Shared between the API and the network thread.
#[derive(Default)]
pub(super) struct Control {
    pub(super) commands: Commands,
    pub(super) stop: AtomicBool,
    /// Whether, at the end of the last turn, every served channel had been requested,
    /// sent to its end and its end-of-partition frame written (see `Transport::drain`).
    pub(super) drained: AtomicBool,
    /// Turns completed (after `drained` is stored).
    pub(super) turns: std::sync::atomic::AtomicU64,
    /// Processes with a connection whose handshake completed.
    pub(super) connected: std::sync::Mutex<std::collections::HashSet<u32>>,
    /// Connections whose handshake completed, since the start.
    pub(super) opened: std::sync::atomic::AtomicUsize,
    /// Why each connection that ended with channels open ended.
    pub(super) lost: std::sync::Mutex<Vec<String>>,
    /// Processes this one dialed that refused it, or that it refused, in the handshake
    /// (the latest [`REFUSALS_KEPT`] at most): why, by process id.
    pub(super) refused: std::sync::Mutex<VecDeque<(u32, String)>>,
    /// Checkpoint messages from other processes, and processes lost.
    pub(super) checkpoints: std::sync::Mutex<CheckpointInbox>,
}

/// Queues a checkpoint service's message on `conn`.
pub(super) fn queue_checkpoint(conn: &mut Conn, bytes: Vec<u8>) {
    let header = Header {
        kind: FrameKind::Checkpoint,
        len: bytes.len() as u32,
        channel: 0,
        arg0: 0,
        arg1: 0,
    };
    conn.queue(header, Some(Payload::Bytes(bytes)));
}

pub(super) fn peer_name(process: u32, addr: SocketAddr) -> String {
    format!("process {process} at {addr}")
}

/// The network thread's state.
/// How the network thread waits and does its I/O.
pub(super) enum Backend {
    /// Readiness (epoll through mio); reads and writes are system calls in the turn.
    Epoll { poll: Poll, events: Events },
    /// Completions: reads and writes are operations submitted once per turn.
    Uring(Box<Uring>),
    /// After a shutdown that had to leak the ring.
    Stopped,
}

pub(super) struct Net {
    pub(super) config: TransportConfig,
    pub(super) backend: Backend,
    /// Whether the last wait reaped completions (work for the next turn).
    pub(super) completed: bool,
    /// Whether a completed read or write was followed at once by the next one.
    pub(super) draining: bool,
    pub(super) listener: TcpListener,
    pub(super) wake: Arc<Wake>,
    pub(super) control: Arc<Control>,
    pub(super) conns: Vec<Option<Conn>>,
    pub(super) gates: Vec<Option<Gate>>,
    /// The generation the next gate gets.
    pub(super) gate_generation: u64,
    /// Channels served and not yet requested, with the process that alone may consume
    /// each (when the caller said).
    pub(super) served: HashMap<u32, (Box<dyn InputChannel>, Option<u32>)>,
    /// Requests for channels not served yet (each fails after `request_timeout`).
    pub(super) waiting: Waiting,
    /// When to try accepting again after the kernel refused a connection.
    pub(super) accept_retry: Option<Instant>,
    /// Checkpoint messages for processes not connected yet, sent when they are.
    pub(super) checkpoints_waiting: HashMap<u32, Vec<Vec<u8>>>,
}

impl Net {
    pub(super) fn new(
        config: TransportConfig,
        listener: TcpListener,
        wake: Arc<Wake>,
        control: Arc<Control>,
    ) -> io::Result<Self> {
        let uring = match config.driver {
            DriverKind::Epoll => None,
            DriverKind::Uring => Some(Uring::new()?),
            DriverKind::Auto => match Uring::new() {
                Ok(uring) => Some(uring),
                Err(error) => {
                    eprintln!("weir transport: io_uring unavailable ({error}); using epoll");
                    None
                }
            },
        };
        let backend = match uring {
            Some(uring) => Backend::Uring(Box::new(uring)),
            None => {
                let poll = Poll::new()?;
                poll.registry().register(
                    &mut SourceFd(&listener.as_raw_fd()),
                    LISTENER,
                    Interest::READABLE,
                )?;
                poll.registry()
                    .register(&mut SourceFd(&wake.raw()), WAKE, Interest::READABLE)?;
                Backend::Epoll {
                    poll,
                    events: Events::with_capacity(256),
                }
            }
        };
        Ok(Net {
            config,
            backend,
            completed: false,
            draining: false,
            listener,
            wake,
            control,
            conns: Vec::new(),
            gates: Vec::new(),
            gate_generation: 0,
            served: HashMap::new(),
            waiting: Waiting::default(),
            accept_retry: None,
            checkpoints_waiting: HashMap::new(),
        })
    }

    /// The I/O backend's name: "uring" or "epoll".
    pub(super) fn driver_name(&self) -> &'static str {
        match self.backend {
            Backend::Epoll { .. } => "epoll",
            Backend::Uring(_) => "uring",
            Backend::Stopped => "stopped",
        }
    }

    pub(super) fn run(&mut self, parker: Parker) {
        let spin = self.config.spin;
        let mut progress_at = Instant::now();
        while !self.control.stop.load(Ordering::Acquire) {
            let busy = self.turn() | std::mem::take(&mut self.completed);
            // Nothing served is left unrequested, unsent or unwritten (a frame queued, or
            // one an io_uring write still owns, is not yet written).
            let drained = self.served.is_empty()
                && self.conns.iter().flatten().all(|c| {
                    c.dead
                        || (c.outgoing.is_empty()
                            && c.out.is_empty()
                            && c.staged.is_empty()
                            && !c.ops.write)
                });
            self.control.drained.store(drained, Ordering::Release);
            self.control.turns.fetch_add(1, Ordering::Release);
            let now = Instant::now();
            let timeout = if busy {
                progress_at = now;
                Duration::ZERO
            } else if now.duration_since(progress_at) < spin {
                Duration::ZERO
            } else {
                self.next_deadline()
                    .map_or(IDLE_PARK_MAX, |d| d.saturating_duration_since(now))
                    .min(IDLE_PARK_MAX)
            };
            match &mut self.backend {
                Backend::Epoll { poll, events } => {
                    if timeout.is_zero() {
                        let _ = poll.poll(events, Some(Duration::ZERO));
                    } else {
                        parker.park_with(
                            Some(timeout),
                            || false,
                            |timeout| {
                                let _ = poll.poll(events, timeout);
                            },
                        );
                    }
                    let mut accept = false;
                    for event in events.iter() {
                        match event.token() {
                            WAKE => self.wake.drain(),
                            LISTENER => accept = true,
                            _ => {}
                        }
                    }
                    if accept {
                        self.accept();
                    }
                }
                Backend::Uring(ring) => {
                    // No poll of the listener while an accept waits to be retried (out of
                    // descriptors): it would complete at once, every turn.
                    let listener = self
                        .accept_retry
                        .is_none()
                        .then(|| self.listener.as_raw_fd());
                    let mut failure = ring.arm(self.wake.raw(), listener).err();
                    if timeout.is_zero() {
                        failure = failure.or(ring.wait(Duration::ZERO).err());
                    } else {
                        parker.park_with(
                            Some(timeout),
                            || false,
                            |timeout| failure = ring.wait(timeout.unwrap_or(IDLE_PARK_MAX)).err(),
                        );
                    }
                    if let Some(error) = failure {
                        // The ring itself failed: nothing can be sent or received any more.
                        self.fail_all(error);
                        return;
                    }
                    self.complete();
                    // Reads that filled everything they asked for, and writes with more to
                    // send, went on at once: reap them before the next turn (bounded, like
                    // epoll's reads per turn).
                    let mut rounds = 0;
                    while std::mem::take(&mut self.draining) && rounds < READS_PER_TURN_MAX {
                        rounds += 1;
                        let Backend::Uring(ring) = &mut self.backend else {
                            break;
                        };
                        if let Err(error) = ring.wait(Duration::ZERO) {
                            self.fail_all(error);
                            return;
                        }
                        self.complete();
                    }
                }
                Backend::Stopped => return,
            }
        }
        self.shutdown();
    }

    /// Applies the io_uring completions of the last wait.
    fn complete(&mut self) {
        let Backend::Uring(ring) = &mut self.backend else {
            return;
        };
        let completions = std::mem::take(&mut ring.ring.completions);
        self.completed = !completions.is_empty();
        for &(user_data, result) in &completions {
            let (slot, op) = uring::parse(user_data);
            match op {
                OP_WAKE => {
                    if let Backend::Uring(ring) = &mut self.backend {
                        // A failed read is read again next turn (the parker's state,
                        // not the eventfd's count, carries the wake-up).
                        let _ = ring.ring.wake_done(result);
                    }
                }
                OP_LISTEN => {
                    if let Backend::Uring(ring) = &mut self.backend {
                        ring.listen_in_flight = false;
                    }
                    self.accept();
                }
                _ => {
                    let Some(mut conn) = self.conns.get_mut(slot).and_then(Option::take) else {
                        continue;
                    };
                    let outcome = match op {
                        OP_RECV => {
                            conn.ops.read = false;
                            match result {
                                _ if conn.dead => Ok(()),
                                0 => Err(Ending::Closed),
                                count if count > 0 => {
                                    let full = count as usize == conn.ops.read_len;
                                    let consumed = self.consumed(slot, &mut conn, count as usize);
                                    if consumed.is_ok() && full {
                                        // The socket may hold more: read on at once, as
                                        // epoll's loop reads until the socket is empty.
                                        self.draining = true;
                                        self.submit_read(slot, &mut conn)
                                            .map_err(|e| io_ending(&conn, e))
                                    } else {
                                        consumed
                                    }
                                }
                                error => os_error(&conn, error),
                            }
                        }
                        OP_SEND => {
                            conn.ops.write = false;
                            match result {
                                _ if conn.dead => Ok(()),
                                count if count >= 0 => {
                                    conn.written(count as usize);
                                    if !conn.staged.is_empty() || !conn.out.is_empty() {
                                        // More to send: write on at once rather than at
                                        // the next turn.
                                        self.draining = true;
                                        self.submit_write(slot, &mut conn)
                                            .map_err(|e| io_ending(&conn, e))
                                    } else {
                                        Ok(())
                                    }
                                }
                                error => os_error(&conn, error),
                            }
                        }
                        OP_POLL => {
                            conn.ops.poll = false;
                            Ok(())
                        }
                        _ => Ok(()),
                    };
                    match outcome {
                        _ if conn.dead => {
                            if conn.ops.in_flight() {
                                self.conns[slot] = Some(conn);
                            }
                            // Otherwise the kernel is done with it: dropped here.
                        }
                        Ok(()) => self.conns[slot] = Some(conn),
                        Err(ending) => self.end(slot, conn, ending),
                    }
                }
            }
        }
        if let Backend::Uring(ring) = &mut self.backend {
            ring.ring.completions = completions;
        }
    }

    /// The ring failed: every connection fails (the thread stops).
    fn fail_all(&mut self, error: io::Error) {
        let reason = format!("the network thread's io_uring failed: {error}");
        for slot in 0..self.conns.len() {
            if let Some(conn) = self.conns[slot].take() {
                if !conn.dead {
                    let ending = Ending::Failed(TransportError::ConnectionLost {
                        peer: conn.name(),
                        reason: reason.clone(),
                    });
                    self.end(slot, conn, ending);
                }
            }
        }
        self.shutdown();
    }

    fn next_deadline(&self) -> Option<Instant> {
        let request = self.waiting.next_deadline(self.config.request_timeout);
        let (heartbeat, idle) = (self.config.heartbeat_interval, self.config.idle_timeout);
        let liveness = self
            .conns
            .iter()
            .flatten()
            .filter(|c| !c.dead && c.process.is_some())
            .map(|c| (c.last_queued + heartbeat).min(c.last_read + idle));
        self.conns
            .iter()
            .flatten()
            .filter(|c| !c.dead)
            .filter_map(|c| c.handshake_deadline)
            .chain(request)
            .chain(self.accept_retry)
            .chain(liveness)
            .min()
    }

    /// Fails the requests that waited past `request_timeout` for their channel: the
    /// consumer gets an error frame naming it.
    fn expire_requests(&mut self, now: Instant) -> bool {
        let timeout = self.config.request_timeout;
        let mut expired = false;
        for (slot, channel) in self.waiting.expire(now, timeout) {
            if let Some(conn) = self.conns[slot].as_mut() {
                let message = format!(
                    "channel {channel} is not served by process {} (waited {timeout:?}): do \
                     all processes run the same job with the same settings?",
                    self.config.process
                );
                queue_error(conn, channel, &message);
            }
            expired = true;
        }
        expired
    }

    /// One turn; `true` if it did anything.
    fn turn(&mut self) -> bool {
        let mut busy = self.commands();
        let now = Instant::now();
        if self.accept_retry.is_some_and(|at| now >= at) {
            self.accept();
        }
        if !self.waiting.is_empty() {
            busy |= self.expire_requests(now);
        }
        for slot in 0..self.conns.len() {
            let Some(mut conn) = self.conns[slot].take() else {
                continue;
            };
            if conn.dead {
                self.conns[slot] = Some(conn);
                continue;
            }
            match self.drive(slot, &mut conn, now) {
                Ok(did) => {
                    busy |= did;
                    self.conns[slot] = Some(conn);
                }
                Err(ending) => {
                    self.end(slot, conn, ending);
                    busy = true;
                }
            }
        }
        busy
    }

    fn commands(&mut self) -> bool {
        let commands = std::mem::take(
            &mut *self
                .control
                .commands
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        let any = !commands.is_empty();
        for command in commands {
            match command {
                Command::Serve {
                    channel,
                    input,
                    consumer,
                } => self.serve(channel, input, consumer),
                Command::Consume(gate) => self.consume(gate),
                Command::Connect(peer) => {
                    // A failed dial is dropped: the caller waits for the connection and
                    // asks again (`TransportChannels::wait_for_peers`).
                    let _ = self.connection_to(peer);
                }
                Command::Checkpoint { process, bytes } => {
                    let conn = self
                        .conns
                        .iter_mut()
                        .flatten()
                        .find(|c| !c.dead && c.process == Some(process));
                    match conn {
                        Some(conn) => queue_checkpoint(conn, bytes),
                        None => self
                            .checkpoints_waiting
                            .entry(process)
                            .or_default()
                            .push(bytes),
                    }
                }
            }
        }
        any
    }

    /// The connection to `peer`: one that exists (dialed or accepted), else a new one,
    /// dialed without waiting (a non-blocking connect).
    fn connection_to(&mut self, peer: Peer) -> Result<usize, (&'static str, io::Error)> {
        let found = self.conns.iter().position(|c| {
            c.as_ref().is_some_and(|c| {
                !c.dead
                    && (c.process == Some(peer.process)
                        || (c.process.is_none() && c.addr == peer.addr))
            })
        });
        if let Some(slot) = found {
            return Ok(slot);
        }
        let stream = mio::net::TcpStream::connect(peer.addr).map_err(|e| ("connecting", e))?;
        let stream = TcpStream::from(OwnedFd::from(stream));
        let slot = self.free_slot();
        self.register(&stream, slot)
            .map_err(|e| ("registering a connection", e))?;
        set_user_timeout(&stream, self.config.idle_timeout);
        let mut conn = Conn::new(
            stream,
            peer.addr,
            true,
            self.config.process,
            &self.config.job,
        );
        conn.expected = Some(peer.process);
        conn.handshake_deadline = Some(Instant::now() + self.config.handshake_timeout);
        self.conns[slot] = Some(conn);
        Ok(slot)
    }

    fn serve(&mut self, channel: u32, input: Box<dyn InputChannel>, consumer: Option<u32>) {
        if let Some((slot, credit)) = self.waiting.take(channel) {
            if let Some(conn) = self.conns[slot].as_mut() {
                match refusal_for(consumer, conn.process, channel) {
                    None => {
                        conn.outgoing.push(SendChannel {
                            id: channel,
                            input,
                            queue: VecDeque::new(),
                            credit,
                            sequence: 0,
                            announced: 0,
                            aligned_announced: 0,
                        });
                        return;
                    }
                    // Its consumer may still ask: the channel waits for it below.
                    Some(message) => queue_error(conn, channel, &message),
                }
            }
        }
        // A second serve of the same id replaces the first (whose consumer, if any,
        // is attached already and unaffected).
        self.served.insert(channel, (input, consumer));
    }

    fn consume(&mut self, mut gate: Gate) {
        let peer = gate.peer;
        let slot = match self.connection_to(peer) {
            Ok(slot) => slot,
            Err((what, error)) => {
                self.fail_gate(gate, peer, what, error);
                return;
            }
        };
        let index = self
            .gates
            .iter()
            .position(Option::is_none)
            .unwrap_or_else(|| {
                self.gates.push(None);
                self.gates.len() - 1
            });
        gate.conn = slot;
        self.gate_generation += 1;
        gate.generation = self.gate_generation;
        let conn = self.conns[slot].as_mut().expect("found or made above");
        let exclusive = gate.exclusive;
        for (position, channel) in gate.channels.iter_mut().enumerate() {
            // An id consumed before is taken again once its gate is gone (a later job
            // over the same transport); while that gate lives, it is a second request.
            let live = conn
                .incoming
                .get(&channel.id)
                .is_some_and(|&at| gate_at(&mut self.gates, at).is_some());
            if live {
                let cause = TransportError::Config(format!(
                    "channel {} from {} is already consumed by this process; request each \
                     channel once",
                    channel.id,
                    conn.name()
                ));
                channel.close(Some(Arc::new(cause)));
                continue;
            }
            conn.incoming.insert(
                channel.id,
                ChannelAt {
                    gate: index,
                    generation: gate.generation,
                    index: position,
                },
            );
            channel.credit = exclusive;
            conn.queue(
                Header::control(FrameKind::PartitionRequest, channel.id, exclusive),
                None,
            );
        }
        self.gates[index] = Some(gate);
    }

    fn fail_gate(&mut self, mut gate: Gate, peer: Peer, what: &'static str, source: io::Error) {
        let cause = Arc::new(TransportError::Io {
            what,
            peer: peer_name(peer.process, peer.addr),
            source,
        });
        for channel in &mut gate.channels {
            let failure = TransportError::ChannelFailed {
                channel: channel.id,
                peer: peer_name(peer.process, peer.addr),
                cause: Arc::clone(&cause),
            };
            channel.close(Some(Arc::new(failure)));
        }
    }

    fn free_slot(&mut self) -> usize {
        match self.conns.iter().position(Option::is_none) {
            Some(slot) => slot,
            None => {
                self.conns.push(None);
                self.conns.len() - 1
            }
        }
    }

    /// Registers a connection's socket with epoll (io_uring needs nothing).
    fn register(&self, stream: &TcpStream, slot: usize) -> io::Result<()> {
        match &self.backend {
            Backend::Epoll { poll, .. } => poll.registry().register(
                &mut SourceFd(&stream.as_raw_fd()),
                Token(slot),
                Interest::READABLE | Interest::WRITABLE,
            ),
            Backend::Uring(_) | Backend::Stopped => Ok(()),
        }
    }

    fn accept(&mut self) {
        self.accept_retry = None;
        loop {
            match self.listener.accept() {
                Ok((stream, addr)) => {
                    let pending = self
                        .conns
                        .iter()
                        .flatten()
                        // Accepted ones only: this process's own dials in their handshake
                        // must not shut out the peers dialing it.
                        .filter(|c| !c.dead && c.process.is_none() && c.expected.is_none())
                        .count();
                    if pending >= HANDSHAKES_PENDING_MAX {
                        // Closed at once (dropped): the backlog drains, nothing is kept.
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    set_user_timeout(&stream, self.config.idle_timeout);
                    let slot = self.free_slot();
                    if self.register(&stream, slot).is_err() {
                        continue;
                    }
                    let mut conn =
                        Conn::new(stream, addr, false, self.config.process, &self.config.job);
                    conn.handshake_deadline = Some(Instant::now() + self.config.handshake_timeout);
                    self.conns[slot] = Some(conn);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    // Out of descriptors (EMFILE, ENFILE) or memory: the connections
                    // wait in the backlog, and an edge-triggered listener would not say
                    // so again. Try again shortly.
                    self.accept_retry = Some(Instant::now() + ACCEPT_RETRY);
                    return;
                }
            }
        }
    }

    /// Reads, grants, sends and writes for one connection.
    fn drive(&mut self, slot: usize, conn: &mut Conn, now: Instant) -> Result<bool, Ending> {
        if conn.connecting {
            match conn.stream.take_error() {
                Ok(Some(error)) | Err(error) => {
                    return Err(Ending::Failed(TransportError::Io {
                        what: "connecting",
                        peer: conn.name(),
                        source: error,
                    }))
                }
                Ok(None) => {}
            }
            match conn.stream.peer_addr() {
                Ok(_) => {
                    conn.connecting = false;
                    let _ = conn.stream.set_nodelay(true);
                }
                Err(e) if e.kind() == io::ErrorKind::NotConnected => {}
                Err(error) => {
                    return Err(Ending::Failed(TransportError::Io {
                        what: "connecting",
                        peer: conn.name(),
                        source: error,
                    }))
                }
            }
        }
        if let Some(deadline) = conn.handshake_deadline {
            if now >= deadline {
                return Err(Ending::Failed(TransportError::HandshakeTimeout {
                    peer: conn.name(),
                    timeout: self.config.handshake_timeout,
                }));
            }
        }
        let uring = matches!(self.backend, Backend::Uring(_));
        if conn.connecting {
            if uring {
                self.submit_poll(slot, conn)
                    .map_err(|e| io_ending(conn, e))?;
            }
            return Ok(false);
        }
        let mut busy = if uring { false } else { self.read(slot, conn)? };
        if conn.process.is_some() {
            if now.saturating_duration_since(conn.last_read) >= self.config.idle_timeout {
                return Err(Ending::Failed(TransportError::PeerSilent {
                    peer: conn.name(),
                    idle: self.config.idle_timeout,
                }));
            }
            busy |= self.send(conn);
            for gate in self.gates.iter_mut().flatten() {
                if gate.conn == slot && !gate.is_closed() {
                    busy |= gate.grant(conn);
                }
            }
            if !conn.staged.is_empty() {
                conn.last_queued = now;
            } else if now.saturating_duration_since(conn.last_queued)
                >= self.config.heartbeat_interval
            {
                // Nothing to say for a while: say that we are alive.
                conn.queue(Header::control(FrameKind::Heartbeat, 0, 0), None);
                conn.last_queued = now;
            }
        }
        self.gates
            .iter_mut()
            .filter(|g| g.as_ref().is_some_and(|g| g.conn == slot && g.is_closed()))
            .for_each(|g| *g = None);
        if uring {
            self.submit_write(slot, conn)
                .map_err(|e| io_ending(conn, e))?;
            self.submit_read(slot, conn)
                .map_err(|e| io_ending(conn, e))?;
        } else {
            busy |= conn.flush().map_err(|e| io_ending(conn, e))?;
        }
        Ok(busy)
    }

    /// io_uring: a poll for the end of a connect, unless one is in flight.
    fn submit_poll(&mut self, slot: usize, conn: &mut Conn) -> io::Result<()> {
        let Backend::Uring(ring) = &mut self.backend else {
            return Ok(());
        };
        if conn.ops.poll {
            return Ok(());
        }
        let entry = opcode::PollAdd::new(types::Fd(conn.stream.as_raw_fd()), libc::POLLOUT as u32)
            .build()
            .user_data(uring::user_data(slot, OP_POLL));
        // SAFETY: a poll points to no memory.
        unsafe { ring.push(&entry)? };
        conn.ops.poll = true;
        Ok(())
    }

    /// io_uring: a write of every queued frame (up to a limit), unless one is in flight.
    fn submit_write(&mut self, slot: usize, conn: &mut Conn) -> io::Result<()> {
        let Backend::Uring(ring) = &mut self.backend else {
            return Ok(());
        };
        if conn.ops.write {
            return Ok(());
        }
        conn.out.append(&mut conn.staged);
        if conn.out.is_empty() {
            return Ok(());
        }
        let iov = &mut conn.ops.write_iov;
        iov.clear();
        let mut skip = conn.out_offset;
        for out in conn.out.iter().take(FRAMES_PER_WRITE_MAX) {
            for part in [&out.header[..], out.payload.as_slice()] {
                if skip >= part.len() {
                    skip -= part.len();
                    continue;
                }
                debug_assert!(iov.len() < iov.capacity(), "sized for FRAMES_PER_WRITE_MAX");
                iov.push(libc::iovec {
                    iov_base: part[skip..].as_ptr() as *mut libc::c_void,
                    iov_len: part.len() - skip,
                });
                skip = 0;
            }
        }
        let entry = opcode::Writev::new(
            types::Fd(conn.stream.as_raw_fd()),
            iov.as_ptr(),
            iov.len() as u32,
        )
        .build()
        .user_data(uring::user_data(slot, OP_SEND));
        // SAFETY: the iovecs and the frames they point to (headers inside `out`'s
        // elements, payloads in segments or vectors they own) stay untouched until the
        // completion: `out` is neither pushed to nor popped while `ops.write` is set
        // (new frames go to `staged`), and the connection is kept until then (module
        // docs of `uring`).
        unsafe { ring.push(&entry)? };
        conn.ops.write = true;
        Ok(())
    }

    /// io_uring: a read into what the connection expects next, unless one is in flight:
    /// a payload's rest straight into its segment and the next header into the header
    /// slot.
    fn submit_read(&mut self, slot: usize, conn: &mut Conn) -> io::Result<()> {
        let Backend::Uring(ring) = &mut self.backend else {
            return Ok(());
        };
        if conn.ops.read {
            return Ok(());
        }
        let header_len = conn.header_len;
        let header = libc::iovec {
            iov_base: conn.header[header_len..].as_mut_ptr().cast(),
            iov_len: HEADER_SIZE - header_len,
        };
        let (first, count) = match &mut conn.reading {
            Reading::Header => (header, 1),
            Reading::Payload {
                buffer,
                len,
                filled,
                ..
            } => {
                let payload = &mut buffer.as_mut_slice()[*filled..*len];
                let first = libc::iovec {
                    iov_base: payload.as_mut_ptr().cast(),
                    iov_len: payload.len(),
                };
                (first, 2)
            }
            Reading::Discard { left } => {
                let size = (*left).min(conn.discard.len());
                let first = libc::iovec {
                    iov_base: conn.discard.as_mut_ptr().cast(),
                    iov_len: size,
                };
                (first, 1)
            }
            Reading::Message { bytes, filled, .. } => {
                let rest = &mut bytes[*filled..];
                let first = libc::iovec {
                    iov_base: rest.as_mut_ptr().cast(),
                    iov_len: rest.len(),
                };
                (first, 1)
            }
        };
        conn.ops.read_iov[0] = first;
        conn.ops.read_iov[1] = header;
        conn.ops.read_len = first.iov_len + if count == 2 { header.iov_len } else { 0 };
        let entry = opcode::Readv::new(
            types::Fd(conn.stream.as_raw_fd()),
            conn.ops.read_iov.as_ptr(),
            count,
        )
        .build()
        .user_data(uring::user_data(slot, OP_RECV));
        // SAFETY: the iovecs are boxed in the connection; they point into its boxed
        // header slot and discard buffer, the vector of an error message it owns, or the
        // segment of the buffer its reading state owns. None of these is touched or
        // dropped until the completion (the connection is kept until then).
        unsafe { ring.push(&entry)? };
        conn.ops.read = true;
        Ok(())
    }

    /// Moves served channels' buffers to the connection's queue against credit.
    fn send(&mut self, conn: &mut Conn) -> bool {
        let mut busy = false;
        let mut index = 0;
        while index < conn.outgoing.len() {
            let channel = &mut conn.outgoing[index];
            // An unaligned barrier announced ahead of the data goes ahead of what is
            // queued (no credit needed: it takes no buffer at the consumer).
            let announced = channel.input.announced_barrier();
            if announced > channel.announced {
                channel.announced = announced;
                let header = Header::priority_barrier(channel.id, announced);
                conn.queue_first(header);
                busy = true;
            }
            // So does an aligned barrier's announcement: the consumer counts the
            // barrier's alignment timeout from it, however long the queue in front.
            let channel = &mut conn.outgoing[index];
            let aligned = channel.input.announced_aligned_barrier();
            if aligned > channel.aligned_announced {
                channel.aligned_announced = aligned;
                let header = Header::aligned_barrier(channel.id, aligned);
                conn.queue_first(header);
                busy = true;
            }
            let channel = &mut conn.outgoing[index];
            while let Some(buffer) = channel.input.poll_buffer() {
                if !buffer.as_slice().is_empty() {
                    channel.queue.push_back(buffer);
                }
            }
            while channel.credit > 0 {
                let Some(buffer) = channel.queue.pop_front() else {
                    break;
                };
                let len = buffer.as_slice().len();
                let header = Header {
                    kind: FrameKind::Buffer,
                    len: len as u32,
                    channel: channel.id,
                    arg0: channel.sequence,
                    arg1: channel.queue.len() as u32,
                };
                channel.credit -= 1;
                channel.sequence = channel.sequence.wrapping_add(1);
                conn.staged.push_back(Out {
                    header: header.encode(),
                    payload: Payload::Shared(buffer, len),
                });
                busy = true;
            }
            let channel = &mut conn.outgoing[index];
            if channel.queue.is_empty() && channel.input.is_disconnected() {
                // Re-check: the producer may have sent its last buffer before it went.
                if let Some(buffer) = channel.input.poll_buffer() {
                    if !buffer.as_slice().is_empty() {
                        channel.queue.push_back(buffer);
                    }
                    index += 1;
                    continue;
                }
                let id = channel.id;
                conn.outgoing.swap_remove(index);
                conn.queue(Header::control(FrameKind::EndOfPartition, id, 0), None);
                busy = true;
                continue;
            }
            index += 1;
        }
        busy
    }

    /// Reads what the connection has (bounded), straight into receive segments.
    fn read(&mut self, slot: usize, conn: &mut Conn) -> Result<bool, Ending> {
        let mut busy = false;
        for _ in 0..READS_PER_TURN_MAX {
            let header_len = conn.header_len;
            let result = match &mut conn.reading {
                Reading::Header => (&conn.stream).read(&mut conn.header[header_len..]),
                Reading::Payload {
                    buffer,
                    len,
                    filled,
                    ..
                } => {
                    let payload = &mut buffer.as_mut_slice()[*filled..*len];
                    let mut slices = [
                        IoSliceMut::new(payload),
                        IoSliceMut::new(&mut conn.header[header_len..]),
                    ];
                    (&conn.stream).read_vectored(&mut slices)
                }
                Reading::Discard { left } => {
                    let size = (*left).min(conn.discard.len());
                    (&conn.stream).read(&mut conn.discard[..size])
                }
                Reading::Message { bytes, filled, .. } => {
                    (&conn.stream).read(&mut bytes[*filled..])
                }
            };
            let count = match result {
                Ok(0) => return Err(Ending::Closed),
                Ok(count) => count,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(busy),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => {
                    return Err(Ending::Failed(TransportError::ConnectionLost {
                        peer: conn.name(),
                        reason: error.to_string(),
                    }))
                }
            };
            busy = true;
            self.consumed(slot, conn, count)?;
        }
        Ok(busy)
    }

    /// Accounts for `count` bytes just read in the current state, completing frames.
    fn consumed(&mut self, slot: usize, conn: &mut Conn, count: usize) -> Result<(), Ending> {
        if count > 0 {
            conn.last_read = Instant::now();
        }
        let complete = match &mut conn.reading {
            Reading::Header => {
                conn.header_len += count;
                false
            }
            Reading::Payload { len, filled, .. } => {
                let take = count.min(*len - *filled);
                *filled += take;
                conn.header_len += count - take;
                *filled == *len
            }
            Reading::Discard { left } => {
                *left -= count;
                *left == 0
            }
            Reading::Message { bytes, filled, .. } => {
                *filled += count;
                *filled == bytes.len()
            }
        };
        if complete {
            let reading = std::mem::replace(&mut conn.reading, Reading::Header);
            self.finish_payload(conn, reading)?;
        }
        while matches!(conn.reading, Reading::Header) && conn.header_len == HEADER_SIZE {
            conn.header_len = 0;
            let header = Header::decode(&conn.header, BUFFER_PAYLOAD_MAX).map_err(|source| {
                Ending::Rejected(TransportError::Frame {
                    peer: conn.name(),
                    source,
                })
            })?;
            self.frame(slot, conn, header)?;
        }
        Ok(())
    }

    /// Ends a connection: fails its open channels (or closes them cleanly).
    fn end(&mut self, slot: usize, mut conn: Conn, ending: Ending) {
        let name = conn.name();
        // The process this was the last connection to, if it was.
        let mut lost = None;
        if let Some(process) = conn.process {
            let other = self
                .conns
                .iter()
                .flatten()
                .any(|c| !c.dead && c.process == Some(process));
            if !other {
                self.control
                    .connected
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&process);
                lost = Some(process);
            }
        }
        let cause = match ending {
            Ending::Closed => TransportError::ConnectionLost {
                peer: name.clone(),
                reason: "closed by the peer".into(),
            },
            Ending::Failed(error) => error,
            Ending::Rejected(error) => {
                // Best effort: tell the peer why, without waiting (and not while an
                // io_uring write owns the queue).
                if !conn.ops.write {
                    // A frame partly written stays, so the error frame starts on a frame
                    // boundary (cut short, the peer would read the error's bytes as the
                    // rest of that frame's payload).
                    conn.out.truncate(usize::from(conn.out_offset > 0));
                    conn.staged.clear();
                    queue_error(&mut conn, CONNECTION_CHANNEL, &error.to_string());
                    let _ = conn.flush();
                }
                error
            }
        };
        if let (None, Some(dialed)) = (conn.process, conn.expected) {
            // A process we dialed and that refused us (its error frame), or that we
            // refused: a caller waiting for it is told why instead of waiting on.
            // A second connection refused while an old one lingers is no verdict on
            // the peer: the caller dials again.
            let final_refusal = matches!(
                cause,
                TransportError::Refused { .. } | TransportError::Remote { .. }
            ) && !cause.to_string().contains(ALREADY_CONNECTED);
            if final_refusal {
                let mut refused = self
                    .control
                    .refused
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                if refused.len() == REFUSALS_KEPT {
                    refused.pop_front();
                }
                refused.push_back((dialed, cause.to_string()));
            }
        }
        if !conn.incoming.is_empty() || !conn.outgoing.is_empty() {
            // Channels broke: say which peer and why, for the producers whose consumers
            // it took away (they see only their consumer gone).
            self.control
                .lost
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(cause.to_string());
        }
        if let Some(process) = lost {
            // The checkpoint service hears that the process is gone (a process stopping
            // at its job's end is heard too; a service that is done ignores it).
            self.control
                .checkpoints
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .deliver(LinkEvent::Lost {
                    process: process as usize,
                    reason: cause.to_string(),
                });
        }
        let cause = Arc::new(cause);
        for (&channel, &at) in &conn.incoming {
            if let Some(gate) = gate_at(&mut self.gates, at) {
                let failure = TransportError::ChannelFailed {
                    channel,
                    peer: name.clone(),
                    cause: Arc::clone(&cause),
                };
                gate.channels[at.index].close(Some(Arc::new(failure)));
            }
        }
        for gate in self.gates.iter_mut() {
            if gate.as_ref().is_some_and(|g| g.conn == slot) {
                *gate = None;
            }
        }
        self.waiting.forget_connection(slot);
        if let Backend::Epoll { poll, .. } = &self.backend {
            let _ = poll
                .registry()
                .deregister(&mut SourceFd(&conn.stream.as_raw_fd()));
        }
        // Completes the connection's io_uring operations, if any.
        let _ = conn.stream.shutdown(std::net::Shutdown::Both);
        // The served channels' consumer ends drop now: their producers see the
        // consumer gone.
        conn.outgoing.clear();
        conn.incoming.clear();
        if conn.ops.in_flight() {
            // The kernel still owns some of its buffers: keep it until it lets go.
            conn.dead = true;
            self.conns[slot] = Some(conn);
        }
    }

    /// Says goodbye to the peers whose connections are sent to their end: a half-close
    /// (FIN after everything queued), then reading and dropping what they still send
    /// until they close too, for at most [`LINGER`]. Closing a socket with bytes unread
    /// makes the kernel reset the connection, and a reset may discard at the peer what
    /// it has received but not yet read: the tail of what this side sent (its last
    /// buffers, its end-of-partition frames). A connection with frames still queued is
    /// not waited for: its peer stopped reading, and it fails as before.
    fn linger(&mut self) {
        let deadline = Instant::now() + LINGER;
        let mut open = Vec::new();
        for (slot, conn) in self.conns.iter().enumerate() {
            let Some(conn) = conn else { continue };
            let sent = conn.out.is_empty() && conn.staged.is_empty() && !conn.ops.write;
            if conn.dead || conn.process.is_none() || !sent {
                continue;
            }
            if conn.stream.shutdown(std::net::Shutdown::Write).is_ok() {
                open.push(slot);
            }
        }
        let mut scratch = [0u8; DISCARD_SIZE];
        while !open.is_empty() && Instant::now() < deadline {
            match self.backend {
                Backend::Uring(_) => {
                    for &slot in &open {
                        if let Some(mut conn) = self.conns[slot].take() {
                            if !conn.dead && !conn.ops.read {
                                let _ = self.submit_read(slot, &mut conn);
                            }
                            self.conns[slot] = Some(conn);
                        }
                    }
                    if let Backend::Uring(ring) = &mut self.backend {
                        if ring.wait(Duration::from_millis(1)).is_err() {
                            return;
                        }
                    }
                    // A read of 0 bytes (the peer closed) ends the connection.
                    self.complete();
                    open.retain(|&slot| self.conns[slot].as_ref().is_some_and(|c| !c.dead));
                }
                Backend::Epoll { .. } => {
                    open.retain(|&slot| {
                        let Some(conn) = self.conns[slot].as_mut() else {
                            return false;
                        };
                        loop {
                            match (&conn.stream).read(&mut scratch) {
                                Ok(0) => return false,
                                Ok(_) => {}
                                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                                Err(_) => return false,
                            }
                        }
                    });
                    if !open.is_empty() {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                Backend::Stopped => return,
            }
        }
    }

    fn shutdown(&mut self) {
        self.linger();
        for slot in 0..self.conns.len() {
            if let Some(conn) = self.conns[slot].take() {
                if conn.dead {
                    self.conns[slot] = Some(conn);
                } else {
                    self.end(slot, conn, Ending::Failed(TransportError::Stopped));
                }
            }
        }
        // io_uring: wait for every operation to complete before anything it points to
        // is freed (the shutdowns above complete the connections' ones, a wake-up the
        // eventfd read; the listener's poll points to nothing).
        self.wake.wake();
        let deadline = Instant::now() + Duration::from_secs(5);
        while let Backend::Uring(ring) = &mut self.backend {
            let busy = ring.ring.wake_in_flight()
                || self.conns.iter().flatten().any(|c| c.ops.in_flight());
            if !busy {
                break;
            }
            if Instant::now() > deadline {
                eprintln!(
                    "weir transport: io_uring operations did not complete at shutdown; \
                     leaking their buffers"
                );
                std::mem::forget(std::mem::take(&mut self.conns));
                if let Backend::Uring(ring) = std::mem::replace(&mut self.backend, Backend::Stopped)
                {
                    ring.ring.leak();
                }
                break;
            }
            if ring.wait(Duration::from_millis(10)).is_err() {
                continue;
            }
            self.complete();
        }
        for gate in self.gates.iter_mut().flatten() {
            for channel in &mut gate.channels {
                channel.close(Some(Arc::new(TransportError::Stopped)));
            }
        }
    }
}
