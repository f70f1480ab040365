//! A worker's spin before parking: with none it parks at once when idle; with a spin
//! longer than its idle spell it keeps polling and never parks; a shorter spin polls,
//! then parks.

use std::time::Duration;

use weir_engine::runtime::{Cores, Progress, Runtime, Task, TaskContext, TaskError};

/// Idle until `at_ns` (its deadline), then done.
struct WaitUntil {
    at_ns: Option<u64>,
    wait: Duration,
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

/// Parks of a run whose one task waits 20 ms, with `spin`.
fn parks(spin: Duration) -> u64 {
    let mut runtime = Runtime::builder()
        .cores(Cores::Count(1))
        .pin(false)
        .spin(spin)
        .build()
        .expect("runtime");
    runtime.spawn(
        0,
        Box::new(|_driver| -> Result<Box<dyn Task>, TaskError> {
            Ok(Box::new(WaitUntil {
                at_ns: None,
                wait: Duration::from_millis(20),
            }))
        }),
    );
    let report = runtime.run().expect("run");
    report.parks[0]
}

#[test]
fn a_spinning_worker_polls_instead_of_parking() {
    assert!(parks(Duration::ZERO) >= 1, "no spin: the idle worker parks");
    assert_eq!(
        parks(Duration::from_secs(5)),
        0,
        "spinning past the wait: no park"
    );
    assert!(
        parks(Duration::from_millis(2)) >= 1,
        "a spin shorter than the wait ends in a park"
    );
}
