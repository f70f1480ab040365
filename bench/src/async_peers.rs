//! Async operator workloads, Weir's `AsyncWaitOperator` and the peers a Rust user would
//! reach for on a tokio current-thread runtime, doing the same work ([`Framework`]):
//! `futures`' `buffered` / `buffer_unordered` (a node allocated per call),
//! `futures-buffered`'s `buffered_ordered` / `buffered_unordered` (a fixed array of
//! slots), and a value-or-future fast path ([`ValueOrFuture`]: a call ready at its first
//! poll with nothing queued ahead is emitted without entering a queue).
//!
//! - latency 0: the call completes inside `invoke` (operator overhead per record of a
//!   call that completes at once, e.g. from a cache). Weir's operator takes its inline
//!   path (nothing stored); `futures` and `futures-buffered` queue every call; the fast
//!   path queues none, as Weir's;
//! - completed in batches: the calls of a full operator complete together on the
//!   task's thread, later (operator overhead per record of a call that returns
//!   through the completion queue, as an I/O client's do). Weir's loop completes them
//!   and drains the operator; tokio's calls are futures over slots that the loop driving
//!   the stream fills (no channel per call, no task in between), waking each call's
//!   future once;
//! - cross-thread: another thread completes each call (Flink's
//!   `AsyncWaitOperatorBenchmark` set-up: capacity 100, no timeout), one dedicated
//!   completer thread that spins;
//! - timer-driven latency L with capacity C: a closed loop whose physical limit is
//!   Little's law, C / L records per second; per-record latency from invoke to emit.
//!   Weir runs it as a task on a runtime worker: each call is a timer on a hashed
//!   timing wheel (the engine's, as the operator's own timeouts are; 64 µs ticks), the
//!   task reports the earliest timer as its deadline, and the idle worker parks until it
//!   (timer slack 1 ns). tokio's precise peer keeps its calls' deadlines in a heap and
//!   arms a `timerfd` at the earliest ([`tokio_precise_timer`]: a `timerfd` has no
//!   slack); the tick
//!   peer runs `tokio::time::sleep(L)` per call, whose 1 ms wheel rounds a deadline up
//!   to the next tick (a 1 ms sleep lasts 1 to 2 ms), as tokio users get by default.
//!
//! Every workload runs its driving thread on the first bench core (pinned at its start,
//! whatever ran before it on the comparison's thread).
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
use weir_engine::element::{Collector, Record, StreamElement};
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

/// Pins the calling thread to the first bench core (where there is one).
fn pin_first_core() {
    let (core_a, _) = crate::affinity::bench_cores();
    crate::affinity::pin(core_a);
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

/// Answers every input without a call ([`AsyncFunction::ready`]); `invoke` gives the
/// same answer where the operator calls it instead.
struct Ready;

impl AsyncFunction for Ready {
    type In = u64;
    type Out = u64;
    #[inline]
    fn ready(&mut self, input: &u64) -> Option<u64> {
        Some(*input)
    }
    #[inline]
    fn invoke(&mut self, input: &u64, result: ResultFuture<u64>) {
        result.complete_one(*input);
    }
    #[inline]
    fn key(&self, input: &u64) -> u64 {
        *input & 63
    }
}

/// `n` records through Weir's operator, each answered by [`AsyncFunction::ready`]: one
/// record at a time, or (`runs`) in runs of its free capacity.
pub fn weir_ready(mode: OutputMode, capacity: usize, n: u64, runs: bool) -> Measurement {
    run_through(Ready, mode, capacity, n, runs)
}

/// `n` records through Weir's operator over `function` (answering each input with
/// itself), timed: one record at a time, or (`runs`) in runs of its free capacity, as a
/// chain hands an async stage the runs it reads from its gate (each run filled from the
/// input sequence, then admitted in one call).
fn run_through<F>(function: F, mode: OutputMode, capacity: usize, n: u64, runs: bool) -> Measurement
where
    F: AsyncFunction<In = u64, Out = u64>,
{
    pin_first_core();
    let parker = Parker::current();
    let config = AsyncConfig::new(mode, capacity);
    let mut operator =
        AsyncWaitOperator::new(function, config, parker.unparker()).expect("valid config");
    let mut sink = CountingSink { count: 0, sum: 0 };
    let start = Instant::now();
    if runs {
        let mut run: Vec<Record<u64>> = Vec::with_capacity(capacity);
        let mut next = 0;
        while next < n {
            let end = n.min(next + operator.free_capacity() as u64);
            run.extend((next..end).map(|value| Record {
                value,
                timestamp: None,
            }));
            next = end;
            operator
                .process_run(run.drain(..), 0, &mut sink)
                .expect("no failure");
        }
    } else {
        for i in 0..n {
            operator
                .process_record(i, None, 0, &mut sink)
                .expect("no failure");
        }
    }
    let elapsed = start.elapsed();
    check(&sink, n);
    elapsed.into()
}

/// `n` records through Weir's operator with latency 0.
pub fn weir_immediate(mode: OutputMode, capacity: usize, n: u64) -> Measurement {
    pin_first_core();
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

/// `n` records through Weir's operator with latency 0, handed over in runs of
/// `capacity` ([`AsyncWaitOperator::process_run`]), as a chain hands an async stage the
/// runs it reads from its gate: each run is filled from the input sequence, then
/// admitted in one call.
pub fn weir_immediate_runs(mode: OutputMode, capacity: usize, n: u64) -> Measurement {
    run_through(Immediate, mode, capacity, n, true)
}

/// The framework a tokio peer runs its calls through, `capacity` in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framework {
    /// `futures::StreamExt::buffered` / `buffer_unordered`: a `FuturesOrdered` /
    /// `FuturesUnordered` that allocates a reference-counted node per call and wakes it
    /// through atomics.
    Futures,
    /// `futures_buffered::BufferedStreamExt::buffered_ordered` / `buffered_unordered`:
    /// a fixed array of slots, no allocation per call.
    FuturesBuffered,
    /// [`ValueOrFuture`]: a call whose future is ready at its first poll is emitted at
    /// once when nothing is queued ahead of it (always, unordered), without entering a
    /// queue; other calls wait in `futures_buffered`'s bounded queues.
    ValueOrFuture,
}

/// Runs `$body` with `$results` bound to the stream of outputs of `$calls` (a stream
/// of `Unpin` futures) through `$framework`, ordered or not, `$capacity` in flight.
/// Each arm is its own concrete type: no dynamic call per record.
macro_rules! with_results {
    ($framework:expr, $ordered:expr, $capacity:expr, $calls:expr, |$results:ident| $body:expr) => {{
        use futures_buffered::BufferedStreamExt as _;
        match ($framework, $ordered) {
            (Framework::Futures, true) => {
                let $results = $calls.buffered($capacity);
                $body
            }
            (Framework::Futures, false) => {
                let $results = $calls.buffer_unordered($capacity);
                $body
            }
            (Framework::FuturesBuffered, true) => {
                let $results = $calls.buffered_ordered($capacity);
                $body
            }
            (Framework::FuturesBuffered, false) => {
                let $results = $calls.buffered_unordered($capacity);
                $body
            }
            (Framework::ValueOrFuture, ordered) => {
                let $results = ValueOrFuture::new($calls, ordered, $capacity);
                $body
            }
        }
    }};
}

/// A stream adapter with a fast path for calls that complete at once: each call's
/// future is polled once as it arrives, and if it is ready and no earlier call is
/// still queued (or the stream is unordered), its value is emitted at once and the
/// call never enters a queue; otherwise it waits in a bounded `futures_buffered` queue
/// (ordered or not), at most `capacity` of them. What a tokio user writes when most
/// calls are answered from a cache. A call that is not ready at its first poll is
/// polled once more by the queue it joins: the price of looking before queueing, paid
/// only by calls that wait.
pub struct ValueOrFuture<St: futures::Stream>
where
    St::Item: std::future::Future,
{
    calls: futures::stream::Fuse<St>,
    ordered: bool,
    capacity: usize,
    in_order: futures_buffered::FuturesOrderedBounded<St::Item>,
    any_order: futures_buffered::FuturesUnorderedBounded<St::Item>,
}

impl<St> ValueOrFuture<St>
where
    St: futures::Stream + Unpin,
    St::Item: std::future::Future + Unpin,
{
    /// `calls` through the fast path, ordered or not, `capacity` queued at most.
    pub fn new(calls: St, ordered: bool, capacity: usize) -> Self {
        let capacity = capacity.max(1);
        ValueOrFuture {
            calls: calls.fuse(),
            ordered,
            capacity,
            in_order: futures_buffered::FuturesOrderedBounded::new(if ordered {
                capacity
            } else {
                1
            }),
            any_order: futures_buffered::FuturesUnorderedBounded::new(if ordered {
                1
            } else {
                capacity
            }),
        }
    }

    fn queued(&self) -> usize {
        if self.ordered {
            self.in_order.len()
        } else {
            self.any_order.len()
        }
    }
}

impl<St> futures::Stream for ValueOrFuture<St>
where
    St: futures::Stream + Unpin,
    St::Item: std::future::Future + Unpin,
{
    type Item = <St::Item as std::future::Future>::Output;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = self.get_mut();
        loop {
            if this.queued() > 0 {
                let ready = if this.ordered {
                    this.in_order.poll_next_unpin(cx)
                } else {
                    this.any_order.poll_next_unpin(cx)
                };
                if let Poll::Ready(Some(value)) = ready {
                    return Poll::Ready(Some(value));
                }
            }
            if this.queued() >= this.capacity {
                return Poll::Pending;
            }
            match this.calls.poll_next_unpin(cx) {
                Poll::Ready(Some(mut call)) => {
                    if !this.ordered || this.queued() == 0 {
                        if let Poll::Ready(value) =
                            std::future::Future::poll(std::pin::Pin::new(&mut call), cx)
                        {
                            return Poll::Ready(Some(value));
                        }
                    }
                    if this.ordered {
                        this.in_order.push_back(call);
                    } else {
                        this.any_order.push(call);
                    }
                }
                Poll::Ready(None) if this.queued() == 0 => return Poll::Ready(None),
                Poll::Ready(None) | Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// `n` records through `framework` with latency 0 (each call's future is ready at its
/// first poll), `capacity` in flight, on a tokio current-thread runtime.
pub fn tokio_immediate(
    framework: Framework,
    ordered: bool,
    capacity: usize,
    n: u64,
) -> Measurement {
    pin_first_core();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        let start = Instant::now();
        let calls = futures::stream::iter(0..n).map(std::future::ready);
        let fold = |(c, s): (u64, u64), v: u64| std::future::ready((c + 1, s.wrapping_add(v)));
        let (count, sum) = with_results!(framework, ordered, capacity, calls, |results| {
            results.fold((0u64, 0u64), fold).await
        });
        let elapsed = start.elapsed();
        check(&CountingSink { count, sum }, n);
        elapsed.into()
    })
}

/// Calls whose values the driving loop fills in: a slot per call in flight (no
/// allocation per call once the slab has grown), each with the waker of the call's
/// future while it waits.
#[derive(Default)]
struct Slots {
    slots: slab::Slab<(Option<u64>, Option<std::task::Waker>)>,
    /// Calls made since the driving loop last completed some: (slot, input, due).
    made: Vec<(usize, u64, u64)>,
}

/// A call's future: ready once the driving loop filled its slot.
struct SlotCall {
    slots: Rc<RefCell<Slots>>,
    slot: usize,
}

impl std::future::Future for SlotCall {
    type Output = u64;
    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<u64> {
        let mut slots = self.slots.borrow_mut();
        let entry = &mut slots.slots[self.slot];
        match entry.0.take() {
            Some(value) => {
                slots.slots.remove(self.slot);
                std::task::Poll::Ready(value)
            }
            None => {
                match &mut entry.1 {
                    Some(waker) if waker.will_wake(cx.waker()) => {}
                    waker => *waker = Some(cx.waker().clone()),
                }
                std::task::Poll::Pending
            }
        }
    }
}

impl Slots {
    /// A new call for `input`, due at `due_ns`.
    fn call(this: &Rc<RefCell<Slots>>, input: u64, due_ns: u64) -> SlotCall {
        let mut slots = this.borrow_mut();
        let slot = slots.slots.insert((None, None));
        slots.made.push((slot, input, due_ns));
        SlotCall {
            slots: Rc::clone(this),
            slot,
        }
    }

    /// Completes a call with `value` and wakes its future.
    fn complete(&mut self, slot: usize, value: u64) {
        let entry = &mut self.slots[slot];
        entry.0 = Some(value);
        if let Some(waker) = entry.1.take() {
            waker.wake();
        }
    }
}

/// Drives `results` on this task: polls it, and whenever it cannot go on, lets
/// `service` complete calls (it returns whether it completed any; if not, the task
/// waits for a wake-up it arranged). `record` sees every output.
async fn drive<S>(
    results: S,
    mut service: impl FnMut(&mut std::task::Context<'_>) -> bool,
    mut record: impl FnMut(S::Item),
) where
    S: futures::Stream,
{
    use std::task::Poll;
    let mut results = std::pin::pin!(results);
    futures::future::poll_fn(|cx| loop {
        match results.as_mut().poll_next(cx) {
            Poll::Ready(Some(item)) => record(item),
            Poll::Ready(None) => return Poll::Ready(()),
            Poll::Pending => {
                if !service(cx) {
                    return Poll::Pending;
                }
            }
        }
    })
    .await
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
    pin_first_core();
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

/// The same on a tokio current-thread runtime through `framework`: each call is a
/// future over a slot (`Slots`); the loop that drives the stream completes the calls
/// made so far, in input order, whenever the stream cannot go on (after `capacity` of
/// them), filling their slots and waking each call's future once: no channel per call,
/// no task in between, as an I/O client polled by the task's own loop completes calls.
pub fn tokio_batched(framework: Framework, ordered: bool, capacity: usize, n: u64) -> Measurement {
    pin_first_core();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        let slots = Rc::new(RefCell::new(Slots::default()));
        let mut batch = Vec::with_capacity(capacity);
        let start = Instant::now();
        let calls = {
            let slots = Rc::clone(&slots);
            futures::stream::iter(0..n).map(move |i| Slots::call(&slots, i, 0))
        };
        let mut sink = CountingSink { count: 0, sum: 0 };
        with_results!(framework, ordered, capacity, calls, |results| {
            drive(
                results,
                |_| {
                    let mut slots = slots.borrow_mut();
                    std::mem::swap(&mut batch, &mut slots.made);
                    let any = !batch.is_empty();
                    for (slot, input, _) in batch.drain(..) {
                        slots.complete(slot, input);
                    }
                    any
                },
                |v| {
                    sink.count += 1;
                    sink.sum = sink.sum.wrapping_add(v);
                },
            )
            .await
        });
        let elapsed = start.elapsed();
        check(&sink, n);
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

/// The same with tokio on this thread through `framework` (ordered or not, `capacity`
/// in flight): each call hands its input and a `tokio::sync::oneshot` sender to a
/// completer thread on the other core through an `rtrb` ring, and awaits the receiver;
/// the completer spins on the ring (the same backoff as Weir's completer) and answers
/// each call. The runtime parks while it waits; a reply wakes it.
pub fn tokio_cross_thread(
    framework: Framework,
    ordered: bool,
    capacity: usize,
    n: u64,
) -> Measurement {
    type Call = (u64, tokio::sync::oneshot::Sender<u64>);
    let (mut calls, mut incoming) = rtrb::RingBuffer::<Call>::new(capacity * 2);
    let (core_a, core_b) = crate::affinity::bench_cores();
    let completer = std::thread::spawn(move || {
        crate::affinity::pin(core_b);
        let mut backoff = crate::affinity::Backoff::default();
        let mut done = 0;
        while done < n {
            match incoming.pop() {
                Ok((input, reply)) => {
                    let _ = reply.send(input);
                    done += 1;
                    backoff.reset();
                }
                Err(_) => backoff.snooze(),
            }
        }
    });
    crate::affinity::pin(core_a);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime");
    let elapsed = runtime.block_on(async move {
        let start = Instant::now();
        let made = futures::stream::iter(0..n).map(move |i| {
            let (reply, answer) = tokio::sync::oneshot::channel();
            let mut call = (i, reply);
            // The ring holds twice the calls in flight: this only spins if the completer
            // thread is descheduled.
            while let Err(rtrb::PushError::Full(back)) = calls.push(call) {
                call = back;
                std::thread::yield_now();
            }
            answer
        });
        let fold = |(c, s): (u64, u64), v: Result<u64, _>| {
            std::future::ready((c + 1, s.wrapping_add(v.expect("the completer answers"))))
        };
        let (count, sum) = with_results!(framework, ordered, capacity, made, |results| {
            results.fold((0u64, 0u64), fold).await
        });
        check(&CountingSink { count, sum }, n);
        start.elapsed()
    });
    completer.join().expect("completer thread");
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
    pin_first_core();
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

/// A `timerfd` on `CLOCK_MONOTONIC`, non-blocking, armed at absolute deadlines.
struct TimerFd(std::os::fd::OwnedFd);

impl TimerFd {
    fn new() -> std::io::Result<TimerFd> {
        use std::os::fd::FromRawFd as _;
        // SAFETY: timerfd_create takes two integer arguments and reads no memory.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        Ok(TimerFd(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    /// Fires once at `deadline_ns` on the monotonic clock ([`monotonic_ns`]).
    fn arm_at(&self, deadline_ns: u64) {
        use std::os::fd::AsRawFd as _;
        let value = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
                // An all-zero value would disarm it.
                tv_nsec: (deadline_ns % 1_000_000_000).max(1) as libc::c_long,
            },
        };
        // SAFETY: `value` is a valid itimerspec for the call's duration; the old value
        // is not asked for (null).
        let rc = unsafe {
            libc::timerfd_settime(
                self.0.as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &value,
                std::ptr::null_mut(),
            )
        };
        assert_eq!(
            rc,
            0,
            "timerfd_settime: {}",
            std::io::Error::last_os_error()
        );
    }

    /// Consumes the expirations, if any.
    fn clear(&self) {
        use std::os::fd::AsRawFd as _;
        let mut expirations = 0u64;
        // SAFETY: reads at most 8 bytes into `expirations`, which has 8.
        let _ = unsafe {
            libc::read(
                self.0.as_raw_fd(),
                (&mut expirations as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }
}

impl std::os::fd::AsRawFd for TimerFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

/// Nanoseconds on `CLOCK_MONOTONIC` (the clock a `timerfd` is armed on).
fn monotonic_ns() -> u64 {
    crate::wake_cost::clock_ns(libc::CLOCK_MONOTONIC)
}

/// The same closed loop on tokio with a precise timer, as Weir's side has one: each call
/// is a future over a slot (`Slots`) whose deadline (call time + `latency`) goes into a
/// binary heap on the task; the loop that drives `futures_buffered`'s
/// `buffered_ordered` / `buffered_unordered` completes the due calls and arms one
/// `timerfd` (registered with tokio's reactor through `AsyncFd`) at the earliest
/// deadline; a `timerfd` expires at its deadline (no timer slack applies to it) and the
/// runtime, which has no time driver, waits in `epoll_wait` without a timeout. So a 1 ms
/// call takes 1 ms and a little, not up to tokio's next 1 ms tick.
pub fn tokio_precise_timer(
    ordered: bool,
    capacity: usize,
    latency: Duration,
    n: u64,
) -> Measurement {
    use std::cmp::Reverse;
    use std::task::Poll;
    pin_first_core();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        let timerfd = TimerFd::new().expect("timerfd");
        // SAFETY: the descriptor is owned by `timerfd`, which the `AsyncFd` owns from
        // here until it is dropped; `as_raw_fd` always returns that one descriptor.
        let timer = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(timerfd, tokio::io::Interest::READABLE)
        }
        .expect("timerfd registered");
        let latency_ns = latency.as_nanos() as u64;
        let slots = Rc::new(RefCell::new(Slots::default()));
        let mut due: std::collections::BinaryHeap<Reverse<(u64, usize, u64)>> =
            std::collections::BinaryHeap::with_capacity(capacity);
        let mut armed = None;
        let mut made = Vec::with_capacity(capacity);
        let start = Instant::now();
        let calls = {
            let slots = Rc::clone(&slots);
            futures::stream::iter(0..n).map(move |i| {
                let invoked = (i % LATENCY_SAMPLE_EVERY == 0).then(Instant::now);
                let call = Slots::call(&slots, i, monotonic_ns() + latency_ns);
                async move { (call.await, invoked) }
            })
        };
        let mut latency_ns_histogram = histogram();
        let mut sink = CountingSink { count: 0, sum: 0 };
        let service = |cx: &mut std::task::Context<'_>| loop {
            let mut slots = slots.borrow_mut();
            std::mem::swap(&mut made, &mut slots.made);
            for (slot, input, at) in made.drain(..) {
                due.push(Reverse((at, slot, input)));
            }
            let now = monotonic_ns();
            let mut any = false;
            while let Some(&Reverse((at, slot, input))) = due.peek() {
                if at > now {
                    break;
                }
                due.pop();
                slots.complete(slot, input);
                any = true;
            }
            if any {
                return true;
            }
            let Some(&Reverse((next, _, _))) = due.peek() else {
                return false;
            };
            if armed != Some(next) {
                timer.get_ref().arm_at(next);
                armed = Some(next);
            }
            match timer.poll_read_ready(cx) {
                Poll::Ready(Ok(mut guard)) => {
                    guard.get_inner().clear();
                    guard.clear_ready();
                    armed = None;
                }
                Poll::Ready(Err(e)) => panic!("timerfd: {e}"),
                Poll::Pending => return false,
            }
        };
        let record = |(i, invoked): (u64, Option<Instant>)| {
            if let Some(invoked) = invoked {
                latency_ns_histogram.saturating_record(invoked.elapsed().as_nanos().max(1) as u64);
            }
            sink.count += 1;
            sink.sum = sink.sum.wrapping_add(i);
        };
        {
            use futures_buffered::BufferedStreamExt as _;
            if ordered {
                drive(calls.buffered_ordered(capacity), service, record).await;
            } else {
                drive(calls.buffered_unordered(capacity), service, record).await;
            }
        }
        let elapsed = start.elapsed();
        check(&sink, n);
        Measurement {
            elapsed,
            latency_ns: Some(latency_ns_histogram),
            cpu: None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every framework, ordered and not, emits every record once, at latency 0 and with
    /// calls completed in batches by the driving loop (each workload checks count and
    /// sum before it reports).
    #[test]
    fn every_tokio_peer_emits_every_record_once() {
        let _cores = crate::affinity::exclusive_cores();
        for framework in [
            Framework::Futures,
            Framework::FuturesBuffered,
            Framework::ValueOrFuture,
        ] {
            for ordered in [false, true] {
                for (capacity, n) in [(1, 10), (4, 1_000), (100, 10_000)] {
                    tokio_immediate(framework, ordered, capacity, n);
                    tokio_batched(framework, ordered, capacity, n);
                    tokio_cross_thread(framework, ordered, capacity, n);
                }
            }
        }
    }

    /// The fast path emits in input order when ordered, even when calls ahead of a
    /// ready one are still pending.
    #[test]
    fn value_or_future_keeps_the_order() {
        let _cores = crate::affinity::exclusive_cores();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("tokio runtime");
        runtime.block_on(async {
            let slots = Rc::new(RefCell::new(Slots::default()));
            // Even inputs wait for the loop; odd ones are ready at once.
            let calls = {
                let slots = Rc::clone(&slots);
                futures::stream::iter(0..200u64).map(move |i| {
                    if i % 2 == 0 {
                        futures::future::Either::Left(Slots::call(&slots, i, 0))
                    } else {
                        futures::future::Either::Right(std::future::ready(i))
                    }
                })
            };
            let mut out = Vec::new();
            drive(
                ValueOrFuture::new(calls, true, 8),
                |_| {
                    let mut slots = slots.borrow_mut();
                    let made = std::mem::take(&mut slots.made);
                    for (slot, input, _) in made.iter().rev() {
                        slots.complete(*slot, *input);
                    }
                    !made.is_empty()
                },
                |v| out.push(v),
            )
            .await;
            assert_eq!(out, (0..200).collect::<Vec<_>>());
        });
    }

    #[test]
    fn timer_driven_calls_take_their_latency_on_both_sides() {
        let _cores = crate::affinity::exclusive_cores();
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
        for ordered in [false, true] {
            let measured = tokio_precise_timer(ordered, 10, latency, 50);
            assert!(measured.latency_ns.expect("sampled").min() >= 1_000_000);
            assert!(measured.elapsed >= Duration::from_millis(5));
        }
        assert!(weir_timer(OutputMode::Unordered, 4, latency, 0).elapsed < latency);
    }
}
