//! The main job's back-pressure wake-up: a source whose writer runs out of buffers is
//! woken by the buffer that comes back, not by a timer or the idle safety net.

use std::sync::Arc;

use weir_engine::async_io::{AsyncConfig, AsyncFunction, OutputMode, ResultFuture};
use weir_engine::exchange::codec::{Codec, DecodeError, Decoder, Encoder};
use weir_engine::runtime::job::{
    run_job, ExchangeSpec, GeneratorSpec, JobProgress, JobRecord, JobSpec, KeyDistribution,
    SourceRecord,
};
use weir_engine::runtime::{Cores, Runtime};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rec(SourceRecord);

impl From<SourceRecord> for Rec {
    fn from(record: SourceRecord) -> Self {
        Rec(record)
    }
}

impl Codec for Rec {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        self.0.id.encode(out);
        self.0.key.encode(out);
        self.0.created_ns.encode(out);
    }
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        Ok(Rec(SourceRecord {
            id: u64::decode(input)?,
            key: u64::decode(input)?,
            created_ns: u64::decode(input)?,
        }))
    }
}

impl JobRecord for Rec {
    fn id(&self) -> u64 {
        self.0.id
    }
    fn key(&self) -> u64 {
        self.0.key
    }
    fn created_ns(&self) -> u64 {
        self.0.created_ns
    }
}

/// Completes every call inside `invoke`: the source's worker has no I/O and no timer.
struct Echo;

impl AsyncFunction for Echo {
    type In = Rec;
    type Out = Rec;
    fn invoke(&mut self, input: &Rec, result: ResultFuture<Rec>) {
        result.complete([*input]);
    }
}

#[test]
fn a_back_pressured_source_is_woken_by_the_recycled_buffer() {
    let records = 40_000;
    let runtime = Runtime::builder()
        .cores(Cores::Count(2))
        .pin(false)
        .build()
        .unwrap();
    let spec = JobSpec {
        generator: GeneratorSpec {
            records,
            rate: None,
            keys: KeyDistribution::Uniform { keys: 1_000 },
            seed: 7,
        },
        keys: None,
        collect: None,
        sources: 1,
        sinks: 1,
        async_config: AsyncConfig::new(OutputMode::Unordered, 64),
        function: Arc::new(|_, _| (Echo, None)),
        // Small segments, a small pool and no buffer timeout: the source runs dry again
        // and again, and only full buffers travel.
        exchange: ExchangeSpec {
            segment_size: 512,
            segments: 2,
            buffer_timeout: None,
        },
    };
    let report = run_job(runtime, spec, Arc::new(JobProgress::default())).unwrap();
    assert_eq!(report.missing, 0);
    assert_eq!(report.duplicates, 0);
    assert_eq!(report.received, records);
    assert!(report.backpressured_ns > 0, "the source was back-pressured");
    // Worker 0 holds the source. Nothing but the pool's notification can wake it: no
    // I/O, no timers, no buffer timeout, no foreign completions.
    let source = report.run.wakeups[0];
    assert!(
        source.notified > 0,
        "the source's worker parked {} times and was never woken by a recycled buffer \
         ({source:?})",
        report.run.parks[0]
    );
    assert_eq!(source.deadline, 0, "{source:?}");
}
