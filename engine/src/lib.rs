//! Weir's engine: the parts of a thread-per-core stream processor that do no I/O.
//!
//! - [`ring`]: the SPSC mail ring, the only way data crosses cores;
//! - [`slab`]: fixed-capacity generational slab for in-flight entries;
//! - [`park`] and [`mailbox`]: a task's inbox and how its thread sleeps without lost
//!   wake-ups;
//! - [`exchange`]: buffer segments recycled through lock-free pools;
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

pub mod error;
pub mod exchange;
pub mod limits;
pub mod mailbox;
pub mod park;
pub mod ring;
pub mod slab;
pub(crate) mod sync;

pub use error::ConfigError;
