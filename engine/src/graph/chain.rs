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

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::async_io::{AsyncFunction, AsyncWaitOperator};
use crate::element::{Record, StreamElement};
use crate::exchange::codec::Codec;
use crate::exchange::{GateEvent, InputGate, RecordWriter};
use crate::runtime::{Control, DriverEvent, Progress, Task, TaskContext, TaskError};

use super::partition::Selector;
use super::sink::Sink;
use super::source::{Source, SourceEvent};
use super::{GraphRunError, IoHandler, Shared};

/// Input elements a task takes per poll before yielding to its worker's other tasks.
pub(crate) const POLL_BATCH_MAX: usize = 256;

/// One operator of a chain (or its end), taking elements of `T`.
pub(crate) trait Link<T> {
    /// Whether it takes another element now.
    fn accepts(&mut self) -> bool;
    /// Takes an element (also when [`accepts`](Self::accepts) said no: it queues it).
    fn push(
        &mut self,
        element: StreamElement<T>,
        cx: &mut TaskContext<'_>,
    ) -> Result<(), TaskError>;
    /// Moves queued work along; whether anything moved.
    fn poll(&mut self, cx: &mut TaskContext<'_>) -> Result<bool, TaskError>;
    /// The input ended: whether this link and all after it are done (called again
    /// until they are).
    fn finish(&mut self, cx: &mut TaskContext<'_>) -> Result<bool, TaskError>;
    /// The earliest time a link needs polling without input.
    fn next_deadline(&self) -> Option<u64>;
    /// Takes a driver event if it is for one of the chain's connections.
    fn on_io(&mut self, event: &DriverEvent<'_>) -> bool;
}

/// Forwards everything but records to `next`.
macro_rules! forward_rest {
    () => {
        #[inline]
        fn accepts(&mut self) -> bool {
            self.next.accepts()
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
    };
}

pub(crate) struct MapLink<F, U> {
    pub(crate) f: F,
    pub(crate) next: Box<dyn Link<U>>,
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
    forward_rest!();
}

pub(crate) struct FlatMapLink<F, U> {
    pub(crate) f: F,
    pub(crate) next: Box<dyn Link<U>>,
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
}

impl<F: AsyncFunction> AsyncLink<F> {
    /// The link running `operator` (with its I/O, if any) for `stage`, ahead of `next`.
    pub(crate) fn new(
        operator: AsyncWaitOperator<F>,
        io: Option<Box<dyn IoHandler>>,
        next: Box<dyn Link<F::Out>>,
        shared: Arc<Shared>,
        stage: usize,
    ) -> Self {
        AsyncLink {
            operator,
            io,
            input: VecDeque::new(),
            output: VecDeque::new(),
            next,
            finished: false,
            in_flight_reported: 0,
            shared,
            stage,
        }
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

    fn move_out(&mut self, cx: &mut TaskContext<'_>) -> Result<bool, TaskError> {
        let mut moved = false;
        while !self.output.is_empty() && self.next.accepts() {
            if let Some(element) = self.output.pop_front() {
                self.next.push(element, cx)?;
                moved = true;
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

impl<F: AsyncFunction> Link<F::In> for AsyncLink<F> {
    #[inline]
    fn accepts(&mut self) -> bool {
        self.input.is_empty() && !self.operator.is_full() && self.output.len() < POLL_BATCH_MAX
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
}

impl<F: AsyncFunction> Drop for AsyncLink<F> {
    /// Hands the operator's counters to the report (also when the run fails).
    fn drop(&mut self) {
        self.shared.merge_async(self.stage, self.operator.metrics());
        let live = &self.shared.live.in_flight;
        live.fetch_sub(self.in_flight_reported, Ordering::Relaxed);
    }
}

/// The end of a stage that feeds an exchange.
pub(crate) struct WriterLink<T: Codec> {
    pub(crate) writer: RecordWriter<Record<T>, Selector<T>>,
    pub(crate) overflow: VecDeque<StreamElement<T>>,
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
                if let Some((partition, partitions)) = self.writer.selector().out_of_range {
                    return Err(Box::new(GraphRunError::PartitionOutOfRange {
                        stage: self.stage.clone(),
                        partition,
                        partitions,
                    }));
                }
            }
            StreamElement::Watermark(w) => self.writer.emit_watermark(w.0, now)?,
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
            self.overflow.push_back(element);
            Ok(())
        }
    }

    fn poll(&mut self, cx: &mut TaskContext<'_>) -> Result<bool, TaskError> {
        let now = cx.now_ns;
        let mut moved = false;
        // `poll_ready` resumes a pending record and, when the pool is dry, arms its
        // notification so that a recycled buffer wakes this worker.
        while self.writer.poll_ready(now)? {
            let Some(element) = self.overflow.pop_front() else {
                break;
            };
            self.write(&element, now)?;
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
}

/// The end of a stage that ends in a sink.
pub(crate) struct SinkLink<S> {
    pub(crate) sink: S,
    pub(crate) finished: bool,
}

impl<T, S: Sink<T>> Link<T> for SinkLink<S> {
    #[inline]
    fn accepts(&mut self) -> bool {
        true
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

    fn poll(&mut self, _cx: &mut TaskContext<'_>) -> Result<bool, TaskError> {
        Ok(false)
    }

    fn finish(&mut self, _cx: &mut TaskContext<'_>) -> Result<bool, TaskError> {
        if !self.finished {
            self.finished = true;
            self.sink.finish()?;
        }
        Ok(true)
    }

    fn next_deadline(&self) -> Option<u64> {
        None
    }

    fn on_io(&mut self, _event: &DriverEvent<'_>) -> bool {
        false
    }
}

/// Where a stage's input comes from: a source, or an input gate (whose records are
/// `Codec`; a source's need not be).
pub(crate) enum StageInput<T> {
    Source(Box<dyn Source<T>>),
    Gate(Box<dyn GateInput<T>>),
}

/// An input gate of any record type, as a stage reads it.
pub(crate) trait GateInput<T> {
    fn next(&mut self, now_ns: u64) -> Result<SourceEvent<T>, TaskError>;
}

impl<T: Codec> GateInput<T> for InputGate<Record<T>> {
    #[inline]
    fn next(&mut self, now_ns: u64) -> Result<SourceEvent<T>, TaskError> {
        Ok(match self.poll_next_at(now_ns)? {
            Some(GateEvent::Record { value, .. }) => {
                SourceEvent::Record(value.value, value.timestamp)
            }
            Some(GateEvent::Watermark(w)) => SourceEvent::Watermark(w),
            Some(GateEvent::End) => SourceEvent::End,
            None => SourceEvent::Idle { until_ns: None },
        })
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
        }
    }

    fn poll_stage(&mut self, cx: &mut TaskContext<'_>) -> Result<Progress, TaskError> {
        let now = cx.now_ns;
        let mut busy = self.chain.poll(cx)?;
        if self.phase == Phase::Running {
            self.wake_at = None;
            let mut taken = 0;
            let mut records = 0;
            while taken < POLL_BATCH_MAX {
                if !self.chain.accepts() {
                    self.blocked_since.get_or_insert(now);
                    break;
                }
                let event = match &mut self.input {
                    StageInput::Source(_) if self.end_requested => SourceEvent::End,
                    StageInput::Source(source) => source.poll_next(now),
                    StageInput::Gate(gate) => gate.next(now)?,
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
        }
        if self.phase == Phase::Finishing && self.chain.finish(cx)? {
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
        self.poll_stage(cx)
            .map_err(|error| self.shared.note_failure(worker, error))
    }

    fn on_io(&mut self, event: &DriverEvent<'_>) -> bool {
        self.chain.on_io(event)
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
        match (self.chain.next_deadline(), self.wake_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

impl<T> Drop for StageTask<T> {
    fn drop(&mut self) {
        self.shared
            .merge_task(self.stage, self.records_in, self.backpressured_ns);
    }
}
