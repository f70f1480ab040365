//! The main job end to end on 1 and 2 workers with both drivers, against the lookup
//! service started here on an ephemeral loopback port: every record arrives exactly
//! once, ordered mode keeps order end to end for one subtask, and injected faults
//! (errors, resets, stalls) with retries lose and duplicate nothing.

use std::sync::Arc;
use std::time::Duration;

use weir_bench::job::{self, JobSettings};
use weir_bench::job::{JobProgress, KeyDistribution};
use weir_engine::async_io::OutputMode;
use weir_engine::runtime::Cores;
use weir_net::lookup::{Faults, Latency, LookupServer, ServerConfig};
use weir_net::DriverKind;

fn server(latency: Latency, faults: Faults) -> LookupServer {
    LookupServer::start(ServerConfig {
        latency,
        faults,
        ..ServerConfig::default()
    })
    .expect("service starts")
}

fn settings(server: &LookupServer, workers: usize, driver: DriverKind) -> JobSettings {
    JobSettings {
        records: 20_000,
        rate: None,
        mode: OutputMode::Unordered,
        capacity: 64,
        timeout: Duration::from_secs(5),
        retries: 0,
        retry_delay: Duration::from_millis(1),
        cores: Cores::Count(workers),
        pin: false,
        driver,
        timer_slack: weir_engine::runtime::TIMER_SLACK_DEFAULT,
        service: server.addr(),
        connections: 2,
        keys: KeyDistribution::Uniform { keys: 1000 },
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
    }
}

/// The drivers this machine can run: io_uring where the kernel allows it (its refusal
/// must be a clear setup error), and epoll always.
fn drivers() -> Vec<DriverKind> {
    match weir_net::build_driver(DriverKind::Uring) {
        Ok(_) => vec![DriverKind::Uring, DriverKind::Epoll],
        Err(error) => {
            assert!(
                error.to_string().contains("cannot set up the uring driver"),
                "{error}"
            );
            eprintln!("io_uring unavailable here ({error}); testing epoll only");
            vec![DriverKind::Epoll]
        }
    }
}

#[test]
fn every_record_arrives_exactly_once() {
    let service = server(
        Latency::Uniform(Duration::from_micros(50), Duration::from_micros(400)),
        Faults::default(),
    );
    for driver in drivers() {
        for workers in [1, 2] {
            let settings = settings(&service, workers, driver);
            let (report, _) =
                job::run(&settings, Arc::new(JobProgress::default())).expect("job runs");
            assert_eq!(report.run.drivers.len(), workers);
            assert!(report.run.drivers.iter().all(|d| *d
                == if driver == DriverKind::Uring {
                    "uring"
                } else {
                    "epoll"
                }));
            assert_eq!(report.generated, settings.records, "{driver:?} × {workers}");
            assert_eq!(report.received, settings.records, "{driver:?} × {workers}");
            assert_eq!(
                (report.missing, report.duplicates),
                (0, 0),
                "{driver:?} × {workers}"
            );
        }
    }
}

#[test]
fn ordered_mode_keeps_order_end_to_end() {
    let service = server(
        Latency::Uniform(Duration::from_micros(10), Duration::from_micros(800)),
        Faults::default(),
    );
    for driver in drivers() {
        let mut settings = settings(&service, 1, driver);
        settings.mode = OutputMode::Ordered;
        let (report, _) = job::run(&settings, Arc::new(JobProgress::default())).expect("job runs");
        assert_eq!(report.received, settings.records);
        assert_eq!(
            report.reordered, 0,
            "{driver:?}: ordered output was reordered"
        );
        // The same run unordered does reorder (the check above can fail).
        settings.mode = OutputMode::Unordered;
        let (report, _) = job::run(&settings, Arc::new(JobProgress::default())).expect("job runs");
        assert!(
            report.reordered > 0,
            "{driver:?}: unordered run came out in order; the latency spread is too small"
        );
    }
}

#[test]
fn faults_with_retries_lose_and_duplicate_nothing() {
    let faults = Faults {
        error_rate: 0.02,
        reset_rate: 0.001,
        stall_rate: 0.002,
        malformed_rate: 0.0,
    };
    let service = server(Latency::Fixed(Duration::from_micros(100)), faults);
    for driver in drivers() {
        for workers in [1, 2] {
            let mut settings = settings(&service, workers, driver);
            settings.retries = 10;
            settings.timeout = Duration::from_secs(3);
            let (report, _) = job::run(&settings, Arc::new(JobProgress::default()))
                .expect("job survives the faults");
            assert_eq!(report.received, settings.records, "{driver:?} × {workers}");
            assert_eq!((report.missing, report.duplicates), (0, 0));
            assert!(
                report.async_metrics.retried > 0,
                "faults were injected but nothing was retried"
            );
        }
    }
    let stats = service.stop();
    assert!(
        stats.errors > 0 && stats.resets > 0 && stats.stalls > 0,
        "{stats:?}"
    );
}

/// The lookups as batch requests (`--lookup-batch`): with errors, resets and stalls
/// injected and retries, every record still arrives exactly once, in both modes.
/// Resets and stalls are drawn per frame (a batch whole), so their rates are higher here
/// than per request in the test above (a reset fails every frame on its connection).
#[test]
fn batch_requests_with_faults_lose_and_duplicate_nothing() {
    let faults = Faults {
        error_rate: 0.02,
        reset_rate: 0.005,
        stall_rate: 0.005,
        malformed_rate: 0.0,
    };
    let service = server(Latency::Fixed(Duration::from_micros(100)), faults);
    for driver in drivers() {
        for mode in [OutputMode::Unordered, OutputMode::Ordered] {
            let mut settings = settings(&service, 2, driver);
            settings.lookup_batch = Some(64);
            settings.mode = mode;
            settings.retries = 10;
            settings.timeout = Duration::from_secs(3);
            let (report, _) = job::run(&settings, Arc::new(JobProgress::default()))
                .expect("job survives the faults");
            assert_eq!(report.received, settings.records, "{driver:?} {mode:?}");
            assert_eq!((report.missing, report.duplicates), (0, 0));
            assert!(report.async_metrics.retried > 0, "nothing was retried");
        }
    }
    let stats = service.stop();
    assert!(
        stats.errors > 0 && stats.resets > 0 && stats.stalls > 0,
        "{stats:?}"
    );
}

#[test]
fn an_unreachable_service_is_a_clear_error() {
    let service = server(Latency::Fixed(Duration::ZERO), Faults::default());
    let mut settings = settings(&service, 1, DriverKind::Epoll);
    let addr = service.addr();
    let _stats = service.stop();
    settings.service = addr;
    settings.records = 100;
    let error = job::run(&settings, Arc::new(JobProgress::default())).expect_err("nothing listens");
    assert!(
        error
            .to_string()
            .contains("connecting to the lookup service"),
        "{error}"
    );
}

#[test]
fn the_lookup_written_as_an_async_block_loses_nothing() {
    let faults = Faults {
        error_rate: 0.01,
        ..Faults::default()
    };
    let service = server(
        Latency::Uniform(Duration::from_micros(20), Duration::from_micros(300)),
        faults,
    );
    for driver in drivers() {
        for workers in [1, 2] {
            let mut settings = settings(&service, workers, driver);
            settings.futures = true;
            settings.retries = 8;
            let (report, _) =
                job::run(&settings, Arc::new(JobProgress::default())).expect("job runs");
            assert_eq!(report.received, settings.records, "{driver:?} × {workers}");
            assert_eq!((report.missing, report.duplicates), (0, 0));
            assert!(
                report.async_metrics.retried > 0,
                "errors were injected: the futures path retried nothing"
            );
        }
    }
}

/// An iterator source feeds its keys in order; a collecting sink gets every record,
/// each key once, with the value the service holds for it; on one worker in ordered
/// mode they arrive in the iterator's order.
#[test]
fn iterator_source_and_collecting_sink() {
    use std::sync::Mutex;
    let service = server(
        Latency::Uniform(Duration::from_micros(10), Duration::from_micros(300)),
        Faults::default(),
    );
    for workers in [1, 2] {
        let mut settings = settings(&service, workers, DriverKind::Epoll);
        settings.mode = OutputMode::Ordered;
        let per_subtask = 3_000u64;
        settings.records = per_subtask * workers as u64;
        settings.key_iter = Some(Arc::new(move |subtask, _sources| {
            Box::new((0..per_subtask).map(move |i| 1_000_000 * subtask as u64 + i * 7))
                as Box<dyn Iterator<Item = u64>>
        }));
        let collected = Arc::new(Mutex::new(Vec::new()));
        settings.collect = Some(Arc::clone(&collected));
        let (report, _) = job::run(&settings, Arc::new(JobProgress::default())).expect("job runs");
        assert_eq!(
            (report.received, report.missing, report.duplicates),
            (settings.records, 0, 0)
        );
        let records = collected.lock().unwrap();
        assert_eq!(records.len() as u64, settings.records);
        let mut keys: Vec<u64> = records.iter().map(|r| r.key).collect();
        if workers == 1 {
            assert!(
                keys.windows(2).all(|w| w[0] < w[1]),
                "ordered mode on one worker keeps the iterator's order"
            );
        }
        for r in records.iter() {
            assert_eq!(r.value[..8], r.key.to_le_bytes(), "value of key {}", r.key);
        }
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len() as u64, settings.records, "every key once");
    }
}
