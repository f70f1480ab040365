//! `weir`: the command of the Weir stream-processing core.

use std::io::Write as _;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use weir_bench::compare;

#[derive(Parser)]
#[command(
    name = "weir",
    version,
    about = "Weir: a thread-per-core, lock-free stream-processing core"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// The main job (embedded lookup service → async lookup → exchange → sink).
    Run,
    /// Weir against its peers in interleaved turns; prints medians and ratios.
    Compare {
        /// Which structures to compare.
        #[arg(value_enum)]
        suite: Suite,
        /// Rounds of turns (each implementation runs once per round).
        #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u32).range(1..=1000))]
        rounds: u32,
        /// Work per turn relative to the default (0.1 for a quick look).
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        /// Also write the figures as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Only the experiments whose name contains this text.
        #[arg(long)]
        only: Option<String>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Suite {
    Ring,
    Pool,
    Async,
    Exchange,
}

fn main() {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Run) {
        Command::Run => run_placeholder(),
        Command::Compare {
            suite,
            rounds,
            scale,
            json,
            only,
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
            };
            if let Some(only) = &only {
                cases.retain(|c| c.experiment.contains(only.as_str()));
                if cases.is_empty() {
                    eprintln!("error: no experiment of this suite matches --only {only:?}");
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

/// What `weir run` says until the runtime lands: what exists, and what to run instead.
fn run_placeholder() {
    println!("weir {}", env!("CARGO_PKG_VERSION"));
    println!();
    println!("The main job (embedded lookup service -> async lookup -> key-hash exchange ->");
    println!("counting sink) is not available yet: it needs the per-core runtime, the I/O");
    println!("drivers and the async operator, which are still to be built. Nothing was run.");
    println!();
    println!("Built so far, in weir-engine:");
    println!("  ring      SPSC mail ring (batch push/pop, disconnect detection)");
    println!("  slab      fixed-capacity generational slab");
    println!("  park      parker with a race-free check-then-park");
    println!("  mailbox   per-task inbox: wired SPSC rings, a foreign MPSC inbox, local mail");
    println!("  exchange  network and local buffer pools with lock-free recycling");
    println!();
    println!("Try:");
    println!("  scripts/test.sh                       tests, benches once, loom models");
    println!("  cargo run --release -- compare ring   Weir's ring against rtrb, crossbeam, std");
    println!("  cargo run --release -- compare pool   Weir's pool against mutex and queue pools");
    println!("  cargo bench --bench ring --bench pool criterion curves");
}
