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

/// The README's Rust examples, compiled and run by `cargo test` as doc tests, so that
/// they cannot drift from the code (the enrichment join is also checked to be
/// `examples/enrichment.rs` word for word).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeExamples;

pub use driver::{build as build_driver, factory as driver_factory, DriverKind, Wake};
pub use error::NetError;

#[cfg(test)]
mod tests {
    /// The README's enrichment join is the example's file as it is (its tests aside):
    /// the example is built and run by `cargo test`, and the README's copy compiles as
    /// a doc test, but only this says they are the same program.
    #[test]
    fn the_readme_shows_the_enrichment_example_as_it_is() {
        let readme = include_str!("../../README.md");
        let example = include_str!("../examples/enrichment.rs");
        let end = example.find("#[cfg(test)]").unwrap_or(example.len());
        let shown = example[..end].trim_end();
        assert!(
            readme.contains(shown),
            "README.md's enrichment block differs from net/examples/enrichment.rs: copy the \
             example's file (up to its tests) into the README"
        );
    }
}
