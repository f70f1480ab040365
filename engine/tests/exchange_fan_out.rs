//! No fan-out and no pool size deadlocks a result partition.
//!
//! A buffer being written holds its segment until it is full or ended. With a buffer
//! open on every subpartition and no segment free, a writer that waits for a recycled
//! segment would wait forever: the readers have read everything published, and nothing
//! else returns a segment. These tests drive a writer as a task does (it takes its next
//! record only when [`RecordWriter::poll_ready`] says so, and otherwise lets its readers
//! run) over every fan-out, pool size, per-subpartition maximum, overdraft, buffer
//! timeout and record size, and fail when the writer cannot go on after its readers
//! have read everything they can: a deadlock, found in a bounded number of rounds
//! rather than as a hang.

use std::time::Duration;

use proptest::prelude::*;
use weir_engine::exchange::{
    local_channel, GateEvent, InputGate, LocalBufferPool, LocalPoolConfig, NetworkBufferPool,
    RecordWriter, ResultPartition, WriterConfig,
};

#[path = "support/records.rs"]
mod records;

use records::{ByTarget, Rec};

struct Settings {
    fan_out: usize,
    /// Segments beyond one per subpartition (the least a pool may have).
    spare: usize,
    max_per_subpartition: usize,
    overdraft: usize,
    segment_size: usize,
    timeout: Option<Duration>,
}

struct Exchange {
    network: NetworkBufferPool,
    writer: RecordWriter<Rec, ByTarget>,
    /// One reader per subpartition.
    gates: Vec<InputGate<Rec>>,
    /// Per subpartition: the records read, in order.
    read: Vec<Vec<Rec>>,
    ended: Vec<bool>,
}

impl Exchange {
    fn new(s: &Settings) -> Self {
        let size = s.fan_out + s.spare;
        let network = NetworkBufferPool::new(size + s.overdraft + 1, s.segment_size).unwrap();
        let config = LocalPoolConfig::new(size, s.fan_out)
            .with_max_per_subpartition(s.max_per_subpartition)
            .with_overdraft(s.overdraft);
        let pool = LocalBufferPool::new(&network, config).unwrap();
        let mut senders = Vec::new();
        let mut gates = Vec::new();
        for _ in 0..s.fan_out {
            let (sender, receiver) = local_channel(size + s.overdraft, None);
            senders.push(sender);
            gates.push(InputGate::new(vec![Box::new(receiver) as _]).unwrap());
        }
        let partition = ResultPartition::new(pool, senders).unwrap();
        let config = WriterConfig {
            max_record_size: 1 << 20,
            buffer_timeout: s.timeout,
        };
        Exchange {
            network,
            writer: RecordWriter::new(partition, ByTarget::default(), config).unwrap(),
            gates,
            read: vec![Vec::new(); s.fan_out],
            ended: vec![false; s.fan_out],
        }
    }

    /// Lets every reader read all it can (its task running to idle); returns the
    /// records read.
    fn drain(&mut self) -> usize {
        let mut count = 0;
        for (sub, gate) in self.gates.iter_mut().enumerate() {
            while let Some(event) = gate.poll_next().unwrap() {
                match event {
                    GateEvent::Record { value, .. } => {
                        self.read[sub].push(value);
                        count += 1;
                    }
                    GateEvent::Watermark(_)
                    | GateEvent::Barrier { .. }
                    | GateEvent::CheckpointAborted { .. } => {}
                    GateEvent::End => {
                        assert!(!self.ended[sub], "end of partition twice");
                        self.ended[sub] = true;
                    }
                }
            }
        }
        count
    }

    /// Bytes and buffers the readers have taken so far.
    fn progress(&self) -> (u64, u64) {
        self.gates.iter().fold((0, 0), |(bytes, buffers), gate| {
            let m = gate.metrics();
            (bytes + m.bytes_in, buffers + m.buffers_in)
        })
    }

    /// Waits as a task does until `ready` (a step of the writer that arms the pool's
    /// notification when it says no) says yes, letting the readers run in between.
    /// After the readers have read everything, every ended buffer is back; a writer that
    /// says no twice in a row with nothing new for its readers in between never will go
    /// on: a deadlock. (A record spanning many segments of a small pool takes many
    /// rounds, each giving the readers a buffer.)
    fn wait_until(
        &mut self,
        mut ready: impl FnMut(&mut RecordWriter<Rec, ByTarget>) -> bool,
        what: &str,
    ) {
        let mut stalled = 0;
        while !ready(&mut self.writer) {
            let before = self.progress();
            self.drain();
            if self.progress() == before {
                stalled += 1;
            } else {
                stalled = 0;
            }
            assert!(
                stalled < 2,
                "deadlock while {what}: the readers read everything and no segment came back \
                 ({} segments lent, {} buffers open)",
                self.writer.partition().pool().in_use(),
                self.writer.partition().open_buffers(),
            );
        }
    }
}

fn run(s: &Settings, records: &[(u32, usize)]) -> (u64, Exchange) {
    let mut x = Exchange::new(s);
    let mut now = 0;
    for (seq, &(target, len)) in records.iter().enumerate() {
        now += 10;
        x.wait_until(|w| w.poll_ready(now).unwrap(), "taking a record");
        let record = Rec {
            target: target % s.fan_out as u32,
            seq: seq as u64,
            payload: vec![seq as u8; len],
        };
        x.writer.emit(&record, now).unwrap();
        x.writer.on_timer(now).unwrap();
    }
    x.wait_until(|w| w.poll_ready(now).unwrap(), "before the end");
    x.writer.finish(now).unwrap();
    x.wait_until(|w| w.poll_pending(now).unwrap(), "ending the partition");
    x.drain();
    assert!(x.ended.iter().all(|&e| e), "every reader sees the end");
    // Every record exactly once, in order, intact, at the subpartition it was sent to.
    let mut expected = vec![Vec::new(); s.fan_out];
    for (seq, &(target, len)) in records.iter().enumerate() {
        expected[target as usize % s.fan_out].push(Rec {
            target: target % s.fan_out as u32,
            seq: seq as u64,
            payload: vec![seq as u8; len],
        });
    }
    assert_eq!(x.read, expected);
    let releases = x.writer.metrics().partition.stuck_releases;
    (releases, x)
}

/// The case that hung: a pool of exactly one segment per subpartition (64 of them, as
/// an exchange to 64 subtasks once sized it), a small record to every subpartition so
/// each holds a buffer being written, and no buffer timeout. The writer ends those
/// buffers instead of waiting for a segment that nothing returns.
#[test]
fn a_buffer_open_on_every_subpartition_does_not_deadlock() {
    let settings = Settings {
        fan_out: 64,
        spare: 0,
        max_per_subpartition: 10,
        overdraft: 5,
        segment_size: 1024,
        timeout: None,
    };
    let count = if cfg!(miri) { 200 } else { 1000 };
    let records: Vec<(u32, usize)> = (0..count).map(|i| (i % 64, 16)).collect();
    let (releases, x) = run(&settings, &records);
    assert!(
        releases > 0,
        "the pool never ran dry: the case was not exercised"
    );
    drop(x.writer);
    drop(x.gates);
    x.network.assert_whole();
}

/// With one segment more than subpartitions (how an exchange sizes its pools), the
/// pool never needs rescuing: the spare segment always lets the writer go on.
#[test]
fn one_spare_segment_never_needs_a_rescue() {
    let settings = Settings {
        fan_out: 64,
        spare: 1,
        max_per_subpartition: 10,
        overdraft: 5,
        segment_size: 1024,
        timeout: None,
    };
    let count = if cfg!(miri) { 300 } else { 5000 };
    let records: Vec<(u32, usize)> = (0..count).map(|i| ((i * 7) % 64, 16)).collect();
    let (releases, _) = run(&settings, &records);
    assert_eq!(releases, 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Any fan-out × pool size × per-subpartition maximum × overdraft × buffer timeout
    /// × record sizes (empty to several segments): every record arrives once, in order,
    /// and the pool is whole at the end.
    #[test]
    fn no_fan_out_or_pool_size_deadlocks(
        fan_out in prop_oneof![1usize..8, 60usize..70, Just(128), Just(200)],
        spare in 0usize..3,
        max_per_subpartition in prop_oneof![Just(1usize), Just(2), Just(4), Just(10)],
        overdraft in 0usize..3,
        segment_size in prop_oneof![Just(64usize), Just(256), Just(1024)],
        timeout in prop_oneof![Just(None), Just(Some(Duration::ZERO)), Just(Some(Duration::from_nanos(25)))],
        records in prop::collection::vec(
            (0u32..256, prop_oneof![4 => 0usize..16, 2 => 16usize..200, 1 => 200usize..3000]),
            0..400,
        ),
    ) {
        let settings = Settings { fan_out, spare, max_per_subpartition, overdraft, segment_size, timeout };
        let (_, x) = run(&settings, &records);
        drop(x.writer);
        drop(x.gates);
        x.network.assert_whole();
    }
}
