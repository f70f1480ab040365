//! Criterion curves for Redis `GET`s of 100-byte values on one worker against a
//! `redis-server` pinned to the other core, over the number in flight: Weir's operator
//! over its Redis client (io_uring and epoll, plain pipelining and `MGET` batching, the
//! worker polling for `SPIN` before it parks),
//! redis-rs's multiplexed connection and fred on a tokio current-thread runtime, one
//! task per `GET` in flight and `MGET`s of C / 2 keys.
//!
//! Needs `redis-server` (scripts/redis.sh install); without it the suite says so and
//! measures nothing. The server's own ceiling and the latency percentiles: `weir
//! compare redis`.

// criterion_group! generates an undocumented `pub fn`.
#![allow(missing_docs)]

mod common;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use weir_bench::compare::{FRED, FRED_MGET, REDIS_RS, REDIS_RS_MGET};
use weir_bench::redis_peers::{fred, peer_batch, redis_rs, server, weir, PeerForm, SPIN};
use weir_net::redis::RedisServer;
use weir_net::DriverKind;

fn in_flight(c: &mut Criterion) {
    if RedisServer::binary().is_none() {
        eprintln!("note: redis-server is not installed (scripts/redis.sh install); the redis benches are skipped");
        return;
    }
    let server = server().expect("redis-server starts");
    let url = server.url();
    let mut drivers = vec![(DriverKind::Epoll, "weir epoll")];
    if weir_net::build_driver(DriverKind::Uring).is_ok() {
        drivers.push((DriverKind::Uring, "weir io_uring"));
    }
    let mut group = c.benchmark_group("redis/get100");
    group.throughput(Throughput::Elements(1));
    for inflight in [1usize, 16, 256, 1024] {
        for &(driver, name) in &drivers {
            group.bench_with_input(BenchmarkId::new(name, inflight), &inflight, |b, &c| {
                b.iter_custom(|n| weir(driver, &url, c, false, SPIN, n).elapsed)
            });
            let batched = format!("{name}, MGET batching");
            group.bench_with_input(BenchmarkId::new(batched, inflight), &inflight, |b, &c| {
                b.iter_custom(|n| weir(driver, &url, c, true, SPIN, n).elapsed)
            });
        }
        let mget = PeerForm::Mget(peer_batch(inflight));
        for (name, form) in [(REDIS_RS, PeerForm::Get), (REDIS_RS_MGET, mget)] {
            group.bench_with_input(BenchmarkId::new(name, inflight), &inflight, |b, &c| {
                b.iter_custom(|n| redis_rs(&url, c, form, n).elapsed)
            });
        }
        for (name, form) in [(FRED, PeerForm::Get), (FRED_MGET, mget)] {
            group.bench_with_input(BenchmarkId::new(name, inflight), &inflight, |b, &c| {
                b.iter_custom(|n| fred(&url, c, form, n).elapsed)
            });
        }
    }
    group.finish();
}

criterion_group! { name = benches; config = common::config(10); targets = in_flight }
criterion_main!(benches);
