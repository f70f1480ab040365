//! The async wait operator itself: entries in a slab, emission order from `queue`,
//! timeouts in a deadline list through the entries, retry delays on a timing wheel,
//! completions from `future`.
//!
//! Entry lifecycle (`State`):
//! ```text
//! InFlight --result/error, retry applies--> RetryWaiting --retry timer--> InFlight
//! InFlight | RetryWaiting --timeout--> TimedOut (the timeout hook runs)
//! InFlight | TimedOut --result (or last attempt)--> Done --emitted--> removed
//! InFlight | TimedOut --error, no retry--> the operator fails
//! ```
//! Every invocation (first call, retry, timeout hook) gets a new `attempt` number; a
//! completion whose attempt or slab generation no longer matches is stale and ignored,
//! which is how "first completion wins" and "a result after the timeout is ignored"
//! hold without cancelling the call itself.
//!
//! Timeouts need no timer: every record shares the one timeout, so deadlines grow with
//! the time of the first invocation, and the records whose timeout runs are kept in a
//! *deadline list* threaded through their entries, in deadline order. A record joins at
//! the tail (walking back past later deadlines only if the caller's clock went back)
//! and leaves in O(1) when it completes or times out; the head is the next timeout, so
//! [`next_timer_deadline`] is exact (always a live record's deadline) and read without
//! a search. Per record that is a few link updates where a timer per record cost a
//! wheel node scheduled and cancelled. Retry delays differ per attempt and are timers
//! on a timing wheel (the operator's own, or its worker's), cancelled in O(1) through
//! the [`TimerKey`] kept in the entry the moment they stop mattering (a retry is
//! attempted early at end of input, a timeout overtakes the delay). [`pending_timers`]
//! counts both and stays bounded by twice the capacity.
//!
//! [`pending_timers`]: AsyncWaitOperator::pending_timers
//! [`next_timer_deadline`]: AsyncWaitOperator::next_timer_deadline
//!
//! A call that completes inside `invoke` (on the operator's thread, before anything
//! else completes) and may leave at once — no watermark pending, and in ordered mode no
//! record held, in keyed-ordered mode none of its key, and no retry applies to its
//! results — is emitted without an entry: the call is made with the input borrowed
//! before the entry would be stored, so such a record costs no slab slot, chain link,
//! timer or queue round trip. Any other outcome is queued ahead of later completions
//! and applied to the stored entry like every completion.
//!
//! A function that knows some answers without a call says so in
//! [`AsyncFunction::ready`]: where a record may leave at once (as above) and no retry or
//! cache is configured, its answer is emitted before any of the call's machinery (slot
//! key, handle, inline slot) is touched; a function that keeps the default pays nothing,
//! the branch being removed with the constant `None`.
//!
//! Runs ([`AsyncWaitOperator::process_run`]) admit records one after the other through
//! the same per-record step as [`AsyncWaitOperator::process_record`], with the failure
//! and capacity checks, the counters, the latency sample of the calls completed inside
//! `invoke` and the look for other threads' completions taken once per run. A completion
//! a record's call leaves in this thread's queue is applied before the next record, as
//! one at a time, so where calls complete on the operator's thread a run emits what its
//! records one at a time would, in the same order, and fails at the same record
//! (`engine/tests/async_runs.rs`). Completions from other threads are looked for once, at
//! the end of the run: in unordered mode they may come out later among the run's
//! outputs than one record at a time would have them, and an error among them fails the
//! operator after the run's calls are made.
//!
//! With a lookup cache (`cache.rs`), a record is looked up before its call: a hit that
//! may leave at once is emitted there, as an answer from `ready` is (its results passed
//! the retry strategy when they were stored); any other hit completes the record's
//! handle at once with the cached results, taking exactly the path of a call completed
//! inside `invoke` (queued ahead of later completions). A miss calls the function;
//! its results are stored in the cache when they stand: at once if the call completed
//! inside `invoke` and leaves at once, else when its entry completes (the entry is
//! marked `loading`; a timeout clears the mark, as its hook's outcome is no lookup).
//!
//! What an operator without a cache pays for this per record: one branch on
//! `cache.is_some()` before the call (the lookup itself is cold and out of line); an
//! inline completion's existing branch on the retry strategy now tests one flag for
//! "retry or cache"; a stored entry carries the `loading` flag, tested when it
//! completes. Hits and misses share the one call site of `invoke` with uncached records:
//! a second call site (a copy of the path for the cache) cost a latency-0 loop the
//! inlining of `invoke`, 34 more instructions per record by `scripts/callgrind.sh`.
//!
//! Owned by one thread (the operator is not `Send`): construct it on the task's thread.

use std::marker::PhantomData;

use super::cache::LookupStore;
use super::future::{Completion, CompletionQueue, Outcome, Results};
use super::queue::{Chains, Segments};
use super::{
    AsyncConfig, AsyncError, AsyncFunction, AsyncMetrics, OperatorError, OutputMode, RetryStrategy,
};
use crate::element::{Collector, Record, StreamElement, Watermark};
use crate::error::ConfigError;
use crate::limits::{LATENCY_SAMPLE_EVERY, TIMER_SLOTS, TIMER_TICK_NS};
use crate::park::Notify;
use crate::slab::{Key, Slab};
use crate::timer::{TimerKey, TimerOwner, TimerPayload, TimerWheel, WorkerTimers};

/// Where an entry stands (see the lifecycle above). A plain tag: the results of a done
/// entry wait in `Entry::results`, so checking the state is one byte compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    InFlight,
    RetryWaiting,
    TimedOut,
    /// Completed; its results wait in `Entry::results` to be emitted.
    Done,
}

struct Entry<In, Out> {
    input: In,
    timestamp: Option<i64>,
    /// Chain key (the user's key in keyed mode, 0 otherwise).
    key: u64,
    /// Input order, for snapshots.
    sequence: u64,
    epoch: u64,
    attempt: u32,
    invocations: u32,
    state: State,
    /// The results of a done entry (`Results::Empty` otherwise).
    results: Results<Out>,
    /// In the deadline list (its timeout runs): until it fires or the record completes.
    /// Its deadline is `first_invoked_ns` plus the timeout.
    timing: bool,
    /// Its neighbours in the deadline list.
    prev_deadline: Option<Key>,
    next_deadline: Option<Key>,
    /// The retry-delay timer, while the entry waits for its next attempt.
    retry_timer: Option<TimerKey>,
    /// Attempted at once at end of input: its outcome stands (no further retry).
    final_attempt: bool,
    /// Called after a lookup-cache miss: its results are stored when they stand.
    loading: bool,
    next_in_chain: Option<Key>,
    next_parked: Option<Key>,
    first_invoked_ns: u64,
}

/// A retry delay's timer: the entry and the attempt it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TimerEvent {
    slot: Key,
    attempt: u32,
}

impl TimerEvent {
    fn encode(self) -> TimerPayload {
        TimerPayload(self.slot.to_u64(), self.attempt)
    }

    fn decode(payload: TimerPayload) -> Self {
        TimerEvent {
            slot: Key::from_u64(payload.0),
            attempt: payload.1,
        }
    }
}

/// The records whose timeout runs, in deadline order: a doubly linked list threaded
/// through their entries (see the module docs).
struct Deadlines {
    head: Option<Key>,
    tail: Option<Key>,
    len: usize,
    /// The head's deadline, `u64::MAX` when the list is empty (read on every worker
    /// turn, so kept here rather than looked up in the slab).
    first_ns: u64,
}

/// Where an operator's timers live: its own wheel (an operator driven by hand, as in
/// the harness and the benchmarks), or its worker's wheel, shared by every operator on
/// that worker (when built on a runtime worker: see [`WorkerTimers`]).
enum Timers {
    Own(TimerWheel<TimerEvent>),
    Worker(TimerOwner),
}

impl Timers {
    fn new() -> Self {
        match WorkerTimers::current() {
            Some(worker) => Timers::Worker(worker.register()),
            None => Timers::Own(TimerWheel::new(TIMER_TICK_NS, TIMER_SLOTS)),
        }
    }

    #[inline]
    fn schedule(&mut self, deadline_ns: u64, event: TimerEvent) -> TimerKey {
        match self {
            Timers::Own(wheel) => wheel.schedule(deadline_ns, event),
            Timers::Worker(owner) => owner.schedule(deadline_ns, event.encode()),
        }
    }

    #[inline]
    fn cancel(&mut self, key: TimerKey) {
        match self {
            Timers::Own(wheel) => {
                wheel.cancel(key);
            }
            Timers::Worker(owner) => {
                owner.cancel(key);
            }
        }
    }

    fn peek_due(&mut self, limit_ns: u64) -> Option<u64> {
        match self {
            Timers::Own(wheel) => wheel.peek_due(limit_ns),
            Timers::Worker(owner) => owner.peek_due(limit_ns),
        }
    }

    fn pop_due(&mut self, limit_ns: u64) -> Option<(u64, TimerEvent)> {
        match self {
            Timers::Own(wheel) => wheel.pop_due(limit_ns),
            Timers::Worker(owner) => owner
                .pop_due(limit_ns)
                .map(|(deadline, payload)| (deadline, TimerEvent::decode(payload))),
        }
    }

    /// Own wheel: its earliest deadline. Worker's wheel: the earliest of this
    /// operator's timers that came due (the worker watches the wheel for the others).
    fn next_deadline(&self) -> Option<u64> {
        match self {
            Timers::Own(wheel) => wheel.next_deadline(),
            Timers::Worker(owner) => owner.next_due(),
        }
    }
}

/// Flink's `AsyncWaitOperator`. See the module docs of `async_io` for the semantics.
///
/// The task drives it: [`process_record`](Self::process_record) and
/// [`process_watermark`](Self::process_watermark) for input (the caller first waits
/// while [`is_full`](Self::is_full): back-pressure), [`drain`](Self::drain) when
/// completions may have arrived, [`fire_due_timer`](Self::fire_due_timer) when time
/// passes, [`begin_finish`](Self::begin_finish) at end of input. Every call takes the
/// current time of the task's clock in nanoseconds and a [`Collector`] for what it
/// emits.
///
/// ```
/// use weir_engine::async_io::{AsyncConfig, AsyncFunction, AsyncWaitOperator, OutputMode, ResultFuture};
/// use weir_engine::element::StreamElement;
///
/// /// Doubles its input; the call completes within `invoke`.
/// struct Double;
/// impl AsyncFunction for Double {
///     type In = u64;
///     type Out = u64;
///     fn invoke(&mut self, n: &u64, result: ResultFuture<u64>) {
///         result.complete_one(n * 2);
///     }
/// }
///
/// // No other thread completes calls here, so nothing needs waking (`|| {}`).
/// let config = AsyncConfig::new(OutputMode::Ordered, 8);
/// let mut operator = AsyncWaitOperator::new(Double, config, || {})?;
/// let mut out = Vec::new();
/// for n in 1..=3 {
///     operator.process_record(n, None, 0, &mut out)?;
/// }
/// operator.process_watermark(10, 0, &mut out)?;
/// assert_eq!(
///     out,
///     [
///         StreamElement::record(2, None),
///         StreamElement::record(4, None),
///         StreamElement::record(6, None),
///         StreamElement::watermark(10),
///     ]
/// );
/// assert_eq!(operator.in_flight(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct AsyncWaitOperator<F: AsyncFunction> {
    function: F,
    timeout_ns: Option<u64>,
    retry: Option<RetryStrategy<F::Out>>,
    mode: OutputMode,
    capacity: usize,
    entries: Slab<Entry<F::In, F::Out>>,
    chains: Chains,
    segments: Segments,
    timers: Timers,
    deadlines: Deadlines,
    /// Retry-delay timers pending in `timers`.
    retry_timers: usize,
    completions: CompletionQueue<F::Out>,
    /// The lookup cache, if configured (see the module docs).
    cache: Option<Box<dyn LookupStore<F::In, F::Out>>>,
    /// Whether the record being processed was a cache hit (written by each lookup).
    cache_hit: bool,
    /// A retry strategy or a cache is configured: a call completed inside `invoke` takes
    /// the branch that checks its results and stores cache loads.
    inline_slow: bool,
    next_sequence: u64,
    /// Calls completed inside `invoke` by runs since the last latency sample taken for
    /// them (below `LATENCY_SAMPLE_EVERY`).
    inline_unsampled: u64,
    closed: bool,
    failure: Option<String>,
    metrics: AsyncMetrics,
    _not_send: PhantomData<*const ()>,
}

impl<F: AsyncFunction> AsyncWaitOperator<F> {
    /// An operator over `function`; `notify` wakes the task when another thread
    /// completes a call. Calls [`AsyncFunction::open`].
    pub fn new(
        mut function: F,
        config: AsyncConfig<F::Out>,
        notify: impl Notify,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        function.validate()?;
        let capacity = config.capacity;
        let cache = match &config.cache {
            None => None,
            Some(spec) => Some(
                *spec
                    .build()
                    .downcast::<Box<dyn LookupStore<F::In, F::Out>>>()
                    .map_err(|_| {
                        ConfigError::Inconsistent(
                            "the lookup cache's key function takes another input type than \
                             the async function: make the LookupCache for AsyncFunction::In",
                        )
                    })?,
            ),
        };
        let inline_slow = config.retry.is_some() || cache.is_some();
        function.open();
        Ok(AsyncWaitOperator {
            function,
            timeout_ns: config
                .timeout
                .map(|t| t.as_nanos().min(u128::from(u64::MAX / 2)) as u64),
            retry: config.retry,
            mode: config.mode,
            capacity,
            entries: Slab::new(capacity)?,
            chains: Chains::new(config.mode, capacity),
            segments: Segments::new(capacity),
            timers: Timers::new(),
            deadlines: Deadlines {
                head: None,
                tail: None,
                len: 0,
                first_ns: u64::MAX,
            },
            retry_timers: 0,
            completions: CompletionQueue::new(capacity, Box::new(notify)),
            inline_slow,
            cache,
            cache_hit: false,
            next_sequence: 0,
            inline_unsampled: 0,
            closed: false,
            failure: None,
            metrics: AsyncMetrics::new(),
            _not_send: PhantomData,
        })
    }

    /// The output mode.
    pub fn mode(&self) -> OutputMode {
        self.mode
    }

    /// Elements held: records in flight or waiting to be emitted, and watermarks
    /// waiting to be emitted.
    pub fn in_flight(&self) -> usize {
        self.entries.len() + self.segments.pending_watermarks()
    }

    /// Elements it takes before it is full: what a run may bring at once.
    pub fn free_capacity(&self) -> usize {
        self.capacity.saturating_sub(self.in_flight())
    }

    /// Whether the next element must wait (back-pressure).
    pub fn is_full(&self) -> bool {
        self.in_flight() >= self.capacity
    }

    /// Timeouts running and retry delays pending (at most two per element held).
    pub fn pending_timers(&self) -> usize {
        self.deadlines.len + self.retry_timers
    }

    /// The earliest pending timer's deadline. Exact (a completed record's timeout stops
    /// at once), and found without scanning: the head of the deadline list, or the
    /// wheel's first retry delay. On a runtime worker, whose wheel this operator shares,
    /// only retry delays already due are reported (the worker watches its wheel for the
    /// rest); timeouts always are.
    pub fn next_timer_deadline(&self) -> Option<u64> {
        self.timeout_due(u64::MAX)
            .into_iter()
            .chain(self.timers.next_deadline())
            .chain(self.function.pending_deadline())
            .min()
    }

    /// Handles issued and not yet completed (some may be on their way from other threads).
    pub fn outstanding_calls(&self) -> usize {
        self.completions.outstanding()
    }

    /// Whether a completion is waiting to be drained.
    pub fn has_completions(&self) -> bool {
        !self.completions.is_empty()
    }

    /// Counters and the latency histogram.
    pub fn metrics(&self) -> &AsyncMetrics {
        &self.metrics
    }

    /// Adds time the task spent waiting for capacity.
    pub fn add_backpressured_ns(&mut self, ns: u64) {
        self.metrics.backpressured_ns += ns;
    }

    /// The user's function.
    pub fn function(&self) -> &F {
        &self.function
    }

    /// Err if the operator has failed.
    #[inline]
    pub fn check(&self) -> Result<(), OperatorError> {
        match &self.failure {
            Some(cause) => Err(Self::failed(cause)),
            None => Ok(()),
        }
    }

    #[cold]
    fn failed(cause: &str) -> OperatorError {
        OperatorError::Failed {
            cause: cause.to_owned(),
        }
    }

    /// Starts the call for a record. The caller must have waited while
    /// [`is_full`](Self::is_full). Completions made inside `invoke` are processed
    /// before this returns.
    ///
    /// For a run of records, [`process_run`](Self::process_run) does the same with its
    /// bookkeeping paid once per run.
    ///
    /// # Panics
    /// If the operator is full (a caller bug: it must wait first).
    // A hint, so that whether a caller's loop inlines the per-record path does not turn
    // on how unrelated code is split into codegen units (measured: 131 instructions per
    // record inlined, 168 called, with the same operator code).
    #[inline]
    pub fn process_record(
        &mut self,
        value: F::In,
        timestamp: Option<i64>,
        now_ns: u64,
        out: &mut impl Collector<F::Out>,
    ) -> Result<(), OperatorError> {
        self.check()?;
        assert!(
            !self.is_full(),
            "process_record on a full async operator: wait while is_full()"
        );
        let sequence = self.next_sequence;
        if self.admit(value, timestamp, now_ns, out) {
            self.metrics.completed += 1;
            self.metrics.emitted += 1;
            if sequence % LATENCY_SAMPLE_EVERY == 0 {
                // Completed within the call: the latency is below the clock's resolution.
                self.metrics.latency_ns.saturating_record(1);
            }
        }
        self.drain_if_waiting(now_ns, out)
    }

    /// Starts the calls for a run of records, in order, all at time `now_ns`: what
    /// [`process_record`](Self::process_record) does for each, with the same outputs in
    /// the same order, but with the failure check, the capacity check, the counters, the
    /// latency sample of the calls completed inside `invoke` and the look for other
    /// completions made once per run instead of once per record. A run therefore holds
    /// at most [`free_capacity`](Self::free_capacity) records (a chain hands an async
    /// stage no more).
    ///
    /// A call that fails inside `invoke` fails the operator before the run's next record,
    /// as in the per-record form: the error is returned and the rest of the run is
    /// dropped uncalled (the task fails with it). Completions from other threads are
    /// looked for once, at the end of the run.
    ///
    /// # Panics
    /// If the run holds more records than the operator's free capacity (a caller bug).
    ///
    /// ```
    /// use weir_engine::async_io::{AsyncConfig, AsyncFunction, AsyncWaitOperator, OutputMode, ResultFuture};
    /// use weir_engine::element::{Record, StreamElement};
    ///
    /// struct Double;
    /// impl AsyncFunction for Double {
    ///     type In = u64;
    ///     type Out = u64;
    ///     fn invoke(&mut self, n: &u64, result: ResultFuture<u64>) {
    ///         result.complete_one(n * 2);
    ///     }
    /// }
    ///
    /// let mut operator = AsyncWaitOperator::new(Double, AsyncConfig::new(OutputMode::Ordered, 8), || {})?;
    /// let mut run: Vec<Record<u64>> = (1..=3).map(|n| Record { value: n, timestamp: None }).collect();
    /// let mut out = Vec::new();
    /// operator.process_run(run.drain(..), 0, &mut out)?;
    /// assert_eq!(
    ///     out,
    ///     [StreamElement::record(2, None), StreamElement::record(4, None), StreamElement::record(6, None)]
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn process_run<I>(
        &mut self,
        records: I,
        now_ns: u64,
        out: &mut impl Collector<F::Out>,
    ) -> Result<(), OperatorError>
    where
        I: IntoIterator<Item = Record<F::In>>,
        I::IntoIter: ExactSizeIterator,
    {
        self.check()?;
        let records = records.into_iter();
        assert!(
            records.len() <= self.free_capacity(),
            "process_run with a run of {} on an async operator with room for {}: \
             hand it at most free_capacity() records",
            records.len(),
            self.free_capacity()
        );
        let mut inline = 0u64;
        for record in records {
            inline += u64::from(self.admit(record.value, record.timestamp, now_ns, out));
            // A completion this thread made and could not hand over at once (one that may
            // not leave yet, an error, another record's handle completed inside the call)
            // is applied before the next record, as the per-record form applies it: the
            // run's outputs and failures then come in the same order. One load of an
            // owner-only length; other threads' completions wait for the end of the run.
            if self.completions.has_local() {
                if let Err(error) = self.drain(now_ns, out) {
                    self.count_inline(inline);
                    return Err(error);
                }
            }
        }
        self.count_inline(inline);
        self.drain_if_waiting(now_ns, out)
    }

    /// Counts `inline` calls of a run completed inside `invoke` (or answered by `ready`)
    /// and emitted at once.
    #[inline]
    fn count_inline(&mut self, inline: u64) {
        if inline > 0 {
            self.metrics.completed += inline;
            self.metrics.emitted += inline;
            // One sample per LATENCY_SAMPLE_EVERY calls completed inside `invoke`, as the
            // per-record form takes them, recorded in one step (below the clock's
            // resolution: 1 ns); the remainder carries over to the next run.
            let due = self.inline_unsampled + inline;
            self.inline_unsampled = due % LATENCY_SAMPLE_EVERY;
            let samples = due / LATENCY_SAMPLE_EVERY;
            if samples > 0 {
                self.metrics.latency_ns.saturating_record_n(1, samples);
            }
        }
    }

    /// Makes the call for one record, the operator known not to be full and not failed.
    /// Returns true if the call completed inside `invoke` and its results were emitted
    /// at once, without an entry (the caller counts it); otherwise the record holds an
    /// entry, and any completion of it made inside `invoke` waits in the queue for the
    /// caller's drain. Shared by both forms, always inlined into each (one copy of the
    /// call site per form).
    #[inline(always)]
    fn admit(
        &mut self,
        value: F::In,
        timestamp: Option<i64>,
        now_ns: u64,
        out: &mut impl Collector<F::Out>,
    ) -> bool {
        let key = match self.mode {
            OutputMode::KeyedOrdered => self.function.key(&value),
            OutputMode::Ordered | OutputMode::Unordered => 0,
        };
        // An answer known without a call, where it may leave at once: emitted here, with
        // no handle, slot or queue. For a function that keeps the default `ready`
        // (always `None`) the compiler removes this branch and its checks; the future
        // wrappers, whose `ready` is optional, pay one check of an `Option` here.
        if !self.inline_slow && self.may_leave_at_once(key) {
            if let Some(result) = self.function.ready(&value) {
                self.next_sequence += 1;
                self.metrics.ready += 1;
                out.collect(StreamElement::Record(Record {
                    value: result,
                    timestamp,
                }));
                return true;
            }
        }
        let Some(slot) = self.entries.next_key() else {
            unreachable!("slab has a slot per unit of capacity and the operator is not full");
        };
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        // With a lookup cache, the record is looked up first (out of line). A hit that may
        // leave at once is emitted here, like an answer from `ready` (its results passed
        // the retry strategy when they were stored); another hit completes the record's
        // handle below and makes no call.
        let hit = match self
            .cache
            .is_some()
            .then(|| self.look_up(&value, now_ns))
            .flatten()
        {
            Some(results) if self.may_leave_at_once(key) => {
                results.for_each(|value| {
                    out.collect(StreamElement::Record(Record { value, timestamp }))
                });
                return true;
            }
            hit => hit,
        };
        // The call is made before the entry is stored, with the input borrowed from
        // here: a call that completes inside `invoke` (a cache hit, a computed answer)
        // and may leave at once never touches the slab, the chains or the wheel.
        self.completions.arm_inline(slot);
        // A miss and an operator without a cache share the call below, the one call site
        // of `invoke` on this path (see the module docs).
        match hit {
            Some(results) => self.complete_hit(results, slot),
            None => {
                let handle = self.completions.issue(slot, 0);
                self.function.invoke_at(&value, handle, now_ns);
            }
        }
        if let Some(outcome) = self.completions.take_inline() {
            match self.emit_completed_inline(key, outcome, timestamp, (&value, now_ns), out) {
                None => return true,
                Some(outcome) => self.completions.push_front(Completion {
                    key: slot,
                    attempt: 0,
                    outcome,
                }),
            }
        }
        let epoch = self.segments.tail_epoch();
        // Built in its slot (see `Slab::insert_with`), sparing a copy of a large entry.
        let inserted = self.entries.insert_with(move || Entry {
            input: value,
            timestamp,
            key,
            sequence,
            epoch,
            attempt: 0,
            invocations: 1,
            state: State::InFlight,
            results: Results::Empty,
            timing: false,
            prev_deadline: None,
            next_deadline: None,
            retry_timer: None,
            final_attempt: false,
            loading: false,
            next_in_chain: None,
            next_parked: None,
            first_invoked_ns: now_ns,
        });
        debug_assert_eq!(inserted.ok(), Some(slot), "next_key names the next slot");
        if self.cache.is_some() && !self.cache_hit {
            // A miss: its results are stored when they stand.
            self.entry_mut(slot).loading = true;
        }
        // Unordered mode keeps no chains: its mode is checked here, one byte, rather than
        // by matching the chains (whose tag hides in a map's pointer).
        if self.mode != OutputMode::Unordered {
            if let Some(previous) = self.chains.append(key, slot) {
                self.entry_mut(previous).next_in_chain = Some(slot);
            }
        }
        self.segments.tail_mut().remaining += 1;
        if self.timeout_ns.is_some() {
            self.link_deadline(slot);
            self.note_timers();
        }
        if F::BUFFERS && self.is_full() {
            // Nothing else could free a slot before the held calls' deadline.
            self.function.flush_pending(now_ns, true);
        }
        false
    }

    /// The fast path of a call completed inside `invoke`, before its entry was stored:
    /// emits its results now if nothing the mode orders before it is held (no pending
    /// watermark; in ordered mode no record at all, in keyed-ordered mode none of its
    /// key) and no retry applies to them. Otherwise hands the completion back, to be
    /// applied to the stored entry like any other.
    ///
    /// `load`: the input and the time, to store the results of a lookup-cache miss
    /// before they are emitted.
    // Always inlined: outlined, the call and the moves of its outcome through memory were
    // a third of the latency-0 path's instructions in a run (`scripts/instructions.sh`).
    #[inline(always)]
    fn emit_completed_inline(
        &mut self,
        key: u64,
        outcome: Outcome<F::Out>,
        timestamp: Option<i64>,
        load: (&F::In, u64),
        out: &mut impl Collector<F::Out>,
    ) -> Option<Outcome<F::Out>> {
        let emittable = self.may_leave_at_once(key);
        let results = match outcome {
            Outcome::Results(results) if emittable => results,
            outcome => return Some(outcome),
        };
        // One branch, on a flag fixed for the operator's life, for both rarer cases: a
        // retry strategy that may reject the results, and a cache load to store
        // (completed within the call: a load time of 0).
        if self.inline_slow {
            if self.may_retry(1, false)
                && self
                    .retry
                    .as_ref()
                    .is_some_and(|r| r.should_retry_result(results.as_slice()))
            {
                return Some(Outcome::Results(results));
            }
            if self.cache.is_some() & !self.cache_hit {
                let (input, now_ns) = load;
                Self::store_in(
                    &mut self.cache,
                    &mut self.metrics,
                    self.retry.as_ref(),
                    input,
                    &results,
                    now_ns,
                    now_ns,
                );
            }
        }
        // Counted and sampled by the caller (once per run in a run).
        results.for_each(|value| out.collect(StreamElement::Record(Record { value, timestamp })));
        None
    }

    /// Whether a record of `key` completed now may be emitted at once: no watermark
    /// pending, and in ordered mode no record held, in keyed-ordered mode none of its key.
    #[inline(always)]
    fn may_leave_at_once(&self, key: u64) -> bool {
        self.segments.list.len() == 1
            && match self.mode {
                OutputMode::Unordered => true,
                OutputMode::Ordered => self.entries.is_empty(),
                OutputMode::KeyedOrdered => !self.chains.has_chain(key),
            }
    }

    /// Looks `input` up in the cache and counts the outcome; notes it in `cache_hit` for
    /// the rest of the record's path (a miss is a load). Cold and out of line: an
    /// operator without a cache never comes here, and one with a cache pays a call for
    /// its lookup anyway.
    #[cold]
    #[inline(never)]
    fn look_up(&mut self, input: &F::In, now_ns: u64) -> Option<Results<F::Out>> {
        let cache = self
            .cache
            .as_mut()
            .expect("the cached path runs with a cache");
        let hit = cache.lookup(input, now_ns);
        self.metrics.cache_entries = cache.len() as u64;
        self.cache_hit = hit.is_some();
        if hit.is_some() {
            self.metrics.cache_hits += 1;
        } else {
            self.metrics.cache_misses += 1;
        }
        hit
    }

    /// Completes the first attempt's handle of entry `slot` with a cache hit's `results`,
    /// as a call completing inside `invoke` would (for a hit that may not leave at once).
    #[cold]
    #[inline(never)]
    fn complete_hit(&mut self, results: Results<F::Out>, slot: Key) {
        let handle = self.completions.issue(slot, 0);
        match results {
            Results::Empty => handle.complete(None),
            Results::One(one) => handle.complete_one(one),
            Results::Many(all) => handle.complete(all),
        }
    }

    /// Stores the results of a loading entry that stood, and hands them back.
    #[inline(never)]
    fn store_load(&mut self, slot: Key, results: Results<F::Out>, now_ns: u64) -> Results<F::Out> {
        let entry = self.entries.get(slot).expect("completing a live entry");
        let (input, first_invoked_ns) = (&entry.input, entry.first_invoked_ns);
        Self::store_in(
            &mut self.cache,
            &mut self.metrics,
            self.retry.as_ref(),
            input,
            &results,
            first_invoked_ns,
            now_ns,
        );
        results
    }

    /// Stores a load's `results` unless the retry strategy rejects them (they stand only
    /// because no attempt is left: a later record should try again), and counts it.
    /// Out of line: the per-record path keeps only the call.
    #[inline(never)]
    fn store_in(
        cache: &mut Option<Box<dyn LookupStore<F::In, F::Out>>>,
        metrics: &mut AsyncMetrics,
        retry: Option<&RetryStrategy<F::Out>>,
        input: &F::In,
        results: &Results<F::Out>,
        invoked_ns: u64,
        now_ns: u64,
    ) {
        let cache = cache.as_mut().expect("only a cached operator loads");
        if retry.is_some_and(|r| r.should_retry_result(results.as_slice())) {
            return;
        }
        if cache.insert(input, results, now_ns) {
            metrics.cache_loads += 1;
            metrics.cache_load_ns += now_ns.saturating_sub(invoked_ns);
        }
        metrics.cache_entries = cache.len() as u64;
    }

    /// Takes a watermark: emitted once everything before it is emitted, and before
    /// anything after it. It takes a slot of capacity while it waits.
    ///
    /// # Panics
    /// If the operator is full (a caller bug: it must wait first).
    pub fn process_watermark(
        &mut self,
        timestamp: i64,
        now_ns: u64,
        out: &mut impl Collector<F::Out>,
    ) -> Result<(), OperatorError> {
        self.check()?;
        assert!(
            !self.is_full(),
            "process_watermark on a full async operator: wait while is_full()"
        );
        if F::BUFFERS {
            // The records before the watermark go now: it waits for them.
            self.function.flush_pending(now_ns, true);
            self.drain(now_ns, out)?;
        }
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        if self.segments.list.len() == 1 && self.segments.list[0].remaining == 0 {
            out.collect(StreamElement::Watermark(Watermark(timestamp)));
        } else {
            let tail = self
                .segments
                .list
                .back_mut()
                .expect("there is always a tail segment");
            tail.watermark = Some((timestamp, sequence));
            self.segments.list.push_back(Default::default());
        }
        self.drain(now_ns, out)?;
        Ok(())
    }

    /// Processes every completion that has arrived and emits what became emittable.
    /// Returns how many completions were processed.
    pub fn drain(
        &mut self,
        now_ns: u64,
        out: &mut impl Collector<F::Out>,
    ) -> Result<usize, OperatorError> {
        self.check()?;
        let mut processed = 0;
        while let Some(completion) = self.completions.pop() {
            processed += 1;
            self.apply(completion, now_ns, out)?;
        }
        Ok(processed)
    }

    /// [`drain`](Self::drain) if a completion waits (calls may complete other calls'
    /// handles, and other threads may have sent theirs).
    #[inline(always)]
    fn drain_if_waiting(
        &mut self,
        now_ns: u64,
        out: &mut impl Collector<F::Out>,
    ) -> Result<(), OperatorError> {
        if !self.completions.is_empty() {
            self.drain(now_ns, out)?;
        }
        Ok(())
    }

    /// The deadline of the earliest timer due at or before `limit_ns`.
    pub fn next_due_timer(&mut self, limit_ns: u64) -> Option<u64> {
        let retry = self.timers.peek_due(limit_ns);
        let held = self.function.pending_deadline().filter(|d| *d <= limit_ns);
        self.timeout_due(limit_ns)
            .into_iter()
            .chain(retry)
            .chain(held)
            .min()
    }

    /// The first timeout's deadline, if it is at or before `limit_ns`.
    #[inline]
    fn timeout_due(&self, limit_ns: u64) -> Option<u64> {
        self.deadlines
            .head
            .filter(|_| self.deadlines.first_ns <= limit_ns)
            .map(|_| self.deadlines.first_ns)
    }

    /// Fires the earliest timer due at or before `limit_ns`, at its deadline, and
    /// processes the completions it causes. Returns the deadline, or `None` if no timer
    /// is due.
    pub fn fire_due_timer(
        &mut self,
        limit_ns: u64,
        out: &mut impl Collector<F::Out>,
    ) -> Result<Option<u64>, OperatorError> {
        self.check()?;
        let timeout = self.timeout_due(limit_ns);
        let retry = self.timers.peek_due(limit_ns);
        if let Some(held) = self.function.pending_deadline().filter(|d| *d <= limit_ns) {
            // Held calls (a batch's timeout) go before timeouts and retries due with
            // them: a record's timeout runs from when it was held.
            if timeout.is_none_or(|t| held <= t) && retry.is_none_or(|r| held <= r) {
                self.function.flush_pending(held, false);
                self.drain(held, out)?;
                return Ok(Some(held));
            }
        }
        let deadline = match (timeout, retry) {
            // A timeout and a retry at the same instant: the timeout first (retries stop
            // at the timeout).
            (Some(timeout), retry) if retry.is_none_or(|retry| timeout <= retry) => {
                let slot = self.deadlines.head.expect("a timeout is due");
                self.on_timeout(slot);
                timeout
            }
            (_, Some(_)) => {
                let (deadline, event) = self.timers.pop_due(limit_ns).expect("peeked above");
                self.on_retry(event.slot, event.attempt, deadline);
                deadline
            }
            (_, None) => return Ok(None),
        };
        self.drain(deadline, out)?;
        Ok(Some(deadline))
    }

    /// End of input: retries waiting for their delay are attempted now, and their
    /// outcomes are not retried again (elements still in their first or a running
    /// attempt keep their retries). The caller then drains until [`in_flight`] is 0 and
    /// calls [`close`](Self::close).
    ///
    /// [`in_flight`]: Self::in_flight
    pub fn begin_finish(
        &mut self,
        now_ns: u64,
        out: &mut impl Collector<F::Out>,
    ) -> Result<(), OperatorError> {
        self.check()?;
        let mut waiting: Vec<(u64, Key)> = self
            .entries
            .iter()
            .filter(|(_, e)| matches!(e.state, State::RetryWaiting))
            .map(|(slot, e)| (e.sequence, slot))
            .collect();
        waiting.sort_unstable();
        for (_, slot) in waiting {
            let entry = self.entry_mut(slot);
            entry.final_attempt = true;
            let retry = entry.retry_timer.take();
            self.cancel_retry(retry);
            self.invoke_again(slot, now_ns);
        }
        if F::BUFFERS {
            // What is held goes now, the retries just attempted with it.
            self.function.flush_pending(now_ns, true);
        }
        self.drain(now_ns, out)?;
        Ok(())
    }

    /// Calls [`AsyncFunction::close`] once, after the last element was emitted.
    pub fn close(&mut self) {
        if !self.closed {
            self.closed = true;
            self.function.close();
        }
    }

    /// The records and watermarks held, in input order: what a restored operator must
    /// process again, first.
    pub fn snapshot(&self) -> Vec<StreamElement<F::In>>
    where
        F::In: Clone,
    {
        let mut held: Vec<(u64, StreamElement<F::In>)> = self
            .entries
            .iter()
            .map(|(_, e)| {
                (
                    e.sequence,
                    StreamElement::record(e.input.clone(), e.timestamp),
                )
            })
            .collect();
        for segment in &self.segments.list {
            if let Some((timestamp, sequence)) = segment.watermark {
                held.push((sequence, StreamElement::watermark(timestamp)));
            }
        }
        held.sort_unstable_by_key(|(sequence, _)| *sequence);
        held.into_iter().map(|(_, element)| element).collect()
    }

    fn entry_mut(&mut self, slot: Key) -> &mut Entry<F::In, F::Out> {
        self.entries
            .get_mut(slot)
            .expect("entry referenced by the queue is live")
    }

    fn may_retry(&self, invocations: u32, final_attempt: bool) -> bool {
        !final_attempt
            && self
                .retry
                .as_ref()
                .is_some_and(|r| invocations < r.max_attempts())
    }

    fn apply(
        &mut self,
        completion: Completion<F::Out>,
        now_ns: u64,
        out: &mut impl Collector<F::Out>,
    ) -> Result<(), OperatorError> {
        let Some(entry) = self.entries.get(completion.key) else {
            return Ok(());
        };
        if entry.attempt != completion.attempt {
            return Ok(());
        }
        let timed_out = match entry.state {
            State::InFlight => false,
            State::TimedOut => true,
            State::RetryWaiting | State::Done => return Ok(()),
        };
        let retry_allowed = !timed_out && self.may_retry(entry.invocations, entry.final_attempt);
        match completion.outcome {
            Outcome::Results(results) => {
                let retry = retry_allowed
                    && self
                        .retry
                        .as_ref()
                        .is_some_and(|r| r.should_retry_result(results.as_slice()));
                if retry {
                    self.schedule_retry(completion.key, now_ns);
                } else {
                    self.complete_entry(completion.key, results, now_ns, out);
                }
                Ok(())
            }
            Outcome::Error(error) => {
                let retry = retry_allowed
                    && self
                        .retry
                        .as_ref()
                        .is_some_and(|r| r.should_retry_error(&error));
                if retry {
                    self.schedule_retry(completion.key, now_ns);
                    Ok(())
                } else {
                    Err(self.fail(error))
                }
            }
        }
    }

    fn fail(&mut self, error: AsyncError) -> OperatorError {
        self.metrics.failed += 1;
        self.failure = Some(error.to_string());
        OperatorError::Async(error)
    }

    fn schedule_retry(&mut self, slot: Key, now_ns: u64) {
        let retry_number = self.entries.get(slot).expect("live").invocations;
        let delay = self
            .retry
            .as_ref()
            .expect("retry applies only with a strategy")
            .delay(retry_number);
        let delay_ns = delay.as_nanos().min(u128::from(u64::MAX / 2)) as u64;
        let entry = self.entry_mut(slot);
        entry.state = State::RetryWaiting;
        entry.attempt += 1;
        let attempt = entry.attempt;
        self.metrics.retried += 1;
        let timer = self.timers.schedule(
            now_ns.saturating_add(delay_ns),
            TimerEvent { slot, attempt },
        );
        self.entry_mut(slot).retry_timer = Some(timer);
        self.retry_timers += 1;
        self.note_timers();
    }

    /// Cancels a retry timer that no longer matters (O(1); one that already came due on
    /// the worker's wheel is ignored when it pops: the entry's `retry_timer` is gone).
    fn cancel_retry(&mut self, timer: Option<TimerKey>) {
        if let Some(timer) = timer {
            self.retry_timers -= 1;
            self.timers.cancel(timer);
        }
    }

    #[inline]
    fn note_timers(&mut self) {
        let pending = self.pending_timers() as u64;
        if pending > self.metrics.timers_peak {
            self.metrics.timers_peak = pending;
        }
    }

    /// The deadline of a record first invoked at `first_invoked_ns` (with a timeout).
    #[inline]
    fn deadline_of(&self, first_invoked_ns: u64) -> u64 {
        first_invoked_ns.saturating_add(self.timeout_ns.unwrap_or(u64::MAX))
    }

    /// Links entry `slot` into the deadline list: at the tail, after walking back past
    /// later deadlines (none unless the clock went back). One timeout for all, so the
    /// deadline order is the order of first invocation.
    fn link_deadline(&mut self, slot: Key) {
        let invoked = self.entry_mut(slot).first_invoked_ns;
        let mut after = self.deadlines.tail;
        while let Some(key) = after {
            let entry = self.entry_mut(key);
            if entry.first_invoked_ns <= invoked {
                break;
            }
            after = entry.prev_deadline;
        }
        let before = match after {
            Some(key) => self.entry_mut(key).next_deadline,
            None => self.deadlines.head,
        };
        let entry = self.entry_mut(slot);
        entry.timing = true;
        entry.prev_deadline = after;
        entry.next_deadline = before;
        match after {
            Some(key) => self.entry_mut(key).next_deadline = Some(slot),
            None => {
                self.deadlines.head = Some(slot);
                self.deadlines.first_ns = self.deadline_of(invoked);
            }
        }
        match before {
            Some(key) => self.entry_mut(key).prev_deadline = Some(slot),
            None => self.deadlines.tail = Some(slot),
        }
        self.deadlines.len += 1;
    }

    /// Takes entry `slot` out of the deadline list: its timeout stops.
    fn unlink_deadline(&mut self, slot: Key) {
        let entry = self.entry_mut(slot);
        debug_assert!(entry.timing, "only a timing entry is in the deadline list");
        entry.timing = false;
        let prev = entry.prev_deadline.take();
        let next = entry.next_deadline.take();
        match prev {
            Some(key) => self.entry_mut(key).next_deadline = next,
            None => {
                self.deadlines.head = next;
                self.deadlines.first_ns = match next {
                    Some(key) => {
                        let invoked = self.entry_mut(key).first_invoked_ns;
                        self.deadline_of(invoked)
                    }
                    None => u64::MAX,
                };
            }
        }
        match next {
            Some(key) => self.entry_mut(key).prev_deadline = prev,
            None => self.deadlines.tail = prev,
        }
        self.deadlines.len -= 1;
    }

    fn invoke_again(&mut self, slot: Key, now_ns: u64) {
        let entry = self.entry_mut(slot);
        entry.state = State::InFlight;
        entry.invocations += 1;
        let attempt = entry.attempt;
        let handle = self.completions.issue(slot, attempt);
        let input = &self.entries.get(slot).expect("live").input;
        self.function.invoke_at(input, handle, now_ns);
    }

    fn on_retry(&mut self, slot: Key, attempt: u32, now_ns: u64) {
        let Some(entry) = self.entries.get_mut(slot) else {
            return;
        };
        if !(entry.retry_timer.is_some()
            && entry.attempt == attempt
            && matches!(entry.state, State::RetryWaiting))
        {
            return;
        }
        entry.retry_timer = None;
        self.retry_timers -= 1;
        self.invoke_again(slot, now_ns);
    }

    /// The timeout of entry `slot` (the head of the deadline list) fires.
    fn on_timeout(&mut self, slot: Key) {
        self.unlink_deadline(slot);
        let entry = self.entry_mut(slot);
        let retry = entry.retry_timer.take();
        entry.state = State::TimedOut;
        // Whatever the timeout hook completes it with is no lookup result.
        entry.loading = false;
        entry.attempt += 1;
        let attempt = entry.attempt;
        self.cancel_retry(retry);
        self.metrics.timed_out += 1;
        let handle = self.completions.issue(slot, attempt);
        let input = &self.entries.get(slot).expect("live").input;
        self.function.timeout(input, handle);
    }

    fn complete_entry(
        &mut self,
        slot: Key,
        results: Results<F::Out>,
        now_ns: u64,
        out: &mut impl Collector<F::Out>,
    ) {
        let entry = self.entry_mut(slot);
        let (key, epoch, timing, loading) = (entry.key, entry.epoch, entry.timing, entry.loading);
        if timing {
            self.unlink_deadline(slot);
        }
        // A load's results move through the store (not borrowed, which would give them an
        // address on every path); the path without a cache pays this flag's branch.
        let results = if loading {
            self.store_load(slot, results, now_ns)
        } else {
            results
        };
        self.metrics.completed += 1;
        let head = self.mode == OutputMode::Unordered || self.chains.is_head(key, slot);
        if head && epoch == self.segments.head_epoch {
            // Emittable now: hand the results straight out instead of storing them.
            let next = self.emit_one(slot, results, now_ns, out);
            if let Some(next) = next {
                self.follow(next, now_ns, out);
            }
            self.advance(now_ns, out);
            return;
        }
        let entry = self.entry_mut(slot);
        entry.state = State::Done;
        entry.results = results;
        if head {
            self.park(slot, epoch);
        }
        // Otherwise its predecessor in the chain emits it when it leaves.
    }

    fn park(&mut self, slot: Key, epoch: u64) {
        self.entry_mut(slot).next_parked = None;
        let previous_tail = {
            let segment = self.segments.get_mut(epoch);
            let previous = segment.parked_tail.replace(slot);
            if previous.is_none() {
                segment.parked_head = Some(slot);
            }
            previous
        };
        if let Some(tail) = previous_tail {
            self.entry_mut(tail).next_parked = Some(slot);
        }
    }

    /// Removes entry `slot` (chain head, head segment) and emits `results` for it;
    /// returns its chain successor.
    #[inline(always)]
    fn emit_one(
        &mut self,
        slot: Key,
        results: Results<F::Out>,
        now_ns: u64,
        out: &mut impl Collector<F::Out>,
    ) -> Option<Key> {
        let (key, timestamp, next, sequence, first_invoked_ns) = self
            .entries
            .remove_with(slot, |e| {
                debug_assert!(!e.timing, "an emitted record's timeout has stopped");
                (
                    e.key,
                    e.timestamp,
                    e.next_in_chain,
                    e.sequence,
                    e.first_invoked_ns,
                )
            })
            .expect("emitting a live entry");
        self.segments.head_mut().remaining -= 1;
        if self.mode != OutputMode::Unordered {
            self.chains.pop_head(key, slot, next);
        }
        results.for_each(|value| out.collect(StreamElement::Record(Record { value, timestamp })));
        self.metrics.emitted += 1;
        // NB: recording into the histogram on every record is a measurable share of the
        // per-record path at latency 0 (`scripts/callgrind.sh` counts that path); one
        // record in LATENCY_SAMPLE_EVERY is plenty for percentiles.
        if sequence % LATENCY_SAMPLE_EVERY == 0 {
            let latency_ns = now_ns.saturating_sub(first_invoked_ns).max(1);
            self.metrics.latency_ns.saturating_record(latency_ns);
        }
        next
    }

    /// After a chain head left: emits its done successors in the head segment, and
    /// parks the first done successor of a later segment.
    fn follow(&mut self, mut next: Key, now_ns: u64, out: &mut impl Collector<F::Out>) {
        loop {
            let successor = self.entries.get_mut(next).expect("chain successor is live");
            if successor.state != State::Done {
                return;
            }
            let epoch = successor.epoch;
            if epoch != self.segments.head_epoch {
                self.park(next, epoch);
                return;
            }
            let results = std::mem::replace(&mut successor.results, Results::Empty);
            match self.emit_one(next, results, now_ns, out) {
                Some(after) => next = after,
                None => return,
            }
        }
    }

    /// Emits `slot` (done, chain head, head segment) and the done successors of its
    /// chain in the head segment; parks a done successor of a later segment.
    fn emit_chain(&mut self, slot: Key, now_ns: u64, out: &mut impl Collector<F::Out>) {
        let entry = self.entries.get_mut(slot).expect("emitting a live entry");
        debug_assert_eq!(entry.epoch, self.segments.head_epoch);
        debug_assert_eq!(entry.state, State::Done, "only done entries are emitted");
        let results = std::mem::replace(&mut entry.results, Results::Empty);
        if let Some(next) = self.emit_one(slot, results, now_ns, out) {
            self.follow(next, now_ns, out);
        }
    }

    /// Emits the watermarks whose segments are empty and releases what was parked on
    /// the segments that become the head.
    fn advance(&mut self, now_ns: u64, out: &mut impl Collector<F::Out>) {
        while self.segments.list.len() > 1 && self.segments.list[0].remaining == 0 {
            let finished = self.segments.list.pop_front().expect("checked above");
            debug_assert!(finished.parked_head.is_none());
            let (timestamp, _) = finished
                .watermark
                .expect("every segment but the last ends in a watermark");
            out.collect(StreamElement::Watermark(Watermark(timestamp)));
            self.segments.head_epoch += 1;
            let head = &mut self.segments.list[0];
            let mut parked = head.parked_head.take();
            head.parked_tail = None;
            while let Some(slot) = parked {
                parked = self.entries.get(slot).and_then(|e| e.next_parked);
                self.emit_chain(slot, now_ns, out);
            }
        }
    }
}

impl<F: AsyncFunction> core::fmt::Debug for AsyncWaitOperator<F> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("AsyncWaitOperator")
            .field("mode", &self.mode)
            .field("capacity", &self.capacity)
            .field("in_flight", &self.in_flight())
            .field("pending_timers", &self.pending_timers())
            .field("failed", &self.failure.is_some())
            .finish_non_exhaustive()
    }
}
