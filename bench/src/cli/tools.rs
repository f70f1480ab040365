//! The smaller subcommands: `produce-stream`, `produce-kafka`, `load-redis`,
//! `serve-lookup`, `profile`, `debloat`.

use crate::*;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use weir_bench::job;
use weir_bench::job::KeyDistribution;
use weir_engine::async_io::OutputMode;
use weir_net::lookup::{Faults, LookupServer, ServerConfig};

/// The lookup service address when Redis is the store (never connected to).
pub(crate) const UNUSED_SERVICE: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    0,
));

/// A load's `--rate` checked and its keys' distribution, for `produce-stream` and
/// `produce-kafka` (`what`: what the rate counts).
fn load_settings(
    rate: Option<f64>,
    draw: KeyDraw,
    keys: u64,
    what: &str,
) -> Result<KeyDistribution, String> {
    if rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        return Err(format!(
            "--rate must be a positive number of {what} per second"
        ));
    }
    Ok(match draw {
        KeyDraw::Uniform => KeyDistribution::Uniform { keys },
        KeyDraw::Zipf(s) => {
            KeyDistribution::Zipf(job::Zipf::new(keys, s).map_err(|e| e.to_string())?)
        }
    })
}

pub(crate) fn produce_stream(args: ProduceStreamArgs) -> i32 {
    let [stream] = args.url.streams.as_slice() else {
        eprintln!("error: {}: name one stream to append to", args.url);
        return 2;
    };
    let keys = match load_settings(args.rate, args.key_distribution, args.keys, "entries") {
        Ok(keys) => keys,
        Err(error) => {
            eprintln!("error: {error}");
            return 2;
        }
    };
    eprintln!(
        "weir produce-stream: {} entries to {}{}",
        args.count,
        args.url,
        args.rate
            .map(|r| format!(" at {r} entries/s"))
            .unwrap_or_default()
    );
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        let _ = ctrlc::set_handler(move || stop.store(true, Ordering::Relaxed));
    }
    let bar = indicatif::ProgressBar::new(args.count);
    let produced = weir_bench::streams::produce_records(
        &args.url.redis,
        stream,
        weir_bench::streams::ProduceSpec {
            count: args.count,
            rate: args.rate,
            keys,
            maxlen: args.maxlen,
        },
        |done| bar.set_position(done),
        &|| stop.load(Ordering::Relaxed),
    );
    bar.finish_and_clear();
    match produced {
        Ok(p) => {
            let seconds = p.elapsed.as_secs_f64().max(1e-9);
            println!(
                "appended {} entries (ids {}..{}, {}) to {} in {seconds:.2} s: {:.0} entries/s",
                p.entries,
                p.first_id,
                p.first_id + p.entries,
                job::bytes_text(p.bytes),
                args.url,
                p.entries as f64 / seconds
            );
            0
        }
        Err(error) => {
            eprintln!("error: {error}");
            1
        }
    }
}

/// `weir produce-kafka`: `--count` records `id,key,t` to a topic (created with
/// `--partitions` if missing), keyed by the key, paced at `--rate` if given.
pub(crate) fn produce_kafka(args: ProduceKafkaArgs) -> i32 {
    let [topic] = args.url.topics.as_slice() else {
        eprintln!("error: {}: name one topic to write", args.url);
        return 2;
    };
    let keys = match load_settings(args.rate, args.key_distribution, args.keys, "records") {
        Ok(keys) => keys,
        Err(error) => {
            eprintln!("error: {error}");
            return 2;
        }
    };
    if args.first_id.saturating_add(args.count) > job::STREAM_ID_MAX {
        eprintln!(
            "error: ids {}..{} reach past {} (the checking sink of weir run keeps a bitmap of \
             ids): give a smaller --first-id or --count",
            args.first_id,
            args.first_id.saturating_add(args.count),
            job::STREAM_ID_MAX
        );
        return 2;
    }
    let brokers = args.url.bootstrap();
    let created = weir_net::kafka::KafkaAdmin::new(&brokers, Duration::from_secs(10))
        .and_then(|admin| admin.create_topic(topic, args.partitions));
    match created {
        Ok(true) => eprintln!(
            "weir produce-kafka: created topic {topic:?} ({} partitions)",
            args.partitions
        ),
        Ok(false) => {}
        Err(error) => {
            eprintln!(
                "error: {}: {error} (is a broker running there? `scripts/kafka.sh start` \
                 starts one on 127.0.0.1:19092)",
                args.url
            );
            return 1;
        }
    }
    eprintln!(
        "weir produce-kafka: {} records to {}{}",
        args.count,
        args.url,
        args.rate
            .map(|r| format!(" at {r} records/s"))
            .unwrap_or_default()
    );
    let bar = indicatif::ProgressBar::new(args.count);
    let started = std::time::Instant::now();
    let mut rng = job::SEED | 1;
    let mut bytes = 0u64;
    let produced = weir_net::kafka::produce::produce(
        &brokers,
        topic,
        args.count,
        Duration::from_secs(60),
        |n, out| {
            if let Some(rate) = args.rate {
                // Open loop: record n leaves at n / rate after the start, never before.
                let due = Duration::from_secs_f64(n as f64 / rate);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
            let first = job::xorshift64star(&mut rng);
            let key = keys.draw(first, || job::xorshift64star(&mut rng));
            out.key = Some(key.to_string().into_bytes());
            let _ = write!(
                out.payload,
                "{},{key},{}",
                args.first_id + n,
                job::wall_clock_ns()
            );
            bytes += out.payload.len() as u64;
            if n % 4096 == 0 {
                bar.set_position(n);
            }
        },
    );
    bar.finish_and_clear();
    match produced {
        Ok(report) => {
            let seconds = report.elapsed.as_secs_f64().max(1e-9);
            println!(
                "wrote {} records (ids {}..{}, {}) to {} in {seconds:.2} s: {:.0} records/s",
                report.delivered,
                args.first_id,
                args.first_id + report.delivered,
                job::bytes_text(bytes),
                args.url,
                report.delivered as f64 / seconds
            );
            0
        }
        Err(error) => {
            eprintln!("error: {error}");
            1
        }
    }
}

pub(crate) fn load_redis(args: LoadRedisArgs) -> i32 {
    eprintln!(
        "weir load-redis: {} keys of {} bytes into {}",
        args.keys, args.value_size, args.store
    );
    let bar = indicatif::ProgressBar::new(args.keys);
    let started = std::time::Instant::now();
    let loaded = weir_net::redis::load_keys(
        &args.store,
        args.keys,
        args.value_size,
        job::REDIS_KEY_PREFIX,
        |done| bar.set_position(done),
    );
    bar.finish_and_clear();
    match loaded {
        Ok(loaded) => {
            let seconds = started.elapsed().as_secs_f64();
            println!(
                "loaded {} keys ({} MB of values) in {seconds:.2} s: {:.0} keys/s",
                loaded.keys,
                loaded.bytes / 1_000_000,
                loaded.keys as f64 / seconds.max(1e-9)
            );
            0
        }
        Err(error) => {
            eprintln!("error: {error}");
            1
        }
    }
}

pub(crate) fn serve(args: ServeArgs) -> i32 {
    let config = ServerConfig {
        addr: args.addr,
        latency: args.latency,
        value_size: args.value_size,
        faults: Faults {
            error_rate: args.error_rate,
            reset_rate: args.reset_rate,
            stall_rate: args.stall_rate,
            malformed_rate: 0.0,
        },
        seed: 1,
        core: None,
        spin: args.spin,
        slack: args.timer_slack,
    };
    match LookupServer::start(config) {
        Ok(server) => {
            eprintln!(
                "weir lookup service listening on {} (latency {}); Ctrl-C stops it",
                server.addr(),
                args.latency
            );
            loop {
                std::thread::sleep(Duration::from_secs(10));
                let stats = server.stats();
                eprintln!(
                    "weir lookup service: {} requests, {} answered",
                    stats.requests, stats.answered
                );
            }
        }
        Err(error) => {
            eprintln!("error: {error}");
            1
        }
    }
}

pub(crate) fn profile(target: ProfileTarget, out: &std::path::Path) -> i32 {
    let guard = match pprof::ProfilerGuardBuilder::default()
        .frequency(999)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
    {
        Ok(guard) => guard,
        Err(error) => {
            eprintln!("error: cannot start the profiler: {error}");
            return 1;
        }
    };
    match target {
        ProfileTarget::MainJob => {
            let code = run_job(RunArgs {
                records: 1_000_000,
                quiet: true,
                ..DefaultRun::parse_from(["weir"]).args
            });
            if code != 0 {
                return code;
            }
        }
        ProfileTarget::Async => {
            for _ in 0..5 {
                weir_bench::async_peers::weir_immediate(OutputMode::Unordered, 100, 2_000_000);
            }
        }
        ProfileTarget::Exchange => {
            for _ in 0..3 {
                weir_bench::exchange_peers::weir_exchange::<100>(
                    1,
                    1,
                    weir_bench::exchange_peers::Routing::RoundRobin,
                    Some(Duration::from_millis(100)),
                    3_000_000,
                );
            }
        }
    }
    let report = match guard.report().build() {
        Ok(report) => report,
        Err(error) => {
            eprintln!("error: cannot build the profile: {error}");
            return 1;
        }
    };
    let written = std::fs::File::create(out)
        .map_err(|e| e.to_string())
        .and_then(|file| report.flamegraph(file).map_err(|e| e.to_string()));
    match written {
        Ok(()) => {
            eprintln!("wrote {}", out.display());
            0
        }
        Err(error) => {
            eprintln!("error: cannot write {}: {error}", out.display());
            1
        }
    }
}

/// Records per second of `weir debloat`'s steady run: below what one consumer reads.
pub(crate) const STEADY_RATE: u64 = 4_000_000;

/// `weir debloat`: the back-pressured runs with and without debloating.
pub(crate) fn debloat(args: DebloatArgs) -> i32 {
    use weir_bench::debloat::{self, Settings};
    use weir_engine::exchange::DebloatConfig;
    let segments = args.segments as usize;
    let settings = Settings {
        rate: args.rate,
        duration: args.duration,
        warm_up: args.duration / 2,
        segments,
        debloat: DebloatConfig {
            target: args.target,
            period: args.period,
            samples: args.samples,
            min_size: args.min_size,
            starting_size: args.starting_size,
            ..DebloatConfig::new(segments)
        },
        ..Settings::default()
    };
    if let Err(error) = settings.debloat.validate() {
        eprintln!("error: {error}");
        return 2;
    }
    let json = match args.json.as_deref().map(std::fs::File::create).transpose() {
        Ok(file) => file,
        Err(error) => {
            eprintln!("error: cannot write the JSON file: {error}");
            return 1;
        }
    };
    let outcomes: Vec<_> = [false, true]
        .into_iter()
        .map(|on| {
            eprintln!("debloating {}…", if on { "on" } else { "off" });
            debloat::back_pressured(&settings, on)
        })
        .collect();
    eprintln!("steady state at buffer timeout 0…");
    let steady = debloat::steady_segments(STEADY_RATE * 2, STEADY_RATE);
    print!("{}", debloat::render(&settings, &outcomes, steady));
    if let Some(mut file) = json {
        let command: Vec<String> = std::env::args().collect();
        let value = debloat::to_json(&settings, &outcomes, steady, &command.join(" "));
        let text = serde_json::to_string_pretty(&value).expect("JSON of plain values");
        if let Err(error) = file.write_all(text.as_bytes()) {
            eprintln!("error: cannot write the JSON file: {error}");
            return 1;
        }
    }
    0
}
