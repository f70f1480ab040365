//! Redis Streams as a log a job reads from and writes to: a source reading streams
//! ([`source`]) and a sink appending to one ([`sink`]), each subtask on its worker's own
//! driver over one pipelined connection (`conn`).
//!
//! - `conn`: one RESP2 connection on the driver (connect, `AUTH`/`SELECT`, back-off,
//!   response timeouts with an allowance for blocking reads) whose replies are handed
//!   over whole as owned frames, in order: streams' replies nest (streams, entries,
//!   fields), unlike the flat replies the lookup client parses in place. A loss drops
//!   every command outstanding and says so once; the owner sends again what it needs.
//! - [`source`]: [`StreamSource`], `XREAD`/`XREADGROUP` with `BLOCK`, positions
//!   checkpointed per stream, event time, watermarks and idleness, consumer groups
//!   acknowledged at completed checkpoints;
//!   `graph.from_source_io(move |info| stream_source(&config, info))`.
//!
//! How a source's streams are split over its subtasks: stream `i` goes to subtask
//! `i % parallelism`, whole, as Kafka partitions go to a consumer's readers. A stream is
//! an ordered log with one position: read by one subtask, its entries leave in ID order
//! and its position is one ID in that subtask's checkpoint. Splitting one stream by ID
//! range over several readers would interleave its entries downstream (losing its
//! order), give it several positions to keep consistent, and need a range per reader
//! that nothing in Redis maintains; a job that needs more readers than streams should
//! write to more streams. A subtask with no stream marks itself idle at once (so that it
//! does not hold back event time downstream) and, when bounded, ends at once.
//!
//! The sink ([`sink`]): [`stream_sink`] appends each record as an entry (`XADD`, trimmed
//! with `MAXLEN ~` if asked), at least once, or exactly once in a job that checkpoints:
//! each checkpoint's entries are committed as one `MULTI`/`EXEC` with a marker key, so a
//! restore writes nothing twice, and readers see them once their checkpoint completes.
//! [`produce()`] appends entries from outside the workers (tools, tests).
//!
//! [`StreamUrl`]: `redis-stream://host:port/stream[,stream…]`, a server and its streams
//! in one argument.

pub(crate) mod conn;
pub mod source;

pub use source::{
    stream_source, ConsumerGroup, EntryId, EntryIdError, EventTime, StartFrom, StreamEntry,
    StreamSource, StreamSourceConfig, StreamSourceCounts, StreamSourceStats,
};

// The sink's modules and re-exports.
pub mod produce;
pub mod sink;

pub use produce::{produce, ProduceReport, Producer};

pub mod url;

pub use sink::{
    stream_sink, Fields, Guarantee, StreamSink, StreamSinkConfig, StreamSinkCounts, StreamSinkStats,
};
pub use url::{StreamUrl, StreamUrlError};
