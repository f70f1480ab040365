//! A task moves records in runs, but never more than its chain has room for: a sink
//! that bounds its input (`Sink::room`) never gets more than it said it takes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use weir_engine::element::Record;
use weir_engine::graph::{Graph, Sink, SubtaskInfo};
use weir_engine::runtime::{Cores, Runtime, TaskError};

/// Takes at most `limit` records between two polls, as a sink with a limit of writes
/// unanswered does; notes the most it was ever given and what it summed.
struct Bounded {
    limit: usize,
    since_poll: usize,
    most: Arc<AtomicU64>,
    sum: Arc<AtomicU64>,
}

impl Bounded {
    fn take(&mut self, value: u64) {
        self.since_poll += 1;
        self.most
            .fetch_max(self.since_poll as u64, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
    }
}

impl Sink<u64> for Bounded {
    fn invoke(&mut self, value: u64, _ts: Option<i64>, _now_ns: u64) -> Result<(), TaskError> {
        self.take(value);
        Ok(())
    }
    fn invoke_batch(
        &mut self,
        records: std::vec::Drain<'_, Record<u64>>,
        _now_ns: u64,
    ) -> Result<(), TaskError> {
        for record in records {
            self.take(record.value);
        }
        Ok(())
    }
    fn accepts(&mut self) -> bool {
        self.since_poll < self.limit
    }
    fn room(&mut self) -> usize {
        self.limit - self.since_poll
    }
    fn poll(&mut self, _now_ns: u64) -> Result<bool, TaskError> {
        // Its writes were answered: room again.
        let moved = self.since_poll > 0;
        self.since_poll = 0;
        Ok(moved)
    }
}

#[test]
fn a_sink_is_never_given_more_than_its_room() {
    let most = Arc::new(AtomicU64::new(0));
    let sum = Arc::new(AtomicU64::new(0));
    let (m, s) = (Arc::clone(&most), Arc::clone(&sum));
    let graph = Graph::new().with_parallelism(2);
    graph
        .from_generator(10_000, None, |n| n)
        .map(|n| n * 2)
        .sink(move |_: &SubtaskInfo| Bounded {
            limit: 3,
            since_poll: 0,
            most: Arc::clone(&m),
            sum: Arc::clone(&s),
        });
    graph
        .execute(
            Runtime::builder()
                .cores(Cores::Count(2))
                .pin(false)
                .build()
                .unwrap(),
        )
        .unwrap();
    assert_eq!(sum.load(Ordering::Relaxed), 2 * (0..10_000u64).sum::<u64>());
    assert!(
        most.load(Ordering::Relaxed) <= 3,
        "a sink that takes 3 at a time was given {}",
        most.load(Ordering::Relaxed)
    );
}
