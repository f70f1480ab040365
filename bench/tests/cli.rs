//! `weir run` and `weir report` as a user meets them, through the built binary: settings
//! that cannot work are one-line errors before anything starts, a failed job still
//! prints its table and writes its JSON with the cause, and the run says what it ran.

use std::path::PathBuf;
use std::process::{Command, Output};

fn weir(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .env_remove("WEIR_DRIVER")
        .output()
        .expect("weir runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The cores this process may run on, as `weir run` counts them.
fn machine_cores() -> usize {
    core_affinity::get_core_ids().map_or(1, |ids| ids.len().max(1))
}

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weir-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Asserts a settings error: exit status 2, nothing on stdout, one line on stderr.
fn assert_one_line_error(output: &Output) -> String {
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "stderr: {stderr}");
    assert!(output.stdout.is_empty(), "stdout: {}", text(&output.stdout));
    assert_eq!(stderr.lines().count(), 1, "stderr: {stderr}");
    assert!(stderr.starts_with("error: "), "stderr: {stderr}");
    stderr
}

#[test]
fn more_workers_than_cores_is_a_one_line_error_before_any_allocation() {
    let workers = machine_cores().max(999) + 1;
    // Under a 512 MiB address-space limit: the run used to allocate 33 GB for 1000
    // workers and abort with a backtrace.
    let output = Command::new("sh")
        .args(["-c", "ulimit -v 524288 && exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_weir"))
        .args(["run", "--cores", &workers.to_string()])
        .output()
        .expect("sh runs");
    let stderr = assert_one_line_error(&output);
    assert!(stderr.contains(&format!("--cores {workers}")), "{stderr}");
    assert!(stderr.contains("--oversubscribe"), "{stderr}");

    let stderr = assert_one_line_error(&weir(&["run", "--cores", "0"]));
    assert!(stderr.contains("at least one"), "{stderr}");
    let stderr = assert_one_line_error(&weir(&["run", "--cores", "0,0"]));
    assert!(stderr.contains("core 0 more than once"), "{stderr}");
    let stderr = assert_one_line_error(&weir(&["run", "--cores", "100000"]));
    assert!(stderr.contains("cores this process may run on"), "{stderr}");
}

#[test]
fn oversubscribe_runs_more_workers_than_cores() {
    let workers = (machine_cores() + 1).to_string();
    let output = weir(&[
        "run",
        "--cores",
        &workers,
        "--oversubscribe",
        "--records",
        "3000",
        "--quiet",
    ]);
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{stdout}{stderr}");
    assert!(stderr.contains(&format!("{workers} workers")), "{stderr}");
    assert!(
        row(&stdout, "outcome").is_some_and(|v| v == "completed"),
        "{stdout}"
    );
}

/// Runs `weir` with `args`, killing it if it has not ended after `limit`: a hang (a
/// deadlock) fails the test instead of stalling the suite. The limit is a watchdog far
/// above the run's time, not a performance bound.
fn weir_or_hang(args: &[&str], limit: std::time::Duration) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .env_remove("WEIR_DRIVER")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("weir starts");
    let start = std::time::Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let output = child.wait_with_output().expect("output");
            panic!(
                "weir {} hung for {limit:?} (a deadlock?)\n{}{}",
                args.join(" "),
                text(&output.stdout),
                text(&output.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

/// The scale the design targets: the main job's key-hash exchange fans out from every
/// worker to every worker, and at 64 workers and more a partition once had exactly one
/// segment per channel, so that with a buffer being written on every channel no segment
/// was free and the job hung. Enough records that every source writes to every channel.
#[test]
fn the_main_job_completes_at_64_128_and_200_workers() {
    for workers in [64, 128, 200] {
        let records = (workers * workers * 16).to_string();
        let workers = workers.to_string();
        let output = weir_or_hang(
            &[
                "run",
                "--cores",
                &workers,
                "--oversubscribe",
                "--records",
                &records,
                // Hundreds of workers and the lookup service share this machine's few
                // cores: a bounded number of lookups in flight, and a timeout far above
                // the queueing that oversubscription adds, keep the run about the
                // exchange (a timed-out lookup would fail the job, not hang it).
                "--capacity",
                "50",
                "--timeout",
                "120s",
                "--quiet",
            ],
            std::time::Duration::from_secs(600),
        );
        let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
        assert!(
            output.status.success(),
            "{workers} workers: {stdout}{stderr}"
        );
        assert!(
            row(&stdout, "outcome").is_some_and(|v| v == "completed"),
            "{workers} workers: {stdout}"
        );
        assert!(
            row(&stdout, "records out").is_some_and(|v| v == records),
            "{workers} workers: {stdout}"
        );
    }
}

/// The value of a row of the closing table.
fn row(table: &str, name: &str) -> Option<String> {
    table.lines().find_map(|line| {
        let rest = line.trim_start().strip_prefix(name)?;
        rest.starts_with("  ").then(|| rest.trim().to_string())
    })
}

#[test]
fn a_failed_job_prints_its_table_and_writes_its_cause() {
    let dir = scratch("failed");
    let json = dir.join("job.json");
    // The service answers after 5 s, the timeout is 50 ms: every lookup stalls past it.
    let output = weir(&[
        "run",
        "--cores",
        "1",
        "--records",
        "200",
        "--latency",
        "fixed:5s",
        "--timeout",
        "50ms",
        "--quiet",
        "--json",
        json.to_str().expect("utf-8 path"),
    ]);
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert_eq!(output.status.code(), Some(1), "{stdout}{stderr}");
    assert_eq!(
        row(&stdout, "outcome").as_deref(),
        Some("failed"),
        "{stdout}"
    );
    let cause = row(&stdout, "cause").expect("a cause row");
    assert!(cause.contains("timed out"), "{cause}");
    assert!(row(&stdout, "records in").is_some(), "{stdout}");
    assert!(row(&stdout, "retried / timed out").is_some(), "{stdout}");
    assert!(stderr.contains("--timeout"), "{stderr}");
    let value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON written"))
            .expect("valid JSON");
    assert_eq!(value["outcome"], "failed");
    assert_eq!(value["cause"].as_str(), Some(cause.as_str()));
    assert!(
        value["timed_out"].as_u64().is_some_and(|n| n > 0),
        "{value}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_unwritable_json_path_fails_before_the_run() {
    let started = std::time::Instant::now();
    let output = weir(&["run", "--json", "/nonexistent/dir/x.json"]);
    let stderr = assert_one_line_error(&output);
    assert!(stderr.contains("/nonexistent/dir/x.json"), "{stderr}");
    assert!(stderr.contains("--json"), "{stderr}");
    // Nothing ran: the default job takes seconds and prints its header first.
    assert!(!stderr.contains("weir run:"), "{stderr}");
    assert!(started.elapsed().as_secs() < 10);
}

#[test]
fn report_without_data_says_what_to_run_first() {
    let dir = scratch("report");
    let out = dir.join("out");
    let output = weir(&[
        "report",
        "--data",
        dir.join("none").to_str().expect("utf-8 path"),
        "--out",
        out.to_str().expect("utf-8 path"),
    ]);
    let stderr = text(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("scripts/report.sh"), "{stderr}");
    assert!(!out.join("REPORT.md").exists());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_run_says_what_it_runs_in_user_facing_names() {
    let help = text(&weir(&["run", "--help"]).stdout);
    assert!(help.contains("over all its attempts"), "{help}");
    let output = weir(&[
        "run",
        "--cores",
        "1",
        "--records",
        "2000",
        "--mode",
        "keyed",
        "--retries",
        "3",
        "--timeout",
        "1s",
        "--quiet",
    ]);
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{stdout}{stderr}");
    for expected in [
        "keyed mode",
        "latency fixed:1ms",
        "timeout 1s over 4 attempts (250ms each)",
        "1 worker ",
    ] {
        assert!(stderr.contains(expected), "{expected:?} in {stderr}");
    }
    for debug in ["KeyedOrdered", "Fixed(", "1 workers", "[true"] {
        assert!(
            !stdout.contains(debug) && !stderr.contains(debug),
            "{debug:?}: {stdout}{stderr}"
        );
    }
    // One worker leaves a core free for the embedded lookup service.
    let service = row(&stdout, "lookup service").expect("a lookup service row");
    if machine_cores() > 1 {
        assert!(service.contains("(own)"), "{service}");
    } else {
        assert!(service.contains("shared with workers"), "{service}");
    }
}

#[test]
fn redis_store_flags_that_cannot_work_are_one_line_errors() {
    let store = "redis://127.0.0.1:6399";
    let stderr = assert_one_line_error(&weir(&["run", "--mget", "8"]));
    assert!(stderr.contains("use it with --store"), "{stderr}");
    let stderr = assert_one_line_error(&weir(&["run", "--store", store, "--futures"]));
    assert!(stderr.contains("--futures"), "{stderr}");
    let stderr = assert_one_line_error(&weir(&["run", "--store", store, "--lookup-batch", "8"]));
    assert!(stderr.contains("--mget"), "{stderr}");
    let stderr = assert_one_line_error(&weir(&["run", "--futures", "--lookup-batch", "8"]));
    assert!(stderr.contains("pick one"), "{stderr}");
    let stderr = assert_one_line_error(&weir(&[
        "run",
        "--lookup-batch",
        "4096",
        "--value-size",
        "65536",
    ]));
    assert!(stderr.contains("lower one of them"), "{stderr}");
    let stderr = assert_one_line_error(&weir(&[
        "run",
        "--store",
        store,
        "--lookup-addr",
        "127.0.0.1:9",
    ]));
    assert!(stderr.contains("give one of them"), "{stderr}");
    let output = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["run", "--records", "10"])
        .env("WEIR_SPIN", "soon")
        .output()
        .expect("weir runs");
    let stderr = assert_one_line_error(&output);
    assert!(stderr.contains("WEIR_SPIN"), "{stderr}");
}

/// The remote suite's two-process rows work end to end: `weir compare` re-executes
/// itself as the producing process, and every record arrives (the workload asserts the
/// count and the order before it reports a time).
#[test]
fn the_remote_benchmark_runs_across_two_processes() {
    let output = weir(&[
        "compare",
        "remote",
        "--rounds",
        "1",
        "--scale",
        "0.02",
        "--only",
        "remote 2→2, 100-byte",
        "--implementation",
        "two processes",
    ]);
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "stderr: {}", text(&output.stderr));
    assert!(
        stdout.contains("weir remote exchange, two processes"),
        "{stdout}"
    );
}

#[test]
fn the_main_job_runs_over_two_processes_with_one_summary() {
    let dir = scratch("processes");
    let json = dir.join("cluster.json");
    let output = weir(&[
        "run",
        "--processes",
        "2",
        "--records",
        "50000",
        "--latency",
        "fixed:100us",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = text(&output.stdout);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("lost / duplicated            0 / 0"),
        "{stdout}"
    );
    assert!(stderr.contains("[process 1]"), "{stderr}");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("json written")).expect("json");
    assert_eq!(summary["processes"], 2);
    assert_eq!(summary["records_out"], 50_000);
    assert_eq!(summary["lost"], 0);
    assert_eq!(summary["duplicated"], 0);
    let per: u64 = summary["per_process"]
        .as_array()
        .expect("per-process reports")
        .iter()
        .map(|r| r["records_out"].as_u64().unwrap())
        .sum();
    assert_eq!(per, 50_000);
}

#[test]
fn cluster_flags_that_cannot_work_are_one_line_errors() {
    let stderr = assert_one_line_error(&weir(&[
        "run",
        "--process",
        "2",
        "--peers",
        "127.0.0.1:1,127.0.0.1:2",
    ]));
    assert!(stderr.contains("--process 2"), "{stderr}");
    let stderr = assert_one_line_error(&weir(&[
        "run",
        "--processes",
        "2",
        "--process",
        "0",
        "--peers",
        "127.0.0.1:1,127.0.0.1:2",
    ]));
    assert!(stderr.contains("one or the other"), "{stderr}");
    let stderr = assert_one_line_error(&weir(&[
        "run",
        "--processes",
        "2",
        "--sink",
        "redis-stream://127.0.0.1:1/out",
    ]));
    assert!(stderr.contains("run in one process"), "{stderr}");
    let stderr = assert_one_line_error(&weir(&[
        "run",
        "--processes",
        "2",
        "--metrics-addr",
        "127.0.0.1:0",
    ]));
    assert!(stderr.contains("same address"), "{stderr}");
}

/// A peer list of two free loopback ports (free when asked: another process may take
/// one before the job binds it, which fails the run, not the test's logic).
fn two_loopback_peers() -> String {
    let ports: Vec<u16> = (0..2)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port()
        })
        .collect();
    format!("127.0.0.1:{},127.0.0.1:{}", ports[0], ports[1])
}

#[test]
fn a_process_killed_mid_run_fails_the_others_with_the_channel_and_peer_named() {
    let peers = two_loopback_peers();
    let start = |process: &str| {
        Command::new(env!("CARGO_BIN_EXE_weir"))
            .args([
                "run",
                "--process",
                process,
                "--peers",
                &peers,
                "--records",
                "50000000",
                "--cores",
                "1",
                "--oversubscribe",
                "--quiet",
            ])
            .env_remove("WEIR_DRIVER")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("weir starts")
    };
    let survivor = start("0");
    let mut victim = start("1");
    // Let the job get going (not a timing assertion: the kill may come at any point).
    std::thread::sleep(std::time::Duration::from_millis(1500));
    victim.kill().expect("kill");
    let _ = victim.wait();
    let output = survivor.wait_with_output().expect("the survivor ends");
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("process 1"), "{stderr}");
    // Its consumers name the channel and the peer; its producers, whose consumers went
    // with the connection, the peer and why the connection ended.
    assert!(
        stderr.contains("remote channel")
            || stderr.contains("another process of the job went away")
            || stderr.contains("waiting for a peer"),
        "{stderr}"
    );
}

/// Processes started by hand that do not share the cluster secret, or do not run the
/// same job, are refused in the handshake, and the process that dialed says why at
/// once instead of waiting a minute for a peer that is "not running".
#[test]
fn processes_without_the_secret_or_of_another_job_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("secrets");
    let secret = |name: &str, bytes: &str| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        path.display().to_string()
    };
    let ours = secret("ours", "0123456789abcdef0123456789abcdef\n");
    let theirs = secret("theirs", "fedcba9876543210fedcba9876543210\n");
    let peers = two_loopback_peers();
    for (their_secret, their_records, why) in [
        (&theirs, "1000", "cluster secret"),
        (&ours, "2000", "another job"),
    ] {
        let mut other = Command::new(env!("CARGO_BIN_EXE_weir"))
            .args([
                "run",
                "--process",
                "1",
                "--peers",
                &peers,
                "--records",
                their_records,
            ])
            .args([
                "--secret-file",
                their_secret,
                "--cores",
                "1",
                "--oversubscribe",
                "--quiet",
            ])
            .env_remove("WEIR_DRIVER")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("weir starts");
        let output = weir_or_hang(
            &[
                "run",
                "--process",
                "0",
                "--peers",
                &peers,
                "--records",
                "1000",
                "--secret-file",
                &ours,
                "--cores",
                "1",
                "--oversubscribe",
                "--quiet",
            ],
            std::time::Duration::from_secs(50),
        );
        let _ = other.kill();
        let _ = other.wait();
        let stderr = text(&output.stderr);
        assert!(!output.status.success(), "{stderr}");
        assert!(stderr.contains("refused"), "{stderr}");
        assert!(stderr.contains(why), "{stderr}");
    }
    // A secret file others may read is a one-line error before anything starts.
    let open = dir.join("open");
    std::fs::write(&open, "0123456789abcdef0123456789abcdef").expect("write");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let stderr = assert_one_line_error(&weir(&[
        "run",
        "--process",
        "0",
        "--peers",
        &peers,
        "--secret-file",
        &open.display().to_string(),
    ]));
    assert!(stderr.contains("chmod 600"), "{stderr}");
}

/// `weir checkpoints DIR` lists every checkpoint, newest first, says which one a restore
/// takes (the newest completed, or none when it is damaged), and why.
#[test]
fn checkpoints_are_listed_with_the_one_a_restore_takes() {
    use weir_engine::checkpoint::{CheckpointMetadata, CheckpointStore};
    let dir = scratch("checkpoints");
    let store = CheckpointStore::open(&dir, 3).expect("store");
    for id in [1, 2, 3] {
        let task = store
            .write_task_state(id, "source-0", &[7u8; 100])
            .expect("state");
        store
            .complete(&CheckpointMetadata {
                id,
                triggered_unix_ms: 1_764_672_000_123 + id * 1000,
                duration: std::time::Duration::from_micros(2500),
                job: "job".into(),
                tasks: vec![task],
            })
            .expect("complete");
    }
    // The newest one's state altered.
    let file = store.checkpoint_dir(3).join("source-0.state");
    let mut bytes = std::fs::read(&file).expect("read");
    bytes[40] ^= 1;
    std::fs::write(&file, bytes).expect("write");
    let output = weir(&["checkpoints", &dir.display().to_string()]);
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", text(&output.stderr));
    let lines: Vec<&str> = stdout.lines().skip(2).collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    // The newest completed one is what a restore takes, and only it: damaged, it is
    // refused, never passed over for an older one.
    assert!(
        lines[0].starts_with("| 3 |") && lines[0].contains("unreadable: --restore refuses it"),
        "{stdout}"
    );
    assert!(lines[0].contains("source-0.state"), "{stdout}");
    assert!(
        lines[1].starts_with("| 2 | 2025-12-02 10:40:02.123 | 2.5 ms | 132 B | 1 |"),
        "{stdout}"
    );
    assert!(
        lines[1].contains("restored when named, or by --restore-fallback"),
        "{stdout}"
    );
    assert!(
        lines[2].starts_with("| 1 |") && !lines[2].contains("restore takes"),
        "{stdout}"
    );
    // A directory that does not exist is a one-line error.
    let output = weir(&["checkpoints", "/nonexistent/weir-checkpoints"]);
    assert!(!output.status.success());
    assert!(text(&output.stderr).contains("/nonexistent/weir-checkpoints"));
}

/// `--metrics-addr` serves Prometheus text while the job runs (scraped here mid-run),
/// and an address already in use is a one-line error before anything starts.
#[test]
fn the_metrics_endpoint_serves_during_a_run() {
    use std::io::{BufRead, BufReader, Read, Write};
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let addr = taken.local_addr().expect("its address").to_string();
    let stderr = assert_one_line_error(&weir(&[
        "run",
        "--records",
        "1000",
        "--metrics-addr",
        &addr,
    ]));
    assert!(stderr.contains("--metrics-addr"), "{stderr}");
    drop(taken);

    // About 3 s at 20,000 records/s.
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["run", "--records", "60000", "--rate", "20000", "--quiet"])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .env_remove("WEIR_DRIVER")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("weir runs");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let url = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|line| {
            line.strip_prefix("weir run: metrics at http://")
                .map(str::to_string)
        })
        .expect("the run names its metrics address");
    let addr = url.trim_end_matches("/metrics").to_string();
    // Scrape until the sources have counted records in (the job needs a moment to start).
    let mut scraped = String::new();
    for _ in 0..100 {
        let mut stream = std::net::TcpStream::connect(&addr).expect("the endpoint answers");
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: weir\r\nConnection: close\r\n\r\n")
            .expect("request");
        scraped.clear();
        stream.read_to_string(&mut scraped).expect("answer");
        if scraped.contains("weir_task_numRecordsIn_total{stage=\"generator") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(scraped.starts_with("HTTP/1.1 200 OK"), "{scraped}");
    for name in [
        "weir_task_numRecordsIn_total{stage=\"generator",
        "weir_task_busyTimeMsPerSecond{",
        "weir_task_backPressuredTimeMsPerSecond{",
        "weir_task_idleTimeMsPerSecond{",
        "weir_task_outPoolUsage{",
        "weir_task_inPoolUsage{",
        "weir_async_inFlight{",
    ] {
        assert!(scraped.contains(name), "{name} missing in\n{scraped}");
    }
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().expect("weir ends");
    assert!(status.success(), "{}", rest.join("\n"));
}

/// The Redis of `WEIR_REDIS_URL` as host:port, or `None` (the test says it skipped).
fn redis_authority(test: &str) -> Option<String> {
    match std::env::var("WEIR_REDIS_URL") {
        Ok(url) => Some(
            url.trim_start_matches("redis://")
                .trim_end_matches('/')
                .to_string(),
        ),
        Err(_) => {
            eprintln!("note: {test} skipped: WEIR_REDIS_URL is unset (scripts/test.sh sets it)");
            None
        }
    }
}

/// `weir produce-stream` fills a stream; `weir run --source … --bounded --sink …`
/// enriches every entry once into another stream, and says what it read and wrote.
#[test]
fn a_stream_is_enriched_into_another_stream() {
    let Some(redis) = redis_authority("a_stream_is_enriched_into_another_stream") else {
        return;
    };
    let tag = format!("weir:test:cli:{}", std::process::id());
    let (input, output) = (format!("{tag}:in"), format!("{tag}:out"));
    let produced = weir(&[
        "produce-stream",
        &format!("redis-stream://{redis}/{input}"),
        "--count",
        "20000",
        "--keys",
        "500",
    ]);
    assert!(produced.status.success(), "{}", text(&produced.stderr));
    assert!(text(&produced.stdout).contains("appended 20000 entries"));
    let run = weir(&[
        "run",
        "--quiet",
        "--cores",
        "2",
        "--oversubscribe",
        "--keys",
        "500",
        "--source",
        &format!("redis-stream://{redis}/{input}"),
        "--bounded",
        "--sink",
        &format!("redis-stream://{redis}/{output}"),
    ]);
    let stdout = text(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", text(&run.stderr));
    assert_eq!(
        row(&stdout, "records in").as_deref(),
        Some("20000"),
        "{stdout}"
    );
    assert_eq!(
        row(&stdout, "records out").as_deref(),
        Some("20000"),
        "{stdout}"
    );
    assert_eq!(
        row(&stdout, "lost / duplicated").as_deref(),
        Some("0 / 0"),
        "{stdout}"
    );
    let sink = row(&stdout, "redis stream sink").expect("the sink's line");
    assert!(sink.starts_with("20000 entries written"), "{sink}");
    assert!(text(&run.stderr).contains("up to its entries at start"));
    let xlen = Command::new("redis-cli")
        .args(["-u", &format!("redis://{redis}"), "XLEN", &output])
        .output();
    if let Ok(xlen) = xlen {
        assert_eq!(text(&xlen.stdout).trim(), "20000");
    }
    let _ = Command::new("redis-cli")
        .args(["-u", &format!("redis://{redis}"), "DEL", &input, &output])
        .output();
}

#[test]
fn stream_flags_that_cannot_work_are_one_line_errors() {
    // URLs are refused by the argument parser, with its pointer to --help.
    let refused = |args: &[&str]| {
        let output = weir(args);
        assert_eq!(output.status.code(), Some(2));
        text(&output.stderr)
    };
    let stderr = refused(&["run", "--source", "redis://127.0.0.1:1/s"]);
    assert!(stderr.contains("write redis-stream://"), "{stderr}");
    let stderr = refused(&["run", "--source", "redis-stream://127.0.0.1:1"]);
    assert!(stderr.contains("names no stream"), "{stderr}");
    let stderr = refused(&["run", "--bounded"]);
    assert!(stderr.contains("--source"), "{stderr}");
    // Nothing listens on port 1: said before the job starts.
    let stderr =
        assert_one_line_error(&weir(&["run", "--source", "redis-stream://127.0.0.1:1/in"]));
    assert!(stderr.contains("is Redis running there?"), "{stderr}");
    let stderr = assert_one_line_error(&weir(&[
        "run",
        "--sink",
        "redis-stream://127.0.0.1:1/out",
        "--sink-guarantee",
        "exactly-once",
    ]));
    assert!(stderr.contains("--checkpoint-interval"), "{stderr}");
    let stderr = assert_one_line_error(&weir(&["run", "--sink", "redis-stream://127.0.0.1:1/a,b"]));
    assert!(stderr.contains("name one stream"), "{stderr}");
}

/// `weir produce-kafka` fills a topic; `weir run --source kafka://… --bounded --sink
/// kafka://… --sink-guarantee exactly-once` with checkpoints enriches every record once
/// into another topic, in transactions, and says what it read and wrote.
#[test]
fn a_topic_is_enriched_into_another_topic_exactly_once() {
    let Some(brokers) = weir_net::kafka::test_brokers("a_topic_is_enriched_into_another_topic")
    else {
        return;
    };
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let (input, output) = (
        format!("weir-cli-in-{stamp}"),
        format!("weir-cli-out-{stamp}"),
    );
    let dir = scratch("kafka-run");
    let produced = weir(&[
        "produce-kafka",
        &format!("kafka://{brokers}/{input}"),
        "--count",
        "20000",
        "--keys",
        "500",
    ]);
    assert!(produced.status.success(), "{}", text(&produced.stderr));
    assert!(
        text(&produced.stdout).contains("wrote 20000 records"),
        "{}",
        text(&produced.stdout)
    );
    let json = dir.join("run.json");
    let run = weir(&[
        "run",
        "--quiet",
        "--cores",
        "2",
        "--oversubscribe",
        "--keys",
        "500",
        "--source",
        &format!("kafka://{brokers}/{input}"),
        "--bounded",
        "--sink",
        &format!("kafka://{brokers}/{output}"),
        "--sink-guarantee",
        "exactly-once",
        "--transactional-id-prefix",
        &format!("weir-cli-{stamp}"),
        "--checkpoint-interval",
        "100ms",
        "--checkpoint-dir",
        dir.join("chk").to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = text(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", text(&run.stderr));
    assert_eq!(
        row(&stdout, "records in").as_deref(),
        Some("20000"),
        "{stdout}"
    );
    assert_eq!(
        row(&stdout, "records out").as_deref(),
        Some("20000"),
        "{stdout}"
    );
    assert_eq!(
        row(&stdout, "lost / duplicated").as_deref(),
        Some("0 / 0"),
        "{stdout}"
    );
    let source = row(&stdout, "kafka source").expect("the source's line");
    assert!(source.starts_with("20000 records"), "{source}");
    let value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parses");
    assert_eq!(value["kafka_sink"]["delivered"], 20000, "{value}");
    assert!(
        value["kafka_sink"]["transactions_committed"]
            .as_u64()
            .unwrap_or(0)
            >= 1
    );
    // What the topic holds: every id once (one attempt, so no aborted copies).
    let admin = weir_net::kafka::KafkaAdmin::new(&brokers, std::time::Duration::from_secs(30))
        .expect("admin");
    let mut ids: Vec<u64> = admin
        .read_all(&output)
        .expect("reads")
        .iter()
        .map(|m| {
            let value = String::from_utf8(m.payload.clone().expect("value")).expect("text");
            let fields: Vec<&str> = value.split(',').collect();
            assert_eq!(fields.len(), 4, "{value}");
            assert_eq!(m.key.as_deref(), Some(fields[1].as_bytes()));
            fields[0].parse().expect("an id")
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..20_000).collect::<Vec<u64>>());
}

#[test]
fn kafka_flags_that_cannot_work_are_one_line_errors() {
    let refused = |args: &[&str]| {
        let output = weir(args);
        assert_eq!(output.status.code(), Some(2));
        text(&output.stderr)
    };
    let stderr = refused(&["run", "--source", "kafka://127.0.0.1:1"]);
    assert!(stderr.contains("names no topic"), "{stderr}");
    let stderr = refused(&["run", "--source", "kafka://127.0.0.1:1/bad topic"]);
    assert!(stderr.contains("not a legal topic name"), "{stderr}");
    let stderr = refused(&["run", "--source", "kafka:/x"]);
    assert!(stderr.contains("kafka://"), "{stderr}");
    // Nothing listens on port 1: said before the job starts.
    let stderr = assert_one_line_error(&weir(&["run", "--source", "kafka://127.0.0.1:1/in"]));
    assert!(stderr.contains("is a broker running there?"), "{stderr}");
    let stderr = assert_one_line_error(&weir(&[
        "run",
        "--sink",
        "kafka://127.0.0.1:1/out",
        "--sink-guarantee",
        "exactly-once",
    ]));
    assert!(stderr.contains("--checkpoint-interval"), "{stderr}");
    let stderr = assert_one_line_error(&weir(&["run", "--sink", "kafka://127.0.0.1:1/a,b"]));
    assert!(stderr.contains("name one topic"), "{stderr}");
    if let Some(brokers) = weir_net::kafka::test_brokers("kafka_flags_that_cannot_work") {
        let stderr = assert_one_line_error(&weir(&[
            "run",
            "--source",
            &format!(
                "kafka://{brokers}/weir-no-such-topic-{}",
                std::process::id()
            ),
        ]));
        assert!(stderr.contains("has no topic"), "{stderr}");
    }
}

/// `--restore` of a path that does not exist, of a directory whose newest completed
/// checkpoint is damaged, or a fresh start over committed output: each is refused by
/// name before anything starts (one line, exit status 2), in one process and over two.
#[test]
fn restores_that_would_break_exactly_once_are_refused_before_anything_starts() {
    let dir = scratch("refused-restores");
    let chk = dir.join("chk");
    let out = dir.join("out");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--records",
            "1000",
            "--checkpoint-interval",
            "50ms",
            "--checkpoint-dir",
            chk.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "--quiet",
        ];
        args.extend_from_slice(extra);
        weir(&args)
    };
    // No such path.
    let output = run(&["--restore", "/nonexistent/weir-restore"]);
    let stderr = assert_one_line_error(&output);
    assert!(
        stderr.contains("--restore /nonexistent/weir-restore"),
        "{stderr}"
    );
    // A completed checkpoint, then its state damaged.
    let output = run(&[]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let newest = weir_engine::checkpoint::storage::newest_completed(&chk)
        .unwrap()
        .expect("completed");
    let state = chk.join(format!("chk-{newest}")).join("s0-0-of-1.state");
    let state = if state.exists() {
        state
    } else {
        std::fs::read_dir(chk.join(format!("chk-{newest}")))
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "state"))
            .expect("a state file")
    };
    let name = state.file_name().unwrap().to_str().unwrap().to_string();
    let mut bytes = std::fs::read(&state).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(&state, bytes).unwrap();
    let committed = std::fs::read_dir(&out).unwrap().count();
    for processes in ["1", "2"] {
        let output = run(&["--restore", chk.to_str().unwrap(), "--processes", processes]);
        let stderr = assert_one_line_error(&output);
        assert!(stderr.contains(&name), "{stderr}");
        assert!(stderr.contains("cannot be restored"), "{stderr}");
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), committed);
    }
    // No restore over the committed output: a fresh start would write it again.
    let output = run(&[]);
    let stderr = assert_one_line_error(&output);
    assert!(stderr.contains("committed part files"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A supervisor starts every attempt with the same command: `--resume` starts from the
/// beginning where no checkpoint ever completed (the directory not there yet), and
/// restores the newest completed checkpoint once one has, saying which. A damaged newest
/// checkpoint is still refused by name, unless `--restore-fallback` is asked for: then
/// the older retained one is restored, the damaged one named as passed over and kept.
#[test]
fn a_supervisor_starts_every_attempt_with_the_same_command() {
    let dir = scratch("resume");
    let chk = dir.join("chk");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--records",
            "200000",
            "--checkpoint-interval",
            "20ms",
            "--checkpoint-dir",
            chk.to_str().unwrap(),
            "--checkpoints-retained",
            "3",
            "--resume",
            "--quiet",
        ];
        args.extend_from_slice(extra);
        weir(&args)
    };
    let first = run(&[]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let stderr = text(&first.stderr);
    assert!(
        stderr.contains("--resume: no checkpoint ever completed under"),
        "{stderr}"
    );
    let completed = weir_engine::checkpoint::storage::list(&chk)
        .unwrap()
        .into_iter()
        .filter(|l| l.metadata.is_ok())
        .count();
    assert!(completed >= 2, "retained: {completed}");
    let newest = weir_engine::checkpoint::storage::newest_completed(&chk)
        .unwrap()
        .expect("completed");
    let second = run(&[]);
    assert!(second.status.success(), "{}", text(&second.stderr));
    let stderr = text(&second.stderr);
    assert!(
        stderr.contains(&format!("restoring checkpoint {newest}")),
        "{stderr}"
    );
    // The newest completed one damaged: refused by name, then passed over on request.
    let newest = weir_engine::checkpoint::storage::newest_completed(&chk)
        .unwrap()
        .expect("completed");
    let damaged = chk.join(format!("chk-{newest}"));
    let state = std::fs::read_dir(&damaged)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "state"))
        .expect("a state file");
    let mut bytes = std::fs::read(&state).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(&state, bytes).unwrap();
    let name = state.file_name().unwrap().to_str().unwrap().to_string();
    let refused = run(&[]);
    let stderr = assert_one_line_error(&refused);
    assert!(stderr.contains(&name), "{stderr}");
    let fallback = run(&["--restore-fallback"]);
    assert!(fallback.status.success(), "{}", text(&fallback.stderr));
    let stderr = text(&fallback.stderr);
    assert!(
        stderr.contains(&format!("passing over {}", damaged.display())) && stderr.contains(&name),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("restoring the older checkpoint {}", newest - 1)),
        "{stderr}"
    );
    assert!(
        damaged.exists(),
        "the damaged checkpoint is kept for the operator"
    );
    // This run numbers its checkpoints after the damaged one: once it completed one,
    // that is the newest and the plain command restores it; until then (a run restored
    // at its end may complete none), the damaged one is still the newest, refused.
    let now = weir_engine::checkpoint::storage::newest_completed(&chk)
        .unwrap()
        .expect("completed");
    assert!(now >= newest, "{now} before {newest}");
    let again = run(&[]);
    if now > newest {
        assert!(again.status.success(), "{}", text(&again.stderr));
    } else {
        let stderr = assert_one_line_error(&again);
        assert!(stderr.contains(&name), "{stderr}");
    }
    // Over several processes the fallback is refused before anything starts.
    let output = run(&["--restore-fallback", "--processes", "2"]);
    let stderr = assert_one_line_error(&output);
    assert!(
        stderr.contains("--restore-fallback runs in one process"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
