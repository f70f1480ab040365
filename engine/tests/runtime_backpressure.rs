//! Back-pressure wake-ups: a source whose writer runs out of buffers is woken by the
//! buffer that comes back, not by a timer or the idle safety net.

use weir_engine::async_io::{AsyncConfig, AsyncFunction, OutputMode, ResultFuture};
use weir_engine::graph::{ExchangeSpec, Graph};
use weir_engine::runtime::{Cores, Runtime};

/// Completes every call inside `invoke`: the source's worker has no I/O and no timer.
struct Echo;

impl AsyncFunction for Echo {
    type In = (u64, u64);
    type Out = (u64, u64);
    fn invoke(&mut self, input: &(u64, u64), result: ResultFuture<(u64, u64)>) {
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
    // Small segments, a small pool and no buffer timeout: the source runs dry again
    // and again, and only full buffers travel.
    let graph = Graph::new().with_exchange(ExchangeSpec {
        segment_size: 512,
        buffers_per_channel: 1,
        floating_buffers: 0,
        max_buffers_per_channel: 1,
        buffer_timeout: None,
        debloat: None,
    });
    let counted = graph
        .from_generator(records, None, |n| (n, n % 1_000))
        .async_wait(|_| Echo, AsyncConfig::new(OutputMode::Unordered, 64))
        .key_by(|record: &(u64, u64)| record.1)
        .count();
    let result = graph.execute(runtime).unwrap();
    assert_eq!(counted.records(), records);
    assert!(
        result.stages[0].backpressured_ns > 0,
        "the source was back-pressured"
    );
    // Worker 0 holds the source. Nothing but the pool's notification can wake it: no
    // I/O, no timers, no buffer timeout, no foreign completions.
    let source = result.run.wakeups[0];
    // A notification left while the worker was still awake counts as pending: it kept
    // the worker from sleeping, and woke it all the same.
    assert!(
        source.notified + source.pending > 0,
        "the source's worker parked {} times and was never woken by a recycled buffer \
         ({source:?})",
        result.run.parks[0]
    );
    assert_eq!(source.deadline, 0, "{source:?}");
    // The idle safety net never found work that nothing had announced: a wake-up it
    // delivered would be a lost one.
    for (worker, wakeups) in result.run.wakeups.iter().enumerate() {
        assert_eq!(wakeups.rescued, 0, "worker {worker}: {wakeups:?}");
    }
}
