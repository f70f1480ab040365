//! Weir's kernel-facing half: the per-core I/O drivers (io_uring with an epoll
//! fallback), the lookup service and its client, and the TCP transport for remote
//! channels. It builds on the traits `weir-engine` defines.
//!
//! Nothing is implemented here yet; the crate exists so the workspace's dependency
//! direction (`engine` ← `net` ← `bench`) is fixed from the start.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(
    missing_docs,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]
