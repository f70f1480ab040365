//! The local data exchange end to end: record writers, result partitions, local
//! channels and input gates. A proptest drives M producers × N consumers with random
//! record sizes (0 bytes to several segments), selectors and watermarks on small pools,
//! and checks that everything written is read back exactly once, intact, in
//! per-channel order, with watermarks combined as minima, and that the pool is whole at
//! the end. A two-thread stress test on a 4-segment pool keeps the writer back-pressured.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use proptest::prelude::*;
use weir_engine::exchange::codec::{Codec, DecodeError, Decoder, Encoder};
use weir_engine::exchange::{
    local_channel, Broadcast, ChannelSelector, Forward, GateEvent, HashModulo, InputChannel,
    InputGate, LocalBufferPool, LocalPoolConfig, NetworkBufferPool, RecordWriter, ResultPartition,
    RoundRobin, SharedBuffer, Target, WriterConfig,
};
use weir_engine::park::{Parker, Wakeup};
use weir_engine::ExchangeError;

/// A test record: who wrote it, its sequence number, and a payload derived from both.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rec {
    producer: u32,
    seq: u64,
    payload: Vec<u8>,
}

fn payload(producer: u32, seq: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64 ^ seq ^ (u64::from(producer) * 31)) as u8)
        .collect()
}

impl Codec for Rec {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        self.producer.encode(out);
        self.seq.encode(out);
        self.payload.encode(out);
    }
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        Ok(Rec {
            producer: u32::decode(input)?,
            seq: u64::decode(input)?,
            payload: Vec::decode(input)?,
        })
    }
}

#[derive(Debug, Clone, Copy)]
enum Selector {
    Forward,
    RoundRobin,
    HashModulo,
    Broadcast,
}

/// One selector type for all four, so a proptest can pick at run time.
enum AnySelector {
    Forward(Forward),
    RoundRobin(RoundRobin),
    HashModulo(HashModulo<fn(&Rec) -> u64>),
    Broadcast(Broadcast),
}

impl ChannelSelector<Rec> for AnySelector {
    fn select(&mut self, record: &Rec, subpartitions: usize) -> Target {
        match self {
            AnySelector::Forward(s) => s.select(record, subpartitions),
            AnySelector::RoundRobin(s) => s.select(record, subpartitions),
            AnySelector::HashModulo(s) => s.select(record, subpartitions),
            AnySelector::Broadcast(s) => ChannelSelector::<Rec>::select(s, record, subpartitions),
        }
    }
    fn is_broadcast(&self) -> bool {
        matches!(self, AnySelector::Broadcast(_))
    }
}

fn selector(kind: Selector) -> AnySelector {
    match kind {
        Selector::Forward => AnySelector::Forward(Forward),
        Selector::RoundRobin => AnySelector::RoundRobin(RoundRobin::default()),
        Selector::HashModulo => AnySelector::HashModulo(HashModulo::new(|r: &Rec| r.seq % 7)),
        Selector::Broadcast => AnySelector::Broadcast(Broadcast),
    }
}

struct Topology {
    network: NetworkBufferPool,
    writers: Vec<RecordWriter<Rec, AnySelector>>,
    gates: Vec<InputGate<Rec>>,
}

fn topology(
    producers: usize,
    consumers: usize,
    segment_size: usize,
    pool_size: usize,
    kind: Selector,
    timeout: Option<Duration>,
) -> Topology {
    let overdraft = 2;
    let network =
        NetworkBufferPool::new(producers * (pool_size + overdraft) + 4, segment_size).unwrap();
    let mut inputs: Vec<Vec<Box<dyn InputChannel>>> = (0..consumers).map(|_| Vec::new()).collect();
    let mut writers = Vec::new();
    for _ in 0..producers {
        let config = LocalPoolConfig::new(pool_size.max(consumers), consumers)
            .with_max_per_subpartition(pool_size)
            .with_overdraft(overdraft);
        let pool = LocalBufferPool::new(&network, config).unwrap();
        let mut senders = Vec::new();
        for input in inputs.iter_mut() {
            let (sender, receiver) = local_channel(pool.size() + overdraft, None);
            senders.push(sender);
            input.push(Box::new(receiver));
        }
        let partition = ResultPartition::new(pool, senders).unwrap();
        let config = WriterConfig {
            max_record_size: 1 << 20,
            buffer_timeout: timeout,
        };
        writers.push(RecordWriter::new(partition, selector(kind), config).unwrap());
    }
    let gates = inputs
        .into_iter()
        .map(|channels| InputGate::new(channels).unwrap())
        .collect();
    Topology {
        network,
        writers,
        gates,
    }
}

/// What the consumers saw.
#[derive(Default)]
struct Seen {
    /// Per consumer, per channel (producer): the records in arrival order.
    records: BTreeMap<(usize, usize), Vec<Rec>>,
    /// Per consumer: the combined watermarks.
    watermarks: BTreeMap<usize, Vec<i64>>,
    ended: BTreeMap<usize, bool>,
}

fn drain(
    gates: &mut [InputGate<Rec>],
    seen: &mut Seen,
    budget: usize,
) -> Result<usize, ExchangeError> {
    let mut read = 0;
    for (consumer, gate) in gates.iter_mut().enumerate() {
        for _ in 0..budget {
            match gate.poll_next()? {
                Some(GateEvent::Record { value, channel }) => {
                    seen.records
                        .entry((consumer, channel))
                        .or_default()
                        .push(value);
                    read += 1;
                }
                Some(GateEvent::Watermark(w)) => {
                    seen.watermarks.entry(consumer).or_default().push(w)
                }
                Some(GateEvent::End) => {
                    assert!(seen.ended.insert(consumer, true).is_none(), "End twice");
                }
                Some(GateEvent::Barrier { .. } | GateEvent::CheckpointAborted { .. }) => {
                    unreachable!("no barriers are written here")
                }
                None => break,
            }
        }
    }
    Ok(read)
}

/// Runs the writer step `step` (emit/watermark/finish) and, while the writer is
/// back-pressured, lets the consumers read so buffers come back.
fn write_through(
    t: &mut Topology,
    seen: &mut Seen,
    producer: usize,
    step: impl FnOnce(&mut RecordWriter<Rec, AnySelector>) -> Result<(), ExchangeError>,
) {
    step(&mut t.writers[producer]).unwrap();
    let mut rounds = 0;
    while t.writers[producer].has_pending() {
        drain(&mut t.gates, seen, 64).unwrap();
        t.writers[producer].resume(0).unwrap();
        rounds += 1;
        assert!(rounds < 100_000, "writer never got buffers back");
    }
}

#[derive(Debug, Clone)]
enum Action {
    Emit { producer: usize, len: usize },
    Watermark { producer: usize },
    Drain { budget: usize },
    Tick,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => (0usize..3, prop_oneof![0usize..16, 16usize..200, 200usize..700]).prop_map(|(producer, len)| Action::Emit { producer, len }),
        1 => (0usize..3).prop_map(|producer| Action::Watermark { producer }),
        2 => (1usize..20).prop_map(|budget| Action::Drain { budget }),
        1 => Just(Action::Tick),
    ]
}

fn selector_kind() -> impl Strategy<Value = Selector> {
    prop_oneof![
        Just(Selector::Forward),
        Just(Selector::RoundRobin),
        Just(Selector::HashModulo),
        Just(Selector::Broadcast)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn everything_written_is_read_once_in_order(
        producers in 1usize..4,
        consumers in 1usize..4,
        segment_size in prop_oneof![Just(64usize), Just(128), Just(256)],
        pool_size in 1usize..5,
        kind in selector_kind(),
        timeout in prop_oneof![Just(None), Just(Some(Duration::ZERO)), Just(Some(Duration::from_nanos(50)))],
        actions in prop::collection::vec(action(), 0..120),
    ) {
        let mut t = topology(producers, consumers, segment_size, pool_size, kind, timeout);
        let mut seen = Seen::default();
        let mut next_seq = vec![0u64; producers];
        let mut next_watermark = vec![0i64; producers];
        let mut sent_watermarks: Vec<Vec<i64>> = vec![Vec::new(); producers];
        let mut now = 0u64;
        for action in actions {
            now += 10;
            match action {
                Action::Emit { producer, len } => {
                    let producer = producer % producers;
                    let seq = next_seq[producer];
                    next_seq[producer] += 1;
                    let record = Rec { producer: producer as u32, seq, payload: payload(producer as u32, seq, len) };
                    write_through(&mut t, &mut seen, producer, |w| w.emit(&record, now));
                }
                Action::Watermark { producer } => {
                    let producer = producer % producers;
                    next_watermark[producer] += 1 + (now as i64 % 3);
                    let w = next_watermark[producer];
                    sent_watermarks[producer].push(w);
                    write_through(&mut t, &mut seen, producer, |wr| wr.emit_watermark(w, now));
                }
                Action::Drain { budget } => { drain(&mut t.gates, &mut seen, budget).unwrap(); }
                Action::Tick => {
                    for writer in &mut t.writers {
                        writer.on_timer(now).unwrap();
                    }
                }
            }
        }
        for producer in 0..producers {
            write_through(&mut t, &mut seen, producer, |w| w.finish(now));
        }
        // Everything is sent (finish flushes); a few rounds read it all.
        for _ in 0..1_000 {
            if seen.ended.len() == consumers {
                break;
            }
            drain(&mut t.gates, &mut seen, 1024).unwrap();
        }
        prop_assert_eq!(seen.ended.len(), consumers, "every gate ends");

        // Exactly once, intact, in per-channel order.
        #[allow(clippy::needless_range_loop)] // `producer` is also the channel index
        for producer in 0..producers {
            let mut received: Vec<u64> = Vec::new();
            for consumer in 0..consumers {
                let records = seen.records.get(&(consumer, producer)).cloned().unwrap_or_default();
                let mut last = None;
                for r in &records {
                    prop_assert_eq!(r.producer as usize, producer);
                    prop_assert_eq!(&r.payload, &payload(r.producer, r.seq, r.payload.len()), "payload corrupted");
                    prop_assert!(last.is_none_or(|l| l < r.seq), "out of order on ({}, {})", consumer, producer);
                    last = Some(r.seq);
                }
                let seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
                if matches!(kind, Selector::Broadcast) {
                    prop_assert_eq!(seqs, (0..next_seq[producer]).collect::<Vec<_>>(), "broadcast reaches everyone");
                } else {
                    received.extend(seqs);
                }
            }
            if !matches!(kind, Selector::Broadcast) {
                received.sort_unstable();
                prop_assert_eq!(received, (0..next_seq[producer]).collect::<Vec<_>>(), "each record once");
            }
            if matches!(kind, Selector::Forward) {
                for consumer in 1..consumers {
                    prop_assert!(seen.records.get(&(consumer, producer)).is_none_or(|r| r.is_empty()));
                }
            }
        }
        // Watermarks: strictly increasing minima; with one producer, exactly what it sent.
        for consumer in 0..consumers {
            let got = seen.watermarks.get(&consumer).cloned().unwrap_or_default();
            prop_assert!(got.windows(2).all(|w| w[0] < w[1]), "watermarks regress: {:?}", got);
            for w in &got {
                prop_assert!(sent_watermarks.iter().any(|s| s.contains(w)), "watermark {} never sent", w);
            }
            if producers == 1 {
                prop_assert_eq!(&got, &sent_watermarks[0]);
            }
        }
        let network = t.network.clone();
        drop(t);
        network.assert_whole();
    }
}

/// A channel fed by the test: buffers with chosen frames, to check the watermark valve
/// and bad input deterministically.
struct Scripted(VecDeque<SharedBuffer>, bool);

impl InputChannel for Scripted {
    fn poll_buffer(&mut self) -> Option<SharedBuffer> {
        self.0.pop_front()
    }
    fn is_disconnected(&self) -> bool {
        self.1
    }
}

fn frames(
    network: &NetworkBufferPool,
    chunks: &[Vec<u8>],
) -> (LocalBufferPool, VecDeque<SharedBuffer>) {
    let mut pool =
        LocalBufferPool::new(network, LocalPoolConfig::new(chunks.len().max(1), 1)).unwrap();
    let buffers = chunks
        .iter()
        .map(|bytes| {
            let mut buffer = pool.request(0).unwrap();
            buffer.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
            buffer.set_len(bytes.len());
            buffer.into_shared()
        })
        .collect();
    (pool, buffers)
}

fn watermark(ts: i64) -> Vec<u8> {
    let mut bytes = (u32::MAX - 1).to_le_bytes().to_vec();
    bytes.extend_from_slice(&ts.to_le_bytes());
    bytes
}

/// The gate's watermark is the minimum over channels that have not ended, emitted when
/// it advances; an ended channel stops holding it back. The gate takes one buffer per
/// channel in turn, so the interleaving (and the output) is deterministic here.
#[test]
fn watermarks_combine_as_the_minimum_over_live_channels() {
    let network = NetworkBufferPool::new(16, 64).unwrap();
    let end = u32::MAX.to_le_bytes().to_vec();
    let (_p0, a) = frames(&network, &[watermark(5), watermark(9), end.clone()]);
    let (_p1, b) = frames(&network, &[watermark(7), watermark(8), watermark(20), end]);
    let mut gate: InputGate<u8> = InputGate::new(vec![
        Box::new(Scripted(a, false)),
        Box::new(Scripted(b, false)),
    ])
    .unwrap();
    let mut events = Vec::new();
    while let Some(event) = gate.poll_next().unwrap() {
        events.push(event);
    }
    assert_eq!(
        events,
        // a:W5 b:W7 -> 5; a:W9 -> 7; b:W8 -> 8; a:End (b holds 8); b:W20 -> 20; b:End.
        vec![
            GateEvent::Watermark(5),
            GateEvent::Watermark(7),
            GateEvent::Watermark(8),
            GateEvent::Watermark(20),
            GateEvent::End
        ]
    );
}

/// An idle channel (Flink's idle watermark status) stops holding the minimum back until
/// it sends a watermark again; when every live channel is idle, the gate passes the idle
/// mark on once.
#[test]
fn idle_channels_leave_the_minimum_until_they_send_a_watermark() {
    let network = NetworkBufferPool::new(16, 64).unwrap();
    let end = u32::MAX.to_le_bytes().to_vec();
    let idle = watermark(weir_engine::element::IDLE_WATERMARK);
    let (_p0, a) = frames(
        &network,
        &[
            watermark(5),
            watermark(30),
            idle.clone(),
            watermark(40),
            end.clone(),
        ],
    );
    let (_p1, b) = frames(
        &network,
        &[watermark(3), idle.clone(), idle, watermark(35), end],
    );
    let mut gate: InputGate<u8> = InputGate::new(vec![
        Box::new(Scripted(a, false)),
        Box::new(Scripted(b, false)),
    ])
    .unwrap();
    let mut events = Vec::new();
    while let Some(event) = gate.poll_next().unwrap() {
        events.push(event);
    }
    assert_eq!(
        events,
        // a:W5 b:W3 -> 3; a:W30; b:idle -> 30 (a alone); a:idle -> both idle: the mark;
        // b:idle again: nothing; a:W40 -> 40 (a active, b idle); b:W35: below, nothing;
        // a:End; b:End.
        vec![
            GateEvent::Watermark(3),
            GateEvent::Watermark(30),
            GateEvent::Watermark(weir_engine::element::IDLE_WATERMARK),
            GateEvent::Watermark(40),
            GateEvent::End
        ]
    );
}

/// Malformed input is a typed error, never a panic: an oversized length, an unknown
/// event tag, trailing bytes, and a producer that vanishes before its end event.
#[test]
fn bad_input_is_a_clear_error() {
    let network = NetworkBufferPool::new(16, 64).unwrap();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (u32::to_le_bytes(1 << 30).to_vec(), "exceeds the maximum"),
        ((u32::MAX - 5).to_le_bytes().to_vec(), "unknown event tag"),
        (
            [2u32.to_le_bytes().to_vec(), vec![1, 2]].concat(),
            "left over",
        ),
    ];
    for (bytes, expected) in cases {
        let (_pool, buffers) = frames(&network, &[bytes]);
        let mut gate: InputGate<u8> =
            InputGate::new(vec![Box::new(Scripted(buffers, false))]).unwrap();
        let error = gate.poll_next().unwrap_err();
        assert!(error.to_string().contains(expected), "{error}");
    }
    let (_pool, buffers) = frames(&network, &[vec![1, 0, 0, 0, 7]]);
    let mut gate: InputGate<u8> = InputGate::new(vec![Box::new(Scripted(buffers, true))]).unwrap();
    assert_eq!(
        gate.poll_next().unwrap(),
        Some(GateEvent::Record {
            value: 7,
            channel: 0
        })
    );
    assert!(matches!(
        gate.poll_next(),
        Err(ExchangeError::ProducerGone { channel: 0 })
    ));
}

/// One writer (forward, 4-segment pool, segments of `segment_size` bytes) wired to one
/// gate through a local channel.
fn one_to_one<T: Codec>(
    segment_size: usize,
    max_record_size: usize,
    buffer_timeout: Option<Duration>,
) -> (NetworkBufferPool, RecordWriter<T, Forward>, InputGate<T>) {
    let network = NetworkBufferPool::new(8, segment_size).unwrap();
    let pool = LocalBufferPool::new(&network, LocalPoolConfig::new(4, 1)).unwrap();
    let (sender, receiver) = local_channel(16, None);
    let partition = ResultPartition::new(pool, vec![sender]).unwrap();
    let config = WriterConfig {
        max_record_size,
        buffer_timeout,
    };
    let writer = RecordWriter::new(partition, Forward, config).unwrap();
    let gate = InputGate::new(vec![Box::new(receiver) as Box<dyn InputChannel>]).unwrap();
    (network, writer, gate)
}

/// A record above the writer's maximum is refused whole; the writer stays usable.
#[test]
fn oversized_records_are_refused_on_the_writer_side() {
    let (_network, mut writer, mut gate) = one_to_one::<Vec<u8>>(64, 100, None);
    let error = writer.emit(&vec![0u8; 200], 0).unwrap_err();
    assert!(
        matches!(
            error,
            ExchangeError::RecordTooLarge {
                size: 204,
                max: 100
            }
        ),
        "{error}"
    );
    writer.emit(&vec![1u8; 10], 0).unwrap();
    writer.finish(0).unwrap();
    assert_eq!(
        gate.poll_next().unwrap(),
        Some(GateEvent::Record {
            value: vec![1u8; 10],
            channel: 0
        })
    );
    assert_eq!(gate.poll_next().unwrap(), Some(GateEvent::End));
}

/// Writing to a consumer that disconnected is an error naming the subpartition.
#[test]
fn a_disconnected_consumer_is_reported() {
    let (_network, mut writer, gate) = one_to_one::<u64>(64, 100, Some(Duration::ZERO));
    drop(gate);
    let error = writer.emit(&7, 0).unwrap_err();
    assert!(
        matches!(error, ExchangeError::ConsumerGone { subpartition: 0 }),
        "{error}"
    );
}

/// Bad wiring is a configuration error: channels too small for the pool.
#[test]
fn channels_must_hold_the_pool() {
    let network = NetworkBufferPool::new(8, 64).unwrap();
    let pool = LocalBufferPool::new(&network, LocalPoolConfig::new(4, 1)).unwrap();
    let (sender, _receiver) = local_channel(2, None);
    let error = ResultPartition::new(pool, vec![sender]).unwrap_err();
    assert!(
        error.to_string().contains("pool's size plus overdraft"),
        "{error}"
    );
}

/// Buffer timeout: a partly filled buffer is sent once the timeout passed, not before;
/// with no timeout it waits for an event.
#[test]
fn buffer_timeout_flushes_partial_buffers() {
    let (_network, mut writer, mut gate) =
        one_to_one::<u64>(4096, 100, Some(Duration::from_millis(100)));
    writer.emit(&1, 1_000).unwrap();
    writer.emit(&2, 50_000_000).unwrap();
    assert_eq!(writer.next_flush_deadline(), Some(100_001_000));
    writer.on_timer(100_000_000).unwrap();
    assert_eq!(gate.poll_next().unwrap(), None, "not yet");
    writer.on_timer(100_001_000).unwrap();
    assert_eq!(
        gate.poll_next().unwrap(),
        Some(GateEvent::Record {
            value: 1,
            channel: 0
        })
    );
    assert_eq!(
        gate.poll_next().unwrap(),
        Some(GateEvent::Record {
            value: 2,
            channel: 0
        })
    );
    assert_eq!(writer.next_flush_deadline(), None);
}

/// Waits for the pool's notification; a wait that ends by its safety timeout is a lost
/// wake-up (the writer armed the notification before parking) and fails the test.
fn park_for_recycle(parker: &Parker) {
    let wakeup = parker.park(Some(Duration::from_secs(10)), || false);
    assert_ne!(
        wakeup,
        Wakeup::TimedOut,
        "lost wake-up: no recycled buffer woke the writer"
    );
}

/// Two threads, a 4-segment pool of 64-byte segments: the writer is back-pressured
/// continually, parks until the reader recycles, and every record arrives once, in
/// order; the pool is whole afterwards.
#[test]
fn two_thread_stress_with_a_tiny_pool() {
    let records: u64 = if cfg!(miri) { 200 } else { 200_000 };
    let network = NetworkBufferPool::new(8, 64).unwrap();
    let parker = Parker::current();
    let config = LocalPoolConfig::new(4, 1)
        .with_max_per_subpartition(4)
        .with_overdraft(2);
    let pool = LocalBufferPool::with_notify(&network, config, parker.unparker()).unwrap();
    let (sender, receiver) = local_channel(8, None);
    let partition = ResultPartition::new(pool, vec![sender]).unwrap();
    let config = WriterConfig {
        max_record_size: 1024,
        buffer_timeout: Some(Duration::ZERO),
    };
    let mut writer: RecordWriter<(u64, Vec<u8>), Forward> =
        RecordWriter::new(partition, Forward, config).unwrap();
    let reader = std::thread::spawn(move || {
        let mut gate: InputGate<(u64, Vec<u8>)> = InputGate::new(vec![Box::new(receiver)]).unwrap();
        let mut expected = 0u64;
        loop {
            match gate.poll_next().unwrap() {
                Some(GateEvent::Record {
                    value: (seq, bytes),
                    ..
                }) => {
                    assert_eq!(seq, expected);
                    assert_eq!(bytes.len(), (seq % 150) as usize);
                    expected += 1;
                }
                Some(GateEvent::End) => return expected,
                Some(
                    GateEvent::Watermark(_)
                    | GateEvent::Barrier { .. }
                    | GateEvent::CheckpointAborted { .. },
                ) => {}
                None => std::thread::yield_now(),
            }
        }
    });
    let mut waits = 0u64;
    for seq in 0..records {
        while !writer.is_available() {
            if !writer.available_or_notify().unwrap() {
                waits += 1;
                park_for_recycle(&parker);
            }
            writer.resume(0).unwrap();
        }
        writer
            .emit(&(seq, vec![seq as u8; (seq % 150) as usize]), 0)
            .unwrap();
    }
    while !writer.resume(0).unwrap() {
        if !writer.available_or_notify().unwrap() {
            park_for_recycle(&parker);
        }
    }
    writer.finish(0).unwrap();
    while !writer.resume(0).unwrap() {
        if !writer.available_or_notify().unwrap() {
            park_for_recycle(&parker);
        }
    }
    assert_eq!(reader.join().unwrap(), records);
    assert!(
        waits > 0,
        "the pool never ran dry: no back-pressure was exercised"
    );
    drop(writer);
    network.assert_whole();
}

/// The gate's idle time runs from its first empty poll to the next poll that yields.
#[test]
fn gate_counts_idle_time() {
    let (_network, mut writer, mut gate) = one_to_one::<u64>(256, 100, Some(Duration::ZERO));
    assert_eq!(gate.poll_next_at(100).unwrap(), None);
    assert_eq!(gate.poll_next_at(200).unwrap(), None);
    writer.emit(&9, 300).unwrap();
    assert_eq!(
        gate.poll_next_at(350).unwrap(),
        Some(GateEvent::Record {
            value: 9,
            channel: 0
        })
    );
    assert_eq!(gate.metrics().idle_ns, 250);
    assert_eq!(gate.metrics().records_in, 1);
}

/// Buffer timeout 0: a record the writer finished in `resume`, after back-pressure, is
/// visible to the consumer at once, like any other record (no tail left behind).
#[test]
fn timeout_zero_flushes_a_record_finished_by_resume() {
    let network = NetworkBufferPool::new(8, 64).unwrap();
    let config = LocalPoolConfig::new(2, 1).with_overdraft(0);
    let pool = LocalBufferPool::new(&network, config).unwrap();
    let (sender, receiver) = local_channel(16, None);
    let partition = ResultPartition::new(pool, vec![sender]).unwrap();
    let writer_config = WriterConfig {
        max_record_size: 1_000,
        buffer_timeout: Some(Duration::ZERO),
    };
    let mut writer = RecordWriter::new(partition, Forward, writer_config).unwrap();
    let mut gate =
        InputGate::<Vec<u8>>::new(vec![Box::new(receiver) as Box<dyn InputChannel>]).unwrap();
    writer.emit(&vec![1u8; 10], 0).unwrap();
    // 158 bytes over 64-byte segments from a 2-segment pool: it goes pending.
    writer.emit(&vec![2u8; 150], 0).unwrap();
    assert!(writer.has_pending());
    let mut seen = Vec::new();
    while !writer.resume(0).unwrap() {
        while let Some(event) = gate.poll_next().unwrap() {
            seen.push(event);
        }
    }
    while let Some(event) = gate.poll_next().unwrap() {
        seen.push(event);
    }
    let lengths: Vec<usize> = seen
        .iter()
        .map(|e| match e {
            GateEvent::Record { value, .. } => value.len(),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(
        lengths,
        vec![10, 150],
        "the resumed record is visible at once"
    );
}

/// The buffer that ends a spanning record is recycled with that record: a writer at its
/// per-subpartition maximum is available again as soon as the record is read.
#[test]
fn the_buffer_ending_a_spanning_record_is_recycled_with_it() {
    let network = NetworkBufferPool::new(8, 64).unwrap();
    let config = LocalPoolConfig::new(4, 1)
        .with_max_per_subpartition(1)
        .with_overdraft(0);
    let pool = LocalBufferPool::new(&network, config).unwrap();
    let (sender, receiver) = local_channel(16, None);
    let partition = ResultPartition::new(pool, vec![sender]).unwrap();
    let mut writer = RecordWriter::new(partition, Forward, WriterConfig::default()).unwrap();
    let mut gate =
        InputGate::<Vec<u8>>::new(vec![Box::new(receiver) as Box<dyn InputChannel>]).unwrap();
    // 4 (frame length) + 4 (vector length) + 120 = 128 bytes: exactly two segments.
    writer.emit(&vec![3u8; 120], 0).unwrap();
    assert!(!writer.is_available(), "the subpartition is at its maximum");
    assert_eq!(
        gate.poll_next().unwrap(),
        Some(GateEvent::Record {
            value: vec![3u8; 120],
            channel: 0
        })
    );
    assert!(
        writer.is_available(),
        "both segments came back with the record"
    );
}

/// A record refused as too large, first into a fresh buffer, leaves nothing to send: a
/// flush after it sends no empty buffer.
#[test]
fn no_empty_buffer_is_ever_sent() {
    let (_network, mut writer, mut gate) = one_to_one::<Vec<u8>>(64, 100, None);
    assert!(writer.emit(&vec![0u8; 200], 0).is_err());
    writer.flush().unwrap();
    assert_eq!(gate.poll_next().unwrap(), None);
    assert_eq!(writer.metrics().partition.buffers_out, 0);
    assert_eq!(gate.metrics().buffers_in, 0);
    writer.emit(&vec![1u8; 10], 0).unwrap();
    writer.flush().unwrap();
    assert_eq!(
        gate.poll_next().unwrap(),
        Some(GateEvent::Record {
            value: vec![1u8; 10],
            channel: 0
        })
    );
    assert_eq!(gate.metrics().buffers_in, 1);
}

/// A channel that keeps writing records larger than its buffers gets one buffer per
/// turn, like any other (round robin at buffer granularity): a quiet channel's record,
/// published after the busy channel's first ten, is read before the busy channel's
/// second record, not after all of them.
#[test]
fn a_busy_channel_spanning_buffers_does_not_starve_a_quiet_one() {
    let network = NetworkBufferPool::new(64, 64).unwrap();
    let mut inputs: Vec<Box<dyn InputChannel>> = Vec::new();
    let mut writers = Vec::new();
    for _ in 0..2 {
        let pool = LocalBufferPool::new(&network, LocalPoolConfig::new(24, 1)).unwrap();
        let (sender, receiver) = local_channel(32, None);
        inputs.push(Box::new(receiver));
        let partition = ResultPartition::new(pool, vec![sender]).unwrap();
        let config = WriterConfig {
            max_record_size: 1024,
            buffer_timeout: Some(Duration::ZERO),
        };
        writers.push(RecordWriter::<Vec<u8>, Forward>::new(partition, Forward, config).unwrap());
    }
    let mut gate: InputGate<Vec<u8>> = InputGate::new(inputs).unwrap();
    // Channel 0: ten records of 100 bytes over 64-byte buffers, each straddling two or
    // three of them. Channel 1: one small record, written last.
    for i in 0..10u8 {
        writers[0].emit(&vec![i; 100], 0).unwrap();
    }
    writers[1].emit(&vec![0xee; 3], 0).unwrap();
    let mut order = Vec::new();
    while let Some(event) = gate.poll_next().unwrap() {
        if let GateEvent::Record { channel, .. } = event {
            order.push(channel);
        }
    }
    assert_eq!(order.len(), 11);
    let quiet = order.iter().position(|&c| c == 1).unwrap();
    assert!(
        quiet <= 1,
        "the quiet channel's record came after {quiet} of the busy channel's: {order:?}"
    );
}

/// The gate's in-flight figure is what its producers published and it has not read:
/// exact after each flush, per channel, and back to 0 once it has read everything.
#[test]
fn in_flight_bytes_are_what_was_published_and_not_yet_read() {
    let network = NetworkBufferPool::new(16, 256).unwrap();
    let pool = LocalBufferPool::new(&network, LocalPoolConfig::new(8, 2)).unwrap();
    let (first, first_rx) = local_channel(16, None);
    let (second, second_rx) = local_channel(16, None);
    let partition = ResultPartition::new(pool, vec![first, second]).unwrap();
    let config = WriterConfig {
        max_record_size: 1024,
        buffer_timeout: None,
    };
    let mut writer: RecordWriter<u64, RoundRobin> =
        RecordWriter::new(partition, RoundRobin::default(), config).unwrap();
    let mut gate: InputGate<u64> =
        InputGate::new(vec![Box::new(first_rx), Box::new(second_rx)]).unwrap();
    assert_eq!(gate.in_flight_bytes(), (0, 0));
    // Written but not flushed: not in flight yet.
    for n in 0..30u64 {
        writer.emit(&n, 0).unwrap();
    }
    assert_eq!(gate.in_flight_bytes(), (0, 0));
    writer.flush().unwrap();
    // 30 records of a 4-byte length and 8 bytes, 15 on each channel (round robin); the
    // 256-byte segments hold 21 each, so nothing spans a buffer.
    assert_eq!(gate.in_flight_bytes(), (360, 180));
    let mut read = 0;
    while read < 10 {
        if let Some(GateEvent::Record { .. }) = gate.poll_next().unwrap() {
            read += 1;
        }
    }
    let (total, fullest) = gate.in_flight_bytes();
    assert_eq!(total, 360 - 10 * 12, "{total}");
    assert_eq!(fullest, 180);
    while read < 30 {
        if let Some(GateEvent::Record { .. }) = gate.poll_next().unwrap() {
            read += 1;
        }
    }
    assert_eq!(gate.in_flight_bytes(), (0, 0));
}
