//! Criterion figures for the segment pool against a `Mutex<VecDeque>` pool (Flink's
//! design) and a `crossbeam_queue::ArrayQueue` pool: acquire + recycle on one thread,
//! and acquire on one core with the recycle (drop) on the other.
//!
//! For ratios that survive this VM's noise use `weir compare pool`.

// criterion_group! generates an undocumented `pub fn`.
#![allow(missing_docs)]

mod common;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use weir_bench::pool_peers::{cross_thread, single_thread, ArrayQueuePool, MutexPool, Pool, Weir};

fn uncontended(c: &mut Criterion) {
    let mut group = c.benchmark_group("pool/uncontended");
    group.throughput(Throughput::Elements(1));
    group.bench_function(Weir::NAME, |b| b.iter_custom(single_thread::<Weir>));
    group.bench_function(MutexPool::NAME, |b| {
        b.iter_custom(single_thread::<MutexPool>)
    });
    group.bench_function(ArrayQueuePool::NAME, |b| {
        b.iter_custom(single_thread::<ArrayQueuePool>)
    });
    group.finish();
}

fn cross_core(c: &mut Criterion) {
    let mut group = c.benchmark_group("pool/cross_core");
    group.throughput(Throughput::Elements(1));
    group.bench_function(Weir::NAME, |b| b.iter_custom(cross_thread::<Weir>));
    group.bench_function(MutexPool::NAME, |b| {
        b.iter_custom(cross_thread::<MutexPool>)
    });
    group.bench_function(ArrayQueuePool::NAME, |b| {
        b.iter_custom(cross_thread::<ArrayQueuePool>)
    });
    group.finish();
}

criterion_group! { name = benches; config = common::config(20); targets = uncontended, cross_core }
criterion_main!(benches);
