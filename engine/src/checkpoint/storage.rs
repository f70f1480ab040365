//! Where checkpoints live: one directory per checkpoint, one file per task, and a
//! `_metadata` file written last.
//!
//! ```text
//! DIR/chk-17/_metadata          written last: temporary file, fsync, rename, fsync DIR/chk-17
//! DIR/chk-17/<task>.state       one per task that has state, fsync'd before the metadata
//!
//! DIR/_completed               the newest completed id: written after each _metadata
//! ```
//!
//! A checkpoint exists only once its `_metadata` does: a crash while the task files or
//! the metadata are being written leaves a directory without one (or with a temporary
//! file), which restore skips and the next completed checkpoint's clean-up removes.
//!
//! Every file is versioned and ends in a CRC-32 of everything before it; the metadata
//! lists each task file with its size and checksum. The last `retain` completed
//! checkpoints are kept (Flink's `state.checkpoints.num-retained`, default 1).
//!
//! ## Where a run starts ([`restore_point`])
//!
//! Restore takes the **newest completed** checkpoint, and only it: once a checkpoint
//! completed, its two-phase-commit sinks may have committed output up to it, so an older
//! checkpoint (or a fresh start) would commit that output a second time. The newest
//! completed checkpoint is the newest `chk-<id>` with a `_metadata`, or the id in
//! `DIR/_completed`, whichever is newer (the marker outlives a deleted or renamed
//! directory). When it cannot be read back whole (a checksum that does not match, a
//! truncated or missing task file, a metadata file that does not decode) restore fails
//! with [`CheckpointError::Unreadable`], naming the file and why; it never falls back on
//! its own. A fresh start is taken only where no checkpoint ever completed. Directories
//! newer than the newest completed one never completed (a crash while they were written)
//! and are skipped, and listed as such.
//!
//! Files are written by whoever calls these functions: the coordinator hands the writes
//! to a thread of its own, off the workers (the asynchronous phase of a snapshot).

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::CheckpointError;

/// The format version written, and the only one read.
pub const FORMAT_VERSION: u32 = 1;
/// The metadata file's name inside a checkpoint directory.
pub const METADATA: &str = "_metadata";
/// The file under a checkpoint directory that names the newest checkpoint completed
/// there (see [`restore_point`]).
pub const COMPLETED: &str = "_completed";
const METADATA_MAGIC: &[u8; 8] = b"WEIRCHK\0";
const COMPLETED_MAGIC: &[u8; 8] = b"WEIRDONE";
const TASK_MAGIC: &[u8; 8] = b"WEIRTASK";
/// Longest task name accepted (it names a file).
const NAME_MAX: usize = 200;

/// A task's state file as the metadata lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskFile {
    /// The task's name (the file is `<name>.state`).
    pub name: String,
    /// Bytes of the file.
    pub size: u64,
    /// CRC-32 of the whole file but its last four bytes (the CRC itself).
    pub crc: u32,
}

/// What a completed checkpoint's `_metadata` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointMetadata {
    /// The checkpoint's id (it names the directory `chk-<id>`).
    pub id: u64,
    /// When it was triggered, in ms since the Unix epoch.
    pub triggered_unix_ms: u64,
    /// From trigger to the last acknowledgement.
    pub duration: Duration,
    /// The job it belongs to (a restore into another job is refused).
    pub job: String,
    /// Every task's state file.
    pub tasks: Vec<TaskFile>,
}

impl CheckpointMetadata {
    /// Bytes of every task file, the state's size.
    pub fn state_bytes(&self) -> u64 {
        self.tasks.iter().map(|t| t.size).sum()
    }
}

/// A checkpoint read back whole: its metadata and every task's state.
#[derive(Debug)]
pub struct Restored {
    /// Its directory.
    pub path: PathBuf,
    /// Its metadata.
    pub metadata: CheckpointMetadata,
    /// Each task's state by task name.
    pub states: std::collections::BTreeMap<String, Vec<u8>>,
    /// Newer checkpoint directories that were not used, and why.
    pub skipped: Vec<(PathBuf, CheckpointError)>,
}

/// One line of [`CheckpointStore::list`].
#[derive(Debug)]
pub struct Listing {
    /// The directory.
    pub path: PathBuf,
    /// Its id, from its name.
    pub id: u64,
    /// Its metadata if it is complete and valid, else why not.
    pub metadata: Result<CheckpointMetadata, CheckpointError>,
}

/// A directory of checkpoints.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    dir: PathBuf,
    retain: usize,
}

impl CheckpointStore {
    /// The checkpoints under `dir` (created if missing), keeping the last `retain`
    /// completed ones.
    pub fn open(dir: impl Into<PathBuf>, retain: usize) -> Result<Self, CheckpointError> {
        let dir = dir.into();
        if retain == 0 {
            return Err(CheckpointError::Config(
                "checkpoints to retain must be at least 1 (the default is 1)".into(),
            ));
        }
        fs::create_dir_all(&dir).map_err(|e| CheckpointError::io("creating", &dir, e))?;
        Ok(CheckpointStore { dir, retain })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory of checkpoint `id`.
    pub fn checkpoint_dir(&self, id: u64) -> PathBuf {
        self.dir.join(format!("chk-{id}"))
    }

    /// Writes `task`'s state for checkpoint `id` and makes it durable (fsync); returns
    /// the entry its metadata lists.
    pub fn write_task_state(
        &self,
        id: u64,
        task: &str,
        state: &[u8],
    ) -> Result<TaskFile, CheckpointError> {
        check_name(task)?;
        let dir = self.checkpoint_dir(id);
        fs::create_dir_all(&dir).map_err(|e| CheckpointError::io("creating", &dir, e))?;
        let mut bytes = Vec::with_capacity(state.len() + 32);
        bytes.extend_from_slice(TASK_MAGIC);
        bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        bytes.extend_from_slice(&id.to_le_bytes());
        bytes.extend_from_slice(&(state.len() as u64).to_le_bytes());
        bytes.extend_from_slice(state);
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        let path = dir.join(format!("{task}.state"));
        write_durably(&path, &bytes)?;
        Ok(TaskFile {
            name: task.to_string(),
            size: bytes.len() as u64,
            crc,
        })
    }

    /// Completes checkpoint `metadata.id`: writes its `_metadata` (a temporary file,
    /// fsync, rename, fsync of the directory), then removes the completed checkpoints
    /// beyond the last `retain` and every unfinished one older than it. From the rename
    /// on, a restore may use it.
    pub fn complete(&self, metadata: &CheckpointMetadata) -> Result<(), CheckpointError> {
        let dir = self.checkpoint_dir(metadata.id);
        fs::create_dir_all(&dir).map_err(|e| CheckpointError::io("creating", &dir, e))?;
        let bytes = encode_metadata(metadata);
        let temporary = dir.join(format!("{METADATA}.tmp"));
        write_durably(&temporary, &bytes)?;
        let path = dir.join(METADATA);
        fs::rename(&temporary, &path).map_err(|e| CheckpointError::io("renaming", &path, e))?;
        sync_dir(&dir)?;
        self.mark_completed(metadata.id)?;
        self.prune(metadata.id)
    }

    /// Records durably that checkpoint `id` completed here (a temporary file, fsync,
    /// rename, fsync of the directory): a fresh start is refused from then on.
    fn mark_completed(&self, id: u64) -> Result<(), CheckpointError> {
        if read_completed(&self.dir)?.is_some_and(|newest| newest >= id) {
            return Ok(());
        }
        self.write_completed(id)
    }

    fn write_completed(&self, id: u64) -> Result<(), CheckpointError> {
        let mut bytes = Vec::with_capacity(24);
        bytes.extend_from_slice(COMPLETED_MAGIC);
        bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        bytes.extend_from_slice(&id.to_le_bytes());
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        let temporary = self.dir.join(format!("{COMPLETED}.tmp"));
        write_durably(&temporary, &bytes)?;
        let path = self.dir.join(COMPLETED);
        fs::rename(&temporary, &path).map_err(|e| CheckpointError::io("renaming", &path, e))?;
        sync_dir(&self.dir)
    }

    /// The newest checkpoint that ever completed here (see [`newest_completed`]), if
    /// any; without reading it back.
    pub fn newest_complete(&self) -> Result<Option<u64>, CheckpointError> {
        newest_completed(&self.dir)
    }

    /// Removes every checkpoint directory newer than the newest completed one: what a
    /// run that crashed left unfinished. Before a restore, so that nothing of the
    /// crashed run is taken for the new run's. A completed checkpoint is never removed
    /// here, readable or not: restore reports an unreadable one by name.
    pub fn discard_unfinished(&self) -> Result<(), CheckpointError> {
        let newest = newest_completed(&self.dir)?.unwrap_or(0);
        for (id, _) in checkpoint_dirs(&self.dir)? {
            if id > newest {
                self.discard(id)?;
            }
        }
        Ok(())
    }

    /// Removes checkpoint `id`'s directory: a checkpoint that failed or was declined.
    pub fn discard(&self, id: u64) -> Result<(), CheckpointError> {
        let dir = self.checkpoint_dir(id);
        match fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(CheckpointError::io("removing", &dir, e)),
        }
    }

    /// Keeps the last `retain` completed checkpoints up to `newest`, and nothing
    /// unfinished older than `newest`.
    fn prune(&self, newest: u64) -> Result<(), CheckpointError> {
        let mut complete = Vec::new();
        for (id, path) in checkpoint_dirs(&self.dir)? {
            if id > newest {
                continue;
            }
            if path.join(METADATA).exists() {
                complete.push((id, path));
            } else if id < newest {
                fs::remove_dir_all(&path).map_err(|e| CheckpointError::io("removing", &path, e))?;
            }
        }
        complete.sort_by_key(|(id, _)| std::cmp::Reverse(*id));
        for (_, path) in complete.into_iter().skip(self.retain) {
            fs::remove_dir_all(&path).map_err(|e| CheckpointError::io("removing", &path, e))?;
        }
        Ok(())
    }

    /// The newest completed checkpoint under this directory, read back whole (see
    /// [`latest_in`]).
    pub fn latest(&self) -> Result<Restored, CheckpointError> {
        latest_in(&self.dir)
    }

    /// Every checkpoint directory, newest first, each with its metadata or why it
    /// cannot be used.
    pub fn list(&self) -> Result<Vec<Listing>, CheckpointError> {
        list(&self.dir)
    }
}

/// The newest completed checkpoint under `dir`, read back whole (see
/// [`restore_point`]); [`CheckpointError::NoValidCheckpoint`] where none ever completed.
pub fn latest_in(dir: &Path) -> Result<Restored, CheckpointError> {
    restore_point(dir)?.ok_or_else(|| CheckpointError::NoValidCheckpoint {
        dir: dir.to_path_buf(),
        tried: checkpoint_dirs(dir)
            .unwrap_or_default()
            .into_iter()
            .map(|(_, path)| format!("{}: never completed", path.display()))
            .collect(),
    })
}

/// Where a run restoring from the checkpoint directory `dir` starts (see the [module
/// docs](self)): `Ok(Some(_))`, the newest completed checkpoint read back whole, with
/// the newer unfinished directories it passed over; `Ok(None)`, a fresh start, since no
/// checkpoint ever completed here (a missing `dir` counts as empty);
/// [`CheckpointError::Unreadable`] when the newest completed checkpoint cannot be read
/// back whole. Never an older checkpoint than the newest completed one.
pub fn restore_point(dir: &Path) -> Result<Option<Restored>, CheckpointError> {
    if !dir.exists() {
        return Ok(None);
    }
    let Some(newest) = newest_completed(dir)? else {
        return Ok(None);
    };
    let path = dir.join(format!("chk-{newest}"));
    let unreadable = |error: CheckpointError| CheckpointError::Unreadable {
        path: path.clone(),
        reason: Box::new(error),
    };
    if !path.is_dir() {
        return Err(unreadable(CheckpointError::Corrupt {
            file: dir.join(COMPLETED),
            why: format!(
                "it records checkpoint {newest} as completed, and {} is gone",
                path.display()
            ),
        }));
    }
    let mut restored = read_checkpoint(&path).map_err(|e| match e {
        CheckpointError::Incomplete { .. } => unreadable(CheckpointError::Corrupt {
            file: path.join(METADATA),
            why: format!(
                "it is missing, and {} records checkpoint {newest} as completed",
                dir.join(COMPLETED).display()
            ),
        }),
        other => unreadable(other),
    })?;
    let mut dirs = checkpoint_dirs(dir)?;
    dirs.sort_by_key(|(id, _)| std::cmp::Reverse(*id));
    restored.skipped = dirs
        .into_iter()
        .filter(|(id, _)| *id > newest)
        .map(|(_, path)| {
            let error = CheckpointError::Incomplete { path: path.clone() };
            (path, error)
        })
        .collect();
    Ok(Some(restored))
}

/// Like [`restore_point`], but where the newest completed checkpoint cannot be read
/// back (or `_completed` is damaged), the newest older completed checkpoint that can,
/// with every newer one passed over and why in [`Restored::skipped`]. For an operator
/// who asks for it: output a sink committed after the checkpoint taken would be
/// written again, which a transactional sink's restore refuses by name. An error only
/// when no completed checkpoint can be read back (the newest one's error).
pub fn fallback_point(dir: &Path) -> Result<Option<Restored>, CheckpointError> {
    let newest_error = match restore_point(dir) {
        Ok(found) => return Ok(found),
        Err(error) => error,
    };
    let Ok(mut dirs) = checkpoint_dirs(dir) else {
        return Err(newest_error);
    };
    dirs.sort_by_key(|(id, _)| std::cmp::Reverse(*id));
    let mut skipped = Vec::new();
    for (_, path) in dirs {
        if !path.join(METADATA).exists() {
            // Never completed: not a fallback, and not worth listing.
            continue;
        }
        match read_checkpoint(&path) {
            Ok(mut restored) => {
                let newest = match &newest_error {
                    CheckpointError::Unreadable { path, .. } => path.clone(),
                    _ => dir.join(COMPLETED),
                };
                if !skipped.iter().any(|(p, _): &(PathBuf, _)| *p == newest) {
                    skipped.insert(0, (newest, newest_error));
                }
                restored.skipped = skipped;
                return Ok(Some(restored));
            }
            Err(error) => skipped.push((path, error)),
        }
    }
    Err(newest_error)
}

/// The newest checkpoint that ever completed under `dir`: the newest `chk-<id>` with a
/// `_metadata`, or the one `_completed` names, whichever is newer; without reading the
/// checkpoint back. A `_completed` that does not decode is an error naming it (what it
/// said is unknown, so a fresh start could not be ruled out).
pub fn newest_completed(dir: &Path) -> Result<Option<u64>, CheckpointError> {
    if !dir.exists() {
        return Ok(None);
    }
    let listed = checkpoint_dirs(dir)?
        .into_iter()
        .filter(|(_, path)| path.join(METADATA).exists())
        .map(|(id, _)| id)
        .max();
    let marked = read_completed(dir)?;
    Ok(listed.max(marked))
}

/// The id `dir/_completed` records, if the file exists.
fn read_completed(dir: &Path) -> Result<Option<u64>, CheckpointError> {
    let file = dir.join(COMPLETED);
    if !file.exists() {
        return Ok(None);
    }
    let bytes = read_file(&file)?;
    let mut fields = framed(&file, &bytes, COMPLETED_MAGIC)?;
    let id = fields
        .u64()
        .ok_or_else(|| CheckpointError::corrupt(&file, "it ends before its id".into()))?;
    if !fields.bytes.is_empty() {
        return Err(CheckpointError::corrupt(
            &file,
            format!("{} bytes after its id", fields.bytes.len()),
        ));
    }
    Ok(Some(id))
}

/// Reads checkpoint directory `path` (`.../chk-<id>`) whole, or says why it cannot be
/// used.
pub fn read_checkpoint(path: &Path) -> Result<Restored, CheckpointError> {
    let metadata = read_metadata(path)?;
    let mut states = std::collections::BTreeMap::new();
    for task in &metadata.tasks {
        let file = path.join(format!("{}.state", task.name));
        let bytes = read_file(&file)?;
        if bytes.len() as u64 != task.size {
            return Err(CheckpointError::corrupt(
                &file,
                format!(
                    "{} bytes where the metadata lists {}",
                    bytes.len(),
                    task.size
                ),
            ));
        }
        let state = decode_task(&file, &bytes, metadata.id)?;
        let crc = crc32fast::hash(&bytes[..bytes.len() - 4]);
        if crc != task.crc {
            return Err(CheckpointError::corrupt(
                &file,
                "its checksum differs from the one the metadata lists".to_string(),
            ));
        }
        states.insert(task.name.clone(), state.to_vec());
    }
    Ok(Restored {
        path: path.to_path_buf(),
        metadata,
        states,
        skipped: Vec::new(),
    })
}

/// Reads and checks `path/_metadata`.
pub fn read_metadata(path: &Path) -> Result<CheckpointMetadata, CheckpointError> {
    let file = path.join(METADATA);
    if !file.exists() {
        return Err(CheckpointError::Incomplete {
            path: path.to_path_buf(),
        });
    }
    let bytes = read_file(&file)?;
    let metadata = decode_metadata(&file, &bytes)?;
    let named = checkpoint_id(path);
    if named.is_some_and(|id| id != metadata.id) {
        return Err(CheckpointError::corrupt(
            &file,
            format!("it is checkpoint {}'s, in another's directory", metadata.id),
        ));
    }
    Ok(metadata)
}

/// Every checkpoint directory under `dir`, newest first, with its metadata or why it
/// cannot be used.
pub fn list(dir: &Path) -> Result<Vec<Listing>, CheckpointError> {
    let mut dirs = checkpoint_dirs(dir)?;
    dirs.sort_by_key(|(id, _)| std::cmp::Reverse(*id));
    Ok(dirs
        .into_iter()
        .map(|(id, path)| Listing {
            metadata: read_checkpoint(&path).map(|r| r.metadata),
            id,
            path,
        })
        .collect())
}

/// The ids and paths of the `chk-<id>` directories under `dir`.
fn checkpoint_dirs(dir: &Path) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
    let entries = fs::read_dir(dir).map_err(|e| CheckpointError::io("reading", dir, e))?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| CheckpointError::io("reading", dir, e))?;
        let path = entry.path();
        if let Some(id) = checkpoint_id(&path) {
            if path.is_dir() {
                out.push((id, path));
            }
        }
    }
    Ok(out)
}

/// The id in a `chk-<id>` directory's name.
pub fn checkpoint_id(path: &Path) -> Option<u64> {
    path.file_name()?
        .to_str()?
        .strip_prefix("chk-")?
        .parse()
        .ok()
}

/// Now, in ms since the Unix epoch.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn check_name(task: &str) -> Result<(), CheckpointError> {
    let valid = !task.is_empty()
        && task.len() <= NAME_MAX
        && !task.starts_with('.')
        && task
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if valid {
        Ok(())
    } else {
        Err(CheckpointError::Config(format!(
            "task name {task:?} cannot name a state file: use 1 to {NAME_MAX} of A-Z a-z 0-9 . - _, not starting with '.'"
        )))
    }
}

fn write_durably(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let mut file = File::create(path).map_err(|e| CheckpointError::io("creating", path, e))?;
    file.write_all(bytes)
        .map_err(|e| CheckpointError::io("writing", path, e))?;
    file.sync_all()
        .map_err(|e| CheckpointError::io("syncing", path, e))
}

fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| CheckpointError::io("syncing", dir, e))
}

fn read_file(path: &Path) -> Result<Vec<u8>, CheckpointError> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| CheckpointError::io("reading", path, e))?;
    Ok(bytes)
}

fn encode_metadata(m: &CheckpointMetadata) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(METADATA_MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&m.id.to_le_bytes());
    out.extend_from_slice(&m.triggered_unix_ms.to_le_bytes());
    out.extend_from_slice(&(m.duration.as_micros() as u64).to_le_bytes());
    out.extend_from_slice(&(m.job.len() as u32).to_le_bytes());
    out.extend_from_slice(m.job.as_bytes());
    out.extend_from_slice(&(m.tasks.len() as u32).to_le_bytes());
    for task in &m.tasks {
        out.extend_from_slice(&(task.name.len() as u16).to_le_bytes());
        out.extend_from_slice(task.name.as_bytes());
        out.extend_from_slice(&task.size.to_le_bytes());
        out.extend_from_slice(&task.crc.to_le_bytes());
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Reads little-endian fields off a byte slice, failing on a short one.
struct Fields<'a> {
    bytes: &'a [u8],
}

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Some(head)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// Checks the magic, the version and the trailing CRC of a file's bytes; returns the
/// fields between the magic and the CRC.
fn framed<'a>(
    file: &Path,
    bytes: &'a [u8],
    magic: &[u8; 8],
) -> Result<Fields<'a>, CheckpointError> {
    if bytes.len() < 16 {
        return Err(CheckpointError::corrupt(
            file,
            format!("{} bytes: shorter than any complete file", bytes.len()),
        ));
    }
    if &bytes[..8] != magic {
        return Err(CheckpointError::corrupt(
            file,
            "it does not start as a Weir checkpoint file".into(),
        ));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    let crc = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
    if crc32fast::hash(body) != crc {
        return Err(CheckpointError::corrupt(
            file,
            "its checksum does not match its contents (torn or altered)".into(),
        ));
    }
    let mut fields = Fields { bytes: &body[8..] };
    let version = fields.u32().unwrap_or(0);
    if version != FORMAT_VERSION {
        return Err(CheckpointError::Version {
            file: file.to_path_buf(),
            found: version,
        });
    }
    Ok(fields)
}

fn decode_metadata(file: &Path, bytes: &[u8]) -> Result<CheckpointMetadata, CheckpointError> {
    let mut f = framed(file, bytes, METADATA_MAGIC)?;
    let short = || CheckpointError::corrupt(file, "it ends before its last field".into());
    let id = f.u64().ok_or_else(short)?;
    let triggered_unix_ms = f.u64().ok_or_else(short)?;
    let duration = Duration::from_micros(f.u64().ok_or_else(short)?);
    let job_len = f.u32().ok_or_else(short)? as usize;
    let job = String::from_utf8(f.take(job_len).ok_or_else(short)?.to_vec())
        .map_err(|_| CheckpointError::corrupt(file, "its job id is not UTF-8".into()))?;
    let count = f.u32().ok_or_else(short)? as usize;
    let mut tasks = Vec::with_capacity(count.min(1 << 16));
    for _ in 0..count {
        let len = f.u16().ok_or_else(short)? as usize;
        let name = String::from_utf8(f.take(len).ok_or_else(short)?.to_vec())
            .map_err(|_| CheckpointError::corrupt(file, "a task name is not UTF-8".into()))?;
        check_name(&name)
            .map_err(|_| CheckpointError::corrupt(file, format!("task name {name:?}")))?;
        let size = f.u64().ok_or_else(short)?;
        let crc = f.u32().ok_or_else(short)?;
        tasks.push(TaskFile { name, size, crc });
    }
    if !f.bytes.is_empty() {
        return Err(CheckpointError::corrupt(
            file,
            format!("{} bytes after its last field", f.bytes.len()),
        ));
    }
    Ok(CheckpointMetadata {
        id,
        triggered_unix_ms,
        duration,
        job,
        tasks,
    })
}

fn decode_task<'a>(file: &Path, bytes: &'a [u8], id: u64) -> Result<&'a [u8], CheckpointError> {
    let mut f = framed(file, bytes, TASK_MAGIC)?;
    let short = || CheckpointError::corrupt(file, "it ends before its state does".into());
    let written_for = f.u64().ok_or_else(short)?;
    if written_for != id {
        return Err(CheckpointError::corrupt(
            file,
            format!("it holds checkpoint {written_for}'s state, not {id}'s"),
        ));
    }
    let len = f.u64().ok_or_else(short)? as usize;
    let state = f.take(len).ok_or_else(short)?;
    if !f.bytes.is_empty() {
        return Err(CheckpointError::corrupt(
            file,
            format!("{} bytes after its state", f.bytes.len()),
        ));
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "weir-checkpoints-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    /// Writes checkpoint `id` with two tasks whose state names the checkpoint.
    fn checkpoint(store: &CheckpointStore, id: u64) -> CheckpointMetadata {
        let tasks = ["source-0", "count-1"]
            .iter()
            .map(|task| {
                store
                    .write_task_state(id, task, format!("{task} at {id}").as_bytes())
                    .expect("task state")
            })
            .collect();
        let metadata = CheckpointMetadata {
            id,
            triggered_unix_ms: unix_ms(),
            duration: Duration::from_millis(3),
            job: "job-a".into(),
            tasks,
        };
        store.complete(&metadata).expect("complete");
        metadata
    }

    #[test]
    fn a_checkpoint_reads_back_whole() {
        let dir = scratch("whole");
        let store = CheckpointStore::open(&dir, 1).expect("store");
        let written = checkpoint(&store, 1);
        let restored = store.latest().expect("restored");
        assert_eq!(restored.metadata, written);
        assert_eq!(restored.states["source-0"], b"source-0 at 1");
        assert_eq!(restored.states["count-1"], b"count-1 at 1");
        assert!(restored.skipped.is_empty());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn only_the_last_retained_checkpoints_are_kept() {
        let dir = scratch("retain");
        let store = CheckpointStore::open(&dir, 2).expect("store");
        for id in 1..=4 {
            checkpoint(&store, id);
        }
        // An unfinished older one (a crash between its task files and its metadata).
        store.write_task_state(5, "source-0", b"x").expect("state");
        checkpoint(&store, 6);
        let ids: Vec<u64> = store.list().expect("list").iter().map(|l| l.id).collect();
        assert_eq!(ids, [6, 4]);
        assert_eq!(store.latest().expect("latest").metadata.id, 6);
        let _ = fs::remove_dir_all(&dir);
    }

    /// The newest completed checkpoint, altered: `f` damages it; restore must refuse it
    /// by naming `expect` (never fall back on the older one, whose replay would commit
    /// output again), and leave it on disk.
    fn refused_when_damaged(name: &str, expect: &str, damage: impl FnOnce(&CheckpointStore)) {
        let dir = scratch(name);
        let store = CheckpointStore::open(&dir, 3).expect("store");
        checkpoint(&store, 1);
        checkpoint(&store, 2);
        // An unfinished newer one: task files, no metadata.
        store.write_task_state(3, "source-0", b"y").expect("state");
        damage(&store);
        let left = store.checkpoint_dir(2).exists();
        let err = store.latest().expect_err("the newest completed is damaged");
        let text = err.to_string();
        assert!(matches!(err, CheckpointError::Unreadable { .. }), "{text}");
        assert!(text.contains("chk-2"), "{text}");
        assert!(text.contains(expect), "{expect:?} in {text}");
        assert!(restore_point(&dir).is_err());
        // Clean-up before a restore removes the unfinished one only.
        store.discard_unfinished().expect("discard");
        assert_eq!(store.checkpoint_dir(2).exists(), left);
        assert!(!store.checkpoint_dir(3).exists());
        assert!(store.latest().is_err(), "still refused after the clean-up");
        // Named explicitly, the older one is still there to be chosen.
        assert_eq!(
            read_checkpoint(&store.checkpoint_dir(1))
                .expect("older")
                .metadata
                .id,
            1
        );
        // Asked for, the fallback takes it, naming the damaged newest as passed over.
        let fallback = fallback_point(&dir)
            .expect("an older one reads back")
            .expect("one completed");
        assert_eq!(fallback.metadata.id, 1);
        assert_eq!(fallback.states["count-1"], b"count-1 at 1");
        let passed: Vec<String> = fallback
            .skipped
            .iter()
            .map(|(path, error)| format!("{}: {error}", path.display()))
            .collect();
        assert!(
            passed
                .first()
                .is_some_and(|p| p.contains("chk-2") && p.contains(expect)),
            "{passed:?}"
        );
        let _ = fs::remove_dir_all(&dir);
    }

    /// The fallback is the newest completed checkpoint where that one reads back, a
    /// fresh start where none completed, and an error where none reads back.
    #[test]
    fn the_fallback_changes_nothing_unless_the_newest_is_damaged() {
        let dir = scratch("fallback");
        assert!(fallback_point(&dir).expect("no directory").is_none());
        let store = CheckpointStore::open(&dir, 2).expect("store");
        assert!(fallback_point(&dir).expect("empty").is_none());
        checkpoint(&store, 1);
        checkpoint(&store, 2);
        let newest = fallback_point(&dir).expect("reads").expect("completed");
        assert_eq!(newest.metadata.id, 2);
        assert!(newest.skipped.is_empty());
        for id in [1, 2] {
            fs::remove_file(store.checkpoint_dir(id).join("source-0.state")).expect("remove");
        }
        let error = fallback_point(&dir).expect_err("none reads back");
        assert!(error.to_string().contains("chk-2"), "{error}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_torn_metadata_file_is_refused_by_name() {
        refused_when_damaged("torn", "_metadata", |store| {
            let metadata = store.checkpoint_dir(2).join(METADATA);
            let bytes = fs::read(&metadata).expect("read");
            fs::write(&metadata, &bytes[..bytes.len() / 2]).expect("tear");
        });
    }

    #[test]
    fn a_flipped_byte_in_a_task_file_is_refused_by_name() {
        refused_when_damaged("flip", "count-1.state", |store| {
            let file = store.checkpoint_dir(2).join("count-1.state");
            let mut bytes = fs::read(&file).expect("read");
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x40;
            fs::write(&file, &bytes).expect("flip");
        });
    }

    #[test]
    fn a_truncated_task_file_is_refused_by_name() {
        refused_when_damaged("truncated", "source-0.state", |store| {
            let file = store.checkpoint_dir(2).join("source-0.state");
            let bytes = fs::read(&file).expect("read");
            fs::write(&file, &bytes[..bytes.len() - 3]).expect("truncate");
        });
    }

    #[test]
    fn a_missing_task_file_is_refused_by_name() {
        refused_when_damaged("missing", "source-0.state", |store| {
            fs::remove_file(store.checkpoint_dir(2).join("source-0.state")).expect("remove");
        });
    }

    /// A deleted `_metadata` makes the directory look unfinished; the `_completed`
    /// marker still says it completed.
    #[test]
    fn a_deleted_metadata_file_is_refused_by_name() {
        refused_when_damaged("no-metadata", "_metadata", |store| {
            fs::remove_file(store.checkpoint_dir(2).join(METADATA)).expect("remove");
        });
    }

    #[test]
    fn a_deleted_checkpoint_directory_is_refused_by_name() {
        refused_when_damaged("no-dir", "is gone", |store| {
            fs::remove_dir_all(store.checkpoint_dir(2)).expect("remove");
        });
    }

    #[test]
    fn a_fresh_start_only_where_no_checkpoint_ever_completed() {
        let dir = scratch("fresh");
        assert!(restore_point(&dir.join("absent"))
            .expect("absent")
            .is_none());
        let store = CheckpointStore::open(&dir, 1).expect("store");
        assert!(restore_point(&dir).expect("empty").is_none());
        // Only unfinished ones: still a fresh start, and latest_in says why.
        store.write_task_state(4, "source-0", b"x").expect("state");
        assert!(restore_point(&dir).expect("unfinished only").is_none());
        let err = store.latest().expect_err("none completed");
        assert!(err.to_string().contains("never completed"), "{err}");
        checkpoint(&store, 7);
        let restored = restore_point(&dir).expect("ok").expect("completed");
        assert_eq!(restored.metadata.id, 7);
        assert_eq!(newest_completed(&dir).expect("newest"), Some(7));
        // Every directory gone, the marker stays: no fresh start.
        fs::remove_dir_all(store.checkpoint_dir(7)).expect("remove");
        assert!(restore_point(&dir).is_err());
        // A damaged marker is an error too, naming it.
        fs::write(dir.join(COMPLETED), b"garbage that is long enough").expect("write");
        let err = restore_point(&dir).expect_err("damaged marker");
        assert!(err.to_string().contains(COMPLETED), "{err}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn without_a_valid_checkpoint_the_error_names_each_one_tried() {
        let dir = scratch("none");
        let store = CheckpointStore::open(&dir, 1).expect("store");
        let err = store.latest().expect_err("empty");
        assert!(err.to_string().contains("no complete checkpoint"), "{err}");
        checkpoint(&store, 7);
        fs::write(store.checkpoint_dir(7).join(METADATA), b"garbage").expect("write");
        let err = store.latest().expect_err("corrupt");
        let text = err.to_string();
        assert!(text.contains("chk-7"), "{text}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_settings_and_names_are_refused() {
        let dir = scratch("names");
        assert!(CheckpointStore::open(&dir, 0).is_err());
        let store = CheckpointStore::open(&dir, 1).expect("store");
        for name in ["", "../escape", ".hidden", "a/b", &"x".repeat(201)] {
            assert!(
                matches!(
                    store.write_task_state(1, name, b""),
                    Err(CheckpointError::Config(_))
                ),
                "{name:?}"
            );
        }
        let _ = fs::remove_dir_all(&dir);
    }

    /// Any cut of a metadata file, and any single flipped bit, fails to decode: a
    /// partial write is never read as a complete one.
    #[test]
    fn every_cut_and_every_flipped_bit_of_a_metadata_file_is_refused() {
        let metadata = CheckpointMetadata {
            id: 9,
            triggered_unix_ms: 1,
            duration: Duration::from_millis(2),
            job: "j".into(),
            tasks: vec![TaskFile {
                name: "t-0".into(),
                size: 40,
                crc: 7,
            }],
        };
        let bytes = encode_metadata(&metadata);
        let file = Path::new("m");
        assert_eq!(decode_metadata(file, &bytes).expect("whole"), metadata);
        for cut in 0..bytes.len() {
            assert!(
                decode_metadata(file, &bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_metadata(file, &flipped).is_err(), "bit {bit}");
        }
    }
}
