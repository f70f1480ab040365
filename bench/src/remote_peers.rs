//! Remote exchange workloads: Weir's record writer → result partition → transport
//! (loopback TCP, credit-based) → input gate, against raw TCP ceilings. The rows:
//!
//! - Weir's remote exchange in one process ([`weir_remote`], network threads on
//!   io_uring or epoll): the producing and the consuming side each have their own
//!   [`Transport`] (so their own network thread, listener and connection end) and their
//!   own network buffer pool, as two processes would; nothing but the TCP connection
//!   joins them.
//! - Weir's remote exchange across two processes ([`weir_remote_processes`]): the
//!   producing side in a second process (this binary re-executed), as a job across
//!   processes would run.
//! - The local exchange, a reference ([`crate::exchange_peers::weir_exchange`]): the
//!   same records between the same threads with no TCP.
//! - The raw TCP ceiling of throughput ([`tcp_ceiling`]): the same bytes moved as a
//!   competent user would by hand. The writer fills a 32 KiB buffer with the same
//!   length-prefixed records (the records' codec) and writes it with its length in front
//!   in one blocking write on a `TcpStream` (`TCP_NODELAY`); the reader reads as much as
//!   has arrived into one large buffer of its own, spinning on a non-blocking socket 1→1
//!   and blocked in `read` 2→2 (whichever is faster on two cores, see [`tcp_ceiling`]),
//!   and decodes every whole frame in place, checking the records' order. No credits, no
//!   pools, no multiplexing: one connection per producer–consumer pair.
//! - Latency at an open-loop rate, 1→1, buffer timeout 0 ([`weir_remote_open_loop`]),
//!   with the network threads parking when idle or spinning 200 µs first; against the
//!   raw TCP ceiling of latency ([`tcp_open_loop_ceiling`]): one write per record on a
//!   `TCP_NODELAY` stream, read by a thread spinning on the non-blocking socket.
//!
//! The consumers of Weir's exchange spin briefly and then park when they have nothing to
//! read, woken by their channels, and the producers park while their pool is exhausted,
//! woken when the network thread has sent a buffer, as workers do: on two cores, threads
//! that spin or yield take the time the network threads need (2→2 at 100 bytes on epoll
//! took 70.9 ns per record with spinning consumers and producers,
//! `results/2026-12-01-remote-9a14b2d-quiet.md`, and 44.6–45.2 with parking ones,
//! `results/2026-12-01-remote-f34aedd.md`; 1→1 at 1000 bytes 595 and 360–365).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_engine::exchange::codec::FixedBytes;
use weir_engine::exchange::{
    local_channel, GateEvent, InputChannel, InputGate, LocalBufferPool, LocalPoolConfig,
    NetworkBufferPool, RecordWriter, ResultPartition, RoundRobin, WriterConfig,
};
use weir_engine::limits::SEGMENT_SIZE_DEFAULT;
use weir_engine::park::{CondvarPark, Notify, UnboundParker};
use weir_net::transport::{Transport, TransportConfig};
use weir_net::DriverKind;

use crate::affinity::{bench_cores, pin, StartLine};
use crate::async_peers::{histogram, Measurement};
use crate::exchange_peers::{
    created_of, decode_segment, fill_segment, finish, record_template, seq_of, stamp,
    wait_available, TurnClock, CLOCK_EVERY, POOL_SEGMENTS,
};

/// Segments of the consuming side's network pool per consumer: the receive pool
/// (exclusive buffers per channel and the floating ones) fits with room to spare.
const RECEIVE_SEGMENTS: usize = 64;

/// Transports of a producing and a consuming "process" on loopback.
fn transports(spin: Duration, driver: DriverKind) -> (Transport, Transport) {
    let mut config = TransportConfig::new(1);
    config.spin = spin;
    config.driver = driver;
    let producer = Transport::start(config.clone()).expect("producer transport");
    config.process = 2;
    let consumer = Transport::start(config).expect("consumer transport");
    (producer, consumer)
}

/// `n` records of `N` bytes from `producers` to `consumers` threads over the transport,
/// round robin, every producer's records reaching every consumer; the network threads
/// on `driver`.
pub fn weir_remote<const N: usize>(
    producers: usize,
    consumers: usize,
    timeout: Option<Duration>,
    driver: DriverKind,
    n: u64,
) -> Measurement {
    let (sending, receiving) = transports(Duration::ZERO, driver);
    let network = NetworkBufferPool::new(producers * (POOL_SEGMENTS + 8), SEGMENT_SIZE_DEFAULT)
        .expect("pool");
    let receive_network =
        NetworkBufferPool::new(consumers * RECEIVE_SEGMENTS, SEGMENT_SIZE_DEFAULT).expect("pool");
    let mut partitions = Vec::new();
    for producer in 0..producers {
        let config =
            LocalPoolConfig::new(POOL_SEGMENTS, consumers).with_max_per_subpartition(POOL_SEGMENTS);
        let parker = UnboundParker::new(CondvarPark::default());
        let pool =
            LocalBufferPool::with_notify(&network, config, parker.unparker()).expect("pool size");
        let mut senders = Vec::new();
        for consumer in 0..consumers {
            let (sender, input) = local_channel(POOL_SEGMENTS + 8, Some(sending.notify()));
            sending.serve((producer * consumers + consumer) as u32, input);
            senders.push(sender);
        }
        partitions.push((pool, senders, parker));
    }
    let epoch = Instant::now();
    let per_producer = n / producers as u64;
    let total = per_producer * producers as u64;
    let (core_a, core_b) = bench_cores();
    let start_gate = StartLine::new(producers + consumers);
    let mut consumer_threads = Vec::new();
    for consumer in 0..consumers {
        let ids: Vec<u32> = (0..producers)
            .map(|p| (p * consumers + consumer) as u32)
            .collect();
        // The consumer parks when it has nothing, as a worker does, woken by its
        // channels: spinning would take the cores the network threads need.
        let parker = UnboundParker::new(CondvarPark::default());
        let notify: Arc<dyn Notify> = Arc::new(parker.unparker());
        let channels: Vec<Box<dyn InputChannel>> = receiving
            .consume(sending.peer(), &ids, &receive_network, Some(notify))
            .expect("consume")
            .into_iter()
            .map(|c| Box::new(c) as Box<dyn InputChannel>)
            .collect();
        let start_gate = Arc::clone(&start_gate);
        consumer_threads.push(std::thread::spawn(move || {
            pin(if consumer % 2 == 0 { core_b } else { core_a });
            let mut gate: InputGate<FixedBytes<N>> = InputGate::new(channels).expect("channels");
            let mut latency = histogram();
            let mut last_seq = vec![None::<u64>; gate.channels()];
            let mut count = 0u64;
            let parker = parker.into_parker();
            let mut spins = 0u32;
            start_gate.wait();
            loop {
                match gate.poll_next().expect("exchange error") {
                    Some(GateEvent::Record { value, channel }) => {
                        let seq = seq_of(&value);
                        assert!(last_seq[channel].is_none_or(|l| l < seq), "out of order");
                        last_seq[channel] = Some(seq);
                        if let Some(created) = created_of(&value) {
                            let now = epoch.elapsed().as_nanos() as u64;
                            latency.saturating_record(now.saturating_sub(created).max(1));
                        }
                        count += 1;
                        spins = 0;
                    }
                    Some(GateEvent::End) => return (count, latency, Instant::now()),
                    Some(
                        GateEvent::Watermark(_)
                        | GateEvent::Barrier { .. }
                        | GateEvent::CheckpointAborted { .. },
                    ) => {}
                    None => idle(&mut spins, &parker),
                }
            }
        }));
    }
    let mut producer_threads = Vec::new();
    for (index, (pool, senders, parker)) in partitions.into_iter().enumerate() {
        let start_gate = Arc::clone(&start_gate);
        producer_threads.push(std::thread::spawn(move || {
            pin(if index % 2 == 0 { core_a } else { core_b });
            let parker = parker.into_parker();
            let partition = ResultPartition::new(pool, senders).expect("partition");
            let config = WriterConfig {
                buffer_timeout: timeout,
                ..WriterConfig::default()
            };
            let mut writer =
                RecordWriter::new(partition, RoundRobin::default(), config).expect("writer");
            let mut value = record_template::<N>();
            start_gate.wait();
            let mut clock = TurnClock::new(epoch);
            for seq in 0..per_producer {
                if seq % CLOCK_EVERY == 0 {
                    clock.read();
                    writer.on_timer(clock.now_ns).expect("timer flush");
                }
                stamp(&mut value, seq, epoch);
                wait_parking(&mut writer, &mut clock, &parker);
                writer.emit(&value, clock.now_ns).expect("emit");
            }
            finish_parking(&mut writer, &mut clock, &parker);
        }));
    }
    for producer in producer_threads {
        producer.join().expect("producer");
    }
    let mut latency = histogram();
    let mut received = 0;
    let mut end: Option<Instant> = None;
    for consumer in consumer_threads {
        let (count, histogram, finished) = consumer.join().expect("consumer");
        received += count;
        latency.add(&histogram).expect("same bounds");
        end = Some(end.map_or(finished, |e| e.max(finished)));
    }
    assert_eq!(received, total, "records lost or duplicated");
    let start = start_gate.start();
    drop((sending, receiving));
    Measurement {
        elapsed: end.map_or(Duration::ZERO, |e| e.saturating_duration_since(start)),
        latency_ns: Some(latency),
        cpu: None,
    }
}

/// The name of the hidden `weir` subcommand that runs the producing side of
/// [`weir_remote_processes`] in a process of its own.
pub const PRODUCER_COMMAND: &str = "remote-producer";

/// What the producing process is asked to do (its command line, after the subcommand).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerArgs {
    /// Record size in bytes (8, 100 or 1000).
    pub size: usize,
    /// Producer threads (each a partition with one subpartition per consumer).
    pub producers: usize,
    /// Consumers, in the other process.
    pub consumers: usize,
    /// Records in all.
    pub records: u64,
    /// Buffer timeout in milliseconds (none: only full buffers).
    pub timeout_ms: Option<u64>,
    /// The network thread's driver.
    pub driver: DriverKind,
}

impl ProducerArgs {
    fn to_args(self) -> Vec<String> {
        let driver = match self.driver {
            DriverKind::Uring => "uring",
            DriverKind::Epoll => "epoll",
            DriverKind::Auto => "auto",
        };
        vec![
            PRODUCER_COMMAND.into(),
            self.size.to_string(),
            self.producers.to_string(),
            self.consumers.to_string(),
            self.records.to_string(),
            self.timeout_ms.map_or("none".into(), |t| t.to_string()),
            driver.into(),
        ]
    }

    /// Parses the arguments after the subcommand.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let [size, producers, consumers, records, timeout, driver] = args else {
            return Err(format!(
                "{PRODUCER_COMMAND} takes 6 arguments, got {}",
                args.len()
            ));
        };
        let number = |text: &String| text.parse::<u64>().map_err(|e| format!("{text:?}: {e}"));
        Ok(ProducerArgs {
            size: number(size)? as usize,
            producers: number(producers)? as usize,
            consumers: number(consumers)? as usize,
            records: number(records)?,
            timeout_ms: if timeout == "none" {
                None
            } else {
                Some(number(timeout)?)
            },
            driver: driver.parse()?,
        })
    }
}

/// `n` records of `N` bytes from `producers` threads in a child process (this binary
/// re-executed with [`PRODUCER_COMMAND`]) to `consumers` threads here, over loopback
/// TCP through both processes' transports. Timed from the start signal sent down the
/// child's stdin to the last consumer's end. Latency is not sampled (the two processes'
/// clocks have no common epoch here).
pub fn weir_remote_processes<const N: usize>(
    producers: usize,
    consumers: usize,
    timeout: Option<Duration>,
    driver: DriverKind,
    n: u64,
) -> Measurement {
    use std::io::BufRead;
    let args = ProducerArgs {
        size: N,
        producers,
        consumers,
        records: n,
        timeout_ms: timeout.map(|t| t.as_millis() as u64),
        driver,
    };
    let exe = std::env::current_exe().expect("the running binary");
    let mut child = std::process::Command::new(exe)
        .args(args.to_args())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the producing process starts");
    let mut to_child = child.stdin.take().expect("piped");
    let mut from_child = std::io::BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    from_child
        .read_line(&mut line)
        .expect("the producer's address");
    let addr: std::net::SocketAddr = line.trim().parse().expect("an address");
    let mut config = TransportConfig::new(2);
    config.driver = driver;
    let receiving = Transport::start(config).expect("consumer transport");
    let receive_network =
        NetworkBufferPool::new(consumers * RECEIVE_SEGMENTS, SEGMENT_SIZE_DEFAULT).expect("pool");
    let peer = weir_net::transport::Peer { process: 1, addr };
    let per_producer = n / producers as u64;
    let total = per_producer * producers as u64;
    let (core_a, core_b) = bench_cores();
    let start_gate = StartLine::new(consumers + 1);
    let mut consumer_threads = Vec::new();
    for consumer in 0..consumers {
        let ids: Vec<u32> = (0..producers)
            .map(|p| (p * consumers + consumer) as u32)
            .collect();
        // The consumer parks when it has nothing, as a worker does, woken by its
        // channels: spinning would take the cores the network threads need.
        let parker = UnboundParker::new(CondvarPark::default());
        let notify: Arc<dyn Notify> = Arc::new(parker.unparker());
        let channels: Vec<Box<dyn InputChannel>> = receiving
            .consume(peer, &ids, &receive_network, Some(notify))
            .expect("consume")
            .into_iter()
            .map(|c| Box::new(c) as Box<dyn InputChannel>)
            .collect();
        let start_gate = Arc::clone(&start_gate);
        consumer_threads.push(std::thread::spawn(move || {
            pin(if consumer % 2 == 0 { core_b } else { core_a });
            let mut gate: InputGate<FixedBytes<N>> = InputGate::new(channels).expect("channels");
            let mut last_seq = vec![None::<u64>; gate.channels()];
            let mut count = 0u64;
            let parker = parker.into_parker();
            let mut spins = 0u32;
            start_gate.wait();
            loop {
                match gate.poll_next().expect("exchange error") {
                    Some(GateEvent::Record { value, channel }) => {
                        let seq = seq_of(&value);
                        assert!(last_seq[channel].is_none_or(|l| l < seq), "out of order");
                        last_seq[channel] = Some(seq);
                        count += 1;
                        spins = 0;
                    }
                    Some(GateEvent::End) => return (count, Instant::now()),
                    Some(
                        GateEvent::Watermark(_)
                        | GateEvent::Barrier { .. }
                        | GateEvent::CheckpointAborted { .. },
                    ) => {}
                    None => idle(&mut spins, &parker),
                }
            }
        }));
    }
    start_gate.wait();
    to_child.write_all(b"start\n").expect("start the producer");
    to_child.flush().expect("start the producer");
    let mut received = 0;
    let mut end: Option<Instant> = None;
    for consumer in consumer_threads {
        let (count, finished) = consumer.join().expect("consumer");
        received += count;
        end = Some(end.map_or(finished, |e| e.max(finished)));
    }
    to_child.write_all(b"done\n").expect("release the producer");
    drop(to_child);
    let status = child.wait().expect("the producing process");
    assert!(status.success(), "the producing process failed: {status}");
    assert_eq!(received, total, "records lost or duplicated");
    let start = start_gate.start();
    drop(receiving);
    end.map_or(Duration::ZERO, |e| e.saturating_duration_since(start))
        .into()
}

/// The producing process of [`weir_remote_processes`]: prints its transport's address,
/// waits for `start` on stdin, writes its records, then waits for `done` (the consumer
/// has everything) before it exits. Returns the exit status.
pub fn run_remote_producer(args: ProducerArgs) -> i32 {
    match args.size {
        8 => remote_producer::<8>(args),
        100 => remote_producer::<100>(args),
        1000 => remote_producer::<1000>(args),
        other => {
            eprintln!("{PRODUCER_COMMAND}: record size {other} is not one of 8, 100, 1000");
            2
        }
    }
}

fn remote_producer<const N: usize>(args: ProducerArgs) -> i32 {
    use std::io::BufRead;
    let mut config = TransportConfig::new(1);
    config.driver = args.driver;
    let sending = Transport::start(config).expect("producer transport");
    let network =
        NetworkBufferPool::new(args.producers * (POOL_SEGMENTS + 8), SEGMENT_SIZE_DEFAULT)
            .expect("pool");
    let mut partitions = Vec::new();
    for producer in 0..args.producers {
        let config = LocalPoolConfig::new(POOL_SEGMENTS, args.consumers)
            .with_max_per_subpartition(POOL_SEGMENTS);
        let parker = UnboundParker::new(CondvarPark::default());
        let pool =
            LocalBufferPool::with_notify(&network, config, parker.unparker()).expect("pool size");
        let mut senders = Vec::new();
        for consumer in 0..args.consumers {
            let (sender, input) = local_channel(POOL_SEGMENTS + 8, Some(sending.notify()));
            sending.serve((producer * args.consumers + consumer) as u32, input);
            senders.push(sender);
        }
        partitions.push((pool, senders, parker));
    }
    println!("{}", sending.local_addr());
    let _ = std::io::stdout().flush();
    let stdin = std::io::stdin();
    let mut line = String::new();
    if stdin.lock().read_line(&mut line).is_err() || line.trim() != "start" {
        return 1;
    }
    let epoch = Instant::now();
    let per_producer = args.records / args.producers as u64;
    let timeout = args.timeout_ms.map(Duration::from_millis);
    let (core_a, core_b) = bench_cores();
    let threads: Vec<_> = partitions
        .into_iter()
        .enumerate()
        .map(|(index, (pool, senders, parker))| {
            std::thread::spawn(move || {
                pin(if index % 2 == 0 { core_a } else { core_b });
                let parker = parker.into_parker();
                let partition = ResultPartition::new(pool, senders).expect("partition");
                let config = WriterConfig {
                    buffer_timeout: timeout,
                    ..WriterConfig::default()
                };
                let mut writer =
                    RecordWriter::new(partition, RoundRobin::default(), config).expect("writer");
                let mut value = record_template::<N>();
                let mut clock = TurnClock::new(epoch);
                for seq in 0..per_producer {
                    if seq % CLOCK_EVERY == 0 {
                        clock.read();
                        writer.on_timer(clock.now_ns).expect("timer flush");
                    }
                    value.0[..8].copy_from_slice(&seq.to_le_bytes());
                    wait_parking(&mut writer, &mut clock, &parker);
                    writer.emit(&value, clock.now_ns).expect("emit");
                }
                finish_parking(&mut writer, &mut clock, &parker);
            })
        })
        .collect();
    for thread in threads {
        if thread.join().is_err() {
            return 1;
        }
    }
    // Keep the transport (and the segments it is still sending) until the consumer
    // has everything.
    line.clear();
    let _ = stdin.lock().read_line(&mut line);
    drop(sending);
    drop(network);
    0
}

/// Waits until the writer may emit, parking while its pool is exhausted: the pool
/// notifies `parker` when the network thread has sent a buffer (and so recycled it).
/// Each wait is a new turn with a new clock reading, as a task's.
fn wait_parking<const N: usize>(
    writer: &mut RecordWriter<FixedBytes<N>, RoundRobin>,
    clock: &mut TurnClock,
    parker: &weir_engine::park::Parker,
) {
    loop {
        if writer.poll_ready(clock.now_ns).expect("resume") {
            return;
        }
        // `poll_ready` armed the pool's notification: no wake-up is lost.
        parker.park(Some(Duration::from_millis(1)), || false);
        clock.read();
        writer.on_timer(clock.now_ns).expect("timer flush");
    }
}

/// Ends the writer's partition, parking for buffers as needed.
fn finish_parking<const N: usize>(
    writer: &mut RecordWriter<FixedBytes<N>, RoundRobin>,
    clock: &mut TurnClock,
    parker: &weir_engine::park::Parker,
) {
    wait_parking(writer, clock, parker);
    clock.read();
    writer.finish(clock.now_ns).expect("finish");
    while !writer.resume(clock.now_ns).expect("resume") {
        wait_parking(writer, clock, parker);
    }
}

/// A consumer with nothing to read: spins a little, then parks until a channel gets a
/// buffer (race-free without a re-check, see `weir_engine::park`).
fn idle(spins: &mut u32, parker: &weir_engine::park::Parker) {
    if *spins < 64 {
        *spins += 1;
        std::hint::spin_loop();
    } else {
        parker.park(Some(Duration::from_millis(10)), || false);
    }
}

/// The raw TCP ceiling: `pairs` writer/reader pairs, each on its own loopback
/// connection, moving `n / pairs` records of `N` bytes in 32 KiB buffers (see the
/// module docs).
///
/// Each buffer goes out in one `write` with its 4-byte length in front (a separate
/// write of the length would cost a system call and, with `TCP_NODELAY`, a TCP segment
/// of its own per buffer); the reader reads as much as has arrived, up to 256 KiB, into
/// one buffer and decodes every whole frame in it in place, keeping a partial one for the
/// next read. The reader spins on a non-blocking socket where it has a core to itself
/// (one pair: the writer on one bench core, the reader on the other) and blocks in `read`
/// where the threads outnumber the cores (two pairs on the two bench cores), whichever
/// is faster there: on this VM, spinning took about a tenth less time per record than
/// blocking 1→1, and blocking about a quarter to a third less than spinning 2→2, where
/// a spinning reader takes the time its core's writer needs. The writes block: a
/// spinning writer gained nothing.
pub fn tcp_ceiling<const N: usize>(pairs: usize, n: u64) -> Measurement {
    const READ_BUFFER: usize = 256 * 1024;
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let per_pair = n / pairs as u64;
    let (core_a, core_b) = bench_cores();
    let spin = pairs == 1 && core_a != core_b;
    let start_gate = StartLine::new(2 * pairs);
    let mut threads = Vec::new();
    for pair in 0..pairs {
        let writer = TcpStream::connect(addr).expect("connect");
        let (reader, _) = listener.accept().expect("accept");
        writer.set_nodelay(true).expect("nodelay");
        reader.set_nonblocking(spin).expect("nonblocking");
        let start = Arc::clone(&start_gate);
        threads.push(std::thread::spawn(move || {
            let mut writer = writer;
            pin(if pair % 2 == 0 { core_a } else { core_b });
            // The frame: 4 bytes of length, then the segment.
            let mut frame = vec![1u8; 4 + SEGMENT_SIZE_DEFAULT].into_boxed_slice();
            let mut record = record_template::<N>();
            let mut seq = 0;
            start.wait();
            while seq < per_pair {
                let used = fill_segment(&mut frame[4..], &mut record, &mut seq, per_pair);
                frame[..4].copy_from_slice(&(used as u32).to_le_bytes());
                writer.write_all(&frame[..4 + used]).expect("write");
            }
            None
        }));
        let start = Arc::clone(&start_gate);
        threads.push(std::thread::spawn(move || {
            let mut reader = reader;
            pin(if pair % 2 == 0 { core_b } else { core_a });
            let mut buffer = vec![1u8; READ_BUFFER].into_boxed_slice();
            let mut filled = 0;
            let mut decoded = 0;
            let mut idle = 0u32;
            start.wait();
            while decoded < per_pair {
                match reader.read(&mut buffer[filled..]) {
                    Ok(0) => panic!("the writer closed early"),
                    Ok(read) => {
                        filled += read;
                        idle = 0;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        spin_or_yield(&mut idle);
                        continue;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => panic!("read: {e}"),
                }
                let mut at = 0;
                while filled - at >= 4 {
                    let used =
                        u32::from_le_bytes(buffer[at..at + 4].try_into().expect("4-byte length"))
                            as usize;
                    if filled - at < 4 + used {
                        break;
                    }
                    decode_segment::<N>(&buffer[at + 4..], used, &mut decoded);
                    at += 4 + used;
                }
                buffer.copy_within(at..filled, 0);
                filled -= at;
            }
            let finished = Instant::now();
            assert_eq!(filled, 0, "bytes beyond the {per_pair} records sent");
            // Nothing beyond the records sent: the writer closes its end after them.
            reader.set_nonblocking(false).expect("blocking");
            let beyond = reader.read(&mut buffer).expect("read");
            assert_eq!(beyond, 0, "bytes beyond the {per_pair} records sent");
            Some(finished)
        }));
    }
    let mut end: Option<Instant> = None;
    for thread in threads {
        if let Some(finished) = thread.join().expect("ceiling thread") {
            end = Some(end.map_or(finished, |e| e.max(finished)));
        }
    }
    let start = start_gate.start();
    end.map_or(Duration::ZERO, |e| e.saturating_duration_since(start))
        .into()
}

/// Open loop over the transport: `n` records of `N` bytes at `rate` per second, 1→1,
/// buffer timeout 0; latency from each record's intended send time to its arrival at
/// the gate (corrected for coordinated omission). `spin`: the network threads' spin.
/// The producer yields while it waits for a record's send time and the consumer parks
/// when it has nothing, so that the two network threads get the cores they need.
pub fn weir_remote_open_loop<const N: usize>(
    rate: u64,
    spin: Duration,
    driver: DriverKind,
    n: u64,
) -> Measurement {
    assert!(N >= 16, "open-loop records carry their intended send time");
    let (sending, receiving) = transports(spin, driver);
    let network = NetworkBufferPool::new(POOL_SEGMENTS + 8, SEGMENT_SIZE_DEFAULT).expect("pool");
    let receive_network =
        NetworkBufferPool::new(RECEIVE_SEGMENTS, SEGMENT_SIZE_DEFAULT).expect("pool");
    let config = LocalPoolConfig::new(POOL_SEGMENTS, 1).with_max_per_subpartition(POOL_SEGMENTS);
    let pool = LocalBufferPool::new(&network, config).expect("pool");
    let (sender, input) = local_channel(POOL_SEGMENTS + 8, Some(sending.notify()));
    sending.serve(0, input);
    // The consumer parks when it has nothing (a worker would), woken by the channel:
    // on two cores, two spinning threads would starve the network threads.
    let parker = UnboundParker::new(CondvarPark::default());
    let notify: Arc<dyn Notify> = Arc::new(parker.unparker());
    let channels: Vec<Box<dyn InputChannel>> = receiving
        .consume(sending.peer(), &[0], &receive_network, Some(notify))
        .expect("consume")
        .into_iter()
        .map(|c| Box::new(c) as Box<dyn InputChannel>)
        .collect();
    let partition = ResultPartition::new(pool, vec![sender]).expect("partition");
    let config = WriterConfig {
        buffer_timeout: Some(Duration::ZERO),
        ..WriterConfig::default()
    };
    let mut writer = RecordWriter::new(partition, RoundRobin::default(), config).expect("writer");
    let interval_ns = 1_000_000_000 / rate.max(1);
    let epoch = Instant::now();
    let (core_a, core_b) = bench_cores();
    let ready = Arc::new(std::sync::Barrier::new(2));
    let consumer_ready = Arc::clone(&ready);
    let consumer = std::thread::spawn(move || {
        pin(core_b);
        let parker = parker.into_parker();
        let mut gate: InputGate<FixedBytes<N>> = InputGate::new(channels).expect("gate");
        consumer_ready.wait();
        let mut latency = histogram();
        let mut count = 0u64;
        loop {
            match gate.poll_next().expect("exchange error") {
                Some(GateEvent::Record { value, .. }) => {
                    let intended = u64::from_le_bytes(value.0[8..16].try_into().expect("16 bytes"));
                    let now = epoch.elapsed().as_nanos() as u64;
                    latency
                        .record_correct(now.saturating_sub(intended).max(1), interval_ns)
                        .expect("in bounds");
                    count += 1;
                }
                Some(GateEvent::End) => return (count, latency),
                Some(
                    GateEvent::Watermark(_)
                    | GateEvent::Barrier { .. }
                    | GateEvent::CheckpointAborted { .. },
                ) => {}
                None => {
                    // Race-free without a re-check: a buffer pushed after the poll above
                    // notifies before or after the announcement, and either way the park
                    // returns (see `weir_engine::park`).
                    parker.park(Some(Duration::from_millis(10)), || false);
                }
            }
        }
    });
    pin(core_a);
    let mut value = record_template::<N>();
    ready.wait();
    let start = Instant::now();
    let first = epoch.elapsed().as_nanos() as u64;
    let mut clock = TurnClock::new(epoch);
    for seq in 0..n {
        let intended = first + seq * interval_ns;
        while (epoch.elapsed().as_nanos() as u64) < intended {
            // Yield, not spin: the network threads share these two cores.
            std::thread::yield_now();
        }
        value.0[..8].copy_from_slice(&seq.to_le_bytes());
        value.0[8..16].copy_from_slice(&intended.to_le_bytes());
        clock.read();
        wait_available(&mut writer, &mut clock);
        writer.emit(&value, clock.now_ns).expect("emit");
    }
    finish(&mut writer, &mut clock);
    let elapsed = start.elapsed();
    let (count, latency) = consumer.join().expect("consumer");
    assert_eq!(count, n);
    drop((sending, receiving));
    Measurement {
        elapsed,
        latency_ns: Some(latency),
        cpu: None,
    }
}

/// The latency ceiling of raw TCP: the same open loop (`n` records of `N` bytes at
/// `rate` per second), each length-prefixed record sent with one write on a
/// `TCP_NODELAY` stream at its intended send time; the reader spins on the non-blocking
/// socket (a read that would block is retried at once), decodes the whole records of
/// what arrived and records each one's latency from its intended send time (corrected
/// for coordinated omission), checking their order. One system call per record on the
/// writer, no wake-up on the reader: a reader blocked in `read` waits for the scheduler
/// to run it, milliseconds on this VM, which is no bound on what the transport can do.
pub fn tcp_open_loop_ceiling<const N: usize>(rate: u64, n: u64) -> Measurement {
    assert!(N >= 16, "open-loop records carry their intended send time");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let mut writer = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
    let (mut reader, _) = listener.accept().expect("accept");
    writer.set_nodelay(true).expect("nodelay");
    reader.set_nonblocking(true).expect("nonblocking");
    let interval_ns = 1_000_000_000 / rate.max(1);
    let epoch = Instant::now();
    let (core_a, core_b) = bench_cores();
    let ready = Arc::new(std::sync::Barrier::new(2));
    let consumer_ready = Arc::clone(&ready);
    let consumer = std::thread::spawn(move || {
        pin(core_b);
        consumer_ready.wait();
        let mut latency = histogram();
        // 64 KiB, not a whole number of records: a read may end inside one.
        let mut buffer = vec![0u8; (64 * 1024).max(4 + N)].into_boxed_slice();
        let mut filled = 0;
        let mut received = 0u64;
        let mut idle = 0u32;
        while received < n {
            match reader.read(&mut buffer[filled..]) {
                Ok(0) => panic!("the writer closed after {received} of {n} records"),
                Ok(read) => {
                    idle = 0;
                    filled = take_records::<N>(&mut buffer, filled + read, |seq, intended| {
                        assert_eq!(seq, received, "out of order");
                        let now = epoch.elapsed().as_nanos() as u64;
                        // A latency beyond the histogram's range (a stall of the
                        // machine) is counted at its top, not lost.
                        let took = now.saturating_sub(intended).clamp(1, latency.high());
                        latency
                            .record_correct(took, interval_ns)
                            .expect("clamped into range");
                        received += 1;
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => spin_or_yield(&mut idle),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => panic!("read: {e}"),
            }
        }
        // Nothing beyond the n records: the writer closes its end after the last one.
        assert_eq!(filled, 0, "bytes beyond the {n} records sent");
        reader.set_nonblocking(false).expect("blocking");
        let beyond = reader.read(&mut buffer).expect("read");
        assert_eq!(beyond, 0, "bytes beyond the {n} records sent");
        latency
    });
    pin(core_a);
    let mut frame = vec![0u8; 4 + N];
    frame[..4].copy_from_slice(&(N as u32).to_le_bytes());
    frame[20..].copy_from_slice(&record_template::<N>().0[16..]);
    ready.wait();
    let start = Instant::now();
    let first = epoch.elapsed().as_nanos() as u64;
    for seq in 0..n {
        let intended = first + seq * interval_ns;
        while (epoch.elapsed().as_nanos() as u64) < intended {
            std::thread::yield_now();
        }
        frame[4..12].copy_from_slice(&seq.to_le_bytes());
        frame[12..20].copy_from_slice(&intended.to_le_bytes());
        writer.write_all(&frame).expect("write");
    }
    drop(writer);
    let latency = consumer.join().expect("consumer");
    Measurement {
        elapsed: start.elapsed(),
        latency_ns: Some(latency),
        cpu: None,
    }
}

/// A spinning reader's wait for more bytes: a spin-loop hint, and a yield after every
/// 4096 empty reads in a row (a few µs of spinning), so that a reader sharing its core
/// with another thread (tests running side by side, a vCPU the host took away) cannot
/// hold it for a whole time slice.
fn spin_or_yield(idle: &mut u32) {
    *idle += 1;
    if *idle % 4096 == 0 {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// Takes the whole length-prefixed records of `N` bytes at the start of
/// `buffer[..filled]`, handing each one's sequence number and intended send time (bytes
/// 0..8 and 8..16 of the record) to `each`, and moves the rest, the start of a record
/// still arriving, to the front of `buffer`; returns its length.
fn take_records<const N: usize>(
    buffer: &mut [u8],
    filled: usize,
    mut each: impl FnMut(u64, u64),
) -> usize {
    let frame = 4 + N;
    let whole = filled / frame * frame;
    for record in buffer[..whole].chunks_exact(frame) {
        let len = u32::from_le_bytes(record[..4].try_into().expect("4 bytes"));
        assert_eq!(len as usize, N, "a record's length prefix");
        let seq = u64::from_le_bytes(record[4..12].try_into().expect("8 bytes"));
        let intended = u64::from_le_bytes(record[12..20].try_into().expect("8 bytes"));
        each(seq, intended);
    }
    buffer.copy_within(whole..filled, 0);
    filled - whole
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spinning_reader_takes_whole_records_and_keeps_the_rest() {
        let _cores = crate::affinity::exclusive_cores();
        let mut stream = Vec::new();
        for seq in 0..3u64 {
            stream.extend_from_slice(&20u32.to_le_bytes());
            stream.extend_from_slice(&seq.to_le_bytes());
            stream.extend_from_slice(&(100 + seq).to_le_bytes());
            stream.extend_from_slice(&[7u8; 4]);
        }
        // Two reads, the first ending inside the second record.
        let mut buffer = [0u8; 64];
        let mut taken = Vec::new();
        buffer[..30].copy_from_slice(&stream[..30]);
        let filled = take_records::<20>(&mut buffer, 30, |seq, at| taken.push((seq, at)));
        assert_eq!((filled, &taken[..]), (6, &[(0, 100)][..]));
        buffer[filled..filled + 42].copy_from_slice(&stream[30..]);
        let filled = take_records::<20>(&mut buffer, filled + 42, |seq, at| taken.push((seq, at)));
        assert_eq!(filled, 0);
        assert_eq!(taken, [(0, 100), (1, 101), (2, 102)]);
    }

    #[test]
    fn the_latency_ceiling_delivers_every_record() {
        let _cores = crate::affinity::exclusive_cores();
        let measured = tcp_open_loop_ceiling::<1000>(100_000, 3_000);
        assert!(measured.latency_ns.is_some_and(|l| l.len() >= 3_000));
        tcp_open_loop_ceiling::<16>(20_000, 1);
        tcp_open_loop_ceiling::<100>(20_000, 0);
    }

    #[test]
    fn remote_exchange_and_ceiling_deliver_every_record() {
        let _cores = crate::affinity::exclusive_cores();
        weir_remote::<100>(
            1,
            1,
            Some(Duration::from_millis(1)),
            DriverKind::Auto,
            20_000,
        );
        weir_remote::<8>(2, 2, None, DriverKind::Epoll, 20_000);
        tcp_ceiling::<100>(2, 20_000);
        // One pair: the reader spins on a non-blocking socket.
        tcp_ceiling::<100>(1, 20_000);
        tcp_ceiling::<1000>(1, 3);
        let measured = tcp_open_loop_ceiling::<100>(20_000, 200);
        assert!(measured.latency_ns.is_some_and(|l| l.len() >= 200));
        let measured = weir_remote_open_loop::<100>(20_000, Duration::ZERO, DriverKind::Auto, 200);
        assert!(measured.latency_ns.is_some());
    }
}
