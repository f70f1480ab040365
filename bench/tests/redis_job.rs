//! The main job with its lookups in Redis (`weir run --store`), end to end on 1 and 2
//! workers with both drivers, against `redis-server`s started here: every record
//! arrives exactly once with its key's value (or none for a missing key), a value
//! bigger than an exchange segment crosses whole, and a server killed and restarted
//! mid-run loses and duplicates nothing while the operator retries.
//!
//! Needs Redis: runs when `WEIR_REDIS_URL` is set (scripts/test.sh and CI set it after
//! `scripts/redis.sh start`), which also says `redis-server` is installed; otherwise
//! each test prints a note and passes.

use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use weir_bench::job::{self, Enriched, JobSettings, RedisStore};
use weir_bench::job::{JobProgress, KeyDistribution};
use weir_engine::async_io::OutputMode;
use weir_engine::runtime::Cores;
use weir_net::redis::{load_keys, value_of, RedisServer, RedisUrl, ServerOptions};
use weir_net::DriverKind;

fn server(test: &str) -> Option<RedisServer> {
    if std::env::var(weir_net::redis::TEST_URL_VAR).is_err() {
        eprintln!("note: {test} skipped: WEIR_REDIS_URL is unset (scripts/test.sh starts Redis with scripts/redis.sh)");
        return None;
    }
    Some(RedisServer::start(ServerOptions::default()).expect("redis-server starts"))
}

fn drivers() -> Vec<DriverKind> {
    match weir_net::build_driver(DriverKind::Uring) {
        Ok(_) => vec![DriverKind::Uring, DriverKind::Epoll],
        Err(_) => vec![DriverKind::Epoll],
    }
}

fn settings(workers: usize, driver: DriverKind, keys: u64) -> JobSettings {
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
        // Not used with Redis as the store.
        service: "127.0.0.1:9".parse().expect("address"),
        connections: 2,
        keys: KeyDistribution::Uniform { keys },
        buffer_timeout: Some(Duration::from_millis(1)),
        futures: false,
        lookup_batch: None,
        key_iter: None,
        collect: Some(Arc::new(Mutex::new(Vec::new()))),
        cluster: None,
        checkpoints: None,
        output: None,
        streams: Default::default(),
        stop: Default::default(),
    }
}

fn store(url: RedisUrl, mget: Option<usize>) -> RedisStore {
    RedisStore {
        url,
        mget,
        stats: Arc::default(),
    }
}

/// Every collected record carries its key's value, or nothing beyond `loaded` keys.
fn check_values(settings: &JobSettings, loaded: u64, value_size: usize) -> (u64, u64) {
    let collected: Vec<Enriched> = std::mem::take(
        &mut *settings
            .collect
            .as_ref()
            .expect("collecting")
            .lock()
            .expect("lock"),
    );
    assert_eq!(collected.len() as u64, settings.records);
    let (mut hits, mut misses) = (0, 0);
    let mut expected = Vec::new();
    for record in &collected {
        if record.key < loaded {
            expected.clear();
            value_of(&mut expected, record.key, value_size);
            assert_eq!(record.value, expected, "key {}", record.key);
            hits += 1;
        } else {
            assert!(record.value.is_empty(), "key {} is missing", record.key);
            misses += 1;
        }
    }
    (hits, misses)
}

#[test]
fn every_record_is_enriched_from_redis_exactly_once() {
    let Some(server) = server("every_record_is_enriched_from_redis_exactly_once") else {
        return;
    };
    load_keys(&server.url(), 1000, 64, job::REDIS_KEY_PREFIX, |_| {}).expect("load");
    for driver in drivers() {
        for workers in [1, 2] {
            for batching in [None, Some(128)] {
                let settings = settings(workers, driver, 1500);
                let store = store(server.url(), batching);
                let (report, _) =
                    job::run_redis(&settings, &store, Arc::new(JobProgress::default()))
                        .expect("job runs");
                assert_eq!((report.missing, report.duplicates), (0, 0));
                assert_eq!(report.received, settings.records);
                let (hits, misses) = check_values(&settings, 1000, 64);
                let stats = store.stats.snapshot();
                assert_eq!((stats.hits, stats.misses), (hits, misses));
                assert!(misses > 0 && hits > 0);
                assert_eq!(stats.failed, 0);
                if batching.is_some() {
                    // The operator's batches went as MGETs: fewer commands than lookups.
                    assert!(stats.batches > 0, "{stats:?}");
                    assert!(stats.commands < stats.calls, "{stats:?}");
                }
            }
        }
    }
}

/// 100 KiB values: bigger than a 32 KiB exchange segment, so each record spans
/// segments on its way to the sink.
#[test]
fn a_value_bigger_than_a_segment_crosses_the_exchange_whole() {
    let Some(server) = server("a_value_bigger_than_a_segment_crosses_the_exchange_whole") else {
        return;
    };
    let size = 100 * 1024 + 7;
    load_keys(&server.url(), 8, size, job::REDIS_KEY_PREFIX, |_| {}).expect("load");
    for driver in drivers() {
        let mut settings = settings(2, driver, 8);
        settings.records = 500;
        let store = store(server.url(), Some(16));
        let (report, _) =
            job::run_redis(&settings, &store, Arc::new(JobProgress::default())).expect("job runs");
        assert_eq!((report.missing, report.duplicates), (0, 0));
        assert_eq!(check_values(&settings, 8, size), (500, 0));
    }
}

/// The server is killed a moment into an open-loop run and restarted from a snapshot
/// 300 ms later: lookups in flight fail, reconnection is refused for a while, and the
/// operator's retries bring every record through, once, with its value.
#[test]
fn a_server_restart_mid_run_loses_and_duplicates_nothing() {
    let Some(mut server) = server("a_server_restart_mid_run_loses_and_duplicates_nothing") else {
        return;
    };
    let url = server.url();
    load_keys(&url, 1000, 32, job::REDIS_KEY_PREFIX, |_| {}).expect("load");
    weir_net::redis::BlockingConnection::connect(&url, Duration::from_secs(5))
        .and_then(|mut c| c.command(&[b"SAVE"]))
        .expect("SAVE");
    let (killed, on_kill) = mpsc::channel();
    let (finished, on_finish) = mpsc::channel::<()>();
    // The server's thread: it must outlive the run (a server dies with the thread that
    // started it).
    let disturber = std::thread::spawn(move || {
        for _ in 0..drivers().len() {
            std::thread::sleep(Duration::from_millis(300));
            server.kill();
            killed.send(()).expect("test waits");
            std::thread::sleep(Duration::from_millis(300));
            server.restart().expect("restart");
            if on_finish.recv().is_err() {
                return;
            }
        }
    });
    for driver in drivers() {
        let mut settings = settings(2, driver, 1000);
        settings.records = 60_000;
        settings.rate = Some(50_000.0);
        settings.retries = 200;
        settings.retry_delay = Duration::from_millis(10);
        settings.timeout = Duration::from_secs(20);
        let store = store(url.clone(), None);
        let (report, _) =
            job::run_redis(&settings, &store, Arc::new(JobProgress::default())).expect("job runs");
        on_kill
            .recv_timeout(Duration::from_secs(5))
            .expect("killed mid-run");
        assert_eq!((report.missing, report.duplicates), (0, 0));
        assert!(report.async_metrics.retried > 0, "lookups were retried");
        assert_eq!(check_values(&settings, 1000, 32), (60_000, 0));
        let stats = store.stats.snapshot();
        assert!(stats.failed > 0 && stats.connects > 2, "{stats:?}");
        finished.send(()).expect("server thread waits");
    }
    disturber.join().expect("server thread");
}
