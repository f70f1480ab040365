//! The batch paths of the exchange give exactly what the per-record paths give.
//!
//! [`RecordWriter::emit_run`] must write, byte for byte, what [`RecordWriter::emit`]
//! writes for the same records, and [`InputGate::poll_run`] (and its in-place form,
//! [`InputGate::poll_run_in_place`]) must yield the records,
//! watermarks, barriers, channel state and end that [`InputGate::poll_next`] yields,
//! at the same positions. For random writers, fan-outs, segment sizes (records of up to
//! several segments), record sizes, run boundaries, run lengths at the reader, event
//! positions and alignment modes:
//!
//! - with a pool large enough that nothing waits, the writers write everything and
//!   then the readers read it all, once per record and once in runs: the readers'
//!   outputs must be identical, event for event;
//! - with a small pool, writers and readers take turns as tasks do (a writer that
//!   cannot go on lets the readers run): each channel's records arrive complete and
//!   in order on both paths, every checkpoint's barrier reaches the task, and the end
//!   arrives.

use proptest::prelude::*;
use weir_engine::checkpoint::AlignmentMode;
use weir_engine::exchange::{
    local_channel, GateEvent, GateRun, InputChannel, InputGate, LocalBufferPool, LocalPoolConfig,
    NetworkBufferPool, RecordWriter, ResultPartition, WriterConfig,
};

#[path = "support/records.rs"]
mod records;

use records::{ByTarget, Rec};

/// One step of the writers' script.
#[derive(Debug, Clone)]
enum Step {
    /// Writer `.0` writes these records, in runs of the given lengths (cycled).
    Records(usize, Vec<Rec>, Vec<usize>),
    /// Writer `.0` broadcasts a watermark.
    Watermark(usize, i64),
    /// Every writer broadcasts the next barrier.
    Barrier,
}

/// What a reader saw.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Record(usize, Rec),
    Watermark(i64),
    Barrier(u64, bool),
    Aborted(u64),
    End,
}

#[derive(Debug, Clone)]
struct Case {
    writers: usize,
    fan_out: usize,
    segment_size: usize,
    unaligned: bool,
    steps: Vec<Step>,
    /// The lengths of the reader's runs (cycled).
    reads: Vec<usize>,
}

fn case() -> impl Strategy<Value = Case> {
    (1usize..4, 1usize..4, 64usize..400, any::<bool>()).prop_flat_map(
        |(writers, fan_out, segment_size, unaligned)| {
            let record = (0..fan_out as u32, 0usize..400);
            let step = prop_oneof![
                6 => (
                    0..writers,
                    prop::collection::vec(record, 1..60),
                    prop::collection::vec(1usize..40, 1..5)
                )
                    .prop_map(|(w, recs, runs)| {
                        let recs = recs
                            .into_iter()
                            .map(|(target, len)| Rec {
                                target,
                                seq: 0,
                                payload: (0..len).map(|i| i as u8).collect(),
                            })
                            .collect();
                        Step::Records(w, recs, runs)
                    }),
                1 => (0..writers, 0i64..1000).prop_map(|(w, t)| Step::Watermark(w, t)),
                1 => Just(Step::Barrier),
            ];
            (
                prop::collection::vec(step, 1..12),
                prop::collection::vec(1usize..300, 1..6),
            )
                .prop_map(move |(mut steps, reads)| {
                    // Sequence numbers per writer, so order and loss show.
                    let mut next = vec![0u64; writers];
                    for step in &mut steps {
                        if let Step::Records(w, recs, _) = step {
                            for r in recs {
                                r.seq = next[*w];
                                next[*w] += 1;
                            }
                        }
                    }
                    Case {
                        writers,
                        fan_out,
                        segment_size,
                        unaligned,
                        steps,
                        reads,
                    }
                })
        },
    )
}

struct Exchange {
    _network: NetworkBufferPool,
    writers: Vec<RecordWriter<Rec, ByTarget>>,
    gates: Vec<InputGate<Rec>>,
    seen: Vec<Vec<Seen>>,
    states: Vec<Vec<(u64, Vec<u8>)>>,
    ended: Vec<bool>,
    /// Writes in runs and reads in runs (of owned values, or in place).
    runs: bool,
    in_place: bool,
    reads: Vec<usize>,
    read_turn: usize,
    scratch: Vec<Rec>,
}

impl Exchange {
    /// `segments` per writer's pool.
    fn new(case: &Case, segments: usize, read: Read) -> Self {
        let network =
            NetworkBufferPool::new(case.writers * (segments + 2), case.segment_size).unwrap();
        let mut inputs: Vec<Vec<Box<dyn InputChannel>>> =
            (0..case.fan_out).map(|_| Vec::new()).collect();
        let mut writers = Vec::new();
        for _ in 0..case.writers {
            let config = LocalPoolConfig::new(segments, case.fan_out)
                .with_max_per_subpartition(segments)
                .with_overdraft(0);
            let pool = LocalBufferPool::new(&network, config).unwrap();
            let mut senders = Vec::new();
            for input in inputs.iter_mut() {
                let (sender, receiver) = local_channel(segments, None);
                senders.push(sender);
                input.push(Box::new(receiver));
            }
            let partition = ResultPartition::new(pool, senders).unwrap();
            let config = WriterConfig {
                max_record_size: 1 << 20,
                buffer_timeout: None,
            };
            writers.push(RecordWriter::new(partition, ByTarget::default(), config).unwrap());
        }
        let gates = inputs
            .into_iter()
            .map(|channels| {
                let mut gate = InputGate::new(channels).unwrap();
                gate.set_alignment(if case.unaligned {
                    AlignmentMode::Unaligned
                } else {
                    AlignmentMode::Aligned
                });
                gate
            })
            .collect();
        Exchange {
            _network: network,
            writers,
            gates,
            seen: vec![Vec::new(); case.fan_out],
            states: vec![Vec::new(); case.fan_out],
            ended: vec![false; case.fan_out],
            runs: read != Read::Single,
            in_place: read == Read::InPlace,
            reads: case.reads.clone(),
            read_turn: 0,
            scratch: Vec::new(),
        }
    }

    /// Every reader reads all it can, once per record or in runs.
    fn drain(&mut self) {
        for g in 0..self.gates.len() {
            loop {
                let gate = &mut self.gates[g];
                let event = if self.runs {
                    let max = self.reads[self.read_turn % self.reads.len()];
                    self.read_turn += 1;
                    let polled = if self.in_place {
                        let scratch = &mut self.scratch;
                        gate.poll_run_in_place(max, |_, record| {
                            scratch.push(record.decode().expect("a whole record"))
                        })
                    } else {
                        gate.poll_run(&mut self.scratch, max)
                    };
                    match polled.unwrap() {
                        None => None,
                        Some(GateRun::Records { channel, count }) => {
                            assert!(count >= 1 && count <= max.max(1), "run of {count}");
                            assert_eq!(count, self.scratch.len());
                            for value in self.scratch.drain(..) {
                                self.seen[g].push(Seen::Record(channel, value));
                            }
                            Some(None)
                        }
                        Some(GateRun::Event(event)) => Some(Some(event)),
                    }
                } else {
                    gate.poll_next().unwrap().map(Some)
                };
                let Some(event) = event else {
                    break;
                };
                match event {
                    None => {}
                    Some(GateEvent::Record { value, channel }) => {
                        assert!(!self.runs, "a run yields records as a run");
                        self.seen[g].push(Seen::Record(channel, value));
                    }
                    Some(GateEvent::Watermark(w)) => self.seen[g].push(Seen::Watermark(w)),
                    Some(GateEvent::Barrier { id, unaligned, .. }) => {
                        self.seen[g].push(Seen::Barrier(id, unaligned))
                    }
                    Some(GateEvent::CheckpointAborted { id, .. }) => {
                        self.seen[g].push(Seen::Aborted(id))
                    }
                    Some(GateEvent::End) => {
                        assert!(!self.ended[g], "end twice");
                        self.ended[g] = true;
                        self.seen[g].push(Seen::End);
                    }
                }
                if let Some(state) = self.gates[g].take_channel_state() {
                    self.states[g].push(state);
                }
            }
        }
    }

    /// Waits until writer `w` may write, letting the readers run and the other writers
    /// finish what they have pending (each is a task of its own); fails on a deadlock.
    fn ready(&mut self, w: usize) {
        for _ in 0..10_000 {
            if self.writers[w].poll_ready(0).unwrap() {
                return;
            }
            self.others(w);
            self.drain();
        }
        panic!("writer {w} cannot go on after its readers read everything");
    }

    /// Moves the other writers' pending writes on, as their tasks would.
    fn others(&mut self, w: usize) {
        for (other, writer) in self.writers.iter_mut().enumerate() {
            if other != w && writer.has_pending() {
                writer.poll_pending(0).unwrap();
            }
        }
    }

    /// Waits until writer `w` has nothing pending.
    fn settle(&mut self, w: usize) {
        for _ in 0..10_000 {
            if self.writers[w].poll_pending(0).unwrap() {
                return;
            }
            self.others(w);
            self.drain();
        }
        panic!("writer {w}'s pending write never completes");
    }

    fn play(&mut self, steps: &[Step]) {
        let mut barrier = 0;
        for step in steps {
            match step {
                Step::Records(w, recs, runs) => {
                    let w = *w;
                    if self.runs {
                        let mut rest: &[Rec] = recs;
                        let mut turn = 0;
                        while !rest.is_empty() {
                            let len = runs[turn % runs.len()].min(rest.len());
                            turn += 1;
                            let mut run = &rest[..len];
                            while !run.is_empty() {
                                self.ready(w);
                                let taken = self.writers[w].emit_run(run, 0).unwrap();
                                assert!(taken >= 1 && taken <= run.len());
                                run = &run[taken..];
                            }
                            rest = &rest[len..];
                        }
                    } else {
                        for r in recs {
                            self.ready(w);
                            self.writers[w].emit(r, 0).unwrap();
                        }
                    }
                }
                Step::Watermark(w, t) => {
                    self.ready(*w);
                    self.writers[*w].emit_watermark(*t, 0).unwrap();
                }
                Step::Barrier => {
                    barrier += 1;
                    for w in 0..self.writers.len() {
                        self.ready(w);
                        self.writers[w].emit_barrier(barrier, 0).unwrap();
                    }
                }
            }
        }
        for w in 0..self.writers.len() {
            self.ready(w);
            self.writers[w].finish(0).unwrap();
            self.settle(w);
        }
        for _ in 0..100 {
            if self.ended.iter().all(|e| *e) {
                break;
            }
            self.drain();
        }
        assert!(self.ended.iter().all(|e| *e), "every reader sees the end");
        // Each writer asked its selector once per record it wrote, never ahead.
        for (w, writer) in self.writers.iter().enumerate() {
            let records: usize = steps
                .iter()
                .map(|s| match s {
                    Step::Records(sw, recs, _) if *sw == w => recs.len(),
                    _ => 0,
                })
                .sum();
            assert_eq!(
                writer.selector().calls,
                records as u64,
                "writer {w}'s selector calls"
            );
        }
    }
}

/// How the readers read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// `poll_next`, writers `emit`.
    Single,
    /// `poll_run`, writers `emit_run`.
    Runs,
    /// `poll_run_in_place`, writers `emit_run`.
    InPlace,
}

/// Segments enough that no writer ever waits.
fn plenty(case: &Case) -> usize {
    let bytes: usize = case
        .steps
        .iter()
        .map(|s| match s {
            Step::Records(_, recs, _) => recs.iter().map(|r| 4 + 20 + r.payload.len()).sum(),
            _ => 12 * case.fan_out,
        })
        .sum();
    2 * bytes / case.segment_size + 4 * case.fan_out + 16
}

/// Each channel's records, in arrival order.
fn per_channel(seen: &[Seen]) -> Vec<Vec<&Rec>> {
    let mut channels: Vec<Vec<&Rec>> = Vec::new();
    for s in seen {
        if let Seen::Record(channel, r) = s {
            if channels.len() <= *channel {
                channels.resize_with(channel + 1, Vec::new);
            }
            channels[*channel].push(r);
        }
    }
    channels
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, .. ProptestConfig::default() })]

    #[test]
    fn runs_write_and_read_exactly_what_single_records_do(case in case()) {
        let segments = plenty(&case);
        let mut single = Exchange::new(&case, segments, Read::Single);
        single.play(&case.steps);
        for read in [Read::Runs, Read::InPlace] {
            let mut runs = Exchange::new(&case, segments, read);
            // Everything written first, then read: identical buffers, identical reads.
            runs.play(&case.steps);
            for g in 0..case.fan_out {
                prop_assert_eq!(&single.seen[g], &runs.seen[g], "{:?}: gate {}", read, g);
                prop_assert_eq!(
                    &single.states[g],
                    &runs.states[g],
                    "{:?}: gate {}'s channel state",
                    read,
                    g
                );
            }
        }
    }

    #[test]
    fn runs_under_back_pressure_lose_nothing_and_keep_each_channel_s_order(case in case()) {
        // A pool of a segment per subpartition and two more: writers wait often.
        let segments = case.fan_out + 2;
        let mut single = Exchange::new(&case, segments, Read::Single);
        let mut runs = Exchange::new(&case, segments, Read::InPlace);
        single.play(&case.steps);
        runs.play(&case.steps);
        for g in 0..case.fan_out {
            let a = per_channel(&single.seen[g]);
            let b = per_channel(&runs.seen[g]);
            prop_assert_eq!(&a, &b, "gate {}'s channels", g);
            // Every record the script aimed at this gate, from each writer in order.
            for (w, records) in b.iter().enumerate() {
                let expected: Vec<&Rec> = case
                    .steps
                    .iter()
                    .filter_map(|s| match s {
                        Step::Records(sw, recs, _) if *sw == w => Some(recs),
                        _ => None,
                    })
                    .flatten()
                    .filter(|r| r.target as usize == g)
                    .collect();
                prop_assert_eq!(records, &expected, "gate {} channel {}", g, w);
            }
            // Every checkpoint reaches the task: its first barrier yields it (whether a
            // later one then aborts it depends on how the channels interleave).
            let checkpoints = case.steps.iter().filter(|s| matches!(s, Step::Barrier)).count();
            let taken = |seen: &[Seen]| {
                let mut ids: Vec<u64> = seen
                    .iter()
                    .filter_map(|s| match s {
                        Seen::Barrier(id, _) => Some(*id),
                        _ => None,
                    })
                    .collect();
                ids.dedup();
                ids
            };
            let all: Vec<u64> = (1..=checkpoints as u64).collect();
            prop_assert_eq!(taken(&single.seen[g]), all.clone());
            prop_assert_eq!(taken(&runs.seen[g]), all);
        }
    }
}

/// Timeout 0: the records a run wrote are visible to their readers even when a later
/// record of the run waits for the pool, as they would be written one at a time.
#[test]
fn with_timeout_zero_a_run_publishes_what_it_wrote_before_a_pending_record() {
    let network = NetworkBufferPool::new(4, 128).unwrap();
    let config = LocalPoolConfig::new(2, 2)
        .with_max_per_subpartition(2)
        .with_overdraft(0);
    let pool = LocalBufferPool::new(&network, config).unwrap();
    let (s0, r0) = local_channel(2, None);
    let (s1, r1) = local_channel(2, None);
    let partition = ResultPartition::new(pool, vec![s0, s1]).unwrap();
    let config = WriterConfig {
        max_record_size: 1 << 20,
        buffer_timeout: Some(std::time::Duration::ZERO),
    };
    let mut writer = RecordWriter::new(partition, ByTarget::default(), config).unwrap();
    let mut gate0: InputGate<Rec> = InputGate::new(vec![Box::new(r0)]).unwrap();
    let small = Rec {
        target: 0,
        seq: 0,
        payload: vec![1; 8],
    };
    // Longer than the two segments the pool has: it waits for the reader.
    let large = Rec {
        target: 1,
        seq: 1,
        payload: vec![2; 300],
    };
    let taken = writer.emit_run(&[small.clone(), large], 0).unwrap();
    assert_eq!(taken, 2);
    assert!(writer.has_pending(), "the large record waits for buffers");
    match gate0.poll_next().unwrap() {
        Some(GateEvent::Record { value, .. }) => assert_eq!(value, small),
        other => panic!("the first record is not visible: {other:?}"),
    }
    drop(r1);
}
