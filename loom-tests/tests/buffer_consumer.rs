//! Loom models of a buffer read while it is written: the builder publishes its position
//! (Release) while a reader on another thread takes views of what was published
//! (Acquire). A reader sees the bytes in order, each once, and all of them once the
//! builder is gone; a segment is recycled exactly once (the pool's debug ownership
//! flags panic otherwise) and only after the writer and every reader are done with it.
//!
//! The segment's bytes are plain memory, which loom does not track; Miri checks the
//! accesses themselves (`scripts/miri.sh`, `exchange_read_while_written`).
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;
use weir_engine::exchange::{
    Buffer, BufferBuilder, BufferConsumer, LocalBufferPool, LocalPoolConfig, NetworkBufferPool,
    Read, SharedBuffer,
};
use weir_engine::park::Parker;
use weir_engine::ring;

/// Reads `consumer` to its end, checking the bytes continue `1, 2, 3, …`; returns the
/// views (still holding the segment) in order.
fn read_all(consumer: &mut BufferConsumer, expected_len: usize) -> Vec<SharedBuffer> {
    let mut views = Vec::new();
    let mut next = 1u8;
    loop {
        match consumer.read() {
            Read::Bytes(view) => {
                assert!(!view.is_empty(), "an empty view");
                for &byte in view.as_slice() {
                    assert_eq!(byte, next, "a byte out of order or not written");
                    next += 1;
                }
                views.push(view);
            }
            Read::Nothing => thread::yield_now(),
            Read::Finished => break,
        }
    }
    assert_eq!(next as usize - 1, expected_len, "bytes lost");
    views
}

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

/// The writer publishes twice and finishes with unpublished bytes, while the reader
/// (which gets the consumer through a ring, as a local channel carries it) polls: it
/// sees every byte once, in order, and the one segment comes home once.
#[test]
fn reader_sees_every_published_byte_once() {
    loom::model(|| {
        let network = NetworkBufferPool::new(1, 64).unwrap();
        let mut pool =
            LocalBufferPool::new(&network, LocalPoolConfig::new(1, 1).with_overdraft(0)).unwrap();
        let mut builder = BufferBuilder::new(pool.request(0).unwrap(), 64);
        let (mut tx, mut rx) = ring::channel::<BufferConsumer>(2);
        let reader = thread::spawn(move || {
            let mut consumer = loop {
                match rx.try_pop() {
                    Some(consumer) => break consumer,
                    None => thread::yield_now(),
                }
            };
            drop(read_all(&mut consumer, 4));
        });
        builder.append(&[1]);
        builder.publish();
        tx.try_push(builder.consumer()).unwrap();
        builder.append(&[2, 3]);
        builder.publish();
        builder.append(&[4]);
        drop(builder);
        reader.join().unwrap();
        let again = pool.request(0).expect("recycled after both sides");
        drop(again);
        drop(pool);
        network.assert_whole();
    });
}

/// The writer waits for its only segment while the reader still holds views of it: it
/// gets the segment back only after the reader is done (the reader marks that before
/// dropping its last view, so a premature recycle finds the mark unset).
#[test]
fn segment_is_recycled_only_after_writer_and_reader() {
    loom::model(|| {
        let network = NetworkBufferPool::new(1, 64).unwrap();
        let parker = Parker::current();
        let config = LocalPoolConfig::new(1, 1).with_overdraft(0);
        let mut pool = LocalBufferPool::with_notify(&network, config, parker.unparker()).unwrap();
        let mut builder = BufferBuilder::new(pool.request(0).unwrap(), 64);
        let mut consumer = builder.consumer();
        let done = Arc::new(AtomicBool::new(false));
        let reader_done = Arc::clone(&done);
        let reader = thread::spawn(move || {
            let views = read_all(&mut consumer, 2);
            drop(consumer);
            reader_done.store(true, Ordering::Release);
            drop(views);
        });
        builder.append(&[1]);
        builder.publish();
        builder.append(&[2]);
        drop(builder);
        let again = request_waiting(&mut pool, &parker);
        assert!(
            done.load(Ordering::Acquire),
            "recycled while the reader held it"
        );
        drop(again);
        reader.join().unwrap();
        drop(pool);
        network.assert_whole();
    });
}

/// Broadcast: one builder, two consumers read at their own pace on two threads; the
/// segment is recycled once, after both.
#[test]
fn broadcast_consumers_recycle_once() {
    loom::model(|| {
        let network = NetworkBufferPool::new(1, 64).unwrap();
        let mut pool =
            LocalBufferPool::new(&network, LocalPoolConfig::new(1, 1).with_overdraft(0)).unwrap();
        let mut builder = BufferBuilder::new(pool.request(0).unwrap(), 64);
        let mut a = builder.consumer();
        let mut b = builder.consumer();
        let tb = thread::spawn(move || drop(read_all(&mut b, 2)));
        builder.append(&[1]);
        builder.publish();
        builder.append(&[2]);
        drop(builder);
        // The writer's thread reads the other copy, racing the reader's last drop.
        drop(read_all(&mut a, 2));
        drop(a);
        tb.join().unwrap();
        let again = pool.request(0).expect("recycled after every reader");
        drop(again);
        drop(pool);
        network.assert_whole();
    });
}
