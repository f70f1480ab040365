//! A stage's task: its input (a source or an input gate), then its chained operators,
//! then its output (a record writer or a sink), all on one thread, as Flink chains
//! operators into one task.
//!
//! Each operator is a [`Link`] that pushes elements into the next one. Back-pressure
//! runs backwards through [`Link::accepts`]: the task takes its next input only while
//! the chain accepts it (the async operator has a free slot, the writer has buffers).
//! A `flat_map` may push more than one element past that check; the next link queues
//! them (the writer in its overflow, the async operator in its input queue) and
//! refuses input until they are out. End of input reaches each link in turn through
//! [`Link::finish`], which is repeated until the link and everything after it are done:
//! the async operator first completes and emits everything in flight, the writer sends
//! its last buffers and the end of partition.
//!
//! Checkpoints (see [`checkpoint`](crate::checkpoint)): a barrier enters the chain at
//! its source (when the coordinator triggers one) or from its input gate (once
//! aligned), and passes every link in order with the elements through
//! [`Link::barrier`]: each link adds its state to the task's [`Snapshot`] and hands the
//! barrier on, so everything before the barrier is in the state or downstream of it,
//! and nothing after it. The async operator lets the results it already emitted go
//! ahead and snapshots every element it still holds; the writer sends the barrier in
//! band behind the records it wrote; a sink pre-commits.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::async_io::{AsyncFunction, AsyncWaitOperator};
use crate::checkpoint::elements::encode_elements;
use crate::checkpoint::{AckFigures, Acks, AlignmentMode, KeyedState, TaskState};
use crate::element::{Record, StreamElement};
use crate::exchange::codec::Codec;
use crate::exchange::{BarrierAnnouncer, GateEvent, GateRun, InputGate, RecordWriter};
use crate::runtime::{Control, DriverEvent, Progress, Task, TaskContext, TaskError};

use super::keys::KeyHashCode;
use super::metrics::TaskMetrics;
use super::partition::Selector;
use super::sink::Sink;
use super::source::{Source, SourceEvent, SourceFailed};
use super::{GraphRunError, IoHandler, Shared};

/// Input elements a task takes per poll before yielding to its worker's other tasks.
pub(crate) const POLL_BATCH_MAX: usize = 256;

/// What one run from a gate should cost a checkpointed task, chain included: the task
/// looks at its gate between runs (barriers announced ahead of the data, alignment
/// timeouts), so a run of 256 records through an operator that takes 20 µs each would
/// hold a barrier for 5 ms. Runs of such a task shrink to what fits this budget (and grow
/// back, doubling, while they take less than half of it), so that barriers wait at most
/// about this long, as Flink's mailbox looks at its mail between records.
pub(crate) const RUN_BUDGET_NS: u64 = 100_000;

/// One operator of a chain (or its end), taking elements of `T`.
pub(crate) trait Link<T> {
    /// Whether it takes another element now.
    fn accepts(&mut self) -> bool;
    /// How many records the next run may hold (0 when it [`accepts`](Self::accepts)
    /// nothing): an async operator its free capacity, so a run never overfills it;
    /// other links take a whole run.
    fn room(&mut self) -> usize {
        if self.accepts() {
            POLL_BATCH_MAX
        } else {
            0
        }
    }
    /// Takes an element (also when [`accepts`](Self::accepts) said no: it queues it).
    fn push(
        &mut self,
        element: StreamElement<T>,
        cx: &mut TaskContext<'_>,
    ) -> Result<(), TaskError>;
    /// The batch form of [`push`](Self::push): takes every record of `run`, in order,
    /// leaving it empty (its capacity stays with the caller). A run was admitted by one
    /// [`accepts`](Self::accepts), as one element is; a link that cannot take all of it
    /// queues the rest, as for `push`. The default pushes each record.
    fn push_run(
        &mut self,
        run: &mut Vec<Record<T>>,
        cx: &mut TaskContext<'_>,
    ) -> Result<(), TaskError> {
        for record in run.drain(..) {
            self.push(StreamElement::Record(record), cx)?;
        }
        Ok(())
    }
    /// Moves queued work along; whether anything moved.
    fn poll(&mut self, cx: &mut TaskContext<'_>) -> Result<bool, TaskError>;
    /// The input ended: whether this link and all after it are done (called again
    /// until they are).
    fn finish(&mut self, cx: &mut TaskContext<'_>) -> Result<bool, TaskError>;
    /// The earliest time a link needs polling without input.
    fn next_deadline(&self) -> Option<u64>;
    /// Takes a driver event if it is for one of the chain's connections.
    fn on_io(&mut self, event: &DriverEvent<'_>) -> bool;
    /// Checkpoint `id`'s barrier reached this link, behind every element pushed before
    /// it: the link adds its state to `snapshot` and hands the barrier on.
    fn barrier(
        &mut self,
        id: u64,
        snapshot: &mut Snapshot,
        cx: &mut TaskContext<'_>,
    ) -> Result<(), TaskError>;
    /// Checkpoint `id` completed (Flink's `notifyCheckpointComplete`).
    fn checkpoint_complete(&mut self, id: u64) -> Result<(), TaskError>;
    /// Writes this link's live figures (and those of the links after it) into the
    /// task's metrics.
    fn report(&mut self, metrics: &TaskMetrics);
}

/// The section of a task's snapshot that holds its source's position.
pub(crate) const SOURCE_SECTION: u32 = 0;
/// The section that holds its input gate's channel state.
pub(crate) const CHANNEL_SECTION: u32 = u32::MAX;
const SNAPSHOT_VERSION: u8 = 1;

/// A task's state at a barrier: each stateful link's bytes under its position in the
/// chain (the source is 0, the operators count from 1 in the order they were chained).
#[derive(Default)]
pub(crate) struct Snapshot {
    pub(crate) sections: Vec<(u32, Vec<u8>)>,
    /// Sections made later, on the checkpoint service's thread (keyed state's
    /// copy-on-write view): see [`into_state`](Self::into_state).
    pub(crate) deferred: Vec<(u32, DeferredSection)>,
    /// A sink pre-committed output that a completed checkpoint must commit.
    pub(crate) commits: bool,
    /// The checkpoint is unaligned: writers announce its barrier ahead of the data.
    pub(crate) unaligned: bool,
    /// The checkpoint is aligned and may time out into unaligned: writers announce its
    /// barrier as they write it, and the consumers count the timeout from then.
    pub(crate) timeoutable: bool,
    /// The task's last snapshot (its input ended): a writer whose end went out hands
    /// over [`announcers`](Self::announcers) for its output still queued.
    pub(crate) finishing: bool,
    /// The finished writers' announcers, for later unaligned barriers.
    pub(crate) announcers: Vec<BarrierAnnouncer>,
}

/// What makes a section's bytes, off the task's worker.
pub(crate) type DeferredSection = Box<dyn FnOnce() -> Vec<u8> + Send + Sync>;

impl core::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Snapshot")
            .field("sections", &self.sections.len())
            .field("deferred", &self.deferred.len())
            .field("commits", &self.commits)
            .field("unaligned", &self.unaligned)
            .finish_non_exhaustive()
    }
}

impl Snapshot {
    pub(crate) fn push(&mut self, position: u32, bytes: Vec<u8>) {
        self.sections.push((position, bytes));
    }

    /// A section whose bytes `make` writes on the checkpoint service's thread.
    pub(crate) fn push_deferred(&mut self, position: u32, make: DeferredSection) {
        self.deferred.push((position, make));
    }

    /// The task's state for the service: encoded now when every section is, else
    /// encoded on the service's thread once the deferred sections are made.
    pub(crate) fn into_state(mut self) -> TaskState {
        if self.deferred.is_empty() {
            return TaskState::from(self.encode());
        }
        let deferred = std::mem::take(&mut self.deferred);
        let sections = std::mem::take(&mut self.sections);
        TaskState::deferred(move || {
            let mut snapshot = Snapshot {
                sections,
                ..Snapshot::default()
            };
            for (position, make) in deferred {
                snapshot.sections.push((position, make()));
            }
            snapshot.encode()
        })
    }

    pub(crate) fn get(&self, position: u32) -> Option<&[u8]> {
        self.sections
            .iter()
            .find(|(p, _)| *p == position)
            .map(|(_, bytes)| bytes.as_slice())
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        SNAPSHOT_VERSION.encode(&mut out);
        (self.sections.len() as u32).encode(&mut out);
        for (position, bytes) in &self.sections {
            position.encode(&mut out);
            bytes.encode(&mut out);
        }
        out
    }

    pub(crate) fn decode(mut bytes: &[u8]) -> Result<Self, String> {
        let input = &mut bytes;
        let version = u8::decode(input).map_err(|e| e.to_string())?;
        if version != SNAPSHOT_VERSION {
            return Err(format!(
                "task state version {version}; this build reads version {SNAPSHOT_VERSION}"
            ));
        }
        let count = u32::decode(input).map_err(|e| e.to_string())?;
        let mut sections = Vec::new();
        for _ in 0..count {
            let position = u32::decode(input).map_err(|e| e.to_string())?;
            let section = Vec::<u8>::decode(input).map_err(|e| e.to_string())?;
            sections.push((position, section));
        }
        if !input.is_empty() {
            return Err(format!("{} bytes after the last section", input.len()));
        }
        Ok(Snapshot {
            sections,
            ..Snapshot::default()
        })
    }
}

/// Forwards everything but records and barriers to `next`.
macro_rules! forward_io {
    () => {
        #[inline]
        fn accepts(&mut self) -> bool {
            self.next.accepts()
        }
        #[inline]
        fn room(&mut self) -> usize {
            self.next.room()
        }
        fn poll(&mut self, cx: &mut TaskContext<'_>) -> Result<bool, TaskError> {
            self.next.poll(cx)
        }
        fn finish(&mut self, cx: &mut TaskContext<'_>) -> Result<bool, TaskError> {
            self.next.finish(cx)
        }
        fn next_deadline(&self) -> Option<u64> {
            self.next.next_deadline()
        }
        fn on_io(&mut self, event: &DriverEvent<'_>) -> bool {
            self.next.on_io(event)
        }
        fn report(&mut self, metrics: &TaskMetrics) {
            self.next.report(metrics)
        }
    };
}

/// Forwards everything but records to `next`.
macro_rules! forward_rest {
    () => {
        forward_io!();
        fn barrier(
            &mut self,
            id: u64,
            snapshot: &mut Snapshot,
            cx: &mut TaskContext<'_>,
        ) -> Result<(), TaskError> {
            self.next.barrier(id, snapshot, cx)
        }
        fn checkpoint_complete(&mut self, id: u64) -> Result<(), TaskError> {
            self.next.checkpoint_complete(id)
        }
    };
}

pub(crate) struct MapLink<F, U> {
    pub(crate) f: F,
    pub(crate) next: Box<dyn Link<U>>,
    /// The mapped run handed on (kept for its capacity).
    pub(crate) run: Vec<Record<U>>,
}

impl<T, U, F: FnMut(T) -> U> Link<T> for MapLink<F, U> {
    #[inline]
    fn push(
        &mut self,
        element: StreamElement<T>,
        cx: &mut TaskContext<'_>,
    ) -> Result<(), TaskError> {
        let element = match element {
            StreamElement::Record(r) => StreamElement::record((self.f)(r.value), r.timestamp),
            StreamElement::Watermark(w) => StreamElement::Watermark(w),
        };
        self.next.push(element, cx)
    }

    #[inline]
    fn push_run(
        &mut self,
        run: &mut Vec<Record<T>>,
        cx: &mut TaskContext<'_>,
    ) -> Result<(), TaskError> {
        let f = &mut self.f;
        self.run.extend(run.drain(..).map(|r| Record {
            value: f(r.value),
            timestamp: r.timestamp,
        }));
        self.next.push_run(&mut self.run, cx)
    }
    forward_rest!();
}

pub(crate) struct FilterLink<F, T> {
    pub(crate) f: F,
    pub(crate) next: Box<dyn Link<T>>,
}

impl<T, F: FnMut(&T) -> bool> Link<T> for FilterLink<F, T> {
    #[inline]
    fn push(
        &mut self,
        element: StreamElement<T>,
        cx: &mut TaskContext<'_>,
    ) -> Result<(), TaskError> {
        if let StreamElement::Record(r) = &element {
            if !(self.f)(&r.value) {
                return Ok(());
            }
        }
        self.next.push(element, cx)
    }

    #[inline]
    fn push_run(
        &mut self,
        run: &mut Vec<Record<T>>,
        cx: &mut TaskContext<'_>,
    ) -> Result<(), TaskError> {
        run.retain(|r| (self.f)(&r.value));
        self.next.push_run(run, cx)
    }
    forward_rest!();
}

pub(crate) struct FlatMapLink<F, U> {
    pub(crate) f: F,
    pub(crate) next: Box<dyn Link<U>>,
    /// The run of outputs handed on (kept for its capacity).
    pub(crate) run: Vec<Record<U>>,
}

impl<T, U, I: IntoIterator<Item = U>, F: FnMut(T) -> I> Link<T> for FlatMapLink<F, U> {
    fn push(
        &mut self,
        element: StreamElement<T>,
        cx: &mut TaskContext<'_>,
    ) -> Result<(), TaskError> {
        match element {
            StreamElement::Record(r) => {
                for value in (self.f)(r.value) {
                    self.next
                        .push(StreamElement::record(value, r.timestamp), cx)?;
                }
                Ok(())
            }
            StreamElement::Watermark(w) => self.next.push(StreamElement::Watermark(w), cx),
        }
    }

    fn push_run(
        &mut self,
        run: &mut Vec<Record<T>>,
        cx: &mut TaskContext<'_>,
    ) -> Result<(), TaskError> {
        for r in run.drain(..) {
            let timestamp = r.timestamp;
            self.run.extend(
                (self.f)(r.value)
                    .into_iter()
                    .map(|value| Record { value, timestamp }),
            );
        }
        self.next.push_run(&mut self.run, cx)
    }
    forward_rest!();
}

/// The async I/O operator in a chain.
pub(crate) struct AsyncLink<F: AsyncFunction> {
    pub(crate) operator: AsyncWaitOperator<F>,
    pub(crate) io: Option<Box<dyn IoHandler>>,
    pub(crate) input: VecDeque<StreamElement<F::In>>,
    pub(crate) output: VecDeque<StreamElement<F::Out>>,
    pub(crate) next: Box<dyn Link<F::Out>>,
    pub(crate) finished: bool,
    pub(crate) in_flight_reported: u64,
    pub(crate) shared: Arc<Shared>,
    pub(crate) stage: usize,
    /// Its section in the task's snapshot.
    pub(crate) position: u32,
    /// Results handed on as a run (kept for its capacity).
    run: Vec<Record<F::Out>>,
}

impl<F: AsyncFunction> AsyncLink<F> {
    /// The link running `operator` (with its I/O, if any) for `stage`, ahead of `next`;
    /// `restored`: the elements it held at the checkpoint restored, processed first.
    pub(crate) fn new(
        operator: AsyncWaitOperator<F>,
        io: Option<Box<dyn IoHandler>>,
        next: Box<dyn Link<F::Out>>,
        shared: Arc<Shared>,
        stage: usize,
        position: u32,
        restored: Vec<StreamElement<F::In>>,
    ) -> Self {
        AsyncLink {
            position,
            operator,
            io,
            input: VecDeque::new(),
            output: VecDeque::new(),
            next,
            finished: false,
            in_flight_reported: 0,
            shared,
            stage,
            run: Vec::new(),
        }
        .with_input(restored)
    }

    fn with_input(mut self, restored: Vec<StreamElement<F::In>>) -> Self {
        self.input.extend(restored);
        self
    }

    fn feed(&mut self, element: StreamElement<F::In>, now: u64) -> Result<(), TaskError> {
        match element {
            StreamElement::Record(r) => {
                self.operator
                    .process_record(r.value, r.timestamp, now, &mut self.output)?
            }
            StreamElement::Watermark(w) => {
                self.operator
                    .process_watermark(w.0, now, &mut self.output)?
            }
        }
        Ok(())
    }

    /// Hands results on: the records at the front as one run (as many as the next link
    /// has room for), a watermark on its own.
    fn move_out(&mut self, cx: &mut TaskContext<'_>) -> Result<bool, TaskError> {
        let mut moved = false;
        while !self.output.is_empty() {
            let room = self.next.room();
            if room == 0 {
                break;
            }
            while self.run.len() < room {
                match self.output.pop_front() {
                    Some(StreamElement::Record(record)) => self.run.push(record),
                    Some(watermark) => {
                        self.output.push_front(watermark);
                        break;
                    }
                    None => break,
                }
            }
            moved = true;
            if self.run.is_empty() {
                let watermark = self.output.pop_front().expect("not empty");
                self.next.push(watermark, cx)?;
            } else {
                self.next.push_run(&mut self.run, cx)?;
            }
        }
        Ok(moved)
    }

    fn report_in_flight(&mut self) {
        let now = self.operator.in_flight() as u64;
        if now != self.in_flight_reported {
            let live = &self.shared.live.in_flight;
            live.fetch_add(now.wrapping_sub(self.in_flight_reported), Ordering::Relaxed);
            self.in_flight_reported = now;
        }
    }
}

impl<F: AsyncFunction> Link<F::In> for AsyncLink<F>
where
    F::In: Codec + Clone,
{
    #[inline]
    fn accepts(&mut self) -> bool {
        self.input.is_empty() && !self.operator.is_full() && self.output.len() < POLL_BATCH_MAX
    }

    #[inline]
    fn room(&mut self) -> usize {
        if self.accepts() {
            self.operator.free_capacity()
        } else {
            0
        }
    }

    #[inline]
    fn push(
        &mut self,
        element: StreamElement<F::In>,
        cx: &mut TaskContext<'_>,
    ) -> Result<(), TaskError> {
        if self.input.is_empty() && !self.operator.is_full() {
            self.feed(element, cx.now_ns)
        } else {
            self.input.push_back(element);
            Ok(())
        }
    }

    /// The operator takes as much of the run as it has room for in one
    /// [`process_run`](AsyncWaitOperator::process_run) (all of it when the run came
    /// within [`room`](Link::room)); the rest waits in the input queue.
    #[inline]
    fn push_run(
        &mut self,
        run: &mut Vec<Record<F::In>>,
        cx: &mut TaskContext<'_>,
    ) -> Result<(), TaskError> {
        if self.input.is_empty() {
            let fits = run.len().min(self.operator.free_capacity());
            if fits > 0 {
                self.operator
                    .process_run(run.drain(..fits), cx.now_ns, &mut self.output)?;
            }
        }
        self.input.extend(run.drain(..).map(StreamElement::Record));
        Ok(())
    }

    fn poll(&mut self, cx: &mut TaskContext<'_>) -> Result<bool, TaskError> {
        let now = cx.now_ns;
        let mut busy = self.operator.drain(now, &mut self.output)? > 0;
        while self
            .operator
            .fire_due_timer(now, &mut self.output)?
            .is_some()
        {
            busy = true;
        }
        while !self.operator.is_full() {
            let Some(element) = self.input.pop_front() else {
                break;
            };
            self.feed(element, now)?;
            busy = true;
        }
        busy |= self.move_out(cx)?;
        if let Some(io) = self.io.as_mut() {
            io.flush(cx.driver, now);
        }
        busy |= self.next.poll(cx)?;
        busy |= self.move_out(cx)?;
        self.report_in_flight();
        Ok(busy)
    }

    fn finish(&mut self, cx: &mut TaskContext<'_>) -> Result<bool, TaskError> {
        if !self.finished {
            // Flink's finish would attempt waiting retries at once and keep their
            // outcome; here the end waits until everything in flight is out.
            if !self.input.is_empty() || self.operator.in_flight() > 0 {
                return Ok(false);
            }
            self.operator.begin_finish(cx.now_ns, &mut self.output)?;
            self.operator.close();
            self.finished = true;
        }
        self.move_out(cx)?;
        if !self.output.is_empty() {
            return Ok(false);
        }
        self.next.finish(cx)
    }

    fn next_deadline(&self) -> Option<u64> {
        [
            self.operator.next_timer_deadline(),
            self.io.as_ref().and_then(|io| io.next_deadline()),
            self.next.next_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn on_io(&mut self, event: &DriverEvent<'_>) -> bool {
        self.io.as_mut().is_some_and(|io| io.on_event(event)) || self.next.on_io(event)
    }

    fn report(&mut self, metrics: &TaskMetrics) {
        // One async operator per task is the common case; several add up in a
        // later link's report only if they are reported first-to-last (they are).
        TaskMetrics::set(&metrics.async_in_flight, self.operator.in_flight() as u64);
        TaskMetrics::set(&metrics.async_timeouts, self.operator.metrics().timed_out);
        TaskMetrics::set(&metrics.async_ready, self.operator.metrics().ready);
        self.next.report(metrics);
    }

    fn barrier(
        &mut self,
        id: u64,
        snapshot: &mut Snapshot,
        cx: &mut TaskContext<'_>,
    ) -> Result<(), TaskError> {
        // What the operator emitted before the barrier goes ahead of it (the next link
        // queues what it cannot take yet); what it still holds, in flight or waiting
        // for its turn, and the input not yet fed to it are its state, processed again
        // first on restore (Flink's `AsyncWaitOperator.snapshotState`).
        while let Some(element) = self.output.pop_front() {
            self.next.push(element, cx)?;
        }
        let mut held = self.operator.snapshot();
        held.extend(self.input.iter().cloned());
        snapshot.push(self.position, encode_elements(&held));
        self.next.barrier(id, snapshot, cx)
    }

    fn checkpoint_complete(&mut self, id: u64) -> Result<(), TaskError> {
        self.next.checkpoint_complete(id)
    }
}

impl<F: AsyncFunction> Drop for AsyncLink<F> {
    /// Hands the operator's counters to the report (also when the run fails).
    fn drop(&mut self) {
        self.shared.merge_async(self.stage, self.operator.metrics());
        let live = &self.shared.live.in_flight;
        live.fetch_sub(self.in_flight_reported, Ordering::Relaxed);
    }
}

/// What waits in a writer link's overflow: elements, and barriers behind them.
pub(crate) enum Out<T> {
    Element(StreamElement<T>),
    Barrier(u64),
}

/// The end of a stage that feeds an exchange.
pub(crate) struct WriterLink<T: Codec> {
    pub(crate) writer: RecordWriter<Record<T>, Selector<T>>,
    pub(crate) overflow: VecDeque<Out<T>>,
    pub(crate) finished: bool,
    pub(crate) stage: String,
}

impl<T: Codec> WriterLink<T> {
    #[inline]
    fn write(&mut self, element: &StreamElement<T>, now: u64) -> Result<(), TaskError> {
        // By reference: the record is encoded from where it lies, with no copy of it
        // (whose wide loads of narrow stores can stall store forwarding).
        match element {
            StreamElement::Record(record) => {
                self.writer.emit(record, now)?;
                self.check_partitions()?;
            }
            StreamElement::Watermark(w) => self.writer.emit_watermark(w.0, now)?,
        }
        Ok(())
    }

    /// A custom partitioner's choice out of range fails the job, naming the stage.
    #[inline]
    fn check_partitions(&self) -> Result<(), TaskError> {
        if let Some((partition, partitions)) = self.writer.selector().out_of_range {
            return Err(Box::new(GraphRunError::PartitionOutOfRange {
                stage: self.stage.clone(),
                partition,
                partitions,
            }));
        }
        Ok(())
    }
}

impl<T: Codec> Link<T> for WriterLink<T> {
    #[inline]
    fn accepts(&mut self) -> bool {
        self.overflow.is_empty() && self.writer.is_available()
    }

    #[inline]
    fn push(
        &mut self,
        element: StreamElement<T>,
        cx: &mut TaskContext<'_>,
    ) -> Result<(), TaskError> {
        if self.overflow.is_empty() && self.writer.is_available() {
            self.write(&element, cx.now_ns)
        } else {
            self.overflow.push_back(Out::Element(element));
            Ok(())
        }
    }

    #[inline]
    fn push_run(
        &mut self,
        run: &mut Vec<Record<T>>,
        cx: &mut TaskContext<'_>,
    ) -> Result<(), TaskError> {
        let mut taken = 0;
        if self.overflow.is_empty() && self.writer.is_available() {
            taken = self.writer.emit_run(run, cx.now_ns)?;
            self.check_partitions()?;
        }
        // What the pool could not take now waits, in order, behind the pending record.
        self.overflow.extend(
            run.drain(..)
                .skip(taken)
                .map(|r| Out::Element(StreamElement::Record(r))),
        );
        run.clear();
        Ok(())
    }

    fn poll(&mut self, cx: &mut TaskContext<'_>) -> Result<bool, TaskError> {
        let now = cx.now_ns;
        let mut moved = false;
        // `poll_ready` resumes a pending record and, when the pool is dry, arms its
        // notification so that a recycled buffer wakes this worker.
        while self.writer.poll_ready(now)? {
            match self.overflow.pop_front() {
                None => break,
                Some(Out::Element(element)) => self.write(&element, now)?,
                Some(Out::Barrier(id)) => self.writer.emit_barrier(id, now)?,
            }
            moved = true;
        }
        self.writer.on_timer(now)?;
        Ok(moved)
    }

    fn finish(&mut self, cx: &mut TaskContext<'_>) -> Result<bool, TaskError> {
        let now = cx.now_ns;
        if !self.finished {
            self.poll(cx)?;
            if !self.overflow.is_empty() || self.writer.has_pending() {
                return Ok(false);
            }
            self.writer.finish(now)?;
            self.finished = true;
        }
        // Arms the pool's notification while the end is pending, so the recycled buffer
        // that lets it continue wakes this task (a plain `resume` would wait for the
        // worker's idle sweep).
        Ok(self.writer.poll_pending(now)?)
    }

    fn next_deadline(&self) -> Option<u64> {
        self.writer.next_flush_deadline()
    }

    fn on_io(&mut self, _event: &DriverEvent<'_>) -> bool {
        false
    }

    fn report(&mut self, metrics: &TaskMetrics) {
        TaskMetrics::set(&metrics.records_out, self.writer.metrics().records_out);
        let usage = self.writer.partition().pool().usage();
        TaskMetrics::set(&metrics.out_pool_usage_ppm, (usage * 1e6) as u64);
    }

    fn barrier(
        &mut self,
        id: u64,
        snapshot: &mut Snapshot,
        cx: &mut TaskContext<'_>,
    ) -> Result<(), TaskError> {
        if self.finished {
            // A finished task's last snapshot: its end went out, and with it every
            // later barrier as far as the consumers are concerned. What it queued in
            // front of the end may still be read: later unaligned barriers are
            // announced ahead of it through these.
            if snapshot.finishing {
                let announcers = if snapshot.timeoutable {
                    self.writer.aligned_barrier_announcers()
                } else {
                    self.writer.barrier_announcers()
                };
                snapshot.announcers.extend(announcers);
            }
            return Ok(());
        }
        if snapshot.unaligned {
            // Ahead of the data: the consumers take the checkpoint now and store what is
            // queued in front of the barrier as channel state.
            self.writer.announce_barrier(id);
        } else if snapshot.timeoutable {
            // Its timeout runs from now at the consumers, however long it queues.
            self.writer.announce_aligned_barrier(id);
        }
        // In band, behind everything written or waiting before it.
        if self.overflow.is_empty() && self.writer.is_available() {
            self.writer.emit_barrier(id, cx.now_ns)?;
        } else {
            self.overflow.push_back(Out::Barrier(id));
        }
        Ok(())
    }

    fn checkpoint_complete(&mut self, _id: u64) -> Result<(), TaskError> {
        Ok(())
    }
}

/// The end of a stage that ends in a sink.
pub(crate) struct SinkLink<S> {
    pub(crate) sink: S,
    /// The sink's own I/O on the worker's driver, if it does any.
    pub(crate) io: Option<Box<dyn IoHandler>>,
    pub(crate) finished: bool,
    /// Its section in the task's snapshot.
    pub(crate) position: u32,
}

impl<T, S: Sink<T>> Link<T> for SinkLink<S> {
    #[inline]
    fn accepts(&mut self) -> bool {
        self.sink.accepts()
    }

    #[inline]
    fn room(&mut self) -> usize {
        self.sink.room().min(POLL_BATCH_MAX)
    }

    #[inline]
    fn push(
        &mut self,
        element: StreamElement<T>,
        cx: &mut TaskContext<'_>,
    ) -> Result<(), TaskError> {
        match element {
            StreamElement::Record(r) => self.sink.invoke(r.value, r.timestamp, cx.now_ns),
            StreamElement::Watermark(w) => self.sink.on_watermark(w.0),
        }
    }

    #[inline]
    fn push_run(
        &mut self,
        run: &mut Vec<Record<T>>,
        cx: &mut TaskContext<'_>,
    ) -> Result<(), TaskError> {
        self.sink.invoke_batch(run.drain(..), cx.now_ns)
    }

    fn poll(&mut self, cx: &mut TaskContext<'_>) -> Result<bool, TaskError> {
        if let Some(io) = self.io.as_mut() {
            io.flush(cx.driver, cx.now_ns);
        }
        self.sink.poll(cx.now_ns)
    }

    fn finish(&mut self, cx: &mut TaskContext<'_>) -> Result<bool, TaskError> {
        if !self.finished {
            self.finished = true;
            self.sink.finish()?;
        }
        self.poll(cx)?;
        Ok(self.sink.flushed())
    }

    fn next_deadline(&self) -> Option<u64> {
        self.io.as_ref().and_then(|io| io.next_deadline())
    }

    fn on_io(&mut self, event: &DriverEvent<'_>) -> bool {
        self.io.as_mut().is_some_and(|io| io.on_event(event))
    }

    fn report(&mut self, _metrics: &TaskMetrics) {}

    fn barrier(
        &mut self,
        id: u64,
        snapshot: &mut Snapshot,
        _cx: &mut TaskContext<'_>,
    ) -> Result<(), TaskError> {
        if let Some(state) = self.sink.snapshot_state(id)? {
            snapshot.push(self.position, state);
            snapshot.commits = true;
        }
        Ok(())
    }

    fn checkpoint_complete(&mut self, id: u64) -> Result<(), TaskError> {
        self.sink.notify_checkpoint_complete(id)
    }
}

/// `map_with_state`: a function of each record and its key's value state, the state
/// kept per key group so that a restore may redistribute it.
pub(crate) struct KeyedMapLink<K, V, KF, F, U> {
    pub(crate) key: KF,
    pub(crate) f: F,
    pub(crate) state: KeyedState<K, V>,
    pub(crate) position: u32,
    pub(crate) stage: String,
    pub(crate) next: Box<dyn Link<U>>,
}

impl<T, U, K, V, KF, F> Link<T> for KeyedMapLink<K, V, KF, F, U>
where
    K: KeyHashCode + Codec + Eq + std::hash::Hash + Clone + Send + Sync + 'static,
    V: Codec + Clone + Send + Sync + 'static,
    KF: FnMut(&T) -> K,
    F: FnMut(T, &mut Option<V>) -> U,
{
    #[inline]
    fn push(
        &mut self,
        element: StreamElement<T>,
        cx: &mut TaskContext<'_>,
    ) -> Result<(), TaskError> {
        let element = match element {
            StreamElement::Record(r) => {
                let key = (self.key)(&r.value);
                let stage = &self.stage;
                let keyed = |e| -> TaskError {
                    format!("{stage}: {e}; map_with_state must follow a key_by with the same key")
                        .into()
                };
                let mut value = self.state.remove(&key).map_err(keyed)?;
                let out = (self.f)(r.value, &mut value);
                if let Some(value) = value {
                    self.state.insert(key, value).map_err(keyed)?;
                }
                StreamElement::record(out, r.timestamp)
            }
            StreamElement::Watermark(w) => StreamElement::Watermark(w),
        };
        self.next.push(element, cx)
    }

    forward_io!();
    fn barrier(
        &mut self,
        id: u64,
        snapshot: &mut Snapshot,
        cx: &mut TaskContext<'_>,
    ) -> Result<(), TaskError> {
        // The synchronous phase takes a copy-on-write view of the maps (a reference count
        // per key group); the bytes are written on the service's thread.
        snapshot.push_deferred(self.position, Box::new(self.state.snapshot_view()));
        self.next.barrier(id, snapshot, cx)
    }
    fn checkpoint_complete(&mut self, id: u64) -> Result<(), TaskError> {
        self.next.checkpoint_complete(id)
    }
}

/// Where a stage's input comes from: a source, or an input gate (whose records are
/// `Codec`; a source's need not be).
pub(crate) enum StageInput<T> {
    Source(Box<dyn Source<T>>),
    Gate(Box<dyn GateInput<T>>),
}

/// What a stage's input gives next.
pub(crate) enum Step<T> {
    Event(SourceEvent<T>),
    /// A checkpoint's barriers are aligned: snapshot and forward.
    Barrier {
        id: u64,
        alignment: Duration,
        unaligned: bool,
    },
    /// A checkpoint cannot complete here.
    Aborted {
        id: u64,
        reason: String,
    },
}

/// An input gate of any record type, as a stage reads it.
pub(crate) trait GateInput<T> {
    /// The channel state of an unaligned checkpoint, once whole.
    fn take_channel_state(&mut self) -> Option<(u64, Vec<u8>)>;
    /// When an alignment in progress times out.
    fn alignment_deadline(&self) -> Option<u64>;
    /// See [`InputGate::in_pool_usage`].
    fn in_pool_usage(&self) -> f64;
    /// See [`InputGate::in_flight_bytes`].
    fn in_flight_bytes(&self) -> (u64, u64);
    /// The batch form of [`next`](Self::next): appends up to `max` records to `run`
    /// (see [`InputGate::poll_run_at`]); what ended the run, if not `max` or the
    /// buffer's end.
    fn next_run(
        &mut self,
        now_ns: u64,
        run: &mut Vec<Record<T>>,
        max: usize,
    ) -> Result<Option<Step<T>>, TaskError>;
}

impl<T: Codec> GateInput<T> for InputGate<Record<T>> {
    fn in_pool_usage(&self) -> f64 {
        InputGate::in_pool_usage(self)
    }

    fn in_flight_bytes(&self) -> (u64, u64) {
        InputGate::in_flight_bytes(self)
    }

    fn take_channel_state(&mut self) -> Option<(u64, Vec<u8>)> {
        InputGate::take_channel_state(self)
    }

    #[inline]
    fn next_run(
        &mut self,
        now_ns: u64,
        run: &mut Vec<Record<T>>,
        max: usize,
    ) -> Result<Option<Step<T>>, TaskError> {
        Ok(match self.poll_run_at(now_ns, run, max)? {
            Some(GateRun::Records { .. }) => None,
            Some(GateRun::Event(event)) => Some(match event {
                GateEvent::Record { value, .. } => {
                    // Not yielded as an event; kept for the type's sake, in order.
                    run.push(value);
                    return Ok(None);
                }
                GateEvent::Watermark(w) => Step::Event(SourceEvent::Watermark(w)),
                GateEvent::End => Step::Event(SourceEvent::End),
                GateEvent::Barrier {
                    id,
                    alignment,
                    unaligned,
                } => Step::Barrier {
                    id,
                    alignment,
                    unaligned,
                },
                GateEvent::CheckpointAborted { id, reason } => Step::Aborted {
                    id,
                    reason: *reason,
                },
            }),
            None => Some(Step::Event(SourceEvent::Idle { until_ns: None })),
        })
    }

    fn alignment_deadline(&self) -> Option<u64> {
        InputGate::alignment_deadline(self)
    }
}

/// What the checkpoints of a run share with every task: the newest checkpoint
/// triggered (sources inject its barrier) and the newest completed.
#[derive(Debug, Default)]
pub(crate) struct CheckpointSignals {
    pub(crate) triggered: AtomicU64,
    pub(crate) completed: AtomicU64,
    /// In unaligned mode, the output channels of tasks that finished (their input
    /// ended and they left), whose consumers may still have their queued output to
    /// read: each later checkpoint's barrier is announced on them when it is
    /// triggered, as it would overtake that output had the task stayed (Flink keeps a
    /// finished task running until its final checkpoint for this). Aligned with a
    /// timeout, the same as an aligned barrier's announcement, so that the consumers'
    /// timeout runs from the trigger.
    pub(crate) finished_outputs: Mutex<Vec<BarrierAnnouncer>>,
}

impl CheckpointSignals {
    /// Checkpoint `id` is triggered: sources inject its barrier, and it is announced
    /// ahead of the finished tasks' queued output.
    pub(crate) fn trigger(&self, id: u64) {
        self.triggered.fetch_max(id, Ordering::AcqRel);
        let outputs = self
            .finished_outputs
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for output in outputs.iter() {
            output.announce(id);
        }
    }

    /// A finished task's output channels, whose state counts from checkpoint `first`
    /// on: announced every later barrier, and the one triggered now if it is one of
    /// them. (Under the lock, so that a trigger either finds them registered or is
    /// seen here.)
    pub(crate) fn finished(&self, announcers: Vec<BarrierAnnouncer>, first: u64) {
        if announcers.is_empty() {
            return;
        }
        let mut outputs = self
            .finished_outputs
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let triggered = self.triggered.load(Ordering::Acquire);
        if triggered >= first {
            for announcer in &announcers {
                announcer.announce(triggered);
            }
        }
        outputs.extend(announcers);
    }
}

/// A task's part in checkpoints.
pub(crate) struct TaskCheckpoint {
    pub(crate) acks: Acks,
    /// Its number among the job's tasks.
    pub(crate) task: usize,
    /// Its state file's name.
    pub(crate) name: String,
    pub(crate) signals: Arc<CheckpointSignals>,
    pub(crate) mode: AlignmentMode,
    /// The newest barrier this task snapshotted.
    last_barrier: u64,
    /// The newest completion it heard of.
    last_completed: u64,
    /// An unaligned snapshot waiting for its channel state.
    waiting: Option<(u64, Snapshot, Duration)>,
    /// At its end: the checkpoint that must complete before it is done (its sink
    /// pre-committed its last output for it).
    final_commit: Option<u64>,
    finished_sent: bool,
}

impl TaskCheckpoint {
    pub(crate) fn new(
        acks: Acks,
        task: usize,
        name: String,
        signals: Arc<CheckpointSignals>,
        mode: AlignmentMode,
        restored: u64,
    ) -> Self {
        TaskCheckpoint {
            acks,
            task,
            name,
            signals,
            mode,
            last_barrier: restored,
            last_completed: restored,
            waiting: None,
            final_commit: None,
            finished_sent: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    Finishing,
}

/// One subtask of a stage.
pub(crate) struct StageTask<T> {
    pub(crate) input: StageInput<T>,
    pub(crate) chain: Box<dyn Link<T>>,
    phase: Phase,
    /// The source was told to stop ([`Control::EndOfInput`]).
    end_requested: bool,
    wake_at: Option<u64>,
    blocked_since: Option<u64>,
    backpressured_ns: u64,
    records_in: u64,
    shared: Arc<Shared>,
    stage: usize,
    /// `stage (subtask/parallelism)`, as Flink names a subtask.
    name: String,
    checkpoint: Option<TaskCheckpoint>,
    /// The source's own I/O on the worker's driver, if it does any.
    source_io: Option<Box<dyn IoHandler>>,
    /// Live figures, when an exporter asked for them.
    metrics: Option<Arc<TaskMetrics>>,
    /// The run of records being handed to the chain (kept for its capacity).
    run: Vec<Record<T>>,
    /// The most records a run from the gate may hold (see [`RUN_BUDGET_NS`]).
    run_cap: usize,
}

impl<T: 'static> StageTask<T> {
    pub(crate) fn new(
        input: StageInput<T>,
        chain: Box<dyn Link<T>>,
        shared: Arc<Shared>,
        stage: usize,
        info: &crate::graph::SubtaskInfo,
    ) -> Self {
        StageTask {
            name: format!("{} ({}/{})", info.stage, info.index + 1, info.parallelism),
            input,
            chain,
            phase: Phase::Running,
            end_requested: false,
            wake_at: None,
            blocked_since: None,
            backpressured_ns: 0,
            records_in: 0,
            shared,
            stage,
            checkpoint: None,
            source_io: None,
            metrics: None,
            run: Vec::with_capacity(POLL_BATCH_MAX),
            run_cap: POLL_BATCH_MAX,
        }
    }

    /// A run of `count` records from the gate took `took_ns` through the chain: the next
    /// run's cap follows [`RUN_BUDGET_NS`].
    fn fit_run_cap(&mut self, count: usize, took_ns: u64) {
        if took_ns > RUN_BUDGET_NS {
            let fits = count as u64 * RUN_BUDGET_NS / took_ns.max(1);
            self.run_cap = (fits as usize).clamp(1, POLL_BATCH_MAX);
        } else if took_ns < RUN_BUDGET_NS / 2 && count >= self.run_cap {
            self.run_cap = (self.run_cap * 2).min(POLL_BATCH_MAX);
        }
    }

    /// Keeps live figures in `metrics`.
    pub(crate) fn with_metrics(mut self, metrics: Option<Arc<TaskMetrics>>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Writes the task's figures after a poll that took `busy_ns`.
    #[cold]
    fn report(&mut self, metrics: &TaskMetrics, busy_ns: u64, now_ns: u64, done: bool) {
        metrics.busy_ns.fetch_add(busy_ns, Ordering::Relaxed);
        TaskMetrics::set(&metrics.records_in, self.records_in);
        let blocked = self
            .blocked_since
            .map_or(0, |since| now_ns.saturating_sub(since));
        TaskMetrics::set(&metrics.backpressured_ns, self.backpressured_ns + blocked);
        if let StageInput::Gate(gate) = &self.input {
            let usage = gate.in_pool_usage();
            TaskMetrics::set(&metrics.in_pool_usage_ppm, (usage * 1e6) as u64);
            let (in_flight, fullest) = gate.in_flight_bytes();
            TaskMetrics::set(&metrics.in_flight_bytes, in_flight);
            TaskMetrics::set(&metrics.in_flight_bytes_max_channel, fullest);
        }
        self.chain.report(metrics);
        if done {
            metrics.finished.store(true, Ordering::Relaxed);
        }
    }

    /// Drives the source's I/O (`None`: it does none).
    pub(crate) fn with_source_io(mut self, io: Option<Box<dyn IoHandler>>) -> Self {
        self.source_io = io;
        self
    }

    /// Hands the source's queued requests to the driver.
    #[inline]
    fn flush_source_io(&mut self, cx: &mut TaskContext<'_>) {
        if let Some(io) = self.source_io.as_mut() {
            io.flush(cx.driver, cx.now_ns);
        }
    }

    /// Takes part in checkpoints.
    pub(crate) fn with_checkpoint(mut self, checkpoint: Option<TaskCheckpoint>) -> Self {
        self.checkpoint = checkpoint;
        self
    }

    /// Snapshots checkpoint `id` (the source's position first, then every link in
    /// order) and sends the barrier on; acknowledges unless channel state is to come.
    #[cold]
    fn snapshot(
        &mut self,
        id: u64,
        alignment: Duration,
        unaligned: bool,
        cx: &mut TaskContext<'_>,
    ) -> Result<(), TaskError> {
        let Some(checkpoint) = self.checkpoint.as_mut() else {
            return Err(format!(
                "{}: a checkpoint barrier arrived, but the job does not checkpoint",
                self.name
            )
            .into());
        };
        checkpoint.last_barrier = checkpoint.last_barrier.max(id);
        let mut snapshot = Snapshot {
            unaligned,
            timeoutable: !unaligned
                && matches!(checkpoint.mode, AlignmentMode::AlignedWithTimeout(_)),
            ..Snapshot::default()
        };
        if let StageInput::Source(source) = &mut self.input {
            match source.snapshot_state() {
                Some(state) => snapshot.push(SOURCE_SECTION, state),
                None => {
                    checkpoint.acks.decline(
                        id,
                        checkpoint.task,
                        format!(
                            "{}: its source cannot be replayed from a position (implement \
                             Source::snapshot_state and restore_state), so no checkpoint can \
                             hold it",
                            self.name
                        ),
                    );
                    return Ok(());
                }
            }
        }
        self.chain.barrier(id, &mut snapshot, cx)?;
        let checkpoint = self.checkpoint.as_mut().expect("checked");
        let mut channel_state = 0;
        if let StageInput::Gate(gate) = &mut self.input {
            // Channel state: what was in flight at the snapshot (unaligned, or records the
            // gate had taken out of their channels and not yet given).
            match gate.take_channel_state() {
                Some((state_id, bytes)) if state_id == id && !bytes.is_empty() => {
                    channel_state = bytes.len() as u64;
                    snapshot.push(CHANNEL_SECTION, bytes);
                }
                Some((state_id, _)) if state_id == id => {}
                _ if unaligned => {
                    checkpoint.waiting = Some((id, snapshot, alignment));
                    return Ok(());
                }
                _ => {}
            }
        }
        checkpoint.acks.acknowledge(
            id,
            checkpoint.task,
            &checkpoint.name,
            snapshot.into_state(),
            AckFigures {
                alignment,
                channel_state,
            },
        );
        Ok(())
    }

    /// What checkpoints ask of the task at each poll: completions to pass on, a
    /// source's barrier to inject, channel state that came whole.
    #[inline]
    fn checkpoint_turn(&mut self, cx: &mut TaskContext<'_>) -> Result<(), TaskError> {
        let Some(checkpoint) = self.checkpoint.as_mut() else {
            return Ok(());
        };
        let completed = checkpoint.signals.completed.load(Ordering::Acquire);
        if completed > checkpoint.last_completed {
            checkpoint.last_completed = completed;
            if let StageInput::Source(source) = &mut self.input {
                source.notify_checkpoint_complete(completed)?;
            }
            self.chain.checkpoint_complete(completed)?;
        }
        self.ack_waiting();
        let checkpoint = self.checkpoint.as_mut().expect("checked");
        if matches!(self.input, StageInput::Source(_)) && self.phase == Phase::Running {
            let triggered = checkpoint.signals.triggered.load(Ordering::Acquire);
            if triggered > checkpoint.last_barrier {
                // A source's barrier is unaligned from the start in unaligned mode.
                let unaligned = checkpoint.mode == AlignmentMode::Unaligned;
                self.snapshot(triggered, Duration::ZERO, unaligned, cx)?;
            }
        }
        Ok(())
    }

    /// Acknowledges an unaligned snapshot whose channel state came whole.
    fn ack_waiting(&mut self) {
        let (Some(checkpoint), StageInput::Gate(gate)) =
            (self.checkpoint.as_mut(), &mut self.input)
        else {
            return;
        };
        if checkpoint.waiting.is_none() {
            return;
        }
        if let Some((id, bytes)) = gate.take_channel_state() {
            if let Some((waiting, mut snapshot, alignment)) = checkpoint.waiting.take() {
                if waiting == id {
                    let channel_state = bytes.len() as u64;
                    if !bytes.is_empty() {
                        snapshot.push(CHANNEL_SECTION, bytes);
                    }
                    checkpoint.acks.acknowledge(
                        id,
                        checkpoint.task,
                        &checkpoint.name,
                        snapshot.into_state(),
                        AckFigures {
                            alignment,
                            channel_state,
                        },
                    );
                } else {
                    checkpoint.waiting = Some((waiting, snapshot, alignment));
                }
            }
        }
    }

    /// The task's input and chain are done: with checkpoints, its final state goes to
    /// the coordinator (which acknowledges every later checkpoint with it), and a task
    /// whose sink pre-committed its last output waits for a checkpoint to commit it.
    /// Whether the task is done.
    fn finish_checkpoints(&mut self, cx: &mut TaskContext<'_>) -> Result<bool, TaskError> {
        let Some(checkpoint) = self.checkpoint.as_mut() else {
            return Ok(true);
        };
        if !checkpoint.finished_sent {
            checkpoint.finished_sent = true;
            // A snapshot waiting for its channel state has it now (every channel
            // ended); one that does not cannot be taken any more.
            self.ack_waiting();
            let checkpoint = self.checkpoint.as_mut().expect("checked");
            if let Some((id, ..)) = checkpoint.waiting.take() {
                checkpoint.acks.decline(
                    id,
                    checkpoint.task,
                    format!("{}: ended before the channel state was whole", self.name),
                );
            }
            let checkpoint = self.checkpoint.as_mut().expect("checked");
            // The checkpoint this state first counts for: one triggered that this task
            // has not snapshotted, or the next.
            let triggered = checkpoint.signals.triggered.load(Ordering::Acquire);
            let first = if triggered > checkpoint.last_barrier {
                triggered
            } else {
                checkpoint.last_barrier + 1
            };
            let mut snapshot = Snapshot {
                finishing: true,
                timeoutable: matches!(checkpoint.mode, AlignmentMode::AlignedWithTimeout(_)),
                ..Snapshot::default()
            };
            if let StageInput::Source(source) = &mut self.input {
                if let Some(state) = source.snapshot_state() {
                    snapshot.push(SOURCE_SECTION, state);
                }
            }
            self.chain.barrier(first, &mut snapshot, cx)?;
            let checkpoint = self.checkpoint.as_mut().expect("checked");
            if matches!(
                checkpoint.mode,
                AlignmentMode::Unaligned | AlignmentMode::AlignedWithTimeout(_)
            ) {
                let announcers = std::mem::take(&mut snapshot.announcers);
                checkpoint.signals.finished(announcers, first);
            }
            let commits = snapshot.commits;
            // The final state holds for every later checkpoint: made once, here.
            let state = snapshot.into_state().into_bytes();
            checkpoint
                .acks
                .finished(checkpoint.task, &checkpoint.name, first, state);
            if commits {
                checkpoint.final_commit = Some(first);
                checkpoint.acks.trigger_now();
            }
        }
        let checkpoint = self.checkpoint.as_mut().expect("checked");
        Ok(checkpoint
            .final_commit
            .is_none_or(|first| checkpoint.last_completed >= first))
    }

    fn poll_stage(&mut self, cx: &mut TaskContext<'_>) -> Result<Progress, TaskError> {
        let now = cx.now_ns;
        if self.checkpoint.is_some() {
            self.checkpoint_turn(cx)?;
        }
        self.flush_source_io(cx);
        let mut busy = self.chain.poll(cx)?;
        if self.phase == Phase::Running {
            self.wake_at = None;
            let mut taken = 0;
            let mut records = 0;
            // A checkpointed task's runs from its gate are timed (one clock read per run)
            // to keep barriers from waiting behind a slow chain (see RUN_BUDGET_NS).
            let mut mark = (self.checkpoint.is_some() && matches!(self.input, StageInput::Gate(_)))
                .then(std::time::Instant::now);
            while taken < POLL_BATCH_MAX {
                // One look at the chain's room per run, not per record.
                let mut room = self.chain.room().min(POLL_BATCH_MAX - taken);
                if mark.is_some() {
                    room = room.min(self.run_cap);
                }
                if room == 0 {
                    self.blocked_since.get_or_insert(now);
                    break;
                }
                let step = match &mut self.input {
                    StageInput::Source(_) if self.end_requested => {
                        Some(Step::Event(SourceEvent::End))
                    }
                    StageInput::Source(source) => {
                        source.poll_batch(now, &mut self.run, room).map(Step::Event)
                    }
                    StageInput::Gate(gate) => gate.next_run(now, &mut self.run, room)?,
                };
                if !self.run.is_empty() {
                    if let Some(since) = self.blocked_since.take() {
                        self.backpressured_ns += now.saturating_sub(since);
                    }
                    let count = self.run.len();
                    records += count as u64;
                    taken += count;
                    self.chain.push_run(&mut self.run, cx)?;
                    if let Some(started) = mark.as_mut() {
                        let now = std::time::Instant::now();
                        let took = now.saturating_duration_since(*started).as_nanos() as u64;
                        *started = now;
                        self.fit_run_cap(count, took);
                    }
                }
                let Some(step) = step else {
                    continue;
                };
                let event = match step {
                    Step::Event(event) => event,
                    Step::Barrier {
                        id,
                        alignment,
                        unaligned,
                    } => {
                        self.snapshot(id, alignment, unaligned, cx)?;
                        taken += 1;
                        continue;
                    }
                    Step::Aborted { id, reason } => {
                        if let Some(checkpoint) = self.checkpoint.as_mut() {
                            if checkpoint.waiting.as_ref().is_some_and(|(w, ..)| *w == id) {
                                checkpoint.waiting = None;
                            }
                            checkpoint.acks.decline(
                                id,
                                checkpoint.task,
                                format!("{}: {reason}", self.name),
                            );
                        }
                        taken += 1;
                        continue;
                    }
                };
                match event {
                    SourceEvent::Record(value, timestamp) => {
                        if let Some(since) = self.blocked_since.take() {
                            self.backpressured_ns += now.saturating_sub(since);
                        }
                        self.chain
                            .push(StreamElement::record(value, timestamp), cx)?;
                        records += 1;
                    }
                    SourceEvent::Watermark(w) => {
                        self.chain.push(StreamElement::watermark(w), cx)?;
                    }
                    SourceEvent::Idle { until_ns } => {
                        self.wake_at = until_ns;
                        break;
                    }
                    SourceEvent::End => {
                        if matches!(self.input, StageInput::Source(_)) {
                            // A bounded source's end is the end of event time (Flink's
                            // final MAX_WATERMARK); a gate's channels carry their own.
                            self.chain.push(StreamElement::watermark(i64::MAX), cx)?;
                        }
                        self.phase = Phase::Finishing;
                        break;
                    }
                    SourceEvent::Failed(message) => {
                        return Err(Box::new(SourceFailed {
                            stage: self.name.clone(),
                            message,
                        }));
                    }
                }
                taken += 1;
            }
            if taken > 0 {
                busy = true;
                self.records_in += records;
                if matches!(self.input, StageInput::Source(_)) {
                    self.shared
                        .live
                        .generated
                        .fetch_add(records, Ordering::Relaxed);
                }
                // Send what the new input started (I/O, buffers) and arm wake-ups.
                self.chain.poll(cx)?;
            }
            // The source's requests (e.g. its next read) go out this turn.
            self.flush_source_io(cx);
        }
        // Channel state that came whole in this poll (no later poll may come soon).
        self.ack_waiting();
        // A sink's final commit may be I/O of its own: the chain finishes again after it.
        if self.phase == Phase::Finishing
            && self.chain.finish(cx)?
            && self.finish_checkpoints(cx)?
            && self.chain.finish(cx)?
        {
            return Ok(Progress::Done);
        }
        Ok(if busy { Progress::Busy } else { Progress::Idle })
    }
}

impl<T: 'static> Task for StageTask<T> {
    fn name(&self) -> &str {
        &self.name
    }

    fn poll(&mut self, cx: &mut TaskContext<'_>) -> Result<Progress, TaskError> {
        let worker = cx.worker;
        let Some(metrics) = self.metrics.clone() else {
            return self
                .poll_stage(cx)
                .map_err(|error| self.shared.note_failure(worker, error));
        };
        let start = std::time::Instant::now();
        let progress = self
            .poll_stage(cx)
            .map_err(|error| self.shared.note_failure(worker, error));
        let busy = start.elapsed().as_nanos() as u64;
        let done = !matches!(progress, Ok(Progress::Busy | Progress::Idle));
        self.report(&metrics, busy, cx.now_ns, done);
        progress
    }

    fn on_io(&mut self, event: &DriverEvent<'_>) -> bool {
        self.source_io.as_mut().is_some_and(|io| io.on_event(event)) || self.chain.on_io(event)
    }

    fn on_control(&mut self, control: Control, cx: &mut TaskContext<'_>) -> Result<(), TaskError> {
        let _ = cx;
        if control == Control::EndOfInput && matches!(self.input, StageInput::Source(_)) {
            // Stop with drain: the source reads no more; its end follows as for a bounded
            // source that ran out, once the chain accepts it (see `poll_stage`).
            self.end_requested = true;
            self.wake_at = None;
        }
        Ok(())
    }

    fn next_deadline(&self) -> Option<u64> {
        let alignment = match &self.input {
            StageInput::Gate(gate) if self.checkpoint.is_some() => gate.alignment_deadline(),
            _ => None,
        };
        let io = self.source_io.as_ref().and_then(|io| io.next_deadline());
        [self.chain.next_deadline(), self.wake_at, alignment, io]
            .into_iter()
            .flatten()
            .min()
    }
}

impl<T> Drop for StageTask<T> {
    fn drop(&mut self) {
        self.shared
            .merge_task(self.stage, self.records_in, self.backpressured_ns);
    }
}
