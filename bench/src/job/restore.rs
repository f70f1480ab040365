//! Where a run starts: a fresh start, a restore, or `--resume`; and the audit of the
//! output committed over every attempt.

use super::*;

use std::path::PathBuf;

/// Why `weir run` cannot run, or why its job stopped: each message says what to change.
/// How a run starts, by the rule that keeps its output exactly once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartPoint {
    /// From this completed checkpoint (its id).
    Checkpoint(u64),
    /// From the start: no checkpoint to restore (none asked for, or none ever completed
    /// in the directory named), and no committed output to write again.
    Fresh,
}

/// Where a run with `settings` starts, or why it must not: the newest completed
/// checkpoint under `--restore` that cannot be read back whole is an error naming the
/// file (never a fresh start), and so is a fresh start over an `--output` that already
/// holds committed part files (they would be written a second time).
pub fn check_start(settings: &JobSettings) -> Result<StartPoint, RunError> {
    check_start_at(
        settings
            .checkpoints
            .as_ref()
            .and_then(|c| c.restore.as_deref()),
        settings.output.as_deref(),
    )
}

/// How `weir run` was asked to start: `--restore`, `--resume` (with the checkpoint
/// directory) and `--restore-fallback`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RestoreRequest<'a> {
    /// `--restore`: a checkpoint directory or one `chk-<id>` directory.
    pub restore: Option<&'a std::path::Path>,
    /// `--resume`: the checkpoint directory, which may not exist yet.
    pub resume: Option<&'a std::path::Path>,
    /// `--restore-fallback`.
    pub fallback: bool,
}

/// What a run restores, decided before anything starts and said on stderr: the path
/// to restore (`None`: from the beginning). `--resume` over a directory where no
/// checkpoint ever completed (or that does not exist yet) starts from the beginning;
/// `--restore-fallback` passes over a newest completed checkpoint that cannot be read
/// back for the newest older one that can, naming each one passed over. Everything
/// else is left to [`check_start_at`], which refuses what would break exactly-once.
pub fn resolve_restore(request: &RestoreRequest<'_>) -> Result<Option<PathBuf>, RunError> {
    use weir_engine::checkpoint::storage;
    if request.fallback && request.restore.is_none() && request.resume.is_none() {
        return Err(RunError::Setting(
            "--restore-fallback chooses among the checkpoints --restore DIR or --resume \
             restores: give one of them"
                .into(),
        ));
    }
    let Some(dir) = request.restore.or(request.resume) else {
        return Ok(None);
    };
    if request.resume.is_some() {
        let newest = storage::newest_completed(dir);
        if matches!(newest, Ok(None)) {
            eprintln!(
                "weir: --resume: no checkpoint ever completed under {}: starting from the \
                 beginning",
                dir.display()
            );
            return Ok(None);
        }
    }
    let explicit = dir.join(storage::METADATA).exists() || storage::checkpoint_id(dir).is_some();
    if !request.fallback || explicit || !dir.exists() {
        return Ok(Some(dir.to_path_buf()));
    }
    match storage::fallback_point(dir) {
        Ok(Some(restored)) if !restored.skipped.is_empty() => {
            for (path, error) in &restored.skipped {
                eprintln!(
                    "weir: --restore-fallback: passing over {}: {error}",
                    path.display()
                );
            }
            eprintln!(
                "weir: --restore-fallback: restoring the older checkpoint {} ({})",
                restored.metadata.id,
                restored.path.display()
            );
            Ok(Some(restored.path))
        }
        Ok(_) => Ok(Some(dir.to_path_buf())),
        Err(error) => Err(RunError::Setting(format!(
            "--restore-fallback: no completed checkpoint under {} can be read back: {error}",
            dir.display()
        ))),
    }
}

/// [`check_start`] for a run restoring from `restore` and writing `output`.
pub fn check_start_at(
    restore: Option<&std::path::Path>,
    output: Option<&std::path::Path>,
) -> Result<StartPoint, RunError> {
    let start = match restore {
        Some(path) => {
            if !path.exists() {
                return Err(RunError::Setting(format!(
                    "--restore {}: no such file or directory; name a checkpoint directory \
                     (--checkpoint-dir of the run to restore) or one of its chk-<id> directories",
                    path.display()
                )));
            }
            let explicit = path
                .join(weir_engine::checkpoint::storage::METADATA)
                .exists()
                || weir_engine::checkpoint::storage::checkpoint_id(path).is_some();
            let found = if explicit {
                weir_engine::checkpoint::storage::read_checkpoint(path).map(Some)
            } else {
                weir_engine::checkpoint::storage::restore_point(path)
            };
            match found {
                Ok(Some(restored)) => StartPoint::Checkpoint(restored.metadata.id),
                Ok(None) => StartPoint::Fresh,
                Err(error) => return Err(RunError::Setting(format!("--restore: {error}"))),
            }
        }
        None => StartPoint::Fresh,
    };
    if let (StartPoint::Fresh, Some(output)) = (&start, output) {
        let committed = committed_parts(output)?;
        if !committed.is_empty() {
            return Err(RunError::Setting(format!(
                "--output {} holds {} committed part files of an earlier run, and this run \
                 starts from the beginning ({}): it would write their records a second time. \
                 Restore the checkpoint that committed them, or remove the directory",
                output.display(),
                committed.len(),
                match restore {
                    Some(path) => format!("no checkpoint ever completed under {}", path.display()),
                    None => "no --restore".to_string(),
                }
            )));
        }
    }
    Ok(start)
}

/// The committed part files under `dir` (names `part-<subtask>-<n>`, no suffix); none
/// if it does not exist.
pub fn committed_parts(dir: &std::path::Path) -> Result<Vec<PathBuf>, RunError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(RunError::Setting(format!(
                "--output {}: cannot read it: {e}",
                dir.display()
            )))
        }
    };
    let mut parts = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let committed = name.strip_prefix("part-").is_some_and(|rest| {
            rest.split_once('-').is_some_and(|(subtask, n)| {
                subtask.parse::<u64>().is_ok() && n.parse::<u64>().is_ok()
            })
        });
        if committed {
            parts.push(entry.path());
        }
    }
    parts.sort();
    Ok(parts)
}

/// What the committed output holds, over every attempt that wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutputAudit {
    /// Committed part files.
    pub files: usize,
    /// Lines in them.
    pub lines: u64,
    /// Distinct record ids in `0..records`.
    pub unique: u64,
    /// Lines beyond the first of an id (or outside `0..records`, or unreadable).
    pub duplicated: u64,
    /// Ids of `0..records` no committed line holds.
    pub lost: u64,
}

/// An audit as the summaries print it.
pub fn audit_text(audit: &OutputAudit) -> String {
    format!(
        "{} lost / {} duplicated over every attempt ({} distinct ids, {} lines in {} \
         committed part files)",
        audit.lost, audit.duplicated, audit.unique, audit.lines, audit.files
    )
}

/// Reads every committed part file under `dir` and counts each record id of
/// `0..records` (the first field of each line): the exactly-once check over every
/// attempt of a run, restarts and restores included.
pub fn audit_output(dir: &std::path::Path, records: u64) -> Result<OutputAudit, RunError> {
    use std::io::BufRead;
    let mut seen = vec![0u64; (records as usize).div_ceil(64)];
    let mut audit = OutputAudit::default();
    for path in committed_parts(dir)? {
        audit.files += 1;
        let file = std::fs::File::open(&path)
            .map_err(|e| RunError::Setting(format!("cannot read {}: {e}", path.display())))?;
        for line in std::io::BufReader::new(file).split(b'\n') {
            let line = line
                .map_err(|e| RunError::Setting(format!("cannot read {}: {e}", path.display())))?;
            audit.lines += 1;
            let id = line
                .split(|b| *b == b' ')
                .next()
                .and_then(|f| std::str::from_utf8(f).ok())
                .and_then(|f| f.parse::<u64>().ok())
                .filter(|id| *id < records);
            match id {
                Some(id) => {
                    let (word, bit) = ((id / 64) as usize, 1u64 << (id % 64));
                    if seen[word] & bit != 0 {
                        audit.duplicated += 1;
                    } else {
                        seen[word] |= bit;
                        audit.unique += 1;
                    }
                }
                None => audit.duplicated += 1,
            }
        }
    }
    audit.lost = records - audit.unique;
    Ok(audit)
}
