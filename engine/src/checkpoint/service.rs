//! The checkpoint service: the [`Coordinator`] on a thread of its own, with the
//! checkpoint directory, so that everything slow about a checkpoint happens off the
//! workers (Flink's asynchronous phase).
//!
//! A task snapshots its state in memory at the barrier (the synchronous phase, on its
//! worker) and hands the bytes to [`Acks::acknowledge`], which only sends them to this
//! thread. The thread writes each task's state file (fsync'd), counts the
//! acknowledgements, writes the metadata once every task has acknowledged, and only then
//! tells the job ([`CheckpointHooks::complete`]: Flink's `notifyCheckpointComplete`,
//! where two-phase-commit sinks commit). Triggers and aborts go to the job through the
//! same hooks. A slow disk therefore delays the checkpoint's completion, never a worker.
//!
//! A job over several processes runs a service in each, over the process's own tasks,
//! with the checkpoint directory shared (the same path on a filesystem every process
//! reaches), joined by a [`CheckpointLink`] (see [`link`](super::link)). Process 0's
//! service is the job's one coordinator: it triggers every checkpoint in every process
//! (its own sources, and a trigger message to each other process), collects every
//! task's acknowledgement or decline, times checkpoints out, enforces the maximum
//! concurrency, the minimum pause and the failures tolerated, writes the `_metadata`
//! that completes a checkpoint, and tells every process of each completion and abort, so
//! that two-phase-commit sinks everywhere commit the same checkpoint. The others write
//! their tasks' files into the shared directory and forward what their tasks say. A
//! process waits for every other one's hello (the checkpoint it restored and the job's
//! task count, which must agree) before the first trigger, and a process that is lost
//! fails the job: a supervisor restarts every process from the same completed
//! checkpoint. Only process 0 removes checkpoint directories.
//!
//! Finished tasks (Flink's checkpoints after tasks finished): a task whose input ended
//! hands its final state to [`Acks::finished`] and leaves; the service acknowledges
//! every checkpoint it has not acknowledged yet, and every later one, with that state.
//! Over several processes a process whose tasks all ended says so and stays until the
//! coordinator releases every process at the job's end, since its finished tasks still
//! acknowledge the checkpoints that commit other processes' last output.
//! Downstream, a channel's end counts as every later barrier, so the snapshots still
//! agree: a bounded job's last records are committed by a checkpoint taken after its
//! sources ended. In unaligned mode a finished task's output still queued does not
//! hold a checkpoint back: each later barrier is announced ahead of it on the task's
//! local channels (as Flink's priority barrier overtakes a finished task's output, the
//! task kept running for it), and the consumer stores that output as channel state.

use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::coordinator::{AckFigures, CheckpointConfig, CheckpointStats, Coordinator, Outcome};
use super::link::{CheckpointLink, LinkEvent, Wire};
use super::storage::{read_metadata, unix_ms, CheckpointMetadata, CheckpointStore};
use super::CheckpointError;

/// How the service reaches the job.
pub trait CheckpointHooks: Send + 'static {
    /// Inject barrier `id` at every source.
    fn trigger(&mut self, id: u64);
    /// Checkpoint `id` is complete and durable: commit what was pre-committed for it.
    fn complete(&mut self, id: u64);
    /// Checkpoint `id` failed or was subsumed: drop what is held for it.
    fn abort(&mut self, id: u64, reason: &str);
    /// Checkpoint `metadata.id` completed, its longest alignment `alignment` (after
    /// [`complete`](Self::complete)): for a progress line.
    fn completed(&mut self, metadata: &CheckpointMetadata, alignment: Duration) {
        let _ = (metadata, alignment);
    }
    /// The service stopped on `error` (too many failed checkpoints, a disk error): the
    /// job must fail.
    fn failed(&mut self, error: &CheckpointError) {
        let _ = error;
    }
}

enum Message {
    Ack {
        id: u64,
        task: usize,
        name: String,
        state: TaskState,
        figures: AckFigures,
    },
    Decline {
        id: u64,
        task: usize,
        reason: String,
    },
    Finished {
        task: usize,
        name: String,
        from: u64,
        state: Vec<u8>,
    },
    TriggerNow,
    /// From the other processes of the job.
    Link(LinkEvent),
    /// The job ended: `wait`, whether to stay for the other processes (a job that
    /// ended well) or stop at once (a failure, or the service dropped).
    Stop {
        wait: bool,
    },
}

/// This process's place among the processes of a job (see the [module docs](self)).
#[derive(Clone)]
pub struct ServicePart {
    /// This process's index: 0 coordinates.
    pub process: usize,
    /// Processes in the job.
    pub processes: usize,
    /// How the services talk.
    pub link: Arc<dyn CheckpointLink>,
    /// The checkpoint this run restored (0: a fresh start), the same in every process.
    pub restored: u64,
}

impl core::fmt::Debug for ServicePart {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ServicePart")
            .field("process", &self.process)
            .field("processes", &self.processes)
            .field("restored", &self.restored)
            .finish_non_exhaustive()
    }
}

/// A task's snapshot for one checkpoint, as it reaches the service: its bytes, or what
/// makes them, run on the service's thread (Flink's asynchronous snapshot phase: keyed
/// state hands over a copy-on-write view of its maps at the barrier, in time independent
/// of its size, and is encoded here while the task goes on).
pub struct TaskState(StateInner);

enum StateInner {
    Bytes(Vec<u8>),
    Deferred(Box<dyn FnOnce() -> Vec<u8> + Send>),
}

impl TaskState {
    /// State whose bytes `make` writes, later, on the service's thread.
    pub fn deferred(make: impl FnOnce() -> Vec<u8> + Send + 'static) -> Self {
        TaskState(StateInner::Deferred(Box::new(make)))
    }

    /// The bytes (made now if they were deferred).
    pub fn into_bytes(self) -> Vec<u8> {
        match self.0 {
            StateInner::Bytes(bytes) => bytes,
            StateInner::Deferred(make) => make(),
        }
    }
}

impl From<Vec<u8>> for TaskState {
    fn from(bytes: Vec<u8>) -> Self {
        TaskState(StateInner::Bytes(bytes))
    }
}

impl core::fmt::Debug for TaskState {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match &self.0 {
            StateInner::Bytes(bytes) => write!(f, "TaskState({} bytes)", bytes.len()),
            StateInner::Deferred(_) => f.write_str("TaskState(deferred)"),
        }
    }
}

/// The tasks' side of the service: cheap to clone, one per task.
#[derive(Clone)]
pub struct Acks {
    tx: Sender<Message>,
}

impl Acks {
    /// Task `task` (its state file named `name`) took its snapshot for checkpoint `id`
    /// with `figures` (how long it waited for its barriers, and the channel state its
    /// snapshot holds; a bare [`Duration`] is an alignment without channel state). Returns at once: the state is made
    /// (when deferred) and written by the service's thread. Does nothing once the
    /// service stopped.
    pub fn acknowledge(
        &self,
        id: u64,
        task: usize,
        name: &str,
        state: impl Into<TaskState>,
        figures: impl Into<AckFigures>,
    ) {
        let _ = self.tx.send(Message::Ack {
            id,
            task,
            name: name.to_string(),
            state: state.into(),
            figures: figures.into(),
        });
    }

    /// Task `task` could not snapshot checkpoint `id`.
    pub fn decline(&self, id: u64, task: usize, reason: String) {
        let _ = self.tx.send(Message::Decline { id, task, reason });
    }

    /// Task `task` (state file `name`) finished with `state`, which holds for checkpoint
    /// `from` and every later one: the service acknowledges them with it (pending or to
    /// come; older ones the task acknowledged or declined itself).
    pub fn finished(&self, task: usize, name: &str, from: u64, state: Vec<u8>) {
        let _ = self.tx.send(Message::Finished {
            task,
            name: name.to_string(),
            from,
            state,
        });
    }

    /// Asks for a checkpoint now, outside the interval.
    pub fn trigger_now(&self) {
        let _ = self.tx.send(Message::TriggerNow);
    }
}

/// See the [module docs](self).
pub struct CheckpointService {
    acks: Option<Acks>,
    thread: Option<JoinHandle<Result<CheckpointStats, CheckpointError>>>,
}

impl CheckpointService {
    /// Starts the service for a job of `tasks` tasks (`job` is its id, stored in every
    /// checkpoint's metadata), its first checkpoint `first_id`.
    pub fn start(
        config: CheckpointConfig,
        store: CheckpointStore,
        job: String,
        tasks: usize,
        first_id: u64,
        hooks: impl CheckpointHooks,
    ) -> Result<Self, CheckpointError> {
        Self::start_part(config, store, job, tasks, first_id, hooks, None)
    }

    /// [`start`](Self::start) for one process of a job over several (see the [module
    /// docs](self)): `tasks` counts the tasks of every process, and the tasks here
    /// acknowledge under their numbers over the whole job; `None`: the whole job is
    /// here.
    pub fn start_part(
        config: CheckpointConfig,
        store: CheckpointStore,
        job: String,
        tasks: usize,
        first_id: u64,
        hooks: impl CheckpointHooks,
        part: Option<ServicePart>,
    ) -> Result<Self, CheckpointError> {
        if let Some(part) = &part {
            if part.processes == 0 || part.process >= part.processes {
                return Err(CheckpointError::Config(format!(
                    "process {} of a job over {} processes: the index must be below the count",
                    part.process, part.processes
                )));
            }
        }
        let epoch = Instant::now();
        let coordinator = Coordinator::new(config, tasks, first_id, 0)?;
        let (tx, rx) = mpsc::channel();
        if let Some(part) = &part {
            let inbox = tx.clone();
            part.link.open(Box::new(move |event| {
                let _ = inbox.send(Message::Link(event));
            }));
        }
        let thread = std::thread::Builder::new()
            .name("weir-checkpoints".into())
            .spawn(move || {
                let mut place = Place {
                    store,
                    job,
                    epoch,
                    tasks,
                };
                run(coordinator, &mut place, hooks, rx, part)
            })
            .map_err(|e| {
                CheckpointError::Config(format!("cannot start the checkpoint thread: {e}"))
            })?;
        Ok(CheckpointService {
            acks: Some(Acks { tx }),
            thread: Some(thread),
        })
    }

    /// A handle for the tasks.
    pub fn acks(&self) -> Acks {
        self.acks.clone().expect("running")
    }

    /// Whether the service ended by itself (too many failures, a disk error, a process
    /// of the job lost): then [`stop`](Self::stop) returns why, and the job must fail.
    pub fn has_failed(&self) -> bool {
        self.thread.as_ref().is_some_and(JoinHandle::is_finished)
    }

    /// Stops the service after a job that ended well and returns its figures, or why it
    /// failed. Over several processes it first waits for the other processes' tasks to
    /// end (their checkpoints go on meanwhile: see the [module docs](self)), or for a
    /// process to be lost.
    pub fn stop(self) -> Result<CheckpointStats, CheckpointError> {
        self.stop_with(true)
    }

    /// Stops the service at once, as after a failure (pending checkpoints are left
    /// unfinished, as a crash would), and returns its figures, or why it failed.
    pub fn abandon(self) -> Result<CheckpointStats, CheckpointError> {
        self.stop_with(false)
    }

    fn stop_with(mut self, wait: bool) -> Result<CheckpointStats, CheckpointError> {
        if let Some(acks) = self.acks.take() {
            let _ = acks.tx.send(Message::Stop { wait });
        }
        let thread = self.thread.take().expect("running");
        thread.join().unwrap_or_else(|_| {
            Err(CheckpointError::Config(
                "the checkpoint thread panicked".into(),
            ))
        })
    }
}

impl Drop for CheckpointService {
    fn drop(&mut self) {
        if let Some(acks) = self.acks.take() {
            let _ = acks.tx.send(Message::Stop { wait: false });
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Where the service writes.
struct Place {
    store: CheckpointStore,
    job: String,
    epoch: Instant,
    /// Tasks of the whole job.
    tasks: usize,
}

impl Place {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

fn run(
    mut coordinator: Coordinator,
    place: &mut Place,
    mut hooks: impl CheckpointHooks,
    rx: Receiver<Message>,
    part: Option<ServicePart>,
) -> Result<CheckpointStats, CheckpointError> {
    // A panic here (a bug) must fail the job like any other end of the service: a job
    // whose checkpoints stopped would otherwise run on and never commit.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match part {
        Some(part) if part.process != 0 => {
            // How long a participant waits for the outcome of a checkpoint it heard
            // of: the checkpoint timeout, by which the coordinator has aborted it.
            let timeout = coordinator.config().timeout;
            participate(place, &mut hooks, rx, part, timeout)
        }
        part => {
            let mut peers = Peers::new(part);
            coordinate(&mut coordinator, place, &mut hooks, rx, &mut peers)
        }
    }))
    .unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(CheckpointError::Config(format!(
            "the checkpoint thread panicked ({message}); this is a bug in Weir"
        )))
    });
    if let Err(error) = &result {
        hooks.failed(error);
    }
    result
}

/// The coordinator's view of the other processes (none for a job in one process).
struct Peers {
    part: Option<ServicePart>,
    /// By process: said hello.
    hello: Vec<bool>,
    /// By process: every task there ended.
    done: Vec<bool>,
}

impl Peers {
    fn new(part: Option<ServicePart>) -> Self {
        let processes = part.as_ref().map_or(1, |p| p.processes);
        let mut hello = vec![false; processes];
        hello[0] = true;
        let mut done = vec![false; processes];
        done[0] = true;
        Peers { part, hello, done }
    }

    fn ready(&self) -> bool {
        self.hello.iter().all(|&h| h)
    }

    fn all_done(&self) -> bool {
        self.done.iter().all(|&d| d)
    }

    fn several(&self) -> bool {
        self.part.is_some()
    }

    /// Sends `wire` to every other process.
    fn broadcast(&self, wire: &Wire) {
        if let Some(part) = &self.part {
            let bytes = wire.encode();
            for process in 1..part.processes {
                part.link.send(process, bytes.clone());
            }
        }
    }

    /// What process `from` said; an error fails the job.
    fn heard(
        &mut self,
        coordinator: &mut Coordinator,
        place: &Place,
        hooks: &mut impl CheckpointHooks,
        event: LinkEvent,
    ) -> Result<(), CheckpointError> {
        let (from, bytes) = match event {
            LinkEvent::Message { from, bytes } => (from, bytes),
            LinkEvent::Lost { process, reason } => {
                return Err(CheckpointError::Link {
                    process,
                    reason: format!(
                        "is lost ({reason}): its checkpoints cannot complete, so the job \
                         stops; restart every process from the latest completed checkpoint"
                    ),
                })
            }
        };
        if from == 0 || from >= self.hello.len() {
            return Err(CheckpointError::Link {
                process: from,
                reason: format!(
                    "is not a participant of this job of {} processes",
                    self.hello.len()
                ),
            });
        }
        let restored = self.part.as_ref().map_or(0, |p| p.restored);
        match Wire::decode(from, &bytes)? {
            Wire::Hello {
                restored: theirs,
                tasks,
            } => {
                if theirs != restored {
                    let said = |id: u64| match id {
                        0 => "started fresh".to_string(),
                        id => format!("restored checkpoint {id}"),
                    };
                    return Err(CheckpointError::Link {
                        process: from,
                        reason: format!(
                            "{} where process 0 {}: every process must restore the same \
                             checkpoint from the same shared directory",
                            said(theirs),
                            said(restored)
                        ),
                    });
                }
                if tasks as usize != place.tasks {
                    return Err(CheckpointError::Link {
                        process: from,
                        reason: format!(
                            "runs a job of {tasks} tasks where process 0 runs {}: every \
                             process must run the same graph with the same workers",
                            place.tasks
                        ),
                    });
                }
                self.hello[from] = true;
            }
            Wire::Ack {
                id,
                task,
                file,
                figures,
            } => {
                coordinator.acknowledge(id, task as usize, file, figures, place.now());
            }
            Wire::Decline { id, task, reason } => {
                coordinator.decline(id, task as usize, format!("process {from}: {reason}"))?;
            }
            Wire::TriggerNow => {
                if let Some(id) = coordinator.trigger_now(place.now()) {
                    trigger(id, self, hooks);
                }
            }
            Wire::Done => self.done[from] = true,
            other => {
                return Err(CheckpointError::Link {
                    process: from,
                    reason: format!("sent {other:?}, which only process 0 sends"),
                })
            }
        }
        Ok(())
    }
}

fn trigger(id: u64, peers: &Peers, hooks: &mut impl CheckpointHooks) {
    hooks.trigger(id);
    peers.broadcast(&Wire::Trigger(id));
}

/// The coordinator's loop: the whole job in one process, or process 0 of several.
fn coordinate(
    coordinator: &mut Coordinator,
    place: &mut Place,
    hooks: &mut impl CheckpointHooks,
    rx: Receiver<Message>,
    peers: &mut Peers,
) -> Result<CheckpointStats, CheckpointError> {
    // Finished tasks and their final state.
    let mut finished: Vec<(usize, String, u64, Vec<u8>)> = Vec::new();
    let mut stopping = false;
    let max_concurrent = coordinator.config().max_concurrent;
    loop {
        // No trigger before every process is there to take it.
        coordinator.hold(if peers.ready() { 0 } else { max_concurrent });
        match coordinator.poll(place.now()) {
            Ok(outcomes) => act(outcomes, place, hooks, peers)?,
            Err(error) => return fail(error, coordinator, place, hooks, peers),
        }
        settle(coordinator, place, hooks, peers, &finished)?;
        if stopping && peers.all_done() {
            peers.broadcast(&Wire::Release);
            return Ok(coordinator.stats().clone());
        }
        let wait = coordinator
            .next_deadline()
            .map_or(Duration::from_secs(3600), |at| {
                Duration::from_nanos(at.saturating_sub(place.now()))
            });
        let message = match rx.recv_timeout(wait) {
            Ok(message) => message,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return Ok(coordinator.stats().clone()),
        };
        match message {
            Message::Ack {
                id,
                task,
                name,
                state,
                figures,
            } => {
                // A late acknowledgement (expired, aborted, subsumed) writes nothing.
                if coordinator.is_pending(id) {
                    // The asynchronous phase: the state is encoded (if it was deferred)
                    // and reaches the disk here, not on the task's worker.
                    let state = state.into_bytes();
                    let file = place.store.write_task_state(id, &name, &state)?;
                    coordinator.acknowledge(id, task, file, figures, place.now());
                }
            }
            Message::Decline { id, task, reason } => {
                if let Err(error) = coordinator.decline(id, task, reason) {
                    return fail(error, coordinator, place, hooks, peers);
                }
            }
            Message::Finished {
                task,
                name,
                from,
                state,
            } => finished.push((task, name, from, state)),
            Message::TriggerNow => {
                if let Some(id) = coordinator.trigger_now(place.now()) {
                    trigger(id, peers, hooks);
                }
            }
            Message::Link(event) => {
                if let Err(error) = peers.heard(coordinator, place, hooks, event) {
                    return fail(error, coordinator, place, hooks, peers);
                }
            }
            // The tasks' handles may outlive the service: it ends when told to. A job
            // over several processes that ended well here goes on coordinating until
            // every process's tasks ended.
            Message::Stop { wait } => {
                if !wait || !peers.several() {
                    return Ok(coordinator.stats().clone());
                }
                stopping = true;
            }
        }
        let outcomes = coordinator.take_outcomes();
        act(outcomes, place, hooks, peers)?;
        settle(coordinator, place, hooks, peers, &finished)?;
    }
}

/// Acknowledges every pending checkpoint for the finished tasks, acting on what that
/// completes.
fn settle(
    coordinator: &mut Coordinator,
    place: &mut Place,
    hooks: &mut impl CheckpointHooks,
    peers: &Peers,
    finished: &[(usize, String, u64, Vec<u8>)],
) -> Result<(), CheckpointError> {
    if finished.is_empty() {
        return Ok(());
    }
    for id in coordinator.pending_ids() {
        for (task, name, from, state) in finished {
            if id >= *from && coordinator.is_pending(id) && !coordinator.has_acknowledged(id, *task)
            {
                let file = place.store.write_task_state(id, name, state)?;
                coordinator.acknowledge(id, *task, file, Duration::ZERO, place.now());
            }
        }
    }
    let outcomes = coordinator.take_outcomes();
    act(outcomes, place, hooks, peers)
}

/// The job fails with `error`: the aborts that came with it reach the job first.
fn fail(
    error: CheckpointError,
    coordinator: &mut Coordinator,
    place: &mut Place,
    hooks: &mut impl CheckpointHooks,
    peers: &Peers,
) -> Result<CheckpointStats, CheckpointError> {
    act(coordinator.take_outcomes(), place, hooks, peers)?;
    Err(error)
}

fn act(
    outcomes: Vec<Outcome>,
    place: &mut Place,
    hooks: &mut impl CheckpointHooks,
    peers: &Peers,
) -> Result<(), CheckpointError> {
    for outcome in outcomes {
        match outcome {
            Outcome::Trigger(id) => trigger(id, peers, hooks),
            Outcome::Abort { id, reason } => {
                // Over several processes, a directory is removed only when a newer
                // checkpoint completes: another process may still write here.
                if !peers.several() {
                    place.store.discard(id)?;
                }
                hooks.abort(id, &reason);
                peers.broadcast(&Wire::Abort { id, reason });
            }
            Outcome::Complete {
                id,
                triggered_ns,
                duration,
                tasks,
                alignment,
                channel_state,
            } => {
                let since_trigger = place
                    .epoch
                    .elapsed()
                    .saturating_sub(Duration::from_nanos(triggered_ns));
                let metadata = CheckpointMetadata {
                    id,
                    triggered_unix_ms: unix_ms().saturating_sub(since_trigger.as_millis() as u64),
                    duration,
                    job: place.job.clone(),
                    tasks,
                };
                place.store.complete(&metadata)?;
                hooks.complete(id);
                peers.broadcast(&Wire::Complete {
                    id,
                    duration,
                    alignment,
                    channel_state,
                });
                hooks.completed(&metadata, alignment);
            }
        }
    }
    Ok(())
}

/// A checkpoint a participant heard of and whose outcome it has not heard yet.
struct Heard {
    since: Instant,
}

/// A participant's loop: a process other than 0 of a job over several.
fn participate(
    place: &mut Place,
    hooks: &mut impl CheckpointHooks,
    rx: Receiver<Message>,
    part: ServicePart,
    timeout: Duration,
) -> Result<CheckpointStats, CheckpointError> {
    let coordinator_lost = |reason: String| CheckpointError::Link {
        process: 0,
        reason: format!(
            "(the checkpoint coordinator) is lost ({reason}): no checkpoint can complete, \
             so the job stops; restart every process from the latest completed checkpoint"
        ),
    };
    let send = |wire: Wire| part.link.send(0, wire.encode());
    send(Wire::Hello {
        restored: part.restored,
        tasks: place.tasks as u32,
    });
    let mut stats = CheckpointStats::default();
    let mut finished: Vec<(usize, String, u64, Vec<u8>)> = Vec::new();
    // Checkpoints heard of (triggered, or acknowledged here first) without an outcome.
    let mut heard: BTreeMap<u64, Heard> = BTreeMap::new();
    // The newest checkpoint whose outcome came: anything up to it is over.
    let mut settled = 0u64;
    // Writes a task's state for checkpoint `id` and tells the coordinator.
    let ack = |id: u64, task: usize, name: &str, state: &[u8], figures: AckFigures| {
        let file = place.store.write_task_state(id, name, state)?;
        send(Wire::Ack {
            id,
            task: task as u32,
            file,
            figures,
        });
        Ok::<(), CheckpointError>(())
    };
    loop {
        // A checkpoint that heard nothing from the coordinator for the checkpoint
        // timeout: the coordinator (which would have aborted it by now) is stalled.
        if let Some((&id, oldest)) = heard.iter().next() {
            if oldest.since.elapsed() >= timeout {
                return Err(CheckpointError::Unsettled {
                    id,
                    after: timeout,
                    waiting_for: "process 0 (the checkpoint coordinator) to complete or \
                                  abort it"
                        .into(),
                });
            }
        }
        let wait = heard
            .values()
            .next()
            .map_or(Duration::from_secs(3600), |h| {
                timeout.saturating_sub(h.since.elapsed())
            });
        let message = match rx.recv_timeout(wait) {
            Ok(message) => message,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return Ok(stats),
        };
        match message {
            Message::Ack {
                id,
                task,
                name,
                state,
                figures,
            } => {
                // A barrier may reach a task here before the coordinator's trigger
                // does: the checkpoint is live until its outcome comes.
                if id > settled {
                    heard.entry(id).or_insert_with(|| Heard {
                        since: Instant::now(),
                    });
                    let state = state.into_bytes();
                    ack(id, task, &name, &state, figures)?;
                }
            }
            Message::Decline { id, task, reason } => send(Wire::Decline {
                id,
                task: task as u32,
                reason,
            }),
            Message::Finished {
                task,
                name,
                from,
                state,
            } => {
                for &id in heard.keys().filter(|&&id| id >= from) {
                    ack(id, task, &name, &state, AckFigures::default())?;
                }
                finished.push((task, name, from, state));
            }
            Message::TriggerNow => send(Wire::TriggerNow),
            Message::Link(LinkEvent::Lost { process, reason }) => {
                // Only the coordinator matters here: a lost channel to another process
                // fails the tasks that read it, by name.
                if process == 0 {
                    return Err(coordinator_lost(reason));
                }
            }
            Message::Link(LinkEvent::Message { from, bytes }) => {
                if from != 0 {
                    return Err(CheckpointError::Link {
                        process: from,
                        reason: "sent a checkpoint message; only process 0 coordinates".into(),
                    });
                }
                match Wire::decode(0, &bytes)? {
                    Wire::Trigger(id) => {
                        let fresh = !heard.contains_key(&id);
                        heard.entry(id).or_insert_with(|| Heard {
                            since: Instant::now(),
                        });
                        hooks.trigger(id);
                        if fresh {
                            for (task, name, from, state) in &finished {
                                if id >= *from {
                                    ack(id, *task, name, state, AckFigures::default())?;
                                }
                            }
                        }
                    }
                    Wire::Complete {
                        id,
                        duration,
                        alignment,
                        channel_state,
                    } => {
                        // What is older is subsumed by it.
                        heard.retain(|&h, _| h > id);
                        settled = settled.max(id);
                        hooks.complete(id);
                        // Durable before the coordinator said so: read for the figures
                        // and the listener (gone already only if a newer one completed).
                        let metadata = read_metadata(&place.store.checkpoint_dir(id)).ok();
                        stats.completed += 1;
                        stats.durations.push(duration);
                        stats.alignments.push(alignment);
                        stats.channel_state.push(channel_state);
                        stats
                            .sizes
                            .push(metadata.as_ref().map_or(0, CheckpointMetadata::state_bytes));
                        if let Some(metadata) = metadata {
                            hooks.completed(&metadata, alignment);
                        }
                    }
                    Wire::Abort { id, reason } => {
                        heard.remove(&id);
                        settled = settled.max(id);
                        // A subsumed checkpoint did not fail (the coordinator counts
                        // the same way).
                        if !reason.starts_with("subsumed by") {
                            stats.failed += 1;
                        }
                        hooks.abort(id, &reason);
                    }
                    Wire::Release => return Ok(stats),
                    other => {
                        return Err(CheckpointError::Link {
                            process: 0,
                            reason: format!("sent {other:?}, which only participants send"),
                        })
                    }
                }
            }
            Message::Stop { wait: false } => return Ok(stats),
            // Every task here ended: stay (acknowledging for the finished tasks) until
            // the coordinator releases the job.
            Message::Stop { wait: true } => send(Wire::Done),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::link::LocalLinks;
    use std::sync::{Arc, Mutex};

    /// What the job was told, in order.
    #[derive(Debug, Clone, PartialEq)]
    enum Told {
        Trigger(u64),
        Complete(u64, bool),
        Abort(u64),
    }

    struct Recorder {
        told: Arc<Mutex<Vec<Told>>>,
        events: Sender<Told>,
        store: CheckpointStore,
    }

    impl CheckpointHooks for Recorder {
        fn trigger(&mut self, id: u64) {
            self.told.lock().unwrap().push(Told::Trigger(id));
            let _ = self.events.send(Told::Trigger(id));
        }
        fn complete(&mut self, id: u64) {
            // Durable before the job hears of it.
            let durable = self.store.latest().is_ok_and(|r| r.metadata.id == id);
            self.told.lock().unwrap().push(Told::Complete(id, durable));
            let _ = self.events.send(Told::Complete(id, durable));
        }
        fn abort(&mut self, id: u64, _reason: &str) {
            self.told.lock().unwrap().push(Told::Abort(id));
            let _ = self.events.send(Told::Abort(id));
        }
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("weir-service-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// The watchdog of these tests: a hook call that does not come within it is a lost
    /// one, and fails the test (it is never what lets a test pass).
    const WATCHDOG: Duration = Duration::from_secs(20);

    fn start(
        dir: &std::path::Path,
        config: CheckpointConfig,
        tasks: usize,
    ) -> (CheckpointService, Receiver<Told>, Arc<Mutex<Vec<Told>>>) {
        let store = CheckpointStore::open(dir, 2).expect("store");
        let (events, rx) = mpsc::channel();
        let told = Arc::new(Mutex::new(Vec::new()));
        let hooks = Recorder {
            told: Arc::clone(&told),
            events,
            store: store.clone(),
        };
        let service = CheckpointService::start(config, store, "job-x".into(), tasks, 1, hooks)
            .expect("service");
        (service, rx, told)
    }

    /// Tasks on other threads acknowledge each trigger with their state; each checkpoint
    /// is written, completed and only then announced, and reads back whole.
    #[test]
    fn acknowledged_checkpoints_complete_on_disk_before_the_job_hears() {
        let dir = scratch("complete");
        let mut config = CheckpointConfig::every(Duration::from_millis(20));
        config.retain = 2;
        let (service, rx, _) = start(&dir, config, 3);
        let acks = service.acks();
        let mut completed = Vec::new();
        while completed.len() < 3 {
            match rx
                .recv_timeout(WATCHDOG)
                .expect("a hook call within the watchdog")
            {
                Told::Trigger(id) => {
                    let workers: Vec<_> = (0..3)
                        .map(|task| {
                            let acks = acks.clone();
                            std::thread::spawn(move || {
                                let state = format!("task {task} at {id}").into_bytes();
                                acks.acknowledge(
                                    id,
                                    task,
                                    &format!("t-{task}"),
                                    state,
                                    Duration::ZERO,
                                );
                            })
                        })
                        .collect();
                    workers.into_iter().for_each(|w| w.join().expect("task"));
                }
                Told::Complete(id, durable) => {
                    assert!(
                        durable,
                        "checkpoint {id} announced before its metadata was durable"
                    );
                    completed.push(id);
                }
                Told::Abort(id) => panic!("checkpoint {id} aborted"),
            }
        }
        let stats = service.stop().expect("stats");
        assert!(stats.completed >= 3);
        let restored = CheckpointStore::open(&dir, 2)
            .expect("store")
            .latest()
            .expect("latest");
        assert_eq!(restored.metadata.job, "job-x");
        let id = restored.metadata.id;
        assert_eq!(
            restored.states["t-2"],
            format!("task 2 at {id}").into_bytes()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A checkpoint some task never acknowledges expires; its files are discarded and the
    /// job is told; past the tolerated failures the service fails with the reason.
    #[test]
    fn an_unacknowledged_checkpoint_expires_and_too_many_fail_the_job() {
        let dir = scratch("expire");
        let config = CheckpointConfig {
            timeout: Duration::from_millis(50),
            tolerable_failures: 1,
            ..CheckpointConfig::every(Duration::from_millis(20))
        };
        let (service, rx, told) = start(&dir, config, 2);
        let acks = service.acks();
        let mut aborted = 0;
        while aborted < 2 {
            match rx
                .recv_timeout(WATCHDOG)
                .expect("a hook call within the watchdog")
            {
                // Only task 0 answers.
                Told::Trigger(id) => acks.acknowledge(id, 0, "t-0", vec![1, 2, 3], Duration::ZERO),
                Told::Abort(id) => {
                    aborted += 1;
                    assert!(
                        !dir.join(format!("chk-{id}")).exists(),
                        "checkpoint {id}'s files kept"
                    );
                }
                Told::Complete(id, _) => panic!("checkpoint {id} completed without task 1"),
            }
        }
        // The thread ends by itself with the failure.
        let deadline = Instant::now() + WATCHDOG;
        while !service.has_failed() {
            assert!(
                Instant::now() < deadline,
                "the service did not fail the job"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let error = service.stop().expect_err("too many failures");
        assert!(
            matches!(error, CheckpointError::TooManyFailures { failures: 2, .. }),
            "{error}"
        );
        assert!(error.to_string().contains("1 of 2 tasks"), "{error}");
        assert_eq!(
            told.lock()
                .unwrap()
                .iter()
                .filter(|t| matches!(t, Told::Complete(..)))
                .count(),
            0
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
    fn part(links: &LocalLinks, process: usize, processes: usize, restored: u64) -> ServicePart {
        ServicePart {
            process,
            processes,
            link: links.link(process),
            restored,
        }
    }

    /// One process of a job over several: its service, the hook calls it made, and
    /// its tasks' handle.
    struct Process {
        service: CheckpointService,
        rx: Receiver<Told>,
        told: Arc<Mutex<Vec<Told>>>,
    }

    fn start_process(
        dir: &std::path::Path,
        config: CheckpointConfig,
        tasks: usize,
        part: ServicePart,
    ) -> Process {
        let store = CheckpointStore::open(dir, 2).expect("store");
        let (events, rx) = mpsc::channel();
        let told = Arc::new(Mutex::new(Vec::new()));
        let hooks = Recorder {
            told: Arc::clone(&told),
            events,
            store: store.clone(),
        };
        let service = CheckpointService::start_part(
            config,
            store,
            "job-x".into(),
            tasks,
            1,
            hooks,
            Some(part),
        )
        .expect("service");
        Process { service, rx, told }
    }

    /// Process 1 of 2 whose coordinator went silent after a trigger: it acknowledges,
    /// hears nothing more, and after the checkpoint timeout fails the job saying what
    /// it waited for.
    #[test]
    fn a_participant_whose_coordinator_goes_silent_stops_after_the_timeout() {
        let dir = scratch("orphan");
        let config = CheckpointConfig {
            timeout: Duration::from_millis(300),
            ..CheckpointConfig::every(Duration::from_millis(10))
        };
        let links = LocalLinks::new(2);
        let p1 = start_process(&dir, config, 2, part(&links, 1, 2, 0));
        // Process 0 is the test: it triggers checkpoint 1, then says nothing.
        links.link(0).send(1, Wire::Trigger(1).encode());
        let started = Instant::now();
        match p1
            .rx
            .recv_timeout(WATCHDOG)
            .expect("a trigger within the watchdog")
        {
            Told::Trigger(1) => {}
            other => panic!("{other:?}"),
        }
        p1.service
            .acks()
            .acknowledge(1, 1, "t-1", vec![1], Duration::ZERO);
        while !p1.service.has_failed() {
            assert!(
                started.elapsed() < WATCHDOG,
                "the service did not fail the job"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(started.elapsed() >= Duration::from_millis(300));
        let error = p1.service.stop().expect_err("unsettled");
        assert!(
            matches!(error, CheckpointError::Unsettled { id: 1, .. }),
            "{error}"
        );
        assert!(error.to_string().contains("process 0"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Three processes, one task each: process 0 alone triggers, nothing before every
    /// process said hello, each checkpoint completes once all three tasks acknowledged
    /// and every process hears the same completions in the same order, durable first;
    /// the participants write their tasks' files and finished tasks acknowledge later
    /// checkpoints; at the end the coordinator stays until every process is done, then
    /// releases them all.
    #[test]
    fn one_coordinator_triggers_and_completes_every_process() {
        let dir = scratch("coordinated");
        let mut config = CheckpointConfig::every(Duration::from_millis(20));
        config.retain = 3;
        let links = LocalLinks::new(3);
        let p0 = start_process(&dir, config.clone(), 3, part(&links, 0, 3, 0));
        // Nothing is triggered while processes 1 and 2 are missing.
        assert!(
            p0.rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "a trigger before every process joined"
        );
        let p1 = start_process(&dir, config.clone(), 3, part(&links, 1, 3, 0));
        let p2 = start_process(&dir, config, 3, part(&links, 2, 3, 0));
        let processes = [&p0, &p1, &p2];
        // Process 2's task finishes after its first checkpoint: its state answers for
        // every later one.
        let mut completed = [Vec::new(), Vec::new(), Vec::new()];
        let mut finished = false;
        let started = Instant::now();
        while completed.iter().any(|c| c.len() < 4) {
            for (index, process) in processes.iter().enumerate() {
                while let Ok(told) = process.rx.try_recv() {
                    match told {
                        Told::Trigger(id) => {
                            if index == 2 && finished {
                                continue;
                            }
                            let state = format!("task {index} at {id}").into_bytes();
                            let acks = process.service.acks();
                            acks.acknowledge(
                                id,
                                index,
                                &format!("t-{index}"),
                                state,
                                Duration::ZERO,
                            );
                            if index == 2 && !finished {
                                finished = true;
                                acks.finished(2, "t-2", id + 1, b"final".to_vec());
                            }
                        }
                        Told::Complete(id, durable) => {
                            assert!(
                                durable,
                                "process {index} heard of {id} before it was durable"
                            );
                            completed[index].push(id);
                        }
                        Told::Abort(id) => panic!("checkpoint {id} aborted"),
                    }
                }
            }
            assert!(
                started.elapsed() < WATCHDOG,
                "four completions everywhere not within the watchdog: {completed:?}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let n = completed.iter().map(Vec::len).min().unwrap();
        assert_eq!(completed[0][..n], completed[1][..n]);
        assert_eq!(completed[0][..n], completed[2][..n]);
        // Only process 0 triggers: every process was told the same ids.
        let triggers = |p: &Process| -> Vec<u64> {
            p.told
                .lock()
                .unwrap()
                .iter()
                .filter_map(|t| match t {
                    Told::Trigger(id) => Some(*id),
                    _ => None,
                })
                .collect()
        };
        let t0 = triggers(&p0);
        assert!(t0.windows(2).all(|w| w[0] < w[1]), "{t0:?}");
        assert_eq!(t0[..3], triggers(&p1)[..3]);
        // The newest checkpoint holds every process's task, the finished one's final.
        let restored = CheckpointStore::open(&dir, 3)
            .expect("store")
            .latest()
            .expect("latest");
        let id = restored.metadata.id;
        assert_eq!(restored.states.len(), 3);
        assert_eq!(
            restored.states["t-1"],
            format!("task 1 at {id}").into_bytes()
        );
        assert_eq!(restored.states["t-2"], b"final".to_vec());
        // The end: process 0 stops first and waits; the others stop and are released.
        let stop0 = std::thread::spawn(move || p0.service.stop());
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !stop0.is_finished(),
            "the coordinator left before the others were done"
        );
        let stop1 = std::thread::spawn(move || p1.service.stop());
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !stop1.is_finished(),
            "released before every process was done"
        );
        let stats2 = p2.service.stop().expect("released");
        let stats1 = stop1.join().unwrap().expect("released");
        let stats0 = stop0.join().unwrap().expect("stops");
        assert!(stats0.completed >= 4 && stats1.completed >= 4 && stats2.completed >= 4);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A participant that restored another checkpoint than the coordinator, or runs a
    /// job of another size, fails the job naming the process and what differs; a
    /// participant lost fails the coordinator, the coordinator lost fails a participant.
    #[test]
    fn disagreeing_or_lost_processes_fail_the_job_by_name() {
        let config = CheckpointConfig::every(Duration::from_millis(20));
        let wait_failed = |service: &CheckpointService| {
            let deadline = Instant::now() + WATCHDOG;
            while !service.has_failed() {
                assert!(
                    Instant::now() < deadline,
                    "the service did not fail the job"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        // Another restore.
        let dir = scratch("disagree");
        let links = LocalLinks::new(2);
        let p0 = start_process(&dir, config.clone(), 2, part(&links, 0, 2, 0));
        let p1 = start_process(&dir, config.clone(), 2, part(&links, 1, 2, 4));
        wait_failed(&p0.service);
        let error = p0.service.stop().expect_err("refused").to_string();
        assert!(
            error.contains("process 1 restored checkpoint 4 where process 0 started fresh"),
            "{error}"
        );
        drop(p1);
        // Another job size.
        let links = LocalLinks::new(2);
        let p0 = start_process(&dir, config.clone(), 2, part(&links, 0, 2, 0));
        let p1 = start_process(&dir, config.clone(), 3, part(&links, 1, 2, 0));
        wait_failed(&p0.service);
        let error = p0.service.stop().expect_err("refused").to_string();
        assert!(error.contains("process 1 runs a job of 3 tasks"), "{error}");
        drop(p1);
        // A participant lost, then (in another job) the coordinator.
        let links = LocalLinks::new(2);
        let p0 = start_process(&dir, config.clone(), 2, part(&links, 0, 2, 0));
        let p1 = start_process(&dir, config.clone(), 2, part(&links, 1, 2, 0));
        links.lose(1, "connection reset");
        wait_failed(&p0.service);
        let error = p0.service.stop().expect_err("lost").to_string();
        assert!(
            error.contains("process 1 is lost (connection reset)"),
            "{error}"
        );
        drop(p1);
        let links = LocalLinks::new(2);
        let p0 = start_process(&dir, config.clone(), 2, part(&links, 0, 2, 0));
        let p1 = start_process(&dir, config, 2, part(&links, 1, 2, 0));
        links.lose(0, "closed by the peer");
        wait_failed(&p1.service);
        let error = p1.service.stop().expect_err("lost").to_string();
        assert!(
            error.contains("process 0 (the checkpoint coordinator) is lost"),
            "{error}"
        );
        drop(p0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
