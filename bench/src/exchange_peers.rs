//! Data exchange workloads: Weir's record writer → local channels → input gates on
//! pinned cores, against a `crossbeam_channel` of records between the same threads
//! (what a Rust user would write) and the single-thread memcpy ceiling (length-prefixed
//! records copied into cold 32 KiB segments).
//!
//! Records are fixed-size byte payloads ([`FixedBytes<N>`], no allocation on either
//! side, for Weir and the crossbeam peer alike): bytes 0..8 carry the sequence number,
//! and for every 16th record of 16 bytes or more, bytes 8..16 carry its creation time,
//! so the consumer samples latency through the exchange. Each consumer checks the count
//! and the per-producer order before a time is reported.

use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_engine::exchange::codec::FixedBytes;
use weir_engine::exchange::{
    local_channel, ChannelSelector, GateEvent, InputChannel, InputGate, KeyHash, LocalBufferPool,
    LocalPoolConfig, NetworkBufferPool, RecordWriter, ResultPartition, RoundRobin, Target,
    WriterConfig,
};
use weir_engine::limits::SEGMENT_SIZE_DEFAULT;

use crate::affinity::{bench_cores, pin, Backoff};
use crate::async_peers::{histogram, Measurement};

/// How records are routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// Round robin (rebalance).
    RoundRobin,
    /// By a key hash of the record's sequence number.
    KeyHash,
}

/// Segments per producer's local pool.
pub const POOL_SEGMENTS: usize = 64;

enum Selector<const N: usize> {
    RoundRobin(RoundRobin),
    KeyHash(KeyHash<fn(&FixedBytes<N>) -> u64>),
}

fn seq_of<const N: usize>(record: &FixedBytes<N>) -> u64 {
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
            Selector::KeyHash(s) => s.select(record, subpartitions),
        }
    }
}

/// Fills in the sequence number and, for a sampled record, its creation time.
#[inline]
fn stamp<const N: usize>(record: &mut FixedBytes<N>, seq: u64, epoch: Instant) {
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
fn created_of<const N: usize>(record: &FixedBytes<N>) -> Option<u64> {
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
    let start_gate = Arc::new(std::sync::Barrier::new(producers + consumers + 1));
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
                        backoff.reset();
                    }
                    Some(GateEvent::End) => return (count, latency, Instant::now()),
                    Some(GateEvent::Watermark(_)) => {}
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
                Routing::KeyHash => {
                    Selector::KeyHash(KeyHash::new(seq_of::<N> as fn(&FixedBytes<N>) -> u64))
                }
            };
            let config = WriterConfig {
                buffer_timeout: timeout,
                ..WriterConfig::default()
            };
            let mut writer = RecordWriter::new(partition, selector, config).expect("writer");
            let mut value = FixedBytes([7u8; N]);
            start_gate.wait();
            for seq in 0..per_producer {
                stamp(&mut value, seq, epoch);
                wait_available(&mut writer);
                writer.emit(&value, 0).expect("emit");
            }
            finish(&mut writer);
        }));
    }
    start_gate.wait();
    let start = Instant::now();
    for producer in producer_threads {
        producer.join().expect("producer");
    }
    let mut latency = histogram();
    let mut received = 0;
    let mut end = start;
    for consumer in consumer_threads {
        let (count, histogram, finished) = consumer.join().expect("consumer");
        received += count;
        latency.add(&histogram).expect("same bounds");
        end = end.max(finished);
    }
    assert_eq!(received, total, "records lost or duplicated");
    Measurement {
        elapsed: end - start,
        latency_ns: Some(latency),
    }
}

fn wait_available<const N: usize, S: ChannelSelector<FixedBytes<N>>>(
    writer: &mut RecordWriter<FixedBytes<N>, S>,
) {
    loop {
        if writer.has_pending() {
            if writer.resume(0).expect("resume") {
                continue;
            }
        } else if writer.is_available() {
            return;
        }
        // The benchmark's pools have no notify: yield instead of parking.
        std::thread::yield_now();
    }
}

/// Ends the writer's partition, waiting for buffers as needed.
fn finish<const N: usize, S: ChannelSelector<FixedBytes<N>>>(
    writer: &mut RecordWriter<FixedBytes<N>, S>,
) {
    wait_available(writer);
    writer.finish(0).expect("finish");
    while !writer.resume(0).expect("resume") {
        wait_available(writer);
    }
}

/// The same records over a bounded `crossbeam_channel` (capacity 1024) between two
/// pinned threads, one record (by value) per message.
pub fn crossbeam_channel<const N: usize>(n: u64) -> Measurement {
    let (tx, rx) = crossbeam_channel::bounded::<FixedBytes<N>>(1024);
    let epoch = Instant::now();
    let (core_a, core_b) = bench_cores();
    let start_gate = Arc::new(std::sync::Barrier::new(3));
    let gate = Arc::clone(&start_gate);
    let consumer = std::thread::spawn(move || {
        pin(core_b);
        let mut latency = histogram();
        let mut count = 0u64;
        gate.wait();
        while let Ok(value) = rx.recv() {
            assert_eq!(seq_of(&value), count, "out of order");
            if let Some(created) = created_of(&value) {
                let now = epoch.elapsed().as_nanos() as u64;
                latency.saturating_record(now.saturating_sub(created).max(1));
            }
            count += 1;
        }
        (count, latency, Instant::now())
    });
    let gate = Arc::clone(&start_gate);
    let producer = std::thread::spawn(move || {
        pin(core_a);
        let mut value = FixedBytes([7u8; N]);
        gate.wait();
        for seq in 0..n {
            stamp(&mut value, seq, epoch);
            tx.send(value).expect("consumer alive");
        }
    });
    start_gate.wait();
    let start = Instant::now();
    producer.join().expect("producer");
    let (count, latency, end) = consumer.join().expect("consumer");
    assert_eq!(count, n);
    Measurement {
        elapsed: end - start,
        latency_ns: Some(latency),
    }
}

/// The single-thread ceiling: `n` length-prefixed records of `size` bytes copied into
/// 32 KiB segments cycling through 64 MiB (cold: larger than the caches).
pub fn memcpy_ceiling(size: usize, n: u64) -> Measurement {
    let segments = (64 << 20) / SEGMENT_SIZE_DEFAULT;
    let mut region = vec![0u8; segments * SEGMENT_SIZE_DEFAULT];
    // Fault every page in first: "cold" means out of cache, not unmapped (Weir's pool
    // is faulted in at start-up too).
    for page in (0..region.len()).step_by(4096) {
        region[page] = 1;
    }
    let record = vec![7u8; size];
    let start = Instant::now();
    let mut segment = 0;
    let mut offset = 0;
    for _ in 0..n {
        if offset + 4 + size > SEGMENT_SIZE_DEFAULT {
            segment = (segment + 1) % segments;
            offset = 0;
        }
        let base = segment * SEGMENT_SIZE_DEFAULT + offset;
        region[base..base + 4].copy_from_slice(&(size as u32).to_le_bytes());
        region[base + 4..base + 4 + size].copy_from_slice(&record);
        offset += 4 + size;
    }
    std::hint::black_box(&region);
    start.elapsed().into()
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
                Some(GateEvent::Watermark(_)) => {}
                None => std::hint::spin_loop(),
            }
        }
    });
    pin(core_a);
    assert!(N >= 16, "open-loop records carry their intended send time");
    let mut value = FixedBytes([7u8; N]);
    ready.wait();
    let start = Instant::now();
    let first = epoch.elapsed().as_nanos() as u64;
    for seq in 0..n {
        // The intended send time: latency counts from it, so a stalled sender is charged.
        let intended = first + seq * interval_ns;
        while (epoch.elapsed().as_nanos() as u64) < intended {
            std::hint::spin_loop();
        }
        value.0[..8].copy_from_slice(&seq.to_le_bytes());
        value.0[8..16].copy_from_slice(&intended.to_le_bytes());
        wait_available(&mut writer);
        writer.emit(&value, 0).expect("emit");
    }
    finish(&mut writer);
    let elapsed = start.elapsed();
    let (count, latency) = consumer.join().expect("consumer");
    assert_eq!(count, n);
    Measurement {
        elapsed,
        latency_ns: Some(latency),
    }
}
