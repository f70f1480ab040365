//! Async operator workloads, Weir's `AsyncWaitOperator` and the peer a Rust user would
//! reach for: `futures::StreamExt::buffered` / `buffer_unordered` on a tokio
//! current-thread runtime, doing the same work.
//!
//! - latency 0: the call completes inside `invoke` (operator overhead per record);
//! - cross-thread: another thread completes each call (Flink's
//!   `AsyncWaitOperatorBenchmark` set-up: capacity 100, no timeout);
//! - timer-driven latency L with capacity C: a closed loop whose physical limit is
//!   Little's law, C / L records per second; per-record latency from invoke to emit.
//!
//! Each workload checks that every record came out once before it reports a time.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use hdrhistogram::Histogram;
use weir_engine::async_io::{
    AsyncConfig, AsyncFunction, AsyncWaitOperator, OutputMode, ResultFuture,
};
use weir_engine::element::{Collector, StreamElement};
use weir_engine::park::Parker;

/// What one run measured.
pub struct Measurement {
    /// Wall time for the run's operations.
    pub elapsed: Duration,
    /// Per-record latency in ns, when the workload has one.
    pub latency_ns: Option<Histogram<u64>>,
}

impl From<Duration> for Measurement {
    fn from(elapsed: Duration) -> Self {
        Measurement {
            elapsed,
            latency_ns: None,
        }
    }
}

/// A latency histogram as STYLE.md sets them: 1 ns to 60 s, 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("static bounds")
}

/// Counts records and checks each input id arrives once.
struct CountingSink {
    count: u64,
    sum: u64,
}

impl Collector<u64> for CountingSink {
    #[inline]
    fn collect(&mut self, element: StreamElement<u64>) {
        if let StreamElement::Record(record) = element {
            self.count += 1;
            self.sum = self.sum.wrapping_add(record.value);
        }
    }
}

fn check(sink: &CountingSink, n: u64) {
    assert_eq!(sink.count, n, "records lost or duplicated");
    assert_eq!(
        sink.sum,
        n * n.saturating_sub(1) / 2,
        "wrong records emitted"
    );
}

/// Completes in `invoke`.
struct Immediate;

impl AsyncFunction for Immediate {
    type In = u64;
    type Out = u64;
    #[inline]
    fn invoke(&mut self, input: &u64, result: ResultFuture<u64>) {
        result.complete([*input]);
    }
    #[inline]
    fn key(&self, input: &u64) -> u64 {
        *input & 63
    }
}

/// `n` records through Weir's operator with latency 0.
pub fn weir_immediate(mode: OutputMode, capacity: usize, n: u64) -> Measurement {
    let parker = Parker::current();
    let config = AsyncConfig::new(mode, capacity);
    let mut operator =
        AsyncWaitOperator::new(Immediate, config, parker.unparker()).expect("valid config");
    let mut sink = CountingSink { count: 0, sum: 0 };
    let start = Instant::now();
    for i in 0..n {
        operator
            .process_record(i, None, 0, &mut sink)
            .expect("no failure");
    }
    let elapsed = start.elapsed();
    check(&sink, n);
    elapsed.into()
}

/// `n` records through `buffered(C)` (or `buffer_unordered(C)`) with latency 0.
pub fn tokio_immediate(ordered: bool, capacity: usize, n: u64) -> Measurement {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        let start = Instant::now();
        let calls = futures::stream::iter(0..n).map(|i| async move { i });
        let (count, sum) = if ordered {
            calls
                .buffered(capacity)
                .fold((0u64, 0u64), |(c, s), v| async move {
                    (c + 1, s.wrapping_add(v))
                })
                .await
        } else {
            calls
                .buffer_unordered(capacity)
                .fold((0u64, 0u64), |(c, s), v| async move {
                    (c + 1, s.wrapping_add(v))
                })
                .await
        };
        let elapsed = start.elapsed();
        check(&CountingSink { count, sum }, n);
        elapsed.into()
    })
}

/// Hands each call to a completer thread through an SPSC ring.
struct Remote {
    calls: weir_engine::ring::Producer<(u64, ResultFuture<u64>)>,
}

impl AsyncFunction for Remote {
    type In = u64;
    type Out = u64;
    fn invoke(&mut self, input: &u64, result: ResultFuture<u64>) {
        let mut call = (*input, result);
        // The ring holds the operator's capacity, so this only spins if the completer
        // thread is descheduled.
        while let Err(back) = self.calls.try_push(call) {
            call = back;
            std::thread::yield_now();
        }
    }
    fn key(&self, input: &u64) -> u64 {
        *input & 63
    }
}

/// `n` records whose calls another thread completes (through the operator's
/// multi-producer inbox and a wake-up), capacity `capacity`.
pub fn weir_cross_thread(mode: OutputMode, capacity: usize, n: u64) -> Measurement {
    let (calls, mut incoming) =
        weir_engine::ring::channel::<(u64, ResultFuture<u64>)>(capacity * 2);
    let (core_a, core_b) = crate::affinity::bench_cores();
    let completer = std::thread::spawn(move || {
        crate::affinity::pin(core_b);
        let mut backoff = crate::affinity::Backoff::default();
        let mut done = 0;
        while done < n {
            match incoming.try_pop() {
                Some((input, result)) => {
                    result.complete([input]);
                    done += 1;
                    backoff.reset();
                }
                None => backoff.snooze(),
            }
        }
    });
    crate::affinity::pin(core_a);
    let parker = Parker::current();
    let config = AsyncConfig::new(mode, capacity);
    let mut operator =
        AsyncWaitOperator::new(Remote { calls }, config, parker.unparker()).expect("valid config");
    let mut sink = CountingSink { count: 0, sum: 0 };
    let start = Instant::now();
    for i in 0..n {
        while operator.is_full() {
            if operator.drain(0, &mut sink).expect("no failure") == 0 {
                parker.park(Some(Duration::from_millis(1)), || {
                    operator.has_completions()
                });
            }
        }
        operator
            .process_record(i, None, 0, &mut sink)
            .expect("no failure");
    }
    while operator.in_flight() > 0 {
        if operator.drain(0, &mut sink).expect("no failure") == 0 {
            parker.park(Some(Duration::from_millis(1)), || {
                operator.has_completions()
            });
        }
    }
    let elapsed = start.elapsed();
    completer.join().expect("completer thread");
    check(&sink, n);
    elapsed.into()
}

type DelayQueue = Rc<RefCell<VecDeque<(u64, u64, ResultFuture<u64>)>>>;

/// Completes each call `latency` after its invocation (a delay line: fixed latency, so
/// due times are in invocation order).
struct DelayLine {
    queue: DelayQueue,
    epoch: Instant,
    latency_ns: u64,
}

impl AsyncFunction for DelayLine {
    type In = u64;
    type Out = u64;
    fn invoke(&mut self, input: &u64, result: ResultFuture<u64>) {
        let due = self.epoch.elapsed().as_nanos() as u64 + self.latency_ns;
        self.queue.borrow_mut().push_back((due, *input, result));
    }
    fn key(&self, input: &u64) -> u64 {
        *input & 63
    }
}

/// `n` records with latency `latency` and capacity `capacity`, closed loop; returns the
/// wall time and the invoke-to-emit latency histogram.
pub fn weir_timer(mode: OutputMode, capacity: usize, latency: Duration, n: u64) -> Measurement {
    let queue: DelayQueue = Rc::new(RefCell::new(VecDeque::with_capacity(capacity)));
    let epoch = Instant::now();
    let function = DelayLine {
        queue: Rc::clone(&queue),
        epoch,
        latency_ns: latency.as_nanos() as u64,
    };
    let parker = Parker::current();
    let mut operator = AsyncWaitOperator::new(
        function,
        AsyncConfig::new(mode, capacity),
        parker.unparker(),
    )
    .expect("valid config");
    let mut sink = CountingSink { count: 0, sum: 0 };
    let start = Instant::now();
    let mut next = 0;
    while sink.count < n {
        let now = epoch.elapsed().as_nanos() as u64;
        loop {
            let due = queue
                .borrow()
                .front()
                .is_some_and(|(due, _, _)| *due <= now);
            if !due {
                break;
            }
            let (_, input, result) = queue.borrow_mut().pop_front().expect("checked");
            result.complete([input]);
        }
        operator.drain(now, &mut sink).expect("no failure");
        while next < n && !operator.is_full() {
            operator
                .process_record(next, None, now, &mut sink)
                .expect("no failure");
            next += 1;
        }
        std::hint::spin_loop();
    }
    let elapsed = start.elapsed();
    check(&sink, n);
    Measurement {
        elapsed,
        latency_ns: Some(operator.metrics().latency_ns.clone()),
    }
}

/// The same closed loop on tokio: `buffered(C)` / `buffer_unordered(C)` over
/// `tokio::time::sleep(latency)`.
pub fn tokio_timer(ordered: bool, capacity: usize, latency: Duration, n: u64) -> Measurement {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        let start = Instant::now();
        let calls = futures::stream::iter(0..n).map(|i| async move {
            let invoked = Instant::now();
            tokio::time::sleep(latency).await;
            (i, invoked)
        });
        let mut latency_ns = histogram();
        let mut sink = CountingSink { count: 0, sum: 0 };
        let mut record = |(i, invoked): (u64, Instant)| {
            latency_ns.saturating_record(invoked.elapsed().as_nanos().max(1) as u64);
            sink.count += 1;
            sink.sum = sink.sum.wrapping_add(i);
        };
        if ordered {
            let mut results = calls.buffered(capacity);
            while let Some(item) = results.next().await {
                record(item);
            }
        } else {
            let mut results = calls.buffer_unordered(capacity);
            while let Some(item) = results.next().await {
                record(item);
            }
        }
        let elapsed = start.elapsed();
        check(&sink, n);
        Measurement {
            elapsed,
            latency_ns: Some(latency_ns),
        }
    })
}
