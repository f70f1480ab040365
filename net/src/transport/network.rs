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
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

use weir_engine::exchange::{Buffer, InputChannel, LocalBufferPool, SharedBuffer};
use weir_engine::park::{Notify, Parker};
use weir_engine::ring::Producer;

use super::channel::FailureSlot;
use super::error::{FrameError, TransportError};
use super::frame::{FrameKind, Header, CONNECTION_CHANNEL, ERROR_MESSAGE_MAX, HEADER_SIZE};
use super::{Commands, Peer, TransportConfig};
use crate::driver::Wake;

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

/// What API calls ask of the network thread.
pub(crate) enum Command {
    /// Offer a subpartition's channel under an id.
    Serve {
        channel: u32,
        input: Box<dyn InputChannel>,
    },
    /// Request channels from a peer into a gate's receive pool.
    Consume(Gate),
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
    ) -> Self {
        RecvChannel {
            id,
            ring: Some(ring),
            notify,
            failure,
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
    Shared(SharedBuffer),
    Bytes(Vec<u8>),
}

impl Payload {
    fn as_slice(&self) -> &[u8] {
        match self {
            Payload::None => &[],
            Payload::Shared(buffer) => buffer.as_slice(),
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
        gate: usize,
        index: usize,
        buffer: Buffer,
        len: usize,
        filled: usize,
    },
    Discard {
        left: usize,
    },
    Message {
        channel: u32,
        bytes: Vec<u8>,
        filled: usize,
    },
}

struct Conn {
    stream: mio::net::TcpStream,
    addr: SocketAddr,
    /// The peer's process id, once its handshake arrived.
    process: Option<u32>,
    connecting: bool,
    handshake_deadline: Option<Instant>,
    out: VecDeque<Out>,
    /// Bytes of the front frame already written.
    out_offset: usize,
    header: [u8; HEADER_SIZE],
    header_len: usize,
    reading: Reading,
    /// Channels consumed over this connection: id → (gate, index in the gate).
    incoming: HashMap<u32, (usize, usize)>,
    outgoing: Vec<SendChannel>,
}

impl Conn {
    fn new(stream: mio::net::TcpStream, addr: SocketAddr, connecting: bool, process: u32) -> Self {
        let mut conn = Conn {
            stream,
            addr,
            process: None,
            connecting,
            handshake_deadline: None,
            out: VecDeque::new(),
            out_offset: 0,
            header: [0; HEADER_SIZE],
            header_len: 0,
            reading: Reading::Header,
            incoming: HashMap::new(),
            outgoing: Vec::new(),
        };
        conn.queue(Header::handshake(process), None);
        conn
    }

    fn name(&self) -> String {
        match self.process {
            Some(process) => peer_name(process, self.addr),
            None => format!("peer at {}", self.addr),
        }
    }

    fn queue(&mut self, header: Header, payload: Option<Payload>) {
        self.out.push_back(Out {
            header: header.encode(),
            payload: payload.unwrap_or(Payload::None),
        });
    }

    /// Writes queued frames until the socket would block; `Ok(true)` if it wrote any.
    fn flush(&mut self) -> io::Result<bool> {
        let mut wrote = false;
        while !self.out.is_empty() {
            let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(2 * FRAMES_PER_WRITE_MAX);
            let mut skip = self.out_offset;
            for out in self.out.iter().take(FRAMES_PER_WRITE_MAX) {
                for part in [&out.header[..], out.payload.as_slice()] {
                    if skip >= part.len() {
                        skip -= part.len();
                        continue;
                    }
                    slices.push(IoSlice::new(&part[skip..]));
                    skip = 0;
                }
            }
            let written = match self.stream.write_vectored(&slices) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            wrote = true;
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
        Ok(wrote)
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
pub(crate) struct Net {
    config: TransportConfig,
    poll: Poll,
    events: Events,
    listener: mio::net::TcpListener,
    wake: Arc<Wake>,
    control: Arc<Control>,
    conns: Vec<Option<Conn>>,
    gates: Vec<Option<Gate>>,
    served: HashMap<u32, Box<dyn InputChannel>>,
    /// Requests for channels not served yet: (connection, channel, credit).
    waiting: Vec<(usize, u32, u32)>,
    scratch: Box<[u8]>,
}

impl Net {
    pub(crate) fn new(
        config: TransportConfig,
        listener: TcpListener,
        wake: Arc<Wake>,
        control: Arc<Control>,
    ) -> io::Result<Self> {
        let poll = Poll::new()?;
        let mut listener = mio::net::TcpListener::from_std(listener);
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        poll.registry()
            .register(&mut SourceFd(&wake.raw()), WAKE, Interest::READABLE)?;
        Ok(Net {
            config,
            poll,
            events: Events::with_capacity(256),
            listener,
            wake,
            control,
            conns: Vec::new(),
            gates: Vec::new(),
            served: HashMap::new(),
            waiting: Vec::new(),
            scratch: vec![0; 64 * 1024].into_boxed_slice(),
        })
    }

    pub(crate) fn run(&mut self, parker: Parker) {
        let spin = self.config.spin;
        let mut progress_at = Instant::now();
        while !self.control.stop.load(Ordering::Acquire) {
            let busy = self.turn();
            let drained = self.served.is_empty()
                && self
                    .conns
                    .iter()
                    .flatten()
                    .all(|c| c.outgoing.is_empty() && c.out.is_empty());
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
            let poll = &mut self.poll;
            let events = &mut self.events;
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
            for event in self.events.iter() {
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
        self.shutdown();
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.conns
            .iter()
            .flatten()
            .filter_map(|c| c.handshake_deadline)
            .min()
    }

    /// One turn; `true` if it did anything.
    fn turn(&mut self) -> bool {
        let mut busy = self.commands();
        let now = Instant::now();
        for slot in 0..self.conns.len() {
            let Some(mut conn) = self.conns[slot].take() else {
                continue;
            };
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
            }
        }
        any
    }

    fn serve(&mut self, channel: u32, input: Box<dyn InputChannel>) {
        if let Some(at) = self.waiting.iter().position(|&(_, c, _)| c == channel) {
            let (slot, _, credit) = self.waiting.swap_remove(at);
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
        let found = self.conns.iter().position(|c| {
            c.as_ref().is_some_and(|c| {
                c.process == Some(peer.process) || (c.process.is_none() && c.addr == peer.addr)
            })
        });
        let slot = match found {
            Some(slot) => slot,
            None => match mio::net::TcpStream::connect(peer.addr) {
                Ok(mut stream) => {
                    let slot = self.free_slot();
                    if let Err(error) = self.poll.registry().register(
                        &mut stream,
                        Token(slot),
                        Interest::READABLE | Interest::WRITABLE,
                    ) {
                        self.fail_gate(gate, peer, "registering a connection", error);
                        return;
                    }
                    let mut conn = Conn::new(stream, peer.addr, true, self.config.process);
                    conn.handshake_deadline = Some(Instant::now() + self.config.handshake_timeout);
                    self.conns[slot] = Some(conn);
                    slot
                }
                Err(error) => {
                    self.fail_gate(gate, peer, "connecting", error);
                    return;
                }
            },
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
        let conn = self.conns[slot].as_mut().expect("found or made above");
        let exclusive = gate.exclusive;
        for (position, channel) in gate.channels.iter_mut().enumerate() {
            if conn.incoming.contains_key(&channel.id) {
                let cause = TransportError::Config(format!(
                    "channel {} from {} is already consumed by this process; request each \
                     channel once",
                    channel.id,
                    conn.name()
                ));
                channel.close(Some(Arc::new(cause)));
                continue;
            }
            conn.incoming.insert(channel.id, (index, position));
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

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    let slot = self.free_slot();
                    if self
                        .poll
                        .registry()
                        .register(
                            &mut stream,
                            Token(slot),
                            Interest::READABLE | Interest::WRITABLE,
                        )
                        .is_err()
                    {
                        continue;
                    }
                    let mut conn = Conn::new(stream, addr, false, self.config.process);
                    conn.handshake_deadline = Some(Instant::now() + self.config.handshake_timeout);
                    self.conns[slot] = Some(conn);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Out of descriptors or similar: try again at the next event.
                Err(_) => return,
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
        if conn.connecting {
            return Ok(false);
        }
        let mut busy = self.read(slot, conn)?;
        if conn.process.is_some() {
            busy |= self.send(conn);
            for gate in self.gates.iter_mut().flatten() {
                if gate.conn == slot && !gate.is_closed() {
                    busy |= gate.grant(conn);
                }
            }
        }
        self.gates
            .iter_mut()
            .filter(|g| g.as_ref().is_some_and(|g| g.conn == slot && g.is_closed()))
            .for_each(|g| *g = None);
        busy |= conn.flush().map_err(|error| {
            Ending::Failed(TransportError::ConnectionLost {
                peer: conn.name(),
                reason: error.to_string(),
            })
        })?;
        Ok(busy)
    }

    /// Moves served channels' buffers to the connection's queue against credit.
    fn send(&mut self, conn: &mut Conn) -> bool {
        let mut busy = false;
        let mut index = 0;
        while index < conn.outgoing.len() {
            let channel = &mut conn.outgoing[index];
            while let Some(buffer) = channel.input.poll_buffer() {
                if !buffer.is_empty() {
                    channel.queue.push_back(buffer);
                }
            }
            while channel.credit > 0 {
                let Some(buffer) = channel.queue.pop_front() else {
                    break;
                };
                let header = Header {
                    kind: FrameKind::Buffer,
                    len: buffer.len() as u32,
                    channel: channel.id,
                    arg0: channel.sequence,
                    arg1: channel.queue.len() as u32,
                };
                channel.credit -= 1;
                channel.sequence = channel.sequence.wrapping_add(1);
                conn.out.push_back(Out {
                    header: header.encode(),
                    payload: Payload::Shared(buffer),
                });
                busy = true;
            }
            let channel = &mut conn.outgoing[index];
            if channel.queue.is_empty() && channel.input.is_disconnected() {
                // Re-check: the producer may have sent its last buffer before it went.
                if let Some(buffer) = channel.input.poll_buffer() {
                    channel.queue.push_back(buffer);
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
                Reading::Header => conn.stream.read(&mut conn.header[header_len..]),
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
                    conn.stream.read_vectored(&mut slices)
                }
                Reading::Discard { left } => {
                    let size = (*left).min(self.scratch.len());
                    conn.stream.read(&mut self.scratch[..size])
                }
                Reading::Message { bytes, filled, .. } => conn.stream.read(&mut bytes[*filled..]),
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
                gate,
                index,
                mut buffer,
                len,
                ..
            } => {
                buffer.set_len(len);
                let channel = self.gates[gate]
                    .as_mut()
                    .map(|g| &mut g.channels[index])
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
                if let Some(&(gate, index)) = conn.incoming.get(&channel) {
                    if let Some(gate) = self.gates[gate].as_mut() {
                        let failure = TransportError::ChannelFailed {
                            channel,
                            peer: conn.name(),
                            cause,
                        };
                        gate.channels[index].close(Some(Arc::new(failure)));
                    }
                }
                Ok(())
            }
            Reading::Header | Reading::Discard { .. } => Ok(()),
        }
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
            if header.kind != FrameKind::Handshake {
                return Err(protocol(
                    conn,
                    format!("a {} frame before the handshake", header.kind.name()),
                ));
            }
            conn.process = Some(header.channel);
            conn.handshake_deadline = None;
            return Ok(());
        }
        let channel = header.channel;
        match header.kind {
            FrameKind::Handshake => return Err(protocol(conn, "a second handshake".into())),
            FrameKind::PartitionRequest => {
                if conn.outgoing.iter().any(|c| c.id == channel) {
                    let message = format!("channel {channel} is already being sent to you");
                    queue_error(conn, channel, &message);
                } else if let Some(input) = self.served.remove(&channel) {
                    conn.outgoing.push(SendChannel {
                        id: channel,
                        input,
                        queue: VecDeque::new(),
                        credit: header.arg0,
                        sequence: 0,
                    });
                } else {
                    self.waiting.push((slot, channel, header.arg0));
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
                } else if let Some(waiting) = self
                    .waiting
                    .iter_mut()
                    .find(|w| w.0 == slot && w.1 == channel)
                {
                    waiting.2 = waiting.2.saturating_add(header.arg0);
                }
                // Otherwise the channel ended meanwhile: late credit is harmless.
            }
            FrameKind::Cancel => {
                conn.outgoing.retain(|c| c.id != channel);
                self.waiting.retain(|w| !(w.0 == slot && w.1 == channel));
            }
            FrameKind::EndOfPartition => {
                let Some(&(gate, index)) = conn.incoming.get(&channel) else {
                    return Err(protocol(
                        conn,
                        format!("end of partition for channel {channel}, never requested"),
                    ));
                };
                if let Some(gate) = self.gates[gate].as_mut() {
                    gate.channels[index].close(None);
                }
            }
            FrameKind::Error => {
                let len = header.len as usize;
                debug_assert!(len <= ERROR_MESSAGE_MAX, "checked by Header::decode");
                conn.reading = Reading::Message {
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
        }
        Ok(())
    }

    /// A buffer header: checks it against the channel's credit and sequence, and starts
    /// reading its payload into a segment of the channel's receive pool.
    fn buffer(&mut self, conn: &mut Conn, header: Header) -> Result<(), Ending> {
        let channel = header.channel;
        let len = header.len as usize;
        let Some(&(gate_index, index)) = conn.incoming.get(&channel) else {
            return Err(Ending::Rejected(TransportError::Protocol {
                peer: conn.name(),
                reason: format!("a buffer for channel {channel}, which was never requested"),
            }));
        };
        let Some(gate) = self.gates[gate_index].as_mut() else {
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
            gate: gate_index,
            index,
            buffer,
            len,
            filled: 0,
        };
        Ok(())
    }

    /// Ends a connection: fails its open channels (or closes them cleanly).
    fn end(&mut self, slot: usize, mut conn: Conn, ending: Ending) {
        let name = conn.name();
        let cause = match ending {
            Ending::Closed => TransportError::ConnectionLost {
                peer: name.clone(),
                reason: "closed by the peer".into(),
            },
            Ending::Failed(error) => error,
            Ending::Rejected(error) => {
                // Best effort: tell the peer why, without waiting.
                conn.out.clear();
                conn.out_offset = 0;
                queue_error(&mut conn, CONNECTION_CHANNEL, &error.to_string());
                let _ = conn.flush();
                error
            }
        };
        let cause = Arc::new(cause);
        for (&channel, &(gate, index)) in &conn.incoming {
            if let Some(gate) = self.gates[gate].as_mut() {
                let failure = TransportError::ChannelFailed {
                    channel,
                    peer: name.clone(),
                    cause: Arc::clone(&cause),
                };
                gate.channels[index].close(Some(Arc::new(failure)));
            }
        }
        for gate in self.gates.iter_mut() {
            if gate.as_ref().is_some_and(|g| g.conn == slot) {
                *gate = None;
            }
        }
        self.waiting.retain(|w| w.0 != slot);
        let _ = self.poll.registry().deregister(&mut conn.stream);
        let _ = conn.stream.shutdown(std::net::Shutdown::Both);
        // The served channels' consumer ends drop with the connection: their producers
        // see the consumer gone.
        drop(conn);
    }

    fn shutdown(&mut self) {
        for slot in 0..self.conns.len() {
            if let Some(conn) = self.conns[slot].take() {
                self.end(slot, conn, Ending::Failed(TransportError::Stopped));
            }
        }
        for gate in self.gates.iter_mut().flatten() {
            for channel in &mut gate.channels {
                channel.close(Some(Arc::new(TransportError::Stopped)));
            }
        }
    }
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
