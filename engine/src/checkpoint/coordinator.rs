//! The checkpoint coordinator (Flink's `CheckpointCoordinator`): when to trigger, what
//! completes a checkpoint, when it expires, and when failures fail the job.
//!
//! It is a state machine over its caller's clock (ns of a monotonic clock): the caller
//! asks [`Coordinator::poll`] on every turn what to do now (trigger checkpoint `n`,
//! expire one), hands it each task's acknowledgement or refusal, and is told when a
//! checkpoint is complete, so that it can write the metadata and notify the tasks
//! (`notify_checkpoint_complete`). One thread drives it: it holds no locks and no
//! atomics.
//!
//! Rules, as Flink's:
//! - a checkpoint is triggered every `interval` after the previous trigger, never more
//!   than `max_concurrent` pending at once, and not before `min_pause` has passed since
//!   the last one completed;
//! - it completes when every task has acknowledged it; a completed checkpoint subsumes
//!   the older ones still pending (they are aborted: a restore would never pick them);
//! - it fails when a task declines it or when `timeout` passes first; more than
//!   `tolerable_failures` failures in a row fail the job. A completed checkpoint resets
//!   the count.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{CheckpointError, TaskFile};

/// How a job checkpoints.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointConfig {
    /// Between two triggers (Flink's `execution.checkpointing.interval`).
    pub interval: Duration,
    /// A checkpoint not complete after this fails (Flink's default: 10 minutes).
    pub timeout: Duration,
    /// At least this long after a checkpoint completed before the next is triggered.
    pub min_pause: Duration,
    /// Checkpoints pending at once (Flink's default: 1).
    pub max_concurrent: usize,
    /// Failed checkpoints in a row a job survives (Flink's default: 0).
    pub tolerable_failures: u32,
    /// Completed checkpoints kept on disk (Flink's default: 1).
    pub retain: usize,
}

impl CheckpointConfig {
    /// Checkpoints every `interval`, with Flink's defaults for the rest.
    pub fn every(interval: Duration) -> Self {
        CheckpointConfig {
            interval,
            timeout: Duration::from_secs(600),
            min_pause: Duration::ZERO,
            max_concurrent: 1,
            tolerable_failures: 0,
            retain: 1,
        }
    }

    /// Refuses settings that cannot work, saying which.
    pub fn validate(&self) -> Result<(), CheckpointError> {
        if self.interval < Duration::from_millis(10) {
            return Err(CheckpointError::Config(format!(
                "the checkpoint interval of {:?} is below the minimum of 10 ms",
                self.interval
            )));
        }
        if self.timeout.is_zero() {
            return Err(CheckpointError::Config(
                "the checkpoint timeout must be above 0 (the default is 10 min)".into(),
            ));
        }
        if self.max_concurrent == 0 {
            return Err(CheckpointError::Config(
                "checkpoints pending at once must be at least 1 (the default is 1)".into(),
            ));
        }
        if self.retain == 0 {
            return Err(CheckpointError::Config(
                "checkpoints to retain must be at least 1 (the default is 1)".into(),
            ));
        }
        Ok(())
    }
}

/// What the coordinator's caller must do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Inject barrier `id` at every source.
    Trigger(u64),
    /// Every task acknowledged checkpoint `id`: write its metadata, then notify the
    /// tasks. Its task files and the time it took come with it.
    Complete {
        /// The checkpoint.
        id: u64,
        /// When it was triggered, by the caller's clock.
        triggered_ns: u64,
        /// From trigger to the last acknowledgement.
        duration: Duration,
        /// Every task's state file, in task order.
        tasks: Vec<TaskFile>,
        /// The longest alignment a task reported.
        alignment: Duration,
        /// Bytes of channel state (data in flight) over every task's snapshot.
        channel_state: u64,
    },
    /// Checkpoint `id` failed (expired, declined or subsumed): discard its files and
    /// tell the tasks to drop what they hold for it.
    Abort {
        /// The checkpoint.
        id: u64,
        /// Why.
        reason: String,
    },
}

/// Figures of a run's checkpoints.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CheckpointStats {
    /// Checkpoints completed.
    pub completed: u64,
    /// Checkpoints failed (expired or declined; not those subsumed).
    pub failed: u64,
    /// Duration of each completed checkpoint, trigger to last acknowledgement.
    pub durations: Vec<Duration>,
    /// Longest alignment of each completed checkpoint.
    pub alignments: Vec<Duration>,
    /// Bytes of state of each completed checkpoint.
    pub sizes: Vec<u64>,
    /// Bytes of channel state (the data in flight an unaligned checkpoint stores) of
    /// each completed checkpoint, over every task.
    pub channel_state: Vec<u64>,
}

/// What a task reports with its acknowledgement, for the checkpoint's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AckFigures {
    /// How long the task waited for its barriers to align.
    pub alignment: Duration,
    /// Bytes of channel state in its snapshot.
    pub channel_state: u64,
}

impl From<Duration> for AckFigures {
    /// An alignment, without channel state.
    fn from(alignment: Duration) -> Self {
        AckFigures {
            alignment,
            channel_state: 0,
        }
    }
}

/// A checkpoint waiting for its acknowledgements.
#[derive(Debug)]
struct Pending {
    triggered_ns: u64,
    tasks: Vec<Option<TaskFile>>,
    acknowledged: usize,
    alignment: Duration,
    channel_state: u64,
}

/// See the [module docs](self).
#[derive(Debug)]
pub struct Coordinator {
    config: CheckpointConfig,
    tasks: usize,
    next_id: u64,
    next_trigger_ns: u64,
    last_completed_ns: Option<u64>,
    pending: BTreeMap<u64, Pending>,
    /// Checkpoints the caller counts as in flight besides the pending ones.
    held: usize,
    failures_in_a_row: u32,
    stats: CheckpointStats,
    outcomes: Vec<Outcome>,
}

impl Coordinator {
    /// A coordinator for a job of `tasks` tasks, whose first checkpoint is `first_id`
    /// (one past the checkpoint it restored from, or 1), triggered `interval` after
    /// `now_ns`.
    pub fn new(
        config: CheckpointConfig,
        tasks: usize,
        first_id: u64,
        now_ns: u64,
    ) -> Result<Self, CheckpointError> {
        config.validate()?;
        if tasks == 0 {
            return Err(CheckpointError::Config(
                "a checkpointed job needs at least one task".into(),
            ));
        }
        let next_trigger_ns = now_ns + config.interval.as_nanos() as u64;
        Ok(Coordinator {
            config,
            tasks,
            next_id: first_id.max(1),
            next_trigger_ns,
            last_completed_ns: None,
            pending: BTreeMap::new(),
            held: 0,
            failures_in_a_row: 0,
            stats: CheckpointStats::default(),
            outcomes: Vec::new(),
        })
    }

    /// The settings.
    pub fn config(&self) -> &CheckpointConfig {
        &self.config
    }

    /// The figures so far.
    pub fn stats(&self) -> &CheckpointStats {
        &self.stats
    }

    /// Checkpoints pending now.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Whether checkpoint `id` is pending (triggered, neither complete nor failed).
    pub fn is_pending(&self, id: u64) -> bool {
        self.pending.contains_key(&id)
    }

    /// The checkpoints pending now, oldest first.
    pub fn pending_ids(&self) -> Vec<u64> {
        self.pending.keys().copied().collect()
    }

    /// Whether task `task` acknowledged pending checkpoint `id`.
    pub fn has_acknowledged(&self, id: u64, task: usize) -> bool {
        self.pending
            .get(&id)
            .and_then(|p| p.tasks.get(task))
            .is_some_and(Option::is_some)
    }

    /// `held` more checkpoints count as in flight until the next call (a caller that
    /// must not trigger yet, such as a coordinator waiting for the processes of its job
    /// to join, holds `max_concurrent`).
    pub fn hold(&mut self, held: usize) {
        self.held = held;
    }

    fn in_flight(&self) -> usize {
        self.pending.len() + self.held
    }

    /// The next id to be triggered.
    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// What to do at `now_ns`: expired checkpoints to abort, a checkpoint to trigger
    /// (both in that order), and what acknowledgements completed since the last call.
    /// Fails the job when more checkpoints failed in a row than it tolerates.
    pub fn poll(&mut self, now_ns: u64) -> Result<Vec<Outcome>, CheckpointError> {
        let timeout_ns = self.config.timeout.as_nanos() as u64;
        let expired: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| now_ns >= p.triggered_ns + timeout_ns)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            let pending = self.pending.remove(&id).expect("listed");
            let error = CheckpointError::Expired {
                id,
                after: self.config.timeout,
                acknowledged: pending.acknowledged,
                tasks: self.tasks,
            };
            self.fail(id, error)?;
        }
        if let Some(id) = self.due(now_ns) {
            self.start(id, now_ns);
        }
        Ok(std::mem::take(&mut self.outcomes))
    }

    /// Triggers a checkpoint now, outside the interval (Flink's on-demand trigger), if
    /// fewer than `max_concurrent` are pending; returns its id.
    pub fn trigger_now(&mut self, now_ns: u64) -> Option<u64> {
        if self.in_flight() >= self.config.max_concurrent {
            return None;
        }
        let id = self.next_id;
        self.start(id, now_ns);
        self.outcomes.retain(|o| *o != Outcome::Trigger(id));
        Some(id)
    }

    /// When the next checkpoint may be triggered, by the caller's clock: the time to
    /// wake up for it.
    pub fn next_deadline(&self) -> Option<u64> {
        let timeout_ns = self.config.timeout.as_nanos() as u64;
        let expiry = self
            .pending
            .values()
            .map(|p| p.triggered_ns + timeout_ns)
            .min();
        let trigger = (self.in_flight() < self.config.max_concurrent).then(|| self.trigger_at());
        match (expiry, trigger) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn trigger_at(&self) -> u64 {
        let pause = self
            .last_completed_ns
            .map_or(0, |at| at + self.config.min_pause.as_nanos() as u64);
        self.next_trigger_ns.max(pause)
    }

    fn due(&self, now_ns: u64) -> Option<u64> {
        (self.in_flight() < self.config.max_concurrent && now_ns >= self.trigger_at())
            .then_some(self.next_id)
    }

    fn start(&mut self, id: u64, now_ns: u64) {
        self.next_id = id + 1;
        self.next_trigger_ns = now_ns + self.config.interval.as_nanos() as u64;
        self.pending.insert(
            id,
            Pending {
                triggered_ns: now_ns,
                tasks: vec![None; self.tasks],
                acknowledged: 0,
                alignment: Duration::ZERO,
                channel_state: 0,
            },
        );
        self.outcomes.push(Outcome::Trigger(id));
    }

    /// Task `task` took its snapshot for checkpoint `id` (its state file, written, and
    /// its figures: how long it waited for its barriers to align, the channel state it
    /// stored). An acknowledgement for a
    /// checkpoint no longer pending (expired, aborted, subsumed) is ignored, as Flink
    /// ignores late ones; a second one from the same task too. Returns whether it
    /// completed the checkpoint (the [`Outcome::Complete`] comes from the next
    /// [`poll`](Self::poll), or at once from [`take_outcomes`](Self::take_outcomes)).
    pub fn acknowledge(
        &mut self,
        id: u64,
        task: usize,
        file: TaskFile,
        figures: impl Into<AckFigures>,
        now_ns: u64,
    ) -> bool {
        let figures = figures.into();
        let Some(pending) = self.pending.get_mut(&id) else {
            return false;
        };
        let Some(slot) = pending.tasks.get_mut(task) else {
            return false;
        };
        if slot.is_some() {
            return false;
        }
        *slot = Some(file);
        pending.acknowledged += 1;
        pending.alignment = pending.alignment.max(figures.alignment);
        pending.channel_state += figures.channel_state;
        if pending.acknowledged < self.tasks {
            return false;
        }
        let pending = self.pending.remove(&id).expect("present");
        // Older pending checkpoints are subsumed: a restore takes this one.
        let older: Vec<u64> = self.pending.range(..id).map(|(id, _)| *id).collect();
        for old in older {
            self.pending.remove(&old);
            self.outcomes.push(Outcome::Abort {
                id: old,
                reason: format!("subsumed by checkpoint {id}"),
            });
        }
        let duration = Duration::from_nanos(now_ns.saturating_sub(pending.triggered_ns));
        let tasks: Vec<TaskFile> = pending.tasks.into_iter().flatten().collect();
        self.stats.completed += 1;
        self.stats.durations.push(duration);
        self.stats.alignments.push(pending.alignment);
        self.stats.sizes.push(tasks.iter().map(|t| t.size).sum());
        self.stats.channel_state.push(pending.channel_state);
        self.failures_in_a_row = 0;
        self.last_completed_ns = Some(now_ns);
        self.outcomes.push(Outcome::Complete {
            id,
            triggered_ns: pending.triggered_ns,
            duration,
            tasks,
            alignment: pending.alignment,
            channel_state: pending.channel_state,
        });
        true
    }

    /// Task `task` could not snapshot checkpoint `id`: the checkpoint fails. Fails the
    /// job when more checkpoints failed in a row than it tolerates.
    pub fn decline(&mut self, id: u64, task: usize, reason: String) -> Result<(), CheckpointError> {
        if self.pending.remove(&id).is_none() {
            return Ok(());
        }
        self.fail(id, CheckpointError::Declined { id, task, reason })
    }

    /// The outcomes since the last [`poll`](Self::poll), without polling.
    pub fn take_outcomes(&mut self) -> Vec<Outcome> {
        std::mem::take(&mut self.outcomes)
    }

    fn fail(&mut self, id: u64, error: CheckpointError) -> Result<(), CheckpointError> {
        self.stats.failed += 1;
        self.failures_in_a_row += 1;
        let reason = error.to_string();
        self.outcomes.push(Outcome::Abort {
            id,
            reason: reason.clone(),
        });
        if self.failures_in_a_row > self.config.tolerable_failures {
            return Err(CheckpointError::TooManyFailures {
                failures: self.failures_in_a_row,
                tolerable: self.config.tolerable_failures,
                last: reason,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn file(task: usize) -> TaskFile {
        TaskFile {
            name: format!("t-{task}"),
            size: 10 + task as u64,
            crc: 0,
        }
    }

    fn config(interval_ms: u64) -> CheckpointConfig {
        CheckpointConfig {
            timeout: Duration::from_millis(1000),
            ..CheckpointConfig::every(Duration::from_millis(interval_ms))
        }
    }

    fn ack_all(c: &mut Coordinator, id: u64, tasks: usize, now: u64) -> bool {
        (0..tasks).fold(false, |done, t| {
            done | c.acknowledge(id, t, file(t), Duration::from_micros(t as u64), now)
        })
    }

    #[test]
    fn a_checkpoint_completes_only_when_every_task_acknowledged() {
        let mut c = Coordinator::new(config(100), 3, 1, 0).expect("coordinator");
        assert!(c.poll(99 * MS).expect("poll").is_empty());
        assert_eq!(c.poll(100 * MS).expect("poll"), [Outcome::Trigger(1)]);
        assert!(!c.acknowledge(1, 0, file(0), Duration::ZERO, 110 * MS));
        assert!(!c.acknowledge(1, 2, file(2), Duration::from_millis(4), 120 * MS));
        // A second acknowledgement from a task changes nothing.
        assert!(!c.acknowledge(1, 2, file(2), Duration::ZERO, 121 * MS));
        assert!(c.acknowledge(1, 1, file(1), Duration::from_millis(2), 130 * MS));
        let outcomes = c.take_outcomes();
        let Outcome::Complete {
            id,
            duration,
            tasks,
            alignment,
            ..
        } = &outcomes[0]
        else {
            panic!("{outcomes:?}")
        };
        assert_eq!(*id, 1);
        assert_eq!(*duration, Duration::from_millis(30));
        assert_eq!(*alignment, Duration::from_millis(4));
        assert_eq!(tasks, &[file(0), file(1), file(2)]);
        assert_eq!(c.stats().completed, 1);
        assert_eq!(c.stats().sizes, [33]);
    }

    #[test]
    fn at_most_max_concurrent_are_pending_and_min_pause_is_kept() {
        let mut c = Coordinator::new(
            CheckpointConfig {
                min_pause: Duration::from_millis(50),
                ..config(100)
            },
            1,
            1,
            0,
        )
        .expect("coordinator");
        assert_eq!(c.poll(100 * MS).expect("poll"), [Outcome::Trigger(1)]);
        // Checkpoint 1 is still pending at the next interval: nothing is triggered.
        assert!(c.poll(200 * MS).expect("poll").is_empty());
        assert_eq!(c.trigger_now(210 * MS), None);
        assert!(ack_all(&mut c, 1, 1, 250 * MS));
        c.take_outcomes();
        // The interval has passed, but not the pause after the completion.
        assert!(c.poll(260 * MS).expect("poll").is_empty());
        assert_eq!(c.next_deadline(), Some(300 * MS));
        assert_eq!(c.poll(300 * MS).expect("poll"), [Outcome::Trigger(2)]);
    }

    /// Checkpoints complete here but waiting for other processes count as in flight:
    /// no trigger while they are held, and `trigger_now` refuses too.
    #[test]
    fn held_checkpoints_count_against_max_concurrent() {
        let mut c = Coordinator::new(config(100), 1, 1, 0).expect("coordinator");
        assert_eq!(c.poll(100 * MS).expect("poll"), [Outcome::Trigger(1)]);
        assert!(c.acknowledge(1, 0, file(0), Duration::ZERO, 110 * MS));
        assert!(matches!(
            c.take_outcomes()[..],
            [Outcome::Complete { id: 1, .. }]
        ));
        c.hold(1);
        assert!(c.poll(10_000 * MS).expect("poll").is_empty());
        assert_eq!(c.trigger_now(10_000 * MS), None);
        assert_eq!(c.next_deadline(), None);
        c.hold(0);
        assert_eq!(c.poll(10_001 * MS).expect("poll"), [Outcome::Trigger(2)]);
    }

    #[test]
    fn a_completed_checkpoint_subsumes_older_pending_ones() {
        let mut c = Coordinator::new(
            CheckpointConfig {
                max_concurrent: 3,
                ..config(100)
            },
            2,
            5,
            0,
        )
        .expect("coordinator");
        assert_eq!(c.poll(100 * MS).expect("poll"), [Outcome::Trigger(5)]);
        assert_eq!(c.poll(200 * MS).expect("poll"), [Outcome::Trigger(6)]);
        assert!(ack_all(&mut c, 6, 2, 250 * MS));
        let outcomes = c.take_outcomes();
        assert_eq!(
            outcomes[0],
            Outcome::Abort {
                id: 5,
                reason: "subsumed by checkpoint 6".into()
            }
        );
        assert!(matches!(outcomes[1], Outcome::Complete { id: 6, .. }));
        // A late acknowledgement of the subsumed one is ignored.
        assert!(!c.acknowledge(5, 0, file(0), Duration::ZERO, 260 * MS));
        assert_eq!(c.stats().failed, 0);
    }

    #[test]
    fn a_checkpoint_expires_at_its_timeout_and_failures_fail_the_job() {
        let mut c = Coordinator::new(
            CheckpointConfig {
                tolerable_failures: 1,
                ..config(100)
            },
            2,
            1,
            0,
        )
        .expect("coordinator");
        assert_eq!(c.poll(100 * MS).expect("poll"), [Outcome::Trigger(1)]);
        c.acknowledge(1, 0, file(0), Duration::ZERO, 150 * MS);
        // Expired at 1100 ms; the next is triggered in the same poll.
        let outcomes = c.poll(1100 * MS).expect("one failure is tolerated");
        assert!(
            matches!(&outcomes[0], Outcome::Abort { id: 1, reason } if reason.contains("1 of 2 tasks")),
            "{outcomes:?}"
        );
        assert_eq!(outcomes[1], Outcome::Trigger(2));
        assert!(!c.acknowledge(1, 1, file(1), Duration::ZERO, 1101 * MS));
        // A second failure in a row is one too many.
        let err = c
            .decline(2, 1, "its disk is full".into())
            .expect_err("fails the job");
        assert!(err.to_string().contains("its disk is full"), "{err}");
        assert_eq!(c.stats().failed, 2);
    }

    #[test]
    fn a_completed_checkpoint_resets_the_failures_in_a_row() {
        let mut c = Coordinator::new(
            CheckpointConfig {
                tolerable_failures: 1,
                ..config(100)
            },
            1,
            1,
            0,
        )
        .expect("coordinator");
        for round in 0..4u64 {
            let t = (round * 2 + 1) * 100 * MS;
            let [Outcome::Trigger(failed)] = c.poll(t).expect("poll")[..] else {
                panic!()
            };
            c.decline(failed, 0, "no".into()).expect("one tolerated");
            c.take_outcomes();
            let [Outcome::Trigger(ok)] = c.poll(t + 100 * MS).expect("poll")[..] else {
                panic!()
            };
            assert!(ack_all(&mut c, ok, 1, t + 150 * MS));
            c.take_outcomes();
        }
        assert_eq!(c.stats().completed, 4);
        assert_eq!(c.stats().failed, 4);
    }

    #[test]
    fn bad_settings_are_refused() {
        for bad in [
            CheckpointConfig::every(Duration::from_millis(1)),
            CheckpointConfig {
                max_concurrent: 0,
                ..config(100)
            },
            CheckpointConfig {
                timeout: Duration::ZERO,
                ..config(100)
            },
            CheckpointConfig {
                retain: 0,
                ..config(100)
            },
        ] {
            assert!(
                matches!(
                    Coordinator::new(bad.clone(), 1, 1, 0),
                    Err(CheckpointError::Config(_))
                ),
                "{bad:?}"
            );
        }
        assert!(Coordinator::new(config(100), 0, 1, 0).is_err());
    }
}
