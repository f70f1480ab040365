//! Loom models of the SPSC mail ring: every interleaving of one producer and one
//! consumer at full, at empty, with batches, with values dropped in flight, and with a
//! disconnecting producer.
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use weir_engine::ring;

/// Values arrive once each, in order, while the producer repeatedly finds the ring full
/// and the consumer repeatedly finds it empty.
#[test]
fn push_pop_race_at_full_and_empty() {
    loom::model(|| {
        let (mut producer, mut consumer) = ring::channel::<u32>(2);
        let sender = thread::spawn(move || {
            for value in 0..3 {
                let mut pending = value;
                while let Err(back) = producer.try_push(pending) {
                    pending = back;
                    thread::yield_now();
                }
            }
        });
        for expected in 0..3 {
            loop {
                if let Some(value) = consumer.try_pop() {
                    assert_eq!(value, expected);
                    break;
                }
                thread::yield_now();
            }
        }
        sender.join().unwrap();
        assert_eq!(consumer.try_pop(), None);
    });
}

/// A batch is published with one index store: the consumer sees a prefix of the batch
/// (never a slot that was not yet written) and, eventually, all of it in order.
#[test]
fn batch_publication() {
    loom::model(|| {
        let (mut producer, mut consumer) = ring::channel::<u32>(4);
        let sender = thread::spawn(move || {
            let mut values = [10, 11, 12].into_iter();
            let mut pushed = 0;
            while pushed < 3 {
                pushed += producer.push_iter(&mut values);
                thread::yield_now();
            }
        });
        let mut out = Vec::new();
        while out.len() < 3 {
            if consumer.pop_into(&mut out, 2) == 0 {
                thread::yield_now();
            }
        }
        assert_eq!(out, vec![10, 11, 12]);
        sender.join().unwrap();
    });
}

struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// Values still in the ring when both sides are dropped, on different threads, are
/// dropped exactly once, as are the ones delivered.
#[test]
fn drop_with_items_in_flight() {
    loom::model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let (mut producer, mut consumer) = ring::channel::<Counted>(2);
        let counter = Arc::clone(&drops);
        let sender = thread::spawn(move || {
            for _ in 0..2 {
                let _ = producer.try_push(Counted(Arc::clone(&counter)));
            }
            drop(producer);
        });
        let taken = consumer.try_pop();
        drop(taken);
        drop(consumer);
        sender.join().unwrap();
        assert_eq!(drops.load(Ordering::Relaxed), 2);
    });
}

/// A consumer that sees the producer gone still finds every value pushed before.
#[test]
fn disconnect_is_seen_after_the_last_value() {
    loom::model(|| {
        let (mut producer, mut consumer) = ring::channel::<u32>(2);
        let sender = thread::spawn(move || {
            producer.try_push(7).unwrap();
            drop(producer);
        });
        while !consumer.is_abandoned() {
            thread::yield_now();
        }
        assert_eq!(consumer.try_pop(), Some(7));
        assert_eq!(consumer.try_pop(), None);
        sender.join().unwrap();
    });
}

/// A producer learns that its consumer is gone.
#[test]
fn producer_sees_consumer_gone() {
    loom::model(|| {
        let (producer, consumer) = ring::channel::<u32>(1);
        let receiver = thread::spawn(move || drop(consumer));
        receiver.join().unwrap();
        assert!(producer.is_abandoned());
    });
}
