//! The lookup client on both drivers against the service, and against a misbehaving
//! peer: values come back intact; a malformed frame closes only its connection and
//! fails only the requests on it, with a clear error.

use std::cell::RefCell;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::rc::Rc;
use std::time::{Duration, Instant};

use weir_engine::async_io::{AsyncConfig, AsyncWaitOperator, OutputMode};
use weir_engine::element::StreamElement;
use weir_engine::park::Parker;
use weir_engine::runtime::Driver;
use weir_net::lookup::protocol::{decode_request, encode_response, STATUS_OK};
use weir_net::lookup::{
    ClientConfig, LookupClient, LookupFunction, LookupRequest, LookupServer, ServerConfig,
};
use weir_net::DriverKind;

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
    let mut operator = AsyncWaitOperator::new(
        LookupFunction::new(Rc::clone(client)),
        config,
        parker.unparker(),
    )
    .unwrap();
    let mut out = Vec::new();
    for &key in keys {
        operator
            .process_record(Key(key), None, 0, &mut out)
            .unwrap();
    }
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
        let config = ClientConfig {
            addr: server.addr(),
            connections: 3,
            capacity: 4096,
            request_timeout: Duration::from_secs(5),
        };
        let client: Client = Rc::new(RefCell::new(LookupClient::new(config).unwrap()));
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
    use weir_net::lookup::protocol::{decode_response, encode_request};
    use weir_net::lookup::Latency;
    let latency = Duration::from_millis(2);
    let server = LookupServer::start(ServerConfig {
        latency: Latency::Fixed(latency),
        spin: Duration::from_micros(500),
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
