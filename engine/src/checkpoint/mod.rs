//! Checkpoints: Flink's asynchronous barrier snapshotting, the parts that do not touch a
//! record.
//!
//! - [`coordinator`]: when a checkpoint is triggered (every `interval`, at most
//!   `max_concurrent` at once, a minimum pause after the last one), which task
//!   acknowledgements complete it, when it times out, and how many failures in a row a
//!   job tolerates: Flink's `CheckpointCoordinator`, as a state machine driven by its
//!   caller's clock, so that every rule is tested without threads or sleeps;
//! - [`alignment`]: barrier alignment at a task with several input channels, aligned,
//!   unaligned, and aligned switching to unaligned after a timeout (Flink's
//!   `SingleCheckpointBarrierHandler`), as a state machine the input gate drives;
//! - [`elements`]: stream elements as checkpoint bytes (what an async operator holds at a
//!   barrier, processed again on restore);
//! - [`keyed`]: keyed state per key group, snapshotted and restored at another
//!   parallelism (Flink's `KeyGroupRangeAssignment`);
//! - [`link`]: what the checkpoint services of a job over several processes say to
//!   each other (process 0 coordinates, the others take part);
//! - [`restart`]: restart strategies (fixed delay, exponential delay) for a job that
//!   failed, restarted from its latest completed checkpoint;
//! - [`service`]: the coordinator on a thread of its own with the checkpoint directory:
//!   tasks hand it their snapshots and it writes them, off the workers;
//! - [`storage`]: the checkpoint directory (`chk-<id>/` with a state file per task and a
//!   `_metadata` written last, fsync'd and renamed into place), the versioned format with
//!   a checksum per file, retention, and restore from the newest checkpoint that reads
//!   back whole;
//! - [`transactional`]: exactly-once part files by two-phase commit (pre-commit at the
//!   barrier, commit when the checkpoint completes, idempotent, restore commits what the
//!   checkpoint pre-committed and drops the rest).
//!
//! The guarantees are Flink's: a checkpoint counts only once every task acknowledged it
//! and its metadata is durable; restore never uses a torn or corrupt checkpoint.

pub mod alignment;
pub mod coordinator;
pub mod elements;
pub mod keyed;
pub mod link;
pub mod restart;
pub mod service;
pub mod storage;
pub mod transactional;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use alignment::{Alignment, AlignmentMode, BarrierAligner, ChannelState};
pub use coordinator::{AckFigures, CheckpointConfig, CheckpointStats, Coordinator, Outcome};
pub use keyed::{key_group_range, KeyedState, KeyedStateError};
pub use link::{CheckpointLink, LinkEvent, LocalLinks};
pub use restart::{RestartStrategy, Restarts};
pub use service::{Acks, CheckpointHooks, CheckpointService, ServicePart, TaskState};
pub use storage::{CheckpointMetadata, CheckpointStore, Restored, TaskFile};
pub use transactional::TransactionalFiles;

/// What went wrong with a checkpoint, or with restoring from one. Every message says
/// what to fix or what was done instead.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// A setting that cannot work.
    #[error("checkpoint setting: {0}")]
    Config(String),
    /// A file or directory could not be read or written.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done ("writing", "syncing", ...).
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A file whose contents cannot be what Weir wrote.
    #[error("{} is corrupt: {why}", file.display())]
    Corrupt {
        /// The file.
        file: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// A file of another format version.
    #[error(
        "{} has format version {found}; this build reads version {}: restore it with the \
         Weir that wrote it",
        file.display(),
        storage::FORMAT_VERSION
    )]
    Version {
        /// The file.
        file: PathBuf,
        /// The version it says.
        found: u32,
    },
    /// A checkpoint directory without metadata: it never completed.
    #[error("{} never completed (no {} in it)", path.display(), storage::METADATA)]
    Incomplete {
        /// The directory.
        path: PathBuf,
    },
    /// No checkpoint to restore from.
    #[error(
        "no complete checkpoint under {} to restore from{}",
        dir.display(),
        if tried.is_empty() { String::from(" (it holds none)") } else { format!("; tried: {}", tried.join("; ")) }
    )]
    NoValidCheckpoint {
        /// The directory searched.
        dir: PathBuf,
        /// Each checkpoint tried and why it could not be used.
        tried: Vec<String>,
    },
    /// The newest completed checkpoint cannot be read back whole. It is never passed
    /// over: its sinks may have committed output up to it, which an older checkpoint or
    /// a fresh start would commit again.
    #[error(
        "checkpoint {} is the newest that completed and cannot be restored: {reason}. It is \
         not skipped silently, since output committed up to it would be written a second \
         time from an older checkpoint or from the start: put the damaged file back (from a \
         copy), or restore an older checkpoint (name its directory, or ask for the fallback \
         to the newest readable one), knowing that output committed after it is written \
         again (the transactional file sink refuses that, naming its files)",
        path.display()
    )]
    Unreadable {
        /// The checkpoint's directory.
        path: PathBuf,
        /// What is wrong with it (names the file).
        reason: Box<CheckpointError>,
    },
    /// A checkpoint of another job.
    #[error(
        "checkpoint {} belongs to job {found}, not this job ({expected}): restore a job \
         with the graph and settings it was taken with",
        path.display()
    )]
    WrongJob {
        /// The checkpoint's directory.
        path: PathBuf,
        /// Its job id.
        found: String,
        /// This job's.
        expected: String,
    },
    /// A checkpoint took longer than the checkpoint timeout.
    #[error(
        "checkpoint {id} expired after {after:?} with {acknowledged} of {tasks} tasks \
         acknowledged (raise the checkpoint timeout, or look for back-pressure)"
    )]
    Expired {
        /// The checkpoint.
        id: u64,
        /// The timeout.
        after: Duration,
        /// Tasks that had acknowledged.
        acknowledged: usize,
        /// Tasks of the job.
        tasks: usize,
    },
    /// Over several processes: a checkpoint this process took part in heard nothing
    /// more for the checkpoint timeout.
    #[error(
        "checkpoint {id} waited {after:?} for {waiting_for}: a process of the job is gone \
         or stalled (this process stops rather than run on without checkpoints; restart \
         the job from its latest completed checkpoint)"
    )]
    Unsettled {
        /// The checkpoint.
        id: u64,
        /// The checkpoint timeout.
        after: Duration,
        /// What it waited for.
        waiting_for: String,
    },
    /// Over several processes: a process the checkpoints depend on is gone, sent
    /// something that cannot be, or runs another job.
    #[error("checkpoints across processes: process {process} {reason}")]
    Link {
        /// The process.
        process: usize,
        /// What happened, and what to do.
        reason: String,
    },
    /// A task could not take its snapshot.
    #[error("checkpoint {id} declined by task {task}: {reason}")]
    Declined {
        /// The checkpoint.
        id: u64,
        /// The task that declined.
        task: usize,
        /// Why.
        reason: String,
    },
    /// More checkpoints failed in a row than the job tolerates.
    #[error(
        "{failures} checkpoints failed in a row, more than the {tolerable} tolerated; the \
         last: {last}"
    )]
    TooManyFailures {
        /// Failures in a row.
        failures: u32,
        /// The tolerated number.
        tolerable: u32,
        /// The last failure.
        last: String,
    },
}

impl CheckpointError {
    fn io(what: &'static str, path: &Path, source: std::io::Error) -> Self {
        CheckpointError::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    }

    fn corrupt(file: &Path, why: String) -> Self {
        CheckpointError::Corrupt {
            file: file.to_path_buf(),
            why,
        }
    }
}
