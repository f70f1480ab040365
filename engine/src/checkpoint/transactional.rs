//! Exactly-once output to files by two-phase commit (Flink's
//! `TwoPhaseCommitSinkFunction`, as its `FileSink` does it): the part files of one
//! subtask move through three names.
//!
//! ```text
//! part-<subtask>-<n>.inprogress   being written (lost on a crash; removed on restore)
//! part-<subtask>-<n>.pending      pre-committed at checkpoint c's barrier: flushed,
//!                                 fsync'd, renamed; listed in checkpoint c's state
//! part-<subtask>-<n>              committed when checkpoint c completed (a rename)
//! ```
//!
//! - [`pre_commit`](TransactionalFiles::pre_commit) at the barrier of checkpoint `c`
//!   closes the file being written as pending and returns the state the checkpoint must
//!   hold (every pending file not yet committed, with its checkpoint);
//! - [`commit`](TransactionalFiles::commit) when checkpoint `c` completed renames the
//!   pending files of `c` and older into place; committing again is harmless (a file
//!   already in place is left as it is), so a notification repeated or replayed after a
//!   restore commits nothing twice;
//! - [`restore`](TransactionalFiles::restore) from a checkpoint's state commits the
//!   pending files it lists (their checkpoint completed: it is the one restored) and
//!   removes every other pending or in-progress file of the subtask (written after that
//!   checkpoint; the source replays their records).
//!
//! So the committed files hold each record of the input exactly once, whatever crashed
//! where, as long as the source replays from the checkpoint's position. Readers see only
//! committed files (the names without a suffix).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::CheckpointError;
use crate::exchange::codec::{Codec, DecodeError};

const IN_PROGRESS: &str = ".inprogress";
const PENDING: &str = ".pending";
/// Format version of the sink's checkpointed state.
const STATE_VERSION: u8 = 1;

/// One subtask's part files in a directory, written through two-phase commit.
#[derive(Debug)]
pub struct TransactionalFiles {
    dir: PathBuf,
    subtask: usize,
    /// The next part file's number.
    next_part: u64,
    /// The part file being written and its number.
    current: Option<(u64, BufWriter<File>)>,
    /// Pre-committed part numbers by the checkpoint they belong to.
    pending: BTreeMap<u64, Vec<u64>>,
}

impl TransactionalFiles {
    /// Part files of `subtask` under `dir` (created if missing), with nothing restored:
    /// every file the subtask left there before is removed unless committed.
    pub fn new(dir: impl Into<PathBuf>, subtask: usize) -> Result<Self, CheckpointError> {
        Self::restore(dir, subtask, None)
    }

    /// Part files of `subtask` under `dir` restored from `state` (what
    /// [`pre_commit`](Self::pre_commit) returned at the checkpoint restored): its
    /// pending files are committed, every other pending or in-progress file of this
    /// subtask is removed.
    pub fn restore(
        dir: impl Into<PathBuf>,
        subtask: usize,
        state: Option<&[u8]>,
    ) -> Result<Self, CheckpointError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|e| CheckpointError::io("creating", &dir, e))?;
        let (next_part, pending) = match state {
            Some(bytes) => decode_state(bytes).map_err(|e| CheckpointError::Corrupt {
                file: dir.clone(),
                why: format!("the file sink's checkpointed state: {e}"),
            })?,
            None => (0, BTreeMap::new()),
        };
        let restored_next = next_part;
        let mut files = TransactionalFiles {
            dir,
            subtask,
            next_part,
            current: None,
            pending,
        };
        // The checkpoint restored completed: what it pre-committed is committed.
        files.commit(u64::MAX)?;
        // Anything else of this subtask's that is not committed came after it.
        let prefix = format!("part-{subtask}-");
        let entries =
            fs::read_dir(&files.dir).map_err(|e| CheckpointError::io("reading", &files.dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| CheckpointError::io("reading", &files.dir, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(rest) = name.strip_prefix(&prefix) else {
                continue;
            };
            let number = rest
                .strip_suffix(IN_PROGRESS)
                .or_else(|| rest.strip_suffix(PENDING))
                .and_then(|n| n.parse::<u64>().ok());
            if let Some(number) = number {
                let path = entry.path();
                fs::remove_file(&path).map_err(|e| CheckpointError::io("removing", &path, e))?;
                files.next_part = files.next_part.max(number + 1);
            } else if let Ok(number) = rest.parse::<u64>() {
                if state.is_some() && number >= restored_next {
                    // Started after the checkpoint restored, yet committed: a newer
                    // checkpoint completed and committed it. Restoring this older one
                    // would replay its records into new files beside it.
                    return Err(CheckpointError::Corrupt {
                        file: entry.path(),
                        why: format!(
                            "it was committed by a checkpoint newer than the one restored \
                             (which had reached part {restored_next} of subtask {subtask}): \
                             its records would be written a second time. Restore the newest \
                             completed checkpoint, or move the part files committed after \
                             the one restored out of the directory"
                        ),
                    });
                }
                files.next_part = files.next_part.max(number + 1);
            }
        }
        sync_dir(&files.dir)?;
        Ok(files)
    }

    fn path(&self, part: u64, suffix: &str) -> PathBuf {
        self.dir
            .join(format!("part-{}-{part}{suffix}", self.subtask))
    }

    /// Appends `bytes` to the part file being written (started if there is none).
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), CheckpointError> {
        if self.current.is_none() {
            let part = self.next_part;
            self.next_part += 1;
            let path = self.path(part, IN_PROGRESS);
            let file =
                File::create(&path).map_err(|e| CheckpointError::io("creating", &path, e))?;
            self.current = Some((part, BufWriter::with_capacity(64 * 1024, file)));
        }
        let (part, writer) = self.current.as_mut().expect("started");
        let part = *part;
        writer.write_all(bytes).map_err(|e| {
            CheckpointError::io(
                "writing",
                &self
                    .dir
                    .join(format!("part-{}-{part}{IN_PROGRESS}", self.subtask)),
                e,
            )
        })
    }

    /// The barrier of checkpoint `checkpoint` arrived: the part file being written is
    /// flushed, fsync'd and renamed pending (nothing if none was started). Returns the
    /// state the checkpoint stores for this sink.
    pub fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<u8>, CheckpointError> {
        if let Some((part, writer)) = self.current.take() {
            let from = self.path(part, IN_PROGRESS);
            let file = writer
                .into_inner()
                .map_err(|e| CheckpointError::io("flushing", &from, e.into_error()))?;
            file.sync_all()
                .map_err(|e| CheckpointError::io("syncing", &from, e))?;
            let to = self.path(part, PENDING);
            fs::rename(&from, &to).map_err(|e| CheckpointError::io("renaming", &from, e))?;
            sync_dir(&self.dir)?;
            self.pending.entry(checkpoint).or_default().push(part);
        }
        Ok(encode_state(self.next_part, &self.pending))
    }

    /// Checkpoint `checkpoint` completed: the files pre-committed at it and before are
    /// renamed into place. A file already in place is left as it is, so a repeated
    /// commit does nothing.
    pub fn commit(&mut self, checkpoint: u64) -> Result<(), CheckpointError> {
        let done: Vec<u64> = self.pending.range(..=checkpoint).map(|(c, _)| *c).collect();
        if done.is_empty() {
            return Ok(());
        }
        for c in done {
            for part in self.pending.remove(&c).unwrap_or_default() {
                let from = self.path(part, PENDING);
                let to = self.path(part, "");
                match fs::rename(&from, &to) {
                    Ok(()) => {}
                    // Committed before (a repeated notification, or a crash after the
                    // rename and before the checkpoint's state forgot it).
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && to.exists() => {}
                    Err(e) => return Err(CheckpointError::io("committing", &from, e)),
                }
            }
        }
        sync_dir(&self.dir)
    }

    /// The committed part files of `subtask` under `dir`, in part order.
    pub fn committed(dir: &Path, subtask: usize) -> Result<Vec<PathBuf>, CheckpointError> {
        let prefix = format!("part-{subtask}-");
        let mut parts = Vec::new();
        for entry in fs::read_dir(dir).map_err(|e| CheckpointError::io("reading", dir, e))? {
            let entry = entry.map_err(|e| CheckpointError::io("reading", dir, e))?;
            let name = entry.file_name();
            if let Some(number) = name
                .to_str()
                .and_then(|n| n.strip_prefix(&prefix))
                .and_then(|n| n.parse::<u64>().ok())
            {
                parts.push((number, entry.path()));
            }
        }
        parts.sort();
        Ok(parts.into_iter().map(|(_, path)| path).collect())
    }
}

fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| CheckpointError::io("syncing", dir, e))
}

fn encode_state(next_part: u64, pending: &BTreeMap<u64, Vec<u64>>) -> Vec<u8> {
    let mut out = Vec::new();
    STATE_VERSION.encode(&mut out);
    next_part.encode(&mut out);
    (pending.len() as u32).encode(&mut out);
    for (checkpoint, parts) in pending {
        checkpoint.encode(&mut out);
        (parts.len() as u32).encode(&mut out);
        for part in parts {
            part.encode(&mut out);
        }
    }
    out
}

fn decode_state(mut bytes: &[u8]) -> Result<(u64, BTreeMap<u64, Vec<u64>>), DecodeError> {
    let input = &mut bytes;
    let version = u8::decode(input)?;
    if version != STATE_VERSION {
        return Err(DecodeError::InvalidTag(version));
    }
    let next_part = u64::decode(input)?;
    let checkpoints = u32::decode(input)?;
    let mut pending = BTreeMap::new();
    for _ in 0..checkpoints {
        let checkpoint = u64::decode(input)?;
        let count = u32::decode(input)?;
        let parts = (0..count)
            .map(|_| u64::decode(input))
            .collect::<Result<Vec<_>, _>>()?;
        pending.insert(checkpoint, parts);
    }
    if !input.is_empty() {
        return Err(DecodeError::Trailing(input.len()));
    }
    Ok((next_part, pending))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("weir-2pc-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    /// The committed output, line by line.
    fn output(dir: &Path) -> Vec<String> {
        TransactionalFiles::committed(dir, 0)
            .expect("list")
            .iter()
            .flat_map(|p| {
                fs::read_to_string(p)
                    .expect("read")
                    .lines()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn write(files: &mut TransactionalFiles, range: std::ops::Range<u32>) {
        for i in range {
            files.write(format!("{i}\n").as_bytes()).expect("write");
        }
    }

    fn lines(range: std::ops::Range<u32>) -> Vec<String> {
        range.map(|i| i.to_string()).collect()
    }

    /// A crash after checkpoint 2 was taken but before its completion was told to the
    /// sink: the restore from checkpoint 2 commits what it pre-committed and drops what
    /// was written after it; the source's replay writes that again. Every record once.
    #[test]
    fn a_restore_commits_the_checkpoint_and_drops_what_came_after() {
        let dir = scratch("restore");
        let mut files = TransactionalFiles::new(&dir, 0).expect("files");
        write(&mut files, 0..10);
        files.pre_commit(1).expect("pre-commit 1");
        files.commit(1).expect("commit 1");
        write(&mut files, 10..20);
        let state_2 = files.pre_commit(2).expect("pre-commit 2");
        write(&mut files, 20..25);
        // Crash: neither commit(2) nor anything else runs.
        drop(files);
        assert_eq!(output(&dir), lines(0..10));
        let mut files = TransactionalFiles::restore(&dir, 0, Some(&state_2)).expect("restore");
        assert_eq!(output(&dir), lines(0..20));
        // The source replays from checkpoint 2's position.
        write(&mut files, 20..30);
        files.pre_commit(3).expect("pre-commit 3");
        files.commit(3).expect("commit 3");
        assert_eq!(output(&dir), lines(0..30));
        let leftovers: Vec<_> = fs::read_dir(&dir)
            .expect("dir")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_str().is_some_and(|n| n.contains('.')))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        let _ = fs::remove_dir_all(&dir);
    }

    /// Restoring from an older checkpoint (the newer one never completed) drops the
    /// newer one's pending files: their records come again from the source.
    #[test]
    fn pending_files_of_a_checkpoint_that_never_completed_are_dropped() {
        let dir = scratch("older");
        let mut files = TransactionalFiles::new(&dir, 0).expect("files");
        write(&mut files, 0..5);
        let state_1 = files.pre_commit(1).expect("pre-commit 1");
        files.commit(1).expect("commit 1");
        write(&mut files, 5..9);
        files.pre_commit(2).expect("pre-commit 2");
        drop(files);
        let mut files = TransactionalFiles::restore(&dir, 0, Some(&state_1)).expect("restore");
        assert_eq!(output(&dir), lines(0..5));
        write(&mut files, 5..9);
        files.pre_commit(2).expect("pre-commit 2 again");
        files.commit(2).expect("commit 2");
        assert_eq!(output(&dir), lines(0..9));
        let _ = fs::remove_dir_all(&dir);
    }

    /// Restoring a checkpoint older than one that completed and committed files (a
    /// fallback past a damaged newest checkpoint) would write those files' records
    /// again: refused, naming the first such file; nothing is removed.
    #[test]
    fn a_restore_older_than_committed_output_is_refused_by_name() {
        let dir = scratch("behind");
        let mut files = TransactionalFiles::new(&dir, 0).expect("files");
        write(&mut files, 0..5);
        let state_1 = files.pre_commit(1).expect("pre-commit 1");
        files.commit(1).expect("commit 1");
        write(&mut files, 5..9);
        files.pre_commit(2).expect("pre-commit 2");
        files.commit(2).expect("commit 2");
        drop(files);
        let error = TransactionalFiles::restore(&dir, 0, Some(&state_1)).expect_err("refused");
        let text = error.to_string();
        assert!(text.contains("part-0-1"), "{text}");
        assert!(text.contains("newer than the one restored"), "{text}");
        assert_eq!(output(&dir), lines(0..9), "nothing removed");
        let _ = fs::remove_dir_all(&dir);
    }

    /// A commit called twice, or for a checkpoint already committed, commits nothing
    /// twice; a restore from a state whose files were committed already leaves them.
    #[test]
    fn a_commit_called_twice_writes_nothing_twice() {
        let dir = scratch("twice");
        let mut files = TransactionalFiles::new(&dir, 0).expect("files");
        write(&mut files, 0..4);
        let state = files.pre_commit(1).expect("pre-commit");
        files.commit(1).expect("commit");
        files.commit(1).expect("again");
        files.commit(0).expect("older");
        drop(files);
        let files = TransactionalFiles::restore(&dir, 0, Some(&state)).expect("restore");
        drop(files);
        assert_eq!(output(&dir), lines(0..4));
        // A checkpoint with nothing written pre-commits nothing.
        let mut files = TransactionalFiles::restore(&dir, 0, Some(&state)).expect("restore");
        let empty = files.pre_commit(2).expect("empty pre-commit");
        files.commit(2).expect("commit");
        assert_eq!(output(&dir), lines(0..4));
        assert!(decode_state(&empty).expect("state").1.is_empty());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_corrupt_state_is_refused() {
        let dir = scratch("corrupt");
        let mut files = TransactionalFiles::new(&dir, 0).expect("files");
        write(&mut files, 0..2);
        let state = files.pre_commit(1).expect("pre-commit");
        for cut in 0..state.len() {
            assert!(
                TransactionalFiles::restore(&dir, 0, Some(&state[..cut])).is_err(),
                "cut at {cut}"
            );
        }
        let _ = fs::remove_dir_all(&dir);
    }
}
