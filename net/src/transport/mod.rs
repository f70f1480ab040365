//! Remote channels over TCP with credit-based flow control (Flink's
//! `RemoteInputChannel`, `PartitionRequestQueue` and
//! `CreditBasedPartitionRequestClientHandler`).
//!
//! A [`Transport`] per process listens on one address and runs one **network thread**.
//! A producer process [`serve`](Transport::serve)s a subpartition under a channel id by
//! handing over the consumer end of the subpartition's local channel; a consumer process
//! asks for channels with [`consume`](Transport::consume) and gets
//! [`RemoteInputChannel`]s, which an [`InputGate`](weir_engine::exchange::InputGate)
//! reads beside local ones. One TCP connection per pair of processes carries every
//! channel between them, both ways.
//!
//! # Why a network thread, not the workers' drivers
//!
//! The workers' [`Driver`](weir_engine::runtime::Driver) hands received bytes to a
//! callback from the driver's own receive buffer, so a buffer's payload would be copied
//! from there into a segment; and a connection belongs to one worker, while the channels
//! it multiplexes feed gates on many workers. The transport therefore runs its own loop
//! on one thread per process (as Flink runs Netty threads): it reads each payload
//! straight into a segment of the consuming gate's receive pool with a vectored read
//! (payload into the segment, the next fixed-size header into the header slot), writes
//! many frames per vectored write (headers and the producers' segments, no copy), and
//! hands buffers to gates and takes them from producers through SPSC rings, waking their
//! workers through their [`Notify`]. It is woken the same way: producers' channels and
//! receive pools notify its [`Unparker`], which costs a
//! system call only when the thread is parked.
//!
//! Every turn the thread grants credit, moves the buffers that have credit to their
//! connection's queue, and writes each connection's queued frames with one vectored
//! write. On io_uring (the default where the kernel allows it, as for the workers) each
//! connection keeps one vectored read and one vectored write in flight and the turn
//! submits them all with one `io_uring_enter`, which is also where the thread parks; on
//! epoll (the fallback, through `mio`) the turn reads each ready connection (bounded)
//! and writes with system calls of its own.
//!
//! # Frames
//!
//! Every frame is a 20-byte header, little-endian, then `length` payload bytes:
//!
//! | bytes | field | handshake | request | buffer | add-credit | end | cancel | error | buffer size | auth | heartbeat | checkpoint | priority barrier | aligned barrier |
//! |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
//! | 0–3 | length | 48 | 0 | 1..=segment size | 0 | 0 | 0 | ≤ 4096 | 0 | 32 | 0 | 1..=16384 | 0 | 0 |
//! | 4 | type | 1 | 2 | 3 | 4 | 5 | 6 | 7 | 8 | 9 | 10 | 11 | 12 | 13 |
//! | 5–7 | reserved | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 |
//! | 8–11 | channel | process id | channel | channel | channel | channel | channel | channel or `u32::MAX` (connection) | channel | 0 | 0 | 0 | channel | channel |
//! | 12–15 | arg0 | magic `WEIR` | initial credit | sequence | credit delta ≥ 1 | 0 | 0 | 0 | bytes per buffer (0: no limit) | 0 | 0 | 0 | checkpoint id, low 32 bits | checkpoint id, low 32 bits |
//! | 16–19 | arg1 | version (7) | 0 | backlog | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | high 32 bits (id ≥ 1) | high 32 bits (id ≥ 1) |
//! | 20– | payload | nonce (16), job id (32) | | the buffer's bytes | | | | UTF-8 message | | HMAC tag (32) | | a checkpoint service's message | | |
//!
//! The checkpoint frame (version 5) carries the messages of the processes' checkpoint
//! services ([`weir_engine::checkpoint::link`]) over the connection that already joins
//! two processes, in order with everything else on it; [`Transport::send_checkpoint`]
//! sends one and [`Transport::open_checkpoints`] receives them, with a loss event when
//! the last connection to a process ends.
//!
//! The priority barrier frame (producer → consumer, version 6) carries an unaligned
//! checkpoint barrier the producer announced ahead of its data
//! ([`ChannelSender::announce_barrier`](weir_engine::exchange::ChannelSender::announce_barrier)):
//! the network thread sends it at its next turn for the connection, ahead of every buffer
//! not yet being written and without credit, and the consumer's
//! [`RemoteInputChannel`] reports it to its gate, which takes the checkpoint and reads the
//! channel ahead to the barrier in band.
//!
//! The aligned barrier frame (producer → consumer, version 7) announces, the same way, an
//! aligned barrier that may time out (Flink's `aligned-checkpoint-timeout`;
//! [`ChannelSender::announce_aligned_barrier`](weir_engine::exchange::ChannelSender::announce_aligned_barrier)):
//! the consumer's gate counts the barrier's timeout from it, and once it passes reads
//! the channel ahead to the barrier as for an unaligned one.
//!
//! The buffer-size frame (consumer → producer, version 2) carries the size the consuming
//! gate's debloater announced for a channel; the producer's subpartition starts its next
//! buffers at that size. It is sent when the size changes, from the network thread's turn.
//!
//! Each side sends its handshake first and expects the peer's as the first frame, then
//! answers the peer's nonce with an authentication frame ([`auth`]) and accepts nothing
//! else until the peer's answer verifies, within [`TransportConfig::handshake_timeout`].
//! A side that has sent nothing for [`TransportConfig::heartbeat_interval`] sends a
//! heartbeat; a connection on which nothing arrived for
//! [`TransportConfig::idle_timeout`] fails with [`TransportError::PeerSilent`]. Records, watermarks and the in-band
//! end-of-partition tag travel inside buffer payloads exactly as on a local channel; the
//! end-of-partition *frame* says that the subpartition's channel is closed (its producer
//! is gone and everything was sent).
//!
//! # Credits (Flink's rules)
//!
//! - Each remote channel owns `exclusive_buffers` (default 2) of its gate's receive pool;
//!   the gate owns `floating_buffers` more (default 8), lent to channels by the backlog
//!   their producers announce.
//! - A credit is a segment the receiver holds for the channel: the partition request
//!   carries the exclusive ones, add-credit frames the rest. The producer sends a buffer
//!   only against a credit and reports its backlog (buffers queued behind it).
//! - The receiver grants credit once per turn per channel, when the channel holds (in
//!   buffers its gate has not recycled plus credit outstanding) fewer than its exclusive
//!   buffers plus its backlog; floating buffers go round robin to channels that want
//!   them. Credit is announced when it grows from what was announced, so a busy channel
//!   costs one add-credit frame per turn, not per buffer.
//! - Every segment counted in credit or held by a gate is the receiver's, so a buffer
//!   that arrives against a credit always finds a segment: the connection is always read,
//!   and a slow consumer stops only its own channel (its credit runs out) while the
//!   others on the connection keep flowing.
//!
//! # Faults
//!
//! - A connection that closes or resets with open channels fails each of them with
//!   [`TransportError::ChannelFailed`] naming the channel and the peer; the gate returns
//!   it as [`ExchangeError::ChannelFailed`](weir_engine::ExchangeError::ChannelFailed)
//!   after the buffers that arrived. Producers whose consumers went away see their
//!   channel disconnected (`ExchangeError::ConsumerGone`). Other connections go on.
//! - A frame that does not decode (unknown type or version, bad magic, a payload above
//!   its type's limit, checked before anything is read into memory), or one that breaks
//!   the rules (a buffer without credit or out of sequence, a frame before the
//!   handshake), fails its connection the same way; the peer gets an error frame first.
//! - A peer that does not complete the handshake in time fails the connection with
//!   [`TransportError::HandshakeTimeout`].
//! - A partition request for a channel the producer does not serve within
//!   [`TransportConfig::request_timeout`] (60 s) gets an error frame naming the channel,
//!   which fails that channel at its consumer (Flink's "partition not found").
//! - Dropping a [`RemoteInputChannel`] cancels it at the producer; dropping the
//!   [`Transport`] stops its thread and fails what is still open.

pub mod auth;
mod channel;
mod conn;
mod error;
pub mod frame;
mod handshake;
mod incoming;
mod network;
mod recv;
mod uring;
mod waiting;

use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use weir_engine::checkpoint::LinkEvent;
use weir_engine::exchange::{InputChannel, LocalBufferPool, LocalPoolConfig, NetworkBufferPool};
use weir_engine::park::{Notify, UnboundParker, Unparker};

pub use auth::{JobId, Secret};
pub use channel::RemoteInputChannel;
pub use error::{FrameError, TransportError};
pub use frame::{Frame, FrameKind, Header, HEADER_SIZE};

use crate::driver::DriverKind;
use network::{Command, Control};
use recv::{Gate, RecvChannel};

/// Settings of a [`Transport`].
#[derive(Debug, Clone)]
pub struct TransportConfig {
    /// This process's id, unique among the processes of a job (the handshake carries it).
    pub process: u32,
    /// Where to listen for peers (port 0: any free port).
    pub listen: SocketAddr,
    /// How long a new connection may take to complete the handshake.
    pub handshake_timeout: Duration,
    /// Segments each remote channel owns (Flink's default: 2).
    pub exclusive_buffers: usize,
    /// Segments each [`consume`](Transport::consume) call's gate lends by backlog
    /// (Flink's default: 8).
    pub floating_buffers: usize,
    /// The network thread's I/O: io_uring (`Auto` falls back to epoll where the kernel
    /// refuses it, and says so on stderr) or epoll.
    pub driver: DriverKind,
    /// How long a partition request for a channel this process does not serve (yet)
    /// waits for it before the consumer gets an error (Flink's "partition not found"):
    /// processes of one job serve their channels as they start, so a request that waits
    /// longer names a channel no process will serve (different job settings, say).
    pub request_timeout: Duration,
    /// How long the network thread keeps polling with nothing to do before it parks
    /// (0: it parks at once). Latency for idle CPU, as a worker's spin.
    pub spin: Duration,
    /// The cluster secret every process of the job holds (`None`: no proof of
    /// membership, see [`auth`]). A peer that cannot prove it holds the same one is
    /// refused in the handshake.
    pub secret: Option<Secret>,
    /// The job this process runs; a peer running another is refused in the handshake
    /// (the default, all zeros, matches only peers that set none either).
    pub job: JobId,
    /// How many processes the job has, when known: a peer whose process id is not
    /// below it (or is this process's own) is refused in the handshake.
    pub processes: Option<u32>,
    /// A connection on which this side sent nothing for this long sends a heartbeat.
    pub heartbeat_interval: Duration,
    /// A connection on which nothing arrived for this long (no frame, no heartbeat)
    /// fails, and so do its channels, naming the peer: a peer that hangs or a network
    /// that drops its packets is detected, not waited for. Also the sockets' TCP user
    /// timeout (data unacknowledged this long fails the connection in the kernel).
    pub idle_timeout: Duration,
}

impl TransportConfig {
    /// Process `process` listening on a free loopback port, with Flink's defaults.
    pub fn new(process: u32) -> Self {
        TransportConfig {
            process,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            handshake_timeout: Duration::from_secs(10),
            exclusive_buffers: 2,
            floating_buffers: 8,
            driver: DriverKind::Auto,
            request_timeout: Duration::from_secs(60),
            spin: Duration::ZERO,
            secret: None,
            job: JobId::default(),
            processes: None,
            heartbeat_interval: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(10),
        }
    }
}

/// A peer process: its id and the address its transport listens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Its process id.
    pub process: u32,
    /// Its transport's listening address.
    pub addr: SocketAddr,
}

/// One process's end of the transport: its listener and its network thread. See the
/// module docs.
pub struct Transport {
    config: TransportConfig,
    driver: &'static str,
    addr: SocketAddr,
    control: Arc<Control>,
    unparker: Unparker,
    thread: Option<JoinHandle<()>>,
}

impl Transport {
    /// Binds `config.listen` and starts the network thread.
    pub fn start(config: TransportConfig) -> Result<Self, TransportError> {
        if config.exclusive_buffers == 0 {
            return Err(TransportError::Config(
                "exclusive_buffers must be at least 1: a channel without buffers of its own \
                 can stall"
                    .into(),
            ));
        }
        if config.handshake_timeout.is_zero() {
            return Err(TransportError::Config(
                "handshake_timeout must be positive".into(),
            ));
        }
        if config.heartbeat_interval.is_zero() || config.heartbeat_interval >= config.idle_timeout {
            return Err(TransportError::Config(format!(
                "heartbeat_interval ({:?}) must be positive and below idle_timeout ({:?}), or \
                 a quiet but healthy peer would be taken for a silent one",
                config.heartbeat_interval, config.idle_timeout
            )));
        }
        if config.processes.is_some_and(|n| config.process >= n) {
            return Err(TransportError::Config(format!(
                "process {} of a job of {} processes: the id must be below the count",
                config.process,
                config.processes.unwrap_or_default()
            )));
        }
        let io = |what, source| TransportError::Io {
            what,
            peer: config.listen.to_string(),
            source,
        };
        let listener = bind_listener(config.listen).map_err(|e| io("binding", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| io("setting the listener non-blocking", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| io("reading the listening address", e))?;
        let wake = Arc::new(crate::driver::Wake::new().map_err(|e| TransportError::Io {
            what: "creating the network thread's eventfd",
            peer: addr.to_string(),
            source: std::io::Error::other(e.to_string()),
        })?);
        let parker = UnboundParker::new(Arc::clone(&wake));
        let unparker = parker.unparker();
        let control = Arc::new(Control::default());
        let mut net = network::Net::new(config.clone(), listener, wake, Arc::clone(&control))
            .map_err(|e| io("setting up the network thread's I/O", e))?;
        let driver = net.driver_name();
        let thread = std::thread::Builder::new()
            .name(format!("weir-net-{}", config.process))
            .spawn(move || net.run(parker.into_parker()))
            .map_err(|e| io("spawning the network thread", e))?;
        Ok(Transport {
            config,
            driver,
            addr,
            control,
            unparker,
            thread: Some(thread),
        })
    }

    /// The network thread's I/O: `"uring"` or `"epoll"`.
    pub fn driver_name(&self) -> &'static str {
        self.driver
    }

    /// The address peers connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// This process as a peer of others.
    pub fn peer(&self) -> Peer {
        Peer {
            process: self.config.process,
            addr: self.addr,
        }
    }

    /// What a served subpartition's local channel should notify when it gets a buffer
    /// (`local_channel(capacity, Some(transport.notify()))`): the network thread.
    pub fn notify(&self) -> Arc<dyn Notify> {
        Arc::new(self.unparker.clone())
    }

    /// Serves `input` (the consumer end of a subpartition's local channel) as channel
    /// `channel` to whichever peer requests it. Its buffers are read with
    /// `poll_buffer` only and sent against the consumer's credit; when it disconnects and
    /// is drained, the consumer gets the end of the partition.
    pub fn serve(&self, channel: u32, input: impl InputChannel + 'static) {
        self.command(Command::Serve {
            channel,
            input: Box::new(input),
            consumer: None,
        });
    }

    /// As [`serve`](Self::serve), for process `consumer` alone: a request for the
    /// channel from any other process (even a member of the job) gets an error frame
    /// instead of its records, and the channel waits for its consumer.
    pub fn serve_to(&self, channel: u32, consumer: u32, input: impl InputChannel + 'static) {
        self.command(Command::Serve {
            channel,
            input: Box::new(input),
            consumer: Some(consumer),
        });
    }

    /// Requests `channels` from `peer`, with a receive pool drawn from `network`
    /// (`exclusive_buffers` per channel plus `floating_buffers`). `notify` wakes the
    /// consuming task when a buffer arrives. The channels come back at once; their
    /// buffers flow once the connection is up, and a connection that fails, fails them.
    pub fn consume(
        &self,
        peer: Peer,
        channels: &[u32],
        network: &NetworkBufferPool,
        notify: Option<Arc<dyn Notify>>,
    ) -> Result<Vec<RemoteInputChannel>, TransportError> {
        if channels.is_empty() {
            return Err(TransportError::Config(
                "consume needs at least one channel".into(),
            ));
        }
        let size = channels.len() * self.config.exclusive_buffers + self.config.floating_buffers;
        // At most one buffer per channel before the pool reports unavailable: so that
        // every recycled buffer, while any is out, wakes the network thread to grant credit.
        let pool_config = LocalPoolConfig::new(size, channels.len())
            .with_max_per_subpartition(1)
            .with_overdraft(0);
        let pool = LocalBufferPool::with_notify(network, pool_config, self.unparker.clone())
            .map_err(|e| TransportError::Config(format!("the receive pool: {e}")))?;
        let peer_name = network::peer_name(peer.process, peer.addr);
        let mut receivers = Vec::with_capacity(channels.len());
        let mut remotes = Vec::with_capacity(channels.len());
        for &channel in channels {
            let (producer, consumer) = weir_engine::ring::channel(size);
            let failure: channel::FailureSlot = Arc::default();
            let buffer_size: channel::BufferSizeSlot = Arc::default();
            let receiver = RecvChannel::new(
                channel,
                producer,
                notify.clone(),
                Arc::clone(&failure),
                Arc::clone(&buffer_size),
            );
            let words = channel::ChannelWords {
                barrier: Arc::clone(&receiver.barrier),
                aligned: Arc::clone(&receiver.aligned),
                received: Arc::clone(&receiver.received),
            };
            receivers.push(receiver);
            remotes.push(RemoteInputChannel::new(
                channel,
                peer_name.clone(),
                consumer,
                failure,
                buffer_size,
                words,
            ));
        }
        self.command(Command::Consume(Gate::new(
            peer,
            pool,
            receivers,
            self.config.exclusive_buffers as u32,
            self.config.floating_buffers as u32,
        )));
        Ok(remotes)
    }

    /// Dials `peer` unless this process has a connection to it already (dialed or
    /// accepted), without waiting; a failed dial is dropped (ask again).
    /// [`is_connected`](Self::is_connected) says when the handshake completed. Processes
    /// that dial each other before they consume keep one connection per pair: consuming
    /// reuses it.
    pub fn connect(&self, peer: Peer) {
        self.command(Command::Connect(peer));
    }

    /// Sends a checkpoint service's message to process `process` (see the [module
    /// docs](self)), after everything queued to it before; held until a connection to
    /// it completes its handshake. At most [`frame::CHECKPOINT_MESSAGE_MAX`] bytes: a
    /// longer or empty message is dropped with a note on stderr (the service's messages
    /// are far shorter).
    pub fn send_checkpoint(&self, process: u32, bytes: Vec<u8>) {
        if bytes.is_empty() || bytes.len() > frame::CHECKPOINT_MESSAGE_MAX {
            eprintln!(
                "weir transport: a checkpoint message of {} bytes to process {process} \
                 dropped (1..={} allowed)",
                bytes.len(),
                frame::CHECKPOINT_MESSAGE_MAX
            );
            return;
        }
        self.command(Command::Checkpoint { process, bytes });
    }

    /// From now on hands every checkpoint message from another process, and every
    /// process whose last connection ended, to `inbox` (on the network thread: it must
    /// not block); what came before first.
    pub fn open_checkpoints(&self, inbox: Box<dyn Fn(LinkEvent) + Send + Sync>) {
        self.control
            .checkpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .open(inbox);
    }

    /// Connections whose handshake completed since the transport started, dialed or
    /// accepted.
    pub fn connections_opened(&self) -> usize {
        self.control
            .opened
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Why each connection that ended with channels still open ended (a peer killed, a
    /// reset, a malformed frame), oldest first: what a producer whose consumer went away
    /// with the connection can report.
    pub fn lost_connections(&self) -> Vec<String> {
        self.control
            .lost
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Why the handshake with process `process`, dialed by [`connect`](Self::connect),
    /// last failed by a refusal (either side's), if it did: a member of another job,
    /// one without the cluster secret, a wrong process id.
    pub fn refusal(&self, process: u32) -> Option<String> {
        self.control
            .refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .rev()
            .find(|(p, _)| *p == process)
            .map(|(_, why)| why.clone())
    }

    /// Whether a connection to process `process` has completed its handshake.
    pub fn is_connected(&self, process: u32) -> bool {
        self.control
            .connected
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&process)
    }

    /// Waits until every channel served so far was requested by its consumer, sent to
    /// its end, and its end-of-partition frame written: what a producer process does
    /// before it exits, so that its consumers get everything. Fails after `timeout`
    /// (a consumer that never asked, or a peer that stopped reading).
    pub fn drain(&self, timeout: Duration) -> Result<(), TransportError> {
        use std::sync::atomic::Ordering;
        let deadline = std::time::Instant::now() + timeout;
        // Two full turns after this call: the second began after every earlier command
        // (a serve) was queued, so its verdict covers them.
        let start = self.control.turns.load(Ordering::Acquire);
        loop {
            let turns = self.control.turns.load(Ordering::Acquire);
            if turns >= start + 2 && self.control.drained.load(Ordering::Acquire) {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err(TransportError::DrainTimeout { timeout });
            }
            self.unparker.unpark();
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn command(&self, command: Command) {
        self.control
            .commands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(command);
        self.unparker.unpark();
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        self.control
            .stop
            .store(true, std::sync::atomic::Ordering::Release);
        self.unparker.unpark();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl core::fmt::Debug for Transport {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Transport")
            .field("process", &self.config.process)
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// Shared with the network thread: commands from API calls (control plane, rare).
type Commands = Mutex<Vec<Command>>;

/// How long [`bind_listener`] retries an address in use.
const BIND_RETRY: Duration = Duration::from_secs(5);

/// Binds the transport's listener, retrying for up to [`BIND_RETRY`] while the address
/// is in use: a process restarted on its port (after a crash, or by a supervisor) may
/// find the listener of the instance before it not yet released, since a socket that
/// io_uring still holds outlives its process until the kernel has torn its ring down.
/// Another process that really holds the port still fails the bind, after the retries.
fn bind_listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let deadline = std::time::Instant::now() + BIND_RETRY;
    let mut pause = Duration::from_millis(5);
    loop {
        match TcpListener::bind(addr) {
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && addr.port() != 0
                    && std::time::Instant::now() + pause < deadline =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            result => return result,
        }
    }
}

#[cfg(test)]
mod bind_tests {
    use super::*;

    /// A port still held when the bind starts is taken once its holder lets it go.
    #[test]
    fn a_port_in_use_is_bound_once_released() {
        let held = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = held.local_addr().expect("addr");
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(held);
        });
        let listener = bind_listener(addr).expect("bound after the release");
        assert_eq!(listener.local_addr().expect("addr"), addr);
        release.join().expect("released");
    }
}
