//! Tasks' mail: control through each task's inbox (cancel, end of input), and
//! availability through its doorbell, so a worker polls only the tasks that have
//! something to do.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use weir_engine::graph::{Graph, Source, SourceEvent, SubtaskInfo};
use weir_engine::park::Unparker;
use weir_engine::runtime::{
    signal, Control, Cores, Progress, Runtime, RuntimeError, Task, TaskContext, TaskError,
};

fn runtime(workers: usize) -> Runtime {
    Runtime::builder()
        .cores(Cores::Count(workers))
        .pin(false)
        .build()
        .expect("runtime")
}

/// Idle until its flag is set (by another thread, which then rings its bell); counts
/// its polls.
struct WaitForFlag {
    flag: Arc<AtomicBool>,
    polls: Arc<AtomicU64>,
}

impl Task for WaitForFlag {
    fn poll(&mut self, _cx: &mut TaskContext<'_>) -> Result<Progress, TaskError> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        Ok(if self.flag.load(Ordering::Acquire) {
            Progress::Done
        } else {
            Progress::Idle
        })
    }
}

/// Busy for `turns` polls, then done: keeps its worker turning.
struct Spinner {
    turns: u64,
}

impl Task for Spinner {
    fn poll(&mut self, _cx: &mut TaskContext<'_>) -> Result<Progress, TaskError> {
        self.turns -= 1;
        Ok(if self.turns == 0 {
            Progress::Done
        } else {
            Progress::Busy
        })
    }
}

#[test]
fn a_worker_polls_only_the_tasks_whose_bell_rang() {
    const WAITERS: usize = 40;
    let mut runtime = runtime(1);
    let polls = Arc::new(AtomicU64::new(0));
    let mut bells: Vec<(Arc<AtomicBool>, Unparker)> = Vec::new();
    for _ in 0..WAITERS {
        let id = runtime.add_task(0);
        let flag = Arc::new(AtomicBool::new(false));
        bells.push((Arc::clone(&flag), runtime.task_unparker(id, signal::USER)));
        let polls = Arc::clone(&polls);
        runtime.set_task(
            id,
            Box::new(move |_| -> Result<Box<dyn Task>, TaskError> {
                Ok(Box::new(WaitForFlag { flag, polls }))
            }),
        );
    }
    // A busy neighbour: thousands of turns during which the waiters have nothing to do.
    runtime.spawn(
        0,
        Box::new(|_| -> Result<Box<dyn Task>, TaskError> {
            Ok(Box::new(Spinner { turns: 20_000 }))
        }),
    );
    let running = runtime.start().expect("starts");
    std::thread::sleep(Duration::from_millis(20));
    for (flag, unparker) in &bells {
        flag.store(true, Ordering::Release);
        unparker.unpark();
    }
    let report = running.join().expect("runs");
    let polls = polls.load(Ordering::Relaxed);
    // Each waiter: its first poll, the one its bell asked for, and a few more if the
    // idle safety net swept; never one per turn of the busy neighbour.
    assert!(
        polls <= (WAITERS * 4) as u64,
        "{polls} polls of {WAITERS} waiting tasks over {} turns",
        report.turns[0]
    );
    assert!(report.turns[0] >= 20_000);
}

/// Never ends by itself, emitting a record whenever polled.
struct Endless {
    next: u64,
}

impl Source<u64> for Endless {
    fn poll_next(&mut self, _now_ns: u64) -> SourceEvent<u64> {
        self.next += 1;
        if self.next % 64 == 0 {
            // Let the rest of the job run between bursts.
            return SourceEvent::Idle {
                until_ns: Some(_now_ns + 10_000),
            };
        }
        SourceEvent::Record(self.next, None)
    }
}

#[test]
fn end_of_input_stops_an_unbounded_source_and_drains_what_it_read() {
    let graph = Graph::new();
    let generated = graph.live();
    let counted = graph
        .from_source(|_: &SubtaskInfo| Endless { next: 0 })
        .parallelism(2)
        .map(|x| x * 2)
        .rebalance()
        .parallelism(2)
        .count();
    let job = graph.start(runtime(2)).expect("starts");
    let controller = job.controller();
    while generated.generated.load(Ordering::Relaxed) < 10_000 {
        std::thread::sleep(Duration::from_millis(1));
    }
    controller.end_input();
    let (result, failure) = job.join();
    assert!(failure.is_none(), "{failure:?}");
    let read = generated.generated.load(Ordering::Relaxed);
    assert!(read >= 10_000);
    assert_eq!(
        counted.records(),
        read,
        "every record read reached the sink once"
    );
    assert_eq!(result.stages[0].records_in, read);
}

#[test]
fn cancel_stops_every_task_and_says_so() {
    let graph = Graph::new();
    let generated = graph.live();
    let _counted = graph
        .from_source(|_: &SubtaskInfo| Endless { next: 0 })
        .parallelism(2)
        .key_by(|x: &u64| *x)
        .parallelism(2)
        .count();
    let job = graph.start(runtime(2)).expect("starts");
    while generated.generated.load(Ordering::Relaxed) < 1_000 {
        std::thread::sleep(Duration::from_millis(1));
    }
    job.controller().cancel();
    let (_result, failure) = job.join();
    match failure {
        Some(RuntimeError::Cancelled { tasks }) => assert!((1..=4).contains(&tasks)),
        other => panic!("expected Cancelled, got {other:?}"),
    }
}

/// Records its control mail; done after `EndOfInput`.
struct Listener {
    heard: Arc<std::sync::Mutex<Vec<Control>>>,
    ended: bool,
}

impl Task for Listener {
    fn poll(&mut self, _cx: &mut TaskContext<'_>) -> Result<Progress, TaskError> {
        Ok(if self.ended {
            Progress::Done
        } else {
            Progress::Idle
        })
    }

    fn on_control(&mut self, control: Control, _cx: &mut TaskContext<'_>) -> Result<(), TaskError> {
        self.heard.lock().unwrap().push(control);
        self.ended |= control == Control::EndOfInput;
        Ok(())
    }
}

#[test]
fn wired_mail_arrives_through_its_ring_in_order() {
    let mut runtime = runtime(2);
    let heard = Arc::new(std::sync::Mutex::new(Vec::new()));
    let id = runtime.add_task(1);
    let mut sender = runtime.connect_mail(id, 4);
    {
        let heard = Arc::clone(&heard);
        runtime.set_task(
            id,
            Box::new(move |_| -> Result<Box<dyn Task>, TaskError> {
                Ok(Box::new(Listener {
                    heard,
                    ended: false,
                }))
            }),
        );
    }
    let running = runtime.start().expect("starts");
    let sending = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(5));
        sender
            .try_send(Control::EndOfInput)
            .expect("room in the ring");
    });
    running.join().expect("the listener ends on its mail");
    sending.join().unwrap();
    assert_eq!(*heard.lock().unwrap(), vec![Control::EndOfInput]);
}

#[test]
fn a_task_added_without_a_factory_is_refused() {
    let mut runtime = runtime(1);
    runtime.add_task(0);
    match runtime.start() {
        Err(RuntimeError::Unset {
            worker: 0,
            index: 0,
        }) => {}
        other => panic!("expected Unset, got {other:?}"),
    }
}

/// Leaves every `hold`-th value's call unanswered (so it times out; the timeout answers
/// it with the same result), fails the first call of every `fail`-th value (retried
/// after a delay), and answers the rest at once with `value + add`.
struct Forgetful {
    hold: u64,
    fail: u64,
    add: u64,
    failed: std::collections::HashSet<u64>,
    held: Vec<weir_engine::async_io::ResultFuture<u64>>,
}

impl weir_engine::async_io::AsyncFunction for Forgetful {
    type In = u64;
    type Out = u64;
    fn invoke(&mut self, input: &u64, result: weir_engine::async_io::ResultFuture<u64>) {
        if input % self.hold == 0 {
            self.held.push(result);
        } else if input % self.fail == 0 && self.failed.insert(*input) {
            result.complete_err(weir_engine::async_io::AsyncError::Call(
                "refused once".into(),
            ));
        } else {
            result.complete(vec![input + self.add]);
        }
    }

    fn timeout(&mut self, input: &u64, result: weir_engine::async_io::ResultFuture<u64>) {
        result.complete(vec![input + self.add]);
    }
}

#[test]
fn operators_on_one_worker_share_its_timer_wheel() {
    use weir_engine::async_io::{AsyncConfig, OutputMode, RetryStrategy};
    for mode in [OutputMode::Ordered, OutputMode::Unordered] {
        let config = |capacity| {
            AsyncConfig::new(mode, capacity)
                .with_timeout(Duration::from_millis(3))
                .with_retry(
                    RetryStrategy::fixed_delay(3, Duration::from_millis(1)).retry_on_any_error(),
                )
        };
        let forgetful = |hold, fail, add| {
            move |_: &SubtaskInfo| Forgetful {
                hold,
                fail,
                add,
                failed: Default::default(),
                held: Vec::new(),
            }
        };
        let graph = Graph::new().with_parallelism(1);
        let out = graph
            .from_iter(|_: &SubtaskInfo| 0..300u64)
            .async_wait(forgetful(7, 3, 1000), config(16))
            .async_wait(forgetful(5, 4, 1_000_000), config(8))
            .collect();
        let (result, failure) = graph.execute_to_end(runtime(1)).expect("starts");
        assert!(failure.is_none(), "{failure:?}");
        let mut got: Vec<u64> = out
            .by_subtask()
            .concat()
            .iter()
            .filter_map(|e| e.as_record().map(|r| r.value))
            .collect();
        if mode == OutputMode::Unordered {
            got.sort_unstable();
        }
        let want: Vec<u64> = (0..300).map(|v| v + 1000 + 1_000_000).collect();
        assert_eq!(got, want, "{mode:?}: each record once, transformed by both");
        let first = result.stages[0]
            .async_metrics
            .as_ref()
            .expect("async metrics");
        // Both operators run in the source's chain: one stage, metrics merged.
        let held =
            (0..300).filter(|v| v % 7 == 0).count() + (1000..1300).filter(|v| v % 5 == 0).count();
        let failed = (0..300).filter(|v| v % 7 != 0 && v % 3 == 0).count()
            + (1000..1300).filter(|v| v % 5 != 0 && v % 4 == 0).count();
        assert_eq!(first.timed_out, held as u64, "{mode:?}");
        assert_eq!(first.retried, failed as u64, "{mode:?}");
    }
}

/// Has work on its second poll but announces it to nobody (no doorbell, no deadline):
/// a lost wake-up, by construction.
struct SilentWork {
    polls: u32,
}

impl Task for SilentWork {
    fn poll(&mut self, _cx: &mut TaskContext<'_>) -> Result<Progress, TaskError> {
        self.polls += 1;
        Ok(if self.polls == 1 {
            Progress::Idle
        } else {
            Progress::Done
        })
    }
}

/// The check the graph and back-pressure tests make can fail: a task whose work was
/// never announced is found only by the idle safety net's sweep, and that sweep counts
/// as rescued; a task that announces its work through its doorbell is not.
#[test]
fn a_task_found_only_by_the_safety_net_counts_as_rescued() {
    let mut silent = runtime(1);
    silent.spawn(
        0,
        Box::new(|_| Ok(Box::new(SilentWork { polls: 0 }) as Box<dyn Task>)),
    );
    let report = silent.run().expect("runs");
    assert_eq!(report.wakeups[0].rescued, 1, "{:?}", report.wakeups[0]);
    assert!(report.wakeups[0].idle >= 1);

    let mut announced = runtime(1);
    let flag = Arc::new(AtomicBool::new(false));
    let polls = Arc::new(AtomicU64::new(0));
    let id = announced.add_task(0);
    let bell: Unparker = announced.task_unparker(id, signal::INPUT);
    let (f, p) = (Arc::clone(&flag), Arc::clone(&polls));
    announced.set_task(
        id,
        Box::new(move |_| Ok(Box::new(WaitForFlag { flag: f, polls: p }) as Box<dyn Task>)),
    );
    let ringer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        flag.store(true, Ordering::Release);
        bell.unpark();
    });
    let report = announced.run().expect("runs");
    ringer.join().expect("ringer");
    assert_eq!(report.wakeups[0].rescued, 0, "{:?}", report.wakeups[0]);
}

/// Idle until the safety net sweeps it; during that poll its work arrives from another
/// thread, which publishes it and then rings the task's bell, as a producer whose
/// buffer timeout came due together with the sweep does.
struct AnnouncedDuringSweep {
    polls: u32,
    bell: Unparker,
}

impl Task for AnnouncedDuringSweep {
    fn poll(&mut self, _cx: &mut TaskContext<'_>) -> Result<Progress, TaskError> {
        self.polls += 1;
        if self.polls == 1 {
            return Ok(Progress::Idle);
        }
        let bell = self.bell.clone();
        std::thread::spawn(move || bell.unpark())
            .join()
            .expect("ringer");
        Ok(Progress::Done)
    }
}

/// Work whose announcement crosses the sweep is a wake-up on its way, not a lost one:
/// the sweep found it, but its bell rang before the poll returned, so it is not
/// counted as rescued (a producer's 100 ms buffer timeout and the 100 ms safety net
/// often come due together).
#[test]
fn work_announced_while_the_safety_net_sweeps_is_not_rescued() {
    let mut rt = runtime(1);
    let id = rt.add_task(0);
    let bell = rt.task_unparker(id, signal::INPUT);
    rt.set_task(
        id,
        Box::new(move |_| Ok(Box::new(AnnouncedDuringSweep { polls: 0, bell }) as Box<dyn Task>)),
    );
    let report = rt.run().expect("runs");
    let wakeups = report.wakeups[0];
    assert!(wakeups.idle >= 1, "the sweep polled it: {wakeups:?}");
    assert_eq!(wakeups.rescued, 0, "{wakeups:?}");
}
