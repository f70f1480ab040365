//! A worker's timer slack: arrivals within the slack after a wake-up are taken in one
//! turn, not one wake-up each; deadlines are kept however long the slack; no arrival
//! is lost to the sleep (the idle safety net rescues nothing).
//!
//! No timing assertions: the slack in the first test is so much longer than the
//! arrivals' spread that a machine slow enough to break it would also fail the hang
//! guards.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod support;

use support::WaitUntil;
use weir_engine::park::Unparker;
use weir_engine::runtime::{
    signal, Cores, Progress, RunReport, Runtime, Task, TaskContext, TaskError,
};

/// Takes what the ringer made available; done once it took `total`.
struct Arrivals {
    /// Set at the first poll, which the ringer waits for: every arrival then comes
    /// after the task's first look, so the first one wakes the worker.
    polled: Arc<AtomicBool>,
    available: Arc<AtomicU64>,
    taken: u64,
    total: u64,
    /// Polls that found arrivals.
    takes: Arc<AtomicU64>,
}

impl Task for Arrivals {
    fn poll(&mut self, _cx: &mut TaskContext<'_>) -> Result<Progress, TaskError> {
        self.polled.store(true, Ordering::Release);
        let available = self.available.load(Ordering::Acquire);
        if available > self.taken {
            self.taken = available;
            self.takes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(if self.taken == self.total {
            Progress::Done
        } else {
            Progress::Idle
        })
    }
}

/// One task fed `total` arrivals `gap` apart from another thread (after `delay`),
/// each published and then announced through the task's bell, on a worker with
/// `slack`. Returns the run's report and the polls that found arrivals.
fn fed(slack: Duration, total: u64, delay: Duration, gap: Duration) -> (RunReport, u64) {
    let mut runtime = Runtime::builder()
        .cores(Cores::Count(1))
        .pin(false)
        .timer_slack(slack)
        .build()
        .expect("runtime");
    let available = Arc::new(AtomicU64::new(0));
    let takes = Arc::new(AtomicU64::new(0));
    let polled = Arc::new(AtomicBool::new(false));
    let id = runtime.add_task(0);
    let bell: Unparker = runtime.task_unparker(id, signal::INPUT);
    let (a, t, p) = (
        Arc::clone(&available),
        Arc::clone(&takes),
        Arc::clone(&polled),
    );
    runtime.set_task(
        id,
        Box::new(move |_| {
            Ok(Box::new(Arrivals {
                polled: p,
                available: a,
                taken: 0,
                total,
                takes: t,
            }) as Box<dyn Task>)
        }),
    );
    let ringer = std::thread::spawn(move || {
        while !polled.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(delay);
        for _ in 0..total {
            available.fetch_add(1, Ordering::Release);
            bell.unpark();
            std::thread::sleep(gap);
        }
    });
    let report = runtime.run().expect("runs");
    ringer.join().expect("ringer");
    for wakeups in &report.wakeups {
        assert_eq!(wakeups.rescued, 0, "a lost wake-up: {wakeups:?}");
    }
    (report, takes.load(Ordering::Relaxed))
}

/// With a slack far longer than the arrivals' spread, the first arrival wakes the
/// worker and every later one waits for the one turn after the slack: two takes for
/// ten arrivals, one slack sleep.
#[test]
fn arrivals_within_the_slack_are_taken_in_one_turn() {
    let (report, takes) = fed(
        Duration::from_secs(2),
        10,
        Duration::from_millis(20),
        Duration::from_millis(1),
    );
    assert_eq!(takes, 2, "{:?}", report.wakeups[0]);
    assert_eq!(report.wakeups[0].slack, 1, "{:?}", report.wakeups[0]);
}

/// Without slack the worker never sleeps it out; every arrival is still taken.
#[test]
fn without_slack_the_worker_never_sleeps_it_out() {
    let (report, takes) = fed(
        Duration::ZERO,
        10,
        Duration::from_millis(5),
        Duration::from_millis(1),
    );
    assert!(takes >= 1);
    assert_eq!(report.wakeups[0].slack, 0, "{:?}", report.wakeups[0]);
}

/// A deadline that comes due within the slack after a wake-up runs at the turn after
/// the slack (late by at most the slack, as a Linux thread's timers are), and one due
/// later wakes the worker as usual: both tasks end, with no lost wake-up.
#[test]
fn deadlines_within_the_slack_wait_for_it_and_later_ones_wake_the_worker() {
    for wait_ms in [5, 300] {
        let mut runtime = Runtime::builder()
            .cores(Cores::Count(1))
            .pin(false)
            .timer_slack(Duration::from_millis(50))
            .build()
            .expect("runtime");
        let id = runtime.add_task(0);
        let bell: Unparker = runtime.task_unparker(id, signal::INPUT);
        runtime.set_task(
            id,
            Box::new(move |_| {
                Ok(Box::new(WaitUntil::new(Duration::from_millis(20 + wait_ms))) as Box<dyn Task>)
            }),
        );
        // A wake-up by work a little after the start, so that the slack applies.
        let ringer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            bell.unpark();
        });
        let started = Instant::now();
        let report = runtime.run().expect("runs");
        ringer.join().expect("ringer");
        let wakeups = report.wakeups[0];
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "hang guard: {wakeups:?}"
        );
        assert_eq!(wakeups.rescued, 0, "{wakeups:?}");
        assert!(
            wakeups.slack <= 1,
            "at most one slack after the wake-up: {wakeups:?}"
        );
    }
}
