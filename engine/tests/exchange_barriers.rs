//! Checkpoint barriers through an input gate of three channels, each fed by its own
//! writer: aligned (records behind a barrier held back until every channel's barrier
//! came), unaligned (the first barrier yields the checkpoint at once; what the other
//! channels still bring before their barrier is recorded and replayed in order on
//! restore), aligned with a timeout, and a barrier that overtakes an alignment.

use std::time::Duration;

use weir_engine::checkpoint::AlignmentMode;
use weir_engine::exchange::{
    local_channel, Forward, GateEvent, InputChannel, InputGate, LocalBufferPool, LocalPoolConfig,
    NetworkBufferPool, RecordWriter, ResultPartition, WriterConfig,
};

type Writer = RecordWriter<u64, Forward>;

/// Three writers, one per channel of a gate; every record and event visible at once.
fn three_channels(mode: AlignmentMode) -> (Vec<Writer>, InputGate<u64>, NetworkBufferPool) {
    let network = NetworkBufferPool::new(64, 256).unwrap();
    let mut writers = Vec::new();
    let mut channels: Vec<Box<dyn InputChannel>> = Vec::new();
    for _ in 0..3 {
        let pool = LocalBufferPool::new(&network, LocalPoolConfig::new(8, 1)).unwrap();
        let (sender, receiver) = local_channel(16, None);
        let partition = ResultPartition::new(pool, vec![sender]).unwrap();
        let config = WriterConfig {
            max_record_size: 64,
            buffer_timeout: Some(Duration::ZERO),
        };
        writers.push(RecordWriter::new(partition, Forward, config).unwrap());
        channels.push(Box::new(receiver));
    }
    let mut gate = InputGate::new(channels).unwrap();
    gate.set_alignment(mode);
    (writers, gate, network)
}

/// Everything the gate yields now.
fn drain(gate: &mut InputGate<u64>, now_ns: u64) -> Vec<GateEvent<u64>> {
    let mut out = Vec::new();
    while let Some(event) = gate.poll_next_at(now_ns).unwrap() {
        out.push(event);
    }
    out
}

fn records(events: &[GateEvent<u64>]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match e {
            GateEvent::Record { value, .. } => Some(*value),
            _ => None,
        })
        .collect()
}

fn barrier_at(events: &[GateEvent<u64>]) -> Option<usize> {
    events
        .iter()
        .position(|e| matches!(e, GateEvent::Barrier { .. }))
}

#[test]
fn aligned_holds_back_records_behind_a_barrier_until_every_channel_delivered_it() {
    let (mut writers, mut gate, _network) = three_channels(AlignmentMode::Aligned);
    // Channel 0: 1, barrier, 101; channel 1: 2, barrier, 102; channel 2: 3.
    writers[0].emit(&1, 0).unwrap();
    writers[0].emit_barrier(7, 0).unwrap();
    writers[0].emit(&101, 0).unwrap();
    writers[1].emit(&2, 0).unwrap();
    writers[1].emit_barrier(7, 0).unwrap();
    writers[1].emit(&102, 0).unwrap();
    writers[2].emit(&3, 0).unwrap();
    let events = drain(&mut gate, 10);
    let mut seen = records(&events);
    seen.sort_unstable();
    // Nothing after a barrier, and no checkpoint yet: channel 2's barrier is missing.
    assert_eq!(seen, [1, 2, 3]);
    assert_eq!(barrier_at(&events), None);
    writers[2].emit_barrier(7, 0).unwrap();
    writers[2].emit(&103, 0).unwrap();
    let events = drain(&mut gate, 30);
    assert_eq!(
        events[0],
        GateEvent::Barrier {
            id: 7,
            alignment: Duration::from_nanos(20),
            unaligned: false
        }
    );
    let mut after = records(&events[1..]);
    after.sort_unstable();
    assert_eq!(after, [101, 102, 103]);
    assert_eq!(gate.take_channel_state(), None);
}

#[test]
fn unaligned_snapshots_at_the_first_barrier_and_records_what_was_in_flight() {
    let (mut writers, mut gate, _network) = three_channels(AlignmentMode::Unaligned);
    writers[0].emit_barrier(3, 0).unwrap();
    writers[0].emit(&100, 0).unwrap();
    let events = drain(&mut gate, 0);
    assert!(matches!(
        events[0],
        GateEvent::Barrier {
            id: 3,
            unaligned: true,
            ..
        }
    ));
    // Channel 0's record came after its barrier: processed, not recorded.
    assert_eq!(records(&events), [100]);
    // In flight on channels 1 and 2 before their barriers: processed and recorded.
    writers[1].emit(&11, 0).unwrap();
    writers[1].emit(&12, 0).unwrap();
    writers[2].emit(&21, 0).unwrap();
    writers[1].emit_barrier(3, 0).unwrap();
    writers[1].emit(&13, 0).unwrap();
    let events = drain(&mut gate, 0);
    let mut seen = records(&events);
    seen.sort_unstable();
    assert_eq!(seen, [11, 12, 13, 21]);
    assert_eq!(
        gate.take_channel_state(),
        None,
        "channel 2's barrier is missing"
    );
    writers[2].emit(&22, 0).unwrap();
    writers[2].emit_barrier(3, 0).unwrap();
    writers[2].emit(&23, 0).unwrap();
    assert_eq!(records(&drain(&mut gate, 0)), [22, 23]);
    let (id, state) = gate.take_channel_state().expect("whole");
    assert_eq!(id, 3);
    // Restored: the recorded records first, each channel's in its order, then new input.
    let (mut writers, mut restored, _network) = three_channels(AlignmentMode::Unaligned);
    restored.restore_channel_state(&state).unwrap();
    writers[0].emit(&999, 0).unwrap();
    let replayed = records(&drain(&mut restored, 0));
    assert_eq!(replayed.len(), 5);
    assert_eq!(*replayed.last().unwrap(), 999);
    let ones: Vec<u64> = replayed.iter().copied().filter(|v| *v / 10 == 1).collect();
    let twos: Vec<u64> = replayed.iter().copied().filter(|v| *v / 10 == 2).collect();
    assert_eq!(ones, [11, 12]);
    assert_eq!(twos, [21, 22]);
}

#[test]
fn an_alignment_that_times_out_switches_to_unaligned() {
    let timeout = Duration::from_millis(5);
    let (mut writers, mut gate, _network) =
        three_channels(AlignmentMode::AlignedWithTimeout(timeout));
    writers[0].emit_barrier(1, 0).unwrap();
    writers[0].emit(&100, 0).unwrap();
    writers[1].emit(&10, 0).unwrap();
    let events = drain(&mut gate, 0);
    assert_eq!(
        records(&events),
        [10],
        "channel 0 is blocked while aligning"
    );
    assert_eq!(gate.alignment_deadline(), Some(5_000_000));
    // Past the timeout: the checkpoint is taken unaligned and channel 0 is read again.
    let events = drain(&mut gate, 5_000_000);
    assert!(matches!(
        events[0],
        GateEvent::Barrier {
            id: 1,
            unaligned: true,
            ..
        }
    ));
    assert_eq!(records(&events), [100]);
    writers[1].emit(&11, 0).unwrap();
    writers[1].emit_barrier(1, 0).unwrap();
    writers[2].emit_barrier(1, 0).unwrap();
    assert_eq!(records(&drain(&mut gate, 5_000_001)), [11]);
    let (id, state) = gate.take_channel_state().expect("whole");
    assert_eq!(id, 1);
    let (_writers, mut restored, _network) = three_channels(AlignmentMode::Aligned);
    restored.restore_channel_state(&state).unwrap();
    // Channel 1's 10 was read before the switch; only 11 was in flight after it.
    assert_eq!(records(&drain(&mut restored, 0)), [11]);
}

#[test]
fn a_newer_barrier_aborts_an_alignment_in_progress() {
    let (mut writers, mut gate, _network) = three_channels(AlignmentMode::Aligned);
    writers[0].emit_barrier(1, 0).unwrap();
    writers[1].emit_barrier(2, 0).unwrap();
    let events = drain(&mut gate, 0);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, GateEvent::CheckpointAborted { id: 1, .. })),
        "{events:?}"
    );
    writers[0].emit_barrier(2, 0).unwrap();
    writers[2].emit_barrier(2, 0).unwrap();
    let events = drain(&mut gate, 0);
    assert!(matches!(events[0], GateEvent::Barrier { id: 2, .. }));
}

#[test]
fn an_ended_channel_counts_as_delivering_every_barrier() {
    let (mut writers, mut gate, _network) = three_channels(AlignmentMode::Aligned);
    writers[2].finish(0).unwrap();
    writers[0].emit_barrier(4, 0).unwrap();
    writers[1].emit_barrier(4, 0).unwrap();
    let events = drain(&mut gate, 0);
    assert!(
        matches!(events[0], GateEvent::Barrier { id: 4, .. }),
        "{events:?}"
    );
}

#[test]
fn a_torn_channel_state_is_refused() {
    let (_, mut gate, _network) = three_channels(AlignmentMode::Unaligned);
    let error = gate.restore_channel_state(&[8, 0, 0, 0, 1, 2]).unwrap_err();
    assert!(error.to_string().contains("cut off"), "{error}");
}

#[test]
fn an_announced_barrier_overtakes_the_queued_data_which_becomes_channel_state() {
    let (mut writers, mut gate, _network) = three_channels(AlignmentMode::Unaligned);
    // Channel 0 has a backlog in front of its barrier; the barrier is announced ahead.
    for n in 0..200 {
        writers[0].emit(&n, 0).unwrap();
    }
    writers[0].announce_barrier(9);
    writers[0].emit_barrier(9, 0).unwrap();
    writers[0].emit(&1000, 0).unwrap();
    writers[1].emit(&2000, 0).unwrap();
    // The checkpoint is taken before a single record of the backlog is yielded.
    let first = gate.poll_next_at(0).unwrap();
    assert!(
        matches!(
            first,
            Some(GateEvent::Barrier {
                id: 9,
                unaligned: true,
                ..
            })
        ),
        "{first:?}"
    );
    let events = drain(&mut gate, 0);
    let seen = records(&events);
    // The backlog, in order, ahead of what came after the barrier.
    assert_eq!(&seen[..200], (0..200).collect::<Vec<u64>>().as_slice());
    assert!(seen.contains(&1000) && seen.contains(&2000));
    // Channels 1 and 2 are recorded until their barriers come in band.
    assert_eq!(gate.take_channel_state(), None);
    writers[1].emit_barrier(9, 0).unwrap();
    writers[2].emit(&3000, 0).unwrap();
    writers[2].announce_barrier(9);
    writers[2].emit_barrier(9, 0).unwrap();
    assert_eq!(records(&drain(&mut gate, 0)), [3000]);
    let (id, state) = gate.take_channel_state().expect("whole");
    assert_eq!(id, 9);
    let (_writers, mut restored, _network) = three_channels(AlignmentMode::Unaligned);
    restored.restore_channel_state(&state).unwrap();
    let mut replayed = records(&drain(&mut restored, 0));
    replayed.sort_unstable();
    let mut expected: Vec<u64> = (0..200).collect();
    expected.extend([2000, 3000]);
    assert_eq!(replayed, expected);
}

#[test]
fn records_held_after_a_read_ahead_belong_to_the_next_checkpoint_too() {
    let (mut writers, mut gate, _network) = three_channels(AlignmentMode::Unaligned);
    for n in 0..100 {
        writers[0].emit(&n, 0).unwrap();
    }
    writers[0].announce_barrier(1);
    writers[0].emit_barrier(1, 0).unwrap();
    for w in &mut writers[1..] {
        w.announce_barrier(1);
        w.emit_barrier(1, 0).unwrap();
    }
    // Checkpoint 1 is taken and the backlog read ahead; only 10 records are given on.
    assert!(matches!(
        gate.poll_next_at(0).unwrap(),
        Some(GateEvent::Barrier { id: 1, .. })
    ));
    let mut given = Vec::new();
    while given.len() < 10 {
        if let Some(GateEvent::Record { value, .. }) = gate.poll_next_at(0).unwrap() {
            given.push(value);
        }
    }
    let (id, _) = gate.take_channel_state().expect("checkpoint 1 whole");
    assert_eq!(id, 1);
    // Checkpoint 2 overtakes the records still held: they are its channel state.
    for w in &mut writers {
        w.announce_barrier(2);
        w.emit_barrier(2, 0).unwrap();
    }
    let mut rest = Vec::new();
    let mut barrier_at = None;
    for _ in 0..500 {
        match gate.poll_next_at(0).unwrap() {
            Some(GateEvent::Barrier { id: 2, .. }) => barrier_at = Some(rest.len()),
            Some(GateEvent::Record { value, .. }) => rest.push(value),
            _ => {}
        }
    }
    // Announcements are looked at every few polls: checkpoint 2 comes within them.
    let at = barrier_at.expect("checkpoint 2 taken");
    assert!(at < 40, "{at}");
    assert_eq!(rest, (10..100).collect::<Vec<u64>>());
    let (id, state) = gate.take_channel_state().expect("checkpoint 2 whole");
    assert_eq!(id, 2);
    // Every record given after checkpoint 2's snapshot is in its channel state.
    let (_writers, mut restored, _network) = three_channels(AlignmentMode::Unaligned);
    restored.restore_channel_state(&state).unwrap();
    assert_eq!(records(&drain(&mut restored, 0)), rest[at..].to_vec());
}

#[test]
fn reading_ahead_to_a_channel_s_end_does_not_read_past_it() {
    let (mut writers, mut gate, _network) = three_channels(AlignmentMode::Unaligned);
    writers[1].emit_barrier(5, 0).unwrap();
    writers[2].emit_barrier(5, 0).unwrap();
    writers[0].emit(&7, 0).unwrap();
    writers[0].announce_barrier(5);
    let mut writers = writers.into_iter();
    let mut first = writers.next().unwrap();
    first.finish(0).unwrap();
    drop(first);
    // Channel 0 ends before its barrier: read ahead to its end, which counts as the
    // barrier; its producer being gone is no error.
    let events: Vec<_> = (0..20)
        .filter_map(|_| gate.poll_next_at(0).unwrap())
        .collect();
    assert!(events
        .iter()
        .any(|e| matches!(e, GateEvent::Barrier { id: 5, .. })));
    assert_eq!(records(&events), [7]);
    let (id, state) = gate.take_channel_state().expect("whole");
    assert_eq!(id, 5);
    assert!(!state.is_empty());
}
