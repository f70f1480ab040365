//! Weir's kernel-facing half: the per-core I/O drivers (io_uring, with an epoll
//! fallback), and the lookup service with its client. It implements what `weir-engine`
//! leaves abstract.
//!
//! - [`driver`]: the driver interface and the io_uring/epoll choice;
//! - `uring`, `epoll`: the two drivers;
//! - `connect`: a client's connection on its worker's driver (a non-blocking connect
//!   with a timeout, shut down when dropped);
//! - [`connectors`]: the external systems, apart from the transport:
//!   - [`lookup`]: the service (binary protocol, latency distributions, fault
//!     injection) and the pipelined client that is an `AsyncFunction`;
//!   - [`redis`]: Redis as an external system, a pipelined client on the same drivers,
//!     and the Redis Streams source and sink;
//!   - [`kafka`]: the Kafka source and sink (rdkafka), exactly once;
//! - [`transport`]: remote channels over TCP with credit-based flow control;
//! - [`cluster`]: a graph over processes on the transport;
//! - [`metrics`]: the Prometheus endpoint.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(
    missing_docs,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]

pub mod cluster;
mod connect;
pub mod connectors;
mod conns;
pub mod driver;
pub mod epoll;
pub mod error;
pub mod metrics;
pub mod transport;
pub mod uring;

pub use connectors::{kafka, lookup, redis};

/// The README's Rust examples, compiled and run by `cargo test` as doc tests, so that
/// they cannot drift from the code.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeExamples;

/// The guide's "Getting started" examples, compiled and run as doc tests (the
/// enrichment join is also checked to be `examples/enrichment.rs` word for word).
#[cfg(doctest)]
#[doc = include_str!("../../guide/src/getting-started.md")]
pub struct GuideGettingStarted;

/// The guide's "Writing pipelines" examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../guide/src/pipelines.md")]
pub struct GuidePipelines;

/// The guide's transport example, compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../../guide/src/transport.md")]
pub struct GuideTransport;

/// The guide's "benchmarks-and-scripts" chapter: any Rust block in it is compiled and run as a doc
/// test.
#[cfg(doctest)]
#[doc = include_str!("../../guide/src/benchmarks-and-scripts.md")]
pub struct GuideBenchmarksAndScripts;

/// The guide's "cluster" chapter: any Rust block in it is compiled and run as a doc
/// test.
#[cfg(doctest)]
#[doc = include_str!("../../guide/src/cluster.md")]
pub struct GuideCluster;

/// The guide's "concepts" chapter: any Rust block in it is compiled and run as a doc
/// test.
#[cfg(doctest)]
#[doc = include_str!("../../guide/src/concepts.md")]
pub struct GuideConcepts;

/// The guide's "exchange" chapter: any Rust block in it is compiled and run as a doc
/// test.
#[cfg(doctest)]
#[doc = include_str!("../../guide/src/exchange.md")]
pub struct GuideExchange;

/// The guide's "fault-tolerance" chapter: any Rust block in it is compiled and run as a doc
/// test.
#[cfg(doctest)]
#[doc = include_str!("../../guide/src/fault-tolerance.md")]
pub struct GuideFaultTolerance;

/// The guide's "introduction" chapter: any Rust block in it is compiled and run as a doc
/// test.
#[cfg(doctest)]
#[doc = include_str!("../../guide/src/introduction.md")]
pub struct GuideIntroduction;

/// The guide's "kafka" chapter: any Rust block in it is compiled and run as a doc
/// test.
#[cfg(doctest)]
#[doc = include_str!("../../guide/src/kafka.md")]
pub struct GuideKafka;

/// The guide's "lookup-protocol" chapter: any Rust block in it is compiled and run as a doc
/// test.
#[cfg(doctest)]
#[doc = include_str!("../../guide/src/lookup-protocol.md")]
pub struct GuideLookupProtocol;

/// The guide's "metrics" chapter: any Rust block in it is compiled and run as a doc
/// test.
#[cfg(doctest)]
#[doc = include_str!("../../guide/src/metrics.md")]
pub struct GuideMetrics;

/// The guide's "redis" chapter: any Rust block in it is compiled and run as a doc
/// test.
#[cfg(doctest)]
#[doc = include_str!("../../guide/src/redis.md")]
pub struct GuideRedis;

/// The guide's "troubleshooting" chapter: any Rust block in it is compiled and run as a doc
/// test.
#[cfg(doctest)]
#[doc = include_str!("../../guide/src/troubleshooting.md")]
pub struct GuideTroubleshooting;

/// The guide's "tuning" chapter: any Rust block in it is compiled and run as a doc
/// test.
#[cfg(doctest)]
#[doc = include_str!("../../guide/src/tuning.md")]
pub struct GuideTuning;

/// The guide's "weir-run" chapter: any Rust block in it is compiled and run as a doc
/// test.
#[cfg(doctest)]
#[doc = include_str!("../../guide/src/weir-run.md")]
pub struct GuideWeirRun;

pub use driver::{build as build_driver, factory as driver_factory, DriverKind, Wake};
pub use error::NetError;

#[cfg(test)]
mod tests {
    /// The guide's enrichment join is the example's file as it is (its tests aside):
    /// the example is built and run by `cargo test`, and the guide's copy compiles as
    /// a doc test, but only this says they are the same program.
    #[test]
    fn the_guide_shows_the_enrichment_example_as_it_is() {
        let guide = include_str!("../../guide/src/getting-started.md");
        let example = include_str!("../examples/enrichment.rs");
        let end = example.find("#[cfg(test)]").unwrap_or(example.len());
        let shown = example[..end].trim_end();
        assert!(
            guide.contains(shown),
            "guide/src/getting-started.md's enrichment block differs from \
             net/examples/enrichment.rs: copy the example's file (up to its tests) into it"
        );
    }

    /// Every chapter SUMMARY.md lists exists, and every relative link of the README and
    /// the guide names a file that exists.
    #[test]
    fn the_guide_s_chapters_and_links_resolve() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = vec![root.join("README.md")];
        let guide = root.join("guide/src");
        for entry in std::fs::read_dir(&guide).expect("guide/src") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
        let mut broken = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).expect("readable");
            let mut rest = text.as_str();
            while let Some(at) = rest.find("](") {
                rest = &rest[at + 2..];
                let Some(end) = rest.find(')') else { break };
                let target = &rest[..end];
                rest = &rest[end..];
                if target.contains("://") || target.starts_with('#') || target.contains(' ') {
                    continue;
                }
                let path = target.split('#').next().unwrap_or(target);
                if path.is_empty() {
                    continue;
                }
                let resolved = file.parent().expect("a directory").join(path);
                if !resolved.exists() {
                    broken.push(format!("{}: {target}", file.display()));
                }
            }
        }
        assert!(broken.is_empty(), "links to nothing: {broken:#?}");
    }
}
