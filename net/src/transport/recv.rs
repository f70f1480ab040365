//! The receive side of the transport: the channels this process consumes, grouped in
//! a gate per `consume` call with its receive pool, and their credit (Flink's
//! `RemoteInputChannel` and `CreditBasedPartitionRequestClientHandler`).
//!
//! Credit invariant, per gate: the sum over its channels of (buffers its pool lent to the
//! channel and has not seen back + credit outstanding) never exceeds the pool's size. A
//! buffer that arrives against a credit therefore always finds a free segment.
//!
//! A connection finds a consumed channel by [`ChannelAt`]: its gate's slot in the
//! network thread's gates, that gate's generation, and its index, so that a frame for a
//! channel whose gate was freed never reaches the gate that took the slot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use weir_engine::exchange::{LocalBufferPool, SharedBuffer};
use weir_engine::park::Notify;
use weir_engine::ring::Producer;

use super::channel::{BufferSizeSlot, FailureSlot};
use super::conn::Conn;
use super::error::TransportError;
use super::frame::{FrameKind, Header};
use super::Peer;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ChannelState {
    Open,
    /// Ended, cancelled or failed: late buffers are read and dropped.
    Closed,
}

/// A channel this process consumes.
pub(super) struct RecvChannel {
    pub(super) id: u32,
    pub(super) ring: Option<Producer<SharedBuffer>>,
    pub(super) notify: Option<Arc<dyn Notify>>,
    pub(super) failure: FailureSlot,
    /// The buffer size the consumer's gate announced (0: none), and the last one sent.
    pub(super) buffer_size: BufferSizeSlot,
    pub(super) buffer_size_sent: u32,
    /// The newest unaligned barrier the producer announced ahead of the data (0: none),
    /// read by the consumer's gate (see [`RemoteInputChannel`](super::RemoteInputChannel)).
    pub(super) barrier: Arc<AtomicU64>,
    /// The newest aligned barrier the producer announced as it wrote it (0: none).
    pub(super) aligned: Arc<AtomicU64>,
    /// Bytes that arrived so far (a running total for the gate's in-flight figure).
    pub(super) received: Arc<AtomicU64>,
    pub(super) received_total: u64,
    pub(super) state: ChannelState,
    pub(super) credit: u32,
    pub(super) announce: u32,
    pub(super) backlog: u32,
    pub(super) next_sequence: u32,
}

impl RecvChannel {
    pub(super) fn new(
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
            barrier: Arc::default(),
            aligned: Arc::default(),
            received: Arc::default(),
            received_total: 0,
            state: ChannelState::Open,
            credit: 0,
            announce: 0,
            backlog: 0,
            next_sequence: 0,
        }
    }

    /// The producer announced unaligned barrier `id` ahead of the data: raised for the
    /// gate (Release: pairs with its Acquire load), which is woken.
    pub(super) fn announce_barrier(&mut self, id: u64) {
        self.barrier.fetch_max(id, Ordering::Release);
        if let Some(notify) = &self.notify {
            notify.notify();
        }
    }

    /// The producer announced aligned barrier `id` as it wrote it: raised for the gate,
    /// which counts the barrier's alignment timeout from it, and woken.
    pub(super) fn announce_aligned_barrier(&mut self, id: u64) {
        self.aligned.fetch_max(id, Ordering::Release);
        if let Some(notify) = &self.notify {
            notify.notify();
        }
    }

    /// Ends the channel: with `failure`, the consumer's gate reports it; without, the
    /// consumer sees a clean disconnection after the buffers it has.
    pub(super) fn close(&mut self, failure: Option<Arc<TransportError>>) {
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
pub(super) struct Gate {
    pub(super) peer: Peer,
    pub(super) pool: LocalBufferPool,
    pub(super) channels: Vec<RecvChannel>,
    pub(super) exclusive: u32,
    pub(super) floating: u32,
    /// Where the next round of floating grants starts (round robin).
    pub(super) rotate: usize,
    pub(super) conn: usize,
    /// Tells this gate from earlier ones in the same slot of `Net::gates`: frames that
    /// name a channel of a freed gate must not reach whichever gate took its slot.
    pub(super) generation: u64,
}

impl Gate {
    pub(super) fn new(
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

    pub(super) fn is_closed(&self) -> bool {
        self.channels
            .iter()
            .all(|c| c.state == ChannelState::Closed)
    }

    /// Cancels channels whose consumer dropped them, then grants credit (see the module
    /// docs of `transport`); queues cancel and add-credit frames on `conn`.
    pub(super) fn grant(&mut self, conn: &mut Conn) -> bool {
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

/// Where a consumed channel lives: its gate's slot in `Net::gates`, that gate's
/// generation (the slot is reused once the gate is freed), and the channel's index in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ChannelAt {
    pub(super) gate: usize,
    pub(super) generation: u64,
    pub(super) index: usize,
}

/// The receive channel at `at`, if its gate is still the one it was consumed into and
/// the index is in range: a stale or hostile frame never reaches another gate's channel.
pub(super) fn gate_at(gates: &mut [Option<Gate>], at: ChannelAt) -> Option<&mut Gate> {
    gates
        .get_mut(at.gate)?
        .as_mut()
        .filter(|gate| gate.generation == at.generation && at.index < gate.channels.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{SocketAddr, TcpListener, TcpStream};

    use super::super::auth::JobId;
    use super::super::conn::Conn;
    use super::super::frame::{FrameKind, Header};
    use weir_engine::exchange::{LocalPoolConfig, NetworkBufferPool};

    fn conn() -> (Conn, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let stream = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (peer, addr) = listener.accept().expect("accept");
        let mut conn = Conn::new(stream, addr, false, 1, &JobId::default());
        // As after the handshake: frames go to the send queue.
        conn.claimed = Some(2);
        conn.proved = true;
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
