//! The Redis client on both drivers against a real server: hits and misses, hashes,
//! a reply bigger than a receive buffer, credentials and databases, a server killed and
//! restarted mid-run with the operator retrying; against misbehaving peers: garbage,
//! a connection closed mid-reply, replies nested too deep, a reply trickled byte by byte;
//! and a client dropped while its worker's driver lives on, which ends its connection.
//!
//! The tests that need Redis find it through `WEIR_REDIS_URL` (`scripts/test.sh` and CI
//! set it after `scripts/redis.sh start`); without it they print a note and pass. The
//! ones that start servers of their own (credentials, restart) use the `redis-server`
//! binary next to it.

use std::cell::RefCell;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::rc::Rc;
use std::time::{Duration, Instant};

use weir_engine::async_io::{
    AsyncConfig, AsyncError, AsyncFunction, AsyncWaitOperator, BatchConfig, Batched, OperatorError,
    OutputMode, RetryStrategy,
};
use weir_engine::element::StreamElement;
use weir_engine::park::Parker;
use weir_engine::runtime::Driver;
use weir_net::redis::{
    value_of, Args, BlockingConnection, Lookup, RedisBatchFunction, RedisClient, RedisConfig,
    RedisError, RedisFunction, RedisRequest, RedisServer, RedisUrl, Reply, ServerOptions,
    REPLY_DEPTH_MAX,
};
use weir_net::DriverKind;

fn redis(test: &str) -> Option<RedisUrl> {
    weir_net::redis::test_server_url(test)
}

/// A server of this test's own (when Redis is installed, as `WEIR_REDIS_URL` says).
fn own_server(test: &str, args: &[&str]) -> Option<RedisServer> {
    redis(test)?;
    let options = ServerOptions {
        args: args.iter().map(|a| a.to_string()).collect(),
        ..ServerOptions::default()
    };
    Some(RedisServer::start(options).expect("redis-server starts"))
}

fn drivers() -> Vec<DriverKind> {
    let mut kinds = vec![DriverKind::Epoll];
    if weir_net::build_driver(DriverKind::Uring).is_ok() {
        kinds.push(DriverKind::Uring);
    } else {
        eprintln!("note: io_uring unavailable here; the epoll driver only");
    }
    kinds
}

/// A lookup of the tests.
#[derive(Debug, Clone)]
enum Req {
    Get(String, u64),
    HGet(String, String),
    HMGet(String, Vec<String>),
}

type Out = (Req, Vec<Option<Vec<u8>>>);

impl RedisRequest for Req {
    type Out = Out;
    fn lookup(&self, args: &mut Args) -> Lookup {
        match self {
            Req::Get(prefix, n) => {
                args.push_fmt(format_args!("{prefix}{n}"));
                Lookup::Get
            }
            Req::HGet(key, field) => {
                args.push(key.as_bytes());
                args.push(field.as_bytes());
                Lookup::HGet
            }
            Req::HMGet(key, fields) => {
                args.push(key.as_bytes());
                for field in fields {
                    args.push(field.as_bytes());
                }
                Lookup::HMGet
            }
        }
    }
    fn complete(self, reply: Reply<'_>) -> Out {
        let values = match reply {
            Reply::Value(value) => vec![value.map(<[u8]>::to_vec)],
            Reply::Fields(fields) => fields.iter().map(|v| v.map(<[u8]>::to_vec)).collect(),
        };
        (self, values)
    }
}

type Client = Rc<RefCell<RedisClient<Req>>>;

/// How the operator hands its lookups to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Batching {
    /// One call per record: each `GET` its own command.
    Off,
    /// The batched operator (batch timeout 0) cuts each turn's records into batches of
    /// up to this many, each batch's `GET`s one `MGET`.
    Mget(usize),
}

fn client(url: &RedisUrl) -> Client {
    let mut config = RedisConfig::new(url.clone());
    config.request_timeout = Duration::from_secs(2);
    Rc::new(RefCell::new(RedisClient::new(config).expect("client")))
}

/// Runs `requests` through an unordered operator of `capacity` over `client` on a
/// fresh driver of kind `driver` (dropped at the end, with the sockets it holds),
/// until all are emitted or the operator fails. `hook` is called each turn with the
/// count emitted so far (to disturb the server mid-run).
fn run(
    driver: DriverKind,
    client: &Client,
    requests: Vec<Req>,
    config: AsyncConfig<Out>,
    hook: impl FnMut(usize),
) -> Result<Vec<Out>, OperatorError> {
    run_batched(driver, client, Batching::Off, requests, config, hook)
}

/// [`run`] with the lookups handed to the client as `batching` says.
fn run_batched(
    driver: DriverKind,
    client: &Client,
    batching: Batching,
    requests: Vec<Req>,
    config: AsyncConfig<Out>,
    hook: impl FnMut(usize),
) -> Result<Vec<Out>, OperatorError> {
    let mut driver = weir_net::build_driver(driver).expect("driver");
    let parker = Parker::current();
    match batching {
        Batching::Off => {
            let function = RedisFunction::new(Rc::clone(client));
            let operator =
                AsyncWaitOperator::new(function, config, parker.unparker()).expect("operator");
            drive(operator, driver.as_mut(), client, requests, hook)
        }
        Batching::Mget(max_keys) => {
            let function = Batched::new(
                RedisBatchFunction::new(Rc::clone(client)),
                BatchConfig::new(max_keys, Duration::ZERO),
            );
            let operator =
                AsyncWaitOperator::new(function, config, parker.unparker()).expect("operator");
            drive(operator, driver.as_mut(), client, requests, hook)
        }
    }
}

/// [`run`] on `driver`, which lives on after it.
fn run_on(
    driver: &mut dyn Driver,
    client: &Client,
    requests: Vec<Req>,
    config: AsyncConfig<Out>,
    hook: impl FnMut(usize),
) -> Result<Vec<Out>, OperatorError> {
    let parker = Parker::current();
    let operator = AsyncWaitOperator::new(
        RedisFunction::new(Rc::clone(client)),
        config,
        parker.unparker(),
    )
    .expect("operator");
    drive(operator, driver, client, requests, hook)
}

/// The worker's loop: takes records while there is room, fires what is due (the
/// batched operator's cut at the end of the turn), flushes the client, turns the
/// driver, until every request came out or the operator failed.
fn drive<F: AsyncFunction<In = Req, Out = Out>>(
    mut operator: AsyncWaitOperator<F>,
    driver: &mut dyn Driver,
    client: &Client,
    requests: Vec<Req>,
    mut hook: impl FnMut(usize),
) -> Result<Vec<Out>, OperatorError> {
    let epoch = Instant::now();
    let total = requests.len();
    let mut requests = requests.into_iter();
    let mut out: Vec<StreamElement<Out>> = Vec::new();
    let mut emitted = 0;
    while emitted < total {
        assert!(
            epoch.elapsed() < Duration::from_secs(60),
            "stalled at {emitted} of {total}"
        );
        let now = epoch.elapsed().as_nanos() as u64;
        while !operator.is_full() {
            let Some(request) = requests.next() else {
                break;
            };
            operator.process_record(request, None, now, &mut out)?;
        }
        while operator.fire_due_timer(now, &mut out)?.is_some() {}
        client.borrow_mut().flush(driver, now);
        let wait = if operator.has_completions() {
            Duration::ZERO
        } else {
            Duration::from_millis(2)
        };
        driver
            .turn(Some(wait), &mut |event| {
                client.borrow_mut().on_event(&event);
            })
            .expect("driver turn");
        operator.drain(epoch.elapsed().as_nanos() as u64, &mut out)?;
        emitted = out.iter().filter(|e| e.as_record().is_some()).count();
        hook(emitted);
    }
    Ok(out
        .into_iter()
        .filter_map(|e| match e {
            StreamElement::Record(record) => Some(record.value),
            StreamElement::Watermark(_) => None,
        })
        .collect())
}

fn unordered(capacity: usize) -> AsyncConfig<Out> {
    AsyncConfig::new(OutputMode::Unordered, capacity)
}

/// The `RedisError` a failed run ended with.
fn redis_error(error: OperatorError) -> RedisError {
    match error {
        OperatorError::Async(AsyncError::Call(inner)) => match inner.downcast::<RedisError>() {
            Ok(redis) => *redis,
            Err(other) => panic!("not a RedisError: {other}"),
        },
        other => panic!("not a call error: {other}"),
    }
}

fn admin(url: &RedisUrl) -> BlockingConnection {
    BlockingConnection::connect(url, Duration::from_secs(5)).expect("admin connection")
}

fn prefix(test: &str) -> String {
    format!("weir-test:{}:{test}:", std::process::id())
}

/// Checks that every request came out once, with its key's value or `None` beyond
/// `loaded` keys.
fn check_gets(outputs: &[Out], requests: u64, loaded: u64, value_size: usize) {
    let mut seen = vec![0u32; requests as usize];
    let mut expected = Vec::new();
    for (request, values) in outputs {
        let Req::Get(_, n) = request else {
            panic!("a GET")
        };
        seen[*n as usize] += 1;
        if *n < loaded {
            expected.clear();
            value_of(&mut expected, *n, value_size);
            assert_eq!(values[0].as_deref(), Some(&expected[..]), "key {n}");
        } else {
            assert_eq!(values[0], None, "key {n} is missing: None");
        }
    }
    assert!(
        seen.iter().all(|&count| count == 1),
        "each key exactly once"
    );
}

#[test]
fn gets_hit_and_miss_on_both_drivers_pipelined_and_batched() {
    let Some(url) = redis("gets_hit_and_miss") else {
        return;
    };
    let prefix = prefix("gets");
    let loaded = 3_000;
    weir_net::redis::load_keys(&url, loaded, 100, &prefix, |_| {}).expect("load");
    for driver in drivers() {
        for batching in [Batching::Off, Batching::Mget(64)] {
            for protocol in ["resp2", "resp3"] {
                let url: RedisUrl = format!("{url}?protocol={protocol}").parse().unwrap();
                let client = client(&url);
                let requests: Vec<Req> = (0..2 * loaded)
                    .map(|n| Req::Get(prefix.clone(), n))
                    .collect();
                let outputs =
                    run_batched(driver, &client, batching, requests, unordered(256), |_| {})
                        .expect("no failure");
                check_gets(&outputs, 2 * loaded, loaded, 100);
                let stats = client.borrow().stats();
                assert_eq!((stats.hits, stats.misses), (loaded, loaded));
                assert_eq!(stats.connects, 1);
                if batching == Batching::Off {
                    assert_eq!(stats.commands, 2 * loaded);
                } else {
                    assert!(
                        stats.batches > 0 && stats.commands < 2 * loaded,
                        "{stats:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn hash_lookups_and_error_replies() {
    let Some(url) = redis("hash_lookups") else {
        return;
    };
    let key = format!("{}user", prefix("hash"));
    let mut admin = admin(&url);
    admin
        .command(&[b"HSET", key.as_bytes(), b"name", b"ada", b"lang", b"rust"])
        .expect("HSET");
    let string_key = format!("{}plain", prefix("hash"));
    admin
        .command(&[b"SET", string_key.as_bytes(), b"x"])
        .expect("SET");
    for driver in drivers() {
        let client = client(&url);
        let fields = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let requests = vec![
            Req::HGet(key.clone(), "name".into()),
            Req::HGet(key.clone(), "age".into()),
            Req::HGet("no-such-hash".into(), "name".into()),
            Req::HMGet(key.clone(), fields(&["lang", "age", "name"])),
            Req::HMGet("no-such-hash".into(), fields(&["a", "b"])),
        ];
        let config = AsyncConfig::new(OutputMode::Ordered, 8);
        let outputs = run_batched(
            driver,
            &client,
            Batching::Mget(16),
            requests,
            config,
            |_| {},
        )
        .expect("no failure");
        let values: Vec<Vec<Option<Vec<u8>>>> = outputs.into_iter().map(|(_, v)| v).collect();
        let some = |s: &str| Some(s.as_bytes().to_vec());
        assert_eq!(
            values,
            vec![
                vec![some("ada")],
                vec![None],
                vec![None],
                vec![some("rust"), None, some("ada")],
                vec![None, None],
            ]
        );
        // An error reply fails the call with the server's message. (A client stays on
        // the driver it started on: a fresh one for the fresh driver.)
        let client = self::client(&url);
        let requests = vec![Req::HGet(string_key.clone(), "f".into())];
        let error = run(driver, &client, requests, unordered(4), |_| {}).expect_err("WRONGTYPE");
        let error = redis_error(error);
        assert!(error.to_string().contains("WRONGTYPE"), "{error}");
        assert!(!error.is_transient());
    }
}

/// A 1 MiB value spans several receives of either driver (and 32 such exchange
/// segments); it arrives whole.
#[test]
fn a_reply_bigger_than_a_receive_buffer_arrives_whole() {
    let Some(url) = redis("big_reply") else {
        return;
    };
    let prefix = prefix("big");
    let size = (1 << 20) + 3;
    weir_net::redis::load_keys(&url, 3, size, &prefix, |_| {}).expect("load");
    for driver in drivers() {
        for batching in [Batching::Off, Batching::Mget(8)] {
            let client = client(&url);
            let requests: Vec<Req> = (0..6).map(|n| Req::Get(prefix.clone(), n)).collect();
            let outputs = run_batched(driver, &client, batching, requests, unordered(6), |_| {})
                .expect("no failure");
            check_gets(&outputs, 6, 3, size);
        }
    }
}

#[test]
fn credentials_and_databases_are_checked_at_set_up() {
    let Some(server) = own_server("credentials", &["--requirepass", "s3cret"]) else {
        return;
    };
    let port = server.port();
    let base: RedisUrl = format!("redis://:s3cret@127.0.0.1:{port}").parse().unwrap();
    let mut admin = admin(&base);
    admin
        .command(&[
            b"ACL",
            b"SETUSER",
            b"app",
            b"on",
            b">app-pass",
            b"~*",
            b"+@all",
        ])
        .expect("ACL SETUSER");
    let in_db3: RedisUrl = format!("redis://:s3cret@127.0.0.1:{port}/3")
        .parse()
        .unwrap();
    let mut db3 = BlockingConnection::connect(&in_db3, Duration::from_secs(5)).expect("db 3");
    db3.command(&[b"SET", b"k0", b"in-db-3"]).expect("SET");
    for driver in drivers() {
        for protocol in ["resp2", "resp3"] {
            let get = || vec![Req::Get("k".into(), 0)];
            // Right credentials: the default user and an ACL user, database 3.
            for credentials in [":s3cret", "app:app-pass"] {
                let url: RedisUrl =
                    format!("redis://{credentials}@127.0.0.1:{port}/3?protocol={protocol}")
                        .parse()
                        .unwrap();
                let outputs =
                    run(driver, &client(&url), get(), unordered(1), |_| {}).expect("authenticated");
                assert_eq!(outputs[0].1, vec![Some(b"in-db-3".to_vec())]);
            }
            // Wrong or missing credentials, a database the server lacks.
            for (url, wanted) in [
                (
                    format!("redis://:wrong@127.0.0.1:{port}"),
                    "refused the credentials",
                ),
                (
                    format!("redis://app:nope@127.0.0.1:{port}"),
                    "refused the credentials",
                ),
                (format!("redis://127.0.0.1:{port}"), "NOAUTH"),
                (
                    format!("redis://:s3cret@127.0.0.1:{port}/99"),
                    "refused SELECT 99",
                ),
            ] {
                let url: RedisUrl = format!("{url}?protocol={protocol}").parse().unwrap();
                let client = client(&url);
                let error =
                    run(driver, &client, get(), unordered(1), |_| {}).expect_err(&url.to_string());
                let error = redis_error(error);
                let message = error.to_string();
                assert!(message.contains(wanted), "{url}: {message}");
                assert!(
                    matches!(error, RedisError::Auth { .. } | RedisError::Select { .. })
                        || (protocol == "resp2" && message.contains("NOAUTH")),
                    "{url}: {error:?}"
                );
                assert!(!message.contains("s3cret"), "no password in messages");
            }
        }
    }
}

/// The server is killed mid-run (commands in flight fail, reconnection is refused for
/// a while) and restarted from a snapshot; the operator retries, and every lookup
/// comes out exactly once with its value.
#[test]
fn a_server_restart_mid_run_loses_and_duplicates_nothing() {
    let Some(mut server) = own_server("restart", &[]) else {
        return;
    };
    let url = server.url();
    let loaded = 2_000;
    let prefix = prefix("restart");
    weir_net::redis::load_keys(&url, loaded, 100, &prefix, |_| {}).expect("load");
    admin(&url).command(&[b"SAVE"]).expect("SAVE");
    let total = 60_000u64;
    for driver in drivers() {
        for batching in [Batching::Off, Batching::Mget(64)] {
            let client = client(&url);
            let requests: Vec<Req> = (0..total)
                .map(|n| Req::Get(prefix.clone(), n % loaded))
                .collect();
            let config = unordered(128)
                .with_timeout(Duration::from_secs(30))
                .with_retry(
                    RetryStrategy::fixed_delay(1000, Duration::from_millis(5)).retry_on_error(
                        |error: &AsyncError| match error {
                            AsyncError::Call(inner) => inner
                                .downcast_ref::<RedisError>()
                                .is_some_and(RedisError::is_transient),
                            _ => false,
                        },
                    ),
                );
            let mut phase = 0;
            let mut killed_at = Instant::now();
            let outputs =
                run_batched(
                    driver,
                    &client,
                    batching,
                    requests,
                    config,
                    |emitted| match phase {
                        0 if emitted as u64 >= total / 3 => {
                            server.kill();
                            killed_at = Instant::now();
                            phase = 1;
                        }
                        1 if killed_at.elapsed() > Duration::from_millis(150) => {
                            server.restart().expect("restart");
                            phase = 2;
                        }
                        _ => {}
                    },
                )
                .expect("no failure");
            assert_eq!(phase, 2, "the server was restarted mid-run");
            let mut seen = vec![0u32; total as usize];
            let mut expected = Vec::new();
            for (request, values) in &outputs {
                let Req::Get(_, n) = request else {
                    panic!("a GET")
                };
                expected.clear();
                value_of(&mut expected, *n, 100);
                assert_eq!(values[0].as_deref(), Some(&expected[..]));
                seen[*n as usize] += 1;
            }
            // Each key was asked total / loaded times and answered as often.
            assert!(seen[..loaded as usize]
                .iter()
                .all(|&c| c == (total / loaded) as u32));
            let stats = client.borrow().stats();
            assert!(stats.failed > 0, "calls failed with the server: {stats:?}");
            assert!(stats.connects >= 2, "the client reconnected: {stats:?}");
        }
    }
}

/// Nothing listens: the call fails with a connect error naming the address.
#[test]
fn a_refused_connection_is_a_typed_error() {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let url: RedisUrl = format!("redis://127.0.0.1:{port}").parse().unwrap();
    for driver in drivers() {
        for protocol in ["resp2", "auto"] {
            let url: RedisUrl = format!("{url}?protocol={protocol}").parse().unwrap();
            let client = client(&url);
            let requests = vec![Req::Get("k".into(), 0)];
            let error = redis_error(
                run(driver, &client, requests, unordered(1), |_| {}).expect_err("refused"),
            );
            assert!(
                matches!(error, RedisError::Connect { .. }),
                "{driver:?} {protocol}: {error:?}"
            );
            assert!(error.to_string().contains(&port.to_string()), "{error}");
            assert!(error.is_transient());
        }
    }
}

/// A peer that answers garbage, or closes with commands outstanding: typed errors, and
/// the connection is closed.
#[test]
fn a_misbehaving_peer_fails_the_calls_with_typed_errors() {
    for (answer, close) in [(&b"!x\r\n"[..], false), (b"$5\r\nab", true)] {
        for driver in drivers() {
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
            let port = listener.local_addr().expect("addr").port();
            let peer = std::thread::spawn(move || {
                let (mut stream, _) = listener.accept().expect("accept");
                let mut buffer = [0u8; 1024];
                let _ = stream.read(&mut buffer);
                let _ = stream.write_all(answer);
                if !close {
                    // Wait for the client to hang up.
                    let _ = stream.read(&mut buffer);
                }
            });
            let url: RedisUrl = format!("redis://127.0.0.1:{port}?protocol=resp2")
                .parse()
                .unwrap();
            let client = client(&url);
            let requests = vec![Req::Get("k".into(), 0)];
            let error = redis_error(
                run(driver, &client, requests, unordered(1), |_| {}).expect_err("fails"),
            );
            if close {
                assert!(
                    matches!(error, RedisError::Closed { pending: 1, .. }),
                    "{error:?}"
                );
            } else {
                assert!(matches!(error, RedisError::Malformed { .. }), "{error:?}");
                assert_eq!(client.borrow().stats().malformed, 1);
            }
            // The run stopped at the failure, before the client's next flush would have
            // closed the connection through the driver: ending the client (as its task
            // ends) hangs it up.
            drop(client);
            peer.join().expect("peer");
        }
    }
}

/// A listener whose accept queue is full drops new SYNs: a connection to it stays in
/// `SYN_SENT`. Returns its port and the connections that filled the queue.
fn unanswering_listener() -> (u16, std::os::fd::OwnedFd, Vec<std::net::TcpStream>) {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket calls on a fresh descriptor we own (wrapped in an OwnedFd at
    // once) and on a zeroed, correctly sized sockaddr_in; every result is checked.
    let (fd, port) = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket");
        let owned = std::os::fd::OwnedFd::from_raw_fd(fd);
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        assert_eq!(
            libc::bind(fd, (&addr as *const libc::sockaddr_in).cast(), len),
            0
        );
        assert_eq!(libc::listen(fd, 0), 0);
        let mut bound: libc::sockaddr_in = std::mem::zeroed();
        let mut bound_len = len;
        assert_eq!(
            libc::getsockname(
                fd,
                (&mut bound as *mut libc::sockaddr_in).cast(),
                &mut bound_len
            ),
            0
        );
        (owned, u16::from_be(bound.sin_port))
    };
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let fillers = (0..4)
        .filter_map(|_| {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(100)).ok()
        })
        .collect();
    (port, fd, fillers)
}

/// A server that never completes the handshake: the set-up times out with a typed
/// error, and the driver lets go of the half-open socket at once.
#[test]
fn a_connect_that_never_completes_times_out() {
    let (port, _listener, _fillers) = unanswering_listener();
    for driver in drivers() {
        for protocol in ["resp2", "auto"] {
            let url: RedisUrl = format!("redis://127.0.0.1:{port}?protocol={protocol}")
                .parse()
                .unwrap();
            let mut config = RedisConfig::new(url);
            config.connect_timeout = Duration::from_millis(200);
            config.request_timeout = Duration::from_millis(300);
            let client = Rc::new(RefCell::new(RedisClient::new(config).expect("client")));
            let started = Instant::now();
            let requests = vec![Req::Get("k".into(), 0)];
            let error = redis_error(
                run(driver, &client, requests, unordered(1), |_| {}).expect_err("times out"),
            );
            assert!(
                matches!(
                    error,
                    RedisError::ConnectTimeout { .. } | RedisError::Timeout { .. }
                ),
                "{driver:?} {protocol}: {error:?}"
            );
            assert!(error.is_transient());
            // The driver was dropped inside `run`: nothing kept it waiting.
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "{driver:?} {protocol}: took {:?}",
                started.elapsed()
            );
        }
    }
}

/// A fake Redis server for one connection on 127.0.0.1: it reads commands (arrays of
/// bulk strings) and writes `answer(arguments)` for each, a byte every `byte_gap` when
/// one is given. It stops when the client hangs up, or after 30 s without a client.
struct FakeRedis {
    url_base: String,
    thread: std::thread::JoinHandle<()>,
}

impl FakeRedis {
    fn start(
        byte_gap: Option<Duration>,
        mut answer: impl FnMut(&[Vec<u8>]) -> Vec<u8> + Send + 'static,
    ) -> FakeRedis {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        listener.set_nonblocking(true).expect("non-blocking");
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            let mut stream = loop {
                match listener.accept() {
                    Ok((stream, _)) => break stream,
                    Err(_) if started.elapsed() < Duration::from_secs(30) => {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(_) => return,
                }
            };
            stream.set_nonblocking(false).expect("blocking");
            let mut inbox = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                while let Some(args) = next_command(&mut inbox) {
                    let reply = answer(&args);
                    let written = match byte_gap {
                        None => stream.write_all(&reply).is_ok(),
                        Some(gap) => reply.iter().all(|byte| {
                            std::thread::sleep(gap);
                            stream.write_all(&[*byte]).is_ok()
                        }),
                    };
                    if !written {
                        return;
                    }
                }
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => inbox.extend_from_slice(&chunk[..n]),
                }
            }
        });
        FakeRedis {
            url_base: format!("redis://127.0.0.1:{port}"),
            thread,
        }
    }

    /// Its URL with `?protocol=...`.
    fn url(&self, protocol: &str) -> RedisUrl {
        format!("{}?protocol={protocol}", self.url_base)
            .parse()
            .expect("url")
    }

    fn join(self) {
        self.thread.join().expect("fake server");
    }
}

/// Takes the first whole command (`*n\r\n` then `n` bulk strings) off `inbox`.
fn next_command(inbox: &mut Vec<u8>) -> Option<Vec<Vec<u8>>> {
    fn header(bytes: &[u8], at: usize, kind: u8) -> Option<(usize, usize)> {
        let end = at + bytes.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
        assert_eq!(bytes[at], kind, "a command is an array of bulk strings");
        let n = std::str::from_utf8(&bytes[at + 1..end])
            .ok()?
            .parse()
            .ok()?;
        Some((n, end + 2))
    }
    let (count, mut at) = header(inbox, 0, b'*')?;
    let mut args = Vec::with_capacity(count);
    for _ in 0..count {
        let (len, start) = header(inbox, at, b'$')?;
        args.push(inbox.get(start..start + len)?.to_vec());
        at = start + len + 2;
        if inbox.len() < at {
            return None;
        }
    }
    inbox.drain(..at);
    Some(args)
}

/// The `HELLO 3` reply of a RESP3 server.
const HELLO_REPLY: &[u8] = b"%1\r\n$5\r\nproto\r\n:3\r\n";

/// `*1\r\n` nested `depth` times around a bulk string.
fn nested_reply(depth: usize) -> Vec<u8> {
    let mut reply = b"*1\r\n".repeat(depth);
    reply.extend_from_slice(b"$1\r\nx\r\n");
    reply
}

/// A reply nesting arrays 100,000 deep, which would overflow the stack of the
/// recursive decoder: the connection fails with a typed error naming the nesting limit,
/// on both protocols and drivers; every lookup in flight fails with it, none is lost.
#[test]
fn a_deeply_nested_reply_fails_the_connection_not_the_stack() {
    for driver in drivers() {
        for protocol in ["resp2", "resp3"] {
            let fake = FakeRedis::start(None, |args| match args[0].as_slice() {
                b"HELLO" => HELLO_REPLY.to_vec(),
                _ => nested_reply(100_000),
            });
            let client = client(&fake.url(protocol));
            let requests = (0..3).map(|n| Req::Get("k".into(), n)).collect();
            let error = redis_error(
                run(driver, &client, requests, unordered(3), |_| {}).expect_err("too deep"),
            );
            let RedisError::TooDeep { depth_max, .. } = error else {
                panic!("{driver:?} {protocol}: {error:?}")
            };
            assert_eq!(depth_max, REPLY_DEPTH_MAX);
            let message = error.to_string();
            assert!(
                message.contains(&format!("deeper than {REPLY_DEPTH_MAX} levels")),
                "{message}"
            );
            assert!(error.is_transient());
            let stats = client.borrow().stats();
            assert_eq!(client.borrow().outstanding(), 0, "{stats:?}");
            assert_eq!((stats.failed, stats.malformed), (3, 1), "{stats:?}");
            drop(client);
            fake.join();
        }
    }
}

/// The blocking connection takes a reply nested exactly `REPLY_DEPTH_MAX` deep, and
/// refuses one level more, or 100,000 levels, with the typed error naming the limit.
#[test]
fn a_deeply_nested_reply_fails_the_blocking_connection() {
    for depths in [&[REPLY_DEPTH_MAX, REPLY_DEPTH_MAX + 1][..], &[100_000]] {
        let fake = FakeRedis::start(None, |args| {
            let depth = std::str::from_utf8(&args[1]).expect("a depth");
            nested_reply(depth.parse().expect("a depth"))
        });
        let mut connection =
            BlockingConnection::connect(&fake.url("resp2"), Duration::from_secs(5))
                .expect("connect");
        for &depth in depths {
            let reply = connection.command(&[b"GET", depth.to_string().as_bytes()]);
            if depth <= REPLY_DEPTH_MAX {
                let frame = format!("{:?}", reply.expect("within the limit"));
                assert_eq!(frame.matches("Array(").count(), depth, "{frame}");
                continue;
            }
            let error = reply.expect_err("too deep");
            let RedisError::TooDeep { depth_max, .. } = error else {
                panic!("{error:?}")
            };
            assert_eq!(depth_max, REPLY_DEPTH_MAX);
            assert!(
                error.to_string().contains(&REPLY_DEPTH_MAX.to_string()),
                "{error}"
            );
        }
        drop(connection);
        fake.join();
    }
}

/// A server that trickles a reply a byte at a time keeps the connection busy
/// (each byte resets the request timeout): the response timeout fails it, and every
/// lookup on it, soon after it expires.
#[test]
fn a_reply_trickled_byte_by_byte_fails_at_the_response_timeout() {
    for driver in drivers() {
        let fake = FakeRedis::start(Some(Duration::from_millis(10)), |_| {
            let mut reply = b"$200\r\n".to_vec();
            reply.extend_from_slice(&[b'v'; 200]);
            reply.extend_from_slice(b"\r\n");
            reply
        });
        let mut config = RedisConfig::new(fake.url("resp2"));
        config.request_timeout = Duration::from_secs(2);
        config.response_timeout = Duration::from_millis(300);
        let client = Rc::new(RefCell::new(RedisClient::new(config).expect("client")));
        let started = Instant::now();
        let requests = (0..2).map(|n| Req::Get("k".into(), n)).collect();
        let outcome = run(driver, &client, requests, unordered(2), |_| {});
        let error = redis_error(outcome.expect_err("trickled reply"));
        let elapsed = started.elapsed();
        let RedisError::ResponseTimeout { timeout, .. } = error else {
            panic!("{driver:?}: {error:?}")
        };
        assert_eq!(timeout, Duration::from_millis(300));
        assert!(error.to_string().contains("300ms"), "{error}");
        assert!(error.to_string().contains("response timeout"), "{error}");
        assert!(error.is_transient());
        // The reply takes 2 s to trickle in; the connection failed at 300 ms.
        assert!(elapsed >= Duration::from_millis(300), "{elapsed:?}");
        assert!(
            elapsed < Duration::from_millis(1500),
            "{driver:?}: {elapsed:?}"
        );
        let stats = client.borrow().stats();
        assert_eq!(
            (stats.failed, client.borrow().outstanding()),
            (2, 0),
            "{stats:?}"
        );
        drop(client);
        fake.join();
    }
}

/// A client dropped while its worker lives on (its task ended, the worker's driver
/// turns on) ends its connection: the server reads the end of the stream, on both
/// drivers and protocols (with and without a set-up), after answering the lookups
/// made. The server gives up after the watchdog if the connection stays open.
#[test]
fn a_dropped_client_ends_its_connection() {
    const WATCHDOG: Duration = Duration::from_secs(10);
    for kind in drivers() {
        for protocol in ["resp2", "resp3"] {
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
            let port = listener.local_addr().expect("addr").port();
            let server = std::thread::spawn(move || -> std::io::Result<usize> {
                let (mut stream, _) = listener.accept()?;
                stream.set_read_timeout(Some(WATCHDOG))?;
                let mut inbox = Vec::new();
                let mut chunk = [0u8; 4096];
                let mut answered = 0;
                loop {
                    while let Some(args) = next_command(&mut inbox) {
                        if args[0] == b"HELLO" {
                            stream.write_all(HELLO_REPLY)?;
                        } else {
                            stream.write_all(b"$5\r\nvalue\r\n")?;
                            answered += 1;
                        }
                    }
                    match stream.read(&mut chunk)? {
                        0 => return Ok(answered),
                        n => inbox.extend_from_slice(&chunk[..n]),
                    }
                }
            });
            let url: RedisUrl = format!("redis://127.0.0.1:{port}?protocol={protocol}")
                .parse()
                .expect("url");
            let client = client(&url);
            let mut driver = weir_net::build_driver(kind).expect("driver");
            let requests = (0..3).map(|n| Req::Get("k".into(), n)).collect();
            let outputs = run_on(driver.as_mut(), &client, requests, unordered(3), |_| {})
                .expect("no failure");
            assert_eq!(outputs.len(), 3, "{kind:?} {protocol}");
            assert_eq!(
                Rc::strong_count(&client),
                1,
                "{kind:?} {protocol}: the last reference"
            );
            drop(client);
            let deadline = Instant::now() + WATCHDOG * 2;
            while !server.is_finished() && Instant::now() < deadline {
                driver
                    .turn(Some(Duration::from_millis(5)), &mut |_| {})
                    .expect("driver turn");
            }
            let answered = server
                .join()
                .expect("the server ran")
                .unwrap_or_else(|error| {
                    panic!("{kind:?} {protocol}: the connection stayed open: {error}")
                });
            assert_eq!(answered, 3, "{kind:?} {protocol}");
        }
    }
}
