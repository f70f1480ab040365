//! Criterion curves for the local data exchange: time per record through record writer
//! → local channel → input gate on two pinned cores, over record size (8, 100, 1000
//! bytes: one chart, `exchange/1to1`), once per record, in runs of 256 and in runs read
//! in place, with a
//! `crossbeam_channel` of the same records (one per message, and a `Vec` of 32 KiB per
//! message) and an `rtrb` ring of records beside it, the cross-core ceiling (the values
//! in recycled 32 KiB batches, no framework), and three references for the wire format's
//! copies (into segments; into segments and decoded; decoded on the other core); 1→2
//! key-hash and 2→2 round-robin; buffer timeout 100 ms and 0.
//!
//! Latency percentiles and the open-loop run: `weir compare exchange`.

// criterion_group! generates an undocumented `pub fn`.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use weir_bench::compare::{
    CROSSBEAM_BATCHED, CROSSBEAM_PER_RECORD, CROSS_CORE_CEILING, RTRB_PER_RECORD,
    WEIR_EXCHANGE_IN_PLACE, WEIR_EXCHANGE_RUNS, WIRE_COPY_REFERENCE, WIRE_CROSS_CORE_REFERENCE,
    WIRE_DECODE_REFERENCE,
};
use weir_bench::exchange_peers::{
    cross_core_ceiling, crossbeam_channel, crossbeam_channel_batched, rtrb_per_record,
    weir_exchange, weir_exchange_in_place, weir_exchange_runs, wire_copy_reference,
    wire_cross_core_reference, wire_decode_reference, Routing,
};

const TIMEOUT: Option<Duration> = Some(Duration::from_millis(100));

fn record_size(c: &mut Criterion) {
    let mut group = common::curve(c, "exchange/1to1");
    macro_rules! size {
        ($n:literal) => {{
            group.bench_with_input(BenchmarkId::new("weir", $n), &$n, |b, _| {
                b.iter_custom(|n| {
                    weir_exchange::<$n>(1, 1, Routing::RoundRobin, TIMEOUT, n.max(1)).elapsed
                })
            });
            group.bench_with_input(BenchmarkId::new(WEIR_EXCHANGE_RUNS, $n), &$n, |b, _| {
                b.iter_custom(|n| {
                    weir_exchange_runs::<$n>(1, 1, Routing::RoundRobin, TIMEOUT, n.max(1)).elapsed
                })
            });
            group.bench_with_input(BenchmarkId::new(WEIR_EXCHANGE_IN_PLACE, $n), &$n, |b, _| {
                b.iter_custom(|n| {
                    weir_exchange_in_place::<$n>(1, 1, Routing::RoundRobin, TIMEOUT, n.max(1))
                        .elapsed
                })
            });
            group.bench_with_input(BenchmarkId::new(CROSSBEAM_PER_RECORD, $n), &$n, |b, _| {
                b.iter_custom(|n| crossbeam_channel::<$n>(n).elapsed)
            });
            group.bench_with_input(BenchmarkId::new(CROSSBEAM_BATCHED, $n), &$n, |b, _| {
                b.iter_custom(|n| crossbeam_channel_batched::<$n>(n).elapsed)
            });
            group.bench_with_input(BenchmarkId::new(RTRB_PER_RECORD, $n), &$n, |b, _| {
                b.iter_custom(|n| rtrb_per_record::<$n>(n).elapsed)
            });
            group.bench_with_input(BenchmarkId::new(CROSS_CORE_CEILING, $n), &$n, |b, _| {
                b.iter_custom(|n| cross_core_ceiling::<$n>(n).elapsed)
            });
            group.bench_with_input(BenchmarkId::new(WIRE_COPY_REFERENCE, $n), &$n, |b, _| {
                b.iter_custom(|n| wire_copy_reference::<$n>(n).elapsed)
            });
            group.bench_with_input(BenchmarkId::new(WIRE_DECODE_REFERENCE, $n), &$n, |b, _| {
                b.iter_custom(|n| wire_decode_reference::<$n>(n).elapsed)
            });
            group.bench_with_input(
                BenchmarkId::new(WIRE_CROSS_CORE_REFERENCE, $n),
                &$n,
                |b, _| b.iter_custom(|n| wire_cross_core_reference::<$n>(n).elapsed),
            );
        }};
    }
    size!(8);
    size!(100);
    size!(1000);
    group.finish();
}

fn fan_out(c: &mut Criterion) {
    let mut group = c.benchmark_group("exchange/100B");
    group.throughput(Throughput::Elements(1));
    group.bench_function("1to2 key-hash", |b| {
        b.iter_custom(|n| {
            weir_exchange::<100>(1, 2, Routing::HashModulo, TIMEOUT, n.max(2)).elapsed
        })
    });
    group.bench_function("2to2 round-robin", |b| {
        b.iter_custom(|n| {
            weir_exchange::<100>(2, 2, Routing::RoundRobin, TIMEOUT, n.max(2)).elapsed
        })
    });
    group.bench_function("1to1 timeout 0", |b| {
        b.iter_custom(|n| {
            weir_exchange::<100>(1, 1, Routing::RoundRobin, Some(Duration::ZERO), n.max(1)).elapsed
        })
    });
    group.finish();
}

criterion_group! { name = benches; config = common::config(20); targets = record_size, fan_out }
criterion_main!(benches);
