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
//! reaches): each service writes its tasks' files and, when they all acknowledged, its
//! part of the metadata (`_metadata.p<process>`); process 0's service writes the
//! `_metadata` that makes the checkpoint complete once every process's part is there,
//! and the others see it appear; only then do their tasks hear of the completion. Each
//! process triggers on its own clock with the same ids; a barrier from another process
//! that reaches a task before this process triggered its checkpoint starts it here too
//! ([`Coordinator::adopt`]). Only process 0 removes checkpoint directories.
//!
//! Finished tasks (Flink's checkpoints after tasks finished): a task whose input ended
//! hands its final state to [`Acks::finished`] and leaves; the service acknowledges
//! every checkpoint it has not acknowledged yet, and every later one, with that state.
//! Downstream, a channel's end counts as every later barrier, so the snapshots still
//! agree: a bounded job's last records are committed by a checkpoint taken after its
//! sources ended.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::coordinator::{CheckpointConfig, CheckpointStats, Coordinator, Outcome};
use super::storage::{unix_ms, CheckpointMetadata, CheckpointStore};
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
        state: Vec<u8>,
        alignment: Duration,
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
    Stop,
}

/// The tasks' side of the service: cheap to clone, one per task.
#[derive(Clone)]
pub struct Acks {
    tx: Sender<Message>,
}

impl Acks {
    /// Task `task` (its state file named `name`) took its snapshot for checkpoint `id`
    /// after waiting `alignment` for its barriers. Returns at once: the state is written
    /// by the service's thread. Does nothing once the service stopped.
    pub fn acknowledge(
        &self,
        id: u64,
        task: usize,
        name: &str,
        state: Vec<u8>,
        alignment: Duration,
    ) {
        let _ = self.tx.send(Message::Ack {
            id,
            task,
            name: name.to_string(),
            state,
            alignment,
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

    /// [`start`](Self::start) for process `part.0` of a job over `part.1` processes
    /// (see the [module docs](self)); `None`: the whole job is here.
    pub fn start_part(
        config: CheckpointConfig,
        store: CheckpointStore,
        job: String,
        tasks: usize,
        first_id: u64,
        hooks: impl CheckpointHooks,
        part: Option<(usize, usize)>,
    ) -> Result<Self, CheckpointError> {
        let epoch = Instant::now();
        let coordinator = Coordinator::new(config, tasks, first_id, 0)?;
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("weir-checkpoints".into())
            .spawn(move || {
                let mut place = Place {
                    store,
                    job,
                    epoch,
                    part,
                    awaiting: std::collections::BTreeMap::new(),
                    timeout: coordinator.config().timeout,
                };
                run(coordinator, &mut place, hooks, rx)
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

    /// Whether the service ended by itself (too many failures, a disk error): then
    /// [`stop`](Self::stop) returns why, and the job must fail.
    pub fn has_failed(&self) -> bool {
        self.thread.as_ref().is_some_and(JoinHandle::is_finished)
    }

    /// Stops the service (pending checkpoints are left unfinished, as a crash would) and
    /// returns its figures, or why it failed.
    pub fn stop(mut self) -> Result<CheckpointStats, CheckpointError> {
        if let Some(acks) = self.acks.take() {
            let _ = acks.tx.send(Message::Stop);
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
            let _ = acks.tx.send(Message::Stop);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Where the service writes, and what it waits for.
struct Place {
    store: CheckpointStore,
    job: String,
    epoch: Instant,
    /// This process and the job's processes, for a job over several.
    part: Option<(usize, usize)>,
    /// Over several processes: checkpoints complete here, waiting for the others, with
    /// their longest alignment here and when they completed here.
    awaiting: std::collections::BTreeMap<u64, (Duration, Instant)>,
    /// How long a checkpoint may wait for the other processes (the checkpoint timeout).
    timeout: Duration,
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
) -> Result<CheckpointStats, CheckpointError> {
    // A panic here (a bug) must fail the job like any other end of the service: a job
    // whose checkpoints stopped would otherwise run on and never commit.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        serve(&mut coordinator, place, &mut hooks, rx)
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

/// How often a process of a job over several looks for the other processes' parts.
const PART_POLL: Duration = Duration::from_millis(2);

fn serve(
    coordinator: &mut Coordinator,
    place: &mut Place,
    hooks: &mut impl CheckpointHooks,
    rx: Receiver<Message>,
) -> Result<CheckpointStats, CheckpointError> {
    // Finished tasks and their final state.
    let mut finished: Vec<(usize, String, u64, Vec<u8>)> = Vec::new();
    loop {
        coordinator.hold(place.awaiting.len());
        match coordinator.poll(place.now()) {
            Ok(outcomes) => act(outcomes, place, hooks)?,
            Err(error) => return fail(error, coordinator, place, hooks),
        }
        settle(coordinator, place, hooks, &finished)?;
        settle_parts(place, hooks)?;
        coordinator.hold(place.awaiting.len());
        let mut wait = coordinator
            .next_deadline()
            .map_or(Duration::from_secs(3600), |at| {
                Duration::from_nanos(at.saturating_sub(place.now()))
            });
        if !place.awaiting.is_empty() {
            wait = wait.min(PART_POLL);
        }
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
                alignment,
            } => {
                if !coordinator.is_pending(id) {
                    // A checkpoint another process triggered first starts here too; an
                    // old one is over.
                    if !coordinator.adopt(id, place.now()) {
                        continue;
                    }
                    let outcomes = coordinator.take_outcomes();
                    act(outcomes, place, hooks)?;
                }
                // The asynchronous phase: the state reaches the disk here, not on the
                // task's worker.
                let file = place.store.write_task_state(id, &name, &state)?;
                coordinator.acknowledge(id, task, file, alignment, place.now());
            }
            Message::Decline { id, task, reason } => {
                if let Err(error) = coordinator.decline(id, task, reason) {
                    return fail(error, coordinator, place, hooks);
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
                    hooks.trigger(id);
                }
            }
            // The tasks' handles may outlive the service: it ends when told to.
            Message::Stop => return Ok(coordinator.stats().clone()),
        }
        let outcomes = coordinator.take_outcomes();
        act(outcomes, place, hooks)?;
        settle(coordinator, place, hooks, &finished)?;
    }
}

/// Acknowledges every pending checkpoint for the finished tasks, acting on what that
/// completes.
fn settle(
    coordinator: &mut Coordinator,
    place: &mut Place,
    hooks: &mut impl CheckpointHooks,
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
    act(outcomes, place, hooks)
}

/// Over several processes: completes what every process's part is written for
/// (process 0), or hears of what process 0 completed (the others).
fn settle_parts(
    place: &mut Place,
    hooks: &mut impl CheckpointHooks,
) -> Result<(), CheckpointError> {
    let Some((process, processes)) = place.part else {
        return Ok(());
    };
    if place.awaiting.is_empty() {
        return Ok(());
    }
    let mut done: Option<u64> = None;
    if process == 0 {
        for (&id, &(alignment, _)) in place.awaiting.iter().rev() {
            let mut parts = Vec::with_capacity(processes);
            for p in 0..processes {
                match place.store.read_part(id, p)? {
                    Some(part) => parts.push(part),
                    None => break,
                }
            }
            if parts.len() < processes {
                continue;
            }
            let mut metadata = parts[0].clone();
            for part in &parts[1..] {
                metadata.tasks.extend(part.tasks.iter().cloned());
                metadata.duration = metadata.duration.max(part.duration);
                metadata.triggered_unix_ms = metadata.triggered_unix_ms.min(part.triggered_unix_ms);
            }
            place.store.complete(&metadata)?;
            hooks.complete(id);
            hooks.completed(&metadata, alignment);
            done = Some(id);
            break;
        }
    } else if let Some(newest) = place.store.newest_complete()? {
        if place
            .awaiting
            .keys()
            .next()
            .is_some_and(|&oldest| oldest <= newest)
        {
            hooks.complete(newest);
            done = Some(newest);
        }
    }
    if let Some(done) = done {
        // What is older is subsumed by the checkpoint completed.
        place.awaiting.retain(|&id, _| id > done);
    }
    // A checkpoint that waited the checkpoint timeout for the other processes: one of
    // them (process 0, which completes checkpoints, or a process whose part never
    // came) is gone or stalled. The job fails rather than run on without checkpoints.
    if let Some((&id, &(_, since))) = place.awaiting.iter().next() {
        if since.elapsed() >= place.timeout {
            return Err(CheckpointError::Unsettled {
                id,
                after: place.timeout,
                waiting_for: if process == 0 {
                    format!("the parts of the other {} processes", processes - 1)
                } else {
                    "process 0 to complete it".to_string()
                },
            });
        }
    }
    Ok(())
}

/// The job fails with `error`: the aborts that came with it reach the job first.
fn fail(
    error: CheckpointError,
    coordinator: &mut Coordinator,
    place: &mut Place,
    hooks: &mut impl CheckpointHooks,
) -> Result<CheckpointStats, CheckpointError> {
    act(coordinator.take_outcomes(), place, hooks)?;
    Err(error)
}

fn act(
    outcomes: Vec<Outcome>,
    place: &mut Place,
    hooks: &mut impl CheckpointHooks,
) -> Result<(), CheckpointError> {
    for outcome in outcomes {
        match outcome {
            Outcome::Trigger(id) => hooks.trigger(id),
            Outcome::Abort { id, reason } => {
                // Over several processes, only process 0 removes directories (when it
                // completes a newer checkpoint): another process may still write here.
                if place.part.is_none() {
                    place.store.discard(id)?;
                }
                hooks.abort(id, &reason);
            }
            Outcome::Complete {
                id,
                triggered_ns,
                duration,
                tasks,
                alignment,
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
                match place.part {
                    None => {
                        place.store.complete(&metadata)?;
                        hooks.complete(id);
                        hooks.completed(&metadata, alignment);
                    }
                    Some((process, _)) => {
                        place.store.complete_part(&metadata, process)?;
                        place.awaiting.insert(id, (alignment, Instant::now()));
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
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
    /// Process 1 of 2 whose process 0 is gone: its part of the first checkpoint is
    /// written, nothing completes it, no second checkpoint is triggered meanwhile (one
    /// unfinished at most on disk), and after the checkpoint timeout the service fails
    /// the job saying what it waited for.
    #[test]
    fn a_process_whose_coordinator_is_gone_stops_after_the_timeout() {
        let dir = scratch("orphan");
        let config = CheckpointConfig {
            timeout: Duration::from_millis(300),
            ..CheckpointConfig::every(Duration::from_millis(10))
        };
        let store = CheckpointStore::open(&dir, 1).expect("store");
        let (events, rx) = mpsc::channel();
        let hooks = Recorder {
            told: Arc::default(),
            events,
            store: store.clone(),
        };
        let service =
            CheckpointService::start_part(config, store, "job-x".into(), 1, 1, hooks, Some((1, 2)))
                .expect("service");
        let acks = service.acks();
        let mut triggered = Vec::new();
        let started = Instant::now();
        while !service.has_failed() {
            assert!(
                started.elapsed() < WATCHDOG,
                "the service did not fail the job"
            );
            if let Ok(Told::Trigger(id)) = rx.recv_timeout(Duration::from_millis(5)) {
                triggered.push(id);
                acks.acknowledge(id, 0, "t-0", vec![1], Duration::ZERO);
            }
        }
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(triggered, [1], "a checkpoint triggered while one was held");
        let dirs = std::fs::read_dir(&dir).expect("dir").count();
        assert_eq!(dirs, 1, "more than one unfinished checkpoint on disk");
        let error = service.stop().expect_err("unsettled");
        assert!(
            matches!(error, CheckpointError::Unsettled { id: 1, .. }),
            "{error}"
        );
        assert!(error.to_string().contains("process 0"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
