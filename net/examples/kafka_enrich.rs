//! A pipeline from a Kafka topic to a Kafka topic, exactly once: orders are read,
//! enriched through the async operator with their user's score from a lookup service,
//! keyed by user for a running total per user (checkpointed keyed state), and written
//! to another topic in a Kafka transaction per checkpoint.
//!
//! ```text
//! kafka source (orders) ─▶ async lookup (user's score) ─▶ key_by(user)
//!     ─▶ running total per user ─▶ kafka sink, exactly once
//! ```
//!
//! With a broker up (`scripts/kafka.sh start` starts one on 127.0.0.1:19092), one
//! command creates two topics of its own, writes the orders, runs the job and checks
//! what it wrote:
//!
//! ```text
//! cargo run --release -p weir-net --example kafka_enrich -- --brokers 127.0.0.1:19092
//! ```
//!
//! The steps also run one at a time, on topics you name, which is how
//! `scripts/kafka-chaos.sh` kills the job with SIGKILL and restarts it:
//!
//! ```text
//! kafka_enrich produce --in orders --out enriched --orders 200000
//! kafka_enrich run     --in orders --out enriched --checkpoints /tmp/chk   (again after a kill)
//! kafka_enrich check   --in orders --out enriched [--commit-log FILE]
//! ```
//!
//! **Input**: each message of `--in` is an order as text, `order,user,cents`, keyed by
//! the user (decimal), so each user's orders lie in one partition, in order. A message
//! that is not three decimal numbers is skipped and counted (`DecodeErrorPolicy::Skip`;
//! `--strict` fails the job naming its topic, partition and offset instead). The source
//! reads every partition to the end it reaches, then the job ends (`bounded`).
//!
//! **Enrichment**: a lookup service started in the process (a stand-in for a remote
//! profile store: `--latency` per answer) is asked for each order's user; the score is
//! the sum of the value's bytes. `--capacity` lookups are in flight per subtask, with a
//! timeout and retries.
//!
//! **Output**: each message of `--out` is `order,user,cents,score,user_total`, keyed by
//! the user, where `user_total` is the user's cents so far, kept per user in keyed state.
//!
//! **Exactly once**: `run` checkpoints every `--interval` into `--checkpoints` and
//! always resumes from the newest completed checkpoint there (a fresh start when there
//! is none): the source's offsets, the running totals, the async operator's calls in
//! flight and the sink's pre-committed transactions are in each checkpoint, and the
//! sink writes each checkpoint's records in one Kafka transaction when the checkpoint
//! completes (see the Kafka chapter of the guide, `guide/src/kafka.md`).
//!
//! **The check** counts only committed transactions: every output message carries a
//! header naming its subtask, checkpoint and attempt, and `run` appends each committed
//! transaction's tag to `--commit-log`. For each subtask and checkpoint, the committed
//! copy is the one the log names, or, where a kill came between the commit and the
//! log's line, the newest attempt's copy (an older attempt's copy of the same
//! checkpoint was aborted, since a restore only sends again what its marker says is not
//! in). The check fails if an order is missing or there twice, if a logged commit is
//! not the newest copy of its checkpoint, if a user's totals are not the running sums
//! of their orders, or if a user's score differs between orders.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_engine::async_io::{AsyncConfig, OutputMode, RetryStrategy};
use weir_engine::checkpoint::AlignmentMode;
use weir_engine::exchange::codec::{Codec, DecodeError, Decoder, Encoder};
use weir_engine::graph::{Checkpointing, Graph, IoHandler, SubtaskInfo};
use weir_engine::runtime::{Cores, Runtime};
use weir_net::kafka::produce::produce;
use weir_net::kafka::{
    DecodeErrorPolicy, KafkaAdmin, KafkaMessage, KafkaOut, KafkaSink, KafkaSinkConfig,
    KafkaSinkStats, KafkaSource, KafkaSourceConfig, KafkaSourceStats, SinkGuarantee,
};
use weir_net::lookup::{
    ClientConfig, ClientIo, Latency, LookupClient, LookupFunction, LookupRequest, LookupServer,
    ServerConfig,
};
use weir_net::DriverKind;

/// The header each output message carries: `{subtask}:{checkpoint}:{attempt}`.
const TAG: &str = "weir-txn";

/// An order as read from the input topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Order {
    order: u64,
    user: u64,
    cents: u64,
}

impl Order {
    /// `order,user,cents`.
    fn parse(message: &KafkaMessage<'_>) -> Result<Order, String> {
        let text = message.payload().unwrap_or_default();
        let text = std::str::from_utf8(text).map_err(|_| "not UTF-8 text".to_string())?;
        let mut fields = text.split(',').map(|f| f.trim().parse::<u64>());
        match (fields.next(), fields.next(), fields.next(), fields.next()) {
            (Some(Ok(order)), Some(Ok(user)), Some(Ok(cents)), None) => {
                Ok(Order { order, user, cents })
            }
            _ => Err(format!("{text:?} is not order,user,cents in decimal")),
        }
    }
}

// Orders cross no exchange, but sit in checkpoints (the async operator's calls in
// flight) encoded.
impl Codec for Order {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        (self.order, self.user, self.cents).encode(out);
    }
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        let (order, user, cents) = <(u64, u64, u64)>::decode(input)?;
        Ok(Order { order, user, cents })
    }
}

/// An order with its user's score.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Scored {
    order: Order,
    score: u64,
}

impl Codec for Scored {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        self.order.encode(out);
        self.score.encode(out);
    }
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        Ok(Scored {
            order: Order::decode(input)?,
            score: u64::decode(input)?,
        })
    }
}

/// The lookup asks for the order's user; the answer's bytes make the score.
impl LookupRequest for Order {
    type Out = Scored;
    fn key(&self) -> u64 {
        self.user
    }
    fn complete(self, value: &[u8]) -> Scored {
        Scored {
            order: self,
            score: value.iter().map(|&b| u64::from(b)).sum(),
        }
    }
}

/// What the job writes: the scored order and the user's running total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Enriched {
    scored: Scored,
    user_total: u64,
}

impl Enriched {
    fn write(&self, out: &mut KafkaOut) {
        let Scored { order, score } = self.scored;
        out.key = Some(order.user.to_string().into_bytes());
        out.payload = format!(
            "{},{},{},{score},{}",
            order.order, order.user, order.cents, self.user_total
        )
        .into_bytes();
    }

    fn read(text: &[u8]) -> Option<Enriched> {
        let text = std::str::from_utf8(text).ok()?;
        let numbers: Vec<u64> = text
            .split(',')
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        let [order, user, cents, score, user_total] = numbers[..] else {
            return None;
        };
        Some(Enriched {
            scored: Scored {
                order: Order { order, user, cents },
                score,
            },
            user_total,
        })
    }
}

/// What to do, and where.
#[derive(Debug, Clone)]
struct Options {
    command: Command,
    brokers: String,
    input: Option<String>,
    output: Option<String>,
    orders: u64,
    users: u64,
    partitions: i32,
    checkpoints: Option<PathBuf>,
    interval: Duration,
    commit_log: Option<PathBuf>,
    capacity: usize,
    latency: Duration,
    strict: bool,
    prefix: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    /// Produce, run, check, on topics of its own.
    All,
    Produce,
    Run,
    Check,
}

const USAGE: &str = "usage: kafka_enrich [produce|run|check] [--brokers HOST:PORT] [--in TOPIC] \
[--out TOPIC] [--orders N] [--users N] [--partitions N] [--checkpoints DIR] [--interval MS] \
[--commit-log FILE] [--capacity N] [--latency-us N] [--transactional-id-prefix P] [--strict]";

impl Options {
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
        let mut options = Options {
            command: Command::All,
            brokers: "127.0.0.1:19092".into(),
            input: None,
            output: None,
            orders: 20_000,
            users: 1_000,
            partitions: 4,
            checkpoints: None,
            interval: Duration::from_millis(200),
            commit_log: None,
            capacity: 64,
            latency: Duration::from_micros(500),
            strict: false,
            prefix: "weir-example".into(),
        };
        let number = |flag: &str, value: Option<String>| -> Result<u64, String> {
            let value = value.ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag} {value:?}: give a whole number\n{USAGE}"))
        };
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "produce" => options.command = Command::Produce,
                "run" => options.command = Command::Run,
                "check" => options.command = Command::Check,
                "--brokers" => options.brokers = args.next().ok_or(USAGE)?,
                "--in" => options.input = Some(args.next().ok_or(USAGE)?),
                "--out" => options.output = Some(args.next().ok_or(USAGE)?),
                "--orders" => options.orders = number(&arg, args.next())?,
                "--users" => options.users = number(&arg, args.next())?.max(1),
                "--partitions" => {
                    options.partitions = i32::try_from(number(&arg, args.next())?.max(1))
                        .map_err(|_| "--partitions: too many")?
                }
                "--checkpoints" => options.checkpoints = Some(args.next().ok_or(USAGE)?.into()),
                "--interval" => {
                    options.interval = Duration::from_millis(number(&arg, args.next())?.max(1))
                }
                "--commit-log" => options.commit_log = Some(args.next().ok_or(USAGE)?.into()),
                "--capacity" => options.capacity = number(&arg, args.next())?.max(1) as usize,
                "--latency-us" => {
                    options.latency = Duration::from_micros(number(&arg, args.next())?)
                }
                "--transactional-id-prefix" => options.prefix = args.next().ok_or(USAGE)?,
                "--strict" => options.strict = true,
                "-h" | "--help" => return Err(USAGE.into()),
                other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
            }
        }
        if options.command != Command::All && (options.input.is_none() || options.output.is_none())
        {
            return Err(format!(
                "produce, run and check need --in and --out\n{USAGE}"
            ));
        }
        Ok(options)
    }

    fn input(&self) -> &str {
        self.input.as_deref().expect("named")
    }

    fn output(&self) -> &str {
        self.output.as_deref().expect("named")
    }
}

/// Creates both topics and writes `orders` orders to the input: order `n` is user
/// `n * 7919 mod users`, `n mod 1000 + 1` cents; every 1000th message is malformed.
fn produce_orders(options: &Options) -> Result<u64, Box<dyn std::error::Error>> {
    let admin = KafkaAdmin::new(&options.brokers, Duration::from_secs(30))?;
    admin.create_topic(options.input(), options.partitions)?;
    admin.create_topic(options.output(), options.partitions)?;
    let users = options.users;
    let report = produce(
        &options.brokers,
        options.input(),
        options.orders + options.orders / 1000,
        Duration::from_secs(60),
        |n, out| {
            // One message in 1001 is not an order: the source skips it.
            if n % 1001 == 1000 {
                out.key = Some(b"junk".to_vec());
                out.payload = b"not an order".to_vec();
                return;
            }
            let order = n - n / 1001;
            let user = order.wrapping_mul(7919) % users;
            out.key = Some(user.to_string().into_bytes());
            out.payload = format!("{order},{user},{}", order % 1000 + 1).into_bytes();
        },
    )?;
    let malformed = options.orders / 1000;
    eprintln!(
        "kafka_enrich: wrote {} orders and {malformed} malformed messages to {:?} in {:.2?}",
        report.delivered - malformed,
        options.input(),
        report.elapsed
    );
    Ok(report.delivered - malformed)
}

/// What a run did.
struct RunSummary {
    read: u64,
    skipped: u64,
    written: u64,
    transactions: u64,
    elapsed: Duration,
}

/// Runs the job to the end of the input, resuming from the newest completed
/// checkpoint in `--checkpoints` if there is one.
fn run_job(options: &Options) -> Result<RunSummary, Box<dyn std::error::Error>> {
    let service = LookupServer::start(ServerConfig {
        latency: Latency::Fixed(options.latency),
        ..ServerConfig::default()
    })?;
    let lookups = ClientConfig {
        addr: service.addr(),
        connections: 1,
        capacity: options.capacity,
        request_timeout: Duration::from_secs(2),
        connect_timeout: ClientConfig::CONNECT_TIMEOUT_DEFAULT,
    };
    let mut source = KafkaSourceConfig::new(options.brokers.clone(), vec![options.input().into()]);
    source.bounded = true;
    source.on_decode_error = if options.strict {
        DecodeErrorPolicy::Fail
    } else {
        DecodeErrorPolicy::Skip
    };
    source.validate()?;
    let mut sink = KafkaSinkConfig::new(options.brokers.clone(), options.output().to_string());
    sink.guarantee = SinkGuarantee::ExactlyOnce;
    sink.transactional_id_prefix = options.prefix.clone();
    sink.checkpoint_header = Some(TAG.into());
    sink.commit_log = options.commit_log.clone();
    sink.validate()?;

    let dir = match &options.checkpoints {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("weir-kafka-enrich-{}", options.output())),
    };
    let checkpointing = Checkpointing::new(&dir, options.interval)
        .with_alignment(AlignmentMode::Aligned)
        .restore_from(&dir);
    let graph = Graph::new()
        .with_parallelism(2)
        .with_checkpointing(checkpointing);
    let source_stats = Arc::new(KafkaSourceStats::default());
    let sink_stats = Arc::new(KafkaSinkStats::default());
    let (read, written) = (Arc::clone(&source_stats), Arc::clone(&sink_stats));
    graph
        .from_source(move |info: &SubtaskInfo| {
            KafkaSource::new(&source, info, Order::parse).with_stats(Arc::clone(&read))
        })
        .name("orders")
        .async_wait_io(
            move |_| {
                let client = Rc::new(RefCell::new(
                    LookupClient::<Order>::new(lookups.clone()).expect("settings checked"),
                ));
                let io: Box<dyn IoHandler> = Box::new(ClientIo(Rc::clone(&client)));
                (LookupFunction::new(client), Some(io))
            },
            AsyncConfig::new(OutputMode::Ordered, options.capacity)
                .with_timeout(Duration::from_secs(5))
                .with_retry(
                    RetryStrategy::fixed_delay(3, Duration::from_millis(50)).retry_on_any_error(),
                ),
        )
        .key_by(|scored: &Scored| scored.order.user)
        .map_with_state(
            |scored: &Scored| scored.order.user,
            |scored: Scored, total: &mut Option<u64>| {
                let user_total = total.unwrap_or(0) + scored.order.cents;
                *total = Some(user_total);
                Enriched { scored, user_total }
            },
        )
        .sink(move |info: &SubtaskInfo| {
            KafkaSink::new(&sink, info, |e: &Enriched, _, out: &mut KafkaOut| {
                e.write(out)
            })
            .with_stats(Arc::clone(&written))
        });
    let runtime = Runtime::builder()
        .cores(Cores::Count(2))
        .pin(false)
        .driver(weir_net::driver_factory(DriverKind::Epoll))
        .build()?;
    let started = Instant::now();
    graph.execute(runtime)?;
    Ok(RunSummary {
        read: source_stats.records.load(Ordering::Relaxed),
        skipped: source_stats.skipped.load(Ordering::Relaxed),
        written: sink_stats.delivered.load(Ordering::Relaxed),
        transactions: sink_stats.transactions_committed.load(Ordering::Relaxed),
        elapsed: started.elapsed(),
    })
}

/// What the output holds, counted by committed transaction.
#[derive(Debug, Default)]
struct Checked {
    orders: u64,
    messages: u64,
    aborted_copies: u64,
    transactions: usize,
    problems: Vec<String>,
}

/// Checks the output against the input (see the module docs).
fn check(options: &Options) -> Result<Checked, Box<dyn std::error::Error>> {
    let admin = KafkaAdmin::new(&options.brokers, Duration::from_secs(60))?;
    let mut inputs: BTreeMap<u64, Order> = BTreeMap::new();
    for message in admin.read_all(options.input())? {
        let view = message.payload.as_deref().unwrap_or_default();
        let text = String::from_utf8_lossy(view);
        let numbers: Option<Vec<u64>> = text.split(',').map(|f| f.parse().ok()).collect();
        if let Some([order, user, cents]) = numbers.as_deref() {
            inputs.insert(
                *order,
                Order {
                    order: *order,
                    user: *user,
                    cents: *cents,
                },
            );
        }
    }
    // The commit log: subtask and checkpoint → the attempt that committed it.
    let mut logged: HashMap<(u64, u64), u64> = HashMap::new();
    let mut checked = Checked::default();
    if let Some(path) = &options.commit_log {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for line in text.lines() {
            let fields: Vec<u64> = line.split(' ').filter_map(|f| f.parse().ok()).collect();
            let [subtask, checkpoint, attempt] = fields[..] else {
                checked
                    .problems
                    .push(format!("commit log line {line:?} is not three numbers"));
                continue;
            };
            if let Some(other) = logged.insert((subtask, checkpoint), attempt) {
                if other != attempt {
                    checked.problems.push(format!(
                        "checkpoint {checkpoint} of subtask {subtask} committed twice, by \
                         attempts {other} and {attempt}"
                    ));
                }
            }
        }
    }
    // Every copy of every transaction in the topic.
    let mut copies: BTreeMap<(u64, u64), BTreeMap<u64, Vec<Enriched>>> = BTreeMap::new();
    for message in admin.read_all(options.output())? {
        checked.messages += 1;
        let tag = message
            .headers
            .iter()
            .find(|(name, _)| name == TAG)
            .and_then(|(_, v)| v.as_deref())
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|t| {
                t.split(':')
                    .map(|f| f.parse::<u64>().ok())
                    .collect::<Option<Vec<_>>>()
            });
        let Some([subtask, checkpoint, attempt]) = tag.as_deref() else {
            checked.problems.push(format!(
                "message at offset {} of partition {} has no {TAG} tag",
                message.offset, message.partition
            ));
            continue;
        };
        let Some(record) = message.payload.as_deref().and_then(Enriched::read) else {
            checked.problems.push(format!(
                "message at offset {} of partition {} is not an enriched order",
                message.offset, message.partition
            ));
            continue;
        };
        copies
            .entry((*subtask, *checkpoint))
            .or_default()
            .entry(*attempt)
            .or_default()
            .push(record);
    }
    let mut outputs: BTreeMap<u64, Vec<Enriched>> = BTreeMap::new();
    for ((subtask, checkpoint), attempts) in &copies {
        let newest = *attempts.keys().next_back().expect("one copy at least");
        let committed = match logged.get(&(*subtask, *checkpoint)) {
            Some(&attempt) if attempt != newest => {
                checked.problems.push(format!(
                    "checkpoint {checkpoint} of subtask {subtask}: attempt {attempt} committed \
                     it and attempt {newest} wrote it again"
                ));
                attempt
            }
            _ => newest,
        };
        checked.transactions += 1;
        for (attempt, records) in attempts {
            if *attempt != committed {
                checked.aborted_copies += records.len() as u64;
                continue;
            }
            for record in records {
                outputs
                    .entry(record.scored.order.order)
                    .or_default()
                    .push(*record);
            }
        }
    }
    let mut per_user: BTreeMap<u64, Vec<Enriched>> = BTreeMap::new();
    for (order, input) in &inputs {
        match outputs.get(order).map(Vec::as_slice) {
            None | Some([]) => checked.problems.push(format!("order {order} is missing")),
            Some([one]) => {
                checked.orders += 1;
                if one.scored.order != *input {
                    checked
                        .problems
                        .push(format!("order {order} came out as {one:?}"));
                }
                per_user.entry(input.user).or_default().push(*one);
            }
            Some(many) => checked
                .problems
                .push(format!("order {order} is there {} times", many.len())),
        }
    }
    for order in outputs.keys().filter(|o| !inputs.contains_key(o)) {
        checked
            .problems
            .push(format!("order {order} was never an input"));
    }
    for (user, records) in &mut per_user {
        // A user's orders lie in one partition in order-id order.
        records.sort_by_key(|r| r.scored.order.order);
        let mut total = 0;
        for record in records.iter() {
            total += record.scored.order.cents;
            if record.user_total != total {
                checked.problems.push(format!(
                    "user {user}: after order {} the total is {}, the orders sum to {total}",
                    record.scored.order.order, record.user_total
                ));
                break;
            }
            if record.scored.score != records[0].scored.score {
                checked.problems.push(format!("user {user}: two scores"));
                break;
            }
        }
    }
    Ok(checked)
}

fn report(checked: &Checked) -> bool {
    eprintln!(
        "kafka_enrich: {} orders exactly once in {} committed transactions ({} messages in the \
         topic, {} of them in aborted copies)",
        checked.orders, checked.transactions, checked.messages, checked.aborted_copies
    );
    for problem in checked.problems.iter().take(20) {
        eprintln!("kafka_enrich: FAILED: {problem}");
    }
    if checked.problems.len() > 20 {
        eprintln!("kafka_enrich: … and {} more", checked.problems.len() - 20);
    }
    checked.problems.is_empty()
}

fn main() {
    let options = match Options::parse(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    let outcome = (|| -> Result<bool, Box<dyn std::error::Error>> {
        let mut options = options.clone();
        if options.command == Command::All {
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            options
                .input
                .get_or_insert(format!("weir-example-orders-{stamp}"));
            options
                .output
                .get_or_insert(format!("weir-example-enriched-{stamp}"));
        }
        if matches!(options.command, Command::All | Command::Produce) {
            produce_orders(&options)?;
        }
        if matches!(options.command, Command::All | Command::Run) {
            let run = run_job(&options)?;
            eprintln!(
                "kafka_enrich: read {} orders (skipped {} malformed), wrote {} in {} \
                 transactions in {:.2?}",
                run.read, run.skipped, run.written, run.transactions, run.elapsed
            );
        }
        if matches!(options.command, Command::All | Command::Check) {
            return Ok(report(&check(&options)?));
        }
        Ok(true)
    })();
    match outcome {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(error) => {
            eprintln!("kafka_enrich: {error}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_parse_and_malformed_ones_are_refused() {
        let good = Enriched {
            scored: Scored {
                order: Order {
                    order: 7,
                    user: 3,
                    cents: 250,
                },
                score: 99,
            },
            user_total: 1000,
        };
        let mut out = KafkaOut::default();
        good.write(&mut out);
        assert_eq!(Enriched::read(&out.payload), Some(good));
        assert_eq!(out.key.as_deref(), Some(&b"3"[..]));
        assert_eq!(Enriched::read(b"1,2,3"), None);
    }

    /// The whole example against the broker the tests use, when there is one.
    #[test]
    fn the_example_writes_every_order_once_with_running_totals() {
        let Some(brokers) = weir_net::kafka::test_brokers("the kafka_enrich example") else {
            return;
        };
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let scratch = std::env::temp_dir().join(format!("weir-kafka-example-{stamp}"));
        let mut options = Options::parse(
            [
                "--brokers",
                &brokers,
                "--orders",
                "3000",
                "--users",
                "50",
                "--interval",
                "50",
            ]
            .map(String::from)
            .into_iter(),
        )
        .expect("options");
        options.input = Some(format!("weir-test-example-in-{stamp}"));
        options.output = Some(format!("weir-test-example-out-{stamp}"));
        options.checkpoints = Some(scratch.join("chk"));
        options.commit_log = Some(scratch.join("commits"));
        options.prefix = format!("weir-test-example-{stamp}");
        std::fs::create_dir_all(&scratch).expect("scratch");
        assert_eq!(produce_orders(&options).expect("produces"), 3000);
        let run = run_job(&options).expect("runs");
        assert_eq!(run.read, 3000);
        assert_eq!(run.skipped, 3);
        assert_eq!(run.written, 3000);
        let checked = check(&options).expect("checks");
        assert!(checked.problems.is_empty(), "{:?}", checked.problems);
        assert_eq!(checked.orders, 3000);
        assert_eq!(checked.aborted_copies, 0);
        // A second run resumes after the end: nothing more is read or written.
        let again = run_job(&options).expect("runs again");
        assert_eq!((again.read, again.transactions), (0, 0));
        let checked = check(&options).expect("checks");
        assert!(checked.problems.is_empty(), "{:?}", checked.problems);
        let _ = std::fs::remove_dir_all(&scratch);
    }
}
