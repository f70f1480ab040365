//! Filling streams for the main job: `weir produce-stream` and the stream benchmark.
//!
//! Each entry is what the main job's stream source reads (`job::record_fields`):
//! `id` (unique over every stream of the server's database: the ids are reserved with
//! one `INCRBY` of [`ID_COUNTER`], so streams filled by several producers, or several
//! times, never share one, and a job reading them all checks each arrives once), `key`
//! (drawn as the generator draws them), and `t`, when it was appended (nanoseconds
//! since the Unix epoch), from which the job measures latency end to end.

use std::time::{Duration, Instant};

use weir_net::redis::streams::Producer;
use weir_net::redis::RedisError;
use weir_net::redis::RedisUrl;

use crate::job::KeyDistribution;

/// The key whose value is the next free record id.
pub const ID_COUNTER: &str = "weir:produce-stream:next-id";

/// How often a rate-limited producer appends what became due (in one pipelined write).
const PACE_STEP: Duration = Duration::from_millis(1);

/// What [`produce_records`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Produced {
    /// Entries appended.
    pub entries: u64,
    /// The first record id (they run `first_id..first_id + entries`).
    pub first_id: u64,
    /// Bytes of fields and values.
    pub bytes: u64,
    /// Wall time.
    pub elapsed: Duration,
}

/// What [`produce_records`] appends.
#[derive(Debug, Clone, Copy)]
pub struct ProduceSpec {
    /// Entries.
    pub count: u64,
    /// Entries a second; `None`: as fast as Redis takes them.
    pub rate: Option<f64>,
    /// How keys are drawn.
    pub keys: KeyDistribution,
    /// Trim the stream to about this many entries.
    pub maxlen: Option<u64>,
}

/// Appends `spec.count` main-job records to `stream` on `url`; `progress` is told how
/// many are done after each write, and `stop` ends it early (checked between writes).
pub fn produce_records(
    url: &RedisUrl,
    stream: &str,
    spec: ProduceSpec,
    mut progress: impl FnMut(u64),
    stop: &dyn Fn() -> bool,
) -> Result<Produced, RedisError> {
    let ProduceSpec {
        count,
        rate,
        keys,
        maxlen,
    } = spec;
    let mut producer = Producer::connect(url, stream, maxlen)?;
    let count_text = count.to_string();
    let reserved = producer.connection().command(&[
        b"INCRBY",
        ID_COUNTER.as_bytes(),
        count_text.as_bytes(),
    ])?;
    let first_id = match reserved {
        redis_protocol::resp2::types::OwnedFrame::Integer(next) if next >= count as i64 => {
            next as u64 - count
        }
        other => {
            return Err(RedisError::Malformed {
                addr: url.to_string(),
                reason: format!("INCRBY {ID_COUNTER} answered {other:?}, not the ids reserved"),
            })
        }
    };
    let mut draw = KeyDraw::new(keys, first_id);
    let started = Instant::now();
    let mut done = 0;
    let mut bytes = 0;
    while done < count && !stop() {
        let due = match rate {
            None => count - done,
            Some(rate) => {
                let due = ((started.elapsed().as_secs_f64() * rate) as u64).min(count);
                if due <= done {
                    std::thread::sleep(PACE_STEP);
                    continue;
                }
                due - done
            }
        }
        .min(16 * 1024);
        let report = producer.append(due, |n, fields| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            fields
                .push_fmt("id", format_args!("{}", first_id + n))
                .push_fmt("key", format_args!("{}", draw.next()))
                .push_fmt("t", format_args!("{t}"));
        })?;
        done += report.entries;
        bytes += report.bytes;
        progress(done);
    }
    Ok(Produced {
        entries: done,
        first_id,
        bytes,
        elapsed: started.elapsed(),
    })
}

/// Keys as the generator draws them (xorshift64*, seeded by the first id).
struct KeyDraw {
    keys: KeyDistribution,
    rng: u64,
}

impl KeyDraw {
    fn new(keys: KeyDistribution, seed: u64) -> Self {
        KeyDraw {
            keys,
            rng: (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x2545_F491) | 1,
        }
    }

    fn next(&mut self) -> u64 {
        let r = crate::job::xorshift64star(&mut self.rng);
        let rng = &mut self.rng;
        self.keys.draw(r, || crate::job::xorshift64star(rng))
    }
}

/// The stream's length (`XLEN`).
pub fn stream_len(url: &RedisUrl, stream: &str) -> Result<u64, RedisError> {
    let mut connection = weir_net::redis::BlockingConnection::connect(url, Duration::from_secs(2))?;
    match connection.command(&[b"XLEN", stream.as_bytes()])? {
        redis_protocol::resp2::types::OwnedFrame::Integer(n) if n >= 0 => Ok(n as u64),
        other => Err(RedisError::Malformed {
            addr: url.to_string(),
            reason: format!("XLEN {stream} answered {other:?}"),
        }),
    }
}
