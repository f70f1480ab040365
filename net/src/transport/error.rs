//! Errors of the transport: a frame that does not decode, and what a connection's
//! failure means for each channel on it.

use std::sync::Arc;
use std::time::Duration;

/// Why bytes are not a frame of the protocol. The connection that carried them fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// A type byte outside the protocol.
    #[error(
        "frame type {0} is unknown: the peer speaks another protocol, or the stream is corrupt"
    )]
    UnknownType(u8),
    /// A handshake without the protocol's magic number.
    #[error(
        "handshake magic {found:#010x} is not Weir's ({expected:#010x}): the peer is not a Weir \
         transport; check the address"
    )]
    BadMagic {
        /// What arrived.
        found: u32,
        /// What was expected.
        expected: u32,
    },
    /// A handshake of another protocol version.
    #[error(
        "the peer speaks transport protocol version {theirs}, this process version {ours}; run \
         the same Weir version on both sides"
    )]
    UnsupportedVersion {
        /// The peer's version.
        theirs: u32,
        /// Ours.
        ours: u32,
    },
    /// A payload longer than that frame type allows (checked before any allocation).
    #[error(
        "{kind} frame of {len} payload bytes exceeds the maximum of {max}; for buffers, give \
         the receiving side segments at least as large as the sending side's"
    )]
    Oversized {
        /// The frame type.
        kind: &'static str,
        /// The announced payload length.
        len: usize,
        /// The largest accepted.
        max: usize,
    },
    /// A frame whose fields contradict the protocol.
    #[error("malformed {kind} frame: {reason}")]
    Malformed {
        /// The frame type.
        kind: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
}

/// Why the transport, a connection or a remote channel failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// A socket operation failed.
    #[error("{what} ({peer}) failed: {source}")]
    Io {
        /// What was attempted.
        what: &'static str,
        /// The address involved.
        peer: String,
        /// The kernel's error.
        #[source]
        source: std::io::Error,
    },
    /// The peer sent bytes that are not a frame.
    #[error("malformed frame from {peer}: {source}; the connection was closed")]
    Frame {
        /// The peer.
        peer: String,
        /// What was wrong.
        #[source]
        source: FrameError,
    },
    /// The peer sent valid frames that break the protocol's rules.
    #[error("protocol violation by {peer}: {reason}; the connection was closed")]
    Protocol {
        /// The peer.
        peer: String,
        /// What it did.
        reason: String,
    },
    /// The peer did not complete the handshake in time.
    #[error(
        "no handshake from {peer} within {timeout:?}: is a Weir transport listening there, and \
         is it alive? (raise TransportConfig::handshake_timeout for slow starts)"
    )]
    HandshakeTimeout {
        /// The peer.
        peer: String,
        /// The configured timeout.
        timeout: Duration,
    },
    /// The peer was refused in the handshake: it is not a member of this job.
    #[error("refused {peer}: {reason}")]
    Refused {
        /// The peer.
        peer: String,
        /// Why, and what to fix.
        reason: String,
    },
    /// Nothing arrived from the peer for the idle timeout, not even a heartbeat.
    #[error(
        "nothing from {peer} for {idle:?}, not even a heartbeat: the peer hangs, or the network \
         drops its packets (TransportConfig::idle_timeout)"
    )]
    PeerSilent {
        /// The peer.
        peer: String,
        /// The idle timeout that passed.
        idle: Duration,
    },
    /// The connection ended (closed or reset) with channels still open on it.
    #[error("connection to {peer} lost: {reason}")]
    ConnectionLost {
        /// The peer.
        peer: String,
        /// Closed by the peer, or the kernel's error.
        reason: String,
    },
    /// The peer reported an error for a channel or the connection.
    #[error("{peer} reported: {message}")]
    Remote {
        /// The peer.
        peer: String,
        /// Its message.
        message: String,
    },
    /// A channel broke because of `cause`.
    #[error("remote channel {channel} from {peer} failed: {cause}")]
    ChannelFailed {
        /// The channel id.
        channel: u32,
        /// The peer that produced it.
        peer: String,
        /// Why (shared by every channel of a failed connection).
        #[source]
        cause: Arc<TransportError>,
    },
    /// Served channels were still open when [`Transport::drain`](super::Transport::drain)
    /// gave up.
    #[error(
        "served channels still open after {timeout:?}: a consumer never requested its \
         channel, or stopped reading (is every process of the job running?)"
    )]
    DrainTimeout {
        /// How long it waited.
        timeout: Duration,
    },
    /// An invalid setting.
    #[error("invalid transport setting: {0}")]
    Config(String),
    /// The transport was shut down.
    #[error("the transport was shut down")]
    Stopped,
}
