//! The async I/O operator: Flink's `AsyncWaitOperator`, on one thread, without
//! allocation per record.
//!
//! Each record triggers a call to an external system through an [`AsyncFunction`];
//! up to `capacity` records and watermarks are in flight; results are emitted in input
//! order ([`OutputMode::Ordered`]), in completion order fenced by watermarks
//! ([`OutputMode::Unordered`]), or in order per key ([`OutputMode::KeyedOrdered`]);
//! calls time out and may be retried.
//!
//! The rules (Flink's, plus the keyed mode):
//! - `capacity > 0` elements in flight, watermarks included; a full operator does not
//!   block its thread: the task yields to its mailbox until a slot frees.
//! - Ordered: strictly in input order. Unordered: in completion order, but never across
//!   a watermark: a watermark is emitted once everything before it is, and before
//!   anything after it. Keyed-ordered: in order per key only.
//! - The first completion of a call wins; an empty result emits nothing; an error
//!   fails the operator unless a retry applies.
//! - The timeout runs from the first invocation and covers every attempt; on expiry the
//!   function's `timeout` hook runs (default: fail with a timeout error), and a result
//!   arriving after it is ignored. Retries stop at the timeout.
//! - End of input: every element in flight is completed and emitted before the
//!   operator finishes; a snapshot holds the elements in flight, in input order, to be
//!   processed again first on restore.
//!
//! - [`AsyncWaitOperator`]: the operator, driven by its task (records, watermarks,
//!   completions, timers, end of input, snapshot);
//! - [`ResultFuture`]: the handle through which a call's result comes back, from the
//!   task's own thread (fast path, no atomics) or any other;
//! - [`RetryStrategy`], [`AsyncConfig`]: how calls are retried and bounded;
//! - [`AsyncBatchFunction`] and [`Batched`]: one call per batch of records (Flink's
//!   `AsyncBatchFunction`), cut by size or time, in the same operator;
//! - [`LookupCache`]: a per-subtask cache of results in front of the calls (Flink's
//!   lookup-join `PARTIAL` cache), set with [`AsyncConfig::with_cache`]; not state: a
//!   restored operator starts with it empty;
//! - [`futures`]: writing the call as an `async` block, run on a per-worker executor;
//! - [`AsyncHarness`]: the real operator with a manual clock and an inline mailbox, for
//!   tests (Flink's `OneInputStreamOperatorTestHarness`).

mod batch;
mod cache;
mod error;
mod future;
pub mod futures;
mod harness;
mod metrics;
mod operator;
mod queue;
mod retry;

use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

pub use batch::{AsyncBatchFunction, BatchConfig, BatchMetrics, BatchResult, Batched};
use cache::CacheSpec;
pub use cache::{LookupCache, LOOKUP_CACHE_ROWS_MAX};
pub use error::{AsyncError, OperatorError};
pub use future::ResultFuture;
pub use harness::AsyncHarness;
pub use metrics::AsyncMetrics;
pub use operator::AsyncWaitOperator;
pub use retry::RetryStrategy;

use crate::error::ConfigError;
use crate::limits::ASYNC_CAPACITY_MAX;

/// How results leave the operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputMode {
    /// Strictly in input order: an element waits for all its predecessors.
    Ordered,
    /// In completion order, but never across a watermark.
    Unordered,
    /// In input order per key ([`AsyncFunction::key`]), watermarks fencing all keys: a
    /// slow key does not hold back the others.
    KeyedOrdered,
}

/// The user's asynchronous call.
///
/// `invoke` starts the call for one input and hands the result back through `result`,
/// now or later, on this thread or another. See [`ResultFuture`] for what happens when
/// it is dropped without completing.
///
/// ```
/// use std::time::Duration;
/// use weir_engine::async_io::{AsyncConfig, AsyncFunction, OutputMode, ResultFuture};
/// use weir_engine::graph::{Graph, SubtaskInfo};
/// use weir_engine::runtime::{Cores, Runtime};
///
/// /// Squares even numbers at once; odd ones on a thread of its own, later.
/// struct Square;
///
/// impl AsyncFunction for Square {
///     type In = u64;
///     type Out = u64;
///     fn invoke(&mut self, n: &u64, result: ResultFuture<u64>) {
///         let n = *n;
///         if n % 2 == 0 {
///             result.complete_one(n * n);
///         } else {
///             std::thread::spawn(move || result.complete_one(n * n));
///         }
///     }
/// }
///
/// let graph = Graph::new();
/// let out = graph
///     .from_generator(10, None, |n| n)
///     .async_wait(
///         |_: &SubtaskInfo| Square,
///         AsyncConfig::new(OutputMode::Ordered, 4).with_timeout(Duration::from_secs(5)),
///     )
///     .collect();
/// graph.execute(Runtime::builder().cores(Cores::Count(1)).pin(false).build()?)?;
/// assert_eq!(out.records(), [0, 1, 4, 9, 16, 25, 36, 49, 64, 81]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait AsyncFunction: 'static {
    /// Input records.
    type In: 'static;
    /// Results; several (or none) may come back per input.
    type Out: Send + 'static;

    /// Whether the function holds calls back to send them together
    /// ([`Batched`]): the operator then tells it when a watermark comes, when it is
    /// full and at end of input ([`flush_pending`](Self::flush_pending)). A constant,
    /// so that other functions pay nothing for it.
    const BUFFERS: bool = false;

    /// Starts the call for `input`.
    fn invoke(&mut self, input: &Self::In, result: ResultFuture<Self::Out>);

    /// An answer known without making a call (a value computed from the input, an entry
    /// of a table the function keeps in memory): `Some(result)` stands for a call that
    /// completed inside [`invoke`](Self::invoke) with that one result, and is emitted at
    /// once without the call's handle, slot or queue: the fast path of functions that
    /// answer many inputs themselves. `None` (the default) makes the call.
    ///
    /// The operator asks only where the answer could leave at once: no watermark is
    /// pending, in ordered mode no record is held, in keyed-ordered mode none of the
    /// record's key, and no retry strategy or lookup cache is configured. Elsewhere it
    /// calls `invoke` for the same input, so an answer given here must be the one
    /// `invoke` completes with, and asking should change nothing (where `ready` returns
    /// `None`, `invoke` runs next). Answers of none or several results go through
    /// `invoke`.
    ///
    /// ```
    /// use weir_engine::async_io::{AsyncConfig, AsyncFunction, AsyncWaitOperator, OutputMode, ResultFuture};
    ///
    /// /// Even numbers are answered at once; odd ones would go to a service.
    /// struct Halve;
    /// impl AsyncFunction for Halve {
    ///     type In = u64;
    ///     type Out = u64;
    ///     fn ready(&mut self, n: &u64) -> Option<u64> {
    ///         (n % 2 == 0).then(|| n / 2)
    ///     }
    ///     fn invoke(&mut self, n: &u64, result: ResultFuture<u64>) {
    ///         match self.ready(n) {
    ///             Some(half) => result.complete_one(half),
    ///             None => result.complete_one(n * 3 + 1), // stands for the service's answer
    ///         }
    ///     }
    /// }
    ///
    /// let mut operator = AsyncWaitOperator::new(Halve, AsyncConfig::new(OutputMode::Ordered, 4), || {})?;
    /// let mut out = Vec::new();
    /// for n in [4, 3, 10] {
    ///     operator.process_record(n, None, 0, &mut out)?;
    /// }
    /// let values: Vec<u64> = out.iter().filter_map(|e| e.as_record().map(|r| r.value)).collect();
    /// assert_eq!(values, [2, 10, 5]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    fn ready(&mut self, input: &Self::In) -> Option<Self::Out> {
        let _ = input;
        None
    }

    /// [`invoke`](Self::invoke) at `now_ns` by the operator's clock (what the operator
    /// calls; the default ignores the time).
    #[inline(always)]
    fn invoke_at(&mut self, input: &Self::In, result: ResultFuture<Self::Out>, now_ns: u64) {
        let _ = now_ns;
        self.invoke(input, result);
    }

    /// When calls held back must be sent at the latest (the operator's timers call
    /// [`flush_pending`](Self::flush_pending) then); `None`: none held.
    #[inline(always)]
    fn pending_deadline(&self) -> Option<u64> {
        None
    }

    /// Sends the calls held back whose time came, or all of them if `force`.
    #[inline(always)]
    fn flush_pending(&mut self, now_ns: u64, force: bool) {
        let _ = (now_ns, force);
    }

    /// Called when the call for `input` timed out (measured from its first invocation,
    /// across retries). Its completion decides the element: results are emitted, an
    /// error fails the operator. The default fails with [`AsyncError::Timeout`].
    fn timeout(&mut self, input: &Self::In, result: ResultFuture<Self::Out>) {
        let _ = input;
        result.complete_err(AsyncError::Timeout);
    }

    /// The key of `input` for [`OutputMode::KeyedOrdered`].
    fn key(&self, input: &Self::In) -> u64 {
        let _ = input;
        0
    }

    /// Called once before the first record.
    fn open(&mut self) {}

    /// Called once after the last element was emitted (end of input).
    fn close(&mut self) {}

    /// Checks the function's own settings when the operator is built (the operator
    /// refuses to start with the error).
    fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }
}

/// Configuration of an [`AsyncWaitOperator`].
///
/// ```
/// use std::time::Duration;
/// use weir_engine::async_io::{AsyncConfig, OutputMode, RetryStrategy};
///
/// // 100 calls in flight, results in input order, each call failed after 1 s, and a
/// // failed call tried up to 3 times, 10 ms apart.
/// let config: AsyncConfig<String> = AsyncConfig::new(OutputMode::Ordered, 100)
///     .with_timeout(Duration::from_secs(1))
///     .with_retry(RetryStrategy::fixed_delay(3, Duration::from_millis(10)).retry_on_any_error());
/// # drop(config);
/// ```
pub struct AsyncConfig<T> {
    pub(crate) mode: OutputMode,
    pub(crate) capacity: usize,
    pub(crate) timeout: Option<Duration>,
    pub(crate) retry: Option<RetryStrategy<T>>,
    /// Shared by the clones of the configuration; each operator builds its own store.
    pub(crate) cache: Option<Arc<dyn CacheSpec<T>>>,
}

impl<T> AsyncConfig<T> {
    /// `capacity` elements in flight at most (records and watermarks), no timeout, no
    /// retry.
    pub fn new(mode: OutputMode, capacity: usize) -> Self {
        AsyncConfig {
            mode,
            capacity,
            timeout: None,
            retry: None,
            cache: None,
        }
    }

    /// Fails (or runs [`AsyncFunction::timeout`] for) calls not completed within
    /// `timeout` of their first invocation.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Retries failed calls (and unwanted results) as `retry` says.
    pub fn with_retry(mut self, retry: RetryStrategy<T>) -> Self {
        self.retry = Some(retry);
        self
    }

    /// Puts a per-subtask cache of results in front of the calls: a record whose key is
    /// cached is completed with the cached results without a call (see [`LookupCache`]
    /// for what is cached, expiry and eviction). Each operator built from this
    /// configuration (each subtask) has its own cache, on its own thread, empty at start
    /// and after a restore: the cache is not checkpointed. The cache's input type must be
    /// the function's [`AsyncFunction::In`]; building the operator fails otherwise.
    pub fn with_cache<In, K>(mut self, cache: LookupCache<In, K, T>) -> Self
    where
        In: 'static,
        K: Hash + Eq + Clone + 'static,
        T: Clone + Send + 'static,
    {
        self.cache = Some(Arc::new(cache));
        self
    }

    /// The output mode.
    pub fn mode(&self) -> OutputMode {
        self.mode
    }

    /// Whether a lookup cache is configured.
    pub fn has_cache(&self) -> bool {
        self.cache.is_some()
    }

    /// The capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.capacity == 0 {
            return Err(ConfigError::ZeroCapacity {
                what: "async operator capacity",
            });
        }
        if self.capacity > ASYNC_CAPACITY_MAX {
            return Err(ConfigError::TooLarge {
                what: "async operator capacity",
                requested: self.capacity,
                limit: ASYNC_CAPACITY_MAX,
            });
        }
        if self.timeout == Some(Duration::ZERO) {
            return Err(ConfigError::Inconsistent(
                "async timeout must be positive; leave it unset for no timeout",
            ));
        }
        if let Some(retry) = &self.retry {
            retry.validate()?;
        }
        if let Some(cache) = &self.cache {
            cache.validate()?;
        }
        Ok(())
    }
}

impl<T> Clone for AsyncConfig<T> {
    fn clone(&self) -> Self {
        AsyncConfig {
            mode: self.mode,
            capacity: self.capacity,
            timeout: self.timeout,
            retry: self.retry.clone(),
            cache: self.cache.clone(),
        }
    }
}

impl<T> core::fmt::Debug for AsyncConfig<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("AsyncConfig")
            .field("mode", &self.mode)
            .field("capacity", &self.capacity)
            .field("timeout", &self.timeout)
            .field("retry", &self.retry)
            .field("cache", &self.cache)
            .finish()
    }
}
