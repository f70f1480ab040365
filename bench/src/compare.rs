//! Interleaved side-by-side comparison of Weir and its peers.
//!
//! This VM's host moves vCPUs between physical cores, so cross-core figures swing 3–5×
//! between and within runs. A fair comparison therefore runs Weir and each peer in short
//! turns, alternating, over several rounds in one process, and quotes medians and the
//! ratio of medians. The starting implementation rotates each round so no one always
//! runs first.
//!
//! Each case is Weir's, a peer's (what a competent user of another library writes for
//! the same work) or a ceiling (the same work with no framework at all, a bound no
//! implementation should beat). Weir is compared with the best peer of the experiment
//! that does the same work in the same way ([`Case::pairing`]: plain pipelining with
//! plain pipelining, batched with batched, a worker that parks with peers that park),
//! never a slower one; ceilings are not peers and are compared with the best of Weir.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{json, Value};
use weir_engine::async_io::OutputMode;

use crate::async_peers::{self, Measurement};
use crate::exchange_peers::{self, Routing};
use crate::lookup_peers;
use crate::redis_peers;
use crate::remote_peers;
use crate::{pool_peers, ring_peers};
use weir_net::lookup::{Latency, LookupServer};
use weir_net::DriverKind;

/// A workload: runs `n` operations.
pub type Workload = Arc<dyn Fn(u64) -> Measurement + Send + Sync>;

/// What an implementation is to its experiment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Weir's side.
    Weir,
    /// A peer: the same work as another library's user writes it.
    Peer,
    /// A bound on the work with no framework (named "... ceiling ...").
    Ceiling,
    /// A figure of another kind shown for scale, neither a peer nor a bound (named
    /// "... reference ..."): e.g. a server's rate under its own load tool, at a
    /// concurrency of its own.
    Reference,
}

impl Role {
    /// The role of an implementation by its name: "weir ..." is Weir's, a name with
    /// "reference" in it a reference, with "ceiling" a ceiling, anything else a peer.
    pub fn of(implementation: &str) -> Role {
        if implementation.starts_with("weir") {
            Role::Weir
        } else if implementation.contains("reference") {
            Role::Reference
        } else if implementation.contains("ceiling") {
            Role::Ceiling
        } else {
            Role::Peer
        }
    }

    /// The name in the JSON.
    pub fn name(self) -> &'static str {
        match self {
            Role::Weir => "weir",
            Role::Peer => "peer",
            Role::Ceiling => "ceiling",
            Role::Reference => "reference",
        }
    }
}

/// One implementation of one experiment.
#[derive(Clone)]
pub struct Case {
    /// Experiment name, shared by Weir and its peers.
    pub experiment: &'static str,
    /// Implementation name.
    pub implementation: &'static str,
    /// Weir's side, a peer or a ceiling.
    pub role: Role,
    /// Operations per turn.
    pub ops: u64,
    /// Runs `ops` operations.
    pub run: Workload,
    /// The physical limit in operations per second, if the experiment has one (e.g.
    /// Little's law: capacity ÷ latency).
    pub limit_ops_per_s: Option<f64>,
    /// Which rows of the experiment this one is compared with: a Weir row and a peer
    /// with the same pairing are compared with each other (e.g. plain pipelining with
    /// plain pipelining, batched with batched, a worker that parks with peers that
    /// park), never with a row of another pairing. `None` compares with every row of the
    /// other side.
    pub pairing: Option<&'static str>,
}

impl Case {
    /// The same case, compared only with rows of the same `pairing`.
    pub fn paired(mut self, pairing: &'static str) -> Case {
        self.pairing = Some(pairing);
        self
    }
}

/// Medians over the rounds for one case.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Experiment name.
    pub experiment: &'static str,
    /// Implementation name.
    pub implementation: &'static str,
    /// Weir's side, a peer or a ceiling.
    pub role: Role,
    /// Nanoseconds per operation, one per round.
    pub samples_ns: Vec<f64>,
    /// Per-operation latency over all rounds, if the workload records one.
    pub latency_ns: Option<Histogram<u64>>,
    /// The physical limit in operations per second, if any.
    pub limit_ops_per_s: Option<f64>,
    /// CPU ns per operation of the thread that ran the operations, one per round, if
    /// the workload measures it.
    pub client_cpu_ns: Vec<f64>,
    /// CPU ns per operation of the service's thread, one per round, likewise.
    pub service_cpu_ns: Vec<f64>,
    /// See [`Case::pairing`].
    pub pairing: Option<&'static str>,
    /// Operations per turn (see [`Case::ops`]).
    pub ops: u64,
}

/// The median of `samples`; NaN if there are none.
pub fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

impl Summary {
    /// Median ns per operation.
    pub fn median_ns(&self) -> f64 {
        median(&self.samples_ns)
    }

    /// Median CPU ns per operation of the client's and the service's thread, if the
    /// workload measures them.
    pub fn cpu_ns(&self) -> Option<(f64, f64)> {
        (!self.client_cpu_ns.is_empty())
            .then(|| (median(&self.client_cpu_ns), median(&self.service_cpu_ns)))
    }

    /// Fastest round.
    pub fn min_ns(&self) -> f64 {
        self.samples_ns
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min)
    }

    /// Slowest round.
    pub fn max_ns(&self) -> f64 {
        self.samples_ns.iter().copied().fold(0.0, f64::max)
    }

    /// Whether this is Weir's side.
    pub fn is_weir(&self) -> bool {
        self.role == Role::Weir
    }
}

/// The fastest (lowest median) of `experiment`'s implementations in `role`, among those
/// of `pairing` where it is given.
fn best<'a>(
    summaries: &'a [Summary],
    experiment: &str,
    role: Role,
    pairing: Option<&str>,
) -> Option<&'a Summary> {
    summaries
        .iter()
        .filter(|s| s.experiment == experiment && s.role == role)
        .filter(|s| pairing.is_none() || s.pairing == pairing)
        .min_by(|a, b| a.median_ns().total_cmp(&b.median_ns()))
}

/// The ratios of one row: for Weir's, the best peer of its pairing, and that peer's time
/// over its own (above 1: Weir is faster); for a peer, its time over the best Weir row of
/// its pairing; for a ceiling or a reference, its time over the best Weir row.
struct Ratios<'a> {
    /// This row's time over the Weir row it is compared with, and that row's name
    /// (peers, ceilings and references).
    over_weir: Option<(&'a str, f64)>,
    /// The peer this row is compared with and its time over this row's (Weir's rows).
    best_peer: Option<(&'a str, f64)>,
}

fn ratios<'a>(summaries: &'a [Summary], s: &Summary) -> Ratios<'a> {
    let median = s.median_ns();
    match s.role {
        Role::Weir => Ratios {
            over_weir: None,
            best_peer: best(summaries, s.experiment, Role::Peer, s.pairing)
                .map(|p| (p.implementation, p.median_ns() / median)),
        },
        Role::Peer => Ratios {
            over_weir: best(summaries, s.experiment, Role::Weir, s.pairing)
                .map(|w| (w.implementation, median / w.median_ns())),
            best_peer: None,
        },
        Role::Ceiling | Role::Reference => Ratios {
            over_weir: best(summaries, s.experiment, Role::Weir, None)
                .map(|w| (w.implementation, median / w.median_ns())),
            best_peer: None,
        },
    }
}

fn case(
    experiment: &'static str,
    implementation: &'static str,
    ops: f64,
    run: fn(u64) -> Duration,
) -> Case {
    workload(
        experiment,
        implementation,
        ops,
        Arc::new(move |n| run(n).into()),
        None,
    )
}

fn workload(
    experiment: &'static str,
    implementation: &'static str,
    ops: f64,
    run: Workload,
    limit_ops_per_s: Option<f64>,
) -> Case {
    Case {
        experiment,
        implementation,
        role: Role::of(implementation),
        ops: (ops as u64).max(1),
        run,
        limit_ops_per_s,
        pairing: None,
    }
}

/// The async operator experiments: latency-0 overhead, other-thread completion, and
/// timer-driven latency against Little's limit, with tokio + futures as the peer.
pub fn async_cases(scale: f64) -> Vec<Case> {
    use async_peers::Framework;
    let immediate = 2_000_000.0 * scale;
    let mut cases = Vec::new();
    let modes = [
        (
            "capacity 100, ordered",
            OutputMode::Ordered,
            "weir ordered",
            true,
        ),
        (
            "capacity 100, unordered",
            OutputMode::Unordered,
            "weir unordered",
            false,
        ),
        (
            "capacity 100, keyed-ordered",
            OutputMode::KeyedOrdered,
            "weir keyed-ordered",
            true,
        ),
    ];
    // Which peer runs each mode: keyed-ordered has no tokio form, so its peers are the
    // ordered ones (the stricter order of the two).
    let frameworks = |ordered: bool| {
        [
            (
                Framework::Futures,
                if ordered {
                    TOKIO_BUFFERED
                } else {
                    TOKIO_BUFFER_UNORDERED
                },
                CALLS_MADE,
            ),
            (
                Framework::FuturesBuffered,
                if ordered {
                    FUTURES_BUFFERED_ORDERED
                } else {
                    FUTURES_BUFFERED_UNORDERED
                },
                CALLS_MADE,
            ),
            (
                Framework::ValueOrFuture,
                if ordered {
                    VALUE_OR_FUTURE_ORDERED
                } else {
                    VALUE_OR_FUTURE_UNORDERED
                },
                ANSWERED_AT_ONCE,
            ),
        ]
    };
    for (setting, mode, weir, ordered) in modes {
        let experiment = leak(format!("async latency 0, {setting}"));
        cases.push(
            workload(
                experiment,
                leak(format!(
                    "{weir} (inline: completed in invoke, nothing stored)"
                )),
                immediate,
                Arc::new(move |n| async_peers::weir_immediate(mode, 100, n)),
                None,
            )
            .paired(CALLS_MADE),
        );
        cases.push(
            workload(
                experiment,
                leak(format!(
                    "{weir} in runs (process_run: a run of its free capacity at a time)"
                )),
                immediate,
                Arc::new(move |n| async_peers::weir_immediate_runs(mode, 100, n)),
                None,
            )
            .paired(CALLS_MADE),
        );
        for (runs, how) in [(false, "one at a time"), (true, "in runs")] {
            cases.push(
                workload(
                    experiment,
                    leak(format!(
                        "{weir} ready, {how} (answered by AsyncFunction::ready, no call made)"
                    )),
                    immediate,
                    Arc::new(move |n| async_peers::weir_ready(mode, 100, n, runs)),
                    None,
                )
                .paired(ANSWERED_AT_ONCE),
            );
        }
        for (framework, name, pairing) in frameworks(ordered) {
            cases.push(
                workload(
                    experiment,
                    name,
                    immediate,
                    Arc::new(move |n| async_peers::tokio_immediate(framework, ordered, 100, n)),
                    None,
                )
                .paired(pairing),
            );
        }
    }
    for (setting, mode, weir, ordered) in modes {
        let experiment = leak(format!(
            "async completed in batches on the task's thread, {setting}"
        ));
        cases.push(workload(
            experiment,
            leak(format!(
                "{weir} (entry stored, completion queued, emitted on drain)"
            )),
            immediate / 2.0,
            Arc::new(move |n| async_peers::weir_batched(mode, 100, n)),
            None,
        ));
        for (framework, name, _) in frameworks(ordered) {
            cases.push(workload(
                experiment,
                name,
                immediate / 2.0,
                Arc::new(move |n| async_peers::tokio_batched(framework, ordered, 100, n)),
                None,
            ));
        }
    }
    let cross = 300_000.0 * scale;
    let experiment = "async completed on another thread, capacity 100";
    for (mode, name, pairing) in [
        (OutputMode::Ordered, "weir ordered", ORDERED),
        (OutputMode::Unordered, "weir unordered", UNORDERED),
        (OutputMode::KeyedOrdered, "weir keyed-ordered", ORDERED),
    ] {
        cases.push(
            workload(
                experiment,
                name,
                cross,
                Arc::new(move |n| async_peers::weir_cross_thread(mode, 100, n)),
                None,
            )
            .paired(pairing),
        );
    }
    for (ordered, name, pairing) in [
        (true, TOKIO_CROSS_THREAD_ORDERED, ORDERED),
        (false, TOKIO_CROSS_THREAD_UNORDERED, UNORDERED),
    ] {
        cases.push(
            workload(
                experiment,
                name,
                cross,
                Arc::new(move |n| {
                    async_peers::tokio_cross_thread(Framework::FuturesBuffered, ordered, 100, n)
                }),
                None,
            )
            .paired(pairing),
        );
    }
    let timers: [(&'static str, u64, usize); 4] = [
        ("async unordered, latency 1 ms, capacity 10", 1, 10),
        ("async unordered, latency 1 ms, capacity 100", 1, 100),
        ("async unordered, latency 1 ms, capacity 1000", 1, 1000),
        ("async unordered, latency 10 ms, capacity 1000", 10, 1000),
    ];
    for (experiment, latency_ms, capacity) in timers {
        let latency = Duration::from_millis(latency_ms);
        let limit = capacity as f64 / latency.as_secs_f64();
        let ops = (limit * 0.25 * scale).max(capacity as f64 * 4.0);
        cases.push(
            workload(
                experiment,
                WEIR_TIMER_UNORDERED,
                ops,
                Arc::new(move |n| {
                    async_peers::weir_timer(OutputMode::Unordered, capacity, latency, n)
                }),
                Some(limit),
            )
            .paired(PRECISE_TIMER),
        );
        cases.push(
            workload(
                experiment,
                TOKIO_PRECISE_TIMER_UNORDERED,
                ops,
                Arc::new(move |n| async_peers::tokio_precise_timer(false, capacity, latency, n)),
                Some(limit),
            )
            .paired(PRECISE_TIMER),
        );
        cases.push(workload(
            experiment,
            TOKIO_TIMER_UNORDERED,
            ops,
            Arc::new(move |n| async_peers::tokio_timer(false, capacity, latency, n)),
            Some(limit),
        ));
    }
    let latency = Duration::from_millis(1);
    let experiment = "async ordered, latency 1 ms, capacity 1000";
    cases.push(
        workload(
            experiment,
            "weir ordered (runtime worker, timer wheel)",
            250_000.0 * scale,
            Arc::new(move |n| async_peers::weir_timer(OutputMode::Ordered, 1000, latency, n)),
            Some(1_000_000.0),
        )
        .paired(PRECISE_TIMER),
    );
    cases.push(
        workload(
            experiment,
            "tokio + futures-buffered buffered_ordered, timerfd (precise timer, 1 ns slack)",
            250_000.0 * scale,
            Arc::new(move |n| async_peers::tokio_precise_timer(true, 1000, latency, n)),
            Some(1_000_000.0),
        )
        .paired(PRECISE_TIMER),
    );
    cases.push(workload(
        experiment,
        "tokio buffered + sleep (1 ms timer tick)",
        250_000.0 * scale,
        Arc::new(move |n| async_peers::tokio_timer(true, 1000, latency, n)),
        Some(1_000_000.0),
    ));
    cases
}

/// A name built once per process for a case (cases name their rows with `&'static
/// str`; the few built from parts live as long as the process).
fn leak(name: String) -> &'static str {
    Box::leak(name.into_boxed_str())
}

/// The pairing, at latency 0, of calls made through `invoke` (and completed there) with
/// the peers that make a call per record and queue it.
const CALLS_MADE: &str = "a call made per record";
/// The pairing, at latency 0, of answers given by `AsyncFunction::ready` with the peer
/// that emits a value known at once without queueing it (the value-or-future loop).
const ANSWERED_AT_ONCE: &str = "answered at once, no call queued";
/// The pairing of ordered output (Weir's ordered and keyed-ordered modes) with ordered
/// peers.
const ORDERED: &str = "ordered output";
/// The pairing of unordered output.
const UNORDERED: &str = "unordered output";
/// The tokio peer of the cross-thread experiment, ordered.
pub const TOKIO_CROSS_THREAD_ORDERED: &str =
    "tokio + futures-buffered buffered_ordered, oneshot per call, spinning completer thread";
/// The same, unordered.
pub const TOKIO_CROSS_THREAD_UNORDERED: &str =
    "tokio + futures-buffered buffered_unordered, oneshot per call, spinning completer thread";

/// The pairing of Weir's timer wheel with the peer's precise timer: the tick peer is
/// shown beside them, compared with the best Weir row, not as Weir's peer.
const PRECISE_TIMER: &str = "precise timers";

/// `futures`' `buffered`: a `FuturesOrdered`, a node allocated per call.
pub const TOKIO_BUFFERED: &str = "tokio + futures buffered (a node allocated per call)";
/// `futures`' `buffer_unordered`.
pub const TOKIO_BUFFER_UNORDERED: &str =
    "tokio + futures buffer_unordered (a node allocated per call)";
/// `futures-buffered`'s `buffered_ordered`: slots, no allocation per call.
pub const FUTURES_BUFFERED_ORDERED: &str =
    "tokio + futures-buffered buffered_ordered (slots, no allocation per call)";
/// `futures-buffered`'s `buffered_unordered`.
pub const FUTURES_BUFFERED_UNORDERED: &str =
    "tokio + futures-buffered buffered_unordered (slots, no allocation per call)";
/// The value-or-future fast path, ordered.
pub const VALUE_OR_FUTURE_ORDERED: &str =
    "tokio + value-or-future fast path, ordered (a ready call skips the queue)";
/// The value-or-future fast path, unordered.
pub const VALUE_OR_FUTURE_UNORDERED: &str =
    "tokio + value-or-future fast path, unordered (a ready call skips the queue)";
/// tokio with a precise timer (timerfd), unordered.
pub const TOKIO_PRECISE_TIMER_UNORDERED: &str =
    "tokio + futures-buffered buffered_unordered, timerfd (precise timer, 1 ns slack)";

/// Weir's side of the timer-driven async experiments: the operator as a task on a
/// runtime worker, each call completed by a timer on a timing wheel, the worker parked
/// until the next one.
pub const WEIR_TIMER_UNORDERED: &str = "weir unordered (runtime worker, timer wheel)";
/// tokio's side: `tokio::time::sleep` per call, whose 1 ms tick rounds a deadline up
/// (a 1 ms sleep takes 1 to 2 ms), as every tokio user gets it.
pub const TOKIO_TIMER_UNORDERED: &str = "tokio buffer_unordered + sleep (1 ms timer tick)";

/// Weir's exchange on its batch paths (`emit_run`, `poll_run`), runs of 256 records.
pub const WEIR_EXCHANGE_RUNS: &str = "weir exchange, runs";
/// The same, the consumer reading each record in place (`poll_run_in_place`).
pub const WEIR_EXCHANGE_IN_PLACE: &str = "weir exchange, runs read in place";

/// The exchange experiments: records/s and latency through writer → channel → gate,
/// 1→1 against peers that pass the records by value (a crossbeam channel, one record
/// per message and a `Vec` of 32 KiB per message; an `rtrb` ring, one record per slot),
/// the cross-core ceiling (the values in recycled 32 KiB batches through SPSC rings, no
/// framework), and three references for the wire format's copies (into segments on one
/// thread, into segments and decoded on one thread, and decoded on the other core).
pub fn exchange_cases(scale: f64) -> Vec<Case> {
    let mut cases = Vec::new();
    let timeout = Some(Duration::from_millis(100));
    macro_rules! one_to_one {
        ($experiment:expr, $n:literal, $ops:expr) => {{
            let ops = $ops * scale;
            cases.push(workload(
                $experiment,
                "weir exchange",
                ops,
                Arc::new(move |n| {
                    exchange_peers::weir_exchange::<$n>(1, 1, Routing::RoundRobin, timeout, n)
                }),
                None,
            ));
            cases.push(workload(
                $experiment,
                WEIR_EXCHANGE_RUNS,
                ops,
                Arc::new(move |n| {
                    exchange_peers::weir_exchange_runs::<$n>(1, 1, Routing::RoundRobin, timeout, n)
                }),
                None,
            ));
            cases.push(workload(
                $experiment,
                WEIR_EXCHANGE_IN_PLACE,
                ops,
                Arc::new(move |n| {
                    exchange_peers::weir_exchange_in_place::<$n>(
                        1,
                        1,
                        Routing::RoundRobin,
                        timeout,
                        n,
                    )
                }),
                None,
            ));
            cases.push(workload(
                $experiment,
                CROSSBEAM_PER_RECORD,
                ops,
                Arc::new(move |n| exchange_peers::crossbeam_channel::<$n>(n)),
                None,
            ));
            cases.push(workload(
                $experiment,
                RTRB_PER_RECORD,
                ops,
                Arc::new(move |n| exchange_peers::rtrb_per_record::<$n>(n)),
                None,
            ));
            cases.push(workload(
                $experiment,
                RTRB_CHUNKED,
                ops,
                Arc::new(move |n| exchange_peers::rtrb_chunked::<$n>(n)),
                None,
            ));
            cases.push(workload(
                $experiment,
                CROSSBEAM_BATCHED,
                ops,
                Arc::new(move |n| exchange_peers::crossbeam_channel_batched::<$n>(n)),
                None,
            ));
            cases.push(workload(
                $experiment,
                CROSS_CORE_CEILING,
                ops,
                Arc::new(move |n| exchange_peers::cross_core_ceiling::<$n>(n)),
                None,
            ));
            cases.push(workload(
                $experiment,
                WIRE_COPY_REFERENCE,
                ops,
                Arc::new(move |n| exchange_peers::wire_copy_reference::<$n>(n)),
                None,
            ));
            cases.push(workload(
                $experiment,
                WIRE_DECODE_REFERENCE,
                ops,
                Arc::new(move |n| exchange_peers::wire_decode_reference::<$n>(n)),
                None,
            ));
            cases.push(workload(
                $experiment,
                WIRE_CROSS_CORE_REFERENCE,
                ops,
                Arc::new(move |n| exchange_peers::wire_cross_core_reference::<$n>(n)),
                None,
            ));
        }};
    }
    one_to_one!(
        "exchange 1→1, 8-byte records, round robin, timeout 100 ms",
        8,
        4_000_000.0
    );
    one_to_one!(
        "exchange 1→1, 100-byte records, round robin, timeout 100 ms",
        100,
        2_000_000.0
    );
    one_to_one!(
        "exchange 1→1, 1000-byte records, round robin, timeout 100 ms",
        1000,
        500_000.0
    );
    let ops = 1_000_000.0 * scale;
    cases.push(workload(
        "exchange 1→2, 100-byte records, key hash, timeout 100 ms",
        "weir exchange",
        ops,
        Arc::new(move |n| {
            exchange_peers::weir_exchange::<100>(1, 2, Routing::HashModulo, timeout, n)
        }),
        None,
    ));
    cases.push(workload(
        "exchange 2→2, 100-byte records, round robin, timeout 100 ms",
        "weir exchange",
        ops,
        Arc::new(move |n| {
            exchange_peers::weir_exchange::<100>(2, 2, Routing::RoundRobin, timeout, n)
        }),
        None,
    ));
    cases.push(workload(
        "exchange 1→1, 100-byte records, round robin, timeout 0",
        "weir exchange",
        ops / 4.0,
        Arc::new(move |n| {
            exchange_peers::weir_exchange::<100>(1, 1, Routing::RoundRobin, Some(Duration::ZERO), n)
        }),
        None,
    ));
    let rate = 10_000u64;
    cases.push(workload(
        "exchange latency, open loop 10 k records/s, 100-byte records, timeout 0",
        "weir exchange",
        (rate as f64 * 0.5 * scale).max(1000.0),
        Arc::new(move |n| exchange_peers::weir_open_loop::<100>(rate, n)),
        Some(rate as f64),
    ));
    cases
}

/// The remote exchange experiments: 1→1 and 2→2 over loopback TCP through the
/// transport, against the local exchange (a reference: no TCP) and the raw TCP ceiling
/// (the same bytes in 32 KiB writes and reads, the reader spinning 1→1 and blocking
/// 2→2); and latency at 10 k records/s,
/// against the raw TCP ceiling of latency (a write per record, a reader spinning on a
/// non-blocking socket).
pub fn remote_cases(scale: f64) -> Vec<Case> {
    let mut cases = Vec::new();
    // The io_uring rows only where the kernel allows io_uring.
    let uring = weir_net::build_driver(DriverKind::Uring).is_ok();
    let timeout = Some(Duration::from_millis(100));
    macro_rules! pair {
        ($experiment:expr, $n:literal, $pairs:literal, $ops:expr) => {{
            let ops = $ops * scale;
            if uring {
                cases.push(workload(
                    $experiment,
                    "weir remote exchange, io_uring",
                    ops,
                    Arc::new(move |n| {
                        remote_peers::weir_remote::<$n>(
                            $pairs,
                            $pairs,
                            timeout,
                            DriverKind::Uring,
                            n,
                        )
                    }),
                    None,
                ));
            }
            cases.push(workload(
                $experiment,
                "weir remote exchange, two processes",
                ops,
                Arc::new(move |n| {
                    remote_peers::weir_remote_processes::<$n>(
                        $pairs,
                        $pairs,
                        timeout,
                        DriverKind::Auto,
                        n,
                    )
                }),
                None,
            ));
            cases.push(workload(
                $experiment,
                "weir remote exchange, epoll",
                ops,
                Arc::new(move |n| {
                    remote_peers::weir_remote::<$n>($pairs, $pairs, timeout, DriverKind::Epoll, n)
                }),
                None,
            ));
            cases.push(workload(
                $experiment,
                LOCAL_EXCHANGE_REFERENCE,
                ops,
                Arc::new(move |n| {
                    exchange_peers::weir_exchange::<$n>(
                        $pairs,
                        $pairs,
                        Routing::RoundRobin,
                        timeout,
                        n,
                    )
                }),
                None,
            ));
            cases.push(workload(
                $experiment,
                TCP_CEILING,
                ops,
                Arc::new(move |n| remote_peers::tcp_ceiling::<$n>($pairs, n)),
                None,
            ));
        }};
    }
    pair!(
        "remote 1→1, 8-byte records, timeout 100 ms",
        8,
        1,
        2_000_000.0
    );
    pair!(
        "remote 1→1, 100-byte records, timeout 100 ms",
        100,
        1,
        1_000_000.0
    );
    pair!(
        "remote 1→1, 1000-byte records, timeout 100 ms",
        1000,
        1,
        200_000.0
    );
    pair!(
        "remote 2→2, 8-byte records, timeout 100 ms",
        8,
        2,
        2_000_000.0
    );
    pair!(
        "remote 2→2, 100-byte records, timeout 100 ms",
        100,
        2,
        1_000_000.0
    );
    pair!(
        "remote 2→2, 1000-byte records, timeout 100 ms",
        1000,
        2,
        200_000.0
    );
    let rate = 10_000u64;
    let ops = (rate as f64 * 0.5 * scale).max(1000.0);
    let latency = "remote latency, open loop 10 k records/s, 100-byte records, timeout 0";
    if uring {
        cases.push(workload(
            latency,
            "weir remote exchange, io_uring (network threads park)",
            ops,
            Arc::new(move |n| {
                remote_peers::weir_remote_open_loop::<100>(
                    rate,
                    Duration::ZERO,
                    DriverKind::Uring,
                    n,
                )
            }),
            Some(rate as f64),
        ));
    }
    cases.push(workload(
        latency,
        "weir remote exchange, epoll (network threads park)",
        ops,
        Arc::new(move |n| {
            remote_peers::weir_remote_open_loop::<100>(rate, Duration::ZERO, DriverKind::Epoll, n)
        }),
        Some(rate as f64),
    ));
    if uring {
        cases.push(workload(
            latency,
            "weir remote exchange, io_uring (network threads spin 200 µs)",
            ops,
            Arc::new(move |n| {
                remote_peers::weir_remote_open_loop::<100>(
                    rate,
                    Duration::from_micros(200),
                    DriverKind::Uring,
                    n,
                )
            }),
            Some(rate as f64),
        ));
    }
    cases.push(workload(
        "remote latency, open loop 10 k records/s, 100-byte records, timeout 0",
        TCP_LATENCY_CEILING,
        ops,
        Arc::new(move |n| remote_peers::tcp_open_loop_ceiling::<100>(rate, n)),
        Some(rate as f64),
    ));
    cases
}

/// One write per record on a plain TCP stream, a reader spinning on the non-blocking
/// socket.
pub const TCP_LATENCY_CEILING: &str =
    "raw TCP ceiling (a write per record, reader spinning on a non-blocking socket)";

/// The local exchange beside the remote one: the same records with no TCP.
pub const LOCAL_EXCHANGE_REFERENCE: &str = "local exchange reference (Weir's, no TCP)";
/// The same bytes over a plain TCP stream, by hand: 32 KiB blocking writes, the reader
/// spinning on a non-blocking socket where it has a core to itself (1→1), blocked in
/// `read` where the threads outnumber the two cores (2→2).
pub const TCP_CEILING: &str =
    "raw TCP ceiling (32 KiB writes and reads; reader spins 1→1, blocks 2→2)";

/// The crossbeam peer with one record per message.
pub const CROSSBEAM_PER_RECORD: &str = "crossbeam_channel, one record per message";
/// The crossbeam peer with a `Vec` of 32 KiB of records per message.
pub const CROSSBEAM_BATCHED: &str = "crossbeam_channel, Vec of 32 KiB per message";
/// The `rtrb` peer: an SPSC ring buffer, one record per slot.
pub const RTRB_PER_RECORD: &str = "rtrb ring buffer, one record per slot";
/// The rtrb peer moving up to 32 KiB of records per chunk.
pub const RTRB_CHUNKED: &str = "rtrb ring buffer, chunks of 32 KiB of records";
/// The same values moved between the two cores with no framework: written by value into
/// preallocated 32 KiB batches that two SPSC rings circulate, both sides spinning.
pub const CROSS_CORE_CEILING: &str =
    "cross-core ceiling: the values in recycled 32 KiB batches, spinning, no framework";
/// The wire format's copy alone: length-prefixed records copied into 32 KiB segments
/// cycling through a warm region of the pool's size, on one thread.
pub const WIRE_COPY_REFERENCE: &str = "wire-format reference: copy into segments, one thread";
/// The same, each filled segment then decoded, on one thread.
pub const WIRE_DECODE_REFERENCE: &str =
    "wire-format reference: copy into segments and decode, one thread";
/// Copy into segments on one core, decode on the other, segments through SPSC rings.
pub const WIRE_CROSS_CORE_REFERENCE: &str =
    "wire-format reference: copy into segments, decode on the other core";

/// The lookup experiments: lookups per second on one worker against the embedded
/// service (pinned to the other core), through the async operator with each driver,
/// through a pipelined tokio client, and the ceiling of a hand-written `mio` loop with
/// no operator; and the 1 ms closed loop.
pub fn lookup_cases(scale: f64) -> Vec<Case> {
    fn with_service(
        latency: Latency,
        run: impl Fn(&LookupServer, u64) -> Measurement + Send + Sync + 'static,
    ) -> Workload {
        Arc::new(move |n| {
            let server = lookup_peers::service(latency);
            let measured = run(&server, n);
            drop(server);
            measured
        })
    }
    let zero = Latency::Fixed(Duration::ZERO);
    let uring = weir_net::build_driver(DriverKind::Uring).is_ok();
    let driver = if uring {
        DriverKind::Uring
    } else {
        DriverKind::Epoll
    };
    let mut cases = Vec::new();
    let sweeps: [(&'static str, usize, f64); 4] = [
        ("lookup latency 0, 1 in flight", 1, 5_000.0),
        ("lookup latency 0, 16 in flight", 16, 100_000.0),
        ("lookup latency 0, 256 in flight", 256, 400_000.0),
        ("lookup latency 0, 1024 in flight", 1024, 400_000.0),
    ];
    for (experiment, c, ops) in sweeps {
        let ops = ops * scale;
        if uring {
            cases.push(workload(
                experiment,
                "weir io_uring",
                ops,
                with_service(zero, move |a, n| {
                    lookup_peers::weir(DriverKind::Uring, a, c, n)
                }),
                None,
            ));
        }
        cases.push(workload(
            experiment,
            "weir epoll",
            ops,
            with_service(zero, move |a, n| {
                lookup_peers::weir(DriverKind::Epoll, a, c, n)
            }),
            None,
        ));
        cases.push(workload(
            experiment,
            TOKIO_LOOKUP,
            ops,
            with_service(zero, move |a, n| lookup_peers::tokio(a, c, n)),
            None,
        ));
        cases.push(workload(
            experiment,
            TOKIO_LOOP_LOOKUP,
            ops,
            with_service(zero, move |a, n| lookup_peers::tokio_loop(a, c, n)),
            None,
        ));
        cases.push(workload(
            experiment,
            MIO_LOOKUP_CEILING,
            ops,
            with_service(zero, move |a, n| lookup_peers::mio_ceiling(a, c, n)),
            None,
        ));
    }
    let one_ms = Latency::Fixed(Duration::from_millis(1));
    let limit = 1024.0 / 1e-3;
    let ops = 500_000.0 * scale;
    cases.push(workload(
        "lookup latency 1 ms, 1024 in flight",
        if uring { "weir io_uring" } else { "weir epoll" },
        ops,
        with_service(one_ms, move |a, n| lookup_peers::weir(driver, a, 1024, n)),
        Some(limit),
    ));
    cases.push(workload(
        "lookup latency 1 ms, 1024 in flight",
        TOKIO_LOOKUP,
        ops,
        with_service(one_ms, |a, n| lookup_peers::tokio(a, 1024, n)),
        Some(limit),
    ));
    cases.push(workload(
        "lookup latency 1 ms, 1024 in flight",
        TOKIO_LOOP_LOOKUP,
        ops,
        with_service(one_ms, |a, n| lookup_peers::tokio_loop(a, 1024, n)),
        Some(limit),
    ));
    cases
}

/// The tokio peer of the lookup experiments.
pub const TOKIO_LOOKUP: &str = "tokio pipelined client (batched writes)";
/// The tokio peer without a per-call future: one task, a pipelined loop.
pub const TOKIO_LOOP_LOOKUP: &str = "tokio pipelined loop (one task, no per-call future)";
/// The ceiling of the lookup experiments.
pub const MIO_LOOKUP_CEILING: &str = "mio loop ceiling (hand-written, no operator)";

/// The Redis experiments: GETs of 100-byte values at C in flight from one worker,
/// Weir (io_uring and epoll, plain pipelining and MGET batching, polling for
/// `redis_peers::SPIN` before parking; and on io_uring, both again parking at once)
/// against redis-rs and fred, each one `GET` per call and in their batched forms
/// (pipeline and `MGET` of C / 2 keys), and the server's rate under its own load tool
/// (`redis-benchmark -P 64`) for reference. A peer is compared with the Weir row that
/// works as it does: plain calls with Weir's plain pipelining, batched calls with Weir's
/// MGET batching, both with the worker that parks as the peers' tokio runtime does; the
/// spinning rows have no peer. One `redis-server`, pinned to the second core, serves
/// every turn; it stops when the cases are dropped. Fails where `redis-server` cannot be
/// started.
pub fn redis_cases(scale: f64) -> Result<Vec<Case>, String> {
    use redis_peers::{fred, peer_batch, redis_rs, reference, weir, PeerForm, SPIN};
    let server = Arc::new(redis_peers::server()?);
    let uring = weir_net::build_driver(DriverKind::Uring).is_ok();
    let mut drivers = vec![(DriverKind::Epoll, "weir epoll", "weir epoll, MGET batching")];
    if uring {
        drivers.insert(
            0,
            (
                DriverKind::Uring,
                "weir io_uring",
                "weir io_uring, MGET batching",
            ),
        );
    }
    let with_server = |run: RedisWorkload| -> Workload {
        let server = Arc::clone(&server);
        Arc::new(move |n| run(&server.url(), n))
    };
    let mut cases = Vec::new();
    let sweeps: [(&'static str, usize, f64); 4] = [
        (REDIS_C1, 1, 20_000.0),
        ("redis GET 100 B, 16 in flight", 16, 200_000.0),
        (REDIS_C256, 256, 600_000.0),
        ("redis GET 100 B, 1024 in flight", 1024, 600_000.0),
    ];
    for (experiment, c, ops) in sweeps {
        let ops = ops * scale;
        for &(driver, plain, batched) in &drivers {
            for (name, mget) in [(plain, false), (batched, true)] {
                cases.push(
                    workload(
                        experiment,
                        name,
                        ops,
                        with_server(Arc::new(move |url, n| weir(driver, url, c, mget, SPIN, n))),
                        None,
                    )
                    .paired(REDIS_SPINNING),
                );
            }
        }
        let (driver, plain, batched) = if uring {
            (
                DriverKind::Uring,
                WEIR_REDIS_NO_SPIN_URING,
                WEIR_REDIS_MGET_NO_SPIN_URING,
            )
        } else {
            (
                DriverKind::Epoll,
                WEIR_REDIS_NO_SPIN_EPOLL,
                WEIR_REDIS_MGET_NO_SPIN_EPOLL,
            )
        };
        for (name, mget, pairing) in [(plain, false, REDIS_PLAIN), (batched, true, REDIS_BATCHED)] {
            cases.push(
                workload(
                    experiment,
                    name,
                    ops,
                    with_server(Arc::new(move |url, n| {
                        weir(driver, url, c, mget, Duration::ZERO, n)
                    })),
                    None,
                )
                .paired(pairing),
            );
        }
        let k = peer_batch(c);
        let peers: [(&'static str, PeerForm, bool, &'static str); 6] = [
            (REDIS_RS, PeerForm::Get, true, REDIS_PLAIN),
            (REDIS_RS_PIPE, PeerForm::Pipeline(k), true, REDIS_BATCHED),
            (REDIS_RS_MGET, PeerForm::Mget(k), true, REDIS_BATCHED),
            (FRED, PeerForm::Get, false, REDIS_PLAIN),
            (FRED_PIPELINE, PeerForm::Pipeline(k), false, REDIS_BATCHED),
            (FRED_MGET, PeerForm::Mget(k), false, REDIS_BATCHED),
        ];
        for (name, form, is_redis_rs, pairing) in peers {
            // At one in flight a batch is one key: the batched forms are the plain one.
            if c == 1 && form != PeerForm::Get {
                continue;
            }
            let run: RedisWorkload = if is_redis_rs {
                Arc::new(move |url, n| redis_rs(url, c, form, n))
            } else {
                Arc::new(move |url, n| fred(url, c, form, n))
            };
            cases.push(workload(experiment, name, ops, with_server(run), None).paired(pairing));
        }
        cases.push(workload(
            experiment,
            REDIS_REFERENCE,
            1_000_000.0 * scale,
            with_server(Arc::new(reference)),
            None,
        ));
    }
    Ok(cases)
}

/// A Redis workload: runs `n` operations against the server at a URL.
type RedisWorkload = Arc<dyn Fn(&weir_net::redis::RedisUrl, u64) -> Measurement + Send + Sync>;

/// The pairing of Weir's rows whose worker spins before it parks: no peer spins.
const REDIS_SPINNING: &str = "worker spins 100 µs before parking (no peer does)";
/// The pairing of one `GET` per call, the worker parking when idle.
const REDIS_PLAIN: &str = "plain GETs, parks when idle";
/// The pairing of batched calls (MGET, pipelines), the worker parking when idle.
const REDIS_BATCHED: &str = "batched GETs, parks when idle";

/// Weir's plain pipelining on io_uring with a worker that parks as soon as it is idle.
pub const WEIR_REDIS_NO_SPIN_URING: &str = "weir io_uring, no spin (parks when idle)";
/// The same on epoll, where io_uring is unavailable.
pub const WEIR_REDIS_NO_SPIN_EPOLL: &str = "weir epoll, no spin (parks when idle)";
/// Weir's MGET batching on io_uring with a worker that parks as soon as it is idle.
pub const WEIR_REDIS_MGET_NO_SPIN_URING: &str =
    "weir io_uring, MGET batching, no spin (parks when idle)";
/// The same on epoll, where io_uring is unavailable.
pub const WEIR_REDIS_MGET_NO_SPIN_EPOLL: &str =
    "weir epoll, MGET batching, no spin (parks when idle)";

/// The Redis experiment at one lookup in flight.
pub const REDIS_C1: &str = "redis GET 100 B, 1 in flight";
/// The Redis experiment the targets are set at.
pub const REDIS_C256: &str = "redis GET 100 B, 256 in flight";
/// The redis-rs peer, one `GET` per call.
pub const REDIS_RS: &str =
    "redis-rs multiplexed connection, a task per GET in flight (tokio current-thread)";
/// The redis-rs peer, `redis::pipe()` of C / 2 `GET`s per call.
pub const REDIS_RS_PIPE: &str = "redis-rs pipe() of C/2 GETs, 2 in flight (tokio current-thread)";
/// The redis-rs peer, `MGET` of C / 2 keys per call.
pub const REDIS_RS_MGET: &str = "redis-rs MGET of C/2 keys, 2 in flight (tokio current-thread)";
/// The fred peer, one `GET` per call.
pub const FRED: &str =
    "fred client, auto-pipelined, a task per GET in flight (tokio current-thread)";
/// The fred peer, `pipeline()` of C / 2 `GET`s per call.
pub const FRED_PIPELINE: &str = "fred pipeline() of C/2 GETs, 2 in flight (tokio current-thread)";
/// The fred peer, `mget` of C / 2 keys per call.
pub const FRED_MGET: &str = "fred mget of C/2 keys, 2 in flight (tokio current-thread)";
/// The server's rate under its own load tool, for reference.
pub const REDIS_REFERENCE: &str =
    "redis-benchmark -P 64 -r 100000, 50 connections (reference: the server under its own load tool)";

/// The ring experiments (issue: streaming single and batched, round trip), scaled.
pub fn ring_cases(scale: f64) -> Vec<Case> {
    use ring_peers::*;
    let stream_ops = 4_000_000.0 * scale;
    let trips = 100_000.0 * scale;
    vec![
        case(
            "ring streaming, one at a time (u64, capacity 1024)",
            Weir::NAME,
            stream_ops,
            stream::<Weir>,
        ),
        case(
            "ring streaming, one at a time (u64, capacity 1024)",
            Rtrb::NAME,
            stream_ops,
            stream::<Rtrb>,
        ),
        case(
            "ring streaming, one at a time (u64, capacity 1024)",
            ArrayQueue::NAME,
            stream_ops,
            stream::<ArrayQueue>,
        ),
        case(
            "ring streaming, one at a time (u64, capacity 1024)",
            StdSync::NAME,
            stream_ops / 4.0,
            stream::<StdSync>,
        ),
        case(
            "ring streaming, batches of 64",
            Weir::NAME,
            stream_ops * 2.0,
            stream_batched::<Weir>,
        ),
        case(
            "ring streaming, batches of 64",
            Rtrb::NAME,
            stream_ops * 2.0,
            stream_batched::<Rtrb>,
        ),
        case(
            "ring ping-pong round trip",
            Weir::NAME,
            trips,
            round_trip::<Weir>,
        ),
        case(
            "ring ping-pong round trip",
            Rtrb::NAME,
            trips,
            round_trip::<Rtrb>,
        ),
        case(
            "ring ping-pong round trip",
            ArrayQueue::NAME,
            trips,
            round_trip::<ArrayQueue>,
        ),
        case(
            "ring ping-pong round trip",
            StdSync::NAME,
            trips / 4.0,
            round_trip::<StdSync>,
        ),
    ]
}

/// The pool experiments (acquire + recycle on one thread and across threads), scaled.
pub fn pool_cases(scale: f64) -> Vec<Case> {
    use pool_peers::*;
    let single = 4_000_000.0 * scale;
    let cross = 500_000.0 * scale;
    vec![
        case(
            "pool acquire+recycle, one thread",
            Weir::NAME,
            single,
            single_thread::<Weir>,
        ),
        case(
            "pool acquire+recycle, one thread",
            MutexPool::NAME,
            single,
            single_thread::<MutexPool>,
        ),
        case(
            "pool acquire+recycle, one thread",
            ArrayQueuePool::NAME,
            single,
            single_thread::<ArrayQueuePool>,
        ),
        case(
            "pool acquire here, recycle on the other core",
            Weir::NAME,
            cross,
            cross_thread::<Weir>,
        ),
        case(
            "pool acquire here, recycle on the other core",
            MutexPool::NAME,
            cross,
            cross_thread::<MutexPool>,
        ),
        case(
            "pool acquire here, recycle on the other core",
            ArrayQueuePool::NAME,
            cross,
            cross_thread::<ArrayQueuePool>,
        ),
    ]
}

/// Runs every case of each experiment in turns, `rounds` times, rotating the order.
/// `progress` is told each finished turn.
pub fn run(cases: &[Case], rounds: usize, mut progress: impl FnMut(&Case, f64)) -> Vec<Summary> {
    let mut summaries: Vec<Summary> = cases
        .iter()
        .map(|c| Summary {
            experiment: c.experiment,
            implementation: c.implementation,
            role: c.role,
            samples_ns: Vec::with_capacity(rounds),
            latency_ns: None,
            limit_ops_per_s: c.limit_ops_per_s,
            client_cpu_ns: Vec::new(),
            service_cpu_ns: Vec::new(),
            pairing: c.pairing,
            ops: c.ops,
        })
        .collect();
    let mut experiments: Vec<&'static str> = cases.iter().map(|c| c.experiment).collect();
    experiments.dedup();
    for round in 0..rounds {
        for experiment in &experiments {
            let members: Vec<usize> = (0..cases.len())
                .filter(|&i| cases[i].experiment == *experiment)
                .collect();
            for k in 0..members.len() {
                let index = members[(k + round) % members.len()];
                let c = &cases[index];
                let measured = (c.run)(c.ops);
                let ns = measured.elapsed.as_nanos() as f64 / c.ops as f64;
                let summary = &mut summaries[index];
                summary.samples_ns.push(ns);
                if let Some(cpu) = measured.cpu {
                    let ops = c.ops as f64;
                    summary.client_cpu_ns.push(cpu.client_ns as f64 / ops);
                    summary.service_cpu_ns.push(cpu.service_ns as f64 / ops);
                }
                if let Some(latency) = measured.latency_ns {
                    match &mut summary.latency_ns {
                        Some(all) => all.add(&latency).expect("histograms share bounds"),
                        None => summary.latency_ns = Some(latency),
                    }
                }
                progress(c, ns);
            }
        }
    }
    summaries
}

/// A Markdown table per experiment: median ns/op, million ops/s, range, the ratios
/// (a peer's time over the best Weir row of its pairing, a ceiling's over the best
/// Weir row; on Weir's rows the best peer of its pairing's time over Weir's: above 1,
/// Weir is faster), the row each is compared with, fraction of the limit and latency; and
/// where the experiment measures CPU time, the median CPU ns per operation of the
/// client's thread and of the service's.
pub fn render(summaries: &[Summary]) -> String {
    let mut out = String::new();
    let mut experiments: Vec<&'static str> = summaries.iter().map(|s| s.experiment).collect();
    experiments.dedup();
    for experiment in experiments {
        let rows: Vec<&Summary> = summaries
            .iter()
            .filter(|s| s.experiment == experiment)
            .collect();
        let cpu = rows.iter().any(|s| s.cpu_ns().is_some());
        let _ = writeln!(out, "\n### {experiment}\n");
        let _ = writeln!(
            out,
            "| implementation | role | median ns/op | M ops/s | min–max ns/op | time ÷ weir's | peer's time ÷ weir's | compared with | of limit | p50 / p99 / p99.9 / max µs |{}",
            if cpu { " client CPU ns/op | service CPU ns/op |" } else { "" }
        );
        let _ = writeln!(
            out,
            "|---|---|---:|---:|---:|---:|---:|---|---:|---:|{}",
            if cpu { "---:|---:|" } else { "" }
        );
        for s in rows {
            let median = s.median_ns();
            let ratios = ratios(summaries, s);
            let over_weir = ratios
                .over_weir
                .map_or("—".to_string(), |(_, r)| format!("{r:.2}×"));
            let best_peer = ratios
                .best_peer
                .map_or("—".to_string(), |(_, r)| format!("{r:.2}×"));
            let compared_with = ratios
                .over_weir
                .or(ratios.best_peer)
                .map_or("—", |(name, _)| name);
            let fraction = match s.limit_ops_per_s {
                Some(limit) => format!("{:.1}%", 1e9 / median / limit * 100.0),
                None => "—".to_string(),
            };
            let latency = match &s.latency_ns {
                Some(h) => format!(
                    "{:.0} / {:.0} / {:.0} / {:.0}",
                    h.value_at_quantile(0.5) as f64 / 1e3,
                    h.value_at_quantile(0.99) as f64 / 1e3,
                    h.value_at_quantile(0.999) as f64 / 1e3,
                    h.max() as f64 / 1e3
                ),
                None => "—".to_string(),
            };
            let cpu_columns = match (cpu, s.cpu_ns()) {
                (false, _) => String::new(),
                (true, Some((client, service))) => format!(" {client:.1} | {service:.1} |"),
                (true, None) => " — | — |".to_string(),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {:.1} | {:.3} | {:.1}–{:.1} | {} | {} | {} | {} | {} |{}",
                s.implementation,
                s.role.name(),
                median,
                1e3 / median,
                s.min_ns(),
                s.max_ns(),
                over_weir,
                best_peer,
                compared_with,
                fraction,
                latency,
                cpu_columns
            );
        }
    }
    out
}

/// The same figures as JSON, with the machine and the command. Per row:
/// `peer_over_weir` is a peer's time over the best Weir row of its pairing (a ceiling's
/// or reference's over the best Weir row); on Weir's rows, `best_peer` names the
/// fastest peer of its pairing and `best_peer_over_weir` is its time over the row's
/// (above 1: Weir is faster); `compared_with` names the other row of the ratio and
/// `pairing` is the row's [`Case::pairing`]. Ceilings are never the best peer. Where the
/// workload measures CPU time: `client_cpu_ns_per_op` and `service_cpu_ns_per_op`
/// (medians) and their samples per round.
pub fn to_json(summaries: &[Summary], command: &str, rounds: usize) -> Value {
    let rows: Vec<Value> = summaries
        .iter()
        .map(|s| {
            let ratios = ratios(summaries, s);
            let mut row = json!({
                "experiment": s.experiment,
                "implementation": s.implementation,
                "role": s.role.name(),
                "is_weir": s.is_weir(),
                "median_ns_per_op": s.median_ns(),
                "min_ns_per_op": s.min_ns(),
                "max_ns_per_op": s.max_ns(),
                "samples_ns_per_op": s.samples_ns,
                "peer_over_weir": ratios.over_weir.map(|(_, r)| r),
                "compared_with": ratios.over_weir.or(ratios.best_peer).map(|(name, _)| name),
                "pairing": s.pairing,
                "ops_per_turn": s.ops,
                "best_peer": ratios.best_peer.map(|(name, _)| name),
                "best_peer_over_weir": ratios.best_peer.map(|(_, r)| r),
                "limit_ops_per_s": s.limit_ops_per_s,
                "fraction_of_limit": s.limit_ops_per_s.map(|l| 1e9 / s.median_ns() / l),
                "latency_ns": s.latency_ns.as_ref().map(|h| json!({
                    "p50": h.value_at_quantile(0.5),
                    "p90": h.value_at_quantile(0.9),
                    "p99": h.value_at_quantile(0.99),
                    "p99.9": h.value_at_quantile(0.999),
                    "max": h.max(),
                    "count": h.len(),
                })),
            });
            if let Some((client, service)) = s.cpu_ns() {
                row["client_cpu_ns_per_op"] = json!(client);
                row["service_cpu_ns_per_op"] = json!(service);
                row["client_cpu_samples_ns_per_op"] = json!(s.client_cpu_ns);
                row["service_cpu_samples_ns_per_op"] = json!(s.service_cpu_ns);
            }
            row
        })
        .collect();
    json!({ "command": command, "rounds": rounds, "machine": machine(), "results": rows })
}

/// User + system CPU time of the whole process so far (every thread, ended ones too).
pub fn process_cpu() -> Duration {
    // SAFETY: an all-zero `rusage` is a valid value for the call to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage; the result is checked.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    Duration::from_micros(micros(usage.ru_utime) + micros(usage.ru_stime))
}

/// CPU model, cores and kernel of this machine.
pub fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    // The machine's online cores, not this thread's affinity (the comparisons pin their
    // threads, after which `available_parallelism` says 1).
    // SAFETY: sysconf reads a system setting; no memory is passed.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    let cores = if online > 0 {
        online as usize
    } else {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    };
    json!({ "cpu": cpu, "cores": cores, "kernel": kernel })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(implementation: &'static str, ns: f64) -> Summary {
        Summary {
            experiment: "e",
            implementation,
            role: Role::of(implementation),
            samples_ns: vec![ns],
            latency_ns: None,
            limit_ops_per_s: None,
            client_cpu_ns: Vec::new(),
            service_cpu_ns: Vec::new(),
            pairing: None,
            ops: 1,
        }
    }

    fn paired(implementation: &'static str, ns: f64, pairing: &'static str) -> Summary {
        Summary {
            pairing: Some(pairing),
            ..summary(implementation, ns)
        }
    }

    #[test]
    fn weir_is_compared_with_the_best_peer_and_a_ceiling_is_no_peer() {
        let summaries = [
            summary("weir epoll", 150.0),
            summary("weir io_uring", 100.0),
            summary("slow peer", 1000.0),
            summary("fast peer", 200.0),
            summary("memcpy ceiling", 10.0),
        ];
        let json = to_json(&summaries, "test", 1);
        let rows = json["results"].as_array().expect("rows");
        let roles: Vec<&str> = rows.iter().map(|r| r["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["weir", "weir", "peer", "peer", "ceiling"]);
        assert_eq!(rows[0]["best_peer"], "fast peer");
        assert!((rows[0]["best_peer_over_weir"].as_f64().unwrap() - 200.0 / 150.0).abs() < 1e-9);
        assert_eq!(rows[1]["best_peer_over_weir"].as_f64(), Some(2.0));
        assert!(rows[1]["peer_over_weir"].is_null());
        // Peers and ceilings over the best Weir row.
        assert_eq!(rows[2]["peer_over_weir"].as_f64(), Some(10.0));
        assert_eq!(rows[3]["peer_over_weir"].as_f64(), Some(2.0));
        assert_eq!(rows[4]["peer_over_weir"].as_f64(), Some(0.1));
        assert!(rows[4]["best_peer"].is_null());
        assert_eq!(rows[2]["compared_with"], "weir io_uring");
        assert_eq!(rows[1]["compared_with"], "fast peer");
        let table = render(&summaries);
        assert!(table.contains("| 2.00× | fast peer |"), "{table}");
    }

    /// A row is compared only with rows of its pairing: a batched Weir row with batched
    /// peers, a plain one with plain peers, however the other pairing's rows compare.
    #[test]
    fn rows_are_compared_within_their_pairing() {
        let summaries = [
            paired("weir plain", 100.0, "plain"),
            paired("weir batched", 20.0, "batched"),
            paired("weir spinning", 50.0, "spin"),
            paired("plain peer", 80.0, "plain"),
            paired("batched peer", 40.0, "batched"),
            paired("other batched peer", 60.0, "batched"),
            summary("memcpy ceiling", 10.0),
        ];
        let json = to_json(&summaries, "test", 1);
        let rows = json["results"].as_array().expect("rows");
        assert_eq!(rows[0]["best_peer"], "plain peer");
        assert!((rows[0]["best_peer_over_weir"].as_f64().unwrap() - 0.8).abs() < 1e-9);
        assert_eq!(rows[1]["best_peer"], "batched peer");
        assert_eq!(rows[1]["best_peer_over_weir"].as_f64(), Some(2.0));
        // No peer spins: no ratio.
        assert!(rows[2]["best_peer"].is_null());
        assert!(rows[2]["best_peer_over_weir"].is_null());
        assert_eq!(rows[3]["compared_with"], "weir plain");
        assert_eq!(rows[3]["peer_over_weir"].as_f64(), Some(0.8));
        assert_eq!(rows[5]["compared_with"], "weir batched");
        assert_eq!(rows[5]["peer_over_weir"].as_f64(), Some(3.0));
        // A ceiling bounds the best of Weir, whatever its pairing.
        assert_eq!(rows[6]["compared_with"], "weir batched");
        assert_eq!(rows[6]["pairing"], Value::Null);
    }

    /// CPU columns appear in the table and the JSON of an experiment that measures CPU
    /// time, and nowhere else.
    #[test]
    fn cpu_per_operation_shows_only_where_measured() {
        let mut weir = summary("weir io_uring", 100.0);
        weir.client_cpu_ns = vec![90.0, 80.0, 70.0];
        weir.service_cpu_ns = vec![40.0, 60.0, 50.0];
        let mut other = summary("weir other", 10.0);
        other.experiment = "f";
        let summaries = [weir, summary("peer", 120.0), other];
        let table = render(&summaries);
        assert!(
            table.contains("client CPU ns/op | service CPU ns/op"),
            "{table}"
        );
        assert!(table.contains("| 80.0 | 50.0 |"), "{table}");
        assert!(table.contains("| — | — |"), "{table}");
        let f = table.split("### f").nth(1).expect("experiment f");
        assert!(!f.contains("CPU"), "{f}");
        let json = to_json(&summaries, "test", 3);
        let rows = json["results"].as_array().expect("rows");
        assert_eq!(rows[0]["client_cpu_ns_per_op"].as_f64(), Some(80.0));
        assert_eq!(rows[0]["service_cpu_ns_per_op"].as_f64(), Some(50.0));
        assert!(rows[1].get("client_cpu_ns_per_op").is_none());
        assert!(rows[2].get("service_cpu_ns_per_op").is_none());
    }

    #[test]
    fn without_a_peer_there_is_no_ratio() {
        let json = to_json(&[summary("weir exchange", 50.0)], "test", 1);
        assert!(json["results"][0]["best_peer_over_weir"].is_null());
    }

    #[test]
    fn every_case_name_says_its_role() {
        for case in exchange_cases(1.0)
            .into_iter()
            .chain(async_cases(1.0))
            .chain(lookup_cases(1.0))
            .chain(remote_cases(1.0))
        {
            let ceiling = case.implementation.contains("ceiling");
            assert_eq!(
                case.role == Role::Ceiling,
                ceiling,
                "{}",
                case.implementation
            );
        }
        // The redis suite needs a server to build its cases; its names by themselves.
        assert_eq!(Role::of(REDIS_RS), Role::Peer);
        assert_eq!(Role::of(FRED), Role::Peer);
        assert_eq!(Role::of(LOCAL_EXCHANGE_REFERENCE), Role::Reference);
        assert_eq!(Role::of(REDIS_REFERENCE), Role::Reference);
        assert_eq!(Role::of("weir io_uring, MGET batching"), Role::Weir);
    }
}
