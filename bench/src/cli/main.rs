//! `weir`: the command of the Weir stream-processing core.
// The doc comments of the argument structs are clap's `--help` text, written for a
// terminal (`redis://[user:password@]host:port`), not rustdoc links.
#![allow(
    rustdoc::broken_intra_doc_links,
    rustdoc::invalid_html_tags,
    rustdoc::bare_urls
)]

mod args;
mod checkpoints;
mod config_reference;
mod reference;
mod run;
mod tools;

use std::io::Write as _;

use clap::Parser;
use weir_bench::compare;

use args::*;
use checkpoints::*;
use config_reference::*;
use reference::*;
use run::*;
use tools::*;

fn main() {
    // The producing side of the two-process remote benchmark: this binary re-executed
    // by `weir compare remote` (not a user-facing command).
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(weir_bench::remote_peers::PRODUCER_COMMAND) {
        match weir_bench::remote_peers::ProducerArgs::parse(&args[2..]) {
            Ok(producer) => {
                std::process::exit(weir_bench::remote_peers::run_remote_producer(producer))
            }
            Err(error) => {
                eprintln!("error: {error}");
                std::process::exit(2);
            }
        }
    }
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Run(cli.run));
    match command {
        Command::Run(args) => std::process::exit(run_job(*args)),
        Command::ServeLookup(args) => std::process::exit(serve(args)),
        Command::LoadRedis(args) => std::process::exit(load_redis(args)),
        Command::ProduceStream(args) => std::process::exit(produce_stream(args)),
        Command::ProduceKafka(args) => std::process::exit(produce_kafka(args)),
        Command::ConfigReference => {
            print!("{}", config_reference());
            std::process::exit(0)
        }
        Command::CliReference => {
            print!("{}", cli_reference());
            std::process::exit(0)
        }
        Command::Report { data, out, commit } => {
            if let Err(error) = weir_bench::report::generate(&data, &out, &commit) {
                eprintln!("error: {error}");
                std::process::exit(1);
            }
            eprintln!("wrote {}", out.join("REPORT.md").display());
        }
        Command::Summarize { reports, json } => {
            match weir_bench::cluster::summarize_files(&reports, json.as_deref()) {
                Ok(code) => std::process::exit(code),
                Err(error) => {
                    eprintln!("error: {error}");
                    std::process::exit(2);
                }
            }
        }
        Command::Checkpoints { dir } => {
            match weir_engine::checkpoint::storage::list(&dir).and_then(|listing| {
                weir_engine::checkpoint::storage::newest_completed(&dir).map(|n| (listing, n))
            }) {
                Ok((listing, newest)) => {
                    print!("{}", checkpoint_table(&listing, newest));
                    std::process::exit(0);
                }
                Err(error) => {
                    eprintln!("error: {error}");
                    std::process::exit(2);
                }
            }
        }
        Command::Profile { target, out } => std::process::exit(profile(target, &out)),
        Command::WakeCost {
            sleeps,
            round_trips,
            json,
        } => {
            if sleeps == 0 || round_trips == 0 {
                eprintln!("error: --sleeps and --round-trips must be at least 1");
                std::process::exit(2);
            }
            let cost = weir_bench::wake_cost::measure(sleeps, round_trips);
            println!(
                "a timed sleep of {} µs that runs out: {:.2} µs of the thread's CPU ({:.1} µs wall)",
                weir_bench::wake_cost::SLEEP.as_micros(),
                cost.timer_cpu_ns / 1e3,
                cost.timer_elapsed_ns / 1e3
            );
            println!(
                "a wake-up by another thread (futex, sender and receiver): {:.2} µs of CPU ({:.1} µs wall)",
                cost.wake_cpu_ns / 1e3,
                cost.wake_elapsed_ns / 1e3
            );
            if let Some(path) = json {
                let mut value = cost.to_json(sleeps, round_trips);
                value["machine"] = weir_bench::compare::machine();
                value["command"] = format!(
                    "weir wake-cost --sleeps {sleeps} --round-trips {round_trips} --json {}",
                    path.display()
                )
                .into();
                if let Err(error) = std::fs::write(&path, format!("{value:#}\n")) {
                    eprintln!("error: writing {}: {error}", path.display());
                    std::process::exit(1);
                }
            }
        }
        Command::Debloat(args) => std::process::exit(debloat(args)),
        Command::KafkaBench {
            brokers,
            records,
            latency_records,
            rate,
            rounds,
            json,
        } => {
            if !(rate.is_finite() && rate >= 100.0) {
                eprintln!("error: --rate must be at least 100 records/s, got {rate}");
                std::process::exit(2);
            }
            let value = match weir_bench::kafka_bench::run(
                &brokers,
                records,
                latency_records,
                rate,
                rounds as usize,
                |line| eprintln!("{line}"),
            ) {
                Ok(value) => value,
                Err(error) => {
                    eprintln!("error: {error}");
                    std::process::exit(1);
                }
            };
            print!("{}", weir_bench::kafka_bench::render(&value));
            if let Some(path) = json {
                let text = serde_json::to_string_pretty(&value).expect("JSON of plain values");
                if let Err(error) = std::fs::write(&path, text) {
                    eprintln!("error: cannot write {}: {error}", path.display());
                    std::process::exit(1);
                }
            }
            std::process::exit(0)
        }
        Command::StreamBench {
            rounds,
            scale,
            rate,
            json,
        } => {
            use weir_bench::stream_bench;
            if !(scale.is_finite() && scale > 0.0 && scale <= 100.0) {
                eprintln!("error: --scale must be in (0, 100], got {scale}");
                std::process::exit(2);
            }
            if !(rate.is_finite() && rate >= 1000.0) {
                eprintln!("error: --rate must be at least 1000 records/s, got {rate}");
                std::process::exit(2);
            }
            let value =
                match stream_bench::run(scale, rounds as usize, rate, |line| eprintln!("{line}")) {
                    Ok(value) => value,
                    Err(error) => {
                        eprintln!("error: {error}");
                        std::process::exit(1);
                    }
                };
            print!("{}", stream_bench::render(&value));
            if let Some(path) = json {
                let text = serde_json::to_string_pretty(&value).expect("JSON of plain values");
                if let Err(error) = std::fs::write(&path, text) {
                    eprintln!("error: cannot write {}: {error}", path.display());
                    std::process::exit(1);
                }
            }
        }
        Command::CheckpointBench {
            rounds,
            scale,
            only,
            json,
        } => {
            use weir_bench::checkpoint_bench;
            if !(scale.is_finite() && scale > 0.0 && scale <= 100.0) {
                eprintln!("error: --scale must be in (0, 100], got {scale}");
                std::process::exit(2);
            }
            let value =
                match checkpoint_bench::run(scale, rounds as usize, only.as_deref(), |line| {
                    eprintln!("{line}")
                }) {
                    Ok(value) => value,
                    Err(error) => {
                        eprintln!("error: {error}");
                        std::process::exit(1);
                    }
                };
            print!("{}", checkpoint_bench::render(&value));
            if let Some(path) = json {
                let text = serde_json::to_string_pretty(&value).expect("JSON of plain values");
                if let Err(error) = std::fs::write(&path, text) {
                    eprintln!("error: cannot write {}: {error}", path.display());
                    std::process::exit(1);
                }
            }
        }
        Command::Compare {
            suite,
            rounds,
            scale,
            json,
            only,
            implementation,
        } => {
            if !(scale.is_finite() && scale > 0.0 && scale <= 100.0) {
                eprintln!("error: --scale must be in (0, 100], got {scale}");
                std::process::exit(2);
            }
            let mut cases = match suite {
                Suite::Ring => compare::ring_cases(scale),
                Suite::Pool => compare::pool_cases(scale),
                Suite::Async => compare::async_cases(scale),
                Suite::Exchange => compare::exchange_cases(scale),
                Suite::Lookup => compare::lookup_cases(scale),
                Suite::Remote => compare::remote_cases(scale),
                Suite::Redis => match compare::redis_cases(scale) {
                    Ok(cases) => cases,
                    Err(error) => {
                        eprintln!("error: the redis suite needs a redis-server: {error}");
                        std::process::exit(1);
                    }
                },
            };
            if let Some(only) = &only {
                cases.retain(|c| c.experiment.contains(only.as_str()));
                if cases.is_empty() {
                    eprintln!("error: no experiment of this suite matches --only {only:?}");
                    std::process::exit(2);
                }
            }
            if let Some(implementation) = &implementation {
                // An exact name picks that one row where others contain it too
                // ("weir exchange, runs" and "weir exchange, runs read in place").
                let exact = cases
                    .iter()
                    .any(|c| c.implementation == implementation.as_str());
                cases.retain(|c| {
                    if exact {
                        c.implementation == implementation.as_str()
                    } else {
                        c.implementation.contains(implementation.as_str())
                    }
                });
                if cases.is_empty() {
                    eprintln!(
                        "error: no implementation in these experiments matches \
                         --implementation {implementation:?}"
                    );
                    std::process::exit(2);
                }
            }
            let summaries = compare::run(&cases, rounds as usize, |case, ns| {
                eprint!(
                    "\r{:<60} {:<24} {:>9.1} ns/op",
                    case.experiment, case.implementation, ns
                );
                let _ = std::io::stderr().flush();
            });
            eprintln!();
            print!("{}", compare::render(&summaries));
            if let Some(path) = json {
                let command: Vec<String> = std::env::args().collect();
                let value = compare::to_json(&summaries, &command.join(" "), rounds as usize);
                let text = serde_json::to_string_pretty(&value).expect("JSON of plain values");
                if let Err(error) = std::fs::write(&path, text) {
                    eprintln!("error: cannot write {}: {error}", path.display());
                    std::process::exit(1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// `docs/cli-reference.md` is what `weir cli-reference` prints now.
    #[test]
    fn the_cli_reference_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/cli-reference.md");
        let written = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            written == super::reference::cli_reference(),
            "docs/cli-reference.md is stale: regenerate it with \
             `cargo run --release -- cli-reference > docs/cli-reference.md`"
        );
    }

    /// `docs/config-reference.md` is what `weir config-reference` prints now.
    #[test]
    fn the_config_reference_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/config-reference.md");
        let written = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            written == super::config_reference::config_reference(),
            "docs/config-reference.md is stale: regenerate it with \
             `cargo run --release -- config-reference > docs/config-reference.md`"
        );
    }

    /// Without a subcommand the flags are `weir run`'s.
    #[test]
    fn flags_without_a_subcommand_are_run_s() {
        use clap::Parser;
        let cli = super::Cli::try_parse_from(["weir", "--records", "5", "--cores", "0"])
            .expect("parses as run's flags");
        assert!(cli.command.is_none());
        assert_eq!(cli.run.records, 5);
        assert!(super::Cli::try_parse_from(["weir", "run", "--records", "5"]).is_ok());
    }
}
