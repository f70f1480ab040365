//! Parking an idle thread without lost wake-ups.
//!
//! A [`Parker`] belongs to the one thread that sleeps on it, and its type says so: it
//! is not `Send`. Any number of [`Unparker`]s (`Send + Sync`) wake it. Wiring that must
//! name a thread's unparker before the thread exists (the runtime's workers) makes an
//! [`UnboundParker`], which is `Send`, and turns it into the `Parker` on the thread that
//! will sleep; only a backend that is not tied to a thread (an eventfd, a condition
//! variable) can be given that way. [`ThreadPark`], which names its thread, also checks
//! it: waiting on it from another thread panics instead of losing wake-ups silently. Sleeping and waking are delegated to a [`ParkBackend`]:
//! `std::thread::park` by default, an eventfd registered with the worker's io_uring
//! on Linux (supplied by `weir-net`).
//!
//! State machine on one atomic (`EMPTY`, `PARKED`, `NOTIFIED`):
//! - the owner announces `PARKED` with a swap, re-checks its queues, then waits;
//! - a waker swaps in `NOTIFIED` after publishing its work, and calls the backend's
//!   `wake` only if the swap returned `PARKED`.
//!
//! Why no wake-up is lost: both sides use read-modify-write operations on `state`, and
//! an RMW always reads the latest value in the modification order. If the waker's swap
//! comes first, the owner's swap returns `NOTIFIED` (and, being Acquire, sees the
//! published work), so it does not sleep. If the owner's swap comes first, the waker's
//! swap returns `PARKED` and it wakes the backend, whose `wake` before `wait` makes
//! `wait` return at once. No `SeqCst` is needed, which also keeps the protocol within
//! what loom models exactly.

use std::marker::PhantomData;
use std::time::{Duration, Instant};

use crate::sync::{thread, Arc, AtomicU32, AtomicU8, Ordering};

const EMPTY: u8 = 0;
const PARKED: u8 = 1;
const NOTIFIED: u8 = 2;

/// How a thread sleeps and is woken. `wake` before `wait` must make that `wait` return
/// at once (a token, as `std::thread::park` and an eventfd have); `wait` may return
/// spuriously.
pub trait ParkBackend: Send + Sync + 'static {
    /// Blocks the owning thread until woken or until `timeout` (if any) elapses.
    fn wait(&self, timeout: Option<Duration>);
    /// Wakes the owning thread; callable from any thread.
    fn wake(&self);
}

/// The default backend: `std::thread::park` on a thread named at construction.
#[derive(Debug)]
pub struct ThreadPark {
    thread: thread::Thread,
}

impl ThreadPark {
    /// A backend that parks and wakes the calling thread.
    pub fn current() -> Self {
        ThreadPark {
            thread: thread::current(),
        }
    }
}

impl ParkBackend for ThreadPark {
    fn wait(&self, timeout: Option<Duration>) {
        assert!(
            thread::current().id() == self.thread.id(),
            "a ThreadPark waited on by a thread other than the one that made it: its \
             wake-ups would go to the wrong thread (make the Parker on the thread that parks)"
        );
        match timeout {
            Some(timeout) => thread::park_timeout(timeout),
            None => thread::park(),
        }
    }

    fn wake(&self) {
        self.thread.unpark();
    }
}

/// A backend on a mutex and condition variable: works whichever thread created it
/// (unlike [`ThreadPark`], which names its thread), for workers without an I/O driver.
#[derive(Debug, Default)]
pub struct CondvarPark {
    token: std::sync::Mutex<bool>,
    condvar: std::sync::Condvar,
}

impl ParkBackend for CondvarPark {
    fn wait(&self, timeout: Option<Duration>) {
        let mut token = self.token.lock().unwrap_or_else(|e| e.into_inner());
        if !*token {
            token = match timeout {
                Some(t) => {
                    self.condvar
                        .wait_timeout(token, t)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self.condvar.wait(token).unwrap_or_else(|e| e.into_inner()),
            };
        }
        *token = false;
    }

    fn wake(&self) {
        *self.token.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.condvar.notify_one();
    }
}

struct Inner {
    state: AtomicU8,
    backend: Box<dyn ParkBackend>,
}

/// The sleeping side. Owned by one thread, so not `Send`; see the module docs for the
/// protocol.
///
/// ```compile_fail
/// fn needs_send<T: Send>() {}
/// needs_send::<weir_engine::park::Parker>();
/// ```
pub struct Parker {
    inner: Arc<Inner>,
    _not_send: PhantomData<*const ()>,
}

/// A parker not yet owned by a thread: made where the wiring happens, moved to the
/// thread that will sleep, and turned into its [`Parker`] there with
/// [`into_parker`](Self::into_parker). Its backend must not be tied to a thread.
pub struct UnboundParker {
    inner: Arc<Inner>,
}

impl UnboundParker {
    /// A parker over a backend that any thread may wait on (an eventfd, a condition
    /// variable; not [`ThreadPark`]).
    pub fn new(backend: impl ParkBackend) -> Self {
        UnboundParker {
            inner: Arc::new(Inner {
                state: AtomicU8::new(EMPTY),
                backend: Box::new(backend),
            }),
        }
    }

    /// A handle that wakes the future parker.
    pub fn unparker(&self) -> Unparker {
        Unparker {
            inner: Arc::clone(&self.inner),
            bell: None,
        }
    }

    /// The parker, owned from now on by the calling thread.
    pub fn into_parker(self) -> Parker {
        Parker {
            inner: self.inner,
            _not_send: PhantomData,
        }
    }
}

impl core::fmt::Debug for UnboundParker {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("UnboundParker").finish_non_exhaustive()
    }
}

/// The waking side: cheap to clone, callable from any thread.
///
/// An unparker made with [`with_doorbell`](Self::with_doorbell) also says *who* has
/// work: it rings one bit of a task's [`Doorbell`] before it wakes the thread, so a
/// worker running many tasks polls only those whose bell rang.
#[derive(Clone)]
pub struct Unparker {
    inner: Arc<Inner>,
    // A std `Arc` even under loom: the runtime shares bells with std types, and the
    // model checks the bits, not the bell's lifetime.
    bell: Option<(std::sync::Arc<Doorbell>, u32)>,
}

/// The signals rung for one task since its worker last looked, a bit each (e.g. "a
/// buffer arrived", "the pool has buffers again", "a call completed elsewhere").
///
/// Ringing is coalescing mail: a bit rung twice before the worker takes it wakes the
/// worker once. Ringers publish their work first, then ring with a read-modify-write
/// (`fetch_or`), and wake the thread only when the bit was clear; the worker takes the
/// bits with a swap before it polls the task. Why nothing is lost: if the ringer's RMW
/// comes first in the modification order of `bits`, the worker's swap reads it (and,
/// being Acquire, sees the published work); if the worker's swap comes first, the ringer
/// finds the bit clear and unparks, which the [`Parker`] protocol never loses. A ringer
/// that finds the bit set relies on the ringer that set it, which unparks after setting
/// it. A plain load instead of the RMW would break this (it could read a bit the worker
/// is about to clear without synchronising with it); the loom model `doorbell` checks it.
#[derive(Debug, Default)]
pub struct Doorbell {
    bits: AtomicU32,
}

impl Doorbell {
    /// A bell with no bit rung.
    pub fn new() -> std::sync::Arc<Self> {
        std::sync::Arc::new(Doorbell {
            bits: AtomicU32::new(0),
        })
    }

    /// Takes the bits rung so far, clearing them (for the worker, before it polls the
    /// task).
    #[inline]
    pub fn take(&self) -> u32 {
        // Relaxed load first: most turns find nothing, and a clear bell needs no RMW
        // (a ring after this load also unparks the worker, whose next turn sees it).
        if self.bits.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        // AcqRel: Acquire pairs with the ringers' Release, making their work visible.
        self.bits.swap(0, Ordering::AcqRel)
    }

    /// The bits rung, without taking them (Acquire: a worker that saw a wake-up through
    /// the bell's unparker sees its bit).
    #[inline]
    pub fn peek(&self) -> u32 {
        self.bits.load(Ordering::Acquire)
    }

    /// Rings `bit`; whether it was clear before (the caller must then wake the worker).
    #[inline]
    pub fn ring(&self, bit: u32) -> bool {
        // AcqRel: Release publishes the ringer's work; an RMW reads the latest value.
        self.bits.fetch_or(bit, Ordering::AcqRel) & bit == 0
    }
}

/// Why [`Parker::park`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wakeup {
    /// A notification was pending or arrived.
    Notified,
    /// The re-check found work before sleeping.
    Ready,
    /// The timeout elapsed with no notification.
    TimedOut,
}

impl Parker {
    /// A parker for the calling thread, sleeping with `std::thread::park`.
    pub fn current() -> Self {
        Self::with_backend(ThreadPark::current())
    }

    /// A parker for the calling thread over another way to sleep (an eventfd, an
    /// io_uring wait).
    pub fn with_backend(backend: impl ParkBackend) -> Self {
        UnboundParker::new(backend).into_parker()
    }

    /// A handle that wakes this parker.
    pub fn unparker(&self) -> Unparker {
        Unparker {
            inner: Arc::clone(&self.inner),
            bell: None,
        }
    }

    /// Sleeps until notified or until `timeout` elapses, unless a notification is
    /// already pending or `is_ready` (called after announcing the park) finds work.
    ///
    /// `is_ready` must look at everything a waker publishes before it calls
    /// [`Unparker::unpark`]; that is what makes the check-then-park race-free.
    pub fn park(&self, timeout: Option<Duration>, is_ready: impl FnOnce() -> bool) -> Wakeup {
        if let Some(early) = self.announce(is_ready) {
            return early;
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let outcome = loop {
            let remaining = match deadline {
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        break Wakeup::TimedOut;
                    }
                    Some(deadline - now)
                }
                None => None,
            };
            self.inner.backend.wait(remaining);
            // Acquire: pairs with the waker's swap, making its work visible.
            if self.inner.state.load(Ordering::Acquire) == NOTIFIED {
                break Wakeup::Notified;
            }
        };
        // Swap (not store): reads the latest state, so a NOTIFIED that lands from here on
        // stays for the next park, and one that landed before synchronises with us.
        if self.inner.state.swap(EMPTY, Ordering::AcqRel) == NOTIFIED {
            return Wakeup::Notified;
        }
        outcome
    }
}

impl Parker {
    /// Like [`park`](Self::park), but sleeps by calling `wait` once (e.g. a driver turn
    /// that also reaps I/O) instead of the backend's `wait`. Returns after that one call
    /// (a driver returns on I/O too, which is work for the caller); the backend's
    /// `wake` must make `wait` return.
    pub fn park_with(
        &self,
        timeout: Option<Duration>,
        is_ready: impl FnOnce() -> bool,
        wait: impl FnOnce(Option<Duration>),
    ) -> Wakeup {
        if let Some(early) = self.announce(is_ready) {
            return early;
        }
        wait(timeout);
        // Swap: reads the latest state and synchronises with any waker before it.
        if self.inner.state.swap(EMPTY, Ordering::AcqRel) == NOTIFIED {
            Wakeup::Notified
        } else {
            Wakeup::TimedOut
        }
    }
}

impl Parker {
    /// Announces the park, then re-checks: `Some` if the thread must not sleep (a
    /// notification was pending, or `is_ready` found work), with the state reset.
    fn announce(&self, is_ready: impl FnOnce() -> bool) -> Option<Wakeup> {
        // AcqRel: Acquire sees the work of any waker whose NOTIFIED we read; Release
        // orders our earlier queue reads before the announcement.
        if self.inner.state.swap(PARKED, Ordering::AcqRel) == NOTIFIED {
            self.inner.state.swap(EMPTY, Ordering::AcqRel);
            return Some(Wakeup::Notified);
        }
        if is_ready() {
            // A waker that saw PARKED meanwhile leaves a backend token: at worst one
            // spurious return from a later wait.
            self.inner.state.swap(EMPTY, Ordering::AcqRel);
            return Some(Wakeup::Ready);
        }
        None
    }
}

impl<B: ParkBackend + ?Sized> ParkBackend for std::sync::Arc<B> {
    fn wait(&self, timeout: Option<Duration>) {
        (**self).wait(timeout);
    }

    fn wake(&self) {
        (**self).wake();
    }
}

impl Unparker {
    /// An unparker for the same thread that first rings `bit` of `doorbell` (see
    /// [`Doorbell`]): the thread is woken only when that bit was clear.
    pub fn with_doorbell(&self, doorbell: &std::sync::Arc<Doorbell>, bit: u32) -> Unparker {
        Unparker {
            inner: Arc::clone(&self.inner),
            bell: Some((std::sync::Arc::clone(doorbell), bit)),
        }
    }

    /// Wakes the parker's thread if it sleeps, or makes its next park return at once.
    /// Call it after publishing the work the thread should see.
    #[inline]
    pub fn unpark(&self) {
        if let Some((bell, bit)) = &self.bell {
            if !bell.ring(*bit) {
                // Already rung: whoever rang it unparks (after ringing).
                return;
            }
        }
        // AcqRel: Release publishes the caller's work to the parker's Acquire; see the
        // module docs for why a read-modify-write is required here.
        if self.inner.state.swap(NOTIFIED, Ordering::AcqRel) == PARKED {
            self.inner.backend.wake();
        }
    }
}

impl core::fmt::Debug for Parker {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Parker").finish_non_exhaustive()
    }
}

impl core::fmt::Debug for Unparker {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Unparker").finish_non_exhaustive()
    }
}

/// Something to poke when a resource becomes available: an [`Unparker`], or a closure
/// that posts mail to a task.
pub trait Notify: Send + Sync + 'static {
    /// Tells the waiting side to look again.
    fn notify(&self);
}

impl Notify for Unparker {
    fn notify(&self) {
        self.unpark();
    }
}

impl<F: Fn() + Send + Sync + 'static> Notify for F {
    fn notify(&self) {
        self()
    }
}
