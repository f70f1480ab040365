//! The thread-per-core runtime: one worker thread per chosen core, tasks placed on
//! workers for good, and each worker's loop.
//!
//! A worker's loop, one turn:
//! 1. poll every live task (its default action: take input, drain its mailboxes, fire
//!    its timers) with the turn's clock reading;
//! 2. let the driver submit queued I/O and reap completions without blocking, handing
//!    each event to the task that owns the connection;
//! 3. if no task made progress, park in the driver until the earliest task deadline,
//!    I/O, or a wake-up from another thread (channels, pools and foreign completions
//!    notify the worker's [`Unparker`]); the [`Parker`](crate::park::Parker) protocol
//!    makes the check-then-park race-free. Each wake-up is counted by its cause
//!    ([`Wakeups`]), so a test or a report can show what woke a worker.
//!
//! Drivers and parkers are made before the threads start, so wiring (channels, pools)
//! can name every worker's [`Unparker`]; tasks are built on their worker's thread by a
//! factory, so they may hold `!Send` state (an `Rc`, the operator).

pub mod driver;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use driver::{ConnId, Driver, DriverEvent, NoIo};

use crate::error::ConfigError;
use crate::park::{UnboundParker, Unparker, Wakeup};

/// Builds a worker's driver (called once per worker, before the threads start).
pub type DriverFactory = Arc<dyn Fn() -> std::io::Result<Box<dyn Driver>> + Send + Sync>;

/// A task's error: ends the run.
pub type TaskError = Box<dyn std::error::Error + Send + Sync>;

/// Builds a task on its worker's thread.
pub type TaskFactory = Box<dyn FnOnce(&mut dyn Driver) -> Result<Box<dyn Task>, TaskError> + Send>;

/// What a task's poll did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// It did work; poll again soon.
    Busy,
    /// Nothing to do until input, I/O, a notification or its deadline.
    Idle,
    /// Finished for good.
    Done,
}

/// What a task sees of its worker during a poll.
pub struct TaskContext<'a> {
    /// The worker's clock: nanoseconds since the run started (shared by all workers).
    pub now_ns: u64,
    /// The worker's driver.
    pub driver: &'a mut dyn Driver,
    /// The worker's index.
    pub worker: usize,
}

/// A unit of work placed on one worker.
pub trait Task {
    /// Runs the task's default action for a bounded while.
    fn poll(&mut self, cx: &mut TaskContext<'_>) -> Result<Progress, TaskError>;
    /// Takes a driver event if it concerns one of the task's connections.
    fn on_io(&mut self, event: &DriverEvent<'_>) -> bool {
        let _ = event;
        false
    }
    /// When the task next needs polling even without input (a timer), by the clock.
    fn next_deadline(&self) -> Option<u64> {
        None
    }
}

/// Which cores the workers run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cores {
    /// This many workers on the first cores.
    Count(usize),
    /// One worker per listed core id.
    List(Vec<usize>),
}

/// Configures a [`Runtime`].
pub struct RuntimeBuilder {
    cores: Cores,
    pin: bool,
    spin: Duration,
    driver: DriverFactory,
}

impl RuntimeBuilder {
    /// Workers on these cores.
    pub fn cores(mut self, cores: Cores) -> Self {
        self.cores = cores;
        self
    }

    /// Whether to pin each worker to its core (refused pinning is a warning).
    pub fn pin(mut self, pin: bool) -> Self {
        self.pin = pin;
        self
    }

    /// How long a worker with nothing to do keeps polling its tasks and its driver
    /// before it parks (0, the default: it parks at once). A worker that owns its core
    /// trades that core's idle time for latency: a reply that arrives within the spin
    /// is taken without the wake-up of a parked thread (tens of µs on a VM).
    pub fn spin(mut self, spin: Duration) -> Self {
        self.spin = spin;
        self
    }

    /// How each worker's driver is made.
    pub fn driver(mut self, driver: DriverFactory) -> Self {
        self.driver = driver;
        self
    }

    /// Makes the drivers and parkers (no threads yet).
    pub fn build(self) -> Result<Runtime, RuntimeError> {
        let available = core_affinity::get_core_ids().unwrap_or_default();
        let placements: Vec<Option<usize>> = match &self.cores {
            Cores::Count(0) => {
                return Err(ConfigError::ZeroCapacity {
                    what: "worker count",
                }
                .into())
            }
            Cores::Count(n) => (0..*n)
                .map(|i| available.get(i % available.len().max(1)).map(|c| c.id))
                .collect(),
            Cores::List(list) if list.is_empty() => {
                return Err(ConfigError::ZeroCapacity { what: "core list" }.into())
            }
            Cores::List(list) => list.iter().map(|&id| Some(id)).collect(),
        };
        let mut workers = Vec::with_capacity(placements.len());
        for core in placements {
            let driver = (self.driver)().map_err(RuntimeError::Driver)?;
            let parker = UnboundParker::new(driver.wake_handle());
            workers.push(WorkerSlot {
                core,
                driver,
                parker,
                tasks: Vec::new(),
            });
        }
        Ok(Runtime {
            workers,
            pin: self.pin,
            spin: self.spin,
        })
    }
}

struct WorkerSlot {
    core: Option<usize>,
    driver: Box<dyn Driver>,
    parker: UnboundParker,
    tasks: Vec<TaskFactory>,
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// Invalid settings.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A driver could not be made.
    #[error("cannot create a worker's I/O driver: {0}")]
    Driver(#[source] std::io::Error),
    /// Setting the run up failed (e.g. an external system's settings were refused).
    #[error("cannot set up the run: {0}")]
    Setup(#[source] TaskError),
    /// A task failed; the run was stopped.
    #[error("task on worker {worker} failed: {error}")]
    Task {
        /// The worker.
        worker: usize,
        /// The task's error.
        error: TaskError,
    },
    /// A worker thread panicked.
    #[error("worker {worker} panicked: {message}")]
    Panic {
        /// The worker.
        worker: usize,
        /// The panic message.
        message: String,
    },
}

/// Why a parked worker woke, counted per worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wakeups {
    /// An [`Unparker`] was called: a channel got a buffer, a pool got a buffer back
    /// for a waiting writer, a call completed on another thread, the run was stopped.
    pub notified: u64,
    /// The driver reported I/O.
    pub io: u64,
    /// A task's deadline came (a timer, a buffer timeout, an open-loop source's next
    /// record).
    pub deadline: u64,
    /// The idle safety net: nothing woke the worker within the longest park.
    pub idle: u64,
}

impl Wakeups {
    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &Wakeups) {
        self.notified += other.notified;
        self.io += other.io;
        self.deadline += other.deadline;
        self.idle += other.idle;
    }
}

/// What a run did, per worker.
#[derive(Debug, Clone, Default)]
pub struct RunReport {
    /// The driver each worker used.
    pub drivers: Vec<&'static str>,
    /// Whether each worker was pinned to its core.
    pub pinned: Vec<bool>,
    /// Loop turns per worker.
    pub turns: Vec<u64>,
    /// Times each worker parked.
    pub parks: Vec<u64>,
    /// Why each worker woke from its parks.
    pub wakeups: Vec<Wakeups>,
}

/// Workers with their drivers, ready to run tasks.
pub struct Runtime {
    workers: Vec<WorkerSlot>,
    pin: bool,
    spin: Duration,
}

impl Runtime {
    /// A builder: one worker per available core, pinned, no I/O driver.
    pub fn builder() -> RuntimeBuilder {
        let count = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        RuntimeBuilder {
            cores: Cores::Count(count),
            pin: true,
            spin: Duration::ZERO,
            driver: Arc::new(|| Ok(Box::new(NoIo::new()))),
        }
    }

    /// Workers.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// The handle that wakes worker `worker` (for wiring channels and pools).
    pub fn unparker(&self, worker: usize) -> Unparker {
        self.workers[worker].parker.unparker()
    }

    /// The driver name of worker `worker`.
    pub fn driver_name(&self, worker: usize) -> &'static str {
        self.workers[worker].driver.name()
    }

    /// Places a task on `worker` (modulo the worker count).
    pub fn spawn(&mut self, worker: usize, task: TaskFactory) {
        let count = self.workers.len();
        self.workers[worker % count].tasks.push(task);
    }

    /// Runs every placed task to completion on its worker; the first failure stops all.
    pub fn run(self) -> Result<RunReport, RuntimeError> {
        let epoch = Instant::now();
        let abort = Arc::new(AtomicBool::new(false));
        let failure: Arc<Mutex<Option<RuntimeError>>> = Arc::new(Mutex::new(None));
        let unparkers: Vec<Unparker> = self.workers.iter().map(|w| w.parker.unparker()).collect();
        let mut handles = Vec::new();
        for (index, slot) in self.workers.into_iter().enumerate() {
            let abort = Arc::clone(&abort);
            let failure = Arc::clone(&failure);
            let unparkers = unparkers.clone();
            let options = WorkerOptions {
                pin: self.pin,
                spin: self.spin,
            };
            let handle = std::thread::Builder::new()
                .name(format!("weir-worker-{index}"))
                .spawn(move || {
                    let mut stats = WorkerStats {
                        driver: slot.driver.name(),
                        pinned: false,
                        turns: 0,
                        parks: 0,
                        wakeups: Wakeups::default(),
                    };
                    // The tasks outlive the loop until a failure is recorded: dropping
                    // them first would disconnect their channels, and another worker's
                    // "producer gone" could then be taken for the cause.
                    let mut tasks = Vec::new();
                    let result =
                        worker_main(index, slot, options, epoch, &abort, &mut stats, &mut tasks);
                    match result {
                        Ok(()) => {}
                        Err(error) => {
                            let mut first = failure.lock().unwrap_or_else(|e| e.into_inner());
                            if first.is_none() {
                                *first = Some(error);
                            }
                            abort.store(true, Ordering::Release);
                            for unparker in &unparkers {
                                unparker.unpark();
                            }
                        }
                    }
                    drop(tasks);
                    stats
                })
                .map_err(RuntimeError::Driver)?;
            handles.push(handle);
        }
        let mut report = RunReport::default();
        for (worker, handle) in handles.into_iter().enumerate() {
            match handle.join() {
                Ok(stats) => {
                    report.drivers.push(stats.driver);
                    report.pinned.push(stats.pinned);
                    report.turns.push(stats.turns);
                    report.parks.push(stats.parks);
                    report.wakeups.push(stats.wakeups);
                }
                Err(panic) => {
                    let message = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "unknown panic".into());
                    let mut first = failure.lock().unwrap_or_else(|e| e.into_inner());
                    if first.is_none() {
                        *first = Some(RuntimeError::Panic { worker, message });
                    }
                }
            }
        }
        let failure = failure.lock().unwrap_or_else(|e| e.into_inner()).take();
        match failure {
            Some(error) => Err(error),
            None => Ok(report),
        }
    }
}

struct WorkerStats {
    driver: &'static str,
    pinned: bool,
    turns: u64,
    parks: u64,
    wakeups: Wakeups,
}

/// Longest an idle worker parks without a task deadline: a safety net, since every
/// source of work wakes the worker explicitly.
const IDLE_PARK_MAX: Duration = Duration::from_millis(100);

/// One driver turn, handing each event to the task that owns its connection; returns
/// how many events there were.
fn turn(
    driver: &mut dyn Driver,
    tasks: &mut [Option<Box<dyn Task>>],
    timeout: Option<Duration>,
) -> std::io::Result<usize> {
    let mut events = 0;
    driver.turn(timeout, &mut |event: DriverEvent<'_>| {
        events += 1;
        for task in tasks.iter_mut().flatten() {
            if task.on_io(&event) {
                break;
            }
        }
    })?;
    Ok(events)
}

/// How a worker holds its core: pinned to it or not, and how long it polls with
/// nothing to do before it parks.
#[derive(Debug, Clone, Copy)]
struct WorkerOptions {
    pin: bool,
    spin: Duration,
}

fn worker_main(
    index: usize,
    slot: WorkerSlot,
    WorkerOptions { pin, spin }: WorkerOptions,
    epoch: Instant,
    abort: &AtomicBool,
    stats: &mut WorkerStats,
    tasks: &mut Vec<Option<Box<dyn Task>>>,
) -> Result<(), RuntimeError> {
    let WorkerSlot {
        core,
        mut driver,
        parker,
        tasks: factories,
    } = slot;
    let parker = parker.into_parker();
    if pin {
        if let Some(id) = core {
            stats.pinned = core_affinity::set_for_current(core_affinity::CoreId { id });
            if !stats.pinned {
                eprintln!("weir: could not pin worker {index} to core {id}; it runs unpinned");
            }
        }
    }
    tasks.reserve(factories.len());
    for factory in factories {
        match factory(driver.as_mut()) {
            Ok(task) => tasks.push(Some(task)),
            Err(error) => {
                return Err(RuntimeError::Task {
                    worker: index,
                    error,
                })
            }
        }
    }
    let mut live = tasks.len();
    let spin_ns = spin.as_nanos().min(u128::from(u64::MAX)) as u64;
    // When a task or the driver last did something.
    let mut progress_ns = epoch.elapsed().as_nanos() as u64;
    while live > 0 {
        if abort.load(Ordering::Acquire) {
            return Ok(());
        }
        stats.turns += 1;
        let now_ns = epoch.elapsed().as_nanos() as u64;
        let mut busy = false;
        for task in tasks.iter_mut() {
            let Some(running) = task.as_mut() else {
                continue;
            };
            let mut cx = TaskContext {
                now_ns,
                driver: driver.as_mut(),
                worker: index,
            };
            match running.poll(&mut cx) {
                Ok(Progress::Busy) => busy = true,
                Ok(Progress::Idle) => {}
                Ok(Progress::Done) => {
                    *task = None;
                    live -= 1;
                    busy = true;
                }
                Err(error) => {
                    return Err(RuntimeError::Task {
                        worker: index,
                        error,
                    })
                }
            }
        }
        let events = match turn(driver.as_mut(), tasks, Some(Duration::ZERO)) {
            Ok(events) => events,
            Err(error) => return Err(RuntimeError::Driver(error)),
        };
        // I/O events complete calls on this thread (no wake-up): poll the tasks again.
        if busy || events > 0 || live == 0 {
            progress_ns = now_ns;
            continue;
        }
        if now_ns.saturating_sub(progress_ns) < spin_ns {
            // Spinning: poll again instead of parking.
            continue;
        }
        let now_ns = epoch.elapsed().as_nanos() as u64;
        let deadline = tasks
            .iter()
            .flatten()
            .filter_map(|t| t.next_deadline())
            .min();
        let (timeout, by_deadline) = match deadline {
            Some(deadline) if deadline <= now_ns => continue,
            Some(deadline) => {
                let wait = Duration::from_nanos(deadline - now_ns);
                (wait.min(IDLE_PARK_MAX), wait <= IDLE_PARK_MAX)
            }
            None => (IDLE_PARK_MAX, false),
        };
        stats.parks += 1;
        let mut turn_error = None;
        let mut io_events = 0;
        let wakeup = parker.park_with(
            Some(timeout),
            || abort.load(Ordering::Acquire),
            |timeout| match turn(driver.as_mut(), tasks, timeout) {
                Ok(events) => io_events = events,
                Err(error) => turn_error = Some(error),
            },
        );
        if let Some(error) = turn_error {
            return Err(RuntimeError::Driver(error));
        }
        let cause = &mut stats.wakeups;
        match wakeup {
            Wakeup::Notified | Wakeup::Ready => cause.notified += 1,
            Wakeup::TimedOut if io_events > 0 => cause.io += 1,
            Wakeup::TimedOut if by_deadline => cause.deadline += 1,
            Wakeup::TimedOut => cause.idle += 1,
        }
    }
    Ok(())
}
