//! Criterion figures for the whole main job (`weir run`'s pipeline) on 1 and 2 workers
//! with each driver: generator → async lookup (latency 0) → key-hash exchange → sink.
//! Each sample starts the workers and an embedded lookup service, so small runs include
//! their start-up.

// criterion_group! generates an undocumented `pub fn`.
#![allow(missing_docs)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use weir_bench::job::{self, JobSettings};
use weir_bench::job::{JobProgress, KeyDistribution};
use weir_engine::async_io::OutputMode;
use weir_engine::runtime::Cores;
use weir_net::lookup::{Latency, LookupServer, ServerConfig};
use weir_net::DriverKind;

fn pipeline(c: &mut Criterion) {
    let server = LookupServer::start(ServerConfig {
        latency: Latency::Fixed(Duration::ZERO),
        ..ServerConfig::default()
    })
    .expect("service");
    let mut group = c.benchmark_group("pipeline/latency0");
    group.throughput(Throughput::Elements(1));
    let mut drivers = vec![(DriverKind::Epoll, "epoll")];
    if weir_net::build_driver(DriverKind::Uring).is_ok() {
        drivers.insert(0, (DriverKind::Uring, "uring"));
    }
    for (driver, name) in drivers {
        for workers in [1usize, 2] {
            group.bench_with_input(BenchmarkId::new(name, workers), &workers, |b, &workers| {
                b.iter_custom(|n| {
                    let settings = JobSettings {
                        records: n.max(1000),
                        rate: None,
                        mode: OutputMode::Unordered,
                        capacity: 1000,
                        timeout: Duration::from_secs(10),
                        retries: 0,
                        retry_delay: Duration::from_millis(1),
                        cores: Cores::Count(workers),
                        pin: true,
                        driver,
                        timer_slack: weir_engine::runtime::TIMER_SLACK_DEFAULT,
                        service: server.addr(),
                        connections: 1,
                        keys: KeyDistribution::Uniform { keys: 1 << 20 },
                        buffer_timeout: Some(Duration::from_millis(1)),
                        futures: false,
                        lookup_batch: None,
                        key_iter: None,
                        collect: None,
                        cluster: None,
                        checkpoints: None,
                        output: None,
                        streams: Default::default(),
                        stop: Default::default(),
                    };
                    let (report, elapsed) =
                        job::run(&settings, Arc::new(JobProgress::default())).expect("job runs");
                    assert_eq!((report.missing, report.duplicates), (0, 0));
                    // Scale to the n criterion asked for when the floor of 1000 applied.
                    elapsed.mul_f64(n as f64 / settings.records as f64)
                })
            });
        }
    }
    group.finish();
}

criterion_group! { name = benches; config = common::config(10); targets = pipeline }
criterion_main!(benches);
