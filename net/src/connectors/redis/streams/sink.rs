//! The Redis Streams sink: each record becomes one entry appended to a stream with
//! `XADD`, pipelined on the worker's own driver over one connection (`super::conn`).
//!
//! A user function writes each record's field/value pairs into a [`Fields`]; the sink
//! encodes `XADD stream [MAXLEN ~ n] * field value ...` (approximate trimming when a
//! `maxlen` is set: Redis trims whole radix-tree nodes, so the stream stays near the
//! bound, slightly above it, at a fraction of exact trimming's cost).
//!
//! **At least once** ([`Guarantee::AtLeastOnce`], the default): every record is sent at
//! once and kept, in order, until its `XADD` is answered. At most `max_in_flight` may be
//! unanswered; beyond, [`Sink::accepts`] says no and the task holds its input back
//! (back-pressure). An error reply fails the job with the server's message and the
//! stream's name. When the connection is lost, every unanswered `XADD` is sent again,
//! in order, once it is made again: an `XADD` the server applied but whose reply was
//! lost is then written twice. That is what at least once means; readers that must not
//! see duplicates deduplicate on a field of their own (e.g. a record id). At a
//! checkpoint barrier the unanswered entries are the sink's state, so that a job
//! restored from that checkpoint sends them again: nothing given to the sink before a
//! barrier is lost, even if the process dies right after the checkpoint completes.
//!
//! **Exactly once** ([`Guarantee::ExactlyOnce`], in a job that checkpoints): a two-phase
//! commit (Flink's `TwoPhaseCommitSinkFunction`) whose transaction is a `MULTI`/`EXEC`.
//! The records since the last barrier are buffered in memory, not written. At barrier
//! `N` they become pending transaction `N`, and the state the checkpoint stores is
//! every pending transaction (pre-commit). When checkpoint `N` completes, each pending
//! transaction up to `N` is written, one after the other, as `MULTI`, its `XADD`s,
//! `SET {marker} N`, `EXEC` (one pipelined write); it stays pending until its `EXEC` is
//! answered. The marker key
//! (`{transaction_prefix}:{subtask}`) is written in the same transaction as the
//! entries, so it says which transactions are in the stream: before committing
//! after a restore, and after a connection lost while an `EXEC` was unanswered, the
//! sink reads it (`GET`) and drops the pending transactions up to it. A restore that
//! commits again therefore writes nothing twice. A job that starts fresh (restores
//! nothing) deletes its marker before its first commit, so that a marker left by an
//! earlier job, whose checkpoint ids ran higher, does not hide its transactions.
//!
//! Entries are invisible to readers until their checkpoint completes (as Kafka's
//! read-committed consumers see a transactional producer's output): the latency of the
//! output is the checkpoint interval. The buffer holds one checkpoint interval of
//! records per subtask, and `max_reply_bytes` must fit an `EXEC`'s reply (about 25
//! bytes an entry). In a job that does not checkpoint there are no checkpoints to commit
//! at, so an exactly-once sink writes at once, as at least once.
//!
//! Redis does not roll a transaction back when one of its commands fails at run time
//! (an `XADD` to a key holding a string, say): the rest of it, the marker included, is
//! applied. The sink fails the job with the server's message in that case; its output
//! for that checkpoint is then incomplete for good (the marker moved, so a restart takes
//! the checkpoint as committed), and the key must be fixed before a restart.
//!
//! A restore from a checkpoint older than the marker (a later run committed past it)
//! deletes the marker before its first commit: this run's checkpoint ids start below
//! it again, and a marker read after a lost `EXEC` must see only this run's commits.
//! What the later run wrote stays; what this run writes again is in the stream twice.
//!
//! Connection losses, and error replies that say the server cannot take commands *for
//! now* (`LOADING` while a restarted server reads its data, `BUSY`, `TRYAGAIN`,
//! `MASTERDOWN`), are retried with a back-off for `retry_timeout`, then fail the job
//! with the last one; a refused `AUTH` or `SELECT`, and any other error reply, fail it
//! at once. At least once, an entry refused for now is sent again behind the ones
//! already in flight, so after such a refusal entries may be out of their input order
//! (after a loss they are repeated, not reordered). Exactly once, a transaction with a
//! refused command is discarded whole by the server (`EXECABORT`, the marker unchanged)
//! and committed again; transactions are committed one at a time, so that none commits
//! (and moves the marker) before an earlier one that was refused.
//! [`StreamSinkStats`] counts what every subtask did.
//!
//! Invariants:
//! 1. `expected` lists what each reply due on the connection answers, in the order the
//!    commands were queued; `ConnEvent::Lost` empties both.
//! 2. At most one transaction's commit is queued: the front of `pending`, when `sent`
//!    (its `sent_entries` entries count as in flight); they commit in checkpoint order.
//! 3. Connection events are drained (`Writer::pump`) before the sink queues anything,
//!    so a command queued after a loss is never re-sent by that loss's handling.

use std::cell::{RefCell, RefMut};
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis_protocol::resp2::types::OwnedFrame;
use weir_engine::graph::{IoHandler, Sink, SubtaskInfo};
use weir_engine::runtime::{Driver, DriverEvent, TaskError};

use super::super::client::{Backoff, MAX_REPLY_BYTES_DEFAULT};
use super::super::error::RedisError;
use super::super::url::RedisUrl;
use super::conn::{ConnEvent, ConnSettings, StreamConn};

/// Which delivery guarantee a [`StreamSink`] gives; see the module docs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Guarantee {
    /// Every record is written; a connection loss may write some twice.
    #[default]
    AtLeastOnce,
    /// Every record is written once, visible when its checkpoint completes (needs a job
    /// that checkpoints; without checkpoints it is [`AtLeastOnce`](Self::AtLeastOnce)).
    ExactlyOnce,
}

/// Settings of a [`StreamSink`].
#[derive(Debug, Clone)]
pub struct StreamSinkConfig {
    /// The server, credentials and database (the sink speaks RESP2).
    pub url: RedisUrl,
    /// The stream's key.
    pub stream: String,
    /// Trim the stream to about this many entries with each `XADD` (`MAXLEN ~ n`);
    /// `None`: no trimming.
    pub maxlen: Option<u64>,
    /// At least once, or exactly once.
    pub guarantee: Guarantee,
    /// The exactly-once marker key of subtask `i` is `{transaction_prefix}:{i}`; it must
    /// not be shared with another job's sink.
    pub transaction_prefix: String,
    /// Entries written but not yet answered at most; beyond, the sink holds its input
    /// back.
    pub max_in_flight: usize,
    /// Connect plus `AUTH`/`SELECT` within this, or the attempt fails.
    pub connect_timeout: Duration,
    /// Each reply whole within this of its command being sent, or the connection is
    /// closed and made again.
    pub response_timeout: Duration,
    /// Reconnection back-off.
    pub backoff: Backoff,
    /// How long work may wait on a lost connection, or on a server that refuses
    /// commands for now (`LOADING` after a restart, `BUSY`...), before the job fails
    /// with the last loss or refusal.
    pub retry_timeout: Duration,
    /// Largest reply buffered (an exactly-once `EXEC` answers one id per entry).
    pub max_reply_bytes: usize,
    /// Counters every sink made from this configuration (or a clone) adds to.
    pub stats: Arc<StreamSinkStats>,
}

impl StreamSinkConfig {
    /// Defaults for appending to `stream` at `url`: at least once, no trimming, marker
    /// prefix `weir:sink:{stream}`, 1024 entries in flight, 1 s connect timeout, 10 s
    /// response timeout, back-off 10 ms doubling to 1 s, 30 s retry timeout, replies up
    /// to [`MAX_REPLY_BYTES_DEFAULT`].
    pub fn new(url: RedisUrl, stream: impl Into<String>) -> Self {
        let stream = stream.into();
        StreamSinkConfig {
            url,
            transaction_prefix: format!("weir:sink:{stream}"),
            stream,
            maxlen: None,
            guarantee: Guarantee::AtLeastOnce,
            max_in_flight: 1024,
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(10),
            backoff: Backoff {
                initial: Duration::from_millis(10),
                max: Duration::from_secs(1),
            },
            retry_timeout: Duration::from_secs(30),
            max_reply_bytes: MAX_REPLY_BYTES_DEFAULT,
            stats: Arc::default(),
        }
    }

    /// Checks the settings ([`validate`](Self::validate)) and resolves the server's
    /// address (blocking).
    pub fn check(&self) -> Result<SocketAddr, RedisError> {
        self.validate()?;
        Ok(self.url.resolve()?)
    }

    /// Checks the settings; the error says what to change.
    pub fn validate(&self) -> Result<(), RedisError> {
        let problem = if self.stream.is_empty() {
            Some("the stream name is empty: name the stream's key")
        } else if self.maxlen == Some(0) {
            Some("maxlen 0 would trim every entry: use None for no trimming")
        } else if self.guarantee == Guarantee::ExactlyOnce && self.transaction_prefix.is_empty() {
            Some("an exactly-once sink needs a transaction_prefix for its marker keys")
        } else if self.max_in_flight == 0 {
            Some("max_in_flight must be at least 1")
        } else if self.connect_timeout.is_zero()
            || self.response_timeout.is_zero()
            || self.retry_timeout.is_zero()
        {
            Some("connect, response and retry timeouts must be positive")
        } else if self.backoff.initial > self.backoff.max {
            Some("the initial back-off must not exceed the maximum")
        } else if self.max_reply_bytes == 0 {
            Some("max_reply_bytes must be positive")
        } else {
            None
        };
        match problem {
            Some(problem) => Err(RedisError::Config(format!(
                "stream sink for {:?}: {problem}",
                self.stream
            ))),
            None => Ok(()),
        }
    }
}

/// What the stream sinks of a configuration did, as [`StreamSinkStats::snapshot`]
/// reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamSinkCounts {
    /// Entries written (their `XADD` answered, or their transaction committed).
    pub entries: u64,
    /// Commands queued (`XADD`, `MULTI`, `SET`, `EXEC`, `GET`, `DEL`), re-sent ones
    /// included.
    pub commands: u64,
    /// Exactly-once transactions committed (ones a restore found committed included).
    pub transactions: u64,
    /// Connections lost once made (each made again while work waits; the failed
    /// attempts in between are not counted).
    pub reconnects: u64,
    /// Error replies: a transient one (`LOADING`, `BUSY`, `TRYAGAIN`, `MASTERDOWN`) is
    /// retried, any other fails the job.
    pub errors: u64,
}

/// Counters the stream sinks of a configuration add to (each at its flushes), for a
/// report during or after a run.
#[derive(Debug, Default)]
pub struct StreamSinkStats {
    entries: AtomicU64,
    commands: AtomicU64,
    transactions: AtomicU64,
    reconnects: AtomicU64,
    errors: AtomicU64,
}

impl StreamSinkStats {
    /// The sums so far.
    pub fn snapshot(&self) -> StreamSinkCounts {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StreamSinkCounts {
            entries: get(&self.entries),
            commands: get(&self.commands),
            transactions: get(&self.transactions),
            reconnects: get(&self.reconnects),
            errors: get(&self.errors),
        }
    }

    fn add(&self, now: &StreamSinkCounts, before: &StreamSinkCounts) {
        let add = |a: &AtomicU64, n: u64, b: u64| {
            if n != b {
                a.fetch_add(n - b, Ordering::Relaxed);
            }
        };
        add(&self.entries, now.entries, before.entries);
        add(&self.commands, now.commands, before.commands);
        add(&self.transactions, now.transactions, before.transactions);
        add(&self.reconnects, now.reconnects, before.reconnects);
        add(&self.errors, now.errors, before.errors);
    }
}

/// The field/value pairs of one stream entry, as the format function writes them.
#[derive(Debug, Clone, Default)]
pub struct Fields {
    bytes: Vec<u8>,
    /// End of each field and each value in `bytes`, alternating.
    ends: Vec<usize>,
}

impl Fields {
    /// No pairs.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a field and its value.
    pub fn push(&mut self, field: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> &mut Self {
        self.push_arg(field.as_ref());
        self.push_arg(value.as_ref());
        self
    }

    /// Appends a field and a value written by `format_args!` (e.g. a number), without
    /// an intermediate `String`.
    pub fn push_fmt(
        &mut self,
        field: impl AsRef<[u8]>,
        value: std::fmt::Arguments<'_>,
    ) -> &mut Self {
        use std::io::Write as _;
        self.push_arg(field.as_ref());
        // Writing into a Vec cannot fail.
        let _ = self.bytes.write_fmt(value);
        self.ends.push(self.bytes.len());
        self
    }

    fn push_arg(&mut self, arg: &[u8]) {
        self.bytes.extend_from_slice(arg);
        self.ends.push(self.bytes.len());
    }

    /// Pairs written.
    pub fn len(&self) -> usize {
        self.ends.len() / 2
    }

    /// Whether none was written.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Pair `i`.
    pub fn get(&self, i: usize) -> Option<(&[u8], &[u8])> {
        (i < self.len()).then(|| (self.arg(2 * i), self.arg(2 * i + 1)))
    }

    /// The pairs in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        (0..self.len()).map(|i| (self.arg(2 * i), self.arg(2 * i + 1)))
    }

    /// Removes every pair (keeping the memory).
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }

    fn arg(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start..self.ends[i]]
    }

    /// Fields and values alternating, as `XADD` takes them.
    pub(crate) fn args(&self) -> impl Iterator<Item = &[u8]> + Clone + '_ {
        (0..self.ends.len()).map(|i| self.arg(i))
    }

    /// Bytes of fields and values together.
    pub(crate) fn size(&self) -> usize {
        self.bytes.len()
    }
}

/// Arguments an `XADD` passes from the stack; one with more (over 13 pairs) allocates.
const XADD_ARGS_INLINE: usize = 32;

/// Calls `f` with the arguments of `XADD stream [MAXLEN ~ maxlen] * field value ...`.
pub(crate) fn with_xadd_args<'a, R>(
    stream: &'a [u8],
    maxlen: Option<&'a [u8]>,
    fields: impl Iterator<Item = &'a [u8]>,
    f: impl FnOnce(&[&[u8]]) -> R,
) -> R {
    let trim = maxlen
        .into_iter()
        .flat_map(|n| [b"MAXLEN".as_slice(), b"~".as_slice(), n]);
    let args = [b"XADD".as_slice(), stream]
        .into_iter()
        .chain(trim)
        .chain(std::iter::once(b"*".as_slice()))
        .chain(fields);
    let mut inline: [&[u8]; XADD_ARGS_INLINE] = [&[]; XADD_ARGS_INLINE];
    let mut spilled: Vec<&[u8]> = Vec::new();
    let mut count = 0;
    for arg in args {
        if count < XADD_ARGS_INLINE {
            inline[count] = arg;
        } else {
            if spilled.is_empty() {
                spilled.extend_from_slice(&inline);
            }
            spilled.push(arg);
        }
        count += 1;
    }
    if count <= XADD_ARGS_INLINE {
        f(&inline[..count])
    } else {
        f(&spilled)
    }
}

/// Entries in order, each a list of arguments (fields and values alternating), in flat
/// buffers: pushing and popping allocate nothing once the buffers have grown.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct EntryLog {
    bytes: Vec<u8>,
    /// End of each argument in `bytes`.
    arg_ends: Vec<usize>,
    /// One past each entry's last argument, as an index into `arg_ends`.
    entry_ends: Vec<usize>,
    /// Entries popped from the front (their bytes are dropped at the next compaction).
    head: usize,
}

/// Popped entries at least kept before a compaction moves the rest to the front.
const COMPACT_MIN: usize = 1024;

impl EntryLog {
    fn len(&self) -> usize {
        self.entry_ends.len() - self.head
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn push<'a>(&mut self, args: impl Iterator<Item = &'a [u8]>) {
        for arg in args {
            self.bytes.extend_from_slice(arg);
            self.arg_ends.push(self.bytes.len());
        }
        self.entry_ends.push(self.arg_ends.len());
    }

    /// Entry `index` (counted from the front)'s arguments.
    fn entry(&self, index: usize) -> impl Iterator<Item = &[u8]> + Clone + '_ {
        let at = self.head + index;
        debug_assert!(at < self.entry_ends.len());
        let first = if at == 0 { 0 } else { self.entry_ends[at - 1] };
        (first..self.entry_ends[at]).map(move |arg| {
            let start = if arg == 0 { 0 } else { self.arg_ends[arg - 1] };
            &self.bytes[start..self.arg_ends[arg]]
        })
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.arg_ends.clear();
        self.entry_ends.clear();
        self.head = 0;
    }

    fn pop_front(&mut self) {
        assert!(!self.is_empty(), "pop from an empty entry log");
        self.head += 1;
        if self.head == self.entry_ends.len() {
            self.clear();
        } else if self.head >= COMPACT_MIN && 2 * self.head >= self.entry_ends.len() {
            // At least half is dead: moving the rest costs no more than what was
            // popped since the last compaction (amortized O(1) a pop).
            let first_arg = self.entry_ends[self.head - 1];
            let first_byte = if first_arg == 0 {
                0
            } else {
                self.arg_ends[first_arg - 1]
            };
            self.bytes.drain(..first_byte);
            self.arg_ends.drain(..first_arg);
            self.arg_ends.iter_mut().for_each(|end| *end -= first_byte);
            self.entry_ends.drain(..self.head);
            self.entry_ends.iter_mut().for_each(|end| *end -= first_arg);
            self.head = 0;
        }
    }

    /// Appends `[u32 entries]` then each entry: `[u32 arguments]`, each `[u32 size]`
    /// and its bytes (little-endian).
    /// The entries of `logs` one after the other, as one log.
    fn encode(logs: &[&EntryLog], out: &mut Vec<u8>) {
        push_u32(out, logs.iter().map(|log| log.len()).sum());
        for log in logs {
            for index in 0..log.len() {
                let args = log.entry(index);
                push_u32(out, args.clone().count());
                for arg in args {
                    push_u32(out, arg.len());
                    out.extend_from_slice(arg);
                }
            }
        }
    }

    fn decode(input: &mut &[u8]) -> Result<Self, String> {
        let mut log = EntryLog::default();
        // Each entry takes at least its count's 4 bytes: a bound before reserving.
        let entries = take_count(input, 4, "entries")?;
        log.entry_ends.reserve(entries);
        for _ in 0..entries {
            let args = take_count(input, 4, "arguments")?;
            for _ in 0..args {
                let size = take_count(input, 1, "bytes")?;
                let (arg, rest) = input.split_at(size);
                log.bytes.extend_from_slice(arg);
                log.arg_ends.push(log.bytes.len());
                *input = rest;
            }
            log.entry_ends.push(log.arg_ends.len());
        }
        Ok(log)
    }
}

fn push_u32(out: &mut Vec<u8>, n: usize) {
    let n = u32::try_from(n).expect("a checkpointed count or size fits 32 bits");
    out.extend_from_slice(&n.to_le_bytes());
}

fn take<const N: usize>(input: &mut &[u8], what: &str) -> Result<[u8; N], String> {
    if input.len() < N {
        return Err(format!("cut short reading {what}"));
    }
    let (head, rest) = input.split_at(N);
    *input = rest;
    Ok(head.try_into().expect("split at N"))
}

/// A count of items of at least `item_size` bytes each, refused if the input is too
/// short to hold them.
fn take_count(input: &mut &[u8], item_size: usize, what: &str) -> Result<usize, String> {
    let count = u32::from_le_bytes(take::<4>(input, what)?) as usize;
    if count.saturating_mul(item_size) > input.len() {
        return Err(format!(
            "{count} {what} announced, {} bytes left",
            input.len()
        ));
    }
    Ok(count)
}

/// Version byte of the checkpointed state.
const STATE_VERSION: u8 = 1;

/// A pre-committed transaction: the entries of one checkpoint interval.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Transaction {
    checkpoint: u64,
    entries: EntryLog,
}

/// The checkpointed state: `[version]`, the unanswered at-least-once entries, then
/// `[u32 transactions]`, each `[u64 checkpoint]` and its entries.
fn encode_state(plain: &[&EntryLog], pending: &VecDeque<Transaction>) -> Vec<u8> {
    let mut out = vec![STATE_VERSION];
    EntryLog::encode(plain, &mut out);
    push_u32(&mut out, pending.len());
    for transaction in pending {
        out.extend_from_slice(&transaction.checkpoint.to_le_bytes());
        EntryLog::encode(&[&transaction.entries], &mut out);
    }
    out
}

fn decode_state(mut input: &[u8]) -> Result<(EntryLog, VecDeque<Transaction>), String> {
    let input = &mut input;
    let [version] = take::<1>(input, "the version")?;
    if version != STATE_VERSION {
        return Err(format!(
            "version {version}, this build reads version {STATE_VERSION}"
        ));
    }
    let plain = EntryLog::decode(input)?;
    let count = take_count(input, 12, "transactions")?;
    let mut pending = VecDeque::with_capacity(count);
    for _ in 0..count {
        let checkpoint = u64::from_le_bytes(take::<8>(input, "a checkpoint id")?);
        if pending
            .back()
            .is_some_and(|t: &Transaction| t.checkpoint >= checkpoint)
        {
            return Err("transactions out of checkpoint order".into());
        }
        let entries = EntryLog::decode(input)?;
        pending.push_back(Transaction {
            checkpoint,
            entries,
        });
    }
    if !input.is_empty() {
        return Err(format!("{} bytes after the end", input.len()));
    }
    Ok((plain, pending))
}

/// What a reply due answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// An at-least-once `XADD`: its entry is the front of `plain`.
    Xadd,
    /// A transaction's `MULTI`.
    Multi,
    /// A command inside a transaction (`QUEUED`, or an error that aborts it).
    Queued,
    /// A transaction's `EXEC`: the front transaction of `pending`.
    Exec,
    /// `GET` of the marker.
    Marker,
    /// `DEL` of the marker (a fresh job).
    Reset,
}

/// Where an exactly-once sink stands with its marker key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MarkerState {
    /// A fresh job: the marker may hold an earlier job's checkpoint id; it is deleted
    /// before the first commit.
    Fresh,
    /// `DEL` sent.
    Resetting,
    /// The marker may have moved since it was last known (a restore; a connection lost
    /// with an `EXEC` unanswered): it is read before the next commit.
    Stale,
    /// `GET` sent.
    Reading,
    /// Known: commits go out.
    Known,
}

/// Whether an error reply says the server cannot take the command *now* (loading its
/// data after a restart, running a long script, a replica that lost its primary), so
/// that the same command may succeed later.
fn is_transient_reply(message: &str) -> bool {
    matches!(
        message.split(' ').next(),
        Some("LOADING" | "BUSY" | "TRYAGAIN" | "MASTERDOWN")
    )
}

/// The connection and what its replies answer (kept together: invariant 1).
struct Outgoing {
    conn: StreamConn,
    expected: VecDeque<Expect>,
    commands: u64,
}

impl Outgoing {
    fn command(&mut self, args: &[&[u8]], expect: Expect) {
        self.conn.command(args);
        self.expected.push_back(expect);
        self.commands += 1;
    }

    fn xadd<'a>(
        &mut self,
        stream: &'a [u8],
        maxlen: Option<&'a [u8]>,
        fields: impl Iterator<Item = &'a [u8]>,
        expect: Expect,
    ) {
        with_xadd_args(stream, maxlen, fields, |args| self.command(args, expect));
    }
}

/// The sink's state, shared (through `Rc<RefCell<_>>`) between the [`StreamSink`] in
/// the task's chain and the I/O handler the task drives.
struct Writer {
    out: Outgoing,
    stream: String,
    /// `maxlen` in decimal.
    maxlen: Option<Vec<u8>>,
    marker: String,
    /// Exactly once in a job that checkpoints.
    transactional: bool,
    max_in_flight: usize,
    backoff: Backoff,
    retry_timeout: Duration,
    /// At-least-once entries sent and not answered, in order.
    plain: EntryLog,
    /// At-least-once entries refused for now (a transient error reply), sent again at
    /// `retry_at_ns`.
    retry: EntryLog,
    /// Exactly once: the entries since the last barrier.
    buffer: EntryLog,
    /// Pre-committed transactions in checkpoint order (see invariant 2).
    pending: VecDeque<Transaction>,
    /// Whether the front pending transaction's commit is queued.
    sent: bool,
    /// Entries of the transaction sent.
    sent_entries: usize,
    /// Every pending transaction up to this checkpoint is to be committed.
    commit_through: u64,
    marker_state: MarkerState,
    /// Restored with transactions pending up to this checkpoint, the marker not read
    /// since: a marker found beyond it was moved by a run after that checkpoint.
    restored_through: Option<u64>,
    /// The first error a command inside the transaction being answered got.
    queued_error: Option<String>,
    failure: Option<RedisError>,
    /// When `retry` is sent again and a transaction refused for now is committed again.
    retry_at_ns: Option<u64>,
    /// Transient refusals in a row (the back-off doubles with each).
    refusals: u32,
    /// Since when work waits on a lost connection or a server that refuses it for now,
    /// and why.
    trouble_since_ns: Option<u64>,
    last_trouble: Option<RedisError>,
    now_ns: u64,
    /// Whether replies arrived since the last poll.
    moved: bool,
    counts: StreamSinkCounts,
    published: StreamSinkCounts,
    stats: Arc<StreamSinkStats>,
}

impl Writer {
    fn new(config: &StreamSinkConfig, addr: SocketAddr, info: &SubtaskInfo) -> Self {
        let settings = ConnSettings {
            connect_timeout: config.connect_timeout,
            response_timeout: config.response_timeout,
            backoff: config.backoff,
            max_reply_bytes: config.max_reply_bytes,
        };
        Writer {
            out: Outgoing {
                conn: StreamConn::new(config.url.clone(), addr, settings),
                expected: VecDeque::new(),
                commands: 0,
            },
            stream: config.stream.clone(),
            maxlen: config.maxlen.map(|n| n.to_string().into_bytes()),
            marker: format!("{}:{}", config.transaction_prefix, info.index),
            transactional: config.guarantee == Guarantee::ExactlyOnce && info.checkpointing,
            max_in_flight: config.max_in_flight,
            backoff: config.backoff,
            retry_timeout: config.retry_timeout,
            plain: EntryLog::default(),
            retry: EntryLog::default(),
            buffer: EntryLog::default(),
            pending: VecDeque::new(),
            sent: false,
            sent_entries: 0,
            commit_through: 0,
            marker_state: MarkerState::Fresh,
            restored_through: None,
            queued_error: None,
            failure: None,
            retry_at_ns: None,
            refusals: 0,
            trouble_since_ns: None,
            last_trouble: None,
            now_ns: 0,
            moved: false,
            counts: StreamSinkCounts::default(),
            published: StreamSinkCounts::default(),
            stats: Arc::clone(&config.stats),
        }
    }

    fn check(&self) -> Result<(), TaskError> {
        match &self.failure {
            Some(error) => Err(Box::new(error.duplicate())),
            None => Ok(()),
        }
    }

    fn fail(&mut self, error: RedisError) {
        if self.failure.is_none() {
            self.failure = Some(error);
        }
    }

    fn server_error(&mut self, command: String, message: String) {
        self.fail(RedisError::Server { command, message });
    }

    fn xadd_name(&self) -> String {
        format!("XADD {}", self.stream)
    }

    /// Notes trouble (a loss, a transient refusal) that work now waits out.
    fn trouble(&mut self, error: RedisError) {
        self.trouble_since_ns.get_or_insert(self.now_ns);
        self.last_trouble = Some(error);
    }

    /// A transient refusal: what was refused goes again after the back-off (doubling
    /// from `backoff.initial` to `backoff.max` while refusals go on).
    fn refused(&mut self, command: String, message: String) {
        if self.retry_at_ns.is_none() {
            let delay = self
                .backoff
                .initial
                .saturating_mul(1u32 << self.refusals.min(20))
                .min(self.backoff.max);
            self.refusals = self.refusals.saturating_add(1);
            self.retry_at_ns = Some(self.now_ns.saturating_add(nanos(delay)));
        }
        self.trouble(RedisError::Server { command, message });
    }

    /// Applies every reply and loss the connection has (invariant 3).
    fn pump(&mut self) {
        while let Some(event) = self.out.conn.next_event() {
            self.moved = true;
            match event {
                ConnEvent::Reply(frame) => self.on_reply(frame),
                ConnEvent::Lost(error) => self.on_lost(error),
            }
        }
    }

    fn on_reply(&mut self, frame: OwnedFrame) {
        let Some(expect) = self.out.expected.pop_front() else {
            // The connection hands out replies to queued commands only (invariant 1).
            unreachable!("a reply to no command of the sink");
        };
        let OwnedFrame::Error(message) = frame else {
            if expect != Expect::Queued {
                // The server takes commands again.
                self.trouble_since_ns = None;
                self.refusals = 0;
            }
            match expect {
                Expect::Xadd => {
                    self.plain.pop_front();
                    self.counts.entries += 1;
                }
                Expect::Multi | Expect::Queued => {}
                Expect::Exec => self.on_exec(frame),
                Expect::Marker => self.on_marker(frame),
                Expect::Reset => {
                    self.marker_state = MarkerState::Known;
                    self.try_commit();
                }
            }
            return;
        };
        self.counts.errors += 1;
        let transient = is_transient_reply(&message);
        match expect {
            Expect::Xadd if transient => {
                // Sent again after the back-off, behind what is in flight.
                self.retry.push(self.plain.entry(0));
                self.plain.pop_front();
                self.refused(self.xadd_name(), message);
            }
            Expect::Xadd => self.server_error(self.xadd_name(), message),
            Expect::Queued => {
                // The EXEC that follows is refused (EXECABORT): this is why.
                self.queued_error.get_or_insert(message);
            }
            // Nothing is queued behind a refused MULTI: what follows it may have run
            // outside a transaction.
            Expect::Multi => self.server_error("MULTI".into(), message),
            Expect::Exec => self.on_exec_refused(message),
            Expect::Marker => {
                let command = format!("GET {} (the transaction marker)", self.marker);
                if transient {
                    self.marker_state = MarkerState::Stale;
                    self.refused(command, message);
                } else {
                    self.server_error(command, message);
                }
            }
            Expect::Reset => {
                let command = format!("DEL {} (the transaction marker)", self.marker);
                if transient {
                    self.marker_state = MarkerState::Fresh;
                    self.refused(command, message);
                } else {
                    self.server_error(command, message);
                }
            }
        }
    }

    fn on_exec(&mut self, frame: OwnedFrame) {
        assert!(self.sent, "an EXEC answered for a transaction sent");
        let transaction = self.pending.pop_front().expect("a sent one is pending");
        self.sent = false;
        self.sent_entries = 0;
        self.queued_error = None;
        match frame {
            OwnedFrame::Array(results) => {
                if let Some(message) = results.iter().find_map(|result| match result {
                    OwnedFrame::Error(message) => Some(message.clone()),
                    _ => None,
                }) {
                    self.counts.errors += 1;
                    let command = format!(
                        "{} in the transaction of checkpoint {} (Redis applied its other commands)",
                        self.xadd_name(),
                        transaction.checkpoint
                    );
                    self.server_error(command, message);
                    return;
                }
                self.counts.transactions += 1;
                self.counts.entries += transaction.entries.len() as u64;
                self.try_commit();
            }
            other => self.fail(RedisError::Malformed {
                addr: self.out.conn.peer().to_string(),
                reason: format!("EXEC answered {other:?}, not the results of its commands"),
            }),
        }
    }

    /// `EXEC` answered an error: the transaction was discarded (`EXECABORT`) because a
    /// command in it was refused. Committed again later if that refusal was transient.
    fn on_exec_refused(&mut self, message: String) {
        assert!(self.sent, "an EXEC answered for a transaction sent");
        self.sent = false;
        self.sent_entries = 0;
        let cause = self.queued_error.take();
        let checkpoint = self.pending.front().map_or(0, |t| t.checkpoint);
        let command = format!(
            "{} in the transaction of checkpoint {checkpoint}",
            self.xadd_name()
        );
        match cause {
            // Nothing of it was applied: the marker did not move either.
            Some(cause) if is_transient_reply(&cause) && message.starts_with("EXECABORT") => {
                self.refused(command, cause);
            }
            Some(cause) => self.server_error(command, cause),
            None => self.server_error("EXEC".into(), message),
        }
    }

    fn on_marker(&mut self, frame: OwnedFrame) {
        let committed = match &frame {
            OwnedFrame::Null => Some(0),
            OwnedFrame::BulkString(bytes) => std::str::from_utf8(bytes)
                .ok()
                .and_then(|text| text.parse::<u64>().ok()),
            _ => None,
        };
        let Some(committed) = committed else {
            self.fail(RedisError::Config(format!(
                "the transaction marker {} holds {frame:?}, not a checkpoint id: delete it, or \
                 give the sink another transaction_prefix",
                self.marker
            )));
            return;
        };
        debug_assert!(!self.sent, "commits wait for the marker");
        while let Some(transaction) = self.pending.front() {
            if transaction.checkpoint > committed {
                break;
            }
            // Written with the marker: in the stream already.
            self.counts.transactions += 1;
            self.counts.entries += transaction.entries.len() as u64;
            self.pending.pop_front();
        }
        self.marker_state = MarkerState::Known;
        if let Some(restored) = self.restored_through.take() {
            if committed > restored {
                // Restored from a checkpoint older than the last one committed: this run's
                // checkpoint ids start below the marker again. It is deleted before the
                // next commit, so that a marker read later sees only this run's commits
                // (the later run's output stays in the stream: what this run writes
                // again is written twice, as a restore to an older checkpoint must).
                self.marker_state = MarkerState::Fresh;
            }
        }
        self.try_commit();
    }

    fn on_lost(&mut self, error: RedisError) {
        if !matches!(
            error,
            RedisError::Connect { .. } | RedisError::ConnectTimeout { .. }
        ) {
            // A connection that was made is lost (failed attempts to make one again
            // are not counted).
            self.counts.reconnects += 1;
        }
        // A worker without an I/O driver cannot connect at all: no use retrying.
        let hopeless = matches!(
            &error,
            RedisError::Connect { source, .. } if source.kind() == std::io::ErrorKind::Unsupported
        );
        if hopeless || !error.is_transient() {
            self.fail(error);
            return;
        }
        // Everything due was dropped with the connection (invariant 1).
        self.out.expected.clear();
        self.queued_error = None;
        self.marker_state = match self.marker_state {
            MarkerState::Resetting => MarkerState::Fresh,
            MarkerState::Reading => MarkerState::Stale,
            // The EXEC may have been applied with its reply lost.
            MarkerState::Known if self.sent => MarkerState::Stale,
            state => state,
        };
        self.sent = false;
        self.sent_entries = 0;
        self.trouble(error);
        let maxlen = self.maxlen.as_deref();
        for index in 0..self.plain.len() {
            let fields = self.plain.entry(index);
            self.out
                .xadd(self.stream.as_bytes(), maxlen, fields, Expect::Xadd);
        }
        self.try_commit();
    }

    /// Queues the commit of the front pending transaction if it is due and none is
    /// queued, after deleting or reading the marker if it is not known. One at a time:
    /// one refused for now is committed again before any after it.
    fn try_commit(&mut self) {
        if self.failure.is_some() || self.sent || self.retry_at_ns.is_some() {
            return;
        }
        let Some(transaction) = self.pending.front() else {
            return;
        };
        if transaction.checkpoint > self.commit_through {
            return;
        }
        match self.marker_state {
            MarkerState::Fresh => {
                self.out
                    .command(&[b"DEL", self.marker.as_bytes()], Expect::Reset);
                self.marker_state = MarkerState::Resetting;
            }
            MarkerState::Stale => {
                self.out
                    .command(&[b"GET", self.marker.as_bytes()], Expect::Marker);
                self.marker_state = MarkerState::Reading;
            }
            MarkerState::Resetting | MarkerState::Reading => {}
            MarkerState::Known => {
                let maxlen = self.maxlen.as_deref();
                self.out.command(&[b"MULTI"], Expect::Multi);
                for index in 0..transaction.entries.len() {
                    let fields = transaction.entries.entry(index);
                    self.out
                        .xadd(self.stream.as_bytes(), maxlen, fields, Expect::Queued);
                }
                let checkpoint = transaction.checkpoint.to_string();
                self.out.command(
                    &[b"SET", self.marker.as_bytes(), checkpoint.as_bytes()],
                    Expect::Queued,
                );
                self.out.command(&[b"EXEC"], Expect::Exec);
                self.sent = true;
                self.sent_entries = transaction.entries.len();
            }
        }
    }

    fn write(&mut self, fields: &Fields) -> Result<(), TaskError> {
        self.pump();
        self.check()?;
        if fields.is_empty() {
            return Err(format!(
                "stream sink for {:?}: the format function wrote no field for a record; an \
                 entry needs at least one field and value",
                self.stream
            )
            .into());
        }
        if self.transactional {
            self.buffer.push(fields.args());
        } else {
            self.out.xadd(
                self.stream.as_bytes(),
                self.maxlen.as_deref(),
                fields.args(),
                Expect::Xadd,
            );
            self.plain.push(fields.args());
        }
        Ok(())
    }

    fn accepts(&mut self) -> bool {
        self.room() > 0
    }

    /// Entries it takes now: what `max_in_flight` leaves (any number once it failed,
    /// which the next poll reports).
    fn room(&mut self) -> usize {
        self.pump();
        let in_flight = self.plain.len() + self.retry.len() + self.sent_entries;
        if self.failure.is_some() {
            usize::MAX
        } else {
            self.max_in_flight.saturating_sub(in_flight)
        }
    }

    fn flushed(&mut self) -> bool {
        self.pump();
        let committable = self
            .pending
            .front()
            .is_some_and(|t| t.checkpoint <= self.commit_through);
        self.plain.is_empty()
            && self.retry.is_empty()
            && !committable
            && self.out.expected.is_empty()
    }

    fn snapshot(&mut self, checkpoint: u64) -> Result<Option<Vec<u8>>, TaskError> {
        self.pump();
        self.check()?;
        if !self.buffer.is_empty() {
            assert!(
                self.pending
                    .back()
                    .is_none_or(|last| last.checkpoint < checkpoint),
                "checkpoint ids increase"
            );
            self.pending.push_back(Transaction {
                checkpoint,
                entries: std::mem::take(&mut self.buffer),
            });
        }
        if self.plain.is_empty() && self.retry.is_empty() && self.pending.is_empty() {
            return Ok(None);
        }
        Ok(Some(encode_state(
            &[&self.plain, &self.retry],
            &self.pending,
        )))
    }

    fn checkpoint_complete(&mut self, checkpoint: u64) -> Result<(), TaskError> {
        self.pump();
        self.check()?;
        self.commit_through = self.commit_through.max(checkpoint);
        self.try_commit();
        Ok(())
    }

    fn restore(&mut self, state: &[u8]) -> Result<(), TaskError> {
        let (plain, pending) = decode_state(state).map_err(|why| {
            format!(
                "stream sink for {:?}: its checkpointed state is corrupt ({why})",
                self.stream
            )
        })?;
        // Sent again, in order, as at-least-once entries are after a loss.
        let maxlen = self.maxlen.as_deref();
        for index in 0..plain.len() {
            let fields = plain.entry(index);
            self.out
                .xadd(self.stream.as_bytes(), maxlen, fields.clone(), Expect::Xadd);
            self.plain.push(fields);
        }
        // The checkpoint restored completed: its transactions are committed, unless the
        // marker says they are already.
        if let Some(last) = pending.back() {
            self.commit_through = self.commit_through.max(last.checkpoint);
            self.restored_through = Some(last.checkpoint);
            self.pending = pending;
            self.marker_state = MarkerState::Stale;
        }
        self.try_commit();
        Ok(())
    }

    fn flush(&mut self, driver: &mut dyn Driver, now_ns: u64) {
        self.now_ns = now_ns;
        self.pump();
        if self.retry_at_ns.is_some_and(|at| now_ns >= at) {
            self.retry_at_ns = None;
            let maxlen = self.maxlen.as_deref();
            for index in 0..self.retry.len() {
                let fields = self.retry.entry(index);
                self.out
                    .xadd(self.stream.as_bytes(), maxlen, fields.clone(), Expect::Xadd);
                self.plain.push(fields);
            }
            self.retry.clear();
            self.try_commit();
        }
        let waiting = !self.out.expected.is_empty() || self.retry_at_ns.is_some();
        if !waiting {
            self.trouble_since_ns = None;
        }
        if let Some(since) = self.trouble_since_ns {
            if now_ns.saturating_sub(since) > nanos(self.retry_timeout) {
                let error = self.last_trouble.take().unwrap_or(RedisError::Closed {
                    addr: self.out.conn.peer().to_string(),
                    pending: self.out.expected.len(),
                    reason: None,
                });
                self.fail(error);
            }
        }
        self.out.conn.flush(driver, now_ns);
        self.pump();
        self.publish();
    }

    fn next_deadline(&self) -> Option<u64> {
        let give_up = self
            .trouble_since_ns
            .filter(|_| self.failure.is_none())
            .map(|since| {
                since
                    .saturating_add(nanos(self.retry_timeout))
                    .saturating_add(1)
            });
        [self.out.conn.next_deadline(), give_up, self.retry_at_ns]
            .into_iter()
            .flatten()
            .min()
    }

    fn publish(&mut self) {
        self.counts.commands = self.out.commands;
        if self.counts != self.published {
            self.stats.add(&self.counts, &self.published);
            self.published = self.counts;
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.publish();
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// The sink of one subtask; see the module docs. Made by [`stream_sink`].
pub struct StreamSink<T, F> {
    /// The writer, or why the configuration is unusable (reported by the first call).
    writer: Result<Rc<RefCell<Writer>>, RedisError>,
    format: F,
    fields: Fields,
    _records: PhantomData<fn(&T)>,
}

impl<T, F> StreamSink<T, F> {
    fn writer(&self) -> Result<RefMut<'_, Writer>, TaskError> {
        match &self.writer {
            Ok(writer) => Ok(writer.borrow_mut()),
            Err(error) => Err(Box::new(error.duplicate())),
        }
    }
}

/// Subtask `info`'s sink to `config.stream`, and the handler of its connection on the
/// worker's driver: each record's entry is what `format` writes into a [`Fields`].
///
/// ```no_run
/// use weir_engine::graph::Graph;
/// use weir_net::redis::streams::{stream_sink, Guarantee, StreamSinkConfig};
/// use weir_net::redis::RedisUrl;
///
/// let mut config = StreamSinkConfig::new(RedisUrl::new("127.0.0.1", 6379), "numbers");
/// config.guarantee = Guarantee::ExactlyOnce;
/// config.check()?;
/// let graph = Graph::new();
/// graph.from_iter(|_| 0..1000u64).sink_io(move |info| {
///     stream_sink(&config, info, |n: &u64, fields| {
///         fields.push_fmt("n", format_args!("{n}"));
///     })
/// });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A configuration that [`check`](StreamSinkConfig::check) refuses (or whose host does
/// not resolve) gives a sink that fails the job at its first record or poll: check it
/// before building the graph to learn of it earlier.
pub fn stream_sink<T, F>(
    config: &StreamSinkConfig,
    info: &SubtaskInfo,
    format: F,
) -> (StreamSink<T, F>, Option<Box<dyn IoHandler>>)
where
    T: 'static,
    F: FnMut(&T, &mut Fields) + 'static,
{
    let writer = config
        .check()
        .map(|addr| Rc::new(RefCell::new(Writer::new(config, addr, info))));
    let io = writer
        .as_ref()
        .ok()
        .map(|writer| Box::new(WriterIo(Rc::clone(writer))) as Box<dyn IoHandler>);
    let sink = StreamSink {
        writer,
        format,
        fields: Fields::new(),
        _records: PhantomData,
    };
    (sink, io)
}

impl<T: 'static, F: FnMut(&T, &mut Fields) + 'static> Sink<T> for StreamSink<T, F> {
    fn invoke(&mut self, value: T, _timestamp: Option<i64>, _now_ns: u64) -> Result<(), TaskError> {
        self.fields.clear();
        (self.format)(&value, &mut self.fields);
        let fields = std::mem::take(&mut self.fields);
        let written = self.writer().and_then(|mut writer| writer.write(&fields));
        self.fields = fields;
        written
    }

    fn accepts(&mut self) -> bool {
        self.writer().map_or(true, |mut writer| writer.accepts())
    }

    fn room(&mut self) -> usize {
        self.writer().map_or(usize::MAX, |mut writer| writer.room())
    }

    fn poll(&mut self, _now_ns: u64) -> Result<bool, TaskError> {
        let mut writer = self.writer()?;
        writer.pump();
        writer.check()?;
        Ok(std::mem::take(&mut writer.moved))
    }

    fn flushed(&mut self) -> bool {
        self.writer().map_or(true, |mut writer| writer.flushed())
    }

    fn snapshot_state(&mut self, checkpoint: u64) -> Result<Option<Vec<u8>>, TaskError> {
        self.writer()?.snapshot(checkpoint)
    }

    fn notify_checkpoint_complete(&mut self, checkpoint: u64) -> Result<(), TaskError> {
        self.writer()?.checkpoint_complete(checkpoint)
    }

    fn restore_state(&mut self, state: &[u8]) -> Result<(), TaskError> {
        self.writer()?.restore(state)
    }
}

/// The sink's connection on its task's driver.
struct WriterIo(Rc<RefCell<Writer>>);

impl IoHandler for WriterIo {
    fn flush(&mut self, driver: &mut dyn Driver, now_ns: u64) {
        self.0.borrow_mut().flush(driver, now_ns);
    }

    fn on_event(&mut self, event: &DriverEvent<'_>) -> bool {
        let mut writer = self.0.borrow_mut();
        let taken = writer.out.conn.on_event(event);
        if taken {
            writer.pump();
        }
        taken
    }

    fn next_deadline(&self) -> Option<u64> {
        self.0.borrow().next_deadline()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(entries: &[&[&str]]) -> EntryLog {
        let mut log = EntryLog::default();
        for entry in entries {
            log.push(entry.iter().map(|a| a.as_bytes()));
        }
        log
    }

    fn entries(log: &EntryLog) -> Vec<Vec<Vec<u8>>> {
        (0..log.len())
            .map(|i| log.entry(i).map(<[u8]>::to_vec).collect())
            .collect()
    }

    /// The log against a `VecDeque` model through pushes and pops across many
    /// compactions, empty arguments and empty logs included.
    #[test]
    fn the_entry_log_keeps_order_through_pops_and_compactions() {
        let mut log = EntryLog::default();
        let mut model: VecDeque<Vec<Vec<u8>>> = VecDeque::new();
        let mut next = 0u64;
        for round in 0..5_000u64 {
            let pushes = if round % 7 == 0 { 3 } else { 1 };
            for _ in 0..pushes {
                let entry: Vec<Vec<u8>> = (0..next % 4)
                    .map(|k| format!("{next}.{k}").into_bytes().repeat(k as usize))
                    .collect();
                log.push(entry.iter().map(Vec::as_slice));
                model.push_back(entry);
                next += 1;
            }
            let pops = if round % 3 == 0 { 2 } else { 1 };
            for _ in 0..pops {
                if model.pop_front().is_some() {
                    log.pop_front();
                }
            }
            assert_eq!(log.len(), model.len());
            if let Some(front) = model.front() {
                assert_eq!(&log.entry(0).map(<[u8]>::to_vec).collect::<Vec<_>>(), front);
            }
        }
        assert_eq!(entries(&log), model.into_iter().collect::<Vec<_>>());
        assert!(log.head < COMPACT_MIN || 2 * log.head < log.entry_ends.len());
    }

    /// The state encodes the unanswered entries and the pending transactions, and
    /// decodes to the same; every cut, a wrong version and trailing bytes are refused.
    #[test]
    fn state_round_trips_and_corruption_is_refused() {
        let plain = log(&[&["n", "1"], &["n", "2", "note", ""]]);
        let mut pending = VecDeque::new();
        pending.push_back(Transaction {
            checkpoint: 3,
            entries: log(&[&["n", "3"]]),
        });
        pending.push_back(Transaction {
            checkpoint: 5,
            entries: log(&[]),
        });
        let state = encode_state(&[&plain], &pending);
        let (plain_back, pending_back) = decode_state(&state).expect("decodes");
        assert_eq!(entries(&plain_back), entries(&plain));
        // Entries in flight and entries waiting to be retried are one list.
        let retry = log(&[&["n", "0"]]);
        let (both, _) = decode_state(&encode_state(&[&plain, &retry], &pending)).expect("decodes");
        assert_eq!(entries(&both), [entries(&plain), entries(&retry)].concat());
        assert_eq!(pending_back, pending);
        for cut in 0..state.len() {
            assert!(decode_state(&state[..cut]).is_err(), "cut at {cut}");
        }
        let mut versioned = state.clone();
        versioned[0] = 9;
        assert!(decode_state(&versioned).unwrap_err().contains("version 9"));
        let mut long = state.clone();
        long.push(0);
        assert!(decode_state(&long).unwrap_err().contains("after the end"));
        // A count far beyond the input is refused before anything is reserved.
        let huge = [&[STATE_VERSION][..], &u32::MAX.to_le_bytes()].concat();
        assert!(decode_state(&huge).unwrap_err().contains("announced"));
    }

    /// `XADD` arguments: trimming, the id, the fields; more than fit on the stack.
    #[test]
    fn xadd_arguments_trim_and_spill() {
        let mut fields = Fields::new();
        fields.push("a", "1").push_fmt("b", format_args!("{}", 2));
        assert_eq!(fields.len(), 2);
        assert_eq!(fields.get(1), Some((&b"b"[..], &b"2"[..])));
        let args = with_xadd_args(b"s", Some(b"100"), fields.args(), |args| {
            args.iter().map(|a| a.to_vec()).collect::<Vec<_>>()
        });
        let expected: Vec<&[u8]> = vec![
            b"XADD", b"s", b"MAXLEN", b"~", b"100", b"*", b"a", b"1", b"b", b"2",
        ];
        assert_eq!(args, expected);
        let mut many = Fields::new();
        for i in 0..40 {
            many.push(format!("f{i}"), format!("v{i}"));
        }
        let count = with_xadd_args(b"s", None, many.args(), |args| {
            assert_eq!(args[0], b"XADD");
            assert_eq!(args[3], b"f0");
            assert_eq!(args[args.len() - 1], b"v39");
            args.len()
        });
        assert_eq!(count, 3 + 80);
    }

    /// Each refused setting says what to change.
    #[test]
    fn bad_settings_are_refused_with_what_to_change() {
        let url = RedisUrl::new("127.0.0.1", 6379);
        let ok = StreamSinkConfig::new(url.clone(), "s");
        assert!(ok.validate().is_ok());
        assert_eq!(ok.transaction_prefix, "weir:sink:s");
        type Change = Box<dyn Fn(&mut StreamSinkConfig)>;
        let cases: Vec<(Change, &str)> = vec![
            (Box::new(|c| c.stream.clear()), "name the stream"),
            (Box::new(|c| c.maxlen = Some(0)), "None for no trimming"),
            (Box::new(|c| c.max_in_flight = 0), "max_in_flight"),
            (
                Box::new(|c| c.response_timeout = Duration::ZERO),
                "positive",
            ),
            (
                Box::new(|c| {
                    c.guarantee = Guarantee::ExactlyOnce;
                    c.transaction_prefix.clear();
                }),
                "transaction_prefix",
            ),
            (
                Box::new(|c| c.backoff.initial = Duration::from_secs(5)),
                "back-off",
            ),
        ];
        for (change, hint) in cases {
            let mut config = ok.clone();
            change(&mut config);
            let error = config.validate().expect_err(hint).to_string();
            assert!(error.contains(hint), "{hint}: {error}");
        }
    }
}
