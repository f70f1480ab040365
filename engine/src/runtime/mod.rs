//! The thread-per-core runtime: one worker thread per chosen core, tasks placed on
//! workers for good, and each worker's loop.
//!
//! Every task has a mailbox ([`Inbox`]) and a [`Doorbell`]. Whatever concerns a task from
//! outside its own poll arrives as mail: control ([`Control`]: cancel, end of input) as
//! messages through the inbox (a foreign queue for the controlling thread, SPSC rings
//! for wired senders, see [`Runtime::connect_mail`]); availability — a buffer arrived
//! on an input channel, the pool has buffers again for a waiting writer, a call
//! completed on another thread, a future was woken — as coalescing signals that ring a
//! bit of the task's doorbell ([`signal`]). A signal carries no payload (the data is
//! already in the channel, the pool or the operator's completion queue), so ringing a
//! rung bit costs one read-modify-write and no wake-up, and a burst of buffers is one
//! piece of mail: the role of Flink's availability futures, without a ring slot per
//! buffer. The handles that ring them are [`Unparker`]s made by
//! [`Runtime::task_unparker`]: channels, pools and operators take them as they would a
//! worker's.
//!
//! A worker's loop, one turn:
//! 1. poll each task that has something to do: its doorbell rang (its control mail is
//!    handed to [`Task::on_control`] first), it was busy last turn, a driver event was
//!    its, or its deadline ([`Task::next_deadline`]) has come; other tasks are not
//!    touched, so a worker with many idle tasks spends nothing on them;
//! 2. let the driver submit queued I/O and reap completions without blocking, handing
//!    each event to the task that owns the connection;
//! 3. if no task made progress, park in the driver until the earliest task deadline,
//!    I/O, or a wake-up from another thread; the [`Parker`](crate::park::Parker)
//!    protocol makes the check-then-park race-free. Each wake-up is counted by its cause
//!    ([`Wakeups`]), so a test or a report can show what woke a worker. A wake-up from
//!    the worker's own unparker ([`Runtime::unparker`], which names no task) makes the
//!    next turn poll every task: coarse, never lost.
//!
//! Each worker has one timer wheel ([`WorkerTimers`]) shared by the timers of all its
//! tasks' operators (their retry delays): the worker's next deadline is one O(1) look,
//! and a timer that comes due is moved to its operator's queue, which makes its task due
//! for a poll. An operator's timeouts are not on the wheel: the operator reports its next
//! one itself, so a task holding an operator must report
//! `AsyncWaitOperator::next_timer_deadline` in its [`Task::next_deadline`] (as the
//! graph's tasks do), or its timeouts never wake the worker.
//!
//! Drivers and parkers are made before the threads start, so wiring (channels, pools)
//! can name every task's unparker; tasks are built on their worker's thread by a
//! factory, so they may hold `!Send` state (an `Rc`, the operator).

pub mod driver;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use driver::{ConnId, Driver, DriverEvent, NoIo};

use crate::error::ConfigError;
use crate::limits::{TIMER_SLOTS, TIMER_TICK_NS};
use crate::mailbox::{ForeignSender, Inbox, MailSender};
use crate::park::{Doorbell, UnboundParker, Unparker, Wakeup};
use crate::timer::WorkerTimers;

/// The doorbell bits of a task (see the module docs). A task's unparker rings one of
/// them; the worker takes them all before it polls the task.
pub mod signal {
    /// A buffer arrived on one of the task's input channels.
    pub const INPUT: u32 = 1 << 0;
    /// The task's output pool has buffers again (its writer was waiting).
    pub const OUTPUT: u32 = 1 << 1;
    /// A call completed on a thread outside the runtime, or a future was woken.
    pub const COMPLETION: u32 = 1 << 2;
    /// Control mail is waiting in the task's inbox.
    pub const MAIL: u32 = 1 << 3;
    /// Anything else a task's own code wants to be polled for.
    pub const USER: u32 = 1 << 4;
}

/// Control mail for a task (Flink's cancel and stop-with-drain).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Control {
    /// Stop now: the task hears of it ([`Task::on_control`]) and is dropped; the run
    /// ends with [`RuntimeError::Cancelled`].
    Cancel,
    /// End of input: a source stops reading and finishes as if its input had ended; what
    /// it read still flows through the job (stop with drain).
    EndOfInput,
}

/// Names a task placed with [`Runtime::add_task`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskId {
    worker: usize,
    index: usize,
}

impl TaskId {
    /// The worker the task runs on.
    pub fn worker(&self) -> usize {
        self.worker
    }
}

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
///
/// A task is polled when it has something to do: it returned [`Progress::Busy`], its
/// doorbell rang (an unparker from [`Runtime::task_unparker`], which is what its
/// channels, pools and operators must be given), a driver event was its, or its
/// [`next_deadline`](Task::next_deadline) came. A task that returns
/// [`Progress::Idle`] without having arranged one of these is polled again only when
/// its worker sweeps every task (after a wake-up through [`Runtime::unparker`], or at
/// the idle safety net, 100 ms).
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
    /// The task's name in errors (a graph's subtasks say `stage (i/n)`).
    fn name(&self) -> &str {
        "unnamed"
    }
    /// Takes control mail. After [`Control::Cancel`] the task is dropped whatever this
    /// returns (release what must not wait for the drop here); after
    /// [`Control::EndOfInput`] it is polled as usual.
    fn on_control(&mut self, control: Control, cx: &mut TaskContext<'_>) -> Result<(), TaskError> {
        let _ = (control, cx);
        Ok(())
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

/// Configures a [`Runtime`]: its workers' cores, pinning, spin and timer slack, and
/// their drivers.
///
/// ```
/// use std::time::Duration;
/// use weir_engine::runtime::{Cores, Runtime};
///
/// // A worker on each of cores 0 and 1, not pinned, parking at once when idle.
/// let runtime = Runtime::builder()
///     .cores(Cores::List(vec![0, 1]))
///     .pin(false)
///     .spin(Duration::ZERO)
///     .build()?;
/// # drop(runtime);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RuntimeBuilder {
    cores: Cores,
    pin: bool,
    spin: Duration,
    slack: Duration,
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

    /// Timer slack (Linux's word for it): a worker woken from a park by work (a buffer,
    /// an answer, mail) does not park and wake again for more within `slack`: once its
    /// turn is done, it sleeps until `slack` after that wake-up, without being woken,
    /// and then takes everything that arrived or came due meanwhile in one turn. At low
    /// load that turns a wake-up per arrival into one per `slack`; an arrival waits at
    /// most `slack` more, and so does a deadline (a timer, a buffer timeout, an
    /// open-loop source's next record) that comes due within the slack, as Linux lets a
    /// thread's timers run late by its slack to batch wake-ups. A busy worker never
    /// sleeps, so under load nothing changes, and a worker idle for longer than the
    /// slack wakes for the next arrival or deadline at once. Zero: every arrival and
    /// every deadline wakes the worker (the lowest latency, the most CPU per record at
    /// low load). See [`TIMER_SLACK_DEFAULT`].
    pub fn timer_slack(mut self, slack: Duration) -> Self {
        self.slack = slack;
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
                anonymous: Doorbell::new(),
                tasks: Vec::new(),
            });
        }
        Ok(Runtime {
            workers,
            pin: self.pin,
            spin: self.spin,
            slack: self.slack,
        })
    }
}

struct WorkerSlot {
    core: Option<usize>,
    driver: Box<dyn Driver>,
    parker: UnboundParker,
    /// Rung by the worker's own unparkers ([`Runtime::unparker`]), which name no task:
    /// the worker then polls every task.
    anonymous: Arc<Doorbell>,
    tasks: Vec<TaskSlot>,
}

/// A task placed on a worker: its factory (once given) and its mailbox.
struct TaskSlot {
    factory: Option<TaskFactory>,
    inbox: Inbox<Control>,
    doorbell: Arc<Doorbell>,
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
    /// The job's checkpoints failed (more failures in a row than it tolerates, a
    /// disk error): the run was stopped.
    #[error("checkpointing failed, so the job was stopped: {0}")]
    Checkpoint(String),
    /// The run was cancelled ([`Controller::cancel`]) before every task finished.
    #[error("the run was cancelled; {tasks} task(s) stopped before they finished")]
    Cancelled {
        /// Tasks dropped by the cancellation.
        tasks: usize,
    },
    /// A task was placed with [`Runtime::add_task`] but never given a factory.
    #[error(
        "task {index} on worker {worker} was added but never given its factory (Runtime::set_task)"
    )]
    Unset {
        /// The worker.
        worker: usize,
        /// The task's index on it.
        index: usize,
    },
    /// A task (or its worker) panicked: the run stops, as for a failed task.
    #[error("{} panicked: {message}", panic_site(*.worker, .task.as_deref()))]
    Panic {
        /// The worker.
        worker: usize,
        /// The task that was running ([`Task::name`]), when the panic was in one.
        task: Option<String>,
        /// The panic message.
        message: String,
    },
}

fn panic_site(worker: usize, task: Option<&str>) -> String {
    match task {
        Some(task) => format!("task {task} on worker {worker}"),
        None => format!("worker {worker}"),
    }
}

/// The message a panic carried (`panic!` with a literal or a format string).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

std::thread_local! {
    /// The index (in its worker's task list) of the task this worker thread is running,
    /// `usize::MAX` between tasks: names the task a panic came from.
    static RUNNING_TASK: core::cell::Cell<usize> = const { core::cell::Cell::new(usize::MAX) };
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
    /// Of those, the ones after which a task had work although nothing had made it due
    /// (no doorbell, no deadline, no earlier progress) and nothing announced it by the
    /// time its poll returned (a ring that crossed the sweep is a wake-up on its way):
    /// a wake-up that should have come and did not, which only the safety net rescued. A healthy run has none; `idle`
    /// alone may also count a worker that simply waited long for a slow peer.
    pub rescued: u64,
    /// Not a wake-up: the times the worker slept out its timer slack after one instead
    /// of parking ([`RuntimeBuilder::timer_slack`]), taking what arrived meanwhile in
    /// one turn.
    pub slack: u64,
    /// Not a wake-up either: parks that returned before the worker slept, because work
    /// was announced meanwhile (a waker that found the worker awake, say during its
    /// timer slack, left a notification) or the run was being stopped.
    pub pending: u64,
}

impl Wakeups {
    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &Wakeups) {
        self.notified += other.notified;
        self.io += other.io;
        self.deadline += other.deadline;
        self.idle += other.idle;
        self.rescued += other.rescued;
        self.slack += other.slack;
        self.pending += other.pending;
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
    /// Task polls per worker (a task with nothing to do is not polled).
    pub polls: Vec<u64>,
}

/// Workers with their drivers, ready to run tasks: a graph runs on one
/// ([`Graph::execute`](crate::graph::Graph::execute)).
///
/// ```
/// use std::time::Duration;
/// use weir_engine::graph::Graph;
/// use weir_engine::runtime::{Cores, Runtime};
///
/// let runtime = Runtime::builder()
///     .cores(Cores::Count(2))
///     .pin(false)
///     .timer_slack(Duration::from_micros(50))
///     .build()?;
/// let graph = Graph::new();
/// let count = graph.from_generator(1_000, None, |n| n).count();
/// graph.execute(runtime)?;
/// assert_eq!(count.records(), 1_000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Runtime {
    workers: Vec<WorkerSlot>,
    pin: bool,
    spin: Duration,
    slack: Duration,
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
            slack: TIMER_SLACK_DEFAULT,
            driver: Arc::new(|| Ok(Box::new(NoIo::new()))),
        }
    }

    /// Workers.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// The handle that wakes worker `worker` (for wiring channels and pools).
    pub fn unparker(&self, worker: usize) -> Unparker {
        let slot = &self.workers[worker];
        slot.parker.unparker().with_doorbell(&slot.anonymous, 1)
    }

    /// The driver name of worker `worker`.
    pub fn driver_name(&self, worker: usize) -> &'static str {
        self.workers[worker].driver.name()
    }

    /// Places a task on `worker` (modulo the worker count).
    pub fn spawn(&mut self, worker: usize, task: TaskFactory) -> TaskId {
        let id = self.add_task(worker);
        self.set_task(id, task);
        id
    }

    /// Places a task on `worker` (modulo the worker count) whose factory comes later
    /// ([`set_task`](Self::set_task)), so that wiring can name its unparkers and mail
    /// senders first.
    pub fn add_task(&mut self, worker: usize) -> TaskId {
        let worker = worker % self.workers.len();
        let slot = &mut self.workers[worker];
        let doorbell = Doorbell::new();
        let unparker = slot
            .parker
            .unparker()
            .with_doorbell(&doorbell, signal::MAIL);
        slot.tasks.push(TaskSlot {
            factory: None,
            inbox: Inbox::new(unparker),
            doorbell,
        });
        TaskId {
            worker,
            index: slot.tasks.len() - 1,
        }
    }

    /// Gives task `id` its factory (replacing any earlier one).
    pub fn set_task(&mut self, id: TaskId, task: TaskFactory) {
        self.workers[id.worker].tasks[id.index].factory = Some(task);
    }

    /// A handle that wakes task `id`'s worker and rings `bit` ([`signal`]) of the task's
    /// doorbell, so the worker polls that task: what channels, pools and operators
    /// feeding the task should be given.
    pub fn task_unparker(&self, id: TaskId, bit: u32) -> Unparker {
        let slot = &self.workers[id.worker];
        slot.parker
            .unparker()
            .with_doorbell(&slot.tasks[id.index].doorbell, bit)
    }

    /// Wires a sending thread to task `id`'s inbox: an SPSC ring of `capacity` slots
    /// (one per sending thread; the sender is `Send`, for the thread that will use it).
    pub fn connect_mail(&mut self, id: TaskId, capacity: usize) -> MailSender<Control> {
        self.workers[id.worker].tasks[id.index]
            .inbox
            .connect(capacity)
    }

    /// Runs every placed task to completion on its worker; the first failure stops all.
    pub fn run(self) -> Result<RunReport, RuntimeError> {
        self.start()?.join()
    }

    /// Starts the workers and returns at once: the run goes on until every task is done,
    /// a task fails, or the [`Controller`] cancels it; [`Running::join`] waits for it.
    pub fn start(self) -> Result<Running, RuntimeError> {
        let epoch = Instant::now();
        let abort = Arc::new(AtomicBool::new(false));
        let cancelled = Arc::new(AtomicBool::new(false));
        let failure: Arc<Mutex<Option<RuntimeError>>> = Arc::new(Mutex::new(None));
        let unparkers: Vec<Unparker> = self.workers.iter().map(|w| w.parker.unparker()).collect();
        let mut controls = Vec::new();
        for (worker, slot) in self.workers.iter().enumerate() {
            for (index, task) in slot.tasks.iter().enumerate() {
                if task.factory.is_none() {
                    return Err(RuntimeError::Unset { worker, index });
                }
                controls.push(task.inbox.foreign_sender());
            }
        }
        let controller = Controller {
            tasks: Arc::new(controls),
            cancelled: Arc::clone(&cancelled),
        };
        let mut handles = Vec::new();
        for (index, slot) in self.workers.into_iter().enumerate() {
            let abort = Arc::clone(&abort);
            let cancelled = Arc::clone(&cancelled);
            let failure = Arc::clone(&failure);
            let unparkers = unparkers.clone();
            let options = WorkerOptions {
                pin: self.pin,
                spin: self.spin,
                slack: self.slack,
            };
            let handle = std::thread::Builder::new()
                .name(format!("weir-worker-{index}"))
                .spawn(move || {
                    let mut stats = WorkerStats {
                        driver: slot.driver.name(),
                        pinned: false,
                        turns: 0,
                        parks: 0,
                        polls: 0,
                        cancelled: 0,
                        wakeups: Wakeups::default(),
                    };
                    // The tasks outlive the loop until a failure is recorded: dropping
                    // them first would disconnect their channels, and another worker's
                    // "producer gone" could then be taken for the cause.
                    let mut tasks = Vec::new();
                    let flags = Flags {
                        abort: &abort,
                        cancelled: &cancelled,
                    };
                    // A panicking task fails the run like a task error: the other
                    // workers stop, and the cause names the task and the message.
                    // Unwind safety: after a panic the worker's state is only dropped.
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        worker_main(index, slot, options, epoch, flags, &mut stats, &mut tasks)
                    }))
                    .unwrap_or_else(|panic| {
                        let running = RUNNING_TASK.with(|t| t.replace(usize::MAX));
                        let task = tasks
                            .get(running)
                            .and_then(|entry| entry.task.as_ref())
                            .map(|task| task.name().to_string());
                        Err(RuntimeError::Panic {
                            worker: index,
                            task,
                            message: panic_message(&*panic),
                        })
                    });
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
        Ok(Running {
            handles,
            failure,
            controller,
        })
    }
}

/// A started run ([`Runtime::start`]).
pub struct Running {
    handles: Vec<std::thread::JoinHandle<WorkerStats>>,
    failure: Arc<Mutex<Option<RuntimeError>>>,
    controller: Controller,
}

/// Sends control mail to every task of a run, from any thread (cloneable, `Send`).
#[derive(Clone)]
pub struct Controller {
    tasks: Arc<Vec<ForeignSender<Control>>>,
    cancelled: Arc<AtomicBool>,
}

impl Controller {
    /// Cancels the run (Flink's cancel): every task gets [`Control::Cancel`] and is
    /// dropped; errors that the cancellation itself causes (a channel whose producer was
    /// dropped first) are not reported. The run ends with [`RuntimeError::Cancelled`]
    /// unless every task had finished already.
    pub fn cancel(&self) {
        // Release: a worker that sees the flag sees that a cancel was asked for.
        self.cancelled.store(true, Ordering::Release);
        for task in self.tasks.iter() {
            task.send(Control::Cancel);
        }
    }

    /// Ends the input (stop with drain): every task gets [`Control::EndOfInput`], sources
    /// stop and finish, and what they emitted drains through the job, which then ends
    /// normally.
    pub fn end_input(&self) {
        for task in self.tasks.iter() {
            task.send(Control::EndOfInput);
        }
    }
}

impl core::fmt::Debug for Controller {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Controller")
            .field("tasks", &self.tasks.len())
            .finish_non_exhaustive()
    }
}

impl Running {
    /// The run's controller.
    pub fn controller(&self) -> Controller {
        self.controller.clone()
    }

    /// Waits for every worker to finish and reports the run.
    pub fn join(self) -> Result<RunReport, RuntimeError> {
        let mut report = RunReport::default();
        let mut cancelled = 0;
        for (worker, handle) in self.handles.into_iter().enumerate() {
            match handle.join() {
                Ok(stats) => {
                    report.drivers.push(stats.driver);
                    report.pinned.push(stats.pinned);
                    report.turns.push(stats.turns);
                    report.parks.push(stats.parks);
                    report.wakeups.push(stats.wakeups);
                    report.polls.push(stats.polls);
                    cancelled += stats.cancelled;
                }
                Err(panic) => {
                    // A panic outside the worker's loop (say, in a task's drop).
                    let message = panic_message(&*panic);
                    let mut first = self.failure.lock().unwrap_or_else(|e| e.into_inner());
                    if first.is_none() {
                        *first = Some(RuntimeError::Panic {
                            worker,
                            task: None,
                            message,
                        });
                    }
                }
            }
        }
        let failure = self
            .failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        match failure {
            Some(error) => Err(error),
            None if cancelled > 0 => Err(RuntimeError::Cancelled { tasks: cancelled }),
            None => Ok(report),
        }
    }
}

impl core::fmt::Debug for Running {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Running")
            .field("workers", &self.handles.len())
            .finish_non_exhaustive()
    }
}

struct WorkerStats {
    driver: &'static str,
    pinned: bool,
    turns: u64,
    parks: u64,
    polls: u64,
    cancelled: usize,
    wakeups: Wakeups,
}

/// The run's shared flags, as a worker reads them.
#[derive(Clone, Copy)]
struct Flags<'a> {
    /// A worker failed: stop at once.
    abort: &'a AtomicBool,
    /// The run is being cancelled: task errors from now on are its consequences.
    cancelled: &'a AtomicBool,
}

/// A live task on its worker, with what the worker knows about whether to poll it.
struct Entry {
    task: Option<Box<dyn Task>>,
    inbox: Inbox<Control>,
    doorbell: Arc<Doorbell>,
    /// It made progress last time, or an I/O event was its: poll it next turn.
    due: bool,
}

/// Longest an idle worker parks without a task deadline: a safety net, since every
/// source of work wakes the worker explicitly.
const IDLE_PARK_MAX: Duration = Duration::from_millis(100);

/// The timer slack workers take unless told otherwise ([`RuntimeBuilder::timer_slack`]):
/// 50 µs, Linux's default timer slack for a thread. A record arriving at a worker that
/// has just woken for another waits at most this long more; at low load a worker wakes
/// at most once per 50 µs instead of once per arrival.
pub const TIMER_SLACK_DEFAULT: Duration = Duration::from_micros(50);

/// One driver turn, handing each event to the task that owns its connection (which is
/// then polled next turn); returns how many events there were.
fn turn(
    driver: &mut dyn Driver,
    tasks: &mut [Entry],
    timeout: Option<Duration>,
) -> std::io::Result<usize> {
    let mut events = 0;
    driver.turn(timeout, &mut |event: DriverEvent<'_>| {
        events += 1;
        for (task_index, entry) in tasks.iter_mut().enumerate() {
            if let Some(task) = entry.task.as_mut() {
                RUNNING_TASK.with(|t| t.set(task_index));
                if task.on_io(&event) {
                    entry.due = true;
                    break;
                }
            }
        }
    })?;
    RUNNING_TASK.with(|t| t.set(usize::MAX));
    Ok(events)
}

/// How a worker holds its core: pinned to it or not, and how long it polls with
/// nothing to do before it parks.
#[derive(Debug, Clone, Copy)]
struct WorkerOptions {
    pin: bool,
    spin: Duration,
    slack: Duration,
}

/// What a task's control mail asked for.
enum AfterMail {
    Poll,
    Drop,
}

/// Hands `entry`'s control mail to its task.
fn deliver_mail(entry: &mut Entry, cx: &mut TaskContext<'_>) -> Result<AfterMail, TaskError> {
    let mut mail = [None; 4];
    let mut after = AfterMail::Poll;
    loop {
        let mut taken = 0;
        entry.inbox.drain(mail.len(), |control| {
            mail[taken] = Some(control);
            taken += 1;
        });
        if taken == 0 {
            return Ok(after);
        }
        for control in mail.iter_mut().take(taken).filter_map(Option::take) {
            if let Some(task) = entry.task.as_mut() {
                task.on_control(control, cx)?;
            }
            if control == Control::Cancel {
                after = AfterMail::Drop;
            }
        }
    }
}

/// Makes the calling thread's timed waits end at their deadline: Linux lets a timed
/// sleep end up to the thread's timer slack late (50 µs by default) to batch wake-ups,
/// and a worker's deadlines are operators' timers and retry delays. Best effort: where
/// the call is refused, waits keep the default slack. Every worker calls it when it
/// starts; a tool whose threads should sleep as a worker's do (`weir wake-cost`) calls
/// it too.
pub fn exact_timers() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes an integer argument and reads or writes no memory;
    // the result is ignored on purpose (best effort).
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}

fn worker_main(
    index: usize,
    slot: WorkerSlot,
    WorkerOptions { pin, spin, slack }: WorkerOptions,
    epoch: Instant,
    flags: Flags<'_>,
    stats: &mut WorkerStats,
    tasks: &mut Vec<Entry>,
) -> Result<(), RuntimeError> {
    exact_timers();
    let WorkerSlot {
        core,
        mut driver,
        parker,
        anonymous,
        tasks: slots,
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
    // The worker's one timer wheel, found by the operators its tasks build.
    let timers = WorkerTimers::new(TIMER_TICK_NS, TIMER_SLOTS);
    let _current = timers.install();
    tasks.reserve(slots.len());
    for slot in slots {
        let factory = slot
            .factory
            .expect("start() checked every task has its factory");
        match factory(driver.as_mut()) {
            Ok(task) => tasks.push(Entry {
                task: Some(task),
                inbox: slot.inbox,
                doorbell: slot.doorbell,
                due: true,
            }),
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
    let slack_ns = slack.as_nanos().min(u128::from(u64::MAX)) as u64;
    // When a park last ended with work arriving (not by its timeout), if the worker has
    // not yet taken its slack after it: the timer slack's reference.
    let mut woke_ns: Option<u64> = None;
    // When a task or the driver last did something.
    let mut progress_ns = epoch.elapsed().as_nanos() as u64;
    // Poll every task this turn (after a wake-up that rang no doorbell).
    let mut sweep = false;
    // Whether this turn's sweep is the idle safety net's (not a wake-up naming no task).
    let mut idle_sweep = false;
    while live > 0 {
        if flags.abort.load(Ordering::Acquire) {
            return Ok(());
        }
        stats.turns += 1;
        // A wake-up that named no task: look at them all.
        if anonymous.take() != 0 {
            sweep = true;
            idle_sweep = false;
        }
        let now_ns = epoch.elapsed().as_nanos() as u64;
        // Timers that came due go to their operators' queues, which makes those
        // operators' tasks report a deadline that has come: they are polled below.
        timers.advance(now_ns);
        let mut busy = false;
        for (task_index, entry) in tasks.iter_mut().enumerate() {
            let Some(running) = entry.task.as_mut() else {
                continue;
            };
            // Named before any of its code runs (its deadline included).
            RUNNING_TASK.with(|t| t.set(task_index));
            let rung = entry.doorbell.take();
            let made_due = core::mem::take(&mut entry.due)
                || rung != 0
                || running.next_deadline().is_some_and(|d| d <= now_ns);
            if !made_due && !sweep {
                continue;
            }
            // Polled only because the safety net swept: work found now was never
            // announced.
            let rescue = idle_sweep && !made_due;
            stats.polls += 1;
            let mut cx = TaskContext {
                now_ns,
                driver: driver.as_mut(),
                worker: index,
            };
            let outcome = if rung & signal::MAIL != 0 || sweep {
                deliver_mail(entry, &mut cx)
            } else {
                Ok(AfterMail::Poll)
            };
            let outcome = match outcome {
                Ok(AfterMail::Drop) => {
                    entry.task = None;
                    live -= 1;
                    stats.cancelled += 1;
                    busy = true;
                    continue;
                }
                Ok(AfterMail::Poll) => entry.task.as_mut().expect("a live entry").poll(&mut cx),
                Err(error) => Err(error),
            };
            // A bell rung by now announced the work after all: its ringer published it,
            // then rang while the sweep ran (say, a producer's buffer timeout coming due
            // with the safety net), and the next turn would have polled the task anyway.
            if rescue
                && matches!(outcome, Ok(Progress::Busy | Progress::Done))
                && entry.doorbell.peek() == 0
                && anonymous.peek() == 0
            {
                stats.wakeups.rescued += 1;
            }
            match outcome {
                Ok(Progress::Busy) => {
                    busy = true;
                    entry.due = true;
                }
                Ok(Progress::Idle) => {}
                Ok(Progress::Done) => {
                    entry.task = None;
                    live -= 1;
                    busy = true;
                }
                Err(_) if flags.cancelled.load(Ordering::Acquire) => {
                    // A consequence of the cancellation (say, an upstream task dropped
                    // before this one heard of it): the task stops like the others.
                    entry.task = None;
                    live -= 1;
                    stats.cancelled += 1;
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
        RUNNING_TASK.with(|t| t.set(usize::MAX));
        sweep = false;
        idle_sweep = false;
        let events = match turn(driver.as_mut(), tasks, Some(Duration::ZERO)) {
            Ok(events) => events,
            Err(error) => return Err(RuntimeError::Driver(error)),
        };
        // I/O events complete calls on this thread (no wake-up): poll their tasks again.
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
            .enumerate()
            .filter_map(|(index, e)| {
                // Named while its code runs, for a panic's report.
                RUNNING_TASK.with(|t| t.set(index));
                e.task.as_ref()?.next_deadline()
            })
            .chain(timers.next_deadline())
            .min();
        RUNNING_TASK.with(|t| t.set(usize::MAX));
        if let Some(woke) = woke_ns.take() {
            // Timer slack: what arrives until `slack` after the last wake-up, and what
            // comes due by then (deadlines run up to `slack` late, as Linux lets a
            // thread's timers), waits for one turn then, instead of waking the worker
            // once each. A plain sleep: wakers find the parker not parked and only
            // leave their bells and a notification, which the turn after it reads.
            let until = woke.saturating_add(slack_ns);
            if until > now_ns {
                stats.wakeups.slack += 1;
                std::thread::sleep(Duration::from_nanos(until - now_ns));
                continue;
            }
        }
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
        // Whether the park slept (the wait ran); else it returned at once.
        let mut slept = false;
        let wakeup = parker.park_with(
            Some(timeout),
            || flags.abort.load(Ordering::Acquire),
            |timeout| {
                slept = true;
                match turn(driver.as_mut(), tasks, timeout) {
                    Ok(events) => io_events = events,
                    Err(error) => turn_error = Some(error),
                }
            },
        );
        if let Some(error) = turn_error {
            return Err(RuntimeError::Driver(error));
        }
        let cause = &mut stats.wakeups;
        if slack_ns > 0 && (io_events > 0 || matches!(wakeup, Wakeup::Notified | Wakeup::Ready)) {
            woke_ns = Some(epoch.elapsed().as_nanos() as u64);
        }
        match wakeup {
            // The bells say which tasks to poll: a task's own, or the worker's
            // anonymous one (every task), taken at the top of the next turn.
            // Announced before the worker slept: no wake-up was paid.
            Wakeup::Notified | Wakeup::Ready if !slept => cause.pending += 1,
            Wakeup::Notified | Wakeup::Ready => cause.notified += 1,
            Wakeup::TimedOut if io_events > 0 => cause.io += 1,
            Wakeup::TimedOut if by_deadline => cause.deadline += 1,
            Wakeup::TimedOut => {
                cause.idle += 1;
                // The idle safety net: look at every task.
                sweep = true;
                idle_sweep = true;
            }
        }
    }
    Ok(())
}
