//! `weir report`: turns the JSON that `scripts/report.sh` collected into
//! `results/REPORT.md` and SVG plots. The report is generated, never hand-edited.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde_json::Value;

mod flink_job;
mod targets;

/// One row of a comparison JSON.
#[derive(Debug, Clone)]
struct Row {
    experiment: String,
    implementation: String,
    is_weir: bool,
    median_ns: f64,
    ratio: Option<f64>,
    /// The row the ratio is taken against: for a peer, the Weir row of its pairing; for
    /// Weir's, the best peer of its pairing.
    compared_with: Option<String>,
    /// Which rows it is compared with (`weir compare`'s pairing), if the suite pairs them.
    pairing: Option<String>,
    limit: Option<f64>,
    fraction: Option<f64>,
    latency: Option<[f64; 5]>,
    /// CPU ns per operation of the client's thread and of the service's, where the
    /// suite measures them (the lookup suite).
    cpu: Option<(f64, f64)>,
}

fn rows(suite: &Value) -> Vec<Row> {
    let Some(results) = suite["results"].as_array() else {
        return Vec::new();
    };
    results
        .iter()
        .map(|r| Row {
            experiment: r["experiment"].as_str().unwrap_or("?").to_string(),
            implementation: r["implementation"].as_str().unwrap_or("?").to_string(),
            is_weir: r["is_weir"].as_bool().unwrap_or(false),
            median_ns: r["median_ns_per_op"].as_f64().unwrap_or(f64::NAN),
            // A Weir row carries the best peer's time over its own instead.
            ratio: r["peer_over_weir"]
                .as_f64()
                .or_else(|| r["best_peer_over_weir"].as_f64()),
            compared_with: r["compared_with"]
                .as_str()
                .or_else(|| r["best_peer"].as_str())
                .map(str::to_string),
            pairing: r["pairing"].as_str().map(str::to_string),
            limit: r["limit_ops_per_s"].as_f64(),
            fraction: r["fraction_of_limit"].as_f64(),
            latency: r["latency_ns"].as_object().map(|l| {
                let get = |k: &str| l.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN) / 1e3;
                [get("p50"), get("p90"), get("p99"), get("p99.9"), get("max")]
            }),
            cpu: r["client_cpu_ns_per_op"]
                .as_f64()
                .zip(r["service_cpu_ns_per_op"].as_f64()),
        })
        .collect()
}

/// The main job's runs on its defaults (`job.json`, `job-1.json`, ...), failed ones
/// included.
fn main_job_files(data: &Path) -> Vec<Value> {
    (0..10)
        .filter_map(|i| match i {
            0 => read(data, "job.json"),
            i => read(data, &format!("job-{i}.json")),
        })
        .collect()
}

/// Little's limit of a main-job run: workers × capacity ÷ the lookups' mean latency.
fn little_limit(job: &Value) -> Option<f64> {
    let workers = job["workers"].as_f64()?;
    let capacity = job["settings"]["capacity"].as_f64()?;
    let latency_s = job["lookup_mean_latency_ms"].as_f64()? / 1e3;
    Some(workers * capacity / latency_s)
}

/// The open-loop runs of the main job (`load-<rate>.json`), by offered rate.
fn load_runs(data: &Path) -> Vec<(f64, Value)> {
    numbered_runs(data, "load-")
}

/// The runs written as `<prefix><number>.json`, by that number.
fn numbered_runs(data: &Path, prefix: &str) -> Vec<(f64, Value)> {
    let mut runs: Vec<(f64, Value)> = std::fs::read_dir(data)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().to_string();
                    let number: f64 = name
                        .strip_prefix(prefix)?
                        .strip_suffix(".json")?
                        .parse()
                        .ok()?;
                    Some((number, read(data, &name)?))
                })
                .collect()
        })
        .unwrap_or_default();
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    runs
}

/// The main job at 50 k records/s with the workers' timer slack at each setting
/// (`slack-<µs>.json`): what the slack saves in CPU and wake-ups, and what it adds to
/// the latency.
fn slack_section(md: &mut String, data: &Path) {
    let mut runs = numbered_runs(data, "slack-");
    if runs.is_empty() {
        return;
    }
    // The same with the embedded service's slack set to the workers' (its own rows).
    runs.extend(numbered_runs(data, "service-slack-"));
    let _ = writeln!(
        md,
        "\n### Timer slack at low load\n\nThe main job at 50 k records/s (open loop) with the workers' timer slack (`weir run --timer-slack`, default {:.0} µs): a worker woken by an arrival takes what arrives or comes due within the slack in the same turn. The embedded lookup service keeps no slack (it stands in for the external system) except in the rows that give it one (`--service-timer-slack`: the answers due within the slack after the earliest leave at one timer expiry).\n",
        weir_engine::runtime::TIMER_SLACK_DEFAULT.as_secs_f64() * 1e6
    );
    let _ = writeln!(
        md,
        "| timer slack µs | service's timer slack µs | CPU µs/record (service share) | worker wake-ups a record | timer-slack sleeps a record | p50 µs | p99 µs | p99.9 µs |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (slack, job) in &runs {
        let service_slack = job["lookup_service"]["timer_slack_us"]
            .as_f64()
            .unwrap_or(0.0);
        let records = job["records_out"].as_f64().unwrap_or(f64::NAN);
        let count = |cause: &str| -> f64 {
            job["wakeups"].as_array().map_or(0.0, |w| {
                w.iter().map(|w| w[cause].as_f64().unwrap_or(0.0)).sum()
            })
        };
        let wakeups: f64 = ["io", "notified", "deadline", "idle"]
            .iter()
            .map(|c| count(c))
            .sum();
        let l = &job["latency_ns"];
        let us = |k: &str| l[k].as_f64().unwrap_or(f64::NAN) / 1e3;
        let _ = writeln!(
            md,
            "| {slack:.0} | {service_slack:.0} | {} | {:.3} | {:.3} | {:.0} | {:.0} | {:.0} |",
            cpu_text(job),
            wakeups / records,
            count("slack") / records,
            us("p50"),
            us("p99"),
            us("p99.9")
        );
    }
    if let Some(text) = wake_cost_text(data) {
        let _ = writeln!(md, "\n{text}");
    }
}

/// What a wake-up and a timer that runs out cost a thread on this machine
/// (`wake-cost.json`, from `weir wake-cost`), as a sentence for the low-load figures.
pub(crate) fn wake_cost_text(data: &Path) -> Option<String> {
    let cost = read(data, "wake-cost.json")?;
    let us = |k: &str| cost[k].as_f64().map(|ns| ns / 1e3);
    let (timer, wake) = (us("timer_cpu_ns")?, us("wake_cpu_ns")?);
    Some(format!(
        "On this machine (`{}`) a timed sleep of {:.0} µs that runs out costs {timer:.1} µs of the sleeping thread's CPU, and a wake-up by another thread (a futex, sender and receiver together; a worker is woken through an eventfd in its `io_uring`, a kernel wake-up of the same kind) {wake:.1} µs, the threads' own CPU only: a job whose threads wake, for a timer or for an arrival, once per k records pays at least {:.0} µs ÷ k a record for the wake-ups alone, so a CPU per record of 3 µs needs every wake-up of every thread (the lookup service's included) shared by {:.0} records or more.",
        cost["command"].as_str().unwrap_or("weir wake-cost"),
        cost["sleep_us"].as_f64().unwrap_or(f64::NAN),
        timer.min(wake),
        (timer.min(wake) / 3.0).ceil(),
    ))
}

fn read(dir: &Path, name: &str) -> Option<Value> {
    let text = std::fs::read_to_string(dir.join(name)).ok()?;
    serde_json::from_str(&text).ok()
}

/// The number after `word ` in `text` (e.g. "capacity 100" → 100).
fn number_after(text: &str, word: &str) -> Option<f64> {
    let start = text.find(word)? + word.len();
    let digits: String = text[start..]
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    digits.parse().ok()
}

fn table(out: &mut String, rows: &[Row]) {
    let mut experiments: Vec<&str> = rows.iter().map(|r| r.experiment.as_str()).collect();
    experiments.dedup();
    for experiment in experiments {
        // CPU per operation, per side, where the experiment measures it.
        let cpu = rows
            .iter()
            .any(|r| r.experiment == experiment && r.cpu.is_some());
        let (cpu_head, cpu_rule) = if cpu {
            (" client CPU ns/op | service CPU ns/op |", "---:|---:|")
        } else {
            ("", "")
        };
        let _ = writeln!(out, "\n#### {experiment}\n");
        let _ = writeln!(out, "| implementation | median ns/op | ops/s | peer ÷ Weir time | compared with | limit ops/s | of limit | p50 / p99 / p99.9 / max µs |{cpu_head}");
        let _ = writeln!(out, "|---|---:|---:|---:|---|---:|---:|---:|{cpu_rule}");
        for r in rows.iter().filter(|r| r.experiment == experiment) {
            let name = if r.is_weir {
                format!("**{}**", r.implementation)
            } else {
                r.implementation.clone()
            };
            let ratio = r.ratio.map_or("—".into(), |x| format!("{x:.2}×"));
            let compared_with = match (&r.compared_with, r.ratio) {
                (Some(name), Some(_)) => name.as_str(),
                _ => "—",
            };
            let limit = r.limit.map_or("—".into(), |x| format!("{x:.0}"));
            let fraction = r
                .fraction
                .map_or("—".into(), |x| format!("{:.1}%", x * 100.0));
            let latency = r.latency.map_or("—".into(), |l| {
                format!("{:.0} / {:.0} / {:.0} / {:.0}", l[0], l[2], l[3], l[4])
            });
            let cpu_columns = match (cpu, r.cpu) {
                (false, _) => String::new(),
                (true, Some((client, service))) => format!(" {client:.1} | {service:.1} |"),
                (true, None) => " — | — |".to_string(),
            };
            let _ = writeln!(
                out,
                "| {name} | {:.1} | {:.0} | {ratio} | {compared_with} | {limit} | {fraction} | {latency} |{cpu_columns}",
                r.median_ns,
                1e9 / r.median_ns
            );
        }
    }
}

type Series = (String, Vec<(f64, f64)>);

fn line_chart(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
) -> Result<(), String> {
    let points: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|(_, p)| p.iter().copied())
        .filter(|(x, y)| *x > 0.0 && *y > 0.0)
        .collect();
    if points.is_empty() {
        return Ok(());
    }
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in &points {
        x0 = x0.min(*x);
        x1 = x1.max(*x);
        y0 = y0.min(*y);
        y1 = y1.max(*y);
    }
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(
            (x0 * 0.8..x1 * 1.25).log_scale(),
            (y0 * 0.7..y1 * 1.4).log_scale(),
        )
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(|e| e.to_string())?;
    for (index, (name, points)) in series.iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        let points: Vec<(f64, f64)> = points
            .iter()
            .copied()
            .filter(|(x, y)| *x > 0.0 && *y > 0.0)
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

fn bar_chart(path: &Path, title: &str, rows: &[Row]) -> Result<(), String> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut experiments: Vec<&str> = rows.iter().map(|r| r.experiment.as_str()).collect();
    experiments.dedup();
    let mut implementations: Vec<&str> = Vec::new();
    for r in rows {
        if !implementations.contains(&r.implementation.as_str()) {
            implementations.push(&r.implementation);
        }
    }
    let y1 = rows.iter().map(|r| 1e3 / r.median_ns).fold(0.0, f64::max) * 1.2;
    let root = SVGBackend::new(path, (1000, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let names: Vec<String> = experiments.iter().map(|e| e.to_string()).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(60)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..experiments.len() as f64, 0f64..y1)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(experiments.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 0.26 && i < names.len() {
                names[i].chars().take(48).collect()
            } else {
                String::new()
            }
        })
        .y_desc("million operations per second")
        .draw()
        .map_err(|e| e.to_string())?;
    let width = 0.8 / implementations.len() as f64;
    for (k, implementation) in implementations.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        let bars: Vec<Rectangle<(f64, f64)>> = experiments
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let r = rows
                    .iter()
                    .find(|r| r.experiment == *e && r.implementation == *implementation)?;
                let x = i as f64 + 0.1 + k as f64 * width;
                Some(Rectangle::new(
                    [(x, 0.0), (x + width * 0.9, 1e3 / r.median_ns)],
                    color.filled(),
                ))
            })
            .collect();
        chart
            .draw_series(bars)
            .map_err(|e| e.to_string())?
            .label(*implementation)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

fn series_by(rows: &[Row], filter: impl Fn(&Row) -> Option<f64>) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for r in rows {
        let Some(x) = filter(r) else { continue };
        let y = 1e9 / r.median_ns;
        match out.iter_mut().find(|(name, _)| *name == r.implementation) {
            Some((_, points)) => points.push((x, y)),
            None => out.push((r.implementation.clone(), vec![(x, y)])),
        }
    }
    for (_, points) in out.iter_mut() {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// Writes `REPORT.md` and `plots/*.svg` under `out` from the JSON in `data`.
pub fn generate(data: &Path, out: &Path, commit: &str) -> Result<(), String> {
    if !has_measurements(data) {
        return Err(format!(
            "no measurements in {}: run scripts/report.sh (or scripts/report.sh --quick) \
             first, which collects them there and then calls weir report",
            data.display()
        ));
    }
    let plots = out.join("plots");
    std::fs::create_dir_all(&plots)
        .map_err(|e| format!("cannot create {}: {e}", plots.display()))?;
    let mut md = String::new();
    let machine = ["ring", "pool", "async", "exchange", "lookup"]
        .iter()
        .find_map(|s| read(data, &format!("{s}.json")))
        .map(|v| v["machine"].clone())
        .unwrap_or(Value::Null);
    let _ = writeln!(md, "# Weir performance report\n");
    let _ = writeln!(md, "Generated by `scripts/report.sh` (`weir report`) from the JSON in `{}`; do not edit by hand. The measurements ran on `weir` built with cargo's `measure` profile (fat LTO, one codegen unit: the settings of the criterion benches), Weir and its Rust peers alike.\n", data.display());
    let _ = writeln!(md, "- date: {}", chrono_free_date());
    let _ = writeln!(md, "- commit: {commit}");
    let _ = writeln!(
        md,
        "- machine: {}, {} cores, kernel {}",
        machine["cpu"].as_str().unwrap_or("?"),
        machine["cores"].as_u64().unwrap_or(0),
        machine["kernel"].as_str().unwrap_or("?")
    );
    let _ = writeln!(md, "\nEvery comparison runs Weir and its peer in alternating turns in one process and reports medians over the rounds; \"peer ÷ Weir time\" above 1 means Weir is faster: on a Weir row it is the time of the best peer doing the same work in the same way (plain with plain, batched with batched, parking with parking) over that row's, on a peer's row that row's time over the best Weir row of the same kind, on a ceiling's or a reference's row its time over the best Weir row's (a ceiling is the same work with no framework, not a peer); \"compared with\" names the other row of each ratio. This VM's host moves vCPUs between cores, so cross-core figures swing between runs: read the ratios, not the absolute numbers.\n");
    targets::section(&mut md, data);
    let suites = [
        ("ring", "SPSC mail ring"),
        ("pool", "Segment pool"),
        ("async", "Async I/O operator"),
        ("exchange", "Local data exchange"),
        ("lookup", "Lookups through the driver"),
        (
            "remote",
            "Remote data exchange (transport over loopback TCP)",
        ),
    ];
    for (suite, title) in suites {
        let Some(mut value) = read(data, &format!("{suite}.json")) else {
            let _ = writeln!(md, "\n## {title}\n\nNot measured in this run.\n");
            continue;
        };
        // Apache Flink's rows, from scripts/flink-peer.sh, beside Weir's and the peers'.
        let flink = crate::flink::merge(data, suite, &mut value);
        let rows = rows(&value);
        let _ = writeln!(
            md,
            "\n## {title}\n\nCommand: `{}`",
            value["command"].as_str().unwrap_or("?")
        );
        if let Some(note) = flink {
            md.push_str(&note);
        }
        match suite {
            "ring" | "pool" => {
                let file = format!("{suite}.svg");
                bar_chart(
                    &plots.join(&file),
                    &format!("{title}: Weir and its peers"),
                    &rows,
                )?;
                let _ = writeln!(md, "\n![{title}](plots/{file})");
            }
            "async" => {
                let mut series = series_by(&rows, |r| {
                    (r.experiment.contains("unordered, latency 1 ms"))
                        .then(|| number_after(&r.experiment, "capacity"))
                        .flatten()
                });
                let little: Vec<(f64, f64)> = [10.0, 100.0, 1000.0]
                    .iter()
                    .map(|c| (*c, c / 1e-3))
                    .collect();
                series.push(("Little's limit C / 1 ms".into(), little));
                line_chart(
                    &plots.join("async_little.svg"),
                    "Async operator at 1 ms latency: throughput vs capacity",
                    "capacity (in flight)",
                    "records per second",
                    &series,
                )?;
                let _ = writeln!(
                    md,
                    "\n![async throughput vs capacity](plots/async_little.svg)"
                );
                if let Some(section) = callgrind_section(out) {
                    md.push_str(&section);
                }
                if let Some(section) = host_section(out) {
                    md.push_str(&section);
                }
            }
            "exchange" => {
                let series = series_by(&rows, |r| {
                    (r.experiment.contains("1→1") && r.experiment.contains("timeout 100 ms"))
                        .then(|| number_after(&r.experiment, "1→1,"))
                        .flatten()
                });
                line_chart(
                    &plots.join("exchange_size.svg"),
                    "Exchange 1→1: records per second vs record size",
                    "record size (bytes)",
                    "records per second",
                    &series,
                )?;
                let _ = writeln!(md, "\n![exchange vs record size](plots/exchange_size.svg)");
                if let Some(line) = timeout_ratio_line(&rows) {
                    md.push_str(&line);
                }
            }
            "lookup" => {
                let series = series_by(&rows, |r| {
                    r.experiment
                        .contains("latency 0")
                        .then(|| number_after(&r.experiment, "latency 0,"))
                        .flatten()
                });
                line_chart(
                    &plots.join("lookup.svg"),
                    "Lookups at latency 0: io_uring, epoll, tokio, mio loop",
                    "requests in flight",
                    "lookups per second",
                    &series,
                )?;
                let _ = writeln!(md, "\n![lookups vs in flight](plots/lookup.svg)");
                let _ = writeln!(md, "\nCPU ns/op: CPU time (user + system) per lookup over the measured loop, of the client's thread (Weir: operator, client and driver; tokio: the runtime and its tasks, all on that thread) and of the service's thread; the service bounds a run where its CPU per lookup is close to the run's ns/op.");
            }
            _ => {}
        }
        table(&mut md, &rows);
    }
    match read(data, "debloat.json") {
        Some(value) => debloat_section(&mut md, &value),
        None => {
            let _ = writeln!(md, "\n## Buffer debloating\n\nNot measured in this run.\n");
        }
    }
    // Redis, when scripts/report.sh could start a server for it.
    if let Some(value) = read(data, "checkpoints.json") {
        // Flink's keyed snapshots (scripts/flink-peer.sh keyed) go beside Weir's, in
        // the same value as its checkpoint rows.
        let flink = match (
            read(data, "flink-checkpoints.json"),
            read(data, "flink-keyed.json"),
        ) {
            (Some(mut checkpoints), Some(keyed)) => {
                checkpoints["keyed"] = keyed;
                Some(checkpoints)
            }
            (None, Some(keyed)) => Some(serde_json::json!({ "keyed": keyed })),
            (checkpoints, None) => checkpoints,
        };
        fault_tolerance_section(&mut md, &value, flink.as_ref());
    }
    match read(data, "redis.json") {
        Some(value) => redis_section(&mut md, &plots, &value)?,
        None => {
            let _ = writeln!(md, "\n## Redis lookups\n\nNot measured in this run (no redis-server could be started).\n");
        }
    }
    // The main job and its open-loop sweep.
    let _ = writeln!(md, "\n## The main job (`weir run`)\n");
    if let Some(job) = read(data, "job.json") {
        let _ = writeln!(
            md,
            "Command: `{}`\n",
            job["command"].as_str().unwrap_or("?")
        );
        if job["outcome"].as_str() == Some("failed") {
            let _ = writeln!(
                md,
                "**The run failed**: {}\n",
                job["cause"].as_str().unwrap_or("no cause recorded")
            );
        }
        let _ = writeln!(md, "| run | records | throughput records/s | of Little's limit | CPU µs/record (service share) | lost | duplicated | p50 µs | p99 µs | p99.9 µs | max µs | drivers |");
        let _ = writeln!(
            md,
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
        );
        for (run, job) in main_job_files(data).iter().enumerate() {
            let l = &job["latency_ns"];
            let us = |k: &str| l[k].as_f64().unwrap_or(f64::NAN) / 1e3;
            let throughput = job["throughput_records_per_s"].as_f64().unwrap_or(0.0);
            let little = little_limit(job).unwrap_or(f64::NAN);
            let _ = writeln!(
                md,
                "| {} | {} | {throughput:.0} | {:.1}% | {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {} |",
                run + 1,
                job["records_out"],
                throughput / little * 100.0,
                cpu_text(job),
                job["lost"],
                job["duplicated"],
                us("p50"),
                us("p99"),
                us("p99.9"),
                us("max"),
                job["drivers"]
            );
        }
    } else {
        let _ = writeln!(md, "Not measured in this run.");
    }
    let loads = load_runs(data);
    if !loads.is_empty() {
        let _ = writeln!(
            md,
            "\n### Latency vs offered load (open loop, coordinated omission corrected)\n"
        );
        let _ = writeln!(
            md,
            "| offered records/s | achieved records/s | CPU µs/record (service share) | p50 µs | p99 µs | p99.9 µs | max µs |"
        );
        let _ = writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|");
        let mut series: Vec<Series> = vec![
            ("p50".into(), vec![]),
            ("p99".into(), vec![]),
            ("p99.9".into(), vec![]),
        ];
        let mut cpu: Vec<Series> = vec![("CPU per record".into(), vec![])];
        for (rate, job) in &loads {
            let l = &job["latency_ns"];
            let us = |k: &str| l[k].as_f64().unwrap_or(f64::NAN) / 1e3;
            let _ = writeln!(
                md,
                "| {rate:.0} | {:.0} | {} | {:.0} | {:.0} | {:.0} | {:.0} |",
                job["throughput_records_per_s"].as_f64().unwrap_or(0.0),
                cpu_text(job),
                us("p50"),
                us("p99"),
                us("p99.9"),
                us("max")
            );
            series[0].1.push((*rate, us("p50")));
            series[1].1.push((*rate, us("p99")));
            series[2].1.push((*rate, us("p99.9")));
            if let Some(ns) = job["cpu_per_record_ns"].as_f64() {
                cpu[0].1.push((*rate, ns / 1e3));
            }
        }
        if !cpu[0].1.is_empty() {
            line_chart(
                &plots.join("cpu_load.svg"),
                "Main job: CPU per record (all threads) vs offered load",
                "offered load (records/s)",
                "CPU per record (µs)",
                &cpu,
            )?;
            let _ = writeln!(
                md,
                "
![CPU per record vs load](plots/cpu_load.svg)"
            );
        }
        line_chart(
            &plots.join("latency_load.svg"),
            "Main job: latency percentiles vs offered load",
            "offered load (records/s)",
            "latency (µs)",
            &series,
        )?;
        let _ = writeln!(md, "\n![latency vs load](plots/latency_load.svg)");
        if let Some(line) = half_load_line(&loads, read(data, "job.json").as_ref()) {
            md.push_str(&line);
        }
        if let Some(bound) = loads
            .iter()
            .filter(|(_, j)| j["latency_ns"]["p99"].as_f64().unwrap_or(f64::MAX) <= 5e6)
            .map(|(r, _)| *r)
            .reduce(f64::max)
        {
            let _ = writeln!(md, "\nThroughput at a p99 bound of 5 ms: {bound:.0} records/s (highest offered load that met it).");
        }
    }
    slack_section(&mut md, data);
    lookup_batch_section(&mut md, data);
    flink_job::section(&mut md, data);
    // The soak run is long (10 minutes), so scripts/soak.sh runs it on its own and
    // leaves its section beside the report.
    match std::fs::read_to_string(out.join("soak.md")) {
        Ok(soak) => {
            let _ = writeln!(
                md,
                "\n## Soak: memory and descriptors over a long run\n\n{soak}"
            );
        }
        Err(_) => {
            let _ = writeln!(
                md,
                "\n## Soak: memory and descriptors over a long run\n\nNot measured: run `scripts/soak.sh`.\n"
            );
        }
    }
    cache_section(&mut md, data);
    match read(data, "streams.json") {
        Some(value) => {
            let _ = writeln!(
                md,
                "\n## Redis Streams in and out\n\nCommand: `{}` ({} rounds, the cases interleaved; medians). The main job as `weir run` runs it (1 ms lookups at the embedded service, capacity 1000, key-by exchange, two workers unpinned), its records read from two Redis streams (`weir run --source … --bounded`) instead of generated, and appended to a stream (`--sink`) as well as checked. The benchmark's own redis-server (no persistence) shares the two cores with the job.",
                value["command"].as_str().unwrap_or("weir stream-bench"),
                value["rounds"].as_u64().unwrap_or(0),
            );
            md.push_str(&crate::stream_bench::render(&value));
        }
        None => {
            let _ = writeln!(md, "\n## Redis Streams in and out\n\nNot measured in this run (`weir stream-bench` needs a redis-server: `scripts/redis.sh install`).\n");
        }
    }
    match read(data, "kafka.json") {
        Some(value) => {
            let _ = writeln!(
                md,
                "\n## Kafka source → sink\n\nCommand: `{}` ({} rounds, the two sides alternating; medians), against the tansu broker `scripts/kafka.sh` starts (in-memory storage, on the same two cores). Weir: the Kafka source chained to the Kafka sink at least once, two subtasks; the peer: rdkafka's own consumer → producer loop doing the same parsing and formatting, a thread per half of the {} partitions, its clients set as Weir's set theirs (the ceiling for this client). Throughput: a topic of {} records read to its end into a fresh topic, until the last delivery is acknowledged; CPU of the whole process per record. Latency: {} records written at {} records/s, each record's age when a consumer of the output reads it (through the broker twice). Flink's `KafkaSource`/`KafkaSink` are not measured: the Flink jars this project installs carry no Kafka connector.",
                value["command"].as_str().unwrap_or("weir kafka-bench"),
                value["rounds"].as_u64().unwrap_or(0),
                value["partitions"].as_u64().unwrap_or(0),
                value["records"].as_u64().unwrap_or(0),
                value["latency_records"].as_u64().unwrap_or(0),
                value["rate"].as_f64().unwrap_or(0.0),
            );
            md.push_str(&crate::kafka_bench::render(&value));
        }
        None => {
            let _ = writeln!(md, "\n## Kafka source → sink\n\nNot measured in this run (`weir kafka-bench` needs a broker: `scripts/kafka.sh start`).\n");
        }
    }
    let _ = writeln!(md, "\n## Flamegraphs\n");
    for (file, what) in [
        ("main-job.svg", "the main job (`weir run`)"),
        ("async.svg", "the async operator at latency 0"),
        ("exchange.svg", "the exchange, 100-byte records 1→1"),
    ] {
        let _ = writeln!(md, "- [{what}](../flamegraphs/{file})");
    }
    std::fs::write(out.join("REPORT.md"), md).map_err(|e| format!("cannot write the report: {e}"))
}

/// Whether `data` holds any JSON that `scripts/report.sh` writes.
/// The open-loop run nearest half the closed-loop run's throughput: its p99 less the
/// lookup latency and the buffer timeout, the latency the engine adds under load.
fn half_load_line(loads: &[(f64, Value)], closed: Option<&Value>) -> Option<String> {
    let saturating = closed?["throughput_records_per_s"].as_f64()?;
    let (rate, job) = loads.iter().min_by(|a, b| {
        (a.0 - saturating / 2.0)
            .abs()
            .total_cmp(&(b.0 - saturating / 2.0).abs())
    })?;
    let p99_us = job["latency_ns"]["p99"].as_f64()? / 1e3;
    let lookup_us = job["lookup_mean_latency_ms"].as_f64()? * 1e3;
    let buffer_us = job["settings"]["buffer_timeout_ms"].as_f64().unwrap_or(1.0) * 1e3;
    Some(format!(
        "\nAt {rate:.0} records/s offered (half the closed-loop run's {saturating:.0}): p99 {p99_us:.0} µs, \
         less the {lookup_us:.0} µs lookup and the {buffer_us:.0} µs buffer timeout: **{:.0} µs** added by the engine \
         under load.\n",
        p99_us - lookup_us - buffer_us
    ))
}

/// The newest `*-async-callgrind-*.txt` in `dir` (by modification time) as a report
/// paragraph: its command and table of instructions per record.
fn callgrind_section(dir: &Path) -> Option<String> {
    let newest = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.contains("-async-callgrind-") && name.ends_with(".txt")
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max()?
        .1;
    let text = std::fs::read_to_string(&newest).ok()?;
    let mut section = format!(
        "\nInstructions per record of the operator (callgrind; `{}`, written by `scripts/callgrind.sh`):\n\n",
        newest.file_name()?.to_string_lossy()
    );
    for line in text.lines().filter(|l| l.starts_with('|')) {
        section.push_str(line);
        section.push('\n');
    }
    Some(section)
}

fn has_measurements(data: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(data) else {
        return false;
    };
    entries.filter_map(|e| e.ok()).any(|e| {
        let name = e.file_name().to_string_lossy().to_string();
        let suite = [
            "ring", "pool", "async", "exchange", "lookup", "remote", "job",
        ]
        .iter()
        .any(|s| name == format!("{s}.json"));
        suite
            || ((name.starts_with("load-") || name.starts_with("slack-"))
                && name.ends_with(".json"))
    })
}

fn chrono_free_date() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// The Redis section: the targets at a glance, plain pipelining against `MGET`
/// batching per C, a plot and the tables.
fn redis_section(md: &mut String, plots: &Path, value: &Value) -> Result<(), String> {
    let rows = rows(value);
    let _ = writeln!(
        md,
        "\n## Redis lookups\n\nCommand: `{}`\n\nOne worker, one connection, `GET`s of 100-byte values from 100,000 keys on a `redis-server` pinned to the other core. Weir's worker polls for 100 µs before it parks (`RuntimeBuilder::spin`, `WEIR_SPIN`); the \"no spin\" rows park as soon as they are idle, as the peers' tokio runtime does, and only they are compared with the peers: plain pipelining with the peers' one `GET` per call, MGET batching with their pipelines and `MGET`s (\"compared with\" in each table names the row). redis-rs (multiplexed connection, tuned: no response timeout, pipeline buffer ≥ C, `TCP_NODELAY`) and fred (auto-pipelining, `TCP_NODELAY`, `Bytes` replies) run on a tokio current-thread runtime with one task per call in flight; their batched forms send C / 2 keys per call, two calls in flight. `redis-benchmark -P 64 -r 100000` (50 connections, 64 commands pipelined on each) reading the same keys is shown as a reference, not a ceiling: it is the server's rate under its own single-threaded load tool, at its own concurrency, so it bounds the tool, not the work.",
        value["command"].as_str().unwrap_or("?")
    );
    let in_flight = |r: &Row| number_after(&r.experiment, "100 B,");
    let ops = |r: &Row| 1e9 / r.median_ns;
    let best = |c: f64, keep: &dyn Fn(&Row) -> bool| -> Option<&Row> {
        rows.iter()
            .filter(|r| in_flight(r) == Some(c) && keep(r))
            .min_by(|a, b| a.median_ns.total_cmp(&b.median_ns))
    };
    let pairing = |r: &Row, word: &str| r.pairing.as_deref().is_some_and(|p| p.starts_with(word));
    let plain = |r: &Row| r.is_weir && !r.implementation.contains("MGET");
    let batched = |r: &Row| r.is_weir && r.implementation.contains("MGET");
    let plain_parks = |r: &Row| r.is_weir && pairing(r, "plain");
    let batched_parks = |r: &Row| r.is_weir && pairing(r, "batched");
    let plain_peer = |r: &Row| !r.is_weir && pairing(r, "plain");
    let batched_peer = |r: &Row| !r.is_weir && pairing(r, "batched");
    let ceiling = |r: &Row| r.implementation.contains("redis-benchmark");
    let p99 = |r: &Row| r.latency.map_or(f64::NAN, |l| l[2]);
    let verdict = |met: bool| if met { "met" } else { "not met" };
    let _ = writeln!(md, "\n### Targets (256 in flight)\n");
    let _ = writeln!(md, "| target | figure | |\n|---|---|---|");
    if let (Some(p), Some(b), Some(c)) = (
        best(256.0, &plain),
        best(256.0, &batched),
        best(256.0, &ceiling),
    ) {
        let _ = writeln!(
            md,
            "| plain pipelining ≥ 90% of redis-benchmark's rate | {}: {:.0} GET/s = {:.0}% of {:.0} | {} |",
            p.implementation,
            ops(p),
            ops(p) / ops(c) * 100.0,
            ops(c),
            verdict(ops(p) >= 0.9 * ops(c))
        );
        let _ = writeln!(
            md,
            "| MGET batching above redis-benchmark's rate | {}: {:.0} GET/s = {:.0}% of it | {} |",
            b.implementation,
            ops(b),
            ops(b) / ops(c) * 100.0,
            verdict(ops(b) > ops(c))
        );
    }
    if let (Some(wp), Some(pp), Some(wb), Some(pb)) = (
        best(256.0, &plain_parks),
        best(256.0, &plain_peer),
        best(256.0, &batched_parks),
        best(256.0, &batched_peer),
    ) {
        let _ = writeln!(
            md,
            "| ≥ 1.5× the best peer at matching settings (a worker that parks) | plain {:.2}× {} ({:.0} GET/s), batched {:.2}× {} ({:.0} GET/s) | {} |",
            ops(wp) / ops(pp),
            pp.implementation,
            ops(pp),
            ops(wb) / ops(pb),
            pb.implementation,
            ops(pb),
            verdict(ops(wp) >= 1.5 * ops(pp) && ops(wb) >= 1.5 * ops(pb))
        );
    } else {
        let _ = writeln!(md, "| — | the 256-in-flight rows are missing | |");
    }
    let mut levels: Vec<f64> = rows.iter().filter_map(in_flight).collect();
    levels.sort_by(f64::total_cmp);
    levels.dedup();
    let mut all_below = true;
    let mut figures = Vec::new();
    for &c in &levels {
        if let (Some(w), Some(r)) = (best(c, &plain_parks), best(c, &plain_peer)) {
            all_below &= p99(w) < p99(r);
            figures.push(format!(
                "C = {c:.0}: {:.0} vs {:.0} µs ({})",
                p99(w),
                p99(r),
                r.implementation
            ));
        }
    }
    let _ = writeln!(
        md,
        "| p99 below the fastest plain peer's at every C (Weir plain, parking, vs that peer) | {} | {} |",
        figures.join("; "),
        verdict(all_below && !figures.is_empty())
    );
    let _ = writeln!(md, "\n### Plain pipelining or MGET batching\n");
    let _ = writeln!(md, "| in flight | best plain GET/s | best batched GET/s | batched ÷ plain |\n|---:|---:|---:|---:|");
    for &c in &levels {
        if let (Some(p), Some(b)) = (best(c, &plain), best(c, &batched)) {
            let _ = writeln!(
                md,
                "| {c:.0} | {:.0} | {:.0} | {:.2}× |",
                ops(p),
                ops(b),
                ops(b) / ops(p)
            );
        }
    }
    let series = series_by(&rows, in_flight);
    line_chart(
        &plots.join("redis.svg"),
        "Redis GET of 100 B values: GETs per second vs in flight",
        "GETs in flight",
        "GETs per second",
        &series,
    )?;
    let _ = writeln!(md, "\n![redis GETs vs in flight](plots/redis.svg)");
    table(md, &rows);
    Ok(())
}

/// The ratios known to depend on the host CPU, with their range on each host seen in
/// committed results: the "Host-dependent ratios" section of `hosts.md` beside the
/// report (which lists every ratio per host with the files that show it).
fn host_section(out: &Path) -> Option<String> {
    let text = std::fs::read_to_string(out.join("hosts.md")).ok()?;
    let heading = "## Host-dependent ratios";
    let body = &text[text.find(heading)? + heading.len()..];
    let body = body.split("\n## ").next().unwrap_or(body).trim();
    Some(format!(
        "\n### Ratios that depend on the host\n\nThe ratios of this section's tables against tokio (and Flink) at latency 0 and in batches move with the host CPU far more than from run to run; the ranges below are those of committed results on each host ([hosts.md](hosts.md) lists every ratio per host with the files that show it). Read this run's figures with the machine line above. The ranges are those of the peer the earlier reports had, futures' `buffered`/`buffer_unordered` built with the `release` profile; this report adds faster peers and builds everything with fat LTO, which speeds the peers up 1.3–2.5× and slows Weir's inline path (`results/2026-12-02-lto-ab-397bfc3.md`).\n\n{body}\n"
    ))
}

/// "0.447 (29%)": the run's CPU per record in µs (user + system time of every thread,
/// the embedded service's included) and the service's share of it; "—" without them.
fn cpu_text(job: &Value) -> String {
    match job["cpu_per_record_ns"].as_f64() {
        Some(ns) => match job["service_cpu_share"].as_f64() {
            Some(share) => format!("{:.3} ({:.0}%)", ns / 1e3, share * 100.0),
            None => format!("{:.3}", ns / 1e3),
        },
        None => "—".to_string(),
    }
}

/// The line comparing Weir's 1→1 exchange of 100-byte records at buffer timeout 0 with
/// the same at 100 ms (buffers read while written: a flush does not cost a segment).
fn timeout_ratio_line(rows: &[Row]) -> Option<String> {
    let weir = |suffix: &str| {
        rows.iter()
            .find(|r| {
                r.is_weir
                    && r.experiment
                        .starts_with("exchange 1→1, 100-byte records, round robin,")
                    && r.experiment.ends_with(suffix)
            })
            .map(|r| 1e9 / r.median_ns)
    };
    let zero = weir("timeout 0")?;
    let hundred = weir("timeout 100 ms")?;
    Some(format!(
        "\nBuffer timeout 0 against 100 ms (100-byte records 1→1): {:.1} M against {:.1} M records/s, {:.0}% (a flush publishes into the buffer being written; it does not cost a segment).\n",
        zero / 1e6,
        hundred / 1e6,
        100.0 * zero / hundred
    ))
}

/// The "Buffer debloating" section, from `weir debloat --json`.
/// Checkpoints: overhead, under back-pressure, recovery; Flink's figures beside.
/// The lookup cache: the main job with Zipf keys, without and with a cache, from the
/// alternating runs `scripts/report.sh` makes (`cache-off-<i>.json`, `cache-on-<i>.json`).
fn cache_section(md: &mut String, data: &Path) {
    let runs = |side: &str| -> Vec<Value> {
        (0..10)
            .filter_map(|i| read(data, &format!("cache-{side}-{i}.json")))
            .collect()
    };
    let (off, on) = (runs("off"), runs("on"));
    let _ = writeln!(md, "\n## Lookup cache\n");
    if off.is_empty() || on.is_empty() {
        let _ = writeln!(md, "Not measured in this run.\n");
        return;
    }
    let median_of = |runs: &[Value], f: &dyn Fn(&Value) -> Option<f64>| {
        crate::compare::median(&runs.iter().filter_map(f).collect::<Vec<_>>())
    };
    let throughput = |v: &Value| v["throughput_records_per_s"].as_f64();
    let p50 = |v: &Value| v["latency_ns"]["p50"].as_f64().map(|ns| ns / 1e3);
    let cpu = |v: &Value| v["cpu_per_record_ns"].as_f64();
    let hit = |v: &Value| v["cache"]["hit_rate"].as_f64();
    let command = on[0]["command"].as_str().unwrap_or("weir run --cache …");
    let _ = writeln!(
        md,
        "The main job with keys drawn Zipf(1.1) over 1 M keys, without a cache and with Flink's PARTIAL lookup cache (10,000 rows per async subtask), the two alternating over {} runs each; medians. With: `{command}`.\n",
        on.len()
    );
    let _ = writeln!(md, "| run | records/s | hit rate | p50 latency (µs) | CPU ns/record |\n|---|---:|---:|---:|---:|");
    for (name, runs) in [("no cache", &off), ("cache, rows=10000", &on)] {
        let hits = median_of(runs, &hit);
        let _ = writeln!(
            md,
            "| {name} | {:.0} | {} | {:.0} | {:.0} |",
            median_of(runs, &throughput),
            if hits.is_nan() {
                "–".to_string()
            } else {
                format!("{:.1}%", hits * 100.0)
            },
            median_of(runs, &p50),
            median_of(runs, &cpu),
        );
    }
    let _ = writeln!(
        md,
        "\nWith the cache: {:.2}× the records/s of the run without.",
        median_of(&on, &throughput) / median_of(&off, &throughput)
    );
}

fn fault_tolerance_section(md: &mut String, value: &Value, flink: Option<&Value>) {
    let _ = writeln!(
        md,
        "\n## Fault tolerance\n\nCommand: `{}` ({} rounds, interleaved; medians). {}\n",
        value["command"].as_str().unwrap_or("?"),
        value["rounds"].as_u64().unwrap_or(0),
        match flink {
            Some(flink) if flink["unavailable"].is_null() => format!(
                "Flink's side: `{}`.",
                flink["command"]
                    .as_str()
                    .unwrap_or("scripts/flink-peer.sh checkpoints")
            ),
            Some(flink) => format!(
                "Flink's side could not run: {}.",
                flink["unavailable"].as_str().unwrap_or("?")
            ),
            None => "Flink's side was not measured (scripts/flink-peer.sh checkpoints).".into(),
        }
    );
    let _ = writeln!(
        md,
        "Unaligned barriers overtake the data queued in front of them on both sides (Weir: announced ahead of the data on every channel, local and remote, the queued data read ahead and stored as channel state; Flink: priority events), also after a source finished (Weir announces later barriers on a finished task's queued output; Flink keeps a finished task running until its final checkpoint). With an aligned-checkpoint timeout both sides switch to unaligned once the timeout has passed since the barrier was written. The two-process experiment runs the sources and the sinks in different processes of the job (Weir: two transports in one OS process, on loopback; Flink: two task managers of one MiniCluster, placed apart), so that every record crosses the network. \"In flight in the exchange\" is sampled every 10 ms from the first record on, on both sides: Weir's bytes published (or, over the transport, arrived) at the sinks' input channels and not yet read, what waits at a sender for credit not counted; Flink's, in one process, the sources' output queues (`outputQueueSize`: bytes written into their subpartitions and not yet taken, which also counts a buffer being filled and not yet flushed, where Weir counts only published bytes), and over two task managers the sinks' input queues (`inputQueueSize`: what arrived and was not yet read), as Weir counts its remote channels.\n"
    );
    for line in crate::checkpoint_bench::targets(value) {
        let _ = writeln!(md, "- {line}");
    }
    md.push_str(&crate::checkpoint_bench::render_with(value, flink));
}

fn debloat_section(md: &mut String, value: &Value) {
    let _ = writeln!(
        md,
        "\n## Buffer debloating\n\nCommand: `{}`\n",
        value["command"].as_str().unwrap_or("?")
    );
    let _ = writeln!(
        md,
        "A producer writes 100-byte records 1→1 as fast as its pool of {} segments of 32 KiB allows to a consumer that reads {} records/s; every {} ms it puts a marker in band (as a checkpoint barrier travels) and the consumer notes how long the marker waited behind the bytes in flight. With debloating the gate measures its throughput every {} ms and asks for buffers that hold {} ms of data in flight (Flink's `buffer-debloat.target`; {} samples of smoothing). Figures after the first half of each run.\n",
        value["segments"].as_u64().unwrap_or(0),
        value["rate"].as_u64().unwrap_or(0),
        value["marker_ms"].as_u64().unwrap_or(0),
        value["period_ms"].as_u64().unwrap_or(0),
        value["target_ms"].as_u64().unwrap_or(0),
        value["samples"].as_u64().unwrap_or(0),
    );
    let _ = writeln!(md, "| debloating | buffer size | in flight mean / max KiB | marker wait p50 / p99 / max ms | records/s |");
    let _ = writeln!(md, "|---|---:|---:|---:|---:|");
    for run in value["runs"].as_array().into_iter().flatten() {
        let size = match run["announced_size"].as_u64() {
            Some(0) | None => "segment".to_string(),
            Some(size) => size.to_string(),
        };
        let wait = &run["marker_wait_ms"];
        let _ = writeln!(
            md,
            "| {} | {size} | {:.0} / {:.0} | {:.0} / {:.0} / {:.0} | {:.0} |",
            if run["debloat"].as_bool().unwrap_or(false) {
                "on"
            } else {
                "off"
            },
            run["in_flight_mean_bytes"].as_f64().unwrap_or(f64::NAN) / 1024.0,
            run["in_flight_max_bytes"].as_f64().unwrap_or(f64::NAN) / 1024.0,
            wait["p50"].as_f64().unwrap_or(f64::NAN),
            wait["p99"].as_f64().unwrap_or(f64::NAN),
            wait["max"].as_f64().unwrap_or(f64::NAN),
            run["records_per_s"].as_f64().unwrap_or(f64::NAN),
        );
    }
    if let Some(mean) = value["steady_segments_per_channel_mean"].as_f64() {
        let _ = writeln!(
            md,
            "\nPool usage per channel at buffer timeout 0, a producer at {:.1} M records/s and a consumer that keeps up: {mean:.2} segments on average, {} at most (buffers read while written; a descheduled consumer lets more pile up, up to the pool).",
            value["steady_records_per_s"].as_f64().unwrap_or(f64::NAN) / 1e6,
            value["steady_segments_per_channel_peak"].as_u64().unwrap_or(0),
        );
    }
}

/// The main job with a lookup request per record against batch requests
/// (`--lookup-batch 256`), alternating runs (`batch-<latency>-<off|on>-<i>.json`):
/// medians, and whether batching wins.
fn lookup_batch_section(md: &mut String, data: &Path) {
    let runs = |latency: &str, side: &str| -> Vec<Value> {
        (0..10)
            .filter_map(|i| read(data, &format!("batch-{latency}-{side}-{i}.json")))
            .filter(|j| j["outcome"].as_str() == Some("completed"))
            .collect()
    };
    let median = |jobs: &[Value], field: &dyn Fn(&Value) -> Option<f64>| -> f64 {
        crate::compare::median(&jobs.iter().filter_map(field).collect::<Vec<_>>())
    };
    let cases = [
        ("1ms", "defaults (1 ms lookups, capacity 1000)"),
        ("0", "lookups answered at once (latency 0, capacity 256)"),
    ];
    if cases
        .iter()
        .all(|(latency, _)| runs(latency, "off").is_empty())
    {
        return;
    }
    let _ = writeln!(md, "\n### Lookup batch requests\n");
    let _ = writeln!(md, "The main job with a request per record, and with the batched async operator cutting each task turn's lookups into batch requests of up to 256 keys (`weir run --lookup-batch 256`: one frame for the keys, one response with their outcomes, answered after one latency); alternating runs, medians.\n");
    let _ = writeln!(md, "| case | lookups | runs | throughput records/s | CPU µs/record (service share) | p50 µs | p99 µs |\n|---|---|---:|---:|---:|---:|---:|");
    let mut verdicts = Vec::new();
    for (latency, name) in cases {
        let mut throughput = Vec::new();
        let mut cpu = Vec::new();
        for (side, label) in [
            ("off", "a request per record"),
            ("on", "batch requests of up to 256"),
        ] {
            let jobs = runs(latency, side);
            if jobs.is_empty() {
                continue;
            }
            let t = median(&jobs, &|j| j["throughput_records_per_s"].as_f64());
            let c = median(&jobs, &|j| j["cpu_per_record_ns"].as_f64());
            let share = median(&jobs, &|j| j["service_cpu_share"].as_f64());
            let p50 = median(&jobs, &|j| j["latency_ns"]["p50"].as_f64()) / 1e3;
            let p99 = median(&jobs, &|j| j["latency_ns"]["p99"].as_f64()) / 1e3;
            let _ = writeln!(
                md,
                "| {name} | {label} | {} | {t:.0} | {:.3} ({:.0}%) | {p50:.0} | {p99:.0} |",
                jobs.len(),
                c / 1e3,
                share * 100.0
            );
            throughput.push(t);
            cpu.push(c);
        }
        if let ([t_off, t_on], [c_off, c_on]) = (&throughput[..], &cpu[..]) {
            verdicts.push(format!(
                "{name}: batch requests {:.2}× the throughput at {:.2}× the CPU per record",
                t_on / t_off,
                c_on / c_off
            ));
        }
    }
    if !verdicts.is_empty() {
        let _ = writeln!(md, "\n{}. `weir run` sends a request per record unless `--lookup-batch` is given, the same work as the peers of the lookup section and the Flink job below; `--lookup-batch` takes whatever saving the ratios here show.", verdicts.join("; "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weir_row(experiment: &str, median_ns: f64) -> Row {
        Row {
            experiment: experiment.into(),
            implementation: "weir exchange".into(),
            is_weir: true,
            median_ns,
            ratio: None,
            compared_with: None,
            pairing: None,
            limit: None,
            fraction: None,
            latency: None,
            cpu: None,
        }
    }

    /// The host section quotes hosts.md's host-dependent ratios, and is absent
    /// without the file.
    #[test]
    fn the_host_section_quotes_the_host_dependent_ratios() {
        let dir = std::env::temp_dir().join(format!("weir-hosts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(host_section(&dir).is_none());
        std::fs::write(
            dir.join("hosts.md"),
            "# t\n\n| a |\n\n## Host-dependent ratios\n\n- **x**: 2× on A, 8× on B.\n\n## Other\n\nunrelated text\n",
        )
        .unwrap();
        let section = host_section(&dir).expect("section");
        assert!(section.contains("- **x**: 2× on A, 8× on B."), "{section}");
        assert!(!section.contains("unrelated"), "{section}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A row's CPU per operation reaches its experiment's table, and an experiment
    /// that does not measure it keeps its columns.
    #[test]
    fn the_table_shows_cpu_per_operation_where_measured() {
        let mut lookup = weir_row("lookup latency 0, 1024 in flight", 100.0);
        lookup.cpu = Some((85.04, 41.0));
        let rows = [lookup, weir_row("exchange 1→1", 40.0)];
        let mut out = String::new();
        table(&mut out, &rows);
        assert!(
            out.contains("client CPU ns/op | service CPU ns/op |"),
            "{out}"
        );
        assert!(out.contains("| 85.0 | 41.0 |"), "{out}");
        let exchange = out.split("exchange 1→1").nth(1).expect("exchange table");
        assert!(!exchange.contains("CPU"), "{exchange}");
    }

    #[test]
    fn timeout_line_compares_the_two_timeouts() {
        let rows = [
            weir_row(
                "exchange 1→1, 100-byte records, round robin, timeout 100 ms",
                40.0,
            ),
            weir_row(
                "exchange 1→1, 100-byte records, round robin, timeout 0",
                50.0,
            ),
        ];
        let line = timeout_ratio_line(&rows).expect("both rows");
        assert!(
            line.contains("20.0 M against 25.0 M records/s, 80%"),
            "{line}"
        );
        assert!(timeout_ratio_line(&rows[..1]).is_none());
    }

    #[test]
    fn debloat_section_lists_both_runs() {
        let settings = crate::debloat::Settings::default();
        let outcome = |debloat| crate::debloat::Outcome {
            debloat,
            announced_size: if debloat { 4096 } else { 0 },
            in_flight_mean: 1024.0,
            in_flight_max: 2048,
            marker_wait_ns: crate::async_peers::histogram(),
            records_per_s: 10.0,
        };
        let value = crate::debloat::to_json(
            &settings,
            &[outcome(false), outcome(true)],
            (2.0, 2, 1e6),
            "weir debloat",
        );
        let mut md = String::new();
        debloat_section(&mut md, &value);
        assert!(md.contains("| off | segment |"), "{md}");
        assert!(md.contains("| on | 4096 |"), "{md}");
        assert!(md.contains("2.00 segments on average"), "{md}");
    }
}
