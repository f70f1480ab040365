//! Incoming frames on the network thread: a frame's header once the peer has
//! authenticated (partition requests, credit, cancels, ends, errors, buffer sizes,
//! heartbeats, checkpoint messages), a buffer's header checked against its channel's credit and sequence,
//! and payloads once read (a buffer handed to its gate, an error to its channel, a
//! handshake or an authentication to `handshake`, a checkpoint message to the
//! checkpoint service's inbox).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use weir_engine::checkpoint::LinkEvent;

use super::conn::{refuse_channel, Conn, Ending, Reading, SendChannel};
use super::error::{FrameError, TransportError};
use super::frame::{FrameKind, Header, CONNECTION_CHANNEL, ERROR_MESSAGE_MAX};
use super::network::{refusal_for, Net, ANNOUNCED_BUFFER_SIZE_MIN, BUFFER_PAYLOAD_MAX};
use super::recv::{gate_at, ChannelState};
use super::waiting::{Refusal, REQUESTS_WAITING_PER_CONNECTION_MAX};

impl Net {
    pub(super) fn finish_payload(
        &mut self,
        conn: &mut Conn,
        reading: Reading,
    ) -> Result<(), Ending> {
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
                        // Relaxed: a gauge (the network thread is its only writer).
                        channel.received_total += len as u64;
                        channel
                            .received
                            .store(channel.received_total, Ordering::Relaxed);
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
            Reading::Message {
                kind: FrameKind::Checkpoint,
                bytes,
                ..
            } => {
                // Checkpoint frames are read only after the peer authenticated.
                let Some(from) = conn.process else {
                    return Ok(());
                };
                self.control
                    .checkpoints
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .deliver(LinkEvent::Message {
                        from: from as usize,
                        bytes,
                    });
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

    /// Applies a decoded header.
    pub(super) fn frame(
        &mut self,
        slot: usize,
        conn: &mut Conn,
        header: Header,
    ) -> Result<(), Ending> {
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
                } else if let Some((input, consumer)) = self.served.remove(&channel) {
                    if let Some(message) = refusal_for(consumer, conn.process, channel) {
                        // Kept for its own consumer.
                        self.served.insert(channel, (input, consumer));
                        refuse_channel(conn, channel, &message)?;
                    } else {
                        conn.outgoing.push(SendChannel {
                            id: channel,
                            input,
                            queue: VecDeque::new(),
                            credit: header.arg0,
                            sequence: 0,
                            announced: 0,
                            aligned_announced: 0,
                        });
                    }
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
            FrameKind::Checkpoint => {
                // Its length (1..=CHECKPOINT_MESSAGE_MAX) was checked by Header::decode.
                conn.reading = Reading::Message {
                    kind: FrameKind::Checkpoint,
                    channel,
                    bytes: vec![0; header.len as usize],
                    filled: 0,
                };
            }
            FrameKind::Buffer => self.buffer(conn, header)?,
            FrameKind::PriorityBarrier => {
                // An unaligned barrier ahead of the channel's queued buffers: the
                // consuming gate takes the checkpoint now and reads the channel ahead to
                // the barrier in band (see `RemoteInputChannel::announced_barrier`).
                let Some(&at) = conn.incoming.get(&channel) else {
                    return Err(protocol(
                        conn,
                        format!(
                            "a priority barrier for channel {channel}, which was never requested"
                        ),
                    ));
                };
                // A channel whose gate is gone, or that ended, ignores it.
                if let Some(gate) = gate_at(&mut self.gates, at) {
                    let receiver = &mut gate.channels[at.index];
                    if receiver.state == ChannelState::Open {
                        receiver.announce_barrier(header.barrier_id());
                    }
                }
            }
            FrameKind::AlignedBarrier => {
                // An aligned barrier was written behind the channel's queued buffers: the
                // consuming gate counts its alignment timeout from now.
                let Some(&at) = conn.incoming.get(&channel) else {
                    return Err(protocol(
                        conn,
                        format!(
                            "an aligned barrier announcement for channel {channel}, which was \
                             never requested"
                        ),
                    ));
                };
                if let Some(gate) = gate_at(&mut self.gates, at) {
                    let receiver = &mut gate.channels[at.index];
                    if receiver.state == ChannelState::Open {
                        receiver.announce_aligned_barrier(header.barrier_id());
                    }
                }
            }
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
    pub(super) fn buffer(&mut self, conn: &mut Conn, header: Header) -> Result<(), Ending> {
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
}
