//! A worker's spin before parking: with none it parks at once when idle; with a spin
//! longer than its idle spell it keeps polling and never parks; a shorter spin polls,
//! then parks. A worker waits with no timer slack.

use std::time::Duration;

mod support;

use support::WaitUntil;
use weir_engine::runtime::{Cores, Progress, Runtime, Task, TaskContext, TaskError};

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
            Ok(Box::new(WaitUntil::new(Duration::from_millis(20))))
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

/// Reads the worker thread's timer slack when polled.
struct ReadSlack(std::sync::Arc<std::sync::Mutex<Option<String>>>);

impl Task for ReadSlack {
    fn poll(&mut self, _cx: &mut TaskContext<'_>) -> Result<Progress, TaskError> {
        *self.0.lock().unwrap() = std::fs::read_to_string("/proc/thread-self/timerslack_ns").ok();
        Ok(Progress::Done)
    }
}

/// A worker's timed waits end at their deadline: its timer slack is 1 ns, not Linux's
/// default 50 µs (which made every timer-driven record up to 50 µs late).
#[cfg(target_os = "linux")]
#[test]
fn workers_wait_with_no_timer_slack() {
    let slack = std::sync::Arc::new(std::sync::Mutex::new(None));
    let mut runtime = Runtime::builder()
        .cores(Cores::Count(1))
        .pin(false)
        .build()
        .expect("runtime");
    let seen = std::sync::Arc::clone(&slack);
    runtime.spawn(
        0,
        Box::new(move |_driver| -> Result<Box<dyn Task>, TaskError> {
            Ok(Box::new(ReadSlack(seen)))
        }),
    );
    runtime.run().expect("run");
    let slack = slack.lock().unwrap().clone();
    match slack {
        Some(text) => assert_eq!(text.trim(), "1", "the worker's timer slack in ns"),
        // Kernels before 4.6 have no such file: nothing to check there.
        None => eprintln!("no /proc/thread-self/timerslack_ns here; not checked"),
    }
}
