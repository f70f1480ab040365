//! `weir run --processes N`: the main job over N local processes, started and summed up
//! here.
//!
//! The launcher picks a free loopback port per process, splits the machine's cores among
//! them (or passes `--cores` on unchanged), and starts `weir run … --process I --peers
//! A,B,…` for each, which run one process of the job each (the same code a process on
//! another host runs: see the guide's "Processes and hosts", `guide/src/cluster.md`). The processes find each other,
//! run their subtasks, and write their report as JSON; the launcher prints one summary:
//! records in and out summed, ids lost counted over all processes (each id's key names
//! one sink subtask, so a process counts its duplicates itself and the launcher adds up
//! the distinct ids), the slowest process's time, the worst process's latency
//! percentiles, and the CPU of all processes per record.
//!
//! With checkpoints (`--checkpoint-interval`), the launcher supervises its processes:
//! when one dies (killed, crashed, or failed), it kills the others and starts them all
//! again from the latest completed checkpoint (`--restore` with the checkpoint
//! directory, which every process shares), as `--restart-strategy` allows. It restores
//! only from the newest completed checkpoint, and starts over only where none ever
//! completed: a newest checkpoint that cannot be read back whole ends the run with an
//! error naming the file, whatever the restart strategy says, and so does a process
//! that refused its settings (exit status 2), which a restart would not change.
//!
//! The processes die with their launcher: each is started with `PR_SET_PDEATHSIG`
//! (SIGKILL when the launcher's thread that started it ends, as an OOM kill or a crashed
//! supervisor ends it), and checks before it runs that the launcher is still its parent
//! (it may have died before the call). What they left (unfinished checkpoints, pending
//! part files) is what a kill -9 leaves, which the next run's restore cleans up.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::job::{RunError, WorkerPlan};

/// What the launcher needs besides the command line it re-issues.
#[derive(Debug, Clone)]
pub struct Launch<'a> {
    /// Processes to start.
    pub processes: usize,
    /// `--cores` as given (passed to every process), or `None` to split the machine.
    pub cores: Option<&'a str>,
    /// Records in all.
    pub records: u64,
    /// Async capacity per source subtask (for Little's limit).
    pub capacity: usize,
    /// The lookups' mean latency (zero: unknown, as with Redis).
    pub mean_latency: Duration,
    /// Where to write the summed-up JSON.
    pub json: Option<&'a Path>,
    /// The cluster secret's file, if the user gave one (otherwise one is made for the
    /// run, in a directory only this user may read).
    pub secret_file: Option<&'a Path>,
    /// With checkpoints: the restart strategy and the checkpoint directory the
    /// processes restore from after a failure.
    pub restart: Option<(weir_engine::checkpoint::RestartStrategy, &'a Path)>,
    /// `--output`: the committed part files the summary checks, over every attempt.
    pub output: Option<&'a Path>,
}

/// The arguments of `weir run` without the ones the launcher sets per process.
pub fn child_args(args: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    let mut skip_value = false;
    for arg in args {
        if std::mem::take(&mut skip_value) {
            continue;
        }
        let name = arg.split('=').next().unwrap_or(arg);
        match name {
            "--processes" | "--json" | "--cores" | "--process" | "--peers" | "--secret-file"
            | "--restore" => {
                skip_value = !arg.contains('=');
            }
            "--quiet" | "--oversubscribe" => {}
            _ => out.push(arg.clone()),
        }
    }
    out
}

/// The cores of each process when the machine is split among `processes`: consecutive
/// equal shares, at least one core each (several processes then share a core).
pub fn split_cores(machine: &[usize], processes: usize) -> Vec<Vec<usize>> {
    let per = (machine.len() / processes.max(1)).max(1);
    (0..processes)
        .map(|i| {
            (0..per)
                .map(|k| machine[(i * per + k) % machine.len().max(1)])
                .collect()
        })
        .collect()
}

fn free_loopback_addrs(n: usize) -> Result<Vec<SocketAddr>, RunError> {
    // Bound together so that they differ; released just before the processes bind them.
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| RunError::Setting(format!("cannot find free loopback ports: {e}")))?;
    listeners
        .iter()
        .map(|l| l.local_addr())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| RunError::Setting(format!("cannot find free loopback ports: {e}")))
}

/// Makes a cluster secret for one run and writes it to `dir/secret`, readable by this
/// user only: the processes it starts prove to each other that they hold it.
fn write_secret(dir: &Path) -> Result<PathBuf, RunError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let secret =
        weir_net::transport::Secret::generate().map_err(|e| RunError::Setting(e.to_string()))?;
    let path = dir.join("secret");
    let _ = std::fs::remove_file(&path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|source| RunError::Json {
            path: path.clone(),
            source,
        })?;
    writeln!(file, "{}", secret.to_hex()).map_err(|source| RunError::Json {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// Starts the processes, waits for them, prints the summary; returns the exit status.
pub fn launch(launch: &Launch<'_>, run_args: &[String]) -> Result<i32, RunError> {
    let n = launch.processes;
    let exe = std::env::current_exe()
        .map_err(|e| RunError::Setting(format!("cannot find the weir executable: {e}")))?;
    // `--restore` as given applies to the first attempt; later ones restore from the
    // latest completed checkpoint.
    let mut restore: Option<PathBuf> = restore_arg(run_args);
    if let Some(path) = &restore {
        // Refused here, before any process starts, as each process would refuse it.
        crate::job::check_start_at(Some(path), launch.output)?;
    }
    let mut restarts = launch.restart.as_ref().map(|(strategy, _)| {
        weir_engine::checkpoint::Restarts::new(strategy.clone(), std::time::Instant::now())
    });
    loop {
        let peers = free_loopback_addrs(n)?;
        let peer_list = peers
            .iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let dir = std::env::temp_dir().join(format!("weir-cluster-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|source| RunError::Json {
            path: dir.clone(),
            source,
        })?;
        let secret_file = match launch.secret_file {
            Some(path) => path.to_path_buf(),
            None => write_secret(&dir)?,
        };
        let shares = match launch.cores {
            Some(_) => None,
            None => Some(split_cores(&WorkerPlan::machine_cores(), n)),
        };
        let base = child_args(run_args);
        eprintln!(
            "weir run: {n} processes on loopback ({peer_list}), {}",
            match &shares {
                Some(shares) => shares
                    .iter()
                    .enumerate()
                    .map(|(i, c)| format!("process {i} on cores {}", crate::job::cores_text(c)))
                    .collect::<Vec<_>>()
                    .join(", "),
                None => format!("each with --cores {}", launch.cores.unwrap_or_default()),
            }
        );
        let mut children = Vec::with_capacity(n);
        let mut forwarders = Vec::with_capacity(n);
        let mut paths: Vec<PathBuf> = Vec::with_capacity(n);
        for i in 0..n {
            let path = dir.join(format!("process-{i}.json"));
            let mut command = Command::new(&exe);
            command
                .arg("run")
                .args(&base)
                .arg("--process")
                .arg(i.to_string())
                .arg("--peers")
                .arg(&peer_list)
                .arg("--json")
                .arg(&path)
                .arg("--secret-file")
                .arg(&secret_file)
                .arg("--quiet");
            if let Some(path) = &restore {
                command.arg("--restore").arg(path);
            }
            match (&shares, launch.cores) {
                (Some(shares), _) => {
                    // A trailing comma: a list of core ids even with one (`1,` is core 1).
                    let list = shares[i]
                        .iter()
                        .map(|c| format!("{c},"))
                        .collect::<String>();
                    command.arg("--cores").arg(list).arg("--oversubscribe");
                }
                (None, Some(cores)) => {
                    command.arg("--cores").arg(cores).arg("--oversubscribe");
                }
                (None, None) => {}
            }
            let launcher = std::process::id();
            // SAFETY: the closure runs in the child between fork and exec, where only
            // async-signal-safe calls are allowed: two system calls, no allocation (the
            // error is a raw OS code). PR_SET_PDEATHSIG follows the thread that forks,
            // this one, which is the thread that waits for the processes below.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // The launcher died before the call: no signal would come.
                    if libc::getppid() as u32 != launcher {
                        return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                    }
                    Ok(())
                })
            };
            let mut child = command
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| RunError::Setting(format!("cannot start process {i}: {e}")))?;
            let stderr = child.stderr.take().expect("piped");
            forwarders.push(std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    eprintln!("[process {i}] {line}");
                }
            }));
            children.push(child);
            paths.push(path);
        }
        // Until every process ended, or one failed while the others run on.
        let mut statuses: Vec<Option<Option<i32>>> = vec![None; n];
        let failed = loop {
            for (i, child) in children.iter_mut().enumerate() {
                if statuses[i].is_none() {
                    if let Ok(Some(status)) = child.try_wait() {
                        statuses[i] = Some(status.code());
                    }
                }
            }
            let failed = statuses
                .iter()
                .position(|s| matches!(s, Some(code) if *code != Some(0)));
            if failed.is_some() || statuses.iter().all(Option::is_some) {
                break failed;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        // A process that refused its settings (exit status 2: an unreadable
        // checkpoint, committed output a fresh start would write again, a bad flag)
        // would refuse them again: no restart.
        let refused = failed.filter(|&i| statuses[i] == Some(Some(2)));
        if let (Some(i), None, Some(restarts), Some((_, checkpoints))) =
            (failed, refused, restarts.as_mut(), launch.restart.as_ref())
        {
            if let Some(delay) = restarts.on_failure(std::time::Instant::now()) {
                for child in &mut children {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                for forwarder in forwarders {
                    let _ = forwarder.join();
                }
                let _ = std::fs::remove_dir_all(&dir);
                // From the newest completed checkpoint, which must read back whole;
                // from the start only where none ever completed.
                let from = match weir_engine::checkpoint::storage::restore_point(checkpoints) {
                    Ok(Some(restored)) => format!(
                        "from checkpoint {} (the latest completed checkpoint)",
                        restored.metadata.id
                    ),
                    Ok(None) => format!(
                        "from the start (no checkpoint ever completed under {})",
                        checkpoints.display()
                    ),
                    Err(error) => {
                        return Err(RunError::Setting(format!(
                            "process {i} ended, and the job cannot be restarted: {error}"
                        )))
                    }
                };
                eprintln!(
                    "weir run: process {i} ended ({}); restart {} of every process in {} {from}",
                    match statuses[i] {
                        Some(Some(code)) => format!("exit status {code}"),
                        _ => "killed by a signal".to_string(),
                    },
                    restarts.total(),
                    weir_net::lookup::format_duration(delay)
                );
                std::thread::sleep(delay);
                restore = Some(checkpoints.to_path_buf());
                continue;
            }
        }
        let mut statuses: Vec<Option<i32>> = statuses.into_iter().map(Option::flatten).collect();
        for (i, child) in children.iter_mut().enumerate() {
            if statuses[i].is_none() {
                statuses[i] = child.wait().map(|s| s.code()).unwrap_or(None);
            }
        }
        for forwarder in forwarders {
            let _ = forwarder.join();
        }
        let reports: Vec<Option<Value>> = paths
            .iter()
            .map(|p| {
                std::fs::read(p)
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok())
            })
            .collect();
        let _ = std::fs::remove_dir_all(&dir);
        let mut summary = summarize(launch, &peers, &statuses, &reports);
        if let (Some(output), "completed") =
            (launch.output, summary["outcome"].as_str().unwrap_or(""))
        {
            let audit = crate::job::audit_output(output, launch.records)?;
            summary["committed_output"] = json!({
                "dir": output.display().to_string(),
                "files": audit.files,
                "lines": audit.lines,
                "unique": audit.unique,
                "lost": audit.lost,
                "duplicated": audit.duplicated,
            });
        }
        return publish(&summary, launch.json);
    }
}

/// The value of `--restore` in `weir run`'s arguments, if given.
fn restore_arg(args: &[String]) -> Option<PathBuf> {
    let mut next = false;
    for arg in args {
        if std::mem::take(&mut next) {
            return Some(PathBuf::from(arg));
        }
        if let Some(value) = arg.strip_prefix("--restore=") {
            return Some(PathBuf::from(value));
        }
        next = arg == "--restore";
    }
    None
}

/// `weir summarize`: the summary of processes' reports written by `--process` runs;
/// returns the exit status (0: completed, nothing lost or duplicated).
pub fn summarize_files(paths: &[PathBuf], json: Option<&Path>) -> Result<i32, RunError> {
    let mut reports = Vec::with_capacity(paths.len());
    for path in paths {
        let bytes = std::fs::read(path).map_err(|source| RunError::Json {
            path: path.clone(),
            source,
        })?;
        let value: Value = serde_json::from_slice(&bytes).map_err(|e| {
            RunError::Setting(format!(
                "{} is not a weir run JSON report: {e}",
                path.display()
            ))
        })?;
        reports.push(Some(value));
    }
    let first = reports[0].as_ref().expect("read above");
    let settings = &first["settings"];
    let launch = Launch {
        processes: reports.len(),
        cores: None,
        records: settings["records"].as_u64().unwrap_or(0),
        capacity: settings["capacity"].as_u64().unwrap_or(0) as usize,
        mean_latency: first["lookup_mean_latency_ms"]
            .as_f64()
            .map_or(Duration::ZERO, |ms| Duration::from_secs_f64(ms / 1e3)),
        json,
        secret_file: None,
        restart: None,
        output: None,
    };
    let statuses: Vec<Option<i32>> = reports
        .iter()
        .map(|r| {
            Some(match r {
                Some(r) if r["outcome"] == "completed" => 0,
                _ => 1,
            })
        })
        .collect();
    let peers: Vec<String> = reports
        .iter()
        .flatten()
        .map(|r| format!("process {}", r["process"]))
        .collect();
    let mut summary = summarize(&launch, &[], &statuses, &reports);
    summary["peers"] = json!(peers);
    summary["processes"] = json!(reports.len());
    publish(&summary, json)
}

/// Prints the summary, writes its JSON if asked; the exit status (0: completed, nothing
/// lost or duplicated).
fn publish(summary: &Value, json: Option<&Path>) -> Result<i32, RunError> {
    println!("{}", render(summary));
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_vec_pretty(summary).unwrap_or_default()).map_err(
            |source| RunError::Json {
                path: path.to_path_buf(),
                source,
            },
        )?;
    }
    let committed_ok = summary
        .get("committed_output")
        .is_none_or(|a| a.is_null() || (a["lost"] == 0 && a["duplicated"] == 0));
    let ok = summary["outcome"] == "completed"
        && summary["lost"] == 0
        && summary["duplicated"] == 0
        && committed_ok;
    Ok(if ok { 0 } else { 1 })
}

fn sum(reports: &[Option<Value>], key: &str) -> u64 {
    reports
        .iter()
        .flatten()
        .map(|r| r[key].as_u64().unwrap_or(0))
        .sum()
}

fn max_f(reports: &[Option<Value>], f: impl Fn(&Value) -> Option<f64>) -> Option<f64> {
    reports.iter().flatten().filter_map(f).reduce(f64::max)
}

/// The summed-up report of the processes' JSON reports.
pub fn summarize(
    launch: &Launch<'_>,
    peers: &[SocketAddr],
    statuses: &[Option<i32>],
    reports: &[Option<Value>],
) -> Value {
    let completed = statuses.iter().all(|s| *s == Some(0))
        && reports
            .iter()
            .all(|r| r.as_ref().is_some_and(|r| r["outcome"] == "completed"));
    let records_out = sum(reports, "records_out");
    let unique = sum(reports, "unique");
    // A run restored from a checkpoint sees only what came after it: its sinks cannot
    // count what is missing (the exactly-once output files are where that is checked).
    let restored = reports
        .iter()
        .flatten()
        .any(|r| !r["checkpoints"]["restored_from"].is_null());
    let elapsed = max_f(reports, |r| r["elapsed_s"].as_f64()).unwrap_or(0.0);
    let workers = sum(reports, "workers");
    let cpu: f64 = reports
        .iter()
        .flatten()
        .filter_map(|r| r["cpu_s"].as_f64())
        .sum();
    let little = if launch.mean_latency.is_zero() {
        None
    } else {
        Some(launch.capacity as f64 * workers as f64 / launch.mean_latency.as_secs_f64())
    };
    let throughput = if elapsed > 0.0 {
        records_out as f64 / elapsed
    } else {
        0.0
    };
    let worst = |q: &str| max_f(reports, |r| r["latency_ns"][q].as_f64());
    json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "machine": crate::compare::machine(),
        "outcome": if completed { "completed" } else { "failed" },
        "processes": peers.len(),
        "peers": peers.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
        "exit_codes": statuses,
        "workers": workers,
        "records_in": sum(reports, "records_in"),
        "records_out": records_out,
        "failed": sum(reports, "failed"),
        "lost": if restored { 0 } else { launch.records.saturating_sub(unique) },
        "restored": restored,
        "duplicated": sum(reports, "duplicated"),
        "elapsed_s": elapsed,
        "throughput_records_per_s": throughput,
        "littles_limit_records_per_s": little,
        "fraction_of_littles_limit": little.map(|l| throughput / l),
        "latency_ns_worst_process": json!({
            "p50": worst("p50"), "p99": worst("p99"), "p99.9": worst("p99.9"), "max": worst("max"),
        }),
        "cpu_s": cpu,
        "cpu_per_record_ns": if records_out > 0 { Some(cpu * 1e9 / records_out as f64) } else { None },
        "per_process": reports,
    })
}

/// The summary table of a launched run.
pub fn render(summary: &Value) -> String {
    let us = |v: &Value| {
        v.as_f64()
            .map_or("-".to_string(), |ns| format!("{:.0}", ns / 1e3))
    };
    let latency = &summary["latency_ns_worst_process"];
    let mut out = String::new();
    let mut line = |name: &str, value: String| {
        out.push_str(&format!("  {name:<28} {value}\n"));
    };
    line(
        "outcome",
        summary["outcome"].as_str().unwrap_or("-").to_string(),
    );
    line(
        "processes / workers",
        format!("{} / {} in all", summary["processes"], summary["workers"]),
    );
    line("records in", summary["records_in"].to_string());
    line("records out", summary["records_out"].to_string());
    line("failed", summary["failed"].to_string());
    line(
        "lost / duplicated",
        if summary["restored"] == true {
            format!(
                "– / {} (this attempt only: it restored a checkpoint, and records before it \
                 are not counted here; with --output, \"committed output\" counts every attempt)",
                summary["duplicated"]
            )
        } else {
            format!("{} / {}", summary["lost"], summary["duplicated"])
        },
    );
    if let Some(audit) = summary.get("committed_output").filter(|a| !a.is_null()) {
        line(
            "committed output",
            crate::job::audit_text(&crate::job::OutputAudit {
                files: audit["files"].as_u64().unwrap_or(0) as usize,
                lines: audit["lines"].as_u64().unwrap_or(0),
                unique: audit["unique"].as_u64().unwrap_or(0),
                duplicated: audit["duplicated"].as_u64().unwrap_or(0),
                lost: audit["lost"].as_u64().unwrap_or(0),
            }),
        );
    }
    line(
        "elapsed",
        format!(
            "{:.3} s (the slowest process)",
            summary["elapsed_s"].as_f64().unwrap_or(0.0)
        ),
    );
    line(
        "throughput",
        format!(
            "{:.0} records/s",
            summary["throughput_records_per_s"].as_f64().unwrap_or(0.0)
        ),
    );
    if let Some(fraction) = summary["fraction_of_littles_limit"].as_f64() {
        line(
            "fraction of Little's limit",
            format!(
                "{:.1}% of {:.0} records/s",
                fraction * 100.0,
                summary["littles_limit_records_per_s"]
                    .as_f64()
                    .unwrap_or(0.0)
            ),
        );
    }
    line(
        "latency p50 / p99 / p99.9",
        format!(
            "{} / {} / {} µs (the worst process's)",
            us(&latency["p50"]),
            us(&latency["p99"]),
            us(&latency["p99.9"])
        ),
    );
    if let Some(cpu) = summary["cpu_per_record_ns"].as_f64() {
        line(
            "CPU per record",
            format!(
                "{:.3} µs (user + sys of all processes {:.2} s ÷ records out)",
                cpu / 1e3,
                summary["cpu_s"].as_f64().unwrap_or(0.0)
            ),
        );
    }
    out.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launcher_s_own_arguments_are_not_passed_on() {
        let args: Vec<String> = [
            "--records",
            "10",
            "--processes",
            "2",
            "--json=x.json",
            "--cores",
            "0,1",
            "--quiet",
            "--capacity",
            "5",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(child_args(&args), ["--records", "10", "--capacity", "5"]);
    }

    #[test]
    fn cores_are_split_in_equal_shares_at_least_one_each() {
        assert_eq!(split_cores(&[0, 1, 2, 3], 2), vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(split_cores(&[0, 1], 3), vec![vec![0], vec![1], vec![0]]);
    }
}
