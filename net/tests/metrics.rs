//! The metrics endpoint scraped while a job runs: every task appears with Flink's task
//! metrics, the counters grow between scrapes, and each task's second adds up.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_engine::graph::{Graph, LiveCounters};
use weir_engine::runtime::{Cores, Runtime};
use weir_net::metrics::{MetricsServer, MetricsSources};

fn scrape(server: &MetricsServer) -> String {
    let mut stream = TcpStream::connect(server.addr()).expect("connect to the endpoint");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: weir\r\nConnection: close\r\n\r\n")
        .expect("send the request");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read the answer");
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    answer
}

/// The value of the sample `name{labels}` (labels as written, in order).
fn value(text: &str, name: &str, labels: &str) -> Option<f64> {
    let prefix = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map(|v| v.trim().parse().expect("a number"))
}

#[test]
fn a_running_job_serves_its_task_metrics() {
    let live = Arc::new(LiveCounters::default());
    let server = MetricsServer::start("127.0.0.1:0", MetricsSources::new(Arc::clone(&live)))
        .expect("the endpoint starts");
    // 20,000 records/s for about 1.5 s over two sources, through an exchange.
    let graph = Graph::new()
        .with_parallelism(2)
        .with_live(Arc::clone(&live));
    let counted = graph
        .from_generator(30_000, Some(20_000.0), |n| n)
        .map(|n| n * 2)
        .key_by(|n: &u64| *n)
        .name("counter")
        .count();
    let runtime = Runtime::builder()
        .cores(Cores::Count(2))
        .pin(false)
        .build()
        .expect("runtime");
    let run = graph.start(runtime).expect("the job starts");

    // Scrape until the sources have emitted a third of their records.
    let deadline = Instant::now() + Duration::from_secs(30);
    while live.generated.load(Ordering::Relaxed) < 10_000 {
        assert!(Instant::now() < deadline, "the sources emitted too little");
        std::thread::sleep(Duration::from_millis(20));
    }
    let first = scrape(&server);
    std::thread::sleep(Duration::from_millis(300));
    let second = scrape(&server);
    let (result, error) = run.join();
    assert!(error.is_none(), "{error:?}");
    assert_eq!(counted.records(), 30_000);

    for text in [&first, &second] {
        for subtask in ["0", "1"] {
            let generator = format!("stage=\"generator → map\",subtask=\"{subtask}\"");
            let counter = format!("stage=\"counter\",subtask=\"{subtask}\"");
            for labels in [&generator, &counter] {
                let parts: Vec<f64> = [
                    "weir_task_busyTimeMsPerSecond",
                    "weir_task_backPressuredTimeMsPerSecond",
                    "weir_task_idleTimeMsPerSecond",
                ]
                .iter()
                .map(|name| {
                    value(text, name, labels)
                        .unwrap_or_else(|| panic!("{name}{{{labels}}} in\n{text}"))
                })
                .collect();
                let total: f64 = parts.iter().sum();
                assert!(
                    (total - 1000.0).abs() < 1e-6,
                    "{labels}: {parts:?} in\n{text}"
                );
                assert!(
                    parts.iter().all(|p| (0.0..=1000.0).contains(p)),
                    "{parts:?}"
                );
            }
        }
    }
    // The sources' counters grew between the scrapes, and they wrote what they took in.
    let generated = |text: &str| -> f64 {
        ["0", "1"]
            .iter()
            .map(|s| {
                let labels = format!("stage=\"generator → map\",subtask=\"{s}\"");
                value(text, "weir_task_numRecordsIn_total", &labels).expect("records in")
            })
            .sum()
    };
    assert!(generated(&first) >= 10_000.0, "{first}");
    assert!(generated(&second) > generated(&first), "{second}");
    let rate = value(
        &second,
        "weir_task_numRecordsInPerSecond",
        "stage=\"generator → map\",subtask=\"0\"",
    )
    .expect("a rate");
    assert!(rate > 0.0, "{second}");
    let out = value(
        &second,
        "weir_task_numRecordsOut_total",
        "stage=\"generator → map\",subtask=\"0\"",
    )
    .expect("records out");
    assert!(out > 0.0, "{second}");
    // Every task of the job was listed, and none is left unfinished after the run.
    assert_eq!(live.tasks().len(), 4);
    assert!(live
        .tasks()
        .iter()
        .all(|t| t.finished.load(Ordering::Relaxed)));
    drop(result);
}

/// A sink slower than its source fills the exchange: the sink's task shows its input
/// channels full (`inPoolUsage` near 1) and the source's its output pool in use and its
/// time back-pressured; a source's task has no input gate (`inPoolUsage` 0).
#[test]
fn a_slow_sink_shows_in_the_pool_usages_and_back_pressure() {
    struct Slow;
    impl weir_engine::graph::Sink<u64> for Slow {
        fn invoke(
            &mut self,
            _: u64,
            _: Option<i64>,
            _: u64,
        ) -> Result<(), weir_engine::runtime::TaskError> {
            let start = Instant::now();
            while start.elapsed() < Duration::from_micros(20) {
                std::hint::spin_loop();
            }
            Ok(())
        }
    }
    let live = Arc::new(LiveCounters::default());
    let server = MetricsServer::start("127.0.0.1:0", MetricsSources::new(Arc::clone(&live)))
        .expect("the endpoint starts");
    let graph = Graph::new()
        .with_parallelism(1)
        .with_live(Arc::clone(&live));
    graph
        .from_generator(200_000, None, |n| n)
        .rebalance()
        .name("slow")
        .sink(|_| Slow);
    let runtime = Runtime::builder()
        .cores(Cores::Count(2))
        .pin(false)
        .build()
        .expect("runtime");
    let run = graph.start(runtime).expect("the job starts");
    let controller = run.controller();
    let sink = "stage=\"slow\",subtask=\"0\"";
    let source = "stage=\"generator\",subtask=\"0\"";
    // The sink takes 20 µs a record: 200,000 records are 4 s; read once it has begun.
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        assert!(
            Instant::now() < deadline,
            "no scrape showed the sink at work"
        );
        std::thread::sleep(Duration::from_millis(200));
        let text = scrape(&server);
        if value(&text, "weir_task_numRecordsIn_total", sink).unwrap_or(0.0) > 10_000.0 {
            // Rates are over the time since this scrape.
            std::thread::sleep(Duration::from_millis(300));
            break scrape(&server);
        }
    };
    controller.cancel();
    let _ = run.join();
    let in_pool = value(&text, "weir_task_inPoolUsage", sink).expect("the sink's inPoolUsage");
    assert!(
        in_pool > 0.5,
        "the sink's channels should be full: {in_pool}\n{text}"
    );
    let source_in = value(&text, "weir_task_inPoolUsage", source).expect("the source's");
    assert_eq!(source_in, 0.0);
    // Full channels hold segments of published records the sink has not read.
    let in_flight = value(&text, "weir_task_inFlightBytes", sink).expect("inFlightBytes");
    let fullest =
        value(&text, "weir_task_inFlightBytesMaxChannel", sink).expect("the fullest channel");
    assert!(
        in_flight > 32.0 * 1024.0 && fullest == in_flight,
        "one full channel: {in_flight} / {fullest}\n{text}"
    );
    assert_eq!(value(&text, "weir_task_inFlightBytes", source), Some(0.0));
    let out_pool = value(&text, "weir_task_outPoolUsage", source).expect("outPoolUsage");
    assert!(
        out_pool > 0.5,
        "the source's pool should be in use: {out_pool}\n{text}"
    );
    let pressured =
        value(&text, "weir_task_backPressuredTimeMsPerSecond", source).expect("back-pressure");
    assert!(
        pressured > 500.0,
        "the source should wait most of each second: {pressured}"
    );
}
