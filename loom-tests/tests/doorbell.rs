//! Loom models of a task's doorbell (`park::Doorbell`) against its worker's
//! take-then-park: a signal rung while the worker decides to sleep is always seen, and
//! a ringer that finds its bit already rung may skip the wake-up (whoever rang it wakes
//! the worker). A lost wake-up shows up as a loom deadlock; missed work as a failed
//! assertion.
#![cfg(loom)]

use loom::sync::atomic::{AtomicU32, Ordering};
use loom::sync::Arc;
use loom::thread;
use weir_engine::park::{Doorbell, Parker};

/// The worker: takes the bell's bits until it sees `want` pieces of work (published
/// with `Relaxed`: only the bell orders them), parking in between.
fn worker(parker: &Parker, bell: &Doorbell, work: &AtomicU32, want: u32) {
    loop {
        bell.take();
        if work.load(Ordering::Relaxed) >= want {
            return;
        }
        parker.park(None, || bell.peek() != 0);
    }
}

/// One ringer: publishes work, rings, and the worker sees the work.
#[test]
fn a_ring_while_parking_is_not_lost() {
    loom::model(|| {
        let parker = Parker::current();
        let bell = Doorbell::new();
        let work = Arc::new(AtomicU32::new(0));
        let unparker = parker.unparker().with_doorbell(&bell, 1);
        let w = Arc::clone(&work);
        let t = thread::spawn(move || {
            w.fetch_add(1, Ordering::Relaxed);
            unparker.unpark();
        });
        worker(&parker, &bell, &work, 1);
        t.join().unwrap();
    });
}

/// Two ringers of the same bit: the second may find it rung and skip its wake-up; the
/// worker still sees both pieces of work.
#[test]
fn a_coalesced_ring_is_covered_by_the_first() {
    loom::model(|| {
        let parker = Parker::current();
        let bell = Doorbell::new();
        let work = Arc::new(AtomicU32::new(0));
        let a = parker.unparker().with_doorbell(&bell, 1);
        let b = a.clone();
        let (wa, wb) = (Arc::clone(&work), Arc::clone(&work));
        let ta = thread::spawn(move || {
            wa.fetch_add(1, Ordering::Relaxed);
            a.unpark();
        });
        let tb = thread::spawn(move || {
            wb.fetch_add(1, Ordering::Relaxed);
            b.unpark();
        });
        worker(&parker, &bell, &work, 2);
        ta.join().unwrap();
        tb.join().unwrap();
    });
}

/// Two bits from two ringers: the worker sees each bit at least once.
#[test]
fn two_bits_both_arrive() {
    loom::model(|| {
        let parker = Parker::current();
        let bell = Doorbell::new();
        let a = parker.unparker().with_doorbell(&bell, 1);
        let b = parker.unparker().with_doorbell(&bell, 2);
        let ta = thread::spawn(move || a.unpark());
        let tb = thread::spawn(move || b.unpark());
        let mut seen = 0;
        while seen != 3 {
            seen |= bell.take();
            if seen != 3 {
                parker.park(None, || bell.peek() != 0);
            }
        }
        ta.join().unwrap();
        tb.join().unwrap();
    });
}
