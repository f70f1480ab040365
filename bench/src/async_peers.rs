//! Async operator workloads, Weir's `AsyncWaitOperator` and the peer a Rust user would
//! reach for: `futures::StreamExt::buffered` / `buffer_unordered` on a tokio
//! current-thread runtime, doing the same work.
//!
//! - latency 0: the call completes inside `invoke` (operator overhead per record of a
//!   call that completes at once, e.g. from a cache);
//! - completed in batches: the calls of a full operator complete together on the
//!   task's thread, later (operator overhead per record of a call that returns
//!   through the completion queue, as an I/O client's do); tokio's calls await a
//!   `oneshot` fired by a completer task on the same thread;
//! - cross-thread: another thread completes each call (Flink's
//!   `AsyncWaitOperatorBenchmark` set-up: capacity 100, no timeout);
//! - timer-driven latency L with capacity C: a closed loop whose physical limit is
//!   Little's law, C / L records per second; per-record latency from invoke to emit.
//!   Weir runs it as a task on a runtime worker: each call is a timer on a hashed
//!   timing wheel (the engine's, as the operator's own timeouts are), the task reports
//!   the earliest timer as its deadline, and the idle worker parks until it. tokio
//!   runs `tokio::time::sleep(L)` per call: its timer wheel has a resolution of 1 ms
//!   and rounds a deadline up to the next tick, so a 1 ms sleep lasts between 1 and
//!   2 ms. That is what a tokio user gets, so the peer keeps it.
//!
//! Each workload checks that every record came out once before it reports a time.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use hdrhistogram::Histogram;
use weir_engine::async_io::{
    AsyncConfig, AsyncFunction, AsyncWaitOperator, OutputMode, ResultFuture,
};
use weir_engine::element::{Collector, StreamElement};
use weir_engine::limits::{LATENCY_SAMPLE_EVERY, TIMER_SLOTS, TIMER_TICK_NS};
use weir_engine::park::Parker;
use weir_engine::runtime::{signal, Cores, Progress, Runtime, Task, TaskContext, TaskError};
use weir_engine::timer::TimerWheel;

/// What one run measured.
pub struct Measurement {
    /// Wall time for the run's operations.
    pub elapsed: Duration,
    /// Per-record latency in ns, when the workload has one.
    pub latency_ns: Option<Histogram<u64>>,
    /// CPU time per side over the run's operations, when the workload measures it.
    pub cpu: Option<CpuTime>,
}

impl From<Duration> for Measurement {
    fn from(elapsed: Duration) -> Self {
        Measurement {
            elapsed,
            latency_ns: None,
            cpu: None,
        }
    }
}

/// CPU time (user + system) over a run's operations, per side of a client and its
/// service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTime {
    /// Of the thread that ran the operations (everything the client side did on it).
    pub client_ns: u64,
    /// Of the service's thread.
    pub service_ns: u64,
}

pub use weir_net::lookup::thread_cpu_ns;

/// A latency histogram as every workload keeps one: 1 ns to 60 s, 3 significant
/// digits (the operator's own histogram has the same bounds).
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
        result.complete_one(*input);
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

/// Keeps each call's handle; the driving loop completes them in a batch, on the
/// operator's thread (how an I/O client on the task's own driver completes calls).
struct Batched {
    pending: Calls,
}

/// Calls waiting for the loop to complete them, with their inputs.
type Calls = Rc<RefCell<Vec<(u64, ResultFuture<u64>)>>>;

impl AsyncFunction for Batched {
    type In = u64;
    type Out = u64;
    #[inline]
    fn invoke(&mut self, input: &u64, result: ResultFuture<u64>) {
        self.pending.borrow_mut().push((*input, result));
    }
    #[inline]
    fn key(&self, input: &u64) -> u64 {
        *input & 63
    }
}

/// `n` records whose calls complete after the operator filled up: the loop invokes
/// `capacity` calls, completes them all in input order on this thread, drains the
/// operator, and so on. Every record takes the operator's whole path (entry stored,
/// completion queued, emitted on drain).
pub fn weir_batched(mode: OutputMode, capacity: usize, n: u64) -> Measurement {
    let parker = Parker::current();
    let config = AsyncConfig::new(mode, capacity);
    let pending = Rc::new(RefCell::new(Vec::with_capacity(capacity)));
    let function = Batched {
        pending: Rc::clone(&pending),
    };
    let mut operator =
        AsyncWaitOperator::new(function, config, parker.unparker()).expect("valid config");
    let mut sink = CountingSink { count: 0, sum: 0 };
    let mut batch = Vec::with_capacity(capacity);
    let start = Instant::now();
    let mut next = 0;
    while next < n {
        while next < n && !operator.is_full() {
            operator
                .process_record(next, None, 0, &mut sink)
                .expect("no failure");
            next += 1;
        }
        std::mem::swap(&mut batch, &mut *pending.borrow_mut());
        for (input, result) in batch.drain(..) {
            result.complete_one(input);
        }
        operator.drain(0, &mut sink).expect("no failure");
    }
    let elapsed = start.elapsed();
    check(&sink, n);
    elapsed.into()
}

/// The same with `buffered(C)` (or `buffer_unordered(C)`) on a tokio current-thread
/// runtime: each call is a future awaiting a `oneshot` whose sender a completer task
/// (on the same thread, in a `LocalSet`) fires in a batch when woken, as a tokio I/O
/// task completes the calls it carries.
pub fn tokio_batched(ordered: bool, capacity: usize, n: u64) -> Measurement {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        type Senders = Rc<RefCell<Vec<(u64, tokio::sync::oneshot::Sender<u64>)>>>;
        let pending: Senders = Rc::new(RefCell::new(Vec::with_capacity(capacity)));
        let wake = Rc::new(tokio::sync::Notify::new());
        let completer = {
            let pending = Rc::clone(&pending);
            let wake = Rc::clone(&wake);
            tokio::task::spawn_local(async move {
                let mut batch = Vec::with_capacity(capacity);
                loop {
                    wake.notified().await;
                    std::mem::swap(&mut batch, &mut *pending.borrow_mut());
                    for (input, sender) in batch.drain(..) {
                        let _ = sender.send(input);
                    }
                }
            })
        };
        let start = Instant::now();
        let calls = futures::stream::iter(0..n).map(|i| {
            let (sender, receiver) = tokio::sync::oneshot::channel();
            pending.borrow_mut().push((i, sender));
            wake.notify_one();
            async move { receiver.await.expect("the completer answers every call") }
        });
        let fold = |(c, s): (u64, u64), v: u64| async move { (c + 1, s.wrapping_add(v)) };
        let (count, sum) = if ordered {
            calls.buffered(capacity).fold((0u64, 0u64), fold).await
        } else {
            calls
                .buffer_unordered(capacity)
                .fold((0u64, 0u64), fold)
                .await
        };
        let elapsed = start.elapsed();
        completer.abort();
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
                    result.complete_one(input);
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

/// Calls waiting for their latency to pass, each with its input, by due time.
type Delays = Rc<RefCell<TimerWheel<(u64, ResultFuture<u64>)>>>;

/// Completes each call `latency` after its invocation, from a timer on the task's
/// timing wheel.
struct Delayed {
    delays: Delays,
    /// The instant the worker's clock counts from (set by the task's first poll).
    epoch: Rc<Cell<Instant>>,
    latency_ns: u64,
}

impl AsyncFunction for Delayed {
    type In = u64;
    type Out = u64;
    fn invoke(&mut self, input: &u64, result: ResultFuture<u64>) {
        // The clock now, not the turn's reading: a turn that invokes a thousand calls
        // would otherwise start the later ones' latency early.
        let now = self.epoch.get().elapsed().as_nanos() as u64;
        self.delays
            .borrow_mut()
            .schedule(now + self.latency_ns, (*input, result));
    }
    fn key(&self, input: &u64) -> u64 {
        *input & 63
    }
}

/// What the timer task reports when it is done.
type TimerOutcome = Arc<Mutex<Option<Measurement>>>;

/// The operator as a task on a runtime worker: feeds it `n` records while it has
/// room, completes the calls whose timers are due, and tells the worker its next
/// deadline so the worker parks until then.
struct TimerTask {
    operator: AsyncWaitOperator<Delayed>,
    delays: Delays,
    epoch: Rc<Cell<Instant>>,
    sink: CountingSink,
    next: u64,
    n: u64,
    started_ns: Option<u64>,
    outcome: TimerOutcome,
}

impl Task for TimerTask {
    fn poll(&mut self, cx: &mut TaskContext<'_>) -> Result<Progress, TaskError> {
        let now = cx.now_ns;
        if self.started_ns.is_none() {
            self.started_ns = Some(now);
            self.epoch.set(Instant::now() - Duration::from_nanos(now));
        }
        let mut busy = false;
        loop {
            let due = self.delays.borrow_mut().pop_due(now);
            let Some((_, (input, result))) = due else {
                break;
            };
            result.complete_one(input);
            busy = true;
        }
        busy |= self.operator.drain(now, &mut self.sink)? > 0;
        while self.operator.fire_due_timer(now, &mut self.sink)?.is_some() {
            busy = true;
        }
        while self.next < self.n && !self.operator.is_full() {
            self.operator
                .process_record(self.next, None, now, &mut self.sink)?;
            self.next += 1;
            busy = true;
        }
        if self.sink.count == self.n {
            let elapsed = Duration::from_nanos(now - self.started_ns.unwrap_or(now));
            check(&self.sink, self.n);
            *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(Measurement {
                elapsed,
                latency_ns: Some(self.operator.metrics().latency_ns.clone()),
                cpu: None,
            });
            return Ok(Progress::Done);
        }
        Ok(if busy { Progress::Busy } else { Progress::Idle })
    }

    fn next_deadline(&self) -> Option<u64> {
        let delay = self.delays.borrow().next_deadline();
        match (delay, self.operator.next_timer_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// `n` records with latency `latency` and capacity `capacity`, closed loop, through
/// the operator as a task on one runtime worker (pinned to the first bench core, no
/// I/O driver: it parks on a condition variable until its next timer or a wake-up);
/// returns the wall time and the operator's invoke-to-emit latency histogram.
pub fn weir_timer(mode: OutputMode, capacity: usize, latency: Duration, n: u64) -> Measurement {
    let (core_a, _) = crate::affinity::bench_cores();
    let builder = Runtime::builder();
    let builder = match core_a {
        Some(core) => builder.cores(Cores::List(vec![core.id])).pin(true),
        None => builder.cores(Cores::Count(1)).pin(false),
    };
    let mut runtime = builder.build().expect("runtime");
    // The operator wakes this task (rings its doorbell) for completions off its thread.
    let task = runtime.add_task(0);
    let unparker = runtime.task_unparker(task, signal::COMPLETION);
    let outcome: TimerOutcome = Arc::new(Mutex::new(None));
    let reported = Arc::clone(&outcome);
    let latency_ns = latency.as_nanos() as u64;
    runtime.set_task(
        task,
        Box::new(move |_driver| {
            let delays: Delays = Rc::new(RefCell::new(TimerWheel::new(TIMER_TICK_NS, TIMER_SLOTS)));
            let epoch = Rc::new(Cell::new(Instant::now()));
            let function = Delayed {
                delays: Rc::clone(&delays),
                epoch: Rc::clone(&epoch),
                latency_ns,
            };
            let operator =
                AsyncWaitOperator::new(function, AsyncConfig::new(mode, capacity), unparker)?;
            Ok(Box::new(TimerTask {
                operator,
                delays,
                epoch,
                sink: CountingSink { count: 0, sum: 0 },
                next: 0,
                n,
                started_ns: None,
                outcome: reported,
            }) as Box<dyn Task>)
        }),
    );
    runtime.run().expect("the timer task runs");
    let measured = outcome.lock().unwrap_or_else(|e| e.into_inner()).take();
    measured.expect("the task reported")
}

/// The same closed loop on tokio: `buffered(C)` / `buffer_unordered(C)` over
/// `tokio::time::sleep(latency)`, whose deadline tokio rounds up to its 1 ms timer
/// tick (a 1 ms sleep takes 1 to 2 ms): what a tokio user gets. Latency from call to
/// result of one call in `LATENCY_SAMPLE_EVERY`, as the operator samples it.
pub fn tokio_timer(ordered: bool, capacity: usize, latency: Duration, n: u64) -> Measurement {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        let start = Instant::now();
        let calls = futures::stream::iter(0..n).map(|i| async move {
            let invoked = (i % LATENCY_SAMPLE_EVERY == 0).then(Instant::now);
            tokio::time::sleep(latency).await;
            (i, invoked)
        });
        let mut latency_ns = histogram();
        let mut sink = CountingSink { count: 0, sum: 0 };
        let mut record = |(i, invoked): (u64, Option<Instant>)| {
            if let Some(invoked) = invoked {
                latency_ns.saturating_record(invoked.elapsed().as_nanos().max(1) as u64);
            }
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
            cpu: None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_driven_calls_take_their_latency_on_both_sides() {
        let latency = Duration::from_millis(1);
        for mode in [OutputMode::Unordered, OutputMode::Ordered] {
            let measured = weir_timer(mode, 10, latency, 50);
            let histogram = measured.latency_ns.expect("the operator samples latency");
            assert!(histogram.min() >= 1_000_000, "a call completed early");
            // Five rounds of 10 calls of 1 ms each, closed loop.
            assert!(measured.elapsed >= Duration::from_millis(5));
        }
        let measured = tokio_timer(false, 10, latency, 50);
        assert!(measured.latency_ns.expect("sampled").min() >= 1_000_000);
        assert!(weir_timer(OutputMode::Unordered, 4, latency, 0).elapsed < latency);
    }
}
