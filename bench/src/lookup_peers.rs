//! Lookup workloads against the embedded service (pinned to the second core): Weir's
//! async operator over its lookup client on one worker with the io_uring and the epoll
//! driver; a tokio + futures client speaking the same protocol
//! (`buffer_unordered(C)` over one pipelined `TcpStream`); and the raw ceiling, a bare
//! loop keeping C requests outstanding on a blocking socket with no operator at all.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weir_engine::async_io::{AsyncConfig, AsyncWaitOperator, OutputMode};
use weir_engine::element::{Collector, StreamElement};
use weir_engine::park::Parker;
use weir_net::lookup::protocol::{decode_response, encode_request};
use weir_net::lookup::{
    ClientConfig, Latency, LookupClient, LookupFunction, LookupRequest, LookupServer, ServerConfig,
};
use weir_net::DriverKind;

use crate::affinity::{bench_cores, pin};
use crate::async_peers::{histogram, Measurement};

/// A service with `latency`, its thread on the second bench core.
pub fn service(latency: Latency) -> LookupServer {
    let (_, core_b) = bench_cores();
    let config = ServerConfig {
        latency,
        value_size: 16,
        core: core_b.map(|c| c.id),
        ..ServerConfig::default()
    };
    LookupServer::start(config).expect("lookup service starts")
}

#[derive(Debug, Clone, Copy)]
struct Key(u64);

impl LookupRequest for Key {
    type Out = u64;
    fn key(&self) -> u64 {
        self.0
    }
    fn complete(self, value: &[u8]) -> u64 {
        self.0 ^ u64::from(value.first().copied().unwrap_or(0))
    }
}

struct Count(u64);

impl Collector<u64> for Count {
    fn collect(&mut self, element: StreamElement<u64>) {
        if element.as_record().is_some() {
            self.0 += 1;
        }
    }
}

/// `n` lookups through Weir's unordered operator (capacity `c`) on this thread with the
/// `driver`, against `addr`.
pub fn weir(driver: DriverKind, addr: SocketAddr, c: usize, n: u64) -> Measurement {
    let (core_a, _) = bench_cores();
    pin(core_a);
    let mut driver = weir_net::build_driver(driver).expect("driver");
    let config = ClientConfig {
        addr,
        connections: 1,
        capacity: c * 2 + 16,
        request_timeout: Duration::from_secs(30),
    };
    let client = Rc::new(RefCell::new(
        LookupClient::<Key>::new(config).expect("client"),
    ));
    let parker = Parker::current();
    let mut operator = AsyncWaitOperator::new(
        LookupFunction::new(Rc::clone(&client)),
        AsyncConfig::new(OutputMode::Unordered, c),
        parker.unparker(),
    )
    .expect("operator");
    let epoch = Instant::now();
    let mut out = Count(0);
    let mut next = 0;
    while out.0 < n {
        let now = epoch.elapsed().as_nanos() as u64;
        while next < n && !operator.is_full() {
            operator
                .process_record(Key(next), None, now, &mut out)
                .expect("no failure");
            next += 1;
        }
        client.borrow_mut().flush(driver.as_mut());
        let wait = if operator.has_completions() {
            Some(Duration::ZERO)
        } else {
            Some(Duration::from_millis(50))
        };
        driver
            .turn(wait, &mut |event| {
                client.borrow_mut().on_event(&event);
            })
            .expect("driver turn");
        operator
            .drain(epoch.elapsed().as_nanos() as u64, &mut out)
            .expect("no failure");
    }
    let elapsed = epoch.elapsed();
    Measurement {
        elapsed,
        latency_ns: Some(operator.metrics().latency_ns.clone()),
    }
}

/// `n` lookups through `buffer_unordered(c)` on a tokio current-thread runtime: each
/// call writes its request and awaits its answer from a reader task that matches ids.
pub fn tokio(addr: SocketAddr, c: usize, n: u64) -> Measurement {
    let (core_a, _) = bench_cores();
    pin(core_a);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let (mut reader, writer) = stream.into_split();
        let writer = Rc::new(tokio::sync::Mutex::new(writer));
        type Waiters = Rc<RefCell<HashMap<u64, tokio::sync::oneshot::Sender<(u64, Instant)>>>>;
        let waiters: Waiters = Rc::new(RefCell::new(HashMap::new()));
        let local = tokio::task::LocalSet::new();
        let reader_waiters = Rc::clone(&waiters);
        local.spawn_local(async move {
            let mut inbox = Vec::with_capacity(64 * 1024);
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                let read = match reader.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(read) => read,
                };
                inbox.extend_from_slice(&buffer[..read]);
                let mut offset = 0;
                while let Ok(Some((response, used))) = decode_response(&inbox[offset..]) {
                    offset += used;
                    if let Some(waiter) = reader_waiters.borrow_mut().remove(&response.request_id) {
                        let _ = waiter.send((response.request_id, Instant::now()));
                    }
                }
                inbox.drain(..offset);
            }
        });
        local
            .run_until(async move {
                let start = Instant::now();
                let mut latency = histogram();
                let calls = futures::stream::iter(0..n).map(|id| {
                    let writer = Rc::clone(&writer);
                    let waiters = Rc::clone(&waiters);
                    async move {
                        let invoked = Instant::now();
                        let (sender, receiver) = tokio::sync::oneshot::channel();
                        waiters.borrow_mut().insert(id, sender);
                        let mut frame = Vec::with_capacity(20);
                        encode_request(&mut frame, id, id);
                        writer.lock().await.write_all(&frame).await.expect("write");
                        let (_, answered) = receiver.await.expect("answer");
                        answered.duration_since(invoked)
                    }
                });
                let mut results = calls.buffer_unordered(c);
                let mut count = 0u64;
                while let Some(took) = results.next().await {
                    latency.saturating_record(took.as_nanos().max(1) as u64);
                    count += 1;
                }
                assert_eq!(count, n);
                Measurement {
                    elapsed: start.elapsed(),
                    latency_ns: Some(latency),
                }
            })
            .await
    })
}

/// The ceiling: `c` requests outstanding on one blocking socket, each answer answered
/// by the next request, all writes and reads batched, no operator.
pub fn raw(addr: SocketAddr, c: usize, n: u64) -> Measurement {
    let (core_a, _) = bench_cores();
    pin(core_a);
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let start = Instant::now();
    let mut out = Vec::with_capacity(c * 20);
    let mut next = 0u64;
    while next < n.min(c as u64) {
        encode_request(&mut out, next, next);
        next += 1;
    }
    stream.write_all(&out).expect("write");
    let mut inbox = Vec::with_capacity(1 << 20);
    let mut buffer = vec![0u8; 256 * 1024];
    let mut answered = 0u64;
    while answered < n {
        let read = stream.read(&mut buffer).expect("read");
        assert!(read > 0, "service closed the connection");
        inbox.extend_from_slice(&buffer[..read]);
        let mut offset = 0;
        out.clear();
        while let Ok(Some((_, used))) = decode_response(&inbox[offset..]) {
            offset += used;
            answered += 1;
            if next < n {
                encode_request(&mut out, next, next);
                next += 1;
            }
        }
        inbox.drain(..offset);
        if !out.is_empty() {
            stream.write_all(&out).expect("write");
        }
    }
    start.elapsed().into()
}
