//! Kafka source → sink: a Weir job (the Kafka source chained to the Kafka sink at least
//! once, two subtasks) against rdkafka's own consumer → producer loop doing the same
//! work (the ceiling for this client: the same parsing and formatting of each record,
//! with no framework between the client's calls), in alternating turns.
//!
//! - **Throughput**: a topic of `records` messages `id,key,t` (4 partitions) read to its
//!   end, each record parsed and written as `id,key,t` keyed by its key to a fresh topic
//!   of 4 partitions; the time from the start to the last delivery acknowledged, and the
//!   CPU of the whole process (librdkafka's threads included) per record.
//! - **Latency**: records written at `rate` per second, each stamped with the wall
//!   clock when it was produced; the pipeline reads them as they come and writes them
//!   on, and a consumer of the output takes each record's age when it reads it: end
//!   to end, producer to consumer, through the broker twice.
//!
//! The peer: one thread per half of the partitions (as Weir's two subtasks), each with a
//! `BaseConsumer` assigned its partitions and a `BaseProducer`, both set as Weir's source
//! and sink set theirs (prefetch, `linger.ms` 5, idempotence), polling the consumer with
//! a timeout and serving delivery reports between messages, as rdkafka's examples do.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError as RdError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::{json, Value};

use crate::compare::{median, process_cpu};
use crate::job::wall_clock_ns;
use weir_engine::graph::{Graph, SubtaskInfo};
use weir_engine::runtime::{Cores, Runtime};
use weir_net::kafka::produce::produce;
use weir_net::kafka::{
    owner_of, KafkaAdmin, KafkaMessage, KafkaOut, KafkaSink, KafkaSinkConfig, KafkaSource,
    KafkaSourceConfig,
};

const PARTITIONS: i32 = 4;
/// Every consumer's `fetch.wait.max.ms` (Weir's source, the loop's, the measuring
/// one): the test broker holds a fetch for the whole wait even when it has records
/// (a Kafka broker answers once `fetch.min.bytes`, 1, are there), so librdkafka's
/// 500 ms default would be most of every latency measured.
const FETCH_WAIT_MS: &str = "10";
const PARALLELISM: usize = 2;

/// One record's fields: `id,key,t`.
type Fields = (u64, u64, u64);

fn parse(payload: &[u8]) -> Option<Fields> {
    let text = std::str::from_utf8(payload).ok()?;
    let mut numbers = text.split(',').map(|f| f.parse::<u64>().ok());
    Some((numbers.next()??, numbers.next()??, numbers.next()??))
}

fn format_into(fields: Fields, key: &mut Vec<u8>, payload: &mut Vec<u8>) {
    use std::io::Write;
    key.clear();
    payload.clear();
    let _ = write!(key, "{}", fields.1);
    let _ = write!(payload, "{},{},{}", fields.0, fields.1, fields.2);
}

fn topic(kind: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "weir-bench-{kind}-{}-{}-{}",
        std::process::id(),
        wall_clock_ns(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Which side runs a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Weir,
    Rdkafka,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Weir => "weir",
            Side::Rdkafka => "rdkafka loop",
        }
    }
}

/// The Weir job: the Kafka source → the Kafka sink at least once, two subtasks.
/// `bounded`: ends at the input's end; else runs until `stop` is set.
fn weir_pipeline(
    brokers: &str,
    input: &str,
    output: &str,
    bounded: bool,
    stop: Arc<AtomicBool>,
) -> Result<(), String> {
    let mut source = KafkaSourceConfig::new(brokers, vec![input.to_string()]);
    source.bounded = bounded;
    source.properties = vec![("fetch.wait.max.ms".into(), FETCH_WAIT_MS.into())];
    let sink = KafkaSinkConfig::new(brokers, output);
    let graph = Graph::new().with_parallelism(PARALLELISM);
    graph
        .from_source(move |info: &SubtaskInfo| {
            KafkaSource::new(&source, info, |m: &KafkaMessage<'_>| {
                parse(m.payload().unwrap_or_default()).ok_or_else(|| "not id,key,t".to_string())
            })
        })
        .sink(move |info: &SubtaskInfo| {
            KafkaSink::new(&sink, info, |fields: &Fields, _, out: &mut KafkaOut| {
                let mut key = Vec::new();
                format_into(*fields, &mut key, &mut out.payload);
                out.key = Some(key);
            })
        });
    let runtime = Runtime::builder()
        .cores(Cores::Count(PARALLELISM))
        .pin(false)
        .build()
        .map_err(|e| e.to_string())?;
    let job = graph.start(runtime).map_err(|e| e.to_string())?;
    if !bounded {
        let controller = job.controller();
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(5));
        }
        controller.cancel();
        let _ = job.join();
        return Ok(());
    }
    let (_, failure) = job.join();
    match failure {
        None => Ok(()),
        Some(failure) => Err(failure.to_string()),
    }
}

/// The peer: a thread per subtask's partitions, each a consumer → producer loop.
fn rdkafka_pipeline(
    brokers: &str,
    input: &str,
    output: &str,
    bounded: bool,
    stop: Arc<AtomicBool>,
) -> Result<(), String> {
    let threads: Vec<_> = (0..PARALLELISM)
        .map(|index| {
            let (brokers, input, output, stop) = (
                brokers.to_string(),
                input.to_string(),
                output.to_string(),
                Arc::clone(&stop),
            );
            std::thread::spawn(move || -> Result<(), String> {
                let consumer: BaseConsumer = ClientConfig::new()
                    .set("bootstrap.servers", &brokers)
                    .set("group.id", format!("weir-bench-peer-{index}"))
                    .set("enable.auto.commit", "false")
                    .set("auto.offset.reset", "earliest")
                    .set("enable.partition.eof", bounded.to_string())
                    .set("queued.max.messages.kbytes", (8 << 10).to_string())
                    .set("queued.min.messages", "10000")
                    .set("fetch.wait.max.ms", FETCH_WAIT_MS)
                    .set("log_level", "3")
                    .create()
                    .map_err(|e| e.to_string())?;
                let mut mine = TopicPartitionList::new();
                let mut owned = 0;
                for p in 0..PARTITIONS {
                    if owner_of(&input, p, PARALLELISM) == index {
                        mine.add_partition_offset(&input, p, Offset::Offset(0))
                            .map_err(|e| e.to_string())?;
                        owned += 1;
                    }
                }
                consumer.assign(&mine).map_err(|e| e.to_string())?;
                let producer: BaseProducer = ClientConfig::new()
                    .set("bootstrap.servers", &brokers)
                    .set("linger.ms", "5")
                    .set("sticky.partitioning.linger.ms", "0")
                    .set("enable.idempotence", "true")
                    .set("partitioner", "murmur2_random")
                    .set("log_level", "3")
                    .create()
                    .map_err(|e| e.to_string())?;
                let (mut key, mut payload) = (Vec::new(), Vec::new());
                let mut ended = 0;
                let mut sent = 0u64;
                while (!bounded || ended != owned) && !stop.load(Ordering::Relaxed) {
                    match consumer.poll(Duration::from_millis(100)) {
                        None => {}
                        Some(Ok(message)) => {
                            let fields = parse(message.payload().unwrap_or_default())
                                .ok_or("not id,key,t")?;
                            format_into(fields, &mut key, &mut payload);
                            loop {
                                let record = BaseRecord::<[u8], [u8]>::to(&output)
                                    .key(key.as_slice())
                                    .payload(payload.as_slice());
                                match producer.send(record) {
                                    Ok(()) => break,
                                    Err((
                                        RdError::MessageProduction(RDKafkaErrorCode::QueueFull),
                                        _,
                                    )) => {
                                        producer.poll(Duration::from_millis(1));
                                    }
                                    Err((e, _)) => return Err(e.to_string()),
                                }
                            }
                            sent += 1;
                            if sent % 256 == 0 {
                                producer.poll(Duration::ZERO);
                            }
                        }
                        Some(Err(RdError::PartitionEOF(_))) => ended += 1,
                        Some(Err(e)) => return Err(e.to_string()),
                    }
                    producer.poll(Duration::ZERO);
                }
                producer
                    .flush(Duration::from_secs(60))
                    .map_err(|e| e.to_string())?;
                Ok(())
            })
        })
        .collect();
    for thread in threads {
        thread
            .join()
            .map_err(|_| "a peer thread panicked".to_string())??;
    }
    Ok(())
}

fn pipeline(
    side: Side,
    brokers: &str,
    input: &str,
    output: &str,
    bounded: bool,
    stop: Arc<AtomicBool>,
) -> Result<(), String> {
    match side {
        Side::Weir => weir_pipeline(brokers, input, output, bounded, stop),
        Side::Rdkafka => rdkafka_pipeline(brokers, input, output, bounded, stop),
    }
}

/// Counts the messages of `topic` and, from `t` in each value, the age when read.
fn consume_latency(
    brokers: &str,
    topic: &str,
    count: u64,
    deadline: Duration,
) -> Result<Histogram<u64>, String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "weir-bench-latency")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", FETCH_WAIT_MS)
        .set("log_level", "3")
        .create()
        .map_err(|e| e.to_string())?;
    let mut all = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        all.add_partition_offset(topic, p, Offset::Offset(0))
            .map_err(|e| e.to_string())?;
    }
    consumer.assign(&all).map_err(|e| e.to_string())?;
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("bounds");
    let started = Instant::now();
    let mut seen = 0;
    while seen < count {
        if started.elapsed() > deadline {
            return Err(format!(
                "{seen} of {count} records reached the output in {deadline:?}"
            ));
        }
        if let Some(Ok(message)) = consumer.poll(Duration::from_millis(50)) {
            let now = wall_clock_ns();
            if let Some((_, _, t)) = parse(message.payload().unwrap_or_default()) {
                histogram.saturating_record((now.saturating_sub(t) / 1000).max(1));
                seen += 1;
            }
        }
    }
    Ok(histogram)
}

/// One throughput turn: seconds and CPU seconds to read `input` to its end into a fresh
/// topic.
fn throughput_turn(side: Side, brokers: &str, input: &str) -> Result<(f64, f64), String> {
    let admin = KafkaAdmin::new(brokers, Duration::from_secs(30)).map_err(|e| e.to_string())?;
    let output = topic("out");
    admin
        .create_topic(&output, PARTITIONS)
        .map_err(|e| e.to_string())?;
    let cpu = process_cpu();
    let started = Instant::now();
    pipeline(side, brokers, input, &output, true, Arc::default())?;
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = (process_cpu() - cpu).as_secs_f64();
    let _ = admin.delete_topic(&output);
    Ok((elapsed, cpu))
}

/// One latency turn: p50 and p99 in µs at `rate` for `records`.
fn latency_turn(side: Side, brokers: &str, records: u64, rate: f64) -> Result<(u64, u64), String> {
    let admin = KafkaAdmin::new(brokers, Duration::from_secs(30)).map_err(|e| e.to_string())?;
    let (input, output) = (topic("lat-in"), topic("lat-out"));
    admin
        .create_topic(&input, PARTITIONS)
        .map_err(|e| e.to_string())?;
    admin
        .create_topic(&output, PARTITIONS)
        .map_err(|e| e.to_string())?;
    let stop = Arc::new(AtomicBool::new(false));
    let running = {
        let (brokers, input, output, stop) = (
            brokers.to_string(),
            input.clone(),
            output.clone(),
            Arc::clone(&stop),
        );
        std::thread::spawn(move || pipeline(side, &brokers, &input, &output, false, stop))
    };
    let writer = {
        let (brokers, input) = (brokers.to_string(), input.clone());
        std::thread::spawn(move || {
            let started = Instant::now();
            produce(
                &brokers,
                &input,
                records,
                Duration::from_secs(60),
                |n, out| {
                    let due = Duration::from_secs_f64(n as f64 / rate);
                    if let Some(wait) = due.checked_sub(started.elapsed()) {
                        std::thread::sleep(wait);
                    }
                    let key = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 100_000;
                    out.key = Some(key.to_string().into_bytes());
                    format_into((n, key, wall_clock_ns()), &mut Vec::new(), &mut out.payload);
                },
            )
            .map_err(|e| e.to_string())
        })
    };
    let deadline = Duration::from_secs_f64(records as f64 / rate + 60.0);
    let histogram = consume_latency(brokers, &output, records, deadline);
    stop.store(true, Ordering::Relaxed);
    let produced = writer
        .join()
        .map_err(|_| "the writer panicked".to_string())?;
    let ran = running
        .join()
        .map_err(|_| "the pipeline panicked".to_string())?;
    produced?;
    ran?;
    let histogram = histogram?;
    let _ = admin.delete_topic(&input);
    let _ = admin.delete_topic(&output);
    Ok((
        histogram.value_at_quantile(0.5),
        histogram.value_at_quantile(0.99),
    ))
}

/// Runs the comparison: `rounds` of each side's throughput turn and latency turn, in
/// alternating order.
pub fn run(
    brokers: &str,
    records: u64,
    latency_records: u64,
    rate: f64,
    rounds: usize,
    log: impl Fn(&str),
) -> Result<Value, String> {
    let admin = KafkaAdmin::new(brokers, Duration::from_secs(30)).map_err(|e| e.to_string())?;
    let input = topic("in");
    admin
        .create_topic(&input, PARTITIONS)
        .map_err(|e| e.to_string())?;
    let written = produce(
        brokers,
        &input,
        records,
        Duration::from_secs(120),
        |n, out| {
            let key = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 100_000;
            out.key = Some(key.to_string().into_bytes());
            format_into((n, key, wall_clock_ns()), &mut Vec::new(), &mut out.payload);
        },
    )
    .map_err(|e| e.to_string())?;
    log(&format!("wrote {} records to {input}", written.delivered));
    let sides = [Side::Weir, Side::Rdkafka];
    let mut rows = Vec::new();
    // Per side: the rounds' figures, four series.
    type Series = (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>);
    let mut results: Vec<Series> = vec![Default::default(); sides.len()];
    for round in 0..rounds {
        for (i, side) in sides.iter().enumerate() {
            // Alternate which side goes first.
            let side = if round % 2 == 0 {
                *side
            } else {
                sides[sides.len() - 1 - i]
            };
            let slot = sides.iter().position(|s| *s == side).expect("a side");
            let (seconds, cpu) = throughput_turn(side, brokers, &input)?;
            let (p50, p99) = latency_turn(side, brokers, latency_records, rate)?;
            log(&format!(
                "round {round} {}: {:.0} records/s, {:.2} µs CPU a record; p50 {p50} µs, p99 {p99} µs",
                side.name(),
                records as f64 / seconds,
                cpu * 1e6 / records as f64
            ));
            let r = &mut results[slot];
            r.0.push(records as f64 / seconds);
            r.1.push(cpu * 1e6 / records as f64);
            r.2.push(p50 as f64);
            r.3.push(p99 as f64);
        }
    }
    let _ = admin.delete_topic(&input);
    for (side, (rate_, cpu, p50, p99)) in sides.iter().zip(results) {
        rows.push(json!({
            "side": side.name(),
            "records_per_s": median(&rate_),
            "cpu_us_per_record": median(&cpu),
            "p50_us": median(&p50),
            "p99_us": median(&p99),
        }));
    }
    Ok(json!({
        "command": format!(
            "weir kafka-bench --records {records} --latency-records {latency_records} --rate {rate} --rounds {rounds}"
        ),
        "records": records,
        "latency_records": latency_records,
        "rate": rate,
        "rounds": rounds,
        "partitions": PARTITIONS,
        "rows": rows,
    }))
}

/// The figures as a markdown table, with Weir ÷ the loop.
pub fn render(value: &Value) -> String {
    let rows = value["rows"].as_array().cloned().unwrap_or_default();
    let get = |side: &str, field: &str| {
        rows.iter()
            .find(|r| r["side"] == side)
            .and_then(|r| r[field].as_f64())
            .unwrap_or(0.0)
    };
    let mut md = String::from(
        "\n| pipeline | throughput (records/s) | CPU per record | p50 end to end | p99 end to end |\n|---|---|---|---|---|\n",
    );
    for side in ["weir", "rdkafka loop"] {
        md.push_str(&format!(
            "| {side} | {:.0} | {:.2} µs | {:.1} ms | {:.1} ms |\n",
            get(side, "records_per_s"),
            get(side, "cpu_us_per_record"),
            get(side, "p50_us") / 1000.0,
            get(side, "p99_us") / 1000.0,
        ));
    }
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    md.push_str(&format!(
        "\nWeir ÷ the loop: throughput {:.2}×, CPU per record {:.2}×, p50 {:.2}×, p99 {:.2}×.\n",
        ratio(
            get("weir", "records_per_s"),
            get("rdkafka loop", "records_per_s")
        ),
        ratio(
            get("weir", "cpu_us_per_record"),
            get("rdkafka loop", "cpu_us_per_record")
        ),
        ratio(get("weir", "p50_us"), get("rdkafka loop", "p50_us")),
        ratio(get("weir", "p99_us"), get("rdkafka loop", "p99_us")),
    ));
    md
}
