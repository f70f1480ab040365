//! Criterion curves for the async operator against tokio with `futures`'
//! `buffered`/`buffer_unordered`, `futures-buffered`'s slot-based streams and a
//! value-or-future fast path: latency-0 overhead per mode, completions from another
//! thread (capacity 100), and timer-driven completions: one curve over capacity (at
//! 1 ms), one over latency (at capacity 100). Weir runs the operator as a task on a
//! runtime worker, its calls completed by timers on a timing wheel and the worker parked
//! until the next; tokio uses a `timerfd` armed at the earliest deadline (a precise
//! timer, as Weir's), and `tokio::time::sleep`, whose 1 ms tick rounds each deadline up.
//!
//! Little's-law fractions and latency percentiles: `weir compare async`.

// criterion_group! generates an undocumented `pub fn`.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use weir_bench::async_peers::{
    tokio_immediate, tokio_precise_timer, tokio_timer, weir_cross_thread, weir_immediate,
    weir_timer, Framework,
};
use weir_bench::compare::{
    FUTURES_BUFFERED_ORDERED, FUTURES_BUFFERED_UNORDERED, TOKIO_BUFFERED, TOKIO_BUFFER_UNORDERED,
    TOKIO_PRECISE_TIMER_UNORDERED, TOKIO_TIMER_UNORDERED, VALUE_OR_FUTURE_ORDERED,
    VALUE_OR_FUTURE_UNORDERED, WEIR_TIMER_UNORDERED,
};
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
    for (framework, ordered, name) in [
        (Framework::Futures, true, TOKIO_BUFFERED),
        (Framework::Futures, false, TOKIO_BUFFER_UNORDERED),
        (Framework::FuturesBuffered, true, FUTURES_BUFFERED_ORDERED),
        (
            Framework::FuturesBuffered,
            false,
            FUTURES_BUFFERED_UNORDERED,
        ),
        (Framework::ValueOrFuture, true, VALUE_OR_FUTURE_ORDERED),
        (Framework::ValueOrFuture, false, VALUE_OR_FUTURE_UNORDERED),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|n| tokio_immediate(framework, ordered, 100, n).elapsed)
        });
    }
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

/// Timer-driven completions, one chart over capacity at 1 ms latency and one over
/// latency at capacity 100.
fn timer_latency(c: &mut Criterion) {
    let mut group = common::curve(c, "async_wait/timer_1ms_by_capacity");
    group.sample_size(10);
    let latency = Duration::from_millis(1);
    for capacity in [10usize, 100, 1000] {
        add_timer_pair(&mut group, capacity, latency, capacity);
    }
    group.finish();
    let mut group = common::curve(c, "async_wait/timer_capacity100_by_latency_ms");
    group.sample_size(10);
    let latencies: &[u64] = if quick() { &[1, 10] } else { &[1, 2, 5, 10] };
    for &latency_ms in latencies {
        add_timer_pair(
            &mut group,
            latency_ms,
            Duration::from_millis(latency_ms),
            100,
        );
    }
    group.finish();
}

fn add_timer_pair(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    parameter: impl std::fmt::Display,
    latency: Duration,
    capacity: usize,
) {
    group.bench_with_input(
        BenchmarkId::new(WEIR_TIMER_UNORDERED, &parameter),
        &capacity,
        |b, &cap| {
            b.iter_custom(|n| {
                weir_timer(OutputMode::Unordered, cap, latency, n.max(cap as u64)).elapsed
            })
        },
    );
    group.bench_with_input(
        BenchmarkId::new(TOKIO_PRECISE_TIMER_UNORDERED, &parameter),
        &capacity,
        |b, &cap| {
            b.iter_custom(|n| tokio_precise_timer(false, cap, latency, n.max(cap as u64)).elapsed)
        },
    );
    group.bench_with_input(
        BenchmarkId::new(TOKIO_TIMER_UNORDERED, &parameter),
        &capacity,
        |b, &cap| b.iter_custom(|n| tokio_timer(false, cap, latency, n.max(cap as u64)).elapsed),
    );
}

criterion_group! { name = benches; config = common::config(20); targets = overhead, cross_thread, timer_latency }
criterion_main!(benches);
