//! Public behaviour of the segment pools: a proptest of request/recycle sequences
//! against a counting model, and a two-thread stress run on a 4-segment pool that keeps
//! the writer back-pressured.

use std::sync::mpsc;
use std::time::Duration;

use proptest::prelude::*;
use weir_engine::exchange::{Buffer, LocalBufferPool, LocalPoolConfig, NetworkBufferPool};
use weir_engine::park::Parker;

#[derive(Debug, Clone)]
enum Op {
    Request(usize),
    Overdraft(usize),
    Recycle(usize),
}

proptest! {
    /// Any sequence of requests, overdrafts and recycles keeps the counts exact: a
    /// request succeeds iff a reserved segment is free, overdraft stays within its limit,
    /// availability follows Flink's rule, and the network pool is whole at the end.
    #[test]
    fn counts_follow_the_model(
        size in 1usize..6,
        subpartitions in 1usize..3,
        max_per in 1usize..4,
        overdraft in 0usize..3,
        ops in prop::collection::vec(prop_oneof![
            (0usize..3).prop_map(Op::Request),
            (0usize..3).prop_map(Op::Overdraft),
            any::<usize>().prop_map(Op::Recycle),
        ], 0..100),
    ) {
        prop_assume!(size >= subpartitions);
        let network = NetworkBufferPool::new(size + 2, 64).unwrap();
        let config = LocalPoolConfig::new(size, subpartitions)
            .with_max_per_subpartition(max_per)
            .with_overdraft(overdraft);
        let mut pool = LocalBufferPool::new(&network, config).unwrap();
        let mut out: Vec<Buffer> = Vec::new();
        for op in ops {
            match op {
                Op::Request(s) => {
                    let s = s % subpartitions;
                    let regular_out = out.iter().filter(|b| !b.is_overdraft()).count();
                    match pool.request(s) {
                        Some(mut b) => {
                            prop_assert!(regular_out < size);
                            b.as_mut_slice()[0] = out.len() as u8;
                            b.set_len(1);
                            out.push(b);
                        }
                        None => prop_assert_eq!(regular_out, size),
                    }
                }
                Op::Overdraft(s) => {
                    let s = s % subpartitions;
                    let lent = out.iter().filter(|b| b.is_overdraft()).count();
                    match pool.request_overdraft(s) {
                        Some(b) => { prop_assert!(lent < overdraft); out.push(b) }
                        None => prop_assert!(lent == overdraft || network.free_segments() == 0),
                    }
                }
                Op::Recycle(n) if !out.is_empty() => { out.swap_remove(n % out.len()); }
                _ => {}
            }
            let regular_out = out.iter().filter(|b| !b.is_overdraft()).count();
            prop_assert!(pool.in_use() >= out.len(), "returns are seen late, never early");
            pool.reclaim();
            let any_at_max = (0..subpartitions).any(|s| out.iter().filter(|b| b.subpartition() == s).count() >= max_per);
            prop_assert_eq!(pool.in_use(), out.len());
            prop_assert_eq!(pool.is_available(), regular_out < size && !any_at_max);
            let mut segments: Vec<usize> = out.iter().map(|b| b.segment_index()).collect();
            segments.sort_unstable();
            segments.dedup();
            prop_assert_eq!(segments.len(), out.len(), "a segment is held twice");
        }
        drop(out);
        drop(pool);
        network.assert_whole();
    }
}

/// A writer on one thread and a reader on another share a 4-segment pool; the writer
/// fills buffers with a sequence, waits (parks) whenever the pool is exhausted, and the
/// reader checks every byte and drops the buffer. Nothing is lost or duplicated, the
/// writer spends most of its time back-pressured, and the pool is whole at the end.
#[test]
fn two_thread_backpressure_stress() {
    let buffers: u64 = if cfg!(miri) { 100 } else { 200_000 };
    let network = NetworkBufferPool::new(4, 256).unwrap();
    let parker = Parker::current();
    let config = LocalPoolConfig::new(4, 1)
        .with_max_per_subpartition(4)
        .with_overdraft(0);
    let mut pool = LocalBufferPool::with_notify(&network, config, parker.unparker()).unwrap();
    let (tx, rx) = mpsc::sync_channel::<Buffer>(16);
    let reader = std::thread::spawn(move || {
        let mut expected = 0u64;
        while let Ok(buffer) = rx.recv() {
            let bytes = buffer.as_slice();
            assert_eq!(bytes.len(), 8);
            assert_eq!(u64::from_le_bytes(bytes.try_into().unwrap()), expected);
            expected += 1;
        }
        expected
    });
    let mut waits = 0u64;
    for sequence in 0..buffers {
        let mut buffer = loop {
            if let Some(buffer) = pool.request(0) {
                break buffer;
            }
            if !pool.available_or_notify() {
                waits += 1;
                parker.park(Some(Duration::from_secs(5)), || pool.is_available());
            }
        };
        buffer.as_mut_slice()[..8].copy_from_slice(&sequence.to_le_bytes());
        buffer.set_len(8);
        tx.send(buffer).unwrap();
    }
    drop(tx);
    assert_eq!(reader.join().unwrap(), buffers);
    assert!(
        waits > 0,
        "the pool never ran out: the test did not exercise back-pressure"
    );
    drop(pool);
    network.assert_whole();
}
