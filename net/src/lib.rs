//! Weir's kernel-facing half: the per-core I/O drivers (io_uring, with an epoll
//! fallback), and the lookup service with its client. It implements what `weir-engine`
//! leaves abstract.
//!
//! - [`driver`]: the driver interface and the io_uring/epoll choice;
//! - `uring`, `epoll`: the two drivers;
//! - `connect`: a client's connection on its worker's driver (a non-blocking connect
//!   with a timeout, shut down when dropped);
//! - [`lookup`]: the service (binary protocol, latency distributions, fault injection)
//!   and the pipelined client that is an `AsyncFunction`;
//! - [`redis`]: Redis as an external system, a pipelined client on the same drivers;
//! - [`transport`]: remote channels over TCP with credit-based flow control.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(
    missing_docs,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]

pub mod cluster;
mod connect;
mod conns;
pub mod driver;
pub mod epoll;
pub mod error;
pub mod lookup;
pub mod metrics;
pub mod redis;
pub mod transport;
pub mod uring;

pub use driver::{build as build_driver, factory as driver_factory, DriverKind, Wake};
pub use error::NetError;
