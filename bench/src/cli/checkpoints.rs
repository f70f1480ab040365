//! `weir checkpoints`: the table of a checkpoint directory.

/// `ms` since the Unix epoch as `YYYY-MM-DD hh:mm:ss.mmm` in UTC (days to a civil date by
/// Howard Hinnant's algorithm, which needs no time-zone data).
pub(crate) fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let (h, mi, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {h:02}:{mi:02}:{s:02}.{:03}",
        ms % 1000
    )
}

/// `weir checkpoints`' table: one line per checkpoint directory, newest first. The
/// newest completed one (`newest`) is what `--restore DIR` takes, and only it: where it
/// cannot be read back, the restore is refused (an older one is restored only when its
/// directory is named, or with `--restore-fallback`).
pub(crate) fn checkpoint_table(
    listing: &[weir_engine::checkpoint::storage::Listing],
    newest: Option<u64>,
) -> String {
    use std::fmt::Write as _;
    if listing.is_empty() {
        return match newest {
            Some(id) => format!(
                "no checkpoint directories, though checkpoint {id} completed here: --restore \
                 refuses this directory\n"
            ),
            None => "no checkpoints\n".to_string(),
        };
    }
    let mut out = String::from(
        "| id | taken (UTC) | duration | size | tasks | restore |\n|---:|---|---:|---:|---:|---|\n",
    );
    for entry in listing {
        let latest = Some(entry.id) == newest;
        match &entry.metadata {
            Ok(m) => {
                let note = if latest {
                    "valid, the latest: --restore takes it"
                } else {
                    "valid (older: restored when named, or by --restore-fallback)"
                };
                let _ = writeln!(
                    out,
                    "| {} | {} | {:.1} ms | {} B | {} | {note} |",
                    m.id,
                    utc(m.triggered_unix_ms),
                    m.duration.as_secs_f64() * 1e3,
                    m.state_bytes(),
                    m.tasks.len()
                );
            }
            Err(error) => {
                let note = if latest {
                    "the latest completed, unreadable: --restore refuses it, --restore-fallback passes over it"
                } else if newest.is_some_and(|n| entry.id > n) {
                    "never completed: skipped"
                } else {
                    "not usable"
                };
                let _ = writeln!(out, "| {} | — | — | — | — | {note}: {error} |", entry.id);
            }
        }
    }
    out
}
