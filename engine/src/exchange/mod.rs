//! Task data exchange (Flink's `RecordWriter → ResultPartition → InputGate`): records
//! serialized into recycled fixed-size segments, one channel per subpartition, pool
//! exhaustion as back-pressure.
//!
//! - [`pool`]: the network and local buffer pools and their buffers;
//! - [`buffer`]: a buffer read while it is written (builder and consumers);
//! - [`codec`]: how records become bytes;
//! - [`writer`]: the record writer, channel selectors, in-band events, buffer timeout;
//! - [`partition`]: subpartitions filling buffers and publishing what they wrote;
//! - [`channel`]: local channels (and the trait a remote one implements);
//! - [`input`]: the input gate: reassembly, watermark combining, fair polling;
//! - [`debloat`]: buffer sizes from the gate's throughput (buffer debloating).

pub mod buffer;
pub mod channel;
pub mod codec;
pub mod debloat;
pub(crate) mod free_list;
pub mod input;
pub mod partition;
pub mod pool;
pub mod writer;

pub use buffer::{BufferBuilder, BufferConsumer, Read};
pub use channel::{
    local_channel, BarrierAnnouncer, ChannelSender, InputChannel, LocalInputChannel,
};
pub use debloat::{DebloatConfig, Debloater, STARTING_SIZE_DEFAULT};
pub use input::{GateEvent, GateMetrics, GateRun, InputGate, RecordRef};
pub use partition::{PartitionMetrics, ResultPartition};
pub use pool::{Buffer, LocalBufferPool, LocalPoolConfig, NetworkBufferPool, SharedBuffer};
pub use writer::{
    Broadcast, ChannelSelector, Forward, HashModulo, RecordWriter, RoundRobin, Target,
    WriterConfig, WriterMetrics,
};
