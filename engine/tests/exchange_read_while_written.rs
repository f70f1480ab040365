//! Buffers read while they are written: a consumer reads what a flush published from
//! the buffer the writer is still filling, and a flush does not cut the buffer.
//!
//! - In lock step at buffer timeout 0, a subpartition never holds more than two
//!   segments (the gauge `segments_per_channel_peak` and `segments_in_use` say so).
//! - Stress: several writer threads, each to its own reader thread (unicast at timeout
//!   0, broadcast to two readers with flushes every few records), records of random
//!   sizes that span buffers; every record arrives once, intact, in order, and every
//!   segment comes home.

use std::time::Duration;

use weir_engine::exchange::{
    local_channel, Broadcast, ChannelSelector, Forward, GateEvent, InputChannel, InputGate,
    LocalBufferPool, LocalPoolConfig, NetworkBufferPool, RecordWriter, ResultPartition,
    WriterConfig,
};
use weir_engine::park::Parker;

/// A record of `seq % 300` bytes, each derived from `seq`, so a torn or stale read
/// shows up as a wrong byte.
fn record(seq: u64) -> (u64, Vec<u8>) {
    let len = (seq.wrapping_mul(2_654_435_761) % 300) as usize;
    (seq, (0..len).map(|i| (seq as usize + i) as u8).collect())
}

/// Timeout 0, the reader reading everything after each record: the flush publishes
/// into the same buffer (one buffer handed to the channel per segment, not per record),
/// and the subpartition holds at most two segments.
#[test]
fn lock_step_at_timeout_zero_holds_two_segments() {
    let network = NetworkBufferPool::new(16, 1024).unwrap();
    let pool = LocalBufferPool::new(&network, LocalPoolConfig::new(8, 1)).unwrap();
    let (sender, receiver) = local_channel(16, None);
    let partition = ResultPartition::new(pool, vec![sender]).unwrap();
    let config = WriterConfig {
        max_record_size: 1024,
        buffer_timeout: Some(Duration::ZERO),
    };
    let mut writer = RecordWriter::new(partition, Forward, config).unwrap();
    let mut gate: InputGate<(u64, Vec<u8>)> =
        InputGate::new(vec![Box::new(receiver) as Box<dyn InputChannel>]).unwrap();
    let records = 2_000;
    for seq in 0..records {
        writer.emit(&record(seq), 0).unwrap();
        match gate.poll_next().unwrap() {
            Some(GateEvent::Record { value, .. }) => assert_eq!(value, record(seq)),
            other => panic!("record {seq} not visible at once: {other:?}"),
        }
        assert!(writer.partition().segments_in_use(0) <= 2);
    }
    let metrics = writer.metrics().partition;
    // One publication per record, and one more for each buffer a record filled.
    assert!(metrics.publishes >= records, "{metrics:?}");
    assert!(
        metrics.buffers_out < records / 4,
        "a flush cut the buffer: {} buffers for {records} records",
        metrics.buffers_out
    );
    assert!(metrics.segments_per_channel_peak <= 2, "{metrics:?}");
    writer.finish(0).unwrap();
    assert_eq!(gate.poll_next().unwrap(), Some(GateEvent::End));
    drop((writer, gate));
    network.assert_whole();
}

/// Reads `expected` records and the end from `gate`, checking order and bytes.
fn read_all(mut gate: InputGate<(u64, Vec<u8>)>, expected: u64) {
    let mut next = 0;
    loop {
        match gate.poll_next().unwrap() {
            Some(GateEvent::Record { value, .. }) => {
                assert_eq!(value, record(next), "record {next} torn or out of order");
                next += 1;
            }
            Some(GateEvent::End) => break,
            Some(
                GateEvent::Watermark(_)
                | GateEvent::Barrier { .. }
                | GateEvent::CheckpointAborted { .. },
            ) => {}
            None => std::thread::yield_now(),
        }
    }
    assert_eq!(next, expected, "records lost");
}

/// Emits `records` records, parking while the pool is dry, flushing every
/// `flush_every` records, then finishes.
fn write_all<S: ChannelSelector<(u64, Vec<u8>)>>(
    mut writer: RecordWriter<(u64, Vec<u8>), S>,
    parker: &Parker,
    records: u64,
    flush_every: u64,
) {
    let wait = |writer: &mut RecordWriter<(u64, Vec<u8>), S>| {
        while !writer.poll_ready(0).unwrap() {
            parker.park(Some(Duration::from_millis(10)), || false);
        }
    };
    for seq in 0..records {
        wait(&mut writer);
        writer.emit(&record(seq), 0).unwrap();
        if seq % flush_every == 0 {
            writer.flush().unwrap();
        }
    }
    wait(&mut writer);
    writer.finish(0).unwrap();
    while !writer.resume(0).unwrap() {
        wait(&mut writer);
    }
}

/// Four unicast pairs at timeout 0 and a broadcast to two readers, all at once, on
/// small segments (records span them) and small pools (the writers are back-pressured).
#[test]
fn many_writers_and_readers_lose_nothing() {
    let records: u64 = if cfg!(miri) { 60 } else { 50_000 };
    let network = NetworkBufferPool::new(64, 256).unwrap();
    let mut threads = Vec::new();
    for _ in 0..4 {
        let network = network.clone();
        let (sender, receiver) = local_channel(8, None);
        threads.push(std::thread::spawn(move || {
            let gate = InputGate::new(vec![Box::new(receiver) as Box<dyn InputChannel>]).unwrap();
            read_all(gate, records);
        }));
        threads.push(std::thread::spawn(move || {
            let parker = Parker::current();
            let config = LocalPoolConfig::new(4, 1).with_overdraft(2);
            let pool = LocalBufferPool::with_notify(&network, config, parker.unparker()).unwrap();
            let partition = ResultPartition::new(pool, vec![sender]).unwrap();
            let config = WriterConfig {
                max_record_size: 1024,
                buffer_timeout: Some(Duration::ZERO),
            };
            let writer = RecordWriter::new(partition, Forward, config).unwrap();
            write_all(writer, &parker, records, u64::MAX);
        }));
    }
    let (sender_a, receiver_a) = local_channel(8, None);
    let (sender_b, receiver_b) = local_channel(8, None);
    for receiver in [receiver_a, receiver_b] {
        threads.push(std::thread::spawn(move || {
            let gate = InputGate::new(vec![Box::new(receiver) as Box<dyn InputChannel>]).unwrap();
            read_all(gate, records);
        }));
    }
    let broadcast_network = network.clone();
    threads.push(std::thread::spawn(move || {
        let parker = Parker::current();
        let config = LocalPoolConfig::new(4, 2).with_overdraft(2);
        let pool =
            LocalBufferPool::with_notify(&broadcast_network, config, parker.unparker()).unwrap();
        let partition = ResultPartition::new(pool, vec![sender_a, sender_b]).unwrap();
        let config = WriterConfig {
            max_record_size: 1024,
            buffer_timeout: None,
        };
        let writer = RecordWriter::new(partition, Broadcast, config).unwrap();
        write_all(writer, &parker, records, 7);
    }));
    for thread in threads {
        thread.join().unwrap();
    }
    network.assert_whole();
}
