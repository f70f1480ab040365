//! Redis lookup workloads: `GET` of 100-byte values from a `redis-server` pinned to the
//! second bench core, C lookups in flight, each implementation on the first core:
//!
//! - Weir's async operator over its Redis client on one worker, with the io_uring and
//!   the epoll driver, each with plain pipelining and with the `GET`s of a driver turn
//!   batched into `MGET`s; the worker polls for [`SPIN`] before it parks, as a runtime
//!   worker built with `RuntimeBuilder::spin(SPIN)` does (`WEIR_SPIN=100us weir run`);
//!   and the same on io_uring without that spin, parking as soon as it is idle, as the
//!   peers' tokio runtime does: the rows the peers are compared with;
//! - `redis` (redis-rs) as its documentation advises for concurrent use: one
//!   multiplexed async connection (which pipelines the commands of concurrent callers
//!   on its one socket) shared by clones, on a tokio current-thread runtime, tuned as
//!   its docs allow (no response timeout, a pipeline buffer of at least C,
//!   `TCP_NODELAY`: see [`redis_rs_client`]; each task refills one `Cmd` and sends it
//!   with `send_packed_command`; redis-rs 1.2.2, the newest that builds on the
//!   workspace's rust-version, has no setting for its write back-pressure boundary, so
//!   its 8 KiB default stands), driven by one task per call in flight
//!   (`by_tasks`); and in the two batched forms its users reach for in bulk
//!   enrichment, `redis::pipe()` of k `GET`s and `MGET` of k keys, C / k calls in flight
//!   ([`peer_batch`]);
//! - `fred`, likewise: one client (auto-pipelining on, its default; `TCP_NODELAY`),
//!   `Bytes` replies, one task per call, and its `pipeline()` and `mget` of k keys;
//! - a reference for scale: `redis-benchmark -P 64 -t get -r 100000` (its 50
//!   connections, 64 commands pipelined on each), pinned to the first core: the
//!   server's rate under its own single-threaded load tool. It is not a ceiling: one
//!   Weir worker passes it from a few hundred requests in flight, so it bounds the
//!   tool, not the work.
//!
//! Every implementation reads the same 100,000 keys of 100-byte values, named as
//! `redis-benchmark -r` names them (`key:000000000000` ...): the reference too, since a
//! server looking up one hot key (`redis-benchmark` without `-r`) runs about 3× faster
//! than one looking up keys spread over its memory, which is other work. Weir and
//! the peers read the keys in turn and check each value's length; the latency is from
//! call to answer, of one call in `LATENCY_SAMPLE_EVERY` (as the operator samples it).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use weir_engine::async_io::{
    AsyncConfig, AsyncFunction, AsyncWaitOperator, BatchConfig, Batched, OutputMode,
};
use weir_engine::element::{Collector, StreamElement};
use weir_engine::limits::LATENCY_SAMPLE_EVERY;
use weir_engine::park::Parker;
use weir_net::redis::{
    load_keys_with, Args, Lookup, RedisBatchFunction, RedisClient, RedisConfig, RedisFunction,
    RedisRequest, RedisServer, RedisUrl, Reply, ServerOptions,
};
use weir_net::DriverKind;

use crate::affinity::{bench_cores, pin};
use crate::async_peers::{histogram, Measurement};
use hdrhistogram::Histogram;

/// Keys loaded and read in turn.
pub const KEYS: u64 = 100_000;
/// Bytes per value.
pub const VALUE_SIZE: usize = 100;
/// Writes key `n`'s name as `redis-benchmark -r` does.
pub fn key(out: &mut Vec<u8>, n: u64) {
    use std::io::Write as _;
    let _ = write!(out, "key:{n:012}");
}
/// Keys per `MGET` at most when batching.
pub const MGET_MAX_KEYS: usize = 512;

/// Keys per `MGET` with `c` lookups in flight (the batched operator's
/// `max_batch_size`): `c / 2`, as the peers' batched forms send (two `MGET`s in flight,
/// so that the server works on one while the client handles the other), at most
/// [`MGET_MAX_KEYS`].
pub fn mget_keys(c: usize) -> usize {
    (c / 2).clamp(1, MGET_MAX_KEYS)
}
/// How long Weir's worker polls before it parks in these workloads: longer than a
/// loopback round trip, so a worker waiting for one reply takes it without the
/// wake-up of a parked thread.
pub const SPIN: Duration = Duration::from_micros(100);

/// A `redis-server` on the second bench core with the bench keys loaded.
pub fn server() -> Result<RedisServer, String> {
    let (_, core_b) = bench_cores();
    let server = RedisServer::start(ServerOptions {
        core: core_b.map(|c| c.id),
        ..ServerOptions::default()
    })
    .map_err(|e| e.to_string())?;
    load_keys_with(&server.url(), KEYS, VALUE_SIZE, key, |_| {}).map_err(|e| e.to_string())?;
    Ok(server)
}

#[derive(Debug, Clone, Copy)]
struct Get(u64);

impl RedisRequest for Get {
    /// The call's number and its value's length.
    type Out = (u64, usize);
    fn lookup(&self, args: &mut Args) -> Lookup {
        args.push_fmt(format_args!("key:{:012}", self.0 % KEYS));
        Lookup::Get
    }
    fn complete(self, reply: Reply<'_>) -> (u64, usize) {
        (self.0, reply.value().map_or(0, <[u8]>::len))
    }
}

/// Counts the values, checks their length, and sums the calls' numbers (so that a call
/// answered twice and one never answered cannot pass for all of them).
struct Count(u64, u64);

impl Collector<(u64, usize)> for Count {
    fn collect(&mut self, element: StreamElement<(u64, usize)>) {
        if let Some(record) = element.as_record() {
            let (call, len) = record.value;
            assert_eq!(len, VALUE_SIZE, "every key holds its value");
            self.0 += 1;
            self.1 = self.1.wrapping_add(call);
        }
    }
}

/// `n` GETs through Weir's unordered operator (capacity `c`) over its Redis client on
/// this thread with `driver`, polling for `spin` before blocking in the driver (the
/// runtime worker's loop, on this thread). With `mget`, the batched async operator
/// (`Batched`, batch timeout 0) cuts each turn's lookups into batches of up to
/// [`mget_keys`]`(c)`, each sent as one `MGET`, as `weir run --mget` does.
pub fn weir(
    driver: DriverKind,
    url: &RedisUrl,
    c: usize,
    mget: bool,
    spin: Duration,
    n: u64,
) -> Measurement {
    let (core_a, _) = bench_cores();
    pin(core_a);
    let mut driver = weir_net::build_driver(driver).expect("driver");
    let mut config = RedisConfig::new(url.clone());
    config.capacity = c * 2 + 16;

    config.request_timeout = Duration::from_secs(30);
    let client = Rc::new(RefCell::new(
        RedisClient::<Get>::new(config).expect("client"),
    ));
    let parker = Parker::current();
    let async_config = AsyncConfig::new(OutputMode::Unordered, c);
    if mget {
        let function = Batched::new(
            RedisBatchFunction::new(Rc::clone(&client)),
            BatchConfig::new(mget_keys(c), Duration::ZERO),
        );
        let operator =
            AsyncWaitOperator::new(function, async_config, parker.unparker()).expect("operator");
        drive(operator, &client, driver.as_mut(), spin, n)
    } else {
        let function = RedisFunction::new(Rc::clone(&client));
        let operator =
            AsyncWaitOperator::new(function, async_config, parker.unparker()).expect("operator");
        drive(operator, &client, driver.as_mut(), spin, n)
    }
}

/// The worker's loop for [`weir`]: takes records while there is room, fires what is
/// due (the batched operator's cut at the end of the turn), flushes the client and
/// turns the driver.
fn drive<F: AsyncFunction<In = Get, Out = (u64, usize)>>(
    mut operator: AsyncWaitOperator<F>,
    client: &Rc<RefCell<RedisClient<Get>>>,
    driver: &mut dyn weir_engine::runtime::Driver,
    spin: Duration,
    n: u64,
) -> Measurement {
    let epoch = Instant::now();
    let spin_ns = spin.as_nanos() as u64;
    let mut progress_ns = 0;
    let mut out = Count(0, 0);
    let mut next = 0;
    while out.0 < n {
        let now = epoch.elapsed().as_nanos() as u64;
        let submitted = next;
        while next < n && !operator.is_full() {
            operator
                .process_record(Get(next), None, now, &mut out)
                .expect("no failure");
            next += 1;
        }
        while operator
            .fire_due_timer(now, &mut out)
            .expect("no failure")
            .is_some()
        {}
        if next > submitted {
            progress_ns = now;
        }
        client.borrow_mut().flush(driver, now);
        let wait = if operator.has_completions() || now.saturating_sub(progress_ns) < spin_ns {
            Duration::ZERO
        } else {
            Duration::from_millis(50)
        };
        let mut events = 0;
        driver
            .turn(Some(wait), &mut |event| {
                events += 1;
                client.borrow_mut().on_event(&event);
            })
            .expect("driver turn");
        if events > 0 {
            progress_ns = now;
        }
        operator
            .drain(epoch.elapsed().as_nanos() as u64, &mut out)
            .expect("no failure");
    }
    let elapsed = epoch.elapsed();
    assert_eq!(
        out.1,
        n * n.saturating_sub(1) / 2,
        "every call answered once"
    );
    Measurement {
        elapsed,
        latency_ns: Some(operator.metrics().latency_ns.clone()),
        cpu: None,
    }
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// redis-rs tuned as its docs allow for `c` calls in flight on one multiplexed
/// connection: no response timeout (its default of 500 ms wraps every call in a timer),
/// a pipeline buffer of at least `c` commands (default 50: more calls in flight wait for
/// room in it), and `TCP_NODELAY` (which redis-rs leaves off, as Weir's client sets it).
pub fn redis_rs_client(url: &RedisUrl) -> redis::Client {
    use redis::IntoConnectionInfo;
    let info = url
        .to_string()
        .into_connection_info()
        .expect("a redis-rs URL")
        .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
    redis::Client::open(info).expect("redis-rs client")
}

/// See [`redis_rs_client`].
pub fn redis_rs_config(c: usize) -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new()
        .set_response_timeout(None)
        .set_pipeline_buffer_size(c.max(50))
}

/// How a peer's calls are issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerForm {
    /// One `GET` per call, `c` calls in flight.
    Get,
    /// `redis::pipe()` / fred's `pipeline()` of `k` `GET`s per call, `c / k` calls in
    /// flight.
    Pipeline(usize),
    /// One `MGET` of `k` keys per call, `c / k` calls in flight.
    Mget(usize),
}

impl PeerForm {
    /// Keys per call.
    pub fn keys(self) -> usize {
        match self {
            PeerForm::Get => 1,
            PeerForm::Pipeline(k) | PeerForm::Mget(k) => k.max(1),
        }
    }
}

/// Keys per batched call of a peer at `c` in flight: `c / 2` (at least 1), so that two
/// batches are in flight and the server works on one while the client handles the
/// replies of the other. The split was chosen by trying 1, 2, 4 and 8 calls at 256 in
/// flight on the bench VM (a one-off exploration, not kept as rows): one and two calls
/// were the fastest, within the VM's noise of each other, for both peers; pipelines of
/// `GET`s were slower than `MGET`s at every split (fred's most: each command of its
/// pipeline is queued by an `await`).
pub fn peer_batch(c: usize) -> usize {
    (c / 2).max(1)
}

/// `n` GETs with redis-rs: one multiplexed connection (tuned: [`redis_rs_client`]) on a
/// tokio current-thread runtime, driven as `by_tasks` says, each call `form`.
pub fn redis_rs(url: &RedisUrl, c: usize, form: PeerForm, n: u64) -> Measurement {
    let (core_a, _) = bench_cores();
    pin(core_a);
    let client = redis_rs_client(url);
    let local = tokio::task::LocalSet::new();
    local.block_on(&current_thread(), async move {
        let connection = client
            .get_multiplexed_async_connection_with_config(&redis_rs_config(c))
            .await
            .expect("redis-rs connects");
        by_tasks(n, c, form.keys(), move |share| {
            // One clone per task, not per call.
            let mut connection = connection.clone();
            async move {
                let mut keys = Vec::new();
                let mut pipe = redis::pipe();
                // One command per task, refilled for each call and sent packed, as a
                // user who issues millions of the same command does (no `Cmd` built
                // per call).
                let mut command = redis::Cmd::new();
                while let Some(batch) = share.next(&mut keys) {
                    let found = match form {
                        PeerForm::Get => {
                            command.clear();
                            command.arg("GET").arg(&keys[0]);
                            let reply =
                                connection.send_packed_command(&command).await.expect("GET");
                            let value: Option<Vec<u8>> =
                                redis::from_redis_value(reply).expect("a GET reply");
                            usize::from(value.is_some_and(|v| v.len() == VALUE_SIZE))
                        }
                        PeerForm::Pipeline(_) => {
                            pipe.clear();
                            for key in &keys {
                                pipe.get(key);
                            }
                            let values: Vec<Option<Vec<u8>>> =
                                pipe.query_async(&mut connection).await.expect("pipeline");
                            full_values(values.iter().map(|v| v.as_ref().map(Vec::len)))
                        }
                        PeerForm::Mget(_) => {
                            command.clear();
                            command.arg("MGET").arg(&keys);
                            let reply = connection
                                .send_packed_command(&command)
                                .await
                                .expect("MGET");
                            let values: Vec<Option<Vec<u8>>> =
                                redis::from_redis_value(reply).expect("an MGET reply");
                            full_values(values.iter().map(|v| v.as_ref().map(Vec::len)))
                        }
                    };
                    share.done(batch, found);
                }
            }
        })
        .await
    })
}

/// How many of the values had the benchmark's length.
fn full_values(lengths: impl Iterator<Item = Option<usize>>) -> usize {
    lengths.filter(|len| *len == Some(VALUE_SIZE)).count()
}

/// `n` GETs with fred: one client (auto-pipelining, its default; `TCP_NODELAY`), values
/// as `Bytes` (no copy out of its read buffer), on a tokio current-thread runtime,
/// driven as `by_tasks` says, each call `form`.
pub fn fred(url: &RedisUrl, c: usize, form: PeerForm, n: u64) -> Measurement {
    use bytes::Bytes;
    use fred::prelude::{ClientLike, KeysInterface, TcpConfig};
    let (core_a, _) = bench_cores();
    pin(core_a);
    let config = fred::prelude::Config::from_url(&url.to_string()).expect("fred config");
    let local = tokio::task::LocalSet::new();
    local.block_on(&current_thread(), async move {
        let client = fred::prelude::Builder::from_config(config)
            .with_connection_config(|connection| {
                connection.tcp = TcpConfig {
                    nodelay: Some(true),
                    ..TcpConfig::default()
                };
            })
            .build()
            .expect("fred client");
        client.init().await.expect("fred connects");
        let caller = client.clone();
        let measured = by_tasks(n, c, form.keys(), move |share| {
            let client = caller.clone();
            async move {
                let mut keys = Vec::new();
                while let Some(batch) = share.next(&mut keys) {
                    let found = match form {
                        PeerForm::Get => {
                            let value: Option<Bytes> =
                                client.get(keys[0].as_str()).await.expect("GET");
                            usize::from(value.is_some_and(|v| v.len() == VALUE_SIZE))
                        }
                        PeerForm::Pipeline(_) => {
                            let pipeline = client.pipeline();
                            for key in &keys {
                                let () = pipeline.get(key.as_str()).await.expect("queued");
                            }
                            let values: Vec<Option<Bytes>> =
                                pipeline.all().await.expect("pipeline");
                            full_values(values.iter().map(|v| v.as_ref().map(Bytes::len)))
                        }
                        PeerForm::Mget(_) => {
                            let names: Vec<&str> = keys.iter().map(String::as_str).collect();
                            let values: Vec<Option<Bytes>> =
                                client.mget(names).await.expect("MGET");
                            full_values(values.iter().map(|v| v.as_ref().map(Bytes::len)))
                        }
                    };
                    share.done(batch, found);
                }
            }
        })
        .await;
        let _ = client.quit().await;
        measured
    })
}

/// A task's share of the work in `by_tasks`: it hands out the next keys and takes
/// each call's outcome.
pub struct Share {
    next: Rc<std::cell::Cell<u64>>,
    n: u64,
    k: u64,
    latency: Rc<RefCell<Histogram<u64>>>,
    done: Rc<std::cell::Cell<u64>>,
}

/// One call's keys: `first..end`, and when it was made if one of them is sampled.
pub struct Batch {
    first: u64,
    end: u64,
    invoked: Option<(Instant, u64)>,
}

impl Share {
    /// The next call's keys, written into `keys` (its strings reused), or `None` when
    /// every key has been called.
    pub fn next(&self, keys: &mut Vec<String>) -> Option<Batch> {
        use std::fmt::Write as _;
        let first = self.next.get();
        if first >= self.n {
            return None;
        }
        let end = (first + self.k).min(self.n);
        self.next.set(end);
        keys.resize_with((end - first) as usize, String::new);
        for (key, i) in keys.iter_mut().zip(first..end) {
            key.clear();
            let _ = write!(key, "key:{:012}", i % KEYS);
        }
        let sampled = (first..end)
            .filter(|i| i % LATENCY_SAMPLE_EVERY == 0)
            .count() as u64;
        Some(Batch {
            first,
            end,
            invoked: (sampled > 0).then(|| (Instant::now(), sampled)),
        })
    }

    /// The call of `batch` answered, `found` of its values with the benchmark's length
    /// (every one must have it).
    pub fn done(&self, batch: Batch, found: usize) {
        assert_eq!(
            found as u64,
            batch.end - batch.first,
            "every key holds its value"
        );
        if let Some((invoked, sampled)) = batch.invoked {
            let took = invoked.elapsed().as_nanos().max(1) as u64;
            self.latency.borrow_mut().saturating_record_n(took, sampled);
        }
        self.done.set(self.done.get() + found as u64);
    }
}

/// `n` GETs of the benchmark's keys, `k` keys per call and `c` keys in flight, driven as
/// a competent tokio user drives a pipelined client: `c / k` tasks on this thread's
/// `LocalSet` (each made by `task` from its [`Share`]), each taking the next `k` keys and
/// awaiting its call, so the server works on some calls while the client handles the
/// replies of others. (A `FuturesUnordered` of the calls, `buffer_unordered(c)` polled
/// `unconstrained`, was slower than these tasks in every round of a one-off exploration
/// at 256 in flight: the client and the server take turns.) Every key is
/// handed out once and every value checked; the latency of one key in
/// `LATENCY_SAMPLE_EVERY` is its call's, from call to answer, as the operator samples it.
async fn by_tasks<T, Fut>(n: u64, c: usize, k: usize, task: T) -> Measurement
where
    T: Fn(Share) -> Fut,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let start = Instant::now();
    let next = Rc::new(std::cell::Cell::new(0u64));
    let done = Rc::new(std::cell::Cell::new(0u64));
    let latency = Rc::new(RefCell::new(histogram()));
    let tasks = (c / k).max(1);
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            tokio::task::spawn_local(task(Share {
                next: Rc::clone(&next),
                n,
                k: k as u64,
                latency: Rc::clone(&latency),
                done: Rc::clone(&done),
            }))
        })
        .collect();
    for handle in handles {
        handle.await.expect("a call task");
    }
    let elapsed = start.elapsed();
    assert_eq!(done.get(), n);
    let latency = latency.borrow().clone();
    Measurement {
        elapsed,
        latency_ns: Some(latency),
        cpu: None,
    }
}

/// The reference: `redis-benchmark -P 64 -t get -r 100000 -n n` (50 connections),
/// pinned to the first core. The time is `n` over the rate it reports.
pub fn reference(url: &RedisUrl, n: u64) -> Measurement {
    let (core_a, _) = bench_cores();
    // Pinned like the other implementations (taskset, from util-linux).
    let mut command = match core_a {
        Some(core) => {
            let mut taskset = std::process::Command::new("taskset");
            taskset.args(["-c", &core.id.to_string(), "redis-benchmark"]);
            taskset
        }
        None => std::process::Command::new("redis-benchmark"),
    };
    let output = command
        .args(["-h", &url.host, "-p", &url.port.to_string()])
        .args(["-P", "64", "-t", "get", "-r", &KEYS.to_string()])
        .args(["-n", &n.to_string(), "--csv"])
        .output()
        .expect("redis-benchmark runs (Debian package redis-tools)");
    assert!(
        output.status.success(),
        "redis-benchmark failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    let rps = parse_csv_rate(&text, "GET")
        .unwrap_or_else(|| panic!("no GET rate in redis-benchmark's output: {text}"));
    Duration::from_secs_f64(n as f64 / rps).into()
}

/// The requests per second of `test` in `redis-benchmark --csv` output
/// (`"GET","476190.47",...`).
pub fn parse_csv_rate(text: &str, test: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let mut fields = line.split(',').map(|f| f.trim().trim_matches('"'));
        if fields.next()? != test {
            return None;
        }
        fields.next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_benchmark_csv_rates_parse() {
        let _cores = crate::affinity::exclusive_cores();
        let text = "\"test\",\"rps\",\"avg_latency_ms\"\n\"GET\",\"476190.47\",\"5.1\"\n";
        assert_eq!(parse_csv_rate(text, "GET"), Some(476190.47));
        assert_eq!(parse_csv_rate(text, "SET"), None);
        assert_eq!(parse_csv_rate("garbage", "GET"), None);
    }

    /// Every implementation reads every value (when Redis is installed).
    #[test]
    fn every_implementation_gets_every_value() {
        let _cores = crate::affinity::exclusive_cores();
        if std::env::var(weir_net::redis::TEST_URL_VAR).is_err() {
            eprintln!("note: skipped: WEIR_REDIS_URL is unset (scripts/redis.sh start)");
            return;
        }
        let server = server().expect("redis-server");
        let url = server.url();
        for (c, n) in [(1, 20), (16, 2_000), (256, 3_000)] {
            for (mget, spin) in [(false, SPIN), (true, SPIN), (false, Duration::ZERO)] {
                weir(DriverKind::Epoll, &url, c, mget, spin, n);
                if weir_net::build_driver(DriverKind::Uring).is_ok() {
                    weir(DriverKind::Uring, &url, c, mget, spin, n);
                }
            }
            for form in [
                PeerForm::Get,
                PeerForm::Pipeline(peer_batch(c)),
                PeerForm::Mget(peer_batch(c)),
            ] {
                assert!(!redis_rs(&url, c, form, n)
                    .latency_ns
                    .expect("sampled")
                    .is_empty());
                assert!(!fred(&url, c, form, n)
                    .latency_ns
                    .expect("sampled")
                    .is_empty());
            }
        }
        assert!(reference(&url, 10_000).elapsed > Duration::ZERO);
    }
}
