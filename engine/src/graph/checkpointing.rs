//! A graph's checkpoints: the settings ([`Checkpointing`]), the checkpoint service a
//! run starts with them, what a restored run reads back, and the report.
//!
//! Each subtask's task is one entry of the coordinator and one state file per
//! checkpoint, named `s<stage>-<subtask>-of-<parallelism>`; its file holds the state of
//! every stateful link of its chain by position (see `chain::Snapshot`). A restore reads
//! the checkpoint whole (the newest valid one under a directory, or the one named), and
//! every task takes its own sections back; keyed state is taken from every subtask's
//! file of its stage, so that a stage may be restored at another parallelism (its key
//! groups redistributed). Other state (a source's position, an async operator's held
//! elements, a sink's transactions, channel state) belongs to one subtask: restoring
//! it at another parallelism is refused, naming the stage.
//!
//! A graph over several processes ([`Graph::with_cluster`](super::Graph::with_cluster))
//! checkpoints into one directory that every process reaches at the same path (a shared
//! filesystem across hosts): process 0's service is the job's one coordinator, which
//! triggers, completes and aborts every checkpoint in every process over the cluster's
//! [`CheckpointLink`](crate::checkpoint::CheckpointLink); each process's service writes
//! its own tasks' files (see [`service`](crate::checkpoint::service)). Every process
//! restores the same checkpoint (the coordinator refuses to start otherwise). Before a
//! restore, process 0 must remove what
//! the crashed run left unfinished
//! ([`CheckpointStore::discard_unfinished`](crate::checkpoint::CheckpointStore::discard_unfinished))
//! before its transport starts, which no other process's run can pass.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::checkpoint::storage::{read_checkpoint, restore_point, CheckpointMetadata, METADATA};
use crate::checkpoint::{
    AlignmentMode, CheckpointConfig, CheckpointError, CheckpointHooks, CheckpointStats,
};
use crate::park::Unparker;
use crate::runtime::{Controller, TaskError};

use super::chain::{CheckpointSignals, Snapshot};

/// Called with each completed checkpoint's metadata and longest alignment (e.g. to
/// print a progress line).
pub type CheckpointListener = Arc<dyn Fn(&CheckpointMetadata, Duration) + Send + Sync>;

/// Told of each checkpoint that failed or was aborted, with its id and why.
pub type AbortListener = Arc<dyn Fn(u64, &str) + Send + Sync>;

/// How a graph checkpoints; see [`Graph::with_checkpointing`](super::Graph::with_checkpointing).
///
/// ```
/// use std::time::Duration;
/// use weir_engine::checkpoint::AlignmentMode;
/// use weir_engine::graph::{Checkpointing, Graph};
/// use weir_engine::runtime::{Cores, Runtime};
///
/// // Unaligned checkpoints every 20 ms into a directory of its own.
/// let dir = std::env::temp_dir().join(format!("weir-doc-checkpointing-{}", std::process::id()));
/// let checkpointing = Checkpointing::new(&dir, Duration::from_millis(20))
///     .with_alignment(AlignmentMode::Unaligned);
/// let graph = Graph::new().with_parallelism(2).with_checkpointing(checkpointing);
/// let count = graph.from_generator(200_000, None, |n| n).rebalance().count();
/// graph.execute(Runtime::builder().cores(Cores::Count(2)).pin(false).build()?)?;
/// assert_eq!(count.records(), 200_000);
/// std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Checkpointing {
    /// Interval, timeout, pause, concurrency, tolerated failures, retention.
    pub config: CheckpointConfig,
    /// Where checkpoints are written (`chk-<id>/` directories).
    pub dir: PathBuf,
    /// How tasks with several input channels align barriers.
    pub alignment: AlignmentMode,
    /// Restore from this checkpoint (a `chk-<id>` directory), or from the newest
    /// completed one under this directory: a fresh start where none ever completed
    /// there, an error where it cannot be read back whole (see
    /// [`restore_point`](crate::checkpoint::storage::restore_point)).
    pub restore: Option<PathBuf>,
    /// Told of each completed checkpoint.
    pub listener: Option<CheckpointListener>,
    /// Told of each checkpoint that failed or was aborted.
    pub abort_listener: Option<AbortListener>,
}

impl core::fmt::Debug for Checkpointing {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Checkpointing")
            .field("config", &self.config)
            .field("dir", &self.dir)
            .field("alignment", &self.alignment)
            .field("restore", &self.restore)
            .finish_non_exhaustive()
    }
}

impl Checkpointing {
    /// Aligned checkpoints every `interval` into `dir`, Flink's defaults otherwise.
    pub fn new(dir: impl Into<PathBuf>, interval: Duration) -> Self {
        Checkpointing {
            config: CheckpointConfig::every(interval),
            dir: dir.into(),
            alignment: AlignmentMode::Aligned,
            restore: None,
            listener: None,
            abort_listener: None,
        }
    }

    /// Restores from `path`: a checkpoint's own directory (`chk-<id>`, exactly that
    /// one), or a directory of checkpoints, where the newest completed one is taken and
    /// must read back whole; a fresh start if none ever completed there (see
    /// [`restore_point`](crate::checkpoint::storage::restore_point)).
    pub fn restore_from(mut self, path: impl Into<PathBuf>) -> Self {
        self.restore = Some(path.into());
        self
    }

    /// Barrier alignment.
    pub fn with_alignment(mut self, alignment: AlignmentMode) -> Self {
        self.alignment = alignment;
        self
    }

    /// Calls `listener` with each completed checkpoint.
    pub fn with_listener(
        mut self,
        listener: impl Fn(&CheckpointMetadata, Duration) + Send + Sync + 'static,
    ) -> Self {
        self.listener = Some(Arc::new(listener));
        self
    }

    /// Calls `listener` with each checkpoint that failed or was aborted (a task
    /// declined it, it timed out, a write failed), with why.
    pub fn with_abort_listener(
        mut self,
        listener: impl Fn(u64, &str) + Send + Sync + 'static,
    ) -> Self {
        self.abort_listener = Some(Arc::new(listener));
        self
    }
}

/// What a run restored from.
#[derive(Debug, Clone)]
pub struct RestoredFrom {
    /// The checkpoint's id.
    pub id: u64,
    /// Its directory.
    pub path: PathBuf,
    /// Newer checkpoints passed over, and why.
    pub skipped: Vec<(PathBuf, String)>,
    /// Reading and checking it.
    pub read_time: Duration,
}

/// A run's checkpoints.
#[derive(Debug, Clone, Default)]
pub struct CheckpointReport {
    /// Completed, failed, durations, alignments, sizes.
    pub stats: CheckpointStats,
    /// The checkpoint the run started from.
    pub restored: Option<RestoredFrom>,
}

/// The name of a subtask's state file.
pub(crate) fn task_file_name(stage: usize, index: usize, parallelism: usize) -> String {
    format!("s{stage}-{index}-of-{parallelism}")
}

fn parse_task_file_name(name: &str) -> Option<(usize, usize, usize)> {
    let rest = name.strip_prefix('s')?;
    let (stage, rest) = rest.split_once('-')?;
    let (index, parallelism) = rest.split_once("-of-")?;
    Some((
        stage.parse().ok()?,
        index.parse().ok()?,
        parallelism.parse().ok()?,
    ))
}

/// A checkpoint read back for a run: every task's sections.
#[derive(Debug, Default)]
pub(crate) struct RestorePlan {
    pub(crate) id: u64,
    /// By stage: its parallelism in the checkpoint and each subtask's snapshot.
    stages: BTreeMap<usize, (usize, BTreeMap<usize, Snapshot>)>,
    /// Stage names (for errors).
    names: Vec<String>,
}

impl RestorePlan {
    /// Reads the checkpoint at `path` (see [`Checkpointing::restore`]) for the job
    /// `job`, whose stages are named `names`; `None` where `path` is a directory in
    /// which no checkpoint ever completed (a fresh start).
    pub(crate) fn read(
        path: &Path,
        job: &str,
        names: Vec<String>,
    ) -> Result<Option<(Self, RestoredFrom)>, CheckpointError> {
        let started = Instant::now();
        let restored = if path.join(METADATA).exists() {
            read_checkpoint(path)?
        } else if crate::checkpoint::storage::checkpoint_id(path).is_some() && path.is_dir() {
            // A checkpoint's own directory named explicitly: that one, or why not.
            read_checkpoint(path)?
        } else {
            match restore_point(path)? {
                Some(restored) => restored,
                None => return Ok(None),
            }
        };
        if restored.metadata.job != job {
            return Err(CheckpointError::Config(format!(
                "{} is a checkpoint of another job ({:?}); this job is {job:?}: restore a \
                 checkpoint of the same graph",
                restored.path.display(),
                restored.metadata.job
            )));
        }
        let mut plan = RestorePlan {
            id: restored.metadata.id,
            stages: BTreeMap::new(),
            names,
        };
        for (name, bytes) in &restored.states {
            let (stage, index, parallelism) =
                parse_task_file_name(name).ok_or_else(|| CheckpointError::Corrupt {
                    file: restored.path.join(name),
                    why: "not a task state file of a graph".into(),
                })?;
            let snapshot = Snapshot::decode(bytes).map_err(|why| CheckpointError::Corrupt {
                file: restored.path.join(format!("{name}.state")),
                why,
            })?;
            plan.stages
                .entry(stage)
                .or_insert_with(|| (parallelism, BTreeMap::new()))
                .1
                .insert(index, snapshot);
        }
        // Every subtask of a stage the checkpoint holds must be there: a subtask
        // restored with no state would start its source over, or forget its sink's
        // pre-committed output.
        for (stage, (parallelism, subtasks)) in &plan.stages {
            if let Some(index) = (0..*parallelism).find(|i| !subtasks.contains_key(i)) {
                return Err(CheckpointError::Unreadable {
                    path: restored.path.clone(),
                    reason: Box::new(CheckpointError::Corrupt {
                        file: restored.path.join(METADATA),
                        why: format!(
                            "it lists {} of the {parallelism} subtasks of stage {stage} and \
                             not {}.state (a process's part missing)",
                            subtasks.len(),
                            task_file_name(*stage, index, *parallelism)
                        ),
                    }),
                });
            }
        }
        let from = RestoredFrom {
            id: restored.metadata.id,
            path: restored.path.clone(),
            skipped: restored
                .skipped
                .iter()
                .map(|(path, why)| (path.clone(), why.to_string()))
                .collect(),
            read_time: started.elapsed(),
        };
        Ok(Some((plan, from)))
    }

    /// Subtask `index` of `stage` (now at `parallelism`)'s section `position`: only at
    /// the parallelism it was taken at.
    pub(crate) fn own(
        &self,
        stage: usize,
        index: usize,
        parallelism: usize,
        position: u32,
    ) -> Result<Option<&[u8]>, TaskError> {
        let Some((was, subtasks)) = self.stages.get(&stage) else {
            return Ok(None);
        };
        if *was != parallelism {
            if subtasks.values().any(|s| s.get(position).is_some()) {
                let name = self.names.get(stage).map_or("?", String::as_str);
                return Err(format!(
                    "stage {name:?} ran at parallelism {was} in checkpoint {} and at \
                     {parallelism} now; only keyed state (map_with_state) is redistributed, \
                     and this stage holds other state: restore it at parallelism {was}",
                    self.id
                )
                .into());
            }
            return Ok(None);
        }
        Ok(subtasks.get(&index).and_then(|s| s.get(position)))
    }

    /// Section `position` of every subtask of `stage` (keyed state, redistributed).
    pub(crate) fn all(&self, stage: usize, position: u32) -> Vec<&[u8]> {
        self.stages
            .get(&stage)
            .map_or_else(Vec::new, |(_, subtasks)| {
                subtasks.values().filter_map(|s| s.get(position)).collect()
            })
    }
}

/// The graph's side of the checkpoint service: triggers and completions go to the
/// tasks through the shared signals and their doorbells; a failed service cancels the
/// run.
pub(crate) struct GraphHooks {
    pub(crate) signals: Arc<CheckpointSignals>,
    pub(crate) unparkers: Vec<Unparker>,
    pub(crate) controller: Arc<OnceLock<Controller>>,
    pub(crate) failure: Arc<Mutex<Option<String>>>,
    pub(crate) listener: Option<CheckpointListener>,
    pub(crate) abort_listener: Option<AbortListener>,
}

impl GraphHooks {
    fn wake_all(&self) {
        for unparker in &self.unparkers {
            unparker.unpark();
        }
    }
}

impl CheckpointHooks for GraphHooks {
    fn trigger(&mut self, id: u64) {
        self.signals.trigger(id);
        self.wake_all();
    }

    fn complete(&mut self, id: u64) {
        self.signals.completed.fetch_max(id, Ordering::AcqRel);
        self.wake_all();
    }

    fn abort(&mut self, id: u64, reason: &str) {
        // Nothing is held per checkpoint outside the tasks: a sink's pre-committed
        // output is committed by the next checkpoint that completes.
        if let Some(listener) = &self.abort_listener {
            listener(id, reason);
        }
    }

    fn completed(&mut self, metadata: &CheckpointMetadata, alignment: Duration) {
        if let Some(listener) = &self.listener {
            listener(metadata, alignment);
        }
    }

    fn failed(&mut self, error: &CheckpointError) {
        *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(error.to_string());
        if let Some(controller) = self.controller.get() {
            controller.cancel();
        }
    }
}
