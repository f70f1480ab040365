//! Tasks shared by the runtime tests.

use std::time::Duration;

use weir_engine::runtime::{Progress, Task, TaskContext, TaskError};

/// Idle until its deadline, `wait` after its first poll; then done.
pub struct WaitUntil {
    pub at_ns: Option<u64>,
    pub wait: Duration,
}

impl WaitUntil {
    /// Done `wait` after its first poll.
    pub fn new(wait: Duration) -> Self {
        WaitUntil { at_ns: None, wait }
    }
}

impl Task for WaitUntil {
    fn poll(&mut self, cx: &mut TaskContext<'_>) -> Result<Progress, TaskError> {
        let at = *self
            .at_ns
            .get_or_insert(cx.now_ns + self.wait.as_nanos() as u64);
        Ok(if cx.now_ns >= at {
            Progress::Done
        } else {
            Progress::Idle
        })
    }

    fn next_deadline(&self) -> Option<u64> {
        self.at_ns
    }
}
