//! A graph over several processes (on one host or many): which subtasks a process runs,
//! and how the channels that cross processes are made.
//!
//! Every process builds the same graph and calls [`Graph::with_cluster`] with its own
//! index. Workers are numbered over the whole cluster: process `p` of `N`, each with `W`
//! workers, holds workers `p·W .. (p+1)·W`; the default spread and explicit placements
//! ([`Stream::place`]) name these global workers. A process runs only its subtasks; a
//! channel between two of them is a local channel, as in one process, and a channel
//! from a subtask here to one elsewhere goes through [`RemoteChannels`] (implemented
//! over TCP with credit-based flow control by `weir-net`'s transport): the producer's
//! side serves the consumer end of a local channel, the consumer's side reads a remote
//! channel beside its local ones in its input gate. Channel ids are numbered the same
//! way in every process (edge, upstream subtask, downstream subtask, in graph order), so
//! the two sides agree without talking.
//!
//! The engine names no socket: whatever carries the bytes is behind the trait.
//!
//! [`Graph::with_cluster`]: super::Graph::with_cluster
//! [`Stream::place`]: super::Stream::place

use std::sync::Arc;

use crate::checkpoint::CheckpointLink;
use crate::exchange::{InputChannel, LocalInputChannel, NetworkBufferPool};
use crate::park::Notify;
use crate::runtime::TaskError;

/// How channels cross processes (the producer and the consumer side).
pub trait RemoteChannels: Send + Sync {
    /// What the producer side of a served channel wakes when it has a buffer (the
    /// thread that sends it).
    fn producer_notify(&self) -> Arc<dyn Notify>;

    /// Serves `input`, the consumer end of a local channel fed by one of this process's
    /// subtasks, as channel `channel` to process `consumer`, which the plan says consumes
    /// it (and which alone may).
    fn serve(&self, channel: u32, consumer: usize, input: LocalInputChannel);

    /// The channels `channels` that process `process` produces, in that order, with
    /// receive buffers drawn from `network`; `notify` wakes the consuming task when a
    /// buffer arrives.
    fn consume(
        &self,
        process: usize,
        channels: &[u32],
        network: &NetworkBufferPool,
        notify: Arc<dyn Notify>,
    ) -> Result<Vec<Box<dyn InputChannel>>, TaskError>;

    /// Segments a [`consume`](Self::consume) of `channels` channels draws from its
    /// network pool.
    fn receive_segments(&self, channels: usize) -> usize;
}

/// This process's place in a cluster of processes.
#[derive(Clone)]
pub struct Cluster {
    /// Processes in all.
    pub processes: usize,
    /// This process's index.
    pub process: usize,
    /// How channels cross processes.
    pub remote: Arc<dyn RemoteChannels>,
    /// How the processes' checkpoint services talk (process 0 coordinates); needed
    /// only by a checkpointed graph.
    pub checkpoints: Option<Arc<dyn CheckpointLink>>,
}

impl Cluster {
    /// The process that runs global worker `worker`, with `per_process` workers each.
    pub fn process_of(&self, worker: usize, per_process: usize) -> usize {
        worker / per_process.max(1)
    }
}

impl core::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Cluster")
            .field("processes", &self.processes)
            .field("process", &self.process)
            .finish_non_exhaustive()
    }
}
