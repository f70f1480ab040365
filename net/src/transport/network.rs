//! The network thread: connections, the receive side's credit accounting, the send
//! side's queues, and the loop that drives them (see the module docs of `transport`).
//!
//! Ownership: everything here belongs to the network thread. Other threads reach it only
//! through `Control` (commands under a mutex, the stop flag), the rings of the channels
//! (the thread owns the receive rings' producers and the served channels' consumers),
//! and the receive pools' recycling (lock-free, from the gates' threads).
//!
//! Credit invariant, per gate: the sum over its channels of (buffers its pool lent to the
//! channel and has not seen back + credit outstanding) never exceeds the pool's size. A
//! buffer that arrives against a credit therefore always finds a free segment.

use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{opcode, types};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

use weir_engine::exchange::{Buffer, InputChannel, LocalBufferPool, SharedBuffer};
use weir_engine::park::{Notify, Parker};
use weir_engine::ring::Producer;

use super::auth::{self, JobId, HELLO_SIZE, NONCE_SIZE, TAG_SIZE};
use super::channel::{BufferSizeSlot, FailureSlot};
use super::error::{FrameError, TransportError};
use super::frame::{FrameKind, Header, CONNECTION_CHANNEL, ERROR_MESSAGE_MAX, HEADER_SIZE};
use super::uring::{self, Uring, UringOps, OP_LISTEN, OP_POLL, OP_RECV, OP_SEND, OP_WAKE};
use super::waiting::{Refusal, Waiting, REQUESTS_WAITING_PER_CONNECTION_MAX};
use super::{Commands, Peer, TransportConfig};
use crate::driver::{DriverKind, Wake};

const WAKE: Token = Token(usize::MAX);
const LISTENER: Token = Token(usize::MAX - 1);
/// Reads per connection per turn, so that one busy peer cannot hold the loop.
const READS_PER_TURN_MAX: usize = 64;
/// Frames (header and payload slices) per vectored write.
const FRAMES_PER_WRITE_MAX: usize = 512;
/// The longest park without a deadline: a safety net, every source of work wakes us.
const IDLE_PARK_MAX: Duration = Duration::from_millis(100);
/// Largest buffer header accepted before the channel's pool is known: the engine's
/// largest segment. The channel's own segment size is checked when it is known.
const BUFFER_PAYLOAD_MAX: usize = weir_engine::limits::SEGMENT_SIZE_MAX;

/// How long a stopping transport waits for its peers to close their ends (see
/// `Net::linger`).
const LINGER: Duration = Duration::from_millis(500);

/// Handshake refusals kept for [`Control::refused`].
pub(crate) const REFUSALS_KEPT: usize = 64;

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
const ANNOUNCED_BUFFER_SIZE_MIN: usize = 256;

/// What API calls ask of the network thread.
pub(crate) enum Command {
    /// Offer a subpartition's channel under an id.
    Serve {
        channel: u32,
        input: Box<dyn InputChannel>,
    },
    /// Request channels from a peer into a gate's receive pool.
    Consume(Gate),
    /// Dial a peer unless a connection to it exists already.
    Connect(Peer),
}

/// Shared between the API and the network thread.
#[derive(Default)]
pub(crate) struct Control {
    pub(crate) commands: Commands,
    pub(crate) stop: AtomicBool,
    /// Whether, at the end of the last turn, every served channel had been requested,
    /// sent to its end and its end-of-partition frame written (see `Transport::drain`).
    pub(crate) drained: AtomicBool,
    /// Turns completed (after `drained` is stored).
    pub(crate) turns: std::sync::atomic::AtomicU64,
    /// Processes with a connection whose handshake completed.
    pub(crate) connected: std::sync::Mutex<std::collections::HashSet<u32>>,
    /// Connections whose handshake completed, since the start.
    pub(crate) opened: std::sync::atomic::AtomicUsize,
    /// Why each connection that ended with channels open ended.
    pub(crate) lost: std::sync::Mutex<Vec<String>>,
    /// Processes this one dialed that refused it, or that it refused, in the handshake
    /// (the latest [`REFUSALS_KEPT`] at most): why, by process id.
    pub(crate) refused: std::sync::Mutex<VecDeque<(u32, String)>>,
}

pub(crate) fn peer_name(process: u32, addr: SocketAddr) -> String {
    format!("process {process} at {addr}")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChannelState {
    Open,
    /// Ended, cancelled or failed: late buffers are read and dropped.
    Closed,
}

/// A channel this process consumes.
pub(crate) struct RecvChannel {
    id: u32,
    ring: Option<Producer<SharedBuffer>>,
    notify: Option<Arc<dyn Notify>>,
    failure: FailureSlot,
    /// The buffer size the consumer's gate announced (0: none), and the last one sent.
    buffer_size: BufferSizeSlot,
    buffer_size_sent: u32,
    state: ChannelState,
    credit: u32,
    announce: u32,
    backlog: u32,
    next_sequence: u32,
}

impl RecvChannel {
    pub(crate) fn new(
        id: u32,
        ring: Producer<SharedBuffer>,
        notify: Option<Arc<dyn Notify>>,
        failure: FailureSlot,
        buffer_size: BufferSizeSlot,
    ) -> Self {
        RecvChannel {
            id,
            ring: Some(ring),
            notify,
            failure,
            buffer_size,
            buffer_size_sent: 0,
            state: ChannelState::Open,
            credit: 0,
            announce: 0,
            backlog: 0,
            next_sequence: 0,
        }
    }

    /// Ends the channel: with `failure`, the consumer's gate reports it; without, the
    /// consumer sees a clean disconnection after the buffers it has.
    fn close(&mut self, failure: Option<Arc<TransportError>>) {
        if self.state == ChannelState::Closed {
            return;
        }
        self.state = ChannelState::Closed;
        self.credit = 0;
        self.announce = 0;
        if let Some(failure) = failure {
            // Written before the producer is dropped below (the gate reads it after it
            // sees the disconnection).
            *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(failure);
        }
        self.ring = None;
        if let Some(notify) = &self.notify {
            notify.notify();
        }
    }
}

/// A [`consume`](super::Transport::consume) call's channels and their receive pool.
pub(crate) struct Gate {
    peer: Peer,
    pool: LocalBufferPool,
    channels: Vec<RecvChannel>,
    exclusive: u32,
    floating: u32,
    /// Where the next round of floating grants starts (round robin).
    rotate: usize,
    conn: usize,
    /// Tells this gate from earlier ones in the same slot of `Net::gates`: frames that
    /// name a channel of a freed gate must not reach whichever gate took its slot.
    generation: u64,
}

impl Gate {
    pub(crate) fn new(
        peer: Peer,
        pool: LocalBufferPool,
        channels: Vec<RecvChannel>,
        exclusive: u32,
        floating: u32,
    ) -> Self {
        Gate {
            peer,
            pool,
            channels,
            exclusive,
            floating,
            rotate: 0,
            conn: usize::MAX,
            generation: 0,
        }
    }

    fn is_closed(&self) -> bool {
        self.channels
            .iter()
            .all(|c| c.state == ChannelState::Closed)
    }

    /// Cancels channels whose consumer dropped them, then grants credit (see the module
    /// docs of `transport`); queues cancel and add-credit frames on `conn`.
    fn grant(&mut self, conn: &mut Conn) -> bool {
        let mut queued = false;
        for channel in &mut self.channels {
            if channel.state == ChannelState::Open
                && channel.ring.as_ref().is_some_and(|r| r.is_abandoned())
            {
                channel.close(None);
                conn.queue(Header::control(FrameKind::Cancel, channel.id, 0), None);
                queued = true;
            }
        }
        // Collects recycled buffers and re-arms the pool's notification.
        self.pool.available_or_notify();
        let exclusive = self.exclusive;
        let mut floating_used: u32 = 0;
        for (index, channel) in self.channels.iter().enumerate() {
            let holding = self.pool.held_by(index) as u32 + channel.credit;
            floating_used += holding.saturating_sub(exclusive);
        }
        let count = self.channels.len();
        for step in 0..count {
            let index = (self.rotate + step) % count;
            let held = self.pool.held_by(index) as u32;
            let channel = &mut self.channels[index];
            if channel.state != ChannelState::Open {
                continue;
            }
            let holding = held + channel.credit;
            let mut grant = exclusive.saturating_sub(holding);
            let want = exclusive.saturating_add(channel.backlog);
            let extra = want
                .saturating_sub(holding + grant)
                .min(self.floating.saturating_sub(floating_used));
            floating_used += extra;
            grant += extra;
            channel.credit += grant;
            channel.announce += grant;
        }
        self.rotate = (self.rotate + 1) % count;
        for channel in &mut self.channels {
            // Relaxed: advice, sent when it changes (the gate announces it rarely).
            let size = channel.buffer_size.load(Ordering::Relaxed);
            if channel.state == ChannelState::Open && size != channel.buffer_size_sent {
                conn.queue(
                    Header::control(FrameKind::BufferSize, channel.id, size),
                    None,
                );
                channel.buffer_size_sent = size;
                queued = true;
            }
            if channel.announce > 0 {
                conn.queue(
                    Header::control(FrameKind::AddCredit, channel.id, channel.announce),
                    None,
                );
                channel.announce = 0;
                queued = true;
            }
        }
        debug_assert!(
            self.channels
                .iter()
                .enumerate()
                .map(|(i, c)| self.pool.held_by(i) + c.credit as usize)
                .sum::<usize>()
                <= self.pool.size(),
            "credit invariant"
        );
        queued
    }
}

/// A served channel attached to the connection that requested it.
struct SendChannel {
    id: u32,
    input: Box<dyn InputChannel>,
    queue: VecDeque<SharedBuffer>,
    credit: u32,
    sequence: u32,
}

enum Payload {
    None,
    /// A producer's buffer and the length its header announced: the frame sends
    /// exactly those bytes, whatever the buffer's view says later.
    Shared(SharedBuffer, usize),
    Bytes(Vec<u8>),
}

impl Payload {
    fn as_slice(&self) -> &[u8] {
        match self {
            Payload::None => &[],
            Payload::Shared(buffer, len) => &buffer.as_slice()[..*len],
            Payload::Bytes(bytes) => bytes,
        }
    }
}

struct Out {
    header: [u8; HEADER_SIZE],
    payload: Payload,
}

enum Reading {
    Header,
    Payload {
        at: ChannelAt,
        buffer: Buffer,
        len: usize,
        filled: usize,
    },
    Discard {
        left: usize,
    },
    /// The payload of a handshake, an authentication or an error frame.
    Message {
        kind: FrameKind,
        channel: u32,
        bytes: Vec<u8>,
        filled: usize,
    },
}

/// Where a consumed channel lives: its gate's slot in `Net::gates`, that gate's
/// generation (the slot is reused once the gate is freed), and the channel's index in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ChannelAt {
    gate: usize,
    generation: u64,
    index: usize,
}

/// The receive channel at `at`, if its gate is still the one it was consumed into and
/// the index is in range: a stale or hostile frame never reaches another gate's channel.
fn gate_at(gates: &mut [Option<Gate>], at: ChannelAt) -> Option<&mut Gate> {
    gates
        .get_mut(at.gate)?
        .as_mut()
        .filter(|gate| gate.generation == at.generation && at.index < gate.channels.len())
}

/// Bytes a connection reads at a time of a payload it drops (of a cancelled channel).
const DISCARD_SIZE: usize = 4096;

struct Conn {
    stream: TcpStream,
    addr: SocketAddr,
    /// The peer's process id, once it authenticated (handshake, then its answer to our
    /// nonce): until then no other frame is accepted.
    process: Option<u32>,
    /// The process id the peer's handshake claimed, before it proved it.
    claimed: Option<u32>,
    /// The nonce our handshake sent, which the peer's authentication must answer.
    nonce: [u8; NONCE_SIZE],
    /// When bytes last arrived (the idle timeout runs from here).
    last_read: Instant,
    /// When a frame was last queued (a heartbeat goes out when this grows old).
    last_queued: Instant,
    /// The process this side connected to, which the handshake must name.
    expected: Option<u32>,
    connecting: bool,
    handshake_deadline: Option<Instant>,
    /// Frames being written: not touched while an io_uring write of them is in flight.
    out: VecDeque<Out>,
    /// Bytes of the front frame already written.
    out_offset: usize,
    /// Frames queued since the last write started.
    staged: VecDeque<Out>,
    /// Frames queued before this side answered the peer's nonce (partition requests of
    /// a fresh connection): they follow the authentication frame, which the peer wants
    /// first.
    held: VecDeque<Out>,
    /// Boxed: the kernel writes into it during an io_uring read, while the
    /// connection itself may move.
    header: Box<[u8; HEADER_SIZE]>,
    header_len: usize,
    discard: Box<[u8]>,
    /// The io_uring operations' state (unused on epoll).
    ops: UringOps,
    /// Failed and shut down; kept only until its io_uring operations complete.
    dead: bool,
    reading: Reading,
    /// Requests of the peer's refused with an error frame (see `refuse_channel`).
    refusals: u32,
    /// Channels consumed over this connection, by id. An entry outlives its gate (late
    /// frames of the channel are then dropped) until the id is consumed again.
    incoming: HashMap<u32, ChannelAt>,
    outgoing: Vec<SendChannel>,
}

impl Conn {
    /// A connection whose first frame, queued here, is this process's handshake.
    fn new(
        stream: TcpStream,
        addr: SocketAddr,
        connecting: bool,
        process: u32,
        job: &JobId,
    ) -> Self {
        let now = Instant::now();
        let nonce = auth::nonce();
        let mut conn = Conn {
            stream,
            addr,
            process: None,
            claimed: None,
            nonce,
            last_read: now,
            last_queued: now,
            expected: None,
            connecting,
            handshake_deadline: None,
            out: VecDeque::new(),
            out_offset: 0,
            staged: VecDeque::new(),
            held: VecDeque::new(),
            header: Box::new([0; HEADER_SIZE]),
            header_len: 0,
            discard: vec![0; DISCARD_SIZE].into_boxed_slice(),
            ops: UringOps::new(2 * FRAMES_PER_WRITE_MAX),
            dead: false,
            reading: Reading::Header,
            refusals: 0,
            incoming: HashMap::new(),
            outgoing: Vec::new(),
        };
        let mut hello = Vec::with_capacity(HELLO_SIZE);
        hello.extend_from_slice(&nonce);
        hello.extend_from_slice(&job.0);
        conn.queue(Header::handshake(process), Some(Payload::Bytes(hello)));
        conn
    }

    fn name(&self) -> String {
        match self.process {
            Some(process) => peer_name(process, self.addr),
            None => format!("peer at {}", self.addr),
        }
    }

    fn queue(&mut self, header: Header, payload: Option<Payload>) {
        let out = Out {
            header: header.encode(),
            payload: payload.unwrap_or(Payload::None),
        };
        let early = matches!(
            header.kind,
            FrameKind::Handshake | FrameKind::Auth | FrameKind::Error
        );
        if self.claimed.is_none() && !early {
            self.held.push_back(out);
        } else {
            self.staged.push_back(out);
        }
    }

    /// Writes queued frames until the socket would block; `Ok(true)` if it wrote any.
    fn flush(&mut self) -> io::Result<bool> {
        let mut wrote = false;
        self.out.append(&mut self.staged);
        while !self.out.is_empty() {
            let mut slices = [IoSlice::new(&[]); 2 * FRAMES_PER_WRITE_MAX];
            let mut count = 0;
            let mut skip = self.out_offset;
            for out in self.out.iter().take(FRAMES_PER_WRITE_MAX) {
                for part in [&out.header[..], out.payload.as_slice()] {
                    if skip >= part.len() {
                        skip -= part.len();
                        continue;
                    }
                    slices[count] = IoSlice::new(&part[skip..]);
                    count += 1;
                    skip = 0;
                }
            }
            let written = match (&self.stream).write_vectored(&slices[..count]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            wrote = true;
            self.written(written);
        }
        Ok(wrote)
    }

    /// Drops the frames that `written` more bytes completed.
    fn written(&mut self, written: usize) {
        let mut done = self.out_offset + written;
        while let Some(front) = self.out.front() {
            let size = HEADER_SIZE + front.payload.as_slice().len();
            if done < size {
                break;
            }
            done -= size;
            // Sent: a producer's segment is recycled here.
            self.out.pop_front();
        }
        self.out_offset = done;
    }
}

/// Why a connection ends.
enum Ending {
    /// Closed by the peer.
    Closed,
    /// Failed: every open channel on it fails with this.
    Failed(TransportError),
    /// Failed by what the peer sent: it gets an error frame first.
    Rejected(TransportError),
}

/// The network thread's state.
/// How the network thread waits and does its I/O.
enum Backend {
    /// Readiness (epoll through mio); reads and writes are system calls in the turn.
    Epoll { poll: Poll, events: Events },
    /// Completions: reads and writes are operations submitted once per turn.
    Uring(Box<Uring>),
    /// After a shutdown that had to leak the ring.
    Stopped,
}

pub(crate) struct Net {
    config: TransportConfig,
    backend: Backend,
    /// Whether the last wait reaped completions (work for the next turn).
    completed: bool,
    /// Whether a completed read or write was followed at once by the next one.
    draining: bool,
    listener: TcpListener,
    wake: Arc<Wake>,
    control: Arc<Control>,
    conns: Vec<Option<Conn>>,
    gates: Vec<Option<Gate>>,
    /// The generation the next gate gets.
    gate_generation: u64,
    served: HashMap<u32, Box<dyn InputChannel>>,
    /// Requests for channels not served yet (each fails after `request_timeout`).
    waiting: Waiting,
    /// When to try accepting again after the kernel refused a connection.
    accept_retry: Option<Instant>,
}

impl Net {
    pub(crate) fn new(
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
        })
    }

    /// The I/O backend's name: "uring" or "epoll".
    pub(crate) fn driver_name(&self) -> &'static str {
        match self.backend {
            Backend::Epoll { .. } => "epoll",
            Backend::Uring(_) => "uring",
            Backend::Stopped => "stopped",
        }
    }

    pub(crate) fn run(&mut self, parker: Parker) {
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
                    let mut failure = ring.arm(self.wake.raw(), self.listener.as_raw_fd()).err();
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
                Command::Serve { channel, input } => self.serve(channel, input),
                Command::Consume(gate) => self.consume(gate),
                Command::Connect(peer) => {
                    // A failed dial is dropped: the caller waits for the connection and
                    // asks again (`TransportChannels::wait_for_peers`).
                    let _ = self.connection_to(peer);
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

    fn serve(&mut self, channel: u32, input: Box<dyn InputChannel>) {
        if let Some((slot, credit)) = self.waiting.take(channel) {
            if let Some(conn) = self.conns[slot].as_mut() {
                conn.outgoing.push(SendChannel {
                    id: channel,
                    input,
                    queue: VecDeque::new(),
                    credit,
                    sequence: 0,
                });
                return;
            }
        }
        // A second serve of the same id replaces the first (whose consumer, if any,
        // is attached already and unaffected).
        self.served.insert(channel, input);
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
                        .filter(|c| !c.dead && c.process.is_none())
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

    fn finish_payload(&mut self, conn: &mut Conn, reading: Reading) -> Result<(), Ending> {
        match reading {
            Reading::Payload {
                at,
                mut buffer,
                len,
                ..
            } => {
                buffer.set_len(len);
                // The gate may have gone while the payload was read: then it is dropped.
                let channel = gate_at(&mut self.gates, at)
                    .map(|g| &mut g.channels[at.index])
                    .filter(|c| c.state == ChannelState::Open);
                if let Some(channel) = channel {
                    if let Some(ring) = channel.ring.as_mut() {
                        if ring.try_push(buffer.into_shared()).is_err() {
                            unreachable!("rings hold the whole receive pool");
                        }
                        if let Some(notify) = &channel.notify {
                            notify.notify();
                        }
                    }
                }
                Ok(())
            }
            Reading::Message {
                kind: FrameKind::Handshake,
                channel,
                bytes,
                ..
            } => self.hello(conn, channel, &bytes),
            Reading::Message {
                kind: FrameKind::Auth,
                bytes,
                ..
            } => self.authenticate(conn, &bytes),
            Reading::Message { channel, bytes, .. } => {
                let message = String::from_utf8_lossy(&bytes).into_owned();
                let cause = TransportError::Remote {
                    peer: conn.name(),
                    message,
                };
                if channel == CONNECTION_CHANNEL {
                    return Err(Ending::Failed(cause));
                }
                let cause = Arc::new(cause);
                if let Some(&at) = conn.incoming.get(&channel) {
                    if let Some(gate) = gate_at(&mut self.gates, at) {
                        let failure = TransportError::ChannelFailed {
                            channel,
                            peer: conn.name(),
                            cause,
                        };
                        gate.channels[at.index].close(Some(Arc::new(failure)));
                    }
                }
                Ok(())
            }
            Reading::Header | Reading::Discard { .. } => Ok(()),
        }
    }

    /// The peer's handshake: checks who it claims to be and that it runs this job, then
    /// answers its nonce (see `auth`). It is accepted once its own answer verifies.
    fn hello(&mut self, conn: &mut Conn, process: u32, bytes: &[u8]) -> Result<(), Ending> {
        let refuse = |conn: &Conn, reason: String| {
            Ending::Rejected(TransportError::Refused {
                peer: conn.name(),
                reason,
            })
        };
        debug_assert_eq!(bytes.len(), HELLO_SIZE, "checked by Header::decode");
        if let Some(expected) = conn.expected {
            if expected != process {
                return Err(refuse(
                    conn,
                    format!(
                        "it is process {process}, not process {expected} as asked for: check \
                         the peer list (addresses and process ids)"
                    ),
                ));
            }
        }
        if process == self.config.process {
            return Err(refuse(
                conn,
                format!("it claims this process's own id {process}: give every process its own"),
            ));
        }
        if let Some(processes) = self.config.processes {
            if process >= processes {
                return Err(refuse(
                    conn,
                    format!(
                        "process id {process} is not one of this job's {processes} processes: \
                         check the peer list"
                    ),
                ));
            }
        }
        if self.is_live(process) {
            return Err(refuse(
                conn,
                format!(
                    "process {process} is connected already: two processes share an id, or an \
                     old one still runs"
                ),
            ));
        }
        let job = JobId(bytes[NONCE_SIZE..].try_into().expect("checked size"));
        if job != self.config.job {
            return Err(refuse(
                conn,
                format!(
                    "it runs another job (id {}…, this process {}…): start every process of a \
                     job with the same graph, worker layout and settings",
                    job.short(),
                    self.config.job.short()
                ),
            ));
        }
        let nonce: [u8; NONCE_SIZE] = bytes[..NONCE_SIZE].try_into().expect("checked size");
        let tag = auth::tag(
            self.config.secret.as_ref(),
            &nonce,
            self.config.process,
            process,
            &self.config.job,
        );
        let header = Header {
            kind: FrameKind::Auth,
            len: TAG_SIZE as u32,
            channel: 0,
            arg0: 0,
            arg1: 0,
        };
        conn.queue(header, Some(Payload::Bytes(tag.to_vec())));
        conn.claimed = Some(process);
        // What was queued before (partition requests) goes after the answer.
        let held = std::mem::take(&mut conn.held);
        conn.staged.extend(held);
        Ok(())
    }

    /// The peer's answer to our nonce: once it verifies, the peer is the process it
    /// claimed and a member of this job, and its other frames are accepted.
    fn authenticate(&mut self, conn: &mut Conn, tag: &[u8]) -> Result<(), Ending> {
        let process = conn
            .claimed
            .expect("an authentication frame follows a handshake");
        let verified = auth::verify(
            self.config.secret.as_ref(),
            &conn.nonce,
            process,
            self.config.process,
            &self.config.job,
            tag,
        );
        if !verified {
            return Err(Ending::Rejected(TransportError::Refused {
                peer: conn.name(),
                reason: "its authentication does not verify: it does not hold this job's \
                         cluster secret (give every process the same --secret-file)"
                    .into(),
            }));
        }
        if self.is_live(process) {
            return Err(Ending::Rejected(TransportError::Refused {
                peer: conn.name(),
                reason: format!("process {process} is connected already"),
            }));
        }
        conn.process = Some(process);
        conn.handshake_deadline = None;
        self.control
            .connected
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(process);
        self.control.opened.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Whether another live connection belongs to authenticated process `process` (the
    /// connection being driven is out of `conns` meanwhile).
    fn is_live(&self, process: u32) -> bool {
        self.conns
            .iter()
            .flatten()
            .any(|c| !c.dead && c.process == Some(process))
    }

    /// Applies a decoded header.
    fn frame(&mut self, slot: usize, conn: &mut Conn, header: Header) -> Result<(), Ending> {
        let protocol = |conn: &Conn, reason: String| {
            Ending::Rejected(TransportError::Protocol {
                peer: conn.name(),
                reason,
            })
        };
        if conn.process.is_none() {
            // Before the peer authenticated: its handshake, then its answer to our nonce.
            let expected = if conn.claimed.is_none() {
                FrameKind::Handshake
            } else {
                FrameKind::Auth
            };
            if header.kind == FrameKind::Error && header.channel == CONNECTION_CHANNEL {
                // The peer refused us and says why: read it (fails the connection with
                // the peer's own words).
                conn.reading = Reading::Message {
                    kind: FrameKind::Error,
                    channel: header.channel,
                    bytes: vec![0; header.len as usize],
                    filled: 0,
                };
                if header.len == 0 {
                    let reading = std::mem::replace(&mut conn.reading, Reading::Header);
                    self.finish_payload(conn, reading)?;
                }
                return Ok(());
            }
            if header.kind != expected {
                return Err(protocol(
                    conn,
                    format!(
                        "a {} frame where its {} was due",
                        header.kind.name(),
                        expected.name()
                    ),
                ));
            }
            // Fixed-size payloads (checked by `Header::decode`): read, then `hello` or
            // `authenticate`.
            conn.reading = Reading::Message {
                kind: header.kind,
                channel: header.channel,
                bytes: vec![0; header.len as usize],
                filled: 0,
            };
            return Ok(());
        }
        let channel = header.channel;
        match header.kind {
            FrameKind::Handshake | FrameKind::Auth => {
                return Err(protocol(
                    conn,
                    format!("a second {} frame", header.kind.name()),
                ))
            }
            // Arrived, so the peer is alive (`consumed` noted the time): nothing else.
            FrameKind::Heartbeat => {}
            FrameKind::PartitionRequest => {
                if conn.outgoing.iter().any(|c| c.id == channel) {
                    let message = format!("channel {channel} is already being sent to you");
                    refuse_channel(conn, channel, &message)?;
                } else if let Some(input) = self.served.remove(&channel) {
                    conn.outgoing.push(SendChannel {
                        id: channel,
                        input,
                        queue: VecDeque::new(),
                        credit: header.arg0,
                        sequence: 0,
                    });
                } else {
                    match self
                        .waiting
                        .push(slot, channel, header.arg0, Instant::now())
                    {
                        Ok(()) => {}
                        Err(Refusal::Duplicate { .. }) => {
                            // One consumer per channel: the first request keeps it.
                            let message =
                                format!("channel {channel} is already requested by a consumer");
                            refuse_channel(conn, channel, &message)?;
                        }
                        Err(Refusal::Full) => {
                            return Err(protocol(
                                conn,
                                format!(
                                    "more than {REQUESTS_WAITING_PER_CONNECTION_MAX} partition \
                                     requests waiting for channels not served yet"
                                ),
                            ))
                        }
                    }
                }
            }
            FrameKind::AddCredit => {
                if let Some(sender) = conn.outgoing.iter_mut().find(|c| c.id == channel) {
                    match sender.credit.checked_add(header.arg0) {
                        Some(credit) => sender.credit = credit,
                        None => {
                            return Err(protocol(
                                conn,
                                format!("credit of channel {channel} overflows"),
                            ))
                        }
                    }
                } else {
                    // A request still waiting takes it; otherwise the channel ended
                    // meanwhile, and late credit is harmless.
                    self.waiting.add_credit(slot, channel, header.arg0);
                }
            }
            FrameKind::Cancel => {
                conn.outgoing.retain(|c| c.id != channel);
                self.waiting.cancel(slot, channel);
            }
            FrameKind::EndOfPartition => {
                let Some(&at) = conn.incoming.get(&channel) else {
                    return Err(protocol(
                        conn,
                        format!("end of partition for channel {channel}, never requested"),
                    ));
                };
                // A channel whose gate is gone (its consumer dropped it) ignores it.
                if let Some(gate) = gate_at(&mut self.gates, at) {
                    gate.channels[at.index].close(None);
                }
            }
            FrameKind::Error => {
                let len = header.len as usize;
                debug_assert!(len <= ERROR_MESSAGE_MAX, "checked by Header::decode");
                conn.reading = Reading::Message {
                    kind: FrameKind::Error,
                    channel,
                    bytes: vec![0; len],
                    filled: 0,
                };
                if len == 0 {
                    let reading = std::mem::replace(&mut conn.reading, Reading::Header);
                    self.finish_payload(conn, reading)?;
                }
            }
            FrameKind::Buffer => self.buffer(conn, header)?,
            FrameKind::BufferSize => {
                // The consumer's gate debloated: the subpartition starts its next
                // buffers at this size. A channel not sent (yet, or any more) ignores it.
                // A size below the floor is raised to it: a peer cannot make this
                // process send a buffer per few bytes (0 stays "no limit").
                if let Some(sender) = conn.outgoing.iter_mut().find(|c| c.id == channel) {
                    let size = match header.arg0 as usize {
                        0 => 0,
                        size => size.max(ANNOUNCED_BUFFER_SIZE_MIN),
                    };
                    sender.input.announce_buffer_size(size);
                }
            }
        }
        Ok(())
    }

    /// A buffer header: checks it against the channel's credit and sequence, and starts
    /// reading its payload into a segment of the channel's receive pool.
    fn buffer(&mut self, conn: &mut Conn, header: Header) -> Result<(), Ending> {
        let channel = header.channel;
        let len = header.len as usize;
        let Some(&at) = conn.incoming.get(&channel) else {
            return Err(Ending::Rejected(TransportError::Protocol {
                peer: conn.name(),
                reason: format!("a buffer for channel {channel}, which was never requested"),
            }));
        };
        let index = at.index;
        let Some(gate) = gate_at(&mut self.gates, at) else {
            // Its gate is gone (the consumer dropped the channel): a late buffer. The
            // payload is bounded like any other before it is skipped.
            if len > BUFFER_PAYLOAD_MAX {
                return Err(Ending::Rejected(TransportError::Frame {
                    peer: conn.name(),
                    source: FrameError::Oversized {
                        kind: FrameKind::Buffer.name(),
                        len,
                        max: BUFFER_PAYLOAD_MAX,
                    },
                }));
            }
            conn.reading = Reading::Discard { left: len };
            return Ok(());
        };
        let segment_size = gate.pool.segment_size();
        let receiver = &mut gate.channels[index];
        if receiver.state != ChannelState::Open {
            conn.reading = Reading::Discard { left: len };
            return Ok(());
        }
        if len > segment_size {
            return Err(Ending::Rejected(TransportError::Frame {
                peer: conn.name(),
                source: FrameError::Oversized {
                    kind: FrameKind::Buffer.name(),
                    len,
                    max: segment_size,
                },
            }));
        }
        if receiver.credit == 0 {
            return Err(Ending::Rejected(TransportError::Protocol {
                peer: conn.name(),
                reason: format!("a buffer for channel {channel} without credit"),
            }));
        }
        if header.arg0 != receiver.next_sequence {
            return Err(Ending::Rejected(TransportError::Protocol {
                peer: conn.name(),
                reason: format!(
                    "buffer {} of channel {channel} where {} was next",
                    header.arg0, receiver.next_sequence
                ),
            }));
        }
        receiver.credit -= 1;
        receiver.next_sequence = receiver.next_sequence.wrapping_add(1);
        receiver.backlog = header.arg1;
        let Some(buffer) = gate.pool.request(index) else {
            // The credit invariant (module docs) makes this unreachable; fail the
            // connection rather than the thread if it ever breaks.
            debug_assert!(
                false,
                "credit invariant broken: no segment for a credited buffer"
            );
            return Err(Ending::Failed(TransportError::Protocol {
                peer: conn.name(),
                reason: "no receive segment for a credited buffer (internal accounting)".into(),
            }));
        };
        conn.reading = Reading::Payload {
            at,
            buffer,
            len,
            filled: 0,
        };
        Ok(())
    }

    /// Ends a connection: fails its open channels (or closes them cleanly).
    fn end(&mut self, slot: usize, mut conn: Conn, ending: Ending) {
        let name = conn.name();
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
                    conn.out.clear();
                    conn.staged.clear();
                    conn.out_offset = 0;
                    queue_error(&mut conn, CONNECTION_CHANNEL, &error.to_string());
                    let _ = conn.flush();
                }
                error
            }
        };
        if let (None, Some(dialed)) = (conn.process, conn.expected) {
            // A process we dialed and that refused us (its error frame), or that we
            // refused: a caller waiting for it is told why instead of waiting on.
            if matches!(
                cause,
                TransportError::Refused { .. } | TransportError::Remote { .. }
            ) {
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

/// Error frames a connection's peer may cause by its requests over the connection's
/// life: a consumer that asks for channels twice a few times is misconfigured; one
/// that keeps asking (and may not read the answers) would grow the send queue.
const REFUSALS_PER_CONNECTION_MAX: u32 = 1024;

/// Refuses a request of the peer's for `channel` with an error frame; past
/// [`REFUSALS_PER_CONNECTION_MAX`] refuses the connection instead.
fn refuse_channel(conn: &mut Conn, channel: u32, message: &str) -> Result<(), Ending> {
    conn.refusals += 1;
    if conn.refusals > REFUSALS_PER_CONNECTION_MAX {
        return Err(Ending::Rejected(TransportError::Protocol {
            peer: conn.name(),
            reason: format!(
                "more than {REFUSALS_PER_CONNECTION_MAX} refused requests (the last: {message})"
            ),
        }));
    }
    queue_error(conn, channel, message);
    Ok(())
}

/// Queues an error frame, its message cut to what the protocol carries.
fn queue_error(conn: &mut Conn, channel: u32, message: &str) {
    let mut end = message.len().min(ERROR_MESSAGE_MAX);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let bytes = message.as_bytes()[..end].to_vec();
    let header = Header {
        kind: FrameKind::Error,
        len: bytes.len() as u32,
        channel,
        arg0: 0,
        arg1: 0,
    };
    conn.queue(header, Some(Payload::Bytes(bytes)));
}

/// Sets the socket's TCP user timeout: data left unacknowledged this long fails the
/// connection in the kernel (a peer host gone while we send). Best effort: a kernel
/// without it leaves the idle timeout to notice.
fn set_user_timeout(stream: &TcpStream, timeout: Duration) {
    let ms = timeout.as_millis().min(u128::from(u32::MAX)) as libc::c_uint;
    // SAFETY: a valid socket descriptor (the stream is live), and a pointer to a
    // `c_uint` with its size, as TCP_USER_TIMEOUT takes.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            (&ms as *const libc::c_uint).cast(),
            std::mem::size_of::<libc::c_uint>() as libc::socklen_t,
        );
    }
}

/// The ending of a connection whose socket operation failed.
fn io_ending(conn: &Conn, error: io::Error) -> Ending {
    Ending::Failed(TransportError::ConnectionLost {
        peer: conn.name(),
        reason: error.to_string(),
    })
}

/// A failed io_uring read or write: retried if interrupted, else the connection ends.
fn os_error(conn: &Conn, result: i32) -> Result<(), Ending> {
    if result == -libc::EINTR || result == -libc::EAGAIN {
        return Ok(());
    }
    Err(io_ending(conn, io::Error::from_raw_os_error(-result)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_engine::exchange::{LocalPoolConfig, NetworkBufferPool};

    fn conn() -> (Conn, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let stream = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (peer, addr) = listener.accept().expect("accept");
        let mut conn = Conn::new(stream, addr, false, 1, &JobId::default());
        // As after the handshake: frames go to the send queue.
        conn.claimed = Some(2);
        conn.process = Some(2);
        conn.staged.clear();
        (conn, peer)
    }

    /// A gate of `channels` channels, each with its exclusive credit outstanding (as after
    /// the partition request), and the channels' consumer ends.
    fn gate(
        network: &NetworkBufferPool,
        channels: usize,
        exclusive: u32,
        floating: u32,
    ) -> (Gate, Vec<weir_engine::ring::Consumer<SharedBuffer>>) {
        let size = channels * exclusive as usize + floating as usize;
        let config = LocalPoolConfig::new(size, channels)
            .with_max_per_subpartition(1)
            .with_overdraft(0);
        let pool = LocalBufferPool::new(network, config).expect("pool");
        let mut consumers = Vec::new();
        let receivers = (0..channels)
            .map(|id| {
                let (producer, consumer) = weir_engine::ring::channel(size);
                consumers.push(consumer);
                let mut channel =
                    RecvChannel::new(id as u32, producer, None, Arc::default(), Arc::default());
                channel.credit = exclusive;
                channel
            })
            .collect();
        let peer = Peer {
            process: 2,
            addr: SocketAddr::from(([127, 0, 0, 1], 1)),
        };
        (
            Gate::new(peer, pool, receivers, exclusive, floating),
            consumers,
        )
    }

    /// Credit granted per channel by the add-credit frames queued on `conn`.
    fn announced(conn: &mut Conn, channels: usize) -> Vec<u32> {
        let mut granted = vec![0; channels];
        for out in conn.staged.drain(..) {
            let header = Header::decode(&out.header, 0).expect("a valid frame");
            assert_eq!(header.kind, FrameKind::AddCredit);
            granted[header.channel as usize] += header.arg0;
        }
        granted
    }

    fn holding(gate: &Gate) -> Vec<u32> {
        (0..gate.channels.len())
            .map(|i| gate.pool.held_by(i) as u32 + gate.channels[i].credit)
            .collect()
    }

    /// Flink's rules on one gate: floating buffers go only to channels with a backlog,
    /// never more than the gate has; a channel always gets its exclusive buffers back as
    /// its consumer recycles them; every credited buffer has a segment.
    #[test]
    fn credit_follows_backlog_and_never_exceeds_the_pool() {
        let network = NetworkBufferPool::new(64, 256).expect("pool");
        let (mut conn, _peer) = conn();
        let (mut gate, _consumers) = gate(&network, 3, 2, 4);
        // Nothing announced while every channel holds its exclusive credit and has no
        // backlog.
        gate.grant(&mut conn);
        assert_eq!(announced(&mut conn, 3), vec![0, 0, 0]);
        // Backlogs of 10, 1 and 0: the floating buffers go to the first two, 4 in all.
        gate.channels[0].backlog = 10;
        gate.channels[1].backlog = 1;
        gate.grant(&mut conn);
        let granted = announced(&mut conn, 3);
        assert_eq!(granted.iter().sum::<u32>(), 4, "{granted:?}");
        assert_eq!(granted[2], 0, "no backlog, no floating buffer");
        assert!(holding(&gate).iter().sum::<u32>() <= 10);
        // Buffers arrive against every credit and sit with the consumer: no credit.
        let mut held = Vec::new();
        for index in 0..3 {
            while gate.channels[index].credit > 0 {
                gate.channels[index].credit -= 1;
                held.push(gate.pool.request(index).expect("credit has a segment"));
            }
        }
        assert_eq!(held.len(), 10);
        gate.channels[0].backlog = 0;
        gate.channels[1].backlog = 0;
        gate.grant(&mut conn);
        assert_eq!(announced(&mut conn, 3), vec![0, 0, 0]);
        // The consumer recycles everything: each channel gets its exclusive credit
        // back, and nothing floating without a backlog.
        held.clear();
        gate.grant(&mut conn);
        assert_eq!(announced(&mut conn, 3), vec![2, 2, 2]);
        assert_eq!(holding(&gate), vec![2, 2, 2]);
    }

    /// A channel whose consumer dropped it is cancelled at the producer, once.
    #[test]
    fn a_dropped_channel_is_cancelled_once() {
        let network = NetworkBufferPool::new(16, 256).expect("pool");
        let (mut conn, _peer) = conn();
        let size = 4;
        let config = LocalPoolConfig::new(size, 1)
            .with_max_per_subpartition(1)
            .with_overdraft(0);
        let pool = LocalBufferPool::new(&network, config).expect("pool");
        let (producer, consumer) = weir_engine::ring::channel(size);
        let channel = RecvChannel::new(7, producer, None, Arc::default(), Arc::default());
        let peer = Peer {
            process: 2,
            addr: SocketAddr::from(([127, 0, 0, 1], 1)),
        };
        let mut gate = Gate::new(peer, pool, vec![channel], 2, 2);
        drop(consumer);
        gate.grant(&mut conn);
        gate.grant(&mut conn);
        let kinds: Vec<(FrameKind, u32)> = conn
            .staged
            .drain(..)
            .map(|out| {
                let header = Header::decode(&out.header, 0).expect("valid");
                (header.kind, header.channel)
            })
            .collect();
        assert_eq!(kinds, vec![(FrameKind::Cancel, 7)]);
        assert!(gate.is_closed());
    }
}
