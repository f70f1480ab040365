//! Loom models of the segment pool: buffers recycled from other threads while the
//! requester takes and waits. The pool's debug ownership flags panic if a segment is
//! handed out twice or recycled twice; `assert_whole` fails if one is lost; a
//! requester that is never woken shows up as a loom deadlock.
#![cfg(loom)]

use loom::thread;
use weir_engine::exchange::{Buffer, LocalBufferPool, LocalPoolConfig, NetworkBufferPool};
use weir_engine::park::Parker;

/// Takes a buffer, sleeping on `parker` until one is recycled when none is free.
fn request_waiting(pool: &mut LocalBufferPool, parker: &Parker) -> Buffer {
    loop {
        if let Some(buffer) = pool.request(0) {
            return buffer;
        }
        if !pool.available_or_notify() {
            parker.park(None, || false);
        }
    }
}

/// Two recycling threads and the requester race over two segments; every segment is
/// handed to one owner at a time and all come home.
#[test]
fn two_recyclers_never_duplicate_or_lose_a_segment() {
    loom::model(|| {
        let network = NetworkBufferPool::new(2, 64).unwrap();
        let parker = Parker::current();
        let config = LocalPoolConfig::new(2, 1).with_overdraft(0);
        let mut pool = LocalBufferPool::with_notify(&network, config, parker.unparker()).unwrap();
        let mut a = pool.request(0).unwrap();
        let mut b = pool.request(0).unwrap();
        a.as_mut_slice()[0] = 1;
        b.as_mut_slice()[0] = 2;
        let ta = thread::spawn(move || {
            assert_eq!(a.as_mut_slice()[0], 1);
            drop(a);
        });
        let tb = thread::spawn(move || {
            assert_eq!(b.as_mut_slice()[0], 2);
            drop(b);
        });
        let c = request_waiting(&mut pool, &parker);
        let d = request_waiting(&mut pool, &parker);
        assert_ne!(c.segment_index(), d.segment_index());
        ta.join().unwrap();
        tb.join().unwrap();
        drop((c, d));
        drop(pool);
        network.assert_whole();
    });
}

/// The requester that registered as waiting on an exhausted pool is woken by the
/// recycle, whichever side of its registration the recycle lands on.
#[test]
fn waiting_requester_is_always_woken() {
    loom::model(|| {
        let network = NetworkBufferPool::new(1, 64).unwrap();
        let parker = Parker::current();
        let config = LocalPoolConfig::new(1, 1).with_overdraft(0);
        let mut pool = LocalBufferPool::with_notify(&network, config, parker.unparker()).unwrap();
        let only = pool.request(0).unwrap();
        let t = thread::spawn(move || drop(only));
        let again = request_waiting(&mut pool, &parker);
        drop(again);
        t.join().unwrap();
        drop(pool);
        network.assert_whole();
    });
}

/// A subpartition at its maximum makes the pool unavailable although a segment is free;
/// the requester waiting on that is woken when the subpartition's buffer comes back.
#[test]
fn waiter_on_a_full_subpartition_is_woken() {
    loom::model(|| {
        let network = NetworkBufferPool::new(2, 64).unwrap();
        let parker = Parker::current();
        let config = LocalPoolConfig::new(2, 1)
            .with_max_per_subpartition(1)
            .with_overdraft(0);
        let mut pool = LocalBufferPool::with_notify(&network, config, parker.unparker()).unwrap();
        let held = pool.request(0).unwrap();
        let t = thread::spawn(move || drop(held));
        while !pool.available_or_notify() {
            parker.park(None, || false);
        }
        t.join().unwrap();
        drop(pool);
        network.assert_whole();
    });
}

/// Overdraft buffers recycled on another thread go back to the network pool and wake a
/// requester waiting on its subpartition's maximum.
#[test]
fn overdraft_recycle_wakes_and_goes_home() {
    loom::model(|| {
        let network = NetworkBufferPool::new(2, 64).unwrap();
        let parker = Parker::current();
        let config = LocalPoolConfig::new(1, 1)
            .with_max_per_subpartition(2)
            .with_overdraft(1);
        let mut pool = LocalBufferPool::with_notify(&network, config, parker.unparker()).unwrap();
        let regular = pool.request(0).unwrap();
        let extra = pool.request_overdraft(0).unwrap();
        let t = thread::spawn(move || drop(extra));
        drop(regular);
        while !pool.available_or_notify() {
            parker.park(None, || false);
        }
        t.join().unwrap();
        drop(pool);
        network.assert_whole();
    });
}
