//! Data exchange workloads: Weir's record writer → local channels → input gates on
//! pinned cores, against what a Rust user would write between the same two threads,
//! a ceiling that bounds the same work, and references for the cost of Weir's wire
//! format. The rows of the 1→1 experiments:
//!
//! - Weir's exchange ([`weir_exchange`]): records encoded length-prefixed into 32 KiB
//!   segments of a local pool, handed over local channels, decoded by the input gate.
//! - Peers, the records passed by value, no serialization:
//!   - [`crossbeam_channel`](fn@crossbeam_channel): a bounded `crossbeam_channel`, one record per message;
//!   - [`rtrb_per_record`]: an `rtrb` SPSC ring buffer, one record per slot, both sides
//!     spinning (then yielding) when the ring is full or empty;
//!   - [`crossbeam_channel_batched`]: a bounded `crossbeam_channel` of `Vec`s of 32 KiB
//!     of records, the emptied `Vec`s sent back for reuse.
//! - The ceiling ([`cross_core_ceiling`]): the same values moved between the same two
//!   cores with no framework: written by value into preallocated 32 KiB batches that two
//!   SPSC rings circulate (full one way, emptied the other), both sides spinning, the
//!   consumer reading the records in place. It is the batched peer without its channel's
//!   locking and allocation, so no implementation of the experiment should beat it.
//! - References for the wire format's copies, length-prefixed serialization into 32 KiB
//!   segments and decoding out of them, with no exchange around them: the floor of an
//!   exchange that serializes, as Weir's does, but no bound on the experiment: a peer
//!   that passes values in memory skips these copies (with 8-byte records the batched
//!   crossbeam peer has been faster than both references that decode):
//!   - [`wire_copy_reference`]: the records copied into segments cycling through a warm
//!     region of the Weir pool's footprint (64 segments), on one thread;
//!   - [`wire_decode_reference`]: the same, each filled segment then decoded record by
//!     record with the records' codec, on one thread;
//!   - [`wire_cross_core_reference`]: a producer thread fills segments and a consumer
//!     thread on the other core decodes them, the 64 segments circulating through two
//!     SPSC rings (full, free).
//!
//! The producer of Weir's exchange reads the clock once every [`CLOCK_EVERY`] records,
//! as a task reads it once per turn, and drives the writer's buffer timeout with it.
//!
//! Records are fixed-size byte payloads ([`FixedBytes<N>`], no allocation on either
//! side, for Weir and the peers alike): bytes 0..8 carry the sequence number, and for
//! every 16th record of 16 bytes or more, bytes 8..16 carry its creation time, so the
//! consumer samples latency through the exchange; the other bytes come from
//! `record_template`, which the compiler cannot see through. Each consumer checks the
//! count and the per-producer order before a time is reported.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use weir_engine::exchange::codec::{Codec, FixedBytes, SliceEncoder};
use weir_engine::exchange::{
    local_channel, ChannelSelector, GateEvent, GateRun, HashModulo, InputChannel, InputGate,
    LocalBufferPool, LocalPoolConfig, NetworkBufferPool, RecordRef, RecordWriter, ResultPartition,
    RoundRobin, Target, WriterConfig,
};
use weir_engine::limits::SEGMENT_SIZE_DEFAULT;

use crate::affinity::{bench_cores, pin, Backoff, StartLine};
use crate::async_peers::{histogram, Measurement};

/// How records are routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// Round robin (rebalance).
    RoundRobin,
    /// By a key hash of the record's sequence number.
    HashModulo,
}

/// Segments per producer's local pool.
pub const POOL_SEGMENTS: usize = 64;

enum Selector<const N: usize> {
    RoundRobin(RoundRobin),
    HashModulo(HashModulo<fn(&FixedBytes<N>) -> u64>),
}

pub(crate) fn seq_of<const N: usize>(record: &FixedBytes<N>) -> u64 {
    u64::from_le_bytes(
        record.0[..8]
            .try_into()
            .expect("records have at least 8 bytes"),
    )
}

impl<const N: usize> ChannelSelector<FixedBytes<N>> for Selector<N> {
    #[inline]
    fn select(&mut self, record: &FixedBytes<N>, subpartitions: usize) -> Target {
        match self {
            Selector::RoundRobin(s) => s.select(record, subpartitions),
            Selector::HashModulo(s) => s.select(record, subpartitions),
        }
    }
}

/// The record a producer stamps and sends, bytes 8.. (16.. where timed) unchanged from
/// record to record, opaque to the compiler: with a record it can see to be constant,
/// the compiler may write the constant bytes (a `memset`) instead of copying the
/// record, as it did in the 1000-byte wire-format copy, a shortcut that no producer of
/// real records gets.
#[inline]
pub(crate) fn record_template<const N: usize>() -> FixedBytes<N> {
    std::hint::black_box(FixedBytes([7u8; N]))
}

/// Fills in the sequence number and, for a sampled record, its creation time.
#[inline]
pub(crate) fn stamp<const N: usize>(record: &mut FixedBytes<N>, seq: u64, epoch: Instant) {
    record.0[..8].copy_from_slice(&seq.to_le_bytes());
    if N >= 16 {
        let created = if seq % 16 == 0 {
            epoch.elapsed().as_nanos() as u64
        } else {
            0
        };
        record.0[8..16].copy_from_slice(&created.to_le_bytes());
    }
}

/// The creation time of a sampled record.
#[inline]
pub(crate) fn created_of<const N: usize>(record: &FixedBytes<N>) -> Option<u64> {
    if N < 16 {
        return None;
    }
    let created = u64::from_le_bytes(record.0[8..16].try_into().expect("16 bytes"));
    (created != 0).then_some(created)
}

/// `n` records of `size` bytes from `producers` to `consumers` threads, all producers'
/// records spread over all consumers. Timeout `None` = flush only when full.
pub fn weir_exchange<const N: usize>(
    producers: usize,
    consumers: usize,
    routing: Routing,
    timeout: Option<Duration>,
    n: u64,
) -> Measurement {
    weir_exchange_by::<N>(Path::PerRecord, producers, consumers, routing, timeout, n)
}

/// [`weir_exchange`] on the batch paths, as a task moves records: the producer writes
/// runs of [`CLOCK_EVERY`] records with [`RecordWriter::emit_run`] (one clock reading
/// per run), the consumer takes runs of up to that many with
/// [`InputGate::poll_run`]; both check and sample every record as the per-record form
/// does.
pub fn weir_exchange_runs<const N: usize>(
    producers: usize,
    consumers: usize,
    routing: Routing,
    timeout: Option<Duration>,
    n: u64,
) -> Measurement {
    weir_exchange_by::<N>(Path::Runs, producers, consumers, routing, timeout, n)
}

/// [`weir_exchange_runs`] with the consumer reading in place
/// ([`InputGate::poll_run_in_place`]): each record's sequence number and creation time
/// are read from its bytes in the segment (a record that spans segments comes decoded),
/// so a record is copied once, into the segment, as the cross-core ceiling copies it
/// once, into its batch.
pub fn weir_exchange_in_place<const N: usize>(
    producers: usize,
    consumers: usize,
    routing: Routing,
    timeout: Option<Duration>,
    n: u64,
) -> Measurement {
    weir_exchange_by::<N>(Path::InPlace, producers, consumers, routing, timeout, n)
}

/// How records pass the writer and the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// [`RecordWriter::emit`] and [`InputGate::poll_next`], one record each.
    PerRecord,
    /// [`RecordWriter::emit_run`] and [`InputGate::poll_run`].
    Runs,
    /// [`RecordWriter::emit_run`] and [`InputGate::poll_run_in_place`].
    InPlace,
}

fn weir_exchange_by<const N: usize>(
    path: Path,
    producers: usize,
    consumers: usize,
    routing: Routing,
    timeout: Option<Duration>,
    n: u64,
) -> Measurement {
    let network = NetworkBufferPool::new(producers * (POOL_SEGMENTS + 8), SEGMENT_SIZE_DEFAULT)
        .expect("pool");
    let mut inputs: Vec<Vec<Box<dyn InputChannel>>> = (0..consumers).map(|_| Vec::new()).collect();
    let mut partitions = Vec::new();
    for _ in 0..producers {
        let config =
            LocalPoolConfig::new(POOL_SEGMENTS, consumers).with_max_per_subpartition(POOL_SEGMENTS);
        let pool = LocalBufferPool::new(&network, config).expect("pool size");
        let mut senders = Vec::new();
        for input in inputs.iter_mut() {
            let (sender, receiver) = local_channel(POOL_SEGMENTS + 8, None);
            senders.push(sender);
            input.push(Box::new(receiver));
        }
        partitions.push((pool, senders));
    }
    let epoch = Instant::now();
    let per_producer = n / producers as u64;
    let total = per_producer * producers as u64;
    let (core_a, core_b) = bench_cores();
    let start_gate = StartLine::new(producers + consumers);
    let mut consumer_threads = Vec::new();
    for (index, channels) in inputs.into_iter().enumerate() {
        let start_gate = Arc::clone(&start_gate);
        consumer_threads.push(std::thread::spawn(move || {
            pin(if index % 2 == 0 { core_b } else { core_a });
            let mut gate: InputGate<FixedBytes<N>> = InputGate::new(channels).expect("channels");
            let mut latency = histogram();
            let mut last_seq = vec![None::<u64>; gate.channels()];
            let mut count = 0u64;
            let mut backoff = Backoff::default();
            let mut run = Vec::with_capacity(CLOCK_EVERY as usize);
            // A record's checks, on its bytes (`FixedBytes` is encoded as it is), so the
            // in-place path reads them where they lie.
            let mut take = |bytes: &[u8; N], channel: usize| {
                let value =
                    |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
                let seq = value(0);
                assert!(last_seq[channel].is_none_or(|l| l < seq), "out of order");
                last_seq[channel] = Some(seq);
                if N >= 16 && value(8) != 0 {
                    let now = epoch.elapsed().as_nanos() as u64;
                    latency.saturating_record(now.saturating_sub(value(8)).max(1));
                }
            };
            start_gate.wait();
            loop {
                let next = match path {
                    Path::PerRecord => gate.poll_next().expect("exchange error"),
                    Path::Runs => match gate
                        .poll_run(&mut run, CLOCK_EVERY as usize)
                        .expect("exchange error")
                    {
                        Some(GateRun::Records {
                            channel,
                            count: taken,
                        }) => {
                            for value in run.drain(..) {
                                take(&value.0, channel);
                            }
                            count += taken as u64;
                            backoff.reset();
                            continue;
                        }
                        Some(GateRun::Event(event)) => Some(event),
                        None => None,
                    },
                    Path::InPlace => match gate
                        .poll_run_in_place(CLOCK_EVERY as usize, |channel, record| match record {
                            RecordRef::Bytes(bytes) => {
                                take(bytes.try_into().expect("an N-byte record"), channel)
                            }
                            RecordRef::Value(value) => take(&value.0, channel),
                        })
                        .expect("exchange error")
                    {
                        Some(GateRun::Records { count: taken, .. }) => {
                            count += taken as u64;
                            backoff.reset();
                            continue;
                        }
                        Some(GateRun::Event(event)) => Some(event),
                        None => None,
                    },
                };
                match next {
                    Some(GateEvent::Record { value, channel }) => {
                        take(&value.0, channel);
                        count += 1;
                        backoff.reset();
                    }
                    Some(GateEvent::End) => return (count, latency, Instant::now()),
                    Some(
                        GateEvent::Watermark(_)
                        | GateEvent::Barrier { .. }
                        | GateEvent::CheckpointAborted { .. },
                    ) => {}
                    None => backoff.snooze(),
                }
            }
        }));
    }
    let mut producer_threads = Vec::new();
    for (index, (pool, senders)) in partitions.into_iter().enumerate() {
        let start_gate = Arc::clone(&start_gate);
        producer_threads.push(std::thread::spawn(move || {
            pin(if index % 2 == 0 { core_a } else { core_b });
            let partition = ResultPartition::new(pool, senders).expect("partition");
            let selector = match routing {
                Routing::RoundRobin => Selector::RoundRobin(RoundRobin::default()),
                Routing::HashModulo => {
                    Selector::HashModulo(HashModulo::new(seq_of::<N> as fn(&FixedBytes<N>) -> u64))
                }
            };
            let config = WriterConfig {
                buffer_timeout: timeout,
                ..WriterConfig::default()
            };
            let mut writer = RecordWriter::new(partition, selector, config).expect("writer");
            let mut value = record_template::<N>();
            let mut run = vec![value; CLOCK_EVERY as usize];
            start_gate.wait();
            let mut clock = TurnClock::new(epoch);
            match path {
                Path::PerRecord => {
                    for seq in 0..per_producer {
                        if seq % CLOCK_EVERY == 0 {
                            clock.read();
                            writer.on_timer(clock.now_ns).expect("timer flush");
                        }
                        stamp(&mut value, seq, epoch);
                        wait_available(&mut writer, &mut clock);
                        writer.emit(&value, clock.now_ns).expect("emit");
                    }
                }
                Path::Runs | Path::InPlace => {
                    let mut seq = 0;
                    while seq < per_producer {
                        clock.read();
                        writer.on_timer(clock.now_ns).expect("timer flush");
                        let len = (per_producer - seq).min(CLOCK_EVERY) as usize;
                        for (i, value) in run[..len].iter_mut().enumerate() {
                            stamp(value, seq + i as u64, epoch);
                        }
                        let mut rest = &run[..len];
                        while !rest.is_empty() {
                            wait_available(&mut writer, &mut clock);
                            let taken = writer.emit_run(rest, clock.now_ns).expect("emit");
                            rest = &rest[taken..];
                        }
                        seq += len as u64;
                    }
                }
            }
            finish(&mut writer, &mut clock);
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
    Measurement {
        elapsed: end.map_or(Duration::ZERO, |e| e.saturating_duration_since(start)),
        latency_ns: Some(latency),
        cpu: None,
    }
}

/// Records a producer emits per clock reading: a worker's task reads the clock once
/// per turn and emits up to this many records in one.
pub const CLOCK_EVERY: u64 = 256;

/// The producer's clock: nanoseconds since `epoch`, read when a turn would read it.
pub(crate) struct TurnClock {
    epoch: Instant,
    pub(crate) now_ns: u64,
}

impl TurnClock {
    pub(crate) fn new(epoch: Instant) -> Self {
        let mut clock = TurnClock { epoch, now_ns: 0 };
        clock.read();
        clock
    }

    pub(crate) fn read(&mut self) {
        self.now_ns = self.epoch.elapsed().as_nanos() as u64;
    }
}

/// Waits until the writer may emit; each wait is a new turn with a new clock reading.
pub(crate) fn wait_available<const N: usize, S: ChannelSelector<FixedBytes<N>>>(
    writer: &mut RecordWriter<FixedBytes<N>, S>,
    clock: &mut TurnClock,
) {
    loop {
        if writer.has_pending() {
            if writer.resume(clock.now_ns).expect("resume") {
                continue;
            }
        } else if writer.is_available() {
            return;
        }
        // The benchmark's pools have no notify: yield instead of parking.
        std::thread::yield_now();
        clock.read();
        writer.on_timer(clock.now_ns).expect("timer flush");
    }
}

/// Ends the writer's partition, waiting for buffers as needed.
pub(crate) fn finish<const N: usize, S: ChannelSelector<FixedBytes<N>>>(
    writer: &mut RecordWriter<FixedBytes<N>, S>,
    clock: &mut TurnClock,
) {
    wait_available(writer, clock);
    clock.read();
    writer.finish(clock.now_ns).expect("finish");
    while !writer.resume(clock.now_ns).expect("resume") {
        wait_available(writer, clock);
    }
}

/// The same records over a bounded `crossbeam_channel` (capacity 1024) between two
/// pinned threads, one record (by value) per message.
pub fn crossbeam_channel<const N: usize>(n: u64) -> Measurement {
    let (tx, rx) = crossbeam_channel::bounded::<FixedBytes<N>>(1024);
    let epoch = Instant::now();
    let (core_a, core_b) = bench_cores();
    let start_gate = StartLine::new(2);
    let gate = Arc::clone(&start_gate);
    let consumer = std::thread::spawn(move || {
        pin(core_b);
        let mut latency = histogram();
        let mut count = 0u64;
        gate.wait();
        while let Ok(value) = rx.recv() {
            receive(&value, &mut count, &mut latency, epoch);
        }
        (count, latency, Instant::now())
    });
    let gate = Arc::clone(&start_gate);
    let producer = std::thread::spawn(move || {
        pin(core_a);
        let mut value = record_template::<N>();
        gate.wait();
        for seq in 0..n {
            stamp(&mut value, seq, epoch);
            tx.send(value).expect("consumer alive");
        }
    });
    producer.join().expect("producer");
    let (count, latency, end) = consumer.join().expect("consumer");
    assert_eq!(count, n);
    Measurement {
        elapsed: end.saturating_duration_since(start_gate.start()),
        latency_ns: Some(latency),
        cpu: None,
    }
}

/// Slots of [`rtrb_per_record`]'s ring: 4096 records, a power of two with slack for the
/// other side's short stalls (some 15 µs of 8-byte records at these rates, 300 µs of
/// 1000-byte ones) while the ring stays in cache where records are small (32 KiB of
/// 8-byte records, 400 KiB of 100-byte ones); 1000-byte records fill 4 MB, twice the
/// 2 MiB that Weir's pool holds ([`POOL_SEGMENTS`] segments of 32 KiB). 1024 and 256
/// slots measured the same within this VM's noise.
pub const RTRB_CAPACITY: usize = 4096;

/// The same records through an `rtrb` SPSC ring buffer ([`RTRB_CAPACITY`] slots) between
/// two pinned threads, one record (by value) per slot: the producer pushes each record,
/// the consumer pops one at a time; either spins on a full or empty ring, yielding
/// after a while ([`Backoff`]) so that two threads on one core still progress.
pub fn rtrb_per_record<const N: usize>(n: u64) -> Measurement {
    let (mut tx, mut rx) = rtrb::RingBuffer::<FixedBytes<N>>::new(RTRB_CAPACITY);
    // The ring's memory is allocated but not written: fill and drain it once before the
    // clock starts, as a ring in use for a while is, rather than fault its pages in
    // during the run (4 MB of them with 1000-byte records).
    let template = record_template::<N>();
    while tx.push(template).is_ok() {}
    while rx.pop().is_ok() {}
    let epoch = Instant::now();
    let (core_a, core_b) = bench_cores();
    let start_gate = StartLine::new(2);
    let gate = Arc::clone(&start_gate);
    let consumer = std::thread::spawn(move || {
        pin(core_b);
        let mut latency = histogram();
        let mut count = 0u64;
        let mut backoff = Backoff::default();
        gate.wait();
        while count < n {
            match rx.pop() {
                Ok(value) => {
                    receive(&value, &mut count, &mut latency, epoch);
                    backoff.reset();
                }
                Err(rtrb::PopError::Empty) => backoff.snooze(),
            }
        }
        (count, latency, Instant::now(), rx)
    });
    let gate = Arc::clone(&start_gate);
    let producer = std::thread::spawn(move || {
        pin(core_a);
        let mut value = record_template::<N>();
        let mut backoff = Backoff::default();
        gate.wait();
        for seq in 0..n {
            stamp(&mut value, seq, epoch);
            while tx.push(value).is_err() {
                backoff.snooze();
            }
            backoff.reset();
        }
    });
    producer.join().expect("producer");
    let (count, latency, end, rx) = consumer.join().expect("consumer");
    assert_eq!(count, n);
    assert!(rx.is_empty(), "records beyond the {n} sent");
    Measurement {
        elapsed: end.saturating_duration_since(start_gate.start()),
        latency_ns: Some(latency),
        cpu: None,
    }
}

/// The same records through an `rtrb` SPSC ring buffer in chunks, as its users move
/// bulk data: the ring holds as many bytes of records as Weir's pool ([`POOL_SEGMENTS`]
/// segments of 32 KiB); the producer writes up to 32 KiB of records at a time into the
/// free slots (`write_chunk_uninit` + `fill_from_iter`, published with one index store),
/// the consumer reads every slot filled so far (`read_chunk` + `commit_all`); either
/// spins on a full or empty ring, yielding after a while ([`Backoff`]).
pub fn rtrb_chunked<const N: usize>(n: u64) -> Measurement {
    let per_chunk = records_per_batch::<N>();
    let capacity = POOL_SEGMENTS * per_chunk;
    let (mut tx, mut rx) = rtrb::RingBuffer::<FixedBytes<N>>::new(capacity);
    // Written and read once before the clock starts, as a ring in use for a while is.
    let template = record_template::<N>();
    while tx.push(template).is_ok() {}
    while rx.pop().is_ok() {}
    let epoch = Instant::now();
    let (core_a, core_b) = bench_cores();
    let start_gate = StartLine::new(2);
    let gate = Arc::clone(&start_gate);
    let consumer = std::thread::spawn(move || {
        pin(core_b);
        let mut latency = histogram();
        let mut count = 0u64;
        let mut backoff = Backoff::default();
        gate.wait();
        while count < n {
            let ready = rx.slots();
            if ready == 0 {
                backoff.snooze();
                continue;
            }
            backoff.reset();
            let chunk = rx.read_chunk(ready).expect("slots counted");
            let (first, second) = chunk.as_slices();
            for value in first.iter().chain(second) {
                receive(value, &mut count, &mut latency, epoch);
            }
            chunk.commit_all();
        }
        (count, latency, Instant::now(), rx)
    });
    let gate = Arc::clone(&start_gate);
    let producer = std::thread::spawn(move || {
        pin(core_a);
        let mut value = record_template::<N>();
        let mut backoff = Backoff::default();
        let mut seq = 0;
        gate.wait();
        while seq < n {
            let free = tx.slots().min(per_chunk).min((n - seq) as usize);
            if free == 0 {
                backoff.snooze();
                continue;
            }
            backoff.reset();
            let chunk = tx.write_chunk_uninit(free).expect("slots counted");
            let written = chunk.fill_from_iter((seq..seq + free as u64).map(|s| {
                stamp(&mut value, s, epoch);
                value
            }));
            seq += written as u64;
        }
    });
    producer.join().expect("producer");
    let (count, latency, end, rx) = consumer.join().expect("consumer");
    assert_eq!(count, n);
    assert!(rx.is_empty(), "records beyond the {n} sent");
    Measurement {
        elapsed: end.saturating_duration_since(start_gate.start()),
        latency_ns: Some(latency),
        cpu: None,
    }
}

/// Records per message of [`crossbeam_channel_batched`]: 32 KiB of records, the bytes
/// of one Weir buffer.
pub fn records_per_batch<const N: usize>() -> usize {
    (SEGMENT_SIZE_DEFAULT / N).max(1)
}

/// The same records over a bounded `crossbeam_channel` between two pinned threads, a
/// `Vec` of 32 KiB of records per message (as many messages in flight as Weir's pool has
/// segments); the consumer sends each emptied `Vec` back on a second channel for the
/// producer to refill, so batches are not allocated in steady state. A batch is sent
/// when full, and the last one at the end.
pub fn crossbeam_channel_batched<const N: usize>(n: u64) -> Measurement {
    let per_batch = records_per_batch::<N>();
    let (tx, rx) = crossbeam_channel::bounded::<Vec<FixedBytes<N>>>(POOL_SEGMENTS);
    let (recycle_tx, recycle_rx) = crossbeam_channel::bounded::<Vec<FixedBytes<N>>>(POOL_SEGMENTS);
    // The batches that circulate, allocated and written once before the clock starts (as
    // the other implementations' buffers are), so the run does not fault them in.
    let template = record_template::<N>();
    for _ in 0..POOL_SEGMENTS {
        let mut batch = vec![template; per_batch];
        batch.clear();
        recycle_tx.send(batch).expect("room for every batch");
    }
    let epoch = Instant::now();
    let (core_a, core_b) = bench_cores();
    let start_gate = StartLine::new(2);
    let gate = Arc::clone(&start_gate);
    let consumer = std::thread::spawn(move || {
        pin(core_b);
        let mut latency = histogram();
        let mut count = 0u64;
        gate.wait();
        while let Ok(mut batch) = rx.recv() {
            for value in batch.drain(..) {
                receive(&value, &mut count, &mut latency, epoch);
            }
            let _ = recycle_tx.try_send(batch);
        }
        (count, latency, Instant::now())
    });
    let gate = Arc::clone(&start_gate);
    let producer = std::thread::spawn(move || {
        pin(core_a);
        let mut value = record_template::<N>();
        let mut batch = recycle_rx.recv().expect("a warm batch");
        gate.wait();
        for seq in 0..n {
            stamp(&mut value, seq, epoch);
            batch.push(value);
            if batch.len() == per_batch {
                let empty = recycle_rx
                    .try_recv()
                    .unwrap_or_else(|_| Vec::with_capacity(per_batch));
                tx.send(std::mem::replace(&mut batch, empty))
                    .expect("consumer alive");
            }
        }
        if !batch.is_empty() {
            tx.send(batch).expect("consumer alive");
        }
    });
    producer.join().expect("producer");
    let (count, latency, end) = consumer.join().expect("consumer");
    assert_eq!(count, n);
    Measurement {
        elapsed: end.saturating_duration_since(start_gate.start()),
        latency_ns: Some(latency),
        cpu: None,
    }
}

/// The cross-core ceiling: the same values between the same two pinned threads with no
/// framework. The producer writes each record by value into a batch of 32 KiB of records
/// ([`records_per_batch`]), and hands each full batch (and the last, partial one) to the
/// consumer through an SPSC ring; the consumer reads the records in place, checking
/// their order and sampling latency as the peers do, and hands the emptied batch back
/// through a second ring. [`POOL_SEGMENTS`] batches, allocated and written once before
/// the clock starts, circulate; both sides spin when a ring is empty (yielding after a
/// while, [`Backoff`], so that two threads on one core still progress). This is the
/// batched crossbeam peer without its channel's blocking (parking and waking threads)
/// and its fallback allocation: nothing that moves these values between two cores does
/// less.
pub fn cross_core_ceiling<const N: usize>(n: u64) -> Measurement {
    type Batch<const N: usize> = Box<[FixedBytes<N>]>;
    let per_batch = records_per_batch::<N>();
    let (mut full_tx, mut full_rx) = rtrb::RingBuffer::<(Batch<N>, usize)>::new(POOL_SEGMENTS);
    let (mut free_tx, mut free_rx) = rtrb::RingBuffer::<Batch<N>>::new(POOL_SEGMENTS);
    for _ in 0..POOL_SEGMENTS {
        free_tx
            .push(vec![record_template::<N>(); per_batch].into_boxed_slice())
            .expect("the ring holds every batch");
    }
    let epoch = Instant::now();
    let (core_a, core_b) = bench_cores();
    let start_gate = StartLine::new(2);
    let gate = Arc::clone(&start_gate);
    let consumer = std::thread::spawn(move || {
        pin(core_b);
        let mut latency = histogram();
        let mut count = 0u64;
        let mut backoff = Backoff::default();
        gate.wait();
        while count < n {
            match full_rx.pop() {
                Ok((batch, len)) => {
                    for value in &batch[..len] {
                        receive(value, &mut count, &mut latency, epoch);
                    }
                    // The free ring holds every batch, so this never fails.
                    let _ = free_tx.push(batch);
                    backoff.reset();
                }
                Err(rtrb::PopError::Empty) => backoff.snooze(),
            }
        }
        (count, latency, Instant::now(), full_rx)
    });
    let gate = Arc::clone(&start_gate);
    let producer = std::thread::spawn(move || {
        pin(core_a);
        let mut value = record_template::<N>();
        let mut backoff = Backoff::default();
        gate.wait();
        let mut seq = 0;
        while seq < n {
            let mut batch = loop {
                match free_rx.pop() {
                    Ok(batch) => break batch,
                    Err(rtrb::PopError::Empty) => backoff.snooze(),
                }
            };
            backoff.reset();
            let len = (n - seq).min(per_batch as u64) as usize;
            for slot in &mut batch[..len] {
                stamp(&mut value, seq, epoch);
                *slot = value;
                seq += 1;
            }
            let mut full = (batch, len);
            while let Err(rtrb::PushError::Full(back)) = full_tx.push(full) {
                full = back;
                backoff.snooze();
            }
            backoff.reset();
        }
    });
    producer.join().expect("producer");
    let (count, latency, end, full_rx) = consumer.join().expect("consumer");
    assert_eq!(count, n);
    assert!(full_rx.is_empty(), "records beyond the {n} sent");
    Measurement {
        elapsed: end.saturating_duration_since(start_gate.start()),
        latency_ns: Some(latency),
        cpu: None,
    }
}

/// Writes length-prefixed records with sequence numbers `*seq..end` into `segment`
/// with the records' codec until it is full (records do not span segments here, which
/// only flatters the wire-format references); returns the bytes used.
#[inline]
pub(crate) fn fill_segment<const N: usize>(
    segment: &mut [u8],
    record: &mut FixedBytes<N>,
    seq: &mut u64,
    end: u64,
) -> usize {
    let mut used = 0;
    while *seq < end && used + 4 + N <= segment.len() {
        record.0[..8].copy_from_slice(&seq.to_le_bytes());
        segment[used..used + 4].copy_from_slice(&(N as u32).to_le_bytes());
        let mut encoder = SliceEncoder::new(&mut segment[used + 4..]);
        record.encode(&mut encoder);
        used += 4 + encoder.finish().expect("checked to fit");
        *seq += 1;
    }
    used
}

/// Decodes the records in `segment[..used]` with the records' codec, checking that
/// their sequence numbers continue from `*expected`.
///
/// Each decoded record goes through `black_box`, as a record handed on to a consumer
/// would be: read for its sequence number only, the decoded copy is otherwise dead and
/// the compiler drops it, leaving two loads per record, no decode at all (the
/// 1000-byte copy-and-decode reference then measured no slower than the copy alone).
#[inline]
pub(crate) fn decode_segment<const N: usize>(segment: &[u8], used: usize, expected: &mut u64) {
    let mut offset = 0;
    while offset < used {
        let len = u32::from_le_bytes(
            segment[offset..offset + 4]
                .try_into()
                .expect("4-byte prefix"),
        ) as usize;
        let mut bytes = &segment[offset + 4..offset + 4 + len];
        let record =
            std::hint::black_box(FixedBytes::<N>::decode(&mut bytes).expect("a whole record"));
        assert_eq!(seq_of(&record), *expected, "out of order");
        *expected += 1;
        offset += 4 + len;
    }
}

/// A peer's consumer took `value`: checks it is record number `*count` (in order, none
/// lost), samples its latency if it carries its creation time, and counts it.
#[inline]
fn receive<const N: usize>(
    value: &FixedBytes<N>,
    count: &mut u64,
    latency: &mut Histogram<u64>,
    epoch: Instant,
) {
    assert_eq!(seq_of(value), *count, "out of order");
    if let Some(created) = created_of(value) {
        let now = epoch.elapsed().as_nanos() as u64;
        latency.saturating_record(now.saturating_sub(created).max(1));
    }
    *count += 1;
}

/// A warm region of the Weir pool's footprint: `POOL_SEGMENTS` segments of 32 KiB,
/// every byte written once before the clock starts.
fn warm_segments() -> Vec<Box<[u8]>> {
    (0..POOL_SEGMENTS)
        .map(|_| vec![1u8; SEGMENT_SIZE_DEFAULT].into_boxed_slice())
        .collect()
}

/// The wire format's copy, on one thread: `n` length-prefixed records of `N` bytes
/// copied into 32 KiB segments cycling through a warm region the size of Weir's pool.
/// A reference, not a ceiling: it is one side of the serialization only.
///
/// Each filled segment goes through `black_box`, so that every segment's bytes are
/// written (a segment is overwritten 64 segments later, and is otherwise never read),
/// and the records come from `record_template`, so that they are copied: with a record
/// the compiler could see to be constant, this was a `memset` of its constant bytes.
pub fn wire_copy_reference<const N: usize>(n: u64) -> Measurement {
    let mut segments = warm_segments();
    let mut record = record_template::<N>();
    let start = Instant::now();
    let mut seq = 0;
    let mut index = 0;
    while seq < n {
        fill_segment(&mut segments[index], &mut record, &mut seq, n);
        std::hint::black_box(&segments[index]);
        index = (index + 1) % segments.len();
    }
    let elapsed = start.elapsed();
    std::hint::black_box(&segments);
    elapsed.into()
}

/// The wire format's copy and decode, on one thread: as [`wire_copy_reference`], and
/// each filled segment is then decoded record by record, as a consumer would (see
/// `decode_segment` for why each decoded record goes through `black_box`).
pub fn wire_decode_reference<const N: usize>(n: u64) -> Measurement {
    let mut segments = warm_segments();
    let mut record = record_template::<N>();
    let start = Instant::now();
    let mut seq = 0;
    let mut decoded = 0;
    let mut index = 0;
    while seq < n {
        let used = fill_segment(&mut segments[index], &mut record, &mut seq, n);
        decode_segment::<N>(std::hint::black_box(&segments[index]), used, &mut decoded);
        index = (index + 1) % segments.len();
    }
    let elapsed = start.elapsed();
    assert_eq!(decoded, n, "records lost");
    elapsed.into()
}

/// The wire format's copies across cores: the producer thread copies records into
/// segments and hands each full one over an SPSC ring to the consumer thread on the
/// other core, which decodes it and hands it back over a second ring; `POOL_SEGMENTS`
/// segments in all. The floor of an exchange that serializes, as Weir's does; not a
/// ceiling of the experiment, whose peers move the values without serializing them.
pub fn wire_cross_core_reference<const N: usize>(n: u64) -> Measurement {
    let (mut full_tx, mut full_rx) = rtrb::RingBuffer::<(Box<[u8]>, usize)>::new(POOL_SEGMENTS);
    let (mut free_tx, mut free_rx) = rtrb::RingBuffer::<Box<[u8]>>::new(POOL_SEGMENTS);
    for segment in warm_segments() {
        free_tx.push(segment).expect("the ring holds every segment");
    }
    let elapsed = crate::affinity::run_pair(
        move || {
            let mut record = record_template::<N>();
            let mut backoff = Backoff::default();
            let mut seq = 0;
            while seq < n {
                let mut segment = loop {
                    match free_rx.pop() {
                        Ok(segment) => break segment,
                        Err(_) => backoff.snooze(),
                    }
                };
                backoff.reset();
                let used = fill_segment(&mut segment, &mut record, &mut seq, n);
                let mut full = (segment, used);
                while let Err(rtrb::PushError::Full(back)) = full_tx.push(full) {
                    full = back;
                    backoff.snooze();
                }
                backoff.reset();
            }
        },
        move || {
            let mut backoff = Backoff::default();
            let mut decoded = 0;
            while decoded < n {
                match full_rx.pop() {
                    Ok((segment, used)) => {
                        decode_segment::<N>(&segment, used, &mut decoded);
                        // The free ring holds every segment, so this never fails.
                        let _ = free_tx.push(segment);
                        backoff.reset();
                    }
                    Err(_) => backoff.snooze(),
                }
            }
        },
    );
    elapsed.into()
}

/// Open loop: `n` records of `size` bytes at `rate` per second, 1→1, buffer timeout 0;
/// latency corrected for coordinated omission (`record_correct` at the interval).
pub fn weir_open_loop<const N: usize>(rate: u64, n: u64) -> Measurement {
    let network = NetworkBufferPool::new(POOL_SEGMENTS + 8, SEGMENT_SIZE_DEFAULT).expect("pool");
    let config = LocalPoolConfig::new(POOL_SEGMENTS, 1).with_max_per_subpartition(POOL_SEGMENTS);
    let pool = LocalBufferPool::new(&network, config).expect("pool");
    let (sender, receiver) = local_channel(POOL_SEGMENTS + 8, None);
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
        let mut gate: InputGate<FixedBytes<N>> =
            InputGate::new(vec![Box::new(receiver)]).expect("gate");
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
                None => std::hint::spin_loop(),
            }
        }
    });
    pin(core_a);
    assert!(N >= 16, "open-loop records carry their intended send time");
    let mut value = record_template::<N>();
    ready.wait();
    let start = Instant::now();
    let first = epoch.elapsed().as_nanos() as u64;
    let mut clock = TurnClock::new(epoch);
    for seq in 0..n {
        // The intended send time: latency counts from it, so a stalled sender is charged.
        let intended = first + seq * interval_ns;
        while (epoch.elapsed().as_nanos() as u64) < intended {
            std::hint::spin_loop();
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
    Measurement {
        elapsed,
        latency_ns: Some(latency),
        cpu: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Each workload asserts its own count and order; these run them small.

    #[test]
    fn batched_crossbeam_sends_a_partial_last_batch() {
        let _cores = crate::affinity::exclusive_cores();
        let n = records_per_batch::<100>() as u64 * 3 + 7;
        crossbeam_channel_batched::<100>(n);
        crossbeam_channel_batched::<8>(1);
    }

    #[test]
    fn wire_format_references_copy_and_decode_every_record() {
        let _cores = crate::affinity::exclusive_cores();
        wire_copy_reference::<1000>(5_000);
        wire_decode_reference::<100>(20_000);
        wire_decode_reference::<8>(1);
        wire_cross_core_reference::<100>(50_000);
        wire_cross_core_reference::<1000>(0);
    }

    #[test]
    fn rtrb_delivers_every_record_through_a_full_ring() {
        let _cores = crate::affinity::exclusive_cores();
        let measured = rtrb_per_record::<100>(RTRB_CAPACITY as u64 * 3 + 5);
        assert!(measured.latency_ns.is_some());
        rtrb_per_record::<8>(1);
        rtrb_per_record::<1000>(0);
    }

    #[test]
    fn rtrb_chunks_deliver_every_record_through_a_full_ring() {
        let _cores = crate::affinity::exclusive_cores();
        // More than the ring holds, so that chunks wrap around its end, and a partial one.
        let n = (records_per_batch::<100>() * POOL_SEGMENTS) as u64 * 2 + 11;
        assert!(rtrb_chunked::<100>(n).latency_ns.is_some());
        rtrb_chunked::<8>(1);
        rtrb_chunked::<1000>(0);
    }

    #[test]
    fn cross_core_ceiling_sends_a_partial_last_batch() {
        let _cores = crate::affinity::exclusive_cores();
        // More batches than circulate, so that they are recycled, and a partial last one.
        let n = records_per_batch::<100>() as u64 * (POOL_SEGMENTS as u64 + 3) + 7;
        let measured = cross_core_ceiling::<100>(n);
        assert!(measured.latency_ns.is_some());
        cross_core_ceiling::<8>(1);
        cross_core_ceiling::<1000>(0);
    }

    #[test]
    fn segments_hold_whole_records() {
        let _cores = crate::affinity::exclusive_cores();
        let mut segment = vec![0u8; SEGMENT_SIZE_DEFAULT];
        let mut record = FixedBytes([7u8; 1000]);
        let mut seq = 0;
        let used = fill_segment(&mut segment, &mut record, &mut seq, 100);
        assert_eq!(seq, (SEGMENT_SIZE_DEFAULT / 1004) as u64);
        assert_eq!(used, seq as usize * 1004);
        let mut decoded = 0;
        decode_segment::<1000>(&segment, used, &mut decoded);
        assert_eq!(decoded, seq);
    }

    #[test]
    fn the_exchange_runs_on_a_real_clock() {
        let _cores = crate::affinity::exclusive_cores();
        weir_exchange::<100>(
            1,
            1,
            Routing::RoundRobin,
            Some(Duration::from_millis(1)),
            20_000,
        );
    }
}
