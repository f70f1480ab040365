//! The report's "The main job beside Apache Flink's" section: `weir run --lookup-addr`
//! and the same job in Flink (`scripts/flink-peer.sh mainjob`) against one external
//! lookup service, a Weir run and a Flink round in turn (`scripts/report.sh` writes
//! `mainjob-weir-<i>.json` and `flink-mainjob-<i>.json`).

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::{little_limit, read};

/// One run of either side, as the table shows it.
struct Run {
    throughput: f64,
    fraction: Option<f64>,
    p50_us: f64,
    p99_us: f64,
    cpu_us: f64,
    lost: u64,
    duplicated: u64,
}

fn median(values: Vec<f64>) -> f64 {
    crate::compare::median(&values)
}

fn weir_run(job: &Value) -> Option<Run> {
    if job["outcome"].as_str() != Some("completed") {
        return None;
    }
    let throughput = job["throughput_records_per_s"].as_f64()?;
    let limit = little_limit(job)?;
    Some(Run {
        throughput,
        fraction: Some(throughput / limit),
        p50_us: job["latency_ns"]["p50"].as_f64()? / 1e3,
        p99_us: job["latency_ns"]["p99"].as_f64()? / 1e3,
        cpu_us: job["cpu_per_record_ns"].as_f64()? / 1e3,
        lost: job["lost"].as_u64().unwrap_or(0),
        duplicated: job["duplicated"].as_u64().unwrap_or(0),
    })
}

fn flink_run(row: &Value, limit: Option<f64>) -> Option<Run> {
    let throughput = row["throughput_records_per_s"].as_f64()?;
    Some(Run {
        throughput,
        fraction: row["fraction_of_limit"]
            .as_f64()
            .or_else(|| limit.map(|l| throughput / l)),
        p50_us: row["latency_ns"]["p50"].as_f64()? / 1e3,
        p99_us: row["latency_ns"]["p99"].as_f64()? / 1e3,
        cpu_us: row["cpu_per_record_ns_steady"]
            .as_f64()
            .or_else(|| row["cpu_per_record_ns"].as_f64())?
            / 1e3,
        lost: row["lost"].as_u64().unwrap_or(0),
        duplicated: row["duplicated"].as_u64().unwrap_or(0),
    })
}

/// Writes the section.
pub fn section(md: &mut String, data: &Path) {
    let _ = writeln!(md, "\n## The main job beside Apache Flink's\n");
    let weir_files: Vec<Value> = (0..10)
        .filter_map(|i| read(data, &format!("mainjob-weir-{i}.json")))
        .collect();
    let flink_files: Vec<Value> = (0..10)
        .filter_map(|i| read(data, &format!("flink-mainjob-{i}.json")))
        .collect();
    if weir_files.is_empty() && flink_files.is_empty() {
        let _ = writeln!(md, "Not measured in this run (`scripts/report.sh` writes `mainjob-weir-<i>.json` and `flink-mainjob-<i>.json`).");
        return;
    }
    let weir: Vec<Run> = weir_files.iter().filter_map(weir_run).collect();
    let mut flink = Vec::new();
    let mut unavailable = Vec::new();
    let mut described = None;
    for file in &flink_files {
        if let Some(reason) = file["unavailable"].as_str() {
            unavailable.push(reason.to_string());
            continue;
        }
        described.get_or_insert(file);
        let limit = file["limit_records_per_s"].as_f64();
        flink.extend(
            file["results"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|row| flink_run(row, limit)),
        );
    }
    let _ = writeln!(
        md,
        "The same job on both engines, against one external lookup service (`weir serve-lookup --latency fixed:1ms --value-size 32`, its own process, so neither side's CPU includes it): a generator of {} records (keys uniform over 1,000,000) on {} subtasks, an unordered async lookup of capacity 1000 per subtask with a 1 s timeout, a key-by exchange with a 1 ms buffer timeout (Flink's is set in whole milliseconds, and 1 ms is its lowest above flushing every record, so Weir runs at 1 ms here too, not its default of 100 µs), and a sink that counts, checks every id once and records each record's latency from its creation. A Weir run and a Flink round in turn, {} of each; medians. Little's limit is subtasks × 1000 ÷ 1 ms for both.\n",
        weir_files
            .first()
            .and_then(|j| j["settings"]["records"].as_u64())
            .map_or("?".to_string(), |n| n.to_string()),
        weir_files
            .first()
            .and_then(|j| j["workers"].as_u64())
            .map_or("?".to_string(), |n| n.to_string()),
        weir_files.len().max(flink_files.len())
    );
    let _ = writeln!(
        md,
        "- Weir: `{}` ({} workers, driver {}, the lookup client pipelining on each worker's driver).",
        weir_files
            .first()
            .and_then(|j| j["command"].as_str())
            .unwrap_or("weir run --lookup-addr …"),
        weir_files
            .first()
            .and_then(|j| j["workers"].as_u64())
            .unwrap_or(0),
        weir_files
            .first()
            .map_or("?".to_string(), |j| j["drivers"].to_string())
    );
    for job in weir_files
        .iter()
        .filter(|j| j["outcome"].as_str() != Some("completed"))
    {
        let _ = writeln!(
            md,
            "\n**A Weir run failed** (left out of the medians): {}",
            job["cause"].as_str().unwrap_or("no cause recorded")
        );
    }
    if let Some(file) = described {
        let _ = writeln!(
            md,
            "- Apache Flink {} ({}): `{}`. {}. {}.",
            file["flink_version"].as_str().unwrap_or("?"),
            file["java_version"].as_str().unwrap_or("?"),
            file["command"]
                .as_str()
                .unwrap_or("scripts/flink-peer.sh mainjob"),
            file["job"].as_str().unwrap_or(""),
            file["setup"].as_str().unwrap_or("")
        );
        let _ = writeln!(md, "- Flink's lookup client is what a competent Flink user writes for a pipelined protocol: one connection per subtask, `asyncInvoke` appends the request to a buffer, and one NIO thread per subtask writes everything pending in one write and completes the futures from the responses it reads; its counters (requests per write, responses per read) are in the JSON. Flink's CPU per record is over the measured window (first record to end of input); Weir's is the whole process over the run.");
    }
    for reason in &unavailable {
        let _ = writeln!(
            md,
            "\n**Apache Flink: not measured in this round**: {reason}"
        );
    }
    let _ = writeln!(md, "- Redis as the store is not measured beside Flink: a competent Flink user would take Lettuce, which is published only as a Maven artifact; the machines that build this report reach the Rust, Python, Debian and npm registries only, and none of them ships it. The Redis sections above compare Weir with redis-rs and fred instead.\n");
    let _ = writeln!(md, "| engine | runs | throughput records/s | of Little's limit | p50 µs | p99 µs | CPU µs/record | lost | duplicated |");
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for (name, runs) in [("**Weir**", &weir), ("Apache Flink", &flink)] {
        if !runs.is_empty() {
            let throughput = median(runs.iter().map(|r| r.throughput).collect());
            let p50 = median(runs.iter().map(|r| r.p50_us).collect());
            let p99 = median(runs.iter().map(|r| r.p99_us).collect());
            let cpu = median(runs.iter().map(|r| r.cpu_us).collect());
            let fraction = median(runs.iter().filter_map(|r| r.fraction).collect());
            let lost: u64 = runs.iter().map(|r| r.lost).sum();
            let duplicated: u64 = runs.iter().map(|r| r.duplicated).sum();
            let _ = writeln!(
                md,
                "| {name} | {} | {throughput:.0} | {:.1}% | {p50:.0} | {p99:.0} | {cpu:.3} | {lost} | {duplicated} |",
                runs.len(),
                fraction * 100.0
            );
            rows.push((throughput, p50, p99, cpu));
        } else {
            let _ = writeln!(md, "| {name} | 0 | — | — | — | — | — | — | — |");
        }
    }
    if let [weir, flink] = rows[..] {
        // "k× less" or "k× more", by which side is ahead.
        let compare = |flink: f64, weir: f64, less: &str, more: &str| {
            if flink >= weir {
                format!("{:.2}× {less}", flink / weir)
            } else {
                format!("{:.2}× {more}", weir / flink)
            }
        };
        let _ = writeln!(
            md,
            "\nWeir against Flink: **{:.2}×** the throughput; CPU per record {}; p50 {}; p99 {}.",
            weir.0 / flink.0,
            compare(flink.3, weir.3, "less", "more"),
            compare(flink.1, weir.1, "lower", "higher"),
            compare(flink.2, weir.2, "lower", "higher")
        );
    }
    let _ = writeln!(md, "\nEach run:\n");
    let _ = writeln!(md, "| engine | throughput records/s | p50 µs | p99 µs | CPU µs/record |\n|---|---:|---:|---:|---:|");
    for (name, runs) in [("Weir", &weir), ("Apache Flink", &flink)] {
        for run in runs.iter() {
            let _ = writeln!(
                md,
                "| {name} | {:.0} | {:.0} | {:.0} | {:.3} |",
                run.throughput, run.p50_us, run.p99_us, run.cpu_us
            );
        }
    }
}
