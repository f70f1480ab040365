//! Lookup workloads against the embedded service (pinned to the second core), all over
//! one connection with C requests in flight:
//!
//! - Weir's async operator over its lookup client on one worker, with the io_uring and
//!   the epoll driver, in turns as a runtime worker takes them: at most `POLL_BATCH`
//!   records fed per turn, their requests handed to the driver at the turn's end;
//! - a pipelined tokio client as a tokio user writes one: a current-thread runtime,
//!   the stream split in halves, `TCP_NODELAY`, a writer task that drains the calls
//!   queued since its last wake-up into one buffer and writes it with one call, a
//!   reader task that decodes every whole response in its read buffer at once, request
//!   ids that are slab slots, a call queued as it is made; the calls are
//!   `buffer_unordered(C)` over it, in a task out of tokio's budget that yields every
//!   128 answers (the budget's own pace; see `YIELD_EVERY`);
//! - a pipelined tokio loop: one task on a current-thread runtime keeping C requests
//!   outstanding on the connection, every answer read in a wake-up decoded at once and
//!   answered with the next request, the requests written every `POLL_BATCH` answers
//!   and at the end of the wake-up; no per-call future, no channel. What a tokio
//!   engineer writes when the calls need no API of their own (a load driver, a batch
//!   job): the cheapest way tokio offers to do the lookups;
//! - the ceiling: a hand-written `mio` event loop with the same batching (every answer
//!   read in a wake-up is decoded, each answer queues the next request, written every
//!   `POLL_BATCH` answers and at the end) and no operator, no per-call future, no
//!   bookkeeping beyond a count.
//!
//! The service answers on time when it has a core of its own (see [`SERVICE_SPIN`]).
//!
//! All reuse the service's own frame encoder and decoder (`weir_net::lookup::protocol`).

use std::cell::RefCell;
use std::future::Future;
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use futures::StreamExt;
use slab::Slab;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot};
use weir_engine::async_io::{AsyncConfig, AsyncWaitOperator, OutputMode};
use weir_engine::element::{Collector, StreamElement};
use weir_engine::limits::LATENCY_SAMPLE_EVERY;
use weir_engine::park::Parker;
use weir_net::lookup::protocol::{decode_response, encode_request, REQUEST_LEN, STATUS_OK};
use weir_net::lookup::{
    ClientConfig, Latency, LookupClient, LookupFunction, LookupRequest, LookupServer, ServerConfig,
};
use weir_net::DriverKind;

use crate::affinity::{bench_cores, pin};
use crate::async_peers::{histogram, thread_cpu_ns, CpuTime, Measurement};

/// How long before a due answer the service stops sleeping, when it has a core of its
/// own: the service stands for an external system whose latency is exactly `latency`,
/// and a sleeping service would answer one wake-up late (tens of microseconds, more on
/// a virtual machine), which every client would pay alike.
pub const SERVICE_SPIN: Duration = Duration::from_micros(200);

/// A service with `latency`, its thread on the second bench core, answering on time
/// (see [`SERVICE_SPIN`]) when that core is its own.
pub fn service(latency: Latency) -> LookupServer {
    let (_, core_b) = bench_cores();
    let config = ServerConfig {
        latency,
        value_size: 16,
        core: core_b.map(|c| c.id),
        spin: if core_b.is_some() {
            SERVICE_SPIN
        } else {
            Duration::ZERO
        },
        ..ServerConfig::default()
    };
    LookupServer::start(config).expect("lookup service starts")
}

/// The CPU clocks of the calling thread and of the service's thread at the start of a
/// measured loop. Started before the loop's clock and stopped after it, on the thread
/// that runs the loop (a tokio current-thread runtime runs its tasks on the thread
/// that calls `block_on`, so its tasks are counted as Weir's operator is).
struct CpuMeter<'a> {
    server: &'a LookupServer,
    client_ns: u64,
    service_ns: u64,
}

impl<'a> CpuMeter<'a> {
    fn start(server: &'a LookupServer) -> Self {
        let service_ns = server.cpu_ns();
        CpuMeter {
            server,
            client_ns: thread_cpu_ns(),
            service_ns,
        }
    }

    fn stop(self) -> CpuTime {
        let client_ns = thread_cpu_ns().saturating_sub(self.client_ns);
        CpuTime {
            client_ns,
            service_ns: self.server.cpu_ns().saturating_sub(self.service_ns),
        }
    }
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

/// Records a worker feeds its operator per turn (the runtime's batch).
const POLL_BATCH: usize = 256;

/// `n` lookups through Weir's unordered operator (capacity `c`) on this thread with the
/// `driver`, against `addr`.
pub fn weir(driver: DriverKind, server: &LookupServer, c: usize, n: u64) -> Measurement {
    let (core_a, _) = bench_cores();
    pin(core_a);
    let mut driver = weir_net::build_driver(driver).expect("driver");
    let config = ClientConfig {
        addr: server.addr(),
        connections: 1,
        capacity: c * 2 + 16,
        request_timeout: Duration::from_secs(30),
        connect_timeout: ClientConfig::CONNECT_TIMEOUT_DEFAULT,
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
    let cpu = CpuMeter::start(server);
    let epoch = Instant::now();
    let mut out = Count(0);
    let mut next = 0;
    while out.0 < n {
        let now = epoch.elapsed().as_nanos() as u64;
        // As a runtime worker does: at most POLL_BATCH records per turn, their requests
        // handed to the driver at the end of the turn, so a thousand calls go out in
        // several sends while the service already answers the first.
        let mut fed = 0;
        while next < n && fed < POLL_BATCH && !operator.is_full() {
            operator
                .process_record(Key(next), None, now, &mut out)
                .expect("no failure");
            next += 1;
            fed += 1;
        }
        client.borrow_mut().flush(driver.as_mut());
        let wait = if fed > 0 || operator.has_completions() {
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
    let cpu = cpu.stop();
    Measurement {
        elapsed,
        latency_ns: Some(operator.metrics().latency_ns.clone()),
        cpu: Some(cpu),
    }
}

/// The answer a call computes from its value (the same as Weir's [`Key::complete`]).
fn answer(key: u64, value: &[u8]) -> u64 {
    key ^ u64::from(value.first().copied().unwrap_or(0))
}

/// A call waiting for its response: its key and where its answer goes.
type Waiter = (u64, oneshot::Sender<u64>);

/// Most calls the writer task takes from its queue per wake-up.
const WRITE_BATCH_MAX: usize = 4096;

/// Answers after which the task driving the calls yields to the runtime: tokio's own
/// budget (128 operations a poll of a task), spent at a point of the task's choosing.
///
/// `buffer_unordered` polls all the calls in one task. Under tokio's budget, the call
/// whose `oneshot` finds the budget spent answers `Pending` and defers its wake-up to
/// the scheduler, which `FuturesUnordered` cannot tell from a wait: it goes on polling
/// every other ready call in vain (each answering `Pending` and queueing a wake-up),
/// and again after each 128 answers, so a read of R answers costs about R²/256 polls:
/// at 1024 calls in flight, more than eight polls a call where two do. The task
/// therefore runs out of the budget (`tokio::task::unconstrained`) and yields itself at
/// this pace; the writer task then sends the calls made since, so the
/// service answers them while the task takes the next answers.
const YIELD_EVERY: u64 = 128;

/// A pipelined client for the lookup protocol on a tokio current-thread runtime (inside
/// a `LocalSet`): calls queue on an unbounded channel to the writer task, which gives
/// each a slab slot as its request id; the reader task answers them by slot.
struct TokioClient {
    calls: mpsc::UnboundedSender<Waiter>,
}

impl TokioClient {
    /// Connects to `addr` and spawns the writer and reader tasks on the current
    /// `LocalSet`.
    async fn connect(addr: SocketAddr) -> std::io::Result<TokioClient> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (reader, writer) = stream.into_split();
        let waiting = Rc::new(RefCell::new(Slab::with_capacity(1024)));
        let (calls, queued) = mpsc::unbounded_channel();
        tokio::task::spawn_local(Self::write_loop(writer, queued, Rc::clone(&waiting)));
        tokio::task::spawn_local(Self::read_loop(reader, waiting));
        Ok(TokioClient { calls })
    }

    /// Looks `key` up: queues the call for the writer task at once, as the call is
    /// made, and returns the future of its answer. (Queued on its first poll instead,
    /// a call would wait for `FuturesUnordered` to poll every call woken before it, the
    /// answers of the whole read, and go out with them in one write per window.)
    fn get(&self, key: u64) -> impl Future<Output = u64> + 'static {
        let (reply, answered) = oneshot::channel();
        self.calls
            .send((key, reply))
            .expect("the writer task runs while the client lives");
        async move { answered.await.expect("the service answers every request") }
    }

    /// Encodes every call queued since the last wake-up into one buffer, then writes it.
    async fn write_loop(
        mut writer: OwnedWriteHalf,
        mut queued: mpsc::UnboundedReceiver<Waiter>,
        waiting: Rc<RefCell<Slab<Waiter>>>,
    ) {
        let mut batch = Vec::with_capacity(WRITE_BATCH_MAX);
        let mut out = Vec::with_capacity(WRITE_BATCH_MAX * REQUEST_LEN);
        while queued.recv_many(&mut batch, WRITE_BATCH_MAX).await > 0 {
            {
                let mut waiting = waiting.borrow_mut();
                for (key, reply) in batch.drain(..) {
                    let id = waiting.insert((key, reply));
                    encode_request(&mut out, id as u64, key);
                }
            }
            if writer.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
    }

    /// Reads what the socket has, then answers every whole response in the buffer.
    async fn read_loop(mut reader: OwnedReadHalf, waiting: Rc<RefCell<Slab<Waiter>>>) {
        let mut inbox = BytesMut::with_capacity(64 * 1024);
        loop {
            inbox.reserve(32 * 1024);
            match reader.read_buf(&mut inbox).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let mut waiting = waiting.borrow_mut();
            loop {
                let (id, value, used) = match decode_response(&inbox) {
                    Ok(Some((response, used))) => {
                        assert_eq!(response.status, STATUS_OK, "the service fails no call");
                        let value = response.value.first().copied().unwrap_or(0);
                        (response.request_id as usize, value, used)
                    }
                    Ok(None) => break,
                    Err(malformed) => panic!("malformed response: {malformed:?}"),
                };
                inbox.advance(used);
                if let Some((key, reply)) = waiting.try_remove(id) {
                    let _ = reply.send(answer(key, &[value]));
                }
            }
        }
    }
}

/// `n` lookups through `buffer_unordered(c)` over `TokioClient` on a tokio
/// current-thread runtime; latency from call to answer, of one call in
/// `LATENCY_SAMPLE_EVERY` as the operator samples it.
pub fn tokio(server: &LookupServer, c: usize, n: u64) -> Measurement {
    let (core_a, _) = bench_cores();
    pin(core_a);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let client = TokioClient::connect(server.addr()).await.expect("connect");
        let cpu = CpuMeter::start(server);
        let start = Instant::now();
        let mut latency = histogram();
        let client = &client;
        let calls = futures::stream::iter(0..n).map(|key| {
            let invoked = (key % LATENCY_SAMPLE_EVERY == 0).then(Instant::now);
            let answer = client.get(key);
            async move { (answer.await, invoked.map(|at| at.elapsed())) }
        });
        // Out of tokio's budget, yielding every `YIELD_EVERY` answers instead (see
        // there): `FuturesUnordered` cannot tell the budget's deferred wake-ups from
        // waits, and would poll every ready call once per 128 answers.
        let (count, sum) = tokio::task::unconstrained(async {
            let mut results = calls.buffer_unordered(c);
            let mut count = 0u64;
            let mut sum = 0u64;
            while let Some((value, took)) = results.next().await {
                sum = sum.wrapping_add(value);
                if let Some(took) = took {
                    latency.saturating_record(took.as_nanos().max(1) as u64);
                }
                count += 1;
                if count % YIELD_EVERY == 0 {
                    tokio::task::yield_now().await;
                }
            }
            (count, sum)
        })
        .await;
        let elapsed = start.elapsed();
        let cpu = cpu.stop();
        assert_eq!(count, n);
        std::hint::black_box(sum);
        Measurement {
            elapsed,
            latency_ns: Some(latency),
            cpu: Some(cpu),
        }
    })
}

/// `n` lookups by one task on a tokio current-thread runtime: `c` requests outstanding,
/// all answers of a read decoded in bulk and each answered by the next request, the
/// requests of a wake-up written with one `write_all`. Latency of one call in
/// `LATENCY_SAMPLE_EVERY`, from when its request was queued.
pub fn tokio_loop(server: &LookupServer, c: usize, n: u64) -> Measurement {
    let (core_a, _) = bench_cores();
    pin(core_a);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        let mut stream = tokio::net::TcpStream::connect(server.addr())
            .await
            .expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let cpu = CpuMeter::start(server);
        let start = Instant::now();
        let mut latency = histogram();
        let mut sent_at: Vec<Option<Instant>> = vec![None; c];
        let mut out = Vec::with_capacity(c * REQUEST_LEN);
        let mut next = 0u64;
        // Request ids are slots in `0..c`: an answer's slot takes the next request.
        while next < n.min(c as u64) {
            if next % LATENCY_SAMPLE_EVERY == 0 {
                sent_at[next as usize] = Some(Instant::now());
            }
            encode_request(&mut out, next, next);
            next += 1;
        }
        let mut inbox = BytesMut::with_capacity(256 * 1024);
        let mut answered = 0u64;
        let mut sum = 0u64;
        while answered < n {
            if !out.is_empty() {
                stream.write_all(&out).await.expect("write");
                out.clear();
            }
            if stream.read_buf(&mut inbox).await.expect("read") == 0 {
                panic!("service closed the connection");
            }
            let mut offset = 0;
            while let Some((response, used)) =
                decode_response(&inbox[offset..]).expect("well-formed response")
            {
                let slot = response.request_id as usize;
                sum = sum.wrapping_add(answer(response.request_id, response.value));
                offset += used;
                answered += 1;
                if let Some(at) = sent_at[slot].take() {
                    latency.saturating_record(at.elapsed().as_nanos().max(1) as u64);
                }
                if next < n {
                    if next % LATENCY_SAMPLE_EVERY == 0 {
                        sent_at[slot] = Some(Instant::now());
                    }
                    encode_request(&mut out, slot as u64, next);
                    next += 1;
                    if out.len() >= POLL_BATCH * REQUEST_LEN {
                        // A long read's answers go out in several writes, as Weir's
                        // turns send them, so the service starts on the first early.
                        stream.write_all(&out).await.expect("write");
                        out.clear();
                    }
                }
            }
            inbox.advance(offset);
        }
        let elapsed = start.elapsed();
        let cpu = cpu.stop();
        std::hint::black_box(sum);
        Measurement {
            elapsed,
            latency_ns: Some(latency),
            cpu: Some(cpu),
        }
    })
}

/// The ceiling: a hand-written `mio` loop on one non-blocking socket keeping `c`
/// requests outstanding, each answer answered by the next request, all reads decoded
/// in bulk and all writes of a wake-up batched into one; no operator.
pub fn mio_ceiling(server: &LookupServer, c: usize, n: u64) -> Measurement {
    const SOCKET: mio::Token = mio::Token(0);
    let (core_a, _) = bench_cores();
    pin(core_a);
    let stream = std::net::TcpStream::connect(server.addr()).expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    stream.set_nonblocking(true).expect("non-blocking");
    let mut stream = mio::net::TcpStream::from_std(stream);
    let mut poll = mio::Poll::new().expect("poll");
    poll.registry()
        .register(
            &mut stream,
            SOCKET,
            mio::Interest::READABLE | mio::Interest::WRITABLE,
        )
        .expect("register");
    let mut events = mio::Events::with_capacity(8);
    let cpu = CpuMeter::start(server);
    let start = Instant::now();
    let mut out = Vec::with_capacity(c * REQUEST_LEN);
    let mut written = 0;
    let mut next = 0u64;
    while next < n.min(c as u64) {
        encode_request(&mut out, next, next);
        next += 1;
    }
    let mut inbox = vec![0u8; 256 * 1024];
    let mut filled = 0;
    let mut answered = 0u64;
    let mut sum = 0u64;
    // Writes what is queued until the socket takes no more.
    let write = |stream: &mut mio::net::TcpStream, out: &mut Vec<u8>, written: &mut usize| {
        while *written < out.len() {
            match stream.write(&out[*written..]) {
                Ok(sent) => *written += sent,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => panic!("write: {e}"),
            }
        }
        if *written == out.len() {
            out.clear();
            *written = 0;
        }
    };
    loop {
        write(&mut stream, &mut out, &mut written);
        if answered == n {
            break;
        }
        poll.poll(&mut events, None).expect("poll");
        // Edge-triggered: read until the socket is empty, decoding as the buffer fills.
        loop {
            match stream.read(&mut inbox[filled..]) {
                Ok(0) => panic!("service closed the connection"),
                Ok(read) => filled += read,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => panic!("read: {e}"),
            }
            let mut offset = 0;
            while let Some((response, used)) =
                decode_response(&inbox[offset..filled]).expect("well-formed response")
            {
                sum = sum.wrapping_add(answer(response.request_id, response.value));
                offset += used;
                answered += 1;
                if next < n {
                    encode_request(&mut out, next, next);
                    next += 1;
                    if out.len() - written >= POLL_BATCH * REQUEST_LEN {
                        // Several writes per long read, as Weir's turns send them.
                        write(&mut stream, &mut out, &mut written);
                    }
                }
            }
            inbox.copy_within(offset..filled, 0);
            filled -= offset;
        }
    }
    let elapsed = start.elapsed();
    let cpu = cpu.stop();
    std::hint::black_box(sum);
    Measurement {
        elapsed,
        latency_ns: None,
        cpu: Some(cpu),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tokio_client_and_the_mio_loop_get_every_answer() {
        let _cores = crate::affinity::exclusive_cores();
        let server = service(Latency::Fixed(Duration::ZERO));
        for (c, n) in [(1, 50), (16, 5_000), (256, 3_000), (64, 10)] {
            let measured = tokio(&server, c, n);
            assert!(!measured.latency_ns.expect("sampled").is_empty());
            assert!(measured.cpu.expect("measured").client_ns > 0);
            let measured = tokio_loop(&server, c, n);
            assert!(!measured.latency_ns.expect("sampled").is_empty());
            let measured = mio_ceiling(&server, c, n);
            let cpu = measured.cpu.expect("measured");
            assert!(cpu.client_ns > 0 && cpu.service_ns > 0, "{cpu:?}");
        }
    }
}
