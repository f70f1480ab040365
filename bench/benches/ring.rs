//! Criterion curves for the SPSC mail ring against rtrb, crossbeam's `ArrayQueue` and
//! std's `sync_channel`, on two pinned cores: streaming one at a time (capacity sweep),
//! streaming in batches of 64, and ping-pong round trips.
//!
//! For ratios that survive this VM's noise use `weir compare ring` (interleaved turns,
//! medians); criterion runs each implementation in one block.

// criterion_group! generates an undocumented `pub fn`.
#![allow(missing_docs)]

mod common;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use weir_bench::ring_peers::{
    round_trip, stream_batched, stream_with, ArrayQueue, Queue, Rtrb, StdSync, Weir,
};

fn streaming(c: &mut Criterion) {
    let mut group = common::curve(c, "ring/streaming");
    for capacity in [64usize, 1024, 16384] {
        fn add<Q: Queue>(
            group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
            capacity: usize,
        ) {
            group.bench_with_input(BenchmarkId::new(Q::NAME, capacity), &capacity, |b, &cap| {
                b.iter_custom(|iters| stream_with::<Q>(iters, cap))
            });
        }
        add::<Weir>(&mut group, capacity);
        add::<Rtrb>(&mut group, capacity);
        add::<ArrayQueue>(&mut group, capacity);
        add::<StdSync>(&mut group, capacity);
    }
    group.finish();
}

fn batched(c: &mut Criterion) {
    let mut group = c.benchmark_group("ring/streaming_batch64");
    group.throughput(Throughput::Elements(1));
    group.bench_function(Weir::NAME, |b| b.iter_custom(stream_batched::<Weir>));
    group.bench_function(Rtrb::NAME, |b| b.iter_custom(stream_batched::<Rtrb>));
    group.finish();
}

fn ping_pong(c: &mut Criterion) {
    let mut group = c.benchmark_group("ring/round_trip");
    group.bench_function(Weir::NAME, |b| b.iter_custom(round_trip::<Weir>));
    group.bench_function(Rtrb::NAME, |b| b.iter_custom(round_trip::<Rtrb>));
    group.bench_function(ArrayQueue::NAME, |b| {
        b.iter_custom(round_trip::<ArrayQueue>)
    });
    group.bench_function(StdSync::NAME, |b| b.iter_custom(round_trip::<StdSync>));
    group.finish();
}

criterion_group! { name = benches; config = common::config(20); targets = streaming, batched, ping_pong }
criterion_main!(benches);
