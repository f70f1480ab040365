//! Loom models of `Parker::park_with` as the workers use it: the thread does not sleep
//! in the parker's backend but in its I/O driver's turn, which returns when the
//! driver's wake-up descriptor (an eventfd) is written, and the parker's backend is
//! that descriptor. The models put a token behind a mutex and a condition variable
//! where the eventfd is: `wake` adds to it, the "driver turn" waits for it and reads
//! it to zero, as a read of an eventfd does. A lost wake-up shows up as a loom
//! deadlock (the turn waits without a timeout); missed work as a failed assertion.
#![cfg(loom)]

use std::time::Duration;

use loom::sync::atomic::{AtomicU32, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
// The parker holds its backend in a std `Arc` (ParkBackend is implemented for it); the
// count is only cloned before the threads start, so loom need not model it.
use loom::thread;
use std::sync::Arc as StdArc;
use weir_engine::park::{ParkBackend, Parker, Wakeup};

/// An eventfd: a counter that `wake` adds to and a turn reads to zero.
#[derive(Default)]
struct EventFd {
    count: Mutex<u64>,
    written: Condvar,
}

impl EventFd {
    /// A driver turn without a timeout: returns once the descriptor was written (at
    /// once if it was before), consuming what was written.
    fn turn(&self) {
        let mut count = self.count.lock().unwrap();
        while *count == 0 {
            count = self.written.wait(count).unwrap();
        }
        *count = 0;
    }
}

impl ParkBackend for EventFd {
    fn wait(&self, _timeout: Option<Duration>) {
        self.turn();
    }

    fn wake(&self) {
        *self.count.lock().unwrap() += 1;
        self.written.notify_one();
    }
}

/// The worker's loop: takes work until it has seen `want` pieces, parking in its
/// driver's turn in between (the ready check looks at the work, as a worker's looks
/// at its doorbells). Returns how its parks ended.
fn worker(parker: &Parker, eventfd: &EventFd, work: &AtomicU32, want: u32) -> Vec<Wakeup> {
    let mut wakeups = Vec::new();
    while work.load(Ordering::Acquire) < want {
        let wakeup = parker.park_with(
            None,
            || work.load(Ordering::Acquire) >= want,
            |_timeout| eventfd.turn(),
        );
        wakeups.push(wakeup);
    }
    wakeups
}

/// One waker publishes work while the worker decides to sleep in its driver: the
/// worker sees the work, and a turn that returned came from the wake-up (a park that
/// ran the turn ends `Notified`, never by its timeout, which it does not have).
#[test]
fn a_wake_up_during_a_driver_turn_is_not_lost() {
    loom::model(|| {
        let eventfd = StdArc::new(EventFd::default());
        let parker = Parker::with_backend(StdArc::clone(&eventfd));
        let unparker = parker.unparker();
        let work = Arc::new(AtomicU32::new(0));
        let w = Arc::clone(&work);
        let t = thread::spawn(move || {
            w.fetch_add(1, Ordering::Release);
            unparker.unpark();
        });
        let wakeups = worker(&parker, &eventfd, &work, 1);
        assert!(
            wakeups.iter().all(|&w| w != Wakeup::TimedOut),
            "a park ended without a notification: {wakeups:?}"
        );
        t.join().unwrap();
    });
}

/// Two wakers, each with its own work: the worker sees both, whichever order the
/// notifications, the announcements and the eventfd writes take.
#[test]
fn two_wakers_during_driver_turns_are_both_seen() {
    loom::model(|| {
        let eventfd = StdArc::new(EventFd::default());
        let parker = Parker::with_backend(StdArc::clone(&eventfd));
        let work = Arc::new(AtomicU32::new(0));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let unparker = parker.unparker();
                let w = Arc::clone(&work);
                thread::spawn(move || {
                    w.fetch_add(1, Ordering::Release);
                    unparker.unpark();
                })
            })
            .collect();
        worker(&parker, &eventfd, &work, 2);
        for t in threads {
            t.join().unwrap();
        }
    });
}
