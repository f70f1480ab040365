//! Buffer debloating end to end on a manual clock: a writer back-pressured by a slow
//! reader fills its pool with full segments; once the gate has measured its throughput
//! it announces a smaller buffer size, the writer starts buffers of that size, and the
//! bytes in flight (written, not yet read) drop. Everything is driven by a simulated
//! clock, so nothing here depends on timing.

use std::time::Duration;

use weir_engine::exchange::codec::FixedBytes;
use weir_engine::exchange::{
    local_channel, DebloatConfig, Forward, GateEvent, InputChannel, InputGate, LocalBufferPool,
    LocalPoolConfig, NetworkBufferPool, RecordWriter, ResultPartition, WriterConfig,
};
use weir_engine::DebloatError;

const SEGMENT: usize = 4096;
const BUFFERS: usize = 8;
/// Bytes of one record on the wire: 4 of length prefix, 100 of payload.
const RECORD_BYTES: u64 = 104;
const TICK_NS: u64 = 10_000_000;

/// Runs `ticks` ticks of 10 ms: the writer writes until back-pressured, the reader reads
/// `per_tick` records. Returns the bytes in flight after each tick and the gate.
fn run(debloat: Option<DebloatConfig>, ticks: u64, per_tick: usize) -> (Vec<u64>, u64, usize) {
    let network = NetworkBufferPool::new(2 * BUFFERS + 8, SEGMENT).unwrap();
    let config = LocalPoolConfig::new(BUFFERS, 1).with_max_per_subpartition(BUFFERS);
    let pool = LocalBufferPool::new(&network, config).unwrap();
    let (sender, receiver) = local_channel(BUFFERS + 8, None);
    let partition = ResultPartition::new(pool, vec![sender]).unwrap();
    let config = WriterConfig {
        buffer_timeout: Some(Duration::from_millis(100)),
        ..WriterConfig::default()
    };
    let mut writer = RecordWriter::new(partition, Forward, config).unwrap();
    let mut gate: InputGate<FixedBytes<100>> =
        InputGate::new(vec![Box::new(receiver) as Box<dyn InputChannel>]).unwrap();
    if let Some(config) = debloat {
        gate.set_debloat(config).unwrap();
    }
    let record = FixedBytes([5u8; 100]);
    let mut read = 0u64;
    let mut in_flight = Vec::new();
    for tick in 0..ticks {
        let now = tick * TICK_NS;
        while writer.poll_ready(now).unwrap() {
            writer.emit(&record, now).unwrap();
        }
        writer.on_timer(now).unwrap();
        for _ in 0..per_tick {
            match gate.poll_next_at(now).unwrap() {
                Some(GateEvent::Record { value, .. }) => {
                    assert_eq!(value, record);
                    read += 1;
                }
                Some(other) => panic!("unexpected {other:?}"),
                None => break,
            }
        }
        let written = writer.metrics().partition.bytes_out;
        in_flight.push(written - read * RECORD_BYTES);
    }
    let announced = writer.partition().announced_buffer_size(0);
    (in_flight, gate.metrics().announced_buffer_size, announced)
}

/// Debloating config for the test: 10 records per 10 ms = 104 kB/s, target 100 ms over
/// 8 buffers: 1300 bytes per buffer (no smoothing, so it settles within a period).
fn debloat() -> DebloatConfig {
    DebloatConfig {
        target: Duration::from_millis(100),
        period: Duration::from_millis(50),
        samples: 1,
        min_size: 256,
        max_size: SEGMENT,
        // Producers start with full segments, so that the shrinking shows.
        starting_size: SEGMENT,
        threshold_percent: 25,
        buffers_per_channel: BUFFERS,
    }
}

#[test]
fn back_pressure_shrinks_buffers_and_in_flight_bytes() {
    let ticks = 300;
    let (without, not_announced, writer_saw_none) = run(None, ticks, 10);
    assert_eq!((not_announced, writer_saw_none), (0, 0));
    let (with, announced, writer_saw) = run(Some(debloat()), ticks, 10);
    assert_eq!(announced, 1300, "104 kB/s × 100 ms ÷ 8 buffers");
    assert_eq!(writer_saw, 1300, "the writer reads the announcement");
    // Both start with the pool full of full segments (the last one being written).
    assert_eq!(with[0], without[0]);
    assert!(without[0] >= 6 * SEGMENT as u64);
    // Without debloating the pool stays nearly full of full segments; with it, once
    // those have drained, at most 8 buffers of 1300 bytes are in flight.
    let last_without = *without.last().unwrap();
    let last_with = *with.last().unwrap();
    assert!(last_without >= 5 * SEGMENT as u64);
    assert!(
        last_with <= BUFFERS as u64 * 1300,
        "in flight {last_with} bytes with debloating, {last_without} without"
    );
}

/// A gate refuses bad debloating settings with a typed error.
#[test]
fn bad_debloat_settings_are_refused() {
    let (_sender, receiver) = local_channel(4, None);
    let mut gate: InputGate<u64> =
        InputGate::new(vec![Box::new(receiver) as Box<dyn InputChannel>]).unwrap();
    let error = gate
        .set_debloat(DebloatConfig {
            target: Duration::ZERO,
            ..debloat()
        })
        .unwrap_err();
    assert_eq!(error, DebloatError::ZeroTarget);
    let error = gate
        .set_debloat(DebloatConfig {
            min_size: SEGMENT + 1,
            ..debloat()
        })
        .unwrap_err();
    assert!(matches!(error, DebloatError::MinAboveMax { .. }), "{error}");
    assert!(gate.debloater().is_none());
}
