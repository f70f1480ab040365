//! One connection to a peer process: its socket, the frames queued and being written,
//! the frame being read, the channels it carries both ways, and its handshake state.
//! The network thread owns every connection; nothing here is shared with other threads.

use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use weir_engine::exchange::{Buffer, InputChannel, SharedBuffer};

use super::auth::{self, JobId, HELLO_SIZE, NONCE_SIZE};
use super::error::TransportError;
use super::frame::{FrameKind, Header, ERROR_MESSAGE_MAX, HEADER_SIZE};
use super::network::peer_name;
use super::recv::ChannelAt;
use super::uring::UringOps;

/// Frames (header and payload slices) per vectored write.
pub(super) const FRAMES_PER_WRITE_MAX: usize = 512;

/// A served channel attached to the connection that requested it.
pub(super) struct SendChannel {
    pub(super) id: u32,
    pub(super) input: Box<dyn InputChannel>,
    pub(super) queue: VecDeque<SharedBuffer>,
    pub(super) credit: u32,
    pub(super) sequence: u32,
    /// The newest unaligned barrier sent ahead of the queue (a priority barrier frame).
    pub(super) announced: u64,
    /// The newest aligned barrier announcement sent ahead of the queue.
    pub(super) aligned_announced: u64,
}

pub(super) enum Payload {
    None,
    /// A producer's buffer and the length its header announced: the frame sends
    /// exactly those bytes, whatever the buffer's view says later.
    Shared(SharedBuffer, usize),
    Bytes(Vec<u8>),
}

impl Payload {
    pub(super) fn as_slice(&self) -> &[u8] {
        match self {
            Payload::None => &[],
            Payload::Shared(buffer, len) => &buffer.as_slice()[..*len],
            Payload::Bytes(bytes) => bytes,
        }
    }
}

pub(super) struct Out {
    pub(super) header: [u8; HEADER_SIZE],
    pub(super) payload: Payload,
}

pub(super) enum Reading {
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

/// Bytes a connection reads at a time of a payload it drops (of a cancelled channel).
pub(super) const DISCARD_SIZE: usize = 4096;

pub(super) struct Conn {
    pub(super) stream: TcpStream,
    pub(super) addr: SocketAddr,
    /// The peer's process id, once it authenticated (handshake, then its answer to our
    /// nonce): until then no other frame is accepted.
    pub(super) process: Option<u32>,
    /// The process id the peer's handshake claimed, before it proved it.
    pub(super) claimed: Option<u32>,
    /// The nonce our handshake sent.
    pub(super) nonce: [u8; NONCE_SIZE],
    /// The nonce the peer's handshake sent.
    pub(super) peer_nonce: [u8; NONCE_SIZE],
    /// Whether this side sent its authentication frame: frames queued before wait in
    /// `held`.
    pub(super) proved: bool,
    /// When bytes last arrived (the idle timeout runs from here).
    pub(super) last_read: Instant,
    /// When a frame was last queued (a heartbeat goes out when this grows old).
    pub(super) last_queued: Instant,
    /// The process this side connected to, which the handshake must name.
    pub(super) expected: Option<u32>,
    pub(super) connecting: bool,
    pub(super) handshake_deadline: Option<Instant>,
    /// Frames being written: not touched while an io_uring write of them is in flight.
    pub(super) out: VecDeque<Out>,
    /// Bytes of the front frame already written.
    pub(super) out_offset: usize,
    /// Frames queued since the last write started.
    pub(super) staged: VecDeque<Out>,
    /// Frames queued before this side proved itself (partition requests of a fresh
    /// connection): they follow the authentication frame, which the peer wants first.
    pub(super) held: VecDeque<Out>,
    /// Boxed: the kernel writes into it during an io_uring read, while the
    /// connection itself may move.
    pub(super) header: Box<[u8; HEADER_SIZE]>,
    pub(super) header_len: usize,
    pub(super) discard: Box<[u8]>,
    /// The io_uring operations' state (unused on epoll).
    pub(super) ops: UringOps,
    /// Failed and shut down; kept only until its io_uring operations complete.
    pub(super) dead: bool,
    pub(super) reading: Reading,
    /// Requests of the peer's refused with an error frame (see `refuse_channel`).
    pub(super) refusals: u32,
    /// Channels consumed over this connection, by id. An entry outlives its gate (late
    /// frames of the channel are then dropped) until the id is consumed again.
    pub(super) incoming: HashMap<u32, ChannelAt>,
    pub(super) outgoing: Vec<SendChannel>,
}

impl Conn {
    /// A connection whose first frame, queued here, is this process's handshake.
    pub(super) fn new(
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
            peer_nonce: [0; NONCE_SIZE],
            proved: false,
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

    pub(super) fn name(&self) -> String {
        match self.process {
            Some(process) => peer_name(process, self.addr),
            None => format!("peer at {}", self.addr),
        }
    }

    pub(super) fn queue(&mut self, header: Header, payload: Option<Payload>) {
        let out = Out {
            header: header.encode(),
            payload: payload.unwrap_or(Payload::None),
        };
        let early = matches!(
            header.kind,
            FrameKind::Handshake | FrameKind::Auth | FrameKind::Error
        );
        if !self.proved && !early {
            self.held.push_back(out);
        } else {
            self.staged.push_back(out);
        }
    }

    /// Queues a frame ahead of every frame not being written yet (a priority barrier
    /// overtakes the staged buffers).
    pub(super) fn queue_first(&mut self, header: Header) {
        let out = Out {
            header: header.encode(),
            payload: Payload::None,
        };
        if self.proved {
            self.staged.push_front(out);
        } else {
            self.held.push_front(out);
        }
    }

    /// Writes queued frames until the socket would block; `Ok(true)` if it wrote any.
    pub(super) fn flush(&mut self) -> io::Result<bool> {
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
    pub(super) fn written(&mut self, written: usize) {
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
pub(super) enum Ending {
    /// Closed by the peer.
    Closed,
    /// Failed: every open channel on it fails with this.
    Failed(TransportError),
    /// Failed by what the peer sent: it gets an error frame first.
    Rejected(TransportError),
}

/// Error frames a connection's peer may cause by its requests over the connection's
/// life: a consumer that asks for channels twice a few times is misconfigured; one
/// that keeps asking (and may not read the answers) would grow the send queue.
pub(super) const REFUSALS_PER_CONNECTION_MAX: u32 = 1024;

/// Refuses a request of the peer's for `channel` with an error frame; past
/// [`REFUSALS_PER_CONNECTION_MAX`] refuses the connection instead.
pub(super) fn refuse_channel(conn: &mut Conn, channel: u32, message: &str) -> Result<(), Ending> {
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
pub(super) fn queue_error(conn: &mut Conn, channel: u32, message: &str) {
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
pub(super) fn set_user_timeout(stream: &TcpStream, timeout: Duration) {
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
pub(super) fn io_ending(conn: &Conn, error: io::Error) -> Ending {
    Ending::Failed(TransportError::ConnectionLost {
        peer: conn.name(),
        reason: error.to_string(),
    })
}

/// A failed io_uring read or write: retried if interrupted, else the connection ends.
pub(super) fn os_error(conn: &Conn, result: i32) -> Result<(), Ending> {
    if result == -libc::EINTR || result == -libc::EAGAIN {
        return Ok(());
    }
    Err(io_ending(conn, io::Error::from_raw_os_error(-result)))
}
