//! `weir run`: the main job, its settings checked before anything starts, its table and
//! JSON.

use crate::*;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use weir_bench::job;
use weir_bench::job::{JobProgress, KeyDistribution};
use weir_bench::job::{RunError, WorkerPlan};
use weir_engine::async_io::OutputMode;
use weir_engine::checkpoint::AlignmentMode;
use weir_net::kafka::{
    KafkaAdmin, KafkaSinkConfig, KafkaSinkStats, KafkaSourceConfig, KafkaSourceStats, KafkaUrl,
    SinkGuarantee as KafkaGuarantee, StartOffsets,
};
use weir_net::lookup::{Faults, LookupServer, ServerConfig};
use weir_net::redis::streams::{
    ConsumerGroup, Guarantee, StartFrom, StreamSinkConfig, StreamSourceConfig, StreamUrl,
};

/// `--source` and `--sink` as the job's stream settings, checked, and the server asked
/// for a `PING` so that one not running is an error now, not a job that waits on it.
pub(crate) fn stream_io(args: &RunArgs) -> Result<job::StreamIo, RunError> {
    let reachable = |what: &str, url: &StreamUrl| -> Result<(), RunError> {
        weir_net::redis::BlockingConnection::connect(&url.redis, Duration::from_secs(2))
            .and_then(|mut c| c.command(&[b"PING"]))
            .map(|_| ())
            .map_err(|e| {
                RunError::Setting(format!(
                    "{what} {url}: {e} (is Redis running there? `scripts/redis.sh start` starts \
                     one on 127.0.0.1:6399)"
                ))
            })
    };
    let source = match args.source.as_ref().and_then(Endpoint::redis) {
        Some(url) => {
            let mut config = StreamSourceConfig::new(url.redis.clone(), url.streams.clone());
            config.bounded = args.bounded;
            config.start = args.source_start;
            config.idle_timeout = args.source_idle_timeout;
            if let Some(text) = &args.consumer_group {
                let (group, consumer) = text.split_once(':').unwrap_or((text, "weir"));
                if group.is_empty() || consumer.is_empty() {
                    return Err(RunError::Setting(format!(
                        "--consumer-group {text:?}: write GROUP or GROUP:CONSUMER, both non-empty"
                    )));
                }
                config.group = Some(ConsumerGroup {
                    group: group.into(),
                    consumer: consumer.into(),
                    create_group: true,
                });
            }
            config.stats = Some(Arc::default());
            let addr = config
                .check()
                .map_err(|e| RunError::Setting(format!("--source {url}: {e}")))?;
            config.addr = Some(addr);
            reachable("--source", url)?;
            Some(config)
        }
        None => None,
    };
    let sink = match args.sink.as_ref().and_then(Endpoint::redis) {
        Some(url) => {
            let [stream] = url.streams.as_slice() else {
                return Err(RunError::Setting(format!(
                    "--sink {url}: name one stream to append to"
                )));
            };
            let mut config = StreamSinkConfig::new(url.redis.clone(), stream.clone());
            config.maxlen = args.sink_maxlen;
            config.guarantee = if sink_exactly_once(args)? {
                Guarantee::ExactlyOnce
            } else {
                Guarantee::AtLeastOnce
            };
            config
                .check()
                .map_err(|e| RunError::Setting(format!("--sink {url}: {e}")))?;
            reachable("--sink", url)?;
            Some(config)
        }
        None => None,
    };
    let (kafka_source, kafka_sink) = kafka_io(args)?;
    Ok(job::StreamIo {
        source,
        sink,
        kafka_source,
        kafka_sink,
    })
}

/// Whether `--sink-guarantee` asks for exactly once, which commits at checkpoints and is
/// refused without them.
fn sink_exactly_once(args: &RunArgs) -> Result<bool, RunError> {
    match args.sink_guarantee {
        SinkGuarantee::AtLeastOnce => Ok(false),
        SinkGuarantee::ExactlyOnce if args.checkpoint_interval.is_none() => Err(RunError::Setting(
            "--sink-guarantee exactly-once commits each checkpoint's records when it \
                 completes: add --checkpoint-interval and --checkpoint-dir"
                .into(),
        )),
        SinkGuarantee::ExactlyOnce => Ok(true),
    }
}

/// `--source kafka://…` and `--sink kafka://…` as the job's Kafka settings, checked, and
/// the brokers asked for the topics, so that a wrong address or a missing input topic
/// is an error now; a missing output topic is created.
#[allow(clippy::type_complexity)]
fn kafka_io(
    args: &RunArgs,
) -> Result<
    (
        Option<(KafkaSourceConfig, Arc<KafkaSourceStats>)>,
        Option<(KafkaSinkConfig, Arc<KafkaSinkStats>)>,
    ),
    RunError,
> {
    let unreachable = |what: &str, url: &KafkaUrl, e: weir_net::kafka::KafkaError| {
        RunError::Setting(format!(
            "{what} {url}: {e} (is a broker running there? `scripts/kafka.sh start` starts one \
             on 127.0.0.1:19092)"
        ))
    };
    let admin = |what: &str, url: &KafkaUrl| {
        KafkaAdmin::new(&url.bootstrap(), Duration::from_secs(10))
            .map_err(|e| unreachable(what, url, e))
    };
    let source = match args.source.as_ref().and_then(Endpoint::kafka) {
        Some(url) => {
            let mut config = KafkaSourceConfig::new(url.bootstrap(), url.topics.clone());
            config.bounded = args.bounded;
            config.start = match args.source_start {
                StartFrom::Beginning => StartOffsets::Earliest,
                StartFrom::Latest => StartOffsets::Latest,
                StartFrom::Id(id) => {
                    return Err(RunError::Setting(format!(
                        "--source-start {id}: an entry id is a Redis stream's position; for \
                         Kafka write beginning or latest"
                    )))
                }
            };
            config.idle_timeout = args.source_idle_timeout;
            config.group_id = args.consumer_group.as_ref().map(|text| {
                text.split_once(':')
                    .map_or(text.as_str(), |(g, _)| g)
                    .to_string()
            });
            config
                .validate()
                .map_err(|e| RunError::Setting(format!("--source {url}: {e}")))?;
            let admin = admin("--source", url)?;
            for topic in &url.topics {
                match admin.partitions(topic) {
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        return Err(RunError::Setting(format!(
                            "--source {url}: the broker has no topic {topic:?} (`weir \
                             produce-kafka kafka://{}/{topic}` writes test records to one)",
                            url.bootstrap()
                        )))
                    }
                    Err(e) => return Err(unreachable("--source", url, e)),
                }
            }
            Some((config, Arc::default()))
        }
        None => None,
    };
    let sink = match args.sink.as_ref().and_then(Endpoint::kafka) {
        Some(url) => {
            let [topic] = url.topics.as_slice() else {
                return Err(RunError::Setting(format!(
                    "--sink {url}: name one topic to write"
                )));
            };
            let mut config = KafkaSinkConfig::new(url.bootstrap(), topic.clone());
            config.guarantee = if sink_exactly_once(args)? {
                KafkaGuarantee::ExactlyOnce
            } else {
                KafkaGuarantee::AtLeastOnce
            };
            config.transactional_id_prefix = args.transactional_id_prefix.clone();
            if args.sink_maxlen.is_some() {
                return Err(RunError::Setting(
                    "--sink-maxlen trims a Redis stream; a Kafka topic keeps what its retention \
                     settings keep"
                        .into(),
                ));
            }
            config
                .validate()
                .map_err(|e| RunError::Setting(format!("--sink {url}: {e}")))?;
            let admin = admin("--sink", url)?;
            if admin
                .create_topic(topic, 4)
                .map_err(|e| unreachable("--sink", url, e))?
            {
                eprintln!("weir run: created topic {topic:?} (4 partitions) for --sink");
            }
            Some((config, Arc::default()))
        }
        None => None,
    };
    Ok((source, sink))
}

pub(crate) fn run_job(args: RunArgs) -> i32 {
    match run_main_job(&args) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error}");
            error.exit_code()
        }
    }
}

/// `weir run`: every setting is checked, and the JSON path opened, before anything
/// sizeable is allocated or started.
pub(crate) fn run_main_job(args: &RunArgs) -> Result<i32, RunError> {
    let cluster = match (&args.process, &args.peers) {
        (Some(process), Some(peers)) => {
            if args.processes > 1 {
                return Err(RunError::Setting(
                    "--processes starts local processes itself; with --process and --peers \
                     this process is one of a cluster started elsewhere: give one or the other"
                        .into(),
                ));
            }
            if *process >= peers.len() {
                return Err(RunError::Setting(format!(
                    "--process {process} with {} peers: the index must be below the number of \
                     --peers (process 0 is the first address)",
                    peers.len()
                )));
            }
            let secret = match &args.secret_file {
                Some(path) => Some(
                    weir_net::transport::Secret::from_file(path)
                        .map_err(|e| RunError::Setting(e.to_string()))?,
                ),
                None => None,
            };
            Some(job::ClusterSettings {
                process: *process,
                peers: peers.clone(),
                secret,
            })
        }
        _ => None,
    };
    // Where the run starts, checked before anything starts: a newest completed
    // checkpoint that cannot be read, or a fresh start over committed output, is
    // refused here by name (every process, and the launcher, check the same).
    if args.restore_fallback && (args.processes > 1 || args.process.is_some()) {
        return Err(RunError::Setting(
            "--restore-fallback runs in one process: over several, every process would \
             have to fall back to the same older checkpoint; restore one by naming its \
             chk-<id> directory with --restore instead"
                .into(),
        ));
    }
    let restore = job::resolve_restore(&job::RestoreRequest {
        restore: args.restore.as_deref(),
        resume: args
            .resume
            .then_some(args.checkpoint_dir.as_deref())
            .flatten(),
        fallback: args.restore_fallback,
    })?;
    if args.output.is_some() || restore.is_some() {
        job::check_start_at(restore.as_deref(), args.output.as_deref())?;
    }
    if args.processes > 1 && (args.source.is_some() || args.sink.is_some()) {
        return Err(RunError::Setting(
            "--source and --sink run in one process: the launcher of --processes neither \
             counts records read from streams nor forwards Ctrl-C's drain to its processes; \
             drop --processes (or start each process with --process and --peers)"
                .into(),
        ));
    }
    if args.processes > 1 && args.metrics_addr.is_some() {
        return Err(RunError::Setting(
            "--metrics-addr with --processes: every process would bind the same address; \
             start each process with --process, --peers and an address of its own"
                .into(),
        ));
    }
    if args.processes > 1 {
        let launch = weir_bench::cluster::Launch {
            processes: args.processes as usize,
            cores: args.cores.as_deref(),
            records: args.records,
            capacity: args.capacity as usize,
            mean_latency: match &args.store {
                Some(_) => Duration::ZERO,
                None => args.latency.mean(),
            },
            json: args.json.as_deref(),
            secret_file: args.secret_file.as_deref(),
            restart: args
                .checkpoint_dir
                .as_deref()
                .map(|dir| (args.restart_strategy.clone(), dir)),
            output: args.output.as_deref(),
        };
        if let Some(path) = &args.json {
            open_json(path)?;
        }
        let run_args: Vec<String> = std::env::args()
            .skip_while(|a| a != "run")
            .skip(1)
            .collect();
        return weir_bench::cluster::launch(&launch, &run_args);
    }
    let driver = match args.driver {
        Some(kind) => kind,
        None => weir_net::driver::kind_from_env()
            .map_err(|error| RunError::Setting(format!("WEIR_DRIVER: {error}")))?,
    };
    let plan = WorkerPlan::new(args.cores.as_deref(), args.oversubscribe)?;
    if let Some(rate) = args.rate {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(RunError::Setting(
                "--rate must be a positive number of records per second".into(),
            ));
        }
    }
    if !(0.0..=1.0).contains(&args.skew) {
        return Err(RunError::Setting("--skew must be in 0..=1".into()));
    }
    if args.store.is_none() && args.mget > 0 {
        return Err(RunError::Setting(
            "--mget batches Redis lookups; use it with --store".into(),
        ));
    }
    if args.store.is_some() && args.lookup_batch > 0 {
        return Err(RunError::Setting(
            "--lookup-batch batches the lookup service's requests; with --store use --mget".into(),
        ));
    }
    if args.lookup_batch > 0 {
        let len = weir_net::lookup::protocol::batch_response_len(
            args.lookup_batch as usize,
            args.value_size,
        );
        if len > weir_net::lookup::protocol::RESPONSE_LEN_MAX {
            return Err(RunError::Setting(format!(
                "--lookup-batch {} of --value-size {} values needs {len}-byte responses, over \
                 the protocol's {} bytes; lower one of them",
                args.lookup_batch,
                args.value_size,
                weir_net::lookup::protocol::RESPONSE_LEN_MAX
            )));
        }
    }
    if args.futures && args.lookup_batch > 0 {
        return Err(RunError::Setting(
            "--lookup-batch and --futures are two ways to write the lookup; pick one".into(),
        ));
    }
    if args.store.is_some() && args.futures {
        return Err(RunError::Setting(
            "--futures applies to the lookup service; drop it with --store".into(),
        ));
    }
    if args.store.is_some() && args.lookup_addr.is_some() {
        return Err(RunError::Setting(
            "--lookup-addr and --store both say where the lookups go; give one of them".into(),
        ));
    }
    // Read again when the job starts; checked here so that a bad value stops the run
    // before anything starts.
    job::spin_from_env().map_err(RunError::Setting)?;
    let streams = stream_io(args)?;
    let records = if streams.reads_input() {
        0
    } else {
        args.records
    };
    job::check_memory(plan.workers(), records, args.capacity as usize)?;
    let mut json = match &args.json {
        Some(path) => Some(open_json(path)?),
        None => None,
    };
    let redis = args.store.as_ref().map(|url| job::RedisStore {
        url: (**url).clone(),
        mget: (args.mget > 0).then_some(args.mget),
        stats: Arc::default(),
    });
    let progress = Arc::new(JobProgress::default());
    let checkpoint_gauges = Arc::new(weir_net::metrics::CheckpointGauges::default());
    let _metrics = match &args.metrics_addr {
        Some(addr) => {
            let mut sources = weir_net::metrics::MetricsSources::new(Arc::clone(&progress));
            if let Some(store) = &redis {
                sources
                    .redis
                    .push(("lookup".to_string(), Arc::clone(&store.stats)));
            }
            if args.checkpoint_interval.is_some() {
                sources.checkpoints = Some(Arc::clone(&checkpoint_gauges));
            }
            if let Some(stats) = streams.source.as_ref().and_then(|c| c.stats.clone()) {
                sources.stream_sources.push(("source".to_string(), stats));
            }
            if let Some(config) = &streams.sink {
                sources
                    .stream_sinks
                    .push(("sink".to_string(), Arc::clone(&config.stats)));
            }
            if let Some((_, stats)) = &streams.kafka_source {
                let stats = Arc::clone(stats);
                sources
                    .extra
                    .push(Box::new(move |registry| stats.register("source", registry)));
            }
            if let Some((_, stats)) = &streams.kafka_sink {
                let stats = Arc::clone(stats);
                sources
                    .extra
                    .push(Box::new(move |registry| stats.register("sink", registry)));
            }
            let server = weir_net::metrics::MetricsServer::start(addr, sources)
                .map_err(|e| RunError::Setting(e.to_string()))?;
            eprintln!("weir run: metrics at http://{}/metrics", server.addr());
            Some(server)
        }
        None => None,
    };
    // The embedded service gets a core of its own when the workers leave one free.
    let service_core = match (args.lookup_addr, args.no_pin) {
        (None, false) => plan.free_core(),
        _ => None,
    };
    let server = match args.lookup_addr.or(redis.as_ref().map(|_| UNUSED_SERVICE)) {
        Some(_) => None,
        None => {
            let config = ServerConfig {
                latency: args.latency,
                value_size: args.value_size,
                faults: Faults {
                    error_rate: args.error_rate,
                    ..Faults::default()
                },
                core: service_core,
                slack: args.service_timer_slack,
                ..ServerConfig::default()
            };
            Some(LookupServer::start(config).map_err(RunError::Service)?)
        }
    };
    let service = match (&server, args.lookup_addr) {
        (Some(server), _) => server.addr(),
        (None, Some(addr)) => addr,
        (None, None) => UNUSED_SERVICE,
    };
    let keys = if let KeyDraw::Zipf(exponent) = args.key_distribution {
        KeyDistribution::Zipf(job::Zipf::new(args.keys, exponent).map_err(RunError::Setting)?)
    } else if args.skew > 0.0 {
        KeyDistribution::Skewed {
            keys: args.keys,
            hot_keys: (args.keys / 100).max(1),
            hot_fraction: args.skew,
        }
    } else {
        KeyDistribution::Uniform { keys: args.keys }
    };
    let settings = job::JobSettings {
        records,
        rate: args.rate,
        mode: match args.mode {
            Mode::Ordered => OutputMode::Ordered,
            Mode::Unordered => OutputMode::Unordered,
            Mode::Keyed => OutputMode::KeyedOrdered,
        },
        capacity: args.capacity as usize,
        timeout: args.timeout,
        retries: args.retries,
        retry_delay: args.retry_delay,
        cores: plan.cores.clone(),
        pin: !args.no_pin,
        driver,
        timer_slack: args.timer_slack,
        service,
        connections: args.connections as usize,
        keys,
        buffer_timeout: Some(args.buffer_timeout),
        futures: args.futures,
        lookup_batch: (args.lookup_batch > 0).then_some(args.lookup_batch as usize),
        key_iter: None,
        collect: None,
        cluster,
        checkpoints: args
            .checkpoint_interval
            .map(|interval| job::JobCheckpoints {
                interval,
                dir: args
                    .checkpoint_dir
                    .clone()
                    .expect("clap requires --checkpoint-dir"),
                alignment: match (args.unaligned, args.aligned_timeout) {
                    (true, _) => AlignmentMode::Unaligned,
                    (false, Some(timeout)) => AlignmentMode::AlignedWithTimeout(timeout),
                    (false, None) => AlignmentMode::Aligned,
                },
                restore: restore.clone(),
                retain: args.checkpoints_retained as usize,
                restart: args.restart_strategy.clone(),
                gauges: Some(Arc::clone(&checkpoint_gauges)),
            }),
        output: args.output.clone(),
        streams,
        stop: job::JobStop::default(),
    };
    if settings.cluster.is_none() {
        // Ctrl-C stops the job with drain (how a run over unbounded streams ends); a
        // second one quits at once.
        let stop = settings.stop.clone();
        let _ = ctrlc::set_handler(move || {
            if stop.requested() {
                std::process::exit(130);
            }
            eprintln!(
                "\nweir run: stopping: the sources end and what they read drains (Ctrl-C again \
                 quits at once)"
            );
            stop.stop();
        });
    }
    let service_core = server.as_ref().and_then(|s| s.core());
    let service_place = match &server {
        None => "external".to_string(),
        Some(server) => match server.core() {
            Some(core) => format!("core {core} (own)"),
            None if args.no_pin => "unpinned, shared with workers".to_string(),
            None => "shared with workers".to_string(),
        },
    };
    eprintln!(
        "weir run: {}, {} mode, capacity {}, {}timeout {}",
        match (&args.source, args.bounded) {
            (Some(url), true) => format!("records from {url} up to its entries at start"),
            (Some(url), false) => format!("records from {url} until Ctrl-C"),
            (None, _) => format!("{} records", settings.records),
        },
        job::mode_name(settings.mode),
        settings.capacity,
        match &redis {
            Some(_) => String::new(),
            None => format!("latency {}, ", args.latency),
        },
        settings.timeout_text(),
    );
    if let Some(cache) = &args.cache {
        eprintln!("weir run: a lookup cache per async subtask (not checkpointed): {cache:?}");
    }
    let lookups = match &redis {
        Some(store) => format!(
            "lookups in Redis at {} ({}), keys {}<key>",
            store.url,
            match store.mget {
                None => "GETs, plain pipelining".to_string(),
                Some(max_keys) => format!("GETs batched into MGETs of up to {max_keys}"),
            },
            job::REDIS_KEY_PREFIX
        ),
        None => format!(
            "lookup service {service} ({}){}",
            match server.as_ref().map(|s| s.core()) {
                None => "external".to_string(),
                Some(Some(core)) => format!("embedded, on its own core {core}"),
                Some(None) => "embedded, sharing the workers' cores".to_string(),
            },
            match args.lookup_batch {
                0 => String::new(),
                max => format!(", batch requests of up to {max} keys"),
            }
        ),
    };
    eprintln!(
        "weir run: {} {}, {lookups}",
        job::workers_text(plan.workers()),
        match (args.no_pin, plan.workers()) {
            (true, _) => "unpinned".to_string(),
            (false, 1) => format!("on core {}", job::cores_text(&plan.placement)),
            (false, _) => format!("on cores {}", job::cores_text(&plan.placement)),
        },
    );
    let cpu_start = weir_bench::compare::process_cpu();
    let handle = {
        let settings = settings.clone();
        let progress = Arc::clone(&progress);
        let redis = redis.clone();
        let cache = args.cache;
        std::thread::spawn(move || match &redis {
            Some(store) => job::run_redis_to_end_cached(&settings, cache, store, progress),
            None => job::run_to_end_cached(&settings, cache, progress),
        })
    };
    let bar = if args.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        let (bar, template) = match settings.streams.reads_input() {
            true => (
                indicatif::ProgressBar::no_length(),
                "{pos} records  {rate}  in flight {msg}  [{elapsed_precise}]",
            ),
            false => (
                indicatif::ProgressBar::new(settings.records),
                "{bar:40} {pos}/{len} records  {rate}  in flight {msg}  [{elapsed_precise}]",
            ),
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template(template)
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .with_key(
                    "rate",
                    |state: &indicatif::ProgressState, out: &mut dyn std::fmt::Write| {
                        let _ = write!(out, "{:.0} records/s", state.per_sec());
                    },
                ),
        );
        bar
    };
    while !handle.is_finished() {
        bar.set_position(progress.received.load(Ordering::Relaxed));
        bar.set_message(progress.in_flight.load(Ordering::Relaxed).to_string());
        std::thread::sleep(Duration::from_millis(100));
    }
    bar.finish_and_clear();
    let result = handle.join();
    let stats = server.map(|s| s.stop());
    // Every thread of the process, the ended ones included: workers, the embedded
    // service, the progress bar.
    let cpu = weir_bench::compare::process_cpu().saturating_sub(cpu_start);
    let finished = match result {
        Ok(Ok(finished)) => finished,
        Ok(Err(error)) => {
            if let Some((path, file)) = json.as_mut() {
                let value = job::failed_to_start_json(&settings, &error);
                write_json(path, file, &value)?;
            }
            return Err(error);
        }
        Err(_) => return Err(RunError::Panicked),
    };
    let mean_latency = match &redis {
        // Little's limit needs the service's latency, which Redis does not announce.
        Some(_) => Duration::ZERO,
        None => args.latency.mean(),
    };
    println!("{}", job::render(&settings, &finished, mean_latency));
    match (&redis, stats) {
        (Some(store), _) => {
            let stats = store.stats.snapshot();
            println!(
                "  {:<28} {} hits, {} misses, {} error replies, {} failed, {} commands ({} MGETs), {} connections",
                "redis",
                stats.hits,
                stats.misses,
                stats.errors,
                stats.failed,
                stats.commands,
                stats.batches,
                stats.connects
            );
        }
        (None, Some(stats)) => println!(
            "  {:<28} {service_place}, {} requests, {} errors injected",
            "lookup service", stats.requests, stats.errors
        ),
        (None, None) => println!("  {:<28} external at {service}", "lookup service"),
    }
    let stream_source = settings
        .streams
        .source
        .as_ref()
        .and_then(|c| c.stats.as_ref())
        .map(|s| s.snapshot());
    if let Some(s) = &stream_source {
        println!(
            "  {:<28} {} entries in {} reads ({}), {} acknowledged, {} reconnects, {} errors",
            "redis stream source",
            s.entries,
            s.reads,
            job::bytes_text(s.bytes),
            s.acknowledged,
            s.reconnects,
            s.errors
        );
    }
    let stream_sink = settings.streams.sink.as_ref().map(|c| c.stats.snapshot());
    if let Some(s) = &stream_sink {
        println!(
            "  {:<28} {} entries written, {} commands, {} transactions, {} reconnects, {} errors",
            "redis stream sink", s.entries, s.commands, s.transactions, s.reconnects, s.errors
        );
    }
    let load = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed);
    if let Some((_, s)) = &settings.streams.kafka_source {
        let lag: i64 = s
            .lag
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|l| (*l).max(0))
            .sum();
        println!(
            "  {:<28} {} records ({}) from {} partitions, {} skipped, {} errors, lag {lag}",
            "kafka source",
            load(&s.records),
            job::bytes_text(load(&s.bytes)),
            load(&s.partitions),
            load(&s.skipped),
            load(&s.errors)
        );
    }
    if let Some((_, s)) = &settings.streams.kafka_sink {
        println!(
            "  {:<28} {} records ({}), {} delivered, {} transactions committed ({} found \
             committed at restore), {} aborted, {} errors",
            "kafka sink",
            load(&s.records),
            job::bytes_text(load(&s.bytes)),
            load(&s.delivered),
            load(&s.transactions_committed),
            load(&s.transactions_found_committed),
            load(&s.transactions_aborted),
            load(&s.errors)
        );
    }
    let records = finished.report.received.max(1);
    let cpu_per_record_ns = cpu.as_nanos() as f64 / records as f64;
    let service_share = stats
        .filter(|s| s.cpu_ns > 0 && !cpu.is_zero())
        .map(|s| s.cpu_ns as f64 / cpu.as_nanos() as f64);
    println!(
        "  {:<28} {:.3} µs (user + sys of all threads {:.2} s ÷ records out){}",
        "CPU per record",
        cpu_per_record_ns / 1e3,
        cpu.as_secs_f64(),
        match service_share {
            Some(share) => format!("; the embedded service {:.0}% of it", share * 100.0),
            None => String::new(),
        }
    );
    if let Some((path, file)) = json.as_mut() {
        let mut value = job::to_json(&settings, &finished);
        value["settings"]["key_distribution"] = Value::from(format!("{:?}", args.key_distribution));
        value["settings"]["cache"] = Value::from(args.cache.map(|c| format!("{c:?}")));
        value["workers"] = Value::from(plan.workers());
        value["worker_cores"] = Value::from(plan.placement.clone());
        value["lookup_service"] = match &redis {
            Some(_) => Value::Null,
            None => serde_json::json!({
                "address": service.to_string(),
                "embedded": stats.is_some(),
                "placement": service_place,
                "core": service_core,
                "timer_slack_us": args.service_timer_slack.as_secs_f64() * 1e6,
                "requests": stats.map(|s| s.requests),
                "errors_injected": stats.map(|s| s.errors),
                "cpu_s": stats.map(|s| s.cpu_ns as f64 / 1e9),
            }),
        };
        value["redis"] = match &redis {
            Some(store) => {
                let stats = store.stats.snapshot();
                serde_json::json!({
                    "url": store.url.to_string(),
                    "mget_max_keys": store.mget,
                    "hits": stats.hits,
                    "misses": stats.misses,
                    "error_replies": stats.errors,
                    "failed": stats.failed,
                    "commands": stats.commands,
                    "mgets": stats.batches,
                    "connections": stats.connects,
                })
            }
            None => Value::Null,
        };
        value["stream_source"] = match (&args.source, &stream_source) {
            (Some(url), Some(s)) => serde_json::json!({
                "url": url.to_string(),
                "bounded": args.bounded,
                "entries": s.entries,
                "reads": s.reads,
                "bytes": s.bytes,
                "acknowledged": s.acknowledged,
                "reconnects": s.reconnects,
                "errors": s.errors,
            }),
            _ => Value::Null,
        };
        value["stream_sink"] = match (&args.sink, &stream_sink) {
            (Some(url), Some(s)) => serde_json::json!({
                "url": url.to_string(),
                "guarantee": format!("{:?}", args.sink_guarantee),
                "entries": s.entries,
                "commands": s.commands,
                "transactions": s.transactions,
                "reconnects": s.reconnects,
                "errors": s.errors,
            }),
            _ => Value::Null,
        };
        value["kafka_source"] = match (&args.source, &settings.streams.kafka_source) {
            (Some(url), Some((_, s))) => serde_json::json!({
                "url": url.to_string(),
                "bounded": args.bounded,
                "records": load(&s.records),
                "bytes": load(&s.bytes),
                "skipped": load(&s.skipped),
                "errors": load(&s.errors),
                "partitions": load(&s.partitions),
            }),
            _ => Value::Null,
        };
        value["kafka_sink"] = match (&args.sink, &settings.streams.kafka_sink) {
            (Some(url), Some((_, s))) => serde_json::json!({
                "url": url.to_string(),
                "guarantee": format!("{:?}", args.sink_guarantee),
                "records": load(&s.records),
                "delivered": load(&s.delivered),
                "transactions_committed": load(&s.transactions_committed),
                "transactions_aborted": load(&s.transactions_aborted),
                "errors": load(&s.errors),
            }),
            _ => Value::Null,
        };
        value["cpu_s"] = Value::from(cpu.as_secs_f64());
        value["lookup_mean_latency_ms"] = match &redis {
            Some(_) => Value::Null,
            None => Value::from(args.latency.mean().as_secs_f64() * 1e3),
        };
        value["cpu_per_record_ns"] = Value::from(cpu_per_record_ns);
        value["service_cpu_share"] = service_share.map_or(Value::Null, Value::from);
        write_json(path, file, &value)?;
    }
    if let Some(error) = &finished.failure {
        match job::failure_hint(error) {
            Some(hint) => eprintln!("error: the job failed: {error}; {hint}"),
            None => eprintln!("error: the job failed: {error}"),
        }
        for lost in &finished.report.lost_connections {
            eprintln!("error: another process of the job went away: {lost}");
        }
        return Ok(1);
    }
    let report = &finished.report;
    if report.missing > 0 || report.duplicates > 0 {
        eprintln!(
            "error: {} records lost and {} duplicated",
            report.missing, report.duplicates
        );
        return Ok(1);
    }
    // The exactly-once check over every attempt that wrote the output (restarts and
    // restores included): what the sinks committed.
    if let (Some(output), false) = (&settings.output, settings.streams.reads_input()) {
        let audit = job::audit_output(output, settings.records)?;
        println!("  {:<28} {}", "committed output", job::audit_text(&audit));
        if audit.lost > 0 || audit.duplicated > 0 {
            eprintln!(
                "error: the committed output under {} lost {} records and holds {} twice",
                output.display(),
                audit.lost,
                audit.duplicated
            );
            return Ok(1);
        }
    }
    Ok(0)
}

/// Opens (creating, not yet truncating) the `--json` file, so that an unwritable path
/// fails before the run rather than after it.
pub(crate) fn open_json(path: &std::path::Path) -> Result<(PathBuf, std::fs::File), RunError> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map(|file| (path.to_path_buf(), file))
        .map_err(|source| RunError::Json {
            path: path.to_path_buf(),
            source,
        })
}

/// Replaces the `--json` file's content with `value`.
pub(crate) fn write_json(
    path: &std::path::Path,
    file: &mut std::fs::File,
    value: &Value,
) -> Result<(), RunError> {
    let text = serde_json::to_string_pretty(value).expect("JSON of plain values");
    file.set_len(0)
        .and_then(|()| std::io::Write::write_all(file, text.as_bytes()))
        .map_err(|source| RunError::Json {
            path: path.to_path_buf(),
            source,
        })
}
