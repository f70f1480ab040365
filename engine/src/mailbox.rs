//! A task's inbox: mail from other threads and from the task itself.
//!
//! Flink's mailbox model: one thread owns a task's state; everyone else sends it mail.
//! The task loop alternates between its default action and `Mailbox::drain`, and
//! parks with [`Mailbox::park`] when it has nothing to do.
//!
//! Three ways in, from fastest to slowest:
//! - `send_local`: the owning thread mails itself (a plain `VecDeque`, no atomics);
//! - a [`MailSender`]: one SPSC [`ring`] per sending worker thread, made
//!   with `Mailbox::connect` at wiring time, before the threads start;
//! - a [`ForeignSender`]: threads that cannot be wired in advance (a user's thread pool
//!   completing a future). They share one lock-free multi-producer queue
//!   (`crossbeam_queue::SegQueue`), the engine's only MPSC path and never the fast path.
//!
//! Invariants:
//! 1. Every sender publishes its mail before it notifies the [`Parker`]
//!    (push, then [`Unparker::unpark`]).
//! 2. `park` re-checks every way in after announcing itself (see [`crate::park`]), so
//!    mail published before a notification is always seen: no lost wake-up.
//! 3. Mail is delivered once: each ring and the foreign queue hand out each value once,
//!    and undelivered mail is dropped with the mailbox.

use std::collections::VecDeque;
use std::time::Duration;

use crate::limits::MAIL_RING_CAPACITY;
use crate::park::{Parker, Unparker, Wakeup};
use crate::ring::{self, Consumer, Producer};
use crate::sync::Arc;

/// The multi-producer queue for unwired threads. Under loom a mutex stands in for
/// `SegQueue`, whose internals loom cannot see; the protocol around it is the same.
#[cfg(not(loom))]
pub(crate) struct ForeignQueue<M>(crossbeam_queue::SegQueue<M>);
#[cfg(loom)]
pub(crate) struct ForeignQueue<M>(crate::sync::Mutex<VecDeque<M>>);

impl<M> ForeignQueue<M> {
    pub(crate) fn new() -> Self {
        #[cfg(not(loom))]
        return ForeignQueue(crossbeam_queue::SegQueue::new());
        #[cfg(loom)]
        return ForeignQueue(crate::sync::Mutex::new(VecDeque::new()));
    }

    pub(crate) fn push(&self, mail: M) {
        #[cfg(not(loom))]
        self.0.push(mail);
        #[cfg(loom)]
        self.0
            .lock()
            .expect("foreign queue poisoned")
            .push_back(mail);
    }

    pub(crate) fn pop(&self) -> Option<M> {
        #[cfg(not(loom))]
        return self.0.pop();
        #[cfg(loom)]
        return self.0.lock().expect("foreign queue poisoned").pop_front();
    }

    pub(crate) fn is_empty(&self) -> bool {
        #[cfg(not(loom))]
        return self.0.is_empty();
        #[cfg(loom)]
        return self.0.lock().expect("foreign queue poisoned").is_empty();
    }
}

/// A task's mailbox on a thread of its own: an [`Inbox`] and the [`Parker`] its thread
/// sleeps on. Dereferences to the inbox for sending, draining and wiring.
pub struct Mailbox<M> {
    inbox: Inbox<M>,
    parker: Parker,
}

/// The receiving side of a mailbox without a way to sleep: the runtime keeps one per
/// task, and the task's worker, which runs many tasks, parks for all of them. Senders
/// wake the worker through the inbox's [`Unparker`] (for a runtime task, one that also
/// rings the task's [`Doorbell`](crate::park::Doorbell)). `Send` when `M` is, so it can
/// be made at wiring time and moved to its worker.
pub struct Inbox<M> {
    local: VecDeque<M>,
    rings: Vec<Consumer<M>>,
    foreign: Arc<ForeignQueue<M>>,
    unparker: Unparker,
    /// Ring to start the next drain at, so no sender is starved by an earlier one.
    next_ring: usize,
}

/// Sends mail from one wired thread to one mailbox, through its own SPSC ring.
pub struct MailSender<M> {
    producer: Producer<M>,
    unparker: Unparker,
}

/// Sends mail from any thread through the mailbox's shared multi-producer queue.
pub struct ForeignSender<M> {
    foreign: Arc<ForeignQueue<M>>,
    unparker: Unparker,
}

impl<M> Clone for ForeignSender<M> {
    fn clone(&self) -> Self {
        ForeignSender {
            foreign: Arc::clone(&self.foreign),
            unparker: self.unparker.clone(),
        }
    }
}

impl<M> Mailbox<M> {
    /// A mailbox whose idle thread sleeps on `parker`.
    pub fn new(parker: Parker) -> Self {
        Mailbox {
            inbox: Inbox::new(parker.unparker()),
            parker,
        }
    }

    /// Sleeps until mail arrives or `timeout` elapses; returns at once if mail is already
    /// waiting. Race-free against concurrent senders (invariant 2).
    pub fn park(&mut self, timeout: Option<Duration>) -> Wakeup {
        if !self.inbox.local.is_empty() {
            return Wakeup::Ready;
        }
        let rings = &self.inbox.rings;
        let foreign = &self.inbox.foreign;
        self.parker.park(timeout, || {
            !rings.iter().all(|r| r.is_empty()) || !foreign.is_empty()
        })
    }
}

impl<M> core::ops::Deref for Mailbox<M> {
    type Target = Inbox<M>;

    fn deref(&self) -> &Inbox<M> {
        &self.inbox
    }
}

impl<M> core::ops::DerefMut for Mailbox<M> {
    fn deref_mut(&mut self) -> &mut Inbox<M> {
        &mut self.inbox
    }
}

impl<M> Inbox<M> {
    /// An inbox whose senders wake their receiver with `unparker`.
    pub fn new(unparker: Unparker) -> Self {
        Inbox {
            local: VecDeque::with_capacity(MAIL_RING_CAPACITY),
            rings: Vec::new(),
            foreign: Arc::new(ForeignQueue::new()),
            unparker,
            next_ring: 0,
        }
    }

    /// Wires a sending thread: a new SPSC ring of `capacity` slots (rounded up to a power
    /// of two) into this mailbox. Call it at wiring time, once per sending thread.
    pub fn connect(&mut self, capacity: usize) -> MailSender<M> {
        let (producer, consumer) = ring::channel(capacity);
        self.rings.push(consumer);
        MailSender {
            producer,
            unparker: self.unparker.clone(),
        }
    }

    /// A sender for threads that are not wired (cloneable, `Send` when `M: Send`).
    pub fn foreign_sender(&self) -> ForeignSender<M> {
        ForeignSender {
            foreign: Arc::clone(&self.foreign),
            unparker: self.unparker.clone(),
        }
    }

    /// A handle that wakes this mailbox's thread.
    pub fn unparker(&self) -> Unparker {
        self.unparker.clone()
    }

    /// Mail from the owning thread to itself (delivered by the next `drain`).
    pub fn send_local(&mut self, mail: M) {
        self.local.push_back(mail);
    }

    /// Handles up to `budget` pieces of mail with `handle`: local mail first (it is the
    /// task's own continuation), then each wired ring in turn starting after the one the
    /// last drain began with, then foreign mail. Returns how many were handled.
    pub fn drain(&mut self, budget: usize, mut handle: impl FnMut(M)) -> usize {
        let mut handled = 0;
        while handled < budget {
            let Some(mail) = self.local.pop_front() else {
                break;
            };
            handle(mail);
            handled += 1;
        }
        let rings = self.rings.len();
        if rings > 0 {
            let start = self.next_ring % rings;
            self.next_ring = start + 1;
            for offset in 0..rings {
                let ring = &mut self.rings[(start + offset) % rings];
                while handled < budget {
                    let Some(mail) = ring.try_pop() else { break };
                    handle(mail);
                    handled += 1;
                }
            }
        }
        while handled < budget {
            let Some(mail) = self.foreign.pop() else {
                break;
            };
            handle(mail);
            handled += 1;
        }
        handled
    }

    /// Whether no mail is waiting anywhere.
    pub fn is_empty(&self) -> bool {
        self.local.is_empty() && self.rings.iter().all(|r| r.is_empty()) && self.foreign.is_empty()
    }

    /// Wired senders whose thread has dropped its [`MailSender`] and whose ring is drained.
    pub fn disconnected_senders(&self) -> usize {
        self.rings
            .iter()
            .filter(|r| r.is_abandoned() && r.is_empty())
            .count()
    }
}

impl<M> MailSender<M> {
    /// Sends `mail` and wakes the receiver; hands the mail back when the ring is full.
    #[inline]
    pub fn try_send(&mut self, mail: M) -> Result<(), M> {
        self.producer.try_push(mail)?;
        self.unparker.unpark();
        Ok(())
    }

    /// Sends `mail` without waking the receiver; call [`MailSender::notify`] after a batch.
    #[inline]
    pub fn try_send_quiet(&mut self, mail: M) -> Result<(), M> {
        self.producer.try_push(mail)
    }

    /// Sends as much of `mail` as fits with one index publication and one wake-up.
    /// Returns how many were sent; the rest stay in the iterator.
    pub fn send_iter<I: Iterator<Item = M>>(&mut self, mail: &mut I) -> usize {
        let sent = self.producer.push_iter(mail);
        if sent > 0 {
            self.unparker.unpark();
        }
        sent
    }

    /// Wakes the receiver (after `try_send_quiet`).
    pub fn notify(&self) {
        self.unparker.unpark();
    }

    /// Whether the mailbox has been dropped.
    pub fn is_abandoned(&self) -> bool {
        self.producer.is_abandoned()
    }
}

impl<M> ForeignSender<M> {
    /// Sends `mail` and wakes the receiver. Never refuses: the queue is unbounded, and its
    /// users (completions of in-flight calls) are bounded by the operator's capacity.
    pub fn send(&self, mail: M) {
        self.foreign.push(mail);
        self.unparker.unpark();
    }
}

impl<M> core::fmt::Debug for Mailbox<M> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Mailbox")
            .field("inbox", &self.inbox)
            .finish_non_exhaustive()
    }
}

impl<M> core::fmt::Debug for Inbox<M> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Inbox")
            .field("local", &self.local.len())
            .field("rings", &self.rings.len())
            .finish_non_exhaustive()
    }
}
