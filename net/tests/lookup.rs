//! The lookup client on both drivers against the service, and against misbehaving
//! peers: values come back intact; a malformed frame closes only its connection and
//! fails only the requests on it, with a clear error; an address that drops connection
//! attempts fails lookups after the connect timeout without holding up the worker; a
//! service that never reads holds at most the client's capacity of requests; a dropped
//! client ends its connections.

use std::cell::RefCell;
use std::future::Future;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::mpsc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use weir_engine::async_io::{AsyncConfig, AsyncError, AsyncWaitOperator, OutputMode};
use weir_engine::element::StreamElement;
use weir_engine::graph::IoHandler;
use weir_engine::park::Parker;
use weir_engine::runtime::Driver;
use weir_net::lookup::protocol::{decode_request, encode_response, STATUS_OK};
use weir_net::lookup::{
    ClientConfig, ClientIo, LookupClient, LookupFunction, LookupRequest, LookupServer, ServerConfig,
};
use weir_net::{DriverKind, NetError};

#[derive(Debug, Clone, Copy)]
struct Key(u64);

impl LookupRequest for Key {
    type Out = (u64, Vec<u8>);
    fn key(&self) -> u64 {
        self.0
    }
    fn complete(self, value: &[u8]) -> (u64, Vec<u8>) {
        (self.0, value.to_vec())
    }
}

fn drivers() -> Vec<Box<dyn Driver>> {
    let mut drivers: Vec<Box<dyn Driver>> =
        vec![weir_net::build_driver(DriverKind::Epoll).unwrap()];
    if let Ok(uring) = weir_net::build_driver(DriverKind::Uring) {
        drivers.push(uring);
    }
    drivers
}

type Client = Rc<RefCell<LookupClient<Key>>>;
/// What a run emitted.
type Output = Vec<StreamElement<(u64, Vec<u8>)>>;

/// Runs `keys` through an unordered operator over the client until all are emitted or
/// the operator fails; returns the output and the failure, if any.
fn run(driver: &mut dyn Driver, client: &Client, keys: &[u64]) -> (Output, Option<String>) {
    let parker = Parker::current();
    let config = AsyncConfig::new(OutputMode::Unordered, keys.len().max(1));
    let operator = AsyncWaitOperator::new(
        LookupFunction::new(Rc::clone(client)),
        config,
        parker.unparker(),
    )
    .unwrap();
    drive(operator, driver, client, keys)
}

/// Takes `keys` into `operator`, fires what is due (a batched operator's cut), then
/// turns the driver until every record is emitted or the operator fails.
fn drive<F: weir_engine::async_io::AsyncFunction<In = Key, Out = (u64, Vec<u8>)>>(
    mut operator: AsyncWaitOperator<F>,
    driver: &mut dyn Driver,
    client: &Client,
    keys: &[u64],
) -> (Output, Option<String>) {
    let mut out = Vec::new();
    for &key in keys {
        operator
            .process_record(Key(key), None, 0, &mut out)
            .unwrap();
    }
    while operator.fire_due_timer(0, &mut out).unwrap().is_some() {}
    let deadline = Instant::now() + Duration::from_secs(10);
    while operator.in_flight() > 0 {
        assert!(Instant::now() < deadline, "lookups hang");
        client.borrow_mut().flush(driver);
        driver
            .turn(Some(Duration::from_millis(5)), &mut |event| {
                client.borrow_mut().on_event(&event);
            })
            .unwrap();
        if let Err(error) = operator.drain(0, &mut out) {
            return (out, Some(error.to_string()));
        }
    }
    (out, None)
}

#[test]
fn values_round_trip_on_every_driver() {
    let server = LookupServer::start(ServerConfig {
        value_size: 20,
        ..ServerConfig::default()
    })
    .unwrap();
    for mut driver in drivers() {
        let client = client_of(server.addr(), 3);
        let keys: Vec<u64> = (0..2000).map(|k| k * 7919).collect();
        let (out, failure) = run(driver.as_mut(), &client, &keys);
        assert_eq!(failure, None, "{}", driver.name());
        assert_eq!(out.len(), keys.len());
        for element in out {
            let (key, value) = element.as_record().unwrap().value.clone();
            let expected: Vec<u8> = (0..20).map(|i| key.to_le_bytes()[i % 8]).collect();
            assert_eq!(
                value,
                expected,
                "{}: wrong value for key {key}",
                driver.name()
            );
        }
        assert_eq!(
            client.borrow().stats().connects,
            3,
            "one connection each, pipelined"
        );
    }
}

/// A client of `connections` connections to `addr`.
fn client_of(addr: SocketAddr, connections: usize) -> Client {
    let config = ClientConfig {
        addr,
        connections,
        capacity: 4096,
        request_timeout: Duration::from_secs(5),
        connect_timeout: ClientConfig::CONNECT_TIMEOUT_DEFAULT,
    };
    Rc::new(RefCell::new(LookupClient::new(config).unwrap()))
}

/// Runs `keys` through an ordered batched operator (batches of up to `max`, cut at the
/// end of the turn; no retries) over the client as batch requests, until all are
/// emitted or the operator fails; returns the output and the failure, if any.
fn run_batches(
    driver: &mut dyn Driver,
    client: &Client,
    keys: &[u64],
    max: usize,
) -> (Output, Option<String>) {
    use weir_engine::async_io::{BatchConfig, Batched};
    use weir_net::lookup::LookupBatchFunction;
    let parker = Parker::current();
    let operator = AsyncWaitOperator::new(
        Batched::new(
            LookupBatchFunction::new(Rc::clone(client)),
            BatchConfig::new(max, Duration::ZERO),
        ),
        AsyncConfig::new(OutputMode::Ordered, keys.len().max(1)),
        parker.unparker(),
    )
    .unwrap();
    drive(operator, driver, client, keys)
}

/// Batches cut by the batched operator go to the service as batch requests (over
/// several connections, at several batch sizes) and come back as one batch response
/// each: every key once with its own value, in order; with injected errors, the first
/// failed key stops the (retry-less, ordered) operator with the service's message, and
/// every record before it came out with its own key.
#[test]
fn batch_requests_round_trip_on_every_driver() {
    use weir_net::lookup::Faults;
    for error_rate in [0.0, 0.2] {
        let server = LookupServer::start(ServerConfig {
            value_size: 20,
            faults: Faults {
                error_rate,
                ..Faults::default()
            },
            ..ServerConfig::default()
        })
        .unwrap();
        for mut driver in drivers() {
            for max in [2, 64, 5000] {
                let client = client_of(server.addr(), 2);
                let keys: Vec<u64> = (0..3000).map(|k| k * 7919).collect();
                let (out, failure) = run_batches(driver.as_mut(), &client, &keys, max);
                let name = driver.name();
                let stats = client.borrow().stats();
                if error_rate == 0.0 {
                    assert_eq!(failure, None, "{name} max {max}");
                    assert_eq!(out.len(), keys.len(), "{name} max {max}");
                    for (element, &key) in out.iter().zip(&keys) {
                        let (got, value) = element.as_record().unwrap().value.clone();
                        let expected: Vec<u8> = (0..20).map(|i| key.to_le_bytes()[i % 8]).collect();
                        assert_eq!((got, value), (key, expected), "{name} max {max}");
                    }
                    assert_eq!(stats.values, keys.len() as u64);
                    let batches = keys.len().div_ceil(max.min(keys.len())) as u64;
                    assert_eq!(stats.batches, batches, "{name} max {max}");
                } else {
                    let failure = failure.expect("an error was injected");
                    assert!(failure.contains("injected error"), "{failure}");
                    for (element, &key) in out.iter().zip(&keys) {
                        assert_eq!(element.as_record().unwrap().value.0, key);
                    }
                    assert!(stats.failed > 0 && stats.values > 0, "{stats:?}");
                }
            }
        }
    }
}

/// A batch whose response would be longer than a frame may be is answered with one
/// error for the whole batch, which says to send smaller batches; the connection stays
/// up and a smaller batch after it is answered.
#[test]
fn a_batch_too_large_to_answer_fails_whole_with_a_clear_error() {
    let server = LookupServer::start(ServerConfig {
        value_size: 1 << 20,
        ..ServerConfig::default()
    })
    .unwrap();
    let mut driver = weir_net::build_driver(DriverKind::Epoll).unwrap();
    let client = client_of(server.addr(), 1);
    let keys: Vec<u64> = (0..17).collect();
    let (_, failure) = run_batches(driver.as_mut(), &client, &keys, 64);
    let failure = failure.expect("the batch fails");
    assert!(failure.contains("send smaller batches"), "{failure}");
    let (out, failure) = run_batches(driver.as_mut(), &client, &keys[..3], 64);
    assert_eq!(failure, None);
    assert_eq!(out.len(), 3);
    assert_eq!(
        client.borrow().stats().connects,
        1,
        "the connection stayed up"
    );
}

/// A peer that answers correctly on its second connection and with garbage on its first.
fn misbehaving_peer() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for (index, stream) in listener.incoming().take(2).enumerate() {
            let mut stream = stream.unwrap();
            std::thread::spawn(move || {
                let mut inbox = Vec::new();
                let mut buffer = [0u8; 4096];
                loop {
                    let n = match stream.read(&mut buffer) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    inbox.extend_from_slice(&buffer[..n]);
                    while let Ok(Some((request, used))) = decode_request(&inbox) {
                        inbox.drain(..used);
                        let mut out = Vec::new();
                        if index == 0 {
                            out.extend_from_slice(&u32::MAX.to_le_bytes());
                        } else {
                            encode_response(&mut out, request.request_id, STATUS_OK, b"fine");
                        }
                        if stream.write_all(&out).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn a_malformed_frame_fails_only_its_connections_requests() {
    for mut driver in drivers() {
        let addr = misbehaving_peer();
        let config = ClientConfig {
            addr,
            connections: 2,
            capacity: 16,
            request_timeout: Duration::from_secs(5),
            connect_timeout: ClientConfig::CONNECT_TIMEOUT_DEFAULT,
        };
        let client: Client = Rc::new(RefCell::new(LookupClient::new(config).unwrap()));
        // Requests alternate between the two connections: 1 on the bad one, 2 on the good.
        let (_out, failure) = run(driver.as_mut(), &client, &[1, 2]);
        let failure = failure.expect("the request on the bad connection fails");
        assert!(
            failure.contains("malformed frame"),
            "{}: {failure}",
            driver.name()
        );
        // The operator stopped at the first failure; keep the I/O going until the good
        // connection's answer is in (or give up after a while).
        let deadline = Instant::now() + Duration::from_secs(5);
        while client.borrow().stats().values == 0 && Instant::now() < deadline {
            driver
                .turn(Some(Duration::from_millis(5)), &mut |event| {
                    client.borrow_mut().on_event(&event);
                })
                .unwrap();
        }
        let stats = client.borrow().stats();
        assert_eq!(stats.malformed, 1, "{}", driver.name());
        assert_eq!(
            stats.values,
            1,
            "{}: the good connection's request succeeded",
            driver.name()
        );
        assert_eq!(stats.failed, 1, "{}", driver.name());
    }
}

/// A service that polls before its deadlines (`ServerConfig::spin`) still answers no
/// request before its latency, and answers every one: spinning changes when it wakes,
/// not when answers are due.
#[test]
fn a_spinning_service_answers_on_time_never_early() {
    never_early(Duration::from_micros(500), Duration::ZERO);
}

/// A service with a timer slack sends the answers due within the slack together, late
/// by at most the slack: never early, every one answered.
#[test]
fn a_service_with_timer_slack_answers_every_request_never_early() {
    never_early(Duration::ZERO, Duration::from_millis(1));
}

/// 20 rounds of 8 requests to a service with `spin` and `slack`: no answer before the
/// latency, every one answered.
fn never_early(spin: Duration, slack: Duration) {
    use weir_net::lookup::protocol::{decode_response, encode_request};
    use weir_net::lookup::Latency;
    let latency = Duration::from_millis(2);
    let server = LookupServer::start(ServerConfig {
        latency: Latency::Fixed(latency),
        spin,
        slack,
        ..ServerConfig::default()
    })
    .unwrap();
    let mut stream = std::net::TcpStream::connect(server.addr()).unwrap();
    stream.set_nodelay(true).unwrap();
    for round in 0..20u64 {
        let mut request = Vec::new();
        for id in 0..8 {
            encode_request(&mut request, round * 8 + id, id);
        }
        let sent = Instant::now();
        stream.write_all(&request).unwrap();
        let mut inbox = Vec::new();
        let mut answered = 0;
        while answered < 8 {
            let mut buffer = [0u8; 4096];
            let read = stream.read(&mut buffer).unwrap();
            assert!(read > 0, "the service closed the connection");
            inbox.extend_from_slice(&buffer[..read]);
            let mut offset = 0;
            while let Some((response, used)) = decode_response(&inbox[offset..]).unwrap() {
                assert_eq!(response.status, STATUS_OK);
                assert!(
                    sent.elapsed() >= latency,
                    "answer {} after {:?}, before the {latency:?} latency",
                    response.request_id,
                    sent.elapsed()
                );
                offset += used;
                answered += 1;
            }
            inbox.drain(..offset);
        }
    }
    let stats = server.stop();
    assert_eq!(stats.answered, 160);
}

/// How long a test waits for a worker that should have finished before declaring it
/// stuck: a watchdog, far above what the work takes.
const WATCHDOG: Duration = Duration::from_secs(10);

/// A loopback address that drops connection attempts: a listener whose accept queue
/// is full, which on Linux makes the kernel drop further SYNs, so that a connect there
/// neither completes nor fails. Returns the listener and the connections filling its
/// queue; both must be kept for as long as the address is used.
fn unanswering_address() -> (TcpListener, Vec<TcpStream>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    // Listening again on a listening socket sets its backlog; 0 leaves room for one
    // connection in the accept queue.
    // SAFETY: `listen` reads only its two arguments, and the descriptor belongs to
    // `listener`, which is alive across the call.
    let listened = unsafe { libc::listen(listener.as_raw_fd(), 0) };
    assert_eq!(listened, 0, "listen: {}", std::io::Error::last_os_error());
    let addr = listener.local_addr().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..4 {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(stream) => fillers.push(stream),
            Err(error) if error.kind() == std::io::ErrorKind::TimedOut => {
                return (listener, fillers)
            }
            Err(error) => panic!("filling the accept queue of {addr}: {error}"),
        }
    }
    panic!(
        "{addr} accepted {} connections with a backlog of 0: this kernel does not drop \
         SYNs to a full accept queue, so the test cannot make an unanswered connect",
        fillers.len()
    );
}

/// What a worker saw of one lookup.
struct Attempt {
    outcome: Result<Vec<u8>, AsyncError>,
    /// From the lookup's start to its outcome.
    took: Duration,
    /// The longest the client's I/O hook took in one flush.
    flush_max: Duration,
}

/// Looks up one key at `addr` the way a worker does: the client's I/O hook flushed each
/// turn with the run's clock, the driver waiting until the hook's next deadline (at
/// most 50 ms) in between.
fn look_up_once(driver: &mut dyn Driver, addr: SocketAddr, connect_timeout: Duration) -> Attempt {
    let client: Client = Rc::new(RefCell::new(
        LookupClient::new(ClientConfig {
            addr,
            connections: 1,
            capacity: 16,
            request_timeout: Duration::from_secs(60),
            connect_timeout,
        })
        .unwrap(),
    ));
    let mut io = ClientIo(Rc::clone(&client));
    let start = Instant::now();
    let mut lookup = client.borrow_mut().get(7);
    let mut cx = Context::from_waker(Waker::noop());
    let mut flush_max = Duration::ZERO;
    loop {
        let now_ns = start.elapsed().as_nanos() as u64;
        let flushed = Instant::now();
        io.flush(driver, now_ns);
        flush_max = flush_max.max(flushed.elapsed());
        if let Poll::Ready(outcome) = std::pin::Pin::new(&mut lookup).poll(&mut cx) {
            return Attempt {
                outcome,
                took: start.elapsed(),
                flush_max,
            };
        }
        let idle = Duration::from_millis(50);
        let wait = io.next_deadline().map_or(idle, |deadline_ns| {
            Duration::from_nanos(deadline_ns.saturating_sub(now_ns)).min(idle)
        });
        driver
            .turn(Some(wait), &mut |event| {
                io.on_event(&event);
            })
            .unwrap();
    }
}

/// An address that drops connection attempts does not hold up the worker: no flush
/// waits for the connect, and the lookup fails with `NetError::ConnectTimeout`, naming
/// the address and the timeout, once the connect timeout passed and not before, on
/// every driver. A watchdog fails the test if the worker is stuck instead (a blocking
/// connect waits there for the kernel's SYN retries, about two minutes).
#[test]
fn a_connect_left_unanswered_times_out_without_blocking_the_worker() {
    let connect_timeout = Duration::from_millis(300);
    let (listener, _fillers) = unanswering_address();
    let addr = listener.local_addr().unwrap();
    let (report, reports) = mpsc::channel();
    std::thread::spawn(move || {
        for mut driver in drivers() {
            let attempt = look_up_once(driver.as_mut(), addr, connect_timeout);
            if report.send((driver.name(), attempt)).is_err() {
                return;
            }
        }
    });
    let mut drivers_seen = 0;
    loop {
        let (name, attempt) = match reports.recv_timeout(connect_timeout + WATCHDOG) {
            Ok(report) => report,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                "the worker is stuck connecting to {addr}: no outcome within {:?}",
                connect_timeout + WATCHDOG
            ),
        };
        drivers_seen += 1;
        let error = attempt.outcome.expect_err("nothing answers at the address");
        let AsyncError::Call(source) = &error else {
            panic!("{name}: {error}");
        };
        match source.downcast_ref::<NetError>() {
            Some(NetError::ConnectTimeout {
                addr: named,
                timeout,
            }) => {
                assert_eq!(named, &addr.to_string(), "{name}");
                assert_eq!(*timeout, connect_timeout, "{name}");
            }
            other => panic!("{name}: {error} ({other:?})"),
        }
        let message = error.to_string();
        assert!(message.contains(&addr.to_string()), "{name}: {message}");
        assert!(message.contains("300ms"), "{name}: {message}");
        assert!(
            attempt.took >= connect_timeout,
            "{name}: failed after {:?}, before the connect timeout",
            attempt.took
        );
        assert!(
            attempt.flush_max < connect_timeout,
            "{name}: a flush took {:?}: it waited for the connect",
            attempt.flush_max
        );
    }
    assert!(drivers_seen >= 1);
    drop(listener);
}

/// A service that accepts connections and never reads them.
struct DeafService {
    addr: SocketAddr,
    drain: mpsc::Sender<()>,
    /// Request frames each connection carried, once drained.
    frames: mpsc::Receiver<Vec<usize>>,
}

impl DeafService {
    fn start() -> DeafService {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (drain, drain_order) = mpsc::channel();
        let (report, frames) = mpsc::channel();
        std::thread::spawn(move || {
            let mut streams = Vec::new();
            while drain_order.try_recv().is_err() {
                match listener.accept() {
                    Ok((stream, _)) => streams.push(stream),
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
            // Read what reached each connection: up to its end, or until nothing more
            // comes for a while (a connection still open).
            let counts = streams
                .into_iter()
                .map(|mut stream| {
                    stream.set_nonblocking(false).unwrap();
                    stream
                        .set_read_timeout(Some(Duration::from_millis(300)))
                        .unwrap();
                    let mut bytes = Vec::new();
                    let mut buffer = [0u8; 4096];
                    while let Ok(read @ 1..) = stream.read(&mut buffer) {
                        bytes.extend_from_slice(&buffer[..read]);
                    }
                    let mut frames = 0;
                    let mut offset = 0;
                    while let Ok(Some((_, used))) = decode_request(&bytes[offset..]) {
                        offset += used;
                        frames += 1;
                    }
                    assert_eq!(offset, bytes.len(), "whole request frames");
                    frames
                })
                .collect();
            let _ = report.send(counts);
        });
        DeafService {
            addr,
            drain,
            frames,
        }
    }
}

/// Requests waiting for a service that accepts connections but never reads them stay
/// within the client's capacity: with lookups refilling the client as fast as requests
/// expire, for many request timeouts, no connection ever carries more request frames
/// than the capacity (frames beyond it would be queued for the service, in the driver
/// or the kernel, with no bound). Checked on every driver by letting the service read,
/// at the end, everything that was queued for it.
#[test]
fn requests_for_a_service_that_never_reads_stay_within_capacity() {
    let capacity = 16;
    let request_timeout = Duration::from_millis(20);
    for mut driver in drivers() {
        let name = driver.name();
        let service = DeafService::start();
        let client = Rc::new(RefCell::new(
            LookupClient::<Key>::new(ClientConfig {
                addr: service.addr,
                connections: 1,
                capacity,
                request_timeout,
                connect_timeout: Duration::from_secs(5),
            })
            .unwrap(),
        ));
        let start = Instant::now();
        let mut key = 0;
        while start.elapsed() < request_timeout * 20 {
            client
                .borrow_mut()
                .expire(start.elapsed().as_nanos() as u64);
            while client.borrow().outstanding() < capacity {
                drop(client.borrow_mut().get(key));
                key += 1;
            }
            client.borrow_mut().flush(driver.as_mut());
            driver
                .turn(Some(Duration::from_millis(1)), &mut |event| {
                    client.borrow_mut().on_event(&event);
                })
                .unwrap();
        }
        let sent = client.borrow().stats().requests;
        assert!(
            sent > 4 * capacity as u64,
            "{name}: only {sent} requests in {:?}",
            request_timeout * 20
        );
        // The worker goes on while the service reads: what is still queued in the
        // driver goes out.
        service.drain.send(()).unwrap();
        let deadline = Instant::now() + WATCHDOG;
        let frames = loop {
            assert!(
                Instant::now() < deadline,
                "{name}: the service never drained"
            );
            driver
                .turn(Some(Duration::from_millis(5)), &mut |event| {
                    client.borrow_mut().on_event(&event);
                })
                .unwrap();
            if let Ok(frames) = service.frames.try_recv() {
                break frames;
            }
        };
        assert!(!frames.is_empty(), "{name}: no connection made");
        assert!(
            frames.iter().all(|&count| count <= capacity),
            "{name}: request frames per connection {frames:?}, capacity {capacity}, \
             {sent} requests sent"
        );
    }
}

/// A client dropped while its worker lives on (its task ended, the worker's driver
/// turns on) ends its connection: the service reads the end of the stream, on every
/// driver, after answering the lookups made. The service gives up after the watchdog
/// if the connection stays open.
#[test]
fn a_dropped_client_ends_its_connection() {
    for mut driver in drivers() {
        let name = driver.name();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let service = std::thread::spawn(move || -> std::io::Result<usize> {
            let (mut stream, _) = listener.accept()?;
            stream.set_read_timeout(Some(WATCHDOG))?;
            let mut inbox = Vec::new();
            let mut buffer = [0u8; 4096];
            let mut answered = 0;
            loop {
                let read = stream.read(&mut buffer)?;
                if read == 0 {
                    return Ok(answered);
                }
                inbox.extend_from_slice(&buffer[..read]);
                while let Ok(Some((request, used))) = decode_request(&inbox) {
                    inbox.drain(..used);
                    let mut out = Vec::new();
                    encode_response(&mut out, request.request_id, STATUS_OK, b"value");
                    stream.write_all(&out)?;
                    answered += 1;
                }
            }
        });
        let client: Client = Rc::new(RefCell::new(
            LookupClient::new(ClientConfig {
                addr,
                connections: 1,
                capacity: 16,
                request_timeout: Duration::from_secs(5),
                connect_timeout: ClientConfig::CONNECT_TIMEOUT_DEFAULT,
            })
            .unwrap(),
        ));
        let (out, failure) = run(driver.as_mut(), &client, &[1, 2, 3]);
        assert_eq!(failure, None, "{name}");
        assert_eq!(out.len(), 3, "{name}");
        assert_eq!(Rc::strong_count(&client), 1, "{name}: the last reference");
        drop(client);
        let deadline = Instant::now() + WATCHDOG * 2;
        while !service.is_finished() && Instant::now() < deadline {
            driver
                .turn(Some(Duration::from_millis(5)), &mut |_| {})
                .unwrap();
        }
        let answered = service
            .join()
            .expect("the service ran")
            .unwrap_or_else(|error| panic!("{name}: the connection stayed open: {error}"));
        assert_eq!(answered, 3, "{name}");
    }
}
