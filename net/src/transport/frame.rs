//! The transport's frames: a fixed 20-byte header, then a payload whose length the
//! header gives (only handshakes, authentications, buffers and errors carry one).
//!
//! The header is fixed-size so that a receiver can read a buffer's payload straight into
//! a pool segment and the next header into its header slot with one vectored read, with
//! no staging copy: it always knows how many bytes the next header takes.
//!
//! Decoding checks everything before anything is allocated or requested: the type, the
//! reserved bytes, the payload length against the limit for that type, the handshake's
//! magic and version. A header that fails any check is a [`FrameError`], never a panic.

use super::auth::{HELLO_SIZE, JOB_ID_SIZE, NONCE_SIZE, TAG_SIZE};
use super::error::FrameError;

/// Bytes of every frame header.
pub const HEADER_SIZE: usize = 20;
/// "WEIR" in ASCII, little-endian: the handshake's first field.
pub const MAGIC: u32 = u32::from_le_bytes(*b"WEIR");
/// The protocol version this build speaks (3: handshakes carry a nonce and the job's
/// id, authentication and heartbeat frames; 4: data buffers may carry checkpoint
/// barriers, an event a version 3 gate refuses as an unknown tag, so the handshake
/// refuses the mix instead; 5: checkpoint frames between the processes' checkpoint
/// services; 6: priority barrier frames, unaligned barriers ahead of queued buffers; 7:
/// aligned barrier announcements, whose alignment timeout counts from when they were
/// written).
pub const PROTOCOL_VERSION: u32 = 7;
/// Largest checkpoint message carried, in bytes.
pub const CHECKPOINT_MESSAGE_MAX: usize = 16 * 1024;
/// Largest error message carried, in bytes (longer ones are cut by the sender).
pub const ERROR_MESSAGE_MAX: usize = 4096;
/// The channel value of an error frame about the whole connection.
pub const CONNECTION_CHANNEL: u32 = u32::MAX;

/// A frame's type, the header's byte 4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// First frame each way: magic, version, process id; a nonce and the job's id.
    Handshake = 1,
    /// Consumer → producer: start sending a channel, with an initial credit.
    PartitionRequest = 2,
    /// Producer → consumer: one filled buffer of a channel.
    Buffer = 3,
    /// Consumer → producer: more credit for a channel.
    AddCredit = 4,
    /// Producer → consumer: the channel's subpartition is finished.
    EndOfPartition = 5,
    /// Consumer → producer: stop sending a channel.
    Cancel = 6,
    /// Either way: a channel (or the connection) failed, with a message.
    Error = 7,
    /// Consumer → producer: start buffers of at most this many bytes (0: no limit), as
    /// the consumer's gate debloats (version 2).
    BufferSize = 8,
    /// Second frame each way: the answer to the peer's nonce (see `auth`), version 3.
    Auth = 9,
    /// Either way, when a side has sent nothing for a while: it is alive (version 3).
    Heartbeat = 10,
    /// Either way: a message between the processes' checkpoint services (version 5).
    Checkpoint = 11,
    /// Producer → consumer: an unaligned checkpoint barrier announced ahead of the
    /// channel's queued buffers (Flink's priority event), its id in arg0 (low 32 bits)
    /// and arg1 (high); the barrier itself still follows in band (version 6).
    PriorityBarrier = 12,
    /// Producer → consumer: an aligned checkpoint barrier that may time out (Flink's
    /// `aligned-checkpoint-timeout`), announced ahead of the channel's queued buffers as
    /// it was written, its id as in a priority barrier: the consumer counts the timeout
    /// from it; the barrier itself follows in band (version 7).
    AlignedBarrier = 13,
}

impl FrameKind {
    fn from_u8(byte: u8) -> Result<Self, FrameError> {
        Ok(match byte {
            1 => FrameKind::Handshake,
            2 => FrameKind::PartitionRequest,
            3 => FrameKind::Buffer,
            4 => FrameKind::AddCredit,
            5 => FrameKind::EndOfPartition,
            6 => FrameKind::Cancel,
            7 => FrameKind::Error,
            8 => FrameKind::BufferSize,
            9 => FrameKind::Auth,
            10 => FrameKind::Heartbeat,
            11 => FrameKind::Checkpoint,
            12 => FrameKind::PriorityBarrier,
            13 => FrameKind::AlignedBarrier,
            other => return Err(FrameError::UnknownType(other)),
        })
    }

    /// The type's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            FrameKind::Handshake => "handshake",
            FrameKind::PartitionRequest => "partition request",
            FrameKind::Buffer => "buffer",
            FrameKind::AddCredit => "add-credit",
            FrameKind::EndOfPartition => "end-of-partition",
            FrameKind::Cancel => "cancel",
            FrameKind::Error => "error",
            FrameKind::BufferSize => "buffer-size",
            FrameKind::Auth => "authentication",
            FrameKind::Heartbeat => "heartbeat",
            FrameKind::Checkpoint => "checkpoint",
            FrameKind::PriorityBarrier => "priority barrier",
            FrameKind::AlignedBarrier => "aligned barrier announcement",
        }
    }
}

/// A decoded, checked header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The type.
    pub kind: FrameKind,
    /// Bytes of payload after the header.
    pub len: u32,
    /// The channel (the process id in a handshake).
    pub channel: u32,
    /// Sequence number (buffer), credit (request, add-credit), magic (handshake).
    pub arg0: u32,
    /// Backlog (buffer), version (handshake).
    pub arg1: u32,
}

impl Header {
    /// A priority barrier's header: checkpoint `id` on `channel`.
    pub fn priority_barrier(channel: u32, id: u64) -> Self {
        Header {
            kind: FrameKind::PriorityBarrier,
            len: 0,
            channel,
            arg0: id as u32,
            arg1: (id >> 32) as u32,
        }
    }

    /// An aligned barrier announcement's header: checkpoint `id` on `channel`.
    pub fn aligned_barrier(channel: u32, id: u64) -> Self {
        Header {
            kind: FrameKind::AlignedBarrier,
            ..Header::priority_barrier(channel, id)
        }
    }

    /// The checkpoint id a priority barrier's or an aligned barrier announcement's
    /// header carries.
    pub fn barrier_id(&self) -> u64 {
        u64::from(self.arg0) | (u64::from(self.arg1) << 32)
    }

    /// A header of `kind` without payload.
    pub fn control(kind: FrameKind, channel: u32, arg0: u32) -> Self {
        Header {
            kind,
            len: 0,
            channel,
            arg0,
            arg1: 0,
        }
    }

    /// The handshake header of process `process` (its payload, the nonce and the job's
    /// id, follows).
    pub fn handshake(process: u32) -> Self {
        Header {
            kind: FrameKind::Handshake,
            len: HELLO_SIZE as u32,
            channel: process,
            arg0: MAGIC,
            arg1: PROTOCOL_VERSION,
        }
    }

    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut bytes = [0; HEADER_SIZE];
        bytes[0..4].copy_from_slice(&self.len.to_le_bytes());
        bytes[4] = self.kind as u8;
        bytes[8..12].copy_from_slice(&self.channel.to_le_bytes());
        bytes[12..16].copy_from_slice(&self.arg0.to_le_bytes());
        bytes[16..20].copy_from_slice(&self.arg1.to_le_bytes());
        bytes
    }

    /// Decodes and checks a header; `buffer_max` is the largest buffer payload the
    /// receiver accepts (its segment size).
    pub fn decode(bytes: &[u8; HEADER_SIZE], buffer_max: usize) -> Result<Self, FrameError> {
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let kind = FrameKind::from_u8(bytes[4])?;
        if bytes[5..8] != [0, 0, 0] {
            return Err(FrameError::Malformed {
                kind: kind.name(),
                reason: "reserved header bytes 5..8 are not zero",
            });
        }
        let header = Header {
            kind,
            len: word(0),
            channel: word(8),
            arg0: word(12),
            arg1: word(16),
        };
        let len = header.len as usize;
        match kind {
            FrameKind::Buffer => {
                if len == 0 {
                    return Err(FrameError::Malformed {
                        kind: kind.name(),
                        reason: "a buffer frame must carry at least one byte",
                    });
                }
                if len > buffer_max {
                    return Err(FrameError::Oversized {
                        kind: kind.name(),
                        len,
                        max: buffer_max,
                    });
                }
            }
            FrameKind::Error if len > ERROR_MESSAGE_MAX => {
                return Err(FrameError::Oversized {
                    kind: kind.name(),
                    len,
                    max: ERROR_MESSAGE_MAX,
                });
            }
            FrameKind::Error => {}
            FrameKind::Checkpoint if len == 0 => {
                return Err(FrameError::Malformed {
                    kind: kind.name(),
                    reason: "a checkpoint frame must carry a message",
                });
            }
            FrameKind::Checkpoint if len > CHECKPOINT_MESSAGE_MAX => {
                return Err(FrameError::Oversized {
                    kind: kind.name(),
                    len,
                    max: CHECKPOINT_MESSAGE_MAX,
                });
            }
            FrameKind::Checkpoint => {}
            FrameKind::Handshake | FrameKind::Auth => {
                let size = if kind == FrameKind::Handshake {
                    HELLO_SIZE
                } else {
                    TAG_SIZE
                };
                if len != size {
                    return Err(FrameError::Malformed {
                        kind: kind.name(),
                        reason: if len > size {
                            "a payload longer than the type's fixed size"
                        } else {
                            "a payload shorter than the type's fixed size"
                        },
                    });
                }
            }
            _ if len != 0 => {
                return Err(FrameError::Oversized {
                    kind: kind.name(),
                    len,
                    max: 0,
                })
            }
            _ => {}
        }
        // Fields a type does not use must be zero: they may carry meaning in a later
        // version, and a frame must re-encode to the bytes it came from.
        let (arg0_used, arg1_used) = match kind {
            FrameKind::Handshake
            | FrameKind::Buffer
            | FrameKind::PriorityBarrier
            | FrameKind::AlignedBarrier => (true, true),
            FrameKind::PartitionRequest | FrameKind::AddCredit | FrameKind::BufferSize => {
                (true, false)
            }
            FrameKind::EndOfPartition
            | FrameKind::Cancel
            | FrameKind::Error
            | FrameKind::Auth
            | FrameKind::Heartbeat
            | FrameKind::Checkpoint => (false, false),
        };
        if matches!(
            kind,
            FrameKind::Auth | FrameKind::Heartbeat | FrameKind::Checkpoint
        ) && header.channel != 0
        {
            return Err(FrameError::Malformed {
                kind: kind.name(),
                reason: "the channel field of a connection-wide frame is not zero",
            });
        }
        if (!arg0_used && header.arg0 != 0) || (!arg1_used && header.arg1 != 0) {
            return Err(FrameError::Malformed {
                kind: kind.name(),
                reason: "a field this frame type does not use (bytes 12..20) is not zero",
            });
        }
        match kind {
            FrameKind::Handshake => {
                if header.arg0 != MAGIC {
                    return Err(FrameError::BadMagic {
                        found: header.arg0,
                        expected: MAGIC,
                    });
                }
                if header.arg1 != PROTOCOL_VERSION {
                    return Err(FrameError::UnsupportedVersion {
                        theirs: header.arg1,
                        ours: PROTOCOL_VERSION,
                    });
                }
            }
            FrameKind::PriorityBarrier | FrameKind::AlignedBarrier
                if header.arg0 == 0 && header.arg1 == 0 =>
            {
                return Err(FrameError::Malformed {
                    kind: kind.name(),
                    reason: "a barrier frame must name a checkpoint (ids start at 1)",
                });
            }
            FrameKind::AddCredit if header.arg0 == 0 => {
                return Err(FrameError::Malformed {
                    kind: kind.name(),
                    reason: "an add-credit frame must add at least one credit",
                });
            }
            _ => {}
        }
        Ok(header)
    }
}

/// A whole frame, borrowed from the bytes it was decoded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame<'a> {
    /// See [`FrameKind::Handshake`].
    Handshake {
        /// The sender's process id.
        process: u32,
        /// A fresh random number the peer's authentication must answer.
        nonce: [u8; NONCE_SIZE],
        /// The job the sender runs (`auth::JobId`).
        job: [u8; JOB_ID_SIZE],
    },
    /// See [`FrameKind::Auth`].
    Auth {
        /// The sender's answer to the peer's nonce (`auth::tag`).
        tag: [u8; TAG_SIZE],
    },
    /// See [`FrameKind::Heartbeat`].
    Heartbeat,
    /// See [`FrameKind::PartitionRequest`].
    PartitionRequest {
        /// The channel.
        channel: u32,
        /// Buffers the consumer has for it now.
        credit: u32,
    },
    /// See [`FrameKind::Buffer`].
    Buffer {
        /// The channel.
        channel: u32,
        /// Buffers sent on the channel before this one (wrapping).
        sequence: u32,
        /// Buffers queued behind this one at the sender.
        backlog: u32,
        /// The buffer's bytes.
        payload: &'a [u8],
    },
    /// See [`FrameKind::AddCredit`].
    AddCredit {
        /// The channel.
        channel: u32,
        /// Credits added (at least 1).
        delta: u32,
    },
    /// See [`FrameKind::EndOfPartition`].
    EndOfPartition {
        /// The channel.
        channel: u32,
    },
    /// See [`FrameKind::Cancel`].
    Cancel {
        /// The channel.
        channel: u32,
    },
    /// See [`FrameKind::Error`].
    Error {
        /// The channel, or [`CONNECTION_CHANNEL`] for the whole connection.
        channel: u32,
        /// The message (UTF-8 by convention; read lossily).
        message: &'a [u8],
    },
    /// See [`FrameKind::BufferSize`].
    BufferSize {
        /// The channel.
        channel: u32,
        /// Bytes per buffer the producer should start (0: no limit).
        size: u32,
    },
    /// See [`FrameKind::Checkpoint`].
    Checkpoint {
        /// The checkpoint service's message.
        message: &'a [u8],
    },
    /// See [`FrameKind::PriorityBarrier`].
    PriorityBarrier {
        /// The channel.
        channel: u32,
        /// The checkpoint (at least 1).
        id: u64,
    },
    /// See [`FrameKind::AlignedBarrier`].
    AlignedBarrier {
        /// The channel.
        channel: u32,
        /// The checkpoint (at least 1).
        id: u64,
    },
}

impl<'a> Frame<'a> {
    /// The frame's header.
    pub fn header(&self) -> Header {
        match *self {
            Frame::Handshake { process, .. } => Header::handshake(process),
            Frame::Auth { .. } => Header {
                kind: FrameKind::Auth,
                len: TAG_SIZE as u32,
                channel: 0,
                arg0: 0,
                arg1: 0,
            },
            Frame::Heartbeat => Header::control(FrameKind::Heartbeat, 0, 0),
            Frame::PartitionRequest { channel, credit } => {
                Header::control(FrameKind::PartitionRequest, channel, credit)
            }
            Frame::Buffer {
                channel,
                sequence,
                backlog,
                payload,
            } => Header {
                kind: FrameKind::Buffer,
                len: payload.len() as u32,
                channel,
                arg0: sequence,
                arg1: backlog,
            },
            Frame::AddCredit { channel, delta } => {
                Header::control(FrameKind::AddCredit, channel, delta)
            }
            Frame::EndOfPartition { channel } => {
                Header::control(FrameKind::EndOfPartition, channel, 0)
            }
            Frame::Cancel { channel } => Header::control(FrameKind::Cancel, channel, 0),
            Frame::BufferSize { channel, size } => {
                Header::control(FrameKind::BufferSize, channel, size)
            }
            Frame::Checkpoint { message } => Header {
                kind: FrameKind::Checkpoint,
                len: message.len() as u32,
                channel: 0,
                arg0: 0,
                arg1: 0,
            },
            Frame::PriorityBarrier { channel, id } => Header::priority_barrier(channel, id),
            Frame::AlignedBarrier { channel, id } => Header::aligned_barrier(channel, id),
            Frame::Error { channel, message } => Header {
                kind: FrameKind::Error,
                len: message.len() as u32,
                channel,
                arg0: 0,
                arg1: 0,
            },
        }
    }

    /// Appends the frame's bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.header().encode());
        match self {
            Frame::Handshake { nonce, job, .. } => {
                out.extend_from_slice(nonce);
                out.extend_from_slice(job);
            }
            Frame::Auth { tag } => out.extend_from_slice(tag),
            Frame::Buffer { payload, .. } => out.extend_from_slice(payload),
            Frame::Error { message, .. } => out.extend_from_slice(message),
            Frame::Checkpoint { message } => out.extend_from_slice(message),
            _ => {}
        }
    }

    /// Decodes the frame at the start of `bytes`: `Ok(None)` if more bytes are needed,
    /// or the frame and the bytes it took. `buffer_max` bounds a buffer's payload.
    pub fn decode(bytes: &'a [u8], buffer_max: usize) -> Result<Option<(Self, usize)>, FrameError> {
        let Some(head) = bytes.get(..HEADER_SIZE) else {
            return Ok(None);
        };
        let header = Header::decode(head.try_into().expect("HEADER_SIZE bytes"), buffer_max)?;
        let total = HEADER_SIZE + header.len as usize;
        let Some(payload) = bytes.get(HEADER_SIZE..total) else {
            return Ok(None);
        };
        let frame = match header.kind {
            FrameKind::Handshake => Frame::Handshake {
                process: header.channel,
                nonce: payload[..NONCE_SIZE].try_into().expect("checked size"),
                job: payload[NONCE_SIZE..].try_into().expect("checked size"),
            },
            FrameKind::Auth => Frame::Auth {
                tag: payload.try_into().expect("checked size"),
            },
            FrameKind::Heartbeat => Frame::Heartbeat,
            FrameKind::PartitionRequest => Frame::PartitionRequest {
                channel: header.channel,
                credit: header.arg0,
            },
            FrameKind::Buffer => Frame::Buffer {
                channel: header.channel,
                sequence: header.arg0,
                backlog: header.arg1,
                payload,
            },
            FrameKind::AddCredit => Frame::AddCredit {
                channel: header.channel,
                delta: header.arg0,
            },
            FrameKind::EndOfPartition => Frame::EndOfPartition {
                channel: header.channel,
            },
            FrameKind::Cancel => Frame::Cancel {
                channel: header.channel,
            },
            FrameKind::Error => Frame::Error {
                channel: header.channel,
                message: payload,
            },
            FrameKind::BufferSize => Frame::BufferSize {
                channel: header.channel,
                size: header.arg0,
            },
            FrameKind::Checkpoint => Frame::Checkpoint { message: payload },
            FrameKind::PriorityBarrier => Frame::PriorityBarrier {
                channel: header.channel,
                id: header.barrier_id(),
            },
            FrameKind::AlignedBarrier => Frame::AlignedBarrier {
                channel: header.channel,
                id: header.barrier_id(),
            },
        };
        Ok(Some((frame, total)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAX: usize = 32 * 1024;

    fn frame_strategy() -> impl Strategy<Value = (u8, u32, u32, u32, Vec<u8>)> {
        (
            1u8..=13,
            any::<u32>(),
            1u32..,
            any::<u32>(),
            proptest::collection::vec(any::<u8>(), 1..300),
        )
    }

    fn build(kind: u8, channel: u32, arg0: u32, arg1: u32, payload: &[u8]) -> Frame<'_> {
        match kind {
            1 => Frame::Handshake {
                process: channel,
                nonce: [arg0 as u8; NONCE_SIZE],
                job: [arg1 as u8; JOB_ID_SIZE],
            },
            8 => Frame::BufferSize {
                channel,
                size: arg0,
            },
            9 => Frame::Auth {
                tag: [arg0 as u8; TAG_SIZE],
            },
            10 => Frame::Heartbeat,
            11 => Frame::Checkpoint { message: payload },
            12 => Frame::PriorityBarrier {
                channel,
                id: u64::from(arg0) | (u64::from(arg1) << 32),
            },
            13 => Frame::AlignedBarrier {
                channel,
                id: u64::from(arg0) | (u64::from(arg1) << 32),
            },
            2 => Frame::PartitionRequest {
                channel,
                credit: arg0,
            },
            3 => Frame::Buffer {
                channel,
                sequence: arg0,
                backlog: arg1,
                payload,
            },
            4 => Frame::AddCredit {
                channel,
                delta: arg0,
            },
            5 => Frame::EndOfPartition { channel },
            6 => Frame::Cancel { channel },
            _ => Frame::Error {
                channel,
                message: payload,
            },
        }
    }

    proptest! {
        /// Any sequence of valid frames decodes back to itself, whole or fed a byte
        /// range at a time (a prefix is never mistaken for a frame).
        #[test]
        fn frames_round_trip(frames in proptest::collection::vec(frame_strategy(), 1..20)) {
            let frames: Vec<Frame<'_>> = frames
                .iter()
                .map(|(k, c, a0, a1, p)| build(*k, *c, *a0, *a1, p))
                .collect();
            let mut bytes = Vec::new();
            for frame in &frames {
                frame.encode(&mut bytes);
            }
            let mut offset = 0;
            for frame in &frames {
                let total = HEADER_SIZE + frame.header().len as usize;
                for cut in [0, 1, HEADER_SIZE - 1, HEADER_SIZE, total - 1] {
                    if cut < total {
                        let prefix = &bytes[offset..offset + cut];
                        prop_assert_eq!(Frame::decode(prefix, MAX).unwrap(), None);
                    }
                }
                let (decoded, used) = Frame::decode(&bytes[offset..], MAX).unwrap().unwrap();
                prop_assert_eq!(&decoded, frame);
                offset += used;
            }
            prop_assert_eq!(offset, bytes.len());
        }

        /// Garbage never panics the decoder; whatever it accepts re-encodes to the same
        /// bytes, and it never claims more bytes than it was given.
        #[test]
        fn garbage_is_an_error_or_a_frame(bytes in proptest::collection::vec(any::<u8>(), 0..200),
                                          max in 0usize..300) {
            match Frame::decode(&bytes, max) {
                Ok(Some((frame, used))) => {
                    prop_assert!(used <= bytes.len());
                    let mut again = Vec::new();
                    frame.encode(&mut again);
                    prop_assert_eq!(&again[..], &bytes[..used]);
                }
                Ok(None) => prop_assert!(
                    bytes.len() < HEADER_SIZE
                        || Header::decode(bytes[..HEADER_SIZE].try_into().unwrap(), max).is_ok()
                ),
                Err(error) => prop_assert!(!error.to_string().is_empty()),
            }
        }
    }

    /// Each way a header can be wrong is its own typed error.
    #[test]
    fn bad_headers_are_typed_errors() {
        let mut bytes = Header::handshake(7).encode();
        bytes[4] = 99;
        assert!(matches!(
            Header::decode(&bytes, MAX),
            Err(FrameError::UnknownType(99))
        ));
        let mut bytes = Header::handshake(7).encode();
        bytes[16] = 1;
        assert!(matches!(
            Header::decode(&bytes, MAX),
            Err(FrameError::UnsupportedVersion { theirs: 1, .. })
        ));
        let mut bytes = Header::handshake(7).encode();
        bytes[12] = 0;
        assert!(matches!(
            Header::decode(&bytes, MAX),
            Err(FrameError::BadMagic { .. })
        ));
        let oversized = Header {
            kind: FrameKind::Buffer,
            len: MAX as u32 + 1,
            channel: 0,
            arg0: 0,
            arg1: 0,
        };
        let error = Header::decode(&oversized.encode(), MAX).unwrap_err();
        assert!(
            matches!(error, FrameError::Oversized { len, max, .. } if len == MAX + 1 && max == MAX)
        );
        assert!(error.to_string().contains("exceeds"), "{error}");
        let huge_error = Header {
            kind: FrameKind::Error,
            len: u32::MAX,
            channel: 0,
            arg0: 0,
            arg1: 0,
        };
        assert!(matches!(
            Header::decode(&huge_error.encode(), MAX),
            Err(FrameError::Oversized { .. })
        ));
        // A checkpoint message: empty, longer than its limit, or on a channel.
        let checkpoint = |len: u32, channel: u32| Header {
            kind: FrameKind::Checkpoint,
            len,
            channel,
            arg0: 0,
            arg1: 0,
        };
        assert!(Header::decode(&checkpoint(100, 0).encode(), MAX).is_ok());
        assert!(matches!(
            Header::decode(&checkpoint(0, 0).encode(), MAX),
            Err(FrameError::Malformed { .. })
        ));
        assert!(matches!(
            Header::decode(
                &checkpoint(CHECKPOINT_MESSAGE_MAX as u32 + 1, 0).encode(),
                MAX
            ),
            Err(FrameError::Oversized { .. })
        ));
        assert!(matches!(
            Header::decode(&checkpoint(100, 3).encode(), MAX),
            Err(FrameError::Malformed { .. })
        ));
        let mut credit = Header::control(FrameKind::Cancel, 1, 0).encode();
        credit[0] = 1;
        assert!(matches!(
            Header::decode(&credit, MAX),
            Err(FrameError::Oversized { max: 0, .. })
        ));
        let zero_credit = Header::control(FrameKind::AddCredit, 1, 0).encode();
        assert!(matches!(
            Header::decode(&zero_credit, MAX),
            Err(FrameError::Malformed { .. })
        ));
        let mut unused = Header::control(FrameKind::Error, 1, 0).encode();
        unused[19] = 0x2d;
        assert!(matches!(
            Header::decode(&unused, MAX),
            Err(FrameError::Malformed { .. })
        ));
        let mut reserved = Header::control(FrameKind::Cancel, 1, 0).encode();
        reserved[6] = 1;
        assert!(matches!(
            Header::decode(&reserved, MAX),
            Err(FrameError::Malformed { .. })
        ));
        // A priority barrier: its id over both fields, never 0, never a payload.
        let barrier = Header::priority_barrier(3, (7 << 32) | 9);
        let decoded = Header::decode(&barrier.encode(), MAX).unwrap();
        assert_eq!(decoded.barrier_id(), (7 << 32) | 9);
        assert!(matches!(
            Header::decode(&Header::priority_barrier(3, 0).encode(), MAX),
            Err(FrameError::Malformed { .. })
        ));
        let mut with_payload = Header::priority_barrier(3, 1).encode();
        with_payload[0] = 4;
        assert!(matches!(
            Header::decode(&with_payload, MAX),
            Err(FrameError::Oversized { max: 0, .. })
        ));
        // An aligned barrier announcement: the same rules.
        let announced = Header::aligned_barrier(3, (7 << 32) | 9);
        let decoded = Header::decode(&announced.encode(), MAX).unwrap();
        assert_eq!(decoded.kind, FrameKind::AlignedBarrier);
        assert_eq!(decoded.barrier_id(), (7 << 32) | 9);
        assert!(matches!(
            Header::decode(&Header::aligned_barrier(3, 0).encode(), MAX),
            Err(FrameError::Malformed { .. })
        ));
    }
}
