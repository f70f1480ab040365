//! The lookup service (the embedded external system) and its client.

pub mod client;
pub mod latency;
pub mod protocol;
pub mod server;

pub use client::{
    lookup_function, ClientConfig, ClientIo, ClientStats, LookupBatchFunction, LookupClient,
    LookupFactory, LookupFunction, LookupRequest,
};
pub use latency::{format_duration, parse_duration, Latency, Rng};
pub use server::{thread_cpu_ns, Faults, LookupServer, ServerConfig, ServerStats};
