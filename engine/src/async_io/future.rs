//! `ResultFuture`: how a call's outcome gets back to its operator.
//!
//! The operator and its handles share one `Completions` block:
//! - `local` (a `VecDeque`), `inline`, `credits` and `alive` belong to the owner thread
//!   (the operator's) and are touched only after checking `thread_token() == owner`;
//!   `inline` takes the outcome of a call completed inside `invoke` while nothing else
//!   waits in `local`, so the operator can emit it without queueing it;
//! - `foreign` (a lock-free MPSC queue) takes completions from any other thread, which
//!   then counts it in `foreign_sent` and wakes the owner through `notify`; the owner
//!   compares that count with what it took before touching the queue;
//! - `refs` counts the references: one per outstanding handle, plus the operator's
//!   unspent `credits`, plus one for the operator itself. The block is freed by whoever
//!   brings it to zero.
//!
//! Same-thread fast path: the operator takes references `COMPLETION_REF_CREDITS` at a
//! time, so issuing a handle costs no atomic; a handle completed on the owner thread
//! while the operator lives pushes to `local` and hands its reference back as a credit,
//! again without an atomic. Only handles completed elsewhere, or after the operator is
//! gone, touch `refs`.
//!
//! Dropping a handle without completing it completes it with [`AsyncError::Dropped`]:
//! nothing waits forever on a handle that no longer exists (the operator fails unless a
//! retry applies, like any error). A handle completed after its operator is gone does
//! nothing: its outcome is dropped with the block.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use super::AsyncError;
use crate::limits::COMPLETION_REF_CREDITS;
use crate::mailbox::ForeignQueue;
use crate::park::Notify;
use crate::slab::Key;
use crate::sync::{fence, thread_token, AtomicUsize, Ordering, UnsafeCell};

/// The results of one call: one inline (the common 1:1 case), several in a vector.
pub(crate) enum Results<T> {
    Empty,
    One(T),
    Many(Vec<T>),
}

impl<T> Results<T> {
    fn collect<I: IntoIterator<Item = T>>(results: I) -> Self {
        let mut iter = results.into_iter();
        let Some(first) = iter.next() else {
            return Results::Empty;
        };
        let Some(second) = iter.next() else {
            return Results::One(first);
        };
        let mut all = Vec::with_capacity(2 + iter.size_hint().0);
        all.push(first);
        all.push(second);
        all.extend(iter);
        Results::Many(all)
    }

    pub(crate) fn as_slice(&self) -> &[T] {
        match self {
            Results::Empty => &[],
            Results::One(one) => core::slice::from_ref(one),
            Results::Many(all) => all,
        }
    }

    /// Calls `f` with each result, moving it.
    pub(crate) fn for_each(self, mut f: impl FnMut(T)) {
        match self {
            Results::Empty => {}
            Results::One(one) => f(one),
            Results::Many(all) => all.into_iter().for_each(f),
        }
    }
}

pub(crate) enum Outcome<T> {
    Results(Results<T>),
    Error(AsyncError),
}

pub(crate) struct Completion<T> {
    pub(crate) key: Key,
    pub(crate) attempt: u32,
    pub(crate) outcome: Outcome<T>,
}

/// No key packs to this: slot indices stay below `u32::MAX`.
const DISARMED: u64 = u64::MAX;

/// The slot a call completed inside `invoke` lands in (owner-only).
struct Inline<T> {
    /// The entry (`Key::to_u64`) whose first attempt's handle is being passed to a
    /// call, or `DISARMED`.
    armed: u64,
    outcome: Option<Outcome<T>>,
}

pub(crate) struct Completions<T> {
    owner: u64,
    local: UnsafeCell<VecDeque<Completion<T>>>,
    inline: UnsafeCell<Inline<T>>,
    credits: UnsafeCell<usize>,
    alive: UnsafeCell<bool>,
    foreign: ForeignQueue<Completion<T>>,
    /// Completions pushed on `foreign` so far (incremented after each push), so the
    /// owner checks for foreign mail with one load instead of a queue pop with a fence.
    foreign_sent: AtomicUsize,
    /// Completions the owner took from `foreign` (owner-only).
    foreign_taken: UnsafeCell<usize>,
    refs: AtomicUsize,
    notify: Box<dyn Notify>,
}

/// The operator's end of the completion path (owner thread only; not `Send`).
pub(crate) struct CompletionQueue<T> {
    shared: NonNull<Completions<T>>,
    _not_send: PhantomData<*const ()>,
}

/// Drops `count` references to `shared`, freeing it with the last.
///
/// # Safety
/// `shared` came from `CompletionQueue::new` and the caller owns `count` of the
/// references counted in `refs`, which it gives up here.
unsafe fn release<T>(shared: NonNull<Completions<T>>, count: usize) {
    // SAFETY: the caller owns `count >= 1` references, so the block is live.
    let refs = unsafe { &shared.as_ref().refs };
    // Release: our uses of the block happen before whoever frees it.
    if refs.fetch_sub(count, Ordering::Release) == count {
        // Acquire: pairs with every other holder's Release decrement.
        fence(Ordering::Acquire);
        // SAFETY: no reference is left; the pointer came from `Box::into_raw`.
        drop(unsafe { Box::from_raw(shared.as_ptr()) });
    }
}

impl<T> CompletionQueue<T> {
    /// A completion path owned by the calling thread; `notify` wakes it for completions
    /// from other threads.
    pub(crate) fn new(capacity: usize, notify: Box<dyn Notify>) -> Self {
        let block = Box::new(Completions {
            owner: thread_token(),
            local: UnsafeCell::new(VecDeque::with_capacity(capacity)),
            inline: UnsafeCell::new(Inline {
                armed: DISARMED,
                outcome: None,
            }),
            credits: UnsafeCell::new(0),
            alive: UnsafeCell::new(true),
            foreign: ForeignQueue::new(),
            foreign_sent: AtomicUsize::new(0),
            foreign_taken: UnsafeCell::new(0),
            refs: AtomicUsize::new(1),
            notify,
        });
        CompletionQueue {
            shared: NonNull::from(Box::leak(block)),
            _not_send: PhantomData,
        }
    }

    #[inline(always)]
    fn block(&self) -> &Completions<T> {
        // SAFETY: the operator holds its own reference until `drop`.
        unsafe { self.shared.as_ref() }
    }

    /// A handle for attempt `attempt` of entry `key`.
    #[inline]
    pub(crate) fn issue(&mut self, key: Key, attempt: u32) -> ResultFuture<T> {
        let block = self.block();
        debug_assert_eq!(block.owner, thread_token(), "operator used off its thread");
        // SAFETY: `credits` is owner-only and we are on the owner thread (the queue is
        // not `Send`); no reference into it is live.
        // Credits come back one per same-thread completion, so they may pile up above
        // the batch size; they are references all the same (invariant on `refs`).
        block.credits.with_mut(|c| unsafe {
            if *c == 0 {
                // Relaxed: like `Arc::clone`, we hold a reference, so no one frees the
                // block meanwhile.
                block
                    .refs
                    .fetch_add(COMPLETION_REF_CREDITS, Ordering::Relaxed);
                *c = COMPLETION_REF_CREDITS;
            }
            *c -= 1;
        });
        ResultFuture {
            shared: self.shared,
            key,
            attempt,
        }
    }

    /// The next completion: same-thread ones first, then other threads'.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<Completion<T>> {
        let block = self.block();
        // SAFETY: owner-only field on the owner thread; the borrow ends in the closure.
        let local = block.local.with_mut(|q| unsafe { (*q).pop_front() });
        if local.is_some() {
            return local;
        }
        if !self.foreign_waiting() {
            return None;
        }
        let completion = block.foreign.pop();
        debug_assert!(
            completion.is_some(),
            "a counted foreign completion is in the queue"
        );
        // SAFETY: owner-only field on the owner thread.
        block.foreign_taken.with_mut(|t| unsafe { *t += 1 });
        completion
    }

    /// Arms the inline slot for the handle of `key`'s first attempt, about to be passed
    /// to a call: if the call completes it on this thread before returning, while no
    /// other same-thread completion waits, its outcome lands in the slot instead of the
    /// queue (see [`take_inline`](Self::take_inline)).
    #[inline]
    pub(crate) fn arm_inline(&mut self, key: Key) {
        let block = self.block();
        // SAFETY: owner-only field on the owner thread; no reference into it is live.
        block
            .inline
            .with_mut(|slot| unsafe { (*slot).armed = key.to_u64() });
    }

    /// Disarms the inline slot and takes the outcome that landed in it, if any. It
    /// completed before any completion still in the queue.
    #[inline]
    pub(crate) fn take_inline(&mut self) -> Option<Outcome<T>> {
        let block = self.block();
        // SAFETY: owner-only field on the owner thread; no reference into it is live.
        block.inline.with_mut(|slot| unsafe {
            (*slot).armed = DISARMED;
            (*slot).outcome.take()
        })
    }

    /// Queues a completion taken from the inline slot that cannot be handled at once,
    /// ahead of the completions that came after it.
    #[inline]
    pub(crate) fn push_front(&mut self, completion: Completion<T>) {
        let block = self.block();
        // SAFETY: owner-only field on the owner thread; no reference into it is live.
        block
            .local
            .with_mut(|q| unsafe { (*q).push_front(completion) });
    }

    /// Whether a completion made on this thread waits in the queue (one owner-only
    /// load; other threads' completions are not looked at).
    #[inline(always)]
    pub(crate) fn has_local(&self) -> bool {
        let block = self.block();
        // SAFETY: owner-only field on the owner thread.
        !block.local.with(|q| unsafe { (*q).is_empty() })
    }

    /// Whether another thread pushed a completion the owner has not taken.
    #[inline]
    fn foreign_waiting(&self) -> bool {
        let block = self.block();
        // SAFETY: owner-only field on the owner thread.
        let taken = block.foreign_taken.with(|t| unsafe { *t });
        // Acquire: pairs with the sender's Release increment, which follows its push, so
        // the counted completion is in the queue.
        block.foreign_sent.load(Ordering::Acquire) != taken
    }

    /// Whether a completion is waiting.
    pub(crate) fn is_empty(&self) -> bool {
        let block = self.block();
        // SAFETY: owner-only field on the owner thread.
        block.local.with(|q| unsafe { (*q).is_empty() }) && !self.foreign_waiting()
    }

    /// Handles issued and neither completed nor dropped (completions of other threads
    /// may be on their way).
    pub(crate) fn outstanding(&self) -> usize {
        let block = self.block();
        // SAFETY: owner-only field on the owner thread.
        let credits = block.credits.with(|c| unsafe { *c });
        // Acquire: a handle that released its reference also pushed its completion.
        block
            .refs
            .load(Ordering::Acquire)
            .saturating_sub(credits + 1)
    }
}

impl<T> Drop for CompletionQueue<T> {
    fn drop(&mut self) {
        let block = self.block();
        // SAFETY: owner-only fields on the owner thread.
        let credits = unsafe {
            block.alive.with_mut(|a| *a = false);
            block.local.with_mut(|q| (*q).clear());
            block.inline.with_mut(|slot| (*slot).outcome = None);
            block.credits.with(|c| *c)
        };
        // SAFETY: we own our reference and `credits` unspent ones.
        unsafe { release(self.shared, credits + 1) };
    }
}

/// The handle through which one call's outcome returns to its operator.
///
/// Complete it once with [`complete`](Self::complete) or
/// [`complete_err`](Self::complete_err) (both consume it), on the operator's thread
/// (no atomics) or any other. Dropping it uncompleted completes it with
/// [`AsyncError::Dropped`]. Completing after the operator is gone does nothing.
pub struct ResultFuture<T> {
    shared: NonNull<Completions<T>>,
    key: Key,
    attempt: u32,
}

// SAFETY: the handle reaches the owner-only fields only after checking it runs on the
// owner thread; from other threads it uses `foreign` (a `Sync` queue), `refs` (atomic)
// and `notify` (`Sync`). The results it carries move to the owner, hence `T: Send`.
unsafe impl<T: Send> Send for ResultFuture<T> {}

impl<T> ResultFuture<T> {
    /// Completes the call with `results` (none, one or several), each emitted with the
    /// input's timestamp. The first completion of an element wins; late ones (after a
    /// timeout or retry took over) are ignored.
    #[inline]
    pub fn complete<I: IntoIterator<Item = T>>(self, results: I) {
        let results = Results::collect(results);
        self.deliver(Outcome::Results(results));
    }

    /// Completes the call with one result: what `complete([value])` does, without going
    /// through an iterator (the common 1:1 case of a lookup).
    #[inline]
    pub fn complete_one(self, value: T) {
        self.deliver(Outcome::Results(Results::One(value)));
    }

    /// Completes the call with an error: the operator fails unless a retry applies.
    pub fn complete_err(self, error: AsyncError) {
        self.deliver(Outcome::Error(error));
    }

    #[inline]
    fn deliver(self, outcome: Outcome<T>) {
        let this = ManuallyDrop::new(self);
        let completion = Completion {
            key: this.key,
            attempt: this.attempt,
            outcome,
        };
        // SAFETY: `this` is never used or dropped again; we own its reference.
        unsafe { send(this.shared, completion) };
    }
}

impl<T> Drop for ResultFuture<T> {
    fn drop(&mut self) {
        let completion = Completion {
            key: self.key,
            attempt: self.attempt,
            outcome: Outcome::Error(AsyncError::Dropped),
        };
        // SAFETY: `drop` runs once; we own this handle's reference.
        unsafe { send(self.shared, completion) };
    }
}

impl<T> core::fmt::Debug for ResultFuture<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ResultFuture")
            .field("key", &self.key)
            .field("attempt", &self.attempt)
            .finish()
    }
}

/// Routes `completion` to the operator and gives up the handle's reference.
///
/// Always inlined, into every way of completing a handle: a call completed inside
/// `invoke` then fills the armed inline slot without a function call, its register
/// saves or the completion passed through memory (`scripts/callgrind.sh` tracks the
/// latency-0 path's instructions per record).
///
/// # Safety
/// The caller owns one reference to `shared` (a live handle's) and gives it up.
#[inline(always)]
unsafe fn send<T>(shared: NonNull<Completions<T>>, completion: Completion<T>) {
    // SAFETY: the handle's reference keeps the block alive.
    let block = unsafe { shared.as_ref() };
    if thread_token() == block.owner
        // SAFETY: owner-only field read on the owner thread (checked just before), with
        // no other borrow live: the operator holds none across calls into user code.
        && block.alive.with(|a| unsafe { *a })
    {
        // SAFETY: as above.
        unsafe {
            block.inline.with_mut(|inline| {
                let inline = &mut *inline;
                if inline.armed == completion.key.to_u64()
                    && completion.attempt == 0
                    && block.local.with(|q| (*q).is_empty())
                {
                    inline.armed = DISARMED;
                    inline.outcome = Some(completion.outcome);
                } else {
                    block.local.with_mut(|q| (*q).push_back(completion));
                }
            });
            // The reference goes back to the operator as a credit.
            block.credits.with_mut(|c| *c += 1);
        }
        return;
    }
    // SAFETY: the caller's guarantee, passed on.
    unsafe { send_elsewhere(shared, completion) };
}

/// [`send`] from another thread, or after the operator is gone.
///
/// # Safety
/// As for [`send`].
#[cold]
#[inline(never)]
unsafe fn send_elsewhere<T>(shared: NonNull<Completions<T>>, completion: Completion<T>) {
    // SAFETY: the handle's reference keeps the block alive.
    let block = unsafe { shared.as_ref() };
    if thread_token() == block.owner {
        // The operator is gone (checked by `send`): the outcome has nowhere to go.
        drop(completion);
    } else {
        block.foreign.push(completion);
        // Release: the push above happens before the owner sees the count.
        block.foreign_sent.fetch_add(1, Ordering::Release);
        block.notify.notify();
    }
    // SAFETY: we own one reference (caller's guarantee) and touch the block no more.
    unsafe { release(shared, 1) };
}
