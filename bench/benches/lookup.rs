//! Criterion curves for lookups on one worker against the embedded service (pinned to
//! the other core): through the async operator with the io_uring and the epoll driver,
//! the pipelined tokio client (a future per call) and the pipelined tokio loop (one
//! task, no per-call future) speaking the same protocol, and the hand-written `mio` loop
//! ceiling, over the number of requests in flight.
//!
//! The 1 ms closed loop (fraction of Little's limit, p99): `weir compare lookup`.

// criterion_group! generates an undocumented `pub fn`.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use weir_bench::compare::{MIO_LOOKUP_CEILING, TOKIO_LOOKUP, TOKIO_LOOP_LOOKUP};
use weir_bench::lookup_peers::{mio_ceiling, service, tokio, tokio_loop, weir};
use weir_net::lookup::Latency;
use weir_net::DriverKind;

fn in_flight(c: &mut Criterion) {
    let server = service(Latency::Fixed(Duration::ZERO));
    let server = &server;
    let mut group = common::curve(c, "lookup/latency0");
    // io_uring only where the kernel allows it (see the guide's "Getting started", requirements).
    let uring = weir_net::build_driver(DriverKind::Uring).is_ok();
    for inflight in [16usize, 256, 1024] {
        if uring {
            group.bench_with_input(
                BenchmarkId::new("weir io_uring", inflight),
                &inflight,
                |b, &c| b.iter_custom(|n| weir(DriverKind::Uring, server, c, n).elapsed),
            );
        }
        group.bench_with_input(
            BenchmarkId::new("weir epoll", inflight),
            &inflight,
            |b, &c| b.iter_custom(|n| weir(DriverKind::Epoll, server, c, n).elapsed),
        );
        group.bench_with_input(
            BenchmarkId::new(TOKIO_LOOKUP, inflight),
            &inflight,
            |b, &c| b.iter_custom(|n| tokio(server, c, n).elapsed),
        );
        group.bench_with_input(
            BenchmarkId::new(TOKIO_LOOP_LOOKUP, inflight),
            &inflight,
            |b, &c| b.iter_custom(|n| tokio_loop(server, c, n).elapsed),
        );
        group.bench_with_input(
            BenchmarkId::new(MIO_LOOKUP_CEILING, inflight),
            &inflight,
            |b, &c| b.iter_custom(|n| mio_ceiling(server, c, n).elapsed),
        );
    }
    group.finish();
}

criterion_group! { name = benches; config = common::config(10); targets = in_flight }
criterion_main!(benches);
