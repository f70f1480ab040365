//! Public behaviour of the SPSC mail ring: a proptest model against `VecDeque`, drop
//! accounting, zero-sized values, and a two-thread stress run.

use std::cell::Cell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use weir_engine::ring;

#[derive(Debug, Clone)]
enum Op {
    Push(u16),
    Pop,
    PushIter(Vec<u16>),
    PopInto(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        any::<u16>().prop_map(Op::Push),
        Just(Op::Pop),
        prop::collection::vec(any::<u16>(), 0..12).prop_map(Op::PushIter),
        (0usize..12).prop_map(Op::PopInto),
    ]
}

proptest! {
    /// Any sequence of single and batch operations behaves like a bounded `VecDeque`:
    /// same values, same order, refusals exactly when full, partial batches when short.
    #[test]
    fn behaves_like_a_bounded_deque(requested in 0usize..9, ops in prop::collection::vec(op(), 0..200)) {
        let (mut producer, mut consumer) = ring::channel::<u16>(requested);
        let capacity = producer.capacity();
        prop_assert!(capacity.is_power_of_two() && capacity >= requested.max(1));
        let mut model = VecDeque::new();
        for op in ops {
            match op {
                Op::Push(v) => {
                    let result = producer.try_push(v);
                    if model.len() == capacity {
                        prop_assert_eq!(result, Err(v));
                    } else {
                        prop_assert_eq!(result, Ok(()));
                        model.push_back(v);
                    }
                }
                Op::Pop => prop_assert_eq!(consumer.try_pop(), model.pop_front()),
                Op::PushIter(values) => {
                    let mut iter = values.iter().copied();
                    let pushed = producer.push_iter(&mut iter);
                    let expected = values.len().min(capacity - model.len());
                    prop_assert_eq!(pushed, expected);
                    model.extend(&values[..pushed]);
                    prop_assert_eq!(iter.collect::<Vec<_>>(), values[pushed..].to_vec());
                }
                Op::PopInto(max) => {
                    let mut out = Vec::new();
                    let popped = consumer.pop_into(&mut out, max);
                    let expected: Vec<u16> = (0..max.min(model.len())).filter_map(|_| model.pop_front()).collect();
                    prop_assert_eq!(popped, expected.len());
                    prop_assert_eq!(out, expected);
                }
            }
            prop_assert_eq!(producer.len(), model.len());
            prop_assert_eq!(consumer.len(), model.len());
        }
    }
}

/// Every value is dropped exactly once: delivered ones by the receiver, undelivered ones
/// when the ring goes, whichever side goes last.
#[test]
fn undelivered_values_drop_exactly_once() {
    struct Counted(Rc<Cell<usize>>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.set(self.0.get() + 1);
        }
    }
    for consumer_first in [false, true] {
        let drops = Rc::new(Cell::new(0));
        let (mut producer, mut consumer) = ring::channel(4);
        for _ in 0..4 {
            assert!(producer.try_push(Counted(Rc::clone(&drops))).is_ok());
        }
        // A refused value comes back whole and is dropped by us.
        let refused = producer.try_push(Counted(Rc::clone(&drops)));
        drop(refused);
        assert_eq!(drops.get(), 1);
        drop(consumer.try_pop());
        assert_eq!(drops.get(), 2);
        if consumer_first {
            drop(consumer);
            assert!(producer.is_abandoned());
            drop(producer);
        } else {
            drop(producer);
            assert!(consumer.is_abandoned());
            drop(consumer);
        }
        assert_eq!(drops.get(), 5);
    }
}

/// Zero-sized values count like any other: the ring fills and empties by count.
#[test]
fn zero_sized_values_are_counted() {
    let (mut producer, mut consumer) = ring::channel::<()>(2);
    assert_eq!(producer.try_push(()), Ok(()));
    assert_eq!(producer.try_push(()), Ok(()));
    assert_eq!(producer.try_push(()), Err(()));
    assert_eq!(consumer.len(), 2);
    assert_eq!(consumer.try_pop(), Some(()));
    assert_eq!(consumer.try_pop(), Some(()));
    assert_eq!(consumer.try_pop(), None);
}

/// A panicking `Extend` in `pop_into` neither loses nor double-drops the values it took.
#[test]
fn pop_into_is_panic_safe() {
    struct Picky(Vec<Arc<()>>);
    impl Extend<Arc<()>> for Picky {
        fn extend<I: IntoIterator<Item = Arc<()>>>(&mut self, iter: I) {
            for (i, v) in iter.into_iter().enumerate() {
                self.0.push(v);
                assert!(i < 1, "refuses the second value");
            }
        }
    }
    let token = Arc::new(());
    let (mut producer, mut consumer) = ring::channel(4);
    for _ in 0..3 {
        producer.try_push(Arc::clone(&token)).unwrap();
    }
    let mut picky = Picky(Vec::new());
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        consumer.pop_into(&mut picky, 3);
    }));
    assert!(result.is_err());
    // Two were moved out (one kept by `picky`, one dropped during unwinding); one remains.
    assert_eq!(picky.0.len(), 2);
    assert_eq!(consumer.len(), 1);
    drop(picky);
    drop(consumer);
    drop(producer);
    assert_eq!(Arc::strong_count(&token), 1);
}

/// Two threads stream values with single and batch operations; the consumer sees every
/// value once, in order, and every value is dropped once.
#[test]
fn two_thread_stress() {
    let count: u64 = if cfg!(miri) { 200 } else { 1_000_000 };
    let live = Arc::new(AtomicUsize::new(0));
    struct Tracked(u64, Arc<AtomicUsize>);
    impl Drop for Tracked {
        fn drop(&mut self) {
            self.1.fetch_sub(1, Ordering::Relaxed);
        }
    }
    let (mut producer, mut consumer) = ring::channel::<Tracked>(64);
    let live_p = Arc::clone(&live);
    let sender = std::thread::spawn(move || {
        let mut next = 0;
        while next < count {
            if next % 3 == 0 {
                let end = (next + 17).min(count);
                let mut batch = (next..end).map(|v| {
                    live_p.fetch_add(1, Ordering::Relaxed);
                    Tracked(v, Arc::clone(&live_p))
                });
                // `push_iter` pulls only what fits; the lazy rest is never materialised.
                let pushed = producer.push_iter(&mut batch);
                next += pushed as u64;
            } else {
                live_p.fetch_add(1, Ordering::Relaxed);
                let mut value = Tracked(next, Arc::clone(&live_p));
                loop {
                    match producer.try_push(value) {
                        Ok(()) => break,
                        Err(back) => {
                            value = back;
                            std::thread::yield_now();
                        }
                    }
                }
                next += 1;
            }
            if next % 4096 == 0 {
                std::thread::yield_now();
            }
        }
    });
    let mut expected = 0;
    let mut out = Vec::with_capacity(64);
    while expected < count {
        if expected % 2 == 0 {
            out.clear();
            if consumer.pop_into(&mut out, 32) == 0 {
                std::thread::yield_now();
            }
            for value in out.drain(..) {
                assert_eq!(value.0, expected);
                expected += 1;
            }
        } else if let Some(value) = consumer.try_pop() {
            assert_eq!(value.0, expected);
            expected += 1;
        } else {
            std::thread::yield_now();
        }
    }
    sender.join().unwrap();
    assert_eq!(consumer.try_pop().map(|v| v.0), None);
    drop(consumer);
    assert_eq!(live.load(Ordering::Relaxed), 0);
}
