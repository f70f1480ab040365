//! The external systems a job talks to, each on its worker's driver: the lookup
//! service ([`lookup`]: its protocol, a service with latency distributions and fault
//! injection, and the pipelined client that is an `AsyncFunction`) and Redis
//! ([`redis`]: a pipelined client, and in [`redis::streams`] the Redis Streams source and
//! sink, exactly once), and Kafka ([`kafka`]: a source and a sink, at least or exactly
//! once, through rdkafka). They are kept apart from the transport, which moves the
//! exchange's own buffers between processes. Each is also reachable at the crate's root
//! (`weir_net::lookup`, `weir_net::redis`, `weir_net::kafka`).

pub mod kafka;
pub mod lookup;
pub mod redis;
