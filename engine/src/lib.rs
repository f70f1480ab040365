//! Weir's engine: the parts of a thread-per-core stream processor that do no I/O.
//!
//! - [`ring`]: the SPSC mail ring, the only way data crosses cores;
//! - [`slab`]: fixed-capacity generational slab for in-flight entries;
//! - [`park`] and [`mailbox`]: a task's inbox and how its thread sleeps without lost
//!   wake-ups;
//! - [`exchange`]: buffer segments recycled through lock-free pools;
//! - [`element`] and [`async_io`]: stream elements and the async I/O operator
//!   (Flink's `AsyncWaitOperator`) with its test harness;
//! - [`timer`]: the hashed timing wheel for timeouts and retries;
//! - [`runtime`]: workers pinned to cores, each running its tasks;
//! - [`graph`]: the job-graph API: sources, chained operators, Flink's partitioners
//!   and key groups, sinks, placement, run on the runtime;
//! - [`checkpoint`]: the checkpoint coordinator's rules and the checkpoint directory
//!   (format, checksums, retention, restore from the newest valid checkpoint);
//! - [`limits`]: every default capacity with its cost.
//!
//! `--cfg loom` switches every atomic to loom (see `sync`) for the models in
//! `loom-tests/`.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(
    missing_docs,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]

pub mod async_io;
pub mod checkpoint;
pub mod element;
pub mod error;
pub mod exchange;
pub mod graph;
pub mod limits;
pub mod mailbox;
pub mod park;
pub mod ring;
pub mod runtime;
pub mod slab;
pub(crate) mod sync;
pub mod timer;

pub use error::{ConfigError, DebloatError, ExchangeError};
