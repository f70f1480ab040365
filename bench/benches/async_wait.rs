//! Criterion curves for the async operator against tokio + futures
//! `buffered`/`buffer_unordered`: latency-0 overhead per mode, completions from another
//! thread (capacity 100), and timer-driven latency over capacity (Weir: the operator as
//! a task on a runtime worker, calls completed by timers on a timing wheel, the worker
//! parked until the next; tokio: `tokio::time::sleep`, whose 1 ms tick rounds each
//! deadline up, as tokio users get it).
//!
//! Little's-law fractions and latency percentiles: `weir compare async`.

// criterion_group! generates an undocumented `pub fn`.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use weir_bench::async_peers::{
    tokio_immediate, tokio_timer, weir_cross_thread, weir_immediate, weir_timer,
};
use weir_bench::compare::{TOKIO_TIMER_UNORDERED, WEIR_TIMER_UNORDERED};
use weir_engine::async_io::OutputMode;

fn quick() -> bool {
    std::env::var_os("WEIR_BENCH_QUICK").is_some()
}

const MODES: [(OutputMode, &str); 3] = [
    (OutputMode::Ordered, "ordered"),
    (OutputMode::Unordered, "unordered"),
    (OutputMode::KeyedOrdered, "keyed"),
];

fn overhead(c: &mut Criterion) {
    let mut group = c.benchmark_group("async_wait/latency0_capacity100");
    group.throughput(Throughput::Elements(1));
    for (mode, name) in MODES {
        group.bench_function(format!("weir {name}"), |b| {
            b.iter_custom(|n| weir_immediate(mode, 100, n).elapsed)
        });
    }
    group.bench_function("tokio buffered", |b| {
        b.iter_custom(|n| tokio_immediate(true, 100, n).elapsed)
    });
    group.bench_function("tokio buffer_unordered", |b| {
        b.iter_custom(|n| tokio_immediate(false, 100, n).elapsed)
    });
    group.finish();
}

fn cross_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("async_wait/other_thread_capacity100");
    group.throughput(Throughput::Elements(1));
    for (mode, name) in MODES {
        group.bench_function(format!("weir {name}"), |b| {
            b.iter_custom(|n| weir_cross_thread(mode, 100, n).elapsed)
        });
    }
    group.finish();
}

fn timer_latency(c: &mut Criterion) {
    let mut group = c.benchmark_group("async_wait/timer_latency");
    group.sample_size(10);
    group.throughput(Throughput::Elements(1));
    let latencies: &[u64] = if quick() { &[1] } else { &[1, 10] };
    for &latency_ms in latencies {
        for capacity in [10usize, 100, 1000] {
            let latency = Duration::from_millis(latency_ms);
            let id = format!("L={latency_ms}ms C={capacity}");
            group.bench_with_input(
                BenchmarkId::new(WEIR_TIMER_UNORDERED, &id),
                &capacity,
                |b, &cap| {
                    b.iter_custom(|n| {
                        weir_timer(OutputMode::Unordered, cap, latency, n.max(cap as u64)).elapsed
                    })
                },
            );
            group.bench_with_input(
                BenchmarkId::new(TOKIO_TIMER_UNORDERED, &id),
                &capacity,
                |b, &cap| {
                    b.iter_custom(|n| tokio_timer(false, cap, latency, n.max(cap as u64)).elapsed)
                },
            );
        }
    }
    group.finish();
}

criterion_group! { name = benches; config = common::config(20); targets = overhead, cross_thread, timer_latency }
criterion_main!(benches);
