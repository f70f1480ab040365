//! Weir's measurement kit: the workloads behind `cargo bench` and `weir compare`, with
//! the peers (rtrb, crossbeam, std, a mutex pool) run on exactly the same workload.
//!
//! Every workload is a plain function returning the elapsed time for `n` operations, so
//! criterion (`benches/`) and the interleaving comparer ([`compare`]) measure the same
//! code. Each checks its result (sequence, count) before reporting a time.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(
    missing_docs,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]

pub mod affinity;
pub mod async_peers;
pub mod checkpoint_bench;
pub mod cluster;
pub mod compare;
pub mod debloat;
pub mod exchange_peers;
pub mod flink;
pub mod job;
pub mod kafka_bench;
pub mod lookup_peers;
pub mod pool_peers;
pub mod redis_peers;
pub mod remote_peers;
pub mod report;
pub mod ring_peers;
pub mod stream_bench;
pub mod streams;
pub mod wake_cost;
