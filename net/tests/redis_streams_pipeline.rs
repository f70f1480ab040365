//! Stream to stream, end to end, against a real server: a job reading two streams,
//! keyed, appending to a stream exactly once, fails mid-run (twice, at pseudo-random
//! records) and restarts from its newest checkpoint; the output holds every input entry
//! exactly once, and each key's entries in their input order.
//!
//! The test finds Redis through `WEIR_REDIS_URL` (`scripts/test.sh` and CI set it);
//! without it, it prints a note and passes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis_protocol::resp2::types::OwnedFrame;
use weir_engine::checkpoint::{AlignmentMode, RestartStrategy};
use weir_engine::graph::{execute_with_restarts, Checkpointing, Graph};
use weir_engine::runtime::{Cores, Runtime};
use weir_net::redis::streams::{
    produce, stream_sink, stream_source, Guarantee, StreamEntry, StreamSinkConfig,
    StreamSourceConfig,
};
use weir_net::redis::{BlockingConnection, RedisUrl};
use weir_net::DriverKind;

fn redis(test: &str) -> Option<RedisUrl> {
    weir_net::redis::test_server_url(test)
}

/// Every entry of `stream` as (field, value) pairs, in order, a page at a time.
fn entries(url: &RedisUrl, stream: &str) -> Vec<HashMap<String, String>> {
    let mut connection = BlockingConnection::connect(url, Duration::from_secs(5)).unwrap();
    let mut all = Vec::new();
    let mut from = "-".to_string();
    let text = |frame: &OwnedFrame| match frame {
        OwnedFrame::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        other => panic!("not a string: {other:?}"),
    };
    loop {
        let OwnedFrame::Array(page) = connection
            .command(&[
                b"XRANGE",
                stream.as_bytes(),
                from.as_bytes(),
                b"+",
                b"COUNT",
                b"1000",
            ])
            .unwrap()
        else {
            panic!("XRANGE answers an array")
        };
        if page.is_empty() {
            return all;
        }
        for entry in &page {
            let OwnedFrame::Array(parts) = entry else {
                panic!("{entry:?}")
            };
            from = format!("({}", text(&parts[0]));
            let OwnedFrame::Array(fields) = &parts[1] else {
                panic!("{parts:?}")
            };
            all.push(
                fields
                    .chunks(2)
                    .map(|kv| (text(&kv[0]), text(&kv[1])))
                    .collect(),
            );
        }
    }
}

#[test]
fn stream_to_stream_exactly_once_across_failures_and_restarts() {
    let Some(url) = redis("stream_to_stream_exactly_once") else {
        return;
    };
    let tag = format!("weir:test:pipeline:{}", std::process::id());
    let inputs = vec![format!("{tag}:in0"), format!("{tag}:in1")];
    let output = format!("{tag}:out");
    let mut cleanup = BlockingConnection::connect(&url, Duration::from_secs(5)).unwrap();
    let mut delete = |keys: &[String]| {
        for key in keys {
            let _ = cleanup.command(&[b"DEL", key.as_bytes()]);
        }
    };
    let markers: Vec<String> = (0..2).map(|i| format!("{output}:committed:{i}")).collect();
    delete(&[inputs.clone(), vec![output.clone()], markers.clone()].concat());
    const PER_STREAM: u64 = 20_000;
    for (s, stream) in inputs.iter().enumerate() {
        produce(&url, stream, PER_STREAM, None, |n, fields| {
            fields
                .push_fmt("n", format_args!("{}", s as u64 * PER_STREAM + n))
                .push_fmt("key", format_args!("{}", n % 97));
        })
        .unwrap();
    }
    let dir = std::env::temp_dir().join(format!("weir-pipeline-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);

    let mut source = StreamSourceConfig::new(url.clone(), inputs.clone());
    source.bounded = true;
    source.count = 500;
    source.addr = Some(source.check().unwrap());
    let mut sink = StreamSinkConfig::new(url.clone(), output.clone());
    sink.guarantee = Guarantee::ExactlyOnce;
    sink.transaction_prefix = format!("{output}:committed");
    // Two failures, each once, at records that depend on the process (seen across the
    // restarts through this counter).
    let seen = Arc::new(AtomicU64::new(0));
    let first = 5_000 + u64::from(std::process::id()) % 5_000;
    let (result, failure, restarts) = execute_with_restarts(
        "fixed-delay:5:10ms".parse::<RestartStrategy>().unwrap(),
        || {
            let graph = Graph::new().with_parallelism(2).with_checkpointing(
                Checkpointing::new(&dir, Duration::from_millis(20))
                    .with_alignment(AlignmentMode::Aligned),
            );
            let (source, sink, seen) = (source.clone(), sink.clone(), Arc::clone(&seen));
            graph
                .from_source_io(move |info| stream_source(&source, info))
                .map(|entry: StreamEntry| {
                    let field = |name: &[u8]| -> u64 {
                        std::str::from_utf8(entry.field(name).expect("the field"))
                            .unwrap()
                            .parse()
                            .unwrap()
                    };
                    (field(b"key"), field(b"n"))
                })
                .key_by(|(key, _): &(u64, u64)| *key)
                .map(move |record| {
                    // 10 µs a record: a run takes some 200 ms, over several checkpoints.
                    let start = std::time::Instant::now();
                    while start.elapsed() < Duration::from_micros(10) {
                        std::hint::spin_loop();
                    }
                    let count = seen.fetch_add(1, Ordering::Relaxed) + 1;
                    if count == first || count == first + 12_000 {
                        panic!("injected failure after {count} records");
                    }
                    record
                })
                .sink_io(move |info| {
                    stream_sink(&sink, info, |(key, n): &(u64, u64), fields| {
                        fields
                            .push_fmt("key", format_args!("{key}"))
                            .push_fmt("n", format_args!("{n}"));
                    })
                });
            let runtime = Runtime::builder()
                .cores(Cores::Count(2))
                .pin(false)
                .driver(weir_net::driver_factory(DriverKind::Epoll))
                .build()?;
            Ok((graph, runtime))
        },
        |_, _, _| {},
    )
    .expect("the job starts");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failure.is_none(), "{failure:?}");
    assert_eq!(restarts, 2, "both injected failures restarted the job");
    for wakeups in &result.run.wakeups {
        // Replies woke the tasks through the driver, not the idle safety net.
        assert_eq!(
            wakeups.rescued, 0,
            "a lost wake-up was rescued: {wakeups:?}"
        );
    }
    assert!(result.checkpoints.and_then(|c| c.restored).is_some());

    let out = entries(&url, &output);
    let mut count = vec![0u32; 2 * PER_STREAM as usize];
    let mut last_of_key: HashMap<(u64, u64), u64> = HashMap::new();
    for entry in &out {
        let n: u64 = entry["n"].parse().unwrap();
        let key: u64 = entry["key"].parse().unwrap();
        count[n as usize] += 1;
        // Within one input stream, a key's entries come out in their input order.
        let stream = n / PER_STREAM;
        if let Some(last) = last_of_key.insert((stream, key), n) {
            assert!(last < n, "key {key}: {n} after {last}");
        }
    }
    let missing = count.iter().filter(|c| **c == 0).count();
    let twice = count.iter().filter(|c| **c > 1).count();
    assert_eq!((missing, twice), (0, 0), "{} entries out", out.len());
    assert_eq!(out.len() as u64, 2 * PER_STREAM);
    delete(&[inputs, vec![output], markers].concat());
}
