//! Apache Flink's rows in `weir report`: `scripts/flink-peer.sh` runs the async,
//! exchange and remote suites' configurations as Flink jobs and writes
//! `flink-async.json`, `flink-exchange.json` and `flink-remote.json` beside the suites'
//! JSON, in the same schema as `weir compare` (plus the Flink version, each
//! configuration's start-up time and, for remote, where each subtask ran: the producers
//! on one task manager, the consumers on the other). [`merge`] puts
//! those rows beside Weir's and the other peers', with their time over Weir's, and says
//! plainly when the file is missing or says that Java or Flink was unavailable.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

/// The suites that have a Flink peer.
pub const SUITES: [&str; 3] = ["async", "exchange", "remote"];

/// The file `scripts/flink-peer.sh` writes for `suite`.
pub fn file_name(suite: &str) -> String {
    format!("flink-{suite}.json")
}

/// Reads `flink-<suite>.json` from `data` and inserts its rows into `suite_json` (the
/// suite's `weir compare` JSON): each after the last row of the same experiment, with
/// `peer_over_weir` against that experiment's Weir row. Returns the Markdown paragraph
/// that tells where Flink's rows come from, or why there are none; `None` for a suite
/// without a Flink peer.
pub fn merge(data: &Path, suite: &str, suite_json: &mut Value) -> Option<String> {
    if !SUITES.contains(&suite) {
        return None;
    }
    let name = file_name(suite);
    let path = data.join(&name);
    let flink: Value = match std::fs::read_to_string(&path) {
        Err(_) => {
            return Some(format!(
                "\n**Apache Flink: not measured in this run** (`{name}` is missing from `{}`; `scripts/flink-peer.sh` writes it).\n",
                data.display()
            ))
        }
        Ok(text) => match serde_json::from_str(&text) {
            Ok(value) => value,
            Err(error) => {
                return Some(format!(
                    "\n**Apache Flink: not measured in this run** (`{name}` is not valid JSON: {error}).\n"
                ))
            }
        },
    };
    if let Some(reason) = flink["unavailable"].as_str() {
        return Some(format!(
            "\n**Apache Flink: not measured in this run**: {reason} (`{}`).\n",
            flink["command"].as_str().unwrap_or("scripts/flink-peer.sh")
        ));
    }
    let flink_rows = flink["results"].as_array().cloned().unwrap_or_default();
    let ours = suite_json["machine"].clone();
    let Some(rows) = suite_json["results"].as_array_mut() else {
        return Some("\n**Apache Flink**: no Weir rows to compare with.\n".into());
    };
    // Weir's row in the same mode ("flink unordered" against "weir unordered ..."), else
    // the experiment's first Weir row, as `weir compare` takes for its peers.
    let weir_row = |rows: &[Value], experiment: &str, implementation: &str| {
        let same_mode = implementation.replacen("flink", "weir", 1);
        let weir =
            |r: &&Value| r["is_weir"].as_bool() == Some(true) && r["experiment"] == experiment;
        rows.iter()
            .filter(weir)
            .find(|r| {
                r["implementation"]
                    .as_str()
                    .is_some_and(|name| name.starts_with(same_mode.as_str()))
            })
            .or_else(|| rows.iter().find(weir))
            .and_then(|r| Some((r["implementation"].clone(), r["median_ns_per_op"].as_f64()?)))
    };
    let mut startups = Vec::new();
    let mut placements = Vec::new();
    for mut row in flink_rows {
        let experiment = row["experiment"].as_str().unwrap_or("?").to_string();
        let implementation = row["implementation"].as_str().unwrap_or("?").to_string();
        row["is_weir"] = Value::Bool(false);
        if let (Some((weir_name, weir)), Some(flink)) = (
            weir_row(rows, &experiment, &implementation),
            row["median_ns_per_op"].as_f64(),
        ) {
            row["peer_over_weir"] = Value::from(flink / weir);
            row["compared_with"] = weir_name;
        }
        if row["placement"].is_object() {
            placements.push((experiment.clone(), row["placement"].clone()));
        }
        startups.push((
            experiment.clone(),
            implementation,
            row["startup_ms"]["median"].as_f64(),
            row["job"].as_str().unwrap_or("").to_string(),
        ));
        let at = rows
            .iter()
            .rposition(|r| r["experiment"] == experiment.as_str())
            .map_or(rows.len(), |i| i + 1);
        rows.insert(at, row);
    }
    let mut missing: Vec<&str> = Vec::new();
    for r in rows.iter() {
        let experiment = r["experiment"].as_str().unwrap_or("?");
        if !startups.iter().any(|s| s.0 == experiment) && !missing.contains(&experiment) {
            missing.push(experiment);
        }
    }
    let mut note = String::new();
    let _ = writeln!(
        note,
        "\nApache Flink {} ({}) beside them, measured by `{}`: {}. Flink's rows are whole Flink jobs in their own process (source, the operator or the network exchange with its serialisation, sink), not interleaved with Weir's turns.",
        flink["flink_version"].as_str().unwrap_or("?"),
        flink["java_version"].as_str().unwrap_or("Java ?"),
        flink["command"].as_str().unwrap_or("scripts/flink-peer.sh"),
        flink["setup"].as_str().unwrap_or("set-up not recorded")
    );
    let theirs = &flink["machine"];
    if theirs.is_object() && ours != *theirs {
        let describe = |m: &Value| {
            format!(
                "{}, {} cores",
                m["cpu"].as_str().unwrap_or("?"),
                m["cores"].as_u64().unwrap_or(0)
            )
        };
        let _ = writeln!(
            note,
            "\n**Flink ran on another machine** ({}) than Weir's rows ({}): regenerate both with `scripts/report.sh` before reading the ratios.",
            describe(theirs),
            describe(&ours)
        );
    }
    if !missing.is_empty() {
        let _ = writeln!(
            note,
            "\nNo Flink job for: {} (Flink has no such configuration).",
            missing
                .iter()
                .map(|e| format!("\"{e}\""))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let _ = writeln!(
        note,
        "\n| Flink job | experiment | start-up ms (median) |\n|---|---|---:|"
    );
    for (experiment, implementation, startup, job) in &startups {
        let job = if job.is_empty() { implementation } else { job };
        let startup = startup.map_or("—".into(), |ms| format!("{ms:.0}"));
        let _ = writeln!(note, "| {job} | {experiment} | {startup} |");
    }
    if !placements.is_empty() {
        let _ = writeln!(
            note,
            "\nWhere Flink's subtasks ran, read back from each run's execution graph (the task manager of every subtask's execution attempt; a run whose producers and consumers shared a task manager was cancelled once its slots were assigned and submitted again, and is not measured):\n\n| experiment | producers and consumers on different task managers | measured runs checked | runs placed together and submitted again | the last run's subtasks |\n|---|---|---:|---:|---|"
        );
        for (experiment, p) in &placements {
            let apart = match p["producers_and_consumers_on_different_task_managers"].as_bool() {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "?",
            };
            let subtasks = p["subtasks"]
                .as_array()
                .map(|s| {
                    s.iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join("; ")
                })
                .unwrap_or_default();
            let _ = writeln!(
                note,
                "| {experiment} | {apart} | {} | {} | {subtasks} |",
                p["runs_checked"].as_u64().unwrap_or(0),
                p["runs_placed_together_and_repeated"].as_u64().unwrap_or(0)
            );
        }
    }
    if let Some(starts) = flink["cluster_starts"].as_str() {
        let _ = writeln!(
            note,
            "\nThe MiniClusters themselves started in {starts} (task managers × slots; once per shape, before its first job)."
        );
    } else if let Some(ms) = flink["cluster_start_ms"].as_f64() {
        let _ = writeln!(
            note,
            "\nThe MiniCluster itself started in {ms:.0} ms (once per suite, before the first job)."
        );
    }
    Some(note)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("weir-flink-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    fn row(experiment: &str, implementation: &str, is_weir: bool, median: f64) -> Value {
        json!({
            "experiment": experiment,
            "implementation": implementation,
            "is_weir": is_weir,
            "median_ns_per_op": median,
            "peer_over_weir": null,
            "limit_ops_per_s": null,
            "fraction_of_limit": null,
            "latency_ns": null,
        })
    }

    fn suite() -> Value {
        json!({
            "command": "weir compare async",
            "rounds": 3,
            "machine": {"cpu": "test", "cores": 2, "kernel": "test"},
            "results": [
                row("async A", "weir unordered", true, 100.0),
                row("async A", "tokio buffer_unordered", false, 250.0),
                row("async B", "weir keyed-ordered", true, 50.0),
            ],
        })
    }

    fn flink() -> Value {
        let mut flink_row = row("async A", "flink unordered", false, 400.0);
        flink_row["startup_ms"] = json!({"median": 81.5, "samples": [80.0, 81.5, 90.0]});
        flink_row["job"] = json!("fromSequence → unorderedWait → sink");
        json!({
            "command": "scripts/flink-peer.sh --quick",
            "peer": "Apache Flink",
            "flink_version": "2.3.0",
            "java_version": "OpenJDK 17",
            "cluster_start_ms": 1500.0,
            "setup": "one MiniCluster",
            "machine": {"cpu": "test", "cores": 2, "kernel": "test"},
            "results": [flink_row],
        })
    }

    #[test]
    fn flink_rows_sit_beside_weirs_with_their_ratio() {
        let dir = scratch("present");
        std::fs::write(dir.join("flink-async.json"), flink().to_string()).expect("write");
        let mut value = suite();
        let note = merge(&dir, "async", &mut value).expect("async has a Flink peer");
        let rows = value["results"].as_array().expect("rows");
        let names: Vec<&str> = rows
            .iter()
            .map(|r| r["implementation"].as_str().expect("name"))
            .collect();
        assert_eq!(
            names,
            [
                "weir unordered",
                "tokio buffer_unordered",
                "flink unordered",
                "weir keyed-ordered"
            ]
        );
        assert_eq!(rows[2]["peer_over_weir"].as_f64(), Some(4.0));
        assert!(note.contains("Apache Flink 2.3.0"), "{note}");
        assert!(note.contains("| 82 |") || note.contains("| 81 |"), "{note}");
        assert!(note.contains("No Flink job for: \"async B\""), "{note}");
        assert!(note.contains("1500 ms"), "{note}");
        assert!(!note.contains("another machine"), "{note}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn each_flink_mode_is_compared_with_weirs_same_mode() {
        let dir = scratch("modes");
        let mut flink = flink();
        flink["results"] = json!([
            row("async C", "flink ordered", false, 300.0),
            row("async C", "flink unordered", false, 300.0),
        ]);
        flink["machine"]["cores"] = json!(4);
        std::fs::write(dir.join("flink-async.json"), flink.to_string()).expect("write");
        let mut value = suite();
        value["results"] = json!([
            row("async C", "weir ordered", true, 100.0),
            row("async C", "weir unordered", true, 150.0),
        ]);
        let note = merge(&dir, "async", &mut value).expect("async has a Flink peer");
        let rows = value["results"].as_array().expect("rows");
        assert_eq!(rows[2]["peer_over_weir"].as_f64(), Some(3.0));
        assert_eq!(rows[3]["peer_over_weir"].as_f64(), Some(2.0));
        assert!(note.contains("Flink ran on another machine"), "{note}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_missing_file_is_stated_and_leaves_the_rows_alone() {
        let dir = scratch("missing");
        let mut value = suite();
        let note = merge(&dir, "exchange", &mut value).expect("exchange has a Flink peer");
        assert!(note.contains("not measured in this run"), "{note}");
        assert!(note.contains("flink-exchange.json"), "{note}");
        assert_eq!(value, suite());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unavailable_java_is_stated_with_its_reason() {
        let dir = scratch("unavailable");
        let marker = json!({
            "peer": "Apache Flink",
            "command": "scripts/flink-peer.sh",
            "unavailable": "Java 17 is not installed and could not be installed here",
            "results": [],
        });
        std::fs::write(dir.join("flink-async.json"), marker.to_string()).expect("write");
        let mut value = suite();
        let note = merge(&dir, "async", &mut value).expect("async has a Flink peer");
        assert!(note.contains("not measured in this run"), "{note}");
        assert!(note.contains("Java 17 is not installed"), "{note}");
        assert_eq!(value, suite());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn remote_rows_carry_their_placement() {
        let dir = scratch("remote");
        let experiment = "remote 1→1, 100-byte records, timeout 100 ms";
        let mut flink_row = row(
            experiment,
            "flink remote exchange, 2 task managers",
            false,
            500.0,
        );
        flink_row["placement"] = json!({
            "producers_and_consumers_on_different_task_managers": true,
            "task_managers": 2,
            "runs_checked": 9,
            "runs_placed_together_and_repeated": 0,
            "subtasks": ["Source: records (1/1) on task manager a", "sink: Writer (1/1) on task manager b"],
        });
        let mut flink = flink();
        flink["results"] = json!([flink_row]);
        flink["cluster_starts"] = json!("2 × 1 slots: 3000 ms, 2 × 2 slots: 1500 ms");
        std::fs::write(dir.join("flink-remote.json"), flink.to_string()).expect("write");
        let mut value = suite();
        value["results"] = json!([
            row(experiment, "weir remote exchange, epoll", true, 50.0),
            row(
                experiment,
                "raw TCP ceiling (32 KiB blocking writes and reads)",
                false,
                40.0
            ),
        ]);
        let note = merge(&dir, "remote", &mut value).expect("remote has a Flink peer");
        let rows = value["results"].as_array().expect("rows");
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[2]["peer_over_weir"].as_f64(), Some(10.0));
        assert!(
            note.contains(&format!("| {experiment} | yes | 9 | 0 | Source: records (1/1) on task manager a; sink: Writer (1/1) on task manager b |")),
            "{note}"
        );
        assert!(note.contains("2 × 2 slots: 1500 ms"), "{note}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn suites_without_a_flink_peer_get_no_note() {
        let dir = scratch("none");
        let mut value = suite();
        assert!(merge(&dir, "ring", &mut value).is_none());
        assert_eq!(value, suite());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_report_shows_flink_rows_or_says_why_not() {
        let data = scratch("report-data");
        let out = scratch("report-out");
        std::fs::write(data.join("async.json"), suite().to_string()).expect("write");
        std::fs::write(data.join("flink-async.json"), flink().to_string()).expect("write");
        crate::report::generate(&data, &out, "test").expect("report");
        let report = std::fs::read_to_string(out.join("REPORT.md")).expect("report");
        assert!(
            report.contains("| flink unordered | 400.0 | 2500000 | 4.00× |"),
            "{report}"
        );
        assert!(report.contains("Apache Flink 2.3.0"), "{report}");
        // No exchange suite at all: nothing to put Flink beside.
        assert!(!report.contains("flink-exchange.json"), "{report}");
        std::fs::remove_file(data.join("flink-async.json")).expect("remove");
        crate::report::generate(&data, &out, "test").expect("report");
        let report = std::fs::read_to_string(out.join("REPORT.md")).expect("report");
        assert!(!report.contains("| flink unordered"), "{report}");
        assert!(
            report.contains("Apache Flink: not measured in this run"),
            "{report}"
        );
        let _ = std::fs::remove_dir_all(&data);
        let _ = std::fs::remove_dir_all(&out);
    }
}
