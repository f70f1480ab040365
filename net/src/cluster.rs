//! A job graph over several processes, its crossing channels on the transport.
//!
//! Every process of a job runs the same program with its own index and the same peer
//! list (one transport address per process, its own included):
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use weir_engine::graph::{Graph, SubtaskInfo};
//! use weir_engine::runtime::{Cores, Runtime};
//! use weir_net::cluster::TransportChannels;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let peers = ["10.0.0.1:7000".parse()?, "10.0.0.2:7000".parse()?];
//! let me = 0; // 1 on the other host
//! let channels = Arc::new(TransportChannels::start(me, &peers)?);
//! channels.wait_for_peers(Duration::from_secs(30))?;
//! let graph = Graph::new().with_parallelism(4).with_cluster(channels.cluster());
//! let counted = graph
//!     .from_iter(|info: &SubtaskInfo| {
//!         let index = info.index as u64;
//!         (0..1_000u64).map(move |n| n * 4 + index)
//!     })
//!     .key_by(|v: &u64| *v)
//!     .count();
//! let runtime = Runtime::builder().cores(Cores::Count(2)).build()?;
//! graph.execute(runtime)?;
//! // Keep serving until every consumer elsewhere has all this process produced.
//! channels.drain(Duration::from_secs(30))?;
//! println!("this process's sinks counted {}", counted.records());
//! # Ok(()) }
//! ```
//!
//! Processes are started by whatever the deployment uses (a shell, systemd, a container
//! orchestrator); each needs the peer list and its index. The processes connect at
//! start, one connection per pair ([`TransportChannels::wait_for_peers`]), a producer keeps its transport up
//! until its consumers have everything ([`TransportChannels::drain`]), and a process
//! that dies fails the channels it fed at each consumer with an error naming the
//! channel and the peer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_engine::checkpoint::{CheckpointLink, LinkEvent};
use weir_engine::exchange::{InputChannel, LocalInputChannel, NetworkBufferPool};
use weir_engine::graph::{Cluster, RemoteChannels};
use weir_engine::park::Notify;
use weir_engine::runtime::TaskError;

use crate::transport::{Peer, Transport, TransportConfig, TransportError};

/// [`RemoteChannels`] over a [`Transport`]: this process's transport and its peers.
pub struct TransportChannels {
    transport: Transport,
    process: usize,
    peers: Vec<Peer>,
    exclusive: usize,
    floating: usize,
}

impl TransportChannels {
    /// Process `process` of `peers.len()`, listening on `peers[process]`, with Flink's
    /// credit defaults.
    pub fn start(process: usize, peers: &[SocketAddr]) -> Result<Self, TransportError> {
        let Some(&listen) = peers.get(process) else {
            return Err(TransportError::Config(format!(
                "process {process} of a cluster of {} processes: the index must be below the \
                 number of peers",
                peers.len()
            )));
        };
        let config = TransportConfig {
            listen,
            ..TransportConfig::new(process as u32)
        };
        Self::with_config(config, peers)
    }

    /// As [`start`](Self::start), with transport settings (`config.process` is this
    /// process's index, `config.listen` its address).
    pub fn with_config(
        config: TransportConfig,
        peers: &[SocketAddr],
    ) -> Result<Self, TransportError> {
        let process = config.process as usize;
        if process >= peers.len() {
            return Err(TransportError::Config(format!(
                "process {process} of a cluster of {} processes: the index must be below the \
                 number of peers",
                peers.len()
            )));
        }
        let (exclusive, floating) = (config.exclusive_buffers, config.floating_buffers);
        // Only the listed processes may connect.
        let config = TransportConfig {
            processes: Some(peers.len().min(u32::MAX as usize) as u32),
            ..config
        };
        let transport = Transport::start(config)?;
        Ok(TransportChannels {
            transport,
            process,
            peers: peers
                .iter()
                .enumerate()
                .map(|(i, &addr)| Peer {
                    process: i as u32,
                    addr,
                })
                .collect(),
            exclusive,
            floating,
        })
    }

    /// This process's place in the cluster, for [`Graph::with_cluster`](weir_engine::graph::Graph::with_cluster).
    pub fn cluster(self: &Arc<Self>) -> Cluster {
        Cluster {
            processes: self.peers.len(),
            process: self.process,
            remote: Arc::clone(self) as Arc<dyn RemoteChannels>,
            checkpoints: Some(Arc::clone(self) as Arc<dyn CheckpointLink>),
        }
    }

    /// Connections to other processes opened so far (one per peer when each pair shares
    /// one, as [`wait_for_peers`](Self::wait_for_peers) arranges).
    pub fn connections_opened(&self) -> usize {
        self.transport.connections_opened()
    }

    /// Why connections to other processes ended with channels open (see
    /// [`Transport::lost_connections`]).
    pub fn lost_connections(&self) -> Vec<String> {
        self.transport.lost_connections()
    }

    /// The address this process's transport listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.transport.local_addr()
    }

    /// Connects this process to every other one (they may start in any order) and
    /// waits until each connection completed its handshake; fails after `timeout`
    /// naming the first peer still missing. Process `i` dials the peers after it and
    /// waits for those before it to dial, so each pair of processes shares one
    /// connection, which every channel between them then uses, both ways.
    pub fn wait_for_peers(&self, timeout: Duration) -> Result<(), TransportError> {
        let deadline = Instant::now() + timeout;
        let mut dialed = Instant::now();
        for peer in &self.peers[self.process + 1..] {
            self.transport.connect(*peer);
        }
        loop {
            let missing = self.peers.iter().find(|p| {
                p.process as usize != self.process && !self.transport.is_connected(p.process)
            });
            let Some(missing) = missing else {
                return Ok(());
            };
            if let Some(reason) = self.transport.refusal(missing.process) {
                // Refused in the handshake: dialing again would not change that.
                return Err(TransportError::Refused {
                    peer: format!("process {} at {}", missing.process, missing.addr),
                    reason,
                });
            }
            if Instant::now() >= deadline {
                return Err(TransportError::Io {
                    what: "waiting for a peer process to connect",
                    peer: format!("process {} at {}", missing.process, missing.addr),
                    source: std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no connection within {timeout:?}; is it running?"),
                    ),
                });
            }
            if dialed.elapsed() >= Duration::from_millis(50) {
                // A peer that was not listening yet refused the dial: dial again.
                for peer in &self.peers[self.process + 1..] {
                    if !self.transport.is_connected(peer.process) {
                        self.transport.connect(*peer);
                    }
                }
                dialed = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Waits until every channel this process serves was sent to its end (see
    /// [`Transport::drain`]).
    pub fn drain(&self, timeout: Duration) -> Result<(), TransportError> {
        self.transport.drain(timeout)
    }
}

impl RemoteChannels for TransportChannels {
    fn producer_notify(&self) -> Arc<dyn Notify> {
        self.transport.notify()
    }

    fn serve(&self, channel: u32, consumer: usize, input: LocalInputChannel) {
        self.transport.serve_to(channel, consumer as u32, input);
    }

    fn consume(
        &self,
        process: usize,
        channels: &[u32],
        network: &NetworkBufferPool,
        notify: Arc<dyn Notify>,
    ) -> Result<Vec<Box<dyn InputChannel>>, TaskError> {
        let peer = *self.peers.get(process).ok_or_else(|| {
            TransportError::Config(format!(
                "no peer {process} in a cluster of {}",
                self.peers.len()
            ))
        })?;
        let remotes = self
            .transport
            .consume(peer, channels, network, Some(notify))?;
        Ok(remotes
            .into_iter()
            .map(|r| Box::new(r) as Box<dyn InputChannel>)
            .collect())
    }

    fn receive_segments(&self, channels: usize) -> usize {
        channels * self.exclusive + self.floating
    }
}

impl core::fmt::Debug for TransportChannels {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("TransportChannels")
            .field("process", &self.process)
            .field("peers", &self.peers)
            .finish_non_exhaustive()
    }
}

/// The checkpoint services' messages ride the connections the channels use (see the
/// transport's checkpoint frame).
impl CheckpointLink for TransportChannels {
    fn open(&self, inbox: Box<dyn Fn(LinkEvent) + Send + Sync>) {
        self.transport.open_checkpoints(inbox);
    }

    fn send(&self, to: usize, bytes: Vec<u8>) {
        self.transport.send_checkpoint(to as u32, bytes);
    }
}
