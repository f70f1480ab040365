//! Remote channels on loopback: exactly-once delivery through the whole exchange,
//! credits, a slow channel's isolation, and the faults (a peer killed mid-stream, a
//! malformed or oversized frame, a peer that never answers).
//!
//! No timing assertions: every wait is a generous hang guard.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use weir_engine::exchange::{
    local_channel, Forward, GateEvent, InputChannel, InputGate, LocalBufferPool, LocalPoolConfig,
    NetworkBufferPool, RecordWriter, ResultPartition, WriterConfig,
};
use weir_engine::ExchangeError;
use weir_net::transport::auth::{self, Role, Transcript};
use weir_net::transport::{
    Frame, FrameError, Header, Peer, RemoteInputChannel, Transport, TransportConfig, TransportError,
};
use weir_net::transport::{JobId, Secret};
use weir_net::DriverKind;

const GUARD: Duration = Duration::from_secs(60);
const SEGMENT: usize = 4096;

thread_local! {
    static DRIVER: std::cell::Cell<DriverKind> = const { std::cell::Cell::new(DriverKind::Epoll) };
}

/// The drivers to run each test on: epoll, and io_uring where the kernel allows it.
fn drivers() -> Vec<DriverKind> {
    let mut config = TransportConfig::new(0);
    config.driver = DriverKind::Uring;
    match Transport::start(config) {
        Ok(_) => vec![DriverKind::Epoll, DriverKind::Uring],
        Err(error) => {
            eprintln!("io_uring unavailable here, epoll only: {error}");
            vec![DriverKind::Epoll]
        }
    }
}

/// Runs `test` once per driver in [`drivers`], with [`config`] picking it.
fn on_each_driver(test: fn()) {
    for driver in drivers() {
        DRIVER.with(|d| d.set(driver));
        test();
    }
}

fn config(process: u32) -> TransportConfig {
    let mut config = TransportConfig::new(process);
    config.driver = DRIVER.with(|d| d.get());
    config
}

fn transport(process: u32) -> Transport {
    let transport = Transport::start(config(process)).expect("transport starts");
    assert_eq!(
        transport.driver_name(),
        match DRIVER.with(|d| d.get()) {
            DriverKind::Uring => "uring",
            _ => "epoll",
        }
    );
    transport
}

/// Writes `count` u64 records (`first..first + count`) into a one-subpartition
/// partition served by `transport` as `channel`, on a thread of its own.
fn produce(
    transport: &Transport,
    channel: u32,
    first: u64,
    count: u64,
    timeout: Option<Duration>,
) -> thread::JoinHandle<Result<(), ExchangeError>> {
    let network = NetworkBufferPool::new(64, SEGMENT).expect("pool");
    let pool = LocalBufferPool::new(&network, LocalPoolConfig::new(16, 1)).expect("local pool");
    let (sender, input) = local_channel(16 + pool.overdraft_max(), Some(transport.notify()));
    transport.serve(channel, input);
    let partition = ResultPartition::new(pool, vec![sender]).expect("partition");
    let config = WriterConfig {
        buffer_timeout: timeout,
        ..WriterConfig::default()
    };
    let mut writer = RecordWriter::<u64, _>::new(partition, Forward, config).expect("writer");
    thread::spawn(move || {
        let started = Instant::now();
        let wait = |started: Instant| {
            assert!(started.elapsed() < GUARD, "producer hung");
            thread::sleep(Duration::from_micros(50));
        };
        for value in first..first + count {
            while !writer.poll_ready(0)? {
                wait(started);
            }
            writer.emit(&value, 0)?;
        }
        while !writer.poll_ready(0)? {
            wait(started);
        }
        writer.finish(0)?;
        while !writer.resume(0)? {
            wait(started);
        }
        writer.flush()?;
        drop(network);
        Ok(())
    })
}

/// A one-subpartition writer whose channel `transport` serves as `channel` (for
/// process `consumer` alone, when given), with segments from `network`.
fn served_writer(
    transport: &Transport,
    channel: u32,
    consumer: Option<u32>,
    network: &NetworkBufferPool,
) -> RecordWriter<u64, Forward> {
    let pool = LocalBufferPool::new(network, LocalPoolConfig::new(4, 1)).expect("pool");
    let (sender, input) = local_channel(4 + pool.overdraft_max(), Some(transport.notify()));
    match consumer {
        Some(consumer) => transport.serve_to(channel, consumer, input),
        None => transport.serve(channel, input),
    }
    let partition = ResultPartition::new(pool, vec![sender]).expect("partition");
    RecordWriter::new(partition, Forward, WriterConfig::default()).expect("writer")
}

/// Reads `gate` to its end (or its first error), with a hang guard.
fn drain(gate: &mut InputGate<u64>) -> Result<Vec<(usize, u64)>, ExchangeError> {
    let started = Instant::now();
    let mut records = Vec::new();
    loop {
        match gate.poll_next()? {
            Some(GateEvent::Record { value, channel }) => records.push((channel, value)),
            Some(GateEvent::End) => return Ok(records),
            Some(
                GateEvent::Watermark(_)
                | GateEvent::Barrier { .. }
                | GateEvent::CheckpointAborted { .. },
            ) => {}
            None => {
                assert!(started.elapsed() < GUARD, "consumer hung");
                thread::sleep(Duration::from_micros(50));
            }
        }
    }
}

fn boxed(channels: Vec<RemoteInputChannel>) -> Vec<Box<dyn InputChannel>> {
    channels
        .into_iter()
        .map(|c| Box::new(c) as Box<dyn InputChannel>)
        .collect()
}

/// Records go `RecordWriter → ResultPartition → transport → InputGate` exactly once and
/// in order per channel, over two remote channels on one connection and a local channel
/// in the same gate.
#[test]
fn records_cross_exactly_once_beside_a_local_channel() {
    on_each_driver(records_cross_exactly_once_beside_a_local_channel_on);
}

fn records_cross_exactly_once_beside_a_local_channel_on() {
    let producer = transport(1);
    let consumer = transport(2);
    let count = 20_000;
    let a = produce(&producer, 10, 0, count, Some(Duration::from_millis(1)));
    let b = produce(&producer, 11, 1_000_000, count, None);
    let network = NetworkBufferPool::new(256, SEGMENT).expect("pool");
    let mut channels = boxed(
        consumer
            .consume(producer.peer(), &[10, 11], &network, None)
            .expect("consume"),
    );
    // A local channel in the same gate.
    let local_network = NetworkBufferPool::new(32, SEGMENT).expect("pool");
    let pool = LocalBufferPool::new(&local_network, LocalPoolConfig::new(8, 1)).expect("pool");
    let (sender, local) = local_channel(8 + pool.overdraft_max(), None);
    channels.push(Box::new(local));
    let partition = ResultPartition::new(pool, vec![sender]).expect("partition");
    let mut writer =
        RecordWriter::<u64, _>::new(partition, Forward, WriterConfig::default()).expect("writer");
    for value in 0..5u64 {
        writer.emit(&(2_000_000 + value), 0).expect("emit");
    }
    writer.finish(0).expect("finish");
    writer.flush().expect("flush");
    let mut gate = InputGate::<u64>::new(channels).expect("gate");
    let records = drain(&mut gate).expect("every record arrives");
    a.join().expect("producer a").expect("producer a ok");
    b.join().expect("producer b").expect("producer b ok");
    for (channel, first, expected) in [(0, 0, count), (1, 1_000_000, count), (2, 2_000_000, 5)] {
        let got: Vec<u64> = records
            .iter()
            .filter(|(c, _)| *c == channel)
            .map(|(_, v)| *v)
            .collect();
        let want: Vec<u64> = (first..first + expected).collect();
        assert_eq!(
            got, want,
            "channel {channel}: in order, none lost or repeated"
        );
    }
    drop(writer);
    drop(gate);
}

/// A consumer that does not read stops only its own channel: the other channel on the
/// same connection (same gate pool, same process pair) runs to its end meanwhile. Then
/// the slow one is read, complete.
#[test]
fn a_slow_channel_back_pressures_only_itself() {
    on_each_driver(a_slow_channel_back_pressures_only_itself_on);
}

fn a_slow_channel_back_pressures_only_itself_on() {
    let producer = transport(1);
    let consumer = transport(2);
    let count = 50_000;
    let slow_producer = produce(&producer, 1, 0, count, None);
    let fast_producer = produce(&producer, 2, 0, count, None);
    let network = NetworkBufferPool::new(64, SEGMENT).expect("pool");
    let mut channels = consumer
        .consume(producer.peer(), &[1, 2], &network, None)
        .expect("consume");
    let fast = channels.pop().expect("two channels");
    let slow = channels.pop().expect("two channels");
    let mut fast_gate = InputGate::<u64>::new(vec![Box::new(fast)]).expect("gate");
    let records = drain(&mut fast_gate).expect("the fast channel ends");
    assert_eq!(records.len() as u64, count);
    fast_producer
        .join()
        .expect("join")
        .expect("fast producer ok");
    // The slow channel holds at most what credit allowed: exclusive + floating buffers.
    assert!(slow.buffered() <= 2 + 8, "{} buffers", slow.buffered());
    assert!(!slow_producer.is_finished() || count * 12 < 10 * SEGMENT as u64);
    let mut slow_gate = InputGate::<u64>::new(vec![Box::new(slow)]).expect("gate");
    let records = drain(&mut slow_gate).expect("the slow channel ends too");
    let values: Vec<u64> = records.into_iter().map(|(_, v)| v).collect();
    assert_eq!(values, (0..count).collect::<Vec<_>>());
    slow_producer
        .join()
        .expect("join")
        .expect("slow producer ok");
}

/// A producer process that dies mid-stream fails each of its channels at the consumer
/// with an error naming the channel and the peer; a channel from another process on the
/// same gate is unaffected and still delivers everything.
#[test]
fn a_killed_peer_fails_its_channels_and_no_other() {
    on_each_driver(a_killed_peer_fails_its_channels_and_no_other_on);
}

fn a_killed_peer_fails_its_channels_and_no_other_on() {
    let doomed = transport(1);
    let healthy = transport(3);
    let consumer = transport(2);
    let network = NetworkBufferPool::new(128, SEGMENT).expect("pool");
    // The doomed producer serves a channel that never ends.
    let pool_network = NetworkBufferPool::new(16, SEGMENT).expect("pool");
    let pool = LocalBufferPool::new(&pool_network, LocalPoolConfig::new(4, 1)).expect("pool");
    let (sender, input) = local_channel(4 + pool.overdraft_max(), Some(doomed.notify()));
    doomed.serve(5, input);
    let partition = ResultPartition::new(pool, vec![sender]).expect("partition");
    let mut writer =
        RecordWriter::<u64, _>::new(partition, Forward, WriterConfig::default()).expect("writer");
    writer.emit(&42, 0).expect("emit");
    writer.flush().expect("flush");
    let good = produce(&healthy, 6, 0, 10_000, None);
    let doomed_channel = consumer
        .consume(doomed.peer(), &[5], &network, None)
        .expect("consume")
        .pop()
        .expect("one");
    let healthy_channel = consumer
        .consume(healthy.peer(), &[6], &network, None)
        .expect("consume")
        .pop()
        .expect("one");
    let mut doomed_gate = InputGate::<u64>::new(vec![Box::new(doomed_channel)]).expect("gate");
    // The record before the death arrives.
    let started = Instant::now();
    loop {
        match doomed_gate.poll_next().expect("no failure yet") {
            Some(GateEvent::Record { value, .. }) => {
                assert_eq!(value, 42);
                break;
            }
            Some(other) => panic!("unexpected {other:?}"),
            None => {
                assert!(started.elapsed() < GUARD, "hung");
                thread::sleep(Duration::from_micros(100));
            }
        }
    }
    let doomed_addr = doomed.local_addr();
    drop(doomed);
    let error = drain(&mut doomed_gate).expect_err("the channel fails");
    let ExchangeError::ChannelFailed { channel, source } = &error else {
        panic!("expected a channel failure, got {error}");
    };
    assert_eq!(*channel, 0);
    let message = error.to_string();
    assert!(message.contains("remote channel 5"), "{message}");
    assert!(message.contains(&doomed_addr.to_string()), "{message}");
    assert!(message.contains("process 1"), "{message}");
    assert!(source.to_string().contains("lost"), "{message}");
    // The other process's channel goes on to its end.
    let mut healthy_gate = InputGate::<u64>::new(vec![Box::new(healthy_channel)]).expect("gate");
    let records = drain(&mut healthy_gate).expect("the healthy channel is unaffected");
    assert_eq!(records.len(), 10_000);
    good.join().expect("join").expect("healthy producer ok");
    // The producer side of the dead transport sees its consumer gone.
    writer.emit(&43, 0).expect("buffered");
    assert!(matches!(
        writer.flush(),
        Err(ExchangeError::ConsumerGone { .. })
    ));
}

/// A fake producer process: accepts one connection and exchanges the handshake.
struct FakePeer {
    listener: TcpListener,
}

impl FakePeer {
    fn new() -> Self {
        FakePeer {
            listener: TcpListener::bind("127.0.0.1:0").expect("bind"),
        }
    }

    fn peer(&self) -> Peer {
        Peer {
            process: 9,
            addr: self.listener.local_addr().expect("addr"),
        }
    }

    fn accept(&self) -> TcpStream {
        let (mut stream, _) = self.listener.accept().expect("accept");
        stream.set_read_timeout(Some(GUARD)).expect("timeout");
        let process = handshake(&mut stream, 9, None, false);
        assert_eq!(process, 2);
        stream
    }
}

/// Speaks the handshake as process `me` of the default job with `secret`, as the side
/// that dialed (`dialer`) or accepted: exchanges handshakes, then the proofs (the
/// dialer's first; the acceptor's only after the dialer's), checking the peer's. Returns
/// the peer's process id.
fn handshake(stream: &mut TcpStream, me: u32, secret: Option<&Secret>, dialer: bool) -> u32 {
    let job = JobId::default();
    let ours = [me as u8; 16];
    send(
        stream,
        Frame::Handshake {
            process: me,
            nonce: ours,
            job: job.0,
        },
    );
    let Frame::Handshake { process, nonce, .. } = read_frame(stream) else {
        panic!("expected a handshake first");
    };
    let transcript = if dialer {
        Transcript {
            dialer: me,
            acceptor: process,
            dialer_nonce: ours,
            acceptor_nonce: nonce,
            job,
        }
    } else {
        Transcript {
            dialer: process,
            acceptor: me,
            dialer_nonce: nonce,
            acceptor_nonce: ours,
            job,
        }
    };
    let (my_role, peer_role) = if dialer {
        (Role::Dialer, Role::Acceptor)
    } else {
        (Role::Acceptor, Role::Dialer)
    };
    if dialer {
        send(
            stream,
            Frame::Auth {
                tag: auth::tag(secret, my_role, &transcript),
            },
        );
    }
    let Frame::Auth { tag } = read_frame(stream) else {
        panic!("expected the peer's authentication");
    };
    assert!(auth::verify(secret, peer_role, &transcript, &tag));
    if !dialer {
        send(
            stream,
            Frame::Auth {
                tag: auth::tag(secret, my_role, &transcript),
            },
        );
    }
    process
}

/// Reads one frame, owning its payload by leaking it (tests only).
fn read_frame(stream: &mut TcpStream) -> Frame<'static> {
    let mut header = [0u8; 20];
    stream.read_exact(&mut header).expect("a header");
    let decoded = Header::decode(&header, 1 << 20).expect("a valid header");
    let mut bytes = header.to_vec();
    bytes.resize(20 + decoded.len as usize, 0);
    stream.read_exact(&mut bytes[20..]).expect("a payload");
    let bytes: &'static [u8] = Vec::leak(bytes);
    Frame::decode(bytes, 1 << 20)
        .expect("valid")
        .expect("whole")
        .0
}

fn send(stream: &mut TcpStream, frame: Frame<'_>) {
    let mut bytes = Vec::new();
    frame.encode(&mut bytes);
    stream.write_all(&bytes).expect("write");
}

fn failure_of(channel: &RemoteInputChannel) -> Arc<TransportError> {
    let started = Instant::now();
    loop {
        if let Some(error) = channel.error() {
            assert!(channel.is_disconnected());
            return error;
        }
        assert!(started.elapsed() < GUARD, "no failure reported");
        thread::sleep(Duration::from_millis(1));
    }
}

/// The consumer asks with its exclusive credit, grants floating credit by the announced
/// backlog without anyone reading, and a buffer beyond the credit fails the connection.
#[test]
fn credits_follow_the_rules_and_a_buffer_without_credit_is_refused() {
    on_each_driver(credits_follow_the_rules_and_a_buffer_without_credit_is_refused_on);
}

fn credits_follow_the_rules_and_a_buffer_without_credit_is_refused_on() {
    let fake = FakePeer::new();
    let consumer = transport(2);
    let network = NetworkBufferPool::new(64, SEGMENT).expect("pool");
    let channel = consumer
        .consume(fake.peer(), &[3], &network, None)
        .expect("consume")
        .pop()
        .expect("one");
    let mut stream = fake.accept();
    let Frame::PartitionRequest { channel: 3, credit } = read_frame(&mut stream) else {
        panic!("expected the partition request");
    };
    assert_eq!(credit, 2, "the exclusive buffers");
    // Two buffers against the two credits, announcing 5 more behind them.
    let payload = 7u32.to_le_bytes();
    let mut record = 4u32.to_le_bytes().to_vec();
    record.extend_from_slice(&payload);
    for sequence in 0..2 {
        send(
            &mut stream,
            Frame::Buffer {
                channel: 3,
                sequence,
                backlog: 5,
                payload: &record,
            },
        );
    }
    // Floating credit for the backlog, with nothing read at the consumer.
    let mut granted = 0;
    while granted < 5 {
        match read_frame(&mut stream) {
            Frame::AddCredit { channel: 3, delta } => granted += delta,
            other => panic!("expected credit, got {other:?}"),
        }
    }
    assert_eq!(granted, 5, "backlog 5 within the 8 floating buffers");
    for sequence in 2..7 {
        send(
            &mut stream,
            Frame::Buffer {
                channel: 3,
                sequence,
                backlog: 0,
                payload: &record,
            },
        );
    }
    // One more, without credit.
    send(
        &mut stream,
        Frame::Buffer {
            channel: 3,
            sequence: 7,
            backlog: 0,
            payload: &record,
        },
    );
    let error = failure_of(&channel);
    let message = error.to_string();
    assert!(message.contains("without credit"), "{message}");
    assert!(message.contains("remote channel 3"), "{message}");
    // The seven credited buffers arrived before it.
    assert_eq!(channel.buffered(), 7);
    // The peer is told why before the connection closes.
    match read_frame(&mut stream) {
        Frame::Error { channel, message } => {
            assert_eq!(channel, u32::MAX);
            assert!(String::from_utf8_lossy(message).contains("without credit"));
        }
        other => panic!("expected an error frame, got {other:?}"),
    }
}

/// An unknown frame type and an oversized buffer each fail the connection with a typed
/// frame error, before anything is read into memory.
#[test]
fn malformed_and_oversized_frames_fail_the_connection() {
    on_each_driver(malformed_and_oversized_frames_fail_the_connection_on);
}

fn malformed_and_oversized_frames_fail_the_connection_on() {
    for (case, header) in [
        ("unknown type", {
            let mut bytes = [0u8; 20];
            bytes[4] = 200;
            bytes
        }),
        ("oversized", {
            let mut bytes = Frame::Buffer {
                channel: 3,
                sequence: 0,
                backlog: 0,
                payload: &[1],
            }
            .header()
            .encode();
            bytes[0..4].copy_from_slice(&(SEGMENT as u32 + 1).to_le_bytes());
            bytes
        }),
        ("huge", {
            let mut bytes = [0u8; 20];
            bytes[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
            bytes[4] = 7;
            bytes
        }),
    ] {
        let fake = FakePeer::new();
        let consumer = transport(2);
        let network = NetworkBufferPool::new(64, SEGMENT).expect("pool");
        let channel = consumer
            .consume(fake.peer(), &[3], &network, None)
            .expect("consume")
            .pop()
            .expect("one");
        let mut stream = fake.accept();
        let _request = read_frame(&mut stream);
        stream.write_all(&header).expect("write");
        let error = failure_of(&channel);
        let TransportError::ChannelFailed { cause, .. } = &*error else {
            panic!("{case}: {error}");
        };
        match (case, &**cause) {
            (
                "unknown type",
                TransportError::Frame {
                    source: FrameError::UnknownType(200),
                    ..
                },
            ) => {}
            (
                "oversized" | "huge",
                TransportError::Frame {
                    source: FrameError::Oversized { .. },
                    ..
                },
            ) => {}
            _ => panic!("{case}: unexpected {error}"),
        }
    }
}

/// A peer that accepts the connection but never speaks fails it after the configured
/// handshake timeout.
#[test]
fn a_silent_peer_times_out_in_the_handshake() {
    on_each_driver(a_silent_peer_times_out_in_the_handshake_on);
}

fn a_silent_peer_times_out_in_the_handshake_on() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let mut config = config(2);
    config.handshake_timeout = Duration::from_millis(200);
    let consumer = Transport::start(config).expect("transport");
    let network = NetworkBufferPool::new(16, SEGMENT).expect("pool");
    let peer = Peer {
        process: 9,
        addr: listener.local_addr().expect("addr"),
    };
    let channel = consumer
        .consume(peer, &[1], &network, None)
        .expect("consume")
        .pop()
        .expect("one");
    let error = failure_of(&channel);
    let TransportError::ChannelFailed { cause, .. } = &*error else {
        panic!("{error}");
    };
    assert!(
        matches!(&**cause, TransportError::HandshakeTimeout { timeout, .. } if *timeout == Duration::from_millis(200)),
        "{error}"
    );
    drop(listener);
}

/// Dropping a remote channel cancels it at the producer, whose writer then sees its
/// consumer gone.
#[test]
fn dropping_a_remote_channel_cancels_it() {
    on_each_driver(dropping_a_remote_channel_cancels_it_on);
}

fn dropping_a_remote_channel_cancels_it_on() {
    let producer = transport(1);
    let consumer = transport(2);
    let pool_network = NetworkBufferPool::new(16, SEGMENT).expect("pool");
    let mut writer = served_writer(&producer, 4, None, &pool_network);
    let network = NetworkBufferPool::new(16, SEGMENT).expect("pool");
    let channel = consumer
        .consume(producer.peer(), &[4], &network, None)
        .expect("consume")
        .pop()
        .expect("one");
    writer.emit(&1, 0).expect("emit");
    writer.flush().expect("flush");
    let started = Instant::now();
    while channel.buffered() == 0 {
        assert!(started.elapsed() < GUARD, "hung");
        thread::sleep(Duration::from_millis(1));
    }
    drop(channel);
    let started = Instant::now();
    loop {
        writer.emit(&2, 0).expect("emit");
        match writer.flush() {
            Ok(()) => {}
            Err(ExchangeError::ConsumerGone { .. }) => break,
            Err(other) => panic!("{other}"),
        }
        assert!(started.elapsed() < GUARD, "the cancel never arrived");
        thread::sleep(Duration::from_millis(1));
    }
}

/// A producer that dies in the middle of a buffer's payload fails the channel (the
/// part already read is dropped), naming the channel and the peer.
#[test]
fn a_peer_dying_mid_frame_fails_the_channel() {
    on_each_driver(a_peer_dying_mid_frame_fails_the_channel_on);
}

fn a_peer_dying_mid_frame_fails_the_channel_on() {
    let fake = FakePeer::new();
    let consumer = transport(2);
    let network = NetworkBufferPool::new(64, SEGMENT).expect("pool");
    let channel = consumer
        .consume(fake.peer(), &[3], &network, None)
        .expect("consume")
        .pop()
        .expect("one");
    let mut stream = fake.accept();
    let _request = read_frame(&mut stream);
    let header = Header {
        len: 100,
        ..Frame::Buffer {
            channel: 3,
            sequence: 0,
            backlog: 0,
            payload: &[0],
        }
        .header()
    };
    stream.write_all(&header.encode()).expect("write");
    stream.write_all(&[0; 10]).expect("write");
    drop(stream);
    let error = failure_of(&channel);
    let message = error.to_string();
    assert!(
        message.contains("remote channel 3 from process 9"),
        "{message}"
    );
    assert!(message.contains("lost"), "{message}");
    assert_eq!(channel.buffered(), 0, "a partial buffer is never delivered");
}

/// A peer whose handshake names another process than the one asked for fails the
/// connection, saying which.
#[test]
fn a_peer_of_another_process_id_is_refused() {
    on_each_driver(a_peer_of_another_process_id_is_refused_on);
}

fn a_peer_of_another_process_id_is_refused_on() {
    let producer = transport(1);
    let consumer = transport(2);
    let network = NetworkBufferPool::new(16, SEGMENT).expect("pool");
    let wrong = Peer {
        process: 5,
        addr: producer.local_addr(),
    };
    let channel = consumer
        .consume(wrong, &[1], &network, None)
        .expect("consume")
        .pop()
        .expect("one");
    let message = failure_of(&channel).to_string();
    assert!(
        message.contains("it is process 1, not process 5"),
        "{message}"
    );
}

/// A request for a channel its producer never serves fails after the request timeout,
/// at the consumer, naming the channel (instead of waiting forever).
#[test]
fn a_channel_never_served_fails_after_the_request_timeout() {
    on_each_driver(a_channel_never_served_fails_after_the_request_timeout_on);
}

fn a_channel_never_served_fails_after_the_request_timeout_on() {
    let mut producer_config = config(1);
    producer_config.request_timeout = Duration::from_millis(200);
    let producer = Transport::start(producer_config).expect("transport");
    let consumer = transport(2);
    let network = NetworkBufferPool::new(16, SEGMENT).expect("pool");
    let channel = consumer
        .consume(producer.peer(), &[42], &network, None)
        .expect("consume")
        .pop()
        .expect("one");
    let error = failure_of(&channel);
    let text = error.to_string();
    assert!(text.contains("channel 42"), "{text}");
    assert!(text.contains("not served"), "{text}");
}

/// A buffer size the consuming gate announces (debloating) reaches the producer's
/// subpartition in a buffer-size frame, raised to a floor when it is tiny.
#[test]
fn an_announced_buffer_size_reaches_the_producer() {
    on_each_driver(an_announced_buffer_size_reaches_the_producer_on);
}

fn an_announced_buffer_size_reaches_the_producer_on() {
    let producer = transport(1);
    let consumer = transport(2);
    let network = NetworkBufferPool::new(64, SEGMENT).expect("pool");
    let pool = LocalBufferPool::new(&network, LocalPoolConfig::new(16, 1)).expect("local pool");
    let (sender, input) = local_channel(16 + pool.overdraft_max(), Some(producer.notify()));
    producer.serve(5, input);
    let partition = ResultPartition::new(pool, vec![sender]).expect("partition");
    let receive = NetworkBufferPool::new(16, SEGMENT).expect("pool");
    let mut channel = consumer
        .consume(producer.peer(), &[5], &receive, None)
        .expect("consume")
        .pop()
        .expect("one");
    for size in [1024, 2048] {
        channel.announce_buffer_size(size);
        let started = Instant::now();
        while partition.announced_buffer_size(0) != size {
            assert!(started.elapsed() < GUARD, "the size never arrived");
            thread::sleep(Duration::from_millis(1));
        }
    }
    // A peer cannot ask for buffers of a few bytes (one send per record): its
    // announcement is raised to the floor.
    channel.announce_buffer_size(1);
    let started = Instant::now();
    while partition.announced_buffer_size(0) == 2048 {
        assert!(started.elapsed() < GUARD, "the size never arrived");
        thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(partition.announced_buffer_size(0), 256);
}

/// Channel ids outlive neither their job nor their gate: after a gate of three
/// channels ends, a later consume takes its slot with one channel. A stale buffer for
/// the old gate's third channel is dropped (it once indexed the new gate's channels and
/// took the network thread down), the new channel's own buffer arrives, and the old
/// ids can be consumed again by a later job over the same transport.
#[test]
fn stale_frames_of_a_finished_gate_reach_no_other_gate_and_its_ids_are_reusable() {
    on_each_driver(stale_frames_of_a_finished_gate_reach_no_other_gate_and_its_ids_are_reusable_on);
}

fn stale_frames_of_a_finished_gate_reach_no_other_gate_and_its_ids_are_reusable_on() {
    let fake = FakePeer::new();
    let consumer = transport(2);
    let network = NetworkBufferPool::new(64, SEGMENT).expect("pool");
    let first = consumer
        .consume(fake.peer(), &[0, 1, 2], &network, None)
        .expect("consume");
    let mut stream = fake.accept();
    for expected in 0..3 {
        let Frame::PartitionRequest { channel, .. } = read_frame(&mut stream) else {
            panic!("expected a partition request");
        };
        assert_eq!(channel, expected);
    }
    for channel in 0..3 {
        send(&mut stream, Frame::EndOfPartition { channel });
    }
    let started = Instant::now();
    while !first.iter().all(|c| c.is_disconnected()) {
        assert!(started.elapsed() < GUARD, "the ends never arrived");
        thread::sleep(Duration::from_millis(1));
    }
    assert!(first.iter().all(|c| c.error().is_none()), "a clean end");
    drop(first);
    // Give the network thread turns to free the ended gate, so the next takes its slot.
    thread::sleep(Duration::from_millis(200));
    let second = consumer
        .consume(fake.peer(), &[7], &network, None)
        .expect("consume")
        .pop()
        .expect("one");
    let Frame::PartitionRequest { channel: 7, .. } = read_frame(&mut stream) else {
        panic!("expected the request for channel 7");
    };
    let mut record = 4u32.to_le_bytes().to_vec();
    record.extend_from_slice(&7u32.to_le_bytes());
    // A stale buffer of the first gate's channel 2, then channel 7's own.
    send(
        &mut stream,
        Frame::Buffer {
            channel: 2,
            sequence: 0,
            backlog: 0,
            payload: &record,
        },
    );
    send(
        &mut stream,
        Frame::Buffer {
            channel: 7,
            sequence: 0,
            backlog: 0,
            payload: &record,
        },
    );
    let started = Instant::now();
    while second.buffered() == 0 {
        assert!(second.error().is_none(), "{:?}", second.error());
        assert!(
            started.elapsed() < GUARD,
            "channel 7's buffer never arrived"
        );
        thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(second.buffered(), 1, "only its own buffer");
    // A later job consumes channel 0 again over the same transport.
    let again = consumer
        .consume(fake.peer(), &[0], &network, None)
        .expect("consume")
        .pop()
        .expect("one");
    let Frame::PartitionRequest { channel: 0, .. } = read_frame(&mut stream) else {
        panic!("expected channel 0 to be requested again");
    };
    assert!(again.error().is_none(), "{:?}", again.error());
    assert!(second.error().is_none(), "{:?}", second.error());
}

/// Connects to `transport` as process `process` would, handshake exchanged.
fn dial(transport: &Transport, process: u32) -> TcpStream {
    let mut stream = TcpStream::connect(transport.local_addr()).expect("connect");
    stream.set_read_timeout(Some(GUARD)).expect("timeout");
    handshake(&mut stream, process, None, true);
    stream
}

/// Reads frames until an error frame for the whole connection (its message), or until
/// the connection ends (how it ended).
fn connection_error(stream: &mut TcpStream) -> Result<String, std::io::ErrorKind> {
    let mut header = [0u8; 20];
    loop {
        stream.read_exact(&mut header).map_err(|e| e.kind())?;
        let decoded = Header::decode(&header, 1 << 20).expect("a valid header");
        let mut payload = vec![0u8; decoded.len as usize];
        stream.read_exact(&mut payload).map_err(|e| e.kind())?;
        if decoded.kind == weir_net::transport::FrameKind::Error && decoded.channel == u32::MAX {
            return Ok(String::from_utf8_lossy(&payload).into_owned());
        }
    }
}

/// A peer that floods requests for channels nobody serves cannot grow the waiting list
/// without bound: past the per-connection bound the connection is refused with a
/// message that says so (before, every request was kept for the request timeout and
/// every turn scanned them all). A second request for a waiting channel is refused
/// on its own, and a peer that keeps making refused requests is refused.
#[test]
fn a_flood_of_partition_requests_is_bounded() {
    on_each_driver(a_flood_of_partition_requests_is_bounded_on);
}

fn a_flood_of_partition_requests_is_bounded_on() {
    let producer = transport(1);
    let mut first = dial(&producer, 7);
    let mut second = dial(&producer, 8);
    send(
        &mut second,
        Frame::PartitionRequest {
            channel: 5,
            credit: 2,
        },
    );
    // Let the second connection's request be first.
    thread::sleep(Duration::from_millis(100));
    let mut bytes = Vec::new();
    for channel in 0..70_000u32 {
        Frame::PartitionRequest { channel, credit: 2 }.encode(&mut bytes);
    }
    first.write_all(&bytes).expect("write");
    let message = connection_error(&mut first).expect("the connection is refused with why");
    assert!(message.contains("partition requests waiting"), "{message}");
    // Channel 5 was the second connection's: the flood's request for it was refused
    // alone, and the second connection lives on.
    send(
        &mut second,
        Frame::PartitionRequest {
            channel: 5,
            credit: 2,
        },
    );
    match read_frame(&mut second) {
        Frame::Error {
            channel: 5,
            message,
        } => {
            let message = String::from_utf8_lossy(message);
            assert!(message.contains("already requested"), "{message}");
        }
        other => panic!("expected an error for channel 5, got {other:?}"),
    }
    // A peer that keeps asking (and need not read the refusals) is refused as a whole
    // once its refusals pass the bound, instead of growing the send queue.
    let mut bytes = Vec::new();
    for _ in 0..2_000 {
        Frame::PartitionRequest {
            channel: 5,
            credit: 2,
        }
        .encode(&mut bytes);
    }
    second.write_all(&bytes).expect("write");
    // The refusal's error frame is written best effort: a peer that did not read the
    // refusals before it may find the connection reset instead (requests it sent were
    // left unread). Either way it ends, where it used to stay open (read timeout).
    match connection_error(&mut second) {
        Ok(message) => assert!(message.contains("refused requests"), "{message}"),
        Err(kind) => assert!(
            matches!(
                kind,
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::UnexpectedEof
            ),
            "the connection did not end: {kind:?}"
        ),
    }
}

fn transport_with(process: u32, change: impl FnOnce(&mut TransportConfig)) -> Transport {
    let mut config = config(process);
    change(&mut config);
    Transport::start(config).expect("transport starts")
}

/// Processes of one job that share its cluster secret exchange records; a process with
/// another secret, or of another job, is refused in the handshake, and the refusal
/// fails the consumer's channel saying why (no record crosses).
#[test]
fn only_members_of_the_job_with_its_secret_are_served() {
    on_each_driver(only_members_of_the_job_with_its_secret_are_served_on);
}

fn only_members_of_the_job_with_its_secret_are_served_on() {
    let secret = Secret::generate().expect("secret");
    let job = JobId::of(b"a job");
    let member = |process| {
        let secret = secret.clone();
        transport_with(process, move |c| {
            c.secret = Some(secret);
            c.job = job;
            c.processes = Some(4);
        })
    };
    let producer = member(1);
    let producing = produce(&producer, 3, 0, 1_000, None);
    // A member reads everything.
    let consumer = member(2);
    let network = NetworkBufferPool::new(64, SEGMENT).expect("pool");
    let mut gate = InputGate::<u64>::new(boxed(
        consumer
            .consume(producer.peer(), &[3], &network, None)
            .expect("consume"),
    ))
    .expect("gate");
    assert_eq!(drain(&mut gate).expect("a member is served").len(), 1_000);
    producing.join().expect("join").expect("producer ok");
    // Another secret, another job, an id outside the job: refused, each saying why.
    let wrong_secret = transport_with(3, |c| {
        c.secret = Some(Secret::generate().expect("secret"));
        c.job = job;
    });
    let wrong_job = transport_with(3, |c| {
        c.secret = Some(secret.clone());
        c.job = JobId::of(b"another job");
    });
    let outsider = transport_with(7, |c| {
        c.secret = Some(secret.clone());
        c.job = job;
    });
    for (stranger, why) in [
        (&wrong_secret, "cluster secret"),
        (&wrong_job, "another job"),
        (&outsider, "not one of this job's 4 processes"),
    ] {
        let channel = stranger
            .consume(producer.peer(), &[3], &network, None)
            .expect("consume")
            .pop()
            .expect("one");
        let message = failure_of(&channel).to_string();
        assert!(message.contains(why), "{message}");
        assert!(message.contains("refused"), "{message}");
        assert_eq!(channel.buffered(), 0);
    }
}

/// A peer that answers the handshake and then says nothing at all (no frame, no
/// heartbeat) fails the connection's channels within the idle timeout, naming the peer
/// and the channel. A healthy connection with nothing to send stays up past the idle
/// timeout: heartbeats keep it alive. (The waits are watchdogs, not performance bounds.)
#[test]
fn a_silent_peer_is_detected_and_a_quiet_one_is_not() {
    on_each_driver(a_silent_peer_is_detected_and_a_quiet_one_is_not_on);
}

fn a_silent_peer_is_detected_and_a_quiet_one_is_not_on() {
    let liveness = |c: &mut TransportConfig| {
        c.heartbeat_interval = Duration::from_millis(50);
        c.idle_timeout = Duration::from_millis(300);
    };
    let fake = FakePeer::new();
    let consumer = transport_with(2, liveness);
    let network = NetworkBufferPool::new(64, SEGMENT).expect("pool");
    let channel = consumer
        .consume(fake.peer(), &[4], &network, None)
        .expect("consume")
        .pop()
        .expect("one");
    let mut stream = fake.accept();
    let Frame::PartitionRequest { channel: 4, .. } = read_frame(&mut stream) else {
        panic!("expected the partition request");
    };
    let started = Instant::now();
    let error = failure_of(&channel);
    let message = error.to_string();
    assert!(message.contains("remote channel 4"), "{message}");
    assert!(message.contains("not even a heartbeat"), "{message}");
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "failed before the idle timeout: {:?}",
        started.elapsed()
    );
    // The consumer sent heartbeats meanwhile.
    let mut heartbeats = 0;
    while heartbeats < 2 {
        match read_frame(&mut stream) {
            Frame::Heartbeat => heartbeats += 1,
            Frame::Error { .. } | Frame::AddCredit { .. } => {}
            other => panic!("expected heartbeats, got {other:?}"),
        }
    }
    // Two live transports, a channel with nothing to carry for several idle timeouts.
    let producer = transport_with(1, liveness);
    let consumer = transport_with(2, liveness);
    let mut writer = served_writer(&producer, 5, None, &network);
    let receive = NetworkBufferPool::new(16, SEGMENT).expect("pool");
    let quiet = consumer
        .consume(producer.peer(), &[5], &receive, None)
        .expect("consume")
        .pop()
        .expect("one");
    thread::sleep(Duration::from_millis(1_200));
    assert!(quiet.error().is_none(), "{:?}", quiet.error());
    writer.emit(&9, 0).expect("emit");
    writer.flush().expect("flush");
    let started = Instant::now();
    while quiet.buffered() == 0 {
        assert!(quiet.error().is_none(), "{:?}", quiet.error());
        assert!(started.elapsed() < GUARD, "the record never arrived");
        thread::sleep(Duration::from_millis(1));
    }
}

/// Bad liveness settings are refused when the transport starts.
#[test]
fn heartbeats_must_come_more_often_than_the_idle_timeout() {
    let mut config = TransportConfig::new(1);
    config.heartbeat_interval = Duration::from_secs(10);
    config.idle_timeout = Duration::from_secs(5);
    let Err(error) = Transport::start(config) else {
        panic!("a heartbeat slower than the idle timeout was accepted");
    };
    assert!(error.to_string().contains("heartbeat_interval"), "{error}");
}

/// A transport that stops says goodbye: it half-closes its connections and reads what
/// its peers still send until they close, instead of closing with bytes unread, which
/// makes the kernel reset the connection (and a reset may discard, at the peer, the
/// tail of what was sent: the last buffers and end-of-partition frames).
#[test]
fn a_stopping_transport_closes_its_connections_without_a_reset() {
    on_each_driver(a_stopping_transport_closes_its_connections_without_a_reset_on);
}

fn a_stopping_transport_closes_its_connections_without_a_reset_on() {
    let producer = transport(1);
    let producing = produce(&producer, 6, 0, 100, None);
    let mut stream = dial(&producer, 2);
    send(
        &mut stream,
        Frame::PartitionRequest {
            channel: 6,
            credit: 64,
        },
    );
    loop {
        match read_frame(&mut stream) {
            Frame::EndOfPartition { channel: 6 } => break,
            Frame::Buffer { .. } | Frame::Heartbeat => {}
            other => panic!("expected buffers, got {other:?}"),
        }
    }
    producing.join().expect("join").expect("producer ok");
    producer.drain(GUARD).expect("drained");
    // The consumer keeps sending (credit and heartbeats, as in a real run) while the
    // producer stops, until it sees the producer's end; then it closes too, as a
    // transport does on end of stream.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writer = stream.try_clone().expect("clone");
    let writing = {
        let done = Arc::clone(&done);
        thread::spawn(move || {
            let mut bytes = Vec::new();
            for _ in 0..16 {
                Frame::Heartbeat.encode(&mut bytes);
            }
            let started = Instant::now();
            while !done.load(std::sync::atomic::Ordering::Acquire) && started.elapsed() < GUARD {
                if writer.write_all(&bytes).is_err() {
                    return;
                }
                thread::sleep(Duration::from_micros(200));
            }
        })
    };
    thread::sleep(Duration::from_millis(20));
    let stopping = thread::spawn(move || drop(producer));
    // Read only after the producer has stopped (its end waits in this socket's receive
    // buffer, where a reset would discard it), then expect a clean end of stream (after
    // any heartbeat it sent), not a reset.
    thread::sleep(Duration::from_millis(250));
    let mut header = [0u8; 20];
    let ended = loop {
        match stream.read_exact(&mut header) {
            Ok(()) => {
                let decoded = Header::decode(&header, 1 << 20).expect("a valid header");
                assert_eq!(decoded.kind, weir_net::transport::FrameKind::Heartbeat);
            }
            Err(error) => break error.kind(),
        }
    };
    done.store(true, std::sync::atomic::Ordering::Release);
    writing.join().expect("writer");
    drop(stream);
    stopping.join().expect("the transport stops");
    assert_eq!(
        ended,
        std::io::ErrorKind::UnexpectedEof,
        "the connection was reset"
    );
}

/// A channel served for one consumer goes to that process alone: a request from any
/// other process, even an authenticated member of the job, gets an error frame naming
/// the consumer, and the channel still goes to its consumer when it asks.
#[test]
fn a_channel_goes_only_to_the_process_that_consumes_it() {
    on_each_driver(a_channel_goes_only_to_the_process_that_consumes_it_on);
}

fn a_channel_goes_only_to_the_process_that_consumes_it_on() {
    let producer = transport(1);
    let network = NetworkBufferPool::new(16, SEGMENT).expect("pool");
    let mut writer = served_writer(&producer, 8, Some(2), &network);
    writer.emit(&77, 0).expect("emit");
    writer.flush().expect("flush");
    // Process 3 asks first: refused, nothing sent.
    let mut intruder = dial(&producer, 3);
    send(
        &mut intruder,
        Frame::PartitionRequest {
            channel: 8,
            credit: 4,
        },
    );
    loop {
        match read_frame(&mut intruder) {
            Frame::Error {
                channel: 8,
                message,
            } => {
                let message = String::from_utf8_lossy(message);
                assert!(message.contains("consumed by process 2"), "{message}");
                break;
            }
            Frame::Heartbeat => {}
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    // Process 2, its consumer, gets the record.
    let mut consumer = dial(&producer, 2);
    send(
        &mut consumer,
        Frame::PartitionRequest {
            channel: 8,
            credit: 4,
        },
    );
    loop {
        match read_frame(&mut consumer) {
            Frame::Buffer {
                channel: 8,
                payload,
                ..
            } => {
                assert!(payload.len() >= 12, "a length prefix and the record");
                break;
            }
            Frame::Heartbeat => {}
            other => panic!("expected the channel's buffer, got {other:?}"),
        }
    }
}

/// A relay of the handshake does not let an outsider in: it dials member A claiming to
/// be member B and gets A's nonce, then dials B claiming to be A with that nonce, to
/// have B prove "B" for A's nonce. B, the accepting side, proves nothing to a dialer
/// that has not proved itself, so there is nothing to relay, and A never takes the
/// outsider for B. (The wait for B's silence is a bound on a negative, not a timing
/// claim: B would answer at once if it answered at all.)
#[test]
fn a_relayed_handshake_proves_nothing() {
    on_each_driver(a_relayed_handshake_proves_nothing_on);
}

fn a_relayed_handshake_proves_nothing_on() {
    let secret = Secret::generate().expect("secret");
    let member = |process| {
        let secret = secret.clone();
        transport_with(process, move |c| {
            c.secret = Some(secret);
            c.processes = Some(3);
        })
    };
    let (a, b) = (member(1), member(2));
    let mut to_a = TcpStream::connect(a.local_addr()).expect("connect");
    to_a.set_read_timeout(Some(GUARD)).expect("timeout");
    send(
        &mut to_a,
        Frame::Handshake {
            process: 2,
            nonce: [7; 16],
            job: JobId::default().0,
        },
    );
    let Frame::Handshake { nonce: nonce_a, .. } = read_frame(&mut to_a) else {
        panic!("expected A's handshake");
    };
    let mut to_b = TcpStream::connect(b.local_addr()).expect("connect");
    to_b.set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    send(
        &mut to_b,
        Frame::Handshake {
            process: 1,
            nonce: nonce_a,
            job: JobId::default().0,
        },
    );
    let Frame::Handshake { .. } = read_frame(&mut to_b) else {
        panic!("expected B's handshake");
    };
    let mut header = [0u8; 20];
    let error = to_b
        .read_exact(&mut header)
        .expect_err("B sent something to a dialer that proved nothing");
    assert!(
        matches!(
            error.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
        "{error}"
    );
    // Whatever the outsider sends A as B's proof fails.
    send(&mut to_a, Frame::Auth { tag: [0; 32] });
    let mut refused = false;
    loop {
        let mut header = [0u8; 20];
        if to_a.read_exact(&mut header).is_err() {
            break;
        }
        let decoded = Header::decode(&header, 1 << 20).expect("a valid header");
        let mut payload = vec![0u8; decoded.len as usize];
        if to_a.read_exact(&mut payload).is_err() {
            break;
        }
        if decoded.kind == weir_net::transport::FrameKind::Error {
            assert!(String::from_utf8_lossy(&payload).contains("does not verify"));
            refused = true;
        }
    }
    assert!(refused, "A said why it refused");
    assert!(!a.is_connected(2));
}

/// An unaligned barrier overtakes a remote channel's queued buffers (a priority barrier
/// frame): announced while the producer's pool is full of buffers the consumer has no
/// credit for, it reaches the consumer before any of them, and before the barrier in
/// band could be written. The consumer's gate then takes the checkpoint first, stores
/// what was queued in front of the barrier as channel state, and still yields every
/// record once, in order.
#[test]
fn an_unaligned_barrier_overtakes_the_buffers_queued_without_credit() {
    on_each_driver(an_unaligned_barrier_overtakes_the_buffers_queued_without_credit_on);
}

fn an_unaligned_barrier_overtakes_the_buffers_queued_without_credit_on() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const AFTER: u64 = 100;
    let producer = transport(1);
    let consumer = transport(2);
    let network = NetworkBufferPool::new(64, SEGMENT).expect("pool");
    let mut writer = served_writer(&producer, 5, None, &network);
    let receive = NetworkBufferPool::new(64, SEGMENT).expect("pool");
    let channel = consumer
        .consume(producer.peer(), &[5], &receive, None)
        .expect("consume")
        .pop()
        .expect("one");
    let written = Arc::new(AtomicU64::new(0));
    let in_band = Arc::new(AtomicBool::new(false));
    let (announced_tx, announced_rx) = std::sync::mpsc::channel();
    let thread = {
        let (written, in_band) = (Arc::clone(&written), Arc::clone(&in_band));
        thread::spawn(move || -> Result<(), ExchangeError> {
            let started = Instant::now();
            // Until the pool is full: the consumer holds what its credit allowed, the
            // rest waits at the producer.
            let mut value = 0u64;
            let mut blocked_since = None;
            loop {
                if writer.poll_ready(0)? {
                    blocked_since = None;
                    writer.emit(&value, 0)?;
                    writer.flush()?;
                    value += 1;
                } else {
                    let since = *blocked_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > Duration::from_millis(100) {
                        break;
                    }
                    thread::sleep(Duration::from_micros(100));
                }
                assert!(started.elapsed() < GUARD, "producer hung");
            }
            written.store(value, Ordering::SeqCst);
            writer.announce_barrier(3);
            announced_tx.send(()).unwrap();
            while !writer.poll_ready(0)? {
                assert!(started.elapsed() < GUARD, "producer hung");
                thread::sleep(Duration::from_micros(50));
            }
            writer.emit_barrier(3, 0)?;
            in_band.store(true, Ordering::SeqCst);
            for v in value..value + AFTER {
                while !writer.poll_ready(0)? {
                    assert!(started.elapsed() < GUARD, "producer hung");
                    thread::sleep(Duration::from_micros(50));
                }
                writer.emit(&v, 0)?;
            }
            writer.finish(0)?;
            while !writer.resume(0)? {
                assert!(started.elapsed() < GUARD, "producer hung");
                thread::sleep(Duration::from_micros(50));
            }
            writer.flush()?;
            Ok(())
        })
    };
    announced_rx
        .recv_timeout(GUARD)
        .expect("the producer filled its pool");
    let started = Instant::now();
    while channel.announced_barrier() != 3 {
        assert!(
            started.elapsed() < GUARD,
            "the priority barrier never arrived"
        );
        thread::sleep(Duration::from_millis(1));
    }
    // Nothing was read yet: no buffer was recycled, no credit granted, so the barrier in
    // band is still waiting for room at the producer.
    assert!(
        !in_band.load(Ordering::SeqCst),
        "the barrier in band went out before the consumer read anything"
    );
    let before = written.load(Ordering::SeqCst);
    assert!(before > 0);
    let mut gate: InputGate<u64> = InputGate::new(boxed(vec![channel])).expect("gate");
    gate.set_alignment(weir_engine::checkpoint::AlignmentMode::Unaligned);
    let mut events = Vec::new();
    let mut state = None;
    loop {
        let now_ns = started.elapsed().as_nanos() as u64;
        match gate.poll_next_at(now_ns).expect("gate") {
            Some(GateEvent::End) => break,
            Some(event) => events.push(event),
            None => {
                assert!(started.elapsed() < GUARD, "consumer hung");
                thread::sleep(Duration::from_micros(50));
            }
        }
        if state.is_none() {
            state = gate.take_channel_state();
        }
    }
    thread.join().expect("producer").expect("produced");
    // The checkpoint first, ahead of every record queued in front of its barrier.
    assert!(
        matches!(
            events.first(),
            Some(GateEvent::Barrier {
                id: 3,
                unaligned: true,
                ..
            })
        ),
        "{:?}",
        events.first()
    );
    let (id, bytes) = state.expect("the channel state came whole");
    assert_eq!(id, 3);
    assert!(
        bytes.len() as u64 >= before * 8,
        "{} bytes of channel state for {before} records queued",
        bytes.len()
    );
    let records: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            GateEvent::Record { value, .. } => Some(*value),
            _ => None,
        })
        .collect();
    assert_eq!(records, (0..before + AFTER).collect::<Vec<_>>());
}
