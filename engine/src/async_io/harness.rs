//! A test harness around the real operator: a manual processing-time clock starting at
//! 0, an inline mailbox, and the output collected in a vector (Flink's
//! `OneInputStreamOperatorTestHarness`).
//!
//! Waiting: when the operator is full (or at end of input) the harness waits as a task
//! would. Completions from other threads wake it through its parker. If no completion
//! arrives within [`WAIT_GRACE`] of real time while a timer is armed, the manual clock
//! moves on to that timer's deadline: in a harness, the only way time passes while the
//! task waits is the harness letting it. If no call is outstanding and no timer is
//! armed, nothing can ever complete and the call fails with
//! [`OperatorError::Stalled`].

use std::time::{Duration, Instant};

use super::{AsyncConfig, AsyncFunction, AsyncWaitOperator, OperatorError};
use crate::element::StreamElement;
use crate::error::ConfigError;
use crate::park::Parker;

/// Real time the harness waits for another thread's completion before letting manual
/// time run to the next armed timer.
pub const WAIT_GRACE: Duration = Duration::from_millis(200);
/// Real time without any completion after which a wait with outstanding calls and no
/// armed timer is declared stalled.
const STALL_AFTER: Duration = Duration::from_secs(30);

/// The real operator with a manual clock and an inline mailbox, for tests.
pub struct AsyncHarness<F: AsyncFunction> {
    operator: AsyncWaitOperator<F>,
    parker: Parker,
    now_ns: u64,
    output: Vec<StreamElement<F::Out>>,
}

impl<F: AsyncFunction> AsyncHarness<F> {
    /// An operator over `function`, on the calling thread, at time 0.
    pub fn new(function: F, config: AsyncConfig<F::Out>) -> Result<Self, ConfigError> {
        let parker = Parker::current();
        let operator = AsyncWaitOperator::new(function, config, parker.unparker())?;
        Ok(AsyncHarness {
            operator,
            parker,
            now_ns: 0,
            output: Vec::new(),
        })
    }

    /// An operator restored from `snapshot`: its records and watermarks are processed
    /// again, in order, before any new input.
    pub fn restore(
        function: F,
        config: AsyncConfig<F::Out>,
        snapshot: Vec<StreamElement<F::In>>,
    ) -> Result<Self, OperatorError> {
        let mut harness = Self::new(function, config)?;
        for element in snapshot {
            match element {
                StreamElement::Record(record) => {
                    harness.process_record(record.value, record.timestamp)?
                }
                StreamElement::Watermark(watermark) => harness.process_watermark(watermark.0)?,
            }
        }
        Ok(harness)
    }

    /// Processes a record, first waiting while the operator is full.
    pub fn process_record(
        &mut self,
        value: F::In,
        timestamp: Option<i64>,
    ) -> Result<(), OperatorError> {
        self.wait_for_room()?;
        self.operator
            .process_record(value, timestamp, self.now_ns, &mut self.output)?;
        self.run_mailbox()
    }

    /// Processes a watermark, first waiting while the operator is full.
    pub fn process_watermark(&mut self, timestamp: i64) -> Result<(), OperatorError> {
        self.wait_for_room()?;
        self.operator
            .process_watermark(timestamp, self.now_ns, &mut self.output)?;
        self.run_mailbox()
    }

    /// Moves the clock forward by `by`, firing every timer due at or before the new time
    /// in time order (each at its own deadline).
    pub fn advance_time(&mut self, by: Duration) -> Result<(), OperatorError> {
        let target = self
            .now_ns
            .saturating_add(by.as_nanos().min(u128::from(u64::MAX)) as u64);
        self.advance_to(target)
    }

    fn advance_to(&mut self, target_ns: u64) -> Result<(), OperatorError> {
        self.run_mailbox()?;
        while let Some(deadline) = self.operator.next_due_timer(target_ns) {
            // The clock reads the timer's deadline while it fires (also if it fails).
            self.now_ns = self.now_ns.max(deadline);
            self.operator.fire_due_timer(deadline, &mut self.output)?;
            self.run_mailbox()?;
        }
        self.now_ns = self.now_ns.max(target_ns);
        self.run_mailbox()
    }

    /// Processes every completion present (the inline mailbox).
    pub fn run_mailbox(&mut self) -> Result<(), OperatorError> {
        self.operator.drain(self.now_ns, &mut self.output)?;
        Ok(())
    }

    /// End of input: attempts waiting retries at once, waits until everything in flight
    /// is completed and emitted, then closes the function.
    pub fn finish(&mut self) -> Result<(), OperatorError> {
        self.operator.begin_finish(self.now_ns, &mut self.output)?;
        loop {
            self.run_mailbox()?;
            if self.operator.in_flight() == 0 {
                break;
            }
            self.wait_once()?;
        }
        self.operator.close();
        Ok(())
    }

    /// Takes what was emitted so far.
    pub fn take_output(&mut self) -> Vec<StreamElement<F::Out>> {
        std::mem::take(&mut self.output)
    }

    /// Records and watermarks held, not yet emitted.
    pub fn in_flight(&self) -> usize {
        self.operator.in_flight()
    }

    /// Timeout and retry timers armed.
    pub fn pending_timers(&self) -> usize {
        self.operator.pending_timers()
    }

    /// The held records and watermarks in input order.
    pub fn snapshot(&self) -> Vec<StreamElement<F::In>>
    where
        F::In: Clone,
    {
        self.operator.snapshot()
    }

    /// The manual clock, in nanoseconds since the harness started.
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// The operator (metrics, function).
    pub fn operator(&self) -> &AsyncWaitOperator<F> {
        &self.operator
    }

    fn wait_for_room(&mut self) -> Result<(), OperatorError> {
        self.operator.check()?;
        let started = Instant::now();
        loop {
            self.run_mailbox()?;
            if !self.operator.is_full() {
                break;
            }
            self.wait_once()?;
        }
        self.operator
            .add_backpressured_ns(started.elapsed().as_nanos() as u64);
        Ok(())
    }

    /// Waits for one thing that can make progress: a completion from another thread, or
    /// (after the grace period) the next armed timer.
    fn wait_once(&mut self) -> Result<(), OperatorError> {
        let started = Instant::now();
        loop {
            if self.operator.has_completions() {
                return Ok(());
            }
            let outstanding = self.operator.outstanding_calls() > 0;
            let next_timer = self.operator.next_timer_deadline();
            let waited = started.elapsed();
            match next_timer {
                Some(deadline) if !outstanding || waited >= WAIT_GRACE => {
                    return self.advance_to(deadline.max(self.now_ns));
                }
                None if !outstanding => {
                    return Err(OperatorError::Stalled {
                        in_flight: self.operator.in_flight(),
                    });
                }
                None if waited >= STALL_AFTER => {
                    return Err(OperatorError::Stalled {
                        in_flight: self.operator.in_flight(),
                    });
                }
                _ => {}
            }
            let operator = &self.operator;
            self.parker.park(Some(Duration::from_millis(10)), || {
                operator.has_completions()
            });
        }
    }
}

impl<F: AsyncFunction> core::fmt::Debug for AsyncHarness<F> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("AsyncHarness")
            .field("now_ns", &self.now_ns)
            .field("operator", &self.operator)
            .field("output", &self.output.len())
            .finish()
    }
}
